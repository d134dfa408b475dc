"""Async function effects: do many runs in one event loop progress together? Side by side, one run.

Each run is real protocol work on one real :class:`~tether.store.SQLiteStore`
file (``synchronous=FULL``): the run started, one ``async def`` function
effect (its key minted and the intent persisted, the body awaited, the
receipt committed), and the finish. The body awaits ``--latency-ms`` (a
remote call's round trip, with no server to muddy the figure). Three ways,
in one process, alternating:

- **one after another**: ``await`` each run to its end before the next;
- **all at once**: ``asyncio.gather`` of every run, through
  ``tether.effects.run_async`` and an awaited decorated coroutine function
  (the store's commits in worker threads, the bodies on the loop);
- **sync API on the loop**: the same runs gathered, but each made with the
  synchronous API from its coroutine (``effects.run``, ``run.call``, a
  synchronous body that sleeps): what a caller gets by blocking the loop.

Beside wall time, the loop's longest stall: the largest gap a 1 ms ticker
task saw while the runs went on. Blocking the loop shows there; the async
path should keep it near a single commit's share of the GIL. Figures are
printed, never asserted (the test that they interleave is
``tests/integration/test_function_effect_async.py``).

Run: ``.venv/bin/python bench/async_effects.py [--runs 100] [--latency-ms 50] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import tether
from tether import effects
from tether.crypto import Keyring
from tether.store import SQLiteStore

KIND = "bench.post"
KEYS = Keyring.generate("bench-async")


def build(store: SQLiteStore, adapter: tether.adapters.FunctionEffect) -> tether.Runtime:
    env = adapter.environment()
    task = tether.TaskSpec.from_json(
        {
            "task_id": "bench-async",
            "task_version": "1",
            "allowed_kinds": [KIND],
            "allowed_paths": [],
            "permissions": ["bench.post"],
            "budgets": {"proposals": 10, "steps": 20, "wall_time_s": 3600, "cost": 10},
            "initial_environment": {
                "namespace": env.namespace,
                "state_fingerprint": env.state_fingerprint,
            },
        }
    )
    rule = {"risk": "low", "permission": "bench.post", "needs_approval": False}
    policy = tether.Policy.from_json(
        {
            "policy_id": "bench-async",
            "policy_version": "1",
            "kinds": {KIND: rule},
            "max_risk": "low",
            "approval_ttl_s": 600,
        }
    )
    return tether.Runtime(store=store, keyring=KEYS, adapter=adapter, task=task, policy=policy)


async def watched(work: Awaitable[Any]) -> tuple[float, float]:
    """Wall seconds of ``work`` and the longest gap (ms) a 1 ms ticker saw meanwhile."""
    stalls = [0.0]
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            stalls[0] = max(stalls[0], now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    start = time.perf_counter()
    await work
    wall = time.perf_counter() - start
    done.set()
    await tick
    return wall, stalls[0] * 1000


def measure(
    way: str, runs: int, latency_s: float, home: Path, round_no: int
) -> tuple[float, float]:
    """One way's wall time and longest loop stall, on a fresh store file."""

    @tether.effect(KIND, target=None, idempotent=True)
    async def post(n: int) -> dict[str, int]:
        await asyncio.sleep(latency_s)
        return {"n": n}

    @tether.effect(KIND, target=None, idempotent=True)
    def post_blocking(n: int) -> dict[str, int]:
        time.sleep(latency_s)
        return {"n": n}

    adapter = post_blocking.adapter if way == "sync API on the loop" else post.adapter
    store = SQLiteStore(home / f"{way.replace(' ', '-')}-{round_no}.sqlite")
    rt = build(store, adapter)

    async def one_async(n: int) -> None:
        async with effects.run_async(rt, f"run-{n}") as run:
            await post(n)
            await run.finish_async()

    async def one_blocking(n: int) -> None:
        with effects.run(rt, f"run-{n}") as run:
            run.call(KIND, "", {"n": n})
            run.finish()

    async def all_of(one: Callable[[int], Awaitable[None]], together: bool) -> None:
        if together:
            await asyncio.gather(*(one(n) for n in range(runs)))
        else:
            for n in range(runs):
                await one(n)

    if way == "one after another":
        work = all_of(one_async, together=False)
    elif way == "all at once":
        work = all_of(one_async, together=True)
    else:
        work = all_of(one_blocking, together=True)
    try:
        return asyncio.run(watched(work))
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ways = ["one after another", "all at once", "sync API on the loop"]
    home = Path(tempfile.mkdtemp(prefix="tether-bench-async-"))
    seen: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    try:
        for round_no in range(args.rounds):
            order = ways if round_no % 2 == 0 else list(reversed(ways))
            for way in order:
                seen[way].append(measure(way, args.runs, args.latency_ms / 1000, home, round_no))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(
        f"{args.runs} runs in one event loop, one async function effect each (its body awaits "
        f"{args.latency_ms:g} ms), SQLite synchronous=FULL; median of {args.rounds} rounds"
    )
    print(f"{'':24}{'wall s':>9}{'runs/s':>9}{'longest loop stall ms':>24}")
    medians = {}
    for way in ways:
        wall = statistics.median(w for w, _ in seen[way])
        stall = statistics.median(s for _, s in seen[way])
        medians[way] = wall
        print(f"{way:24}{wall:9.2f}{args.runs / wall:9.1f}{stall:24.1f}")
    ratio = medians["all at once"] / medians["one after another"]
    print(f"all at once takes {ratio:.2f}x the time of one after another")


if __name__ == "__main__":
    main()
