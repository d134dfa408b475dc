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
#: ``(stat key, content hash, stamp_ns)``
CacheRow = tuple[StatKey, str, int]


def _checksum(path: str, key: StatKey, file_hash: str, stamp: int) -> str:
    text = f"{path}\x00{key}\x00{file_hash}\x00{stamp}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


@dataclass(slots=True)
class Scan:
    """One scan's result: the root digest, every file's hash, every directory's entries."""

    root: str
    hashes: dict[str, str]
    #: Directory prefix (``""``, ``"a/"``, ``"a/b/"``) -> its entries; only
    #: directories with at least one file below them.
    dirs: dict[str, dict[str, Entry]]
    digests: dict[str, str] = field(default_factory=dict)

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
    timestamps are compared with.
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
        self._rows: dict[str, CacheRow] = {}
        # Directory prefix -> (entries, digest) of the last scan.
        self._trees: dict[str, tuple[dict[str, Entry], str]] = {}
        self._conn: sqlite3.Connection | None = None
        #: File bodies read to hash them since this cache was opened.
        self.files_hashed = 0
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
            conn.execute("DELETE FROM header")
            conn.execute("INSERT INTO header VALUES (1, ?, ?)", (_FORMAT, self._root))
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
            )
            if ok:  # a damaged row is skipped: the file is simply hashed again
                self._rows[path] = (key, file_hash, stamp)

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
                [(p, *key, h, s, _checksum(p, key, h, s)) for p, (key, h, s) in changed.items()],
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
        old = self._rows
        fresh: dict[str, CacheRow] = {}
        changed: dict[str, CacheRow] = {}
        hashes: dict[str, str] = {}
        dirs: dict[str, dict[str, Entry]] = {}
        digests: dict[str, str] = {}
        trees = self._trees
        new_trees: dict[str, tuple[dict[str, Entry], str]] = {}
        window = self._window
        seen_old = [0]

        def walk(directory: str, prefix: str) -> str | None:
            entries: dict[str, Entry] = {}
            with os.scandir(directory) as listing:
                for item in listing:
                    name = item.name
                    rel = prefix + name
                    if not name.isascii():
                        check_name(rel)
                    if item.is_symlink():
                        raise UnsupportedEntryError(rel, "symlink")
                    if item.is_dir(follow_symlinks=False):
                        sub = walk(item.path, rel + "/")
                        if sub is not None:
                            entries[name] = (DIR, sub, False)
                        continue
                    if not item.is_file(follow_symlinks=False):
                        raise UnsupportedEntryError(rel, "special file")
                    st = item.stat(follow_symlinks=False)
                    key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode)
                    row = old.get(rel)
                    if row is not None:
                        seen_old[0] += 1
                    if row is not None and row[0] == key and max(key[1], key[2]) < row[2] - window:
                        file_hash = row[1]
                        fresh[rel] = row
                    else:
                        file_hash = digest_bytes(read_file(item.path))
                        self.files_hashed += 1
                        fresh[rel] = changed[rel] = (key, file_hash, stamp)
                    hashes[rel] = file_hash
                    entries[name] = (FILE, file_hash, bool(st.st_mode & stat.S_IXUSR))
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
        gone = [p for p in old if p not in fresh] if seen_old[0] < len(old) else []
        self._rows = fresh
        self._trees = new_trees
        self._persist(changed, gone)
        return Scan(root, hashes, dirs, digests)
