"""What the run keeps of a call's arguments and of the upstream's answer, exactly.

tether hashes and signs canonical JSON (RFC 8785), which has no integer
beyond ±(2**53 - 1): such a number cannot be written in it exactly. MCP
carries plain JSON, where a server may send, and a client may ask with, any
integer (a 64-bit id, an amount in a currency's smallest unit). And a
function effect's receipt keeps a result of at most 16 KiB whole. So:

- **Arguments** holding such an integer are carried in the intent as their
  JSON text (keys sorted, no spaces): a string where the arguments object
  would be (:func:`carried`). An MCP call's arguments are always an object,
  so a string there is never a real call's: the mapping is one-to-one, and
  :func:`sent` gives back the exact object the upstream receives. The same
  call made again is the same text, so the same effect (a replay); other
  integers give other text, so another effect.
- **An answer** the receipt cannot keep whole (over 16 KiB with tether's
  field, or holding such an integer) is kept apart, as its exact JSON text,
  in the store's content-addressed blobs, and the receipt records its
  digest, its size and why (:func:`kept_apart`). A replay reads it back,
  checks its digest, and answers exactly what the upstream answered,
  structured content and all (:func:`read_back`). A sensitive tool's answer
  is never kept apart (its text must not be stored): a replay of it says
  so, as an error answer, which an output schema does not bind.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from tether.core import CanonicalJSONError, ContractViolationError, canonical_bytes

#: Where each answer says what tether did with the call.
CALL_META = "tether/call"
#: The largest integer canonical JSON writes exactly (RFC 8785: IEEE 754 doubles).
SAFE_INTEGER = 2**53 - 1
#: The most a function effect's receipt keeps of a result whole (tether.adapters).
RECEIPT_LIMIT = 16_384
#: The receipt's field naming an answer kept apart.
KEPT_APART = "tether_kept_apart"

Keep = Callable[[str, bytes], None]
"""``keep(digest, body)``: store ``body`` durably under ``digest`` (blocking)."""
Fetch = Callable[[str], bytes | None]
"""``fetch(digest)``: the bytes stored under ``digest``, or ``None`` (blocking)."""


def has_big_integer(value: Any) -> bool:
    """Whether ``value`` holds an integer canonical JSON cannot write exactly."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > SAFE_INTEGER:
            return True
    return False


def exact_text(value: Any) -> str:
    """``value`` as JSON text, every integer exact: keys sorted, no spaces, deterministic."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def carried(arguments: dict[str, Any]) -> dict[str, Any] | str:
    """A call's arguments as its intent carries them (the module docstring)."""
    return exact_text(arguments) if has_big_integer(arguments) else arguments


def sent(carried_arguments: Any) -> dict[str, Any]:
    """The arguments object the upstream receives, from what the intent carries."""
    if isinstance(carried_arguments, str):
        try:
            found = json.loads(carried_arguments)
        except ValueError as exc:
            raise ContractViolationError(
                "bad_args", f"unreadable carried arguments: {exc}"
            ) from None
        carried_arguments = found
    if not isinstance(carried_arguments, dict):
        raise ContractViolationError("bad_args", "a tool call's arguments must be an object")
    return carried_arguments


def fits(record: dict[str, Any]) -> bool:
    """Whether a receipt keeps ``record`` whole: canonical JSON, within the receipt's limit."""
    try:
        return len(canonical_bytes(record)) <= RECEIPT_LIMIT
    except CanonicalJSONError:
        return False


def kept_apart(doc: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The receipt's record of an answer kept apart, and the exact bytes to keep."""
    body = exact_text(doc).encode("utf-8")
    why = "holds integers beyond 2**53" if has_big_integer(doc) else "over 16 KiB"
    record: dict[str, Any] = {
        KEPT_APART: {
            "sha256": "sha256:" + hashlib.sha256(body).hexdigest(),
            "bytes": len(body),
            "why": why,
        }
    }
    if doc.get("isError") is True:
        record["isError"] = True
    return record, body


def read_back(record: dict[str, Any], fetch: Fetch) -> dict[str, Any] | None:
    """The exact answer a receipt's record names (kept apart: read and checked), or ``None``."""
    apart = record.get(KEPT_APART)
    if not isinstance(apart, dict):
        return None
    name = apart.get("sha256")
    if not isinstance(name, str):
        return None
    body = fetch(name)
    if body is None or "sha256:" + hashlib.sha256(body).hexdigest() != name:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("content"), list) else None
