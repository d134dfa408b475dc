"""TetherSaver: a LangGraph checkpoint saver on tether's SQLite and PostgreSQL stores.

What it adds to a plain LangGraph saver:

- every checkpoint and every pending write is sealed with the keyring's HMAC
  (:func:`tether.crypto.seal`) and verified on every read; a tampered row, a
  wrong key or a missing key raises an :class:`~tether.core.IntegrityError`;
- a high-water mark per (thread_id, checkpoint_ns) names the one checkpoint
  "latest" may return; a deleted newest row, an older row put back under the
  newest id, or rows stored past the mark are refused
  (:class:`CheckpointRollbackError`), never served as an older state;
- ``put`` is a compare-and-set from the parent checkpoint its config names to
  the new one, in ONE store transaction with the content; a second writer
  from the same parent loses with :class:`ThreadConflictError`;
- pending writes are keyed by (task_id, idx): the same value again is a
  no-op, another value is :class:`PendingWriteConflictError`; the latest
  checkpoint's writes are listed in a sealed manifest on its mark
  (:mod:`tether.integrations.langgraph._manifest`), so a deleted one is
  refused (:class:`PendingWriteMissingError`), never a task run again.

Time travel: a checkpoint asked for by id is served only when its sealed
lineage is the thread's current one and its sealed position is at or below
the mark (with CAS puts the thread's checkpoints form one chain, so that is
"on the chain below the mark"). Writing from an older checkpoint (a fork in
place) is refused like any stale parent.

The async methods run the sync ones in a worker thread
(:func:`asyncio.to_thread`): tether's stores are synchronous, and a SQLite
store serializes its connection with a lock anyway.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from tether.core import CheckpointCorruptError, StoreError
from tether.crypto import Keyring, envelope_digest
from tether.integrations.langgraph import _manifest as manifests
from tether.integrations.langgraph._errors import (
    CheckpointRollbackError,
    PendingWriteConflictError,
    ThreadConflictError,
)
from tether.integrations.langgraph._rows import BATCH, Mark, SaverRows, text
from tether.integrations.langgraph._seal import (
    CheckpointSeal,
    Typed,
    WriteSeal,
    check_value,
    open_checkpoint,
    open_write,
    seal_checkpoint,
    seal_write,
    value_digest,
)
from tether.store import SQLBase, SQLStatements, open_store


class TetherSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer whose checkpoints are sealed, rollback-checked and CAS-written.

    ``store`` is a tether SQL store (:func:`tether.store.open_store`);
    ``keyring`` seals and verifies. ``strict_parent=True`` also refuses a put
    that names no parent on a thread that already has checkpoints (LangGraph
    itself never does that; the conformance suite does, so the default
    accepts it as a new head of the same chain, still in one CAS).
    """

    def __init__(
        self,
        store: SQLBase,
        keyring: Keyring,
        *,
        serde: SerializerProtocol | None = None,
        strict_parent: bool = False,
    ) -> None:
        if serde is None:
            serde = JsonPlusSerializer(pickle_fallback=False)
        if getattr(serde, "pickle_fallback", False):
            raise StoreError("TetherSaver refuses a serializer with pickle_fallback enabled")
        super().__init__(serde=serde)
        self.store = store
        self.keyring = keyring
        self.strict_parent = strict_parent
        self._owns_store = False
        self._rows = SaverRows(store)
        #: The last manifest this saver sealed: (keyring, envelope, manifest).
        self._memo: tuple[Keyring, bytes, manifests.WritesManifest] | None = None

    @classmethod
    def from_url(cls, url: str, keyring: Keyring, **kwargs: Any) -> TetherSaver:
        """Open the store a URL names (``sqlite:///...``, ``postgresql://...``); close() closes it."""
        saver = cls(open_store(url), keyring, **kwargs)
        saver._owns_store = True
        return saver

    def close(self) -> None:
        """Close the store if this saver opened it (from_url)."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> TetherSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- put -----------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Seal ``checkpoint`` and move the thread's mark to it from the config's parent (CAS)."""
        thread_id, ns, parent = _ids(config)
        head = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        blobs: dict[str, Typed] = {}
        channels: dict[str, str] = {}
        # Every channel's digest goes into the seal; a channel that did not
        # change serializes to the bytes already stored and inserts nothing.
        for name, value in checkpoint["channel_values"].items():
            typed = self._dump(value)
            digest = value_digest(*typed)
            channels[name] = digest
            blobs[digest] = typed
        head_typed = self._dump(head)
        meta_typed = self._dump(get_checkpoint_metadata(config, metadata))
        checkpoint_id = str(checkpoint["id"])

        def body(tx: SQLStatements) -> None:
            # The mark's row first (held on PostgreSQL), as put_writes takes it: the
            # writes adopted below are then all that were stored before.
            mark = self._rows.hold_mark(tx, thread_id, ns)
            if mark is None:
                if parent is not None:
                    raise ThreadConflictError(
                        thread_id=thread_id, checkpoint_ns=ns, expected=parent, actual=None
                    )
                seq, lineage = 1, uuid.uuid4().hex
            else:
                if parent != mark.checkpoint_id and (parent is not None or self.strict_parent):
                    # Two or more behind the mark cannot be a writer that raced this
                    # one from the same parent: it is a replay from history.
                    row = tx.one(
                        "SELECT seq FROM tether_lg_checkpoints WHERE thread_id = ? AND "
                        "checkpoint_ns = ? AND checkpoint_id = ?",
                        (thread_id, ns, parent),
                    )
                    older = row is not None and isinstance(row[0], int) and row[0] < mark.seq - 1
                    raise ThreadConflictError(
                        thread_id=thread_id,
                        checkpoint_ns=ns,
                        expected=parent,
                        actual=mark.checkpoint_id,
                        older=older,
                    )
                seq, lineage = mark.seq + 1, mark.lineage
            envelope = seal_checkpoint(
                CheckpointSeal(
                    thread_id=thread_id,
                    checkpoint_ns=ns,
                    checkpoint_id=checkpoint_id,
                    parent_id=parent,
                    seq=seq,
                    lineage=lineage,
                    head=head_typed,
                    metadata=meta_typed,
                    channels=channels,
                ),
                self.keyring,
            )
            digest = envelope_digest(envelope)
            ids = (thread_id, ns, checkpoint_id)
            # Writes LangGraph stored for this checkpoint before it (its background
            # puts run side by side) are adopted: from now on, each must stay.
            # Mostly there are none, so the mark first gets the empty manifest.
            known = manifests.empty(*ids)
            rows = [(d, kind, raw) for d, (kind, raw) in blobs.items()]
            if mark is None:
                early = self._rows.early_writes(tx, ids)
                writes = self._seal_manifest(known.with_rows(manifests.listed(early, thread_id)))
                moved = self._rows.first_mark(
                    tx, ids, (digest, seq, lineage, writes), envelope, rows
                )
                stored = 0
            else:
                writes = self._seal_manifest(known)
                moved, stored = self._rows.move_mark(
                    tx, ids, mark, (digest, seq, writes), envelope, rows
                )
            if moved != 1:
                now = self._rows.mark(tx, thread_id, ns)
                raise ThreadConflictError(
                    thread_id=thread_id,
                    checkpoint_ns=ns,
                    expected=parent,
                    actual=None if now is None else now.checkpoint_id,
                )
            if stored:
                early = self._rows.early_writes(tx, ids)
                adopted = self._seal_manifest(known.with_rows(manifests.listed(early, thread_id)))
                if self._rows.set_manifest(tx, ids, (adopted, seq)) != 1:
                    raise StoreError(f"thread {thread_id!r}: its mark moved while it was held")

        self.store.transaction(body)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    # -- pending writes ------------------------------------------------------

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes, keyed by (task_id, idx): same value again is a no-op.

        A different value under a regular key raises
        :class:`PendingWriteConflictError`. LangGraph's special channels
        (error, interrupt, resume, scheduled) are re-recorded by the runtime
        for a retried task, so a new value replaces the old one, as in
        LangGraph's own savers, sealed like any other write.
        """
        thread_id, ns, checkpoint_id = _ids(config)
        if checkpoint_id is None:
            raise StoreError("put_writes needs a config that names its checkpoint_id")
        prepared = []
        for position, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, position)
            kind, raw = self._dump(value)
            sealed = WriteSeal(
                thread_id=thread_id,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                idx=idx,
                channel=channel,
                task_path=task_path,
                value=value_digest(kind, raw),
            )
            prepared.append((sealed, kind, raw, seal_write(sealed, self.keyring)))

        ids = (thread_id, ns, checkpoint_id)
        rows = [(*ids, task_id, s.idx, kind, raw, env) for s, kind, raw, env in prepared]

        def body(tx: SQLStatements) -> None:
            # The mark's row is held: concurrent writes of one checkpoint's tasks then
            # update its manifest one after another.
            stored = [(task_id, s.idx, envelope_digest(env)) for s, _, _, env in prepared]
            opened = None
            recorded = False
            if self._rows.fused and 0 < len(rows) <= BATCH:
                # One round trip for the hold and the rows; the manifest, when this
                # is the latest checkpoint, in a second.
                mark, inserted = self._rows.hold_and_insert(tx, rows)
                latest = mark is not None and mark.checkpoint_id == checkpoint_id
                if mark is not None and latest and mark.writes is not None:
                    opened = self._open_manifest(mark.writes, ids)
            else:
                mark = self._rows.hold_mark(tx, thread_id, ns)
                # The latest checkpoint's writes are what a resume reads: they go in
                # its manifest. An older one's (the thread moved on) are no longer.
                latest = mark is not None and mark.checkpoint_id == checkpoint_id
                planned = None
                if mark is not None and latest and mark.writes is not None:
                    opened = self._open_manifest(mark.writes, ids)
                    # Sealed before the insert, for nearly every case: every row new.
                    planned = (self._seal_manifest(opened.with_rows(stored)), mark.seq)
                inserted, recorded = self._rows.insert_writes(tx, ids, rows, planned)
            if inserted != len(rows):
                stored = self._settle_writes(tx, ids, task_id, prepared)
            if mark is None or not latest or recorded:
                return
            if opened is None:  # a mark from before manifests: adopt what is stored
                manifests.record(tx, self.keyring, ids, mark.seq, None, stored)
                return
            sealed = self._seal_manifest(opened.with_rows(stored))
            if self._rows.set_manifest(tx, ids, (sealed, mark.seq)) != 1:
                # This transaction holds the row: a store that lost it.
                raise StoreError(f"thread {thread_id!r}: its mark moved while writes were stored")

        self.store.transaction(body)

    def _settle_writes(
        self,
        tx: SQLStatements,
        ids: tuple[str, str, str],
        task_id: str,
        prepared: Sequence[tuple[WriteSeal, str, bytes, bytes]],
    ) -> builtins.list[tuple[str, int, str]]:
        """Settle writes whose key was taken; ``(task_id, idx, envelope digest)`` as now stored.

        The same value again is a no-op; a special channel's new value replaces
        the old; any other value is a :class:`PendingWriteConflictError`.
        """
        thread_id, ns, checkpoint_id = ids
        current = self._rows.stored_writes(tx, ids, task_id, sorted({s.idx for s, *_ in prepared}))
        stored = []
        for sealed, kind, raw, envelope in prepared:
            row = current.get(sealed.idx)
            if row is None:  # deleted between the two statements: refuse, never guess
                raise StoreError(f"thread {thread_id!r}: a pending write vanished mid-write")
            kept_bytes = bytes(row) if isinstance(row, bytes | bytearray | memoryview) else row
            if kept_bytes == envelope:  # this row, inserted just now (or sealed alike before)
                stored.append((task_id, sealed.idx, envelope_digest(envelope)))
                continue
            kept = open_write(
                kept_bytes,
                self.keyring,
                thread_id=thread_id,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                idx=sealed.idx,
            )
            if kept.channel == sealed.channel and kept.value == sealed.value:
                stored.append((task_id, sealed.idx, envelope_digest(kept_bytes)))
                continue
            if sealed.channel in WRITES_IDX_MAP and kept.channel == sealed.channel:
                tx.run(
                    "UPDATE tether_lg_writes SET kind = ?, body = ?, envelope = ? "
                    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? "
                    "AND task_id = ? AND idx = ?",
                    (kind, raw, envelope, *ids, task_id, sealed.idx),
                )
                current[sealed.idx] = envelope
                stored.append((task_id, sealed.idx, envelope_digest(envelope)))
                continue
            raise PendingWriteConflictError(
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                idx=sealed.idx,
            )
        return stored

    def _seal_manifest(self, manifest: manifests.WritesManifest) -> bytes:
        sealed = manifest.seal(self.keyring)
        self._memo = (self.keyring, sealed, manifest)
        return sealed

    def _open_manifest(self, sealed: bytes, ids: tuple[str, str, str]) -> manifests.WritesManifest:
        """Verify the manifest on the mark naming ``ids``, unless it is the one this saver just sealed.

        Bytes equal to those this saver sealed under this keyring are
        authentic by construction: the mark is usually the one the last put or
        put_writes left, so the next put_writes skips the verify (one HMAC and
        one strict JSON parse).
        """
        memo = self._memo
        if memo is not None and memo[0] is self.keyring and memo[1] == sealed:
            known = memo[2]
            if (known.thread_id, known.checkpoint_ns, known.checkpoint_id) == ids:
                return known
        thread_id, ns, checkpoint_id = ids
        return manifests.open_manifest(
            sealed, self.keyring, thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
        )

    # -- reads ---------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The thread's latest checkpoint (the one its mark names), or the one asked for by id."""
        thread_id, ns, checkpoint_id = _ids(config)
        return self.store.read(lambda tx: self._load(tx, thread_id, ns, checkpoint_id))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by id), each verified against its thread's mark."""
        where: list[str] = []
        params: list[Any] = []
        if config is not None:
            conf = config.get("configurable", {})
            if conf.get("thread_id") is not None:
                where.append("thread_id = ?")
                params.append(str(conf["thread_id"]))
            if conf.get("checkpoint_ns") is not None:
                where.append("checkpoint_ns = ?")
                params.append(str(conf["checkpoint_ns"]))
            if conf.get("checkpoint_id") is not None:
                where.append("checkpoint_id = ?")
                params.append(str(conf["checkpoint_id"]))
        if before is not None and before.get("configurable", {}).get("checkpoint_id"):
            where.append("checkpoint_id < ?")
            params.append(str(before["configurable"]["checkpoint_id"]))
        sql = "SELECT thread_id, checkpoint_ns, checkpoint_id FROM tether_lg_checkpoints"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY checkpoint_id DESC"
        if limit is not None and not filter:
            sql += f" LIMIT {int(limit)}"
        keys = self.store.read(lambda tx: tx.all(sql, params))
        yielded = 0
        heads: set[tuple[str, str]] = set()
        for thread_id, ns, checkpoint_id in keys:
            if limit is not None and yielded >= limit:
                return
            key = (text(thread_id, "thread_id"), text(ns, "checkpoint_ns"))
            if key not in heads:
                # A history whose newest entry was deleted is a rollback too.
                self.store.read(functools.partial(self._check_head, thread_id=key[0], ns=key[1]))
                heads.add(key)
            found = self._load_one(*key, text(checkpoint_id, "checkpoint_id"))
            if found is None:
                continue  # deleted since the scan
            if filter and not all(found.metadata.get(k) == v for k, v in filter.items()):
                continue
            yielded += 1
            yield found

    def _load_one(self, thread_id: str, ns: str, checkpoint_id: str) -> CheckpointTuple | None:
        return self.store.read(lambda tx: self._load(tx, thread_id, ns, checkpoint_id))

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write, blob and mark of the thread (all namespaces)."""

        def body(tx: SQLStatements) -> None:
            for table in ("tether_lg_writes", "tether_lg_checkpoints", "tether_lg_blobs"):
                tx.run(f"DELETE FROM {table} WHERE thread_id = ?", (str(thread_id),))
            tx.run("DELETE FROM tether_lg_marks WHERE thread_id = ?", (str(thread_id),))

        self.store.transaction(body)

    # -- async: the sync methods in a worker thread ------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple` (runs in a worker thread)."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list` (the whole page is read in a worker thread)."""

        def page() -> builtins.list[CheckpointTuple]:
            return builtins.list(self.list(config, filter=filter, before=before, limit=limit))

        found = await asyncio.to_thread(page)
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async :meth:`put` (runs in a worker thread)."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async :meth:`put_writes` (runs in a worker thread)."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread` (runs in a worker thread)."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    # -- inside a unit of work ----------------------------------------------

    def _load(
        self, tx: SQLStatements, thread_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointTuple | None:
        mark = self._rows.mark(tx, thread_id, ns)
        if mark is None:
            if tx.one(
                "SELECT checkpoint_id FROM tether_lg_checkpoints "
                "WHERE thread_id = ? AND checkpoint_ns = ? LIMIT 1",
                (thread_id, ns),
            ):
                raise CheckpointRollbackError(
                    f"thread {thread_id!r}: checkpoints are stored but its high-water mark is "
                    "gone; refusing to guess which one is the latest",
                    thread_id=thread_id,
                    checkpoint_ns=ns,
                    expected=None,
                    actual=None,
                )
            return None
        latest = checkpoint_id is None
        target = mark.checkpoint_id if checkpoint_id is None else checkpoint_id
        row = tx.one(
            "SELECT seq, envelope FROM tether_lg_checkpoints "
            "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
            (thread_id, ns, target),
        )
        if row is None:
            if latest:
                raise CheckpointRollbackError(
                    f"thread {thread_id!r}: the checkpoint its mark names ({target}) is gone; "
                    "refusing to serve an older one",
                    thread_id=thread_id,
                    checkpoint_ns=ns,
                    expected=target,
                    actual=None,
                )
            return None
        sealed = open_checkpoint(
            row[1], self.keyring, thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=target
        )
        if row[0] != sealed.seq:
            raise CheckpointCorruptError(
                f"thread {thread_id!r}: checkpoint {target} row position differs from its seal",
                run_id=thread_id,
            )
        self._check_chain(sealed, envelope_digest(bytes(row[1])), mark)
        if latest:
            beyond = tx.one(
                "SELECT checkpoint_id FROM tether_lg_checkpoints "
                "WHERE thread_id = ? AND checkpoint_ns = ? AND seq > ? LIMIT 1",
                (thread_id, ns, mark.seq),
            )
            if beyond is not None:
                raise CheckpointRollbackError(
                    f"thread {thread_id!r}: checkpoints are stored past its mark; the mark "
                    "was put back",
                    thread_id=thread_id,
                    checkpoint_ns=ns,
                    expected=mark.checkpoint_id,
                    actual=text(beyond[0], "checkpoint_id"),
                )
        values = self._channel_values(tx, thread_id, ns, sealed)
        manifest = None
        if target == mark.checkpoint_id and mark.writes is not None:
            manifest = manifests.open_manifest(
                mark.writes,
                self.keyring,
                thread_id=thread_id,
                checkpoint_ns=ns,
                checkpoint_id=target,
            )
        writes = self._pending_writes(tx, thread_id, ns, target, manifest)
        head = self._load_typed(sealed.head, thread_id, "checkpoint")
        if not isinstance(head, dict):
            raise CheckpointCorruptError(f"thread {thread_id!r}: checkpoint head is not a map")
        metadata = self._load_typed(sealed.metadata, thread_id, "metadata")
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": target,
                }
            },
            checkpoint={**head, "channel_values": values},  # type: ignore[typeddict-item]
            metadata=metadata,
            parent_config=None
            if sealed.parent_id is None
            else {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": sealed.parent_id,
                }
            },
            pending_writes=writes,
        )

    def _check_head(self, tx: SQLStatements, thread_id: str, ns: str) -> None:
        """Refuse a thread whose mark is gone or names a row that is not there, as stored."""
        mark = self._rows.mark(tx, thread_id, ns)
        row = None
        if mark is not None:
            row = tx.one(
                "SELECT envelope FROM tether_lg_checkpoints "
                "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                (thread_id, ns, mark.checkpoint_id),
            )
        if (
            mark is None
            or row is None
            or not isinstance(row[0], bytes | bytearray | memoryview)
            or envelope_digest(bytes(row[0])) != mark.envelope_digest
        ):
            raise CheckpointRollbackError(
                f"thread {thread_id!r}: its high-water mark or the checkpoint it names is "
                "missing or altered; refusing to list a history without its head",
                thread_id=thread_id,
                checkpoint_ns=ns,
                expected=None if mark is None else mark.checkpoint_id,
                actual=None,
            )

    def _check_chain(self, sealed: CheckpointSeal, digest: str, mark: Mark) -> None:
        """Refuse a checkpoint that is not on the thread's chain at or below the mark."""
        on_chain = sealed.lineage == mark.lineage and (
            sealed.seq < mark.seq
            or (
                sealed.seq == mark.seq
                and sealed.checkpoint_id == mark.checkpoint_id
                and digest == mark.envelope_digest
            )
        )
        if not on_chain:
            raise CheckpointRollbackError(
                f"thread {sealed.thread_id!r}: checkpoint {sealed.checkpoint_id} is not on the "
                f"chain below its mark ({mark.checkpoint_id}); refusing to serve it",
                thread_id=sealed.thread_id,
                checkpoint_ns=sealed.checkpoint_ns,
                expected=mark.checkpoint_id,
                actual=sealed.checkpoint_id,
            )

    def _channel_values(
        self, tx: SQLStatements, thread_id: str, ns: str, sealed: CheckpointSeal
    ) -> dict[str, Any]:
        if not sealed.channels:
            return {}
        digests = sorted(set(sealed.channels.values()))
        marks = ", ".join("?" for _ in digests)
        rows = tx.all(
            "SELECT digest, kind, body FROM tether_lg_blobs WHERE thread_id = ? AND "
            f"checkpoint_ns = ? AND digest IN ({marks})",
            (thread_id, ns, *digests),
        )
        found: dict[str, Typed] = {}
        for digest, kind, raw in rows:
            if isinstance(digest, str) and digest in sealed.channels.values():
                found[digest] = check_value(kind, raw, digest, thread_id=thread_id, what="channel")
        values: dict[str, Any] = {}
        for name, digest in sealed.channels.items():
            typed = found.get(digest)
            if typed is None:
                raise CheckpointCorruptError(
                    f"thread {thread_id!r}: channel {name!r} of checkpoint "
                    f"{sealed.checkpoint_id} is missing from the store",
                    run_id=thread_id,
                )
            values[name] = self._load_typed(typed, thread_id, f"channel {name!r}")
        return values

    def _pending_writes(
        self,
        tx: SQLStatements,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        manifest: manifests.WritesManifest | None,
    ) -> builtins.list[tuple[str, str, Any]]:
        rows = tx.all(
            "SELECT task_id, idx, kind, body, envelope FROM tether_lg_writes "
            "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
            (thread_id, ns, checkpoint_id),
        )
        if manifest is not None:  # the latest checkpoint: exactly the writes the saver stored
            manifest.check(manifests.listed([(r[0], r[1], r[4]) for r in rows], thread_id))
        found = []
        for task_id, idx, kind, raw, envelope in rows:
            if isinstance(idx, bool) or not isinstance(idx, int):
                raise CheckpointCorruptError(f"thread {thread_id!r}: a write's idx is damaged")
            sealed = open_write(
                envelope,
                self.keyring,
                thread_id=thread_id,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=text(task_id, "task_id"),
                idx=idx,
            )
            typed = check_value(kind, raw, sealed.value, thread_id=thread_id, what="pending write")
            found.append((sealed, self._load_typed(typed, thread_id, "pending write")))
        found.sort(
            key=lambda item: writes_sort_key(item[0].task_path, item[0].task_id, item[0].idx)
        )
        return [(s.task_id, s.channel, value) for s, value in found]

    # -- serde -------------------------------------------------------------

    def _dump(self, value: Any) -> Typed:
        kind, raw = self.serde.dumps_typed(value)
        return kind, bytes(raw)

    def _load_typed(self, typed: Typed, thread_id: str, what: str) -> Any:
        if typed[0] == "pickle":
            raise CheckpointCorruptError(
                f"thread {thread_id!r}: {what} is pickled; TetherSaver never unpickles",
                run_id=thread_id,
            )
        try:
            return self.serde.loads_typed(typed)
        except Exception as exc:  # the serializer's own errors, after the seal verified
            raise CheckpointCorruptError(
                f"thread {thread_id!r}: {what} does not deserialize: {exc}", run_id=thread_id
            ) from exc


def _ids(config: RunnableConfig) -> tuple[str, str, str | None]:
    conf = config.get("configurable") or {}
    if conf.get("thread_id") is None:
        raise StoreError("a TetherSaver config needs configurable.thread_id")
    checkpoint_id = conf.get("checkpoint_id")
    return (
        str(conf["thread_id"]),
        str(conf.get("checkpoint_ns") or ""),
        None if checkpoint_id is None else str(checkpoint_id),
    )
