"""A recovery worker: claims runs whose lease expired, admits and resumes them.

Many workers, on many machines, point at one store (PostgreSQL for more than
one machine). Each claim is a compare-and-set that bumps the run's lease
version, so no two workers drive a run at once, and the version fences every
commit and every adapter call of the one that does.

The application is loaded by ``module:factory``: a callable
``factory(store, run_id, worker) -> Runtime`` that builds the runtime for one
run (its adapter, task, policy, agent, keys and trust roots).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from tether.core import LeaseError, Phase, TetherError
from tether.runtime._runtime import Runtime
from tether.store import Lease

log = logging.getLogger("tether.worker")

RuntimeFactory = Callable[[Any, str, str], Runtime]


class AppLoadError(TetherError):
    """``module:factory`` does not name a callable that can be imported."""


def load_factory(spec: str) -> RuntimeFactory:
    """Import ``module:factory`` and return the callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app must look like module:factory, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppLoadError(f"cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise AppLoadError(f"{module_name}.{attr} is not a callable")
    return factory  # type: ignore[no-any-return]


@dataclass
class WorkerStats:
    """What a worker did, for its log line and for tests."""

    claimed: int = 0
    completed: int = 0
    waiting: int = 0
    lost: int = 0
    errors: int = 0
    runs: list[str] = field(default_factory=list)


class Worker:
    """Claims and drives runs until stopped; one run at a time."""

    def __init__(
        self,
        store: Any,
        factory: RuntimeFactory,
        worker_id: str,
        *,
        lease_ttl_s: float = 15.0,
        poll_s: float = 0.5,
    ) -> None:
        self.store = store
        self.factory = factory
        self.worker_id = worker_id
        self.lease_ttl_s = lease_ttl_s
        self.poll_s = poll_s
        self.stats = WorkerStats()
        self._stop = threading.Event()

    def stop(self) -> None:
        """Finish the current step, release the lease, and return from :meth:`serve`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def serve(self, *, max_runs: int | None = None, idle_exit: bool = False) -> WorkerStats:
        """Claim and drive runs until stopped (or ``max_runs`` claimed, or idle with ``idle_exit``)."""
        while not self.stopping:
            if max_runs is not None and self.stats.claimed >= max_runs:
                break
            claimed = self.store.claim_expired(self.worker_id, self.lease_ttl_s, limit=1)
            if not claimed:
                if idle_exit:
                    break
                self._stop.wait(self.poll_s)
                continue
            for lease in claimed:
                self.drive(lease)
        return self.stats

    def drive(self, lease: Lease) -> Phase | None:
        """Recover one claimed run and step it until it ends, freezes, waits, or we stop."""
        self.stats.claimed += 1
        self.stats.runs.append(lease.run_id)
        session = None
        try:
            runtime = self.factory(self.store, lease.run_id, self.worker_id)
            runtime.lease_ttl_s = self.lease_ttl_s
            runtime.worker = self.worker_id
            session = runtime.recover(lease.run_id, lease=lease)
            while not self.stopping:
                phase = session.state.phase
                if phase.terminal or phase is Phase.NEEDS_REVIEW:
                    break
                before = session.state.generation
                session.run(max_steps=1)
                if session.state.generation == before:
                    # Waiting for a person: keep the lease until it expires, which
                    # is the natural back-off before any worker looks again.
                    self.stats.waiting += 1
                    return session.state.phase
            phase = session.state.phase
            if phase is Phase.COMPLETED:
                self.stats.completed += 1
            session.release()
            return phase
        except LeaseError as exc:
            self.stats.lost += 1
            log.warning("run %s: lease lost (%s); leaving it to its new owner", lease.run_id, exc)
            return None
        except TetherError as exc:
            self.stats.errors += 1
            log.error("run %s: %s: %s", lease.run_id, type(exc).__name__, exc)
            if session is not None and session.lease is not None:
                with contextlib.suppress(LeaseError):
                    session.release()
            return None


def install_signal_handlers(worker: Worker) -> None:
    """SIGTERM and SIGINT stop the worker cleanly: finish the step, release the lease."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: finishing the current step, then releasing the lease", signum)
        worker.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
