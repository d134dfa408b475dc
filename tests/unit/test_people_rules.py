"""Rules of the people around a run as values: which inbox entries a run reads, and why it froze."""

from __future__ import annotations

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy
from tether.core import Phase, ReviewReason, SpecError
from tether.core import _people as people_rules

READ, REFUSE, STOP = people_rules.InboxRead
POLICY = make_policy()  # cancel: operators; rewind: operators and reviewers (the defaults)
ALL = frozenset({"approver", "reviewer", "operator"})

CASES = [
    ("approval", ALL, Phase.PENDING, READ),
    ("approval", frozenset({"reviewer"}), Phase.PENDING, STOP),
    ("review_decision", frozenset({"reviewer"}), Phase.NEEDS_REVIEW, READ),
    ("review_decision", frozenset({"approver"}), Phase.NEEDS_REVIEW, STOP),
    ("effect_decision", frozenset({"approver"}), Phase.RUNNING, STOP),
    ("cancel", frozenset({"operator"}), Phase.RUNNING, READ),
    ("cancel", frozenset({"approver"}), Phase.RUNNING, STOP),
    ("cancel", frozenset({"approver"}), Phase.PENDING, STOP),
    ("cancel", frozenset({"approver"}), Phase.NEEDS_REVIEW, REFUSE),
    ("rewind", frozenset({"operator"}), Phase.RUNNING, READ),
    ("rewind", frozenset({"approver"}), Phase.RUNNING, STOP),
    ("fork", frozenset({"operator"}), Phase.RUNNING, READ),
    ("fork", frozenset({"approver"}), Phase.RUNNING, STOP),
    ("admission", frozenset(), Phase.RUNNING, READ),
]


@pytest.mark.parametrize(("kind", "roles", "phase", "expected"), CASES)
def test_the_inbox_rule_table(
    kind: str, roles: frozenset[str], phase: Phase, expected: people_rules.InboxRead
) -> None:
    """Read when the roots name a role that may sign it; a frozen run refuses a cancel at once."""
    assert people_rules.inbox_read(POLICY, kind, roles, phase) is expected


def test_who_may_sign_follows_the_policys_authority() -> None:
    """Cancel and rewind signers come from the policy; the agent never signs an inbox entry."""
    policy = make_policy(authority={"cancel": ["reviewer"], "rewind": ["agent", "operator"]})
    assert people_rules.signers_of(policy, "cancel") == {"reviewer"}
    assert people_rules.signers_of(policy, "rewind") == {"operator"}
    assert people_rules.signers_of(policy, "approval") == {"approver"}


def test_a_park_with_a_word_that_is_no_review_reason_is_refused(world: World) -> None:
    """Review reasons are one StrEnum: a typo is refused typed, and nothing is frozen."""
    session = world.runtime(ScriptedAgent([finish])).start("r1")
    with pytest.raises(SpecError, match="worker_eror"):
        session.park("worker_eror", "a typo")
    assert session.state.phase is Phase.RUNNING
    session.park(ReviewReason.WORKER_ERROR, "kept failing")
    assert session.state.review_cases[-1].reason == "worker_error"
