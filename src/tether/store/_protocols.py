"""The two store protocols and the records they move.

``ContentStore`` keeps what is written once and never changed: sealed
checkpoints (addressed by digest), trace events, effect-ledger entries
(hash-chained, written only inside a checkpoint's commit) and
content-addressed blobs. ``GenerationStore`` keeps the one mutable thing, the
high-water mark per run, and moves it only by compare-and-set.

The generation store also keeps each run's lease: who may advance it now
(``lease_owner``), until when (``lease_expires_at``, judged by the STORE's
clock so workers with skewed clocks agree), and the fencing token
(``lease_version``), which every new owner increments. Lease version 0 means
"never leased": single-process use commits with ``expected_lease_version=0``
and never touches leases.

They may be one database (``CommitStore.commit`` moves both in one
transaction) or two (content first, then CAS the mark). Because checkpoints
are addressed by digest and the mark names the digest it accepted, content
written by an attempt whose CAS never happened is simply unreachable.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from tether.core import CheckpointCorruptError, LedgerEntry, TraceEvent
from tether.core._listing import Listing


@dataclass(frozen=True, slots=True)
class Mark:
    """A run's high-water mark: the one checkpoint recovery may accept."""

    run_id: str
    generation: int
    checkpoint_digest: str
    state_version: int
    lease_version: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    phase: str = "running"
    #: Consecutive failed attempts to drive the run (reset by a clean release),
    #: when it may be claimed again, and the last failure's text. A free run's
    #: ``retry_at`` is when it becomes claimable: the instant it was created free
    #: or let go, or the end of a back-off (``defer``; a wait's floor); a time
    #: in the past is not by itself a failure (``attempts`` counts those).
    #: ``None`` (a claim clears it): once free, claimable "since ever", as after
    #: ``retry_now`` or on a row written before creation set it.
    attempts: int = 0
    retry_at: datetime | None = None
    last_error: str | None = None
    #: Set while the run waits for a person: the inbox entry it had read last.
    waiting_after: int | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's claim on a run: ``lease_version`` is the fencing token to pass on.

    ``expires_at`` is by the store's clock; renew well before it (a third of
    the ttl is a good cadence). ``state_version`` and ``generation`` are the
    mark's at the moment the lease was granted.
    """

    run_id: str
    owner: str
    lease_version: int
    expires_at: datetime
    state_version: int
    generation: int


@dataclass(frozen=True, slots=True)
class Evidence:
    """A signed document left in a run's inbox: an approval or a reviewer decision."""

    run_id: str
    seq: int
    kind: str
    document: dict[str, Any]
    received_at: datetime


EVIDENCE_KINDS = frozenset(
    {"approval", "review_decision", "effect_decision", "fork", "rewind", "admission", "cancel"}
)


@dataclass(frozen=True, slots=True)
class Commit:
    """Everything one checkpoint advance writes."""

    run_id: str
    generation: int
    checkpoint_digest: str
    envelope: bytes
    events: Sequence[TraceEvent] = ()
    blobs: Mapping[str, bytes] | None = None
    phase: str = "running"
    #: Effect-ledger entries, sealed into the run's chain; they land with the
    #: checkpoint or not at all, under the same compare-and-set.
    ledger: Sequence[LedgerEntry] = ()
    #: What a list of runs shows of the state committed, kept with the mark
    #: (``None``: nothing; a list then reads the checkpoint itself).
    listing: Listing | None = None


BeforeCommit = Callable[[], None]


@dataclass(frozen=True, slots=True)
class ListedRun:
    """One run as a page of the runs list reads it: its mark, its last commit, its listing.

    ``listing`` is ``None`` for a run last committed without one (by an older
    tether, or a caller that records none): its checkpoint says the rest.
    """

    mark: Mark
    updated_at: datetime
    listing: Listing | None
    #: The sealed checkpoint the mark names, when the page was asked for it.
    envelope: bytes | None = None


@dataclass(frozen=True, slots=True)
class MarksPage:
    """One page of runs by run id, and where the next one starts.

    ``after`` is the run id to pass for the next page (``None``: this was
    the last). Rows too damaged to read are in ``damaged``, never dropped.
    """

    runs: tuple[ListedRun, ...]
    damaged: tuple[CheckpointCorruptError, ...] = ()
    after: str | None = None


@runtime_checkable
class ContentStore(Protocol):
    """Write-once content: checkpoints, trace, ledger, blobs."""

    def put_content(self, commit: Commit, before_commit: BeforeCommit | None = None) -> None:
        """Write a commit's content (not the mark) in one transaction."""
        ...

    def get_checkpoint(self, run_id: str, checkpoint_digest: str) -> bytes | None:
        """The sealed envelope stored under ``checkpoint_digest``, or ``None``."""
        ...

    def envelopes(self, run_id: str, generation: int | None = None) -> list[bytes]:
        """Every sealed envelope stored for the run (of one ``generation``), landed or not.

        Rarely needed: orphan proofs, and a rewind looking up its target.
        """
        ...

    def newest_generation(self, run_id: str) -> int | None:
        """The highest generation of any content written for the run (landed or not)."""
        ...

    def ledger(self, run_id: str) -> list[LedgerEntry]:
        """Every effect-ledger row the store holds for the run, by sequence number.

        Unverified: rows are trusted only after
        :func:`tether.core.verify_ledger` chained them to a signed head.
        """
        ...

    def ledger_between(self, run_id: str, low: int, high: int | None = None) -> list[LedgerEntry]:
        """The run's ledger rows with ``low <= seq <= high`` (``None``: no bound), by seq.

        Every row the store holds in that range, on the chain or not: what a
        recovery reads near the signed head, strays included. Unverified.
        """
        ...

    def ledger_for_effect(self, run_id: str, effect: str) -> list[LedgerEntry]:
        """The run's ledger rows whose terms name effect digest ``effect``, by seq.

        Found by index (one effect, whatever the ledger's length); unverified:
        the caller proves each on the signed chain before using it.
        """
        ...

    def ledger_on_target(
        self, run_id: str, target: str, *, below: int | None = None, limit: int = 8
    ) -> list[LedgerEntry]:
        """The run's newest rows on ``target`` past their intent, newest first: at most ``limit``.

        ``target`` is a target digest (``EffectTerms.target_key``); rows with
        seq below ``below`` only (``None``: no bound). Found by index (one
        probe, whatever the ledger's length); unverified, strays included:
        the caller proves each on the signed chain before using it.
        """
        ...

    def ledger_chain(
        self, run_id: str, head: str, limit: int | None = None, *, before: int | None = None
    ) -> list[LedgerEntry]:
        """The ledger's chain ending at ``head``, oldest first: a page of it.

        Rows below seq ``before`` only (``None``: from the head), the newest
        ``limit`` of them; reached by their links from ``head``. Unverified.
        """
        ...

    def action_seen(self, run_id: str, action_id: str) -> bool:
        """Whether an intent with this action id was ever recorded for the run."""
        ...

    def trace(
        self, run_id: str, head: str, limit: int | None = None, *, before: int | None = None
    ) -> list[TraceEvent]:
        """The chain ending at ``head``, oldest first (the newest ``limit`` if given).

        ``before``: only events below that seq (still reached by their links
        from ``head``), so a page deep in a long trace is one request.
        """
        ...

    def trace_between(self, run_id: str, low: int, high: int | None = None) -> list[TraceEvent]:
        """The run's trace rows with ``low <= seq <= high`` (``None``: no bound), by seq.

        Every row held in the range, on the chain or not (a page deep in a long
        trace, read by index). Unverified.
        """
        ...

    def trace_for_action(self, run_id: str, action_id: str) -> list[TraceEvent]:
        """Events of the run, on any chain, that record ``action_id`` as taken; by seq, unverified."""
        ...

    def trace_landmarks(
        self, run_id: str, kinds: Collection[str], *, head: str | None = None
    ) -> list[TraceEvent]:
        """Events of the run of the landmark ``kinds`` (a handful per run), by seq; unverified.

        Landmarks are starts, recoveries, rewinds and refused documents (see
        ``tether.store.LANDMARK_KINDS``). Without ``head``: every such row held,
        by index, on any chain; with it: those on the chain ending at ``head``.
        """
        ...

    def get_blob(self, blob_digest: str) -> bytes | None:
        """Content-addressed bytes, or ``None``."""
        ...

    def put_blobs(self, blobs: Mapping[str, bytes]) -> None:
        """Store content-addressed bytes write-once, in one transaction.

        Each key must be ``sha256:<hex>`` of its bytes; otherwise nothing is
        written and :class:`~tether.core.WriteOnceError` is raised. A blob
        already present is left as it is (same digest, same bytes).
        """
        ...

    def has_blob(self, blob_digest: str) -> bool:
        """Whether bytes are stored under ``blob_digest``."""
        ...

    def stored_blobs(self, blob_digests: Collection[str]) -> set[str]:
        """Which of ``blob_digests`` have bytes stored: one round trip for many."""
        ...

    def put_evidence(self, run_id: str, kind: str, document: dict[str, Any]) -> int:
        """Append signed evidence to the run's inbox; returns its sequence number (from 1).

        A run waiting for a person (see ``GenerationStore.wait_for_evidence``)
        in the same database is claimable again from this commit on.
        """
        ...

    def evidence(self, run_id: str, after: int = 0) -> list[Evidence]:
        """Inbox entries of the run with a sequence number above ``after``, oldest first."""
        ...


@runtime_checkable
class KeyClock(Protocol):
    """A content store that records, on its own clock, when it took each ledger row.

    Optional: a store without it has a key's age judged by the runtime's
    clock plus a skew margin (``tether.core._retention``). Both SQL stores
    have it.
    """

    def key_age_s(self, run_id: str, effect: str, key: str) -> float | None:
        """Seconds, by the store's clock, since it recorded ``key``'s first row of ``effect``.

        ``None`` when it holds no such row with a recorded time.
        """
        ...


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """Create a run already leased: to ``owner``, for ``ttl_s`` seconds by the store's clock."""

    owner: str
    ttl_s: float


@runtime_checkable
class GenerationStore(Protocol):
    """The high-water mark per run, moved only by compare-and-set."""

    def get_mark(self, run_id: str) -> Mark | None:
        """The run's mark, or ``None`` when the store has never seen the run."""
        ...

    def cas_mark(
        self,
        run_id: str,
        expected_generation: int,
        new_generation: int,
        checkpoint_digest: str,
        expected_lease_version: int = 0,
        *,
        phase: str = "running",
        lease_to: LeaseRequest | None = None,
        listing: Listing | None = None,
    ) -> Lease | None:
        """Move the mark from ``expected_generation`` (0: create) and record ``phase``, or raise.

        ``listing`` is recorded with the mark, replacing the one before
        (``None`` records none: a list reads the checkpoint for that run).

        ``lease_to`` (allowed for the first generation only) creates the run
        with its lease in the same statement, version 1, and returns it, so no
        claim can take a run between its creation and its first holder.

        Raises :class:`~tether.core.GenerationConflictError` when the mark is
        elsewhere, :class:`~tether.core.LeaseLostError` when the lease version
        is not the current one (taken over, or released). A lease that expired
        but that nobody took over still commits: the version check is what
        fences, and nobody else can have advanced the run.
        """
        ...

    def runs(self, *, damaged: list[CheckpointCorruptError] | None = None) -> list[Mark]:
        """Every run's mark; a malformed row raises, or goes into ``damaged`` when given."""
        ...

    def runs_page(
        self,
        *,
        after: str | None = None,
        limit: int = 50,
        phase: str | None = None,
        needs_person_at: datetime | None = None,
        envelopes: bool = False,
    ) -> MarksPage:
        """Up to ``limit`` runs with a run id after ``after``, by run id: one indexed read.

        ``phase`` keeps the runs in that phase; ``needs_person_at`` keeps the
        runs that wait for a person at that moment (by the rules of
        :mod:`tether.core.listing_rules`), and those recorded without a listing,
        which only their checkpoint can answer for. ``envelopes`` also reads the
        checkpoint each mark names (when the marks and the content share a
        database).
        """
        ...

    def acquire_lease(self, run_id: str, worker: str, ttl_s: float) -> Lease:
        """Take the run's lease for ``ttl_s`` seconds of the store's clock.

        Succeeds when the run is unowned, its lease expired, or ``worker``
        already holds it. Every acquire increments ``lease_version``, even by
        the same worker id, so a restarted worker fences out its own hung
        predecessor; only :meth:`renew_lease` extends a lease. Raises
        :class:`~tether.core.LeaseHeldError` when another worker holds a live
        lease, :class:`~tether.core.RunNotFoundError` for an unknown run.
        """
        ...

    def renew_lease(self, run_id: str, worker: str, lease_version: int, ttl_s: float) -> Lease:
        """Extend the lease to ``ttl_s`` from now if ``worker`` still holds ``lease_version``.

        An expired lease renews as long as nobody took it over. Otherwise
        raises :class:`~tether.core.LeaseLostError`.
        """
        ...

    def release_lease(self, run_id: str, worker: str, lease_version: int) -> None:
        """Give the lease up so another worker may claim the run at once.

        Releasing an already released lease of the same version is a no-op;
        releasing a lease that another worker has taken over raises
        :class:`~tether.core.LeaseLostError`, because the caller's last
        actions may have been superseded.
        """
        ...

    def note_progress(self, run_id: str, worker: str, lease_version: int) -> None:
        """Record that ``worker``'s claim at ``lease_version`` got a step done.

        :meth:`claim_expired` counted the claim in ``Mark.attempts`` before
        anything ran; a claim that made progress ends a run of failures, so
        the count restarts at it (1). A no-op when the lease was taken over.
        """
        ...

    def defer(
        self,
        run_id: str,
        worker: str,
        lease_version: int,
        delay_s: float,
        error: str,
        *,
        count: bool = True,
        progressed: bool = False,
    ) -> Mark:
        """Give the lease up after a failure: no claim takes the run for ``delay_s``.

        :meth:`claim_expired` counts every claim in ``Mark.attempts``; a clean
        :meth:`release_lease` or :meth:`wait_for_evidence` resets it, so it
        counts consecutive claims that ended badly (a worker that died
        included), and :meth:`note_progress` restarts it at a claim that got a
        step done. ``count=False`` uncounts this one (not a failure: the
        adapter said "in flight"); ``progressed`` restarts the count at this
        failure. Keeps ``error``. Raises :class:`~tether.core.LeaseLostError`
        unless ``worker`` holds ``lease_version``.
        """
        ...

    def wait_for_evidence(
        self, run_id: str, worker: str, lease_version: int, seen: int, floor_s: float
    ) -> None:
        """Give the lease up while the run waits for a person; no claim takes it meanwhile.

        ``seen`` is the last inbox entry the run has read: evidence past it (an
        approval, a reviewer decision) makes the run claimable again, but not
        before ``floor_s``; evidence already past it leaves the run claimable
        (it does not wait). :meth:`ContentStore.put_evidence` wakes a waiting
        run as its evidence lands, so a claim never reads inboxes. Raises
        :class:`~tether.core.LeaseLostError` unless ``worker`` holds
        ``lease_version``.
        """
        ...

    def check_lease(self, run_id: str, lease_version: int) -> None:
        """Refuse to act on a lease that is no longer current or live (call before every effect).

        Raises :class:`~tether.core.LeaseLostError` when the version moved or
        the lease was released, :class:`~tether.core.LeaseExpiredError` when it
        expired by the store's clock. Version 0 passes only while the run has
        never been leased.
        """
        ...

    def claim_expired(
        self,
        worker: str,
        ttl_s: float,
        limit: int = 1,
        phases: Sequence[str] = ("running", "pending"),
        max_attempts: int | None = None,
        suspects: bool | None = None,
    ) -> list[Lease]:
        """Atomically take up to ``limit`` runs in ``phases`` whose lease is unowned or expired.

        Each claim increments the run's lease version. Concurrent claimers never
        get the same run. A deferred run is skipped until its ``retry_at``, and
        one with ``max_attempts`` failed attempts or more is not taken at all
        (parked); the run claimable longest comes first (a run created free is
        claimable from its creation, by the store's clock). A claim whose lease ran
        out unreleased is no failure if the run's generation moved past what a
        recovery commits of its own since it was taken (``core.failed_claims``).
        ``suspects``: ``True`` takes only runs whose last claim ended uncleanly
        (lease run out unreleased, counted), ``False`` only the others.
        """
        ...


@runtime_checkable
class CommitStore(ContentStore, GenerationStore, Protocol):
    """Both protocols in one database: a commit moves content and mark atomically."""

    def commit(
        self,
        commit: Commit,
        expected_generation: int,
        expected_lease_version: int = 0,
        before_commit: BeforeCommit | None = None,
        *,
        lease_to: LeaseRequest | None = None,
    ) -> Lease | None:
        """Write content and CAS the mark (recording ``commit.phase``) in ONE transaction.

        ``lease_to`` is as for :meth:`GenerationStore.cas_mark`.

        The CAS is on (generation, lease version), with the errors of
        :meth:`GenerationStore.cas_mark`; if ``before_commit`` raises, nothing
        lands.
        """
        ...
