"""Run fuzz seeds over worker processes; a process stuck in C (an endless SQL walk) is killed.

Each worker announces the seed it starts, so a seed that hangs below Python
(where the in-process alarm cannot reach) is still named: the parent kills
the worker after ``hang_s`` and records the seed as an untyped failure.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tests.integration import _fuzzkit


@dataclass
class _Slot:
    process: Any
    seed: int | None = None
    since: float = 0.0


def _work(tasks: Any, results: Any, full: bool) -> None:
    base = _fuzzkit.base_for_process()
    while True:
        seed = tasks.get()
        if seed is None:
            return
        results.put(("start", seed, os.getpid()))
        try:
            result = _fuzzkit.run_case(base, seed, full=full)
        except BaseException as exc:
            result = _fuzzkit.Result(seed, "harness", "", untyped=[f"harness: {exc!r}"])
        results.put(("done", seed, result))


def run_many(
    seeds: Iterable[int], processes: int = 2, hang_s: float = 60.0, *, full: bool = True
) -> Iterator[_fuzzkit.Result]:
    """Yield one :class:`~tests.integration._fuzzkit.Result` per seed (in completion order)."""
    ctx = mp.get_context("fork")
    tasks: Any = ctx.Queue()
    results: Any = ctx.Queue()
    pending = list(seeds)
    for seed in pending:
        tasks.put(seed)
    slots: dict[int, _Slot] = {}

    def spawn() -> None:
        process = ctx.Process(target=_work, args=(tasks, results, full), daemon=True)
        process.start()
        slots[process.pid] = _Slot(process)

    for _ in range(processes):
        spawn()
    left = len(pending)
    try:
        while left:
            try:
                kind, seed, result = results.get(timeout=1.0)
            except queue.Empty:
                kind = ""
            if kind == "start" and result in slots:
                slots[result].seed, slots[result].since = seed, time.monotonic()
            elif kind == "done":
                for slot in slots.values():
                    if slot.seed == seed:
                        slot.seed = None
                left -= 1
                yield result
            now = time.monotonic()
            for pid, slot in list(slots.items()):
                stuck = slot.seed is not None and now - slot.since > hang_s
                if stuck or not slot.process.is_alive():
                    slot.process.kill()
                    slot.process.join()
                    del slots[pid]
                    if slot.seed is not None:
                        left -= 1
                        yield _fuzzkit.Result(
                            slot.seed,
                            "hang",
                            "",
                            untyped=[f"worker stuck past {hang_s} s (or died) on this seed"],
                        )
                    if left:
                        spawn()
    finally:
        for _ in slots:
            tasks.put(None)
        for slot in slots.values():
            slot.process.join(timeout=5)
            if slot.process.is_alive():
                slot.process.kill()
