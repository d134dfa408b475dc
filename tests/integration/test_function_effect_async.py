"""An ``async def`` effect: its body awaited on the caller's loop, the store's commits off it.

Real SQLite files, the real ticket service on loopback for the httpx body,
and one event loop carrying a hundred runs at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from examples.own_function import config
from examples.own_function.tickets import KIND, open_ticket_async, tickets

import tether
from tests.integration._services import EffectsService, effects_service
from tether import effects
from tether.core import EffectRejectedError, NotInRunError, Phase
from tether.crypto import Keyring
from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash
from tether.store import SQLiteStore

KEYS = Keyring.generate("fn-async-1")
RUNS = 100
#: How long a body waits for all the others to be running (a failure, not a measure).
BARRIER_S = 60.0


class RecordingStore(SQLiteStore):
    """The real SQLite store, noting which thread made each checkpoint commit."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.commit_threads: list[int] = []

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        self.commit_threads.append(threading.get_ident())
        return super().commit(*args, **kwargs)


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EffectsService]:
    """The reference ticket service on loopback, named in TICKETS_URL."""
    with effects_service(tmp_path) as running:
        monkeypatch.setenv("TICKETS_URL", running.url)
        yield running


def test_an_async_body_runs_on_the_callers_loop_and_no_commit_does(
    tmp_path: Path, service: EffectsService
) -> None:
    """httpx.AsyncClient's POST is awaited on the caller's loop; every commit ran in a worker."""
    store = RecordingStore(tmp_path / "runs.sqlite")
    seen: dict[str, Any] = {}

    @tether.effect(KIND, target=None, idempotent=True)
    async def open_on_loop(title: str) -> dict[str, Any]:
        seen["loop"], seen["thread"] = asyncio.get_running_loop(), threading.get_ident()
        done: dict[str, Any] = await open_ticket_async.adapter.function(
            title, idempotency_key=tether.current_key()
        )
        return done

    async def main() -> tuple[Any, ...]:
        rt = config.runtime(open_on_loop.adapter, store, KEYS)
        async with effects.run_async(rt, "r1") as run:
            done = await open_on_loop("printer on fire")
            again = await effects.call_async(KIND, "", {"title": "printer on fire"})
            await run.finish_async("opened")
            phase = run.phase
        return asyncio.get_running_loop(), threading.get_ident(), done, again, phase

    loop, loop_thread, done, again, phase = asyncio.run(main())
    assert seen == {"loop": loop, "thread": loop_thread}
    assert store.commit_threads and loop_thread not in store.commit_threads
    assert done.outcome == "executed" and again.replayed and phase is Phase.COMPLETED
    assert [t["ticket_id"] for t in tickets("printer on fire")] == [done.result["ticket_id"]]


def test_a_hundred_runs_in_one_loop_make_progress_together(tmp_path: Path) -> None:
    """Every run's body is in flight at once: none finishes until all have started."""
    order: list[tuple[str, int]] = []
    started = 0
    everyone: asyncio.Event | None = None

    @tether.effect("notes.post", target=None, idempotent=True)
    async def post(n: int) -> dict[str, int]:
        nonlocal started
        if everyone is None:
            raise RuntimeError("no barrier")
        order.append(("start", n))
        started += 1
        if started == RUNS:
            everyone.set()
        # Released only once all RUNS bodies are running: if the store's commits
        # held the loop, or the runs took turns, this would never be set.
        await asyncio.wait_for(everyone.wait(), timeout=BARRIER_S)
        order.append(("end", n))
        return {"n": n}

    env = post.adapter.environment()
    task = config.task(post.adapter).to_json()
    task["allowed_kinds"] = ["notes.post"]
    task["initial_environment"] = {
        "namespace": env.namespace,
        "state_fingerprint": env.state_fingerprint,
    }
    rule = {"risk": "low", "permission": "tickets.open", "needs_approval": False}
    policy = config.policy().to_json()
    policy["kinds"] = {"notes.post": rule}
    rt = tether.Runtime(
        store=SQLiteStore(tmp_path / "runs.sqlite"),
        keyring=KEYS,
        adapter=post.adapter,
        task=tether.TaskSpec.from_json(task),
        policy=tether.Policy.from_json(policy),
    )

    async def one(n: int) -> str:
        async with effects.run_async(rt, f"run-{n}") as run:
            done = await post(n)
            await run.finish_async()
            return f"{done.outcome}/{run.phase}"

    async def main() -> list[str]:
        nonlocal everyone
        everyone = asyncio.Event()
        return list(await asyncio.gather(*(one(n) for n in range(RUNS))))

    ends = asyncio.run(main())
    assert ends == ["executed/completed"] * RUNS
    starts = [n for what, n in order if what == "start"]
    first_end = next(i for i, (what, _) in enumerate(order) if what == "end")
    assert sorted(starts) == list(range(RUNS)) and first_end == RUNS  # all began before any ended


def test_an_async_call_killed_after_the_send_is_settled_by_key(
    tmp_path: Path, service: EffectsService
) -> None:
    """Crashed after the POST under asyncio, recovered in a new loop: found by key, one ticket."""
    crashing = config.runtime(
        open_ticket_async.adapter,
        SQLiteStore(tmp_path / "runs.sqlite"),
        KEYS,
        CrashPlan(CrashPoint.EFFECT_SENT),
    )

    async def attempt(rt: tether.Runtime) -> Any:
        async with effects.run_async(rt, "r1"):
            return await open_ticket_async("printer on fire")

    with pytest.raises(SimulatedCrash):
        asyncio.run(attempt(crashing))
    assert len(tickets("printer on fire")) == 1
    again = asyncio.run(
        attempt(
            config.runtime(open_ticket_async.adapter, SQLiteStore(tmp_path / "runs.sqlite"), KEYS)
        )
    )
    assert again.replayed and len(tickets("printer on fire")) == 1


def test_an_async_effect_called_from_its_own_loop_without_await_is_refused(
    tmp_path: Path,
) -> None:
    """The synchronous call path from a running loop is refused before a key: it would block."""
    rt = config.runtime(open_ticket_async.adapter, SQLiteStore(tmp_path / "runs.sqlite"), KEYS)

    async def main() -> None:
        with effects.run(rt, "r1") as run, pytest.raises(EffectRejectedError) as caught:
            effects.call(KIND, "", {"title": "x"})
        assert caught.value.reason == "blocking_call" and run.phase is Phase.RUNNING

    asyncio.run(main())
    with pytest.raises(NotInRunError):
        asyncio.run(effects.call_async(KIND, "", {"title": "x"}))  # no run open here
