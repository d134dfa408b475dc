"""TetherToolset: a PydanticAI toolset whose mutating tools are effects of a tether run.

PydanticAI runs a tool whenever the model asks for one, and a run that is
resumed after a crash (by hand, or by its Temporal/DBOS/Prefect durable
execution, all at-least-once for tools) asks again. Wrapping the toolset
routes the named tools through :func:`tether.effects.call` instead of their
bodies: the adapter that owns the kind performs the effect once, and the
same effect asked for again in the same tether run returns the recorded
receipt without sending anything. Tools not named pass through untouched
(the read-only ones).

How each of tether's refusals reaches the agent:

* :class:`~tether.core.ApprovalRequiredError` becomes PydanticAI's own
  "needs a person": :class:`pydantic_ai.exceptions.ApprovalRequired`, so the
  run ends with :class:`pydantic_ai.tools.DeferredToolRequests` (the agent's
  ``output_type`` must include it) whose ``metadata[tool_call_id]["tether"]``
  carries the run, the action and the fields a person signs. The next
  ``agent.run(..., deferred_tool_results=...)`` approves the call and puts the
  signed document in ``DeferredToolResults.metadata[tool_call_id]`` under
  :data:`APPROVAL_METADATA_KEY` (or it was delivered with ``run.approve``).
  A bare ``True`` is not a signed approval: if tether still waits, the typed
  :class:`~tether.core.ApprovalRequiredError` is raised.
* :class:`~tether.core.NeedsReviewError` and every other tether error are
  raised typed and end the agent run. Never a :class:`~pydantic_ai.ModelRetry`:
  a retried tool call could ask for the effect again, and an unknown outcome
  must go to a person, not back to the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.tools import AgentDepsT, RunContext
from pydantic_ai.toolsets import (
    AbstractToolset,
    CombinedToolset,
    FunctionToolset,
    PrefixedToolset,
    RenamedToolset,
    ToolsetTool,
    WrapperToolset,
)
from pydantic_core import PydanticSerializationError, to_jsonable_python

from tether import effects
from tether.core import ApprovalRequiredError, EvidenceBindingError, SpecError

APPROVAL_METADATA_KEY = "tether_approval"
"""Where a person's signed approval travels in ``DeferredToolResults.metadata[tool_call_id]``."""

CallMapper = Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Guard:
    """How one tool's call becomes a tether effect.

    ``kind`` is the action kind the owning adapter performs (``email.send``).
    ``target`` names the tool parameter holding the target (``None``: the
    kind takes none); the other parameters are the arguments. When the
    tool's parameters are not the adapter's arguments, ``call`` maps the
    validated tool arguments to ``(target, args)`` instead, e.g.
    ``lambda a: ("tickets", {"json": a})`` for ``http.post``.
    """

    kind: str
    target: str | None = None
    call: CallMapper | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise SpecError("kind", "a guarded tool needs its action kind, e.g. 'email.send'")
        if self.target is not None and self.call is not None:
            raise SpecError("target", "give the target parameter or a call mapper, not both")

    def split(self, tool: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The effect's target and arguments for one call of ``tool``."""
        if self.call is not None:
            target, mapped = self.call(dict(args))
            if not isinstance(target, str) or not isinstance(mapped, dict):
                raise SpecError(tool, "the call mapper must return (target: str, args: dict)")
            return target, mapped
        values = dict(args)
        if self.target is None:
            return "", values
        if self.target not in values:
            raise SpecError(tool, f"the call has no parameter {self.target!r} to hold the target")
        where = values.pop(self.target)
        if not isinstance(where, str):
            raise SpecError(self.target, f"the target must be a string, not {where!r}")
        return where, values


GuardSpec = Guard | tuple[str, str | None]


def as_guard(spec: GuardSpec) -> Guard:
    """A :class:`Guard` from itself or from the ``(kind, target parameter)`` shorthand."""
    if isinstance(spec, Guard):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return Guard(spec[0], spec[1])
    raise SpecError("kinds", f"expected a Guard or (kind, target parameter), not {spec!r}")


@dataclass
class TetherToolset(WrapperToolset[AgentDepsT]):
    """``wrapped`` with the tools named in ``kinds`` carried out as effects of the current tether run.

        toolset = TetherToolset(tools, kinds={"send_email": ("email.send", "to")})
        agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
        with tether.effects.run(runtime, "order-7"):
            agent.run_sync("tell the customer")

    A guarded tool's body never runs; the model sees the receipt's result
    (a replayed call: the first one's). A name in ``kinds`` that the wrapped
    toolset does not hold is an error when the tools are listed: a typo must
    not leave a mutating tool unguarded. A tool the toolset holds but hides
    for a step (its ``prepare`` returned ``None``, a filter) is not offered
    that step, and that is no error: "holds" is a function toolset's own
    registration (through prefixes and renames), or an offer at an earlier
    step of this run for a toolset whose tools are only known when listed.
    """

    kinds: Mapping[str, GuardSpec] = field(default_factory=dict)
    _guards: dict[str, Guard] = field(init=False, repr=False)
    _offered: set[str] = field(init=False, repr=False, default_factory=set)

    def __post_init__(self) -> None:
        if not isinstance(self.kinds, Mapping):
            raise SpecError("kinds", "a mapping of tool name to Guard or (kind, target parameter)")
        self._guards = {str(name): as_guard(spec) for name, spec in self.kinds.items()}

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        tools = await super().get_tools(ctx)
        self._offered |= set(tools)
        missing = set(self._guards) - self._offered
        if missing:
            missing -= registered(self.wrapped)  # held, and hidden this step
        if missing:
            raise SpecError(
                "kinds",
                f"no tool named {sorted(missing)} in {self.wrapped.label} "
                f"(offered: {sorted(tools)})",
            )
        return tools

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        guard = self._guards.get(name)
        if guard is None:
            return await super().call_tool(name, tool_args, ctx, tool)
        run = effects.current()  # read here: the worker thread gets a copy of this context
        try:
            plain = to_jsonable_python(tool_args)
        except PydanticSerializationError as exc:
            raise SpecError(name, f"the tool's arguments have no JSON form: {exc}") from None
        target, args = guard.split(name, plain)
        document = _signed_approval(ctx)
        if document is not None and run.session.awaiting_approval:
            # Only while the run waits: the same continuation run again after the
            # write went (a crash before its caller saw it) replays, it is not re-approved.
            if not run.waits_for(guard.kind, target, args):
                # Approved with other arguments (override_args) than the write the
                # signature names: delivering it would send the write as first asked.
                raise EvidenceBindingError(
                    "intent", "this call's arguments", "the write as first asked"
                )
            await asyncio.to_thread(run.approve, document)
        try:
            done = await asyncio.to_thread(run.call, guard.kind, target, args)
        except ApprovalRequiredError as exc:
            if ctx.tool_call_approved:
                raise  # approved in PydanticAI, but no signed approval reached tether
            if not exc.for_this_call:
                # The run waits for another write's approval (one a person denied in
                # PydanticAI, say): deferring *this* call would show the person this
                # tool while the request they would sign is the other write's.
                raise
            raise ApprovalRequired(
                metadata={
                    "tether": {
                        "run_id": exc.run_id,
                        "action_id": exc.action_id,
                        "request": exc.request,
                    }
                }
            ) from exc
        return done.result


def registered(toolset: AbstractToolset[Any]) -> set[str]:
    """The tool names ``toolset`` holds whatever a step hides: its function tools, as named.

    Followed through combined, prefixed, renamed and other wrapping toolsets;
    a toolset whose tools are known only when listed (an MCP server, a
    dynamic toolset) adds none.
    """
    if isinstance(toolset, FunctionToolset):
        return set(toolset.tools)
    if isinstance(toolset, CombinedToolset):
        return set().union(*(registered(each) for each in toolset.toolsets))
    if isinstance(toolset, PrefixedToolset):
        return {f"{toolset.prefix}_{name}" for name in registered(toolset.wrapped)}
    if isinstance(toolset, RenamedToolset):
        new_names = {old: new for new, old in toolset.name_map.items()}
        return {new_names.get(name, name) for name in registered(toolset.wrapped)}
    if isinstance(toolset, WrapperToolset):
        return registered(toolset.wrapped)
    return set()


def _signed_approval(ctx: RunContext[Any]) -> Any:
    """The signed approval a person sent with this call's PydanticAI approval, if any."""
    if not ctx.tool_call_approved or not isinstance(ctx.tool_call_metadata, Mapping):
        return None
    return ctx.tool_call_metadata.get(APPROVAL_METADATA_KEY)
