"""The signed payload of a run state: canonical bytes built from parts that keep theirs.

A commit signs one payload. Encoding the whole state again at every commit
would cost what the state weighs, and storing it whole at every commit would
store its unchanged parts again and again. So:

- **Encoding.** The payload is RFC 8785 JSON built member by member: scalars
  are spelled directly, and every sub-document (the binding, the pending
  write, the last write, the review cases...) is encoded once per object and
  its bytes reused for as long as the state keeps that object
  (:func:`~tether.core.part_bytes`). The bytes equal
  ``canonical_bytes(state.to_json())`` with the parts put back; a unit test
  holds them to it.
- **Parts (schema 4).** A sub-document of :data:`PART_MIN` bytes or more is
  not written into the payload: the payload's ``parts`` object names it by
  its SHA-256 digest, and its bytes are stored once, content-addressed, as a
  blob beside the checkpoint (in the same transaction). The signature covers
  the payload, and so every part's digest: a part whose bytes do not hash to
  the signed digest is corruption, as an altered payload is. A step that
  changes the pending write stores the pending write, not the binding again.
- **Inline when it changed.** Given the digests of the previous generation's
  members (``previous``), a sub-document that changed since then is written
  into the payload instead: a part costs its digest twice (in the payload and
  as the blob's key) and a row with its index entry, which buys nothing for
  bytes that no later generation will share (a write step's pending write,
  last write and rest point change at every step). Unchanged, it becomes a
  part (stored once) and later generations name it. Readers take either
  form for every member (:func:`parts_named`), so this is a writer's choice
  within schema 4.

:func:`expand_payload` turns a schema-4 payload and its parts back into the
whole document :meth:`RunState.from_json` reads; a schema-3 payload (every
part inline) passes through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tether.core._canonical import (
    JSONValue,
    canonical_bytes,
    digest_bytes,
    part_bytes,
    scalar_bytes,
    strict_loads,
    text_bytes,
)
from tether.core._errors import (
    CanonicalJSONError,
    CheckpointCorruptError,
    InvariantError,
    UnknownFieldError,
)
from tether.core._model import format_time
from tether.core._state import SCHEMA_VERSION, RunState, check_state

#: Sub-documents this long (canonical bytes) or longer are stored as parts.
PART_MIN = 256
#: The members of a state that may be stored as parts (the rest are small scalars).
PART_FIELDS = frozenset(
    {
        "binding",
        "environment",
        "pending",
        "last_write",
        "verification",
        "review_cases",
        "quarantined_keys",
        "decisions",
        "rewinding",
        "forks",
        "fork_nonces",
        "cancel_nonces",
        "replay_approvals",
        "approval_nonces",
        "last_outcome",
        "rest",
    }
)
#: Every member a state's whole document has: each RunState field, and the schema version.
STATE_MEMBERS = frozenset(
    {
        *PART_FIELDS,
        "schema_version",
        "run_id",
        "generation",
        "epoch",
        "worker",
        "phase",
        "stop_reason",
        "started_at",
        "updated_at",
        "plan_cursor",
        "agent_context_digest",
        "spent",
        "adapter_version",
        "observed_version",
        "writes_committed",
        "trace_head",
        "trace_length",
        "ledger_head",
        "ledger_length",
        "inbox_cursor",
        "results_digest",
        "epoch_id",
        "admission",
        "occurrence_id",
        "contract",
        "policy_change",
    }
)
#: The payload schemas this tether reads: 3 (every part inline) and 4 (parts by digest).
READABLE_SCHEMA_VERSIONS = frozenset({3, SCHEMA_VERSION})
_PARTS_FROM = 4
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class EncodedState:
    """A state's signed payload, the parts it names (``{digest: canonical bytes}``),
    and the digest of every sub-document it has (``{member: digest}``, inline or not)."""

    payload: bytes
    parts: Mapping[str, bytes]
    digests: Mapping[str, str] = field(default_factory=dict)


def encode_state(state: RunState, previous: Mapping[str, str] | None = None) -> EncodedState:
    """The schema-4 payload of ``state`` and its parts (see the module docstring).

    ``previous``: the previous generation's :attr:`EncodedState.digests`; a
    sub-document whose digest differs from it there is written inline.
    ``None`` (not known): every sub-document of :data:`PART_MIN` bytes or
    more is a part. Raises :class:`~tether.core.CanonicalJSONError` for a
    state that is not JSON.
    """
    members, digests = _members(state)
    parts: dict[str, bytes] = {}
    named: dict[str, bytes] = {}
    for name, found in digests.items():
        data = members[name]
        if len(data) >= PART_MIN and (previous is None or previous.get(name) == found):
            del members[name]
            parts[found] = data
            named[name] = text_bytes(found)
    members["parts"] = _object(named)
    return EncodedState(_object(members), parts, digests)


def member_digests(state: RunState) -> dict[str, str]:
    """The digest of each of ``state``'s sub-documents (as :attr:`EncodedState.digests`)."""
    return dict(_members(state)[1])


def whole_payload(state: RunState) -> bytes:
    """``canonical_bytes(state.to_json())``, built from cached parts (every part inline)."""
    members, _ = _members(state)
    return _object(members)


def validate_state(state: RunState) -> bytes:
    """Check cross-object invariants and serializability; return the signed payload's bytes.

    Called after every restore; every commit calls :func:`encode_valid_state`.
    Raises :class:`InvariantError` at the first breach.
    """
    return encode_valid_state(state).payload


def encode_valid_state(state: RunState, previous: Mapping[str, str] | None = None) -> EncodedState:
    """:func:`~tether.core.check_state`, then :func:`encode_state`: what a commit signs.

    Called before every commit, so invalid state never moves the mark; a
    state that is not JSON is an :class:`InvariantError` too.
    """
    check_state(state)
    try:
        return encode_state(state, previous)
    except (CanonicalJSONError, ValueError, TypeError) as exc:
        raise InvariantError(
            f"run {state.run_id}: state is not serializable: {exc}", run_id=state.run_id
        ) from exc


def parts_named(payload: Any) -> dict[str, str]:
    """``{member: digest}`` of the parts a schema-4 payload names (none for schema 3).

    A ``parts`` object that is missing, malformed, names a member a state
    does not store as a part, or names one also given inline raises
    :class:`~tether.core.UnknownFieldError`.
    """
    if not _has_parts(payload):
        return {}
    parts = payload.get("parts")
    if not isinstance(parts, dict):
        raise UnknownFieldError("parts", "missing or not an object of part digests")
    for name, found in parts.items():
        if name not in PART_FIELDS:
            raise UnknownFieldError(f"parts.{name}", "not a member a state stores as a part")
        if not isinstance(found, str) or not _DIGEST.fullmatch(found):
            raise UnknownFieldError(f"parts.{name}", "expected a sha256:<hex> digest")
        if name in payload:
            raise UnknownFieldError(name, "given both inline and as a part")
    return dict(parts)


def expand_payload(
    payload: Any, fetch: Callable[[str], bytes | None], *, run_id: str | None = None
) -> Any:
    """The whole state document of a verified ``payload``: its parts read back in.

    ``fetch(digest)`` returns a part's stored bytes (``None``: missing). A
    missing part, or one whose bytes do not hash to the digest the payload
    signed, or are not strict JSON, raises
    :class:`~tether.core.CheckpointCorruptError`. A schema-3 payload is
    returned as it is.
    """
    named = parts_named(payload)
    if not _has_parts(payload):
        return payload
    document = {key: value for key, value in payload.items() if key != "parts"}
    for name, found in sorted(named.items()):
        body = fetch(found)
        where = f"run {run_id}: " if run_id is not None else ""
        if body is None:
            raise CheckpointCorruptError(
                f"{where}the checkpoint's {name} (part {found}) is missing from the store",
                run_id=run_id,
            )
        if digest_bytes(body) != found:
            raise CheckpointCorruptError(
                f"{where}the checkpoint's {name} (part {found}) was altered: its bytes do not "
                "hash to the digest the checkpoint signed",
                run_id=run_id,
            )
        try:
            document[name] = strict_loads(body)
        except CanonicalJSONError as exc:
            raise CheckpointCorruptError(
                f"{where}the checkpoint's {name} (part {found}) is not strict JSON: {exc}",
                run_id=run_id,
            ) from exc
    return document


def _has_parts(payload: Any) -> bool:
    if not isinstance(payload, dict):
        return False
    version = payload.get("schema_version")
    return type(version) is int and version >= _PARTS_FROM


def _object(members: Mapping[str, bytes]) -> bytes:
    # Every key here is one of the fixed ASCII member names below: code point
    # order is RFC 8785's UTF-16 order.
    return b"{" + b",".join(_KEY[key] + members[key] for key in sorted(members)) + b"}"


def _part(members: dict[str, bytes], digests: dict[str, str], name: str, value: Any) -> None:
    """Add member ``name``: null, or a sub-document whose bytes are cached by its identity."""
    if value is None:
        members[name] = b"null"
        return
    data, found = part_bytes(value, _DOCUMENT[name])
    members[name] = data
    digests[name] = found


def _members(state: RunState) -> tuple[dict[str, bytes], dict[str, str]]:
    """Every member of ``state.to_json()`` as canonical bytes, and the digest of each part."""
    s = scalar_bytes
    members = {
        "schema_version": _SCHEMA,
        "run_id": s(state.run_id),
        "generation": s(state.generation),
        "epoch": s(state.epoch),
        "worker": s(state.worker),
        "phase": s(state.phase.value),
        "stop_reason": s(state.stop_reason),
        "started_at": s(format_time(state.started_at)),
        "updated_at": s(format_time(state.updated_at)),
        "plan_cursor": s(state.plan_cursor),
        "agent_context_digest": s(state.agent_context_digest),
        "spent": canonical_bytes(state.spent.to_json()),
        "adapter_version": s(state.adapter_version),
        "observed_version": s(state.observed_version),
        "writes_committed": s(state.writes_committed),
        "trace_head": s(state.trace_head),
        "trace_length": s(state.trace_length),
        "ledger_head": s(state.ledger_head),
        "ledger_length": s(state.ledger_length),
        "inbox_cursor": s(state.inbox_cursor),
        "results_digest": s(state.results_digest),
        "epoch_id": s(state.epoch_id),
        "admission": s(state.admission),
        "occurrence_id": s(state.occurrence_id),
        "contract": s(state.contract.value),
    }
    digests: dict[str, str] = {}
    _part(members, digests, "binding", state.binding)
    _part(members, digests, "environment", state.environment)
    _part(members, digests, "pending", state.pending)
    _part(members, digests, "last_write", state.last_write)
    _part(members, digests, "verification", state.verification)
    _part(members, digests, "review_cases", state.review_cases)
    _part(members, digests, "quarantined_keys", state.quarantined_keys)
    _part(members, digests, "decisions", state.decisions)
    _part(members, digests, "rewinding", state.rewinding)
    # Written only once used, as RunState.to_json does.
    for name in _WHEN_USED:
        value = getattr(state, name)
        if value:
            _part(members, digests, name, value)
    if state.last_outcome is not None:
        _part(members, digests, "last_outcome", state.last_outcome)
    if state.policy_change.value != "refuse":
        members["policy_change"] = s(state.policy_change.value)
    if state.rest is not None:
        _part(members, digests, "rest", state.rest)
    return members, digests


def _to_json(value: Any) -> JSONValue:
    return value.to_json()


def _each(value: Any) -> JSONValue:
    return [item.to_json() for item in value]


def _as_list(value: Any) -> JSONValue:
    return list(value)


# How each part's JSON document is built (only on a cache miss).
_DOCUMENT: dict[str, Callable[[Any], JSONValue]] = {
    "binding": _to_json,
    "environment": _to_json,
    "pending": _to_json,
    "last_write": _to_json,
    "verification": _to_json,
    "review_cases": _each,
    "quarantined_keys": _as_list,
    "decisions": _as_list,
    "rewinding": _to_json,
    "forks": _as_list,
    "fork_nonces": _as_list,
    "cancel_nonces": _as_list,
    "replay_approvals": _each,
    "approval_nonces": _each,
    "last_outcome": _to_json,
    "rest": _to_json,
}
# Members written only once used (non-empty), as RunState.to_json writes them.
_WHEN_USED = ("forks", "fork_nonces", "cancel_nonces", "replay_approvals", "approval_nonces")
_SCHEMA = str(SCHEMA_VERSION).encode("ascii")
_KEY = {name: text_bytes(name) + b":" for name in (*STATE_MEMBERS, "parts")}
