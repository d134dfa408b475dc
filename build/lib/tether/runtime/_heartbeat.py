"""A heartbeat that keeps a held lease alive while one step works.

A step can outlast the lease's ttl: the agent thinks, the verifier runs the
tests, a slow service answers. Without renewal another worker would take the
run mid-step (the fence would stop this one's later commit, but the work is
lost and repeated). So while a step runs, a background thread renews the
lease every third of the ttl.

Two limits keep a renewal from outliving the work it covers:

- the thread renews only while a step is in progress (between
  :meth:`Heartbeat.busy` entering and leaving), never for a session that
  sits idle or was abandoned without a release;
- a single step is covered for at most ``max_s`` seconds: a step stuck in
  an endless loop then loses its lease like a hung process does, and
  another worker recovers the run (a stopped process, SIGSTOP, renews
  nothing at all).

Timing reads the runtime's injected clock; only the thread's sleep between
looks is real time.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from tether.core import TetherError

log = logging.getLogger("tether.heartbeat")

#: The longest one step keeps its lease by heartbeat, unless the runtime says otherwise.
DEFAULT_MAX_S = 3600.0


class Heartbeat:
    """Renews a session's lease from a daemon thread while a step is in progress."""

    def __init__(
        self,
        owner: Any,
        renew: Callable[[Any], None],
        now: Callable[[], datetime],
        *,
        every_s: float,
        max_s: float,
    ) -> None:
        # A weak reference: an abandoned session is collected and its thread ends.
        self._owner = weakref.ref(owner)
        self._renew = renew
        self._now = now
        self.every_s = every_s
        self.max_s = max_s
        self._since: datetime | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: TetherError | None = None

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Cover the enclosed step: renew while it runs (nesting is one step)."""
        if self._since is not None:
            yield
            return
        self._since = self._now()
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="tether-heartbeat", daemon=True)
            self._thread.start()
        self._wake.set()
        try:
            yield
        finally:
            self._since = None

    def stop(self) -> None:
        """End the thread (the lease was released or lost)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._thread = None

    def _loop(self) -> None:
        # Look a few times per interval so a step that starts just after a look
        # is not left uncovered for a whole interval.
        pause = max(0.005, self.every_s / 4)
        while not self._stop.is_set():
            self._wake.wait(pause)
            self._wake.clear()
            since = self._since
            owner = self._owner()
            if owner is None:
                return
            if since is None or self._stop.is_set():
                del owner
                continue
            if (self._now() - since).total_seconds() > self.max_s:
                del owner
                continue  # a step this long is treated like a hung one: let the lease lapse
            try:
                self._renew(owner)  # renews only when a third of the ttl has passed
            except TetherError as exc:
                # Lost or unreachable: the step's next guard() or commit says so.
                self.failure = exc
                log.warning("heartbeat could not renew the lease: %s", exc)
                return
            finally:
                del owner
