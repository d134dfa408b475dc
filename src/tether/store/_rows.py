"""Reading stored rows back: every column checked, every malformed value a typed error.

A store is not trusted: a row may have been edited. Each parser here turns
a row into a value object or raises an integrity error that names the run
(never a bare ``ValueError`` or ``TypeError``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from tether.core import (
    CanonicalJSONError,
    CheckpointCorruptError,
    Compensation,
    EffectStatus,
    EffectTerms,
    LedgerEntry,
    LedgerIntegrityError,
    Phase,
    RetrySemantics,
    StoreError,
    TraceEvent,
    TraceIntegrityError,
    strict_loads,
)
from tether.core import _steps as step_rules
from tether.core._fields import Fields
from tether.core._listing import Listing
from tether.core._model import parse_time_text
from tether.store._codec import inflate, pack
from tether.store._protocols import Evidence, Lease, Mark

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MARK = (
    "run_id",
    "generation",
    "checkpoint_digest",
    "state_version",
    "lease_version",
    "lease_owner",
    "lease_expires_at",
    "phase",
    "attempts",
    "retry_at",
    "last_error",
    "waiting_after",
)
MARK_COLUMNS = ", ".join(_MARK)


#: The columns a commit records a run's listing in (see ``core.Listing``).
LISTING_COLUMNS = ("epoch", "subject", "pending_action", "gate", "approved_until")


def listing_values(listing: Listing | None) -> tuple[Any, ...]:
    """The values of :data:`LISTING_COLUMNS` for ``listing`` (all NULL for none)."""
    if listing is None:
        return (None,) * len(LISTING_COLUMNS)
    return (
        listing.epoch,
        listing.subject,
        listing.pending_action,
        listing.gate,
        listing.approved_until,
    )


def listing_of_row(run_id: str, row: Sequence[Any]) -> Listing | None:
    """The listing stored in :data:`LISTING_COLUMNS`, ``None`` when none was recorded."""
    epoch, subject, pending_action, gate, approved_until = row
    if epoch is None:
        return None

    def text(value: Any) -> str | None:
        return None if value is None else text_of(value)

    try:
        return Listing(
            epoch=whole(epoch),
            subject=text(subject),
            pending_action=text(pending_action),
            gate=None if gate is None else EffectStatus(text_of(gate)).value,
            approved_until=text(approved_until),
        )
    except (TypeError, ValueError) as exc:
        raise CheckpointCorruptError(
            f"run {run_id}: its listing columns are malformed: {exc}", run_id=run_id
        ) from exc


def mark_columns(raw: str) -> str:
    """The mark's columns, each read through ``raw`` (a format string; see SQLBase.raw_column)."""
    return ", ".join(raw.format(c) for c in _MARK)


def from_micros(micros: Any) -> datetime:
    return EPOCH + timedelta(microseconds=int(micros))


def text_of(value: Any) -> str:
    """A text column read back as exactly text (bytes are decoded strictly: damage raises)."""
    if isinstance(value, bytes | bytearray | memoryview):
        # Read raw (see SQLBase.raw_column) so one undecodable row fails alone.
        return bytes(value).decode("utf-8")
    if not isinstance(value, str):
        raise ValueError(f"expected text, found {type(value).__name__}")
    return value


def parse_stored_time(text: Any) -> datetime:
    return parse_time_text(text)


def ttl_micros(ttl_s: float) -> int:
    if isinstance(ttl_s, bool) or not math.isfinite(ttl_s) or ttl_s <= 0:
        raise StoreError(f"a lease ttl must be a positive number of seconds, not {ttl_s!r}")
    return max(1, round(ttl_s * 1_000_000))


def phase_text(phase: str) -> str:
    try:
        return Phase(phase).value
    except ValueError:
        raise StoreError(
            f"unknown phase {phase!r}; expected one of {[p.value for p in Phase]}"
        ) from None


def mark_of(row: Sequence[Any]) -> Mark:
    run_id, generation, digest, state_version, lease_version, owner, expires, phase = row[:8]
    attempts, retry_at, last_error, waiting_after = row[8:12]
    try:
        run_id = text_of(run_id)
        return Mark(
            run_id=run_id,
            generation=whole(generation),
            checkpoint_digest=text_of(digest),
            state_version=whole(state_version),
            lease_version=whole(lease_version),
            lease_owner=None if owner is None else text_of(owner),
            lease_expires_at=None if expires is None else from_micros(whole(expires)),
            phase=Phase(text_of(phase)).value,
            attempts=whole(attempts),
            retry_at=None if retry_at is None else from_micros(whole(retry_at)),
            last_error=None if last_error is None else text_of(last_error),
            waiting_after=None if waiting_after is None else whole(waiting_after),
        )
    except (TypeError, ValueError, OverflowError, OSError) as exc:
        shown = run_id if isinstance(run_id, str) else repr(run_id)
        raise CheckpointCorruptError(
            f"run {shown}: its high-water mark row is malformed: {exc}", run_id=shown
        ) from exc


def whole(value: Any) -> int:
    """An integer column read back as exactly an integer (text or a float is damage)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, found {_short(value)}")
    return value


def stored_int(value: Any, what: str, *, run_id: str | None = None) -> int:
    """An integer column (a count, a MAX) or a typed error naming what it is."""
    try:
        return whole(value)
    except ValueError as exc:
        raise CheckpointCorruptError(f"{what} is malformed: {exc}", run_id=run_id) from exc


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def evidence_of(run_id: str, row: Sequence[Any]) -> Evidence:
    """An inbox row, or an integrity error naming the run and the entry."""
    seq, kind, document, received_at = row
    try:
        number = whole(seq)
        value = strict_loads(text_of(document))
        if not isinstance(value, dict):
            raise ValueError("its document is not an object")
        return Evidence(run_id, number, text_of(kind), value, parse_stored_time(received_at))
    except (TypeError, ValueError, OverflowError, CanonicalJSONError) as exc:
        raise CheckpointCorruptError(
            f"run {run_id}: inbox entry {_short(seq)} is malformed: {exc}", run_id=run_id
        ) from exc


def ledger_columns(entry: LedgerEntry) -> tuple[str | None, str | None, str | None]:
    """The JSON text a ledger row stores for ``entry``'s receipt, terms and payload."""
    return entry.column_texts()


def ledger_packed_columns(
    entry: LedgerEntry, *, deflate: bool = True
) -> tuple[str | None, str | None, str | None, bytes | None]:
    """What a ledger row stores for ``entry``'s receipt, terms and payload, and ``packed``.

    One JSON array of the three, deflated (``tether.store._codec``, codec d1)
    into ``packed`` when that is shorter, the three text columns then NULL;
    otherwise the texts as they are and ``packed`` NULL.
    """
    texts = ledger_columns(entry)
    whole = b"[" + b",".join(b"null" if t is None else t.encode("utf-8") for t in texts) + b"]"
    stored, codec = pack(whole, deflate=deflate)
    if codec is None:
        return (*texts, None)
    return None, None, None, stored


def trace_data_columns(event: TraceEvent, *, deflate: bool = True) -> tuple[str, bytes | None]:
    """What a trace row stores for ``event``'s data: ``(data, packed)``.

    The canonical JSON deflated into ``packed`` (codec d1) when that is
    shorter, ``data`` then ``''``; otherwise the text as it is and NULL.
    """
    data = event.encoded_data()
    stored, codec = pack(data, deflate=deflate)
    if codec is None:
        return data.decode("utf-8"), None
    return "", stored


def _unpacked(value: Any) -> str:
    """The text a ``packed`` column deflated (``ValueError`` when damaged)."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError(f"its packed column is {type(value).__name__}, not bytes")
    return inflate(bytes(value)).decode("utf-8")


def index_key(value: str | None) -> str | None:
    """How an index column keeps an id: as it is, with NUL (which PostgreSQL text
    cannot hold) as U+FFFD. A look-up compares the rows it finds exactly."""
    return None if value is None else value.replace("\x00", "\ufffd")


def effect_key(entry: LedgerEntry) -> str | None:
    """The ``effect`` index column of ``entry``'s row: its terms' effect digest."""
    return index_key(None if entry.terms is None else entry.terms.effect)


def target_key(entry: LedgerEntry) -> str | None:
    """The ``target`` index column of ``entry``'s row: its target digest once sent, else NULL.

    Every row after the intent is indexed (dispatched, unknown, committed,
    refused, cancelled, compensated): the replay rule asks which attempt on a
    target may have landed last, and an attempt's newest row says whether it
    did (migrations 15 and 16). An intent alone never left the process.
    """
    terms = entry.terms
    if terms is None or terms.effect is None or entry.status is EffectStatus.INTENDED:
        return None
    return terms.target_key


def stored_target(status: Any, terms: Any) -> str | None:
    """The ``target`` column of a row written before migration 16, from its raw columns.

    ``None`` where it names none (an intent, no effect digest) or its terms
    cannot be read: the column stays NULL, and a reader refuses the row as
    it did before.
    """
    try:
        body = None if terms is None else strict_loads(str(terms))
        if not isinstance(body, dict) or EffectStatus(str(status)) is EffectStatus.INTENDED:
            return None
        parsed = _terms_of(body, lambda problem: LedgerIntegrityError(problem))
    except (ValueError, CanonicalJSONError, LedgerIntegrityError):
        return None
    return None if parsed.effect is None else parsed.target_key


def action_key(event: TraceEvent) -> str | None:
    """The ``action_id`` index column of ``event``'s row: the action id it records as taken."""
    return index_key(step_rules.action_id_of(event.kind, event.data))


def ledger_entry_of(run_id: str, row: Sequence[Any]) -> LedgerEntry:
    """A ledger row read back; its ``effect`` index column must say what its terms say."""
    documents = None
    if len(row) > 14 and row[14] is not None:
        documents = _ledger_documents(run_id, row, row[14])
    entry = _ledger_entry_of(run_id, row[:12], documents)
    if len(row) > 12 and row[12] != effect_key(entry):
        raise LedgerIntegrityError(
            f"run {run_id}: ledger row {entry.hash}'s effect index ({str(row[12])[:80]!r}) is "
            "not its terms' effect digest: the column was edited",
            run_id=run_id,
        )
    if len(row) > 13 and row[13] != target_key(entry):
        raise LedgerIntegrityError(
            f"run {run_id}: ledger row {entry.hash}'s target index ({str(row[13])[:80]!r}) is "
            "not its commit's target digest: the column was edited",
            run_id=run_id,
        )
    return entry


def _ledger_documents(run_id: str, row: Sequence[Any], packed: Any) -> list[Any]:
    """The receipt, terms and payload (parsed) of a row that keeps them ``packed``."""
    try:
        if any(row[i] is not None for i in (7, 10, 11)):
            raise ValueError("it holds both packed and plain documents")
        documents = strict_loads(_unpacked(packed))
        if not isinstance(documents, list) or len(documents) != 3:
            raise ValueError("its packed documents are not [receipt, terms, payload]")
        return documents
    except (ValueError, UnicodeDecodeError, CanonicalJSONError) as exc:
        raise LedgerIntegrityError(
            f"run {run_id}: ledger row {row[0]} is malformed: {exc}", run_id=run_id
        ) from exc


def _ledger_entry_of(
    run_id: str, row: Sequence[Any], documents: Sequence[Any] | None = None
) -> LedgerEntry:
    """A ledger row's content; ``documents``: its receipt, terms and payload, parsed
    from its packed column (the row's own text columns are then NULL)."""
    hash_, prev, seq, key, status, action_id, intent_digest, receipt, epoch, at, terms, payload = (
        row
    )

    def broken(problem: str) -> LedgerIntegrityError:
        return LedgerIntegrityError(f"run {run_id}: ledger row {hash_} {problem}", run_id=run_id)

    def document(name: str, value: Any, index: int) -> dict[str, Any] | None:
        if documents is not None:
            body = documents[index]
        else:
            try:
                body = None if value is None else strict_loads(str(value))
            except CanonicalJSONError as exc:
                raise broken(f"has {name} that is not JSON: {exc}") from exc
        if body is not None and not isinstance(body, dict):
            raise broken(f"has {name} that is not an object")
        return body

    try:
        effect = EffectStatus(str(status))
        moment = parse_stored_time(at)
        number, epoch_number = whole(seq), whole(epoch)
    except (TypeError, ValueError, OverflowError) as exc:
        raise broken(f"is malformed: {exc}") from exc
    terms_body = document("terms", terms, 1)
    return LedgerEntry(
        run_id=run_id,
        idempotency_key=str(key),
        seq=number,
        status=effect,
        action_id=str(action_id),
        intent_digest=str(intent_digest),
        receipt=document("a receipt", receipt, 0),
        epoch=epoch_number,
        at=moment,
        prev_hash=str(prev),
        hash=str(hash_),
        terms=None if terms_body is None else _terms_of(terms_body, broken),
        payload=document("a payload", payload, 2),
    )


def _terms_of(body: dict[str, Any], broken: Callable[[str], LedgerIntegrityError]) -> EffectTerms:
    f = Fields(body, "terms", lambda field, problem: broken(f"has bad {field}: {problem}"))
    retry, compensation = f.str("retry"), f.str("compensation")
    try:
        terms = EffectTerms(
            adapter=f.str("adapter"),
            kind=f.str("kind"),
            target=f.str("target", nonempty=False),
            retry=RetrySemantics(retry),
            compensation=Compensation(compensation),
            sensitive=f.bool("sensitive"),
            effect=f.optional_str("effect"),
            queryable=f.optional_bool("queryable"),
            absent_is_final=f.optional_bool("absent_is_final"),
        )
    except ValueError as exc:
        raise broken(f"has unknown terms: {exc}") from exc
    f.done()
    return terms


def trace_event_of(run_id: str, row: Sequence[Any]) -> TraceEvent:
    """A trace row read back; its ``action_id`` index column must say what its data says."""
    content = list(row[:6])
    if len(row) > 7 and row[7] is not None:
        try:
            if content[5] != "":
                raise ValueError("it holds both packed and plain data")
            content[5] = _unpacked(row[7])
        except (ValueError, UnicodeDecodeError) as exc:
            raise TraceIntegrityError(
                f"run {run_id}: trace row {content[0]} is malformed: {exc}", run_id=run_id
            ) from exc
    event = _trace_event_of(run_id, content)
    if len(row) > 6 and row[6] != action_key(event):
        raise TraceIntegrityError(
            f"run {run_id}: trace row {event.hash}'s action index ({str(row[6])[:80]!r}) is "
            "not the action id its data records: the column was edited",
            run_id=run_id,
        )
    return event


def _trace_event_of(run_id: str, row: Sequence[Any]) -> TraceEvent:
    hash_, prev, seq, kind, at, data = row
    try:
        text = str(data)
        value = strict_loads(text)
        if not isinstance(value, dict):
            raise ValueError("its data is not an object")
        return TraceEvent(
            run_id=run_id,
            seq=whole(seq),
            kind=str(kind),
            at=parse_stored_time(at),
            data=value,
            prev_hash=str(prev),
            hash=str(hash_),
            data_text=text.encode("utf-8"),  # the hash is checked over what was stored
        )
    except (TypeError, ValueError, OverflowError, CanonicalJSONError) as exc:
        raise TraceIntegrityError(
            f"run {run_id}: trace row {hash_} is malformed: {exc}", run_id=run_id
        ) from exc


def lease_of(mark: Mark) -> Lease:
    if mark.lease_owner is None or mark.lease_expires_at is None:
        # Only reachable if a statement that grants a lease left it unowned.
        raise StoreError(f"run {mark.run_id}: the store granted a lease it does not record")
    return Lease(
        run_id=mark.run_id,
        owner=mark.lease_owner,
        lease_version=mark.lease_version,
        expires_at=mark.lease_expires_at,
        state_version=mark.state_version,
        generation=mark.generation,
    )
