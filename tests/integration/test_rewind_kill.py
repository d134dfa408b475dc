"""A rewind killed with SIGKILL halfway through restoring the workspace is finished, not guessed."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ScriptedAgent, make_policy, make_task, write
from tether.adapters import FileWorkspace
from tether.core import Phase
from tether.crypto import Keyring
from tether.runtime import Runtime
from tether.store import SQLiteStore

pytestmark = pytest.mark.slow

FILES = ("a.txt", "b.txt", "c.txt")


def runtime(tmp: Path, ws: FileWorkspace, keyring: Keyring) -> Runtime:
    task = make_task(
        (tmp / "fingerprint").read_text(),
        allowed_paths=list(FILES),
        initial_environment={"namespace": "file-workspace"},
    )
    return Runtime(
        store=SQLiteStore(tmp / "t.sqlite"),
        keyring=keyring,
        adapter=ws,
        task=task,
        policy=make_policy(authority={"rewind": ["agent"]}),
        agent=ScriptedAgent([write(name, f"{name} edited\n") for name in FILES]),
    )


# The child recovers the run and rewinds it; the second file the restore
# replaces kills the process, leaving the workspace half restored.
CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from tests.integration.test_rewind_kill import runtime
    from tether.adapters import FileWorkspace, _tree
    from tether.crypto import Keyring

    tmp = Path({tmp!r})
    real = _tree.Tree.replace
    calls = []

    def dying(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *args, **kwargs)

    with FileWorkspace(tmp / "ws", tmp / "journal") as ws:
        rt = runtime(tmp, ws, Keyring.from_file(tmp / "keyring.json"))
        session = rt.recover("run-k")
        _tree.Tree.replace = dying
        session.rewind({to}, "killed halfway")
    """
)


def test_a_rewind_killed_mid_restore_is_finished_by_the_next_process(tmp_path: Path) -> None:
    """SIGKILL after one of two files was restored: the next recovery completes the same rewind."""
    root = tmp_path / "ws"
    root.mkdir()
    for name in FILES:
        (root / name).write_text(f"{name} original\n")
    keyring = Keyring.generate("k1")
    keyring.write_file(tmp_path / "keyring.json")
    with FileWorkspace(root, tmp_path / "journal") as ws:
        (tmp_path / "fingerprint").write_text(ws.environment().state_fingerprint)
        rt = runtime(tmp_path, ws, keyring)
        session = rt.start("run-k")
        session.step()
        # The first write's rewind point: the next commit (the second write's),
        # which carries its receipt, records the state at rest right after it.
        after_first = session.state.generation + 1
        session.step()
        session.step()
        session.release()  # the process lets the run go: the last receipt lands
        before = session.state
        assert [(root / n).read_text() for n in FILES] == [f"{n} edited\n" for n in FILES]
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD.format(
                root=str(Path(__file__).resolve().parents[2]), tmp=str(tmp_path), to=after_first
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    # Half restored: exactly one of the two later files is back to its original.
    restored = [(root / n).read_text() == f"{n} original\n" for n in FILES[1:]]
    assert restored.count(True) == 1
    with FileWorkspace(root, tmp_path / "journal") as ws:
        rt = runtime(tmp_path, ws, keyring)
        again = rt.recover("run-k")
        assert again.state.rewinding is not None  # the plan was checkpointed before the restore
        outcome = again.step()
        assert outcome.reason == "rewound"
        assert [(root / n).read_text() for n in FILES] == [
            "a.txt edited\n",
            "b.txt original\n",
            "c.txt original\n",
        ]
        state = again.state
        assert state.phase is Phase.RUNNING and state.rewinding is None
        assert state.generation > before.generation and state.trace_length > before.trace_length
        kinds = [e.kind for e in again.trace()]
        assert kinds.count("rewind_started") == 1 and kinds.count("rewound") == 1
        assert ws.environment() == state.environment
