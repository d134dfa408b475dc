"""The terms an unsettled write is settled under: the weaker of when it was sent and now.

A write that was dispatched and has no receipt may have landed. Whether it
may be sent again under its key, or whether a look-up that finds nothing
proves it never landed, depends on what the callee promised when the write
was SENT, not only on what the code declares now: a write sent without a
key (declared neither idempotent nor queryable) is not deduplicated by a
key the upgraded code would send now. So it is settled under both:

===================  ===================  ===============================
sent under (ledger)  declared now         settled under
===================  ===================  ===============================
idempotent           idempotent           idempotent (resend by key)
either not           either not           not idempotent
queryable            queryable            queryable (look up by key)
either not           either not           not queryable
absence final        absence final        absence final
either not           either not           absence not final
not recorded         anything             what is declared now
===================  ===================  ===============================

The ledger records one retry promise per entry (``RetrySemantics``, the
strongest of idempotent, queryable, neither) and, on entries written since
they were added, whether the adapter could be looked up and whether its
"nothing" was final. On older entries ``idempotent`` hides whether the
adapter was also queryable, and absence-finality is not recorded: those
are "not recorded", and what is declared now decides them (the behaviour
before the terms were bound).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tether.core._model import Capabilities
from tether.core._phases import RetrySemantics


@dataclass(frozen=True, slots=True)
class SentTerms:
    """What the callee promised when a write was sent (``None``: not recorded)."""

    idempotent: bool | None
    queryable: bool | None
    absent_is_final: bool | None = None


def sent_terms(
    retry: RetrySemantics,
    *,
    queryable: bool | None = None,
    absent_is_final: bool | None = None,
) -> SentTerms:
    """What one ledger entry says of its send: its retry promise, and where the entry
    recorded them, whether it could be looked up and whether absence was final."""
    if retry is RetrySemantics.IDEMPOTENT:
        # Queryable too, maybe: the entry says so where it records it.
        return SentTerms(True, queryable, absent_is_final)
    if retry is RetrySemantics.QUERYABLE:
        return SentTerms(False, True, absent_is_final)
    return SentTerms(False, False, absent_is_final)


def _both(a: bool | None, b: bool | None) -> bool | None:
    if a is None:
        return b
    if b is None:
        return a
    return a and b


def weaker(a: SentTerms, b: SentTerms) -> SentTerms:
    """The terms two sends of one write both promise (each of them may be the one that landed)."""
    return SentTerms(
        _both(a.idempotent, b.idempotent),
        _both(a.queryable, b.queryable),
        _both(a.absent_is_final, b.absent_is_final),
    )


def settling_capabilities(current: Capabilities, sent: SentTerms | None) -> Capabilities:
    """``current`` with no promise the write's sends were not made under.

    ``sent`` ``None``: the ledger recorded no terms for the sends (rows
    written before it did), so what is declared now decides, as before.
    """
    if sent is None:
        return current
    idempotent = current.idempotent and sent.idempotent is not False
    queryable = current.queryable and sent.queryable is not False
    final = current.absent_is_final and sent.absent_is_final is not False
    if (idempotent, queryable, final) == (
        current.idempotent,
        current.queryable,
        current.absent_is_final,
    ):
        return current
    return replace(current, idempotent=idempotent, queryable=queryable, absent_is_final=final)
