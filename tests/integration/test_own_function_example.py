"""examples/own_function: httpx against the real ticket service, killed with SIGKILL by the harness.

Each trial is real interpreters (the run killed at the point, then its
recoveries), all talking to one reference service on loopback; the world is
counted from the service's own ``tickets`` table, never from tether.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration._services import EffectsService, effects_service
from tether.core import EffectStatus, TetherError
from tether.runtime import CrashPoint
from tether.store import SQLiteStore
from tether.testing.crash_harness import Verdict, run_crash_harness

P = CrashPoint
# One trial per pass: the harness itself is exercised in test_crash_harness.py;
# here every pass of every point is reached once, on real processes.
TRIALS = 1
KIND = "tickets.open"


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EffectsService]:
    """The reference ticket service; the harness's children find it in TICKETS_URL."""
    with effects_service(tmp_path) as running:
        monkeypatch.setenv("TICKETS_URL", running.url)
        yield running


def tickets_of(service: EffectsService, run_id: str) -> int:
    """Rows in the service's tickets table whose request names the run."""
    return sum(1 for t in service.tickets() if f"[{run_id}]" in t["body"])


@pytest.mark.slow
def test_the_proven_function_opens_one_ticket_whatever_the_kill(
    tmp_path: Path, service: EffectsService
) -> None:
    """Killed at every pass of every crash point and recovered: one ticket per run, each completed."""
    report = run_crash_harness(
        "examples.own_function.crash_app:app",
        trials=TRIALS,
        workdir=tmp_path / "work",
        jobs=2,
        recoveries=1,
    )
    assert report.passed, report.render()
    reached = {cell.point for cell in report.cells}
    assert reached == set(P) - {P.CONTENT_BEFORE_MARK}, report.render()
    assert report.unreached == (P.CONTENT_BEFORE_MARK,)  # content and mark commit together
    for cell in report.cells:
        for trial in cell.trials:
            assert trial.verdict is Verdict.OK, report.render()
            assert trial.phase == "completed"
            assert tickets_of(service, trial.run_id) == 1  # the server's rows: no duplicate
    assert report.baseline.effects == {KIND: 1}


@pytest.mark.slow
def test_an_unproven_function_killed_after_the_send_goes_to_review(
    tmp_path: Path, service: EffectsService
) -> None:
    """Declaring nothing, killed after its send: review, twice recovered, the body never run again."""
    report = run_crash_harness(
        "examples.own_function.crash_app:unproven_app",
        trials=TRIALS,
        points=[P.EFFECT_SENT],
        workdir=tmp_path / "work",
        recoveries=2,
    )
    assert report.passed, report.render()
    (cell,) = report.cells
    assert cell.verdict is Verdict.REVIEW
    for trial in cell.trials:
        assert (trial.phase, trial.reviews) == ("needs_review", ("outcome_unknown",))
        assert tickets_of(service, trial.run_id) == 1  # sent once, never re-run


@pytest.mark.slow
def test_the_async_function_killed_after_its_send_opens_one_ticket(
    tmp_path: Path, service: EffectsService
) -> None:
    """The async body, killed after its send under asyncio and recovered: one ticket per run."""
    report = run_crash_harness(
        "examples.own_function.crash_app:async_app",
        trials=TRIALS,
        points=[P.EFFECT_SENT],
        workdir=tmp_path / "work",
        jobs=2,
        recoveries=1,
    )
    assert report.passed, report.render()
    for cell in report.cells:
        for trial in cell.trials:
            assert (trial.verdict, trial.phase) == (Verdict.OK, "completed"), report.render()
            assert tickets_of(service, trial.run_id) == 1


REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "own_function" / "quickstart.py"


def first_python_block(page: Path) -> str:
    """The first ``python`` code block of a docs page."""
    text = page.read_text()
    start = text.index("```python\n") + len("```python\n")
    return text[start : text.index("```", start)]


def test_the_docs_show_the_quickstart_as_it_is() -> None:
    """The "Guard your own function" page's example is quickstart.py, byte for byte."""
    page = REPO / "docs" / "how-to" / "own-function.md"
    assert first_python_block(page) == QUICKSTART.read_text()


def quickstart(cwd: Path, url: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TICKETS_URL": url, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(QUICKSTART)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def dispatched(cwd: Path) -> bool:
    """Whether case-1's ledger says its ticket was sent (read from the run's own store)."""
    if not (cwd / "runs.sqlite").exists():
        return False
    try:
        with SQLiteStore(cwd / "runs.sqlite", read_only=True) as store:
            return any(e.status is EffectStatus.DISPATCHED for e in store.ledger("case-1"))
    except TetherError:
        return False  # the script is still making its store


@pytest.mark.slow
def test_the_quickstart_runs_as_written_and_survives_a_kill_after_its_post(
    tmp_path: Path, service: EffectsService
) -> None:
    """Killed with SIGKILL while the service holds its POST, run again: one ticket, replayed."""
    service.mode(slow_s=1.5)  # the service takes the key, then works 1.5 s before committing
    first = quickstart(tmp_path, service.url)
    deadline = time.monotonic() + 60
    while not dispatched(tmp_path) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)  # the POST reaches the service, which is still working on it
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    while not service.tickets() and time.monotonic() < deadline:
        time.sleep(0.05)  # the service finishes the request the dead client sent
    landed = len(service.tickets())
    service.mode(slow_s=0)
    again = quickstart(tmp_path, service.url)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    (ticket,) = service.tickets()
    # Landed before the kill: found by its key. Not yet (a slow machine): sent now, same key.
    assert out.split() == ["replayed" if landed else "executed", "ticket", str(ticket["ticket_id"])]
    last = quickstart(tmp_path, service.url)
    assert last.communicate(timeout=60)[0] == "case-1 is completed\n"
    assert len(service.tickets()) == 1
