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


# Numbers the standard encoder may spell differently from RFC 8785: any
# float, and integers of 16+ digits (near or past 2**53, which the reference
# encoder refuses). They are found by type while the value is walked, not by
# searching the encoded text.
_BIG_INT = 10**15
_PLAIN = frozenset({str, bool, type(None)})


def canonical_bytes(value: JSONValue) -> bytes:
    """Return the RFC 8785 canonical encoding of ``value``.

    The standard encoder's output *is* RFC 8785's when it is all ASCII (code
    point order equals UTF-16 order, and both escape control characters
    alike) and holds no float and no integer near or past 2**53. The numbers
    are checked on the value, the ASCII on the output; anything else goes to
    the reference encoder, which is pure Python and several times slower.
    """
    if isinstance(value, dict | list):
        risky = _scan(value)
        try:
            text = json.dumps(
                value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
            )
        except (TypeError, ValueError) as exc:  # a value that holds itself among them
            raise CanonicalJSONError(f"value is not canonical JSON: {exc}") from exc
        except RecursionError as exc:
            raise CanonicalJSONError("value is nested too deeply to be JSON") from exc
        if not risky and text.isascii():
            return text.encode("ascii")
    try:
        return bytes(rfc8785.dumps(value))
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise CanonicalJSONError(f"value is not canonical JSON: {exc}") from exc
    except RecursionError as exc:
        raise CanonicalJSONError("value is nested too deeply to be JSON") from exc


def _scan(value: JSONValue) -> bool:
    """Walk a value once: refuse what the standard encoder would quietly accept, and
    say whether it holds a number that only the reference encoder spells right.

    Refused: an object key that is not a string (the standard encoder would
    turn ``1`` into ``"1"``, giving ``{1: "a"}`` and ``{"1": "a"}`` one
    digest) and a tuple (written as an array by the standard encoder, refused
    by the reference one: refused on both paths alike). Containers whose
    values are all strings, booleans or nulls are passed over by type alone.
    """
    risky = False
    stack = [value]
    # Each container is walked once: a value that holds itself would loop for
    # ever (the encoder after the scan refuses the cycle, typed).
    walked: set[int] = set()
    while stack:
        item = stack.pop()
        if id(item) in walked:
            continue
        walked.add(id(item))
        if isinstance(item, dict):
            if set(map(type, item)) != {str}:
                for key in item:
                    if not isinstance(key, str):
                        raise CanonicalJSONError(f"object key {key!r} is not a string")
            values: Any = item.values()
        elif isinstance(item, tuple):
            raise CanonicalJSONError("a tuple is not a JSON value; use a list")
        else:
            values = item
        if set(map(type, values)) <= _PLAIN:
            continue
        for inner in values:
            kind = type(inner)
            if kind is str or kind is bool or inner is None:
                continue
            if kind is dict or kind is list or isinstance(inner, dict | list | tuple):
                stack.append(inner)
            elif isinstance(inner, float) or (
                isinstance(inner, int) and not -_BIG_INT < inner < _BIG_INT
            ):
                risky = True
    return risky


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
