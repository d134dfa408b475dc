"""The retention rule: a key's age is measured on the store's clock as well as the runtime's."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from tests.unit.test_settle import NOW, PRE, facts, state_with
from tether.core import Capabilities, EffectStatus, OutcomeKind, Phase
from tether.core import _retention as retention_rules
from tether.core import _settle as settle_rules
from tether.core._transition import LookupAnswer, LookupStatus

MARGIN = retention_rules.UNMEASURED_SKEW_S

# (runtime's age of the key, store's age of it or None, retention) -> remembered
CASES: list[tuple[str, float, float | None, float | None, bool]] = [
    ("no retention declared: kept for ever", 10**9, None, None, True),
    ("clocks agree, within retention", 2.0, 2.0, 5.0, True),
    ("clocks agree, at the limit", 5.0, 5.0, 5.0, True),
    ("clocks agree, past retention", 6.0, 6.0, 5.0, False),
    ("runtime 30 s behind the store: the store's age wins", -10.0, 20.0, 5.0, False),
    ("runtime ahead of the store: its own larger age wins", 20.0, 2.0, 5.0, False),
    ("a store stamp edited to look young cannot beat the runtime", 9.0, 0.0, 5.0, False),
    ("the store cannot say: the runtime's age plus the margin", 2.0, None, 5.0, False),
    ("the store cannot say, a long retention absorbs the margin", 2.0, None, 3600.0, True),
    ("the store cannot say, right at the margin", 0.0, None, MARGIN, True),
]


@pytest.mark.parametrize(
    ("runtime_age", "store_age", "retention", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_retention_table(
    runtime_age: float, store_age: float | None, retention: float | None, expected: bool
) -> None:
    """A key counts as remembered only while every clock that measured it says so."""
    since = NOW - timedelta(seconds=runtime_age)
    assert retention_rules.remembered(retention, NOW, since, store_age) is expected


FORGETS = Capabilities(
    idempotent=False,
    queryable=True,
    conditional_writes=False,
    absent_is_final=True,
    retention_s=5.0,
)


@pytest.mark.parametrize(
    ("runtime_age", "store_age", "sent"),
    [
        (2.0, 2.0, True),  # honest clocks, within retention: absence is final, sent again
        (-10.0, 20.0, False),  # the recovering worker's clock 30 s behind: review
        (2.0, None, False),  # no store time: the margin puts it past 5 s: review
    ],
)
def test_settling_an_absent_key_reads_the_store_age(
    runtime_age: float, store_age: float | None, sent: bool
) -> None:
    """An absence is final for the settle rule only while the store's clock agrees the key is young."""
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    # The pending write was minted at NOW; the runtime reads its clock runtime_age later.
    now = NOW + timedelta(seconds=runtime_age)
    told = replace(facts(FORGETS, "not_needed", PRE), now=now, key_age_s=store_age)
    t = settle_rules.after_lookup(state, told, LookupAnswer(LookupStatus.ABSENT))
    if sent:
        assert t.outcome is OutcomeKind.EXECUTED and t.call is not None
    else:
        assert t.call is None and t.state is not None
        assert t.state.phase is Phase.NEEDS_REVIEW and t.reason == "outcome_unknown"
        assert "past the 5 s" in (t.state.review_cases[-1].detail)
