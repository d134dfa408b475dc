"""A worker driving many runs at once: one thread per claimed run, up to ``concurrency``.

Each run is driven exactly as :meth:`Worker.drive` drives one (its own
lease, its own fence, its own back-off); only the claiming differs: the
worker claims as many runs as it has free threads, and claims again as
threads come free. The threads share the worker's store, so their commits
meet in the store's group commit (``store._group``): commits that wait
together are written in one transaction, with one fsync, each still fenced
by its own run's lease and generation.

A thread ends when its run ends, freezes, waits, or the worker stops; a
stopping worker lets every thread finish its step and release its lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from tether.core import TetherError
from tether.store import Lease

log = logging.getLogger("tether.worker")

#: The most runs one worker drives at once.
MAX_CONCURRENCY = 1024


def serve_many(
    *,
    concurrency: int,
    poll_s: float,
    stopping: Callable[[], bool],
    claim: Callable[[int], list[Lease]],
    drive: Callable[[Lease], object],
    pause: Callable[[float], object],
    give_up_after: int,
    max_runs: int | None,
    idle_exit: bool,
) -> None:
    """Claim up to ``concurrency`` runs at once and ``drive`` each on a thread, until ``stopping()``.

    ``claim(limit)`` claims at most ``limit`` runs; ``pause(seconds)`` waits,
    cut short when the worker is told to stop. ``give_up_after``: claims that
    fail in a row before an ``idle_exit`` worker raises the last error (see
    :meth:`Worker.serve`).
    """
    changed = threading.Condition()
    active: set[threading.Thread] = set()
    started = 0
    failures = 0

    def drive_one(lease: Lease) -> None:
        try:
            drive(lease)  # drive() keeps every per-run failure to itself
        finally:
            with changed:
                active.discard(threading.current_thread())
                changed.notify_all()

    try:
        while not stopping():
            with changed:
                free = concurrency - len(active)
                if max_runs is not None:
                    free = min(free, max_runs - started)
                    if free <= 0 and not active:
                        break
                if free <= 0:
                    changed.wait(poll_s or None)
                    continue
            try:
                claimed = claim(free)
            except TetherError as exc:  # the store is down, or a row is damaged: wait, ask again
                failures += 1
                log.error("claiming failed: %s: %s", type(exc).__name__, exc)
                if idle_exit and failures >= give_up_after:
                    raise
                pause(poll_s)
                continue
            failures = 0
            with changed:
                for lease in claimed:
                    thread = threading.Thread(
                        target=drive_one, args=(lease,), name=f"tether-run-{lease.run_id}"
                    )
                    active.add(thread)
                    started += 1
                    thread.start()
                if not claimed:
                    if idle_exit and not active:
                        break
                    # Wait for a thread to come free (its run may be claimable again
                    # after a back-off) or for the poll interval, whichever is first.
                    changed.wait(poll_s)
    finally:
        with changed:
            waiting = list(active)
        for thread in waiting:
            thread.join()
