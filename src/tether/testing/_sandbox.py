"""An in-memory adapter with the workspace's semantics, for fast tests and demos.

:class:`Sandbox` shares normalization, fingerprints and receipts with
:class:`~tether.adapters.FileWorkspace` (both use ``_filewrite``), so an
environment state computed by one has the same shape as the other's. Unlike
the workspace it can pretend to be a weaker adapter: not idempotent, not
queryable, not conditional; and it can fail on purpose, before or after its
write committed, to model a lost response.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from tether.adapters._base import Fence, VerifierResult
from tether.adapters._errors import NotQueryableError, UnsupportedEntryError
from tether.adapters._filewrite import (
    FILE_KINDS,
    WriteRequest,
    check_instance,
    check_prestate,
    check_target,
    fingerprint,
    make_receipt,
    normalize_write,
    parse_write,
    read_files,
    tampered,
)
from tether.adapters._snapshot import blobs_of_flat, flatten
from tether.core import (
    ActionKind,
    AdapterError,
    AdapterUnavailableError,
    Capabilities,
    ContractViolationError,
    EnvironmentDriftError,
    EnvironmentState,
    IdempotencyConflictError,
    Intent,
    JSONValue,
    PreconditionFailedError,
    Receipt,
    digest_bytes,
    format_time,
)
from tether.core._spec import check_canonical_path

ADAPTER_VERSION = "1"


def _random_id() -> str:
    return secrets.token_hex(16)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _always_passes(files: dict[str, str]) -> bool:
    return True


class Sandbox:
    """A dict of files that behaves like a workspace with a journal.

    ``files`` is the initial tree. ``instance_id`` defaults to one drawn from
    ``id_source`` (which also names receipts); ``clock`` stamps receipts.
    ``verifier`` judges the files for :meth:`verify`.

    The capability flags change behaviour, not just what is advertised:

    - ``idempotent=False``: :meth:`execute` ignores keys it has seen and
      performs the write AGAIN, as a real non-idempotent API would; the newest
      receipt replaces the older one under that key. (With
      ``conditional_writes=True`` as well, a replay usually fails its
      precondition instead, since the first write changed the target.)
    - ``queryable=False``: :meth:`lookup` raises :class:`NotQueryableError`.
    - ``conditional_writes=False``: :meth:`normalize` adds no expected hash and
      :meth:`execute` writes whatever the target holds.
    """

    #: Its effects stay in local, versioned storage (allowed under ``local-only``).
    local_effects = True

    def __init__(
        self,
        files: Mapping[str, str] | None = None,
        *,
        instance_id: str | None = None,
        id_source: Callable[[], str] = _random_id,
        clock: Callable[[], datetime] = _utc_now,
        idempotent: bool = True,
        queryable: bool = True,
        conditional_writes: bool = True,
        verifier: Callable[[dict[str, str]], bool] = _always_passes,
        namespace: str = "sandbox",
    ) -> None:
        if not namespace:
            raise AdapterError("namespace must not be empty")
        initial = dict(files or {})
        directories: set[str] = set()
        for path, content in initial.items():
            check_canonical_path(path, f"files[{path!r}]")
            if not isinstance(content, str):
                raise AdapterError(f"files[{path!r}] must be a string")
            parts = path.split("/")
            directories.update("/".join(parts[:index]) for index in range(1, len(parts)))
        clash = sorted(directories & set(initial))
        if clash:
            raise UnsupportedEntryError(clash[0], "file that is also a directory")
        self._files = initial
        self._namespace = namespace
        self._ids = id_source
        self._clock = clock
        self._verifier = verifier
        self._instance_id = instance_id if instance_id is not None else id_source()
        if not self._instance_id:
            raise AdapterError("instance_id must not be empty")
        self._capabilities = Capabilities(
            idempotent=idempotent,
            queryable=queryable,
            conditional_writes=conditional_writes,
            fencing=False,
        )
        self._version = 0
        self._writes = 0
        self._receipts: dict[str, Receipt] = {}
        self._fault: bool | None = None
        # Tests drive adapters from several threads (racing workers); keep it atomic.
        self._lock = threading.RLock()

    # --- identity -----------------------------------------------------

    @property
    def namespace(self) -> str:
        """Stable name of the kind of environment (default ``"sandbox"``)."""
        return self._namespace

    @property
    def version(self) -> str:
        """Adapter code version; bound into receipts."""
        return ADAPTER_VERSION

    @property
    def instance_id(self) -> str:
        """Identity of this in-memory instance."""
        return self._instance_id

    @property
    def capabilities(self) -> Capabilities:
        """As configured in the constructor; never fencing."""
        return self._capabilities

    @property
    def files(self) -> dict[str, str]:
        """A copy of the current tree."""
        with self._lock:
            return dict(self._files)

    # --- reading ------------------------------------------------------

    def environment(self) -> EnvironmentState:
        """Identity, write version and the fingerprint of the files."""
        with self._lock:
            return self._environment(self._hashes())

    @property
    def kinds(self) -> tuple[ActionKind, ...]:
        """``file.write``, ``file.read`` and ``file.list``."""
        return FILE_KINDS

    def read(
        self, kind: str, target: str, args: dict[str, Any], scope: Callable[[str], bool]
    ) -> dict[str, JSONValue]:
        """One file's text (``file.read``) or each path in scope with its hash (``file.list``)."""
        with self._lock:
            files = self._files
            return read_files(
                kind,
                target,
                self._hashes,
                lambda rel: files[rel].encode("utf-8") if rel in files else None,
                scope,
            )

    def lookup(self, key: str) -> Receipt | None:
        """The receipt under ``key``, or ``None``; refuses when configured not queryable."""
        if not self._capabilities.queryable:
            raise NotQueryableError(f"{self._namespace} cannot look up writes by key")
        with self._lock:
            return self._receipts.get(key)

    def receipts_after(self, version: int, limit: int = 100) -> list[Receipt]:
        """Receipts whose post-state version is above ``version``, oldest first (see ListsReceipts)."""
        with self._lock:
            newer = [r for r in self._receipts.values() if r.post_state.version > version]
        return sorted(newer, key=lambda r: r.post_state.version)[: max(0, limit)]

    def write_count(self) -> int:
        """How many writes the files actually received through :meth:`execute`."""
        with self._lock:
            return self._writes

    # --- writing ------------------------------------------------------

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """Canonical ``file.write`` args (with ``expected_sha256`` when conditional)."""
        with self._lock:
            return normalize_write(
                kind,
                target,
                args,
                self._hash_of,
                conditional=self._capabilities.conditional_writes,
            )

    def effect_identity(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """As the file workspace: the same content to the same path is the same effect."""
        return {"content": args.get("content")}

    def derive_post_state(self, prestate: EnvironmentState, intent: Intent) -> EnvironmentState:
        """The exact environment :meth:`execute` leaves; the files must still be at ``prestate``."""
        request = parse_write(intent, conditional=self._capabilities.conditional_writes)
        with self._lock:
            hashes = self._hashes()
            check_prestate(prestate, self._environment(hashes))
            self._check_precondition(request)
            hashes[request.target] = request.after
            return EnvironmentState(
                self._namespace, self._instance_id, prestate.version + 1, fingerprint(hashes)
            )

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        """Write ``intent`` under ``key`` (once, when idempotent) and return its receipt.

        ``fence`` is accepted and ignored: the sandbox does not fence.
        """
        if not key:
            raise ContractViolationError("bad_key", "the idempotency key must not be empty")
        request = parse_write(intent, conditional=self._capabilities.conditional_writes)
        check_instance(prestate, self._namespace, self._instance_id)
        intent_digest = intent.digest
        with self._lock:
            fault, self._fault = self._fault, None
            if fault is False:
                raise AdapterUnavailableError("injected fault: the write was not attempted")
            existing = self._receipts.get(key)
            if existing is not None and self._capabilities.idempotent:
                if existing.intent_digest == intent_digest:
                    return existing
                raise IdempotencyConflictError(key, intent_digest, existing)
            self._hash_of(request.target)  # shape rules hold even for unconditional writes
            self._check_precondition(request)
            self._files[request.target] = intent.args["content"]
            self._version += 1
            self._writes += 1
            receipt = make_receipt(
                namespace=self._namespace,
                adapter_version=ADAPTER_VERSION,
                receipt_id="rcpt-" + self._ids(),
                key=key,
                intent_digest=intent_digest,
                request=request,
                committed_at=format_time(self._clock()),
                post_state=self._environment(self._hashes()),
            )
            self._receipts[key] = receipt
            if fault is True:
                raise AdapterUnavailableError("injected fault: the write committed, reply lost")
            return receipt

    def verify(self, argv: tuple[str, ...], timeout_s: int) -> VerifierResult:
        """Judge the files with the ``verifier`` callable; ``argv`` and the timeout are ignored."""
        with self._lock:
            passed = bool(self._verifier(dict(self._files)))
            output = "verifier passed\n" if passed else "verifier failed\n"
            return VerifierResult(
                passed=passed,
                exit_code=0 if passed else 1,
                output_digest=digest_bytes(output.encode("utf-8")),
                output_tail=output,
                environment=self._environment(self._hashes()),
            )

    # --- test and demo helpers ----------------------------------------

    def fail_next(self, after_commit: bool) -> None:
        """Make the next :meth:`execute` raise :class:`~tether.core.AdapterUnavailableError`.

        ``after_commit=False``: nothing is written. ``after_commit=True``: the
        write and its receipt commit, then the reply is lost.
        """
        with self._lock:
            self._fault = bool(after_commit)

    # --- snapshots (so a run on the sandbox can be rewound) --------------

    def snapshot_blobs(
        self,
        root: str,
        have: Callable[[str], bool],
        have_many: Callable[[list[str]], set[str]] | None = None,
    ) -> dict[str, bytes]:
        """The blobs of the snapshot ``root`` (the files now) that ``have`` lacks.

        With ``have_many`` the store is asked once for the whole (small) tree.
        """
        with self._lock:
            hashes = self._hashes()
            files = dict(self._files)
        made, blobs = blobs_of_flat(
            hashes, lambda path: files[path].encode("utf-8"), have, have_many
        )
        if made != root:
            raise EnvironmentDriftError(
                "the files are not at the snapshot root asked for; observe again",
                expected=root,
                actual=made,
            )
        return blobs

    def restore_snapshot(
        self, root: str, get_blob: Callable[[str], bytes | None], fence: Fence | None = None
    ) -> EnvironmentState:
        """Make the files the snapshot ``root`` (verified first, or nothing changes)."""
        with self._lock:
            if fingerprint(self._hashes()) == root:
                return self.environment()
            restored = flatten(root, get_blob)  # every blob verified before any change
            try:
                files = {path: data.decode("utf-8") for path, (data, _x) in restored.items()}
            except UnicodeDecodeError as exc:
                raise AdapterError(f"the sandbox holds text only: {exc}") from exc
            self._files = files
            self._version += 1
            return self.environment()

    def bypass_write(self, relpath: str, content: str) -> None:
        """Change a file as another actor would: the fingerprint moves, the version does not."""
        check_target(relpath)
        with self._lock:
            self._hash_of(relpath)  # same shape rules as a real tree
            self._files[relpath] = content

    def delete_receipt(self, key: str) -> bool:
        """Lose the receipt under ``key`` (a broken adapter); True if it existed."""
        with self._lock:
            return self._receipts.pop(key, None) is not None

    def tamper_receipt(self, key: str, /, **field_changes: Any) -> Receipt:
        """Rewrite fields of the stored receipt (drift); returns the new receipt."""
        with self._lock:
            current = self._receipts.get(key)
            if current is None:
                raise AdapterError(f"no receipt under key {key!r} to tamper with")
            changed = tampered(current, field_changes)
            self._receipts[key] = changed
            return changed

    # --- internals (callers hold the lock) ----------------------------

    def _hashes(self) -> dict[str, str]:
        return {path: digest_bytes(text.encode("utf-8")) for path, text in self._files.items()}

    def _hash_of(self, target: str) -> str | None:
        # A dict could hold both "a" and "a/b"; a disk cannot. Refuse like the workspace.
        parts = target.split("/")
        for index in range(1, len(parts)):
            prefix = "/".join(parts[:index])
            if prefix in self._files:
                raise UnsupportedEntryError(prefix, "non-directory on the path to a file")
        if any(path.startswith(target + "/") for path in self._files):
            raise UnsupportedEntryError(target, "directory")
        text = self._files.get(target)
        return None if text is None else digest_bytes(text.encode("utf-8"))

    def _environment(self, hashes: dict[str, str]) -> EnvironmentState:
        return EnvironmentState(
            self._namespace, self._instance_id, self._version, fingerprint(hashes)
        )

    def _check_precondition(self, request: WriteRequest) -> None:
        if not self._capabilities.conditional_writes:
            return
        actual = self._hash_of(request.target)
        if actual != request.expected:
            raise PreconditionFailedError(
                request.target, request.expected or "absent", actual or "absent"
            )
