"""examples/plain_loop: a hand-written loop, unguarded and guarded, on a real ticket service and
mail server on loopback, killed with SIGKILL in child processes.

The crash harness kills the guarded loop at every pass of every crash point
(each of the three effects, and the finish) once per pass (``make test``'s
first pass; under ``-O`` only the three effect windows), recovers it twice
in fresh processes, and compares the world with a clean run's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from examples.plain_loop import run_demo
from examples.plain_loop.desk import REPLY

from tether.runtime import CrashPoint
from tether.testing.crash_harness import Verdict, run_crash_harness

P = CrashPoint
EXAMPLE = Path(run_demo.__file__).parent
EFFECT_WINDOWS = (P.INTENT_PERSISTED, P.EFFECT_SENT, P.RECEIPT_PERSISTED)
CLEAN = {"file.write": 1, "http.post": 1, "email.send": 1}


@pytest.fixture
def services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The reference ticket service and mail server, started as run_demo.py starts them."""
    with run_demo.services(tmp_path / "services") as env:
        for name, value in env.items():
            monkeypatch.setenv(name, value)  # the harness's children inherit them
        yield env


def changed_lines(before: Path, after: Path) -> list[str]:
    """The lines difflib adds or removes going from ``before`` to ``after``."""
    diff = difflib.unified_diff(
        before.read_text().splitlines(), after.read_text().splitlines(), lineterm="", n=0
    )
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_the_guarded_loop_differs_from_the_unguarded_in_under_20_lines() -> None:
    """Guarding the loop changes fewer than 20 lines (added plus removed, by difflib)."""
    changed = changed_lines(EXAMPLE / "unguarded.py", EXAMPLE / "guarded.py")
    assert any("@tether.effect" in line for line in changed)
    assert len(changed) < 20, "\n".join(changed)


def normal(world: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The world with the run's id and its ticket's number made generic, once checked."""
    numbers = [re.match(r"#(\d+) ", t) for t in world["tickets"]]
    cited = [re.search(r"#(\d+)$", s) for s in world["emails"]]
    # Each email cites a ticket this case opened, never another case's.
    assert all(cited), world
    assert {m.group(1) for m in cited if m} <= {m.group(1) for m in numbers if m}, world
    out = {**world, "tickets": [re.sub(r"^#\d+ ", "#N ", t) for t in world["tickets"]]}
    out["emails"] = [re.sub(r"#\d+$", "#N", s) for s in world["emails"]]
    return {
        k: [v.replace(run_id, "CASE") for v in vs] if isinstance(vs, list) else vs
        for k, vs in out.items()
    }


@pytest.mark.slow
def test_the_guarded_loop_survives_a_kill_at_every_crash_point(
    tmp_path: Path, services: dict[str, str]
) -> None:
    """Killed at each pass of each effect window, recovered twice: the world equals the clean run's."""
    # The effect windows, where a repeat could happen: every other point of the
    # harness is covered on its own example apps (test_crash_harness.py), and
    # CI's time budget is nearly spent.
    points = list(EFFECT_WINDOWS)
    work = tmp_path / "work"
    report = run_crash_harness(
        "examples.plain_loop.crash_app:app", trials=1, points=points, workdir=work, jobs=2
    )
    assert report.passed, report.render()
    for point in EFFECT_WINDOWS:  # each of the three effects passes each window once
        assert report.baseline.passes[point] == 3, report.baseline.passes
    from examples.plain_loop.crash_app import app

    looked = app(work)
    (clean_id,) = [p.name for p in (work / "runs").iterdir() if p.name.endswith("-clean")]
    clean = normal(looked.world(clean_id), clean_id)
    assert clean["reply.txt"] == REPLY and len(clean["tickets"]) == len(clean["emails"]) == 1
    judged = {(c.point, c.hit) for c in report.cells}
    assert {(w, hit) for w in EFFECT_WINDOWS for hit in (1, 2, 3)} <= judged
    for cell in report.cells:
        for trial in cell.trials:
            assert trial.verdict is Verdict.OK, report.render()
            assert (trial.phase, dict(trial.effects)) == ("completed", CLEAN), report.render()
            assert normal(looked.world(trial.run_id), trial.run_id) == clean, trial.run_id


def test_the_unguarded_loop_killed_after_its_ticket_and_rerun_opens_two(
    tmp_path: Path, services: dict[str, str]
) -> None:
    """The control: the unguarded loop, SIGKILLed right after the POST and run again, repeats it."""
    env = run_demo.fresh_case(tmp_path, "unguarded", services)
    seen = run_demo.crash_then_rerun("unguarded", "unguarded-1", env)
    assert seen["tickets"] == [
        "#1 [unguarded-1] The printer is on fire.",
        "#2 [unguarded-1] The printer is on fire.",
    ]
    assert len(seen["emails"]) == 1


def test_the_guarded_loop_killed_after_its_ticket_and_rerun_opens_one(
    tmp_path: Path, services: dict[str, str]
) -> None:
    """The same kill (tether's effect_sent window) and rerun of the guarded loop: one ticket, one email."""
    env = run_demo.fresh_case(tmp_path, "guarded", services)
    seen = run_demo.crash_then_rerun("guarded", "guarded-1", env)
    assert seen["tickets"] == ["#1 [guarded-1] The printer is on fire."]
    assert seen["emails"] == ["[guarded-1] your ticket #1"]
    assert seen["reply.txt"] == REPLY
