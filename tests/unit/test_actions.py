"""The whole action contract: reads, writes, test runs, finish and cancel through one gate."""

from __future__ import annotations

import secrets
import sqlite3
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from tests._plain import plain
from tests.conftest import ScriptedAgent, Step, World, finish, make_policy, make_task, write
from tether.core import (
    ActionResult,
    ContractViolationError,
    EffectStatus,
    IllegalTransitionError,
    Observation,
    OutcomeKind,
    Phase,
    Proposal,
    RunFrozenError,
    RunTerminalError,
    SpecError,
    TetherError,
    TraceIntegrityError,
    new_approval,
)
from tether.core._actions import catalog, gate
from tether.core._commit import seal_commit
from tether.crypto import Signer, TrustRoots
from tether.runtime import AgentContext, CrashPlan, CrashPoint, Decision, SimulatedCrash
from tether.testing import Sandbox

ALICE = Signer.generate("alice", "approver")
TRUST = TrustRoots.of(ALICE.trust_root())


def propose(kind: str, target: str = "", action_id: str | None = None, **extra: Any) -> Step:
    """A step that proposes any action, then moves the plan cursor on."""

    def step(context: AgentContext, obs: Observation) -> Decision:
        cursor = context.plan_cursor
        proposal = Proposal(action_id or f"a{cursor}", kind, target, **extra)
        return Decision(AgentContext(context.messages, context.memory, cursor + 1), proposal)

    return step


class Recorder:
    """Plays its steps and keeps every observation it was shown."""

    def __init__(self, steps: list[Step]) -> None:
        self.agent = ScriptedAgent(steps)
        self.seen: list[Observation] = []

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        self.seen.append(observation)
        return self.agent.decide(context, observation)


def approval(world: World, state: Any, ttl: float = 300) -> dict[str, Any]:
    now = world.clock.now()
    body = new_approval(
        state,
        ALICE.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl),
        nonce=secrets.token_hex(16),
    )
    return ALICE.sign(body)


# -- the gate, as a pure table ---------------------------------------------------

KINDS = catalog(Sandbox({}).kinds)


def _judge(world: World, proposal: Proposal, **overrides: Any) -> str | None:
    env = world.sandbox.environment()
    args: dict[str, Any] = {
        "kinds": KINDS,
        "task": world.task,
        "policy": world.policy,
        "phase": Phase.RUNNING,
        "environment": env,
        "now": world.clock.now(),
        "action_seen": False,
        "cost_spent": 0,
    }
    args.update(overrides)
    rejection = gate(proposal, **args)
    return None if rejection is None else rejection.reason


def _write(**changes: Any) -> Proposal:
    base = Proposal("w1", "file.write", "notes.txt", {"content": "x"}, based_on_version=0)
    return replace(base, **changes)


@pytest.mark.parametrize(
    ("proposal", "overrides", "reason"),
    [
        (_write(), {"phase": Phase.PENDING}, "pending_exists"),
        (_write(action_id=""), {}, "schema"),
        (_write(extra={"colour": "red"}), {}, "schema"),
        (Proposal("f1", "finish", "calc.py"), {}, "schema"),
        (_write(args={"content": "x", "approved_by": "me"}), {}, "embedded_approval"),
        (_write(kind="shell.run"), {}, "unknown_kind"),
        (_write(args={}), {}, "missing_argument"),
        (_write(args={"content": "x", "mode": "0777"}), {}, "unknown_argument"),
        (Proposal("r1", "file.read", "notes.txt", {"offset": 3}), {}, "unknown_argument"),
        (Proposal("c1", "cancel"), {}, "missing_argument"),
        (_write(target="../etc/passwd"), {}, "scope_target"),
        (_write(target="secrets.txt"), {}, "scope_target"),
        (Proposal("t1", "tests.run", "rm-rf"), {}, "test_target"),
        (_write(idempotency_key="mine"), {}, "agent_key"),
        (Proposal("r1", "file.read", "notes.txt", idempotency_key="k"), {}, "agent_key"),
        (_write(risk="high"), {}, "risk_mismatch"),
        (_write(based_on_version=None), {}, "missing_version"),
        (_write(based_on_version=3), {}, "stale_version"),
        (_write(action_id="used"), {"action_seen": True}, "duplicate_action"),
        (_write(cost=1), {"cost_spent": 100}, "budget_cost"),
        (_write(), {}, None),
        (Proposal("r1", "file.read", "notes.txt"), {}, None),
        (Proposal("l1", "file.list"), {}, None),
        (Proposal("f1", "finish", args={"summary": "done"}), {}, None),
        (Proposal("c1", "cancel", args={"reason": "no longer needed"}), {}, None),
    ],
)
def test_the_gate_refuses_each_violation_with_its_reason_word(
    world: World, proposal: Proposal, overrides: dict[str, Any], reason: str | None
) -> None:
    """Every refusal in the gate's table has a stable reason word; a sound proposal passes."""
    assert _judge(world, proposal, **overrides) == reason


def test_the_gate_refuses_kinds_the_task_or_policy_do_not_grant(world: World) -> None:
    """A kind outside the task, without a rule, beyond the permission or the risk is refused."""
    fp = world.sandbox.environment().state_fingerprint
    writes_only = make_task(fp, allowed_kinds=["file.write"], permissions=["workspace.write"])
    read = Proposal("r1", "file.read", "notes.txt")
    assert _judge(world, read, task=writes_only) == "scope_kind"
    bare = replace(world.policy, kinds={})
    assert _judge(world, read, policy=bare) == "no_rule"
    readers = make_task(fp, permissions=["workspace.read"])
    assert _judge(world, _write(), task=readers) == "permission"
    risky = make_policy(
        kinds={
            "file.write": {"risk": "high", "permission": "workspace.write", "needs_approval": False}
        }
    )
    assert _judge(world, _write(), policy=risky) == "risk"
    assert _judge(world, _write(deadline=world.clock.now())) == "deadline"


def test_unknown_names_in_task_or_policy_fail_at_load(world: World) -> None:
    """An unknown permission, an undeclared kind, or a kind with no rule refuse to load."""
    fp = world.sandbox.environment().state_fingerprint
    with pytest.raises(SpecError, match=r"unknown permission 'workspace\.wrte'"):
        world.runtime(ScriptedAgent([finish]), task=make_task(fp, permissions=["workspace.wrte"]))
    with pytest.raises(SpecError, match=r"unknown action kind 'shell\.run'"):
        world.runtime(ScriptedAgent([finish]), task=make_task(fp, allowed_kinds=["shell.run"]))
    no_read = replace(world.policy, kinds={"file.write": world.policy.kinds["file.write"]})
    with pytest.raises(SpecError, match=r"no rule for 'file\.read'"):
        world.runtime(ScriptedAgent([finish]), policy=no_read)


# -- reads ---------------------------------------------------------------------


def test_a_read_is_an_action_whose_answer_is_the_next_observation(world: World) -> None:
    """The agent sees what it read, not the whole tree; the ledger records nothing for it."""
    agent = Recorder([propose("file.read", "notes.txt", "read-notes"), finish])
    session = world.runtime(agent).start("r1")
    first = session.step()
    assert first.kind is OutcomeKind.OBSERVED and first.event == "action_observed"
    assert session.state.spent.proposals == 1
    session.step()
    seen = agent.seen[-1]
    result = seen.result("read-notes")
    assert result is not None and result.outcome == "observed"
    assert result.data["text"] == "draft\n" and result.data["exists"] is True
    assert not hasattr(seen, "data")  # no whole-tree dump rides along
    assert session.state.ledger_length == 0
    assert world.sandbox.write_count() == 0


def test_read_results_survive_a_recovery(world: World) -> None:
    """A run recovered after a read shows the agent the same result its checkpoint recorded."""
    session = world.runtime(Recorder([propose("file.read", "notes.txt", "rd"), finish])).start("r1")
    session.step()
    agent = Recorder([propose("file.read", "notes.txt", "rd"), finish])
    recovered = world.runtime(agent).recover("r1")
    recovered.step()
    result = agent.seen[-1].result("rd")
    assert result is not None and result.data["text"] == "draft\n"
    assert recovered.state.phase is Phase.COMPLETED


def test_a_read_id_used_before_is_refused_also_after_a_recovery(world: World) -> None:
    """The gate's "used before" covers reads, rebuilt from the signed trace on recovery."""
    steps = [propose("file.read", "notes.txt", "same"), propose("file.read", "notes.txt", "same")]
    session = world.runtime(ScriptedAgent(steps)).start("r1")
    session.step()
    recovered = world.runtime(ScriptedAgent(steps)).recover("r1")
    outcome = recovered.step()
    assert outcome.kind is OutcomeKind.REJECTED and outcome.reason == "duplicate_action"


def test_a_rejection_is_the_agents_next_result(world: World) -> None:
    """The agent hears why it was refused: the reason word is in its next observation."""
    agent = Recorder([write("secrets/key.txt", "x", "bad"), finish])
    session = world.runtime(agent).start("r1")
    outcome = session.step()
    assert outcome.kind is OutcomeKind.REJECTED and outcome.reason == "scope_target"
    session.step()
    result = agent.seen[-1].result("bad")
    assert result == ActionResult(
        "bad", "file.write", "secrets/key.txt", "rejected", "scope_target", result.data
    )


def test_a_read_the_policy_guards_waits_for_an_approval(world: World) -> None:
    """A read can need approval: it waits, with no ledger entry, and runs once approved."""
    world.policy = make_policy(
        kinds={"file.read": {"risk": "low", "permission": "workspace.read", "needs_approval": True}}
    )
    agent = Recorder([propose("file.read", "notes.txt", "rd"), finish])
    session = world.runtime(agent, trust=TRUST).start("r1")
    waiting = session.step()
    assert waiting.kind is OutcomeKind.WAITING_FOR_APPROVAL
    assert session.state.phase is Phase.PENDING and session.state.ledger_length == 0
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL  # nothing read meanwhile
    session.approve(approval(world, session.state))
    recovered = world.runtime(agent, trust=TRUST).recover("r1")  # the approval survives it
    done = recovered.step()
    assert done.kind is OutcomeKind.OBSERVED
    assert recovered.state.spent.proposals == 1  # charged once, when it was proposed
    recovered.step()
    result = agent.seen[-1].result("rd")
    assert result is not None and result.data["text"] == "draft\n"
    assert recovered.state.ledger_length == 0


# -- test runs -----------------------------------------------------------------


def test_a_test_run_is_an_action_on_the_tasks_allowlist(world: World) -> None:
    """tests.run runs an allowlisted command and hands its verdict to the agent."""
    fp = world.sandbox.environment().state_fingerprint
    world.task = make_task(
        fp, tests={"unit": {"argv": ["python", "-m", "unittest"], "timeout_s": 30}}
    )
    agent = Recorder(
        [propose("tests.run", "unit", "t1"), propose("tests.run", "lint", "t2"), finish]
    )
    session = world.runtime(agent).start("r1")
    assert session.step().kind is OutcomeKind.OBSERVED
    refused = session.step()
    assert refused.reason == "test_target"
    ran = agent.seen[1].result("t1")
    assert ran is not None and ran.data["passed"] is True and ran.data["exit_code"] == 0


# -- finish ----------------------------------------------------------------------


def test_a_failed_verifier_tells_the_agent_why(tmp_path: Any, world: World) -> None:
    """A finish the verifier refuses leaves the run going, and the agent's next result says so."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"},
        instance_id="sbx-1",
        clock=world.clock.now,
        verifier=lambda files: files.get("notes.txt") == "done\n",
    )
    agent = Recorder([finish, write("notes.txt", "done\n"), finish])
    session = world.runtime(agent).start("r1")
    failed = session.step()
    assert failed.kind is OutcomeKind.VERIFIER_FAILED and session.state.phase is Phase.RUNNING
    session.step()
    (result,) = agent.seen[-1].results
    assert result.kind == "finish" and result.reason == "verifier_failed"
    assert session.run().kind is OutcomeKind.FINISHED


# -- cancel ----------------------------------------------------------------------


def test_the_agent_can_cancel_and_a_cancelled_run_never_moves_again(world: World) -> None:
    """cancel ends the run; step and recover refuse it from then on."""
    steps = [propose("cancel", args={"reason": "the ticket was closed"}), finish]
    session = world.runtime(ScriptedAgent(steps)).start("r1")
    outcome = session.step()
    assert outcome.kind is OutcomeKind.CANCELLED and session.state.phase is Phase.CANCELLED
    assert session.trace()[-1].data["reason"] == "the ticket was closed"
    with pytest.raises(RunTerminalError):
        session.step()
    recovered = world.runtime(ScriptedAgent(steps)).recover("r1")
    with pytest.raises(RunTerminalError):
        recovered.step()
    with pytest.raises(RunTerminalError):
        recovered.cancel("again")


def test_cancel_drops_a_write_that_never_left(world: World) -> None:
    """A write waiting for approval is dropped by a cancel, and the ledger says cancelled."""
    world.policy = make_policy(
        kinds={
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}
        }
    )
    session = world.runtime(ScriptedAgent([write("notes.txt", "x"), finish])).start("r1")
    session.step()
    assert session.state.phase is Phase.PENDING
    outcome = session.cancel("the operator changed their mind")
    assert outcome.kind is OutcomeKind.CANCELLED and session.state.pending is None
    ledger = world.store().ledger("r1")
    assert [e.status for e in ledger] == [EffectStatus.INTENDED, EffectStatus.CANCELLED]
    assert world.sandbox.write_count() == 0


def test_cancel_records_a_write_that_landed_before_it_cancels(world: World) -> None:
    """A crash after the send: the cancel asks the adapter, records the receipt, then cancels."""
    crash = CrashPlan(CrashPoint.EFFECT_SENT)
    session = world.runtime(ScriptedAgent([write("notes.txt", "x"), finish]), crash=crash)
    with pytest.raises(SimulatedCrash):
        session.start("r1").step()
    recovered = world.runtime(ScriptedAgent([finish])).recover("r1")
    outcome = recovered.cancel("stop")
    assert outcome.kind is OutcomeKind.CANCELLED
    assert recovered.state.writes_committed == 1 and world.sandbox.write_count() == 1
    statuses = [e.status for e in world.store().ledger("r1")]
    assert statuses == [EffectStatus.INTENDED, EffectStatus.DISPATCHED, EffectStatus.COMMITTED]


def test_cancel_of_a_dispatched_write_the_adapter_has_no_record_of_goes_to_review(
    world: World,
) -> None:
    """Absent is not proof at cancel time (an older worker may still be sending): a person decides."""
    crash = CrashPlan(CrashPoint.INTENT_PERSISTED)
    with pytest.raises(SimulatedCrash):
        world.runtime(ScriptedAgent([write("notes.txt", "x"), finish]), crash=crash).start(
            "r1"
        ).step()
    recovered = world.runtime(ScriptedAgent([finish])).recover("r1")
    assert recovered.state.pending is not None
    assert recovered.state.pending.status is EffectStatus.DISPATCHED
    outcome = recovered.cancel("stop")
    assert outcome.kind is OutcomeKind.FROZEN and outcome.reason == "cancel_outcome_unknown"
    assert world.store().ledger("r1")[-1].status is EffectStatus.OUTCOME_UNKNOWN
    assert world.sandbox.write_count() == 0  # the cancel sent nothing


def test_cancel_with_an_unknowable_outcome_goes_to_review(world: World) -> None:
    """A dispatched write on an adapter that can't be asked is never abandoned: review."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"},
        instance_id="sbx-1",
        clock=world.clock.now,
        idempotent=True,
        queryable=False,
    )
    crash = CrashPlan(CrashPoint.INTENT_PERSISTED)
    with pytest.raises(SimulatedCrash):
        world.runtime(ScriptedAgent([write("notes.txt", "x"), finish]), crash=crash).start(
            "r1"
        ).step()
    recovered = world.runtime(ScriptedAgent([finish])).recover("r1")
    outcome = recovered.cancel("stop")
    assert outcome.kind is OutcomeKind.FROZEN and outcome.reason == "cancel_outcome_unknown"
    assert recovered.state.phase is Phase.NEEDS_REVIEW
    assert world.store().ledger("r1")[-1].status is EffectStatus.OUTCOME_UNKNOWN
    with pytest.raises(RunFrozenError):
        recovered.cancel("stop again")


def test_a_cancel_needs_a_reason(world: World) -> None:
    """An empty reason is a typed error and changes nothing."""
    session = world.runtime(ScriptedAgent([finish])).start("r1")
    generation = session.state.generation
    with pytest.raises(SpecError):
        session.cancel("  ")
    assert session.state.generation == generation and session.state.phase is Phase.RUNNING


# -- what the adversarial review found ----------------------------------------------


def _guard(world: World, kind: str, permission: str = "workspace.read") -> None:
    world.policy = make_policy(
        kinds={kind: {"risk": "low", "permission": permission, "needs_approval": True}}
    )


@pytest.mark.parametrize("kind", ["finish", "file.list"])
def test_a_held_action_with_no_target_restores_and_runs_once(world: World, kind: str) -> None:
    """A gated finish or listing survives a recovery (empty target) and runs once approved."""
    _guard(world, kind)
    step = finish if kind == "finish" else propose("file.list", action_id="ls")
    session = world.runtime(ScriptedAgent([step, finish]), trust=TRUST).start("r1")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    recovered = world.runtime(ScriptedAgent([step, finish]), trust=TRUST).recover("r1")
    recovered.approve(approval(world, recovered.state))
    again = world.runtime(ScriptedAgent([step, finish]), trust=TRUST).recover("r1")
    done = again.step()
    assert done.kind is (OutcomeKind.FINISHED if kind == "finish" else OutcomeKind.OBSERVED)
    assert again.state.pending is None and again.state.spent.proposals == 1


class RefusingSandbox(Sandbox):
    """A sandbox whose reads are always refused, as a real adapter may refuse one."""

    def read(self, kind: str, target: str, args: dict[str, Any], scope: Any) -> Any:
        raise ContractViolationError("too_large", f"{target} is too large to read")


def test_an_approved_read_the_adapter_refuses_is_rejected_once_and_not_pending(
    world: World,
) -> None:
    """A held read the adapter then refuses ends as one rejection; the run goes on, charged once."""
    world.sandbox = RefusingSandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", clock=world.clock.now
    )
    _guard(world, "file.read")
    agent = Recorder([propose("file.read", "notes.txt", "rd"), finish])
    session = world.runtime(agent, trust=TRUST).start("r1")
    session.step()
    session.approve(approval(world, session.state))
    refused = session.step()
    assert refused.kind is OutcomeKind.REJECTED and refused.reason == "too_large"
    assert session.state.phase is Phase.RUNNING and session.state.pending is None
    assert session.state.spent.proposals == 1
    assert session.run().kind is OutcomeKind.FINISHED


def test_an_edited_trace_row_fails_recovery_closed(world: World) -> None:
    """Editing a stored trace event (here: which action it names) is a typed integrity error."""
    session = world.runtime(ScriptedAgent([propose("file.read", "notes.txt", "rd")])).start("r1")
    session.step()
    plain(world.db)
    with sqlite3.connect(world.db) as db:
        db.execute(
            "UPDATE tether_trace SET data = replace(data, '\"rd\"', '\"other\"') "
            "WHERE kind = 'action_observed'"
        )
    with pytest.raises(TraceIntegrityError):
        world.runtime(ScriptedAgent([finish])).recover("r1")


def test_a_listing_shows_only_the_tasks_paths(world: World) -> None:
    """file.list names no path outside the task's allowed paths (nor its hash)."""
    world.sandbox = Sandbox(
        {"notes.txt": "a", "secrets.env": "TOKEN=1", "src/m.py": "x"},
        instance_id="sbx-1",
        clock=world.clock.now,
    )
    world.task = make_task(world.sandbox.environment().state_fingerprint)
    agent = Recorder([propose("file.list", action_id="ls"), finish])
    session = world.runtime(agent).start("r1")
    session.step()
    session.step()
    listed = agent.seen[-1].result("ls")
    assert listed is not None and sorted(listed.data["files"]) == ["notes.txt", "src/m.py"]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "proposal",
    [
        Proposal("x", "file.read", "notes.txt", None),  # type: ignore[arg-type]
        Proposal("x", "file.read", "notes.txt", {1: "a", "b": 2}),  # type: ignore[dict-item]
        Proposal("x", "finish", args={"summary": {1, 2}}),
        Proposal("x", "finish", args={"summary": 3}),
        Proposal("x", "cancel", args={"reason": "  "}),
        Proposal("x", "cancel", args={"reason": 7}),
    ],
)
def test_malformed_arguments_are_a_schema_rejection_not_a_crash(
    world: World, proposal: Proposal
) -> None:
    """Arguments that are not a JSON object of text-keyed values are refused with `schema`."""
    assert _judge(world, proposal) == "schema"
    session = world.runtime(ScriptedAgent([lambda c, o: Decision(c, proposal)])).start("r1")
    outcome = session.step()
    assert outcome.kind is OutcomeKind.REJECTED and outcome.reason == "schema"


def test_a_refused_recovery_leaves_no_lease_behind(world: World) -> None:
    """A recovery that fails a restore check releases the lease it took, so others can proceed."""
    session = world.runtime(ScriptedAgent([finish]), lease_ttl_s=30).start("r1")
    session.release()
    twin = Sandbox(world.sandbox.files, instance_id="sbx-other")  # another instance: fails closed
    with pytest.raises(TetherError):
        world.runtime(ScriptedAgent([finish]), lease_ttl_s=30, worker="w2", adapter=twin).recover(
            "r1"
        )
    mark = world.store().get_mark("r1")
    assert mark is not None and mark.lease_owner is None


def test_the_agents_own_cancel_costs_a_proposal(world: World) -> None:
    """cancel is an action like any other: it is charged one proposal and its cost."""
    steps = [propose("cancel", args={"reason": "done here"}, cost=3)]
    session = world.runtime(ScriptedAgent(steps)).start("r1")
    session.step()
    assert (session.state.spent.proposals, session.state.spent.cost) == (1, 3)


def test_an_agent_cannot_shadow_the_runtimes_finish_id(world: World) -> None:
    """An agent that uses the id the runtime gives a later finish does not block that finish."""
    session = world.runtime(ScriptedAgent([propose("file.read", "notes.txt", "finish@2"), finish]))
    run = session.start("r1")
    run.step()
    assert run.step().kind is OutcomeKind.FINISHED


def test_a_finish_rule_the_task_can_never_meet_fails_at_load(world: World) -> None:
    """A policy rule for finish needing a permission the task lacks (or too much risk) won't load."""
    unreachable = make_policy(
        kinds={"finish": {"risk": "low", "permission": "root", "needs_approval": False}}
    )
    with pytest.raises(SpecError, match="finish"):
        world.runtime(ScriptedAgent([finish]), policy=unreachable)
    risky = make_policy(
        kinds={"finish": {"risk": "high", "permission": "workspace.read", "needs_approval": False}}
    )
    with pytest.raises(SpecError, match="finish"):
        world.runtime(ScriptedAgent([finish]), policy=risky)


def test_a_pending_write_cannot_complete_the_run(world: World) -> None:
    """pending -> completed exists for a held finish only; a pending write must settle first."""
    world.policy = make_policy(
        kinds={
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}
        }
    )
    session = world.runtime(ScriptedAgent([write("notes.txt", "x")])).start("r1")
    session.step()
    with pytest.raises(IllegalTransitionError):
        seal_commit(
            session.state,
            session.state.evolve(phase=Phase.COMPLETED, stop_reason="verified"),
            [],
            now=world.clock.now(),
        )
