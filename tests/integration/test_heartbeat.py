"""A heartbeat keeps a working step's lease; a step stuck past the cap loses it; timing reads the runtime's clock."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, finish, write
from tether.core import LeaseError, LeaseHeldError, Observation, Phase
from tether.runtime import AgentContext, Decision
from tether.runtime._clock import SystemClock


class SlowAgent:
    """Thinks for ``seconds`` before its first decision; meanwhile probes the lease from outside."""

    def __init__(self, world: World, seconds: float, probes: list[float]) -> None:
        self.world = world
        self.seconds = seconds
        self.probes = probes
        self.taken: list[Any] = []  # what another worker got at each probe
        self.inner = ScriptedAgent([write("notes.txt", "done\n"), finish])

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        if context.plan_cursor == 0:
            started = time.monotonic()
            other = self.world.store()
            for at in self.probes:
                time.sleep(max(0.0, started + at - time.monotonic()))
                try:
                    self.taken.append(other.acquire_lease("r1", "w2", 30))
                except LeaseHeldError as exc:
                    self.taken.append(exc)
            time.sleep(max(0.0, started + self.seconds - time.monotonic()))
        return self.inner.decide(context, observation)


def test_an_agent_call_three_times_the_ttl_keeps_its_lease(world: World) -> None:
    """While the agent thinks for 3x the ttl no other worker can take the run, and its write lands once."""
    ttl = 0.4
    agent = SlowAgent(world, seconds=3 * ttl, probes=[0.5, 0.9, 1.1])
    session = world.runtime(agent, lease_ttl_s=ttl, clock=SystemClock(), worker="w1").start("r1")
    outcome = session.run()
    assert all(isinstance(t, LeaseHeldError) for t in agent.taken), agent.taken
    assert outcome.state.phase is Phase.COMPLETED
    assert world.sandbox.write_count() == 1
    mark = world.store().get_mark("r1")
    assert mark is not None and mark.lease_version == 1  # never taken over


def test_a_step_stuck_past_the_heartbeat_cap_loses_its_lease_and_sends_nothing(
    world: World,
) -> None:
    """A step covered past heartbeat_max_s lapses like a hung one: another worker takes it, the write never leaves."""
    ttl = 0.3
    agent = SlowAgent(world, seconds=1.5, probes=[1.2])
    session = world.runtime(
        agent, lease_ttl_s=ttl, heartbeat_max_s=0.3, clock=SystemClock(), worker="w1"
    ).start("r1")
    with pytest.raises(LeaseError):
        session.run()
    assert [type(t).__name__ for t in agent.taken] == ["Lease"]  # the other worker got it
    assert world.sandbox.write_count() == 0


def test_renewal_is_timed_by_the_runtimes_clock(world: World) -> None:
    """guard() renews only once the injected clock has moved a third of the ttl, whatever real time did."""
    session = world.runtime(ScriptedAgent([finish]), lease_ttl_s=30).start("r1")
    lease = session.lease
    assert lease is not None
    time.sleep(0.05)
    session.guard()
    assert session.lease is not None and session.lease.expires_at == lease.expires_at
    world.clock.advance(11)  # past ttl/3 by the runtime's clock
    session.guard()
    assert session.lease is not None and session.lease.expires_at > lease.expires_at
    assert session.lease.lease_version == lease.lease_version  # a renewal is no new holder


def test_the_heartbeat_max_must_be_a_positive_bounded_duration(world: World) -> None:
    """heartbeat_max_s of zero, a negative number, NaN or more than a day is refused at construction."""
    from tether.core import SpecError

    for bad in (0, -1, float("nan"), 10**9, True):
        with pytest.raises(SpecError):
            world.runtime(ScriptedAgent([finish]), heartbeat_max_s=bad)
