"""The stat cache: which file bodies need hashing again, and each directory's tree digest.

A scan visits every directory and stats every file (a content edit in place
changes no directory's mtime, so nothing cheaper is safe without help), but a
file whose stat tuple -- size, mtime, ctime, inode, mode -- equals the one
recorded with its hash is not read again. Only changed directories get their
tree object re-encoded; the rest keep their digests. With help -- a watcher
(:mod:`._watch`) armed through the last scan that says which places changed
-- :meth:`StatCache.update` looks only there.

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
import re
import sqlite3
import stat
import time
from collections.abc import Callable, Mapping, Set
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.adapters._errors import UnsupportedEntryError
from tether.adapters._snapshot import DIR, EMPTY_TREE, FILE, Entry, tree_bytes
from tether.adapters._tree import check_name, read_file
from tether.adapters._watch import Changes
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


# Names RFC 8785 writes as they are (printable ASCII but '"' and '\\'), in
# the order it sorts them (UTF-16 code units: for ASCII, Python's order).
_PLAIN = re.compile(r"[ !#-\[\]-~]*")


def encode_tree(entries: Mapping[str, Entry]) -> bytes:
    """:func:`~tether.adapters._snapshot.tree_bytes`, about ten times faster for plain names.

    The scan re-encodes every directory from a change up to the root, and the
    general canonical encoder dominated that. Only names that canonical JSON
    writes unescaped take the short path (digests are ``sha256:<hex>``, plain
    too, but a row read back from the cache file is checked like a name);
    anything else goes through the canonical encoder. A test holds the
    two equal.
    """
    parts = []
    for name in sorted(entries):
        kind, value, executable = entries[name]
        if not (_PLAIN.fullmatch(name) and _PLAIN.fullmatch(value)):
            return tree_bytes(entries)
        if kind == FILE:
            flag = "true" if executable else "false"
            parts.append(f'"{name}":{{"exec":{flag},"hash":"{value}","type":"file"}}')
        else:
            parts.append(f'"{name}":{{"hash":"{value}","type":"dir"}}')
    return ("{" + ",".join(parts) + "}").encode("ascii")


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

    def differing(self, other: Scan) -> list[str]:
        """Paths of the files whose entry differs between this scan and ``other``."""
        found = []
        for prefix in self.dirs.keys() | other.dirs.keys():
            if self.digests.get(prefix) == other.digests.get(prefix):
                continue
            mine, theirs = self.dirs.get(prefix, {}), other.dirs.get(prefix, {})
            for name in mine.keys() | theirs.keys():
                a, b = mine.get(name), theirs.get(name)
                # A directory on both sides differs below: its own prefix says where.
                if a != b and FILE in (a and a[0], b and b[0]):
                    found.append(prefix + name)
        return found

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
            child = (DIR, digest_bytes(encode_tree(entries)), False)
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
        # The last scan's state, kept current by :meth:`update`: directory
        # prefix -> entries and -> tree digest (only directories with a file
        # below them, and always the root). Entry dicts are replaced, never
        # changed in place, so a Scan handed out earlier stays what it was.
        self._dirs: dict[str, dict[str, Entry]] = {}
        self._digests: dict[str, str] = {}
        # Directory prefix -> names of files with more than one link: a write
        # through another name raises no event here, so updates re-stat them.
        self._linked: dict[str, set[str]] = {}
        self._last: Scan | None = None
        self._conn: sqlite3.Connection | None = None
        #: File bodies read to hash them since this cache was opened.
        self.files_hashed = 0
        #: Directories listed since this cache was opened (a full scan lists them all).
        self.dirs_listed = 0

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

    def scan(self, on_dir: OnDir | None = None) -> Scan:
        """Stat the whole tree, hash what changed, and return the Merkle state.

        ``on_dir(path, prefix)`` is called for each directory just before it
        is listed (a watcher arms itself there, so nothing slips between).
        """
        run = _Pass(self._clock(), self._window)  # stamp before the first stat
        self._last = None
        dirs: dict[str, dict[str, Entry]] = {}
        digests: dict[str, str] = {}
        linked: dict[str, set[str]] = {}
        visited: set[str] = set()
        try:
            self._walk(run, self._root, "", on_dir, dirs, digests, linked, visited)
        except OSError as exc:
            raise AdapterUnavailableError(f"cannot read the workspace tree: {exc}") from exc
        if "" not in digests:
            dirs[""], digests[""] = {}, EMPTY_TREE
        rows = self._rows
        if len(visited) < len(rows):  # whole directories went away
            for prefix in [p for p in rows if p not in visited]:
                run.gone.extend(prefix + name for name in rows.pop(prefix))
        # Copies: update() changes the cache's maps, never a Scan handed out.
        self._dirs, self._digests, self._linked = dict(dirs), dict(digests), linked
        self._persist(run.changed, run.gone)
        self._last = Scan(digests[""], dirs, digests)
        return self._last

    def update(self, changes: Changes, on_dir: OnDir | None = None) -> Scan:
        """The state after ``changes``, looking only where they say (and at multiply-linked files).

        Valid only while every change since the last :meth:`scan` is in
        ``changes`` (a watcher armed through that scan that has lost nothing).
        A directory is listed again only if its listing may have changed; a
        file is stat'ed again only if it, or its directory, is named; tree
        objects are re-encoded from the changed directories up to the root.
        """
        if not changes and not self._linked and self._last is not None:
            return self._last  # nothing to look at: the last answer stands
        run = _Pass(self._clock(), self._window)
        self._last = None  # until this update is complete
        try:
            touched, tops = self._apply(run, changes, on_dir)
        except OSError as exc:
            raise AdapterUnavailableError(f"cannot read the workspace tree: {exc}") from exc
        self._propagate(touched, tops)
        self._persist(run.changed, run.gone)
        self._last = Scan(self._digests[""], dict(self._dirs), dict(self._digests))
        return self._last

    def _apply(
        self, run: _Pass, changes: Changes, on_dir: OnDir | None
    ) -> tuple[set[str], set[str]]:
        """Bring the directories ``changes`` name up to date; returns (touched, walked whole)."""
        tops: list[str] = []  # outermost directories to walk whole
        for prefix in sorted(changes.deep, key=len):
            if not any(prefix.startswith(top) for top in tops):
                tops.append(prefix)

        def inside_top(prefix: str) -> bool:
            return any(prefix.startswith(top) for top in tops)

        relist = {p for p in changes.relist if not inside_top(p)}
        names: dict[str, set[str]] = {}
        for source in (changes.names, self._linked):
            for prefix, found in source.items():
                if prefix not in relist and not inside_top(prefix):
                    names.setdefault(prefix, set()).update(found)
        for prefix, found in names.items():
            if not self._restat(run, prefix, found):
                relist.add(prefix)  # something other than a content edit happened there
        walked: set[str] = set()
        for prefix in sorted(relist, key=len):
            self._relist(run, prefix, set(tops), on_dir, walked)
        for top in tops:
            if top not in walked:
                self._walk_whole(run, top, on_dir)
                walked.add(top)
        return relist | set(names) | walked, walked

    def _real_dir(self, prefix: str) -> bool:
        """Whether ``prefix`` is a directory reached from the root through directories only."""
        path = self._root
        for part in prefix.split("/")[:-1]:
            path += "/" + part
            try:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    return False
            except FileNotFoundError:
                return False
        return True

    def _restat(self, run: _Pass, prefix: str, names: set[str]) -> bool:
        """Re-stat ``names`` in ``prefix``; False if one is not an existing regular file we knew."""
        old = self._dirs.get(prefix)
        if old is None or not self._real_dir(prefix):
            return False
        entries = dict(old)
        known = self._rows.setdefault(prefix, {})
        linked = self._linked.get(prefix)
        directory = self._root + "/" + prefix
        for name in names:
            if name not in entries or entries[name][0] != FILE:
                return False
            path = directory + name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return False
            if not stat.S_ISREG(st.st_mode):
                return False
            entries[name] = self._file(run, known, prefix, name, path, st)
            if st.st_nlink > 1:
                self._linked.setdefault(prefix, set()).add(name)
            elif linked is not None:
                linked.discard(name)
        self._dirs[prefix] = entries
        return True

    def _file(
        self, run: _Pass, known: dict[str, CacheRow], prefix: str, name: str, path: str, st: Any
    ) -> Entry:
        """One regular file's entry: from its trusted row if the stat matches, else read."""
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode)
        row = known.get(name)
        if row is not None and row[0] == key:
            return row[1]
        entry = _entry(digest_bytes(read_file(path)), st.st_mode)
        self.files_hashed += 1
        if key[1] < run.trusted_before and key[2] < run.trusted_before:
            known[name] = run.changed[prefix + name] = (key, entry, run.stamp)
        elif row is not None:
            del known[name]  # racy: read again next time
            run.gone.append(prefix + name)
        return entry

    def _relist(
        self,
        run: _Pass,
        prefix: str,
        deep: set[str],
        on_dir: OnDir | None,
        walked: set[str],
    ) -> None:
        """List ``prefix`` again; subdirectories new to us (or in ``deep``) are walked whole."""
        old = self._dirs.get(prefix, {})
        entries: dict[str, Entry] = {}
        items: list[os.DirEntry[str]] = []
        if self._real_dir(prefix):
            self.dirs_listed += 1
            try:
                with os.scandir(self._root + "/" + prefix) as listing:
                    items = list(listing)
            except (FileNotFoundError, NotADirectoryError):
                pass  # gone since the event: it lists as empty
        known = self._rows.setdefault(prefix, {})
        linked: set[str] = set()
        for item in items:
            name = item.name
            if not name.isascii():
                check_name(prefix + name)
            if item.is_file(follow_symlinks=False):
                st = item.stat(follow_symlinks=False)
                entries[name] = self._file(run, known, prefix, name, item.path, st)
                if st.st_nlink > 1:
                    linked.add(name)
            elif item.is_dir(follow_symlinks=False):
                sub = prefix + name + "/"
                digest = self._digests.get(sub)
                if digest is None or sub in deep:
                    digest = self._walk_whole(run, sub, on_dir)
                    walked.add(sub)
                if digest is not None:
                    entries[name] = (DIR, digest, False)
            else:
                kind = "symlink" if item.is_symlink() else "special file"
                raise UnsupportedEntryError(prefix + name, kind)
        for name in [n for n in known if entries.get(n, (DIR,))[0] != FILE]:
            del known[name]
            run.gone.append(prefix + name)
        if linked:
            self._linked[prefix] = linked
        else:
            self._linked.pop(prefix, None)
        for name, (kind, _value, _exec) in old.items():
            if kind == DIR and entries.get(name, (FILE,))[0] != DIR:
                self._purge(run, prefix + name + "/")  # gone, or no longer a directory
        self._dirs[prefix] = entries

    def _walk_whole(self, run: _Pass, prefix: str, on_dir: OnDir | None) -> str | None:
        """Walk the directory ``prefix`` and everything below it afresh; its digest or None."""
        dirs: dict[str, dict[str, Entry]] = {}
        digests: dict[str, str] = {}
        linked: dict[str, set[str]] = {}
        visited: set[str] = set()
        digest = None
        known_before = prefix in self._rows or prefix in self._dirs
        if self._real_dir(prefix):
            try:
                digest = self._walk(
                    run, self._root + "/" + prefix[:-1], prefix, on_dir, dirs, digests, linked,
                    visited,
                )  # fmt: skip
            except (FileNotFoundError, NotADirectoryError):
                dirs, digests, linked, visited, digest = {}, {}, {}, set(), None
        if known_before:
            self._purge(run, prefix, keep=visited)
        self._dirs.update(dirs)
        self._digests.update(digests)
        self._linked.update(linked)
        if digest is None:
            self._dirs.pop(prefix, None)
        return digest

    def _purge(self, run: _Pass, prefix: str, keep: Set[str] = frozenset()) -> None:
        """Forget what we knew under directory ``prefix`` (rows of ``keep`` stay: just written)."""
        for table in (self._dirs, self._digests, self._linked):
            for stale in [p for p in table if p.startswith(prefix)]:
                del table[stale]
        for stale in [p for p in self._rows if p.startswith(prefix) and p not in keep]:
            run.gone.extend(stale + name for name in self._rows.pop(stale))

    def _propagate(self, touched: set[str], walked: set[str]) -> None:
        """Re-encode the touched directories and their ancestors, deepest first."""
        todo = set(touched)
        for prefix in touched:
            parts = prefix.split("/")[:-1]
            todo.update("/".join(parts[:i]) + "/" if i else "" for i in range(len(parts)))
        todo.add("")
        fresh: set[str] = set()  # entry dicts made in this pass, safe to change in place
        dirs, digests = self._dirs, self._digests
        for prefix in sorted(todo, key=lambda p: p.count("/"), reverse=True):
            if prefix in walked and prefix not in fresh:
                digest = digests.get(prefix)  # _walk_whole computed it
            else:
                entries = dirs.get(prefix, {})
                digest = digest_bytes(encode_tree(entries)) if entries else None
                if digest is None:
                    dirs.pop(prefix, None)
                    digests.pop(prefix, None)
                else:
                    digests[prefix] = digest
            if prefix == "":
                dirs.setdefault("", {})
                digests[""] = digest or EMPTY_TREE
                break
            head, _, name = prefix[:-1].rpartition("/")
            parent = head + "/" if head else ""
            if parent not in fresh:
                dirs[parent] = dict(dirs.get(parent, {}))
                fresh.add(parent)
            siblings = dirs[parent]
            if digest is not None:
                siblings[name] = (DIR, digest, False)
            elif siblings.get(name, (FILE,))[0] == DIR:
                del siblings[name]

    def _walk(
        self,
        run: _Pass,
        directory: str,
        prefix: str,
        on_dir: OnDir | None,
        dirs: dict[str, dict[str, Entry]],
        digests: dict[str, str],
        linked: dict[str, set[str]],
        visited: set[str],
    ) -> str | None:
        """List ``directory`` and everything below it into ``dirs``/``digests``; its digest."""
        if on_dir is not None:
            on_dir(directory, prefix)
        rows = self._rows
        trusted_before = run.trusted_before
        entries: dict[str, Entry] = {}
        known = rows.get(prefix)
        if known is None:
            known = rows[prefix] = {}
        visited.add(prefix)
        hits = 0
        self.dirs_listed += 1
        with os.scandir(directory) as listing:
            for item in listing:
                name = item.name
                if not name.isascii():
                    check_name(prefix + name)
                # Files first (most entries are), and never through a symlink:
                # with follow_symlinks=False a symlink is neither file nor dir.
                if not item.is_file(follow_symlinks=False):
                    if item.is_dir(follow_symlinks=False):
                        sub = self._walk(
                            run, item.path, prefix + name + "/", on_dir, dirs, digests, linked,
                            visited,
                        )  # fmt: skip
                        if sub is not None:
                            entries[name] = (DIR, sub, False)
                        continue
                    kind = "symlink" if item.is_symlink() else "special file"
                    raise UnsupportedEntryError(prefix + name, kind)
                st = item.stat(follow_symlinks=False)
                if st.st_nlink > 1:
                    linked.setdefault(prefix, set()).add(name)
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
                    known[name] = run.changed[prefix + name] = (key, entry, run.stamp)
                elif row is not None:
                    del known[name]  # racy: read again next time
                    hits -= 1
                    run.gone.append(prefix + name)
        if hits < len(known):
            for name in [n for n in known if entries.get(n, (DIR,))[0] != FILE]:
                del known[name]
                run.gone.append(prefix + name)
        if not entries:
            return None  # empty directories are not part of the state
        if self._dirs.get(prefix) == entries:
            tree_digest = self._digests[prefix]
        else:
            tree_digest = digest_bytes(encode_tree(entries))
        dirs[prefix] = entries
        digests[prefix] = tree_digest
        return tree_digest


#: ``on_dir(path, prefix)``: called before a directory is listed.
OnDir = Callable[[str, str], None]


@dataclass(slots=True)
class _Pass:
    """One scan's or update's clock reading and the rows it changed."""

    stamp: int
    window: int
    changed: dict[str, CacheRow] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)

    @property
    def trusted_before(self) -> int:
        return self.stamp - self.window
