"""Recovery workers racing over one run, as real processes, against SQLite and PostgreSQL.

The figures each test reaches (trials, takeovers, refused stale writes,
duplicate effects) are printed so `pytest -s` shows them; the assertions
are the contract: one write, and a stale worker changes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
from tether import _demo
from tether.adapters import FileWorkspace
from tether.core import EffectStatus, Phase
from tether.runtime import Checkpointer
from tether.store import open_store

TTL = 1.0


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tether.sqlite'}"
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield url_in_schema(dsn, schema)


def seeded(tmp_path: Path, store_url: str) -> _demo.DemoPaths:
    paths = replace(_demo.DemoPaths.under(tmp_path), store_url=store_url)
    _demo.prepare(paths)
    return paths


def env(paths: _demo.DemoPaths) -> dict[str, str]:
    return {**os.environ, "TETHER_DEMO_HOME": str(paths.home)}


def child(paths: _demo.DemoPaths, *args: str, timeout: float = 60) -> subprocess.Popen[str]:
    cmd = [
        sys.executable,
        "-m",
        "tether.cli",
        "_demo-child",
        *args,
        "--db",
        str(paths.db),
        "--workspace",
        str(paths.workspace),
        "--store",
        str(paths.store_url),
    ]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env(paths),
    )


def worker(paths: _demo.DemoPaths, worker_id: str) -> dict[str, object]:
    """A real `tether worker` process that exits when nothing is left to claim."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.cli",
            "worker",
            "--store",
            str(paths.store_url),
            "--app",
            "tether._demo:worker_factory",
            "--id",
            worker_id,
            "--lease-ttl",
            str(TTL),
            "--idle-exit",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=env(paths),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def final(paths: _demo.DemoPaths):
    with open_store(str(paths.store_url)) as store:
        state = Checkpointer(store, _demo.keyring(paths)).load(_demo.RUN_ID).state
        ledger = store.ledger(_demo.RUN_ID)
    with _demo.workspace(paths) as ws:
        return state, ledger, ws.write_count()


def wait_stopped(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(")")[-1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never stopped")


PAUSED_OWNER = r"""
import json, os, signal, sys
from dataclasses import replace
from pathlib import Path
from tether import _demo
from tether.adapters import FileWorkspace, FenceRejectedError
from tether.core import TetherError

class PausingWorkspace(FileWorkspace):
    '''The real workspace; the process stops itself on entry to execute (after the lease check).'''
    def execute(self, key, intent, prestate, fence=None):
        os.kill(os.getpid(), signal.SIGSTOP)
        return super().execute(key, intent, prestate, fence)

home, url = Path(sys.argv[1]), sys.argv[2]
paths = replace(_demo.DemoPaths.under(home), store_url=url)
ws = PausingWorkspace(paths.workspace, paths.journal, verifier_allowlist=[_demo.VERIFIER])
session = _demo.runtime(paths, ws, lease_ttl_s=float(sys.argv[3])).start(_demo.RUN_ID)
out = {"lease_version": session.lease.lease_version}
try:
    session.run()
    out["execute"] = "wrote"
except FenceRejectedError as exc:
    out["execute"] = type(exc).__name__
    out["presented"], out["highest"] = exc.presented, exc.highest
try:
    session.commit(session.state, [("late_write_attempt", {})])
    out["commit"] = "accepted"
except TetherError as exc:
    out["commit"] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_paused_owner_past_its_lease_is_fenced_out(tmp_path: Path, store_url: str) -> None:
    """SIGSTOP an owner past its lease, let another worker finish, SIGCONT: nothing it does lands."""
    trials, refused_writes, refused_commits = 3, 0, 0
    for trial in range(trials):
        where = tmp_path / f"t{trial}"
        url = store_url if trial == 0 else _fresh(store_url, where)  # a fresh store per trial
        paths = seeded(where, url)
        owner = subprocess.Popen(
            [sys.executable, "-c", PAUSED_OWNER, str(paths.home), str(paths.store_url), str(TTL)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        try:
            wait_stopped(owner.pid)
            time.sleep(TTL + 0.3)  # the owner's lease runs out while it is stopped
            stats = worker(paths, f"b{trial}")
            assert stats["completed"] == 1, stats
        finally:
            owner.send_signal(signal.SIGCONT)
        out, err = owner.communicate(timeout=60)
        assert owner.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
        assert report["execute"] == "FenceRejectedError", report
        assert report["commit"] == "LeaseLostError", report
        refused_writes += 1
        refused_commits += 1
        state, ledger, writes = final(paths)
        assert state.phase is Phase.COMPLETED
        assert writes == 1
        assert sum(e.status is EffectStatus.COMMITTED for e in ledger) == 1
        assert "late_write_attempt" not in _kinds(paths, state)
    print(
        f"\n{store_url.split(':', maxsplit=1)[0]}: {trials} takeovers, {refused_writes} stale adapter calls "
        f"refused by the fence, {refused_commits} stale checkpoints refused, 0 duplicate effects"
    )


@pytest.mark.slow
def test_two_workers_reconcile_the_same_committed_receipt(tmp_path: Path, store_url: str) -> None:
    """A write committed before a crash is reconciled by one worker and again by the next: once."""
    paths = seeded(tmp_path, store_url)
    first = child(paths, "start", "--crash-at", "effect_sent")
    first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL
    # Worker A reconciles the receipt, then dies inside the commit that would
    # record it and advance: that transaction dies whole.
    second = child(paths, "recover", "--lease-ttl", str(TTL), "--crash-at", "receipt_persisted")
    second.communicate(timeout=60)
    assert second.returncode == -signal.SIGKILL
    _, ledger_a, _ = final(paths)
    assert [e for e in ledger_a if e.status is EffectStatus.COMMITTED] == []
    time.sleep(TTL + 0.3)
    stats = worker(paths, "b")  # worker B reconciles the same receipt and finishes
    assert stats["completed"] == 1, stats
    state, ledger, writes = final(paths)
    assert writes == 1
    (committed,) = [e for e in ledger if e.status is EffectStatus.COMMITTED]
    with FileWorkspace(paths.workspace, paths.journal) as ws:
        adapter_receipt = ws.lookup(committed.idempotency_key)
    assert adapter_receipt is not None and adapter_receipt.to_json() == committed.receipt
    assert state.last_write is not None
    assert state.last_write.receipt_fingerprint == adapter_receipt.fingerprint
    assert state.phase is Phase.COMPLETED


@pytest.mark.slow
def test_a_second_worker_cannot_take_a_live_lease(tmp_path: Path, store_url: str) -> None:
    """While one worker holds a live lease, another worker claims nothing and writes nothing."""
    paths = seeded(tmp_path, store_url)
    owner = subprocess.Popen(
        [sys.executable, "-c", PAUSED_OWNER, str(paths.home), str(paths.store_url), "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_stopped(owner.pid)
        stats = worker(paths, "intruder")
        assert stats["claimed"] == 0, stats
    finally:
        owner.send_signal(signal.SIGCONT)
    out, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["execute"] == "wrote", (report, err)
    _, _, writes = final(paths)
    assert writes == 1


@pytest.mark.slow
def test_sigterm_finishes_the_step_and_releases_the_lease(tmp_path: Path, store_url: str) -> None:
    """A worker told to stop leaves a run it was driving unowned, for the next worker at once."""
    paths = seeded(tmp_path, store_url)
    with open_store(str(paths.store_url)) as store, _demo.workspace(paths) as ws:
        _demo.runtime(paths, ws, store=store).start(_demo.RUN_ID)  # genesis only
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tether.cli",
            "worker",
            "--store",
            str(paths.store_url),
            "--app",
            "tether._demo:worker_factory",
            "--id",
            "w-term",
            "--lease-ttl",
            "30",
            "--poll",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env(paths),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state, _, _ = final(paths)
        if state.phase is Phase.COMPLETED:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["completed"] == 1
    with open_store(str(paths.store_url)) as store:
        mark = store.get_mark(_demo.RUN_ID)
    assert mark is not None and mark.lease_owner is None


def _kinds(paths: _demo.DemoPaths, state) -> list[str]:
    with open_store(str(paths.store_url)) as store:
        return [e.kind for e in store.trace(state.run_id, state.trace_head)]


def _fresh(store_url: str, where: Path) -> str:
    """Another empty store of the same kind for a repeated trial."""
    if store_url.startswith("sqlite:"):
        where.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{where / 'tether.sqlite'}"
    import uuid

    import psycopg

    dsn = pg_dsn()
    schema = f"tether_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    _SCHEMAS.append(schema)
    return url_in_schema(dsn, schema)


_SCHEMAS: list[str] = []


@pytest.fixture(autouse=True, scope="module")
def _drop_extra_schemas() -> Iterator[None]:
    yield
    if _SCHEMAS:
        import psycopg

        with psycopg.connect(pg_dsn(), autocommit=True) as admin:
            for schema in _SCHEMAS:
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
