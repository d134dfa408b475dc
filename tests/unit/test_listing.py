"""Who a run waits for, decided once in core: table tests of the listing rules."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tether.core import Phase
from tether.core import _listing as listing_rules
from tether.core._listing import Listing, listing_of
from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
LATER = "2026-12-02T12:05:00.000000Z"
EARLIER = "2026-12-02T11:55:00.000000Z"
PENDING = Listing(epoch=1, subject="file.write a.txt", pending_action="w1", gate="intended")


@pytest.mark.parametrize(
    ("phase", "listing", "waiting_after", "awaits"),
    [
        ("pending", PENDING, None, True),  # never sent, no approval: a person must sign
        ("pending", replace(PENDING, approved_until=LATER), None, False),  # one in force
        ("pending", replace(PENDING, approved_until=EARLIER), None, True),  # it lapsed
        ("pending", replace(PENDING, approved_until=""), None, True),  # no readable expiry
        ("pending", replace(PENDING, gate="dispatched"), None, False),  # the adapter settles it
        ("pending", replace(PENDING, gate="dispatched"), 3, True),  # the worker parked it
        ("pending", replace(PENDING, gate=None), None, False),  # no approval applies
        ("running", PENDING, None, False),  # not pending at all
        ("needs_review", PENDING, 2, False),  # a reviewer's turn, not an approver's
    ],
)
def test_awaits_approval(
    phase: str, listing: Listing, waiting_after: int | None, awaits: bool
) -> None:
    """A pending write waits for an approval exactly when one applies, none is in force, and it may go."""
    assert listing_rules.awaits_approval(phase, listing, waiting_after, NOW) is awaits


@pytest.mark.parametrize(
    ("attempts", "error", "owner", "expires_in_s", "is_failing"),
    [
        (0, None, None, None, False),  # never claimed
        (1, None, "w", 30, False),  # being worked on
        (1, None, "w", -1, True),  # its worker died holding it
        (2, "boom", None, None, True),  # backed off after errors
        (1, "boom", "w", 30, True),  # held again, but the last attempt failed
    ],
)
def test_failing(
    attempts: int, error: str | None, owner: str | None, expires_in_s: int | None, is_failing: bool
) -> None:
    """Claims that ended badly count; the claim a live worker holds does not."""
    expires = None if expires_in_s is None else NOW + timedelta(seconds=expires_in_s)
    assert listing_rules.failing(attempts, error, owner, expires, NOW) is is_failing


@pytest.mark.parametrize(
    ("phase", "listing", "approval", "failing", "says", "person"),
    [
        ("needs_review", Listing(1, "c1 (conflict)"), False, False, "decision on c1", True),
        ("needs_review", Listing(1, ""), False, False, "decision on the run", True),
        ("pending", PENDING, True, False, "an approval of w1 (file.write a.txt)", True),
        ("pending", PENDING, False, False, "a worker to settle w1", False),
        (
            "pending",
            PENDING,
            False,
            True,
            "a worker to settle w1, after 2 failed attempt(s): boom (from --max-attempts on "
            "it is parked: `tether resume RUN` once the cause is fixed)",
            True,
        ),
        (
            "running",
            Listing(1),
            False,
            True,
            "a retry after 2 failed attempt(s): boom (from --max-attempts on it is parked: "
            "`tether resume RUN` once the cause is fixed)",
            True,
        ),
        ("running", Listing(1), False, False, None, False),
        ("completed", Listing(1), False, True, None, False),  # ended: nothing to wait for
    ],
)
def test_waiting_for_and_needs_person(
    phase: str, listing: Listing, approval: bool, failing: bool, says: str | None, person: bool
) -> None:
    """The words a list shows and whether a person must act, from the same facts."""
    text = listing_rules.waiting_for(
        phase, listing, approval=approval, failing=failing, attempts=2, last_error="boom"
    )
    assert (text is None) is (says is None)
    assert says is None or (text is not None and says in text)
    assert listing_rules.needs_person(phase, approval, failing) is person


def test_listing_of_a_pending_write_under_its_own_policy_and_under_another(
    world: World,
) -> None:
    """Gate and subject of a write waiting for approval; a policy the run is not bound to is no rule."""
    guarded = make_policy(
        kinds={
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}
        }
    )
    agent = ScriptedAgent([write("notes.txt", "v1\n", action_id="w1"), finish])
    session = world.runtime(agent, policy=guarded).start("r1")
    session.step()
    state = session.state
    assert state.phase is Phase.PENDING
    assert listing_of(state, guarded) == Listing(
        epoch=state.epoch, subject="file.write notes.txt", pending_action="w1", gate="intended"
    )
    # The lenient policy would let the write through, but it is not this run's.
    assert listing_of(state, world.policy).gate == "intended"
    assert listing_of(state, None).gate == "intended"
    # A run bound to the lenient policy: its pending write takes no approval.
    crashed = world.runtime(
        ScriptedAgent([write("notes.txt", "v2\n", action_id="w2"), finish]),
        crash=CrashPlan(CrashPoint.INTENT_PERSISTED),
    ).start("r2")
    with pytest.raises(SimulatedCrash):
        crashed.step()
    lenient = crashed.state
    assert lenient.pending is not None
    assert listing_of(lenient, world.policy).gate is None
    done = world.runtime(ScriptedAgent([finish])).start("r3").state
    assert listing_of(done, world.policy) == Listing(epoch=done.epoch)
