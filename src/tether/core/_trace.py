"""The append-only, hash-chained trace.

Each event's hash covers the previous head and the event's canonical body,
so a checkpoint that carries only the head (and the length) pins the whole
history without carrying it: a step's cost does not grow with the trace.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tether.core._canonical import JSONValue, canonical_bytes, scalar_bytes
from tether.core._errors import TraceIntegrityError
from tether.core._model import format_time


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One sealed trace entry.

    ``data_text`` is the canonical JSON of ``data``, encoded once: it is what
    the hash covers and what a store keeps, so an event read back is checked
    against the bytes that were stored, not against a re-encoding of them.
    """

    run_id: str
    seq: int
    kind: str
    at: datetime
    data: dict[str, Any]
    prev_hash: str
    hash: str
    data_text: bytes = field(default=b"", compare=False, repr=False)
    # The canonical bytes of body() as sealed: set by seal_event only, and not
    # an __init__ argument, so dataclasses.replace() and rows read back start
    # without it and are encoded afresh (a changed event never reuses it).
    _sealed_body: bytes = field(default=b"", init=False, compare=False, repr=False)

    def encoded_data(self) -> bytes:
        """The canonical JSON of ``data`` (as sealed or as stored)."""
        return self.data_text or canonical_bytes(self.data)

    def body_bytes(self) -> bytes:
        """The canonical bytes of :meth:`body`, built around :meth:`encoded_data`."""
        return self._sealed_body or _body_bytes(
            self.run_id, self.seq, self.kind, format_time(self.at), self.encoded_data()
        )

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


def chain_hash(prev_hash: str, body: dict[str, JSONValue] | bytes) -> str:
    """The hash of an entry that follows ``prev_hash`` (``body``: its canonical bytes, or the body)."""
    h = hashlib.sha256()
    h.update(prev_hash.encode("ascii"))
    h.update(b"\x00")
    h.update(body if isinstance(body, bytes) else canonical_bytes(body))
    return "sha256:" + h.hexdigest()


def _body_bytes(run_id: str, seq: int, kind: str, at: str, data: bytes) -> bytes:
    # RFC 8785 orders keys by code unit: at < data < kind < run_id < seq. The
    # other fields are encoded here (small); ``data`` is spliced in as is.
    s = scalar_bytes
    return (
        b'{"at":'
        + s(at)
        + b',"data":'
        + data
        + b',"kind":'
        + s(kind)
        + b',"run_id":'
        + s(run_id)
        + b',"seq":'
        + s(seq)
        + b"}"
    )


def verify_trace(
    run_id: str, events: list[TraceEvent], head: str, length: int, genesis: str
) -> None:
    """Refuse a trace that is not one chain from genesis to ``head`` of ``length`` events.

    Every event's hash is recomputed from its content, so an edited row (its
    kind, data, time or sequence) fails here with a typed error.
    """
    current = genesis
    for index, event in enumerate(events, start=1):
        if (
            event.seq != index
            or event.prev_hash != current
            or chain_hash(current, event.body_bytes()) != event.hash
        ):
            raise TraceIntegrityError(
                f"run {run_id}: the trace breaks at event {index}", run_id=run_id
            )
        current = event.hash
    if current != head or len(events) != length:
        raise TraceIntegrityError(
            f"run {run_id}: the trace does not end at the checkpoint's head", run_id=run_id
        )


def seal_event(
    run_id: str, seq: int, kind: str, at: datetime, data: dict[str, Any], prev_hash: str
) -> TraceEvent:
    """Build the next event of a chain whose head is ``prev_hash`` (its data encoded once)."""
    data_text = canonical_bytes(data)
    body = _body_bytes(run_id, seq, kind, format_time(at), data_text)
    event = TraceEvent(
        run_id, seq, kind, at, data, prev_hash, chain_hash(prev_hash, body), data_text
    )
    object.__setattr__(event, "_sealed_body", body)
    return event
