"""Canonical JSON (RFC 8785) out, strict JSON in.

Everything tether hashes or signs goes through :func:`canonical_bytes`, so two
processes that hold equal values always produce equal digests. Everything it
reads goes through :func:`strict_loads`, which refuses what the standard
library quietly accepts: duplicate keys, NaN and Infinity, invalid UTF-8.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
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

    The standard (C) encoder's output *is* RFC 8785's when the value holds no
    float and no integer near or past 2**53, and every object key sorts the
    same by code point as by UTF-16 code unit:

    - strings: both escape exactly ``"``, ``\\`` and the characters below
      U+0020 (``\\b \\t \\n \\f \\r`` short, the others as ``\\u00xx``
      in lower case) and write every other character as itself, in UTF-8;
      a lone surrogate cannot be written as UTF-8 and goes to the reference
      encoder, which refuses it;
    - keys: code point order and UTF-16 order agree unless a key holds a
      character at or above U+D800 (astral characters are surrogate pairs in
      UTF-16 and sort before U+E000..U+FFFF there): such keys go to the
      reference encoder;
    - ``true``, ``false``, ``null`` and integers of fewer than 16 digits are
      spelled alike.

    The numbers are checked on the value; the keys only when the output is
    not all ASCII (ASCII keys always sort alike). Anything else goes to the
    reference encoder, which is pure Python and several times slower. A
    property test holds both to byte equality on generated documents.
    """
    if isinstance(value, dict | list):
        risky = _scan(value)
        try:
            text = _dumps(value)
        except (TypeError, ValueError) as exc:
            raise CanonicalJSONError(f"value is not canonical JSON: {exc}") from exc
        except RecursionError as exc:  # nested too deeply, or a value that holds itself
            raise CanonicalJSONError("value is nested too deeply to be JSON") from exc
        if not risky:
            if text.isascii():
                return text.encode("ascii")
            if _keys_sort_alike(value):
                try:
                    return text.encode("utf-8")
                except UnicodeEncodeError:
                    pass  # a lone surrogate: the reference encoder says what is wrong
    else:
        return scalar_bytes(value)
    return _reference(value)


def _reference(value: JSONValue) -> bytes:
    """The reference encoder's bytes (``rfc8785``), its refusals as CanonicalJSONError."""
    try:
        return bytes(rfc8785.dumps(value))
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise CanonicalJSONError(f"value is not canonical JSON: {exc}") from exc
    except RecursionError as exc:
        raise CanonicalJSONError("value is nested too deeply to be JSON") from exc


def _refuse(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The standard library's C encoder, made once: json.dumps builds a new encoder
# object (and checks its arguments) at every call, which costs more than
# encoding a small document. No circular-reference markers: a cycle cannot come
# out of strict_loads, and one built in code ends in RecursionError, refused.
_C_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_ENCODE: Any = (
    None
    if _C_ENCODER is None
    else _C_ENCODER(
        None, _refuse, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
)


def _dumps(value: JSONValue) -> str:
    if _ENCODE is None:  # no C accelerator (another Python): the same text, slower
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    return "".join(_ENCODE(value, 0))


# The C string encoder of the standard library (``ensure_ascii=False``): its
# escapes are RFC 8785's, see canonical_bytes.
_encode_text: Any = json.encoder.encode_basestring


def text_bytes(value: str) -> bytes:
    """The RFC 8785 encoding of one string (a lone surrogate raises :class:`CanonicalJSONError`)."""
    try:
        return bytes(_encode_text(value).encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise CanonicalJSONError(f"value is not canonical JSON: a lone surrogate ({exc})") from exc


_SAFE_INT = 2**53


def scalar_bytes(value: JSONValue) -> bytes:
    """The RFC 8785 encoding of a value that is usually a string, an integer, a bool or null.

    The common cases are spelled directly: a string as :func:`text_bytes`, an
    integer below 2**53 in magnitude in decimal, ``true``, ``false``,
    ``null``. Anything else is :func:`canonical_bytes`'s or the reference
    encoder's.
    """
    if value is None:
        return b"null"
    kind = type(value)
    if kind is str:
        return text_bytes(value)
    if kind is int and -_SAFE_INT < value < _SAFE_INT:
        return str(value).encode("ascii")
    if value is True:
        return b"true"
    if value is False:
        return b"false"
    if isinstance(value, dict | list):
        return canonical_bytes(value)
    if isinstance(value, str):
        return text_bytes(value)  # a str subclass (a StrEnum member): its text
    return _reference(value)


def object_bytes(members: Mapping[str, bytes]) -> bytes:
    """An object whose member values are already canonical bytes, keys in RFC 8785 order.

    Keys are ASCII names chosen by tether (``ValueError`` otherwise), so code
    point order is UTF-16 order.
    """
    keys = sorted(members)
    for key in keys:
        if not key.isascii():
            raise ValueError(f"object_bytes takes ASCII keys only, not {key!r}")
    return b"{" + b",".join(_key_bytes(key) + members[key] for key in keys) + b"}"


@functools.lru_cache(maxsize=512)
def _key_bytes(key: str) -> bytes:
    return text_bytes(key) + b":"


# Canonical bytes of immutable parts of a document (a state's binding, its
# pending write...), by the identity of the part: an unchanged part is the
# same object from one state to the next, so it is encoded once. The cache
# holds each part, so no other object can take its id while it is there.
# Parts are values nobody changes in place (frozen dataclasses, tuples). It
# is bounded by count and by bytes (a pending write may carry a big file).
class _PartCache:
    __slots__ = ("entries", "size")

    def __init__(self) -> None:
        self.entries: dict[int, tuple[object, bytes, str]] = {}
        self.size = 0


_PARTS = _PartCache()
_PARTS_MAX = 4096
_PARTS_MAX_BYTES = 16 * 2**20


def part_bytes(part: Any, document: Callable[[Any], JSONValue]) -> tuple[bytes, str]:
    """``(canonical bytes, digest)`` of an immutable ``part``, whose JSON ``document(part)`` is.

    Computed once per part object (see above); ``document`` is called only then.
    """
    cache = _PARTS
    hit = cache.entries.get(id(part))
    if hit is not None and hit[0] is part:
        return hit[1], hit[2]
    data = canonical_bytes(document(part))
    found = "sha256:" + hashlib.sha256(data).hexdigest()
    if len(cache.entries) >= _PARTS_MAX or cache.size + len(data) > _PARTS_MAX_BYTES:
        cache.entries.clear()  # a cache only: cheaper to start again than to track age
        cache.size = 0
    if len(data) <= _PARTS_MAX_BYTES // 4:
        cache.entries[id(part)] = (part, data, found)
        cache.size += len(data)
    return data, found


def _keys_sort_alike(value: JSONValue) -> bool:
    """Whether every object key in ``value`` sorts alike by code point and by UTF-16 unit."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if not key.isascii() and max(key) >= "\ud800":
                    return False
            stack.extend(v for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, dict | list))
    return True


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


# Made once: json.loads with hooks builds a new decoder (and its scanner) at every
# call, which costs about as much as parsing a small document. It holds no state
# between calls.
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants)


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
        if text.startswith("\ufeff"):  # as json.loads refuses it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise CanonicalJSONError(f"not JSON: {exc.msg} at position {exc.pos}") from exc
    except RecursionError as exc:
        raise CanonicalJSONError("JSON nested too deeply") from exc
    if "\\u" in text:  # only an escape can spell a lone surrogate in valid UTF-8
        _text_only(value)
    return value
