"""A dispatched write is settled under the weaker of the terms it was sent under and today's.

Every combination of what the ledger recorded at the send (idempotent,
queryable, absence final: each yes, no or not recorded) and what the
adapter declares now, through the settle rules: resend by key, ask (and
then resend or review on an absent look-up), or review. The expected cell
is restated here from the table in ``tether.core._terms``.
"""

from __future__ import annotations

import itertools
import json
from datetime import timedelta

import pytest

from tests.unit.test_settle import INTENT, KEY, NOW, POST, state_with
from tether.core import Capabilities, EffectStatus, OutcomeKind
from tether.core import _replay as replay_rules
from tether.core import _settle as settle_rules
from tether.core._ledger import EffectTerms, LedgerEntry
from tether.core._phases import Compensation, RetrySemantics
from tether.core._terms import SentTerms, sent_terms, settling_capabilities, weaker
from tether.core._transition import Execute, Facts, Lookup, LookupAnswer, LookupStatus

# (recorded at the send, declared now) -> settled under: the one table, restated.
BOTH = {
    (True, True): True,
    (True, False): False,
    (False, True): False,
    (False, False): False,
    (None, True): True,  # not recorded: today's declaration decides
    (None, False): False,
}
RECORDED = [True, False, None]
CURRENT = [True, False]


def facts(now: Capabilities, sent: SentTerms | None) -> Facts:
    return Facts(
        now=NOW,
        live=POST,
        needs_approval=False,
        case_id="case-1",
        capabilities=now,
        namespace="ns",
        sent_under=sent,
    )


def decision(now: Capabilities, sent: SentTerms | None) -> str:
    """What the settle rules do with a dispatched write, and with an absent look-up if they ask."""
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    first = settle_rules.settle(state, facts(now, sent))
    if isinstance(first.call, Lookup):
        answer = LookupAnswer(LookupStatus.ABSENT)
        then = settle_rules.after_lookup(state, facts(now, sent), answer)
        return "ask, then " + _label(then.outcome, then.call)
    return _label(first.outcome, first.call)


def _label(outcome: OutcomeKind, call: object) -> str:
    if isinstance(call, Execute) and call.retry:
        return "resend"
    if outcome is OutcomeKind.FROZEN:
        return "review"
    raise AssertionError(f"unexpected step {outcome} {call!r}")


def expected(idem: bool, query: bool, final: bool) -> str:
    """The settle table for the terms a write is settled under."""
    if query:
        return "ask, then " + ("resend" if final or idem else "review")
    return "resend" if idem else "review"


@pytest.mark.parametrize(
    ("r_idem", "r_query", "r_final", "c_idem", "c_query", "c_final"),
    list(itertools.product(RECORDED, RECORDED, RECORDED, CURRENT, CURRENT, CURRENT)),
)
def test_every_combination_of_recorded_and_declared_terms_settles_under_both(
    r_idem: bool | None,
    r_query: bool | None,
    r_final: bool | None,
    c_idem: bool,
    c_query: bool,
    c_final: bool,
) -> None:
    """A resend or a final absence only where the send's terms and today's both allow it."""
    now = Capabilities(
        idempotent=c_idem, queryable=c_query, conditional_writes=False, absent_is_final=c_final
    )
    sent = SentTerms(r_idem, r_query, r_final)
    want = expected(BOTH[r_idem, c_idem], BOTH[r_query, c_query], BOTH[r_final, c_final])
    assert decision(now, sent) == want


@pytest.mark.parametrize(
    ("c_idem", "c_query", "c_final"), list(itertools.product(CURRENT, repeat=3))
)
def test_a_write_whose_sends_recorded_no_terms_is_settled_as_declared_now(
    c_idem: bool, c_query: bool, c_final: bool
) -> None:
    """Ledger rows from before terms were recorded: today's declaration alone decides, as before."""
    now = Capabilities(
        idempotent=c_idem, queryable=c_query, conditional_writes=False, absent_is_final=c_final
    )
    assert settling_capabilities(now, None) is now
    assert decision(now, None) == expected(c_idem, c_query, c_final)


def test_the_ledgers_retry_promise_reads_as_what_it_proves() -> None:
    """Idempotent hides queryable; queryable says not idempotent; neither says neither."""
    assert sent_terms(RetrySemantics.IDEMPOTENT) == SentTerms(True, None, None)
    assert sent_terms(RetrySemantics.QUERYABLE) == SentTerms(False, True, None)
    assert sent_terms(RetrySemantics.NEITHER) == SentTerms(False, False, None)
    assert weaker(SentTerms(True, None, None), SentTerms(False, True, None)) == SentTerms(
        False, True, None
    )


def _entry(seq: int, status: EffectStatus, retry: RetrySemantics) -> LedgerEntry:
    terms = EffectTerms("ns", INTENT.kind, INTENT.target, retry, Compensation.NONE, effect="fx")
    return LedgerEntry(
        "r", KEY, seq, status, "a1", INTENT.digest, None, 1, NOW + timedelta(seconds=seq),
        terms=terms,
    )  # fmt: skip


def test_the_ledger_keeps_the_weakest_terms_of_every_send_of_a_key() -> None:
    """Sent blind, then resent as idempotent: the unsettled attempt is known by the blind send."""
    record = replay_rules.known_effects(
        [
            _entry(1, EffectStatus.INTENDED, RetrySemantics.NEITHER),
            _entry(2, EffectStatus.DISPATCHED, RetrySemantics.NEITHER),
            _entry(3, EffectStatus.DISPATCHED, RetrySemantics.IDEMPOTENT),
            _entry(4, EffectStatus.OUTCOME_UNKNOWN, RetrySemantics.IDEMPOTENT),
        ]
    )["fx"]
    assert record.unsettled is not None
    assert record.unsettled.sent_under == SentTerms(False, False, None)


def test_the_repro_a_keyless_send_is_not_resent_by_code_that_now_declares_idempotent() -> None:
    """Sent under ``neither``, declared idempotent now: a person decides, nothing is sent."""
    now = Capabilities(idempotent=True, queryable=False, conditional_writes=False)
    assert decision(now, None) == "resend"  # what happened before the terms were bound
    assert decision(now, sent_terms(RetrySemantics.NEITHER)) == "review"


def test_a_recorded_lookup_says_what_the_retry_promise_hides() -> None:
    """An entry that records its look-up terms fills in what its retry promise alone leaves open."""
    assert sent_terms(
        RetrySemantics.IDEMPOTENT, queryable=True, absent_is_final=False
    ) == SentTerms(True, True, False)
    assert sent_terms(RetrySemantics.QUERYABLE, absent_is_final=True) == SentTerms(
        False, True, True
    )
    assert sent_terms(RetrySemantics.NEITHER, queryable=False, absent_is_final=False) == (
        SentTerms(False, False, False)
    )


def test_code_that_now_says_absence_is_final_does_not_settle_a_send_made_when_it_was_not() -> None:
    """Sent with a look-up whose "nothing" was not final, declared final now: absence proves nothing, nothing is resent."""
    terms = EffectTerms(
        "ns",
        INTENT.kind,
        INTENT.target,
        RetrySemantics.QUERYABLE,
        Compensation.NONE,
        effect="fx",
        queryable=True,
        absent_is_final=False,
    )
    entries = [
        LedgerEntry(
            "r",
            KEY,
            seq,
            status,
            "a1",
            INTENT.digest,
            None,
            1,
            NOW + timedelta(seconds=seq),
            terms=terms,
        )
        for seq, status in ((1, EffectStatus.INTENDED), (2, EffectStatus.DISPATCHED))
    ]
    record = replay_rules.known_effects(entries)["fx"]
    assert record.unsettled is not None
    sent = record.unsettled.sent_under
    assert sent == SentTerms(False, True, False)
    now = Capabilities(
        idempotent=False, queryable=True, conditional_writes=False, absent_is_final=True
    )
    assert settling_capabilities(now, sent).absent_is_final is False
    assert json.loads(json.dumps(terms.to_json()))["absent_is_final"] is False  # recorded
