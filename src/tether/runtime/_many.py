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

A run whose claims died twice in a row without moving it (a suspect: its
worker's process died with it, maybe of it; ``core.claimed_alone``) is
claimed only by a worker that holds no other run, and
the worker claims nothing more until that run has made a step of progress (or
let go): a run whose step kills the process (``os._exit``, an OOM kill, a
segfault) then kills no neighbour, and the neighbours it killed before each
get a claim of their own in which they move on, so the store's count of
failed claims parks the poison run alone (issue 25: one failing run never
stops a healthy one).
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
    claim: Callable[[int, bool | None], list[Lease]],
    drive: Callable[[Lease], object],
    alone: Callable[[Lease], bool],
    pause: Callable[[float], object],
    give_up_after: int,
    max_runs: int | None,
    idle_exit: bool,
) -> None:
    """Claim up to ``concurrency`` runs at once and ``drive`` each on a thread, until ``stopping()``.

    ``claim(limit, suspects)`` claims at most ``limit`` runs (only suspects,
    only others: see ``claim_expired``); ``alone(lease)``: a suspect being
    driven still needs the worker to itself (it has made no progress yet);
    ``pause(seconds)`` waits, cut short when the worker is told to stop.
    ``give_up_after``: claims that fail in a row before an ``idle_exit`` worker raises the last error (see
    :meth:`Worker.serve`).
    """
    changed = threading.Condition()
    active: dict[threading.Thread, Lease] = {}
    #: The threads driving a suspect.
    suspects: set[threading.Thread] = set()
    started = 0
    failures = 0

    def drive_one(lease: Lease) -> None:
        try:
            drive(lease)  # drive() keeps every per-run failure to itself
        finally:
            with changed:
                active.pop(threading.current_thread(), None)
                suspects.discard(threading.current_thread())
                changed.notify_all()

    def start(lease: Lease, suspect: bool) -> None:
        nonlocal started
        thread = threading.Thread(
            target=drive_one, args=(lease,), name=f"tether-run-{lease.run_id}"
        )
        active[thread] = lease
        if suspect:
            suspects.add(thread)
        started += 1
        thread.start()

    try:
        while not stopping():
            with changed:
                if any(alone(active[thread]) for thread in suspects):
                    # A suspect not yet cleared by a step of progress holds the worker alone.
                    changed.wait(poll_s or None)
                    continue
                free = concurrency - len(active)
                if max_runs is not None:
                    free = min(free, max_runs - started)
                    if free <= 0 and not active:
                        break
                if free <= 0:
                    changed.wait(poll_s or None)
                    continue
                idle = not active
            try:
                # A suspect only into an empty worker; then nothing else beside it.
                suspect = claim(1, True) if idle else []
                claimed = suspect or claim(free, False)
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
                    start(lease, bool(suspect))
                if not claimed:
                    if idle and not active:
                        if idle_exit:
                            break
                    elif not active:
                        # Emptied while it claimed: no suspect was offered, so ask again at once.
                        continue
                    # Wait for a thread to come free (its run may be claimable again
                    # after a back-off) or for the poll interval, whichever is first.
                    changed.wait(poll_s)
    finally:
        with changed:
            waiting = list(active)
        for thread in waiting:
            thread.join()
