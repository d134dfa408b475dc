"""Effects from any loop: ``with effects.run(runtime, run_id):``, ``effects.call``, ``@effect``.

See :mod:`tether.runtime._effects` for the contract: each call is one step of
the protocol (gate, key and intent persisted first, the owning adapter's
call, the receipt recorded); a call a host framework repeats after a crash
returns the recorded receipt; what needs a person is raised, typed.

Your own function can be the one that performs an effect (``@effect`` with
what it proves declared, then ``fn.adapter`` given to the runtime; or
:func:`function_effect` built at run time): see
:mod:`tether.runtime._decorator` and :class:`~tether.adapters.FunctionEffect`.
From a coroutine: :func:`run_async`, :func:`call_async`.
"""

from tether.adapters import EffectToUndo, Found, FunctionEffect, current_fence, current_key
from tether.runtime._decorator import FIRST_PARAMETER, EffectFunction, effect
from tether.runtime._effects import (
    CallResult,
    GuardedRun,
    call,
    call_async,
    current,
    run,
    run_async,
)

#: Build a function effect at run time: ``function_effect(kind, fn, idempotent=..., lookup=...)``
#: is a :class:`~tether.adapters.FunctionEffect`, an adapter the runtime accepts like any other.
function_effect = FunctionEffect

__all__ = [
    "FIRST_PARAMETER",
    "CallResult",
    "EffectFunction",
    "EffectToUndo",
    "Found",
    "GuardedRun",
    "call",
    "call_async",
    "current",
    "current_fence",
    "current_key",
    "effect",
    "function_effect",
    "run",
    "run_async",
]
