"""FileWorkspace against real directories, a real SQLite journal and real child processes."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.adapters import (
    Adapter,
    FileWorkspace,
    UnresolvedWriteError,
    UnsupportedEntryError,
    WorkspaceConfigError,
)
from tether.core import (
    AdapterUnavailableError,
    ContractViolationError,
    EnvironmentDriftError,
    EnvironmentState,
    IdempotencyConflictError,
    Intent,
    PreconditionFailedError,
    Receipt,
    VerifierRefusedError,
    canonical_bytes,
    digest,
    digest_bytes,
)
from tether.testing import Sandbox

PASS = ("python", "-c", "import sys; sys.exit(0 if open('a.txt').read() == 'done' else 3)")
IMPORTS = ("python", "-c", "import helper; print(helper.VALUE)")
SLOW = ("python", "-c", "import time; print('started', flush=True); time.sleep(30)")

# A child process: open the same directories, report identity and a receipt.
INSPECT = """
import json, sys
from pathlib import Path
from tether.adapters import FileWorkspace
with FileWorkspace(Path(sys.argv[1]), Path(sys.argv[2])) as ws:
    receipt = ws.lookup(sys.argv[3])
    print(json.dumps({
        "instance_id": ws.instance_id,
        "receipt": None if receipt is None else receipt.to_json(),
        "environment": ws.environment().to_json(),
    }))
"""

# A child process racing another to execute the same key: both prepare the
# same intent, say they are ready, wait for the go file, then execute.
RACE = """
import json, sys, time
from pathlib import Path
from tether.adapters import FileWorkspace
from tether.core import Intent
root, journal, signals, name = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
with FileWorkspace(root, journal) as ws:
    args = ws.normalize("file.write", "race.txt", {"content": "winner"})
    intent = Intent("file.write", "race.txt", args, "low")
    prestate = ws.environment()
    (signals / f"ready-{name}").touch()
    deadline = time.monotonic() + 30
    while not (signals / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.001)
    print(json.dumps(ws.execute("race-key", intent, prestate).to_json()))
"""


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.txt").write_text("alpha")
    return root, tmp_path / "journal"


@pytest.fixture
def ws(dirs: tuple[Path, Path]) -> Iterator[FileWorkspace]:
    with FileWorkspace(*dirs, verifier_allowlist=[PASS, IMPORTS, SLOW]) as workspace:
        yield workspace


def propose(adapter: FileWorkspace | Sandbox, target: str, content: str) -> Intent:
    return Intent(
        "file.write", target, adapter.normalize("file.write", target, {"content": content}), "low"
    )


def insert_prepared(journal: Path, key: str, intent: Intent, temp_name: str) -> None:
    """Write a prepared row as a crash between the file write and the receipt leaves it."""
    args = intent.args
    with sqlite3.connect(journal / "journal.sqlite") as conn:
        conn.execute(
            "INSERT INTO prepared (idempotency_key, intent_digest, target, before_sha256,"
            " after_sha256, temp_name, intent) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                key,
                intent.digest,
                intent.target,
                args["expected_sha256"],
                digest_bytes(args["content"].encode()),
                temp_name,
                canonical_bytes(intent.to_json()),
            ),
        )
    conn.close()


def child(script: str, *argv: object) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


# --- configuration and identity ------------------------------------------


def test_workspace_satisfies_the_adapter_protocol(ws: FileWorkspace) -> None:
    """FileWorkspace is structurally an Adapter with the promised capabilities."""
    assert isinstance(ws, Adapter)
    caps = ws.capabilities
    assert (caps.idempotent, caps.queryable, caps.conditional_writes, caps.fencing) == (
        True,
        True,
        True,
        True,
    )
    assert ws.version == "1"


@pytest.mark.parametrize("where", ["root", "inside", "nested/deeper"])
def test_journal_inside_root_is_refused(tmp_path: Path, where: str) -> None:
    """A journal at or under the workspace root is refused, since a rewind could erase it."""
    root = tmp_path / "tree"
    root.mkdir()
    journal = root if where == "root" else root / where
    with pytest.raises(WorkspaceConfigError):
        FileWorkspace(root, journal)
    if where != "root":
        assert not journal.exists(), "refused before creating anything in the tree"


def test_journal_inside_root_via_symlink_is_refused(tmp_path: Path) -> None:
    """A journal path that resolves into the root through a symlink is refused too."""
    root = tmp_path / "tree"
    root.mkdir()
    (tmp_path / "alias").symlink_to(root)
    with pytest.raises(WorkspaceConfigError):
        FileWorkspace(root, tmp_path / "alias" / "journal")


def test_missing_root_is_refused(tmp_path: Path) -> None:
    """A root that does not exist is a configuration error, not a silently new tree."""
    with pytest.raises(WorkspaceConfigError):
        FileWorkspace(tmp_path / "absent", tmp_path / "journal")


def test_instance_id_persists_and_a_copy_with_another_journal_differs(
    dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    """Reopening the same journal keeps the instance id; another journal is another instance."""
    root, journal = dirs
    with FileWorkspace(root, journal) as first:
        instance = first.instance_id
        fingerprint = first.environment().state_fingerprint
        assert len(instance) == 32
    with FileWorkspace(root, journal) as again:
        assert again.instance_id == instance
    with FileWorkspace(root, tmp_path / "other-journal") as copy:
        assert copy.instance_id != instance
        assert copy.environment().state_fingerprint == fingerprint


def test_environment_fingerprints_every_regular_file(ws: FileWorkspace) -> None:
    """The fingerprint is the root tree object's digest; hidden files count, empty dirs do not."""
    (ws.root / "d").mkdir()
    (ws.root / "d" / "b.bin").write_bytes(b"\x00\xff")
    (ws.root / ".hidden").write_text("h")
    (ws.root / "empty-dir").mkdir()

    def file(data: bytes) -> dict[str, object]:
        return {"type": "file", "hash": digest_bytes(data), "exec": False}

    subtree = digest({"b.bin": file(b"\x00\xff")})
    expected = digest(
        {"a.txt": file(b"alpha"), "d": {"type": "dir", "hash": subtree}, ".hidden": file(b"h")}
    )
    env = ws.environment()
    assert env == EnvironmentState("file-workspace", ws.instance_id, 0, expected)


def test_sandbox_and_workspace_agree_on_fingerprints(ws: FileWorkspace) -> None:
    """The same files give the same fingerprint in the sandbox and on disk."""
    (ws.root / "d").mkdir()
    (ws.root / "d" / "b.txt").write_text("beta")
    sandbox = Sandbox({"a.txt": "alpha", "d/b.txt": "beta"})
    assert sandbox.environment().state_fingerprint == ws.environment().state_fingerprint


def test_read_returns_text_with_replacement(ws: FileWorkspace) -> None:
    """file.read shows one file as UTF-8 text, replacing undecodable bytes; list names them all."""
    (ws.root / "bin.dat").write_bytes(b"ok\xff")
    everything = lambda path: True  # noqa: E731
    seen = ws.read("file.read", "bin.dat", {}, everything)
    assert seen == {
        "path": "bin.dat",
        "exists": True,
        "sha256": "sha256:" + hashlib.sha256(b"ok\xff").hexdigest(),
        "text": "ok\ufffd",
    }
    missing = ws.read("file.read", "nope.txt", {}, everything)
    assert missing == {"path": "nope.txt", "exists": False, "sha256": None, "text": None}
    listed = ws.read("file.list", "", {}, everything)
    assert sorted(listed["files"]) == ["a.txt", "bin.dat"]  # type: ignore[arg-type]
    scoped = ws.read("file.list", "", {}, lambda path: path == "a.txt")
    assert list(scoped["files"]) == ["a.txt"]  # type: ignore[call-overload]
    (ws.root / "d").mkdir()
    with pytest.raises(ContractViolationError) as refused:
        ws.read("file.read", "d", {}, everything)
    assert refused.value.reason == "not_a_file"


def test_symlinks_are_refused(ws: FileWorkspace, tmp_path: Path) -> None:
    """A symlink anywhere in the tree makes the workspace refuse rather than follow it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws.root / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsupportedEntryError) as caught:
        ws.environment()
    assert caught.value.path == "link"
    with pytest.raises(UnsupportedEntryError):
        ws.normalize("file.write", "link/escape.txt", {"content": "x"})
    assert not (outside / "escape.txt").exists()


def test_closed_workspace_refuses_calls(dirs: tuple[Path, Path]) -> None:
    """After close every call raises AdapterUnavailableError."""
    workspace = FileWorkspace(*dirs)
    workspace.close()
    workspace.close()
    with pytest.raises(AdapterUnavailableError):
        workspace.environment()


# --- writes ----------------------------------------------------------------


def test_execute_writes_exact_content_atomically(ws: FileWorkspace) -> None:
    """execute leaves exactly the new bytes, creates parents, and no temp file behind."""
    intent = propose(ws, "deep/er/new.txt", "héllo\n")
    receipt = ws.execute("key-1", intent, ws.environment())
    assert (ws.root / "deep" / "er" / "new.txt").read_bytes() == "héllo\n".encode()
    assert sorted(p.name for p in (ws.root / "deep" / "er").iterdir()) == ["new.txt"]
    assert receipt.result == {
        "path": "deep/er/new.txt",
        "sha256": digest_bytes("héllo\n".encode()),
        "bytes": 7,
    }
    assert receipt.business_object_id == "deep/er/new.txt"
    assert receipt.receipt_id.startswith("rcpt-")
    assert ws.write_count() == 1


def test_execute_keeps_the_file_mode(ws: FileWorkspace) -> None:
    """Replacing an executable file keeps it executable."""
    script = ws.root / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    ws.execute("key-1", propose(ws, "run.sh", "#!/bin/sh\necho hi\n"), ws.environment())
    assert script.stat().st_mode & 0o777 == 0o755


def test_replay_returns_the_same_receipt_without_writing(ws: FileWorkspace) -> None:
    """Executing the same key and intent again returns the first receipt; one write happened."""
    intent = propose(ws, "a.txt", "omega")
    prestate = ws.environment()
    first = ws.execute("key-1", intent, prestate)
    second = ws.execute("key-1", intent, prestate)
    assert second == first
    assert ws.write_count() == 1
    assert ws.environment().version == 1
    assert ws.lookup("key-1") == first


def test_same_key_different_intent_conflicts(ws: FileWorkspace) -> None:
    """Another intent under a used key raises IdempotencyConflictError carrying the receipt."""
    prestate = ws.environment()
    first = ws.execute("key-1", propose(ws, "a.txt", "omega"), prestate)
    other = Intent("file.write", "b.txt", {"content": "x", "expected_sha256": None}, "low")
    with pytest.raises(IdempotencyConflictError) as caught:
        ws.execute("key-1", other, prestate)
    assert caught.value.receipt == first
    assert not (ws.root / "b.txt").exists()


def test_precondition_failure_leaves_the_file_alone(ws: FileWorkspace) -> None:
    """A target changed since normalize makes execute raise PreconditionFailedError."""
    intent = propose(ws, "a.txt", "omega")
    prestate = ws.environment()
    ws.bypass_write("a.txt", "meddled")
    with pytest.raises(PreconditionFailedError) as caught:
        ws.execute("key-1", intent, prestate)
    assert caught.value.expected == digest_bytes(b"alpha")
    assert caught.value.actual == digest_bytes(b"meddled")
    assert (ws.root / "a.txt").read_text() == "meddled"
    assert ws.lookup("key-1") is None
    assert ws.write_count() == 0


def test_derive_post_state_equals_environment_after_execute(ws: FileWorkspace) -> None:
    """The predicted post-state is exactly environment() and the receipt's post_state."""
    intent = propose(ws, "src/new.py", "print('hi')\n")
    prestate = ws.environment()
    predicted = ws.derive_post_state(prestate, intent)
    receipt = ws.execute("key-1", intent, prestate)
    assert predicted == ws.environment() == receipt.post_state
    assert predicted.version == 1


def test_derive_post_state_refuses_a_moved_environment(ws: FileWorkspace) -> None:
    """derive_post_state raises EnvironmentDriftError once the tree left the prestate."""
    intent = propose(ws, "b.txt", "x")
    prestate = ws.environment()
    ws.bypass_write("c.txt", "drift")
    with pytest.raises(EnvironmentDriftError):
        ws.derive_post_state(prestate, intent)


def test_bypass_write_changes_fingerprint_not_version(ws: FileWorkspace) -> None:
    """A write outside the journal moves the fingerprint but neither version nor write count."""
    before = ws.environment()
    ws.bypass_write("a.txt", "other actor")
    after = ws.environment()
    assert after.state_fingerprint != before.state_fingerprint
    assert after.version == before.version == 0
    assert ws.write_count() == 0
    assert (ws.root / "a.txt").read_text() == "other actor"


def test_receipts_survive_a_rewind_of_the_tree(ws: FileWorkspace) -> None:
    """Restoring the tree's old content does not erase the receipt kept in the journal."""
    receipt = ws.execute("key-1", propose(ws, "a.txt", "omega"), ws.environment())
    (ws.root / "a.txt").write_text("alpha")
    assert ws.lookup("key-1") == receipt


def test_delete_and_tamper_receipt(ws: FileWorkspace) -> None:
    """The test hooks edit the journal row: tampering shows in lookup, deleting loses it."""
    original = ws.execute("key-1", propose(ws, "a.txt", "omega"), ws.environment())
    changed = ws.tamper_receipt("key-1", result={"path": "a.txt", "sha256": "x", "bytes": 0})
    assert ws.lookup("key-1") == changed != original
    assert ws.delete_receipt("key-1") is True
    assert ws.lookup("key-1") is None


# --- crash recovery ----------------------------------------------------------


def test_prepared_write_that_landed_is_completed_on_open(dirs: tuple[Path, Path]) -> None:
    """A prepared row whose file shows the new content gets its receipt and version bump."""
    root, journal = dirs
    with FileWorkspace(root, journal) as ws:
        intent = propose(ws, "a.txt", "omega")
    insert_prepared(journal, "key-1", intent, ".tether-crash.tmp")
    (root / "a.txt").write_text("omega")
    with FileWorkspace(root, journal) as ws:
        receipt = ws.lookup("key-1")
        assert receipt is not None
        assert receipt.intent_digest == intent.digest
        assert receipt.post_state == ws.environment()
        assert ws.write_count() == 1
        assert ws.execute("key-1", intent, ws.environment()) == receipt
        assert ws.write_count() == 1


def test_prepared_write_that_never_landed_is_dropped_on_open(dirs: tuple[Path, Path]) -> None:
    """A prepared row whose file is unchanged is forgotten, its temp file removed, and retry works."""
    root, journal = dirs
    with FileWorkspace(root, journal) as ws:
        intent = propose(ws, "a.txt", "omega")
        prestate = ws.environment()
    insert_prepared(journal, "key-1", intent, ".tether-crash.tmp")
    (root / ".tether-crash.tmp").write_text("om")  # a torn temp file the crash left
    with FileWorkspace(root, journal) as ws:
        assert not (root / ".tether-crash.tmp").exists()
        assert ws.lookup("key-1") is None
        assert ws.environment() == prestate
        ws.execute("key-1", intent, prestate)
        assert ws.write_count() == 1
        assert (root / "a.txt").read_text() == "omega"


def test_prepared_write_matching_neither_side_stays_unresolved(dirs: tuple[Path, Path]) -> None:
    """When the target is neither before nor after, execute refuses and lookup says None."""
    root, journal = dirs
    with FileWorkspace(root, journal) as ws:
        intent = propose(ws, "a.txt", "omega")
    insert_prepared(journal, "key-1", intent, ".tether-crash.tmp")
    (root / "a.txt").write_text("a third thing")
    with FileWorkspace(root, journal) as ws:
        assert ws.lookup("key-1") is None
        with pytest.raises(UnresolvedWriteError) as caught:
            ws.execute("key-1", intent, ws.environment())
        assert caught.value.actual == digest_bytes(b"a third thing")
        (root / "a.txt").write_text("omega")  # an operator restores the after-content
        assert ws.lookup("key-1") is not None


# --- verifier ------------------------------------------------------------------


def test_verifier_outside_the_allowlist_is_refused(ws: FileWorkspace) -> None:
    """Only an argv exactly equal to an allowlist entry may run."""
    with pytest.raises(VerifierRefusedError):
        ws.verify(("python", "-c", "print('not allowed')"), 5)
    with pytest.raises(VerifierRefusedError):
        ws.verify(PASS[:2], 5)


def test_verifier_passes_and_fails_with_a_real_command(ws: FileWorkspace) -> None:
    """A real python -c verifier runs in the root and reports exit code and environment."""
    failed = ws.verify(PASS, 30)
    assert (failed.passed, failed.exit_code) == (False, 3)
    ws.bypass_write("a.txt", "done")
    passed = ws.verify(PASS, 30)
    assert (passed.passed, passed.exit_code) == (True, 0)
    assert passed.environment == ws.environment()
    assert passed.output_digest == digest_bytes(b"")


def test_verifier_leaves_no_bytecode_in_the_tree(ws: FileWorkspace) -> None:
    """A verifier importing a module from the tree does not add __pycache__ to it."""
    ws.bypass_write("helper.py", "VALUE = 42\n")
    before = ws.environment()
    result = ws.verify(IMPORTS, 30)
    assert result.passed
    assert result.output_tail.strip() == "42"
    assert result.environment == before
    assert not (ws.root / "__pycache__").exists()


def test_a_pytest_verifier_leaves_no_cache_in_the_tree(dirs: tuple[Path, Path]) -> None:
    """pytest run as the verifier writes no .pytest_cache: the tree it judged is the tree after."""
    pytest_argv = ("python", "-m", "pytest", "-q", "test_one.py")
    with FileWorkspace(*dirs, verifier_allowlist=[pytest_argv]) as workspace:
        workspace.bypass_write("test_one.py", "def test_one():\n    pass\n")
        before = workspace.environment()
        result = workspace.verify(pytest_argv, 60)
        assert result.passed, result.output_tail
        assert result.environment == before
        assert not (workspace.root / ".pytest_cache").exists()


def test_verifier_timeout_fails_with_exit_code_minus_one(ws: FileWorkspace) -> None:
    """A verifier that outruns its timeout is a failure with exit code -1."""
    started = time.monotonic()
    result = ws.verify(SLOW, 1)
    assert (result.passed, result.exit_code) == (False, -1)
    assert time.monotonic() - started < 20


# --- other processes ---------------------------------------------------------


def test_second_process_sees_same_instance_and_receipts(ws: FileWorkspace) -> None:
    """Another process opening the same directories sees the same instance id and receipt."""
    receipt = ws.execute("key-1", propose(ws, "a.txt", "omega"), ws.environment())
    seen = child(INSPECT, ws.root, ws.root.parent / "journal", "key-1")
    assert seen["instance_id"] == ws.instance_id
    assert seen["receipt"] == receipt.to_json()
    assert seen["environment"] == ws.environment().to_json()


def test_two_processes_racing_one_key_write_once(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """Two processes executing the same key concurrently cause one write and share one receipt."""
    root, journal = dirs
    signals = tmp_path / "signals"
    signals.mkdir()
    # No journal yet: the racers also race to create it, and must agree on one instance.
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(root), str(journal), str(signals), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("one", "two")
    ]
    deadline = time.monotonic() + 60
    while not all((signals / f"ready-{name}").exists() for name in ("one", "two")):
        assert time.monotonic() < deadline, "racers never became ready"
        time.sleep(0.005)
    (signals / "go").touch()
    outputs = []
    for racer in racers:
        out, err = racer.communicate(timeout=60)
        assert racer.returncode == 0, err
        outputs.append(json.loads(out))
    assert outputs[0] == outputs[1]
    with FileWorkspace(root, journal) as ws:
        assert ws.write_count() == 1
        stored = ws.lookup("race-key")
        assert isinstance(stored, Receipt)
        assert stored.to_json() == outputs[0]
    assert (root / "race.txt").read_text() == "winner"
    assert sorted(os.listdir(root)) == ["a.txt", "race.txt"]


def test_a_superseded_fencing_token_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """After lease version 2 wrote, a write presenting version 1 is refused before any change."""
    from tether.adapters import Fence, FenceRejectedError
    from tether.core import Intent

    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.txt").write_text("0")
    with FileWorkspace(root, tmp_path / "journal") as ws:

        def intent(content: str) -> Intent:
            args = ws.normalize("file.write", "a.txt", {"content": content})
            return Intent("file.write", "a.txt", args, "low")

        ws.execute("k-new", intent("new"), ws.environment(), Fence("run-1", 2))
        before = ws.environment()
        with pytest.raises(FenceRejectedError) as caught:
            ws.execute("k-old", intent("old"), before, Fence("run-1", 1))
        assert (caught.value.presented, caught.value.highest) == (1, 2)
        assert ws.environment() == before and ws.write_count() == 1
        assert ws.lookup("k-old") is None
        # Other runs have their own token; an equal token is the same holder.
        ws.execute("k-other", intent("other"), before, Fence("run-2", 1))
        ws.execute("k-same", intent("same"), ws.environment(), Fence("run-1", 2))
    with FileWorkspace(root, tmp_path / "journal") as again:  # the token is durable
        args = again.normalize("file.write", "a.txt", {"content": "late"})
        with pytest.raises(FenceRejectedError):
            again.execute(
                "k-late",
                Intent("file.write", "a.txt", args, "low"),
                again.environment(),
                Fence("run-1", 1),
            )
