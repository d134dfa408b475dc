"""Function effects: defects an outside attack found, each reproduced on real parts, then fixed.

Real SQLite files, real event loops, real child processes (see ``_fnchild``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.conftest import signed_approval
from tests.integration._fnchild import KIND, record, runtime, seen
from tether import effects
from tether.core import (
    ApprovalRequiredError,
    EffectNotSettledError,
    EffectRejectedError,
    EffectStatus,
    EffectUnrecordedError,
    LeaseError,
    LeaseHeldError,
    NeedsReviewError,
    Phase,
    StoreUnavailableError,
)
from tether.crypto import Signer, TrustRoots
from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash
from tether.store import SQLiteStore

ALICE = Signer.generate("alice", "approver")
ROOT = Path(__file__).resolve().parents[2]


class Clock:
    """A runtime clock a test moves forward."""

    def __init__(self) -> None:
        self.at = datetime.now(UTC)

    def now(self) -> datetime:
        """The moment the test set."""
        return self.at


def ledger(root: Path) -> list[EffectStatus]:
    """Run r's ledger, status by status."""
    with SQLiteStore(root / "runs.sqlite", read_only=True) as store:
        return [e.status for e in store.ledger("r")]


# --- A11: a gated kind whose function receipt has no commit time ----------------------


def test_a_gated_function_effect_without_a_commit_time_proceeds_once_approved(
    tmp_path: Path,
) -> None:
    """Approved, the body returns no commit time: committed and the run goes on (no freeze)."""

    @tether.effect(KIND, target=None)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(tmp_path, "charge", idempotency_key, cents)
        return {"charged": cents}

    clock = Clock()
    rt = runtime(
        tmp_path, charge.adapter, gated=True, trust=TrustRoots.of(ALICE.trust_root()), clock=clock
    )
    with effects.run(rt, "r") as run:
        with pytest.raises(ApprovalRequiredError):
            charge(500)
        run.approve(signed_approval(ALICE, run.session.state, clock.now()))
        done = charge(500)
        assert run.phase is Phase.RUNNING
        with pytest.raises(ApprovalRequiredError):  # the run goes on: the next waits for its own
            charge(600)
    assert done.outcome == "executed" and done.result == {"charged": 500}
    assert len(seen(tmp_path, "charge")) == 1
    assert ledger(tmp_path).count(EffectStatus.COMMITTED) == 1


@pytest.mark.parametrize("late", [False, True])
def test_a_gated_function_effect_found_by_look_up_is_judged_by_when_it_was_found(
    tmp_path: Path, late: bool
) -> None:
    """Killed after the send: found before the approval expired, reconciled; found after, review."""

    def find(key: str) -> dict[str, Any] | None:
        rows = [b for k, b in seen(tmp_path, "charge") if k == key]
        return {"charged": int(rows[0])} if rows else None

    @tether.effect(KIND, target=None, lookup=find)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(tmp_path, "charge", idempotency_key, cents)
        return {"charged": cents}

    clock = Clock()
    trust = TrustRoots.of(ALICE.trust_root())
    crash = CrashPlan(CrashPoint.EFFECT_SENT)
    rt = runtime(tmp_path, charge.adapter, gated=True, trust=trust, clock=clock, crash=crash)
    with pytest.raises(SimulatedCrash), effects.run(rt, "r") as run:
        with pytest.raises(ApprovalRequiredError):
            charge(500)
        run.approve(signed_approval(ALICE, run.session.state, clock.now()))
        charge(500)
    if late:
        clock.at += timedelta(seconds=301)  # the approval (five minutes) expired meanwhile
    rt = runtime(tmp_path, charge.adapter, gated=True, trust=trust, clock=clock)
    with effects.run(rt, "r") as run:
        if late:
            with pytest.raises(NeedsReviewError) as caught:
                charge(500)
            assert caught.value.reason == "approval_boundary"
        else:
            assert charge(500).outcome == "replayed"
            assert run.phase is Phase.RUNNING
    assert len(seen(tmp_path, "charge")) == 1  # never sent again, either way
    assert ledger(tmp_path)[-1] is EffectStatus.COMMITTED  # whatever a person decides


# --- A20: a function effect's target is text, never a file path -----------------------


def test_a_function_effects_target_is_any_text_not_a_path_in_the_tasks_scope(
    tmp_path: Path,
) -> None:
    """URLs, channels, absolute routes: sent once each with no allowed_paths; a NUL is refused."""

    @tether.effect("chat.post")
    def post(channel: str, text: str, idempotency_key: str) -> dict[str, Any]:
        record(tmp_path, "post", idempotency_key, [channel, text])
        return {"posted": channel}

    targets = ["#general", "https://hooks.example.com/T0/B1?x=1", "/v1/charges", "../up", ""]
    with effects.run(runtime(tmp_path, post.adapter), "r") as run:
        done = [post(t, "hi") for t in targets]
        with pytest.raises(EffectRejectedError) as caught:
            post("bad\x00name", "hi")
        assert run.phase is Phase.RUNNING
    assert [d.outcome for d in done] == ["executed"] * len(targets)
    assert caught.value.reason == "schema"
    assert [json.loads(b)[0] for _, b in seen(tmp_path, "post")] == targets


# --- A12: a plain def that returns a coroutine -----------------------------------------


def hidden(root: Path) -> Any:
    """A plain def that hands back a coroutine; the coroutine would record a charge."""

    async def send(cents: int, key: str) -> dict[str, Any]:
        record(root, "charge", key, cents)
        return {"charged": cents}

    @tether.effect(KIND, target=None)
    def charge(cents: int, idempotency_key: str) -> Any:
        return send(cents, idempotency_key)  # no await: nothing has happened yet

    return charge


@pytest.mark.parametrize("caller", ["no_loop", "loop_thread", "call_async"])
@pytest.mark.filterwarnings("error::RuntimeWarning")  # "never awaited" would be a leak
def test_a_plain_def_returning_a_coroutine_is_refused_and_nothing_happens(
    tmp_path: Path, caller: str
) -> None:
    """From plain code, a loop's thread or call_async: rejected, typed, never awaited, never committed."""
    charge = hidden(tmp_path)
    rt = runtime(tmp_path, charge.adapter)

    def sync() -> str:
        with effects.run(rt, "r") as run:
            with pytest.raises(EffectRejectedError) as caught:
                charge(500)
            assert run.phase is Phase.RUNNING  # refused: the run goes on, no review
            return str(caught.value)

    async def on_loop() -> str:
        if caller == "loop_thread":
            return sync()
        async with effects.run_async(rt, "r"):
            with pytest.raises(EffectRejectedError) as caught:
                await effects.call_async(KIND, "", {"cents": 500})
            return str(caught.value)

    message = sync() if caller == "no_loop" else asyncio.run(on_loop())
    assert "returned a coroutine" in message and "async def" in message
    assert seen(tmp_path, "charge") == []
    statuses = ledger(tmp_path)
    assert EffectStatus.COMMITTED not in statuses and statuses[-1] is EffectStatus.REJECTED


def test_a_plain_def_returning_a_running_task_is_an_unknown_outcome(tmp_path: Path) -> None:
    """A task scheduled on the loop runs anyway: never awaited by tether, never committed, review."""

    async def send(cents: int, key: str) -> None:
        record(tmp_path, "charge", key, cents)

    @tether.effect(KIND, target=None)
    def charge(cents: int, idempotency_key: str) -> Any:
        return asyncio.ensure_future(send(cents, idempotency_key))  # on the caller's loop

    async def main() -> None:
        with effects.run(runtime(tmp_path, charge.adapter), "r") as run:
            with pytest.raises(NeedsReviewError):
                charge(500)  # a sync call on the loop's thread: the body schedules a task
            assert run.phase is Phase.NEEDS_REVIEW
        await asyncio.sleep(0)  # the task tether never awaited runs all the same

    asyncio.run(main())
    assert len(seen(tmp_path, "charge")) == 1  # it did happen: "unknown" was the honest answer
    assert ledger(tmp_path)[-1] is EffectStatus.OUTCOME_UNKNOWN


# --- A13: a sync call on a loop's thread while an async call of the run is in flight ----


def test_a_sync_call_on_the_loop_while_an_async_body_waits_there_is_refused_not_deadlocked(
    tmp_path: Path,
) -> None:
    """A body waits on the loop: a sync call there is refused, a sync block ends; all finish once."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration._fnchild", str(tmp_path), "loop", "go"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,  # a deadlock guard only: the child finishes at once when fixed
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "during": "RunBusyError",
        "charge": "executed",
        "after": "executed",
        "closed": "executed",  # the block closed on the loop; its call finished and let go
        "again": "replayed",
    }
    assert len(seen(tmp_path, "charge")) == 2  # r's and r2's, each once
    assert [b for _, b in seen(tmp_path, "note")] == ['"after"']


# --- A14: the body ran, then the receipt's commit failed ------------------------------


def test_a_receipt_whose_commit_hits_a_locked_store_is_recorded_on_the_next_call(
    tmp_path: Path,
) -> None:
    """Another connection holds the SQLite file locked: a typed error with the result; then once."""
    locks: list[sqlite3.Connection] = []

    @tether.effect(KIND, target=None)  # declares nothing: without the receipt, only review
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(tmp_path, "charge", idempotency_key, cents)
        if not locks:  # a real second writer takes the store's file while the body returns
            other = sqlite3.connect(tmp_path / "runs.sqlite", isolation_level=None)
            other.execute("BEGIN EXCLUSIVE")
            locks.append(other)
        return {"charged": cents}

    store = SQLiteStore(tmp_path / "runs.sqlite", busy_timeout_ms=200)
    with effects.run(runtime(tmp_path, charge.adapter, store=store), "r") as run:
        with pytest.raises(EffectUnrecordedError) as caught:
            charge(500)
        assert ledger(tmp_path)[-1] is EffectStatus.DISPATCHED  # the durable state: dispatched
        locks[0].execute("COMMIT")  # the store is back
        again = charge(500)
        assert run.phase is Phase.RUNNING
    error = caught.value
    assert isinstance(error.__cause__, StoreUnavailableError)
    assert error.result == {"charged": 500} and error.idempotency_key in str(error)
    assert "may have happened" in str(error)
    assert again.outcome == "executed" and again.result == {"charged": 500}
    assert len(seen(tmp_path, "charge")) == 1 and ledger(tmp_path)[-1] is EffectStatus.COMMITTED


@pytest.mark.parametrize("declared", ["nothing", "lookup"])
def test_a_receipt_whose_commit_lost_the_lease_is_settled_by_the_recovery(
    tmp_path: Path, declared: str
) -> None:
    """A second runtime takes the lapsed lease while the body runs: typed error, then key or review."""

    def find(key: str) -> dict[str, Any] | None:
        rows = [b for k, b in seen(tmp_path, "charge") if k == key]
        return {"charged": int(rows[0])} if rows else None

    proofs: dict[str, Any] = {} if declared == "nothing" else {"lookup": find}

    @tether.effect(KIND, target=None, **proofs)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(tmp_path, "charge", idempotency_key, cents)
        marks = SQLiteStore(tmp_path / "runs.sqlite")
        for _ in range(600):  # until the lease lapses (the heartbeat gives up after 0.3 s)
            try:
                taken = marks.acquire_lease("r", "thief", 30)
                break
            except LeaseHeldError:
                time.sleep(0.05)
        else:
            raise AssertionError("the lease never lapsed")
        marks.release_lease("r", "thief", taken.lease_version)  # free for the recovery below
        marks.close()
        return {"charged": cents}

    rt = runtime(tmp_path, charge.adapter, lease_ttl_s=0.3, heartbeat_max_s=0.3)
    with pytest.raises(EffectUnrecordedError) as caught, effects.run(rt, "r"):
        charge(500)
    assert isinstance(caught.value.__cause__, LeaseError)
    assert caught.value.result == {"charged": 500}
    assert ledger(tmp_path)[-1] is EffectStatus.DISPATCHED
    with effects.run(runtime(tmp_path, charge.adapter, lease_ttl_s=30), "r") as run:
        if declared == "nothing":
            with pytest.raises(NeedsReviewError):
                charge(500)
            assert ledger(tmp_path)[-1] is EffectStatus.OUTCOME_UNKNOWN
        else:
            assert charge(500).outcome == "replayed"  # found by its key
            assert run.phase is Phase.RUNNING and ledger(tmp_path)[-1] is EffectStatus.COMMITTED
    assert len(seen(tmp_path, "charge")) == 1  # never sent again


# --- Two processes open the same run at once ------------------------------------------


@pytest.mark.parametrize("declared", ["leased", "unleased"])
def test_two_processes_on_one_run_with_leases_the_second_is_refused(
    tmp_path: Path, declared: str
) -> None:
    """Leases on: refused while the first is in the body, then a replay. Off: the run is held by the first process, the second refused."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    argv = [sys.executable, "-m", "tests.integration._fnchild", str(tmp_path), f"two:{declared}"]
    (tmp_path / "hold").write_text("")
    first = subprocess.Popen(
        [*argv, "a"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**env, "HOLD": "1"},
    )  # fmt: skip
    try:
        for _ in range(3000):  # until the first process is inside the body
            if seen(tmp_path, "entered") or first.poll() is not None:
                break
            time.sleep(0.02)
        assert seen(tmp_path, "entered"), first.stderr.read() if first.stderr else ""
        second = subprocess.run(
            [*argv, "b"],
            check=False,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
        )
    finally:
        (tmp_path / "hold").unlink()
        out, err = first.communicate(timeout=120)
    keys = {k for k, _ in seen(tmp_path, "charge")}
    if declared == "leased":
        assert second.stdout.strip() == "LeaseHeldError", second.stderr  # nothing was sent
        assert out.strip() == "executed", err
        third = subprocess.run(
            [*argv, "c"],
            check=False,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
        )
        assert third.stdout.strip() == "replayed", third.stderr
        assert len(seen(tmp_path, "entered")) == 1 and len(seen(tmp_path, "charge")) == 1
    else:
        # No lease: the first process holds the run while it lives (a flock beside the
        # SQLite file), so the second is refused before it sends anything.
        assert second.stdout.strip() == "RunBusyError", second.stderr
        assert out.strip() == "executed", err
        assert len(seen(tmp_path, "charge")) == 1
    assert len(keys) == 1  # whatever happened, one key: a deduplicating callee acts once


# --- A, B, A: a stateful target declared with holds= -----------------------------------


def topics(root: Path) -> sqlite3.Connection:
    """A real table the effect changes: one topic per channel."""
    conn = sqlite3.connect(root / "chat.sqlite", timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS topic (channel TEXT PRIMARY KEY, text TEXT)")
    return conn


def test_a_b_a_on_a_declared_stateful_target_is_three_effects_and_a_retry_is_one(
    tmp_path: Path,
) -> None:
    """holds= reads the topic: A, B, A sets it three times; A again (it holds A) replays."""
    broken: list[bool] = []

    def holds(channel: str, text: str) -> bool:
        if broken:
            raise ConnectionError("chat API down")
        with topics(tmp_path) as conn:
            row = conn.execute("SELECT text FROM topic WHERE channel = ?", (channel,)).fetchone()
        return row is not None and row[0] == text

    @tether.effect("chat.topic", holds=holds)
    def set_topic(channel: str, text: str, idempotency_key: str) -> dict[str, Any]:
        record(tmp_path, "topic", idempotency_key, [channel, text])
        with topics(tmp_path) as conn:
            conn.execute("INSERT OR REPLACE INTO topic VALUES (?, ?)", (channel, text))
        return {"topic": text}

    with effects.run(runtime(tmp_path, set_topic.adapter), "r"):
        first = set_topic("#ops", "A").outcome  # then the process ends; the run is reopened
    rt = runtime(tmp_path, set_topic.adapter)
    with effects.run(rt, "r") as run:
        outcomes = [set_topic("#ops", text).outcome for text in ("A", "B", "A", "A")]
        broken.append(True)
        set_topic("#ops", "C")  # no equal effect on record: holds() is not read
        with pytest.raises(EffectNotSettledError) as caught:
            set_topic("#ops", "A")  # an equal effect on record, the reader down: nothing sent
        assert run.phase is Phase.RUNNING
    # Reopened, A holds A: replayed. B, A: new effects. A again: it holds A, replayed.
    assert [first, *outcomes] == ["executed", "replayed", "executed", "executed", "replayed"]
    assert caught.value.reason == "adapter_unavailable"
    sent = [json.loads(b)[1] for _, b in seen(tmp_path, "topic")]
    assert sent == ["A", "B", "A", "C"]
    assert len({k for k, _ in seen(tmp_path, "topic")}) == 4  # a new key for each new effect
