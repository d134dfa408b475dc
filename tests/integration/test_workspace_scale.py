"""The workspace's stat cache and Merkle fingerprint, on real files.

``files_hashed`` counts the file bodies a workspace read to hash them, which
is how these tests see a cache hit (no read) from a miss (a read).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.adapters import FileWorkspace, UnsupportedEntryError
from tether.adapters._filewrite import fingerprint
from tether.core import Intent, digest_bytes
from tether.testing import Sandbox

# Small enough for a test to outwait, large enough to cover the coarse kernel clock.
WINDOW_NS = 20_000_000


def settle() -> None:
    """Let every file written so far age past the racy window."""
    time.sleep(3 * WINDOW_NS / 1e9)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "tree"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "src" / "pkg" / "m.py").write_text("print(1)\n")
    (root / "src" / "run.sh").write_text("#!/bin/sh\n")
    return root, tmp_path / "journal"


@pytest.fixture
def ws(dirs: tuple[Path, Path]) -> Iterator[FileWorkspace]:
    with FileWorkspace(*dirs, racy_window_ns=WINDOW_NS) as workspace:
        yield workspace


def expected_fingerprint(root: Path) -> str:
    """The fingerprint recomputed from scratch with the reference (non-incremental) function."""
    hashes, executable = {}, set()
    for path in root.rglob("*"):
        if path.is_file():
            rel = path.relative_to(root).as_posix()
            hashes[rel] = digest_bytes(path.read_bytes())
            if os.stat(path).st_mode & 0o100:
                executable.add(rel)
    return fingerprint(hashes, executable)


def test_unchanged_files_are_not_read_again(ws: FileWorkspace) -> None:
    """A file whose stat tuple is unchanged and older than the racy window is not re-read."""
    settle()
    first = ws.environment()
    assert ws.files_hashed == 3
    assert ws.environment() == first
    assert ws.files_hashed == 3
    assert first.state_fingerprint == expected_fingerprint(ws.root)


def test_only_changed_files_are_hashed_again(ws: FileWorkspace) -> None:
    """After one file changes, a scan reads that file alone and the fingerprint follows it."""
    settle()
    ws.environment()
    (ws.root / "src" / "pkg" / "m.py").write_text("print(2)\n")
    settle()
    env = ws.environment()
    assert ws.files_hashed == 4
    assert env.state_fingerprint == expected_fingerprint(ws.root)


def test_an_edit_keeping_size_and_mtime_is_seen_through_ctime(ws: FileWorkspace) -> None:
    """Same size, mtime put back with os.utime: the ctime still moved, so the file is re-read."""
    target = ws.root / "a.txt"
    settle()
    before = ws.environment()
    old = os.stat(target)
    with open(target, "r+b") as handle:  # in place: same inode, same size
        handle.write(b"ALPHA")
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))
    now = os.stat(target)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (old.st_size, old.st_mtime_ns, old.st_ino)
    after = ws.environment()
    assert after.state_fingerprint != before.state_fingerprint
    assert after.state_fingerprint == expected_fingerprint(ws.root)


def test_a_new_inode_with_the_same_size_and_mtime_is_seen(ws: FileWorkspace) -> None:
    """A file replaced by rename (new inode) with size and mtime copied over is re-read."""
    target = ws.root / "a.txt"
    settle()
    before = ws.environment()
    old = os.stat(target)
    fresh = ws.root / "fresh.tmp"
    fresh.write_bytes(b"ALPHA")
    os.utime(fresh, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(fresh, target)
    assert os.stat(target).st_ino != old.st_ino
    after = ws.environment()
    assert after.state_fingerprint != before.state_fingerprint
    assert after.state_fingerprint == expected_fingerprint(ws.root)


def test_a_racy_entry_is_hashed_again(dirs: tuple[Path, Path]) -> None:
    """A file modified within the racy window of its cache entry is re-read, not trusted."""
    with FileWorkspace(*dirs, racy_window_ns=60_000_000_000) as ws:
        first = ws.environment()
        assert ws.files_hashed == 3
        assert ws.environment() == first
        assert ws.files_hashed == 6  # every file is younger than a minute: all re-read
    with FileWorkspace(*dirs, racy_window_ns=WINDOW_NS) as ws:
        settle()
        ws.environment()  # re-stamps whatever was racy, now that the files have aged
        seen = ws.files_hashed
        ws.environment()
        assert ws.files_hashed == seen


def test_chmod_x_changes_the_fingerprint(ws: FileWorkspace) -> None:
    """The executable bit is part of the state: chmod +x and back moves the fingerprint."""
    script = ws.root / "src" / "run.sh"
    before = ws.environment().state_fingerprint
    script.chmod(0o755)
    after = ws.environment().state_fingerprint
    assert after != before
    assert after == expected_fingerprint(ws.root)
    script.chmod(0o644)
    assert ws.environment().state_fingerprint == before


def test_a_write_keeps_the_executable_bit_and_the_derived_post_state_holds(
    ws: FileWorkspace,
) -> None:
    """derive_post_state predicts the tree after a write to an executable file exactly."""
    (ws.root / "src" / "run.sh").chmod(0o755)
    pre = ws.environment()
    args = ws.normalize("file.write", "src/run.sh", {"content": "#!/bin/sh\necho hi\n"})
    intent = Intent("file.write", "src/run.sh", args, "low")
    post = ws.derive_post_state(pre, intent)
    receipt = ws.execute("k1", intent, pre)
    assert receipt.post_state == post == ws.environment()
    assert os.stat(ws.root / "src" / "run.sh").st_mode & 0o111 == 0o111


def test_the_cache_survives_reopening(dirs: tuple[Path, Path]) -> None:
    """A reopened workspace trusts the persisted cache: nothing is read again."""
    settle()
    with FileWorkspace(*dirs, racy_window_ns=WINDOW_NS) as ws:
        first = ws.environment()
    with FileWorkspace(*dirs, racy_window_ns=WINDOW_NS) as ws:
        assert ws.environment() == first
        assert ws.files_hashed == 0


def test_a_damaged_cache_is_rebuilt_and_a_forged_row_is_not_trusted(
    dirs: tuple[Path, Path],
) -> None:
    """A row whose check fails is ignored; an unreadable cache file is replaced."""
    root, journal = dirs
    settle()
    with FileWorkspace(root, journal, racy_window_ns=WINDOW_NS) as ws:
        truth = ws.environment()
    with sqlite3.connect(journal / "statcache.sqlite") as conn:
        conn.execute("UPDATE files SET hash = ? WHERE path = 'a.txt'", (digest_bytes(b"lie"),))
    with FileWorkspace(root, journal, racy_window_ns=WINDOW_NS) as ws:
        assert ws.environment() == truth
        assert ws.files_hashed == 1
    for suffix in ("", "-wal", "-shm"):
        (journal / ("statcache.sqlite" + suffix)).unlink(missing_ok=True)
    (journal / "statcache.sqlite").write_bytes(b"not a database at all" * 100)
    with FileWorkspace(root, journal, racy_window_ns=WINDOW_NS) as ws:
        assert ws.environment() == truth
        assert ws.files_hashed == 3


def test_a_read_reads_only_the_asked_file(ws: FileWorkspace) -> None:
    """file.read opens the one target; it never scans or hashes the tree."""
    answer = ws.read("file.read", "a.txt", {}, lambda _path: True)
    assert answer["text"] == "alpha"
    assert ws.files_hashed == 0


def test_sandbox_and_workspace_agree_on_nested_trees(ws: FileWorkspace) -> None:
    """The incremental fingerprint equals the sandbox's reference one for nested files."""
    sandbox = Sandbox({"a.txt": "alpha", "src/pkg/m.py": "print(1)\n", "src/run.sh": "#!/bin/sh\n"})
    assert sandbox.environment().state_fingerprint == ws.environment().state_fingerprint


@pytest.mark.parametrize("kind", ["symlink", "special file"])
def test_a_scan_refuses_file_symlinks_and_special_files(ws: FileWorkspace, kind: str) -> None:
    """A symlink to a file or a FIFO deep in the tree is refused by name, never followed."""
    ws.environment()
    entry = ws.root / "src" / "pkg" / "odd"
    if kind == "symlink":
        entry.symlink_to(ws.root / "a.txt")
    else:
        os.mkfifo(entry)
    with pytest.raises(UnsupportedEntryError) as caught:
        ws.environment()
    assert (caught.value.path, caught.value.kind) == ("src/pkg/odd", kind)
