"""The workspace's inotify change watcher, on real files, against from-scratch fingerprints.

Every check compares the watched ``environment()`` with the fingerprint
recomputed from the files on disk. Most workspaces here never verify
(``verify_interval_s=None``), so a watcher bug cannot hide behind a
verifying full scan. ``dirs_listed`` shows whether a look walked the tree.
"""

from __future__ import annotations

import mmap
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.adapters import FileWorkspace, UnsupportedEntryError, WorkspaceConfigError
from tether.adapters._filewrite import fingerprint
from tether.adapters._watch import WatchMissedChangeWarning
from tether.core import Intent, digest_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")

WINDOW_NS = 20_000_000


def reference(root: Path) -> str:
    """The fingerprint recomputed from scratch with the reference (non-incremental) function."""
    hashes, executable = {}, set()
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            rel = path.relative_to(root).as_posix()
            hashes[rel] = digest_bytes(path.read_bytes())
            if os.stat(path).st_mode & 0o100:
                executable.add(rel)
    return fingerprint(hashes, executable)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "tree"
    for d in ("src/pkg", "src/other", "docs"):
        (root / d).mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "src" / "pkg" / "m.py").write_text("print(1)\n")
    (root / "src" / "other" / "n.py").write_text("print(2)\n")
    (root / "docs" / "index.md").write_text("# docs\n")
    return root, tmp_path / "journal"


@pytest.fixture
def ws(dirs: tuple[Path, Path]) -> Iterator[FileWorkspace]:
    with FileWorkspace(
        *dirs, racy_window_ns=WINDOW_NS, watch=True, verify_interval_s=None
    ) as workspace:
        assert workspace.watching, workspace.watch_problem
        workspace.environment()  # the cold look: a full scan that arms the watches
        yield workspace


def agrees(ws: FileWorkspace) -> bool:
    return ws.environment().state_fingerprint == reference(ws.root) and ws.watching


def test_an_unchanged_tree_is_not_walked(ws: FileWorkspace) -> None:
    """With the watcher armed and no events, environment() lists no directory and reads no file."""
    listed, hashed = ws.dirs_listed, ws.files_hashed
    first = ws.environment()
    assert ws.environment() == first
    assert (ws.dirs_listed, ws.files_hashed) == (listed, hashed)
    assert first.state_fingerprint == reference(ws.root)


def test_edits_by_this_process_are_seen(ws: FileWorkspace) -> None:
    """Edits in place, same-size edits and bypass writes each show up in the next look."""
    (ws.root / "src" / "pkg" / "m.py").write_text("print(9)\n")  # same size
    assert agrees(ws)
    listed = ws.dirs_listed
    (ws.root / "a.txt").write_text("alpha, longer")
    assert agrees(ws)
    assert ws.dirs_listed == listed  # a content edit re-stats the file, lists nothing
    ws.bypass_write("docs/index.md", "# changed\n")
    assert agrees(ws)


def test_edits_by_another_process_are_seen(ws: FileWorkspace) -> None:
    """A child process writing, creating and deleting files is seen through its events."""
    script = (
        "import os, sys; root = sys.argv[1];"
        "open(os.path.join(root, 'src/pkg/m.py'), 'w').write('from child\\n');"
        "os.makedirs(os.path.join(root, 'new/deep'));"
        "open(os.path.join(root, 'new/deep/c.txt'), 'w').write('child');"
        "os.remove(os.path.join(root, 'docs/index.md'))"
    )
    subprocess.run([sys.executable, "-c", script, str(ws.root)], check=True)
    assert agrees(ws)


def test_creates_in_new_nested_directories_are_seen(ws: FileWorkspace) -> None:
    """mkdir -p of new directories with files at several depths, then edits inside them."""
    (ws.root / "x" / "y" / "z").mkdir(parents=True)
    (ws.root / "x" / "y" / "z" / "f.txt").write_text("deep")
    (ws.root / "x" / "g.txt").write_text("shallow")
    (ws.root / "empty" / "dirs").mkdir(parents=True)
    assert agrees(ws)
    (ws.root / "x" / "y" / "z" / "f.txt").write_text("deeper")  # watched since the last look
    (ws.root / "empty" / "dirs" / "h.txt").write_text("not empty any more")
    assert agrees(ws)


def test_deletes_are_seen(ws: FileWorkspace) -> None:
    """Deleting a file, then a whole directory, then emptying one, each changes the fingerprint."""
    (ws.root / "a.txt").unlink()
    assert agrees(ws)
    shutil.rmtree(ws.root / "src" / "pkg")
    assert agrees(ws)
    (ws.root / "docs" / "index.md").unlink()  # docs/ stays, empty: not part of the state
    assert agrees(ws)
    (ws.root / "docs" / "back.md").write_text("back")
    assert agrees(ws)


def test_renames_of_files_and_directories_are_seen(ws: FileWorkspace) -> None:
    """Renames within and across directories, of a directory, and edits inside the renamed one."""
    (ws.root / "a.txt").rename(ws.root / "b.txt")
    assert agrees(ws)
    (ws.root / "b.txt").rename(ws.root / "docs" / "b.txt")
    assert agrees(ws)
    (ws.root / "src" / "pkg").rename(ws.root / "docs" / "pkg2")
    assert agrees(ws)
    # The moved directory's events must now be reported under its new name.
    (ws.root / "docs" / "pkg2" / "m.py").write_text("moved and edited\n")
    (ws.root / "docs" / "pkg2" / "sub").mkdir()
    (ws.root / "docs" / "pkg2" / "sub" / "s.txt").write_text("s")
    assert agrees(ws)
    outside = ws.root.parent / "outside"
    (ws.root / "docs" / "pkg2").rename(outside)  # moved out of the tree
    (outside / "m.py").write_text("no longer ours\n")
    assert agrees(ws)
    outside.rename(ws.root / "back")  # and in again
    assert agrees(ws)


def test_a_directory_and_a_file_trading_places_is_seen(ws: FileWorkspace) -> None:
    """A directory replaced by a file of the same name, and back, keeps the fingerprint right."""
    shutil.rmtree(ws.root / "src" / "other")
    (ws.root / "src" / "other").write_text("now a file")
    assert agrees(ws)
    (ws.root / "src" / "other").unlink()
    (ws.root / "src" / "other").mkdir()
    (ws.root / "src" / "other" / "again.py").write_text("again")
    assert agrees(ws)


def test_chmod_x_is_seen(ws: FileWorkspace) -> None:
    """Setting and clearing the executable bit changes the fingerprint as a full scan says."""
    before = ws.environment().state_fingerprint
    os.chmod(ws.root / "src" / "pkg" / "m.py", 0o755)
    assert agrees(ws)
    os.chmod(ws.root / "src" / "pkg" / "m.py", 0o644)
    assert agrees(ws)
    assert ws.environment().state_fingerprint == before


def test_a_symlink_is_refused_as_a_full_scan_refuses_it(ws: FileWorkspace) -> None:
    """A symlink appearing raises the same UnsupportedEntryError; removing it recovers."""
    (ws.root / "docs" / "link").symlink_to(ws.root / "a.txt")
    with pytest.raises(UnsupportedEntryError):
        ws.environment()
    (ws.root / "docs" / "link").unlink()
    assert ws.environment().state_fingerprint == reference(ws.root)


def test_a_hard_link_from_outside_is_followed(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """A file scanned with two links is re-stat'ed on every look: writes through the other raise
    no event here."""
    outside = tmp_path / "outside-link"
    os.link(dirs[0] / "a.txt", outside)
    with FileWorkspace(*dirs, watch=True, verify_interval_s=None) as ws:
        ws.environment()
        with open(outside, "r+b") as handle:
            handle.write(b"ALPHA")
        assert agrees(ws)
        outside.unlink()  # one link again: the next look learns it and stops re-stat'ing
        assert agrees(ws)


def test_steps_through_the_adapter_agree_with_the_tree(ws: FileWorkspace) -> None:
    """normalize, derive_post_state, execute: the derived post-state is what the tree holds."""
    for n in range(3):
        pre = ws.environment()
        args = ws.normalize("file.write", "src/pkg/m.py", {"content": f"step {n}\n"})
        intent = Intent("file.write", "src/pkg/m.py", args, "low")
        post = ws.derive_post_state(pre, intent)
        receipt = ws.execute(f"k{n}", intent, pre)
        assert receipt.post_state == post
        assert ws.environment() == post
        assert post.state_fingerprint == reference(ws.root)


def test_a_fresh_process_starts_cold_then_watches(dirs: tuple[Path, Path]) -> None:
    """A new instance has no watch history: its first look walks every directory, the next none."""
    with FileWorkspace(*dirs, watch=True, verify_interval_s=None) as first:
        first.environment()
    with FileWorkspace(*dirs, watch=True, verify_interval_s=None) as ws:
        ws.environment()
        assert ws.dirs_listed == 5  # the root, src, src/pkg, src/other, docs
        ws.environment()
        assert ws.dirs_listed == 5


def test_a_queue_overflow_falls_back_to_a_full_scan(ws: FileWorkspace) -> None:
    """A real IN_Q_OVERFLOW: the change whose event was dropped is still found, by a full scan."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 200_000:
        pytest.skip(f"max_queued_events is {limit}: too many events to overflow quickly")
    a, b = ws.root / "a.txt", ws.root / "docs" / "index.md"
    for i in range(limit // 2 + 10):  # alternating, so the kernel cannot merge them
        os.utime(a, ns=(i, i))
        os.utime(b, ns=(i, i))
    (ws.root / "src" / "pkg" / "m.py").write_text("its event is dropped\n")
    listed = ws.dirs_listed
    assert agrees(ws)
    assert ws.dirs_listed - listed >= 5  # walked everything
    (ws.root / "src" / "pkg" / "m.py").write_text("watched again\n")
    listed = ws.dirs_listed
    assert agrees(ws)
    assert ws.dirs_listed == listed


def test_the_watch_limit_falls_back_to_full_scans(dirs: tuple[Path, Path]) -> None:
    """Past max_watches (handled as ENOSPC) the watcher is dropped and full scans stay right."""
    with FileWorkspace(*dirs, watch=True, verify_interval_s=None, max_watches=5) as ws:
        ws.environment()
        assert ws.watching  # five directories, five watches
        (ws.root / "sixth").mkdir()
        (ws.root / "sixth" / "f.txt").write_text("one watch too many")
        assert ws.environment().state_fingerprint == reference(ws.root)
        assert not ws.watching
        assert ws.watch_problem is not None and "limit" in ws.watch_problem
        (ws.root / "sixth" / "f.txt").write_text("seen by a full scan")
        assert ws.environment().state_fingerprint == reference(ws.root)
    with FileWorkspace(*dirs, watch=True, max_watches=2) as ws:
        assert ws.environment().state_fingerprint == reference(ws.root)
        assert not ws.watching


def test_verification_catches_an_mmap_write(dirs: tuple[Path, Path]) -> None:
    """An mmap write raises no event; the verifying scan finds it, warns, and stops watching."""
    with FileWorkspace(*dirs, watch=True, verify_interval_s=0) as ws:
        with open(ws.root / "a.txt", "r+b") as handle:
            mapped = mmap.mmap(handle.fileno(), 0)
        before = ws.environment()
        with mapped:  # munmap raises IN_CLOSE_WRITE: the miss lasts while the map is open
            mapped[:5] = b"ALPHA"
            mapped.flush()
            with pytest.warns(WatchMissedChangeWarning) as caught:
                after = ws.environment()
        assert after.state_fingerprint == reference(ws.root) != before.state_fingerprint
        assert caught[0].message.paths == ["a.txt"]  # type: ignore[union-attr]
        assert not ws.watching and ws.watch_problem is not None


def test_verification_of_reported_changes_does_not_warn(dirs: tuple[Path, Path]) -> None:
    """Changes the watcher reported never count as misses, however often it is verified."""
    with FileWorkspace(*dirs, watch=True, verify_interval_s=0) as ws:
        ws.environment()
        with warnings.catch_warnings():
            warnings.simplefilter("error", WatchMissedChangeWarning)
            for n in range(3):
                (ws.root / "docs" / f"n{n}.md").write_text(str(n))
                assert agrees(ws)
        assert ws.watching


def test_watch_is_off_by_default_and_its_settings_are_checked(dirs: tuple[Path, Path]) -> None:
    """The default watches nothing and reports no problem; a negative interval or cap is refused."""
    with FileWorkspace(*dirs) as ws:
        assert not ws.watching and ws.watch_problem is None
    for bad in (
        {"verify_interval_s": -1.0},
        {"verify_interval_s": float("nan")},
        {"max_watches": 0},
    ):
        with pytest.raises(WorkspaceConfigError):
            FileWorkspace(*dirs, watch=True, **bad)  # type: ignore[arg-type]


def test_random_changes_agree_with_full_scans(dirs: tuple[Path, Path]) -> None:
    """Seeded bursts of creates, edits, deletes, renames and chmods: every look matches a rescan."""
    import random

    rng = random.Random(20261204)
    with FileWorkspace(*dirs, racy_window_ns=WINDOW_NS, watch=True, verify_interval_s=None) as ws:
        ws.environment()
        root = ws.root
        for _ in range(40):
            for _ in range(rng.randint(1, 6)):
                files = [p for p in root.rglob("*") if p.is_file()]
                folders = [root, *(p for p in root.rglob("*") if p.is_dir())]
                op = rng.choice(
                    ["edit", "create", "mkdir", "delete", "mv", "mvdir", "chmod", "rmdir"]
                )
                if op == "edit" and files:
                    rng.choice(files).write_text(str(rng.random()))
                elif op == "create":
                    (rng.choice(folders) / f"f{rng.randint(0, 99)}").write_text("new")
                elif op == "mkdir":
                    new = rng.choice(folders) / f"d{rng.randint(0, 99)}" / "inner"
                    new.mkdir(parents=True, exist_ok=True)
                    (new / "x").write_text("x")
                elif op == "delete" and files:
                    rng.choice(files).unlink()
                elif op == "mv" and files:
                    src, dest = rng.choice(files), rng.choice(folders)
                    if not (dest / src.name).is_dir():
                        src.rename(dest / src.name)
                elif op == "mvdir" and len(folders) > 1:
                    src, dest = rng.choice(folders[1:]), rng.choice(folders)
                    target = dest / f"m{rng.randint(0, 99)}"
                    if src not in (dest, *dest.parents) and not target.exists():
                        src.rename(target)
                elif op == "chmod" and files:
                    os.chmod(rng.choice(files), rng.choice([0o644, 0o755]))
                elif op == "rmdir" and len(folders) > 1:
                    shutil.rmtree(rng.choice(folders[1:]))
            assert agrees(ws)


def test_the_fast_tree_encoding_is_the_canonical_one() -> None:
    """encode_tree gives tree_bytes's bytes for plain, escaped, non-ASCII and odd-order names."""
    from tether.adapters._snapshot import tree_bytes
    from tether.adapters._statcache import encode_tree

    digest = digest_bytes(b"x")
    names = [
        "a",
        "B",
        "a b",
        "~",
        "0",
        'q"uote',
        "back\\slash",
        "tab\there",
        "é",
        "日本",
        "😀",
        "Z",
    ]
    for count in range(1, len(names) + 1):
        for shift in range(0, len(names), 3):
            chosen = (names[shift:] + names[:shift])[:count]
            entries = {
                name: ("file", digest, i % 2 == 0) if i % 3 else ("dir", digest, False)
                for i, name in enumerate(chosen)
            }
            assert encode_tree(entries) == tree_bytes(entries)
    assert encode_tree({}) == tree_bytes({})
    assert encode_tree({"f": ("file", 'not"a digest', False)}) == tree_bytes(
        {"f": ("file", 'not"a digest', False)}
    )


def test_a_forked_child_scans_and_leaves_the_parents_watches_alone(ws: FileWorkspace) -> None:
    """After fork() the child shares the inotify queue: it stops watching, the parent does not."""
    pid = os.fork()
    if pid == 0:  # the child: any failure is its exit status
        code = 1
        try:
            (ws.root / "docs" / "child.md").write_text("from the fork")
            seen = ws.environment().state_fingerprint == reference(ws.root)
            code = 0 if seen and not ws.watching else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    listed = ws.dirs_listed
    assert agrees(ws)  # the child's write, seen through the parent's own watches
    assert ws.dirs_listed - listed <= 1
