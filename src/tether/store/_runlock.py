"""A process's hold on the runs it has open without a lease, let go of by the OS when it dies.

A runtime without a lease (``lease_ttl_s=None``) assumes it alone has a run
open. Two processes that open the same run at once would both recover it
and both settle a write in flight (each may send it). So each process takes
a lock per open run that lives exactly as long as the process can act on
it: a ``flock`` on a file beside a SQLite database, a session-level
advisory lock on a PostgreSQL connection. Both vanish with the process
(``kill -9`` included), so a rerun after a crash opens the run at once, with
no expiry to wait for; a second live process is refused with
:class:`~tether.core.RunBusyError`.

The hold is per process, never per opener: two sessions of one process on
one run share it (a count), as they shared the run before (the in-process
rules, ``tether.effects``'s one block per run and the commit's
compare-and-set, still apply between them). A dialect supplies two hooks:
where its locks live (:meth:`HoldsRuns._hold_place`) and one try at a run's
lock (:meth:`HoldsRuns._try_hold`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tether.core import RunBusyError


class ProcessLock(Protocol):
    """One run's lock as a dialect took it: kept until :meth:`let_go`."""

    def let_go(self) -> None:
        """Give the lock up (an error is swallowed: a lock that is gone is given up)."""

    def alive(self) -> bool:
        """Whether the lock is still this process's (a dropped connection loses it)."""

    def forget(self) -> None:
        """In a forked child: drop the inherited lock without giving the parent's up."""


class NoLock:
    """What a read-only store holds for a run: nothing (it commits nothing, so acts on nothing)."""

    def let_go(self) -> None:
        return None

    def alive(self) -> bool:
        return True

    def forget(self) -> None:
        return None


@runtime_checkable
class RunHolder(Protocol):
    """A generation store that can hold a run for this process (see the module docstring)."""

    def hold_run(self, run_id: str) -> RunHold: ...


@dataclass
class _Held:
    """This process's lock on one run, and how many openers share it."""

    lock: ProcessLock
    count: int


class _Registry:
    """(place, run id) -> this process's lock. Taking and giving up a lock (a file, or
    a round trip to PostgreSQL) happens under ``lock``: runs are opened rarely,
    and two threads must never both take the first share."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], _Held] = {}
        self.lock = threading.Lock()
        #: Shares a garbage collector let go of while ``lock`` was taken (see
        #: :meth:`RunHold.release_soon`), given up by the next holder of ``lock``.
        self.dropped: list[RunHold] = []

    def settle_dropped(self) -> None:
        """Give up the shares dropped meanwhile (called with ``lock`` held)."""
        while self.dropped:
            self.dropped.pop()._give_up()


_registry = _Registry()


def _forget_after_fork() -> None:
    """A forked child holds nothing: its parent does (the inherited locks are the parent's)."""
    _registry.lock = threading.Lock()  # the parent's may have been held mid-fork
    for held in _registry.held.values():
        held.lock.forget()
    _registry.held.clear()
    _registry.dropped.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


class RunHold:
    """One opener's share of this process's hold on a run; :meth:`release` gives it up once."""

    def __init__(self, place: str, run_id: str, held: _Held) -> None:
        self.run_id = run_id
        self._key = (place, run_id)
        self._held = held
        self._released = False

    def release(self) -> None:
        """Give this share up; the lock goes when the last share of this process does."""
        with _registry.lock:
            _registry.settle_dropped()
            self._give_up()

    def release_soon(self) -> None:
        """:meth:`release` for a garbage collector's finalizer: never waits.

        A collection can run inside :meth:`HoldsRuns.hold_run` itself (a new
        PostgreSQL connection allocates), with the registry's lock taken by
        this very thread: waiting for it there deadlocked. The share is then
        given up by whoever takes the lock next.
        """
        if _registry.lock.acquire(blocking=False):
            try:
                _registry.settle_dropped()
                self._give_up()
            finally:
                _registry.lock.release()
        else:
            _registry.dropped.append(self)

    def _give_up(self) -> None:
        if self._released:
            return
        self._released = True
        held = self._held
        held.count -= 1
        if held.count <= 0:
            if _registry.held.get(self._key) is held:
                del _registry.held[self._key]
            held.lock.let_go()

    def check(self) -> None:
        """Before an effect leaves: this process still holds the run, or RunBusyError.

        The lock can be lost under a live process (its PostgreSQL connection
        dropped, its lock file deleted): another process may then have opened
        the run and moved it on, so nothing is sent on the old hold, even
        after a later opener of this process took the lock afresh.
        """
        with _registry.lock:  # a PostgreSQL lock's connection is in use under it
            _registry.settle_dropped()
            held = self._held
            alive = _registry.held.get(self._key) is held and held.lock.alive()
        if not alive:
            raise RunBusyError(
                f"run {self.run_id}: this process no longer holds the run (its lock was "
                "given up or lost, e.g. a dropped database connection), so another process "
                "may have it open; nothing was sent: open the run again to go on",
                run_id=self.run_id,
            )


class HoldsRuns:
    """The shared half of a store's run holds; each dialect supplies the two hooks."""

    def hold_run(self, run_id: str) -> RunHold:
        """Hold ``run_id`` for this process while it is open here, or refuse (RunBusyError).

        Refused only when another live process holds it; in this process the
        hold is shared by every opener and given up with the last
        (:meth:`RunHold.release`), or by the OS when the process dies.
        """
        place = self._hold_place()
        key = (place, run_id)
        with _registry.lock:
            _registry.settle_dropped()
            held = _registry.held.get(key)
            if held is None or not held.lock.alive():
                # Not held here, or held and lost: take it afresh.
                lock = self._try_hold(run_id)
                if lock is None:
                    raise RunBusyError(
                        f"run {run_id} is open in another process (it holds the run's lock in "
                        f"{place}); let that process finish, or stop it and open the run again "
                        "(a process that died holds nothing). Where several processes may work "
                        "on one run, give every runtime lease_ttl_s=",
                        run_id=run_id,
                    )
                # A lost one stays with its shares (they let it go), never to pass a check again.
                held = _registry.held[key] = _Held(lock, 0)
            held.count += 1
        return RunHold(place, run_id, held)

    def _hold_place(self) -> str:
        """Where this store's run locks live (one place shares one process-wide lock per run)."""
        raise NotImplementedError

    def _try_hold(self, run_id: str) -> ProcessLock | None:
        """Take ``run_id``'s lock without waiting; ``None`` if another process holds it."""
        raise NotImplementedError
