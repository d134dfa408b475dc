"""A stop signal that lands while the worker waits never deadlocks it."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from tether.runtime import Worker
from tether.runtime._worker import install_signal_handlers
from tether.store import open_store


def test_a_signal_arriving_inside_the_idle_wait_stops_the_worker_instead_of_hanging(
    tmp_path: Path,
) -> None:
    """The handler runs where Event.wait() holds the event's lock (as SIGTERM can) and returns; the worker stops once the lock is let go."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with open_store(f"sqlite:///{tmp_path / 'w.sqlite'}") as store:
        worker = Worker(store, lambda run_id: None, "w1")  # type: ignore[arg-type,return-value]
        try:
            install_signal_handlers(worker)
            handler = signal.getsignal(signal.SIGTERM)
            if not callable(handler):
                raise TypeError("no SIGTERM handler installed")
            returned = threading.Event()
            lock = worker._stop._cond  # the lock Event.wait() holds between its checks
            with lock:
                caller = threading.Thread(
                    target=lambda: (handler(signal.SIGTERM, None), returned.set()), daemon=True
                )
                caller.start()
                # Called where the event's lock is held, the handler must come back at once.
                assert returned.wait(10), "the signal handler blocked on the event's lock"
                assert not worker.stopping
            assert worker._stop.wait(10) and worker.stopping
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
