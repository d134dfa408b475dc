"""Effects from any loop: ``with effects.run(runtime, run_id):``, ``effects.call``, ``@effect``.

See :mod:`tether.runtime._effects` for the contract: each call is one step of
the protocol (gate, key and intent persisted first, the owning adapter's
call, the receipt recorded); a call a host framework repeats after a crash
returns the recorded receipt; what needs a person is raised, typed.
"""

from tether.runtime._effects import (
    FIRST_PARAMETER,
    CallResult,
    GuardedRun,
    call,
    current,
    effect,
    run,
)

__all__ = ["FIRST_PARAMETER", "CallResult", "GuardedRun", "call", "current", "effect", "run"]
