"""Sealed envelopes for LangGraph checkpoints and pending writes.

Two layers, as tether's own checkpoints: LangGraph's serde turns values into
``(type, bytes)``; this module puts those (base64) and the row's identity in
a canonical JSON payload and seals it with the keyring through
:func:`tether.crypto.seal`. Channel values and write values are not inside
the envelope: it names them by a digest over their type and bytes, so a
channel that did not change is stored once and still covered by every
checkpoint that uses it.

Opening verifies the envelope (:func:`tether.crypto.open_envelope`: checksum,
key id, key, HMAC), then that the payload is exactly this format and is
bound to the row it was read from. Every failure is an
:class:`~tether.core.IntegrityError`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Any

from tether.core import BindingMismatchError, CheckpointCorruptError, canonical_bytes
from tether.crypto import Keyring, open_envelope, seal

CHECKPOINT_FORMAT = "tether.langgraph.checkpoint.v1"
WRITE_FORMAT = "tether.langgraph.write.v1"

_CHECKPOINT_FIELDS = frozenset(
    {
        "format",
        "thread_id",
        "checkpoint_ns",
        "checkpoint_id",
        "parent_id",
        "seq",
        "lineage",
        "head",
        "metadata",
        "channels",
    }
)
_WRITE_FIELDS = frozenset(
    {
        "format",
        "thread_id",
        "checkpoint_ns",
        "checkpoint_id",
        "task_id",
        "idx",
        "channel",
        "task_path",
        "value",
    }
)

Typed = tuple[str, bytes]


def value_digest(kind: str, body: bytes) -> str:
    """The content address of one serialized value: SHA-256 over its type and bytes."""
    h = hashlib.sha256()
    for part in (kind.encode("utf-8"), body):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True, slots=True)
class CheckpointSeal:
    """What a checkpoint envelope says (after it verified)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    seq: int
    lineage: str
    head: Typed
    metadata: Typed
    #: channel name -> digest of its serialized value (in ``tether_lg_blobs``)
    channels: dict[str, str]


@dataclass(frozen=True, slots=True)
class WriteSeal:
    """What a pending write's envelope says (after it verified)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    task_path: str
    value: str


def seal_checkpoint(c: CheckpointSeal, keyring: Keyring) -> bytes:
    """The sealed envelope of one checkpoint."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "thread_id": c.thread_id,
        "checkpoint_ns": c.checkpoint_ns,
        "checkpoint_id": c.checkpoint_id,
        "parent_id": c.parent_id,
        "seq": c.seq,
        "lineage": c.lineage,
        "head": _typed_out(c.head),
        "metadata": _typed_out(c.metadata),
        "channels": dict(c.channels),
    }
    return seal(canonical_bytes(payload), keyring)


def seal_write(w: WriteSeal, keyring: Keyring) -> bytes:
    """The sealed envelope of one pending write."""
    payload = {
        "format": WRITE_FORMAT,
        "thread_id": w.thread_id,
        "checkpoint_ns": w.checkpoint_ns,
        "checkpoint_id": w.checkpoint_id,
        "task_id": w.task_id,
        "idx": w.idx,
        "channel": w.channel,
        "task_path": w.task_path,
        "value": w.value,
    }
    return seal(canonical_bytes(payload), keyring)


def open_checkpoint(
    envelope: bytes, keyring: Keyring, *, thread_id: str, checkpoint_ns: str, checkpoint_id: str
) -> CheckpointSeal:
    """Verify a checkpoint envelope read from the row keyed by the three ids."""
    doc = open_payload(envelope, keyring, thread_id, CHECKPOINT_FORMAT, _CHECKPOINT_FIELDS)
    channels = doc["channels"]
    if not isinstance(channels, dict) or not all(isinstance(v, str) for v in channels.values()):
        raise CheckpointCorruptError(
            "checkpoint channels are not a name -> digest map", run_id=thread_id
        )
    parent = doc["parent_id"]
    if parent is not None and not isinstance(parent, str):
        raise CheckpointCorruptError("checkpoint parent_id is not a string", run_id=thread_id)
    sealed = CheckpointSeal(
        thread_id=text_field(doc, "thread_id", thread_id),
        checkpoint_ns=text_field(doc, "checkpoint_ns", thread_id),
        checkpoint_id=text_field(doc, "checkpoint_id", thread_id),
        parent_id=parent,
        seq=int_field(doc, "seq", thread_id),
        lineage=text_field(doc, "lineage", thread_id),
        head=_typed_in(doc["head"], thread_id),
        metadata=_typed_in(doc["metadata"], thread_id),
        channels=dict(channels),
    )
    bind_field(thread_id, ("thread_id", thread_id, sealed.thread_id))
    bind_field(thread_id, ("checkpoint_ns", checkpoint_ns, sealed.checkpoint_ns))
    bind_field(thread_id, ("checkpoint_id", checkpoint_id, sealed.checkpoint_id))
    return sealed


def open_write(
    envelope: bytes,
    keyring: Keyring,
    *,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    task_id: str,
    idx: int,
) -> WriteSeal:
    """Verify a pending write's envelope read from the row with these keys."""
    doc = open_payload(envelope, keyring, thread_id, WRITE_FORMAT, _WRITE_FIELDS)
    sealed = WriteSeal(
        thread_id=text_field(doc, "thread_id", thread_id),
        checkpoint_ns=text_field(doc, "checkpoint_ns", thread_id),
        checkpoint_id=text_field(doc, "checkpoint_id", thread_id),
        task_id=text_field(doc, "task_id", thread_id),
        idx=int_field(doc, "idx", thread_id),
        channel=text_field(doc, "channel", thread_id),
        task_path=text_field(doc, "task_path", thread_id),
        value=text_field(doc, "value", thread_id),
    )
    for what, expected, actual in (
        ("thread_id", thread_id, sealed.thread_id),
        ("checkpoint_ns", checkpoint_ns, sealed.checkpoint_ns),
        ("checkpoint_id", checkpoint_id, sealed.checkpoint_id),
        ("task_id", task_id, sealed.task_id),
        ("idx", idx, sealed.idx),
    ):
        bind_field(thread_id, (what, expected, actual))
    return sealed


def check_value(kind: Any, body: Any, digest: str, *, thread_id: str, what: str) -> Typed:
    """A stored ``(type, bytes)`` whose digest must be the sealed one."""
    if not isinstance(kind, str) or not isinstance(body, bytes | bytearray | memoryview):
        raise CheckpointCorruptError(
            f"{what}: stored value has the wrong column types", run_id=thread_id
        )
    raw = bytes(body)
    if value_digest(kind, raw) != digest:
        raise CheckpointCorruptError(
            f"{what}: stored bytes do not match the sealed digest: altered", run_id=thread_id
        )
    return kind, raw


def open_payload(
    envelope: Any, keyring: Keyring, thread_id: str, fmt: str, fields: frozenset[str]
) -> dict[str, Any]:
    """Verify ``envelope`` and return its payload, which must be exactly a ``fmt`` document."""
    if not isinstance(envelope, bytes | bytearray | memoryview):
        raise CheckpointCorruptError(
            f"envelope stored as {type(envelope).__name__}, not bytes", run_id=thread_id
        )
    doc = open_envelope(bytes(envelope), keyring, run_id=thread_id)
    if not isinstance(doc, dict) or set(doc) != fields or doc.get("format") != fmt:
        raise CheckpointCorruptError(f"envelope payload is not a {fmt} document", run_id=thread_id)
    return doc


def bind_field(thread_id: str, check: tuple[str, Any, Any]) -> None:
    """Refuse a sealed field that names another row than the one it was read from."""
    what, expected, actual = check
    if expected != actual:
        # A validly sealed envelope moved to another row (another thread, another id).
        raise BindingMismatchError(what, expected, actual, run_id=thread_id)


def text_field(doc: dict[str, Any], name: str, thread_id: str) -> str:
    """``doc[name]``, which must be text."""
    value = doc[name]
    if not isinstance(value, str):
        raise CheckpointCorruptError(f"envelope field {name} is not a string", run_id=thread_id)
    return value


def int_field(doc: dict[str, Any], name: str, thread_id: str) -> int:
    """``doc[name]``, which must be an integer (not a bool)."""
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointCorruptError(f"envelope field {name} is not an integer", run_id=thread_id)
    return value


def _typed_out(value: Typed) -> list[str]:
    return [value[0], base64.b64encode(value[1]).decode("ascii")]


def _typed_in(value: Any, thread_id: str) -> Typed:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(part, str) for part in value)
    ):
        raise CheckpointCorruptError("envelope holds a malformed typed value", run_id=thread_id)
    try:
        return value[0], base64.b64decode(value[1], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CheckpointCorruptError(
            "envelope holds a typed value that is not base64", run_id=thread_id
        ) from exc
