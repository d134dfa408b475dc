"""A signed not_landed stands only where the adapter, asked by key, does not contradict it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.unit.test_case_table import ENV, INTENT, frozen
from tether.core import DecisionRefusedError, Receipt
from tether.core import _case_rules as case_rules
from tether.core._case_table import CaseKind, key_doubt, not_landed_warning
from tether.core._transition import LookupAnswer, LookupStatus

C = case_rules.NotLandedCheck
ST = LookupStatus


def receipt(key: str, intent_digest: str) -> Receipt:
    return Receipt(
        namespace="smtp",
        adapter_version="1",
        receipt_id="rcpt-7",
        idempotency_key=key,
        intent_digest=intent_digest,
        result={"ok": True},
        business_object_id="msg-7",
        committed_at=None,
        post_state=ENV,
    )


FOUND = LookupAnswer(ST.COMMITTED, receipt("k", INTENT.digest))
FOREIGN = LookupAnswer(ST.COMMITTED, receipt("k", "sha256:" + "f" * 64))

ABSENT = LookupAnswer(ST.ABSENT)

# (the adapter's answer, absence final, key within retention, taken over since the send,
# the decision says what was searched) -> what not_landed becomes
CASES: list[tuple[str, LookupAnswer | None, bool, bool, bool, bool, case_rules.NotLandedCheck]] = [
    ("cannot be asked by key", None, False, True, False, False, C.UNPROVEN),
    ("it landed", FOUND, True, True, False, False, C.LANDED),
    ("another intent holds the key", FOREIGN, True, True, False, False, C.LANDED),
    (
        "still in flight",
        LookupAnswer(ST.IN_PROGRESS, detail="409"),
        True,
        True,
        False,
        False,
        C.IN_FLIGHT,
    ),
    (
        "in flight, absence never final",
        LookupAnswer(ST.IN_PROGRESS),
        False,
        False,
        False,
        False,
        C.IN_FLIGHT,
    ),
    ("unreachable", LookupAnswer(ST.UNAVAILABLE), True, True, False, False, C.UNREACHABLE),
    (
        "unreachable, with evidence",
        LookupAnswer(ST.UNAVAILABLE),
        True,
        True,
        False,
        True,
        C.UNREACHABLE,
    ),
    ("recorded as refused", LookupAnswer(ST.REFUSED), False, True, False, False, C.STANDS),
    ("absent, final, within retention", ABSENT, True, True, False, False, C.STANDS),
    ("absent, final, past retention", ABSENT, True, False, False, False, C.UNSEARCHED),
    ("absent, past retention, searched", ABSENT, True, False, False, True, C.UNPROVEN),
    ("absent, not final", ABSENT, False, True, False, False, C.UNSEARCHED),
    ("absent, not final, searched", ABSENT, False, True, False, True, C.UNPROVEN),
    ("absent after a takeover", ABSENT, True, True, True, False, C.UNSEARCHED),
    ("absent after a takeover, searched", ABSENT, True, True, True, True, C.UNPROVEN),
    ("inconclusive", LookupAnswer(ST.INCONCLUSIVE), True, True, False, False, C.UNSEARCHED),
    ("inconclusive, searched", LookupAnswer(ST.INCONCLUSIVE), True, True, False, True, C.UNPROVEN),
    (
        "refused by the adapter after a takeover",
        LookupAnswer(ST.REFUSED),
        True,
        True,
        True,
        False,
        C.STANDS,
    ),
]


@pytest.mark.parametrize(
    ("answer", "final", "kept", "taken_over", "searched", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_not_landed_table(
    answer: LookupAnswer | None,
    final: bool,
    kept: bool,
    taken_over: bool,
    searched: bool,
    expected: case_rules.NotLandedCheck,
) -> None:
    """Every answer the adapter can give, and what it makes of a signed not_landed."""
    got = case_rules.check_not_landed(
        answer, absent_is_final=final, remembered=kept, taken_over=taken_over, evidence=searched
    )
    assert got is expected


@pytest.mark.parametrize(
    ("final", "kept", "taken_over", "says"),
    [
        (True, True, False, ""),
        (True, False, False, "forgotten"),
        (False, True, False, "does not declare"),
        (True, True, True, "lost its lease"),
    ],
)
def test_why_an_absence_proves_nothing(
    final: bool, kept: bool, taken_over: bool, says: str
) -> None:
    """The doubt names the reason an absence is not final, and is empty where it is."""
    doubt = case_rules.absence_doubt(absent_is_final=final, remembered=kept, taken_over=taken_over)
    assert (doubt == "") is (says == "")
    assert says in doubt


@pytest.mark.parametrize("kind", [CaseKind.UNKNOWN_OUTCOME, CaseKind.UNKNOWN_ON_CANCEL])
@pytest.mark.parametrize("check", list(C))
def test_only_a_contradiction_or_a_missing_search_refuses(
    kind: CaseKind, check: case_rules.NotLandedCheck
) -> None:
    """A refusal is typed, names what the adapter found, and says what to do next."""
    state = frozen(kind)
    case = state.review_cases[-1]
    answer = {
        C.LANDED: FOUND,
        C.IN_FLIGHT: LookupAnswer(ST.IN_PROGRESS, detail="409 in flight"),
        C.UNREACHABLE: LookupAnswer(ST.UNAVAILABLE, detail="connection refused"),
        C.UNSEARCHED: ABSENT,
    }.get(check)
    refused = case_rules.refuse_not_landed(case, state, check, answer, doubt="it was forgotten")
    if check not in {C.LANDED, C.IN_FLIGHT, C.UNREACHABLE, C.UNSEARCHED}:
        assert refused is None
        return
    assert isinstance(refused, DecisionRefusedError)
    assert refused.decision == "not_landed" and refused.case_id == case.case_id
    assert refused.found == check.value
    if check is C.LANDED:
        assert (
            "rcpt-7" in str(refused) and "msg-7" in str(refused) and "sign landed" in str(refused)
        )
        assert "not_landed" not in refused.fits and "landed" in refused.fits
    elif check is C.IN_FLIGHT:
        assert "still in flight (409 in flight)" in str(refused) and "decide again" in str(refused)
        assert "not_landed" in refused.fits
    elif check is C.UNREACHABLE:
        assert "could not be asked" in str(refused) and "connection refused" in str(refused)
        assert "sign abort or landed now" in str(refused)
    else:
        assert "proves nothing now (it was forgotten)" in str(refused)
        assert "not for the key" in str(refused) and "evidence" in str(refused)


@pytest.mark.parametrize(
    ("kind", "protected", "warned"),
    [
        (CaseKind.UNKNOWN_OUTCOME, False, True),
        (CaseKind.UNKNOWN_OUTCOME, None, True),
        (CaseKind.UNKNOWN_OUTCOME, True, False),
        (CaseKind.UNKNOWN_ON_CANCEL, False, True),
        (CaseKind.COMMITTED_FROZEN, False, False),  # takes no not_landed
        (CaseKind.UNKNOWN_EARLIER, None, False),
    ],
)
def test_a_not_landed_tether_cannot_check_is_warned_of(
    kind: CaseKind, protected: bool | None, warned: bool
) -> None:
    """The warning shows where not_landed is offered and the adapter cannot be asked by key."""
    text = not_landed_warning(kind, protected)
    assert bool(text) is warned
    if warned:
        assert "still in flight" in text or "in flight" in text


NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("hints", "now", "says"),
    [
        ({}, NOW, ""),
        ({"key look-up": "absence not final"}, NOW, "absence not final"),
        ({"key kept until": "2026-12-06T12:00:00.000000Z"}, NOW, ""),
        ({"key kept until": "2026-12-05T12:00:30.000000Z"}, NOW, "forgotten"),  # within skew
        ({"key kept until": "2026-12-05T11:00:00.000000Z"}, NOW, "forgotten"),
        ({"key kept until": "2026-12-06T12:00:00.000000Z"}, None, "forgotten"),  # no clock
        ({"key kept until": "not a time"}, NOW, "forgotten"),
    ],
)
def test_the_card_doubts_a_key_look_up_once_the_key_may_be_forgotten(
    hints: dict[str, str], now: datetime | None, says: str
) -> None:
    """The card's doubt: the freeze's reason always, the retention once it nears or passed."""
    doubt = key_doubt(hints, now)
    assert (doubt == "") is (says == "") and says in doubt
    warning = not_landed_warning(CaseKind.UNKNOWN_OUTCOME, True, doubt)
    assert bool(warning) is bool(doubt)
    if doubt:
        assert "not for the key" in warning and "--evidence" in warning
    assert not_landed_warning(CaseKind.COMMITTED_FROZEN, True, "x") == ""
