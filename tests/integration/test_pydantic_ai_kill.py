"""The SIGKILL-after-effect trial for a PydanticAI agent: killed right after the send, run again.

Each trial is two real processes: the first runs the agent (offline
FunctionModel) inside ``tether.effects.run`` on a SQLite file and is killed
with SIGKILL at ``EFFECT_SENT`` (the service committed the ticket, the
receipt is not yet recorded); the second, a fresh process, runs the same
agent again in the same tether run. The reference effects service counts the
tickets it holds per title: what the world received, whatever either side
believes. The control does the same with an unguarded tool and must repeat
the effect, so the trial measures something. All trials share one service
and one zygote process that forks the children (see ``_pydantic_ai_kit``).
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai", reason="needs the [pydantic-ai] extra")

from tests.integration._services import EffectsService, effects_service
from tests.integration._zygote import Zygote
from tether.crypto import Keyring

pytestmark = pytest.mark.slow

# `make optimized` (python -O) sets TETHER_CRASH_TRIALS=1: the first pass already ran 20.
TRIALS = int(os.environ.get("TETHER_CRASH_TRIALS", "20"))
CONTROL_TRIALS = 3


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("pydantic-ai-kill")
    Keyring.generate("k1").write_file(where / "keyring.json")
    return where


@pytest.fixture(scope="module")
def service(base: Path) -> Iterator[EffectsService]:
    with effects_service(base) as running:
        yield running


@pytest.fixture(scope="module")
def zygote(base: Path) -> Iterator[Zygote]:
    parent = Zygote("tests.integration._pydantic_ai_kit", stderr=base / "children.log")
    yield parent
    parent.close()


def received(service: EffectsService, title: str) -> list[int]:
    """Ids of the tickets the service holds with ``title``."""
    tickets = service.tickets()
    return [t["ticket_id"] for t in tickets if json.loads(t["body"])["title"] == title]


def trial(zygote: Zygote, service: EffectsService, base: Path, *, guarded: bool) -> int:
    """Kill the first process after its send, run the agent again; tickets the service got."""
    title = f"printer-{uuid.uuid4().hex[:10]}"
    request = {
        "guarded": guarded,
        "title": title,
        "url": service.url,
        "base": str(base),
        "store": f"sqlite:///{base / 'tether.sqlite'}",
        "run_id": f"run-{title}",
        "answer": str(base / f"{title}.answer"),
    }
    first = zygote.run(**request, armed=True)
    assert first == -signal.SIGKILL, f"not killed (exit {first}): {zygote.log()}"
    assert len(received(service, title)) == 1, "the killed process never sent: nothing measured"
    second = zygote.run(**request, armed=False)
    assert second == 0, f"the run again failed (exit {second}): {zygote.log()}"
    tickets = received(service, title)
    if guarded:  # the model of the second process was told the first process's ticket
        told = json.loads(Path(request["answer"]).read_text())
        assert told["body"]["ticket_id"] == tickets[0], told
    return len(tickets)


def test_an_unguarded_pydantic_ai_tool_repeats_its_effect_after_a_kill(
    zygote: Zygote, service: EffectsService, base: Path
) -> None:
    """The control: a plain tool killed after its POST and run again posts a second ticket."""
    counts = [trial(zygote, service, base, guarded=False) for _ in range(CONTROL_TRIALS)]
    assert counts == [2] * CONTROL_TRIALS


def test_a_guarded_pydantic_ai_tool_is_never_repeated_after_a_kill(
    zygote: Zygote, service: EffectsService, base: Path
) -> None:
    """TetherToolset killed after the send and run again: one ticket in every trial, 0 duplicates."""
    counts = [trial(zygote, service, base, guarded=True) for _ in range(TRIALS)]
    assert counts == [1] * TRIALS
