"""FunctionEffect: your own function performs the effect, once, under a key tether minted first.

A user with a Stripe, Slack or GitHub call should not have to write an
adapter class to guard one line of it. :class:`FunctionEffect` is an adapter
made of plain functions: the body that performs the effect, and what it can
prove, declared (never guessed):

=====================  ========================================================
declared               after a crash between the send and its receipt
=====================  ========================================================
``idempotent=True``    the callee deduplicates by the key: the body is called
                       again with the same key
``lookup=fn``          ``fn(key)`` is asked: its answer is the receipt's
                       result; ``None`` is absence, which counts only with
                       ``absent_is_final=True`` (or ``idempotent``): then the
                       body is called again with the same key
nothing (default)      the outcome is unknown: the run goes to review
                       (``needs_review``, ``outcome_unknown``) and the body is
                       never run again
=====================  ========================================================

With leases on, a run whose worker's lease lapsed (a paused process, a
VM stopped) is taken over by another; the paused one may wake inside the
body and send. A look-up finding nothing cannot rule that out, so after a
takeover an absence is not final: the run goes to review, unless
``fencing=True`` declares that the callee refuses a stale fencing token,
which the body reads from :func:`current_fence` and passes on (an
``idempotent`` callee needs no fence: both sends carry the same key).

A look-up answers what the body returned for that key (the ledger compares
the two): ``None`` alone means "nothing under this key"; a body whose
answer is ``None`` (or any falsy value) is found as ``Found(None)`` (see
:class:`Found`). Any other falsy answer (``[]``, ``{}``, ``0``, ``False``,
``""``) is not taken for a receipt nor for an absence: the write stays
unsettled (in flight) and after ``in_flight_limit_s`` goes to review.

The body reads the key, minted and persisted with the intent before it
starts, from :func:`current_key` or from a parameter named
``idempotency_key`` (``key_parameter``), which is not part of the intent,
and passes it on (an ``Idempotency-Key`` header, Stripe's
``idempotency_key``, a client token). What it returns (JSON) is the
receipt's result: a JSON object as it is, any other value as
``{"value": ...}``; one larger than 16 KiB, or not JSON, is kept as a
digest or a type name (the effect happened all the same). Its exceptions:

=========================================  ====================================
the body raises                            the effect is
=========================================  ====================================
one of ``refusals``                        refused: nothing happened
                                           (``rejected``; on a resend under the
                                           same key, unknown: the first attempt
                                           may have landed)
one of ``conflicts``                       a key conflict (the callee holds the
                                           key for another request): review
tether's own ``PreconditionFailedError``,  what the adapter protocol says of it
``IdempotencyConflictError``,
``UnresolvedWriteError``,
``AdapterUnavailableError``
anything else                              an unknown outcome (as above)
=========================================  ====================================

What tether keeps of an exception the body (or look-up) raised, in the
checkpoint, the trace and the error the caller sees, is its type name and
its first line redacted (:func:`~tether.adapters._errors.exception_summary`:
URL credentials and queries, ``token=``-like pairs, bearer tokens and long
opaque strings removed): an exception's text often carries a secret.

``compensate=fn`` undoes a committed effect under its own, freshly minted
key (the compensation protocol: a reviewer orders it): ``fn`` is called with
an :class:`EffectToUndo` and reads its key the same way. The undo is another
call than the write, so it proves nothing the write declared: after a crash
between its send and its receipt, it goes to review and is never run again,
unless ``compensate_idempotent=True`` declares that the callee deduplicates
the undo by its key (a refund under a key it remembers).

An ``async def`` body (or look-up, or compensation) is awaited on the event
loop of the caller that made the call (``await`` on a decorated coroutine
function, :func:`tether.effects.call_async`), while the protocol's store
commits run in a worker thread; from code with no loop of its own it runs
on a fresh one. A synchronous call of an async effect from a running loop's
own thread is refused before anything is persisted (it would block the loop
it needs). A plain ``def`` that returns a coroutine is refused
(:class:`~tether.adapters.HiddenCoroutineError`, the effect ``rejected``):
the coroutine is closed before it starts, so nothing happened; one that
returns a task or future, which may be running, is an unknown outcome.

Its environment is its identity (namespace and ``instance``, version 0): what
a function changes in the world cannot be fingerprinted, so the ledger
remembers it. An equal call (same target, same arguments) after one that
committed is therefore a replay: the recorded receipt, nothing sent, as long
as no other call committed on that target in between. After one did (A, B,
A), what the target is decides, as declared with ``targets``: ``"state"``
(a topic, a record's fields: A is written again), ``"collection"`` (each
call makes its own object: replayed, the default), ``"unknown"`` (a person
decides: review, ``repeat_or_revert``). To have A, B, A judged by the target itself, declare
``holds=fn``: ``fn`` is called with the call's
own target and arguments (no key) and answers whether the target holds now
what the call leaves. ``True``: the earlier effect stands, replayed;
``False``: the target moved since (A, B, A), a new effect under a new key.
It is asked only when an equal effect is on record; if it raises (or answers
anything but a bool) nothing is sent and the call is not settled
(``EffectNotSettledError``, ``adapter_unavailable``): call again.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from tether.adapters._base import Adapter, Fence, RoutesKinds
from tether.adapters._errors import (
    FunctionKeyConflictError,
    FunctionRefusedError,
    HiddenCoroutineError,
    KeyInFlightError,
    NotQueryableError,
    UnresolvedWriteError,
    exception_summary,
)
from tether.adapters._fncall import (
    FIRST_PARAMETER,
    KEY_PARAMETER,
    CallShape,
    FirstParameter,
    awaits,
    call_shape,
    call_with_key,
    loop_running_here,
)
from tether.adapters._remote import RemoteEffect
from tether.core import (
    ActionClass,
    ActionKind,
    AdapterUnavailableError,
    Capabilities,
    Compensation,
    ContractViolationError,
    EnvironmentState,
    IdempotencyConflictError,
    Intent,
    PreconditionFailedError,
    Receipt,
    SpecError,
    TargetKind,
    Targets,
    TetherError,
    canonical_bytes,
    strict_loads,
)
from tether.core._compensation import compensated_effect

#: The largest result a receipt keeps whole (the ledger stores receipts).
MAX_RESULT_BYTES = 16_384
#: A look-up without the intent cannot say which intent its record is.
UNJUDGED = "unjudged:function-lookup"
#: What the body may raise in the adapter protocol's own words.
_PROTOCOL_ERRORS = (
    IdempotencyConflictError,
    PreconditionFailedError,
    UnresolvedWriteError,
    AdapterUnavailableError,
)


@dataclass(frozen=True, slots=True)
class EffectToUndo:
    """What a compensation function is handed: the committed effect it undoes.

    ``idempotency_key`` is the ORIGINAL effect's key (the compensation's own
    key is :func:`current_key`); ``business_object_id`` what the receipt
    named (``object_id``), empty if nothing.
    """

    kind: str
    target: str
    idempotency_key: str
    action_id: str
    receipt_id: str
    business_object_id: str


@dataclass(frozen=True, slots=True)
class Found:
    """A look-up's answer "found under this key, and the body returned ``value``".

    Needed where the body's answer is ``None`` (or another falsy value): a
    bare ``None`` from a look-up means absence, and a bare falsy value is
    refused as ambiguous.
    """

    value: Any = None


def _is_exception_types(value: object) -> bool:
    return isinstance(value, tuple) and all(
        isinstance(t, type) and issubclass(t, Exception) for t in value
    )


class FunctionEffect(RemoteEffect):
    """An adapter whose one write kind is performed by ``fn``'s body (see the module docstring).

    ``kind``: the action kind's name (its arguments are ``fn``'s parameters:
    those without a default required, the others optional), or a whole
    :class:`~tether.core.ActionKind` (needed when ``fn`` takes ``**extra``).
    ``target``: the parameter holding the target (default the first; ``None``:
    the kind takes none). ``idempotent``, ``lookup``, ``absent_is_final``,
    ``retention_s`` (keys are remembered at least this long by the callee;
    ``None``: for ever), ``fencing`` (the callee refuses a stale
    :func:`current_fence`): what it can prove. ``in_flight_limit_s``: a key
    the look-up still reports in flight (``UnresolvedWriteError``, or an
    ambiguous falsy answer) this long after its dispatch goes to review
    (default 900 s; ``None``: wait for ever). ``refusals``, ``conflicts``:
    exception types meaning "nothing happened" and "the key is held for
    another request". ``compensate``: undoes an effect (``fn(EffectToUndo)``).
    ``holds``: ``fn(**call)`` says whether the target holds now what the call
    leaves (a stateful target: A, B, A is three effects). ``targets``: what
    the target is where nothing reads it (:class:`~tether.core.Targets`):
    ``"state"`` (A, B, A writes A again), ``"collection"`` (each call makes
    its own object: the third is replayed; the default), ``"unknown"`` (a
    call equal to one committed before another call on its target goes to a
    person).
    ``object_id``, ``committed_at``: fields of a returned JSON object naming
    the business object and the callee's commit time (RFC 3339), for the
    receipt. Where a kind needs an approval, a receipt without a commit time
    is judged by when it reached the runtime (the body returned, or a look-up
    found it): before the approval expired, it committed inside it. ``namespace`` (default: the kind's name), ``instance`` (default:
    the namespace) and ``version``: the identity bound into receipts and
    checkpoints. Give it to the :class:`~tether.runtime.Runtime` as its
    adapter, alone or in :class:`~tether.adapters.Adapters`.
    """

    #: A function's effects are taken to leave the process (undeclared is external).
    local_effects: ClassVar[bool] = False
    #: A look-up cannot see a request a worker paused inside the body has not
    #: sent yet: once the run was taken over (a lapsed lease), a final absence
    #: proves nothing unless ``fencing=True`` (see the module docstring).
    absence_needs_fence: ClassVar[bool] = True

    def __init__(
        self,
        kind: str | ActionKind,
        fn: Callable[..., Any],
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
        targets: Targets | str | None = None,
        object_id: str | None = None,
        committed_at: str | None = None,
        key_parameter: str = KEY_PARAMETER,
        namespace: str | None = None,
        instance: str | None = None,
        version: str = "1",
    ) -> None:
        if not callable(fn):
            raise SpecError("fn", f"a function effect needs a function, not {fn!r}")
        if getattr(fn, "__tether_effect__", None) is not None:
            raise SpecError(
                "fn", "is decorated with @tether.effect already: give the runtime its .adapter"
            )
        for field_name, given in (("fn", fn), ("lookup", lookup), ("compensate", compensate)):
            if inspect.isgeneratorfunction(given) or inspect.isasyncgenfunction(given):
                # Calling it runs none of its body: the effect would be recorded, never made.
                raise SpecError(
                    field_name,
                    f"{getattr(given, '__qualname__', given)!r} is a generator function; calling "
                    "it runs nothing: give a plain function (or async def) that acts and returns",
                )
        name = kind.name if isinstance(kind, ActionKind) else kind
        if not isinstance(name, str) or not name:
            raise SpecError("kind", "an effect needs its action kind, e.g. 'tickets.create'")
        shape = call_shape(fn, target, key_parameter)
        fn_name = getattr(fn, "__qualname__", name)
        if shape.receiver is not None:
            raise SpecError(
                fn_name,
                f"its first parameter is {shape.receiver!r}: a function effect's body is called "
                "with the call's arguments alone, so decorate a plain function, not a method",
            )
        for param in shape.signature.parameters.values():
            if param.kind is param.POSITIONAL_ONLY:
                raise SpecError(fn_name, f"{param.name} is positional-only; name each parameter")
        for field_name, flag in (
            ("idempotent", idempotent),
            ("absent_is_final", absent_is_final),
            ("fencing", fencing),
            ("compensate_idempotent", compensate_idempotent),
        ):
            if not isinstance(flag, bool):
                raise SpecError(field_name, f"must be True or False, not {flag!r}")
        for field_name, given in (
            ("lookup", lookup),
            ("compensate", compensate),
            ("holds", holds),
        ):
            if given is not None and not callable(given):
                raise SpecError(field_name, f"must be a function, not {given!r}")
        if holds is not None and (awaits(holds) or inspect.isgeneratorfunction(holds)):
            raise SpecError(
                "holds",
                "must be a plain function answering True or False (it is asked inside the "
                "protocol's step, where nothing is awaited): read the target with a sync client",
            )
        try:
            declared_targets = Targets.COLLECTION if targets is None else Targets(targets)
        except ValueError:
            raise SpecError(
                "targets", f"must be one of {[t.value for t in Targets]}, not {targets!r}"
            ) from None
        if holds is not None and targets is not None and declared_targets is not Targets.STATE:
            raise SpecError("targets", "holds reads a target's state: its targets are a state")
        if holds is not None:
            declared_targets = Targets.STATE
        if compensate_idempotent and compensate is None:
            raise SpecError("compensate_idempotent", "says what compensate proves: give compensate")
        if absent_is_final and lookup is None:
            raise SpecError("absent_is_final", "says what a look-up's absence proves: give lookup")
        if retention_s is not None and (
            isinstance(retention_s, bool)
            or not isinstance(retention_s, int | float)
            or not 0 < retention_s <= 10 * 366 * 86400
        ):
            raise SpecError("retention_s", "must be positive seconds, at most ten years, or None")
        if in_flight_limit_s is not None and (
            isinstance(in_flight_limit_s, bool)
            or not isinstance(in_flight_limit_s, int | float)
            or not 0 < in_flight_limit_s <= 30 * 86400
        ):
            raise SpecError(
                "in_flight_limit_s", "must be positive seconds, at most 30 days, or None"
            )
        for field_name, types in (("refusals", refusals), ("conflicts", conflicts)):
            if not _is_exception_types(types):
                raise SpecError(field_name, "must be a tuple of exception classes")
        for field_name, value in (
            ("object_id", object_id),
            ("committed_at", committed_at),
            ("instance", instance),
        ):
            if value is not None and not isinstance(value, str):
                raise SpecError(field_name, f"must be a string, not {value!r}")
        if namespace is not None and (not isinstance(namespace, str) or not namespace):
            raise SpecError("namespace", "must be a non-empty string")
        if not isinstance(version, str) or not version:
            raise SpecError("version", "must be a non-empty string")
        self._fn = fn
        self._shape = shape
        self._declared = self._declare(kind, shape, compensate is not None)
        self._kind = self._declared
        self._lookup = lookup
        self._refusals = refusals
        self._conflicts = conflicts
        self._compensate = compensate
        self._key_name = key_parameter
        # The parameter of ``compensate`` that is handed its key, if it takes one.
        self._undo_key = None if compensate is None else self._undo_parameter(compensate)
        self._holds = holds
        self._object_id = object_id
        self._committed_at = committed_at
        self._namespace = namespace or name
        self._instance = instance if instance is not None else self._namespace
        self._version = version
        self._capabilities = Capabilities(
            idempotent=idempotent,
            queryable=lookup is not None,
            conditional_writes=False,
            fencing=fencing,
            absent_is_final=absent_is_final,
            retention_s=None if retention_s is None else float(retention_s),
            in_flight_limit_s=None if in_flight_limit_s is None else float(in_flight_limit_s),
            stateful=False,
            target_state=holds is not None,
            targets=declared_targets,
        )
        # The undo's own proofs: none unless declared (the write's are not the undo's).
        self._undo_capabilities = Capabilities(
            idempotent=compensate_idempotent,
            queryable=False,
            conditional_writes=False,
            fencing=False,
            absent_is_final=False,
            retention_s=None if retention_s is None else float(retention_s),
            stateful=False,
        )

    def _declare(self, kind: str | ActionKind, shape: CallShape, undoes: bool) -> ActionKind:
        """The action kind: given whole, or read from the function's parameters."""
        params = shape.signature.parameters
        if isinstance(kind, ActionKind):
            if kind.action_class is not ActionClass.WRITE:
                raise SpecError("kind", f"{kind.name!r} must be a write kind: an effect")
            if kind.compensation is Compensation.ADAPTER and not undoes:
                raise SpecError("compensate", f"{kind.name!r} declares adapter compensation")
            accepted = set(shape.arguments)
            if shape.spread is None and not (kind.required | kind.optional) <= accepted:
                extra = sorted((kind.required | kind.optional) - accepted)
                raise SpecError("kind", f"the function takes no {extra}")
            needed = {n for n in shape.arguments if params[n].default is inspect.Parameter.empty}
            if not needed <= kind.required:
                raise SpecError("kind", f"the function needs {sorted(needed - kind.required)}")
            return replace(kind, compensation=Compensation.ADAPTER) if undoes else kind
        if shape.spread is not None:
            raise SpecError(
                kind,
                f"**{shape.spread} cannot be declared as arguments; give the kind as an "
                "ActionKind naming them",
            )
        required = frozenset(
            n for n in shape.arguments if params[n].default is inspect.Parameter.empty
        )
        return ActionKind(
            kind,
            ActionClass.WRITE,
            # A function's target is whatever its parameter names, not a file path.
            TargetKind.NAME if shape.holder is not None else TargetKind.NONE,
            required,
            frozenset(shape.arguments) - required,
            # Undone by its compensate function where there is one; otherwise a person can.
            compensation=Compensation.ADAPTER if undoes else Compensation.HUMAN,
        )

    def _undo_parameter(self, compensate: Callable[..., Any]) -> str | None:
        """The key parameter ``compensate`` takes, if any; it must take one undo besides."""
        shape = call_shape(compensate, None, self._key_name)
        required = [
            p
            for p in shape.signature.parameters.values()
            if p.name != shape.key
            and p.default is inspect.Parameter.empty
            and p.kind not in {p.VAR_KEYWORD, p.KEYWORD_ONLY}
        ]
        if len(required) != 1:
            raise SpecError(
                "compensate",
                "takes exactly one argument, the EffectToUndo (and optionally the key parameter)",
            )
        return shape.key

    # --- identity -----------------------------------------------------

    @property
    def function(self) -> Callable[..., Any]:
        """The function whose body performs the effect."""
        return self._fn

    @property
    def compensation_capabilities(self) -> Capabilities:
        """What ``compensate`` proves after a crash: only ``compensate_idempotent``, if declared."""
        return self._undo_capabilities

    @property
    def committed_at(self) -> str | None:
        """The returned object's field holding the effect's commit time, if declared.

        A kind under approval needs it: a receipt without a commit time cannot
        be checked against the approval's expiry, and goes to review.
        """
        return self._committed_at

    @property
    def instance_id(self) -> str:
        """The declared instance (default: the namespace)."""
        return self._instance

    @property
    def version(self) -> str:
        """The declared code version; bound into receipts."""
        return self._version

    # --- writing ------------------------------------------------------

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments with the function's defaults applied, checked against it.

        Refuses (before any key is minted) arguments the function cannot take,
        the key parameter among them, and a synchronous call of an async body
        from a running event loop's own thread.
        """
        self._check_kind(kind)
        if not isinstance(args, dict):
            raise ContractViolationError("bad_args", f"{kind} takes a JSON object of arguments")
        shape = self._shape
        if self._key_name in args:
            raise ContractViolationError(
                "bad_args", f"{self._key_name!r} is the key tether mints; it is not an argument"
            )
        params = shape.signature.parameters
        normal = dict(args)
        for name in shape.arguments:
            default = params[name].default
            if name not in normal and default is not inspect.Parameter.empty:
                normal[name] = copy.deepcopy(default)
        unknown = sorted(set(normal) - set(shape.arguments)) if shape.spread is None else []
        missing = sorted(n for n in shape.arguments if n not in normal)
        if unknown or missing:
            what = f"takes no {unknown}" if unknown else f"needs {missing}"
            raise ContractViolationError("bad_args", f"{kind} {what}")
        try:
            canonical_bytes(normal)
        except TetherError as exc:
            raise ContractViolationError(
                "bad_args", f"{kind}'s arguments are not JSON: {exc}"
            ) from None
        if awaits(self._fn) and loop_running_here():
            raise ContractViolationError(
                "blocking_call",
                f"{kind} is an async function called synchronously from a running event "
                "loop's thread; await it (or tether.effects.call_async)",
            )
        return normal

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        """Run the body once under ``key``; its return value is the receipt's result."""
        self._check_send(key, intent, prestate)
        if compensated_effect(intent) is not None:
            raise ContractViolationError(
                "bad_args", "a compensation intent is carried out by compensate(), not execute()"
            )
        # A copy of its own: a body that changes its arguments must not change the intent.
        kwargs = copy.deepcopy(dict(intent.args))
        if self._shape.holder is not None:
            kwargs[self._shape.holder] = intent.target
        if self._shape.key is not None:
            kwargs[self._shape.key] = key
        value = self._perform(self._fn, (), kwargs, key, intent, fence)
        return self._receipt(key, intent.digest, value)

    def compensate(self, key: str, intent: Intent, fence: Fence | None = None) -> Receipt:
        """Undo the committed effect ``intent`` names: ``compensate(EffectToUndo)`` under ``key``."""
        undo = self._compensate
        named = compensated_effect(intent)
        if undo is None or named is None:
            raise ContractViolationError(
                "no_compensation",
                f"{self._namespace} "
                + (
                    "declares no compensate function"
                    if undo is None
                    else "compensates only compensation intents"
                ),
            )
        self._check_send(key, intent, self.environment())
        effect = EffectToUndo(
            kind=intent.kind,
            target=intent.target,
            idempotency_key=str(named.get("idempotency_key", "")),
            action_id=str(named.get("action_id", "")),
            receipt_id=str(named.get("receipt_id", "")),
            business_object_id=str(named.get("business_object_id", "")),
        )
        kwargs = {} if self._undo_key is None else {self._undo_key: key}
        value = self._perform(undo, (effect,), kwargs, key, intent, fence)
        return self._receipt(key, intent.digest, value)

    def _perform(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str,
        intent: Intent,
        fence: Fence | None = None,
    ) -> Any:
        """Call one of the user's functions that acts; its exceptions in the protocol's words."""
        if awaits(fn) and loop_running_here():
            # Nothing was sent: awaiting here would block the loop the body needs.
            raise FunctionRefusedError(
                intent.kind, intent.target, RuntimeError("an async body called from its own loop")
            )
        try:
            return call_with_key(fn, args, kwargs, key, fence)
        except _PROTOCOL_ERRORS:
            raise
        except self._conflicts as exc:
            raise FunctionKeyConflictError(key, intent.digest, exc) from exc
        except self._refusals as exc:
            raise FunctionRefusedError(intent.kind, intent.target, exc) from exc
        except Exception as exc:  # the user's code: whatever it raised, it may have acted
            raise AdapterUnavailableError(
                f"{intent.kind} under key {key} raised {exception_summary(exc)}; "
                "the outcome is unknown (it may have acted)"
            ) from exc

    def where_to_look(self, key: str, intent: Intent) -> dict[str, str]:
        """Where a person finds what the body did under ``key``: the function and the key it got."""
        fn = self._fn
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        return {
            "function": name,
            "key": key,
            "how": "the body was handed this key (tether.current_key()): look in the system "
            "it called for a request under it (an Idempotency-Key, a client token); found, "
            "sign landed with its id; not there, sign not_landed (the body runs once more "
            "with the same key). Where the card warns that a look-up by key proves nothing "
            "(the service forgot it), look for what the body made by its content instead",
        }

    def target_holds(self, intent: Intent) -> bool | None:
        """Whether ``intent``'s target holds now what the call leaves: ``holds(**call)``.

        ``None`` where no ``holds`` is declared (the replay rule does not ask);
        :class:`~tether.core.AdapterUnavailableError` where it failed or did
        not answer ``True`` or ``False`` (the rule waits: nothing is sent).
        """
        holds = self._holds
        if holds is None:
            return None
        kwargs = copy.deepcopy(dict(intent.args))
        if self._shape.holder is not None:
            kwargs[self._shape.holder] = intent.target
        try:
            answer = holds(**kwargs)
        except Exception as exc:  # the user's code: a reader that failed tells nothing
            raise AdapterUnavailableError(
                f"{intent.kind}: holds() raised {exception_summary(exc)}"
            ) from exc
        if not isinstance(answer, bool):
            raise AdapterUnavailableError(
                f"{intent.kind}: holds() answered {type(answer).__name__}, not True or False"
            )
        return answer

    # --- asking by key ------------------------------------------------

    def lookup(self, key: str) -> Receipt | None:
        """What the look-up function finds under ``key`` (its intent not judged), or ``None``."""
        return self._look_up(key, None)

    def lookup_intent(self, key: str, intent: Intent) -> Receipt | None:
        """What the look-up function finds under ``key``, as ``intent``'s receipt (tether mints
        one key per intent, so a record under it is that intent's)."""
        return self._look_up(key, intent)

    def _look_up(self, key: str, intent: Intent | None) -> Receipt | None:
        finder = self._lookup
        if finder is None:
            raise NotQueryableError(f"{self._namespace} declares no look-up by key")
        if not key:
            raise ContractViolationError("bad_key", "the idempotency key must not be empty")
        if intent is not None and compensated_effect(intent) is not None:
            # The look-up answers for the write's keys, not for its undo's.
            raise NotQueryableError(f"{self._namespace} declares no look-up of its compensations")
        if awaits(finder) and loop_running_here():
            raise AdapterUnavailableError(
                f"{self._namespace}: an async look-up cannot be awaited from its own loop's thread"
            )
        try:
            value = call_with_key(finder, (key,), {}, key)
        except HiddenCoroutineError as exc:
            # Nothing was asked: a look-up that never ran proves nothing, least of all a refusal.
            raise AdapterUnavailableError(f"the look-up of key {key}: {exc}") from exc
        except (UnresolvedWriteError, AdapterUnavailableError, PreconditionFailedError):
            raise
        except self._refusals as exc:
            # The callee recorded that it refused this request: nothing landed.
            raise FunctionRefusedError(self._declared.name, "", exc) from exc
        except Exception as exc:  # the user's code: a look-up that failed proves nothing
            raise AdapterUnavailableError(
                f"the look-up of key {key} raised {exception_summary(exc)}"
            ) from exc
        if value is None:
            return None
        if isinstance(value, Found):
            value = value.value
        elif not value:
            # [] or 0 or False is neither a record nor a clear "nothing": never a receipt
            # for a write that may not have been sent, never an absence either.
            raise KeyInFlightError(
                key,
                f"the look-up answered {type(value).__name__} {str(value)[:40]!r}: only None "
                "means absent; a found record is a value, or Found(value) for a falsy one",
            )
        return self._receipt(key, UNJUDGED if intent is None else intent.digest, value)

    # --- receipts -----------------------------------------------------

    def _receipt(self, key: str, intent_digest: str, value: Any) -> Receipt:
        """The same fields whether built from the body's return or from a look-up."""
        result = _kept(value, self._declared.name)
        return Receipt(
            namespace=self._namespace,
            adapter_version=self._version,
            receipt_id=f"{self.instance_id}/{key}",
            idempotency_key=key,
            intent_digest=intent_digest,
            result=result,
            business_object_id=_field(value, self._object_id),
            committed_at=_field(value, self._committed_at),
            post_state=self.environment(),
        )


def owner_of(adapter: Adapter, kind: str) -> Adapter | None:
    """The adapter that performs ``kind`` in ``adapter`` (a member of a composite), or ``None``."""
    if isinstance(adapter, RoutesKinds):
        try:
            return adapter.owner(kind)
        except TetherError:
            return None
    return adapter if any(k.name == kind for k in adapter.kinds) else None


def _kept(value: Any, kind: str) -> dict[str, Any]:
    """What a receipt keeps of a returned value: a JSON object as it is, else wrapped.

    The effect happened whatever the value is: one that cannot be encoded (not
    JSON, an integer past 2**53, a cycle, too deep, an object whose methods
    raise) is kept as its type name, with a warning saying why; it never
    turns a performed effect into an error.
    """
    try:
        encoded = canonical_bytes(value)
        kept = strict_loads(encoded)  # a pure JSON copy: lists for tuples, nothing shared
    except Exception as exc:  # the user's value: whatever its encoding raised, it returned
        why = "not a safe integer" if "safe integer" in str(exc) else "not JSON"
        name = type(value).__name__
        warnings.warn(
            f"{kind} returned a {name}, {why} ({str(exc)[:120]}): the receipt records only "
            "that it returned (return a JSON value, integers within 2**53, to keep it)",
            stacklevel=2,
        )
        return {"not_json": name, "why": why}
    if len(encoded) > MAX_RESULT_BYTES:
        return {"value_sha256": "sha256:" + hashlib.sha256(encoded).hexdigest()}
    if isinstance(kept, dict):
        return kept
    return {"value": kept}


def _field(value: Any, name: str | None) -> str:
    if name is None or not isinstance(value, dict):
        return ""
    try:
        found = value.get(name)
        return "" if found is None else str(found)
    except Exception:  # the user's object: a field that cannot be read names nothing
        return ""
