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

The state fingerprint is the root of a content-addressed tree
(:mod:`._snapshot`), kept current by a stat cache (:mod:`._statcache`) so a
scan re-reads only files whose stat changed. With ``watch=True`` an inotify
watcher (:mod:`._watch`) says which directories and files changed, so a look
at an unchanged tree walks nothing; the watcher is armed during a full scan,
falls back to full scans whenever it may have missed something, and is
checked against a full scan every ``verify_interval_s`` seconds.

A snapshot restore follows the same shape as a write: fetch and verify every blob, record "restoring to
root" in the journal, rewrite what differs, then drop the record and bump the
version in one transaction; a crash in between is finished by restoring the
same root again, and writes are refused until then.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from tether.adapters._base import Fence, VerifierResult
from tether.adapters._errors import (
    FenceRejectedError,
    RestoreIncompleteError,
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
    make_receipt,
    normalize_write,
    parse_write,
    read_files,
    tampered,
)
from tether.adapters._journal import Journal, Prepared
from tether.adapters._snapshot import plan_restore
from tether.adapters._snapshot import snapshot_blobs as collect_blobs
from tether.adapters._statcache import RACY_WINDOW_NS, Scan, StatCache, encode_tree
from tether.adapters._tree import Tree
from tether.adapters._watch import Watcher, WatchMissedChangeWarning, unavailable_reason
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
    holds the receipt journal, the writer lock and the stat cache (see
    :mod:`tether.adapters._statcache`; ``racy_window_ns`` is how recently
    modified a file may be and still be re-read rather than trusted by stat).
    The state fingerprint is the root digest of the tree's content-addressed
    snapshot (:mod:`tether.adapters._snapshot`). ``verifier_allowlist``
    lists the exact argv tuples :meth:`verify` may run. Instances are safe to
    share between threads; any number of processes may open the same
    directories, and they see the same ``instance_id`` and receipts.

    ``watch=True`` (Linux, local file systems) keeps an inotify watch on every
    directory, so a look at the tree re-examines only what changed instead of
    stat'ing every file; the first look is still a full scan, and so is any
    look after the watcher may have missed events (queue overflow, an
    unreadable event). It is off by default because inotify is blind to
    writes through ``mmap`` and through hard links from outside the tree,
    and each watched directory draws on the per-user watch budget that
    editors and build tools share. ``verify_interval_s`` bounds how long such
    a miss can go unseen: the first look after that many seconds is a full
    scan compared with the watcher's answer, and a difference the watcher did
    not report warns (:class:`~tether.adapters._watch.WatchMissedChangeWarning`)
    and switches the watcher off for this instance (``None``: never verify).
    ``max_watches`` caps the watches taken; past it (or the kernel's limit)
    the workspace falls back to full scans. :attr:`watching` and
    :attr:`watch_problem` say which mode it is in and why.
    """

    #: Its effects stay in local, versioned storage (allowed under ``local-only``).
    local_effects = True

    def __init__(
        self,
        root: Path,
        journal_dir: Path,
        *,
        verifier_allowlist: Sequence[tuple[str, ...]] = (),
        namespace: str = "file-workspace",
        racy_window_ns: int = RACY_WINDOW_NS,
        watch: bool = False,
        verify_interval_s: float | None = 60.0,
        max_watches: int | None = None,
    ) -> None:
        if not namespace:
            raise WorkspaceConfigError("namespace must not be empty")
        if verify_interval_s is not None and not verify_interval_s >= 0:
            raise WorkspaceConfigError("verify_interval_s must be None or at least 0 seconds")
        if max_watches is not None and max_watches < 1:
            raise WorkspaceConfigError("max_watches must be None or at least 1")
        self._namespace = namespace
        resolved_root, journal_dir = _resolve_dirs(Path(root), Path(journal_dir))
        self._tree = Tree(resolved_root)
        self._allowlist = frozenset(tuple(entry) for entry in verifier_allowlist)
        self._mutex = threading.RLock()
        self._journal = Journal(journal_dir)
        self._cache = StatCache(journal_dir / "statcache.sqlite", resolved_root, racy_window_ns)
        self._watcher: Watcher | None = None
        self._watch_problem: str | None = None
        self._baseline = False  # the cache holds a full scan the watcher has tracked since
        self._verify_interval = verify_interval_s
        self._verified_at = 0.0
        if watch:
            self._watch_problem = unavailable_reason(str(resolved_root))
            if self._watch_problem is None:
                try:
                    self._watcher = Watcher(str(resolved_root), max_watches)
                except OSError as exc:  # EMFILE: the per-user inotify instances are used up
                    self._watch_problem = str(exc)
        try:
            self._instance_id = self._journal.meta()[0]
            with self._mutex, self._journal.locked():
                self._cache.load()
            with self._exclusive():
                pass  # settles writes a crash left prepared, before anyone looks
        except BaseException:
            self._journal.close()
            self._cache.close()
            self._drop_watcher(None)
            raise

    # --- lifecycle ----------------------------------------------------

    def close(self) -> None:
        """Release the journal connection and the lock file; later calls raise."""
        with self._mutex:
            self._journal.close()
            self._cache.close()
            self._drop_watcher(self._watch_problem or "closed")

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

    @property
    def watching(self) -> bool:
        """Whether a change watcher is on (``watch=True`` and nothing has switched it off)."""
        return self._watcher is not None

    @property
    def watch_problem(self) -> str | None:
        """Why the watcher asked for is off (platform, file system, limits, a miss); else None."""
        return self._watch_problem

    # --- reading ------------------------------------------------------

    def environment(self) -> EnvironmentState:
        """Identity, journal version and the fingerprint of every regular file."""
        with self._exclusive():
            return self._environment(self._scan().root)

    @property
    def files_hashed(self) -> int:
        """How many file bodies this instance has read to hash them (the stat cache's misses)."""
        return self._cache.files_hashed

    @property
    def dirs_listed(self) -> int:
        """How many directory listings this instance has read (a full scan reads every one)."""
        return self._cache.dirs_listed

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
                return read_files(
                    kind, target, lambda: self._scan().hashes(), self._tree.read, scope
                )
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
            scan = self._scan()
            check_prestate(prestate, self._environment(scan.root))
            self._check_precondition(request)
            # A replaced file keeps its mode; a new one is not executable.
            executable = scan.executable(request.target)
            post = scan.root_with(request.target, request.after, executable)
            return EnvironmentState(self._namespace, self._instance_id, prestate.version + 1, post)

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
                _check_fence(journal, fence)
            pending_root = journal.pending_restore()
            if pending_root is not None:
                raise RestoreIncompleteError(pending_root)
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

        ``argv[0] == "python"`` runs this interpreter. Bytecode writing and
        pytest's cache are disabled so the verifier cannot add
        ``__pycache__`` or ``.pytest_cache`` files to the tree (a tree the
        verifier changed reads, after a crash, as changed outside the run).
        A timeout counts as a failure with exit code -1.
        """
        argv = tuple(argv)
        if not argv or argv not in self._allowlist:
            raise VerifierRefusedError(f"verifier {list(argv)!r} is not on the allowlist")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s <= 0:
            raise ContractViolationError("bad_verifier", "timeout_s must be a positive integer")
        command = [sys.executable, *argv[1:]] if argv[0] == "python" else list(argv)
        addopts = f"{os.environ.get('PYTEST_ADDOPTS', '')} -p no:cacheprovider".strip()
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_ADDOPTS": addopts}
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
                environment=self._environment(self._scan().root),
            )

    # --- snapshots ----------------------------------------------------

    def snapshot_blobs(
        self,
        root: str,
        have: Callable[[str], bool],
        have_many: Callable[[list[str]], set[str]] | None = None,
    ) -> dict[str, bytes]:
        """The blobs of the snapshot ``root`` (file bodies, tree objects) that ``have`` lacks.

        ``root`` must be the tree's current fingerprint, or
        :class:`~tether.core.EnvironmentDriftError` is raised. Subtrees whose
        digest ``have`` already holds are not entered, so the cost and the
        size of the answer follow what changed since the last stored snapshot.
        Keys are ``sha256:`` digests of the bytes they map to.
        """
        with self._exclusive():
            scan = self._scan()
            if scan.root != root:
                raise EnvironmentDriftError(
                    "the tree is not at the snapshot root asked for; observe again",
                    expected=root,
                    actual=scan.root,
                )

            def body(relpath: str, expected: str) -> bytes:
                data = self._tree.read(relpath)
                actual = None if data is None else digest_bytes(data)
                if data is None or actual != expected:
                    raise EnvironmentDriftError(
                        f"{relpath} changed while its snapshot was taken; observe again",
                        expected=expected,
                        actual=actual,
                    )
                return data

            return collect_blobs(scan.dirs, scan.digests, body, have, encode_tree, have_many)

    def restore_snapshot(
        self, root: str, get_blob: Callable[[str], bytes | None], fence: Fence | None = None
    ) -> EnvironmentState:
        """Make the tree equal to the snapshot ``root``; returns the new environment.

        Only what differs is written: subtrees with equal digests are not
        visited, each differing file is replaced atomically and durably, files
        and directories the snapshot lacks are removed, executable bits are
        set. Every blob is fetched through ``get_blob`` and verified before
        anything is written; a missing or damaged one raises
        :class:`~tether.core.CheckpointCorruptError` with the tree untouched.

        The journal records the restore before the first change and bumps the
        version once, with the record's removal, when the tree is at ``root``.
        A restore killed midway leaves that record: writes are refused
        (:class:`RestoreIncompleteError`) until this is called again, which
        finishes the job. Called when the tree is already at ``root`` with no
        restore pending, it changes nothing and returns the current state.
        A ``fence`` is checked as :meth:`execute` checks it: a worker whose
        lease was taken over cannot rewind the tree either.
        """
        with self._exclusive() as journal:
            if fence is not None:
                _check_fence(journal, fence)
            unresolved = journal.prepared()
            if unresolved:
                # Rewriting its target could make an unresolved write look landed.
                row = unresolved[0]
                actual = self._hash_or_none(row.target)
                raise UnresolvedWriteError(row.key, row.target, row.before, row.after, actual)
            pending = journal.pending_restore()
            scan = self._scan()
            if pending is None and scan.root == root:
                return self._environment(root)
            plan = plan_restore(root, scan.root, scan.dirs, get_blob)
            journal.begin_restore(root)
            temp_name = _temp_name("restore:" + root)
            for path in plan.deletes:
                self._tree.delete(path)
            for directory in plan.rmdirs:
                self._tree.remove_empty_dirs(directory)
            for path, (data, executable) in plan.writes.items():
                self._tree.remove_empty_dirs(path)  # an empty directory in a file's place
                self._tree.replace(path, data, temp_name, executable)
            for path, executable in plan.chmods.items():
                self._tree.chmod(path, executable)
            landed = self._scan().root
            if landed != root:
                # Someone else is changing the tree; the record stays, a retry finishes.
                raise EnvironmentDriftError(
                    "the tree changed during the restore; call restore_snapshot again",
                    expected=root,
                    actual=landed,
                )
            version = journal.complete_restore()
            return EnvironmentState(self._namespace, self._instance_id, version, root)

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

    def _environment(self, root: str) -> EnvironmentState:
        version = self._journal.meta()[1]
        return EnvironmentState(self._namespace, self._instance_id, version, root)

    def _scan(self) -> Scan:
        """The tree's state now: from the watcher's changes when it is trusted, else a full scan."""
        watcher = self._watcher
        if watcher is None:
            return self._cache.scan()
        changes = watcher.take() if self._baseline else None
        if changes is None:
            return self._full_scan(watcher)
        self._baseline = False  # an update that raises leaves the cache half-done
        watched = self._cache.update(changes, watcher.watch_dir)
        self._baseline = True
        if watcher.broken is not None:
            self._drop_watcher(watcher.broken)  # this answer is right; the next must scan
        elif self._verify_interval is not None and (
            time.monotonic() - self._verified_at >= self._verify_interval
        ):
            return self._verify(watcher, watched)
        return watched

    def _full_scan(self, watcher: Watcher) -> Scan:
        """Walk everything, (re)arming a watch on each directory before it is listed."""
        self._baseline = False
        watcher.begin_full_scan()
        scan = self._cache.scan(watcher.watch_dir)
        watcher.end_full_scan()
        self._verified_at = time.monotonic()
        if watcher.broken is not None:
            self._drop_watcher(watcher.broken)
        else:
            self._baseline = True
        return scan

    def _verify(self, watcher: Watcher, watched: Scan) -> Scan:
        """A full scan checked against the watcher's answer; a miss it never reported ends it."""
        early = watcher.take()  # changes since the watched answer: a race, not a miss
        truth = self._full_scan(watcher)
        if early is None or self._watcher is None:
            return truth  # it lost track (and said so) or broke: nothing to judge
        early.merge(watcher.pending())  # changes during the full scan stay pending
        missed = [path for path in watched.differing(truth) if not early.covers(path)]
        if missed:
            warnings.warn(WatchMissedChangeWarning(missed), stacklevel=4)
            self._drop_watcher("missed changes to " + ", ".join(sorted(missed)[:5]))
        return truth

    def _drop_watcher(self, reason: str | None) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
            self._watch_problem = reason
        self._baseline = False

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
        state = self._scan().root

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


def _check_fence(journal: Journal, fence: Fence) -> None:
    """Refuse an expired or superseded lease version; otherwise record it as the highest seen."""
    if fence.expires_at is not None and datetime.now(UTC) >= fence.expires_at:
        raise FenceRejectedError(fence.run_id, fence.lease_version, None)
    highest = journal.fence(fence.run_id)
    if fence.lease_version < highest:
        raise FenceRejectedError(fence.run_id, fence.lease_version, highest)
    journal.raise_fence(fence.run_id, fence.lease_version)


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
