"""Runs opened without a lease by two real processes at once: one acts, the other is refused.

The defect, found from outside: two copies of an agent process started on
one run with no ``lease_ttl_s=`` both settled the same write in flight and
charged twice under one key (10 of 30 races). Each child here is a real
process (``_livechild``) over a real SQLite file or a real PostgreSQL schema;
the holder is killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
from tests.integration._fnchild import KIND, record, runtime, seen
from tests.integration._livechild import BUSY
from tether import effects
from tether.core import EffectStatus, RunBusyError
from tether.crypto import Keyring
from tether.store import SQLiteStore, open_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The run's store: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'runs.sqlite'}"
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield url_in_schema(dsn, schema)


def spawn(root: Path, url: str) -> subprocess.Popen[str]:
    """One copy of the agent process on run r (no lease)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration._livechild", str(root), url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])},
    )


def said(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The child's one JSON line (it has exited)."""
    out, err = proc.communicate(timeout=60)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no answer (exit {proc.returncode}): {err[-2000:]}"
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


def wait_until(done: Any, what: str, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not done():
        if time.monotonic() > deadline:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_two_processes_on_one_run_without_a_lease_act_once_and_a_rerun_after_sigkill_recovers(
    tmp_path: Path, store_url: str
) -> None:
    """Two processes race for one run: one charges, the other gets RunBusyError; after the holder's
    SIGKILL mid-body a new process opens the run at once and finds the charge instead of doubling."""
    Keyring.generate("fnchild-1").write_file(tmp_path / "keys.json")  # before both read it
    procs = [spawn(tmp_path, store_url), spawn(tmp_path, store_url)]
    try:
        # The loser is refused and exits while the winner waits inside its body.
        wait_until(lambda: any(p.poll() is not None for p in procs), "a refusal", procs)
        (loser,) = [p for p in procs if p.poll() is not None]
        (holder,) = [p for p in procs if p is not loser]
        refused = said(loser)
        assert loser.returncode == BUSY, refused
        assert refused["run_id"] == "r" and "another process" in refused["busy"]
        wait_until(lambda: len(seen(tmp_path, "entered")) == 1, "the holder's body", procs)
        (tmp_path / "go").touch()
        wait_until(lambda: len(seen(tmp_path, "charge")) == 1, "the charge", procs)
        os.kill(holder.pid, signal.SIGKILL)  # the charge landed; its receipt is not recorded
        holder.wait(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    started = time.monotonic()
    rerun = spawn(tmp_path, store_url)
    answer = said(rerun)
    took = time.monotonic() - started
    assert rerun.returncode == 0, answer  # no ttl to wait out: the dead process held nothing
    assert answer == {"outcome": "replayed"}, answer  # the landed charge, found by key
    assert len(seen(tmp_path, "entered")) == 1  # the body never ran again
    assert len(seen(tmp_path, "charge")) == 1
    print(
        f"rerun after SIGKILL opened and settled the run in {took:.2f} s (process start included)"
    )
    store = open_store(store_url)
    try:
        statuses = [e.status for e in store.ledger("r")]
    finally:
        store.close()
    assert statuses.count(EffectStatus.COMMITTED) == 1


def test_a_session_open_in_this_process_refuses_another_process_until_it_is_released(
    tmp_path: Path,
) -> None:
    """While a session of the run is open here another process is refused; release() lets it in."""
    Keyring.generate("fnchild-1").write_file(tmp_path / "keys.json")
    (tmp_path / "go").touch()
    (tmp_path / "done").touch()

    @tether.effect(KIND, target=None, idempotent=True)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(tmp_path, "charge", idempotency_key, cents)
        return {"charged": cents}

    rt = runtime(tmp_path, charge.adapter)
    session = rt.start("r")
    url = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    other = spawn(tmp_path, url)
    assert said(other).get("run_id") == "r" and other.returncode == BUSY
    session.release()
    other = spawn(tmp_path, url)
    assert said(other) == {"outcome": "executed"} and other.returncode == 0
    assert len(seen(tmp_path, "charge")) == 1


def test_a_lost_hold_sends_nothing(tmp_path: Path) -> None:
    """A run lock file deleted under a live process: its next effect is refused before it is sent,
    and the run opened again sends it once."""
    sent: list[str] = []

    @tether.effect(KIND, target=None, idempotent=True)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        sent.append(idempotency_key)
        return {"charged": cents}

    rt = runtime(tmp_path, charge.adapter)
    with effects.run(rt, "r"):
        locks = list((tmp_path / "runs.sqlite-locks").iterdir())
        assert len(locks) == 1
        locks[0].unlink()  # another process could now lock a new file of that name
        with pytest.raises(RunBusyError) as refused:
            charge(500)
        assert refused.value.run_id == "r"
    assert sent == []
    with effects.run(rt, "r"):  # opened again: the run is held afresh, and the write goes once
        charge(500)
    assert len(sent) == 1


def test_a_leased_runtime_takes_no_hold_and_an_unleased_one_does(tmp_path: Path) -> None:
    """The lease is the authority where there is one; without, the session carries a hold."""

    @tether.effect(KIND, target=None, idempotent=True)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        return {"charged": cents}

    store = SQLiteStore(tmp_path / "runs.sqlite")
    leased = runtime(tmp_path, charge.adapter, store=store, lease_ttl_s=30).start("leased")
    plain = runtime(tmp_path, charge.adapter, store=store).start("plain")
    try:
        assert leased.liveness is None
        assert plain.liveness is not None and plain.liveness.run_id == "plain"
        plain.liveness.check()
    finally:
        leased.release()
        plain.release()
    with pytest.raises(RunBusyError):
        plain.liveness.check()  # given up with release(): nothing more is sent through it
