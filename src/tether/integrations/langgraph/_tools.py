"""Guarded tools: a LangChain tool whose effect goes through the tether run, once.

    from tether.integrations.langgraph import guard

    send_email = guard(send_email_tool, kind="email.send", target="to")
    tools = ToolNode([send_email, ...])

    with tether.effects.run(runtime, "ticket-42"):
        graph.invoke(inputs, {"configurable": {"thread_id": "ticket-42"}})

The wrapped tool keeps its name, description and argument schema (what the
model sees); its own code is never run. An invocation is one
``tether.effects`` call on the run open in the caller's context: the
adapter that owns ``kind`` performs the effect under a key persisted
before anything is sent, and a node that LangGraph re-executes after a
crash or a resume gets the recorded receipt back instead of a second send.

**Which run.** The run is the one ``tether.effects.run`` made current (a
ContextVar). LangGraph carries the caller's context into every place a
tool runs: the node itself (sync ``invoke``/``stream`` run a lone task in
the caller's thread and parallel tasks through a context-copying
executor; ``ainvoke``/``astream`` run tasks as asyncio tasks, which copy
the context) and ToolNode's parallel tool calls (LangChain's
context-copying executor). Tests check each path. A registry keyed by the
RunnableConfig's ``thread_id`` was not needed, and would be a second
source of truth for which run an effect belongs to; with no run in the
context the call is refused (:class:`~tether.core.NotInRunError`) and
nothing is sent.

**People.** "Waiting for approval" and "needs review" become LangGraph
``interrupt()`` calls (a checkpointer is needed, as for any interrupt). The
interrupt's value is a JSON object a person can act on:

- ``{"tether": "approval_required", "run_id", "action_id", "tool",
  "for_this_call", "kind", "target", "args", "request": {the fields an
  approval must carry}, "refused"}``: ``kind``, ``target`` and ``args`` (left
  out for a kind the policy marks sensitive) are the write waiting; when
  another write than this tool's call waits (``for_this_call`` false,
  ``tool`` null), this call goes on once that one is settled
- ``{"tether": "needs_review", "run_id", "case_id", "reason", "detail",
  "tool", "request": {the fields a reviewer decision must carry}, "refused"}``

The signed document (``Signer.sign({**request, "approver_id": ..., ...})``)
comes back with ``graph.invoke(Command(resume=document), config)``.
LangGraph re-executes the node; the wrapper, refused again, calls
``interrupt()`` and now gets the document, delivers it
(``run.approve`` / ``run.review``) and calls the effect again: it is sent
once, under the key minted before the first interrupt.

**A refused document** (a bad signature, a wrong binding, an expired
approval) re-interrupts with the same request and ``"refused"`` set to the
reason: the graph stops where it was, visibly, and a corrected document
resumes it. Raising would end the graph run with the pending write still
waiting, and a person's typo is not a failure of the run. A document that
does not bind the request at hand is not delivered at all: it may be the
answer to an earlier interrupt of the same node (LangGraph hands a
re-executed node its earlier resume values in order, and a guarded call
that already went through asks for none), so the wrapper goes on to the
next resume value. Keep a node's own ``interrupt()`` calls before its
guarded tools (or in another node): a guarded call that is replayed asks
for no resume value, which would shift the ones after it.

Used outside a graph (no runnable config), the typed
:class:`~tether.core.ApprovalRequiredError` / :class:`~tether.core.NeedsReviewError`
is raised as :func:`tether.effects.call` raises it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.pydantic import get_fields
from langgraph.config import get_config
from langgraph.types import interrupt
from pydantic import BaseModel, ConfigDict

from tether import effects
from tether.core import (
    ApprovalRequiredError,
    EvidenceError,
    NeedsReviewError,
    PolicyError,
    ReviewDecision,
    SpecError,
    answer_body,
    decision_request,
)
from tether.crypto import Signer
from tether.effects import CallResult, GuardedRun

APPROVAL = "approval_required"
REVIEW = "needs_review"

#: Where LangGraph keeps a running node's interrupt state in its config: without it
#: (a tool invoked outside a graph) interrupt() cannot work.
_SCRATCHPAD = "__pregel_scratchpad"

#: The fields of a tool's schema LangChain fills in itself (never the model).
_FRAMEWORK_ARGS = frozenset({"run_manager", "callbacks", "config"})


class _FirstField:
    """``guard``'s default target: the first field of the tool's schema."""


FIRST_FIELD = _FirstField()


def guard(
    tool: BaseTool | Callable[..., Any],
    kind: str,
    *,
    target: str | _FirstField | None = FIRST_FIELD,
    to_effect: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]] | None = None,
    name: str | None = None,
    description: str | None = None,
) -> GuardedTool:
    """A tool that performs ``kind`` through the current tether run instead of its own code.

    ``tool`` is a LangChain tool or a plain function (its signature and
    docstring become the schema, as with ``@tool``). ``target`` names the
    argument holding the effect's target (default: the first; ``None``: the
    kind takes none); the other arguments are the effect's. Where the
    model's arguments are not the adapter's, ``to_effect`` maps them
    (validated, by name) to ``(target, args)``, e.g. for ``http.post``:
    ``lambda a: ("tickets", {"json": a})``; ``target`` is then unused. The
    result the model sees is ``{"outcome": "executed"|"replayed"|"observed", "result": ...}``.
    """
    if not isinstance(kind, str) or not kind:
        raise SpecError("kind", "a guarded tool needs its action kind, e.g. 'email.send'")
    if isinstance(tool, BaseTool):
        inner = tool
    elif callable(tool):
        inner = StructuredTool.from_function(func=tool)
    else:
        raise SpecError("tool", f"expected a LangChain tool or a function, not {tool!r}")
    fields = _field_names(inner)
    if to_effect is not None:
        holder: str | None = None
    elif isinstance(target, _FirstField):
        if not fields:
            raise SpecError("target", f"tool {inner.name!r} has no argument to hold the target")
        holder = fields[0]
    else:
        holder = target
    if to_effect is None and holder is not None and holder not in fields:
        raise SpecError("target", f"tool {inner.name!r} has no argument {holder!r}")
    return GuardedTool(
        name=name or inner.name,
        description=description or inner.description,
        args_schema=inner.args_schema,
        return_direct=inner.return_direct,
        kind=kind,
        target_field=holder,
        effect_fields=tuple(fields),
        to_effect=to_effect,
    )


def sign_answer(
    ask: Mapping[str, Any],
    signer: Signer,
    *,
    decision: str | None = None,
    ttl_s: int = 300,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The signed document answering a guarded tool's interrupt value ``ask``.

    The person's side: the request's fields, who signs, when, a fresh nonce,
    signed with ``signer`` (an approver for ``approval_required``, a reviewer
    with ``decision`` ``replan``/``abort``/``accept`` for ``needs_review``).
    Give it back with ``Command(resume=document)``.
    """
    request = ask.get("request")
    if not isinstance(request, Mapping):
        raise SpecError("ask", "not a guarded tool's interrupt value (no request to sign)")
    issued = now or datetime.now(UTC)
    chosen: ReviewDecision | None = None
    if ask.get("tether") == APPROVAL:
        who = ("approver_id", signer.signer_id)
    elif ask.get("tether") == REVIEW:
        try:
            chosen = ReviewDecision(decision or "")
        except ValueError:
            raise SpecError(
                "decision", "a review needs a decision: replan, abort or accept"
            ) from None
        who = ("reviewer_id", signer.signer_id)
    else:
        raise SpecError("ask", f"unknown interrupt kind {ask.get('tether')!r}")
    body = answer_body(
        request,
        who,
        issued_at=issued,
        expires_at=issued + timedelta(seconds=ttl_s),
        nonce=secrets.token_hex(16),
        decision=chosen,
    )
    return signer.sign(body)


def _field_names(tool: BaseTool) -> list[str]:
    """The arguments the model gives (LangChain's injected ones left out), in schema order."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        names = list(schema.get("properties", {}))
    else:
        names = list(get_fields(schema))
    return [n for n in names if n not in _FRAMEWORK_ARGS]


class GuardedTool(BaseTool):
    """A LangChain tool whose every invocation is one effect of the current tether run.

    Made by :func:`guard`. Works wherever a tool does: in a ``ToolNode``,
    called from a node with ``.invoke``/``.ainvoke``, or bound to a model.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    kind: str
    """The action kind the run's adapter performs (``http.post``, ``email.send``, ...)."""
    target_field: str | None = None
    """The argument holding the effect's target (``None``: the kind takes no target)."""
    effect_fields: tuple[str, ...] = ()
    """The arguments that make up the effect (the schema's, without injected ones)."""
    to_effect: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]] | None = None
    """Maps the model's arguments to the effect's ``(target, args)`` (see :func:`guard`)."""

    def _call_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        values = dict(kwargs)
        if args:  # a plain string input: LangChain passes it as the first argument
            if len(args) != 1 or not self.effect_fields:
                raise SpecError(self.name, "a guarded tool takes its arguments by name")
            values.setdefault(self.effect_fields[0], args[0])
        known = set(self.effect_fields)
        where: Any
        effect_args = {k: _plain(v) for k, v in values.items() if k in known}
        if self.to_effect is not None:
            mapped = self.to_effect(effect_args)
            if not (isinstance(mapped, tuple) and len(mapped) == 2 and isinstance(mapped[1], dict)):
                raise SpecError(self.name, f"to_effect must return (target, args), not {mapped!r}")
            where, effect_args = mapped
        elif self.target_field is None:
            where = ""
        else:
            where = effect_args.pop(self.target_field, None)
        if not isinstance(where, str):
            raise SpecError(str(self.target_field), f"the target must be a string, not {where!r}")
        return where, effect_args

    def _run(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        target, effect_args = self._call_of(args, kwargs)
        run = effects.current()
        refused: str | None = None
        while True:
            try:
                return _shown(run.call(self.kind, target, effect_args))
            except (ApprovalRequiredError, NeedsReviewError) as exc:
                ask = self._ask(run, exc, refused)
            refused = self._take(run, ask)

    async def _arun(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        target, effect_args = self._call_of(args, kwargs)
        run = effects.current()  # read here: the worker threads get copies of this context
        refused: str | None = None
        while True:
            try:
                done = await asyncio.to_thread(run.call, self.kind, target, effect_args)
                return _shown(done)
            except (ApprovalRequiredError, NeedsReviewError) as exc:
                ask = self._ask(run, exc, refused)
            # interrupt() runs here, in the task that holds the node's config.
            document = _interrupt(ask)
            refused = await asyncio.to_thread(_deliver, run, ask, document)

    def _ask(
        self, run: GuardedRun, exc: ApprovalRequiredError | NeedsReviewError, refused: str | None
    ) -> _Ask:
        return _Ask(exc, _payload(run, exc, self.name, refused))

    def _take(self, run: GuardedRun, ask: _Ask) -> str | None:
        return _deliver(run, ask, _interrupt(ask))


@dataclass(frozen=True, slots=True)
class _Ask:
    """One thing the run waits for: the typed refusal and the interrupt's value."""

    error: ApprovalRequiredError | NeedsReviewError
    payload: dict[str, Any]


def _payload(
    run: GuardedRun, exc: ApprovalRequiredError | NeedsReviewError, tool: str, refused: str | None
) -> dict[str, Any]:
    if isinstance(exc, ApprovalRequiredError):
        return {
            "tether": APPROVAL,
            "run_id": exc.run_id,
            "action_id": exc.action_id,
            # Another write may be the one waiting (this tool's call waits behind
            # it): the person is shown what is signed, never this tool's name on it.
            "tool": tool if exc.for_this_call else None,
            "for_this_call": exc.for_this_call,
            **_what_waits(run),
            "request": dict(exc.request),
            "refused": refused,
        }
    state = run.session.state
    case = next((c for c in state.review_cases if c.case_id == exc.case_id), None)
    return {
        "tether": REVIEW,
        "run_id": exc.run_id,
        "case_id": exc.case_id,
        "reason": exc.reason,
        "detail": exc.detail,
        "tool": tool,
        "request": None if case is None else decision_request(state, case),
        "refused": refused,
    }


def _what_waits(run: GuardedRun) -> dict[str, Any]:
    """The held action a person reads before signing: kind, target, arguments (unless sensitive)."""
    pending = run.session.state.pending
    if pending is None:
        return {}
    intent = pending.intent
    rule = run.session.rt.policy.kinds.get(intent.kind)
    shown: dict[str, Any] = {"kind": intent.kind, "target": intent.target}
    if rule is None or not rule.sensitive:
        shown["args"] = dict(intent.args)
    return shown


def _interrupt(ask: _Ask) -> Any:
    """The person's answer to ``ask``: LangGraph's resume value, or the graph stops here."""
    try:
        config = get_config()
    except RuntimeError:
        config = {}
    if _SCRATCHPAD not in config.get("configurable", {}):
        raise ask.error  # not in a graph's node: the effects API's own typed refusal
    return interrupt(ask.payload)


def _deliver(run: GuardedRun, ask: _Ask, document: Any) -> str | None:
    """Give ``document`` to the run if it answers ``ask``; why not, if it was refused or skipped."""
    request = ask.payload.get("request")
    body = document.get("body") if isinstance(document, dict) else None
    if not isinstance(body, dict):
        return "the resume value is not a signed document (a dict with 'body' and 'signature')"
    if isinstance(request, dict):
        for field, want in request.items():
            if body.get(field) != want:
                # Not this request's answer (perhaps an earlier interrupt's): not delivered.
                return f"the document's {field} is {body.get(field)!r}, the request's {want!r}"
    try:
        if ask.payload["tether"] == APPROVAL:
            run.approve(document)
        else:
            run.review(document)
    except (EvidenceError, PolicyError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _shown(done: CallResult) -> dict[str, Any]:
    """What the model reads back: whether it happened now or before, and the result."""
    return {"outcome": done.outcome, "result": done.result}


def _plain(value: Any) -> Any:
    """A validated argument as JSON (pydantic models as their JSON form)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
