"""The upstream's tools as one tether adapter: each effect a function effect, reads answered.

Forwarding an effect tool's call is a :class:`~tether.adapters.FunctionEffect`
built at run time whose kind is the tool's name: its body sends
``tools/call`` to the upstream once per intent, under the key minted and
persisted before it starts, and what the upstream answers (the whole
``CallToolResult``) is the receipt's result. A tool whose listing declares
that it accepts an idempotency key gets the key in the call's ``_meta``
(:data:`IDEMPOTENCY_KEY_META`) and is idempotent: after a crash between the
send and its receipt it is asked again under the same key. Any other tool
proves nothing, so that crash leaves an unknown outcome for a person.

How a server declares it accepts a key, in its tool listing (SEP-3182
proposes an optional key in a request's ``_meta``; it is not in the
published schema, so the declaration is tether's convention)::

    {"name": "charge", ..., "_meta": {"idempotencyKey": {"accepted": true,
                                                         "retentionSeconds": 86400}}}

``retentionSeconds`` (optional) is how long the server remembers a key: an
unsettled call older than that goes to review instead of being sent again.
The call then carries ``"_meta": {"idempotencyKey": "<key>"}``.

All of them share one identity (namespace ``mcp``, the upstream's
instance), so the run's environment is the upstream, whatever its tools.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any

import anyio
import mcp_types as types

from tether.adapters import Fence, FunctionEffect, NotQueryableError, VerifierResult
from tether.core import (
    ActionClass,
    ActionKind,
    AdapterUnavailableError,
    Capabilities,
    Compensation,
    ContractViolationError,
    EnvironmentState,
    Intent,
    JSONValue,
    Receipt,
    TargetKind,
    VerifierRefusedError,
    digest,
    format_time,
)
from tether.integrations.mcp._answers import (
    KEPT_APART,
    Keep,
    fits,
    has_big_integer,
    kept_apart,
    sent,
)
from tether.integrations.mcp._policy import GatewayPolicy, kind_of, tool_of
from tether.integrations.mcp._upstream import (
    UpstreamDownError,
    UpstreamError,
    UpstreamRefusedError,
    log,
)
from tether.integrations.mcp._wire import answer_document

#: The one argument of every tool's kind: the tool call's arguments object, whole.
ARGUMENTS = "arguments"
#: Where a call carries tether's key, and where a tool listing declares it accepts one.
IDEMPOTENCY_KEY_META = "idempotencyKey"
#: The namespace of every receipt the gateway records.
NAMESPACE = "mcp"
#: Where a recorded answer keeps the moment the gateway received it (the receipt's commit
#: time: the upstream committed before it answered, so this bounds it from above).
RECEIVED_AT = "tether_received_at"

Caller = Callable[..., Coroutine[Any, Any, dict[str, Any]]]
"""``call(tool, arguments, meta, effect=...)``: the upstream's answer as JSON (see
``Upstream.answer``)."""


Answered = Callable[[str, dict[str, Any], str, dict[str, Any]], None]
"""``answered(tool, arguments, key, answer)``: the upstream answered a forwarded call (on the
loop, the protocol waiting for the body's return)."""


class ToolRefusedError(Exception):
    """Nothing happened: the upstream refused the call, or was never reached."""


def result_document(result: types.CallToolResult) -> dict[str, Any]:
    """A tool's answer as JSON, without what the connection stamped on it."""
    return answer_document(result.model_dump(by_alias=True, mode="json", exclude_none=True))


def text_of(doc: Mapping[str, Any], limit: int = 2000) -> str:
    """The text blocks of a tool's answer, joined (for an error message)."""
    parts = [
        str(block.get("text", ""))
        for block in doc.get("content", [])
        if isinstance(block, dict) and block.get("type") == "text"
    ]
    return " ".join(parts)[:limit] or "(no text)"


def key_declaration(tool: types.Tool) -> tuple[bool, float | None]:
    """Whether ``tool``'s listing declares it accepts a key, and for how many seconds."""
    meta = tool.meta or {}
    declared = meta.get(IDEMPOTENCY_KEY_META)
    if not isinstance(declared, dict) or declared.get("accepted") is not True:
        return False, None
    retention = declared.get("retentionSeconds")
    if isinstance(retention, bool) or not isinstance(retention, int | float) or retention <= 0:
        return True, None
    return True, float(retention)


def tool_kind(name: str, action_class: ActionClass) -> ActionKind:
    """The action kind of tool ``name`` (:func:`kind_of` names it): no target, its arguments
    object as one argument."""
    return ActionKind(
        kind_of(name),
        action_class,
        TargetKind.NONE,
        frozenset({ARGUMENTS}),
        compensation=Compensation.HUMAN if action_class is ActionClass.WRITE else Compensation.NONE,
    )


def forwarding_effect(
    tool: types.Tool,
    gateway: GatewayPolicy,
    call: Caller,
    instance: str,
    live: dict[str, dict[str, Any]],
    keep: Keep | None = None,
    *,
    answered: Answered | None = None,
) -> FunctionEffect:
    """The function effect that forwards ``tool``'s calls to the upstream (module docstring).

    ``live`` receives each answer under its key as it arrives, whole: the
    agent gets all of it; ``answered(tool, arguments, key, answer)`` is told
    of it at once, before the receipt is made of it. An answer the receipt cannot keep whole is kept
    apart with ``keep`` before the body returns, so before its receipt is
    committed (see :mod:`._answers`); a sensitive tool's never is.
    """
    rule = gateway.rule(tool.name)
    declared, retention = key_declaration(tool)
    accepts_key = declared if rule.accepts_key is None else rule.accepts_key
    name = tool.name

    async def forward(arguments: dict[str, Any] | str, idempotency_key: str) -> dict[str, Any]:
        meta = {IDEMPOTENCY_KEY_META: idempotency_key} if accepts_key else None
        try:
            exact = sent(arguments)
        except ContractViolationError as exc:  # nothing was sent
            raise ToolRefusedError(str(exc)) from exc
        try:
            doc = await call(name, exact, meta, effect=True)
        except (UpstreamRefusedError, UpstreamDownError) as exc:
            raise ToolRefusedError(str(exc)) from exc
        if doc.get("isError") is True and rule.errors_are_refusals:
            raise ToolRefusedError(f"{name} answered with an error: {text_of(doc)}")
        live[idempotency_key] = doc
        if answered is not None:
            try:
                answered(name, exact, idempotency_key, doc)
            except Exception as exc:  # the effect happened: its receipt is recorded regardless
                log(f"{name}: its answer could not be passed on early ({exc})")
        # An approval is checked against the commit time: the answer's arrival bounds it.
        received = {RECEIVED_AT: format_time(datetime.now(UTC))}
        record = doc | received
        if rule.sensitive or fits(record):
            return record
        apart, body = kept_apart(doc)
        if keep is not None:
            try:
                await anyio.to_thread.run_sync(keep, apart[KEPT_APART]["sha256"], body)
            except Exception as exc:  # the effect happened: record it, kept apart or not
                log(f"{name}: its answer could not be kept apart ({exc}); a replay will say so")
        return apart | received

    forward.__qualname__ = forward.__name__ = f"forward_{name}"
    return FunctionEffect(
        tool_kind(name, ActionClass.WRITE),
        forward,
        target=None,
        idempotent=accepts_key,
        retention_s=retention if accepts_key else None,
        refusals=(ToolRefusedError,),
        committed_at=RECEIVED_AT,
        targets=rule.targets,
        namespace=NAMESPACE,
        instance=instance,
    )


class UpstreamTools:
    """One adapter for all of the upstream's tools: the run's environment is the upstream.

    ``target`` is the upstream's target as :attr:`Upstream.target_identity` says it.

    ``effects`` maps each effect tool's kind to its forwarding function
    effect; ``reads`` names the read tools, answered by ``read`` (a blocking
    call of the upstream from the protocol's worker thread, by the tool's
    name) and traced like any read. Every kind routes to its owner
    (``owner``), whose capabilities the runtime judges the kind by. Kinds
    are the tools' names but where :func:`~._policy.kind_of` says otherwise.
    """

    #: The upstream is outside the process: never allowed under ``local-only``.
    local_effects = False

    def __init__(
        self,
        instance: str,
        effects: Mapping[str, FunctionEffect],
        reads: frozenset[str],
        read: Callable[[str, dict[str, Any]], dict[str, Any]],
        *,
        target: str = "",
        fingerprint: str | None = None,
    ) -> None:
        if not instance:
            raise ContractViolationError("bad_instance", "the upstream needs an instance name")
        self._instance = instance
        self._fingerprint = fingerprint or digest({"instance": instance, "target": target})
        self._effects = dict(effects)
        self._reads = {kind_of(name): tool_kind(name, ActionClass.READ) for name in sorted(reads)}
        self._read = read
        self._kinds = tuple(self._reads.values()) + tuple(e.kind for e in self._effects.values())

    # --- identity -----------------------------------------------------

    @property
    def namespace(self) -> str:
        """``mcp``: every tool's receipts carry it."""
        return NAMESPACE

    @property
    def version(self) -> str:
        """The gateway's forwarding protocol version; bound into receipts."""
        return "1"

    @property
    def instance_id(self) -> str:
        """The upstream's identity (``--instance``, else the name it gives itself)."""
        return self._instance

    @property
    def capabilities(self) -> Capabilities:
        """What holds of every tool (per-tool promises: each effect's own, via ``owner``)."""
        return Capabilities(
            idempotent=False, queryable=False, conditional_writes=False, stateful=False
        )

    def environment(self) -> EnvironmentState:
        """The upstream's identity; version 0 (what it holds is not fingerprinted).

        Its fingerprint binds the instance and the upstream's target (the
        command line and directory it is started with, or its URL), so the
        run's task names one upstream: another one behind the same run is
        another task, refused. ``fingerprint`` (given) is the identity a
        run recorded, kept for a server that moved (``--upstream-moved``).
        """
        return EnvironmentState(NAMESPACE, self._instance, 0, self._fingerprint)

    @property
    def kinds(self) -> tuple[ActionKind, ...]:
        """One kind per upstream tool: a read or a write, as the policy says."""
        return self._kinds

    def owner(self, kind: str) -> Any:
        """The adapter that carries out ``kind``: an effect's function effect, else this one."""
        found = self._effects.get(kind)
        if found is not None:
            return found
        if kind in self._reads:
            return self
        raise ContractViolationError("unknown_kind", f"the upstream offers no tool {kind!r}")

    def effect_of(self, kind: str) -> FunctionEffect | None:
        """The function effect forwarding tool ``kind``, or ``None`` for a read."""
        return self._effects.get(kind)

    # --- acting -------------------------------------------------------

    def read(
        self, kind: str, target: str, args: dict[str, Any], scope: Callable[[str], bool]
    ) -> dict[str, JSONValue]:
        """Ask the upstream's read tool ``kind``; its answer, whole, is the read's result."""
        if kind not in self._reads:
            raise ContractViolationError("unknown_kind", f"{kind!r} is not a read of this gateway")
        arguments = sent(args.get(ARGUMENTS, {}))
        try:
            return self._read(tool_of(kind), arguments)
        except UpstreamRefusedError as exc:
            raise ContractViolationError("refused", str(exc)) from exc
        except UpstreamError as exc:
            raise AdapterUnavailableError(str(exc)) from exc

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """Normalized by the tool's function effect (a read's arguments stay as they are)."""
        effect = self._effects.get(kind)
        if effect is None:
            self.owner(kind)  # refuses an unknown kind
            return dict(args)
        return effect.normalize(kind, target, args)

    def derive_post_state(self, prestate: EnvironmentState, intent: Intent) -> EnvironmentState:
        """The same identity: what a tool changes upstream is not fingerprinted here."""
        return prestate

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        """Forward ``intent`` once under ``key`` with its tool's function effect."""
        return self._effect(intent.kind).execute(key, intent, prestate, fence)

    def lookup(self, key: str) -> Receipt | None:
        """No tool can be asked by key: MCP has no such request."""
        raise NotQueryableError("an MCP upstream cannot be asked what it did under a key")

    def verify(self, argv: tuple[str, ...], timeout_s: int) -> VerifierResult:
        """The upstream runs no commands for tether."""
        raise VerifierRefusedError("an MCP gateway's run has no verifier")

    def _effect(self, kind: str) -> FunctionEffect:
        effect = self._effects.get(kind)
        if effect is None:
            raise ContractViolationError("unknown_kind", f"{kind!r} is not an effect tool")
        return effect


def blocking_reader(
    call: Caller,
    loop: Callable[[], asyncio.AbstractEventLoop],
    timeout_s: float,
    live: dict[str, dict[str, Any]],
) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """A read for the protocol's worker thread: the upstream asked on the gateway's loop.

    ``loop()`` is the loop the upstream's connection lives on. An answer
    holding an integer canonical JSON cannot write is traced as its digest
    and handed to the agent from ``live`` (by that digest), exact.
    """

    def read(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        future = asyncio.run_coroutine_threadsafe(call(name, arguments, None), loop())
        try:
            doc = future.result(timeout_s + 5)
        except TimeoutError as exc:
            future.cancel()
            raise UpstreamDownError(f"{name}: no answer in {timeout_s:g} s") from exc
        if not has_big_integer(doc):
            return doc
        record, _ = kept_apart(doc)
        live[record[KEPT_APART]["sha256"]] = doc
        return record

    return read
