"""Where the MCP gateway's time per tool call goes: ``python bench/mcp.py --profile``.

The gateway's own call path (``Gateway.call``, as its MCP server runs it)
driven in this process against the test upstream (a real child over
stdio, the SDK's server), with no MCP client in front: what is measured is
what tether adds between the agent's request arriving and its answer
leaving. Per call kind:

- wall time per call, and how much of it was the upstream's round trip
  (``Upstream.answer``), the store's commits (``Checkpointer.advance``, the
  fsync included) and everything else (tether's Python, the hops between
  the event loop and the protocol's worker thread);
- the CPU the protocol's worker thread spends, by function (cProfile with
  the thread's own CPU clock, so waiting is not counted), and the event
  loop thread's.

Nothing of tether is changed: methods are wrapped for the run of this
process only.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    """Wall time spent inside wrapped methods, per label, for the call being measured."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        spent, counts = self.spent, self.counts
        if asyncio.iscoroutinefunction(original):

            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    spent[label] += time.perf_counter() - start
                    counts[label] += 1

            setattr(owner, name, timed_async)
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - start
                counts[label] += 1

        setattr(owner, name, timed)

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        spent, counts = dict(self.spent), dict(self.counts)
        self.spent.clear()
        self.counts.clear()
        return spent, counts


@contextmanager
def worker_profile(profiles: dict[str, cProfile.Profile], current: list[str]) -> Iterator[None]:
    """Profile ``GuardedRun.call`` (the protocol's worker thread) into ``profiles[current[0]]``."""
    from tether.runtime._effects import GuardedRun

    original = GuardedRun.call

    def profiled(self: Any, *args: Any, **kwargs: Any) -> Any:
        profile = profiles.setdefault(current[0], cProfile.Profile(time.thread_time))
        return profile.runcall(original, self, *args, **kwargs)

    GuardedRun.call = profiled  # type: ignore[method-assign]
    try:
        yield
    finally:
        GuardedRun.call = original  # type: ignore[method-assign]


def top(profile: cProfile.Profile, calls: int, limit: int = 14) -> str:
    """The functions with most own CPU time, per call."""
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    rows = []
    for (path, line, fn), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(path).name}:{line}({fn})"
        rows.append((tt, ct, nc, where))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    lines = [f"    thread CPU per call: {total / calls * 1000:.2f} ms; own time, top {limit}:"]
    for tt, ct, nc, where in rows[:limit]:
        lines.append(
            f"    {tt / calls * 1000:7.3f} ms own {ct / calls * 1000:7.3f} ms cum "
            f"{nc / calls:6.1f} calls  {where}"
        )
    mine = sorted(
        (
            (ct, tt, nc, f"{Path(path).parent.name}/{Path(path).name}:{line}({fn})")
            for (path, line, fn), (_cc, nc, tt, ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
            if "/tether/" in path
        ),
        reverse=True,
    )
    lines.append(f"    tether's functions by cumulative time, top {limit}:")
    for ct, tt, nc, where in mine[:limit]:
        lines.append(
            f"    {ct / calls * 1000:7.3f} ms cum {tt / calls * 1000:7.3f} ms own "
            f"{nc / calls:6.1f} calls  {where}"
        )
    return "\n".join(lines)


async def profile(where: Path, calls: int) -> None:
    from tether import effects
    from tether.crypto import Keyring
    from tether.integrations.mcp import (
        Gateway,
        GatewayConfig,
        GatewayPolicy,
        Upstream,
        stdio_target,
    )
    from tether.integrations.mcp import _upstream as upstream_module
    from tether.runtime import _checkpointer

    clock = Clock()
    clock.wrap(upstream_module.Upstream, "answer", "upstream round trip")
    clock.wrap(_checkpointer.Checkpointer, "advance", "store commit")
    argv = [sys.executable, "-m", "tests.integration._mcp_upstream", str(where / "up.sqlite")]
    gateway = Gateway(
        GatewayConfig(
            store=f"sqlite:///{where / 'tether.sqlite'}",
            run_id="profile",
            keyring=Keyring.generate("k1"),
            policy=GatewayPolicy.from_json({"reads": ["count_notes"]}),
        ),
        Upstream(stdio_target(argv, str(ROOT)), timeout_s=60),
    )
    profiles: dict[str, cProfile.Profile] = {}
    current = ["warm"]
    async with anyio.create_task_group() as group:
        await gateway.upstream.start(group)
        gateway.loop = asyncio.get_running_loop()
        tools = await gateway.upstream.tools()
        runtime = await anyio.to_thread.run_sync(gateway.build_runtime, tools)
        try:
            async with effects.run_async(runtime, "profile") as run:
                gateway.run = run
                kinds: dict[str, Callable[[int], Any]] = {
                    # The gateway's own round trip to the upstream (its stdio lane), no tether.
                    "bare upstream call": lambda i: gateway.upstream.answer("count_notes", {}),
                    # tether's protocol alone, as the gateway asks it (no MCP answer built).
                    "protocol read": lambda i: run.call_async("count_notes", "", {"arguments": {}}),
                    "read": lambda i: gateway.call("count_notes", {}),
                    "protocol effect": lambda i: run.call_async(
                        "add_note", "", {"arguments": {"text": f"bare {i}"}}
                    ),
                    "effect": lambda i: gateway.call("add_note", {"text": f"note {i}"}),
                    "replay": lambda i: gateway.call("add_note", {"text": "again"}),
                }
                with worker_profile(profiles, current):
                    for make in kinds.values():  # warm: imports, caches, the replayed call
                        await make(-1)
                    clock.take()
                    walls: dict[str, list[float]] = defaultdict(list)
                    spent: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
                    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
                    loops = {kind: cProfile.Profile(time.thread_time) for kind in kinds}
                    for i in range(calls):  # the kinds interleaved: each call beside the others
                        for kind, make in kinds.items():
                            current[0] = kind
                            start = time.perf_counter()
                            loops[kind].enable()
                            answer = await make(i)
                            loops[kind].disable()
                            walls[kind].append(time.perf_counter() - start)
                            await gateway.recorded()  # the receipt, after the answer
                            if getattr(answer, "is_error", False):
                                raise RuntimeError(f"{kind}: {answer.content}")
                            took, many = clock.take()
                            for label, seconds in took.items():
                                spent[kind][label] += seconds
                                counts[kind][label] += many[label]
                    for kind in kinds:
                        report(
                            kind,
                            calls,
                            walls[kind],
                            spent[kind],
                            counts[kind],
                            profiles.get(kind),
                            loops[kind],
                        )
        finally:
            await gateway.upstream.aclose()
            group.cancel_scope.cancel()


def report(
    kind: str,
    calls: int,
    walls: list[float],
    spent: dict[str, float],
    counts: dict[str, int],
    worker: cProfile.Profile | None,
    loop: cProfile.Profile,
) -> None:
    mean = sum(walls) / calls
    print(
        f"{kind}: {calls} calls, wall median {statistics.median(walls) * 1000:.2f} ms, "
        f"mean {mean * 1000:.2f} ms"
    )
    accounted = 0.0
    for label, seconds in sorted(spent.items()):
        accounted += seconds
        print(
            f"  {label:<22} {seconds / calls * 1000:7.2f} ms per call "
            f"({counts[label] / calls:.1f} per call)"
        )
    print(f"  {'everything else':<22} {(mean - accounted / calls) * 1000:7.2f} ms per call")
    if worker is not None:
        print("  the protocol's worker thread:")
        print(top(worker, calls))
    print("  the event loop's thread:")
    print(top(loop, calls, limit=8))
