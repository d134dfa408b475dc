"""The append-only, hash-chained trace.

Each event's hash covers the previous head and the event's canonical body,
so a checkpoint that carries only the head (and the length) pins the whole
history without carrying it: a step's cost does not grow with the trace.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tether.core._canonical import JSONValue, canonical_bytes
from tether.core._model import format_time


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One sealed trace entry."""

    run_id: str
    seq: int
    kind: str
    at: datetime
    data: dict[str, Any]
    prev_hash: str
    hash: str

    def body(self) -> dict[str, JSONValue]:
        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "kind": self.kind,
            "at": format_time(self.at),
            "data": self.data,
        }

    def to_json(self) -> dict[str, JSONValue]:
        return {**self.body(), "prev_hash": self.prev_hash, "hash": self.hash}


def chain_hash(prev_hash: str, body: dict[str, JSONValue]) -> str:
    """The hash of an event that follows ``prev_hash``."""
    h = hashlib.sha256()
    h.update(prev_hash.encode("ascii"))
    h.update(b"\x00")
    h.update(canonical_bytes(body))
    return "sha256:" + h.hexdigest()


def seal_event(
    run_id: str, seq: int, kind: str, at: datetime, data: dict[str, Any], prev_hash: str
) -> TraceEvent:
    """Build the next event of a chain whose head is ``prev_hash``."""
    body: dict[str, JSONValue] = {
        "run_id": run_id,
        "seq": seq,
        "kind": kind,
        "at": format_time(at),
        "data": data,
    }
    return TraceEvent(run_id, seq, kind, at, data, prev_hash, chain_hash(prev_hash, body))
