"""The lease a session works under: hold, renew when due, check before every effect, release.

Two kinds of check, and why they differ:

- before an effect leaves the process (an adapter call), the lease is read
  from the store every time: a worker whose lease moved on sends nothing;
- at the start of a step, it is touched only when a renewal is due (a third
  of the ttl by the runtime's clock) or the heartbeat has reported a
  failure. A step that only commits needs no read of its own: the commit is
  a compare-and-set on (generation, lease version), so a worker that lost
  its lease is refused there and nothing it decided lands. This saves one
  round trip per step.
"""

from __future__ import annotations

import contextlib
import threading
from datetime import datetime
from typing import Protocol

from tether.adapters import Adapter, Fence, wants_fence
from tether.core import LeaseLostError
from tether.runtime._checkpointer import Checkpointer
from tether.runtime._clock import Clock
from tether.runtime._heartbeat import Heartbeat
from tether.store import Lease, RunHold


class LeaseRuntime(Protocol):
    """What lease handling reads of the runtime."""

    @property
    def clock(self) -> Clock: ...
    @property
    def lease_ttl_s(self) -> float | None: ...
    @property
    def heartbeat_max_s(self) -> float: ...
    @property
    def checkpointer(self) -> Checkpointer: ...
    @property
    def adapter(self) -> Adapter: ...


class LeaseHolder:
    """A session's half that keeps its lease (a base class of ``RunSession``)."""

    rt: LeaseRuntime
    lease: Lease | None
    _renewed: datetime
    _heartbeat: Heartbeat | None

    def _init_lease(self, now: datetime) -> None:
        self.lease = None
        # The version given up by release(): nothing acts under it any more.
        self._released: int | None = None
        self._renewed = now
        # The heartbeat thread and the step share the lease; this orders them.
        self._lease_lock = threading.RLock()
        self._heartbeat = None
        #: This process's hold on a run opened without a lease (see ``_liveness``).
        self.liveness: RunHold | None = None

    @property
    def run_id(self) -> str:
        raise NotImplementedError

    def hold(self, lease: Lease) -> None:
        """Work under ``lease``: its version fences every commit and adapter call."""
        with self._lease_lock:
            self.lease = lease
            self._renewed = self.rt.clock.now()
        ttl = self.rt.lease_ttl_s
        if ttl is not None and self._heartbeat is None:
            self._heartbeat = Heartbeat(
                self,
                LeaseHolder.renew_if_due,
                self.rt.clock.now,
                every_s=ttl / 3,
                max_s=self.rt.heartbeat_max_s,
            )

    def release(self) -> None:
        """Give the lease up (a clean shutdown), so another worker may take the run at once.

        Without a lease: give up this session's share of the process's hold
        on the run, so another process may open it once no session here has it.
        """
        if self.liveness is not None:
            self.liveness.release()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        with self._lease_lock:
            if self.lease is not None:
                self._released = self.lease.lease_version
                self.rt.checkpointer.marks.release_lease(
                    self.run_id, self.lease.owner, self.lease.lease_version
                )
                self.lease = None

    def renew_if_due(self) -> None:
        """Renew the held lease once a third of its ttl has passed (by the runtime's clock)."""
        self._renew_due()

    def _renew_due(self) -> bool:
        """:meth:`renew_if_due`; True if it renewed (the store confirmed the lease is ours)."""
        ttl = self.rt.lease_ttl_s
        with self._lease_lock:
            lease = self.lease
            if lease is None or ttl is None:
                return False
            if (self.rt.clock.now() - self._renewed).total_seconds() <= ttl / 3:
                return False
            marks = self.rt.checkpointer.marks
            self.hold(marks.renew_lease(self.run_id, lease.owner, lease.lease_version, ttl))
            return True

    def working(self) -> contextlib.AbstractContextManager[None]:
        """Cover a step: the heartbeat renews the lease while it runs (see ``_heartbeat``)."""
        if self._heartbeat is None:
            return contextlib.nullcontext()
        return self._heartbeat.busy()

    def keep(self) -> None:
        """At the start of a step: renew when due; read the lease only if the heartbeat failed.

        A lost lease is then found by the step's commit (its CAS names the
        lease version) or by the :meth:`guard` before any adapter call.
        """
        if self._renew_due():
            return
        heartbeat = self._heartbeat
        lease = self.lease
        if lease is not None and heartbeat is not None and heartbeat.failure is not None:
            self.rt.checkpointer.marks.check_lease(self.run_id, lease.lease_version)
            heartbeat.failure = None  # it was passing trouble: the lease is still ours

    def guard(self) -> Fence | None:
        """Before every effect: renew if a third of the ttl has passed, then check the lease.

        Returns the fencing token for adapters that can check it.
        """
        self.renew_if_due()
        lease = self.lease
        if lease is None:
            if self._released is not None:
                # This session gave it up (release()): whoever holds it now acts, not us.
                raise LeaseLostError(self.run_id, self._released, self._released)
            if self.liveness is not None:
                self.liveness.check()  # no lease: this process must still hold the run
            return None
        self.rt.checkpointer.marks.check_lease(self.run_id, lease.lease_version)
        if not wants_fence(self.rt.adapter):
            return None
        return Fence(self.run_id, lease.lease_version, lease.expires_at)
