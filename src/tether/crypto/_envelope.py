"""Signed checkpoint envelopes: canonical payload bytes -> sealed, verifiable bytes.

Two layers, as in a converter/codec split: the core turns run state into
canonical bytes; this module wraps those bytes in an envelope carrying

- ``checksum``: plain SHA-256 over the key id, check value, MAC and payload,
  which catches accidental corruption anywhere in the envelope (and only
  that: anyone can recompute it);
- ``key_id`` and ``kcv``: which key signed, and a one-way check value that
  tells a wrong key with the right id from a forged payload;
- ``mac``: HMAC-SHA256 over a domain label, the key id and the payload,
  which proves the bytes came from a holder of the key.

Opening checks these in order and raises a distinct error for each. The
stored bytes must be exactly the canonical envelope of the payload they
carry, so the MAC covers the bytes as stored: an equivalent spelling of the
same values (``1.0`` for ``1``, escaped characters, reordered keys) is
corruption, not the same checkpoint.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from tether.core import (
    CanonicalJSONError,
    CheckpointCorruptError,
    RetiredKeyError,
    SignatureError,
    UnknownKeyError,
    WrongKeyError,
    canonical_bytes,
    strict_loads,
)
from tether.core._canonical import text_bytes
from tether.crypto._keyring import Keyring, KeyStatus

FORMAT = "tether.checkpoint"
ENVELOPE_VERSION = 1
_DOMAIN = b"tether.checkpoint.v1"
_FIELDS = frozenset({"checksum", "format", "kcv", "key_id", "mac", "payload", "version"})
_VERSION = str(ENVELOPE_VERSION).encode("ascii")
_FORMAT_MEMBER = b',"format":' + text_bytes(FORMAT) + b',"kcv":'


def seal(payload: bytes, keyring: Keyring) -> bytes:
    """Wrap canonical ``payload`` bytes in a signed envelope (canonical JSON itself)."""
    key = keyring.active
    mac = key.mac(_DOMAIN, key.key_id.encode("utf-8"), payload).hex()
    checksum = _checksum(key.key_id, key.check_value, mac, payload)
    return _assemble(checksum, key.check_value, key.key_id, mac, payload)


def _assemble(checksum: str, kcv: str, key_id: str, mac: str, payload: bytes) -> bytes:
    # Keys in RFC 8785 order (checksum < format < kcv < key_id < mac < payload <
    # version); the payload is already canonical, so splicing its bytes in
    # keeps the envelope canonical without encoding the payload twice.
    return b"".join(
        (
            b'{"checksum":',
            text_bytes(checksum),
            _FORMAT_MEMBER,
            text_bytes(kcv),
            b',"key_id":',
            text_bytes(key_id),
            b',"mac":',
            text_bytes(mac),
            b',"payload":',
            payload,
            b',"version":',
            _VERSION,
            b"}",
        )
    )


def open_envelope(blob: bytes, keyring: Keyring, *, run_id: str | None = None) -> Any:
    """Verify an envelope and return its parsed payload object.

    Raises, in this order: :class:`CheckpointCorruptError` (not an envelope,
    or the checksum fails), :class:`UnknownKeyError`, :class:`RetiredKeyError`,
    :class:`WrongKeyError`, :class:`SignatureError`.
    """
    doc, payload = _intact(blob, run_id)
    key_id: str = doc["key_id"]
    key = keyring.get(key_id)
    if key is None:
        raise UnknownKeyError(key_id, run_id=run_id, held=keyring.key_ids, source=keyring.source)
    if key.status is KeyStatus.RETIRED:
        raise RetiredKeyError(key_id, run_id=run_id)
    if not hmac.compare_digest(key.check_value, doc["kcv"]):
        raise WrongKeyError(key_id, run_id=run_id, held=keyring.key_ids, source=keyring.source)
    expected = key.mac(_DOMAIN, key_id.encode("utf-8"), payload).hex()
    if not hmac.compare_digest(expected, doc["mac"]):
        raise SignatureError(
            "checkpoint signature does not verify: the payload was altered", run_id=run_id
        )
    return doc["payload"]


#: Envelopes found intact, by their bytes -> their payload's bytes (see :func:`_intact`).
#: At most this many, of at most 32 KB each (larger envelopes are checked every time).
_INTACT: dict[bytes, bytes] = {}
_INTACT_MAX = 256
_INTACT_MAX_BYTES = 8 * 2**20


def _intact(blob: bytes, run_id: str | None) -> tuple[dict[str, Any], bytes]:
    """The envelope's fields and its payload's bytes, or :class:`CheckpointCorruptError`.

    Whether bytes are an intact envelope depends on the bytes alone (no key is
    involved), so bytes found intact once are not encoded again to check they
    are canonical: a run restored again and again (after each refused step)
    reads the same envelope each time. They are parsed again, so every caller
    gets a payload of its own. A cache only: it forgets everything when full.
    """
    keep = type(blob) is bytes and len(blob) <= _INTACT_MAX_BYTES // _INTACT_MAX
    known = _INTACT.get(blob) if keep else None
    if known is not None:
        return strict_loads(blob), known
    try:
        doc = strict_loads(blob)
    except CanonicalJSONError as exc:
        raise CheckpointCorruptError(
            f"checkpoint is not strict JSON: {exc}", run_id=run_id
        ) from exc
    if not isinstance(doc, dict) or set(doc) != _FIELDS:
        raise CheckpointCorruptError("checkpoint envelope has the wrong fields", run_id=run_id)
    if doc["format"] != FORMAT or doc["version"] != ENVELOPE_VERSION:
        raise CheckpointCorruptError(
            f"not a {FORMAT} envelope of version {ENVELOPE_VERSION}", run_id=run_id
        )
    for name in ("checksum", "kcv", "key_id", "mac"):
        if not isinstance(doc[name], str):
            raise CheckpointCorruptError(f"envelope field {name} is not a string", run_id=run_id)
    try:
        payload = canonical_bytes(doc["payload"])
    except CanonicalJSONError as exc:
        raise CheckpointCorruptError(
            f"payload is not canonical JSON: {exc}", run_id=run_id
        ) from exc
    if _assemble(doc["checksum"], doc["kcv"], doc["key_id"], doc["mac"], payload) != blob:
        raise CheckpointCorruptError(
            "checkpoint bytes are not the canonical envelope of their payload: corrupted",
            run_id=run_id,
        )
    checksum = _checksum(doc["key_id"], doc["kcv"], doc["mac"], payload)
    if not hmac.compare_digest(checksum, doc["checksum"]):
        raise CheckpointCorruptError("checkpoint checksum does not match: corrupted", run_id=run_id)
    if keep:
        if len(_INTACT) >= _INTACT_MAX:
            _INTACT.clear()  # cheaper to start again than to track age
        _INTACT[blob] = payload
    return doc, payload


def _checksum(key_id: str, kcv: str, mac: str, payload: bytes) -> str:
    parts = (
        key_id.encode("utf-8"),
        kcv.encode("ascii", "replace"),
        mac.encode("ascii", "replace"),
        payload,
    )
    framed = b"".join(len(part).to_bytes(8, "big") + part for part in parts)
    return "sha256:" + hashlib.sha256(framed).hexdigest()


def envelope_digest(blob: bytes) -> str:
    """The content address of a sealed envelope."""
    return "sha256:" + hashlib.sha256(blob).hexdigest()
