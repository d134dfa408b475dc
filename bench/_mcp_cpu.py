"""The CPU of the gateway's call path by thread, no profiler: ``python bench/mcp.py --cpu``.

The gateway's own call path (``Gateway.call``) driven in this process
against the test upstream (a real child over stdio), as ``--profile`` does,
but timed with each thread's own CPU clock only, so the figures are not
inflated by a profiler: per kind of call, the protocol's worker thread (and
of it, the store's commits: ``Checkpointer.advance``; an effect's receipt,
committed while the agent is answered, counted) and the event loop's thread
until the answer (the upstream's lane, the hand-offs to and from the worker), beside
the upstream's lane alone (``Upstream.answer``, no tether). What the
agent's side of the gateway adds (its stdio channel) is not in it: the
whole process's CPU per call is in ``bench/mcp.py``'s own table.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def thread_clock(owner: Any, name: str, label: str, spent: dict[str, float]) -> Iterator[None]:
    """Add the CPU the calling thread spends in ``owner.name`` to ``spent[label]``."""
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.thread_time() - start

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)


async def cpu(where: Path, calls: int) -> None:
    from tether import effects
    from tether.crypto import Keyring
    from tether.integrations.mcp import (
        Gateway,
        GatewayConfig,
        GatewayPolicy,
        Upstream,
        stdio_target,
    )
    from tether.runtime import _checkpointer
    from tether.runtime._effects import GuardedRun

    argv = [sys.executable, "-m", "tests.integration._mcp_upstream", str(where / "up.sqlite")]
    policy = {"reads": ["count_notes"], "tools": {"add_note": {"targets": "collection"}}}
    gateway = Gateway(
        GatewayConfig(
            store=f"sqlite:///{where / 'tether.sqlite'}",
            run_id="cpu",
            keyring=Keyring.generate("k1"),
            policy=GatewayPolicy.from_json(policy),
        ),
        Upstream(stdio_target(argv, str(ROOT)), timeout_s=60),
    )
    spent: dict[str, float] = {}
    async with anyio.create_task_group() as group:
        await gateway.upstream.start(group)
        gateway.loop = asyncio.get_running_loop()
        tools = await gateway.upstream.tools()
        runtime = await anyio.to_thread.run_sync(gateway.build_runtime, tools)
        try:
            with (
                thread_clock(GuardedRun, "call", "worker", spent),
                thread_clock(_checkpointer.Checkpointer, "advance", "commits", spent),
            ):
                async with effects.run_async(runtime, "cpu") as run:
                    gateway.run = run
                    kinds: dict[str, Callable[[int], Any]] = {
                        # The upstream's lane alone: no tether, no worker thread.
                        "upstream alone": lambda i: gateway.upstream.answer("count_notes", {}),
                        "read": lambda i: gateway.call("count_notes", {}),
                        "effect, no key": lambda i: gateway.call("add_note", {"text": f"n {i}"}),
                        "effect, keyed": lambda i: gateway.call(
                            "charge", {"account": f"a{i}", "cents": 1}
                        ),
                        "replay": lambda i: gateway.call("add_note", {"text": "again"}),
                    }
                    for make in kinds.values():  # warm: imports, caches, the replayed call
                        await make(-1)
                    seen: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
                    for i in range(calls):  # the kinds interleaved
                        for kind, make in kinds.items():
                            spent.clear()
                            start = time.thread_time()
                            answer = await make(i)
                            if getattr(answer, "is_error", False):
                                raise RuntimeError(f"{kind}: {answer.content}")
                            spent["loop"] = time.thread_time() - start
                            # An effect is answered before its receipt's commit: its end too.
                            await gateway.recorded()
                            for label in ("worker", "commits", "loop"):
                                seen[kind].setdefault(label, []).append(spent.get(label, 0.0))
            print(f"CPU per call by thread, median of {calls} (ms; no profiler):")
            for kind, got in seen.items():
                worker, commits, loop = (
                    statistics.median(got[label]) * 1000 for label in ("worker", "commits", "loop")
                )
                print(
                    f"  {kind:<15} protocol's worker {worker:5.2f} (of it commits {commits:5.2f})"
                    f"   event loop {loop:5.2f}"
                )
        finally:
            await gateway.upstream.aclose()
            group.cancel_scope.cancel()
