"""Canonical JSON (RFC 8785) out, strict JSON in.

Everything tether hashes or signs goes through :func:`canonical_bytes`, so two
processes that hold equal values always produce equal digests. Everything it
reads goes through :func:`strict_loads`, which refuses what the standard
library quietly accepts: duplicate keys, NaN and Infinity, invalid UTF-8.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

from tether.core._errors import CanonicalJSONError

JSONValue = Any  # None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]


_SAFE_INT = 2**53 - 1


def _plain(value: Any) -> bool:
    """True when the standard encoder's output is exactly RFC 8785's for ``value``.

    That holds for ASCII strings and keys (sorting by code point equals
    sorting by UTF-16 unit, and both escape control characters alike),
    integers in the safe range, booleans, null, lists and objects. Floats and
    non-ASCII text go to the reference encoder.
    """
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -_SAFE_INT <= value <= _SAFE_INT
    if isinstance(value, str):
        return value.isascii()
    if isinstance(value, list | tuple):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and k.isascii() and _plain(v) for k, v in value.items())
    return False


def canonical_bytes(value: JSONValue) -> bytes:
    """Return the RFC 8785 canonical encoding of ``value``."""
    if _plain(value):
        # The reference encoder is pure Python; this path is what every step uses.
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("ascii")
    try:
        return bytes(rfc8785.dumps(value))
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise CanonicalJSONError(f"value is not canonical JSON: {exc}") from exc


def digest(value: JSONValue) -> str:
    """SHA-256 of the canonical encoding, as ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


def digest_bytes(data: bytes) -> str:
    """SHA-256 of raw bytes, as ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise CanonicalJSONError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise CanonicalJSONError(f"{name} is not JSON")


def strict_loads(data: bytes | str) -> JSONValue:
    """Parse JSON strictly; raise :class:`CanonicalJSONError` on anything doubtful."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8", errors="strict")
        except UnicodeDecodeError as exc:
            raise CanonicalJSONError(f"not UTF-8: {exc}") from exc
    else:
        text = data
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise CanonicalJSONError(f"not JSON: {exc.msg} at position {exc.pos}") from exc
    except RecursionError as exc:
        raise CanonicalJSONError("JSON nested too deeply") from exc
