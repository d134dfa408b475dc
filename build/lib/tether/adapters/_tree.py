"""The workspace tree on disk: reading, hashing and atomic, durable file changes.

Scanning the whole tree is the stat cache's (:mod:`._statcache`).

Nothing here follows a symlink. A symlink could point outside the tree, so
reading through it would fingerprint someone else's files and writing
through it would change them; both are refused with
:class:`~tether.adapters.UnsupportedEntryError` instead.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tether.adapters._errors import UnsupportedEntryError
from tether.core import AdapterUnavailableError, digest_bytes


class Tree:
    """Regular files under one resolved ``root``, addressed by POSIX relative paths.

    Callers pass canonical relative paths (see
    :func:`~tether.core.check_canonical_path`) and hold the workspace lock.
    """

    __slots__ = ("root",)

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, target: str) -> bytes | None:
        """The bytes of ``target``, ``None`` if absent; refuses symlinks on the way."""
        if not self._is_file(target):
            return None
        return read_file(self.root / target)

    def hash_of(self, target: str) -> str | None:
        """Content hash of ``target``, ``None`` if absent; refuses symlinks on the way."""
        if not self._is_file(target):
            return None
        return digest_bytes(read_file(self.root / target))

    def _is_file(self, target: str) -> bool:
        """Whether ``target`` is a regular file (False: absent); refuses anything else."""
        path = self.root
        parts = target.split("/")
        for index, part in enumerate(parts):
            path = path / part
            sub = "/".join(parts[: index + 1])
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise AdapterUnavailableError(f"cannot inspect {sub}: {exc}") from exc
            if stat.S_ISLNK(mode):
                raise UnsupportedEntryError(sub, "symlink")
            if index < len(parts) - 1:
                if not stat.S_ISDIR(mode):
                    raise UnsupportedEntryError(sub, "non-directory on the path to a file")
            elif not stat.S_ISREG(mode):
                kind = "directory" if stat.S_ISDIR(mode) else "special file"
                raise UnsupportedEntryError(sub, kind)
        return True

    def replace(
        self, target: str, data: bytes, temp_name: str, executable: bool | None = None
    ) -> None:
        """Replace ``target`` atomically and durably, creating (and syncing) parents.

        Call :meth:`hash_of` first: it proves the path holds no symlink. The
        temp file sits beside the target because ``os.replace`` is atomic only
        within one file system. The file keeps its mode (a new one is 0644)
        unless ``executable`` says which executable bits it must have.
        """
        parts = target.split("/")
        try:
            parent = self.root
            for part in parts[:-1]:
                child = parent / part
                try:
                    child.mkdir()
                except FileExistsError:
                    pass  # hash_of already proved it a real directory
                else:
                    _fsync_dir(parent)
                parent = child
            final = parent / parts[-1]
            try:
                mode = stat.S_IMODE(os.lstat(final).st_mode)
            except FileNotFoundError:
                mode = 0o644
            if executable is not None:
                mode = _with_exec(mode, executable)
            temp = parent / temp_name
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, mode)
            try:
                os.fchmod(fd, mode)  # keep an executable script executable
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, final)
            _fsync_dir(parent)
        except OSError as exc:
            raise AdapterUnavailableError(
                f"write to {target} failed; its outcome is settled on the next call: {exc}"
            ) from exc

    def discard_temp(self, target: str, temp_name: str) -> None:
        """Remove a temp file a crash left beside ``target`` (it would skew the fingerprint)."""
        parent = self.root.joinpath(*target.split("/")[:-1])
        temp = parent / temp_name
        try:
            if temp.is_symlink() or temp.is_file():
                temp.unlink()
                _fsync_dir(parent)
        except OSError as exc:
            raise AdapterUnavailableError(
                f"cannot remove leftover temp file {temp}: {exc}"
            ) from exc

    def chmod(self, target: str, executable: bool) -> None:
        """Set or clear ``target``'s executable bits (read bits decide which), durably."""
        path = self.root / target
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                mode = stat.S_IMODE(os.fstat(fd).st_mode)
                os.fchmod(fd, _with_exec(mode, executable))
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise AdapterUnavailableError(f"cannot change the mode of {target}: {exc}") from exc

    def delete(self, target: str) -> None:
        """Remove the file ``target`` if present (never following a symlink), durably."""
        parent = self.root.joinpath(*target.split("/")[:-1])
        try:
            os.unlink(self.root / target)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise AdapterUnavailableError(f"cannot delete {target}: {exc}") from exc
        _fsync_dir(parent)

    def remove_empty_dirs(self, target: str) -> None:
        """Remove directory ``target`` if it holds only (nested) empty directories.

        A directory that still holds a file is left alone: it is then part of
        the state, and the caller's final fingerprint check will say so.
        """
        path = self.root / target
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return
            for below, subdirs, files in os.walk(path, topdown=False):
                if files:
                    return
                for sub in subdirs:
                    child = os.path.join(below, sub)
                    if os.path.islink(child):
                        return
            for below, _subdirs, _files in os.walk(path, topdown=False):
                os.rmdir(below)
            _fsync_dir(path.parent)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise AdapterUnavailableError(f"cannot remove directory {target}: {exc}") from exc


def _with_exec(mode: int, executable: bool) -> int:
    # chmod +x the way git checks out: execute wherever read is allowed.
    if executable:
        return mode | ((mode & 0o444) >> 2) | stat.S_IXUSR
    return mode & ~0o111


def _fsync_dir(path: Path) -> None:
    # A rename or a new entry is durable only once its directory is synced.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str | Path) -> bytes:
    """The bytes of the regular file at ``path``; a symlink there is refused, not followed."""
    try:
        # O_NOFOLLOW: a symlink swapped in after the scan is refused, not followed.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise AdapterUnavailableError(f"cannot read {path}: {exc}") from exc


def check_name(rel: str) -> None:
    """Refuse a name that is not valid UTF-8 (it has no canonical JSON form)."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        # Such a name has no canonical JSON form, so it cannot be fingerprinted.
        shown = rel.encode("utf-8", "replace").decode("utf-8")
        raise UnsupportedEntryError(shown, "non-UTF-8 name") from None
