"""Linux inotify through ``ctypes``: which directories and files changed since the last look.

The watcher is never an authority, only a list of places to look again. It
takes one watch per directory of the tree; the stat cache adds each watch
*before* it lists that directory (:meth:`Watcher.watch_dir` is its hook), so
a change made during a scan is either seen by the listing or queued as an
event, never lost. :meth:`Watcher.take` drains the queue into a
:class:`Changes` value; ``None`` means the watcher may have missed something
(the kernel's queue overflowed, an event could not be read, the root itself
moved or went away) and the caller must scan the whole tree.

What inotify does not report, and so the watcher cannot either:

* writes through a shared ``mmap`` (no ``IN_MODIFY`` is raised);
* writes through a hard link whose other name lies outside the tree (the
  event goes to the directory the file was opened through); files that
  already have several links when scanned are re-examined on every look;
* changes made on another machine to a network file system. A tree whose
  file system is not on :data:`_LOCAL_FS` is refused (``"remote file system"``).

A workspace that opts in verifies itself periodically with a full scan for
the first two (see :class:`~tether.adapters.FileWorkspace`).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import struct
import sys
from dataclasses import dataclass, field

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000

#: Every event that can change what a scan would find.
WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_CREATE
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
#: Events after which the directory's listing, not just one file, may differ.
_LISTING = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name

#: statfs ``f_type`` of file systems whose every change is made by this kernel
#: (so inotify sees it): ext2/3/4, XFS, Btrfs, tmpfs, F2FS, ZFS, overlayfs, ramfs.
_LOCAL_FS = frozenset(
    {0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010, 0x2FC12FC1, 0x794C7630, 0x858458F6}
)


class WatchMissedChangeWarning(UserWarning):
    """A verifying full scan found changes the watcher never reported; it is switched off.

    ``paths`` are the files that differed. The usual causes are writes
    through ``mmap`` or through a hard link from outside the tree. The
    workspace goes on with full scans, which are always right.
    """

    def __init__(self, paths: list[str]) -> None:
        shown = ", ".join(sorted(paths)[:5]) + (", ..." if len(paths) > 5 else "")
        super().__init__(
            f"the change watcher missed changes to {shown} (mmap or hard-link writes?); "
            "this workspace now scans the whole tree on every look"
        )
        self.paths = sorted(paths)


@dataclass(slots=True)
class Changes:
    """Where to look again, by directory prefix (``""``, ``"a/"``, ``"a/b/"``)."""

    #: Directories whose listing may have changed (an entry created, deleted, renamed).
    relist: set[str] = field(default_factory=set)
    #: Directories that appeared (created or moved in): walk them whole.
    deep: set[str] = field(default_factory=set)
    #: Directory -> names whose content or mode may have changed.
    names: dict[str, set[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.relist or self.deep or self.names)

    def merge(self, other: Changes) -> None:
        """Add ``other``'s places to this one's."""
        self.relist |= other.relist
        self.deep |= other.deep
        for prefix, names in other.names.items():
            self.names.setdefault(prefix, set()).update(names)

    def covers(self, relpath: str) -> bool:
        """Whether a change at ``relpath`` (a file) is among the places to look again."""
        prefix, _, name = relpath.rpartition("/")
        prefix = prefix + "/" if prefix else ""
        if prefix in self.relist or name in self.names.get(prefix, ()):
            return True
        return any(relpath.startswith(d) for d in self.deep)


class _Libc:
    """The three inotify calls, bound once per process."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.init1 = libc.inotify_init1
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int
        self.rm_watch = libc.inotify_rm_watch
        self.rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self.rm_watch.restype = ctypes.c_int
        self.statfs = libc.statfs
        self.statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        self.statfs.restype = ctypes.c_int


@functools.cache
def _bind() -> _Libc:
    return _Libc()


def unavailable_reason(root: str) -> str | None:
    """Why a watcher cannot be trusted on ``root`` (``None``: it can)."""
    if not sys.platform.startswith("linux"):
        return f"inotify is Linux-only (this is {sys.platform})"
    try:
        libc = _bind()
    except (OSError, AttributeError) as exc:
        return f"libc has no inotify: {exc}"
    buffer = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if libc.statfs(os.fsencode(root), buffer) != 0:
        return f"statfs failed: {os.strerror(ctypes.get_errno())}"
    fs_type = ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF
    if fs_type not in _LOCAL_FS:
        return f"remote file system (statfs type {fs_type:#x}): other machines' changes raise no events"
    return None


class Watcher:
    """One inotify instance watching every directory under ``root``; callers hold the lock.

    ``max_watches`` caps how many watches this watcher may hold (a share of
    the per-user ``fs.inotify.max_user_watches`` budget, which editors and
    build tools draw on too); going past it is handled exactly like the
    kernel's ``ENOSPC``: the watcher is :attr:`broken`.
    """

    def __init__(self, root: str, max_watches: int | None = None) -> None:
        self._root = root
        self._max = max_watches
        self._libc = _bind()
        fd = self._libc.init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        self._fd = fd
        self._pid = os.getpid()
        self._paths: dict[int, str] = {}  # wd -> directory prefix
        self._wds: dict[str, int] = {}  # directory prefix -> wd
        self._seen: set[int] | None = None  # wds (re)added during a full scan
        self._pending = Changes()
        self._lost = False
        #: Why this watcher can no longer be trusted at all (``None`` while it can).
        self.broken: str | None = None

    @property
    def watches(self) -> int:
        """How many directories are watched."""
        return len(self._paths)

    def close(self) -> None:
        """Release the inotify instance (its watches go with it)."""
        if self._fd >= 0:
            os.close(self._fd)  # after fork() only this process's copy: the parent keeps watching
            self._fd = -1
        self._paths.clear()
        self._wds.clear()

    # --- watches ----------------------------------------------------------

    def watch_dir(self, path: str, prefix: str) -> None:
        """Watch directory ``path`` (``prefix`` in the tree); the scan lists it only afterwards."""
        if self.broken is not None:
            return
        known = self._wds.get(prefix)
        if self._max is not None and known is None and len(self._paths) >= self._max:
            self.broken = f"watch limit reached ({self._max} watches; like ENOSPC)"
            return
        wd = self._libc.add_watch(
            self._fd, os.fsencode(path), WATCH_MASK | IN_ONLYDIR | IN_DONT_FOLLOW
        )
        if wd < 0:
            code = ctypes.get_errno()
            if code in (errno.ENOENT, errno.ENOTDIR):
                return  # gone or replaced already: its parent's events say so
            self.broken = f"inotify_add_watch failed on {prefix or '.'}: {os.strerror(code)}"
            return
        old = self._paths.get(wd)
        if old is not None and old != prefix and self._wds.get(old) == wd:
            del self._wds[old]  # the same directory under a new name
        self._paths[wd] = prefix
        self._wds[prefix] = wd
        if self._seen is not None:
            self._seen.add(wd)

    def begin_full_scan(self) -> None:
        """A full scan starts: what it does not watch again is gone from the tree."""
        self.take()  # the scan sees all of it; events from now on are kept
        self._seen = set()

    def end_full_scan(self) -> None:
        """Drop the watches of directories the full scan no longer found."""
        seen, self._seen = self._seen, None
        if seen is None or self.broken is not None:
            return  # a broken watcher (maybe a forked copy) must not touch shared watches
        for wd in [w for w in self._paths if w not in seen]:
            self._forget(wd, remove=True)

    def _forget(self, wd: int, *, remove: bool) -> None:
        prefix = self._paths.pop(wd, None)
        if prefix is not None and self._wds.get(prefix) == wd:
            del self._wds[prefix]
        if remove and self._fd >= 0 and os.getpid() == self._pid:
            self._libc.rm_watch(self._fd, wd)  # EINVAL if the kernel dropped it already

    def _forget_below(self, prefix: str) -> None:
        for wd in [w for w, p in self._paths.items() if p.startswith(prefix)]:
            self._forget(wd, remove=True)

    # --- events -----------------------------------------------------------

    def take(self) -> Changes | None:
        """Everything changed since the last take; ``None`` if something may have been missed."""
        self.pending()
        changes, self._pending = self._pending, Changes()
        lost, self._lost = self._lost, False
        return None if lost or self.broken is not None else changes

    def pending(self) -> Changes:
        """Drain the queue into the changes the next :meth:`take` returns, and show them."""
        if os.getpid() != self._pid:
            # A forked child shares the parent's queue: reading it would steal events.
            self.broken = "inherited across fork()"
        if self.broken is not None:
            return self._pending
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            except OSError as exc:
                self.broken = f"cannot read inotify events: {exc}"
                break
            self._parse(data)
        return self._pending

    def _parse(self, data: bytes) -> None:
        offset, end = 0, len(data)
        while offset < end:
            if offset + _EVENT.size > end:
                self._lost = True  # a torn event: something may be missing
                return
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            start = offset + _EVENT.size
            offset = start + length
            if offset > end:
                self._lost = True
                return
            name = os.fsdecode(data[start:offset].split(b"\0", 1)[0])
            self._event(wd, mask, name)

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self._lost = True
            return
        if mask & IN_IGNORED:
            self._forget(wd, remove=False)
            return
        prefix = self._paths.get(wd)
        if prefix is None:
            return  # a watch we dropped: its directory is walked again where it now is
        if not name:  # about the watched directory itself
            if prefix == "" and mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT):
                self._lost = True  # the root itself went away or moved
            elif mask & IN_UNMOUNT:
                self._lost = True
            return  # otherwise its parent's event names it
        pending = self._pending
        if mask & IN_ISDIR:
            pending.relist.add(prefix)
            sub = prefix + name + "/"
            if mask & (IN_CREATE | IN_MOVED_TO):
                pending.deep.add(sub)
            elif mask & (IN_DELETE | IN_MOVED_FROM):
                pending.deep.discard(sub)
                self._forget_below(sub)
            return
        if mask & _LISTING:
            pending.relist.add(prefix)
        else:
            pending.names.setdefault(prefix, set()).add(name)
