"""What the page shows of a run, shaped for templates.

The reading itself is the operator layer's (``tether.runtime.open_run`` and
``list_runs``, the same the CLI uses): verified under the keyring when one is
given, fail closed on a damaged byte. Here the run view is only arranged for
people: the ledger grouped by effect, each open review case as its two sides,
and the expiry of documents still waiting in the inbox.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.core import RunState, StoreError
from tether.runtime import Page, RunView
from tether.store import Evidence

#: How many trace events and ledger entries one run page shows.
PAGE_ROWS = 50


@dataclass(frozen=True, slots=True)
class RunPage:
    """Everything the run page shows: the operator layer's view, arranged."""

    view: RunView
    effects: list[dict[str, Any]]
    cases: list[dict[str, Any]]
    #: Inbox seq -> the ``expires_at`` its signed body carries (for the live countdown).
    expiries: dict[int, str]


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
    return RunPage(
        view=view,
        effects=list(reversed(view.effects())),  # the newest effect first
        cases=cases(view.state),
        expiries=expiries,
    )


def cases(state: RunState) -> list[dict[str, Any]]:
    """Open review cases with the two sides of each: the run's intent and the adapter's receipt."""
    out: list[dict[str, Any]] = []
    pending = state.pending
    for case in state.review_cases:
        ours = (
            pending
            if pending is not None and pending.idempotency_key == case.idempotency_key
            else None
        )
        receipt = case.receipt or {}
        out.append(
            {
                "case_id": case.case_id,
                "reason": case.reason,
                "detail": case.detail,
                "action_id": case.action_id,
                "key": case.idempotency_key,
                "opened_at": case.opened_at,
                "environment": case.environment,
                "ours": {
                    "intent_digest": case.intent_digest,
                    "kind": None if ours is None else ours.intent.kind,
                    "target": None if ours is None else ours.intent.target,
                    "args": None if ours is None else pretty(ours.intent.args),
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
    """JSON for people: sorted keys, indented, cut at 2,000 characters."""
    text = json.dumps(value, sort_keys=True, indent=2, default=str)
    return text if len(text) <= 2000 else text[:2000] + "\n..."
