"""Group commit on real SQLite and PostgreSQL: commits queued together land in one transaction.

Each test holds the first committer inside its transaction (its
``before_commit`` waits) until the others have queued behind it, so the
batch they form is known; then it checks what landed, what each committer
was told, and how many transactions the store committed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tether.core import (
    GenerationConflictError,
    LeaseLostError,
    StoreUnavailableError,
    WriteOnceError,
)
from tether.runtime import CrashPoint, SimulatedCrash
from tether.store import Commit, PostgresStore, SQLiteStore
from tether.testing.store_conformance import make_commit, make_events


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each store tether ships, on a database of its own."""
    if request.param == "sqlite":
        with SQLiteStore(tmp_path / "store.sqlite") as opened:
            yield opened
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema, PostgresStore(in_schema(dsn, schema)) as opened:
        yield opened


class Outcomes:
    """What each committer thread was told: the value returned, or the error raised."""

    def __init__(self) -> None:
        self.told: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []

    def commit(self, store: Any, name: str, *args: Any, **kwargs: Any) -> None:
        def body() -> None:
            try:
                self.told[name] = store.commit(*args, **kwargs)
            except BaseException as exc:  # every outcome is recorded, none escapes the thread
                self.told[name] = exc

        thread = threading.Thread(target=body, name=name)
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=30)


def _wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the committers never queued")
        time.sleep(0.001)


def _held(store: Any, outcomes: Outcomes) -> threading.Event:
    """A first commit (run ``first``) held inside its transaction until the event is set."""
    store.commit(make_commit("first", 1), 0)
    go = threading.Event()
    outcomes.commit(store, "first", make_commit("first", 2), 1, 0, lambda: go.wait(30) and None)
    group = store._group
    if group is None:
        raise AssertionError("tether's stores group their commits")
    _wait_until(lambda: group._leading and not group._queue)
    return go


def _queue_behind(store: Any, outcomes: Outcomes, commits: list[tuple[str, Any]]) -> None:
    for name, args in commits:
        outcomes.commit(store, name, *args)
    group = store._group
    if group is None:
        raise AssertionError("tether's stores group their commits")
    _wait_until(lambda: len(group._queue) == len(commits))


def _seed(store: Any, run_id: str, leased: bool = False) -> int:
    """Run ``run_id`` at generation 1; leased: its lease version (else 0)."""
    store.commit(make_commit(run_id, 1), 0)
    if not leased:
        return 0
    return store.acquire_lease(run_id, "w", 60).lease_version


def test_commits_queued_together_land_in_one_transaction(store: Any) -> None:
    """Five runs' commits queued behind a transaction are written by the next one, all five."""
    runs = [f"r{i}" for i in range(5)]
    versions = {run_id: _seed(store, run_id, leased=True) for run_id in runs}
    outcomes = Outcomes()
    go = _held(store, outcomes)
    before = store.transactions_committed
    _queue_behind(
        store,
        outcomes,
        [(r, (make_commit(r, 2), 1, versions[r])) for r in runs],
    )
    go.set()
    outcomes.join()
    assert all(outcomes.told[name] is None for name in ["first", *runs])
    assert store.transactions_committed - before == 2  # the held one, then the five together
    for run_id in runs:
        mark = store.get_mark(run_id)
        assert mark is not None and mark.generation == 2


def test_a_refused_commit_in_a_batch_fails_alone_with_its_own_error(store: Any) -> None:
    """A lost lease and a stale generation refuse only their runs' commits; the rest land."""
    for run_id in ("ok1", "ok2", "stale"):
        _seed(store, run_id)
    lost_version = _seed(store, "lost", leased=True)
    store.acquire_lease(
        "lost", "w", 60
    )  # taken again (a restarted worker): the old token is fenced
    outcomes = Outcomes()
    go = _held(store, outcomes)
    _queue_behind(
        store,
        outcomes,
        [
            ("ok1", (make_commit("ok1", 2), 1)),
            ("lost", (make_commit("lost", 2), 1, lost_version)),
            ("stale", (make_commit("stale", 3, b"skips"), 2)),
            ("ok2", (make_commit("ok2", 2), 1)),
        ],
    )
    go.set()
    outcomes.join()
    assert outcomes.told["ok1"] is None and outcomes.told["ok2"] is None
    assert isinstance(outcomes.told["lost"], LeaseLostError)
    assert isinstance(outcomes.told["stale"], GenerationConflictError)
    generations = {r: store.get_mark(r).generation for r in ("ok1", "ok2", "lost", "stale")}  # type: ignore[union-attr]
    assert generations == {"ok1": 2, "ok2": 2, "lost": 1, "stale": 1}
    # The refused ones wrote nothing: their checkpoints are not in the store.
    assert store.newest_generation("lost") == 1 and store.newest_generation("stale") == 1


def _torn(store: Any, run_id: str) -> Commit:
    """Generation 2 of ``run_id`` (seeded at 1 with one event) that the store refuses as
    a write-once violation after its compare-and-set has run.

    SQLite: its digest does not address its envelope (checked as its content
    is written, after the CAS: undone to its savepoint); PostgreSQL: it
    carries the stored event again (the database refuses the row, which
    aborts the whole transaction: the batch is written again one commit at a
    time).
    """
    sealed = make_commit(run_id, 2, events=make_events(run_id, 1))
    if isinstance(store, PostgresStore):
        return sealed
    return Commit(
        sealed.run_id,
        sealed.generation,
        "sha256:" + "0" * 64,
        sealed.envelope,
        (),
        sealed.blobs,
        sealed.phase,
        sealed.ledger,
    )


def test_a_write_once_violation_in_a_batch_rolls_back_only_its_commit(store: Any) -> None:
    """A commit whose content collides is refused with WriteOnceError alone; the others land."""
    _seed(store, "ok")
    store.commit(make_commit("torn", 1, events=make_events("torn", 1)), 0)
    outcomes = Outcomes()
    go = _held(store, outcomes)
    _queue_behind(
        store,
        outcomes,
        [
            ("torn", (_torn(store, "torn"), 1)),
            ("ok", (make_commit("ok", 2), 1)),
        ],
    )
    go.set()
    outcomes.join()
    assert isinstance(outcomes.told["torn"], WriteOnceError)
    assert outcomes.told["ok"] is None
    torn = store.get_mark("torn")
    assert torn is not None and torn.generation == 1  # the CAS it ran first was undone
    ok = store.get_mark("ok")
    assert ok is not None and ok.generation == 2


def _crash() -> None:
    raise SimulatedCrash(CrashPoint.CHECKPOINT_WRITE)


def test_a_crash_inside_a_batch_loses_the_whole_batch(store: Any) -> None:
    """A simulated death while a batch is written leaves every run of it where it was."""
    runs = ["a", "b", "c"]
    for run_id in runs:
        _seed(store, run_id)
    outcomes = Outcomes()
    go = _held(store, outcomes)
    before = store.transactions_committed
    _queue_behind(
        store,
        outcomes,
        [
            ("a", (make_commit("a", 2), 1)),
            ("b", (make_commit("b", 2), 1, 0, _crash)),
            ("c", (make_commit("c", 2), 1)),
        ],
    )
    go.set()
    outcomes.join()
    assert isinstance(outcomes.told["b"], SimulatedCrash)
    assert isinstance(outcomes.told["a"], StoreUnavailableError)
    assert isinstance(outcomes.told["c"], StoreUnavailableError)
    assert store.transactions_committed - before == 1  # the held one only
    for run_id in runs:
        mark = store.get_mark(run_id)
        assert mark is not None and mark.generation == 1
        assert store.newest_generation(run_id) == 1


def test_a_committer_alone_writes_at_once(store: Any) -> None:
    """With no one queued, each commit is its own transaction, as without grouping."""
    before = store.transactions_committed
    for generation in range(1, 6):
        store.commit(make_commit("alone", generation), generation - 1)
    assert store.transactions_committed - before == 5
    group = store._group
    assert group is not None and not group._leading and not group._queue


def test_a_commit_inside_a_callers_transaction_joins_it(store: Any) -> None:
    """A commit made inside ``transaction`` joins that transaction instead of queueing."""
    before = store.transactions_committed

    def body(_: Any) -> None:
        store.commit(make_commit("inner", 1), 0)

    store.transaction(body)
    assert store.transactions_committed - before == 1
    mark = store.get_mark("inner")
    assert mark is not None and mark.generation == 1


def test_no_committer_returns_before_its_batch_is_committed(store: Any) -> None:
    """While a batch's transaction is open, none of its committers has been answered."""
    for run_id in ("a", "b", "c"):
        _seed(store, run_id)
    outcomes = Outcomes()
    go = _held(store, outcomes)
    inside = threading.Event()
    finish = threading.Event()

    def last_body() -> None:
        inside.set()
        finish.wait(30)

    _queue_behind(
        store,
        outcomes,
        [
            ("a", (make_commit("a", 2), 1)),
            ("b", (make_commit("b", 2), 1)),
            ("c", (make_commit("c", 2), 1, 0, last_body)),
        ],
    )
    go.set()
    assert inside.wait(30)  # a, b and c's statements have run; the COMMIT has not
    time.sleep(0.2)  # time for a committer answered too early to record its answer
    answered = sorted(name for name in outcomes.told if name != "first")
    finish.set()
    outcomes.join()
    assert answered == []
    assert [outcomes.told[name] for name in ("a", "b", "c")] == [None, None, None]


class _Interrupted(Exception):
    """Raised by the test's signal handler in the thread waiting for its batch."""


def test_a_committer_interrupted_while_queued_drops_its_commit_and_blocks_no_one(
    store: Any,
) -> None:
    """A commit whose waiting committer is interrupted never lands, and later commits still do."""
    _seed(store, "gone")
    _seed(store, "after")
    outcomes = Outcomes()
    go = _held(store, outcomes)
    group = store._group

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupted

    def fire() -> None:
        _wait_until(lambda: len(group._queue) == 1)
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        threading.Thread(target=fire).start()
        with pytest.raises(_Interrupted):
            store.commit(make_commit("gone", 2), 1)  # the main thread waits behind "first"
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert group._queue == []
    go.set()
    outcomes.join()
    store.commit(make_commit("after", 2), 1)  # leads at once: nobody holds the lead
    gone, after = store.get_mark("gone"), store.get_mark("after")
    assert gone is not None and gone.generation == 1
    assert after is not None and after.generation == 2


def test_a_committer_chosen_to_lead_that_stops_waiting_hands_the_lead_on(store: Any) -> None:
    """If the committer woken to lead is gone, the next one in line is woken to lead instead."""
    from tether.store._group import _Request

    group = store._group
    gone = _Request(lambda: None, None, None)
    next_in_line = _Request(lambda: None, None, None)
    # Queued behind a leader, as submit queues them: each waits on an event of its own.
    gone.wake, next_in_line.wake = threading.Event(), threading.Event()
    group._queue.extend([gone, next_in_line])
    group._leading = True
    gone.wake.set()  # chosen by the leader before it
    group._abandon(gone)
    assert group._queue == [next_in_line] and next_in_line.wake.is_set() and group._leading
    group._queue.clear()
    group._abandon(next_in_line)  # already taken: nothing to do
    group._leading = False
