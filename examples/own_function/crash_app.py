"""The guarded function as an app for tether's crash harness, killed at every crash point.

    TICKETS_URL=http://127.0.0.1:PORT tether crashtest --app examples.own_function.crash_app:app

(from the repository root, with the reference ticket service running;
``tests/integration/test_own_function_example.py`` does exactly that). Each
run opens one ticket whose title names the run, so runs sharing one service
are counted apart, from the service's own table.

- ``app``: :func:`~examples.own_function.tickets.open_ticket` (idempotent,
  with a look-up): every kill is settled by the key, one ticket per run.
- ``unproven_app``: :func:`~examples.own_function.tickets.open_ticket_unproven`
  (nothing declared): killed after the send, the run goes to review and the
  body is never run again (still one ticket).
- ``async_app``: :func:`~examples.own_function.tickets.open_ticket_async`,
  awaited on the loop of an ``asyncio`` caller.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import tether
from examples.own_function import config
from examples.own_function.tickets import (
    KIND,
    open_ticket,
    open_ticket_async,
    open_ticket_unproven,
    tickets,
)
from tether.core import EffectNotSettledError, NeedsReviewError
from tether.effects import EffectFunction
from tether.runtime import CrashPlan
from tether.store import ContentStore

T = TypeVar("T")
#: How often a call that was not settled yet (a request still in flight) is made again.
ATTEMPTS = 40


def title(run_id: str) -> str:
    """The ticket a run opens: its title names the run."""
    return f"[{run_id}] The printer is on fire."


def settled(call: Callable[[], T]) -> T:
    """``call()``, made again while an earlier attempt is still in flight (bounded)."""
    for attempt in range(ATTEMPTS):
        try:
            return call()
        except EffectNotSettledError:
            time.sleep(min(0.5, 0.01 * 2**attempt))
    return call()


async def settled_async(call: Callable[[], Awaitable[T]]) -> T:
    """:func:`settled` for a coroutine."""
    for attempt in range(ATTEMPTS):
        try:
            return await call()
        except EffectNotSettledError:
            await asyncio.sleep(min(0.5, 0.01 * 2**attempt))
    return await call()


class TicketApp:
    """prepare / runtime / drive / effects, as :class:`~tether.testing.crash_harness.LoopCrashApp`."""

    def __init__(self, workdir: Path, opener: EffectFunction) -> None:
        self.workdir = Path(workdir)
        self.opener = opener
        # One key for every run under workdir; made before any child starts.
        self.keys = config.keyring(self.workdir / "keyring.json")

    def prepare(self, run_id: str) -> None:
        """Nothing to make: the service is shared, and each run's ticket names the run."""

    def runtime(self, store: ContentStore, run_id: str, crash: CrashPlan) -> tether.Runtime:
        return config.runtime(self.opener.adapter, store, self.keys, crash)

    def drive(self, runtime: tether.Runtime, run_id: str) -> None:
        """Open the run's ticket and finish; a run that ended, or waits for a person, is left."""
        if inspect.iscoroutinefunction(self.opener):
            asyncio.run(self._drive_async(runtime, run_id))
            return
        with tether.effects.run(runtime, run_id) as run:
            if run.phase.terminal:
                return
            try:
                settled(lambda: self.opener(title(run_id)))
                run.finish("ticket opened")
            except NeedsReviewError:
                return  # the outcome is unknown: a person decides, the run waits

    async def _drive_async(self, runtime: tether.Runtime, run_id: str) -> None:
        async with tether.effects.run_async(runtime, run_id) as run:
            if run.phase.terminal:
                return
            try:
                await settled_async(lambda: self.opener(title(run_id)))
                await run.finish_async("ticket opened")
            except NeedsReviewError:
                return

    def effects(self, run_id: str) -> dict[str, Any]:
        """The tickets the service's own table holds for this run."""
        return {KIND: len(tickets(f"[{run_id}]"))}


def app(workdir: Path) -> TicketApp:
    """``--app examples.own_function.crash_app:app``: idempotent, with a look-up."""
    return TicketApp(workdir, open_ticket)


def unproven_app(workdir: Path) -> TicketApp:
    """``--app examples.own_function.crash_app:unproven_app``: nothing declared."""
    return TicketApp(workdir, open_ticket_unproven)


def async_app(workdir: Path) -> TicketApp:
    """``--app examples.own_function.crash_app:async_app``: an ``async def`` body."""
    return TicketApp(workdir, open_ticket_async)
