"""The protocol's work off an async caller's event loop; the effect's body back on it.

A call from a coroutine must not hold its loop for a store commit: the
protocol (gate, commits, the adapter's call) runs in a worker thread here,
with a copy of the caller's context (its open run), and an ``async def``
body that thread reaches is awaited on the caller's loop
(``tether.adapters._function``), so one loop carries many runs' bodies at
once while their commits wait on the store in threads.

The pool is large because a worker waits, idle, while its body runs on the
loop: its size is how many async effects can be in flight at once; more
calls queue for a worker and never block one already running.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tether.adapters._fncall import bodies_await_on

#: Calls in flight at once from async callers, across every loop of the process.
WORKERS = 256

T = TypeVar("T")

_pools: list[ThreadPoolExecutor] = []  # made on first use: importing tether starts no thread
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    with _pool_lock:
        if not _pools:
            _pools.append(ThreadPoolExecutor(WORKERS, thread_name_prefix="tether-effects"))
        return _pools[0]


async def off_loop(fn: Callable[..., T], /, *args: Any) -> T:
    """``fn(*args)`` in a worker thread, in a copy of this context, bodies awaited on this loop."""
    import asyncio  # a caller that awaits this has loaded it; `import tether` does not

    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    context.run(bodies_await_on, loop)
    return await loop.run_in_executor(_executor(), functools.partial(context.run, fn, *args))
