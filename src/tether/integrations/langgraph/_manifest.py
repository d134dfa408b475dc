"""The sealed list of a thread's latest pending writes, kept on its high-water mark.

LangGraph resumes a thread from its latest checkpoint and skips every task
whose writes are stored as pending writes of it: a node that ran and whose
write was then deleted runs again, effect and all. Each write row is sealed,
but a deleted row leaves nothing behind to verify. So the mark (the one row
that names the latest checkpoint) carries a sealed manifest of that
checkpoint's writes: each ``(task_id, idx)`` with the digest of its row's
envelope, updated in the same transaction as the rows (and, when a put
moves the mark, holding the writes LangGraph stored for that checkpoint
first: its background puts run side by side). A read of the latest
checkpoint compares the rows with it; a write missing, or holding another
envelope than the one recorded, is refused (:class:`PendingWriteMissingError`).

A mark written before the manifest existed holds none (``NULL``): its
writes are read as before, and the first write the saver stores for it
adopts the rows then present.

What it does not prove: the manifest binds no counter of its own, so an
older manifest of the SAME checkpoint, sealed before a later write was
listed and put back on the mark by someone with write access to the
database, hides a deletion of that later write. (Putting back an older
mark, naming an older checkpoint, is refused: the thread's rows betray it.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tether.core import CheckpointCorruptError, StoreError, canonical_bytes
from tether.crypto import Keyring, envelope_digest, seal
from tether.integrations.langgraph._errors import PendingWriteMissingError
from tether.integrations.langgraph._seal import bind_field, int_field, open_payload, text_field

WRITES_FORMAT = "tether.langgraph.writes.v1"
_FIELDS = frozenset({"format", "thread_id", "checkpoint_ns", "checkpoint_id", "writes"})

#: ``(task_id, idx)`` -> the digest of the stored row's envelope.
Entries = dict[tuple[str, int], str]


@dataclass(frozen=True, slots=True)
class WritesManifest:
    """The pending writes the saver stored for one checkpoint, as sealed on its mark."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    entries: Entries

    def seal(self, keyring: Keyring) -> bytes:
        """The sealed envelope the mark's ``writes`` column holds."""
        writes = [[task, idx, digest] for (task, idx), digest in sorted(self.entries.items())]
        payload = {
            "format": WRITES_FORMAT,
            "thread_id": self.thread_id,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
            "writes": writes,
        }
        return seal(canonical_bytes(payload), keyring)

    def with_rows(self, rows: Iterable[tuple[str, int, str]]) -> WritesManifest:
        """This manifest with each ``(task_id, idx, envelope digest)`` recorded (or replaced)."""
        entries = dict(self.entries)
        entries.update({(task, idx): digest for task, idx, digest in rows})
        return WritesManifest(self.thread_id, self.checkpoint_ns, self.checkpoint_id, entries)

    def check(self, rows: Iterable[tuple[str, int, str]]) -> None:
        """Refuse stored rows that lack a write recorded here, or hold another envelope for it.

        A row recorded nowhere here is sealed like every write (bound to this
        checkpoint and task), so only the saver wrote it: one LangGraph stored
        beside the put that moved the mark. It is a real write, read as one.
        """
        stored = {(task, idx): digest for task, idx, digest in rows}
        for key, digest in sorted(self.entries.items()):
            found = stored.get(key)
            if found != digest:
                raise PendingWriteMissingError(
                    thread_id=self.thread_id,
                    checkpoint_ns=self.checkpoint_ns,
                    checkpoint_id=self.checkpoint_id,
                    task_id=key[0],
                    idx=key[1],
                    found="gone" if found is None else "altered",
                )


def empty(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> WritesManifest:
    """The manifest of a checkpoint just put: no writes yet."""
    return WritesManifest(thread_id, checkpoint_ns, checkpoint_id, {})


def open_manifest(
    envelope: bytes, keyring: Keyring, *, thread_id: str, checkpoint_ns: str, checkpoint_id: str
) -> WritesManifest:
    """Verify the manifest read from the mark that names ``checkpoint_id``."""
    doc = open_payload(envelope, keyring, thread_id, WRITES_FORMAT, _FIELDS)
    writes = doc["writes"]
    if not isinstance(writes, list):
        raise CheckpointCorruptError("the writes manifest holds no list", run_id=thread_id)
    entries: Entries = {}
    for item in writes:
        if not isinstance(item, list) or len(item) != 3:
            raise CheckpointCorruptError("a writes manifest entry is malformed", run_id=thread_id)
        entry = {"task": item[0], "idx": item[1], "digest": item[2]}
        entries[(text_field(entry, "task", thread_id), int_field(entry, "idx", thread_id))] = (
            text_field(entry, "digest", thread_id)
        )
    for what, expected in (
        ("thread_id", thread_id),
        ("checkpoint_ns", checkpoint_ns),
        ("checkpoint_id", checkpoint_id),
    ):
        bind_field(thread_id, (what, expected, text_field(doc, what, thread_id)))
    return WritesManifest(thread_id, checkpoint_ns, checkpoint_id, entries)


def record(
    tx: Any,
    keyring: Keyring,
    ids: tuple[str, str, str],
    seq: int,
    sealed: bytes | None,
    stored: Iterable[tuple[str, int, str]],
) -> None:
    """Add the rows just stored to the manifest on the mark naming ``ids``'s checkpoint (at ``seq``).

    ``tx`` is the saver's unit of work, holding the mark's row. A mark from
    before manifests (``sealed`` is ``None``) adopts the rows then stored.
    """
    thread_id, ns, checkpoint_id = ids
    if sealed is None:
        rows = tx.all(
            "SELECT task_id, idx, envelope FROM tether_lg_writes WHERE thread_id = ? AND "
            "checkpoint_ns = ? AND checkpoint_id = ?",
            (thread_id, ns, checkpoint_id),
        )
        known = empty(*ids).with_rows(listed(rows, thread_id))
    else:
        opened = open_manifest(
            sealed, keyring, thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
        )
        known = opened.with_rows(stored)
    moved = tx.run(
        "UPDATE tether_lg_marks SET writes = ? WHERE thread_id = ? AND checkpoint_ns = ? "
        "AND checkpoint_id = ? AND seq = ?",
        (known.seal(keyring), thread_id, ns, checkpoint_id, seq),
    )
    if moved != 1:  # this transaction holds the row: a store that lost it
        raise StoreError(f"thread {thread_id!r}: its mark moved while writes were stored")


def listed(rows: Sequence[Sequence[Any]], thread_id: str) -> list[tuple[str, int, str]]:
    """``(task_id, idx, envelope)`` rows as a manifest lists them (the envelope's digest)."""
    out = []
    for task_id, idx, envelope in rows:
        if not isinstance(task_id, str) or isinstance(idx, bool) or not isinstance(idx, int):
            raise CheckpointCorruptError(f"thread {thread_id!r}: a write's key is damaged")
        if not isinstance(envelope, bytes | bytearray | memoryview):
            raise CheckpointCorruptError(f"thread {thread_id!r}: a write's envelope is not bytes")
        out.append((task_id, idx, envelope_digest(bytes(envelope))))
    return out
