"""The first seed's action contract, as tables: one version rule, one failed ending, one nonce set."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, make_policy, make_task, write
from tether.core import (
    AdmissionRefusedError,
    EnvironmentState,
    NonceReusedError,
    OutcomeKind,
    Phase,
    Proposal,
    Purpose,
    ReviewDecision,
    RunState,
    admission_request,
    new_admission,
    new_approval,
    new_cancel,
    new_decision,
)
from tether.core import _people as people_rules
from tether.core import _steps as step_rules
from tether.core._actions import Rejection, catalog, gate, version_problem
from tether.core._admission import check_admission
from tether.core._cancel import check_cancel
from tether.core._evidence import (
    check_approval,
    check_decision,
    consumed_nonces,
    keep_approval_nonce,
)
from tether.core._state import SpentNonce
from tether.testing import Sandbox

KINDS = catalog(Sandbox({}).kinds)
ENV = EnvironmentState("sandbox", "sbx-1", 4, "sha256:" + "a" * 64)

# -- one version rule for every kind -------------------------------------------------

#: One proposal of each class: a write, a read, a list, a test run, a finish, a cancel.
EVERY_KIND = {
    "file.write": Proposal("w", "file.write", "notes.txt", {"content": "x"}),
    "file.read": Proposal("r", "file.read", "notes.txt"),
    "file.list": Proposal("l", "file.list"),
    "tests.run": Proposal("t", "tests.run", "unit"),
    "finish": Proposal("f", "finish"),
    "cancel": Proposal("c", "cancel", args={"reason": "not needed"}),
}


@pytest.mark.parametrize(
    ("kind", "based_on", "reason"),
    [
        (kind, based_on, reason)
        for kind in EVERY_KIND
        for based_on, reason in [
            (4, None),  # built on the version the environment is at
            (3, "stale_version"),  # the environment moved on since
            (5, "stale_version"),  # a version the environment never reached
            (None, "missing_version" if kind == "file.write" else None),
        ]
    ],
)
def test_every_kind_is_refused_on_another_version_by_the_one_rule(
    kind: str, based_on: int | None, reason: str | None
) -> None:
    """version_problem judges every kind alike; None is refused for a write only."""
    problem = version_problem(KINDS[kind], based_on, ENV)
    assert (None if problem is None else problem.reason) == reason


@pytest.mark.parametrize("kind", sorted(EVERY_KIND))
@pytest.mark.parametrize("based_on", [0, 1, None])
def test_the_gate_gives_every_kind_the_refusal_a_write_gets(
    world: World, kind: str, based_on: int | None
) -> None:
    """Through the gate, a stale read or test run reads exactly as a stale write does."""
    world.task = make_task(
        world.sandbox.environment().state_fingerprint,
        tests={"unit": {"argv": ["python", "-c", "pass"], "timeout_s": 30}},
    )
    env = replace(world.sandbox.environment(), version=1)
    proposal = replace(EVERY_KIND[kind], based_on_version=based_on)
    rejection = gate(
        proposal,
        kinds=KINDS,
        task=world.task,
        policy=world.policy,
        phase=Phase.RUNNING,
        environment=env,
        now=world.clock.now(),
        action_seen=False,
        cost_spent=0,
    )
    expected = version_problem(KINDS[kind], based_on, env)
    assert rejection == expected
    if based_on == 0:
        assert rejection is not None and rejection.reason == "stale_version"


# -- one failed ending for every budget and path -----------------------------------


def _state(world: World, **spent: int) -> RunState:
    state = world.runtime(ScriptedAgent([write("notes.txt", "x")])).start("r1").state
    return state.evolve(spent=replace(state.spent, **spent))


BUDGETS = {"proposals": 3, "steps": 5, "cost": 10, "wall_time_s": 60, "deadline_s": 120}


@pytest.mark.parametrize(
    ("spent", "later_s", "which"),
    [
        ({}, 0, None),
        ({"steps": 5}, 0, "steps"),
        ({"proposals": 3}, 0, "proposals"),
        ({"cost": 11}, 0, "cost"),
        ({"cost": 10}, 0, None),  # the budget itself may be spent to the last unit
        ({"wall_time_ms": 60_001}, 0, "wall_time"),
        ({}, 121, "deadline"),
        ({"steps": 5, "proposals": 3}, 0, "steps"),  # steps are checked first
    ],
)
def test_each_spent_budget_fails_the_run_with_a_traced_failed_event(
    world: World, spent: dict[str, int], later_s: int, which: str | None
) -> None:
    """exhausted fails the run on each spent budget, tracing failed with the budget's reason."""
    world.task = make_task(world.sandbox.environment().state_fingerprint, budgets=BUDGETS)
    state = _state(world, **spent)
    now = state.started_at + timedelta(seconds=later_s)
    resumed = now  # nothing of the epoch's own working time counts on top
    assert step_rules.spent_budget(state, world.task.budgets, now, resumed_at=resumed) == which
    ended = step_rules.exhausted(state, world.task.budgets, now, resumed_at=resumed)
    if which is None:
        assert ended is None
        return
    reason = f"budget_exhausted:{which}"
    assert ended is not None and ended.state is not None
    assert (ended.outcome, ended.reason) == (OutcomeKind.FAILED, reason)
    assert (ended.state.phase, ended.state.stop_reason) == (Phase.FAILED, reason)
    assert ended.events == (("failed", {"reason": reason}),)


@pytest.mark.parametrize(
    ("proposals_before", "spent_already", "fails"),
    [
        (0, False, False),
        (1, False, True),  # this rejection is the budget's last proposal
        (2, True, True),  # already charged (a held action refused): the count decides alone
        (1, True, False),
    ],
)
def test_a_rejection_that_spends_the_last_proposal_traces_failed(
    world: World, proposals_before: int, spent_already: bool, fails: bool
) -> None:
    """reject fails the run on the budget's last proposal, tracing failed after the rejection."""
    world.task = make_task(world.sandbox.environment().state_fingerprint, budgets={"proposals": 2})
    state = _state(world, proposals=proposals_before)
    proposal = Proposal("a9", "file.write", "outside.txt", {"content": "x"})
    refused = step_rules.reject(
        state,
        proposal,
        Rejection("scope_target", "outside"),
        world.task.budgets,
        spent_already=spent_already,
    )
    assert refused.state is not None
    kinds = [kind for kind, _ in refused.events]
    assert refused.reason == "scope_target"  # the agent is told why, either way
    if fails:
        assert kinds == ["proposal_rejected", "failed"]
        assert refused.events[-1][1] == {"reason": "budget_exhausted:proposals"}
        assert refused.outcome is OutcomeKind.FAILED
        assert refused.state.phase is Phase.FAILED
        assert refused.state.stop_reason == "budget_exhausted:proposals"
    else:
        assert kinds == ["proposal_rejected"]
        assert (refused.outcome, refused.state.phase) == (OutcomeKind.REJECTED, Phase.RUNNING)


@pytest.mark.parametrize(("proposals", "fails"), [(0, False), (1, False), (2, True), (3, True)])
def test_charged_last_fails_exactly_when_no_proposal_is_left(
    world: World, proposals: int, fails: bool
) -> None:
    """charged_last ends the run, with its failed event, once the proposal count reaches the budget."""
    world.task = make_task(world.sandbox.environment().state_fingerprint, budgets={"proposals": 2})
    state = _state(world, proposals=proposals)
    after, events = step_rules.charged_last(state, world.task.budgets)
    if fails:
        assert after == step_rules.failed(state, "budget_exhausted:proposals")[0]
        assert events == (("failed", {"reason": "budget_exhausted:proposals"}),)
    else:
        assert (after, events) == (state, ())


def test_a_reviews_abort_ends_the_run_the_same_way(world: World) -> None:
    """An abort's ending is the one failed builds: phase, stop reason and the failed event."""
    state = _state(world)
    frozen = _parked(world, state)
    case = frozen.review_cases[0]
    aborted = people_rules.apply_decision(frozen, case, ReviewDecision.ABORT, {}, cursor=None)
    assert aborted.state is not None
    expected_state, expected_event = step_rules.failed(
        aborted.state.evolve(phase=Phase.NEEDS_REVIEW, stop_reason=None), "aborted_by_review"
    )
    assert aborted.state == expected_state
    assert aborted.events[-1] == expected_event


# -- one nonce set for every kind of signed document ---------------------------------

NONCE = "n" * 32


def _parked(world: World, state: RunState) -> RunState:
    parked = step_rules.park(
        state,
        case_id="case-1",
        reason="worker_error",
        detail="stuck",
        now=world.clock.now(),
        live=state.environment,
    )
    assert parked.state is not None
    return parked.state


def _pending(world: World) -> RunState:
    """A run whose write waits for an approval, frozen by a review case about it."""
    world.policy = make_policy(
        kinds={
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}
        }
    )
    session = world.runtime(ScriptedAgent([write("notes.txt", "x")])).start("r1")
    session.step()
    assert session.state.pending is not None
    return _parked(world, session.state)


def _consumed_by(state: RunState, source: str) -> RunState:
    """``state`` recording ``NONCE`` as consumed by one kind of document, where that kind keeps it."""
    if source == "decision":
        return state.evolve(decisions=({"body": {"kind": "review_decision", "nonce": NONCE}},))
    if source == "effect_decision":
        return state.evolve(decisions=({"body": {"kind": "effect_decision", "nonce": NONCE}},))
    if source == "fork":
        return state.evolve(fork_nonces=(NONCE,))
    if source == "cancel":
        return state.evolve(cancel_nonces=(NONCE,))
    if source == "approval":  # as a checkpoint written before approval_nonces kept it
        pending = state.pending
        assert pending is not None
        return state.evolve(pending=replace(pending, nonces=(NONCE,)))
    if source == "settled approval":  # its action long gone, the approval still alive
        return state.evolve(approval_nonces=(SpentNonce(NONCE, T0 + timedelta(hours=1)),))
    return state


SOURCES = ["decision", "effect_decision", "fork", "cancel", "approval", "settled approval"]


@pytest.mark.parametrize("source", [*SOURCES, "nothing"])
def test_consumed_nonces_sees_every_kind(world: World, source: str) -> None:
    """consumed_nonces reads each kind's own record; nothing consumed is an empty set."""
    state = _consumed_by(_pending(world), source)
    assert consumed_nonces(state) == (frozenset() if source == "nothing" else {NONCE})


def _check(kind: str, state: RunState, now: Any, nonce: str) -> None:
    """Run ``kind``'s check on a body for ``state`` carrying ``nonce``."""
    alive = {"issued_at": now, "expires_at": now + timedelta(seconds=300), "nonce": nonce}
    if kind == "approval":
        check_approval(new_approval(state, "alice", **alive), "alice", state, now=now, ttl_s=600)
    elif kind == "decision":
        case = state.review_cases[0]
        body = new_decision(state, case, "rev", "replan", **alive)
        check_decision(body, "rev", state, case, now=now, ttl_s=600)
    elif kind == "cancel":
        body = new_cancel(state, "ops", reason="stop", **alive)
        check_cancel(body, "ops", state, now=now, ttl_s=600)
    else:
        request = admission_request(
            state,
            checkpoint_digest="sha256:" + "c" * 64,
            policy=state.binding,
            purpose=Purpose.RECOVERY,
        )
        body = new_admission(request, "ops", **alive)
        check_admission(
            body,
            "ops",
            request,
            now=now,
            ttl_s=600,
            run_id=state.run_id,
            consumed=consumed_nonces(state),
        )


@pytest.mark.parametrize("checked", ["approval", "decision", "cancel", "admission"])
@pytest.mark.parametrize("source", SOURCES)
def test_a_nonce_consumed_by_any_document_is_refused_for_every_other(
    world: World, source: str, checked: str
) -> None:
    """Each check refuses a nonce another kind consumed, and takes a fresh one."""
    state = _consumed_by(_pending(world), source)
    now = world.clock.now()
    _check(checked, state, now, "f" * 32)  # a fresh nonce passes every other binding
    refused = AdmissionRefusedError if checked == "admission" else NonceReusedError
    with pytest.raises(refused, match="consumed before"):
        _check(checked, state, now, NONCE)


def test_a_decision_reusing_the_nonce_of_a_closed_case_is_refused(world: World) -> None:
    """A replan closes its case; a decision on the next case with the same nonce is refused."""
    state = _parked(world, _state(world))
    now = world.clock.now()
    alive = {"issued_at": now, "expires_at": now + timedelta(seconds=300), "nonce": NONCE}
    first = new_decision(state, state.review_cases[0], "rev", "replan", **alive)
    check_decision(first, "rev", state, state.review_cases[0], now=now, ttl_s=600)
    closed = people_rules.apply_decision(
        state, state.review_cases[0], ReviewDecision.REPLAN, {"body": first}, cursor=None
    )
    assert closed.state is not None
    again = step_rules.park(
        closed.state,
        case_id="case-2",
        reason="worker_error",
        detail="stuck again",
        now=now,
        live=closed.state.environment,
    ).state
    assert again is not None
    second = new_decision(again, again.review_cases[0], "rev", "replan", **alive)
    with pytest.raises(NonceReusedError):
        check_decision(second, "rev", again, again.review_cases[0], now=now, ttl_s=600)


T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
SKEW = timedelta(seconds=60)


@pytest.mark.parametrize(
    ("until", "now", "kept"),
    [
        (T0 + timedelta(minutes=5), T0, True),  # alive
        (T0, T0, True),  # just expired: another worker's clock may still accept it
        (T0, T0 + SKEW - timedelta(microseconds=1), True),
        (T0, T0 + SKEW, False),  # expired on every clock tolerated: refused anyway
        (T0, T0 + timedelta(hours=1), False),
    ],
)
def test_an_approval_nonce_is_forgotten_only_once_its_approval_has_expired(
    until: datetime, now: datetime, kept: bool
) -> None:
    """keep_approval_nonce drops a nonce only past its approval's expiry plus the clock skew."""
    old = SpentNonce("o" * 32, until)
    after = keep_approval_nonce((old,), NONCE, now + timedelta(minutes=5), now=now)
    assert after[-1] == SpentNonce(NONCE, now + timedelta(minutes=5))  # the new one, always
    assert (old in after) is kept
    assert len(after) == (2 if kept else 1)


def test_an_approval_nonce_outlives_the_action_it_approved(world: World) -> None:
    """Recorded, then its write settled: the nonce stays consumed for every other document."""
    state = _pending(world)
    now = world.clock.now()
    alive = {"issued_at": now, "expires_at": now + timedelta(seconds=300), "nonce": NONCE}
    body = new_approval(state, "alice", **alive)
    recorded = people_rules.record_approval(state, {"body": body}, body, cursor=None, now=now)
    assert recorded.state is not None
    settled = recorded.state.evolve(phase=Phase.RUNNING, pending=None)
    assert NONCE in consumed_nonces(settled)
    assert settled.approval_nonces == (SpentNonce(NONCE, now + timedelta(seconds=300)),)
