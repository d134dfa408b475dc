"""A run opened without a lease is held for this process while a session of it is open here.

With ``lease_ttl_s=None`` a runtime assumes it alone has the run open. That
is now checked, not assumed: :meth:`Runtime.start` and :meth:`Runtime.recover`
take the store's hold on the run for this process first (see
``tether.store._runlock``), so a second live process is refused with
:class:`~tether.core.RunBusyError` before it reads anything, and a process
that died (``kill -9`` too) holds nothing, so a rerun opens the run at once.

Sessions of one process share the hold, as they shared the run before. A
session gives its share up on :meth:`~tether.runtime.RunSession.release` (the
end of a ``tether.effects.run`` block does that) or when it is garbage
collected; the process gives all up when it exits. Leased runtimes take no
hold: the lease is the authority there, and a hold would keep a run from
being taken over from a worker that stalls while alive, which is what a
lease's expiry is for. A store that cannot hold runs (a third-party one
without ``hold_run``) works as before, unchecked.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tether.store import Lease, RunHold, RunHolder

if TYPE_CHECKING:
    from tether.runtime._session import RunSession


@contextmanager
def opening(
    marks: object, lease_ttl_s: float | None, run_id: str, lease: Lease | None = None
) -> Iterator[Callable[[RunSession], RunSession]]:
    """Hold ``run_id`` while the block opens a session of it; the block hands the session to
    the function it is given, which keeps the hold with it. A block that fails lets go.

    ``marks``: the runtime's generation store (it holds runs where it can);
    ``lease_ttl_s``: the runtime's lease, if any (a leased runtime takes no hold).
    """
    hold = None
    if lease is None and lease_ttl_s is None and isinstance(marks, RunHolder):
        hold = marks.hold_run(run_id)
    try:
        yield lambda session: _keep(session, hold)
    except BaseException:
        if hold is not None:
            hold.release()
        raise


def _keep(session: RunSession, hold: RunHold | None) -> RunSession:
    if hold is not None:
        session.liveness = hold
        # A session dropped without release() (``rt.start(id).run()``) lets go with it.
        weakref.finalize(session, hold.release_soon)  # never waits inside a collection
    return session
