"""The ``file.write`` contract shared by the on-disk workspace and the in-memory sandbox.

Both adapters must agree byte for byte on normalization, fingerprints and
receipts, so that a test written against the sandbox says something true
about the workspace. Keeping one copy of these rules is how they agree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any

from tether.adapters._errors import JournalCorruptError
from tether.adapters._snapshot import merkle_root
from tether.core import (
    ActionClass,
    ActionKind,
    AdapterError,
    ContractViolationError,
    EnvironmentDriftError,
    EnvironmentState,
    Intent,
    JSONValue,
    Receipt,
    SpecError,
    TargetKind,
    canonical_bytes,
    digest_bytes,
    strict_loads,
)
from tether.core._fields import Fields
from tether.core._spec import check_canonical_path

FILE_WRITE = "file.write"
FILE_READ = "file.read"
FILE_LIST = "file.list"

#: The kinds both file adapters declare: write one file, read one file, list
#: the tree's paths with their content hashes.
FILE_KINDS = (
    ActionKind(FILE_WRITE, ActionClass.WRITE, TargetKind.PATH, required=frozenset({"content"})),
    ActionKind(FILE_READ, ActionClass.READ, TargetKind.PATH),
    ActionKind(FILE_LIST, ActionClass.READ, TargetKind.NONE),
)

# The fields a receipt is made of (its fingerprint is derived from them).
_RECEIPT_FIELDS = frozenset(f.name for f in fields(Receipt) if f.init)


@dataclass(frozen=True, slots=True)
class WriteRequest:
    """A validated ``file.write`` intent: where, what bytes, and the expected prior hash."""

    target: str
    data: bytes
    expected: str | None

    @property
    def after(self) -> str:
        """The content hash the target holds once the write has landed."""
        return digest_bytes(self.data)


def check_target(target: str) -> str:
    """Return ``target`` if it is a canonical relative path, else refuse the proposal."""
    try:
        return check_canonical_path(target, "target")
    except SpecError as exc:
        raise ContractViolationError("bad_target", exc.problem) from exc


def _encode(content: object) -> bytes:
    if not isinstance(content, str):
        raise ContractViolationError("bad_args", "args.content must be a string")
    try:
        return content.encode("utf-8")
    except UnicodeEncodeError as exc:
        # Lone surrogates cannot be written as UTF-8 nor canonicalized as JSON.
        raise ContractViolationError("bad_args", "args.content is not encodable as UTF-8") from exc


def read_files(
    kind: str,
    target: str,
    hashes: Callable[[], Mapping[str, str]],
    content: Callable[[str], bytes | None],
    scope: Callable[[str], bool],
) -> dict[str, JSONValue]:
    """Answer a ``file.read`` (one file's text) or a ``file.list`` (each path in scope, hashed).

    Text is UTF-8 with undecodable bytes replaced; ``sha256`` is of the exact
    bytes, so an agent can tell a replaced byte from the real character. A
    listing names only paths in ``scope``: what lies outside the task's paths
    (its names, its hashes) is not the agent's to see.
    """
    if kind == FILE_LIST:
        return {"files": {p: h for p, h in sorted(hashes().items()) if scope(p)}}
    if kind != FILE_READ:
        raise ContractViolationError("bad_kind", f"{kind!r} is not a read this adapter knows")
    check_target(target)
    if not scope(target):
        raise ContractViolationError("scope_target", f"{target!r} is outside the task's paths")
    data = content(target)
    if data is None:
        return {"path": target, "exists": False, "sha256": None, "text": None}
    return {
        "path": target,
        "exists": True,
        "sha256": digest_bytes(data),
        "text": data.decode("utf-8", errors="replace"),
    }


def normalize_write(
    kind: str,
    target: str,
    args: dict[str, Any],
    current_hash: Callable[[str], str | None],
    *,
    conditional: bool,
) -> dict[str, Any]:
    """Canonical ``file.write`` arguments; adds ``expected_sha256`` when writes are conditional.

    ``current_hash`` returns the target's present content hash, or ``None``
    when it does not exist. It is only called once the target is known sound.
    """
    if kind != FILE_WRITE:
        raise ContractViolationError("bad_kind", f"only {FILE_WRITE!r} is supported, not {kind!r}")
    check_target(target)
    if not isinstance(args, dict) or set(args) != {"content"}:
        raise ContractViolationError("bad_args", 'args must be exactly {"content": <string>}')
    content = args["content"]
    _encode(content)
    if not conditional:
        return {"content": content}
    return {"content": content, "expected_sha256": current_hash(target)}


def parse_write(intent: Intent, *, conditional: bool) -> WriteRequest:
    """Validate a normalized intent again at execution time.

    The intent may come back from a checkpoint written by other code, so the
    adapter re-checks it rather than trusting that ``normalize`` produced it.
    """
    if intent.kind != FILE_WRITE:
        raise ContractViolationError("bad_kind", f"only {FILE_WRITE!r} is supported")
    target = check_target(intent.target)
    args = intent.args
    wanted = {"content", "expected_sha256"} if conditional else {"content"}
    if not isinstance(args, dict) or set(args) != wanted:
        raise ContractViolationError(
            "bad_args", f"normalized args must have exactly {sorted(wanted)}"
        )
    data = _encode(args["content"])
    expected = args.get("expected_sha256")
    if expected is not None and not isinstance(expected, str):
        raise ContractViolationError("bad_args", "args.expected_sha256 must be a string or null")
    return WriteRequest(target=target, data=data, expected=expected)


def fingerprint(hashes: Mapping[str, str], executable: Collection[str] = ()) -> str:
    """The state fingerprint of a tree given as ``{relpath: "sha256:<hex>"}``.

    It is the root digest of the tree's content-addressed snapshot (see
    :mod:`tether.adapters._snapshot`); ``executable`` names the files whose
    executable bit is set. The workspace computes the same value incrementally.
    An in-memory adapter asks for the same tree's fingerprint several times a
    step: the last few answers are kept, by the tree's content.
    """
    return _fingerprint(tuple(sorted(hashes.items())), frozenset(executable))


@functools.lru_cache(maxsize=32)
def _fingerprint(items: tuple[tuple[str, str], ...], executable: frozenset[str]) -> str:
    return merkle_root(dict(items), executable)


def check_instance(prestate: EnvironmentState, namespace: str, instance_id: str) -> None:
    """Refuse a prestate that names another environment instance than this adapter's."""
    if prestate.namespace != namespace or prestate.instance_id != instance_id:
        raise EnvironmentDriftError(
            f"intent was prepared for {prestate.namespace}/{prestate.instance_id}, "
            f"this adapter is {namespace}/{instance_id}; re-observe before writing",
            expected=(prestate.namespace, prestate.instance_id),
            actual=(namespace, instance_id),
        )


def check_prestate(prestate: EnvironmentState, current: EnvironmentState) -> None:
    """Refuse to derive a post-state from a prestate the environment is no longer in."""
    if prestate != current:
        raise EnvironmentDriftError(
            "the environment moved since the prestate was observed; observe again",
            expected=prestate,
            actual=current,
        )


def _receipt_error(field: str, problem: str) -> Exception:
    return JournalCorruptError(field, problem)


def parse_receipt(data: bytes) -> Receipt:
    """Parse stored receipt bytes strictly; anything doubtful is :class:`JournalCorruptError`."""
    return Receipt.parse(Fields(strict_loads(data), "", _receipt_error))


def receipt_bytes(receipt: Receipt) -> bytes:
    """The canonical bytes a receipt is stored as."""
    return canonical_bytes(receipt.to_json())


def make_receipt(
    *,
    namespace: str,
    adapter_version: str,
    receipt_id: str,
    key: str,
    intent_digest: str,
    request: WriteRequest,
    committed_at: str,
    post_state: EnvironmentState,
) -> Receipt:
    """Build the receipt for a landed write, round-tripped through its stored form.

    The round trip guarantees the receipt handed out now is field-for-field the
    one a later ``lookup`` parses back, so replay comparisons never see drift
    that storage itself introduced.
    """
    receipt = Receipt(
        namespace=namespace,
        adapter_version=adapter_version,
        receipt_id=receipt_id,
        idempotency_key=key,
        intent_digest=intent_digest,
        result={"path": request.target, "sha256": request.after, "bytes": len(request.data)},
        business_object_id=request.target,
        committed_at=committed_at,
        post_state=post_state,
    )
    return parse_receipt(receipt_bytes(receipt))


def tampered(receipt: Receipt, changes: Mapping[str, Any]) -> Receipt:
    """A copy of ``receipt`` with JSON-level field changes (for drift tests only)."""
    unknown = sorted(set(changes) - _RECEIPT_FIELDS)
    if unknown:
        raise AdapterError(f"receipts have no field {unknown[0]!r}")
    body = receipt.to_json()
    for name, value in changes.items():
        body[name] = value.to_json() if isinstance(value, EnvironmentState) else value
    return parse_receipt(canonical_bytes(body))
