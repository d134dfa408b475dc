"""A real directory the agent edits, with a crash-safe receipt journal beside it.

The journal (``journal_dir/journal.sqlite``) lives outside the tree on
purpose: rewinding or restoring the tree can never erase a receipt, so a
write that happened stays known. Every write follows one protocol, under an
exclusive ``flock`` that serializes writers across processes:

1. settle any write left *prepared* by a crash (see :meth:`FileWorkspace._recover`);
2. a receipt for the key ends the call: same intent digest returns it,
   another digest raises :class:`~tether.core.IdempotencyConflictError`;
3. the target must hold the expected prior content (a conditional write);
4. a ``prepared`` row records key, digest, target, before and after hashes;
5. the file is replaced atomically (temp file, fsync, rename, fsync dir);
6. one transaction drops the row, bumps the version and stores the receipt.

A crash between 5 and 6 leaves a prepared row whose target shows whether the
write landed; recovery completes it or drops it, and refuses to guess when
the target matches neither side.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from tether.adapters._base import Fence, VerifierResult
from tether.adapters._errors import (
    FenceRejectedError,
    UnresolvedWriteError,
    UnsupportedEntryError,
    WorkspaceConfigError,
)
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
from tether.adapters._journal import Journal, Prepared
from tether.adapters._tree import Tree
from tether.core import (
    ActionKind,
    AdapterError,
    AdapterUnavailableError,
    Capabilities,
    ContractViolationError,
    EnvironmentState,
    IdempotencyConflictError,
    Intent,
    JSONValue,
    PreconditionFailedError,
    Receipt,
    VerifierRefusedError,
    canonical_bytes,
    digest_bytes,
    format_time,
)

ADAPTER_VERSION = "1"
_TAIL_CHARS = 2000


def _temp_name(key: str) -> str:
    # Derived from the key and recorded in the prepared row, so recovery can
    # remove a temp file a crash left in the tree (it would change the fingerprint).
    return ".tether-" + hashlib.sha256(key.encode()).hexdigest()[:16] + ".tmp"


class FileWorkspace:
    """A directory on disk managed as one environment instance.

    ``root`` is the tree the agent edits; ``journal_dir`` (outside ``root``)
    holds the receipt journal and the writer lock. ``verifier_allowlist``
    lists the exact argv tuples :meth:`verify` may run. Instances are safe to
    share between threads; any number of processes may open the same
    directories, and they see the same ``instance_id`` and receipts.
    """

    def __init__(
        self,
        root: Path,
        journal_dir: Path,
        *,
        verifier_allowlist: Sequence[tuple[str, ...]] = (),
        namespace: str = "file-workspace",
    ) -> None:
        if not namespace:
            raise WorkspaceConfigError("namespace must not be empty")
        self._namespace = namespace
        resolved_root, journal_dir = _resolve_dirs(Path(root), Path(journal_dir))
        self._tree = Tree(resolved_root)
        self._allowlist = frozenset(tuple(entry) for entry in verifier_allowlist)
        self._mutex = threading.RLock()
        self._journal = Journal(journal_dir)
        try:
            self._instance_id = self._journal.meta()[0]
            with self._exclusive():
                pass  # settles writes a crash left prepared, before anyone looks
        except BaseException:
            self._journal.close()
            raise

    # --- lifecycle ----------------------------------------------------

    def close(self) -> None:
        """Release the journal connection and the lock file; later calls raise."""
        with self._mutex:
            self._journal.close()

    def __enter__(self) -> FileWorkspace:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _exclusive(self) -> Iterator[Journal]:
        """Hold the thread mutex and the cross-process lock, with leftovers settled."""
        # flock excludes other open files, not other threads sharing this one.
        with self._mutex, self._journal.locked():
            self._recover()
            yield self._journal

    # --- identity -----------------------------------------------------

    @property
    def namespace(self) -> str:
        """Stable name of the kind of environment (default ``"file-workspace"``)."""
        return self._namespace

    @property
    def version(self) -> str:
        """Adapter code version; bound into receipts."""
        return ADAPTER_VERSION

    @property
    def instance_id(self) -> str:
        """Random id minted when the journal was created; a copy with another journal differs."""
        return self._instance_id

    @property
    def capabilities(self) -> Capabilities:
        """Idempotent, queryable, conditional, and fencing: it refuses superseded lease versions."""
        return Capabilities(idempotent=True, queryable=True, conditional_writes=True, fencing=True)

    @property
    def root(self) -> Path:
        """The resolved workspace tree."""
        return self._tree.root

    # --- reading ------------------------------------------------------

    def environment(self) -> EnvironmentState:
        """Identity, journal version and the fingerprint of every regular file."""
        with self._exclusive():
            return self._environment(self._tree.hashes())

    @property
    def kinds(self) -> tuple[ActionKind, ...]:
        """``file.write``, ``file.read`` and ``file.list``."""
        return FILE_KINDS

    def read(
        self, kind: str, target: str, args: dict[str, Any], scope: Callable[[str], bool]
    ) -> dict[str, JSONValue]:
        """One file's text (``file.read``; UTF-8, undecodable bytes replaced) or the paths in scope.

        A directory, a symlink or anything else that is not a regular file is
        a refused read (``not_a_file``), not a crash.
        """
        with self._exclusive():
            try:
                return read_files(kind, target, self._tree.hashes, self._tree.read, scope)
            except UnsupportedEntryError as exc:
                raise ContractViolationError("not_a_file", str(exc)) from exc

    def lookup(self, key: str) -> Receipt | None:
        """The receipt stored under ``key``; ``None`` if none (or its write is unresolved)."""
        with self._exclusive() as journal:
            return journal.receipt(key)

    def receipts_after(self, version: int, limit: int = 100) -> list[Receipt]:
        """Receipts whose post-state version is above ``version``, oldest first (see ListsReceipts)."""
        with self._exclusive() as journal:
            return journal.receipts_after(version, max(0, limit))

    def write_count(self) -> int:
        """How many journaled writes the tree actually received (bypass writes excluded)."""
        with self._exclusive() as journal:
            return journal.meta()[2]

    # --- writing ------------------------------------------------------

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """``{"content", "expected_sha256"}`` for a ``file.write``; ``None`` hash if absent."""
        with self._exclusive():
            return normalize_write(kind, target, args, self._tree.hash_of, conditional=True)

    def effect_identity(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """The content alone (the path is the target): the same content to the same path is
        the same effect, whatever the file held when it was proposed (``expected_sha256``)."""
        return {"content": args.get("content")}

    def derive_post_state(self, prestate: EnvironmentState, intent: Intent) -> EnvironmentState:
        """The exact environment :meth:`execute` leaves; the tree must still be at ``prestate``."""
        request = parse_write(intent, conditional=True)
        with self._exclusive():
            hashes = self._tree.hashes()
            check_prestate(prestate, self._environment(hashes))
            self._check_precondition(request)
            hashes[request.target] = request.after
            return EnvironmentState(
                self._namespace, self._instance_id, prestate.version + 1, fingerprint(hashes)
            )

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        """Write ``intent`` once under ``key`` and return its receipt.

        A replay with the same key and intent returns the stored receipt and
        writes nothing. With a ``fence`` the workspace keeps the highest lease
        version it has seen per run and refuses a lower one
        (:class:`FenceRejectedError`) before anything else, so a worker whose
        lease was taken over cannot write even if it still believes it owns
        the run.
        """
        if not key:
            raise ContractViolationError("bad_key", "the idempotency key must not be empty")
        request = parse_write(intent, conditional=True)
        check_instance(prestate, self._namespace, self._instance_id)
        intent_digest = intent.digest
        with self._exclusive() as journal:
            if fence is not None:
                if fence.expires_at is not None and datetime.now(UTC) >= fence.expires_at:
                    raise FenceRejectedError(fence.run_id, fence.lease_version, None)
                highest = journal.fence(fence.run_id)
                if fence.lease_version < highest:
                    raise FenceRejectedError(fence.run_id, fence.lease_version, highest)
                journal.raise_fence(fence.run_id, fence.lease_version)
            unresolved = journal.prepared(key)  # recovery just ran: what is left is unresolved
            if unresolved:
                row, actual = unresolved[0], self._hash_or_none(request.target)
                raise UnresolvedWriteError(key, row.target, row.before, row.after, actual)
            existing = journal.receipt(key)
            if existing is not None:
                if existing.intent_digest == intent_digest:
                    return existing
                raise IdempotencyConflictError(key, intent_digest, existing)
            self._check_precondition(request)
            temp_name = _temp_name(key)
            journal.prepare(
                Prepared(
                    key=key,
                    intent_digest=intent_digest,
                    target=request.target,
                    before=request.expected,
                    after=request.after,
                    temp_name=temp_name,
                    intent=canonical_bytes(intent.to_json()),
                )
            )
            # If this raises, the prepared row stays and the next call settles it.
            self._tree.replace(request.target, request.data, temp_name)
            return self._complete(key, intent_digest, request)

    def verify(self, argv: tuple[str, ...], timeout_s: int) -> VerifierResult:
        """Run an allowlisted command in ``root`` and report it against the state it judged.

        ``argv[0] == "python"`` runs this interpreter. Bytecode writing is
        disabled so the verifier cannot add ``__pycache__`` files to the tree.
        A timeout counts as a failure with exit code -1.
        """
        argv = tuple(argv)
        if not argv or argv not in self._allowlist:
            raise VerifierRefusedError(f"verifier {list(argv)!r} is not on the allowlist")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s <= 0:
            raise ContractViolationError("bad_verifier", "timeout_s must be a positive integer")
        command = [sys.executable, *argv[1:]] if argv[0] == "python" else list(argv)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        # Held for the whole run so no write lands between the run and its report.
        with self._exclusive():
            try:
                done = subprocess.run(
                    command,
                    cwd=self._tree.root,
                    capture_output=True,
                    timeout=timeout_s,
                    env=env,
                    check=False,
                )
                exit_code, output = done.returncode, done.stdout + done.stderr
            except subprocess.TimeoutExpired as exc:
                exit_code, output = -1, _as_bytes(exc.stdout) + _as_bytes(exc.stderr)
            except OSError as exc:
                raise AdapterUnavailableError(f"cannot start verifier {argv[0]!r}: {exc}") from exc
            return VerifierResult(
                passed=exit_code == 0,
                exit_code=exit_code,
                output_digest=digest_bytes(output),
                output_tail=output.decode("utf-8", errors="replace")[-_TAIL_CHARS:],
                environment=self._environment(self._tree.hashes()),
            )

    # --- test and demo helpers ----------------------------------------

    def bypass_write(self, relpath: str, content: str) -> None:
        """For tests and demos: change a file as another actor would, outside the journal.

        The fingerprint changes; the version and the write count do not.
        """
        check_target(relpath)
        with self._exclusive():
            self._tree.hash_of(relpath)  # refuses symlinks and non-files along the path
            temp_name = ".tether-bypass-" + secrets.token_hex(8) + ".tmp"
            self._tree.replace(relpath, content.encode("utf-8"), temp_name)

    def delete_receipt(self, key: str) -> bool:
        """For tests: lose the receipt under ``key`` (a broken adapter); True if it existed."""
        with self._exclusive() as journal:
            return journal.delete_receipt(key)

    def tamper_receipt(self, key: str, /, **field_changes: Any) -> Receipt:
        """For tests: rewrite fields of the stored receipt (drift); returns the new receipt."""
        with self._exclusive() as journal:
            current = journal.receipt(key)
            if current is None:
                raise AdapterError(f"no receipt under key {key!r} to tamper with")
            changed = tampered(current, field_changes)
            journal.replace_receipt(key, changed)
            return changed

    # --- internals (callers hold the lock) ----------------------------

    def _environment(self, hashes: dict[str, str]) -> EnvironmentState:
        version = self._journal.meta()[1]
        return EnvironmentState(self._namespace, self._instance_id, version, fingerprint(hashes))

    def _hash_or_none(self, target: str) -> str | None:
        try:
            return self._tree.hash_of(target)
        except UnsupportedEntryError:
            return None

    def _check_precondition(self, request: WriteRequest) -> None:
        actual = self._tree.hash_of(request.target)
        if actual != request.expected:
            raise PreconditionFailedError(
                request.target, request.expected or "absent", actual or "absent"
            )

    def _complete(self, key: str, intent_digest: str, request: WriteRequest) -> Receipt:
        """Step 6: drop the prepared row, bump both counters, store the receipt, atomically."""
        state = fingerprint(self._tree.hashes())

        def build(version: int) -> Receipt:
            return make_receipt(
                namespace=self._namespace,
                adapter_version=ADAPTER_VERSION,
                receipt_id="rcpt-" + secrets.token_hex(8),
                key=key,
                intent_digest=intent_digest,
                request=request,
                committed_at=format_time(datetime.now(UTC)),
                post_state=EnvironmentState(self._namespace, self._instance_id, version, state),
            )

        return self._journal.complete(key, build)

    def _recover(self) -> None:
        """Settle writes a crash left prepared: the target's content says what happened.

        After-content: the write landed, so finish it (receipt, version bump).
        Before-content: it never landed, so forget it. Anything else: leave the
        row; :meth:`execute` reports it as unresolved and :meth:`lookup` as absent.
        """
        for row in self._journal.prepared():
            request = row.request()
            try:
                actual = self._tree.hash_of(row.target)
            except UnsupportedEntryError:
                continue  # a symlink or directory is neither side: leave it unresolved
            # Only now, with the path proven free of symlinks, is removing the temp safe.
            self._tree.discard_temp(row.target, row.temp_name)
            if actual == row.after:
                self._complete(row.key, row.intent_digest, request)
            elif actual == row.before:
                self._journal.forget(row.key)


def _resolve_dirs(root: Path, journal_dir: Path) -> tuple[Path, Path]:
    """Resolve both directories and refuse a journal that a rewind of the tree could erase."""
    try:
        resolved_root = root.resolve(strict=True)
        resolved_journal = journal_dir.resolve(strict=False)
    except OSError as exc:
        raise WorkspaceConfigError(f"workspace root {root} is not usable: {exc}") from exc
    if not resolved_root.is_dir():
        raise WorkspaceConfigError(f"workspace root {resolved_root} is not a directory")
    if resolved_journal == resolved_root or resolved_root in resolved_journal.parents:
        raise WorkspaceConfigError(
            f"journal_dir {resolved_journal} is inside the workspace root {resolved_root}; "
            "put it outside, where rewinding the tree cannot erase receipts"
        )
    return resolved_root, resolved_journal


def _as_bytes(data: bytes | str | None) -> bytes:
    if data is None:
        return b""
    return data.encode("utf-8", errors="replace") if isinstance(data, str) else data
