"""The replay rule through the real runtime: each way it once sent twice or swallowed a write."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    ScriptedAgent,
    World,
    finish,
    make_policy,
    make_task,
    signed_approval,
    signed_decision,
    write,
)
from tests.integration._services import EffectsService, effects_service
from tests.integration.test_http_effect import http_run
from tether.adapters import REFERENCE_PROFILE, HttpEffect, KeyInFlightError
from tether.core import EffectStatus, Intent, OutcomeKind, Phase, RunState, new_fork
from tether.crypto import Signer, TrustRoots
from tether.runtime import CrashPlan, CrashPoint, RunSession, Runtime, SimulatedCrash
from tether.testing import Sandbox

REVIEWER = Signer.generate("rev", "reviewer")
APPROVER = Signer.generate("alice", "approver")
TRUST = TrustRoots.of(REVIEWER.trust_root(), APPROVER.trust_root())


def replan(session: RunSession, now: Any) -> None:
    """A reviewer's signed replan of the run's open case, applied."""
    session.review(signed_decision(REVIEWER, session.state, now))


def keys(state: RunState, world: World) -> list[str]:
    return [e.idempotency_key for e in world.store().ledger(state.run_id)]


# -- A, B, A: a reverted write is a new effect ------------------------------------


def test_a_reverted_write_is_written_again_not_swallowed(world: World) -> None:
    """debug=true, debug=false, debug=true: the third is executed and the file holds it."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", idempotent=False, clock=world.clock.now
    )
    steps = [
        write("notes.txt", "debug=true\n"),
        write("notes.txt", "debug=false\n"),
        write("notes.txt", "debug=true\n"),
        finish,
    ]
    session = world.runtime(ScriptedAgent(steps)).start("r1")
    kinds = [session.step().kind for _ in range(3)]
    assert kinds == [OutcomeKind.EXECUTED] * 3
    assert world.sandbox.files["notes.txt"] == "debug=true\n"
    assert world.sandbox.write_count() == 3


def test_the_same_write_re_proposed_after_a_crash_is_still_replayed(world: World) -> None:
    """The case the rule exists for: new action ids after a crash, the file already holds it."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", idempotent=False, clock=world.clock.now
    )
    steps = [write("notes.txt", "debug=true\n"), finish]
    plan = CrashPlan(CrashPoint.BEFORE_PROPOSAL, nth=2)
    # The write's receipt committed before the crash (not left to ride on the next
    # commit): the ledger says committed, and the re-proposal meets the replay rule.
    with pytest.raises(SimulatedCrash):
        world.runtime(ScriptedAgent(steps), crash=plan, defer_receipts=False).start("r1").run()
    again = [finish, write("notes.txt", "debug=true\n", "regenerated-7"), finish]
    session = world.runtime(ScriptedAgent(again)).recover("r1")
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REPLAYED, "effect_replayed")
    assert world.sandbox.write_count() == 1
    (result,) = session.results()
    assert result.data["settled_by"] == "adapter" and result.data["result"] is not None
    assert result.data["result"]["path"] == "notes.txt"


# -- the adapter is asked, and its receipt is the authority -------------------------


@pytest.mark.parametrize(
    ("damage", "reason"),
    [("delete", "receipt_missing"), ("tamper", "receipt_drift")],
)
def test_a_deleted_or_drifted_adapter_receipt_is_never_replayed(
    world: World, damage: str, reason: str
) -> None:
    """The ledger's copy alone proves nothing: the run freezes, nothing is sent."""
    steps = [write("notes.txt", "hello\n", "a0"), write("notes.txt", "hello\n", "a1"), finish]
    session = world.runtime(ScriptedAgent(steps)).start("r1")
    assert session.step().kind is OutcomeKind.EXECUTED
    key = keys(session.state, world)[0]
    if damage == "delete":
        assert world.sandbox.delete_receipt(key)
    else:
        world.sandbox.tamper_receipt(key, result={"path": "notes.txt", "sha256": "x", "bytes": 1})
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.FROZEN, reason)
    assert session.state.phase is Phase.NEEDS_REVIEW
    assert world.sandbox.write_count() == 1


def test_a_replacement_write_is_never_answered_by_another_intents_receipt(world: World) -> None:
    """After a replan of a key conflict, the same write freezes (never replayed from the other
    intent's receipt, never sent on the adapter's word); a signed fork sends it once."""
    steps = [write("notes.txt", "ours\n", "a0"), finish]
    with pytest.raises(SimulatedCrash):
        world.runtime(ScriptedAgent(steps), crash=CrashPlan(CrashPoint.INTENT_PERSISTED)).start(
            "r1"
        ).run()
    store = world.store()
    key = store.ledger("r1")[0].idempotency_key
    sandbox = world.sandbox
    theirs = sandbox.normalize("file.write", "src/theirs.txt", {"content": "theirs\n"})
    other = Intent("file.write", "src/theirs.txt", theirs, "low")
    sandbox.execute(key, other, sandbox.environment())
    again = [write("notes.txt", "ours\n", f"a{i}") for i in range(1, 4)]
    steps = [steps[0], *again, finish]  # the agent proposes it again
    session = world.runtime(ScriptedAgent(steps), trust=TRUST).recover("r1")
    # The other caller's write under our key moved the workspace: a person replans.
    assert session.state.review_cases[-1].reason == "environment_drift"
    replan(session, world.clock.now())
    assert key in session.state.quarantined_keys
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.FROZEN, "key_conflict")
    assert sandbox.files["notes.txt"] == "draft\n" and sandbox.write_count() == 1
    replan(session, world.clock.now())
    effect = next(iter(session.effects))
    now = world.clock.now()
    body = new_fork(
        session.state,
        session.effects[effect].current,
        REVIEWER.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    session.fork(REVIEWER.sign(body))
    assert session.step().kind is OutcomeKind.EXECUTED
    assert sandbox.files["notes.txt"] == "ours\n"
    assert keys(session.state, world)[-1] != key


# -- a gated kind's replay needs its approval; a replay is charged -----------------


def test_a_replay_of_an_approval_gated_write_needs_an_approval_alive(world: World) -> None:
    """The write's own approval answers replays while it lives; past it, a fresh one; never a send."""
    rule = {"risk": "low", "permission": "workspace.write", "needs_approval": True}
    world.policy = make_policy(kinds={"file.write": rule})
    steps = [write("notes.txt", "hello\n", f"a{i}") for i in range(3)] + [finish]
    session = world.runtime(ScriptedAgent(steps), trust=TRUST).start("r1")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    session.approve(signed_approval(APPROVER, session.state, world.clock.now()))
    assert session.step().kind is OutcomeKind.EXECUTED
    alive = session.step()  # a1, within the approval's five minutes
    assert (alive.kind, alive.reason) == (OutcomeKind.REPLAYED, "effect_replayed")
    world.clock.advance(301)  # the approval that let the write happen has expired
    waiting = session.step()  # a2
    assert (waiting.kind, waiting.reason) == (OutcomeKind.WAITING_FOR_APPROVAL, "approval_required")
    assert session.state.pending is not None and session.state.pending.action_id == "a2"
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL  # no approval: still waits
    world.sandbox.bypass_write("src/other.txt", "x\n")  # an unrelated edit: a replay sends nothing
    session.approve(signed_approval(APPROVER, session.state, world.clock.now()))
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REPLAYED, "effect_replayed")
    assert world.sandbox.write_count() == 1 and session.state.pending is None
    (result,) = session.results()
    assert result.action_id == "a2" and result.data["replay_of"] == "a0"
    assert result.data["result"]["path"] == "notes.txt"
    statuses = [e.status for e in world.store().ledger("r1")]
    assert statuses == [EffectStatus.INTENDED, EffectStatus.DISPATCHED, EffectStatus.COMMITTED]


def test_a_held_replay_frozen_when_carried_out_records_the_world_as_it_is_then(
    world: World,
) -> None:
    """Approved after an unrelated edit and a deleted receipt: the case binds the world read then."""
    rule = {"risk": "low", "permission": "workspace.write", "needs_approval": True}
    world.policy = make_policy(kinds={"file.write": rule})
    steps = [write("notes.txt", "hello\n", f"a{i}") for i in range(2)] + [finish]
    session = world.runtime(ScriptedAgent(steps), trust=TRUST).start("r1")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    session.approve(signed_approval(APPROVER, session.state, world.clock.now()))
    assert session.step().kind is OutcomeKind.EXECUTED
    world.clock.advance(301)
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL  # a1, a held replay
    held_in = session.state.environment
    world.sandbox.bypass_write("src/other.txt", "x\n")
    assert world.sandbox.delete_receipt(keys(session.state, world)[0])
    session.approve(signed_approval(APPROVER, session.state, world.clock.now()))
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.FROZEN, "receipt_missing")
    (case,) = session.state.review_cases
    assert case.environment == world.sandbox.environment() != held_in
    # Bound to the world as it is, a reviewer's decision applies (no stale case to refresh).
    replan(session, world.clock.now())
    assert session.state.phase is Phase.RUNNING
    assert session.state.environment == world.sandbox.environment()
    assert world.sandbox.write_count() == 1


def test_a_replay_that_spends_the_last_proposal_ends_the_run_at_once(world: World) -> None:
    """The run fails on its budget in the same step, with a failed event in its trace."""
    world.task = make_task(world.sandbox.environment().state_fingerprint, budgets={"proposals": 2})
    steps = [write("notes.txt", "hello\n", "a0"), write("notes.txt", "hello\n", "a1"), finish]
    session = world.runtime(ScriptedAgent(steps)).start("r1")
    session.step()
    outcome = session.step()
    assert outcome.kind is OutcomeKind.REPLAYED
    assert session.state.phase is Phase.FAILED
    assert session.state.stop_reason == "budget_exhausted:proposals"
    assert [e.kind for e in session.trace()][-2:] == ["effect_replayed", "failed"]


# -- a key past the service's retention: absence proves nothing ---------------------


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EffectsService]:
    with effects_service(tmp_path) as running:
        yield running


def ticket_runtime(tmp_path: Path, http: HttpEffect) -> Runtime:
    """The HTTP tests' ticket run, with the reviewer trusted."""
    runtime = http_run(tmp_path, http)
    runtime.trust = TRUST
    return runtime


def test_a_ticket_past_retention_is_not_sent_again_after_a_replan(
    tmp_path: Path, service: EffectsService
) -> None:
    """Frozen as unknown, replanned, proposed again: a 404 past retention sends nothing."""
    service.mode(drop_after_commit=True, retention_s=0.3)
    short = replace(REFERENCE_PROFILE, retention_s=0.3)
    with HttpEffect(service.url, profile=short, timeout_s=2) as http:
        ticket_runtime(tmp_path, http).start("r1").step()
        time.sleep(0.5)  # the key outlives the service's memory of it
        service.mode(drop_after_commit=False)
        other = {"Idempotency-Key": '"someone-else"'}
        service.client.post("/tickets", json={"title": "x"}, headers=other)  # purges old keys
        session = ticket_runtime(tmp_path, http).recover("r1")
        session.step()
        assert session.state.review_cases[-1].reason == "outcome_unknown"
        replan(session, session.rt.clock.now())
        outcome = session.step()
        assert (outcome.kind, outcome.reason) == (OutcomeKind.FROZEN, "replay_of_unknown_effect")
    assert len(service.tickets()) == 2  # ours, once, and the other caller's


# -- a key stuck in flight stays decidable -------------------------------------------


class _Hung(Sandbox):
    """A workspace whose first send stays in flight for good (its handler never returns)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.hung: set[str] = set()

    @property
    def capabilities(self) -> Any:
        return replace(super().capabilities, in_flight_limit_s=60.0)

    def execute(self, key: str, intent: Intent, prestate: Any, fence: Any = None) -> Any:
        if key in self.hung or not self.hung:
            self.hung.add(key)
            raise KeyInFlightError(key, "accepted, still running")
        return super().execute(key, intent, prestate, fence)

    def lookup(self, key: str) -> Any:
        if key in self.hung:
            raise KeyInFlightError(key, "still running")
        return super().lookup(key)


@pytest.mark.parametrize("decision", ["abort", "replan"])
def test_a_run_frozen_on_a_key_stuck_in_flight_can_still_be_decided(
    world: World, decision: str
) -> None:
    """The decision's re-read of the receipt meets "still in flight": no receipt then, none now."""
    world.sandbox = _Hung({"notes.txt": "draft\n"}, instance_id="sbx-1", clock=world.clock.now)
    steps = [write("notes.txt", "A\n", f"a{i}") for i in range(3)] + [finish]
    session = world.runtime(ScriptedAgent(steps), trust=TRUST).start("r1")
    assert session.step().kind is OutcomeKind.IN_FLIGHT
    world.clock.advance(61)
    assert session.step().kind is OutcomeKind.FROZEN
    assert session.state.review_cases[-1].reason == "outcome_unknown"
    session.review(signed_decision(REVIEWER, session.state, world.clock.now(), decision))
    assert session.state.phase is (Phase.FAILED if decision == "abort" else Phase.RUNNING)
    if decision == "replan":  # the same write again is never sent while its key may land
        outcome = session.step()
        assert outcome.kind is OutcomeKind.RETRY_LATER
    assert world.sandbox.write_count() == 0
