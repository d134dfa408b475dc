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
from typing import TYPE_CHECKING

from tether.core import TetherError
from tether.store import Lease

if TYPE_CHECKING:
    from tether.runtime._worker import Worker, WorkerStats

log = logging.getLogger("tether.worker")

#: The most runs one worker drives at once.
MAX_CONCURRENCY = 1024


def serve_many(worker: Worker, *, max_runs: int | None, idle_exit: bool) -> WorkerStats:
    """Claim and drive up to ``worker.concurrency`` runs at once, until stopped (see ``serve``)."""
    from tether.runtime._worker import IDLE_EXIT_CLAIM_FAILURES, PHASES_CLAIMED

    changed = threading.Condition()
    active: set[threading.Thread] = set()
    started = 0
    failures = 0

    def drive(lease: Lease) -> None:
        try:
            worker.drive(lease)  # drive() keeps every per-run failure to itself
        finally:
            with changed:
                active.discard(threading.current_thread())
                changed.notify_all()

    try:
        while not worker.stopping:
            with changed:
                free = worker.concurrency - len(active)
                if max_runs is not None:
                    free = min(free, max_runs - started)
                    if free <= 0 and not active:
                        break
                if free <= 0:
                    changed.wait(worker.poll_s or None)
                    continue
            try:
                claimed = worker.store.claim_expired(
                    worker.worker_id,
                    worker.lease_ttl_s,
                    limit=free,
                    phases=PHASES_CLAIMED,
                    max_attempts=worker.max_attempts,
                )
            except TetherError as exc:  # the store is down, or a row is damaged: wait, ask again
                failures += 1
                log.error("claiming failed: %s: %s", type(exc).__name__, exc)
                if idle_exit and failures >= IDLE_EXIT_CLAIM_FAILURES:
                    raise
                worker._stop.wait(worker.poll_s)
                continue
            failures = 0
            with changed:
                for lease in claimed:
                    thread = threading.Thread(
                        target=drive, args=(lease,), name=f"tether-run-{lease.run_id}"
                    )
                    active.add(thread)
                    started += 1
                    thread.start()
                if not claimed:
                    if idle_exit and not active:
                        break
                    # Wait for a thread to come free (its run may be claimable again
                    # after a back-off) or for the poll interval, whichever is first.
                    changed.wait(worker.poll_s)
    finally:
        with changed:
            waiting = list(active)
        for thread in waiting:
            thread.join()
    return worker.stats
