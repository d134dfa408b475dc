"""What the people around a run see of it: one reading for the CLI and the page.

:func:`open_run` reads a run back (verified when a keyring is given: the
checkpoint, the trace chain and the ledger chain); who it waits for is
decided by ``core.listing_rules``, the same rules a list of runs uses
(:mod:`._runs`). Nothing here holds a key or changes run state; the
documents people sign are :mod:`._operator`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tether.core import (
    CanonicalJSONError,
    CheckpointCorruptError,
    LedgerEntry,
    Listing,
    Policy,
    RunNotFoundError,
    RunState,
    SpecError,
    TetherError,
    TraceEvent,
    approvable,
    digest_bytes,
    expand_payload,
    format_time,
    listing_of,
    listing_rules,
    strict_loads,
    validate_state,
)
from tether.crypto import Keyring
from tether.runtime._checkpointer import Checkpointer
from tether.runtime._clock import SystemClock
from tether.store import ContentStore, Evidence, GenerationStore, Mark


@dataclass(frozen=True, slots=True)
class InboxItem:
    """One document in a run's inbox and what became of it.

    ``status``: ``waiting`` (the run has not read it yet), ``applied`` (read
    and accepted), ``refused`` (read and refused; ``why`` says why), or
    ``read`` when the view was opened without its history.
    """

    seq: int
    kind: str
    signer: str | None
    received_at: datetime
    status: str
    why: str | None = None


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as a person sees it: its checkpoint, trace, ledger and inbox.

    ``verified`` says whether the checkpoint, the trace chain and the ledger
    chain were checked under the keyring; unverified views are for display
    only (the runtime re-checks everything a signed document binds).
    ``policy`` is the run's policy when the store holds it (runs started
    by this version keep it, content-addressed by its fingerprint).
    """

    state: RunState
    mark: Mark
    verified: bool
    trace: tuple[TraceEvent, ...]
    ledger: tuple[LedgerEntry, ...]
    inbox: tuple[InboxItem, ...]
    policy: Policy | None
    #: When it was read: what "expired" and "waiting since" are measured against.
    read_at: datetime

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def listing(self) -> Listing:
        """What a list of runs shows of this run (as the runtime records it at each commit)."""
        return listing_of(self.state, self.policy)

    @property
    def waiting_for(self) -> str | None:
        """Who or what the run waits for, in a few words (``None``: nothing, or it ended)."""
        return listing_rules.waiting_for(
            self.state.phase.value,
            self.listing,
            approval=self.needs_approval,
            failing=self.failing,
            attempts=self.mark.attempts,
            last_error=self.mark.last_error,
        )

    @property
    def held(self) -> bool:
        """A worker holds a live lease on the run now."""
        expires = self.mark.lease_expires_at
        return self.mark.lease_owner is not None and expires is not None and expires > self.read_at

    @property
    def failing(self) -> bool:
        """Claims of the run keep ending badly: in an error, or in a worker that died holding it.

        A claim counts an attempt when it is taken, so a claim being worked on
        (a live lease, no error yet) is not a failure.
        """
        mark = self.mark
        return listing_rules.failing(
            mark.attempts, mark.last_error, mark.lease_owner, mark.lease_expires_at, self.read_at
        )

    @property
    def needs_approval(self) -> bool:
        """The pending write waits for an approval no valid document gives yet."""
        return listing_rules.awaits_approval(
            self.state.phase.value, self.listing, self.mark.waiting_after, self.read_at
        )

    @property
    def approvable(self) -> bool:
        """An approval of the pending write is something the runtime would take.

        Not for a compensation (the signed decision that ordered it is its
        authority) or a kind the run's policy lets through unapproved. A write
        already sent takes one too: if the adapter cannot settle it, it goes
        again only under an approval in force.
        """
        return approvable(self.state.pending, self.policy)

    @property
    def needs_person(self) -> bool:
        """Nothing happens to this run until a person acts (or it keeps failing)."""
        return listing_rules.needs_person(self.state.phase.value, self.needs_approval, self.failing)

    def epochs(self) -> list[dict[str, Any]]:
        """Every epoch of the run, from its trace: how it was opened, by whom, from where, why."""
        epochs: list[dict[str, Any]] = []
        for event in self.trace:
            data = event.data
            at = format_time(event.at)
            if event.kind == "run_started":
                epochs.append({"epoch": 1, "opened_by": "start", "at": at, "generation": None})
            elif event.kind in {"recovered", "rewind_started"}:
                epochs.append(
                    {
                        "epoch": len(epochs) + 1,
                        "opened_by": "recovery" if event.kind == "recovered" else "rewind",
                        "at": at,
                        "epoch_id": data.get("epoch_id"),
                        "previous_epoch_id": data.get("previous_epoch_id"),
                        "principal": data.get("principal"),
                        "role": data.get("role"),
                        "signed": data.get("signed"),
                        "admission": data.get("admission"),
                        "generation": data.get("from_generation"),
                        "to_generation": data.get("to_generation"),
                        "reason": data.get("reason") or None,
                    }
                )
        return epochs

    def effects(self) -> list[dict[str, Any]]:
        """The ledger grouped by effect: its terms, its status now and every status it had."""
        by_key: dict[str, dict[str, Any]] = {}
        for entry in self.ledger:
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
            receipt_id = (entry.receipt or {}).get("receipt_id")
            item.update(status=entry.status.value, epoch=entry.epoch)
            if receipt_id:
                item["receipt_id"] = receipt_id
            item["history"].append(
                {
                    "seq": entry.seq,
                    "status": entry.status.value,
                    "epoch": entry.epoch,
                    "receipt_id": receipt_id,
                }
            )
        return list(by_key.values())


def open_run(
    store: ContentStore,
    run_id: str,
    *,
    keyring: Keyring | None = None,
    marks: GenerationStore | None = None,
    now: datetime | None = None,
    history: bool = True,
) -> RunView:
    """Read ``run_id`` back: verified under ``keyring`` (every check), else read as stored.

    ``now`` (default: the system clock) is what approval expiry is judged by.
    ``history=False`` reads the checkpoint alone (no trace, no ledger, and so
    no reasons for refused documents): enough to say what the run waits for.
    """
    trace: tuple[TraceEvent, ...] = ()
    ledger: tuple[LedgerEntry, ...] = ()
    if keyring is not None:
        checkpointer = Checkpointer(store, keyring, marks=marks)
        restored = checkpointer.load(run_id)
        state, mark = restored.state, restored.mark
        if history:
            trace = tuple(checkpointer.verified_trace(state))
            ledger = tuple(checkpointer.verified_ledger(state))
    else:
        state, mark = read_state(store, run_id, marks)
        if history:
            trace = tuple(store.trace(run_id, state.trace_head))
            ledger = tuple(store.ledger(run_id))
    return RunView(
        state=state,
        mark=mark,
        verified=keyring is not None,
        trace=trace,
        ledger=ledger,
        inbox=_inbox(store.evidence(run_id), state, trace if history else None),
        policy=stored_policy(store, state),
        read_at=now if now is not None else SystemClock().now(),
    )


def marks_of(store: ContentStore) -> GenerationStore:
    if not isinstance(store, GenerationStore):
        raise TetherError("this store keeps no high-water marks: name the marks store")
    return store


def read_state(
    store: ContentStore, run_id: str, marks: GenerationStore | None
) -> tuple[RunState, Mark]:
    """The run's newest checkpoint as stored (unverified: for display and re-checks only)."""
    mark = (marks if marks is not None else marks_of(store)).get_mark(run_id)
    if mark is None:
        raise RunNotFoundError(run_id)
    envelope = store.get_checkpoint(run_id, mark.checkpoint_digest)
    if envelope is None:
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint the mark names is missing", run_id=run_id
        )
    try:
        document = strict_loads(envelope)
    except CanonicalJSONError as exc:
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint is not a well-formed envelope: {exc}", run_id=run_id
        ) from exc
    if not isinstance(document, dict) or not isinstance(document.get("payload"), dict):
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint envelope carries no payload object", run_id=run_id
        )
    state = RunState.from_json(expand_payload(document["payload"], store.get_blob, run_id=run_id))
    # What is shown must at least be what is signed: the invariants tie the
    # displayed intent to its digest, which the documents bind.
    validate_state(state)
    return state, mark


def stored_policy(store: ContentStore, state: RunState) -> Policy | None:
    """The run's policy as the store keeps it (by the fingerprint its binding names), if it does."""
    fingerprint = state.binding.policy_fingerprint
    data = store.get_blob(fingerprint)
    if data is None or digest_bytes(data) != fingerprint:
        return None
    try:
        policy = Policy.from_json(data)
    except SpecError:
        return None
    return policy if policy.fingerprint == fingerprint else None


def _inbox(
    found: list[Evidence], state: RunState, trace: tuple[TraceEvent, ...] | None
) -> tuple[InboxItem, ...]:
    refusals = {
        event.data.get("seq"): f"{event.data.get('error')}: {event.data.get('message')}"
        for event in trace or ()
        if event.kind == "evidence_refused"
    }
    items = []
    for item in found:
        signer = item.document.get("signer")
        if item.seq > state.inbox_cursor:
            status, why = "waiting", None
        elif trace is None:  # read, but without the trace nobody can say how it went
            status, why = "read", None
        elif item.seq in refusals:
            status, why = "refused", refusals[item.seq]
        else:
            status, why = "applied", None
        items.append(
            InboxItem(
                item.seq,
                item.kind,
                signer if isinstance(signer, str) else None,
                item.received_at,
                status,
                why,
            )
        )
    return tuple(items)
