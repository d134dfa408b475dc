"""Canonical JSON (RFC 8785) out, strict JSON in.

Everything tether hashes or signs goes through :func:`canonical_bytes`, so two
processes that hold equal values always produce equal digests. Everything it
reads goes through :func:`strict_loads`, which refuses what the standard
library quietly accepts: duplicate keys, NaN and Infinity, invalid UTF-8.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import rfc8785

from tether.core._errors import CanonicalJSONError

JSONValue = Any  # None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]


# A float (fraction or exponent) or an integer of 16+ digits (near or past
# 2**53) in number position: between a delimiter and a delimiter. Inside a
# string the same text only sends the value to the reference encoder, which
# is always correct; a number outside a string cannot escape this pattern.
_RISKY_NUMBER = re.compile(r"[:,\[]-?(?:\d+(?:\.\d+(?:[eE][+-]?\d+)?|[eE][+-]?\d+)|\d{16,})[,\]}]")


def canonical_bytes(value: JSONValue) -> bytes:
    """Return the RFC 8785 canonical encoding of ``value``.

    The standard encoder's output *is* RFC 8785's when it is all ASCII (code
    point order equals UTF-16 order, and both escape control characters
    alike) and holds no float and no integer near or past 2**53. That is
    checked on the output; anything else goes to the reference encoder, which
    is pure Python and several times slower.
    """
    if isinstance(value, dict | list):
        _text_keys(value)
        try:
            text = json.dumps(
                value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
            )
        except (TypeError, ValueError) as exc:
            raise CanonicalJSONError(f"value is not canonical JSON: {exc}") from exc
        if text.isascii() and _RISKY_NUMBER.search(text) is None:
            return text.encode("ascii")
    try:
        return bytes(rfc8785.dumps(value))
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise CanonicalJSONError(f"value is not canonical JSON: {exc}") from exc


def _text_keys(value: JSONValue) -> None:
    """Refuse an object key that is not a string (the standard encoder would quietly
    turn ``1`` into ``"1"``, giving ``{1: "a"}`` and ``{"1": "a"}`` one digest)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    raise CanonicalJSONError(f"object key {key!r} is not a string")
                if isinstance(inner, dict | list | tuple):
                    stack.append(inner)
        elif isinstance(item, tuple):
            # The standard encoder would write it as an array, the reference
            # encoder refuses it: refuse it on both paths alike.
            raise CanonicalJSONError("a tuple is not a JSON value; use a list")
        else:
            stack.extend(inner for inner in item if isinstance(inner, dict | list | tuple))


def _text_only(value: JSONValue) -> None:
    """Refuse a string holding a lone surrogate (``"\\ud800"`` parses to one; it is not text)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise CanonicalJSONError(f"a string holds a lone surrogate: {exc}") from exc
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


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
        _text_only(text)
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise CanonicalJSONError(f"not JSON: {exc.msg} at position {exc.pos}") from exc
    except RecursionError as exc:
        raise CanonicalJSONError("JSON nested too deeply") from exc
    if "\\u" in text:  # only an escape can spell a lone surrogate in valid UTF-8
        _text_only(value)
    return value
