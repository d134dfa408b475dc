"""The stat cache: which file bodies need hashing again, and each directory's tree digest.

A scan still visits every directory and stats every file (a content edit in
place changes no directory's mtime, so nothing cheaper is safe), but a file
whose stat tuple -- size, mtime, ctime, inode, mode -- equals the one recorded
with its hash is not read again. Only changed directories get their tree
object re-encoded; the rest keep their digests.

**Racy timestamps.** An entry is recorded with ``stamp``, the clock reading
taken *before* the scan's first stat. It is trusted only while the file's
mtime and ctime are older than ``stamp - racy_window_ns``: a file modified
within the timestamp granularity of that moment (git's "racy git") could be
modified again in the same tick without any stat field changing, so it is
hashed again on the next scan, until it is old enough. The window covers
the kernel's coarse file clock lagging the precise one and one-second (or
two-second) timestamp file systems.

The cache persists in ``journal_dir/statcache.sqlite``. It is never an
authority: each row carries a check over its fields, a row that fails it is
ignored, and a file that cannot be opened or read is deleted and rebuilt.
Every row is a true observation ("this stat tuple had these bytes"), so
rows written by another process, or lost in a crash, only cost re-hashing.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from tether.adapters._errors import UnsupportedEntryError
from tether.adapters._snapshot import DIR, EMPTY_TREE, FILE, Entry, tree_bytes
from tether.adapters._tree import check_name, read_file
from tether.core import AdapterUnavailableError, digest_bytes

#: Default racy window: 2 s covers FAT's two-second mtimes, one-second file
#: systems and the coarse kernel clock; recently modified files cost a re-read.
RACY_WINDOW_NS = 2_000_000_000

_FORMAT = 1
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS header (id INTEGER PRIMARY KEY CHECK (id = 1),"
    " format INTEGER NOT NULL, root TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER NOT NULL,"
    " mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, inode INTEGER NOT NULL,"
    " mode INTEGER NOT NULL, hash TEXT NOT NULL, stamp_ns INTEGER NOT NULL,"
    " checksum TEXT NOT NULL)",
)

#: ``(size, mtime_ns, ctime_ns, inode, mode)``
StatKey = tuple[int, int, int, int, int]
#: ``(stat key, the file's tree entry, stamp_ns)``; held only once trusted.
CacheRow = tuple[StatKey, Entry, int]


def _checksum(path: str, key: StatKey, file_hash: str, stamp: int) -> str:
    text = f"{path}\x00{key}\x00{file_hash}\x00{stamp}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _entry(file_hash: str, mode: int) -> Entry:
    return (FILE, file_hash, bool(mode & stat.S_IXUSR))


@dataclass(slots=True)
class Scan:
    """One scan's result: the root digest and every directory's entries and digest."""

    root: str
    #: Directory prefix (``""``, ``"a/"``, ``"a/b/"``) -> its entries; only
    #: directories with at least one file below them (and always the root).
    dirs: dict[str, dict[str, Entry]]
    digests: dict[str, str] = field(default_factory=dict)

    def hashes(self) -> dict[str, str]:
        """Every file's content hash by relative path."""
        return {
            prefix + name: value
            for prefix, entries in self.dirs.items()
            for name, (kind, value, _exec) in entries.items()
            if kind == FILE
        }

    def executable(self, relpath: str) -> bool:
        """Whether ``relpath`` is a file with its executable bit set."""
        prefix, _, name = relpath.rpartition("/")
        entry = self.dirs.get(prefix + "/" if prefix else "", {}).get(name)
        return entry is not None and entry[0] == FILE and entry[2]

    def by_digest(self) -> dict[str, tuple[str, dict[str, Entry]]]:
        """Tree digest -> ``(prefix, entries)`` (equal subtrees share one digest)."""
        return {self.digests[prefix]: (prefix, entries) for prefix, entries in self.dirs.items()}

    def root_with(self, relpath: str, file_hash: str, executable: bool) -> str:
        """The root digest after ``relpath`` holds ``file_hash``: O(depth) tree objects.

        Callers have proved the path runs through directories only.
        """
        parts = relpath.split("/")
        prefixes = ["/".join(parts[:i]) + "/" if i else "" for i in range(len(parts))]
        child: Entry = (FILE, file_hash, executable)
        for depth in range(len(parts) - 1, -1, -1):
            entries = dict(self.dirs.get(prefixes[depth], {}))
            entries[parts[depth]] = child
            child = (DIR, digest_bytes(tree_bytes(entries)), False)
        return child[1]


class StatCache:
    """Stat-tuple -> hash rows for one tree, in memory and in a rebuildable SQLite file.

    Callers hold the workspace lock; ``clock_ns`` is the wall clock file
    timestamps are compared with. A row is kept only once it is trusted (the
    file's timestamps older than its stamp by the racy window): a racy
    observation is used for the scan that made it and then forgotten, so the
    next scan reads the file again.
    """

    def __init__(
        self,
        path: Path,
        root: Path,
        racy_window_ns: int = RACY_WINDOW_NS,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._path = path
        self._root = str(root)
        self._window = racy_window_ns
        self._clock = clock_ns
        # Directory prefix -> file name -> row: a scan looks a file up without
        # building its relative path, which is most of what a warm scan costs.
        self._rows: dict[str, dict[str, CacheRow]] = {}
        # Directory prefix -> (entries, digest) of the last scan.
        self._trees: dict[str, tuple[dict[str, Entry], str]] = {}
        self._conn: sqlite3.Connection | None = None
        #: File bodies read to hash them since this cache was opened.
        self.files_hashed = 0

    def load(self) -> None:
        """Open (or create) the cache file and load its rows; call it under the workspace lock.

        Under the lock, because a cache found damaged is deleted and rebuilt,
        which must not happen while another process is writing it.
        """
        try:
            self._open()
        except (sqlite3.Error, OSError):
            self._rebuild()

    # --- persistence ----------------------------------------------------

    def _open(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        self._conn = conn
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL: a crash may lose the newest rows, never tear the file.
        conn.execute("PRAGMA synchronous = NORMAL")
        for statement in _SCHEMA:
            conn.execute(statement)
        header = conn.execute("SELECT format, root FROM header WHERE id = 1").fetchone()
        if header != (_FORMAT, self._root):
            # Another tree or format: the rows describe something else.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM files")
            conn.execute("INSERT OR REPLACE INTO header VALUES (1, ?, ?)", (_FORMAT, self._root))
            conn.execute("COMMIT")
            return
        rows = conn.execute(
            "SELECT path, size, mtime_ns, ctime_ns, inode, mode, hash, stamp_ns, checksum"
            " FROM files"
        )
        for path, size, mtime, ctime, inode, mode, file_hash, stamp, check in rows:
            key = (size, mtime, ctime, inode, mode)
            ok = (
                isinstance(path, str)
                and isinstance(file_hash, str)
                and all(isinstance(v, int) for v in (*key, stamp))
                and check == _checksum(path, key, file_hash, stamp)
                and max(mtime, ctime) < stamp - self._window
            )
            if ok:  # a damaged (or, for this window, racy) row is skipped: hashed again
                prefix, _, name = path.rpartition("/")
                directory = self._rows.setdefault(prefix + "/" if prefix else "", {})
                directory[name] = (key, _entry(file_hash, mode), stamp)

    def _rebuild(self) -> None:
        self.close()
        self._rows.clear()
        for suffix in ("", "-wal", "-shm"):
            with suppress(OSError):
                os.unlink(str(self._path) + suffix)
        try:
            self._open()
        except (sqlite3.Error, OSError):
            self.close()  # run without persistence; the cache is only a speed-up

    def _persist(self, changed: dict[str, CacheRow], gone: list[str]) -> None:
        conn = self._conn
        if conn is None or not (changed or gone):
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("DELETE FROM files WHERE path = ?", [(p,) for p in gone])
            conn.executemany(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (p, *key, entry[1], s, _checksum(p, key, entry[1], s))
                    for p, (key, entry, s) in changed.items()
                ],
            )
            conn.execute("COMMIT")
        except sqlite3.Error:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._rebuild()

    def close(self) -> None:
        """Close the cache file; the in-memory rows stay usable."""
        if self._conn is not None:
            with suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    # --- scanning ---------------------------------------------------------

    def scan(self) -> Scan:
        """Stat the whole tree, hash what changed, and return the Merkle state."""
        stamp = self._clock()  # before the first stat: see "racy timestamps"
        trusted_before = stamp - self._window
        rows = self._rows
        changed: dict[str, CacheRow] = {}
        gone: list[str] = []
        dirs: dict[str, dict[str, Entry]] = {}
        digests: dict[str, str] = {}
        trees = self._trees
        new_trees: dict[str, tuple[dict[str, Entry], str]] = {}
        visited: set[str] = set()

        def walk(directory: str, prefix: str) -> str | None:
            entries: dict[str, Entry] = {}
            known = rows.get(prefix)
            if known is None:
                known = rows[prefix] = {}
            visited.add(prefix)
            hits = 0
            with os.scandir(directory) as listing:
                for item in listing:
                    name = item.name
                    if not name.isascii():
                        check_name(prefix + name)
                    # Files first (most entries are), and never through a symlink:
                    # with follow_symlinks=False a symlink is neither file nor dir.
                    if not item.is_file(follow_symlinks=False):
                        if item.is_dir(follow_symlinks=False):
                            sub = walk(item.path, prefix + name + "/")
                            if sub is not None:
                                entries[name] = (DIR, sub, False)
                            continue
                        kind = "symlink" if item.is_symlink() else "special file"
                        raise UnsupportedEntryError(prefix + name, kind)
                    st = item.stat(follow_symlinks=False)
                    key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode)
                    row = known.get(name)
                    if row is not None:
                        hits += 1
                        if row[0] == key:
                            entries[name] = row[1]
                            continue
                    entry = _entry(digest_bytes(read_file(item.path)), st.st_mode)
                    self.files_hashed += 1
                    entries[name] = entry
                    if key[1] < trusted_before and key[2] < trusted_before:
                        known[name] = changed[prefix + name] = (key, entry, stamp)
                    elif row is not None:
                        del known[name]  # racy: read again next time
                        hits -= 1
                        gone.append(prefix + name)
            if hits < len(known):
                for name in [n for n in known if entries.get(n, (DIR,))[0] != FILE]:
                    del known[name]
                    gone.append(prefix + name)
            if not entries:
                return None  # empty directories are not part of the state
            cached = trees.get(prefix)
            if cached is not None and cached[0] == entries:
                tree_digest = cached[1]
            else:
                tree_digest = digest_bytes(tree_bytes(entries))
            new_trees[prefix] = (entries, tree_digest)
            dirs[prefix] = entries
            digests[prefix] = tree_digest
            return tree_digest

        try:
            root = walk(self._root, "") or EMPTY_TREE
        except OSError as exc:
            raise AdapterUnavailableError(f"cannot read the workspace tree: {exc}") from exc
        if "" not in digests:
            dirs[""], digests[""] = {}, EMPTY_TREE
        if len(visited) < len(rows):  # whole directories went away
            for prefix in [p for p in rows if p not in visited]:
                gone.extend(prefix + name for name in rows.pop(prefix))
        self._trees = new_trees
        self._persist(changed, gone)
        return Scan(root, dirs, digests)
