"""The held action and the call that asks for it: which rule settles it, whether a call asks for it,
and what a call does once the step has settled what came first, each as a table."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests._states import pending_state, pending_write
from tether.core import EnvironmentState, Intent, PendingWrite, Phase, Proposal
from tether.core._held import AfterSettle, HeldKind, after_settle, answers_held, held_kind
from tether.core._rewind import RewindPlan, RewindScope

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
PRE = EnvironmentState("ns", "inst", 3, "sha256:" + "a" * 64)
POST = EnvironmentState("ns", "inst", 4, "sha256:" + "b" * 64)
WRITE = Intent("file.write", "a.txt", {"content": "x"}, "low")
READ = Intent("file.read", "a.txt", {}, "low")
HELD_WRITE = pending_write(WRITE, prestate=PRE, expected_post=POST, at=NOW)
HELD_READ = pending_write(READ, prestate=PRE, expected_post=PRE, at=NOW, mutating=False)
HELD_REPLAY = pending_write(WRITE, prestate=PRE, expected_post=PRE, at=NOW, mutating=False)


@pytest.mark.parametrize(
    ("held", "kind_mutates", "expected"),
    [
        (HELD_WRITE, True, HeldKind.WRITE),
        (HELD_WRITE, None, HeldKind.WRITE),  # a write the catalog no longer declares: by its key
        (HELD_READ, False, HeldKind.ACTION),
        (HELD_READ, None, HeldKind.ACTION),
        (HELD_REPLAY, True, HeldKind.REPLAY),  # a write's kind held without a change: a replay
    ],
)
def test_which_rule_settles_the_held_action(
    held: PendingWrite, kind_mutates: bool | None, expected: HeldKind
) -> None:
    """A write is settled by its key, a held non-write carried out, a held write kind replayed."""
    assert held_kind(held, kind_mutates=kind_mutates) is expected


def ask(action_id: str, intent: Intent, **args: object) -> Proposal:
    return Proposal(action_id, intent.kind, intent.target, args={**intent.args, **args})


ANSWERS_TABLE = [
    # (held, proposal, proposal's effect digest, held's effect digest) -> answers
    ("own id, other args", HELD_WRITE, ask("a1", WRITE, content="y"), "e2", "e1", True),
    ("same effect, new id", HELD_WRITE, ask("a9", WRITE), "e1", "e1", True),
    ("other effect", HELD_WRITE, ask("a9", WRITE, content="y"), "e2", "e1", False),
    ("no effect (refused)", HELD_WRITE, ask("a9", WRITE), None, "e1", False),
    ("no effect known for either", HELD_WRITE, ask("a9", WRITE), None, None, False),
    ("read asked again", HELD_READ, ask("a9", READ), None, None, True),
    ("read, other args", HELD_READ, ask("a9", READ, lines=3), None, None, False),
    ("read, other target", HELD_READ, Proposal("a9", "file.read", "b.txt"), None, None, False),
    ("read, own id", HELD_READ, Proposal("a1", "file.read", "b.txt"), None, None, True),
    ("replay asked again", HELD_REPLAY, ask("a9", WRITE), None, None, True),
]


@pytest.mark.parametrize(
    ("case", "held", "proposal", "effect", "held_effect", "expected"),
    ANSWERS_TABLE,
    ids=[row[0] for row in ANSWERS_TABLE],
)
def test_a_call_answers_the_held_action_by_its_id_or_as_the_same_action(
    case: str,
    held: PendingWrite,
    proposal: Proposal,
    effect: str | None,
    held_effect: str | None,
    expected: bool,
) -> None:
    """Its own id, or the same action: a write by its effect digest, a non-write by what it asks."""
    got = answers_held(held, proposal, effect=effect, held_effect=held_effect)
    assert got is expected


RUNNING = pending_state(HELD_WRITE, at=NOW).evolve(phase=Phase.RUNNING, pending=None)
PLAN = RewindPlan(
    to_generation=1,
    from_generation=2,
    target=PRE,
    context_digest="sha256:" + "0" * 64,
    plan_cursor=0,
    scope=RewindScope.ALIGNED,
    reason="redo",
    by="agent",
    admission="sha256:" + "2" * 64,
    boundary=0,
    prefix_length=1,
    suffix_head="sha256:" + "1" * 64,
    suffix_length=1,
)
STATES = {
    "at rest": RUNNING,
    "holding a write": pending_state(HELD_WRITE, at=NOW),
    "rewinding": RUNNING.evolve(rewinding=PLAN),
    "frozen": RUNNING.evolve(phase=Phase.NEEDS_REVIEW),
    "completed": RUNNING.evolve(phase=Phase.COMPLETED),
    "cancelled": RUNNING.evolve(phase=Phase.CANCELLED),
    "failed": RUNNING.evolve(phase=Phase.FAILED),
}

AFTER_TABLE = [
    # (state after settling, settled, asked) -> what the call does
    *[(name, False, asked, AfterSettle.PROCEED) for name in STATES for asked in (False, True)],
    ("holding a write", True, False, AfterSettle.WAIT),
    ("holding a write", True, True, AfterSettle.WAIT),  # still held: its answer is not in yet
    ("rewinding", True, False, AfterSettle.WAIT),
    ("at rest", True, True, AfterSettle.ANSWER),
    ("completed", True, True, AfterSettle.ANSWER),  # a held finish, approved, ended the run
    ("failed", True, True, AfterSettle.ANSWER),  # the held action spent the last proposal
    ("frozen", True, True, AfterSettle.ANSWER),
    ("at rest", True, False, AfterSettle.PROCEED),  # another's held action settled: go on
    ("frozen", True, False, AfterSettle.STOPPED),
    ("completed", True, False, AfterSettle.STOPPED),
    ("cancelled", True, False, AfterSettle.STOPPED),
    ("failed", True, False, AfterSettle.STOPPED),
]


@pytest.mark.parametrize(("name", "settled", "asked", "expected"), AFTER_TABLE)
def test_what_a_call_does_once_the_step_settled_what_came_first(
    name: str, settled: bool, asked: bool, expected: AfterSettle
) -> None:
    """Nothing settled or the run free: proceed; still held: wait; its own action: answer."""
    assert after_settle(STATES[name], settled=settled, asked=asked) is expected
