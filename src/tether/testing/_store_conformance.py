"""Store conformance, part one: generation CAS, content, torn writes, ledger, trace, migrations.

Plain pytest. Checks use explicit ``raise AssertionError`` (through
:func:`expect`), never ``assert``: this module is not rewritten by pytest,
and ``python -O`` would strip bare asserts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tether.core import (
    Compensation,
    EffectStatus,
    GenerationConflictError,
    LedgerEntry,
    MigrationError,
    RetrySemantics,
    StoreError,
    TetherError,
    TraceEvent,
    WriteOnceError,
)
from tether.core._ledger import EffectTerms, seal_entry
from tether.core._state import GENESIS_HASH
from tether.core._trace import seal_event
from tether.store import Commit, KeyClock

StoreFactory = Callable[[], Any]

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


# -- what every check uses ------------------------------------------------------


def expect(condition: bool, message: str) -> None:
    """Fail the test with ``message`` unless ``condition`` holds (survives ``python -O``)."""
    if not condition:
        raise AssertionError(message)


def expect_eq(actual: Any, expected: Any, what: str) -> None:
    """Fail the test unless ``actual == expected``."""
    if actual != expected:
        raise AssertionError(f"{what}: expected {expected!r}, got {actual!r}")


def make_commit(
    run_id: str,
    generation: int,
    body: bytes = b"",
    *,
    events: Sequence[TraceEvent] = (),
    blobs: Mapping[str, bytes] | None = None,
    phase: str = "running",
    ledger: Sequence[LedgerEntry] = (),
) -> Commit:
    """A commit whose digest addresses its envelope; ``body`` makes two commits differ."""
    envelope = b"envelope:" + run_id.encode() + b":" + str(generation).encode() + b":" + body
    digest = "sha256:" + hashlib.sha256(envelope).hexdigest()
    return Commit(run_id, generation, digest, envelope, tuple(events), blobs, phase, tuple(ledger))


def make_events(
    run_id: str, count: int, prev: str = GENESIS_HASH, seq: int = 1, label: str = "main"
) -> list[TraceEvent]:
    """``count`` chained trace events following ``prev``; ``label`` makes branches differ."""
    events = []
    for i in range(count):
        at = T0 + timedelta(seconds=seq + i)
        event = seal_event(run_id, seq + i, "step", at, {"n": seq + i, "label": label}, prev)
        events.append(event)
        prev = event.hash
    return events


def chained(
    key: str,
    statuses: Sequence[EffectStatus],
    *,
    after: LedgerEntry | None = None,
    run_id: str = "r",
    action_id: str = "a1",
    intent: str = "sha256:intent-1",
    receipt: dict[str, Any] | None = None,
) -> list[LedgerEntry]:
    """Ledger entries for ``key`` chained after ``after`` (or genesis), one per status."""
    rows: list[LedgerEntry] = []
    prev, seq = (GENESIS_HASH, 0) if after is None else (after.hash, after.seq)
    for status in statuses:
        seq += 1
        row = seal_entry(
            run_id,
            seq,
            prev,
            idempotency_key=key,
            status=status,
            action_id=action_id,
            intent_digest=intent,
            receipt=receipt if status is EffectStatus.COMMITTED else None,
            epoch=1,
            at=T0 + timedelta(seconds=seq),
        )
        rows.append(row)
        prev = row.hash
    return rows


def seeded(store: Any, run_id: str = "r", generations: int = 1) -> Commit:
    """Commit ``generations`` checkpoints of ``run_id``; returns the last."""
    last = make_commit(run_id, 1)
    store.commit(last, 0)
    for generation in range(2, generations + 1):
        last = make_commit(run_id, generation)
        store.commit(last, generation - 1)
    return last


@pytest.fixture
def tether_connect(tether_store_factory: StoreFactory) -> Iterator[StoreFactory]:
    """Open connections to the test's one database; all are closed at teardown."""
    opened: list[Any] = []

    def connect() -> Any:
        store = tether_store_factory()
        opened.append(store)
        return store

    yield connect
    for store in reversed(opened):
        close = getattr(store, "close", None)
        if close is not None:
            close()


@pytest.fixture
def tether_store(tether_connect: StoreFactory) -> Any:
    """The first connection: a fresh, empty store."""
    return tether_connect()


# -- compare-and-set on the generation ------------------------------------------


def test_cas_creates_a_run_exactly_once(tether_store: Any) -> None:
    """Creating a run sets generation 1 and a second create loses with GenerationConflictError."""
    first = make_commit("r", 1)
    tether_store.commit(first, 0)
    with pytest.raises(GenerationConflictError):
        tether_store.commit(make_commit("r", 1, b"other"), 0)
    mark = tether_store.get_mark("r")
    expect(mark is not None, "the mark exists after create")
    expect_eq(
        (mark.generation, mark.checkpoint_digest, mark.lease_version, mark.lease_owner),
        (1, first.checkpoint_digest, 0, None),
        "mark after create",
    )
    expect_eq(tether_store.get_mark("unknown"), None, "mark of an unknown run")


def test_cas_refuses_stale_and_skipping_expectations(tether_store: Any) -> None:
    """A stale expected generation and a skipped generation both lose and move nothing."""
    second = seeded(tether_store, generations=2)
    with pytest.raises(GenerationConflictError) as stale:
        tether_store.commit(make_commit("r", 2, b"late"), 1)
    expect_eq((stale.value.expected, stale.value.actual), (1, 2), "stale conflict")
    with pytest.raises(GenerationConflictError):
        tether_store.commit(make_commit("r", 4), 2)
    mark = tether_store.get_mark("r")
    expect_eq((mark.generation, mark.checkpoint_digest), (2, second.checkpoint_digest), "mark")
    expect_eq(tether_store.newest_generation("r"), 2, "newest content generation")


def test_a_losing_commit_writes_no_content(tether_store: Any) -> None:
    """The loser of a CAS leaves no checkpoint, event or blob behind."""
    seeded(tether_store)
    events = make_events("r", 1)
    loser = make_commit("r", 1, b"loser", events=events, blobs={"sha256:b": b"blob"})
    with pytest.raises(GenerationConflictError):
        tether_store.commit(loser, 0)
    expect_eq(tether_store.get_checkpoint("r", loser.checkpoint_digest), None, "loser content")
    expect_eq(tether_store.trace("r", events[0].hash), [], "loser events")
    expect_eq(tether_store.get_blob("sha256:b"), None, "loser blob")


def test_cas_mark_alone_follows_the_same_rules(tether_store: Any) -> None:
    """cas_mark creates once, advances only from the expected generation and records the phase."""
    tether_store.cas_mark("r", 0, 1, "sha256:one")
    with pytest.raises(GenerationConflictError):
        tether_store.cas_mark("r", 0, 1, "sha256:again")
    with pytest.raises(GenerationConflictError):
        tether_store.cas_mark("r", 1, 3, "sha256:skip")
    tether_store.cas_mark("r", 1, 2, "sha256:two", phase="pending")
    with pytest.raises(GenerationConflictError):
        tether_store.cas_mark("r", 1, 2, "sha256:stale")
    mark = tether_store.get_mark("r")
    expect_eq(
        (mark.generation, mark.checkpoint_digest, mark.phase), (2, "sha256:two", "pending"), "mark"
    )


def test_commit_records_the_phase(tether_store: Any) -> None:
    """Each commit records its phase on the mark; an unknown phase is refused and moves nothing."""
    tether_store.commit(make_commit("r", 1), 0)
    expect_eq(tether_store.get_mark("r").phase, "running", "default phase")
    tether_store.commit(make_commit("r", 2, phase="pending"), 1)
    expect_eq(tether_store.get_mark("r").phase, "pending", "phase after commit")
    with pytest.raises(StoreError):
        tether_store.commit(make_commit("r", 3, phase="sleeping"), 2)
    expect_eq(tether_store.get_mark("r").generation, 2, "generation after a refused phase")


def test_runs_lists_every_mark(tether_store: Any) -> None:
    """runs() returns one mark per run."""
    seeded(tether_store, "a")
    seeded(tether_store, "b", generations=2)
    expect_eq(
        sorted((m.run_id, m.generation) for m in tether_store.runs()), [("a", 1), ("b", 2)], "runs"
    )


# -- write-once content ---------------------------------------------------------


def test_same_digest_same_bytes_is_accepted(tether_store: Any) -> None:
    """Writing the same content twice is a no-op, and it reads back byte for byte."""
    first = make_commit("r", 1, events=make_events("r", 2), blobs={"sha256:b": b"blob"})
    tether_store.put_content(first)
    tether_store.put_content(first)
    expect_eq(tether_store.get_checkpoint("r", first.checkpoint_digest), first.envelope, "bytes")
    expect_eq(tether_store.get_blob("sha256:b"), b"blob", "blob")
    expect_eq(tether_store.get_checkpoint("other-run", first.checkpoint_digest), None, "other run")


def test_blobs_are_put_write_once_and_refused_unless_addressed(tether_store: Any) -> None:
    """put_blobs stores bytes by their digest once; a key that is not the digest refuses all."""
    body = b"snapshot bytes"
    address = "sha256:" + hashlib.sha256(body).hexdigest()
    other = "sha256:" + hashlib.sha256(b"other").hexdigest()
    expect_eq(tether_store.has_blob(address), False, "has_blob before")
    tether_store.put_blobs({address: body})
    tether_store.put_blobs({address: body})  # already there: a no-op
    tether_store.put_blobs({})
    expect_eq(tether_store.has_blob(address), True, "has_blob after")
    expect_eq(tether_store.get_blob(address), body, "blob")
    with pytest.raises(WriteOnceError):
        tether_store.put_blobs({other: b"other", address + "0": body})
    expect_eq(tether_store.has_blob(other), False, "a refused batch writes nothing")
    with pytest.raises(WriteOnceError):
        tether_store.put_blobs({address: b"not the bytes"})
    expect_eq(tether_store.get_blob(address), body, "the stored blob is unchanged")


def test_stored_blobs_answers_for_many_digests_at_once(tether_store: Any) -> None:
    """stored_blobs names exactly the digests with bytes stored, however many are asked."""
    bodies = [f"blob {i}".encode() for i in range(1200)]
    addresses = ["sha256:" + hashlib.sha256(b).hexdigest() for b in bodies]
    tether_store.put_blobs(dict(zip(addresses[::2], bodies[::2], strict=True)))
    expect_eq(tether_store.stored_blobs(addresses), set(addresses[::2]), "stored of 1200")
    expect_eq(tether_store.stored_blobs([]), set(), "stored of none")


def test_a_digest_that_does_not_address_its_bytes_is_refused(tether_store: Any) -> None:
    """Content whose digest is not the SHA-256 of its bytes is refused and nothing is written."""
    good = make_commit("r", 1)
    forged = Commit("r", 1, good.checkpoint_digest, b"other bytes")
    with pytest.raises(WriteOnceError):
        tether_store.commit(forged, 0)
    with pytest.raises(WriteOnceError):
        tether_store.put_content(forged)
    expect_eq(tether_store.get_mark("r"), None, "mark after a forged commit")
    expect_eq(tether_store.get_checkpoint("r", good.checkpoint_digest), None, "forged content")


def test_a_trace_event_cannot_be_rewritten(tether_store: Any) -> None:
    """An event hash that already names other content is refused with WriteOnceError."""
    event = make_events("r", 1)[0]
    tether_store.put_content(make_commit("r", 1, events=[event]))
    other = TraceEvent(event.run_id, 7, event.kind, event.at, event.data, "sha256:x", event.hash)
    with pytest.raises(WriteOnceError):
        tether_store.put_content(make_commit("r", 2, events=[other]))
    expect_eq(tether_store.trace("r", event.hash), [event], "the original event")


# -- torn writes and separate placement -----------------------------------------


class _Torn(Exception):
    """Raised from ``before_commit``: the process dies inside the transaction."""


def _tear() -> None:
    raise _Torn("torn")


def test_a_torn_commit_leaves_nothing(tether_store: Any) -> None:
    """An exception from before_commit inside commit leaves the mark and all content unchanged."""
    first = seeded(tether_store)
    events = make_events("r", 2)
    torn = make_commit("r", 2, events=events, blobs={"sha256:torn": b"torn"})
    with pytest.raises(_Torn):
        tether_store.commit(torn, 1, before_commit=_tear)
    mark = tether_store.get_mark("r")
    expect_eq((mark.generation, mark.checkpoint_digest), (1, first.checkpoint_digest), "mark")
    expect_eq(tether_store.get_checkpoint("r", torn.checkpoint_digest), None, "torn checkpoint")
    expect_eq(tether_store.newest_generation("r"), 1, "newest generation")
    expect_eq(tether_store.trace("r", events[-1].hash), [], "torn events")
    expect_eq(tether_store.get_blob("sha256:torn"), None, "torn blob")
    tether_store.commit(torn, 1)  # the same commit lands once retried whole
    expect_eq(tether_store.get_mark("r").generation, 2, "generation after the retry")


def test_a_torn_content_write_leaves_nothing(tether_store: Any) -> None:
    """An exception from before_commit inside put_content leaves no content."""
    torn = make_commit("r", 1, events=make_events("r", 1))
    with pytest.raises(_Torn):
        tether_store.put_content(torn, before_commit=_tear)
    expect_eq(tether_store.get_checkpoint("r", torn.checkpoint_digest), None, "torn checkpoint")
    expect_eq(tether_store.newest_generation("r"), None, "newest generation")


def test_orphan_content_is_unreachable(tether_store: Any) -> None:
    """Content written without its CAS stays unreachable: the mark and trace head still name the old."""
    old_events = make_events("r", 1)
    old = make_commit("r", 1, events=old_events)
    tether_store.put_content(old)
    tether_store.cas_mark("r", 0, 1, old.checkpoint_digest)
    orphan_events = make_events("r", 2, prev=old_events[-1].hash, seq=2, label="orphan")
    orphan = make_commit("r", 2, events=orphan_events)
    tether_store.put_content(orphan)  # ... and the process dies before cas_mark
    mark = tether_store.get_mark("r")
    expect_eq((mark.generation, mark.checkpoint_digest), (1, old.checkpoint_digest), "mark")
    expect_eq(tether_store.newest_generation("r"), 2, "orphan content is stored")
    expect_eq(tether_store.trace("r", old_events[-1].hash), old_events, "trace from the old head")
    tether_store.cas_mark("r", 1, 2, orphan.checkpoint_digest)  # the retried advance
    expect_eq(tether_store.get_mark("r").checkpoint_digest, orphan.checkpoint_digest, "mark")


# -- ledger ---------------------------------------------------------------------


def test_ledger_rows_land_with_their_checkpoint(tether_store: Any) -> None:
    """Ledger rows written by a commit read back whole, in sequence order."""
    receipt = {"receipt_id": "rc-1", "result": {"ok": True}}
    rows = chained("k1", [EffectStatus.INTENDED, EffectStatus.DISPATCHED])
    tether_store.commit(make_commit("r", 1, ledger=rows), 0)
    more = chained("k1", [EffectStatus.COMMITTED], after=rows[-1], receipt=receipt)
    more += chained("k2", [EffectStatus.INTENDED], after=more[-1], action_id="a2")
    tether_store.commit(make_commit("r", 2, ledger=more), 1)
    everything = tether_store.ledger("r")
    expect_eq(everything, [*rows, *more], "every field of every row")
    expect_eq(everything[2].receipt, receipt, "receipt")
    expect(tether_store.action_seen("r", "a2"), "a2 was seen")
    expect(not tether_store.action_seen("r", "a3"), "a3 was not seen")


def test_a_refused_commit_writes_no_ledger_rows(tether_store: Any) -> None:
    """A commit whose compare-and-set fails leaves none of its ledger rows behind."""
    seeded(tether_store)
    stale = make_commit("r", 2, ledger=chained("k", [EffectStatus.INTENDED]))
    with pytest.raises(GenerationConflictError):
        tether_store.commit(stale, 0)
    expect_eq(tether_store.ledger("r"), [], "ledger after the refused commit")


def test_a_torn_commit_writes_no_ledger_rows(tether_store: Any) -> None:
    """A commit whose before_commit raises leaves none of its ledger rows behind."""
    torn = make_commit("r", 1, ledger=chained("k", [EffectStatus.INTENDED]))
    with pytest.raises(_Torn):
        tether_store.commit(torn, 0, before_commit=_tear)
    with pytest.raises(_Torn):
        tether_store.put_content(torn, before_commit=_tear)
    expect_eq(tether_store.ledger("r"), [], "ledger after the torn commits")


def test_ledger_rows_are_write_once(tether_store: Any) -> None:
    """Writing an identical row again is a no-op; another row under the same hash is refused."""
    rows = chained("k", [EffectStatus.INTENDED])
    tether_store.put_content(make_commit("r", 1, ledger=rows))
    tether_store.put_content(make_commit("r", 1, b"again", ledger=rows))
    expect_eq(tether_store.ledger("r"), rows, "one row after an identical rewrite")
    (row,) = rows
    for clash in (
        replace(row, seq=row.seq + 1),
        replace(row, status=EffectStatus.COMMITTED, receipt={"forged": True}),
    ):
        with pytest.raises(WriteOnceError):
            tether_store.put_content(make_commit("r", 2, ledger=[clash]))
    expect_eq(tether_store.ledger("r"), rows, "rows after the refused clashes")


# -- trace ----------------------------------------------------------------------


def test_the_trace_walks_back_from_its_head_ignoring_orphans(tether_store: Any) -> None:
    """trace(head) is the chain ending at head: an orphaned branch is not on it."""
    chain = make_events("r", 3)
    branch = make_events("r", 1, prev=chain[1].hash, seq=3, label="orphan")
    tether_store.put_content(make_commit("r", 1, events=chain))
    tether_store.put_content(make_commit("r", 2, events=branch))
    expect_eq(tether_store.trace("r", chain[-1].hash), chain, "the main chain")
    expect_eq(tether_store.trace("r", branch[0].hash), [*chain[:2], *branch], "the branch")
    expect_eq(tether_store.trace("r", chain[-1].hash, limit=2), chain[1:], "the newest two")
    expect_eq(tether_store.trace("r", "sha256:nowhere"), [], "an unknown head")
    expect_eq(tether_store.trace("other", chain[-1].hash), [], "another run")


# -- migrations -----------------------------------------------------------------


def test_the_schema_version_is_recorded_and_reopening_is_idempotent(
    tether_store: Any, tether_connect: StoreFactory
) -> None:
    """A second open of the same database keeps the schema version and sees the same data."""
    version = tether_store.schema_version()
    expect(version >= 1, f"schema version {version} is recorded")
    seeded(tether_store)
    again = tether_connect()
    expect_eq(again.schema_version(), version, "schema version after reopening")
    expect_eq(again.get_mark("r").generation, 1, "data seen through the second connection")


def test_a_newer_schema_is_refused(
    tether_store: Any, tether_connect: StoreFactory, request: pytest.FixtureRequest
) -> None:
    """A database migrated by a newer tether is refused with MigrationError on open."""
    try:
        bump: Callable[[], None] = request.getfixturevalue("tether_schema_bump")
    except pytest.FixtureLookupError:
        pytest.skip("define a tether_schema_bump fixture to check newer schemas are refused")
    bump()
    with pytest.raises(MigrationError, match="newer"):
        tether_connect()


# -- inbox ------------------------------------------------------------------------


def test_the_inbox_appends_in_order_and_reads_after_a_cursor(
    tether_store: Any, tether_connect: StoreFactory
) -> None:
    """Evidence gets sequence numbers from 1 per run, reads back whole, and filters by cursor."""
    first = {"body": {"n": 1}, "signer": "a", "alg": "ed25519", "signature": "x"}
    second = {"body": {"n": 2}, "signer": "b", "alg": "ed25519", "signature": "y"}
    expect_eq(tether_store.put_evidence("r", "approval", first), 1, "first seq")
    expect_eq(tether_connect().put_evidence("r", "review_decision", second), 2, "second seq")
    expect_eq(tether_store.put_evidence("other", "approval", first), 1, "seq is per run")
    items = tether_store.evidence("r")
    expect_eq(
        [(i.seq, i.kind, i.document) for i in items],
        [(1, "approval", first), (2, "review_decision", second)],
        "inbox contents",
    )
    expect_eq([i.seq for i in tether_store.evidence("r", after=1)], [2], "read after cursor 1")
    expect_eq(tether_store.evidence("r", after=2), [], "nothing after the last entry")


def test_the_inbox_refuses_unknown_kinds(tether_store: Any) -> None:
    """Only approvals and reviewer decisions may be left for a run."""
    with pytest.raises(StoreError):
        tether_store.put_evidence("r", "order", {"x": 1})
    expect_eq(tether_store.evidence("r"), [], "nothing stored")


# -- driver errors --------------------------------------------------------------


def test_a_closed_store_raises_a_tether_store_error(tether_store: Any) -> None:
    """Using a closed store raises StoreError (the driver's error chained), never a driver error."""
    seeded(tether_store)
    tether_store.close()
    uses: list[Callable[[], object]] = [
        lambda: tether_store.get_mark("r"),
        lambda: tether_store.commit(make_commit("r", 2), 1),
        lambda: tether_store.ledger("r"),
        lambda: tether_store.acquire_lease("r", "w", 5),
    ]
    for use in uses:
        with pytest.raises(TetherError) as caught:
            use()
        expect(isinstance(caught.value, StoreError), f"{caught.value!r} is a StoreError")
        expect(
            type(caught.value).__module__.startswith("tether."),
            f"{type(caught.value)} is tether's, not the driver's",
        )


def test_a_key_age_is_read_on_the_stores_own_clock(tether_store: Any) -> None:
    """A store that keeps time for ledger rows says how old a key's first row is, by its clock."""
    store: Any = tether_store  # narrowed below, but committed to as any store
    if not isinstance(store, KeyClock):
        pytest.skip("this store keeps no time for its ledger rows (tether.store.KeyClock)")
    clock: KeyClock = store
    terms = EffectTerms(
        "ns", "ticket.create", "t", RetrySemantics.QUERYABLE, Compensation.NONE, effect="sha256:e1"
    )
    rows: list[LedgerEntry] = []
    prev = GENESIS_HASH
    for seq, status in enumerate((EffectStatus.INTENDED, EffectStatus.DISPATCHED), start=1):
        row = seal_entry(
            "r",
            seq,
            prev,
            idempotency_key="k1",
            status=status,
            action_id="a1",
            intent_digest="sha256:intent-1",
            receipt=None,
            epoch=1,
            # The rows' own times say nothing to the store: a century off, on purpose.
            at=T0 - timedelta(days=36500),
            terms=terms,
        )
        rows.append(row)
        prev = row.hash
    tether_store.commit(make_commit("r", 1, ledger=rows), 0)
    age = clock.key_age_s("r", "sha256:e1", "k1")
    expect(age is not None and -1.0 <= age < 60.0, f"a key just committed is young ({age})")
    expect(clock.key_age_s("r", "sha256:e1", "k2") is None, "an unknown key has no age")
    expect(clock.key_age_s("r", "sha256:e2", "k1") is None, "another effect's key neither")


__all__ = [
    "StoreFactory",
    "chained",
    "expect",
    "expect_eq",
    "make_commit",
    "make_events",
    "seeded",
    "test_a_closed_store_raises_a_tether_store_error",
    "test_a_digest_that_does_not_address_its_bytes_is_refused",
    "test_a_key_age_is_read_on_the_stores_own_clock",
    "test_a_losing_commit_writes_no_content",
    "test_a_newer_schema_is_refused",
    "test_a_refused_commit_writes_no_ledger_rows",
    "test_a_torn_commit_leaves_nothing",
    "test_a_torn_commit_writes_no_ledger_rows",
    "test_a_torn_content_write_leaves_nothing",
    "test_a_trace_event_cannot_be_rewritten",
    "test_blobs_are_put_write_once_and_refused_unless_addressed",
    "test_cas_creates_a_run_exactly_once",
    "test_cas_mark_alone_follows_the_same_rules",
    "test_cas_refuses_stale_and_skipping_expectations",
    "test_commit_records_the_phase",
    "test_ledger_rows_are_write_once",
    "test_ledger_rows_land_with_their_checkpoint",
    "test_orphan_content_is_unreachable",
    "test_runs_lists_every_mark",
    "test_same_digest_same_bytes_is_accepted",
    "test_the_inbox_appends_in_order_and_reads_after_a_cursor",
    "test_the_inbox_refuses_unknown_kinds",
    "test_the_schema_version_is_recorded_and_reopening_is_idempotent",
    "test_the_trace_walks_back_from_its_head_ignoring_orphans",
    "tether_connect",
    "tether_store",
]
