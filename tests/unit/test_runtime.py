"""The runtime's write protocol, gate, budgets, replay and freeze rules, on a Sandbox."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_task, write
from tether.core import (
    EffectStatus,
    EnvironmentDriftError,
    InvariantError,
    LedgerIntegrityError,
    OutcomeKind,
    Phase,
    RunFrozenError,
    RunTerminalError,
    Verification,
    canonical_bytes,
    format_time,
)
from tether.core._ledger import seal_entry
from tether.core._payload import validate_state
from tether.runtime import CrashPlan, CrashPoint, Decision, SimulatedCrash
from tether.testing import Sandbox
from tether.testing.counting import count_calls


def crash_then_recover(world: World, agent: ScriptedAgent, point: CrashPoint, nth: int = 1):
    """Run until ``point`` fires, then recover with a fresh runtime over the same files."""
    rt = world.runtime(agent, crash=CrashPlan(point, nth=nth))
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    return world.runtime(agent).recover("r1")


def blind(world: World) -> None:
    """Swap in an adapter that can neither deduplicate nor be queried (an SMTP-like one)."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"},
        instance_id="sbx-1",
        idempotent=False,
        queryable=False,
        clock=world.clock.now,
    )


def test_happy_path_writes_once_and_completes_with_verifier_at_final_version(world: World) -> None:
    """A write then finish ends completed, with one write and verifier evidence at the final version."""
    session = world.runtime(ScriptedAgent([write("notes.txt", "done\n"), finish])).start("r1")
    state = session.run().state
    assert state.phase is Phase.COMPLETED
    assert world.sandbox.write_count() == 1
    assert state.verification is not None
    assert state.verification.env_version == state.environment.version == 1
    assert state.verification.state_fingerprint == world.sandbox.environment().state_fingerprint
    kinds = [e.kind for e in session.trace()]
    assert kinds == [
        "run_started",
        "intent_persisted",
        "effect_committed",
        "verifier_ran",
        "completed",
    ]


def test_key_is_persisted_with_the_intent_before_the_adapter_is_called(world: World) -> None:
    """At the intent_persisted crash the checkpoint holds the key and the adapter saw nothing."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    rt = world.runtime(agent, crash=CrashPlan(CrashPoint.INTENT_PERSISTED))
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    restored = world.runtime(agent).checkpointer.load("r1").state
    assert restored.phase is Phase.PENDING
    assert restored.pending is not None
    key = restored.pending.idempotency_key
    assert world.sandbox.write_count() == 0
    # A queryable adapter: the one pending commit already says `dispatched`, with its rows.
    assert restored.pending.status is EffectStatus.DISPATCHED
    rows = world.store().ledger("r1")
    assert [e.status for e in rows] == [EffectStatus.INTENDED, EffectStatus.DISPATCHED]
    assert {e.idempotency_key for e in rows} == {key}
    assert restored.ledger_length == 2 and restored.ledger_head == rows[-1].hash
    session = world.runtime(agent).recover("r1")
    session.run()
    assert world.sandbox.write_count() == 1
    receipt = world.sandbox.lookup(key)
    assert receipt is not None and receipt.idempotency_key == key


def test_lost_reply_is_resolved_by_lookup_with_the_same_key(world: World) -> None:
    """A write whose reply was lost is found by key on retry; no second key, no second write."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = world.runtime(agent).start("r1")
    world.sandbox.fail_next(after_commit=True)
    outcome = session.step()
    assert outcome.kind is OutcomeKind.RETRY_LATER and "reply lost" in outcome.message
    assert session.state.phase is Phase.PENDING
    pending = session.state.pending
    assert pending is not None
    statuses = [e.status for e in world.store().ledger("r1")]
    assert statuses[-1] is EffectStatus.DISPATCHED  # it may have landed: ask by key next
    session.run()
    assert session.state.phase is Phase.COMPLETED
    assert world.sandbox.write_count() == 1
    assert session.state.last_write is not None
    assert session.state.last_write.idempotency_key == pending.idempotency_key


def test_unattempted_write_is_executed_once_on_retry(world: World) -> None:
    """A write that failed before reaching the adapter runs once on the next step."""
    session = world.runtime(ScriptedAgent([write("notes.txt", "x"), finish])).start("r1")
    world.sandbox.fail_next(after_commit=False)
    outcome = session.step()
    assert outcome.kind is OutcomeKind.RETRY_LATER and "not attempted" in outcome.message
    session.run()
    assert session.state.phase is Phase.COMPLETED
    assert world.sandbox.write_count() == 1


@pytest.mark.parametrize(
    "point", [CrashPoint.INTENT_PERSISTED, CrashPoint.EFFECT_SENT, CrashPoint.RECEIPT_PERSISTED]
)
def test_every_write_window_recovers_to_exactly_one_write(world: World, point: CrashPoint) -> None:
    """A crash in any window of a write recovers, asking the adapter by key, to one send and one write."""
    calls = count_calls(world.sandbox)  # the Sandbox absorbs a resend; the calls do not
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, point)
    assert session.run().phase is Phase.COMPLETED
    assert world.sandbox.write_count() == 1
    ((key, sends),) = calls.sent().items()
    assert sends == 1, f"{point}: the write was sent {sends} times"
    # Dispatched, then the process died: recovery may not know whether it left, so asks.
    assert calls.lookups(key) >= 1, f"{point}: recovery never asked the adapter"
    committed = [e for e in world.store().ledger("r1") if e.status is EffectStatus.COMMITTED]
    assert len(committed) == 1


def test_missing_cache_with_complete_adapter_receipt_reconciles(world: World) -> None:
    """After effect_sent the ledger lacks the receipt; the adapter's complete receipt reconciles."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.EFFECT_SENT)
    pending = session.state.pending
    assert pending is not None
    assert not [e for e in world.store().ledger("r1") if e.status is EffectStatus.COMMITTED]
    session.step()
    assert session.state.phase is Phase.RUNNING
    assert session.trace()[-1].kind == "effect_reconciled"
    ledger_receipt = world.store().ledger("r1")[-1].receipt
    adapter_receipt = world.sandbox.lookup(pending.idempotency_key)
    assert adapter_receipt is not None and ledger_receipt == adapter_receipt.to_json()


def test_same_key_different_intent_freezes_with_full_evidence(world: World) -> None:
    """An adapter receipt for the key with another intent digest freezes the run, evidence kept."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.EFFECT_SENT)
    pending = session.state.pending
    assert pending is not None
    conflicting = world.sandbox.tamper_receipt(
        pending.idempotency_key, intent_digest="sha256:" + "e" * 64
    )
    session.step()
    state = session.state
    assert state.phase is Phase.NEEDS_REVIEW
    assert state.pending == pending  # the pending intent is kept
    (case,) = state.review_cases
    assert case.reason == "key_conflict"
    assert case.receipt == conflicting.to_json()
    assert case.receipt_fingerprint == conflicting.fingerprint
    assert case.environment == world.sandbox.environment()
    assert session.trace()[-1].kind == "needs_review"
    with pytest.raises(RunFrozenError):
        session.step()
    # Frozen survives a restore: the case is in the checkpoint.
    again = world.runtime(agent).recover("r1")
    assert again.state.phase is Phase.NEEDS_REVIEW
    assert again.state.review_cases == state.review_cases
    with pytest.raises(RunFrozenError):
        again.step()
    assert again.run().phase is Phase.NEEDS_REVIEW  # run() stops at the gate, changes nothing
    assert world.sandbox.write_count() == 1


def test_deleted_adapter_receipt_refuses_replay(world: World) -> None:
    """A write whose receipt the adapter lost is never sent again as new: the run freezes."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.RECEIPT_PERSISTED)
    pending = session.state.pending
    assert pending is not None
    assert world.sandbox.delete_receipt(pending.idempotency_key)
    session.step()
    assert session.state.phase is Phase.NEEDS_REVIEW
    assert session.state.review_cases[0].reason == "outcome_unknown"
    assert world.sandbox.write_count() == 1


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("namespace", "other"),
        ("post_state", {"namespace": "sandbox", "instance_id": "sbx-1", "version": 9,
                        "state_fingerprint": "sha256:" + "0" * 64}),
    ],
)  # fmt: skip
def test_drifted_adapter_receipt_refuses_replay(
    world: World, field_name: str, value: object
) -> None:
    """A receipt for another namespace or post-state is not reconciled: the run freezes."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.RECEIPT_PERSISTED)
    pending = session.state.pending
    assert pending is not None
    world.sandbox.tamper_receipt(pending.idempotency_key, **{field_name: value})
    session.step()
    assert session.state.phase is Phase.NEEDS_REVIEW
    assert session.state.review_cases[0].reason == "receipt_mismatch"
    assert world.sandbox.write_count() == 1


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("adapter_version", "2"),
        ("receipt_id", "rcpt-other"),
        ("result", {"path": "notes.txt", "sha256": "sha256:" + "0" * 64, "bytes": 1}),
    ],
)
def test_a_receipt_found_after_the_receipt_commit_died_is_recorded_as_the_adapter_gave_it(
    world: World, field_name: str, value: object
) -> None:
    """No ledger copy survives a death inside the receipt commit: the adapter's receipt is recorded verbatim."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.RECEIPT_PERSISTED)
    pending = session.state.pending
    assert pending is not None
    assert not [e for e in world.store().ledger("r1") if e.status is EffectStatus.COMMITTED]
    receipt = world.sandbox.tamper_receipt(pending.idempotency_key, **{field_name: value})
    outcome = session.step()
    assert (outcome.kind, session.state.phase) == (OutcomeKind.REPLAYED, Phase.RUNNING)
    assert session.trace()[-1].kind == "effect_reconciled"
    (committed,) = [e for e in world.store().ledger("r1") if e.status is EffectStatus.COMMITTED]
    assert committed.receipt == receipt.to_json()
    assert session.state.last_write is not None
    assert session.state.last_write.receipt_fingerprint == receipt.fingerprint
    assert world.sandbox.write_count() == 1


def test_uncertain_send_on_a_non_idempotent_unqueryable_adapter_freezes(world: World) -> None:
    """An adapter that can neither deduplicate nor be queried freezes an uncertain send."""
    blind(world)
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.EFFECT_SENT)
    session.step()
    assert session.state.phase is Phase.NEEDS_REVIEW
    assert session.state.review_cases[0].reason == "outcome_unknown"
    assert world.sandbox.write_count() == 1
    statuses = [e.status for e in world.store().ledger("r1")]
    assert statuses[-1] is EffectStatus.OUTCOME_UNKNOWN


def test_undispatched_write_on_a_non_idempotent_adapter_runs_once(world: World) -> None:
    """Before dispatch, even a non-idempotent, unqueryable adapter is safe to call once."""
    blind(world)
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.INTENT_PERSISTED)
    assert session.run().phase is Phase.COMPLETED
    assert world.sandbox.write_count() == 1


def test_a_death_inside_the_receipt_commit_on_a_blind_adapter_freezes(
    world: World,
) -> None:
    """The receipt and the advance are one commit: dying in it leaves a blind write unknown, for review."""
    blind(world)
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.RECEIPT_PERSISTED)
    outcome = session.run()
    assert (outcome.kind, outcome.phase) == (OutcomeKind.FROZEN, Phase.NEEDS_REVIEW)
    assert session.state.review_cases[0].reason == "outcome_unknown"
    assert world.sandbox.write_count() == 1


def test_a_blind_write_the_live_state_contradicts_freezes_with_that_state(world: World) -> None:
    """On a blind adapter nothing the world shows is taken as a receipt: the case keeps the live state."""
    blind(world)
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.RECEIPT_PERSISTED)
    pending = session.state.pending
    assert pending is not None and pending.status is EffectStatus.DISPATCHED
    world.sandbox.bypass_write("notes.txt", "x")  # same content...
    world.sandbox.bypass_write("extra.txt", "and something else")  # ...but the state moved
    assert world.sandbox.environment() != pending.expected_post
    session.step()
    assert session.state.phase is Phase.NEEDS_REVIEW
    (case,) = session.state.review_cases
    assert case.reason == "outcome_unknown"
    assert case.environment == world.sandbox.environment()
    assert session.state.environment == pending.prestate  # nothing advanced on a guess
    assert [e.status for e in world.store().ledger("r1")][-1] is EffectStatus.OUTCOME_UNKNOWN
    assert world.sandbox.write_count() == 1


def test_a_receipt_forged_into_the_ledger_of_a_pending_blind_write_fails_closed(
    world: World,
) -> None:
    """Only a commit writes the ledger: a receipt row added by SQL, even correctly chained, is refused."""
    blind(world)
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    rt = world.runtime(agent, crash=CrashPlan(CrashPoint.RECEIPT_PERSISTED))
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    state = world.runtime(agent).checkpointer.load("r1").state
    pending = state.pending
    assert pending is not None and state.phase is Phase.PENDING
    # The old "receipt persisted, state not advanced" window, forged: it no longer exists.
    forged = seal_entry(
        "r1",
        state.ledger_length + 1,
        state.ledger_head,
        idempotency_key=pending.idempotency_key,
        status=EffectStatus.COMMITTED,
        action_id=pending.action_id,
        intent_digest=pending.intent_digest,
        receipt={"receipt_id": "rcpt-forged"},
        epoch=state.epoch,
        at=state.updated_at,
    )
    with sqlite3.connect(world.db) as conn:
        conn.execute(
            "INSERT INTO tether_ledger (run_id, hash, prev_hash, seq, idempotency_key, status, "
            "action_id, intent_digest, receipt, epoch, at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                forged.run_id,
                forged.hash,
                forged.prev_hash,
                forged.seq,
                forged.idempotency_key,
                forged.status.value,
                forged.action_id,
                forged.intent_digest,
                canonical_bytes(forged.receipt).decode(),
                forged.epoch,
                format_time(forged.at),
            ),
        )
    conn.close()
    with pytest.raises(LedgerIntegrityError, match="not on the signed chain"):
        world.runtime(agent).recover("r1")
    assert world.sandbox.write_count() == 1


def test_recovered_agent_gets_exactly_the_checkpointed_context(world: World) -> None:
    """The context handed to the agent after recovery is the one saved with the checkpoint."""
    agent = ScriptedAgent([write("notes.txt", "one"), write("notes.txt", "two", "b"), finish])
    rt = world.runtime(agent, crash=CrashPlan(CrashPoint.BEFORE_PROPOSAL, nth=2))
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    saved = world.runtime(agent).checkpointer.load("r1").state
    fresh = ScriptedAgent(agent.steps)
    session = world.runtime(fresh).recover("r1")
    assert session.context.encode()[0] == saved.agent_context_digest
    session.run()
    assert fresh.seen[0].plan_cursor == 1
    assert fresh.seen[0].messages == ({"step": 0, "saw_version": 0},)
    assert world.sandbox.write_count() == 2


def test_restore_of_same_version_with_a_different_state_goes_to_review(world: World) -> None:
    """A file changed outside the runtime (same version, new fingerprint) freezes the run for review."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    first = world.runtime(agent).start("r1")
    first.run(max_steps=1)
    first.land_deferred()  # the receipt is durable: the drift is about the run, not the write
    before = world.sandbox.environment()
    world.sandbox.bypass_write("notes.txt", "someone else")
    session = world.runtime(agent).recover("r1")
    assert session.state.phase is Phase.NEEDS_REVIEW
    (case,) = session.state.review_cases
    (evidence,) = case.evidence
    assert case.reason == "environment_drift" and case.environment == world.sandbox.environment()
    assert evidence["checkpoint"] == before.to_json()
    assert evidence["observed"] == world.sandbox.environment().to_json()


def test_restore_refuses_the_same_state_in_another_instance(world: World) -> None:
    """An identical copy of the environment with another instance id fails closed."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    world.runtime(agent).start("r1").run(max_steps=1)
    twin = Sandbox(world.sandbox.files, instance_id="sbx-2")
    with pytest.raises(EnvironmentDriftError, match="instance"):
        world.runtime(agent, adapter=twin).recover("r1")


def test_drift_not_provable_from_the_pending_write_goes_to_review(world: World) -> None:
    """Two writes past the checkpoint are not derivable from it: frozen, their receipts shown."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    world.runtime(agent).start("r1")
    outsider = ScriptedAgent([write("notes.txt", "y", "o1"), write("notes.txt", "z", "o2"), finish])
    world.runtime(outsider).start("other").run(max_steps=2)
    session = world.runtime(agent).recover("r1")
    assert session.state.phase is Phase.NEEDS_REVIEW
    (case,) = session.state.review_cases
    assert case.reason == "environment_ahead" and case.environment == world.sandbox.environment()
    shown = [e for e in case.evidence if e["kind"] == "unrecorded_receipt"]
    assert len(shown) == 2 and world.sandbox.write_count() == 2  # r1 wrote nothing


def test_restore_accepts_the_one_state_the_pending_write_produces(world: World) -> None:
    """After effect_sent the live state is the pending write's exact post-state, and restores."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.EFFECT_SENT)
    assert session.state.pending is not None
    assert world.sandbox.environment() == session.state.pending.expected_post


def test_completion_needs_passing_verifier_and_a_later_write_voids_it(world: World) -> None:
    """A failed verifier keeps the run going; a write clears evidence; a pass at the end completes."""
    verdicts = iter([False, True])
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", verifier=lambda files: next(verdicts)
    )
    agent = ScriptedAgent(
        [write("notes.txt", "one"), finish, write("notes.txt", "two", "b"), finish]
    )
    session = world.runtime(agent).start("r1")
    session.step()
    session.step()  # verifier fails
    assert session.state.phase is Phase.RUNNING
    assert session.state.verification is not None and not session.state.verification.passed
    session.step()  # a write
    assert session.state.verification is None
    session.step()
    assert session.state.phase is Phase.COMPLETED
    assert session.state.verification is not None
    assert session.state.verification.env_version == session.state.environment.version == 2


def test_completed_state_with_evidence_from_an_older_version_is_invalid(world: World) -> None:
    """The invariant check refuses completion judged at another environment version."""
    session = world.runtime(ScriptedAgent([write("notes.txt", "x"), finish])).start("r1")
    state = session.run().state
    stale = state.evolve(
        verification=Verification(
            env_version=0,
            state_fingerprint="sha256:" + "1" * 64,
            passed=True,
            exit_code=0,
            output_digest="sha256:" + "2" * 64,
            at=world.clock.now(),
        )
    )
    with pytest.raises(InvariantError, match="another environment version"):
        validate_state(stale)


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        (write("notes.txt", "x", kind="shell.run"), "unknown_kind"),
        (write("secrets/key.txt", "x"), "scope_target"),
        (write("../notes.txt", "x"), "scope_target"),
        (write("src/./a.py", "x"), "scope_target"),
        (write("notes.txt", "x", based_on_version=7), "stale_version"),
        (write("notes.txt", "x", cost=1000), "budget_cost"),
        (write("notes.txt", "x", args={"content": "x", "approval": "yes"}), "embedded_approval"),
        (write("notes.txt", "x", args={"content": 1}), "bad_args"),
    ],
)
def test_gate_rejections_consume_budget_and_are_traced(world: World, step, reason: str) -> None:
    """Each contract violation is refused, traced with its reason, and charged to the budget."""
    session = world.runtime(ScriptedAgent([step])).start("r1")
    session.step()
    assert session.state.phase is Phase.RUNNING
    assert session.state.spent.proposals == 1
    assert session.state.pending is None
    event = session.trace()[-1]
    assert event.kind == "proposal_rejected"
    assert event.data["reason"] == reason
    assert world.sandbox.write_count() == 0


def test_gate_refuses_permission_and_risk_the_policy_does_not_grant(world: World) -> None:
    """A kind whose permission the task lacks, or whose risk exceeds the policy, is refused."""
    from tests.conftest import make_policy

    high = make_policy(
        kinds={
            "file.write": {"risk": "high", "permission": "workspace.write", "needs_approval": False}
        }
    )
    session = world.runtime(ScriptedAgent([write("notes.txt", "x")]), policy=high).start("r1")
    session.step()
    assert session.trace()[-1].data["reason"] == "risk"
    reader = make_task(
        world.sandbox.environment().state_fingerprint, permissions=["workspace.read"]
    )
    session = world.runtime(ScriptedAgent([write("notes.txt", "x")]), task=reader).start("r2")
    session.step()
    assert session.trace()[-1].data["reason"] == "permission"


def test_gate_refuses_a_passed_deadline_and_a_reused_action_id(world: World) -> None:
    """A proposal past its deadline, and an action id used before, are refused."""
    late = write("notes.txt", "x", deadline=world.clock.now() - timedelta(seconds=1))
    session = world.runtime(ScriptedAgent([late])).start("r1")
    session.step()
    assert session.trace()[-1].data["reason"] == "deadline"
    agent = ScriptedAgent([write("notes.txt", "x", "same"), write("notes.txt", "y", "same")])
    session = world.runtime(agent).start("r2")
    session.step()
    session.step()
    assert session.trace()[-1].data["reason"] == "duplicate_action"
    assert world.sandbox.write_count() == 1


def test_a_reused_action_id_is_refused_after_recovery_from_the_signed_ledger(
    world: World,
) -> None:
    """The gate's "used before" survives a crash: recovery reads it from the verified ledger."""
    agent = ScriptedAgent([write("notes.txt", "x", "same"), write("notes.txt", "y", "same")])
    rt = world.runtime(agent, crash=CrashPlan(CrashPoint.BEFORE_PROPOSAL, nth=2))
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    session = world.runtime(agent).recover("r1")
    # The first write's receipt was to ride on the next commit: settled by its key first.
    assert session.step().kind is OutcomeKind.REPLAYED
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "duplicate_action")
    assert world.sandbox.write_count() == 1


def test_exhausted_proposal_budget_fails_the_run_and_terminal_refuses(world: World) -> None:
    """The last allowed rejection moves the run to failed, which refuses every further step."""
    world.task = make_task(world.sandbox.environment().state_fingerprint, budgets={"proposals": 2})
    session = world.runtime(ScriptedAgent([write("outside.txt", "x")])).start("r1")
    state = session.run().state
    assert state.phase is Phase.FAILED
    assert state.stop_reason == "budget_exhausted:proposals"
    assert state.spent.proposals == 2
    with pytest.raises(RunTerminalError):
        session.step()
    with pytest.raises(RunTerminalError):
        world.runtime(ScriptedAgent([finish])).recover("r1").step()


def test_run_returns_when_the_agent_asks_for_nothing_instead_of_asking_again(
    world: World,
) -> None:
    """An agent that only waits: run() takes one step, commits it, and returns WAITED at once."""
    idle = ScriptedAgent([lambda c, o: Decision(c)])
    session = world.runtime(idle).start("r1")
    before = session.state.generation
    outcome = session.run()
    assert (outcome.kind, outcome.event) == (OutcomeKind.WAITED, "agent_waited")
    assert idle.calls == 1 and session.state.generation == before + 1
    assert session.state.phase is Phase.RUNNING
    # Asked again later, it takes one more step; the run is there, durable, in the file.
    assert world.runtime(idle).recover("r1").run().kind is OutcomeKind.WAITED
    assert idle.calls == 2


def test_exhausted_step_and_wall_time_budgets_fail_the_run(world: World) -> None:
    """Running out of steps, or of wall time on the injected clock, fails the run."""
    world.task = make_task(world.sandbox.environment().state_fingerprint, budgets={"steps": 2})
    idle = ScriptedAgent([lambda c, o: Decision(c)])
    waiting = world.runtime(idle).start("r1")
    ran = [waiting.run() for _ in range(3)]  # each run() returns at the agent's wait
    assert [o.kind for o in ran] == [OutcomeKind.WAITED, OutcomeKind.WAITED, OutcomeKind.FAILED]
    assert ran[-1].state.stop_reason == "budget_exhausted:steps"
    world.task = make_task(
        world.sandbox.environment().state_fingerprint, budgets={"wall_time_s": 60}
    )
    session = world.runtime(idle).start("r2")
    session.step()
    world.clock.advance(61)
    assert session.run().state.stop_reason == "budget_exhausted:wall_time"


def test_checkpoint_size_does_not_grow_with_the_trace(world: World) -> None:
    """The checkpoint carries the trace head, not its body: its size is flat across steps."""
    idle = ScriptedAgent([lambda c, o: Decision(c)])
    session = world.runtime(idle).start("r1")
    rt = session.rt
    sizes = []
    for _ in range(15):
        session.step()
        sizes.append(len(rt.checkpointer.load("r1").envelope))
    assert session.state.trace_length == 16
    # Only the digits of counters may change, never the history.
    assert max(sizes) - min(sizes) <= 8


def test_a_lost_receipt_after_the_effect_freezes_instead_of_rejecting(world: World) -> None:
    """If the adapter lost the receipt of a sent write, the retry's failed precondition means review."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.EFFECT_SENT)
    pending = session.state.pending
    assert pending is not None
    assert world.sandbox.delete_receipt(pending.idempotency_key)
    session.step()
    assert session.state.phase is Phase.NEEDS_REVIEW
    assert session.state.review_cases[0].reason == "outcome_unknown"
    assert world.sandbox.write_count() == 1


def test_a_first_attempt_with_a_changed_target_is_rejected_and_the_run_goes_on(
    world: World,
) -> None:
    """A first send whose precondition fails is rejected; after a crash the same refusal means review."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = world.runtime(agent).start("r1")
    original = world.sandbox.execute

    def moved_first(key, intent, prestate, fence=None):  # type: ignore[no-untyped-def]
        world.sandbox.bypass_write("notes.txt", "changed")
        world.sandbox.execute = original  # type: ignore[method-assign]
        return original(key, intent, prestate, fence)

    world.sandbox.execute = moved_first  # type: ignore[method-assign]
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "precondition_failed")
    assert session.state.phase is Phase.RUNNING
    assert session.trace()[-1].kind == "effect_rejected"
    assert world.sandbox.write_count() == 0
    # After a crash the write was dispatched before: a refused re-send may hide one that landed.
    world.sandbox.bypass_write("notes.txt", "draft\n")
    rt = world.runtime(agent, crash=CrashPlan(CrashPoint.INTENT_PERSISTED))
    with pytest.raises(SimulatedCrash):
        rt.start("r2").run()
    again = world.runtime(agent).recover("r2")
    world.sandbox.bypass_write("notes.txt", "changed")
    again.step()
    assert again.state.phase is Phase.NEEDS_REVIEW
    assert again.state.review_cases[0].reason == "outcome_unknown"


def test_a_frozen_case_restores_where_it_was_opened_and_a_decision_applies(world: World) -> None:
    """A case whose receipt shows an unexpected post-state restores in a new runtime, frozen."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    session = crash_then_recover(world, agent, CrashPoint.EFFECT_SENT)
    pending = session.state.pending
    assert pending is not None
    forged_post = {**pending.expected_post.to_json(), "version": 7}
    world.sandbox.tamper_receipt(pending.idempotency_key, post_state=forged_post)
    session.step()
    assert session.state.phase is Phase.NEEDS_REVIEW
    assert session.state.review_cases[0].reason == "receipt_mismatch"
    committed = [e for e in world.store().ledger("r1") if e.status is EffectStatus.COMMITTED]
    assert len(committed) == 1  # the effect happened; the ledger says so before any decision
    again = world.runtime(agent).recover("r1")  # restorable, so a decision can be applied
    assert again.state.phase is Phase.NEEDS_REVIEW


def test_a_rejection_lost_in_a_crash_is_asked_again_and_sent_once(world: World) -> None:
    """A refusal dies with its commit; recovery asks the adapter by key and sends once."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    rt = world.runtime(agent, crash=CrashPlan(CrashPoint.CHECKPOINT_WRITE, nth=3))
    session = rt.start("r1")
    # Make the adapter refuse: the target changes after the intent is persisted.
    original = world.sandbox.execute

    def refuse_once(key, intent, prestate, fence=None):
        world.sandbox.bypass_write("notes.txt", "moved")
        world.sandbox.execute = original  # type: ignore[method-assign]
        return original(key, intent, prestate, fence)

    world.sandbox.execute = refuse_once  # type: ignore[method-assign]
    with pytest.raises(SimulatedCrash):
        session.run()
    statuses = [e.status for e in world.store().ledger("r1")]
    assert statuses[-1] is EffectStatus.DISPATCHED  # the rejection's commit died whole
    world.sandbox.bypass_write("notes.txt", "draft\n")  # back to the checkpointed state
    recovered = world.runtime(agent).recover("r1")
    recovered.step()
    assert recovered.state.phase is Phase.RUNNING
    assert recovered.state.writes_committed == 1
    assert world.sandbox.write_count() == 1


def test_an_environment_far_ahead_lists_fifty_receipts_and_says_there_are_more(
    world: World,
) -> None:
    """A case never claims the list is whole when the adapter holds more than it shows."""
    from tether.core import Intent

    world.runtime(ScriptedAgent([write("notes.txt", "x"), finish])).start("r1")
    sandbox = world.sandbox
    for n in range(55):
        args = sandbox.normalize("file.write", "notes.txt", {"content": f"other {n}"})
        sandbox.execute(
            f"o-{n}", Intent("file.write", "notes.txt", args, "low"), sandbox.environment()
        )
    session = world.runtime(ScriptedAgent([finish])).recover("r1")
    (case,) = session.state.review_cases
    assert sum(e["kind"] == "unrecorded_receipt" for e in case.evidence) == 50
    assert "more than 50 (the first 50 shown)" in case.detail
