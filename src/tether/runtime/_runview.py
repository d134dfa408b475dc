"""What the people around a run see of it: one reading for the CLI and the page.

:func:`open_run` reads a run back (verified when a keyring is given: the
checkpoint, and its history page by page); who it waits for is decided by
``core.listing_rules``, the same rules a list of runs uses (:mod:`._runs`).
Nothing here holds a key or changes run state; the documents people sign
are :mod:`._operator`'s.

A view holds one :class:`Page` of the run's history: the newest ``limit``
trace events and ledger entries below a seq, newest first, and the seq to
ask for the next older page. Read with a keyring, a page's rows are reached
by their links from the signed head, each one's hash is recomputed, and the
shown rows link to each other (the newest page: to the signed head itself).
``Page(limit=None)`` reads the whole history, every hash from the head to
genesis, as ``tether verify`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tether.core import (
    CanonicalJSONError,
    CheckpointCorruptError,
    IntegrityError,
    LedgerEntry,
    LedgerIntegrityError,
    MissingHighWaterMarkError,
    Policy,
    RunNotFoundError,
    RunState,
    SpecError,
    StoreError,
    TetherError,
    TraceEvent,
    TraceIntegrityError,
    digest_bytes,
    format_time,
    strict_loads,
)
from tether.core import _listing as listing_rules
from tether.core import _replay as replay_rules
from tether.core._listing import Listing, approvable, listing_of
from tether.core._payload import expand_payload, validate_state
from tether.core._segment import hashes_to_itself, walk_down
from tether.core._state import GENESIS_HASH
from tether.crypto import Keyring, PublishedTrust
from tether.runtime._checkpointer import Checkpointer
from tether.runtime._clock import SystemClock
from tether.store import LANDMARK_KINDS, ContentStore, Evidence, GenerationStore, Mark


@dataclass(frozen=True, slots=True)
class Page:
    """Which stretch of a run's history a view reads: the newest ``limit`` rows below a seq.

    ``trace_before`` and ``ledger_before`` (``None``: from the head) are the
    seqs a previous page handed back as :attr:`RunView.older_trace` and
    :attr:`RunView.older_ledger`. ``limit=None`` reads everything.
    """

    limit: int | None = 50
    trace_before: int | None = None
    ledger_before: int | None = None

    def __post_init__(self) -> None:
        for name in ("limit", "trace_before", "ledger_before"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise StoreError(f"page {name} must be a whole number, not {value!r}")
            if value is not None and value < 1:
                raise StoreError(f"page {name} must be at least 1, not {value}")


#: The whole history (what ``--all`` asks for).
ALL = Page(limit=None)


@dataclass(frozen=True, slots=True)
class RecordedTrust:
    """The trust roots the run's current epoch opened under, as the store keeps them.

    ``fingerprint`` ``None``: that runtime had no trust roots, so it accepts no
    signed document. ``roots`` ``None`` beside a fingerprint: the store lacks
    the record it names (or holds other bytes there). ``seq``: the trace
    event that names them.
    """

    fingerprint: str | None
    roots: PublishedTrust | None
    seq: int


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
    #: The ``trace_before`` of the next older page (``None``: this page reaches the start).
    older_trace: int | None = None
    #: The ``ledger_before`` of the next older page (``None``: this page reaches the start).
    older_ledger: int | None = None
    #: How each epoch began (and every rewind), whatever page is shown: see :data:`LANDMARK_KINDS`.
    landmarks: tuple[TraceEvent, ...] = ()
    #: What the ledger records of each effect digest :func:`open_run` was asked
    #: about (``None``: nothing), read by index whatever the page.
    effect_records: dict[str, replay_rules.EffectHistory | None] = field(default_factory=dict)
    #: The trust roots the run's epoch runs under (``None``: not recorded, by a
    #: tether from before they were, or the view was read without its history).
    trust: RecordedTrust | None = None

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
        for event in self.landmarks:
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
        """The ledger page grouped by effect: its terms, its status now, every status it had.

        Only the statuses on this page: an effect whose first entries lie on an
        older page shows there too.
        """
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
    page: Page = ALL,
    effects: Collection[str] = (),
) -> RunView:
    """Read ``run_id`` back: verified under ``keyring`` (every check), else read as stored.

    ``now`` (default: the system clock) is what approval expiry is judged by.
    ``history=False`` reads the checkpoint alone (no trace, no ledger, and so
    no reasons for refused documents): enough to say what the run waits for.
    ``page`` says which stretch of the history to read (default: all of it;
    the CLI and the page read ``Page()``, the newest 50). ``effects``: effect
    digests whose ledger records to read whatever the page (a fork names one).
    """
    trace: tuple[TraceEvent, ...] = ()
    ledger: tuple[LedgerEntry, ...] = ()
    landmarks: tuple[TraceEvent, ...] = ()
    older: tuple[int | None, int | None] = (None, None)
    records: dict[str, replay_rules.EffectHistory | None] = {}
    if keyring is not None:
        checkpointer = Checkpointer(store, keyring, marks=marks)
        try:
            restored = checkpointer.load(run_id)
        except MissingHighWaterMarkError:
            _never_started(store, run_id)
            raise
        state, mark = restored.state, restored.mark
        if history and page.limit is None:
            trace = tuple(checkpointer.verified_trace(state))
            ledger = tuple(checkpointer.verified_ledger(state))
        elif history:
            trace, ledger, older = _page(store, state, page, check=True)
        if history:
            whole = trace if page.limit is None else None
            landmarks = _landmarks(store, state, whole, check=True)
        if effects:
            records = _effect_records(checkpointer, state, effects)
    else:
        state, mark = read_state(store, run_id, marks)
        if history and page.limit is None:
            trace = tuple(store.trace(run_id, state.trace_head))
            ledger = tuple(store.ledger(run_id))
        elif history:
            trace, ledger, older = _page(store, state, page, check=False)
        if history:
            whole = trace if page.limit is None else None
            landmarks = _landmarks(store, state, whole, check=False)
        for digest in effects:
            found = replay_rules.known_effects(store.ledger_for_effect(run_id, digest))
            records[digest] = found.get(digest)
    return RunView(
        state=state,
        mark=mark,
        verified=keyring is not None,
        trace=trace,
        ledger=ledger,
        inbox=_inbox(store.evidence(run_id), state, landmarks if history else None),
        policy=stored_policy(store, state),
        read_at=now if now is not None else SystemClock().now(),
        older_trace=older[0],
        older_ledger=older[1],
        landmarks=landmarks,
        effect_records=records,
        trust=recorded_trust(store, landmarks),
    )


def _page(
    store: ContentStore, state: RunState, page: Page, *, check: bool
) -> tuple[tuple[TraceEvent, ...], tuple[LedgerEntry, ...], tuple[int | None, int | None]]:
    """One page of the trace and of the ledger, each checked (``check``) as the module says."""
    run_id = state.run_id
    limit = page.limit if page.limit is not None else max(state.trace_length, 1)
    events = _rows(
        lambda low, high: store.trace_between(run_id, low, high),
        lambda before: store.trace(run_id, state.trace_head, limit, before=before),
        state.trace_head,
        state.trace_length,
        limit,
        page.trace_before,
        (lambda p: TraceIntegrityError(f"run {run_id}: the trace {p}", run_id=run_id))
        if check
        else None,
    )
    limit = page.limit if page.limit is not None else max(state.ledger_length, 1)
    entries = _rows(
        lambda low, high: store.ledger_between(run_id, low, high),
        lambda before: store.ledger_chain(run_id, state.ledger_head, limit, before=before),
        state.ledger_head,
        state.ledger_length,
        limit,
        page.ledger_before,
        (lambda p: LedgerIntegrityError(f"run {run_id}: effect ledger {p}", run_id=run_id))
        if check
        else None,
    )
    return tuple(events), tuple(entries), (_older(events), _older(entries))


def _rows(
    by_seq: Callable[[int, int], Sequence[Any]],
    by_links: Callable[[int | None], Sequence[Any]],
    head: str,
    length: int,
    limit: int,
    before: int | None,
    broken: Callable[[str], IntegrityError] | None,
) -> list[Any]:
    """The newest ``limit`` rows of one chain below ``before``, oldest first.

    Read by seq (neighbouring rows, one range of one index), hanging from
    the row above the page: the signed head for the newest page, else the row
    at ``before``. Where the store holds one row per seq there, those rows
    are the chain's (a chain broken further up is what ``tether verify``
    finds; the newest page is checked against the signed head itself); where
    it holds more (an orphan, a forgery), the page is walked from the head by
    its links instead, to tell them apart. ``broken`` (verified views) makes
    every row shown hash to its content and link to the next.
    """
    top = length if before is None else min(before - 1, length)
    newest = top == length
    if top < 1:
        return []
    low = max(1, top - limit + 1)
    found = by_seq(low, top if newest else top + 1)
    at: dict[int, list[Any]] = {}
    for row in found:
        at.setdefault(row.seq, []).append(row)
    if any(len(same) > 1 for same in at.values()):
        rows = list(by_links(None if newest else top + 1))  # tell them apart by the links
        anchor = head if newest else (rows[-1].hash if rows else "")
    else:
        rows = [at[seq][0] for seq in range(low, top + 1) if seq in at]
        if newest:
            anchor = head
        else:
            above = at.get(top + 1)
            if above is None:
                if broken is not None:
                    raise broken(f"lacks its entry at seq {top + 1} (deleted or never written)")
                return rows
            if broken is not None and not hashes_to_itself(above[0]):
                raise broken(f"entry {top + 1} was altered (its hash does not match its content)")
            anchor = above[0].prev_hash
    if broken is not None:
        if not rows:
            raise broken(f"lacks the entries at seq {low}..{top} (deleted or never written)")
        walk_down(rows, top=anchor, top_seq=top, floor=low, genesis=GENESIS_HASH, broken=broken)
    return rows


def _older(rows: Sequence[Any]) -> int | None:
    """The ``before`` of the page under ``rows`` (``None``: they reach seq 1, or are none)."""
    return rows[0].seq if rows and rows[0].seq > 1 else None


def _landmarks(
    store: ContentStore, state: RunState, whole: tuple[TraceEvent, ...] | None, *, check: bool
) -> tuple[TraceEvent, ...]:
    """The run's landmark events: from the whole trace when read, else by index.

    Read by index, an event counts if it lies within the signed length and is
    the only row the store holds at its seq (a chain broken there is what
    ``tether verify`` finds); verified views also recompute its hash. Where a
    seq holds more than one row, the chain is walked from the head instead.
    """
    run_id = state.run_id
    if whole is not None:
        return tuple(e for e in whole if e.kind in LANDMARK_KINDS)
    found = [
        e for e in store.trace_landmarks(run_id, LANDMARK_KINDS) if e.seq <= state.trace_length
    ]
    for event in found:
        if check and not hashes_to_itself(event):
            raise TraceIntegrityError(
                f"run {run_id}: the trace's {event.kind} event {event.seq} was altered",
                run_id=run_id,
            )
        if len(store.trace_between(run_id, event.seq, event.seq)) != 1:
            walked = store.trace_landmarks(run_id, LANDMARK_KINDS, head=state.trace_head)
            return tuple(e for e in walked if not check or hashes_to_itself(e))
    return tuple(found)


def _effect_records(
    checkpointer: Checkpointer, state: RunState, effects: Collection[str]
) -> dict[str, replay_rules.EffectHistory | None]:
    """What the ledger records of each digest in ``effects``: its rows proven on the chain."""
    chain = checkpointer.ledger_chain(state)
    records: dict[str, replay_rules.EffectHistory | None] = {}
    for digest in effects:
        rows = [
            e
            for e in checkpointer.content.ledger_for_effect(state.run_id, digest)
            if e.terms is not None and e.terms.effect == digest and chain.check(e)
        ]
        found = replay_rules.known_effects(sorted(rows, key=lambda e: e.seq))
        records[digest] = found.get(digest)
    return records


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
        _never_started(store, run_id)
        raise MissingHighWaterMarkError(run_id)
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


#: The events that open an epoch, and so name the trust roots it runs under.
_OPENERS = ("run_started", "recovered", "rewind_started")


def recorded_trust(store: ContentStore, landmarks: Sequence[TraceEvent]) -> RecordedTrust | None:
    """The trust roots the newest epoch opened under, read from the store (see :class:`RecordedTrust`)."""
    for opener in reversed(landmarks):
        if opener.kind not in _OPENERS:
            continue
        data = opener.data
        if "trust" not in data and isinstance(data.get("recovered"), dict):
            data = data["recovered"]  # a rewind that opened the epoch carries the recovery's facts
        if "trust" in data:
            return _trust_named(store, data["trust"], opener.seq)
        if opener.kind != "rewind_started":
            return None  # opened by a tether that did not record them
        # A rewind applied by a running process: the epoch before it names its roots.
    return None


def _trust_named(store: ContentStore, fingerprint: Any, seq: int) -> RecordedTrust:
    """The record a trace event names by ``fingerprint``, read from the store's blobs."""
    if fingerprint is None:
        return RecordedTrust(None, None, seq)
    if not isinstance(fingerprint, str):
        return RecordedTrust(str(fingerprint), None, seq)
    body = store.get_blob(fingerprint)
    if body is None or digest_bytes(body) != fingerprint:
        return RecordedTrust(fingerprint, None, seq)
    try:
        roots = PublishedTrust.from_json(body)
    except TetherError:
        roots = None
    return RecordedTrust(fingerprint, roots, seq)


def _never_started(store: ContentStore, run_id: str) -> None:
    """A run without a mark: no such run (nothing of it stored), else a lost mark (integrity).

    Raises :class:`~tether.core.RunNotFoundError` for the first; returns for
    the second, which the caller reports as the integrity failure it is.
    """
    if store.newest_generation(run_id) is None:
        raise RunNotFoundError(run_id)


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
    found: list[Evidence], state: RunState, landmarks: tuple[TraceEvent, ...] | None
) -> tuple[InboxItem, ...]:
    refusals = {
        event.data.get("seq"): f"{event.data.get('error')}: {event.data.get('message')}"
        for event in landmarks or ()
        if event.kind == "evidence_refused"
    }
    items = []
    for item in found:
        signer = item.document.get("signer")
        if item.seq > state.inbox_cursor:
            status, why = "waiting", None
        elif landmarks is None:  # read, but without the trace nobody can say how it went
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
