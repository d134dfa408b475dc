"""Content-addressed workspace snapshots: stored as blobs, restored whole, on real files."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.adapters import Fence, FenceRejectedError, FileWorkspace, RestoreIncompleteError
from tether.core import CheckpointCorruptError, EnvironmentDriftError, Intent, digest_bytes
from tether.store import SQLiteStore

# A child process that restores a snapshot and is SIGKILLed by its third file replacement.
DIE_MIDWAY = """
import os, signal, sys
from pathlib import Path
from tether.adapters import FileWorkspace, _tree
from tether.store import SQLiteStore

root, journal, store_path, target = sys.argv[1:]
original, calls = _tree.Tree.replace, [0]

def dying(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(self, *args, **kwargs)

_tree.Tree.replace = dying
with SQLiteStore(Path(store_path)) as store, FileWorkspace(Path(root), Path(journal)) as ws:
    ws.restore_snapshot(target, store.get_blob)
"""


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "tree"
    files = {
        "a.txt": b"alpha",
        "notes": b"a file that becomes a directory",
        "data.bin": bytes(range(256)),
        "bin/tool": b"#!/bin/sh\necho tool\n",
        "src/pkg/m.py": b"print(1)\n",
        "src/pkg/util.py": b"def f(): pass\n",
        "docs/old/readme.md": b"# old\n",
        "keep/untouched.txt": b"nobody touches me",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "bin" / "tool").chmod(0o755)
    return root, tmp_path / "journal"


@pytest.fixture
def ws(dirs: tuple[Path, Path]) -> Iterator[FileWorkspace]:
    with FileWorkspace(*dirs) as workspace:
        yield workspace


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    with SQLiteStore(tmp_path / "store.sqlite") as opened:
        yield opened


def files_of(root: Path) -> dict[str, tuple[bytes, bool]]:
    """Every regular file's bytes and executable bit, by relative path."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), bool(p.stat().st_mode & stat.S_IXUSR))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def take_snapshot(ws: FileWorkspace, store: SQLiteStore) -> tuple[str, dict[str, bytes]]:
    """Store the tree's missing blobs; returns the root and what was new."""
    root = ws.environment().state_fingerprint
    blobs = ws.snapshot_blobs(root, store.has_blob)
    store.put_blobs(blobs)
    return root, blobs


def mutate(root: Path) -> None:
    """Change, add, delete, rename, rewrite binary, drop the exec bit, remove a nested dir."""
    (root / "a.txt").write_bytes(b"alpha, edited")
    (root / "new.txt").write_bytes(b"added")
    (root / "src" / "pkg" / "util.py").unlink()
    os.rename(root / "src" / "pkg" / "m.py", root / "src" / "m2.py")
    (root / "data.bin").write_bytes(bytes(reversed(range(256))))
    (root / "bin" / "tool").chmod(0o644)
    shutil.rmtree(root / "docs")
    (root / "notes").unlink()
    (root / "notes").mkdir()
    (root / "notes" / "inside.txt").write_bytes(b"was a file")
    (root / "extra" / "deep").mkdir(parents=True)
    (root / "extra" / "deep" / "x.txt").write_bytes(b"to be removed with its directories")


def test_restore_gives_back_bytes_modes_and_fingerprint(
    ws: FileWorkspace, store: SQLiteStore
) -> None:
    """Snapshot, mutate every way, restore: same fingerprint, bytes and modes; version +1."""
    original = files_of(ws.root)
    root, _ = take_snapshot(ws, store)
    untouched = ws.root / "keep" / "untouched.txt"
    before = os.stat(untouched)
    mutate(ws.root)
    version = ws.environment().version
    restored = ws.restore_snapshot(root, store.get_blob)
    assert restored.state_fingerprint == root
    assert restored.version == version + 1
    assert restored == ws.environment()
    assert files_of(ws.root) == original
    assert not (ws.root / "extra").exists()
    after = os.stat(untouched)
    assert (after.st_ino, after.st_mtime_ns, after.st_ctime_ns) == (
        before.st_ino,
        before.st_mtime_ns,
        before.st_ctime_ns,
    )


def test_restore_writes_only_what_differs_and_is_idempotent(
    ws: FileWorkspace, store: SQLiteStore
) -> None:
    """Unchanged siblings keep their inode and ctime; a second restore changes nothing."""
    root, _ = take_snapshot(ws, store)
    sibling = ws.root / "src" / "pkg" / "util.py"
    before = os.stat(sibling)
    (ws.root / "src" / "pkg" / "m.py").write_bytes(b"print(2)\n")
    first = ws.restore_snapshot(root, store.get_blob)
    after = os.stat(sibling)
    assert (after.st_ino, after.st_ctime_ns) == (before.st_ino, before.st_ctime_ns)
    written = os.stat(ws.root / "src" / "pkg" / "m.py")
    assert ws.restore_snapshot(root, store.get_blob) == first
    again = os.stat(ws.root / "src" / "pkg" / "m.py")
    assert (again.st_ino, again.st_ctime_ns) == (written.st_ino, written.st_ctime_ns)


def test_a_snapshot_stores_only_what_changed(ws: FileWorkspace, store: SQLiteStore) -> None:
    """The second snapshot adds the changed file's blob and the trees on its path, nothing else."""
    _, first = take_snapshot(ws, store)
    assert len(first) == 8 + 7  # eight distinct files; root, bin, src, pkg, docs, old, keep
    (ws.root / "src" / "pkg" / "m.py").write_bytes(b"print(2)\n")
    root, second = take_snapshot(ws, store)
    trees = [b for b in second.values() if b.startswith(b"{")]
    assert set(second) - {digest_bytes(t) for t in trees} == {digest_bytes(b"print(2)\n")}
    assert len(trees) == 3  # src/pkg, src and the root
    assert root in second
    assert all(digest_bytes(body) == key for key, body in second.items())
    assert ws.snapshot_blobs(root, store.has_blob) == {}


@pytest.mark.parametrize("damage", ["missing file", "corrupt file", "corrupt tree"])
def test_a_missing_or_corrupt_blob_fails_closed_before_writing(
    ws: FileWorkspace, store: SQLiteStore, damage: str
) -> None:
    """A blob that is absent or does not hash to its address raises; nothing is written."""
    root, blobs = take_snapshot(ws, store)
    mutate(ws.root)
    tampered = dict(blobs)
    tool = digest_bytes(b"#!/bin/sh\necho tool\n")
    if damage == "missing file":
        del tampered[digest_bytes(b"alpha")]
    elif damage == "corrupt file":
        tampered[digest_bytes(b"alpha")] = b"alphA"
    else:
        tree = next(k for k, v in blobs.items() if b'"tool"' in v and tool.encode() in v)
        tampered[tree] = tampered[tree].replace(b"true", b"false")
    mutated, env = files_of(ws.root), ws.environment()
    with pytest.raises(CheckpointCorruptError):
        ws.restore_snapshot(root, tampered.get)
    assert files_of(ws.root) == mutated
    assert ws.environment() == env


def test_a_restore_killed_midway_is_finished_by_calling_it_again(
    dirs: tuple[Path, Path], store: SQLiteStore, tmp_path: Path
) -> None:
    """SIGKILL after two files: writes are refused until the same restore runs again, once."""
    root_dir, journal = dirs
    with FileWorkspace(root_dir, journal) as ws:
        original = files_of(ws.root)
        root, _ = take_snapshot(ws, store)
        mutate(ws.root)
        version = ws.environment().version
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            DIE_MIDWAY,
            str(root_dir),
            str(journal),
            str(tmp_path / "store.sqlite"),
            root,
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    with FileWorkspace(root_dir, journal) as ws:
        partial = ws.environment()
        assert partial.state_fingerprint != root and partial.version == version
        pre = ws.environment()
        intent = Intent(
            "file.write",
            "a.txt",
            ws.normalize("file.write", "a.txt", {"content": "x"}),
            "low",
        )
        with pytest.raises(RestoreIncompleteError):
            ws.execute("k1", intent, pre)
        done = ws.restore_snapshot(root, store.get_blob)
        assert (done.state_fingerprint, done.version) == (root, version + 1)
        assert files_of(ws.root) == original
        assert ws.restore_snapshot(root, store.get_blob) == done


def test_a_snapshot_restores_into_an_empty_tree_elsewhere(
    ws: FileWorkspace, store: SQLiteStore, tmp_path: Path
) -> None:
    """Another machine's empty workspace becomes the snapshot, from the store's blobs alone."""
    root, _ = take_snapshot(ws, store)
    (tmp_path / "elsewhere").mkdir()
    with FileWorkspace(tmp_path / "elsewhere", tmp_path / "elsewhere.journal") as other:
        restored = other.restore_snapshot(root, store.get_blob)
        assert (restored.state_fingerprint, restored.version) == (root, 1)
        assert files_of(other.root) == files_of(ws.root)


def test_snapshot_blobs_refuses_a_root_the_tree_is_not_at(
    ws: FileWorkspace, store: SQLiteStore
) -> None:
    """Asking for the blobs of a root the tree has left is drift, not a silent other snapshot."""
    root = ws.environment().state_fingerprint
    (ws.root / "a.txt").write_bytes(b"moved on")
    with pytest.raises(EnvironmentDriftError):
        ws.snapshot_blobs(root, store.has_blob)


def test_a_restore_under_a_superseded_lease_is_refused(
    ws: FileWorkspace, store: SQLiteStore
) -> None:
    """A fence older than one the workspace has seen refuses the restore before any change."""
    root, _ = take_snapshot(ws, store)
    (ws.root / "a.txt").write_bytes(b"changed")
    ws.restore_snapshot(root, store.get_blob, Fence("run-1", 2))
    (ws.root / "a.txt").write_bytes(b"changed again")
    env = ws.environment()
    with pytest.raises(FenceRejectedError):
        ws.restore_snapshot(root, store.get_blob, Fence("run-1", 1))
    assert ws.environment() == env


def test_a_session_that_knows_only_the_root_still_sends_only_what_changed(
    ws: FileWorkspace, store: SQLiteStore
) -> None:
    """Taking a step's first question as new never makes the walk resend subtrees the session never looked into."""
    from types import SimpleNamespace

    from tether.runtime._rewind import snapshot_blobs

    old_root, _ = take_snapshot(ws, store)
    rt = SimpleNamespace(store=store, adapter=ws)
    known = {old_root}  # a session that found the whole tree stored at its root
    (ws.root / "src" / "pkg" / "m.py").write_bytes(b"print(3)\n")
    root = ws.environment().state_fingerprint
    sent = snapshot_blobs(rt, root, known, since_known=True)
    assert sent is not None
    trees = [b for b in sent.values() if b.startswith(b"{")]
    assert set(sent) - {digest_bytes(t) for t in trees} == {digest_bytes(b"print(3)\n")}
    assert len(trees) == 3  # src/pkg, src and the root: keep/, docs/, bin/ are not resent
