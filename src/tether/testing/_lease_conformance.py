"""Store conformance, part two: leases, fencing on commit, and races between connections.

Expiry is exercised for real: a tiny ttl (0.2 s) and a sleep past it. The
race checks open two connections to the same database and let two threads
meet at a barrier before they commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tether.core import (
    EffectStatus,
    GenerationConflictError,
    LeaseError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLostError,
    RunNotFoundError,
    StoreError,
)
from tether.core._retry import failed_claims
from tether.testing._store_conformance import (
    StoreFactory,
    chained,
    expect,
    expect_eq,
    make_commit,
    seeded,
)

TTL = 0.2  # seconds of the store's clock
PAST_TTL = 0.35  # a sleep that outlasts TTL with room for scheduling jitter
LONG = 30.0


def _unchanged(store: Any, run_id: str, generation: int, digest: str) -> None:
    mark = store.get_mark(run_id)
    expect_eq((mark.generation, mark.checkpoint_digest), (generation, digest), f"mark of {run_id}")


# -- acquire, renew, release, check ---------------------------------------------


def test_acquire_gives_a_new_owner_a_new_version(tether_store: Any) -> None:
    """A first acquire sets version 1; re-acquiring, even by the same owner, is a new token."""
    seeded(tether_store)
    lease = tether_store.acquire_lease("r", "w1", LONG)
    expect_eq((lease.run_id, lease.owner, lease.lease_version), ("r", "w1", 1), "first lease")
    expect_eq((lease.generation, lease.state_version), (1, 1), "lease carries the mark")
    again = tether_store.acquire_lease("r", "w1", LONG * 2)
    expect_eq(again.lease_version, 2, "re-acquire by the same owner fences the old session")
    expect(again.expires_at > lease.expires_at, "re-acquire extends the expiry")
    with pytest.raises(LeaseLostError):
        tether_store.check_lease("r", 1)
    mark = tether_store.get_mark("r")
    expect_eq((mark.lease_owner, mark.lease_version), ("w1", 2), "mark after acquire")
    expect_eq(mark.lease_expires_at, again.expires_at, "mark's expiry")


def test_a_run_created_with_its_lease_is_held_from_its_first_statement(tether_store: Any) -> None:
    """commit and cas_mark with lease_to create the run held at version 1: no claim takes it first."""
    from tether.store import LeaseRequest

    lease = tether_store.commit(make_commit("r", 1), 0, lease_to=LeaseRequest("w1", LONG))
    expect_eq((lease.run_id, lease.owner, lease.lease_version), ("r", "w1", 1), "granted lease")
    mark = tether_store.get_mark("r")
    expect_eq((mark.lease_owner, mark.lease_version), ("w1", 1), "mark of the new run")
    expect_eq(mark.lease_expires_at, lease.expires_at, "expiry")
    expect_eq(tether_store.claim_expired("w2", LONG, limit=5), [], "claims of a held new run")
    tether_store.check_lease("r", 1)
    other = tether_store.cas_mark(
        "q", 0, 1, make_commit("q", 1).checkpoint_digest, lease_to=LeaseRequest("w1", LONG)
    )
    expect_eq((other.owner, other.lease_version), ("w1", 1), "cas_mark's granted lease")
    with pytest.raises(StoreError):  # a lease comes with the first generation only
        tether_store.commit(make_commit("r", 2), 1, 1, lease_to=LeaseRequest("w1", LONG))
    with pytest.raises(GenerationConflictError):  # the run exists: no second creation
        tether_store.commit(make_commit("r", 1, b"again"), 0, lease_to=LeaseRequest("w2", LONG))
    expect_eq(tether_store.get_mark("r").lease_owner, "w1", "owner after a refused creation")


def test_a_live_lease_is_not_taken(tether_store: Any) -> None:
    """Another worker's acquire of a live lease raises LeaseHeldError naming the holder."""
    seeded(tether_store)
    held = tether_store.acquire_lease("r", "w1", LONG)
    with pytest.raises(LeaseHeldError) as caught:
        tether_store.acquire_lease("r", "w2", LONG)
    expect_eq(
        (caught.value.owner, caught.value.lease_version, caught.value.expires_at),
        ("w1", 1, held.expires_at),
        "holder in the error",
    )
    expect_eq(tether_store.get_mark("r").lease_owner, "w1", "owner after the refusal")


def test_lease_calls_on_an_unknown_run_raise_run_not_found(tether_store: Any) -> None:
    """acquire, renew, release and check on a run the store never saw raise RunNotFoundError."""
    calls: list[Callable[[], object]] = [
        lambda: tether_store.acquire_lease("ghost", "w", LONG),
        lambda: tether_store.renew_lease("ghost", "w", 1, LONG),
        lambda: tether_store.release_lease("ghost", "w", 1),
        lambda: tether_store.check_lease("ghost", 1),
    ]
    for call in calls:
        with pytest.raises(RunNotFoundError):
            call()


def test_a_ttl_must_be_positive(tether_store: Any) -> None:
    """A zero, negative or non-finite ttl is refused with StoreError."""
    seeded(tether_store)
    for ttl in (0, -1, float("nan"), float("inf")):
        with pytest.raises(StoreError):
            tether_store.acquire_lease("r", "w", ttl)
    expect_eq(tether_store.get_mark("r").lease_owner, None, "owner after refusals")


def test_an_expired_lease_is_taken_over_with_a_new_version(tether_store: Any) -> None:
    """Past its ttl by the store's clock a lease goes to the next worker, and the version increments."""
    seeded(tether_store)
    tether_store.acquire_lease("r", "w1", TTL)
    with pytest.raises(LeaseHeldError):
        tether_store.acquire_lease("r", "w2", LONG)
    time.sleep(PAST_TTL)
    taken = tether_store.acquire_lease("r", "w2", LONG)
    expect_eq((taken.owner, taken.lease_version), ("w2", 2), "lease after takeover")
    with pytest.raises(LeaseLostError):
        tether_store.renew_lease("r", "w1", 1, LONG)


def test_renew_extends_only_the_current_lease(tether_store: Any) -> None:
    """Renew extends the holder's lease, even expired if nobody took over; a wrong owner or version loses."""
    seeded(tether_store)
    lease = tether_store.acquire_lease("r", "w1", TTL)
    time.sleep(PAST_TTL)
    renewed = tether_store.renew_lease("r", "w1", 1, LONG)
    expect_eq(renewed.lease_version, 1, "renew keeps the version")
    expect(renewed.expires_at > lease.expires_at, "renew extends the expiry")
    tether_store.check_lease("r", 1)
    with pytest.raises(LeaseLostError):
        tether_store.renew_lease("r", "w2", 1, LONG)
    with pytest.raises(LeaseLostError):
        tether_store.renew_lease("r", "w1", 2, LONG)


def test_release_frees_the_run_and_repeats_harmlessly(tether_store: Any) -> None:
    """A released run is acquired by another worker at once; a stale release raises LeaseLostError."""
    seeded(tether_store)
    tether_store.acquire_lease("r", "w1", LONG)
    tether_store.release_lease("r", "w1", 1)
    tether_store.release_lease("r", "w1", 1)  # already released: a no-op
    mark = tether_store.get_mark("r")
    expect_eq((mark.lease_owner, mark.lease_expires_at), (None, None), "mark after release")
    taken = tether_store.acquire_lease("r", "w2", LONG)
    expect_eq(taken.lease_version, 2, "version after release and a new acquire")
    with pytest.raises(LeaseLostError):
        tether_store.release_lease("r", "w1", 1)
    expect_eq(tether_store.get_mark("r").lease_owner, "w2", "owner after a stale release")


def test_check_lease_refuses_lost_released_and_expired_leases(tether_store: Any) -> None:
    """check_lease passes a live current lease and names every other case with its own error."""
    seeded(tether_store)
    tether_store.check_lease("r", 0)  # never leased: single-process use passes
    tether_store.acquire_lease("r", "w1", TTL)
    tether_store.check_lease("r", 1)
    with pytest.raises(LeaseLostError):
        tether_store.check_lease("r", 0)
    time.sleep(PAST_TTL)
    with pytest.raises(LeaseExpiredError) as expired:
        tether_store.check_lease("r", 1)
    expect_eq(expired.value.expected, 1, "expired version")
    tether_store.acquire_lease("r", "w2", LONG)
    with pytest.raises(LeaseLostError) as lost:
        tether_store.check_lease("r", 1)
    expect_eq((lost.value.expected, lost.value.actual), (1, 2), "lost versions")
    tether_store.release_lease("r", "w2", 2)
    with pytest.raises(LeaseLostError):
        tether_store.check_lease("r", 2)


# -- fencing on commit ----------------------------------------------------------


def test_a_commit_with_a_superseded_lease_version_changes_nothing(tether_store: Any) -> None:
    """After a takeover the old version's commit raises LeaseLostError and writes nothing."""
    first = seeded(tether_store)
    tether_store.acquire_lease("r", "w1", TTL)
    with pytest.raises(LeaseLostError):
        tether_store.commit(make_commit("r", 2, b"unleased"), 1, 0)
    time.sleep(PAST_TTL)
    tether_store.acquire_lease("r", "w2", LONG)
    late = make_commit("r", 2, b"late")
    with pytest.raises(LeaseLostError) as caught:
        tether_store.commit(late, 1, 1)
    expect_eq((caught.value.expected, caught.value.actual), (1, 2), "versions in the error")
    with pytest.raises(LeaseLostError):
        tether_store.cas_mark("r", 1, 2, late.checkpoint_digest, 1)
    _unchanged(tether_store, "r", 1, first.checkpoint_digest)
    expect_eq(tether_store.get_checkpoint("r", late.checkpoint_digest), None, "late content")
    tether_store.commit(make_commit("r", 2, b"current"), 1, 2)
    expect_eq(tether_store.get_mark("r").generation, 2, "the current holder commits")


def test_an_expired_lease_nobody_took_still_commits(tether_store: Any) -> None:
    """Expiry alone does not fence a commit: only a takeover moves the version."""
    seeded(tether_store)
    tether_store.acquire_lease("r", "w1", TTL)
    time.sleep(PAST_TTL)
    tether_store.commit(make_commit("r", 2), 1, 1)
    expect_eq(tether_store.get_mark("r").generation, 2, "generation")


def test_a_released_lease_does_not_commit(tether_store: Any) -> None:
    """After release, a commit with the released version is refused with LeaseLostError."""
    first = seeded(tether_store)
    tether_store.acquire_lease("r", "w1", LONG)
    tether_store.release_lease("r", "w1", 1)
    with pytest.raises(LeaseLostError):
        tether_store.commit(make_commit("r", 2), 1, 1)
    _unchanged(tether_store, "r", 1, first.checkpoint_digest)


def test_runs_that_were_never_leased_commit_with_version_zero(tether_store: Any) -> None:
    """Single-process use: expected_lease_version 0 commits as long as nobody ever leased the run."""
    seeded(tether_store, generations=3)
    expect_eq(tether_store.get_mark("r").lease_version, 0, "lease version")


# -- claiming expired runs ------------------------------------------------------


def test_claim_expired_takes_unowned_and_expired_runs_in_the_given_phases(
    tether_store: Any,
) -> None:
    """Unowned and expired runs in running/pending are claimed with a new version; others are left."""
    tether_store.commit(make_commit("fresh", 1), 0)
    tether_store.commit(make_commit("pending", 1, phase="pending"), 0)
    tether_store.commit(make_commit("done", 1, phase="completed"), 0)
    tether_store.commit(make_commit("live", 1), 0)
    tether_store.commit(make_commit("stale", 1), 0)
    tether_store.acquire_lease("live", "other", LONG)
    tether_store.acquire_lease("stale", "other", TTL)
    time.sleep(PAST_TTL)
    claimed = tether_store.claim_expired("w", LONG, limit=10)
    expect_eq(
        sorted((c.run_id, c.owner, c.lease_version) for c in claimed),
        [("fresh", "w", 1), ("pending", "w", 1), ("stale", "w", 2)],
        "claimed runs",
    )
    expect_eq(tether_store.claim_expired("w2", LONG, limit=10), [], "nothing left to claim")
    expect_eq(tether_store.get_mark("done").lease_owner, None, "a completed run is left alone")
    expect_eq(tether_store.get_mark("live").lease_owner, "other", "a live lease is left alone")
    only = tether_store.claim_expired("w3", LONG, limit=5, phases=("completed",))
    expect_eq([c.run_id for c in only], ["done"], "claim restricted to phases")


def test_claim_expired_respects_its_limit(tether_store: Any) -> None:
    """claim_expired returns at most ``limit`` runs, and a limit of 0 claims nothing."""
    for i in range(5):
        tether_store.commit(make_commit(f"r{i}", 1), 0)
    expect_eq(tether_store.claim_expired("w", LONG, limit=0), [], "limit 0")
    expect_eq(len(tether_store.claim_expired("w", LONG, limit=2)), 2, "limit 2")
    expect_eq(len(tether_store.claim_expired("w", LONG, limit=10)), 3, "the rest")


# -- races between two connections ----------------------------------------------


def _race(stores: list[Any], act: Callable[[int, Any], object]) -> list[object]:
    """Run ``act(i, stores[i])`` in one thread per store, released together by a barrier."""
    barrier = threading.Barrier(len(stores))
    outcomes: list[object] = [None] * len(stores)

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=LONG)
            outcomes[i] = act(i, stores[i])
        except BaseException as exc:  # every outcome is judged by the caller
            outcomes[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=LONG * 2)
    expect(not any(t.is_alive() for t in threads), "a racing thread hung")
    return outcomes


def test_two_connections_racing_for_one_generation_exactly_one_wins(
    tether_store: Any, tether_connect: StoreFactory
) -> None:
    """Two connections commit at the same expected generation: one wins, the other gets a typed error."""
    stores = [tether_store, tether_connect()]
    seeded(tether_store)
    trials = 25
    for _ in range(trials):
        generation = stores[0].get_mark("r").generation
        expect_eq(stores[1].get_mark("r").generation, generation, "both load the same mark")
        commits = [make_commit("r", generation + 1, f"worker-{i}".encode()) for i in range(2)]

        def commit(i: int, store: Any, generation: int = generation, commits: Any = commits) -> str:
            store.commit(commits[i], generation)
            return "won"

        outcomes = _race(stores, commit)
        winners = [i for i, o in enumerate(outcomes) if o == "won"]
        expect_eq(len(winners), 1, f"winners of generation {generation + 1} ({outcomes!r})")
        loser = outcomes[1 - winners[0]]
        expect(
            isinstance(loser, GenerationConflictError | LeaseError), f"typed loss, got {loser!r}"
        )
        _unchanged(tether_store, "r", generation + 1, commits[winners[0]].checkpoint_digest)
        expect_eq(
            stores[0].get_checkpoint("r", commits[1 - winners[0]].checkpoint_digest),
            None,
            "loser content",
        )
    expect_eq(tether_store.get_mark("r").generation, trials + 1, "generation after all trials")


def test_a_late_commit_racing_a_takeover_never_lands_after_it(
    tether_store: Any, tether_connect: StoreFactory
) -> None:
    """An expired holder's commit racing a claim lands before the takeover or is refused, never after."""
    stores = [tether_store, tether_connect()]
    seeded(tether_store)
    for trial in range(6):
        mark = tether_store.get_mark("r")
        lease = tether_store.acquire_lease("r", f"old-{trial}", TTL)
        time.sleep(PAST_TTL)
        late = make_commit("r", mark.generation + 1, f"late-{trial}".encode())

        def act(
            i: int,
            store: Any,
            late: Any = late,
            version: int = lease.lease_version,
            trial: int = trial,
        ) -> object:
            if i == 0:
                store.commit(late, late.generation - 1, version)
                return "committed"
            return store.claim_expired(f"new-{trial}", LONG)

        committed, claimed = _race(stores, act)
        expect(isinstance(claimed, list), f"the claim raised {claimed!r}")
        after = tether_store.get_mark("r")
        if committed == "committed":
            expect_eq(after.generation, mark.generation + 1, "a commit that won landed")
            if isinstance(claimed, list) and claimed:
                # Both succeeded: the commit must have landed BEFORE the takeover,
                # so the new holder's lease names the generation it made.
                expect_eq(
                    claimed[0].generation,
                    mark.generation + 1,
                    "the generation the takeover saw (a late commit landed after it)",
                )
        else:
            expect(isinstance(committed, LeaseLostError), f"typed refusal, got {committed!r}")
            expect(claimed != [], "only a takeover refuses the old holder")
            _unchanged(tether_store, "r", mark.generation, mark.checkpoint_digest)
        if claimed:  # a claimer may skip a row a committer holds locked: then nothing moved
            expect_eq(after.lease_version, lease.lease_version + 1, "version after the claim")
            tether_store.release_lease("r", f"new-{trial}", after.lease_version)


def test_concurrent_claimers_never_share_a_run(
    tether_store: Any, tether_connect: StoreFactory
) -> None:
    """Two connections claiming in a loop split the runs between them: none is claimed twice."""
    runs = [f"r{i:02d}" for i in range(20)]
    for run_id in runs:
        tether_store.commit(make_commit(run_id, 1), 0)
    stores = [tether_store, tether_connect()]

    def drain(i: int, store: Any) -> list[str]:
        got: list[str] = []
        while batch := store.claim_expired(f"w{i}", LONG, limit=3):
            got.extend(lease.run_id for lease in batch)
        return got

    outcomes = _race(stores, drain)
    for outcome in outcomes:
        expect(isinstance(outcome, list), f"a claimer failed: {outcome!r}")
    claimed = [run_id for outcome in outcomes if isinstance(outcome, list) for run_id in outcome]
    expect_eq(sorted(claimed), runs, "every run claimed exactly once")
    expect(all(m.lease_version == 1 for m in tether_store.runs()), "one claim per run")


def test_racing_commits_land_one_ledger(tether_store: Any, tether_connect: StoreFactory) -> None:
    """Two connections committing the same generation with ledger rows: one lands, with only its rows."""
    stores = [tether_store, tether_connect()]
    for trial in range(10):
        run_id = f"r{trial}"
        tether_store.commit(make_commit(run_id, 1), 0)

        def advance(i: int, store: Any, run_id: str = run_id) -> object:
            rows = chained(f"k{i}", [EffectStatus.INTENDED], run_id=run_id, action_id=f"a{i}")
            store.commit(make_commit(run_id, 2, str(i).encode(), ledger=rows), 1)
            return rows

        outcomes = _race(stores, advance)
        won = [o for o in outcomes if isinstance(o, list)]
        lost = [o for o in outcomes if isinstance(o, GenerationConflictError)]
        expect_eq((len(won), len(lost)), (1, 1), f"one winner, one typed loser: {outcomes!r}")
        expect_eq(tether_store.ledger(run_id), won[0], f"only the winner's rows in {run_id}")


# -- failed attempts: defer, back off, park ---------------------------------------


def test_a_deferred_run_is_not_claimed_until_its_back_off_has_passed(tether_store: Any) -> None:
    """defer releases the lease, counts the attempt, keeps the error; claims wait out the delay."""
    seeded(tether_store)
    lease = tether_store.claim_expired("w1", LONG)[0]
    mark = tether_store.defer("r", "w1", lease.lease_version, TTL, "boom: the agent raised")
    expect_eq((mark.lease_owner, mark.attempts), (None, 1), "released, one attempt counted")
    expect_eq(mark.last_error, "boom: the agent raised", "the failure kept")
    expect(mark.retry_at is not None, "a retry time is set")
    expect_eq(tether_store.claim_expired("w2", LONG), [], "no claim during the back-off")
    time.sleep(PAST_TTL)
    again = tether_store.claim_expired("w2", LONG)
    expect_eq([x.run_id for x in again], ["r"], "claimed once the back-off passed")
    tether_store.release_lease("r", "w2", again[0].lease_version)
    after = tether_store.get_mark("r")
    expect_eq((after.attempts, after.last_error), (0, None), "reset")
    # Claimable at once again, from the moment it was let go (see the next test).
    expect_eq(tether_store.claim_expired("w3", LONG)[0].run_id, "r", "claimable at once")


def test_a_released_run_waits_its_turn_behind_runs_claimable_longer(tether_store: Any) -> None:
    """A run let go cleanly is claimable from then on, so a run claimable longer comes first."""
    for run_id in ("a", "b"):
        tether_store.commit(make_commit(run_id, 1), 0)
    first = tether_store.claim_expired("w1", LONG)
    expect_eq([x.run_id for x in first], ["a"], "created first (at the same instant: smaller id)")
    tether_store.release_lease("a", "w1", first[0].lease_version)
    expect_eq([x.run_id for x in tether_store.claim_expired("w2", LONG)], ["b"], "b waited longer")
    expect_eq([x.run_id for x in tether_store.claim_expired("w2", LONG)], ["a"], "then a")


def test_a_tie_goes_to_the_run_that_waited_longest_for_its_turn(tether_store: Any) -> None:
    """Runs claimable at the same instant go least recently taken first, whatever their ids."""
    for run_id in ("a", "b"):
        tether_store.commit(make_commit(run_id, 1), 0)

    def claims(count: int) -> list[str]:
        return [x.run_id for _ in range(count) for x in tether_store.claim_expired("w", LONG)]

    def let_go(*run_ids: str) -> None:
        # Released, and the operator's "try again" (what `tether resume` calls):
        # claimable since ever, so runs let go this way tie whatever the clock says
        # (runs created free, or released, are claimable from an instant each).
        for run_id in run_ids:
            mark = tether_store.get_mark(run_id)
            if mark.lease_owner is not None:
                tether_store.release_lease(run_id, mark.lease_owner, mark.lease_version)
            tether_store.retry_now(run_id)

    let_go("a", "b")
    expect_eq(claims(1), ["a"], "never taken, either of them: the smaller run id")
    let_go("a")
    expect_eq(claims(2), ["b", "a"], "b was never taken: its turn before a's second")
    let_go("a", "b")
    for run_id in ("b", "a"):
        tether_store.acquire_lease(run_id, "w1", LONG)
    let_go("a", "b")
    expect_eq(claims(2), ["b", "a"], "b was taken before a (an acquire is a turn too)")


def test_a_run_whose_worker_died_goes_before_runs_created_after_its_lease_ran_out(
    tether_store: Any,
) -> None:
    """A run is claimable from its creation: runs created after a dead worker's lease ran out
    queue behind that run, and a run created while the lease was live goes before it."""
    tether_store.commit(make_commit("z-dead", 1), 0)
    # A lease of a second: room for a store whose commit takes a while to create
    # the next run while it is still live.
    (dead,) = tether_store.claim_expired("w1", 1.0)  # its worker dies holding it
    tether_store.commit(make_commit("y-early", 1), 0)  # created while that lease is live
    expect(tether_store.get_mark("y-early").retry_at < dead.expires_at, "created while live")
    time.sleep(1.0 + PAST_TTL - TTL)
    for run_id in ("a-new", "b-new"):  # created once it ran out
        tether_store.commit(make_commit(run_id, 1), 0)
    fresh = tether_store.get_mark("a-new")
    expect_eq((fresh.attempts, fresh.last_error), (0, None), "a new run has failed nothing")
    expect(fresh.retry_at is not None, "a new run is claimable from its creation")
    expect(fresh.retry_at > dead.expires_at, "created after the dead worker's lease ran out")
    claimed = [x.run_id for _ in range(5) for x in tether_store.claim_expired("w2", LONG)]
    expect_eq(claimed, ["y-early", "z-dead", "a-new", "b-new"], "in the order each became due")


def test_resume_puts_a_dead_workers_run_before_runs_created_while_its_lease_was_live(
    tether_store: Any,
) -> None:
    """retry_now lets go of a lease that ran out, so the run is claimable since ever, first."""
    tether_store.commit(make_commit("z-dead", 1), 0)
    (dead,) = tether_store.claim_expired("w1", TTL)  # its worker dies holding it
    tether_store.commit(make_commit("a-early", 1), 0)  # created while that lease is live
    time.sleep(PAST_TTL)
    mark = tether_store.retry_now("z-dead")
    expect_eq((mark.lease_owner, mark.retry_at), (None, None), "its dead lease let go")
    expect_eq(mark.lease_version, dead.lease_version, "its version kept: the fence stands")
    claimed = [x.run_id for _ in range(3) for x in tether_store.claim_expired("w2", LONG)]
    expect_eq(claimed, ["z-dead", "a-early"], "the resumed run first")


def test_a_run_with_too_many_failed_attempts_is_parked(tether_store: Any) -> None:
    """claim_expired(max_attempts=N) never takes a run that failed N times; others still go."""
    seeded(tether_store)
    seeded(tether_store, "healthy")
    for attempt in range(1, 4):
        (lease,) = [x for x in tether_store.claim_expired("w1", LONG, limit=5) if x.run_id == "r"]
        mark = tether_store.defer("r", "w1", lease.lease_version, 0, f"failure {attempt}")
        expect_eq(mark.attempts, attempt, "each claim that failed counts")
        tether_store.release_lease("healthy", "w1", tether_store.get_mark("healthy").lease_version)
    claimed = tether_store.claim_expired("w2", LONG, limit=5, max_attempts=3)
    expect_eq([x.run_id for x in claimed], ["healthy"], "the parked run is left alone")
    claimed = tether_store.claim_expired("w3", LONG, limit=5, max_attempts=4)
    expect_eq([x.run_id for x in claimed], ["r"], "below the ceiling it is claimable")


def test_a_run_parked_at_one_workers_ceiling_is_taken_in_its_turn_by_a_higher_one(
    tether_store: Any,
) -> None:
    """max_attempts is the claiming worker's: a run another worker's ceiling parked is still
    taken, first come first served, by a worker that allows more; and resumed, by anyone."""
    seeded(tether_store, "deferred")
    for _ in range(2):  # a worker of max_attempts 2 defers it after each claim
        (lease,) = tether_store.claim_expired("w1", LONG, max_attempts=2)
        tether_store.defer("deferred", "w1", lease.lease_version, 0, "boom")
    seeded(tether_store, "died")
    for _ in range(2):  # that worker dies holding it, twice: a suspect
        tether_store.claim_expired("w1", TTL, max_attempts=2)
        time.sleep(PAST_TTL)
    seeded(tether_store, "later")  # claimable after both
    expect_eq(tether_store.suspect_waiting(max_attempts=2), False, "parked at 2: none due")
    expect_eq(tether_store.claim_expired("w1", LONG, 5, max_attempts=2, suspects=True), [], "")
    claimed = tether_store.claim_expired("w1", LONG, limit=5, max_attempts=2)
    expect_eq([x.run_id for x in claimed], ["later"], "both parked at that worker's ceiling")
    tether_store.release_lease("later", "w1", claimed[0].lease_version)
    expect_eq(tether_store.suspect_waiting(max_attempts=3), True, "under a ceiling of 3")
    order = [
        x.run_id
        for _ in range(4)
        for x in tether_store.claim_expired("w3", LONG, 1, max_attempts=3)
    ]
    expect_eq(order, ["deferred", "died", "later"], "in the order they became claimable")
    for run_id in ("deferred", "died"):  # their third claims fail too
        tether_store.defer(run_id, "w3", tether_store.get_mark(run_id).lease_version, 0, "boom")
    expect_eq(tether_store.claim_expired("w3", LONG, 5, max_attempts=3), [], "parked at 3 now")
    tether_store.retry_now("died")  # a person resumes it
    claimed = tether_store.claim_expired("w1", LONG, limit=5, max_attempts=2)
    expect_eq([x.run_id for x in claimed], ["died"], "claimable again, at any ceiling")


def test_attempts_count_consecutive_claims_that_ended_badly(tether_store: Any) -> None:
    """A claim counts; a clean release or a wait resets; progress restarts; uncounted undoes."""
    seeded(tether_store)
    lease = tether_store.claim_expired("w1", LONG)[0]
    expect_eq(tether_store.get_mark("r").attempts, 1, "a claim counts (a worker may die)")
    tether_store.defer("r", "w1", lease.lease_version, 0, "in flight", count=False)
    expect_eq(tether_store.get_mark("r").attempts, 0, "an attempt that was not a failure")
    for _ in range(2):
        lease = tether_store.claim_expired("w1", LONG)[0]
        tether_store.defer("r", "w1", lease.lease_version, 0, "boom")
    expect_eq(tether_store.get_mark("r").attempts, 2, "two failures in a row")
    lease = tether_store.claim_expired("w1", LONG)[0]
    tether_store.defer("r", "w1", lease.lease_version, 0, "boom after progress", progressed=True)
    expect_eq(tether_store.get_mark("r").attempts, 1, "progress restarts the count")
    lease = tether_store.claim_expired("w1", LONG)[0]
    tether_store.wait_for_evidence("r", "w1", lease.lease_version, 0, 0)
    expect_eq(tether_store.get_mark("r").attempts, 0, "waiting for a person is no failure")


def test_a_claim_that_made_progress_restarts_the_count_even_if_its_worker_dies(
    tether_store: Any,
) -> None:
    """note_progress: claims whose workers died after a step never add up to a parked run."""
    seeded(tether_store)
    for _ in range(2):  # two workers died before doing anything
        tether_store.claim_expired("w1", TTL)
        time.sleep(PAST_TTL)
    expect_eq(tether_store.get_mark("r").attempts, 2, "each claim counted")
    for _ in range(2):  # two workers each got a step done, then died
        (lease,) = tether_store.claim_expired("w1", TTL, max_attempts=3)
        tether_store.note_progress("r", "w1", lease.lease_version)
        expect_eq(tether_store.get_mark("r").attempts, 1, "the count restarts at this claim")
        time.sleep(PAST_TTL)
    tether_store.claim_expired("w2", LONG)
    tether_store.note_progress("r", "w1", lease.lease_version)  # taken over: nothing of w1's
    expect_eq(tether_store.get_mark("r").attempts, 2, "the new owner's claim counted, untouched")


def test_only_the_holder_may_defer(tether_store: Any) -> None:
    """defer by a worker whose lease moved on raises LeaseLostError and changes nothing."""
    seeded(tether_store)
    old = tether_store.acquire_lease("r", "w1", LONG)
    tether_store.acquire_lease("r", "w1", LONG)  # a restarted w1 fences its predecessor
    with pytest.raises(LeaseLostError):
        tether_store.defer("r", "w1", old.lease_version, 1, "late")
    expect_eq(tether_store.get_mark("r").attempts, 0, "no attempt counted")


def test_a_run_waiting_for_a_person_is_claimed_only_when_evidence_arrives(
    tether_store: Any,
) -> None:
    """wait_for_evidence parks a run: no claim takes it until an inbox entry past ``seen``."""
    seeded(tether_store)
    lease = tether_store.claim_expired("w1", LONG, phases=("running", "needs_review"))[0]
    tether_store.wait_for_evidence("r", "w1", lease.lease_version, 0, 0)
    mark = tether_store.get_mark("r")
    expect_eq((mark.lease_owner, mark.waiting_after), (None, 0), "parked, lease released")
    expect_eq(tether_store.claim_expired("w2", LONG), [], "no claim while nothing new")
    tether_store.put_evidence("r", "approval", {"signed": "document"})
    woken = tether_store.claim_expired("w2", LONG)
    expect_eq([x.run_id for x in woken], ["r"], "evidence wakes it")
    expect_eq(tether_store.get_mark("r").waiting_after, None, "a claim clears the wait")
    with pytest.raises(LeaseLostError):
        tether_store.wait_for_evidence("r", "w1", lease.lease_version, 0, 0)  # stale holder


@pytest.mark.parametrize("moved", [0, 1, 2, 3])
def test_a_dead_claim_counts_unless_it_moved_the_run_past_a_resend(
    tether_store: Any, moved: int
) -> None:
    """A claim whose lease ran out is counted as core.failed_claims says, from the generations moved."""
    seeded(tether_store)
    for _ in range(2):  # two workers died before doing anything
        tether_store.claim_expired("w1", TTL)
        time.sleep(PAST_TTL)
    (lease,) = tether_store.claim_expired("w1", TTL)
    before = tether_store.get_mark("r")
    for step in range(moved):  # what this claim committed before its worker died
        generation = lease.generation + step
        tether_store.commit(make_commit("r", generation + 1), generation, lease.lease_version)
    time.sleep(PAST_TTL)
    failed = failed_claims(
        before.attempts,
        generation=lease.generation + moved,
        claimed_at=lease.generation,
        unclean=True,
    )
    expect_eq(failed, 0 if moved > 1 else 3, "the rule's own answer")
    claimed = tether_store.claim_expired("w2", LONG, max_attempts=3)
    expect_eq([x.run_id for x in claimed], ["r"] if failed < 3 else [], "parked at the ceiling")
    expected = failed + 1 if claimed else failed
    expect_eq(tether_store.get_mark("r").attempts, expected, "the count the claim left")


def test_a_suspect_is_claimed_apart_from_the_other_runs(tether_store: Any) -> None:
    """suspects=True takes only runs whose claims ran out unreleased twice in a row; False the rest."""
    for run_id in ("dead", "once", "deferred", "fresh"):
        seeded(tether_store, run_id)
    expect_eq(len(tether_store.claim_expired("w0", TTL, limit=1)), 1, "dead's first claim")
    time.sleep(PAST_TTL)  # its worker died: one failed claim, no suspect yet
    expect_eq(tether_store.claim_expired("w0", TTL, limit=1, suspects=True), [], "died once")
    expect_eq(tether_store.suspect_waiting(), False, "no suspect waits yet")
    leases = {x.run_id: x for x in tether_store.claim_expired("w1", TTL, limit=4)}
    expect_eq(sorted(leases), ["dead", "deferred", "fresh", "once"], "claimed together")
    tether_store.defer("deferred", "w1", leases["deferred"].lease_version, 0, "boom")
    tether_store.release_lease("fresh", "w1", leases["fresh"].lease_version)
    time.sleep(PAST_TTL)
    expect_eq(tether_store.suspect_waiting(), True, "a suspect is due, read without taking it")
    expect_eq(tether_store.suspect_waiting(("needs_review",)), False, "not in those phases")
    suspects = tether_store.claim_expired("w2", TTL, limit=4, suspects=True)
    expect_eq(tether_store.suspect_waiting(), False, "taken: none waits")
    expect_eq([x.run_id for x in suspects], ["dead"], "only the run whose workers died twice")
    others = tether_store.claim_expired("w2", LONG, limit=4, suspects=False)
    expect_eq(sorted(x.run_id for x in others), ["deferred", "fresh", "once"], "the rest")
    time.sleep(PAST_TTL)
    expect_eq(tether_store.claim_expired("w3", LONG, limit=4, suspects=False), [], "no suspect")
    expect_eq([x.run_id for x in tether_store.claim_expired("w3", LONG)], ["dead"], "either")


__all__ = [
    "test_a_claim_that_made_progress_restarts_the_count_even_if_its_worker_dies",
    "test_a_commit_with_a_superseded_lease_version_changes_nothing",
    "test_a_dead_claim_counts_unless_it_moved_the_run_past_a_resend",
    "test_a_deferred_run_is_not_claimed_until_its_back_off_has_passed",
    "test_a_late_commit_racing_a_takeover_never_lands_after_it",
    "test_a_live_lease_is_not_taken",
    "test_a_released_lease_does_not_commit",
    "test_a_released_run_waits_its_turn_behind_runs_claimable_longer",
    "test_a_run_created_with_its_lease_is_held_from_its_first_statement",
    "test_a_run_parked_at_one_workers_ceiling_is_taken_in_its_turn_by_a_higher_one",
    "test_a_run_waiting_for_a_person_is_claimed_only_when_evidence_arrives",
    "test_a_run_whose_worker_died_goes_before_runs_created_after_its_lease_ran_out",
    "test_a_run_with_too_many_failed_attempts_is_parked",
    "test_a_suspect_is_claimed_apart_from_the_other_runs",
    "test_a_tie_goes_to_the_run_that_waited_longest_for_its_turn",
    "test_a_ttl_must_be_positive",
    "test_acquire_gives_a_new_owner_a_new_version",
    "test_an_expired_lease_is_taken_over_with_a_new_version",
    "test_an_expired_lease_nobody_took_still_commits",
    "test_attempts_count_consecutive_claims_that_ended_badly",
    "test_check_lease_refuses_lost_released_and_expired_leases",
    "test_claim_expired_respects_its_limit",
    "test_claim_expired_takes_unowned_and_expired_runs_in_the_given_phases",
    "test_concurrent_claimers_never_share_a_run",
    "test_lease_calls_on_an_unknown_run_raise_run_not_found",
    "test_only_the_holder_may_defer",
    "test_racing_commits_land_one_ledger",
    "test_release_frees_the_run_and_repeats_harmlessly",
    "test_renew_extends_only_the_current_lease",
    "test_resume_puts_a_dead_workers_run_before_runs_created_while_its_lease_was_live",
    "test_runs_that_were_never_leased_commit_with_version_zero",
    "test_two_connections_racing_for_one_generation_exactly_one_wins",
]
