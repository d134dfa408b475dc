"""A failing run never captures a worker: it backs off, the others go on, and it is parked."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, finish, make_policy, make_task, write
from tether.core import Observation, Phase
from tether.crypto import Keyring
from tether.runtime import AgentContext, Decision, Runtime, Worker
from tether.store import SQLiteStore
from tether.testing import Sandbox

MAX_ATTEMPTS = 3


class BuggyAgent:
    """User code with a bug: every decision raises."""

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        raise RuntimeError("agent bug: list index out of range")


class Fleet:
    """Runs in one SQLite file, each with its own sandbox; builds runtimes for workers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keyring = Keyring.generate("k1")
        self.sandboxes: dict[str, Sandbox] = {}
        self.unrestorable: set[str] = set()
        self.policy = make_policy()
        self.trust: Any = None
        self.fixed = False
        self.tasks: dict[str, Any] = {}  # fixed when the run starts, as a real task file is

    def runtime(self, store: Any, run_id: str, worker: str = "starter") -> Runtime:
        sandbox = self.sandboxes.setdefault(run_id, Sandbox({"notes.txt": "draft\n"}))
        if run_id in self.unrestorable and worker != "starter":
            raise RuntimeError("the factory cannot build this run (bad configuration)")
        buggy = run_id.startswith("broken") and not self.fixed
        agent: Any = (
            BuggyAgent() if buggy else ScriptedAgent([write("notes.txt", "done\n"), finish])
        )
        return Runtime(
            store=store,
            keyring=self.keyring,
            adapter=sandbox,
            task=self.tasks.setdefault(run_id, make_task(sandbox.environment().state_fingerprint)),
            policy=self.policy,
            agent=agent,
            worker=worker,
            trust=self.trust,
        )

    def start(self, run_id: str) -> None:
        with SQLiteStore(self.path) as store:
            self.runtime(store, run_id).start(run_id)


def serve_until(
    fleet: Fleet, done: Any, workers: int = 2, seconds: float = 20, ttl: float = 30
) -> list[Worker]:
    """``workers`` real Worker loops in threads, each on its own connection, until ``done()``."""
    made: list[Worker] = []
    stop = threading.Event()

    def loop(index: int) -> None:
        with SQLiteStore(fleet.path) as store:
            worker = Worker(
                store,
                fleet.runtime,
                f"w{index}",
                lease_ttl_s=ttl,
                poll_s=0.01,
                max_attempts=MAX_ATTEMPTS,
                backoff_s=0.05,
                max_backoff_s=0.2,
            )
            made.append(worker)
            while not stop.is_set():
                worker.serve(idle_exit=True)
                stop.wait(0.02)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not done():
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    return made


def mark(fleet: Fleet, run_id: str) -> Any:
    with SQLiteStore(fleet.path) as store:
        return store.get_mark(run_id)


def test_a_broken_run_backs_off_the_healthy_one_completes_and_the_broken_one_is_parked(
    tmp_path: Path,
) -> None:
    """Two workers, one buggy run, one healthy: healthy completes; the buggy one goes to review."""
    fleet = Fleet(tmp_path / "tether.sqlite")
    fleet.start("broken")
    fleet.start("healthy")

    def settled() -> bool:
        return mark(fleet, "healthy").phase == "completed" and mark(fleet, "broken").phase == (
            "needs_review"
        )

    workers = serve_until(fleet, settled)
    assert settled()
    claims = sum(w.stats.runs.count("broken") for w in workers)
    assert claims <= MAX_ATTEMPTS + 1, claims
    assert sum(w.stats.parked for w in workers) == 1
    with SQLiteStore(fleet.path) as store:
        state = fleet.runtime(store, "broken").checkpointer.load("broken").state
    (case,) = state.review_cases
    assert case.reason == "worker_error" and "agent bug" in case.detail
    assert fleet.sandboxes["healthy"].write_count() == 1
    assert fleet.sandboxes["broken"].write_count() == 0


def test_a_run_that_cannot_even_be_built_is_parked_at_the_mark(tmp_path: Path) -> None:
    """When the factory itself fails, the run is deferred, then left unclaimed with its error."""
    fleet = Fleet(tmp_path / "tether.sqlite")
    fleet.unrestorable.add("broken-config")
    fleet.start("broken-config")
    workers = serve_until(
        fleet, lambda: mark(fleet, "broken-config").attempts >= MAX_ATTEMPTS, seconds=10
    )
    parked = mark(fleet, "broken-config")
    assert parked.attempts == MAX_ATTEMPTS and parked.lease_owner is None
    assert "bad configuration" in (parked.last_error or "")
    claims = sum(w.stats.runs.count("broken-config") for w in workers)
    assert claims == MAX_ATTEMPTS
    with SQLiteStore(fleet.path) as store:
        assert store.claim_expired("w9", 30, max_attempts=MAX_ATTEMPTS) == []


@pytest.mark.parametrize("attempts", [0, 1, 2, 5])
def test_the_back_off_doubles_and_is_capped(tmp_path: Path, attempts: int) -> None:
    """A failed attempt defers the run by backoff * 2**attempts, at most max_backoff, less the
    jitter: at the lowest draw, half of that."""
    fleet = Fleet(tmp_path / "tether.sqlite")
    fleet.start("broken")
    with SQLiteStore(fleet.path) as store:
        for _ in range(attempts):
            lease = store.claim_expired("setup", 30, max_attempts=10)[0]
            store.defer("broken", "setup", lease.lease_version, 0, "earlier failure")
        worker = Worker(
            store,
            fleet.runtime,
            "w1",
            max_attempts=10,
            backoff_s=1.0,
            max_backoff_s=8.0,
            draw=lambda: 0.0,
        )
        lease = store.claim_expired("w1", 30, max_attempts=10)[0]
        before = time.time()
        worker.drive(lease)
        after = store.get_mark("broken")
    assert after.attempts == attempts + 1
    expected = min(8.0, 2.0**attempts) / 2
    waited = after.retry_at.timestamp() - before
    assert expected - 0.5 <= waited <= expected + 1.0, (waited, expected)


def test_a_run_waiting_for_approval_is_parked_and_woken_by_the_approval(tmp_path: Path) -> None:
    """While it waits it gains no checkpoint however often workers poll; an approval wakes it."""
    import secrets
    from datetime import UTC, datetime, timedelta

    from tether.core import new_approval
    from tether.crypto import Signer, TrustRoots

    alice = Signer.generate("alice", "approver")
    fleet = Fleet(tmp_path / "tether.sqlite")
    fleet.policy = make_policy(
        kinds={
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}
        }
    )
    fleet.trust = TrustRoots.of(alice.trust_root())
    fleet.start("guarded")
    parked = lambda: mark(fleet, "guarded").waiting_after is not None  # noqa: E731
    serve_until(fleet, parked, seconds=10, ttl=0.05)
    generation = mark(fleet, "guarded").generation
    serve_until(fleet, lambda: False, seconds=1.5, ttl=0.05)  # ~30 ttl periods of polling
    assert mark(fleet, "guarded").generation == generation  # not one checkpoint meanwhile
    with SQLiteStore(fleet.path) as store:
        state = fleet.runtime(store, "guarded").checkpointer.load("guarded").state
        now = datetime.now(UTC)
        body = new_approval(
            state,
            "alice",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
        store.put_evidence("guarded", "approval", alice.sign(body))
    serve_until(fleet, lambda: mark(fleet, "guarded").phase == "completed", seconds=10, ttl=0.05)
    assert mark(fleet, "guarded").phase == "completed"
    assert fleet.sandboxes["guarded"].write_count() == 1


def test_a_parked_run_is_woken_by_a_signed_replan_and_finishes(tmp_path: Path) -> None:
    """worker_error -> the bug is fixed -> a reviewer's replan in the inbox -> a worker finishes it."""
    import secrets
    from datetime import UTC, datetime, timedelta

    from tether.core import new_decision
    from tether.crypto import Signer, TrustRoots

    reviewer = Signer.generate("rev", "reviewer")
    fleet = Fleet(tmp_path / "tether.sqlite")
    fleet.trust = TrustRoots.of(reviewer.trust_root())
    fleet.start("broken-then-fixed")
    serve_until(fleet, lambda: mark(fleet, "broken-then-fixed").phase == "needs_review")
    fleet.fixed = True  # the operator deploys the fix
    with SQLiteStore(fleet.path) as store:
        state = (
            fleet.runtime(store, "broken-then-fixed").checkpointer.load("broken-then-fixed").state
        )
        now = datetime.now(UTC)
        body = new_decision(
            state,
            state.review_cases[0],
            "rev",
            "replan",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
        store.put_evidence("broken-then-fixed", "review_decision", reviewer.sign(body))
    serve_until(fleet, lambda: mark(fleet, "broken-then-fixed").phase == "completed", ttl=0.05)
    assert mark(fleet, "broken-then-fixed").phase == "completed"
    assert fleet.sandboxes["broken-then-fixed"].write_count() == 1


def test_a_worker_without_trust_roots_neither_spins_nor_burns_the_evidence(tmp_path: Path) -> None:
    """Evidence it cannot verify: the run is backed off and parked; the inbox is left unread."""
    fleet = Fleet(tmp_path / "tether.sqlite")
    fleet.policy = make_policy(
        kinds={
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}
        }
    )
    fleet.start("guarded")
    serve_until(fleet, lambda: mark(fleet, "guarded").waiting_after is not None)
    with SQLiteStore(fleet.path) as store:
        store.put_evidence("guarded", "approval", {"some": "signed document"})
    workers = serve_until(
        fleet, lambda: mark(fleet, "guarded").attempts >= MAX_ATTEMPTS, seconds=10
    )
    parked = mark(fleet, "guarded")
    assert parked.attempts == MAX_ATTEMPTS and "no trust roots" in (parked.last_error or "")
    assert sum(w.stats.runs.count("guarded") for w in workers) == MAX_ATTEMPTS
    time.sleep(0.3)
    with SQLiteStore(fleet.path) as store:
        assert store.claim_expired("w9", 30, max_attempts=MAX_ATTEMPTS) == []  # no spinning
        state = fleet.runtime(store, "guarded").checkpointer.load("guarded").state
    assert state.inbox_cursor == 0  # nothing consumed unread
    assert state.phase is Phase.PENDING  # a configuration error is not a reviewer's to decide


class LandsThenResets(Sandbox):
    """A service client that applies the write, then loses the reply (an unwrapped OS error)."""

    def execute(self, key: str, intent: Any, prestate: Any, fence: Any = None) -> Any:
        super().execute(key, intent, prestate, fence)
        raise ConnectionResetError("connection reset by peer after the request was applied")


def test_a_parked_run_whose_write_landed_can_still_be_decided(tmp_path: Path) -> None:
    """The case records the live environment and receipt, so a signed decision applies."""
    import secrets
    from datetime import UTC, datetime, timedelta

    from tether.core import new_decision
    from tether.crypto import Signer, TrustRoots

    reviewer = Signer.generate("rev", "reviewer")
    fleet = Fleet(tmp_path / "tether.sqlite")
    fleet.trust = TrustRoots.of(reviewer.trust_root())
    fleet.sandboxes["landed"] = LandsThenResets({"notes.txt": "draft\n"})
    fleet.start("landed")
    with SQLiteStore(fleet.path) as store:
        worker = Worker(store, fleet.runtime, "w1", max_attempts=1)  # park at the first failure
        worker.drive(store.claim_expired("w1", 30)[0])
    assert worker.stats.parked == 1 and mark(fleet, "landed").phase == "needs_review"
    assert fleet.sandboxes["landed"].write_count() == 1
    with SQLiteStore(fleet.path) as store:
        operator = fleet.runtime(store, "landed", "operator")
        operator.lease_ttl_s = 30
        session = operator.recover("landed")
        (case,) = session.state.review_cases
        assert case.receipt_fingerprint is not None  # the landed write's receipt is evidence
        now = datetime.now(UTC)
        body = new_decision(
            session.state,
            case,
            "rev",
            "abort",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
        session.review(reviewer.sign(body))
        assert session.state.phase is Phase.FAILED


def test_a_damaged_mark_row_does_not_stop_the_workers(tmp_path: Path) -> None:
    """One run's mark is damaged: workers survive, skip it, and the healthy run completes."""
    import sqlite3

    fleet = Fleet(tmp_path / "tether.sqlite")
    fleet.start("a-damaged")
    fleet.start("healthy")
    with sqlite3.connect(fleet.path) as db:
        db.execute("UPDATE tether_marks SET state_version = 'x' WHERE run_id = 'a-damaged'")
    serve_until(fleet, lambda: _phase_of(fleet, "healthy") == "completed", seconds=10)
    assert _phase_of(fleet, "healthy") == "completed"


def _phase_of(fleet: Fleet, run_id: str) -> str:
    import sqlite3

    with sqlite3.connect(fleet.path) as db:
        (phase,) = db.execute(
            "SELECT phase FROM tether_marks WHERE run_id = ?", (run_id,)
        ).fetchone()
    return str(phase)


class UnreachableForReads(Sandbox):
    """A workspace whose reads time out (the file server is down); writes never get that far."""

    def read(self, kind: str, target: str, args: dict[str, Any], scope: Any) -> Any:
        from tether.core import AdapterUnavailableError

        raise AdapterUnavailableError("the file server did not answer")


def test_a_reclaim_that_changes_nothing_writes_nothing(tmp_path: Path) -> None:
    """Five claims of a run whose adapter keeps saying "later" add no checkpoint and no trace event."""
    from tether.core import Proposal

    def read_notes(context: AgentContext, obs: Observation) -> Decision:
        return Decision(context, Proposal("r0", "file.read", "notes.txt"))

    sandbox = UnreachableForReads({"notes.txt": "draft\n"})
    keyring = Keyring.generate("k1")
    task = make_task(sandbox.environment().state_fingerprint)
    policy = make_policy()

    def factory(store: Any, run_id: str, worker: str) -> Runtime:
        return Runtime(
            store=store,
            keyring=keyring,
            adapter=sandbox,
            task=task,
            policy=policy,
            agent=ScriptedAgent([read_notes]),
            worker=worker,
        )

    with SQLiteStore(tmp_path / "tether.sqlite") as store:
        factory(store, "r1", "starter").start("r1")
        before = store.get_mark("r1")
        # Leases long enough that a loaded machine never lets one run out mid-drive:
        # each "later" releases the run itself, deferred by the back-off.
        worker = Worker(
            store, factory, "w1", lease_ttl_s=5.0, poll_s=0.01, backoff_s=0.01, max_backoff_s=0.04
        )
        for _ in range(5):
            claimed = []
            deadline = time.monotonic() + 5.0
            while not claimed and time.monotonic() < deadline:
                time.sleep(0.02)  # the back-off is capped at 0.04 s
                claimed = store.claim_expired("w1", 5.0, phases=("running",))
            assert [lease.run_id for lease in claimed] == ["r1"]
            worker.drive(claimed[0])
        after = store.get_mark("r1")
        assert before is not None and after is not None
        assert worker.stats.claimed == 5 and worker.stats.errors == 0
        assert (after.generation, after.checkpoint_digest) == (
            before.generation,
            before.checkpoint_digest,
        )
        assert after.attempts == 0  # "later" is not a failure


def test_the_worker_command_takes_the_retry_settings(tmp_path: Path) -> None:
    """`tether worker --max-attempts 2 --backoff S`: two claims of a broken run, then it is parked."""
    import json
    import os
    import subprocess
    import sys
    from dataclasses import replace

    from tether import _demo

    url = f"sqlite:///{tmp_path / 'tether.sqlite'}"
    paths = replace(_demo.DemoPaths.under(tmp_path), store_url=url)
    _demo.prepare(paths)
    with _demo.workspace(paths) as ws:
        rt = _demo.runtime(paths, ws)
        rt.start(_demo.RUN_ID)
        rt.store.close()
    paths.keyring.unlink()  # the factory can no longer build the run

    def tether_worker(*flags: str) -> subprocess.CompletedProcess[str]:
        argv = ["worker", "--store", url, "--app", "tether._demo:worker_factory", *flags]
        return subprocess.run(
            [sys.executable, "-m", "tether.cli", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "TETHER_DEMO_HOME": str(paths.home)},
            check=False,
        )

    settings = ["--max-attempts", "2", "--backoff", "0.05", "--max-backoff", "0.05"]
    claims = []
    for _ in range(3):
        done = tether_worker(*settings, "--poll", "0.01", "--idle-exit")
        assert done.returncode == 0, done.stderr
        claims.append(json.loads(done.stdout.strip().splitlines()[-1])["claimed"])
        time.sleep(0.1)  # past the back-off
    assert claims == [1, 1, 0]  # claimed twice, then parked: no third claim
    with SQLiteStore(tmp_path / "tether.sqlite") as store:
        parked = store.get_mark(_demo.RUN_ID)
    assert parked.attempts == 2 and parked.last_error
    refused = tether_worker("--max-attempts", "0")
    assert refused.returncode == 2 and "must be from 1 to 1000" in refused.stderr


class DownForAWhile(Sandbox):
    """An adapter whose service is unreachable until ``up`` is set (an outage, not a bug)."""

    up = threading.Event()

    def environment(self) -> Any:
        if not self.up.is_set():
            from tether.core import AdapterUnavailableError

            raise AdapterUnavailableError("connection refused: the service is down")
        return super().environment()


def test_an_outage_during_recovery_is_waited_out_not_counted(tmp_path: Path) -> None:
    """The adapter is down while workers claim: no attempts are counted; back up, it completes."""
    fleet = Fleet(tmp_path / "tether.sqlite")
    outage = DownForAWhile({"notes.txt": "draft\n"})
    outage.up.set()
    fleet.sandboxes["flaky"] = outage
    fleet.start("flaky")
    outage.up.clear()
    serve_until(fleet, lambda: False, seconds=1.0, ttl=0.05)  # many claims meet the outage
    assert mark(fleet, "flaky").attempts == 0 and "down" in (mark(fleet, "flaky").last_error or "")
    outage.up.set()
    serve_until(fleet, lambda: mark(fleet, "flaky").phase == "completed", seconds=10, ttl=0.05)
    assert mark(fleet, "flaky").phase == "completed"
    assert outage.write_count() == 1


@pytest.mark.parametrize(
    "settings",
    [
        {"lease_ttl_s": float("nan")},
        {"lease_ttl_s": 1e300},
        {"lease_ttl_s": 0},
        {"poll_s": -1},
        {"poll_s": 0},
        {"poll_s": 1e-9},
        {"poll_s": float("inf")},
        {"max_attempts": 0},
        {"max_attempts": True},
        {"backoff_s": float("nan")},
    ],
)
def test_worker_settings_out_of_range_are_refused(tmp_path: Path, settings: dict[str, Any]) -> None:
    """NaN, overflow, zero or negative settings fail at construction with a typed error."""
    from tether.core import StoreError

    with SQLiteStore(tmp_path / "s.sqlite") as store, pytest.raises(StoreError):
        Worker(store, lambda *a: None, "w", **settings)  # type: ignore[arg-type,return-value]


def test_a_run_parked_at_the_mark_is_claimed_again_after_tether_retry(tmp_path: Path) -> None:
    """Unbuildable -> parked at the mark; the cause fixed, `tether retry` lets it complete."""
    import subprocess
    import sys

    fleet = Fleet(tmp_path / "tether.sqlite")
    fleet.unrestorable.add("stuck")
    fleet.start("stuck")
    serve_until(fleet, lambda: mark(fleet, "stuck").attempts >= MAX_ATTEMPTS, seconds=10)
    with SQLiteStore(fleet.path) as store:
        assert store.claim_expired("w9", 30, max_attempts=MAX_ATTEMPTS) == []  # parked
    fleet.unrestorable.clear()  # the operator fixes the configuration
    url = f"sqlite:///{fleet.path}"
    done = subprocess.run(
        [sys.executable, "-m", "tether.cli", "retry", "stuck", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and f"had {MAX_ATTEMPTS} failed attempt(s)" in done.stdout
    serve_until(fleet, lambda: mark(fleet, "stuck").phase == "completed", seconds=10)
    assert mark(fleet, "stuck").phase == "completed"
    missing = subprocess.run(
        [sys.executable, "-m", "tether.cli", "retry", "nope", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
