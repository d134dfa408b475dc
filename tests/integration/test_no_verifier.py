"""A task with nothing to test: the run completes on the agent's finish, and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ScriptedAgent, World, finish, write
from tether.cli import main
from tether.core import Phase, TaskSpec


def test_a_run_of_a_task_without_a_verifier_completes_unverified_and_traces_it(
    world: World,
) -> None:
    """finish completes the run at the state it is in; the trace says no verifier ran."""
    body = world.task.to_json()
    body.pop("verifier")
    world.task = TaskSpec.from_json(json.dumps(body))
    agent = ScriptedAgent([write("notes.txt", "done\n"), finish])
    session = world.runtime(agent).start("run-a")
    while not session.state.phase.terminal:
        session.step()
    state = session.state
    assert state.phase is Phase.COMPLETED and state.stop_reason == "finished_unverified"
    kinds = [e.kind for e in session.trace()]
    assert "no_verifier" in kinds and "verifier_ran" not in kinds
    assert state.verification is not None
    assert state.verification.env_version == state.environment.version


def test_init_with_verifier_none_writes_a_task_without_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`tether init --verifier none` leaves the verifier out, and the task loads."""
    ws = tmp_path / "proj"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "notes.md").write_text("hello\n")
    assert main(["init", "--workspace", str(ws), "--out", str(tmp_path), "--verifier", "none"]) == 0
    capsys.readouterr()
    task = TaskSpec.from_json((tmp_path / "task.json").read_bytes())
    assert task.verifier is None


def test_init_refuses_to_write_into_the_workspace_it_fingerprints(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--out inside the workspace would change the recorded fingerprint: refused, nothing written."""
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "a.py").write_text("x = 1\n")
    assert main(["init", "--workspace", str(ws), "--out", str(ws)]) == 1
    assert "inside the workspace" in capsys.readouterr().err
    assert sorted(p.name for p in ws.iterdir()) == ["a.py"]
