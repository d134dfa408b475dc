"""What the page shows of a run, shaped for templates.

The reading itself is the operator layer's (``tether.runtime.open_run`` and
``list_runs``, the same the CLI uses): verified under the keyring when one is
given, fail closed on a damaged byte. Here the run view is only arranged for
people: the ledger grouped by effect, each open review case as its two sides,
and the expiry of documents still waiting in the inbox.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tether.core import LedgerEntry, RunState, StoreError, format_time
from tether.runtime import Page, RunView, case_effect
from tether.store import Evidence

#: How many trace events and ledger entries one run page shows.
PAGE_ROWS = 50


@dataclass(frozen=True, slots=True)
class Signed:
    """A document a person signed for the pending write or an open case, and what became of it.

    ``status`` is the inbox's (``waiting``, ``applied``, ``refused``);
    ``expired``: still waiting, and past its expiry (the run will refuse it).
    """

    seq: int
    kind: str
    signer: str
    decision: str
    evidence: str
    expires_at: str
    status: str
    why: str | None = None
    expired: bool = False


@dataclass(frozen=True, slots=True)
class RunPage:
    """Everything the run page shows: the operator layer's view, arranged."""

    view: RunView
    effects: list[dict[str, Any]]
    cases: list[dict[str, Any]]
    #: Inbox seq -> the ``expires_at`` its signed body carries (for the live countdown).
    expiries: dict[int, str]
    #: The newest approval signed for the pending write and not yet applied (waiting, or
    #: refused), if any: while one waits, the page offers no second one.
    pending_signed: Signed | None = None


def page_of(query: Mapping[str, str]) -> Page:
    """The page a run page's query asks for: ``?before=SEQ``, ``?ledger_before=SEQ``, ``?all=1``.

    A value that is not a whole number is refused (:class:`~tether.core.StoreError`).
    """
    if query.get("all") in {"1", "true", "yes"}:
        return Page(limit=None)

    def seq(name: str) -> int | None:
        text = query.get(name)
        if text is None or text == "":
            return None
        if not text.isdigit():
            raise StoreError(f"?{name}= must be a whole number, not {text[:40]!r}")
        return int(text)

    return Page(PAGE_ROWS, trace_before=seq("before"), ledger_before=seq("ledger_before"))


def arrange(view: RunView, evidence: list[Evidence]) -> RunPage:
    """The page's arrangement of ``view``; ``evidence`` is the run's inbox as stored."""
    expiries: dict[int, str] = {}
    for item in evidence:
        body = item.document.get("body")
        if isinstance(body, dict) and isinstance(body.get("expires_at"), str):
            expiries[item.seq] = body["expires_at"]
    signed = _signed(view, evidence)
    pending = view.state.pending
    pending_signed = None
    if pending is not None:
        pending_signed = _newest(
            signed,
            "approval",
            lambda b: (
                b.get("action_id") == pending.action_id
                and b.get("idempotency_key") == pending.idempotency_key
            ),
        )
    return RunPage(
        view=view,
        effects=list(reversed(view.effects())),  # the newest effect first
        cases=cases(view.state, signed, view.ledger, view.read_at),
        expiries=expiries,
        pending_signed=pending_signed,
    )


def _signed(view: RunView, evidence: list[Evidence]) -> list[tuple[Signed, dict[str, Any]]]:
    """Approvals and review decisions in the inbox that are not applied: each with its body."""
    status = {item.seq: item for item in view.inbox}
    now = format_time(view.read_at)
    out: list[tuple[Signed, dict[str, Any]]] = []
    for item in evidence:
        seen = status.get(item.seq)
        body = item.document.get("body")
        if seen is None or seen.status not in {"waiting", "refused"} or not isinstance(body, dict):
            continue
        if item.kind not in {"approval", "review_decision"}:
            continue
        expires = str(body.get("expires_at", ""))
        out.append(
            (
                Signed(
                    seq=item.seq,
                    kind=item.kind,
                    signer=str(item.document.get("signer", "?")),
                    decision=str(body.get("decision", "approve")),
                    evidence=str(body.get("evidence") or ""),
                    expires_at=expires,
                    status=seen.status,
                    why=seen.why,
                    expired=seen.status == "waiting" and expires <= now,
                ),
                body,
            )
        )
    return out


def _newest(
    signed: list[tuple[Signed, dict[str, Any]]], kind: str, about: Callable[[dict[str, Any]], bool]
) -> Signed | None:
    """The newest document of ``kind`` about it: one still waiting first, else the last refused."""
    mine = [doc for doc, body in signed if doc.kind == kind and about(body)]
    waiting = [doc for doc in mine if doc.status == "waiting" and not doc.expired]
    if waiting:
        return waiting[-1]
    return mine[-1] if mine else None


def _about_case(case_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda body: body.get("case_id") == case_id


def cases(
    state: RunState,
    signed: list[tuple[Signed, dict[str, Any]]] | None = None,
    ledger: Iterable[LedgerEntry] = (),
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Open review cases: the write in question whole, where to look, the adapter's receipt,
    and the decision a person signed for it, if one waits in the inbox."""
    out: list[dict[str, Any]] = []
    for case in state.review_cases:
        effect = case_effect(state, case, ledger, now)
        receipt = case.receipt or {}
        out.append(
            {
                "case_id": case.case_id,
                "reason": case.reason,
                "detail": case.detail,
                "action_id": effect.action_id,
                "key": effect.idempotency_key,
                "opened_at": case.opened_at,
                "environment": case.environment,
                "effect": effect,
                "signed": _newest(signed or [], "review_decision", _about_case(case.case_id)),
                "ours": {
                    "intent_digest": effect.intent_digest,
                    "kind": effect.kind or None,
                    "target": effect.target or None,
                    "args": effect.arguments_text if effect.names_a_write else None,
                },
                "theirs": {
                    "intent_digest": receipt.get("intent_digest"),
                    "receipt_id": receipt.get("receipt_id"),
                    "business_object_id": receipt.get("business_object_id"),
                    "committed_at": receipt.get("committed_at"),
                    "result": None if not receipt else pretty(receipt.get("result")),
                    "fingerprint": case.receipt_fingerprint,
                },
            }
        )
    return out


def pretty(value: Any) -> str:
    """JSON for people: sorted keys, indented, whole (the page scrolls it; nothing is cut)."""
    return json.dumps(value, sort_keys=True, indent=2, default=str, ensure_ascii=False)
