"""What a person reads of a review case before deciding it: the effect in question, whole.

The operator page's case card and ``tether review``'s prompt both show
:func:`case_effect`: which write the case is about (its kind, target,
arguments, key, when it was sent), where to look for it in the world (the
adapter's hints, recorded with the freeze), the receipt the adapter holds
if any, the decisions the case takes, and a warning where a ``not_landed``
cannot be checked against the adapter (it cannot be asked by key) or where a
look-up by key may prove nothing (the key past the service's retention,
absence not final, a takeover since the send: look for the effect itself, not
the key). Nothing is cut: arguments are
shown whole (a person must never sign for content they did not see).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tether.core import (
    Compensation,
    LedgerEntry,
    RetrySemantics,
    ReviewCase,
    ReviewDecision,
    RunState,
    format_time,
)
from tether.core._case_table import (
    CaseKind,
    case_kind,
    earlier_key,
    fitting,
    key_doubt,
    needs_evidence,
    not_landed_warning,
)
from tether.core._compensation import is_compensation


@dataclass(frozen=True, slots=True)
class CaseEffect:
    """A review case as a person decides it (see the module docstring).

    ``arguments`` is ``None`` where the run does not keep them (a sensitive
    kind, or a case about the run rather than a write); ``where_to_look``
    holds the adapter's labelled hints (empty where it gave none).
    """

    case_id: str
    reason: str
    case_kind: str
    decisions: tuple[str, ...]
    #: The decisions among them that must carry what the reviewer found (``landed``).
    evidence_for: tuple[str, ...]
    detail: str
    opened_at: str
    action_id: str = ""
    kind: str = ""
    target: str = ""
    arguments: Any = None
    idempotency_key: str = ""
    intent_digest: str = ""
    status: str = ""
    sent_at: str | None = None
    where_to_look: dict[str, str] = field(default_factory=dict)
    receipt: dict[str, Any] | None = None
    #: How its kind said it could be undone (``adapter``, ``human``, ``none``), as the
    #: ledger recorded it; ``None`` where the entries read did not say.
    compensation: str | None = None
    #: What a person must know before signing ``not_landed`` ('' if nothing): tether
    #: cannot ask the write's adapter whether it is still in flight, or a look-up by key
    #: may prove nothing now (``not_landed_warning``).
    warning: str = ""

    @property
    def names_a_write(self) -> bool:
        """Whether the case is about a write (else about the run: a worker, a rewind, drift)."""
        return bool(self.idempotency_key)

    @property
    def arguments_text(self) -> str:
        """The arguments as a person reads them: JSON, indented, whole."""
        if self.arguments is None:
            return "(not kept by the run: the policy marks this kind sensitive)"
        return pretty(self.arguments)

    def lines(self) -> list[tuple[str, str]]:
        """(label, text) pairs, in the order a prompt shows them."""
        out = [("case", f"{self.case_id} ({self.reason})"), ("detail", self.detail)]
        if self.names_a_write:
            out += [
                ("action", self.action_id),
                ("write", f"{self.kind} -> {self.target}"),
                ("arguments", self.arguments_text),
                ("idempotency key", self.idempotency_key),
                ("status", self.status),
                ("sent at", self.sent_at or "(never sent)"),
            ]
        else:
            out.append(("write", "none: this case is about the run, not one write"))
        out += [(f"look: {label}", text) for label, text in self.where_to_look.items()]
        if self.warning:
            out.append(("warning", self.warning))
        out.append(("decisions it takes", ", ".join(self.decisions)))
        return out


def pretty(value: Any) -> str:
    """JSON for people: sorted keys, indented, whole (never cut)."""
    return json.dumps(value, sort_keys=True, indent=2, default=str, ensure_ascii=False)


def case_effect(
    state: RunState,
    case: ReviewCase,
    ledger: Iterable[LedgerEntry] = (),
    now: datetime | None = None,
) -> CaseEffect:
    """What ``case`` in ``state`` is about, for the person who decides it.

    ``ledger``: entries the reader holds (a page of them is enough: the
    freeze's own entry is the newest); where one says the write's kind cannot
    be undone by the runtime, ``compensate`` is not offered. ``now``: when it
    is shown, to judge whether the service may have forgotten the key
    (``None``: the card warns wherever the adapter declares a retention).
    """
    kind = case_kind(case, state)
    key = earlier_key(case) if kind is CaseKind.UNKNOWN_EARLIER else case.idempotency_key
    entries = [e for e in ledger if e.idempotency_key == key]
    undo = next((e.terms.compensation.value for e in entries if e.terms), None)
    # Every send's promise counts: one made under terms that cannot be asked is enough.
    sends = [e.terms.retry for e in entries if e.terms]
    protected = all(r is not RetrySemantics.NEITHER for r in sends) if sends else None
    pending_action = (
        state.pending.action_id
        if state.pending is not None and state.pending.idempotency_key == key
        else ""
    )
    action = pending_action or next((e.action_id for e in entries), "")
    # A compensation is never itself undone (the runtime refuses it): not offered.
    undoable = undo in {None, Compensation.ADAPTER.value} and not is_compensation(action)
    offered = [d for d in fitting(kind) if d is not ReviewDecision.COMPENSATE or undoable]
    base: dict[str, Any] = {
        "case_id": case.case_id,
        "reason": case.reason,
        "case_kind": kind.value,
        "decisions": tuple(d.value for d in offered),
        "evidence_for": tuple(d.value for d in offered if needs_evidence(kind, d)),
        "compensation": undo,
        "detail": case.detail,
        "opened_at": format_time(case.opened_at),
        "receipt": case.receipt,
        "warning": not_landed_warning(kind, protected, key_doubt(_hints(case, key), now))
        if ReviewDecision.NOT_LANDED in offered
        else "",
    }
    pending = state.pending
    if pending is not None and case.idempotency_key == pending.idempotency_key:
        sent = pending.dispatched_at
        hints = _hints(case, pending.idempotency_key)
        return CaseEffect(
            **base,
            action_id=pending.action_id,
            kind=pending.intent.kind,
            target=pending.intent.target,
            arguments=dict(pending.intent.args),
            idempotency_key=pending.idempotency_key,
            intent_digest=pending.intent_digest,
            status=pending.status.value,
            sent_at=None if sent is None else format_time(sent),
            where_to_look=hints,
        )
    if kind is CaseKind.UNKNOWN_EARLIER:
        key = earlier_key(case)
        item = next((e for e in case.evidence if e.get("earlier_idempotency_key") == key), {})
        found = item.get("effect")
        shown: dict[str, Any] = found if isinstance(found, dict) else {}
        told = shown.get("where_to_look")
        return CaseEffect(
            **base,
            action_id=str(item.get("earlier_action_id") or ""),
            kind=str(shown.get("kind") or ""),
            target=str(shown.get("target") or ""),
            arguments=shown.get("args"),
            idempotency_key=key,
            intent_digest=str(item.get("earlier_intent_digest") or ""),
            status="outcome unknown (an earlier attempt, set aside by a replan)",
            sent_at=item.get("earlier_sent_at"),
            where_to_look=_how_last({str(k): str(v) for k, v in told.items()})
            if isinstance(told, dict)
            else {},
        )
    return CaseEffect(
        **base,
        action_id=case.action_id,
        idempotency_key=case.idempotency_key,
        intent_digest=case.intent_digest,
        where_to_look=_hints(case, case.idempotency_key),
    )


def _hints(case: ReviewCase, key: str) -> dict[str, str]:
    for item in case.evidence:
        if item.get("kind") == "where_to_look" and item.get("idempotency_key") == key:
            hints = item.get("hints")
            if isinstance(hints, dict):
                return _how_last({str(k): str(v) for k, v in hints.items()})
    return {}


def _how_last(hints: dict[str, str]) -> dict[str, str]:
    """The hints as stored (their keys sorted, canonical JSON), with the advice ``how`` last."""
    return {
        **{k: v for k, v in hints.items() if k != "how"},
        **{k: v for k, v in hints.items() if k == "how"},
    }
