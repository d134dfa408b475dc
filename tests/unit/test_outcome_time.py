"""The agent hears how its last action ended; wall time counts only the run's own work."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, Step, World, finish, make_policy, make_task, write
from tether.core import (
    Observation,
    OutcomeKind,
    Phase,
    Proposal,
    RunState,
    TaskSpec,
    UnknownFieldError,
    new_approval,
)
from tether.core._fields import Fields
from tether.core._model import OUTCOME_OUTPUT_MAX, LastOutcome
from tether.core._state import working_ms
from tether.crypto import Signer, TrustRoots
from tether.runtime import AgentContext, CrashPlan, CrashPoint, Decision, SimulatedCrash
from tether.testing import Sandbox

ALICE = Signer.generate("alice", "approver")
GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


@dataclass
class Listening(ScriptedAgent):
    """A scripted agent that keeps every observation it was given."""

    observations: list[Observation] = field(default_factory=list)

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        self.observations.append(observation)
        return ScriptedAgent.decide(self, context, observation)


def outside(context: AgentContext, obs: Observation) -> Decision:
    """Propose a write to a path the task does not allow: the gate refuses it."""
    cursor = context.plan_cursor
    proposal = Proposal(f"x{cursor}", "file.write", "secrets.txt", args={"content": "no"})
    return Decision(AgentContext(context.messages, context.memory, cursor + 1), proposal)


def slow(seconds: float, world: World, then: Step) -> Step:
    """A step whose thinking takes ``seconds`` on the injected clock."""

    def step(context: AgentContext, obs: Observation) -> Decision:
        world.clock.advance(seconds)
        return then(context, obs)

    return step


# -- the last outcome -------------------------------------------------------------------


def test_the_next_observation_carries_the_gates_rejection(world: World) -> None:
    """A write outside the allowed paths is refused; the agent's next look says why."""
    agent = Listening([outside, finish])
    session = world.runtime(agent).start("r1")
    assert session.step().kind is OutcomeKind.REJECTED
    session.step()
    heard = agent.observations[1].last_outcome
    assert heard is not None and heard.kind == "rejected" and heard.action_id == "x0"
    assert heard.reason and "secrets.txt" in heard.message
    assert agent.observations[0].last_outcome is None


def test_the_next_observation_carries_the_verifiers_verdict_and_output(world: World) -> None:
    """finish on a state the verifier rejects: the next look has verifier_failed and its output."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"},
        instance_id="sbx-1",
        clock=world.clock.now,
        verifier=lambda files: files["notes.txt"] == "good",
    )
    agent = Listening([finish, write("notes.txt", "good"), finish])
    session = world.runtime(agent).start("r1")
    assert session.step().kind is OutcomeKind.VERIFIER_FAILED
    session.step()
    heard = agent.observations[1].last_outcome
    assert heard is not None and heard.kind == "verifier_failed"
    assert heard.reason == "verifier_failed" and "verifier failed" in heard.output
    session.run()
    assert session.state.phase is Phase.COMPLETED


def test_the_last_outcome_survives_a_crash_between_steps(world: World) -> None:
    """A rejection, a crash before the next proposal: the recovered agent still hears it."""
    agent = Listening([outside, finish])
    crash = CrashPlan(CrashPoint.BEFORE_PROPOSAL, nth=2)
    with pytest.raises(SimulatedCrash):
        world.runtime(agent, crash=crash).start("r1").run()
    fresh = Listening([outside, finish])
    world.runtime(fresh).recover("r1").step()
    heard = fresh.observations[0].last_outcome
    assert heard is not None and heard.kind == "rejected" and heard.action_id == "x0"


def test_an_executed_write_is_the_last_outcome_until_the_agent_has_seen_it(world: World) -> None:
    """A committed write is heard as executed; once the agent has looked, the state drops it."""
    agent = Listening([write("notes.txt", "x"), finish])
    session = world.runtime(agent).start("r1")
    session.step()
    assert session.state.last_outcome is not None
    assert session.state.last_outcome.kind == "executed"
    session.step()
    heard = agent.observations[1].last_outcome
    assert heard is not None and heard.kind == "executed" and heard.action_id == "a0"
    assert session.state.phase is Phase.COMPLETED and session.state.last_outcome is None


def test_a_last_outcome_stays_bounded_and_parses_strictly() -> None:
    """Output is cut to its last 4 KB and messages to 1000 characters; longer ones are refused."""
    big = LastOutcome.bounded("verifier_failed", message="m" * 5000, output="o" * 9000 + "END")
    assert len(big.output) == OUTCOME_OUTPUT_MAX and big.output.endswith("END")
    assert len(big.message) == 1000
    again = LastOutcome.parse(Fields(big.to_json(), "last_outcome", UnknownFieldError))
    assert again == big
    with pytest.raises(UnknownFieldError):
        LastOutcome.parse(
            Fields({**big.to_json(), "output": "o" * 5000}, "last_outcome", UnknownFieldError)
        )


def test_checkpoints_stay_flat_however_many_rejections(world: World) -> None:
    """The state's size does not grow with the number of outcomes the agent has heard."""
    agent = ScriptedAgent([outside] * 9 + [finish])
    world.task = make_task(world.task.initial_environment.state_fingerprint)
    session = world.runtime(agent).start("r1")
    sizes = []
    for _ in range(8):
        session.step()
        sizes.append(len(str(session.state.to_json())))
    assert max(sizes[2:]) - min(sizes[2:]) < 64


# -- wall time -----------------------------------------------------------------------------


def test_working_time_counts_while_running_not_while_waiting(world: World) -> None:
    """working_ms counts a running run's time, not a frozen one's, and not before resumed_at."""
    state = world.runtime(ScriptedAgent([finish])).start("r1").state
    now = state.updated_at + timedelta(seconds=30)
    assert working_ms(state, now) == 30_000
    assert working_ms(state, now, resumed_at=now - timedelta(seconds=5)) == 5_000
    assert working_ms(state.evolve(phase=Phase.NEEDS_REVIEW), now) == 0


def test_the_agents_thinking_time_is_wall_time(world: World) -> None:
    """Time the run spends working between commits is added to spent.wall_time_ms."""
    agent = ScriptedAgent([slow(120, world, write("notes.txt", "x")), finish])
    session = world.runtime(agent).start("r1")
    session.step()
    assert session.state.spent.wall_time_ms == 120_000


def test_downtime_between_a_crash_and_the_recovery_is_not_wall_time(world: World) -> None:
    """A run down for longer than its wall-time budget recovers and completes within it."""
    world.task = make_task(
        world.task.initial_environment.state_fingerprint, budgets={"wall_time_s": 600}
    )
    agent = ScriptedAgent([slow(100, world, write("notes.txt", "x")), finish])
    with pytest.raises(SimulatedCrash):
        world.runtime(agent, crash=CrashPlan(CrashPoint.BEFORE_PROPOSAL, nth=2)).start("r1").run()
    world.clock.advance(10_000)  # the machine was off for hours
    session = world.runtime(ScriptedAgent(agent.steps)).recover("r1")
    assert session.run().kind is OutcomeKind.FINISHED
    assert session.state.spent.wall_time_ms == 100_000


def test_waiting_for_an_approval_is_not_wall_time(world: World) -> None:
    """The hours a write waits for a person's approval do not count against wall_time_s."""
    world.policy = make_policy(kinds=GUARDED, approval_ttl_s=600)
    world.task = make_task(
        world.task.initial_environment.state_fingerprint, budgets={"wall_time_s": 60}
    )
    session = world.runtime(
        ScriptedAgent([write("notes.txt", "x"), finish]), trust=TrustRoots.of(ALICE.trust_root())
    ).start("r1")
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    world.clock.advance(7200)
    session.approve(approval(world, session.state))
    assert session.run().kind is OutcomeKind.FINISHED
    assert session.state.spent.wall_time_ms == 0


def test_a_calendar_deadline_bounds_the_run_whatever_it_did(world: World) -> None:
    """deadline_s counts calendar time from the start: downtime does count there."""
    world.task = make_task(
        world.task.initial_environment.state_fingerprint, budgets={"deadline_s": 3600}
    )
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    with pytest.raises(SimulatedCrash):
        world.runtime(agent, crash=CrashPlan(CrashPoint.BEFORE_PROPOSAL, nth=2)).start("r1").run()
    world.clock.advance(4000)
    session = world.runtime(ScriptedAgent(agent.steps)).recover("r1")
    # The write's receipt was to ride on the next commit: the recovery settles it first.
    assert session.step().kind is OutcomeKind.REPLAYED
    outcome = session.step()
    assert outcome.kind is OutcomeKind.FAILED
    assert session.state.stop_reason == "budget_exhausted:deadline"


def test_the_deadline_is_in_the_task_fingerprint_only_when_set(world: World) -> None:
    """A task without deadline_s keeps its fingerprint; one with it differs and round-trips."""
    fingerprint = world.task.initial_environment.state_fingerprint
    plain = make_task(fingerprint)
    assert "deadline_s" not in plain.to_json()["budgets"]
    timed = make_task(fingerprint, budgets={"deadline_s": 86_400})
    assert timed.fingerprint != plain.fingerprint
    assert TaskSpec.from_json(timed.to_json()).budgets.deadline_s == 86_400


def approval(world: World, state: RunState) -> Any:
    now = world.clock.now()
    return ALICE.sign(
        new_approval(
            state,
            "alice",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
    )


def test_the_next_observation_carries_the_adapters_refusal_of_a_write(world: World) -> None:
    """The adapter refuses a write (its target changed): the agent's next look says so."""
    agent = Listening([write("notes.txt", "x"), finish])
    session = world.runtime(agent).start("r1")
    original = world.sandbox.execute

    def moved_first(key, intent, prestate, fence=None):  # type: ignore[no-untyped-def]
        world.sandbox.bypass_write("notes.txt", "changed by hand")
        world.sandbox.execute = original  # type: ignore[method-assign]
        return original(key, intent, prestate, fence)

    world.sandbox.execute = moved_first  # type: ignore[method-assign]
    assert session.step().kind is OutcomeKind.REJECTED
    session.step()
    heard = agent.observations[1].last_outcome
    assert heard is not None and heard.kind == "rejected"
    assert heard.reason == "precondition_failed" and heard.action_id == "a0"
