"""``tether mcp``: an MCP server in front of an upstream one, whose effects are never repeated.

The agent sees the upstream's tools unchanged (names, schemas,
descriptions, annotations, ``_meta``). Each call is one step of a tether
run that outlives the agent:

- a **read** (the policy names it) is asked of the upstream and traced;
- an **effect** (every other tool) goes through tether's protocol: the
  gate, a key minted and the intent persisted, then the upstream's
  ``tools/call`` (with the key in ``_meta`` where the tool accepts one),
  and its answer recorded as the receipt (the agent is answered as soon as
  the upstream answered, the receipt committed meanwhile:
  :meth:`Gateway.call`). A call equal to one the run
  already committed (same tool, same canonical arguments) gets the
  recorded answer back and reaches nothing.

What needs a person is said to the agent as the tool's answer, ``isError``
with a text that names the person's command: a tool the policy gates waits
for ``tether approve`` (or, given ``--approver-key`` and a client that fills
in forms, is put to the person in the client: :mod:`._approve`); an outcome
a crash left unknown, on a tool that cannot be asked again safely, waits for
``tether review``. Every answer carries ``_meta["tether/call"]``: the run,
the action, and whether it was executed now, replayed, or read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import mcp_types as types
from anyio.abc import TaskGroup
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from tether import __version__, effects
from tether.adapters import FunctionEffect
from tether.core import (
    ApprovalRequiredError,
    EffectNotSettledError,
    EffectRejectedError,
    LeaseHeldError,
    NeedsReviewError,
    Phase,
    RunTerminalError,
    SpecError,
    TaskMismatchError,
    TetherError,
)
from tether.crypto import Keyring, Signer, TrustRoots
from tether.integrations.mcp._answers import CALL_META, KEPT_APART, carried, read_back, sent
from tether.integrations.mcp._approve import (
    ClientApprover,
    can_ask_now,
    elicits,
    said_yes,
    shown_arguments,
)
from tether.integrations.mcp._early import EarlyAnswers
from tether.integrations.mcp._policy import GatewayPolicy, RunRules, kind_of, run_rules, tool_of
from tether.integrations.mcp._stdio import AgentChannel
from tether.integrations.mcp._tools import (
    ARGUMENTS,
    NAMESPACE,
    RECEIVED_AT,
    UpstreamTools,
    blocking_reader,
    forwarding_effect,
    text_of,
)
from tether.integrations.mcp._upstream import Upstream, UpstreamError, log
from tether.runtime import NO_CRASH, CrashPlan, Runtime, open_run
from tether.store import ContentStore, open_store

#: How many times a call is made again when the run first settled earlier work.
_SETTLE_RETRIES = 3


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything ``tether mcp`` is told: where the run lives and what guards it.

    ``store``: the store URL; ``run_id``: the run every session of this
    configuration continues; ``keyring``: seals its checkpoints; ``trust``:
    the people whose approvals and review decisions count (needed when the
    policy gates a tool); ``instance``: the upstream's identity in the
    run's environment (default: the name the upstream gives itself);
    ``lease_ttl_s``: how long the run stays held by a gateway that died;
    ``upstream_moved``: the run continues with an upstream started or
    reached otherwise than it was (the same server, moved): the identity
    the run recorded is kept. ``approver``: an approver's key; where the
    client fills in forms, a gated call is put to the person there and their
    yes signed with it (needs ``trust`` naming it). ``crash``: the crash
    plan the run's runtime is built with (the crash harness arms it).
    """

    store: str
    run_id: str
    keyring: Keyring
    policy: GatewayPolicy
    trust: TrustRoots | None = None
    principal: Signer | None = None
    instance: str | None = None
    task_id: str | None = None
    lease_ttl_s: float = 15.0
    upstream_moved: bool = False
    approver: Signer | None = None
    crash: CrashPlan | None = None


def shown_store(url: str) -> str:
    """The store URL as a person may see it: any password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "STORE"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The one exception a nest of task groups carries (the group itself if several)."""
    errors: Any = group.exceptions
    while len(errors) == 1 and isinstance(errors[0], BaseExceptionGroup):
        errors = errors[0].exceptions
    return errors[0] if len(errors) == 1 else group


def _noted(result: types.CallToolResult, text: str, meta: dict[str, Any]) -> types.CallToolResult:
    """``result`` with ``text`` added after its content and ``meta`` in its tether meta."""
    doc = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    doc.pop("resultType", None)
    if text:
        doc["content"] = [*doc.get("content", []), {"type": "text", "text": text}]
    said = dict(doc.get("_meta") or {})
    said[CALL_META] = dict(said.get(CALL_META) or {}) | meta
    doc["_meta"] = said
    return types.CallToolResult.model_validate(doc)


def _untrusted(gated: list[str]) -> SpecError:
    """The refusal of a gateway whose policy gates tools and that was given no --trust."""
    what = f"the tools {gated}" if gated else "every effect tool (its default)"
    return SpecError(
        "--trust",
        f"the policy gates {what}, and no approval can be checked without trust roots: give "
        "--trust with the approvers' public keys (tether keys new --role approver)",
    )


def _error(text: str, meta: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult.model_validate(
        {"content": [{"type": "text", "text": text}], "isError": True, "_meta": {CALL_META: meta}}
    )


class Gateway:
    """One gateway: an upstream connection, one tether run, and the MCP server over stdio."""

    def __init__(self, config: GatewayConfig, upstream: Upstream) -> None:
        self.config = config
        self.upstream = upstream
        self.tools: list[types.Tool] = []
        self.adapter: UpstreamTools | None = None
        self.run: effects.GuardedRun | None = None
        self.runtime: Runtime | None = None
        #: The run's task and policy, once the upstream's tools are known.
        self.rules: RunRules | None = None
        #: Puts a gated call to the person in the client (``approver`` given; checked now,
        #: before anything starts: a key the run would refuse fails closed).
        self.approver = (
            None
            if config.approver is None
            else ClientApprover(config.approver, config.trust, config.keyring)
        )
        if config.trust is None and config.policy.gates:
            # Before the upstream is started: an approval no one can check must not be waited for.
            raise _untrusted(sorted(n for n, r in config.policy.tools.items() if r.needs_approval))
        # Each answer as it arrives, by key: the receipt may keep it apart (see _answers).
        self._live: dict[str, dict[str, Any]] = {}
        # A read's answer traced as its digest (an integer past 2**53), by that digest.
        self._live_reads: dict[str, dict[str, Any]] = {}
        #: The loop the upstream's connection lives on (set when it is started).
        self.loop: asyncio.AbstractEventLoop | None = None
        #: Effects answered as the upstream answers, while their receipts are committed.
        self.early = EarlyAnswers(config.run_id, self._live)

    # --- setting up ---------------------------------------------------

    def build_runtime(
        self, tools: list[types.Tool], *, store: ContentStore | None = None
    ) -> Runtime:
        """The runtime of this gateway's run, for the upstream's ``tools`` (over ``store``, or
        the store the configuration names)."""
        config = self.config
        names = [tool.name for tool in tools]
        config.policy.check_names(names)
        server = self.upstream.server_info
        instance = config.instance or (server.name if server is not None else "") or "upstream"
        store = store if store is not None else open_store(config.store)

        def keep(name: str, body: bytes) -> None:
            store.put_blobs({name: body})

        effects_by_tool: dict[str, FunctionEffect] = {
            kind_of(tool.name): forwarding_effect(
                tool,
                config.policy,
                self.upstream.answer,
                instance,
                self._live,
                keep,
                answered=self._answered,
            )
            for tool in tools
            if not config.policy.is_read(tool.name)
        }
        reader = blocking_reader(
            self.upstream.answer, self._loop, self.upstream.timeout_s, self._live_reads
        )
        reads = frozenset(n for n in names if config.policy.is_read(n))
        fingerprint = self._recorded_identity(instance) if config.upstream_moved else None
        adapter = UpstreamTools(
            instance,
            effects_by_tool,
            reads,
            reader,
            target=self.upstream.target_identity,
            fingerprint=fingerprint,
        )
        rules = run_rules(
            config.policy, names, adapter.environment(), config.task_id or f"mcp:{instance}"
        )
        self.rules = rules
        gated = sorted(tool_of(n) for n, r in rules.policy.kinds.items() if r.needs_approval)
        if gated and config.trust is None:
            raise _untrusted(gated)
        self.tools = tools
        self.adapter = adapter
        self.runtime = Runtime(
            store=store,
            keyring=config.keyring,
            adapter=adapter,
            task=rules.task,
            policy=rules.policy,
            trust=config.trust,
            principal=config.principal,
            lease_ttl_s=config.lease_ttl_s,
            crash=NO_CRASH if config.crash is None else config.crash,
        )
        return self.runtime

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The loop the upstream's connection lives on (a read is asked there)."""
        if self.loop is None:
            raise UpstreamError("the upstream's connection is not started")
        return self.loop

    def _recorded_identity(self, instance: str) -> str:
        """The upstream identity run ``--run`` recorded, for ``--upstream-moved``."""
        config = self.config
        store = open_store(config.store)
        try:
            view = open_run(store, config.run_id, keyring=config.keyring, history=False)
        except TetherError as exc:
            raise SpecError(
                "--upstream-moved",
                f"run {config.run_id} cannot be read ({exc}); the flag continues a run that exists",
            ) from exc
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()
        recorded = view.state.environment
        if recorded.namespace != NAMESPACE or recorded.instance_id != instance:
            raise SpecError(
                "--upstream-moved",
                f"run {config.run_id} was started for {recorded.namespace}:{recorded.instance_id}, "
                f"not this upstream ({NAMESPACE}:{instance}); the flag is for the same server, "
                "moved",
            )
        return recorded.state_fingerprint

    async def open_run(self, runtime: Runtime, stack: contextlib.AsyncExitStack) -> None:
        """Start the run, or continue it; wait (up to a lease) for a gateway that died holding it."""
        waited = 0.0
        limit = self.config.lease_ttl_s + 2.0
        while True:
            try:
                self.run = await stack.enter_async_context(
                    effects.run_async(runtime, self.config.run_id)
                )
                return
            except TaskMismatchError:
                names = sorted(tool.name for tool in self.tools)
                log(
                    f"run {self.config.run_id} was started for another task: its task is the "
                    f"upstream's tool list (now {names}), the instance, the task id and the "
                    "upstream itself (the command line and directory it is started with, or its "
                    "URL); another upstream is another task, so give a new --run (the old run "
                    "stays as it was). If it is the same server, moved (another path, another "
                    "URL), give --upstream-moved to continue the run with it"
                )
                raise
            except LeaseHeldError as exc:
                if waited >= limit:
                    raise
                if waited == 0.0:
                    log(f"run {self.config.run_id} is held ({exc}); waiting for its lease")
                await anyio.sleep(0.25)
                waited += 0.25

    async def serve_stdio(self) -> None:
        """Connect the upstream, open the run, and serve MCP on stdin/stdout until EOF.

        A failure is raised as itself, not wrapped in the task groups it
        crossed, so the CLI says it in one line.
        """
        try:
            await self._serve_stdio()
        except BaseExceptionGroup as group:
            raise _leaf(group) from None

    async def rules_only(self) -> RunRules:
        """The run's task and policy for the upstream as it is now; the run is not touched."""
        try:
            async with anyio.create_task_group() as group:
                await self.upstream.start(group)
                try:
                    tools = await self.upstream.tools()
                    runtime = self.build_runtime(tools)
                    close = getattr(runtime.store, "close", None)
                    if callable(close):
                        close()
                finally:
                    await self.upstream.aclose()
        except BaseExceptionGroup as group_error:
            raise _leaf(group_error) from None
        if self.rules is None:  # pragma: no cover - build_runtime sets it
            raise TetherError("no rules were derived")
        return self.rules

    async def _serve_stdio(self) -> None:
        async with anyio.create_task_group() as group:
            try:
                # Left before the group is cancelled: the run's lease is given up on the way
                # out (a cancelled scope would cancel that release), then the upstream closed.
                async with contextlib.AsyncExitStack() as stack:
                    await self._serve(group, stack)
            finally:
                group.cancel_scope.cancel()

    async def _serve(self, group: TaskGroup, stack: contextlib.AsyncExitStack) -> None:
        await self.upstream.start(group)
        stack.push_async_callback(self.upstream.aclose)
        tools = await self.upstream.tools()
        self.loop = asyncio.get_running_loop()
        runtime = await anyio.to_thread.run_sync(self.build_runtime, tools)
        close = getattr(runtime.store, "close", None)
        if callable(close):
            stack.callback(close)
        await self.open_run(runtime, stack)
        # Left before the run is let go (the stack unwinds in reverse): every call
        # answered early has its receipt committed first (asked again if the store
        # refused it).
        stack.push_async_callback(self.early.record_again)
        phase = "?" if self.run is None else self.run.phase.value
        log(
            f"run {self.config.run_id} ({phase}): {len(tools)} tools of "
            f"{runtime.adapter.instance_id}"
        )
        if self.config.trust is None:
            log(
                "no --trust: a person's review decision cannot be checked by this gateway; "
                "give --trust with the reviewers' public keys so a frozen run can be decided"
            )
        server = self.server()
        channel = AgentChannel(self.lane_answer, server.server_info_stamp)
        async with contextlib.AsyncExitStack() as streams:
            try:
                read_stream, write_stream = await streams.enter_async_context(channel.streams())
            except ValueError:  # stdin or stdout is a plain file: the SDK's own transport
                read_stream, write_stream = await streams.enter_async_context(stdio_server())
            else:
                # SIGTERM ends it as EOF does: the calls under way answered, every
                # receipt committed and the run let go, then the gateway exits.
                streams.enter_context(channel.ended_by_sigterm())
            await server.run(read_stream, write_stream, server.create_initialization_options())

    def server(self) -> Server[Any]:
        """The MCP server the agent talks to."""
        return Server(
            "tether",
            version=__version__,
            instructions=self.upstream.instructions,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    # --- answering ----------------------------------------------------

    async def lane_answer(self, name: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """A tool call the agent's channel read itself (``_stdio``): its result as JSON, or
        ``None`` where the call is to be put to the person in the client (the SDK's server
        knows what the client can do, and answers it: see :meth:`_call_tool`)."""
        answer = await self.call(name, arguments)
        said = (answer.meta or {}).get(CALL_META, {})
        if (
            self.approver is not None
            and said.get("waits_for") == "approval"
            and said.get("for_this_call")
        ):
            return None
        doc: dict[str, Any] = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        return doc

    async def _list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        name, arguments = params.name, dict(params.arguments or {})
        answer = await self.call(name, arguments)
        said = (answer.meta or {}).get(CALL_META, {})
        if (
            self.approver is None
            or said.get("waits_for") != "approval"
            or not said.get("for_this_call")
            or not elicits(ctx)
        ):
            return answer
        return await self._approve_in_client(ctx, params, answer, str(said.get("action_id")))

    async def _approve_in_client(
        self,
        ctx: Any,
        params: types.CallToolRequestParams,
        waiting: types.CallToolResult,
        action_id: str,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Put this gated call to the person in the client; on their yes, sign, deliver, send."""
        approver, runtime = self.approver, self.runtime
        if approver is None or runtime is None:  # pragma: no cover - the caller checked
            return waiting
        name, arguments = params.name, dict(params.arguments or {})
        sensitive = self.config.policy.rule(name).sensitive
        message = approver.question(
            name, action_id, self.config.run_id, shown_arguments(arguments, sensitive=sensitive)
        )
        if can_ask_now(ctx):
            try:
                answer: types.ElicitResult | None = await approver.ask_now(ctx, message)
            except Exception as exc:  # whatever the client answered: nothing is signed
                return _noted(
                    waiting,
                    f"tether: the client could not put the question to a person ({exc}).",
                    {"asked_in_client": "failed"},
                )
        else:
            answer = approver.answer_in(params, action_id)
            if answer is None:  # the first leg: the client asks, then calls again
                return approver.input_required(message, action_id)
        if not said_yes(answer):
            word = "declined" if answer is None else answer.action
            return _noted(
                waiting,
                f"tether: the person in the client did not approve ({word}); nothing was sent.",
                {"asked_in_client": word},
            )
        try:
            await anyio.to_thread.run_sync(
                approver.sign, runtime.store, self.config.run_id, action_id
            )
        except TetherError as exc:
            return _noted(
                waiting,
                f"tether: the approval given in the client was not signed: {exc}",
                {"asked_in_client": "refused"},
            )
        log(f"{name}: approved in the client, signed as {approver.signer_id} ({action_id})")
        done = await self.call(name, arguments)
        return _noted(done, "", {"approved_in_client": approver.signer_id})

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """One tool call through the run: its answer, or what stops it, as the agent reads it.

        An effect that needs no approval is answered as soon as the upstream
        answered, while the protocol commits its receipt (:mod:`._early`); the
        next call starts once that commit is done.
        """
        await self.recorded()
        return await self._call(name, arguments)

    async def recorded(self) -> None:
        """Wait until every call answered early has committed its receipt (or failed to).

        What its protocol raised besides a refusal (a crash the harness fired) is raised here.
        """
        await self.early.recorded()

    def _answered(
        self, name: str, arguments: dict[str, Any], key: str, doc: dict[str, Any]
    ) -> None:
        self.early.answered(self.run, name, arguments, key, doc)

    async def _call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        run = self.run
        meta: dict[str, Any] = {"run_id": self.config.run_id, "tool": name}
        if run is None or self.adapter is None:
            return _error("tether: the gateway's run is not open", meta)
        kind = kind_of(name)
        try:
            self.adapter.owner(kind)
        except TetherError:
            return _error(
                f"tether: the upstream offered no tool {name!r} when the gateway started", meta
            )
        if self.adapter.effect_of(kind) is not None:
            try:
                # Before the protocol takes the call: a crash while the upstream is started
                # again leaves nothing dispatched, so the call is simply made again.
                await self.upstream.ready()
            except UpstreamError as exc:  # a recorded answer may still be replayed
                log(f"{name}: the upstream is not reachable ({exc})")
        # An action held for a person that is not this call: a step may carry it out first.
        # (Only a call waiting for approval: a frozen run's write is a person's to decide.)
        held = run.session.state.pending if run.phase is Phase.PENDING else None
        if held is not None and run.waits_for(kind, "", {ARGUMENTS: carried(arguments)}):
            held = None
        notes: list[str] = []
        rule = self.rules.policy.kinds.get(kind) if self.rules is not None else None
        # Answered as the upstream answers: a write no person gates, with nothing to settle first.
        early = held is None and rule is not None and not rule.needs_approval
        early = early and self.adapter.effect_of(kind) is not None
        for _ in range(_SETTLE_RETRIES):
            got = await self._attempt(run, name, arguments, early=early)
            if isinstance(got, types.CallToolResult):
                return got  # answered early: the protocol records it meanwhile
            now = run.session.state.pending
            if held is not None and (now is None or now.action_id != held.action_id):
                # Say what became of it: the agent may believe nothing was ever sent.
                notes.append(await anyio.to_thread.run_sync(self._settled_note, run, held))
                meta = meta | {"settled_first": held.action_id}
                held = None
            if got is None:
                continue  # the run settled earlier work: this call's own turn now
            if isinstance(got, effects.CallResult):
                return await self._answer(got, meta, notes)
            text, extra = got
            return _error(" ".join([*notes, text]), meta | extra)
        return _error(
            " ".join(
                [
                    *notes,
                    f"tether: {name} was not carried out (the run kept settling); call it again",
                ]
            ),
            meta,
        )

    async def _attempt(
        self, run: effects.GuardedRun, name: str, arguments: dict[str, Any], *, early: bool
    ) -> effects.CallResult | types.CallToolResult | tuple[str, dict[str, Any]] | None:
        """One try of a call: its result (or its answer, ``early``: :mod:`._early`), what stops
        it (text, meta), or ``None`` (try again)."""
        try:
            if early:
                return await self.early.call(run, name, arguments)
            return await run.call_async(kind_of(name), "", {ARGUMENTS: carried(arguments)})
        except EffectNotSettledError as exc:
            if exc.reason == "settled_earlier_work":
                return None
            return f"tether: {name} was not carried out ({exc}); call it again", {}
        except ApprovalRequiredError as exc:
            if not exc.for_this_call:
                # The same call, made earlier in the run, is answered from the record: it
                # waits behind nothing.
                recorded = await anyio.to_thread.run_sync(self._recorded, run, name, arguments)
                if recorded is not None:
                    return recorded
            waits = {
                "waits_for": "approval",
                "action_id": exc.action_id,
                "for_this_call": exc.for_this_call,
            }
            return self._waits_for_approval(name, exc), waits
        except NeedsReviewError as exc:
            waits = {"waits_for": "review", "case_id": exc.case_id, "reason": exc.reason}
            effect = await anyio.to_thread.run_sync(self._effect_digest, name, arguments)
            record = None if effect is None else run.session.effects.get(effect)
            # This very call is the one whose earlier attempt's outcome is unknown.
            mine = record is not None and record.unsettled is not None
            return self._waits_for_review(name, exc, effect, mine=mine), waits
        except EffectRejectedError as exc:
            return f"tether: {name} was refused, nothing happened: {exc}", {"outcome": "rejected"}
        except RunTerminalError as exc:
            return f"tether: the run has ended, nothing is sent any more: {exc}", {}
        except (TetherError, UpstreamError) as exc:
            return f"tether: {name} failed: {type(exc).__name__}: {exc}", {}

    def _effect_digest(self, name: str, arguments: dict[str, Any]) -> str | None:
        """The effect digest of tool ``name``'s call (what a fork names), or ``None`` for a read."""
        runtime = self.runtime
        kind = kind_of(name)
        if self.adapter is None or runtime is None or self.adapter.effect_of(kind) is None:
            return None
        try:
            args = self.adapter.normalize(kind, "", {ARGUMENTS: carried(arguments)})
            return runtime.effect_of(kind, "", args)
        except TetherError:
            return None

    def _recorded(
        self, run: effects.GuardedRun, name: str, arguments: dict[str, Any]
    ) -> effects.CallResult | None:
        """This call's committed answer, if the run already made the same call (a replay)."""
        effect = self._effect_digest(name, arguments)
        if effect is None:
            return None
        record = run.session.effects.get(effect)
        if record is None or record.unsettled is not None or record.committed is None:
            return None
        known = record.committed
        if known.receipt is None:
            return None
        return effects.CallResult(
            known.action_id,
            kind_of(name),
            "",
            "replayed",
            effect_digest=effect,
            receipt=dict(known.receipt),
        )

    def _settled_note(self, run: effects.GuardedRun, held: Any) -> str:
        """What the run did with ``held`` (a call settled first) before this call's turn."""
        intent = held.intent
        kind = tool_of(intent.kind)  # the tool's name, as the agent knows it
        if self.config.policy.rule(kind).sensitive:
            shown = "(arguments not shown: the tool is sensitive)"
        else:
            shown = json.dumps(sent(intent.args.get(ARGUMENTS, {})), sort_keys=True)[:500]
        what = f"{kind} with arguments {shown} (action {held.action_id})"
        # A call the policy gates (sent only once a person approved it), or an earlier
        # call still to settle (in flight beside this one, or left by a gateway that
        # died): say which.
        rule = None if self.rules is None else self.rules.policy.kinds.get(intent.kind)
        gated = held.approvals or (rule is not None and rule.needs_approval)
        which = "the call a person approved earlier" if gated else "an earlier call"
        record = run.session.effects.get(run.session.rt.effect_digest(intent))
        known = None if record is None else record.committed
        if known is None or known.action_id != held.action_id or known.receipt is None:
            return (
                f"tether: before this call, the run settled {which}, {what}; "
                f"see it with: tether inspect {self.config.run_id}."
            )
        key = known.receipt.get("idempotency_key")
        doc = self._live.get(key) if isinstance(key, str) else None
        if doc is None:
            doc = self._recorded_answer(known.receipt.get("result"))
        answer = text_of(doc, 500) if doc is not None else "(not kept whole)"
        return (
            f"tether: before this call, the run carried out {which}: "
            f"{what}; the upstream answered: {answer}. Calling {kind} again with those "
            "arguments gets that answer back; nothing is sent again."
        )

    def _recorded_answer(self, result: Any) -> dict[str, Any] | None:
        """The upstream's answer as a receipt's result records it, exact, or ``None`` (not
        kept whole: a sensitive tool's, or kept apart and not found). Blocking (the store)."""
        if not isinstance(result, dict):
            return None
        if KEPT_APART in result:
            runtime = self.runtime
            return None if runtime is None else read_back(result, runtime.store.get_blob)
        return result if isinstance(result.get("content"), list) else None

    async def _answer(
        self, done: effects.CallResult, meta: dict[str, Any], notes: list[str] | None = None
    ) -> types.CallToolResult:
        meta = meta | {"action_id": done.action_id, "outcome": done.outcome}
        if done.effect_digest is not None:
            meta["effect"] = done.effect_digest
        doc: dict[str, Any] | None
        if done.outcome == "observed":
            doc = done.data
            apart = doc.get(KEPT_APART)
            if isinstance(apart, dict):
                doc = self._live_reads.pop(str(apart.get("sha256")), None)
        else:
            receipt = done.receipt or {}
            key = receipt.get("idempotency_key")
            doc = self._live.pop(key, None) if isinstance(key, str) else None
            if doc is None:
                doc = await anyio.to_thread.run_sync(self._recorded_answer, done.result)
        if doc is None:
            # Said as an error answer: an output schema binds only a tool's success.
            kept = done.result if isinstance(done.result, dict) else {}
            doc = {"content": [{"type": "text", "text": self._unkept(kept)}], "isError": True}
            meta["answer_kept"] = False
            if kept.get("settled_by") == "review":
                meta |= {
                    "settled_by": "review",
                    "reviewer_id": kept.get("reviewer_id"),
                    "evidence": kept.get("evidence"),
                }
        answer = {k: v for k, v in doc.items() if k != RECEIVED_AT}
        if notes:  # what the run did first, after the tool's own answer
            answer["content"] = [*answer["content"], {"type": "text", "text": " ".join(notes)}]
        answer["_meta"] = dict(answer.get("_meta") or {}) | {CALL_META: meta}
        return types.CallToolResult.model_validate(answer)

    def _unkept(self, kept: dict[str, Any]) -> str:
        """What the agent is told of a call made earlier whose answer cannot be given back."""
        see = f"See the call with: tether inspect {self.config.run_id}."
        if kept.get("settled_by") == "review":
            # A person found it landed: the upstream's answer never reached the gateway.
            return (
                "tether: this call was made earlier in this run and is not made again: its "
                "answer was lost, and a person looked and signed that it happened "
                f"({kept.get('reviewer_id')}, who found: {kept.get('evidence')}). The "
                f"upstream's own answer was never received, so it cannot be given back. {see}"
            )
        why = kept.get(KEPT_APART) or "the tool is sensitive, or the record is older"
        return (
            "tether: this call was made earlier in this run and is not made again; the "
            "upstream's answer to it was not kept whole, so it cannot be given back "
            f"({why}). {see}"
        )

    def _waits_for_approval(self, name: str, exc: ApprovalRequiredError) -> str:
        store = shown_store(self.config.store)
        run_id = self.config.run_id
        action = exc.action_id or "ACTION"
        head = (
            f"tether: {name} needs a person's approval before it is sent; nothing has been sent."
            if exc.for_this_call
            else f"tether: {name} waits behind another call that needs a person's approval "
            f"({action}); nothing has been sent for it."
        )
        return (
            f"{head} Run {run_id} waits for a signed approval of action {action}. A person "
            f"approves with: tether approve {run_id} {action} --store {store} --key APPROVER.key "
            f"(see it first with: tether inspect {run_id} --store {store}). Then call {name} "
            "again with the same arguments."
        )

    def _waits_for_review(
        self, name: str, exc: NeedsReviewError, effect: str | None, *, mine: bool
    ) -> str:
        store = shown_store(self.config.store)
        run_id = self.config.run_id
        case = exc.case_id or "CASE"
        reason = f" ({exc.reason})" if exc.reason else ""
        fork = f"tether fork {run_id} {effect or 'EFFECT'} --store {store} --key REVIEWER.key"
        text = (
            f"tether: run {run_id} is frozen for a person's review{reason}: a call's "
            "outcome is unknown (it may have happened) and the tool cannot be asked again "
            f"safely, so nothing more is sent until a person decides. {exc.detail} "
            f"A person looks with: tether inspect {run_id} --store {store}; and decides with: "
            f"tether review {run_id} {case} --decision DECISION --store {store} "
            "--key REVIEWER.key (landed --evidence WHAT_THEY_FOUND: the call happened, it is "
            "recorded and answered from the record; not_landed: it did not, it is made once "
            "more under the same key; replan: the run goes on, but the call whose outcome is unknown "
            "is never made again by asking for it with the same arguments, since it may have "
            f"happened: to make it again a person signs a fork of its effect ({fork}); abort: "
            f"end the run). Do not call {name} again until then."
        )
        if mine:
            text = (
                f"tether: {name} with these arguments was sent in run {run_id} and its "
                "outcome is unknown (it may have happened): asking again does not make it "
                f"again. If a person decides it must be made again, they sign a fork ({fork}) "
                f"and decide the review below with replan; then call {name} again. Meanwhile: "
                + text.removeprefix("tether: ")
            )
        if self.config.trust is None:
            text += (
                " This gateway was started without --trust, so no person's decision can be "
                "checked: restart it with --trust naming the reviewer's public key (tether "
                "keys new --role reviewer) for the decision to be applied."
            )
        return text.replace("  ", " ")
