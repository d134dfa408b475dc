"""``@tether.effect``: a function's calls become effects of the current run.

The function's parameters are the call: ``target`` names the one that holds
the target (default: the first; ``None``: the kind takes none), the others,
defaults applied, are the arguments (``**extra`` spread among them; a
method's ``self`` or ``cls`` left out; a parameter named ``idempotency_key``
is tether's, never the caller's).

Who performs the effect is the runtime's choice, made once, where it is
built: the adapter that owns the kind. Two forms follow:

- **Your function performs it.** The decorated function is an adapter of its
  own, ``fn.adapter`` (a :class:`~tether.adapters.FunctionEffect`); give it
  to the :class:`~tether.runtime.Runtime` (alone or in
  :class:`~tether.adapters.Adapters`) and the body runs once per intent,
  under a key minted and persisted before it starts (``tether.current_key()``
  or the ``idempotency_key`` parameter). What it can prove is declared here
  (``idempotent``, ``lookup``, ``absent_is_final``, ``retention_s``), with the
  exceptions that mean "nothing happened" (``refusals``) or "the key is held
  for another request" (``conflicts``), an optional ``compensate``, and
  ``holds`` for a stateful target (an equal call after the target moved is a
  new effect: A, B, A), or ``targets`` saying what the target is where
  nothing reads it (``"state"``, ``"collection"``); see
  :mod:`tether.adapters._function`.
- **An adapter performs it** (``HttpEffect``, ``SmtpEffect``, the workspace):
  the body is never run, and the signature only names the call (a tool's
  schema, for the model that calls it).

A function that declares what its body proves, called in a runtime whose
adapter for the kind is not its own, is refused before anything is
persisted (its body would never run, its proofs silently unused); so is a
function whose kind another function's body performs there.

A coroutine function gets an async wrapper: the protocol's commits run in a
worker thread, off the caller's loop, and an ``async def`` body is awaited
on that loop.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Protocol, cast

from tether.adapters import FunctionEffect
from tether.adapters._fncall import (
    FIRST_PARAMETER,
    KEY_PARAMETER,
    CallShape,
    FirstParameter,
    call_shape,
    refuse_inside_a_body,
)
from tether.adapters._function import owner_of
from tether.core import SpecError
from tether.runtime._effects import CallResult, GuardedRun, current

__all__ = ["FIRST_PARAMETER", "EffectFunction", "effect"]


class EffectFunction(Protocol):
    """A function decorated with ``@tether.effect``: each call is an effect of the current run.

    ``adapter`` is its :class:`~tether.adapters.FunctionEffect` (plain
    functions only: a method or a ``**extra`` function has none), for the
    runtime that lets its body perform the effect.
    """

    adapter: FunctionEffect

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Carry out the effect this call describes (a :class:`CallResult`, or awaitable one)."""
        ...


def effect(
    kind: str,
    *,
    target: str | FirstParameter | None = FIRST_PARAMETER,
    idempotent: bool = False,
    lookup: Callable[[str], Any] | None = None,
    absent_is_final: bool = False,
    fencing: bool = False,
    retention_s: float | None = None,
    in_flight_limit_s: float | None = 900.0,
    refusals: tuple[type[Exception], ...] = (),
    conflicts: tuple[type[Exception], ...] = (),
    compensate: Callable[..., Any] | None = None,
    compensate_idempotent: bool = False,
    holds: Callable[..., bool] | None = None,
    targets: str | None = None,
    object_id: str | None = None,
    committed_at: str | None = None,
    key_parameter: str = KEY_PARAMETER,
    namespace: str | None = None,
    instance: str | None = None,
) -> Callable[[Callable[..., Any]], EffectFunction]:
    """Route a function's calls through the current run as effects of ``kind``.

    See the module docstring: the adapter that owns ``kind`` in the runtime
    performs the effect; ``fn.adapter`` makes the function's own body that
    adapter. Every other keyword is :class:`~tether.adapters.FunctionEffect`'s,
    declaring what the body can prove (nothing, by default: an unknown
    outcome goes to review and the body is never run again).
    """
    if not isinstance(kind, str) or not kind:
        raise SpecError("kind", "an effect needs its action kind, e.g. 'email.send'")
    # A body that declares what it proves means to perform the effect itself.
    declared = (
        idempotent is True
        or lookup is not None
        or bool(refusals)
        or bool(conflicts)
        or compensate is not None
        or holds is not None
        or targets is not None
    )

    def wrap(fn: Callable[..., Any]) -> EffectFunction:
        shape = call_shape(fn, target, key_parameter)
        own: FunctionEffect | None = None
        try:
            own = FunctionEffect(
                kind,
                fn,
                target=target,
                idempotent=idempotent,
                lookup=lookup,
                absent_is_final=absent_is_final,
                fencing=fencing,
                retention_s=retention_s,
                in_flight_limit_s=in_flight_limit_s,
                refusals=refusals,
                conflicts=conflicts,
                compensate=compensate,
                compensate_idempotent=compensate_idempotent,
                holds=holds,
                targets=targets,
                object_id=object_id,
                committed_at=committed_at,
                key_parameter=key_parameter,
                namespace=namespace,
                instance=instance,
            )
        except SpecError:
            if declared or (shape.receiver is None and shape.spread is None):
                raise
            # A method or a **extra function: only an adapter can perform its kind.
        split = _splitter(fn, shape)

        def routed(
            args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[GuardedRun, str, dict[str, Any]]:
            refuse_inside_a_body(kind)  # before anything else: the run is held by that body
            where, values = split(args, kwargs)
            run = current()
            _check_performer(run, kind, fn, declared)
            return run, where, values

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def guarded_async(*args: Any, **kwargs: Any) -> CallResult:
                run, where, values = routed(args, kwargs)
                return await run.call_async(kind, where, values)

            wrapper: Callable[..., Any] = guarded_async
        else:

            @functools.wraps(fn)
            def guarded(*args: Any, **kwargs: Any) -> CallResult:
                run, where, values = routed(args, kwargs)
                return run.call(kind, where, values)

            wrapper = guarded
        marked: Any = wrapper
        marked.__tether_effect__ = kind
        if shape.key is not None:
            # What a caller (or a framework reading the tool's schema) sees: no key.
            marked.__signature__ = shape.callable_signature()
            marked.__annotations__ = {
                k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != shape.key
            }
        if own is not None:
            marked.adapter = own
        return cast(EffectFunction, wrapper)

    return wrap


def _splitter(
    fn: Callable[..., Any], shape: CallShape
) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, dict[str, Any]]]:
    """How a call of ``fn`` becomes the effect's target and arguments."""
    signature = shape.callable_signature()
    name = getattr(fn, "__name__", "effect")

    def split(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise SpecError(name, str(exc)) from None
        bound.apply_defaults()
        values: dict[str, Any] = {}
        for param, value in bound.arguments.items():
            if param == shape.receiver:
                continue  # a method's receiver is not part of the call
            if param == shape.spread:
                values.update(value)  # **extra: each one an argument of its own
            else:
                values[param] = value
        where = "" if shape.holder is None else values.pop(shape.holder)
        if not isinstance(where, str):
            raise SpecError(str(shape.holder), f"the target must be a string, not {where!r}")
        return where, values

    return split


def _check_performer(run: GuardedRun, kind: str, fn: Callable[..., Any], declared: bool) -> None:
    """Refuse a call whose body would not be the one that performs it (nothing persisted)."""
    owner = owner_of(run.session.rt.adapter, kind)
    name = getattr(fn, "__qualname__", kind)
    if isinstance(owner, FunctionEffect):
        if owner.function is not fn:
            other = getattr(owner.function, "__qualname__", "another function")
            raise SpecError(
                kind,
                f"this runtime performs {kind!r} with {other}'s body, not {name}'s; give each "
                "function effect its own kind",
            )
        return
    if declared:
        where = "no adapter" if owner is None else f"the adapter {owner.namespace!r}"
        raise SpecError(
            kind,
            f"{name} declares what its body proves, but in this runtime {where} performs "
            f"{kind!r}, so its body would never run: give `{name}.adapter` to the Runtime "
            "(alone or in Adapters(...))",
        )
