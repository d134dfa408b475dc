"""The anchor's failure as a test: a LangGraph node SIGKILLed right after its effect, resumed elsewhere.

Each trial: a child process runs a graph whose ToolNode opens a ticket with
a real ``POST /tickets`` to a counting service on loopback and is SIGKILLed
right after the service answered; a NEW process resumes the graph from its
saver. The service counts requests by the trial's ticket title: what the
world saw, whatever the graph believes. With plain ``SqliteSaver`` and a
plain tool the resumed node sends again (the control: the test checks it
does, every time, so the other half measures something); with
``TetherSaver`` and the tool guarded by tether, the service sees each ticket
once. 30 trials a side (4 under ``python -O``, the suite's second pass,
which sets TETHER_CRASH_TRIALS lower), two at a time. Each process of a
trial is forked from a zygote that imported LangGraph and tether once and
opened nothing (see ``_lgkill.zygote``).
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("langgraph.prebuilt", reason="needs the [langgraph] extra")
pytest.importorskip("langgraph.checkpoint.sqlite", reason="the control needs SqliteSaver")

from bench._compare_kill import seen, service

from tests.integration._zygote import Zygote
from tether.crypto import Keyring

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TRIALS = max(4, int(os.environ.get("TETHER_CRASH_TRIALS", "20")) * 3 // 2)


@dataclass(frozen=True)
class Trial:
    """What one trial's two processes did, and what the service saw."""

    title: str
    first_exit: int
    resume_exit: int
    resumed_with: str
    stderr: str
    seen: int


@pytest.fixture(scope="module")
def counting_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One counting service for every trial of the module (each trial has its own title)."""
    with service(tmp_path_factory.mktemp("service")) as url:
        yield url


@pytest.fixture(scope="module")
def zygotes() -> Iterator[list[Zygote]]:
    """Two zygotes: trials run two at a time, each worker forking from its own."""
    pair = [Zygote("tests.integration._lgkill"), Zygote("tests.integration._lgkill")]
    yield pair
    for zygote in pair:
        zygote.close()


def trial(zygote: Zygote, mode: str, index: int, url: str, base: Path) -> Trial:
    where = base / f"{mode}-{index}"
    where.mkdir()
    Keyring.generate("lg-kill").write_file(where / "keyring.json")
    title = f"{mode}-{index}-{uuid.uuid4().hex[:8]}"
    job = {"mode": mode, "url": url, "title": title, "where": str(where)}
    first = zygote.run(**job, phase="first")
    resumed = zygote.run(**job, phase="resume")
    lines = (where / "resume.out").read_text().strip().splitlines()
    errors = "".join((where / f"{p}.err").read_text() for p in ("first", "resume"))
    return Trial(
        title, first, resumed, lines[-1] if lines else "", errors[-2000:], seen(url).get(title, 0)
    )


def trials(zygotes: list[Zygote], mode: str, url: str, base: Path) -> list[Trial]:
    def worker(slot: int) -> list[Trial]:
        return [trial(zygotes[slot], mode, i, url, base) for i in range(slot, TRIALS, 2)]

    with ThreadPoolExecutor(max_workers=2) as pool:
        return [t for done in pool.map(worker, range(2)) for t in done]


def check_killed_and_resumed(done: list[Trial]) -> None:
    for t in done:
        assert t.first_exit == -signal.SIGKILL, f"{t.title}: first child not killed: {t.stderr}"
        assert t.resume_exit == 0, f"{t.title}: the resume failed: {t.stderr}"


def test_plain_sqlitesaver_resends_the_killed_nodes_effect(
    zygotes: list[Zygote], counting_url: str, tmp_path: Path
) -> None:
    """The control measures something: SqliteSaver's resumed node re-sends the request every time."""
    done = trials(zygotes, "control", counting_url, tmp_path)
    check_killed_and_resumed(done)
    duplicates = sum(t.seen > 1 for t in done)
    assert duplicates == TRIALS, [t.seen for t in done]
    assert all(json.loads(t.resumed_with) == "opened" for t in done)


def test_tethersaver_with_a_guarded_tool_sends_the_killed_effect_once(
    zygotes: list[Zygote], counting_url: str, tmp_path: Path
) -> None:
    """With TetherSaver and the guarded tool the service sees each killed trial's ticket exactly once."""
    done = trials(zygotes, "tether", counting_url, tmp_path)
    check_killed_and_resumed(done)
    assert [t.seen for t in done] == [1] * TRIALS
    # The resumed ToolNode got the recorded receipt back, not a second send.
    resumed = [json.loads(t.resumed_with) for t in done]
    assert all(r["outcome"] == "replayed" for r in resumed)
    # ... and that receipt's result: the service's own answer to the one POST, a ticket per trial.
    assert all(r["result"]["status"] == 201 for r in resumed), resumed
    assert len({r["result"]["body"]["ticket_id"] for r in resumed}) == TRIALS
