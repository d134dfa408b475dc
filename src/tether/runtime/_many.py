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
claimed only beside runs that have already moved in their own claims (a
claim that moved its run counts as no failure if the process dies under
it), one suspect at a time, and the worker claims nothing more until that
suspect has moved its run (a step, or more than a recovery's own commit)
or let go. A run whose step kills the process (``os._exit``, an OOM kill, a
segfault) then adds no failure to a neighbour, so the store's count parks
the poison run alone (issue 25: one failing run never stops a healthy one).

Suspects come first: a worker starts by looking for them, keeps taking them
one after another while it finds them, and, however busy, looks again every
:data:`LOOK_FOR_SUSPECTS_S` (it then claims no new run until the runs it
holds have moved, so a suspect waits about that long plus one step).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tether.core import TetherError
from tether.store import Lease

log = logging.getLogger("tether.worker")

#: The most runs one worker drives at once.
MAX_CONCURRENCY = 1024
#: How often a busy worker looks for suspects (seconds).
LOOK_FOR_SUSPECTS_S = 10.0
#: How often a worker waiting for its runs to move looks at them again (seconds):
#: a run's move is a commit, which wakes nobody.
MOVE_POLL_S = 0.05


def serve_many(
    *,
    concurrency: int,
    poll_s: float,
    stopping: Callable[[], bool],
    claim: Callable[[int, bool | None], list[Lease]],
    drive: Callable[[Lease], object],
    unmoved: Callable[[Lease], bool],
    suspect_waiting: Callable[[], bool] = lambda: True,
    pause: Callable[[float], object],
    give_up_after: int,
    max_runs: int | None,
    idle_exit: bool,
) -> None:
    """Claim up to ``concurrency`` runs at once and ``drive`` each on a thread, until ``stopping()``.

    ``claim(limit, suspects)`` claims at most ``limit`` runs (only suspects,
    only others: see ``claim_expired``); ``unmoved(lease)``: the claim
    ``lease`` has not moved its run yet (a death of the process now would
    count against it); ``suspect_waiting()``: a suspect is due now (read, not
    claimed; a busy worker makes room only for one that is);
    ``pause(seconds)`` waits, cut short when the worker is told to stop.
    ``give_up_after``: claims that fail in a row before an ``idle_exit`` worker raises the last error (see
    :meth:`Worker.serve`).
    """
    changed = threading.Condition()
    active: dict[threading.Thread, Lease] = {}
    #: The threads driving a suspect, and when each was claimed.
    suspects: dict[threading.Thread, float] = {}
    started = 0
    failures = 0

    def drive_one(lease: Lease) -> None:
        try:
            drive(lease)  # drive() keeps every per-run failure to itself
        finally:
            with changed:
                active.pop(threading.current_thread(), None)
                suspects.pop(threading.current_thread(), None)
                changed.notify_all()

    def start(lease: Lease, suspect: bool) -> None:
        nonlocal started
        thread = threading.Thread(
            target=drive_one, args=(lease,), name=f"tether-run-{lease.run_id}"
        )
        active[thread] = lease
        if suspect:
            suspects[thread] = time.monotonic()
        started += 1
        thread.start()

    #: Looking for suspects now: at start (this worker may be one that died), while
    #: it keeps finding them, and every LOOK_FOR_SUSPECTS_S however busy; a look
    #: waits for the runs held to move until ``give_up_at``, then is put off.
    looking = True
    look_at = give_up_at = time.monotonic() + LOOK_FOR_SUSPECTS_S
    try:
        while not stopping():
            with changed:
                now = time.monotonic()
                if any(
                    unmoved(active[thread]) and now < since + LOOK_FOR_SUSPECTS_S
                    for thread, since in suspects.items()
                ):
                    # A suspect that has not moved its run holds the worker alone (a
                    # first step slower than LOOK_FOR_SUSPECTS_S lets the others in:
                    # they are no suspects, so one death adds at most one failure).
                    changed.wait(MOVE_POLL_S)
                    continue
                free = concurrency - len(active)
                if max_runs is not None:
                    free = min(free, max_runs - started)
                    if free <= 0 and not active:
                        break
                if free <= 0:
                    changed.wait(poll_s or None)
                    continue
                due = not looking and now >= look_at
            if due:
                # Every LOOK_FOR_SUSPECTS_S: make room only for a suspect that is due.
                look_at = now + LOOK_FOR_SUSPECTS_S
                try:
                    looking, give_up_at = suspect_waiting(), now + LOOK_FOR_SUSPECTS_S
                except TetherError as exc:
                    log.error("looking for suspects failed: %s: %s", type(exc).__name__, exc)
                continue
            with changed:
                if looking and any(unmoved(lease) for lease in active.values()):
                    if now < give_up_at:
                        # A suspect goes in only beside runs that moved: claim
                        # nothing new until the runs held have (about one step).
                        changed.wait(MOVE_POLL_S)
                        continue
                    looking = False  # a step slower than that: the look is put off
                    look_at = now + LOOK_FOR_SUSPECTS_S
            try:
                suspect = claim(1, True) if looking else []
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
                searched = looking
                if looking:
                    now = time.monotonic()
                    look_at = now + LOOK_FOR_SUSPECTS_S
                    # Found one: look for the next as soon as it has moved.
                    looking, give_up_at = bool(suspect), now + LOOK_FOR_SUSPECTS_S
                for lease in claimed:
                    start(lease, bool(suspect))
                if not claimed:
                    if not active:
                        if not searched:
                            looking = True  # nothing else: look for suspects before idling
                            give_up_at = time.monotonic() + LOOK_FOR_SUSPECTS_S
                            continue
                        if idle_exit:
                            break
                    # Wait for a thread to come free (its run may be claimable again
                    # after a back-off) or for the poll interval, whichever is first.
                    changed.wait(poll_s)
    finally:
        with changed:
            waiting = list(active)
        for thread in waiting:
            thread.join()
