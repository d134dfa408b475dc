"""When a carried-out read's record must be durable: the table, and the transition it marks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests._states import pending_state, pending_write
from tether.core import EnvironmentState, Intent, Phase, Proposal
from tether.core import _steps as step_rules
from tether.core._steps import MAX_RIDING_EVENTS, observation_durability
from tether.core._transition import Durability


@pytest.mark.parametrize(
    ("read", "approved", "riding", "expected"),
    [
        (True, False, 0, Durability.DEFERRED),
        (True, False, MAX_RIDING_EVENTS - 1, Durability.DEFERRED),
        (True, False, MAX_RIDING_EVENTS, Durability.NOW),
        (True, True, 0, Durability.NOW),
        (False, False, 0, Durability.NOW),
        (False, True, 0, Durability.NOW),
    ],
)
def test_observation_durability_follows_the_table(
    read: bool, approved: bool, riding: int, expected: Durability
) -> None:
    """Only a read that used no approval, with room behind the next commit, rides on it; a test run and an approved read commit at once."""
    assert observation_durability(read=read, approved=approved, riding=riding) is expected


def test_observed_carries_the_durability_it_is_given() -> None:
    """The observed transition is marked as the rule said: a deferred one is not durable on its own."""
    at = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    env = EnvironmentState("ns", "inst", 3, "sha256:" + "a" * 64)
    held = pending_write(Intent("w", "t", {}, "low"), prestate=env, expected_post=env, at=at)
    state = pending_state(held, at=at).evolve(phase=Phase.RUNNING, pending=None)
    proposal = Proposal("a1", "count", "", args={}, based_on_version=state.environment.version)
    later = step_rules.observed(state, proposal, {"x": 1}, durability=Durability.DEFERRED)
    assert later.durability is Durability.DEFERRED and not later.durable
    assert step_rules.observed(state, proposal, {"x": 1}).durable
