"""Races between real worker processes on one store file or one PostgreSQL schema.

Two spawned processes stay alive for all trials and meet at barriers: each
trial both load the mark at generation N, a barrier releases them together,
and both commit ``expected_generation=N``. Exactly one must win every time
and the other must get a typed error. A second test lets one process's lease
expire while it sleeps, another process claims the run, and the first
one's late commit must be refused without changing anything.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tether.core import GenerationConflictError, LeaseError, LeaseLostError
from tether.store import PostgresStore, SQLiteStore
from tether.testing.store_conformance import make_commit

RUN = "race"
TRIALS = int(os.environ.get("TETHER_RACE_TRIALS", "200"))
WAIT_S = 60.0

Spec = tuple[str, str]  # ("sqlite", path) or ("postgres", conninfo): picklable for spawn


def _open(spec: Spec) -> Any:
    kind, where = spec
    return SQLiteStore(where) if kind == "sqlite" else PostgresStore(where, max_connections=2)


# -- what runs in the child processes ------------------------------------------------


def _contender(spec: Spec, name: str, trials: int, barrier: Any, results: Any) -> None:
    """Load the mark, wait for the rival, commit; report one outcome per trial."""
    outcomes: list[tuple[str, int, str]] = []
    try:
        store = _open(spec)
        try:
            for trial in range(trials):
                barrier.wait(WAIT_S)  # both finished the previous trial
                mark = store.get_mark(RUN)
                barrier.wait(WAIT_S)  # both hold generation N: go
                attempt = make_commit(RUN, mark.generation + 1, f"{name}-{trial}".encode())
                try:
                    store.commit(attempt, mark.generation)
                    outcomes.append(("won", mark.generation, attempt.checkpoint_digest))
                except (GenerationConflictError, LeaseError) as exc:
                    outcomes.append(("typed", mark.generation, type(exc).__name__))
                except Exception as exc:
                    outcomes.append(("other", mark.generation, repr(exc)))
        finally:
            store.close()
    except BaseException as exc:
        outcomes.append(("crashed", -1, repr(exc)))
    results.put((name, outcomes))


def _old_holder(spec: Spec, ttl_s: float, events: Any, results: Any) -> None:
    """Acquire with a short ttl, sleep past it, then try to commit with the old version."""
    try:
        store = _open(spec)
        try:
            mark = store.get_mark(RUN)
            lease = store.acquire_lease(RUN, "worker-a", ttl_s)
            results.put(("a-acquired", lease.lease_version))
            events["a_acquired"].set()
            time.sleep(ttl_s + 0.2)  # "paused" past the lease
            if not events["b_committed"].wait(WAIT_S):
                raise TimeoutError("worker B never committed")
            late = make_commit(RUN, mark.generation + 1, b"worker-a-late")
            try:
                store.commit(late, mark.generation, lease.lease_version)
                results.put(("a-commit", "landed", late.checkpoint_digest))
            except LeaseLostError as exc:
                results.put(("a-commit", "LeaseLostError", (exc.expected, exc.actual)))
            try:
                store.check_lease(RUN, lease.lease_version)
                results.put(("a-check", "passed"))
            except LeaseLostError:
                results.put(("a-check", "LeaseLostError"))
            results.put(("a-late-digest", late.checkpoint_digest))
        finally:
            store.close()
    except BaseException as exc:
        results.put(("a-crashed", repr(exc)))


def _new_holder(spec: Spec, events: Any, results: Any) -> None:
    """Claim the run once A's lease expired, then commit with the new version."""
    try:
        store = _open(spec)
        try:
            if not events["a_acquired"].wait(WAIT_S):
                raise TimeoutError("worker A never acquired")
            deadline = time.monotonic() + WAIT_S
            claimed: list[Any] = []
            while not claimed and time.monotonic() < deadline:
                claimed = store.claim_expired("worker-b", 30.0)
                if not claimed:
                    time.sleep(0.02)
            lease = claimed[0]
            results.put(("b-claimed", lease.lease_version))
            mark = store.get_mark(RUN)
            mine = make_commit(RUN, mark.generation + 1, b"worker-b")
            store.commit(mine, mark.generation, lease.lease_version)
            results.put(("b-commit", mine.checkpoint_digest))
            events["b_committed"].set()
        finally:
            store.close()
    except BaseException as exc:
        results.put(("b-crashed", repr(exc)))
        events["b_committed"].set()


# -- the tests -------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Spec]:
    """A fresh database every process of the test opens by itself."""
    if request.param == "sqlite":
        yield ("sqlite", str(tmp_path / "race.sqlite"))
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield ("postgres", in_schema(dsn, schema))


def _seed(spec: Spec) -> str:
    store = _open(spec)
    try:
        first = make_commit(RUN, 1, b"seed")
        store.commit(first, 0)
        return first.checkpoint_digest
    finally:
        store.close()


def test_two_processes_racing_for_one_generation_exactly_one_wins_every_time(spec: Spec) -> None:
    """Over 200 trials two processes commit at the same generation: one wins, one gets a typed error."""
    _seed(spec)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_contender, args=(spec, name, TRIALS, barrier, results))
        for name in ("w1", "w2")
    ]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    reports = dict(results.get(timeout=WAIT_S * 4) for _ in workers)
    for worker in workers:
        worker.join(timeout=WAIT_S)
    elapsed = time.monotonic() - started

    tally: Counter[str] = Counter()
    losses: Counter[str] = Counter()
    wins_by: Counter[str] = Counter()
    winners: list[str] = []
    for trial, (one, two) in enumerate(zip(reports["w1"], reports["w2"], strict=True)):
        assert one[1] == two[1] == trial + 1, f"trial {trial}: both load generation N"
        kinds = sorted((one[0], two[0]))
        tally[f"{kinds[0]}+{kinds[1]}"] += 1
        for name, outcome in (("w1", one), ("w2", two)):
            if outcome[0] == "won":
                winners.append(outcome[2])
                wins_by[name] += 1
            else:
                losses[f"{outcome[0]}:{outcome[2]}"] += 1
    print(
        f"\n[{spec[0]}] trials={len(reports['w1'])} pairs={dict(tally)} wins={len(winners)} "
        f"wins_by={dict(wins_by)} losses={dict(losses)} elapsed={elapsed:.1f}s"
    )
    assert len(reports["w1"]) == len(reports["w2"]) == TRIALS
    assert tally == Counter({"typed+won": TRIALS}), tally

    store = _open(spec)
    try:
        mark = store.get_mark(RUN)
        assert mark is not None
        assert (mark.generation, mark.checkpoint_digest) == (TRIALS + 1, winners[-1])
        assert all(store.get_checkpoint(RUN, d) is not None for d in winners)
        assert store.newest_generation(RUN) == TRIALS + 1
    finally:
        store.close()


def test_a_late_commit_after_a_takeover_between_processes_changes_nothing(spec: Spec) -> None:
    """A's lease expires while it sleeps, B claims (version + 1) and commits, A's late commit is refused."""
    seed_digest = _seed(spec)
    ctx = multiprocessing.get_context("spawn")
    events = {"a_acquired": ctx.Event(), "b_committed": ctx.Event()}
    results = ctx.Queue()
    a = ctx.Process(target=_old_holder, args=(spec, 0.3, events, results))
    b = ctx.Process(target=_new_holder, args=(spec, events, results))
    a.start()
    b.start()
    facts: dict[str, Any] = {}
    while "a-late-digest" not in facts and not any(k.endswith("crashed") for k in facts):
        kind, *rest = results.get(timeout=WAIT_S)
        facts[kind] = rest[0] if len(rest) == 1 else tuple(rest)
    a.join(timeout=WAIT_S)
    b.join(timeout=WAIT_S)
    print(f"\n[{spec[0]}] takeover facts: {facts}")

    assert not any(k.endswith("crashed") for k in facts), facts
    assert facts["a-acquired"] == 1
    assert facts["b-claimed"] == 2
    assert facts["a-commit"] == ("LeaseLostError", (1, 2))
    assert facts["a-check"] == "LeaseLostError"
    store = _open(spec)
    try:
        mark = store.get_mark(RUN)
        assert mark is not None
        assert (mark.generation, mark.checkpoint_digest) == (2, facts["b-commit"])
        assert (mark.lease_owner, mark.lease_version) == ("worker-b", 2)
        assert store.get_checkpoint(RUN, facts["a-late-digest"]) is None
        assert store.get_checkpoint(RUN, seed_digest) is not None
    finally:
        store.close()
