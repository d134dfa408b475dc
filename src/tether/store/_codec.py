"""How a store keeps a checkpoint envelope or a blob: as it is, or deflated.

A codec is the stored form only: everything above the store (digests,
signatures, hashes) is over the bytes as sealed, and a reader gets those
back. A row records its codec (migration 17), NULL meaning "as it is", so
rows written before it read as they always did.

``d1`` is raw DEFLATE (RFC 1951) with a fixed preset dictionary of the JSON
that tether's envelopes and state parts are made of: small documents
(a few hundred bytes to a few KB) are mostly member names and ``sha256:``
digests, which a dictionary lets DEFLATE spell in a few bits from the first
byte on. The dictionary is part of the format: changing one byte of it is a
new codec name, never an edit of this one.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from tether.core import CheckpointCorruptError

#: The codec name of :func:`pack`'s output.
DEFLATE = "d1"
#: Bytes shorter than this are stored as they are (a header would eat the gain).
PACK_MIN = 64
#: Bytes longer than this are stored as they are: deflating a large workspace
#: file would cost the commit more time than its bytes are worth, and a bound
#: on what a stored row may inflate to keeps an edited row from exhausting memory.
PACK_MAX = 1 << 20

# DEFLATE gives the shortest codes to the nearest matches, so the commonest
# strings come last. Fixed forever for ``d1`` (see the module docstring).
_DICTIONARY = (
    b'"adapter":"sandbox","compensation":"none","kind":"file.write","sensitive":false,'
    b'"approvals":[],"cost":0,"status":"dispatched","status":"intended","mutating":true,'
    b'"result":{"bytes":"path":"business_object_id":"committed_at":"adapter_version":"1",'
    b'"verification":null,"rewinding":null,"stop_reason":null,"admission":null,'
    b'"review_cases":[],"quarantined_keys":[],"decisions":[],"contract":"standard",'
    b'"schema_version":4,"spent":{"cost":0,"proposals":"steps":"wall_time_ms":'
    b'"started_at":"updated_at":"dispatched_at":"worker":"epoch":"epoch_id":"epoch-'
    b'"occurrence_id":"inbox_cursor":0,"results_digest":null,"writes_committed":'
    b'"observed_version":"plan_cursor":"phase":"running","phase":"pending",'
    b'"generation":"trace_length":"ledger_length":"args":{"content":"target":'
    b'"policy_fingerprint":"sha256:","policy_id":"policy_version":"task_fingerprint":"sha256:'
    b'"scenario_fingerprint":"sha256:","task_id":"task_version":"binding":"parts":{'
    b'"receipt_fingerprint":"sha256:","receipt_id":"rcpt-","post_version":'
    b'"trace_head":"sha256:","ledger_head":"sha256:","context_digest":"sha256:'
    b'"agent_context_digest":"sha256:","intent":{"action_id":"w'
    b'"expected_post":{"instance_id":"namespace":"sandbox","state_fingerprint":"sha256:'
    b'"environment":{"instance_id":"namespace":"state_fingerprint":"sha256:","version":'
    b'"idempotency_key":"idem-","intent_digest":"sha256:","last_write":{"action_id":"'
    b'"pending":{"action_id":"rest":{"memory":{'
    b'{"checksum":"sha256:","format":"tether.checkpoint","kcv":"key_id":"mac":"payload":{'
)
# A 4 KB window holds the dictionary and most of a document; a smaller one
# than DEFLATE's default makes each call cheap (its state is allocated per call).
_WBITS = 12
_MEM_LEVEL = 6
_LEVEL = 6

#: A compressor with the dictionary loaded and nothing written: each row starts from a copy.
_PRIMED = zlib.compressobj(_LEVEL, zlib.DEFLATED, -_WBITS, _MEM_LEVEL, zdict=_DICTIONARY)


def pack(data: bytes, *, deflate: bool = True) -> tuple[bytes, str | None]:
    """``(stored bytes, codec)`` for ``data``: deflated when that is shorter, else as it is.

    ``deflate=False``: as it is, always (a store whose rows are thrown away soon).
    """
    if not deflate or not PACK_MIN <= len(data) <= PACK_MAX:
        return data, None
    packer = _PRIMED.copy()  # the dictionary loaded once, not per row (same bytes out)
    packed = packer.compress(data) + packer.flush()
    if len(packed) >= len(data):
        return data, None
    return packed, DEFLATE


def unpack(stored: bytes, codec: object, what: str, *, run_id: str | None = None) -> bytes:
    """The bytes a row keeps in ``codec``; damage or an unknown codec is corruption.

    ``what`` names the row in the error (``"checkpoint sha256:..."``).
    """
    if codec is None:
        return stored
    if codec != DEFLATE:
        raise CheckpointCorruptError(
            f"{what} is stored in codec {str(codec)[:20]!r}, which this tether does not read",
            run_id=run_id,
        )
    try:
        return inflate(stored)
    except ValueError as exc:
        raise CheckpointCorruptError(f"{what} is damaged: {exc}", run_id=run_id) from exc


def inflate(stored: bytes) -> bytes:
    """The bytes :func:`pack` deflated into ``stored`` (codec d1); ``ValueError`` when damaged."""
    try:
        unpacker = zlib.decompressobj(-_WBITS, zdict=_DICTIONARY)
        data = unpacker.decompress(stored, PACK_MAX + 1)
    except zlib.error as exc:
        raise ValueError(f"its stored bytes do not inflate ({exc})") from exc
    if len(data) > PACK_MAX or not unpacker.eof or unpacker.unused_data:
        raise ValueError("its stored bytes are not one whole DEFLATE stream")
    return data


def blob_rows(
    blobs: Mapping[str, bytes], *, deflate: bool = True
) -> list[tuple[str, bytes, str | None]]:
    """``(digest, stored body, codec)`` of each blob, by digest (one order, so two
    writers never deadlock on PostgreSQL)."""
    return [(found, *pack(data, deflate=deflate)) for found, data in sorted(blobs.items())]


def stored_bytes(value: Any, codec: Any, what: str, *, run_id: str | None = None) -> bytes:
    """The bytes a row of ``codec`` keeps (see ``tether.store._codec``), or a typed error."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise CheckpointCorruptError(f"{what}: stored as {type(value).__name__}", run_id=run_id)
    return unpack(bytes(value), codec, what, run_id=run_id)
