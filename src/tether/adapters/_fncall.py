"""How a function is called as an effect: its parameters read as a call, its key, its loop.

:func:`call_shape` reads a function's parameters as an effect's call (the
target, the arguments, the key parameter). :func:`call_with_key` runs one
of the user's functions with the effect's key current (:func:`current_key`),
awaiting a coroutine on the loop of the async caller that made the call
(:func:`bodies_await_on`, set by the runtime before it hands the protocol's
work to a worker thread), or on a fresh loop where there is none.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tether.adapters._base import Fence
from tether.adapters._errors import HiddenCoroutineError
from tether.core import AdapterUnavailableError, NotInRunError, SpecError

if TYPE_CHECKING:  # imported by the first async call: `import tether` does not load asyncio
    import asyncio

#: The parameter a body (or a compensation) may declare to be handed its key.
KEY_PARAMETER = "idempotency_key"
#: The first parameter of a method, never part of the call.
RECEIVERS = frozenset({"self", "cls"})

_key: ContextVar[str | None] = ContextVar("tether_effect_key", default=None)
_fence: ContextVar[Fence | None] = ContextVar("tether_effect_fence", default=None)
_caller_loop: ContextVar[asyncio.AbstractEventLoop | None] = ContextVar(
    "tether_caller_loop", default=None
)


def current_key() -> str:
    """The idempotency key of the effect whose body is running here.

    Minted and persisted with the intent before the body started; pass it to
    the callee so it can deduplicate (the same key on every attempt of this
    intent, never another). Outside an effect's body: :class:`~tether.core.NotInRunError`.
    """
    key = _key.get()
    if key is None:
        raise NotInRunError(
            "no effect's body is running here: current_key() answers inside a function "
            "that tether runs as an effect (@tether.effect, tether.function_effect)"
        )
    return key


def current_fence() -> Fence | None:
    """The run's lease as a fencing token, for the effect whose body is running here.

    ``None`` where the runtime runs without leases. Pass ``lease_version`` to
    a callee that refuses a token lower than the highest it has seen for the
    run (and declare ``fencing=True``): a worker paused past its lease, whose
    run another worker took over, is then refused instead of sending twice.
    Outside an effect's body: :class:`~tether.core.NotInRunError`.
    """
    if _key.get() is None:
        raise NotInRunError("no effect's body is running here: current_fence() answers inside one")
    return _fence.get()


def inside_effect_body() -> bool:
    """Whether an effect's body (or look-up, or compensation) is running in this context."""
    return _key.get() is not None


def refuse_inside_a_body(what: str) -> None:
    """Refuse a call made from inside an effect's body: it would wait for its own step."""
    if inside_effect_body():
        raise SpecError(
            what,
            "an effect's body cannot make another effect or end the run (its own step holds "
            "the run); return, and make the next call from the loop",
        )


def bodies_await_on(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` the one async bodies are awaited on, in the current context.

    Called in a copy of an async caller's context before the protocol's work
    is handed to a worker thread, so the body runs on the caller's loop.
    """
    _caller_loop.set(loop)


class FirstParameter:
    """The default target of a function effect: the function's first parameter."""

    def __repr__(self) -> str:
        return "FIRST_PARAMETER"


FIRST_PARAMETER = FirstParameter()


@dataclass(frozen=True, slots=True)
class CallShape:
    """How a function's parameters make an effect's call: its target, its arguments, its key.

    ``receiver``: a method's ``self`` or ``cls`` (never part of the call);
    ``holder``: the parameter holding the target (``None``: the kind takes
    none); ``arguments``: the parameters that are the intent's arguments;
    ``spread``: a ``**extra`` parameter (each of its items an argument);
    ``key``: the parameter handed the idempotency key, if the function has it.
    """

    signature: inspect.Signature
    receiver: str | None
    holder: str | None
    arguments: tuple[str, ...]
    spread: str | None
    key: str | None

    def callable_signature(self) -> inspect.Signature:
        """The signature a caller binds against: the key parameter is tether's, not theirs."""
        return self.signature.replace(
            parameters=[p for p in self.signature.parameters.values() if p.name != self.key]
        )


def call_shape(
    fn: Callable[..., Any],
    target: str | FirstParameter | None = FIRST_PARAMETER,
    key_parameter: str = KEY_PARAMETER,
) -> CallShape:
    """Read ``fn``'s parameters as an effect's call (see :class:`CallShape`); ``SpecError`` if
    they cannot be one."""
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise SpecError(name, f"its signature cannot be read: {exc}") from None
    params = signature.parameters
    for param in params.values():
        if param.kind is param.VAR_POSITIONAL:
            raise SpecError(name, f"*{param.name} has no name to become an argument; name each one")
    first = next(iter(params), None)
    receiver = first if first in RECEIVERS else None
    spread = next((p.name for p in params.values() if p.kind is p.VAR_KEYWORD), None)
    key = key_parameter if key_parameter in params and key_parameter != receiver else None
    names = [n for n in params if n not in {receiver, key, spread}]
    if isinstance(target, FirstParameter):
        if not names:
            raise SpecError("target", f"{name} has no parameter to hold the target")
        holder: str | None = names[0]
    else:
        holder = target
    if holder is not None and holder not in names:
        raise SpecError("target", f"{name} has no parameter {holder!r}")
    arguments = tuple(n for n in names if n != holder)
    return CallShape(signature, receiver, holder, arguments, spread, key)


def awaits(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives an awaitable (a coroutine function, or an async __call__)."""
    if inspect.iscoroutinefunction(fn):
        return True
    # An object whose __call__ is a coroutine function awaits too.
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(
        type(fn).__dict__.get("__call__")
    )


def loop_running_here() -> bool:
    """Whether this thread runs an event loop now (a blocking wait here would stall it)."""
    return _running_loop() is not None


def call_with_key(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    key: str,
    fence: Fence | None = None,
) -> Any:
    """Run ``fn`` with ``key`` (and ``fence``) current: a coroutine on the caller's loop (or a
    fresh one)."""
    token, fenced = _key.set(key), _fence.set(fence)
    try:
        value = fn(*args, **kwargs)
    finally:
        _fence.reset(fenced)
        _key.reset(token)
    if not inspect.isawaitable(value):
        return value
    if not awaits(fn):
        _refuse_hidden(fn, value)
    import asyncio  # a coroutine to run: loaded now, not by `import tether`

    async def keyed() -> Any:
        # The coroutine runs in its task's own context.
        inner, inner_fence = _key.set(key), _fence.set(fence)
        try:
            return await value
        finally:
            _fence.reset(inner_fence)
            _key.reset(inner)

    loop = _caller_loop.get()
    if loop is not None and loop.is_running():
        if loop is _running_loop():  # waiting here would stop the loop the body needs
            _close(value)
            raise AdapterUnavailableError(
                "an async body cannot be awaited from its own loop's thread; nothing was started"
            )
        return asyncio.run_coroutine_threadsafe(keyed(), loop).result()
    runner: Coroutine[Any, Any, Any] = keyed()
    return asyncio.run(runner)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """This thread's running loop, or ``None``; no loop runs where asyncio was never imported."""
    loaded = sys.modules.get("asyncio")
    if loaded is None:
        return None
    try:
        running: asyncio.AbstractEventLoop = loaded.get_running_loop()
    except RuntimeError:
        return None
    return running


def _close(value: object) -> None:
    """Close a coroutine that will never be awaited (it never starts; no warning)."""
    if inspect.iscoroutine(value):
        value.close()


def _refuse_hidden(fn: Callable[..., Any], value: object) -> None:
    """A plain ``def`` that returned an awaitable: refused, and never awaited.

    A coroutine not yet started is closed (its body never runs: nothing
    happened, :class:`HiddenCoroutineError`); any other awaitable (a task, a
    future) may be running already, so what it does is unknown.
    """
    name = getattr(fn, "__qualname__", type(fn).__name__)
    if inspect.iscoroutine(value) and inspect.getcoroutinestate(value) == inspect.CORO_CREATED:
        value.close()
        raise HiddenCoroutineError(name)
    raise AdapterUnavailableError(
        f"{name} is a plain def that returned a {type(value).__name__}, which may be running "
        "already: the outcome is unknown (declare the function `async def` and await inside it)"
    )
