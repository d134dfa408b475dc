"""The two store protocols and the records they move.

``ContentStore`` keeps what is written once and never changed: sealed
checkpoints (addressed by digest), trace events, effect-ledger entries and
content-addressed blobs. ``GenerationStore`` keeps the one mutable thing, the
high-water mark per run, and moves it only by compare-and-set.

They may be one database (``CommitStore.commit`` moves both in one
transaction) or two (content first, then CAS the mark). Because checkpoints
are addressed by digest and the mark names the digest it accepted, content
written by an attempt whose CAS never happened is simply unreachable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from tether.core import EffectStatus, TraceEvent


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


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One status of one external effect. Entries are appended, never changed."""

    run_id: str
    idempotency_key: str
    seq: int
    status: EffectStatus
    action_id: str
    intent_digest: str
    receipt: dict[str, Any] | None
    epoch: int
    at: datetime


@dataclass(frozen=True, slots=True)
class Commit:
    """Everything one checkpoint advance writes."""

    run_id: str
    generation: int
    checkpoint_digest: str
    envelope: bytes
    events: Sequence[TraceEvent] = ()
    blobs: Mapping[str, bytes] | None = None


BeforeCommit = Callable[[], None]


@runtime_checkable
class ContentStore(Protocol):
    """Write-once content: checkpoints, trace, ledger, blobs."""

    def put_content(self, commit: Commit, before_commit: BeforeCommit | None = None) -> None:
        """Write a commit's content (not the mark) in one transaction."""
        ...

    def get_checkpoint(self, run_id: str, checkpoint_digest: str) -> bytes | None:
        """The sealed envelope stored under ``checkpoint_digest``, or ``None``."""
        ...

    def newest_generation(self, run_id: str) -> int | None:
        """The highest generation of any content written for the run (landed or not)."""
        ...

    def append_ledger(self, *entries: LedgerEntry) -> list[LedgerEntry]:
        """Append effect statuses in one transaction; returns them with sequence numbers.

        The ledger is written only about writes whose pending checkpoint has
        landed, so content orphaned by a crash never leaves ledger entries.
        """
        ...

    def ledger(self, run_id: str, idempotency_key: str | None = None) -> list[LedgerEntry]:
        """Ledger entries of a run (or of one key), oldest first."""
        ...

    def action_seen(self, run_id: str, action_id: str) -> bool:
        """Whether an intent with this action id was ever recorded for the run."""
        ...

    def trace(self, run_id: str, head: str, limit: int | None = None) -> list[TraceEvent]:
        """The chain ending at ``head``, oldest first (the newest ``limit`` if given)."""
        ...

    def get_blob(self, blob_digest: str) -> bytes | None:
        """Content-addressed bytes, or ``None``."""
        ...


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
    ) -> None:
        """Move the mark from ``expected_generation`` (0: create) or raise.

        Raises :class:`~tether.core.GenerationConflictError` when the mark is
        elsewhere, :class:`~tether.core.LeaseError` when the lease moved.
        """
        ...

    def runs(self) -> list[Mark]:
        """Every run's mark."""
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
    ) -> None:
        """Write content and CAS the mark in ONE transaction."""
        ...
