"""Which settle steps read the environment: the rule says so (``ReadEnvironment``), never the session.

Every settle rule is run, on every cell of capabilities x signed status x
approval x policy verdict x adapter answer, first with no environment and
then with each environment a cell can meet. A rule asks for the environment
exactly where it decides the step (a freeze records it in its case; the
approval gate judges against it), and then commits nothing; anywhere else
its answer is the same whatever the world holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from tests.unit.test_settle import (
    EXECUTES,
    INTENT,
    KEY,
    LOOKUPS,
    NOW,
    OTHER,
    POST,
    PRE,
    state_with,
)
from tether.core import Capabilities, EffectStatus, OutcomeKind, Phase, RunState
from tether.core import _settle as settle_rules
from tether.core._actions import Rejection
from tether.core._transition import Execute, Facts, ReadEnvironment, Transition

LIVES = (PRE, POST, OTHER)
CAPS = [
    Capabilities(idempotent=i, queryable=q, conditional_writes=True, absent_is_final=f)
    for i, q, f in itertools.product([False, True], repeat=3)
]
FORBIDDEN = {"allowed": None, "forbidden": Rejection("risk", "the policy in force forbids it")}
LOOKUP_ANSWERS = list(LOOKUPS.values())
EXECUTE_ANSWERS = list(EXECUTES.values())


Rule = Callable[[RunState, Facts], Transition]

RULES: list[tuple[str, Rule]] = [
    ("settle", settle_rules.settle),
    ("dispatch", settle_rules.dispatch),
    ("send_again", settle_rules.send_again),
    *[
        (f"after_lookup:{a.status}", lambda s, f, a=a: settle_rules.after_lookup(s, f, a))
        for a in LOOKUP_ANSWERS
    ],
    *[
        (
            f"after_execute:{a.status}:{'retry' if retry else 'first'}",
            lambda s, f, a=a, r=retry: settle_rules.after_execute(
                s, f, Execute(KEY, INTENT, PRE, retry=r), a
            ),
        )
        for a in EXECUTE_ANSWERS
        for retry in (False, True)
    ],
    ("cancel_pending:unaskable", lambda s, f: settle_rules.cancel_pending(s, f, None)),
    *[
        (f"cancel_pending:{a.status}", lambda s, f, a=a: settle_rules.cancel_pending(s, f, a))
        for a in LOOKUP_ANSWERS
    ],
]


@pytest.mark.parametrize("caps", CAPS, ids=repr)
@pytest.mark.parametrize("status", [EffectStatus.INTENDED, EffectStatus.DISPATCHED])
@pytest.mark.parametrize("approval", ["not_needed", "valid", "missing", "expired"])
@pytest.mark.parametrize("verdict", sorted(FORBIDDEN))
def test_a_rule_reads_the_environment_exactly_where_it_decides_the_step(
    caps: Capabilities, status: EffectStatus, approval: str, verdict: str
) -> None:
    """Asked only for a freeze or the approval gate, committing nothing; else blind to the world."""
    state = state_with(status, approval)
    blind = Facts(
        now=NOW,
        live=None,
        needs_approval=approval != "not_needed",
        case_id="case-1",
        capabilities=caps,
        namespace="ns",
        forbidden=FORBIDDEN[verdict],
    )
    for name, rule in RULES:
        asked = rule(state, blind)
        seen = {live: rule(state, replace(blind, live=live)) for live in LIVES}
        for live, decided in seen.items():
            assert not isinstance(decided.call, ReadEnvironment), name  # given, never asked again
            if decided.outcome is OutcomeKind.FROZEN and decided.state is not None:
                # The case records the world as it was read for it.
                assert decided.state.review_cases[-1].environment == live, name
        if isinstance(asked.call, ReadEnvironment):
            assert (asked.state, asked.events, asked.ledger) == (None, (), ()), name
            frozen = all(d.outcome is OutcomeKind.FROZEN for d in seen.values())
            assert frozen or blind.needs_approval, name
        else:
            assert all(d == asked for d in seen.values()), name
            assert asked.state is None or asked.state.phase is not Phase.NEEDS_REVIEW, name
