"""What the page shows: runs and one run, read back for people.

Everything here turns store records into plain values the templates print.
With a keyring the checkpoint, the trace chain and the ledger chain are
verified before anything is shown (a damaged byte is an integrity error, not
a half-drawn page); without one they are shown as stored, and the page says
so. Nothing read here carries a key: checkpoints hold none, and signed
documents carry only public signatures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tether.core import (
    CanonicalJSONError,
    CheckpointCorruptError,
    IntegrityError,
    LedgerEntry,
    MissingHighWaterMarkError,
    Phase,
    RunState,
    TraceEvent,
    format_time,
    strict_loads,
    validate_state,
)
from tether.crypto import Keyring
from tether.runtime import Checkpointer
from tether.store import Evidence, Mark, SQLBase


@dataclass(frozen=True, slots=True)
class RunRow:
    """One line of the runs page."""

    run_id: str
    phase: str
    generation: int
    epoch: int | None
    waiting_for: str
    since: str
    needs_person: bool
    attempts: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class InboxItem:
    """A signed document left for the run, and what became of it."""

    seq: int
    kind: str
    signer: str
    received_at: str
    status: str  # applied | waiting | refused
    why: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunPage:
    """Everything the run page shows; see :func:`read_run`."""

    state: RunState
    mark: Mark
    verified: bool
    waiting_for: str
    trace: list[TraceEvent]
    ledger: list[dict[str, Any]]
    inbox: list[InboxItem]
    cases: list[dict[str, Any]] = field(default_factory=list)


def asks_approval(store: SQLBase, state: RunState, mark: Mark, now: datetime) -> bool:
    """Whether the pending write waits for a person's approval: asked for, none alive now."""
    pending = state.pending
    if state.phase is not Phase.PENDING or pending is None:
        return False
    alive = format_time(now)
    if any(str(d.get("body", {}).get("expires_at", "")) > alive for d in pending.approvals):
        return False  # approved: a worker carries it out
    if mark.waiting_after is not None:
        return True
    recent = store.trace(state.run_id, state.trace_head, 8)
    return any(event.kind == "approval_requested" for event in recent)


def waiting_for(state: RunState, mark: Mark | None, asking: bool = False) -> str:
    """What the run waits for, in words ('' when it waits for nobody)."""
    if state.phase is Phase.NEEDS_REVIEW:
        reasons = ", ".join(sorted({c.reason for c in state.review_cases})) or "a decision"
        return f"a reviewer's decision ({reasons})"
    if state.phase is Phase.PENDING and state.pending is not None:
        if asking:
            return f"an approval of {state.pending.action_id}"
        return f"the write {state.pending.action_id} to settle"
    if mark is not None and mark.attempts:
        return f"a worker (failed {mark.attempts} time(s))"
    return ""


def load(store: SQLBase, run_id: str, keyring: Keyring | None) -> tuple[RunState, Mark, bool]:
    """The run's newest checkpoint and mark; verified under ``keyring`` when given."""
    if keyring is not None:
        restored = Checkpointer(store, keyring).load(run_id)
        return restored.state, restored.mark, True
    mark = store.get_mark(run_id)
    if mark is None:
        raise MissingHighWaterMarkError(run_id)
    envelope = store.get_checkpoint(run_id, mark.checkpoint_digest)
    if envelope is None:
        raise CheckpointCorruptError(
            f"run {run_id}: the store lacks the checkpoint its mark names", run_id=run_id
        )
    try:
        document = strict_loads(envelope)
    except CanonicalJSONError as exc:
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint is not a well-formed envelope: {exc}", run_id=run_id
        ) from exc
    payload = document.get("payload") if isinstance(document, dict) else None
    if not isinstance(payload, dict):
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint envelope carries no payload", run_id=run_id
        )
    state = RunState.from_json(payload)
    # Shown unverified, but at least self-consistent: the displayed intent is
    # the one its digest (which a signature binds) names.
    validate_state(state)
    return state, mark, False


def list_rows(store: SQLBase, keyring: Keyring | None, phase: str | None = None) -> list[RunRow]:
    """Every run the store knows, those waiting for a person first, then newest first."""
    rows: list[RunRow] = []
    for listed in store.runs():
        if phase and listed.phase != phase:
            continue
        try:
            state, mark, _ = load(store, listed.run_id, keyring)
        except IntegrityError as exc:
            # One damaged run is shown as such (and nothing of it); the others still list.
            rows.append(
                RunRow(
                    listed.run_id,
                    listed.phase,
                    listed.generation,
                    None,
                    f"a person: integrity: {type(exc).__name__}",
                    "",
                    True,
                    listed.attempts,
                    listed.last_error,
                )
            )
            continue
        asking = asks_approval(store, state, mark, datetime.now(UTC))
        rows.append(
            RunRow(
                run_id=state.run_id,
                phase=state.phase.value,
                generation=state.generation,
                epoch=state.epoch,
                waiting_for=waiting_for(state, mark, asking),
                since=format_time(state.updated_at),
                needs_person=asking or state.phase is Phase.NEEDS_REVIEW,
                attempts=mark.attempts,
                last_error=mark.last_error,
            )
        )
    rows.sort(key=lambda r: r.since, reverse=True)
    rows.sort(key=lambda r: not r.needs_person)  # stable: needs-a-person first, each newest first
    return rows


def read_run(store: SQLBase, run_id: str, keyring: Keyring | None) -> RunPage:
    """One run: state, trace, ledger, inbox and open cases (chains verified under ``keyring``)."""
    state, mark, verified = load(store, run_id, keyring)
    if keyring is not None:
        checkpointer = Checkpointer(store, keyring)
        trace = checkpointer.verified_trace(state)
        entries = checkpointer.verified_ledger(state)
    else:
        trace = store.trace(run_id, state.trace_head, state.trace_length + 1)
        entries = store.ledger(run_id)
    return RunPage(
        state=state,
        mark=mark,
        verified=verified,
        waiting_for=waiting_for(state, mark, asks_approval(store, state, mark, datetime.now(UTC))),
        trace=trace,
        ledger=effects(entries),
        inbox=inbox(store.evidence(run_id), state, trace),
        cases=cases(state),
    )


def effects(entries: list[LedgerEntry]) -> list[dict[str, Any]]:
    """The ledger grouped by effect: its terms, its current state and the path it took."""
    by_key: dict[str, dict[str, Any]] = {}
    for entry in entries:
        item = by_key.setdefault(
            entry.idempotency_key,
            {"key": entry.idempotency_key, "action_id": entry.action_id, "history": []},
        )
        if entry.terms is not None and "kind" not in item:
            item.update(
                kind=entry.terms.kind,
                target=entry.terms.target,
                adapter=entry.terms.adapter,
                retry=entry.terms.retry.value,
                compensation=entry.terms.compensation.value,
            )
        receipt = entry.receipt or {}
        item["status"] = entry.status.value
        item["epoch"] = entry.epoch
        if receipt.get("receipt_id"):
            item["receipt_id"] = receipt.get("receipt_id")
        item["history"].append(entry.status.value)
    return list(by_key.values())


def inbox(items: list[Evidence], state: RunState, trace: list[TraceEvent]) -> list[InboxItem]:
    """Each inbox document with its fate: refused (and why), applied, or waiting to be read."""
    refused: dict[int, str] = {}
    for event in trace:
        if event.kind == "evidence_refused" and isinstance(event.data.get("seq"), int):
            why = f"{event.data.get('error', '')}: {event.data.get('message', '')}"
            refused[event.data["seq"]] = why
    out: list[InboxItem] = []
    for item in items:
        if item.seq in refused:
            status, why = "refused", refused[item.seq]
        elif item.seq <= state.inbox_cursor:
            status, why = "applied", ""
        else:
            status, why = "waiting", "not read yet: the run reads its inbox at its next step"
        body = item.document.get("body")
        out.append(
            InboxItem(
                seq=item.seq,
                kind=item.kind,
                signer=str(item.document.get("signer", "?")),
                received_at=format_time(item.received_at),
                status=status,
                why=why,
                body=body if isinstance(body, dict) else {},
            )
        )
    return out


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
                "opened_at": format_time(case.opened_at),
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


def when(moment: datetime | None) -> str:
    return "" if moment is None else format_time(moment)
