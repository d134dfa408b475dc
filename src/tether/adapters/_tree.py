"""The workspace tree on disk: scanning, hashing and atomic, durable file replacement.

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

    def scan(self) -> dict[str, Path]:
        """Every regular file by relative path; raises on a symlink or special file."""
        found: dict[str, Path] = {}
        stack: list[tuple[Path, str]] = [(self.root, "")]
        try:
            while stack:
                directory, prefix = stack.pop()
                with os.scandir(directory) as entries:
                    for entry in entries:
                        rel = prefix + entry.name
                        _check_name(rel)
                        if entry.is_symlink():
                            raise UnsupportedEntryError(rel, "symlink")
                        if entry.is_dir(follow_symlinks=False):
                            stack.append((Path(entry.path), rel + "/"))
                        elif entry.is_file(follow_symlinks=False):
                            found[rel] = Path(entry.path)
                        else:
                            raise UnsupportedEntryError(rel, "special file")
        except OSError as exc:
            raise AdapterUnavailableError(f"cannot read the workspace tree: {exc}") from exc
        return found

    def contents(self) -> dict[str, bytes]:
        """Every regular file's bytes by relative path."""
        return {rel: _read(path) for rel, path in self.scan().items()}

    def hashes(self) -> dict[str, str]:
        """Every regular file's ``sha256:<hex>`` by relative path."""
        return {rel: digest_bytes(_read(path)) for rel, path in self.scan().items()}

    def read(self, target: str) -> bytes | None:
        """The bytes of ``target``, ``None`` if absent; refuses symlinks on the way."""
        if self.hash_of(target) is None:
            return None
        return _read(self.root / target)

    def hash_of(self, target: str) -> str | None:
        """Content hash of ``target``, ``None`` if absent; refuses symlinks on the way."""
        path = self.root
        parts = target.split("/")
        for index, part in enumerate(parts):
            path = path / part
            sub = "/".join(parts[: index + 1])
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return None
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
        return digest_bytes(_read(path))

    def replace(self, target: str, data: bytes, temp_name: str) -> None:
        """Replace ``target`` atomically and durably, creating (and syncing) parents.

        Call :meth:`hash_of` first: it proves the path holds no symlink. The
        temp file sits beside the target because ``os.replace`` is atomic only
        within one file system.
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


def _fsync_dir(path: Path) -> None:
    # A rename or a new entry is durable only once its directory is synced.
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path) -> bytes:
    try:
        # O_NOFOLLOW: a symlink swapped in after the scan is refused, not followed.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise AdapterUnavailableError(f"cannot read {path}: {exc}") from exc


def _check_name(rel: str) -> None:
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        # Such a name has no canonical JSON form, so it cannot be fingerprinted.
        shown = rel.encode("utf-8", "replace").decode("utf-8")
        raise UnsupportedEntryError(shown, "non-UTF-8 name") from None
