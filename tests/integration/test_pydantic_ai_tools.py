"""TetherToolset: a PydanticAI agent (offline FunctionModel) whose tools send real HTTP and SMTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="needs the [pydantic-ai] extra")

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import (
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDefinition,
    ToolDenied,
)
from pydantic_ai.toolsets import FunctionToolset

from tests.conftest import signed_approval
from tests.integration._pydantic_ai_kit import CUSTOMER, KINDS, agent, policy, scripted, task, tools
from tests.integration._services import (
    EffectsService,
    delivered,
    effects_service,
    smtp_adapter,
    smtp_server,
)
from tether import effects
from tether.adapters import REFERENCE_PROFILE, Adapters, HttpEffect
from tether.core import (
    ApprovalRequiredError,
    EvidenceBindingError,
    NeedsReviewError,
    NotInRunError,
    SpecError,
)
from tether.crypto import Keyring, Signer, TrustRoots
from tether.integrations.pydantic_ai import (
    APPROVAL_METADATA_KEY,
    TetherCapability,
    TetherToolset,
)
from tether.runtime import CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import SQLiteStore

ALICE = Signer.generate("alice", "approver")
TICKET = {"title": "printer on fire", "detail": "third floor"}
MAIL = {"to": CUSTOMER, "subject": "your ticket", "body": "We opened a ticket."}


class Desk:
    """One test's real services, SQLite file and keyring; builds runtimes over them."""

    def __init__(self, tmp_path: Path, service: EffectsService, smtp_port: int) -> None:
        self.db = tmp_path / "tether.sqlite"
        self.maildir = tmp_path / "maildir"
        self.service = service
        self.keyring = Keyring.generate("k1")
        self.http = HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=5)
        self.smtp_port = smtp_port
        self.stores: list[SQLiteStore] = []

    def runtime(self, *, blind_mail: bool = False, **overrides: Any) -> Runtime:
        mail = smtp_adapter(self.smtp_port, None if blind_mail else self.maildir)
        combined = Adapters(self.http, mail)
        store = SQLiteStore(self.db)
        self.stores.append(store)
        kwargs: dict[str, Any] = {
            "store": store,
            "keyring": self.keyring,
            "adapter": combined,
            "task": task(combined),
            "policy": policy(),
            "agent": None,
        }
        kwargs.update(overrides)
        return Runtime(**kwargs)

    def tickets(self) -> list[dict[str, Any]]:
        return self.service.tickets()

    def close(self) -> None:
        for store in self.stores:
            store.close()
        self.http.close()


@pytest.fixture
def desk(tmp_path: Path) -> Iterator[Desk]:
    with effects_service(tmp_path) as service, smtp_server(tmp_path / "maildir") as port:
        made = Desk(tmp_path, service, port)
        yield made
        made.close()


def tool_returns(result: Any) -> list[Any]:
    """What the model was given back by the tools in one agent run."""
    return [
        part.content
        for message in result.all_messages()
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


def test_a_guarded_tool_sends_once_and_the_model_sees_the_receipts_result(desk: Desk) -> None:
    """The model's open_ticket call is one real POST; the tool returns the receipt's result."""
    calls: list[str] = []
    guarded = TetherToolset(tools(calls), kinds=KINDS)
    with effects.run(desk.runtime(), "r1"):
        result = agent(scripted("open_ticket", TICKET), guarded).run_sync("printer!")
        again = effects.call("http.post", "tickets", {"json": TICKET})
    (ticket,) = desk.tickets()
    assert tool_returns(result) == [again.result]
    assert again.replayed and again.result["body"]["ticket_id"] == ticket["ticket_id"]
    assert calls == []  # the tool's own body never ran: the adapter performed the effect


def test_a_second_agent_run_in_the_same_tether_run_replays_and_sends_nothing(desk: Desk) -> None:
    """The agent run again (a new runtime, as after a crash) gets the first receipt; 0 sends."""
    guarded = TetherToolset(tools([]), kinds=KINDS)
    model = scripted("send_email", MAIL)
    with effects.run(desk.runtime(), "r1"):
        first = agent(model, guarded).run_sync("tell the customer")
    with effects.run(desk.runtime(), "r1"):
        second = agent(model, guarded).run_sync("tell the customer")
    assert len(delivered(desk.maildir)) == 1
    (sent,) = tool_returns(first)
    assert tool_returns(second) == [sent] and sent["to"] == CUSTOMER


def test_an_unguarded_read_only_tool_runs_its_own_body(desk: Desk) -> None:
    """A tool not named in kinds passes through: its body runs and nothing goes through tether."""
    calls: list[str] = []
    guarded = TetherToolset(tools(calls), kinds=KINDS)
    with effects.run(desk.runtime(), "r1"):
        result = agent(scripted("lookup_order", {"order_id": "o-7"}), guarded).run_sync("status?")
    assert calls == ["lookup_order"]
    assert tool_returns(result) == [{"order_id": "o-7", "status": "shipped"}]
    assert desk.tickets() == []


def test_the_capability_guards_the_agents_own_tools(desk: Desk) -> None:
    """TetherCapability wraps the agent's assembled toolset the same way."""
    calls: list[str] = []
    capability: TetherCapability[None] = TetherCapability(KINDS)
    bot = agent(scripted("open_ticket", TICKET), tools(calls))
    with effects.run(desk.runtime(), "r1"):
        bot.run_sync("printer!", capabilities=[capability])
        bot.run_sync("printer!", capabilities=[capability])
    assert len(desk.tickets()) == 1 and calls == []


def test_a_guarded_tool_outside_a_run_is_refused_and_nothing_is_sent(desk: Desk) -> None:
    """Without an open tether run the tool call raises NotInRunError; neither body nor effect runs."""
    calls: list[str] = []
    guarded = TetherToolset(tools(calls), kinds=KINDS)
    with pytest.raises(NotInRunError):
        agent(scripted("open_ticket", TICKET), guarded).run_sync("printer!")
    assert desk.tickets() == [] and calls == []


def test_a_kinds_entry_naming_no_tool_is_refused(desk: Desk) -> None:
    """A typo in kinds fails when the tools are listed, instead of leaving a write unguarded."""
    guarded = TetherToolset(tools([]), kinds={"open_tikcet": ("http.post", None)})
    with effects.run(desk.runtime(), "r1"), pytest.raises(SpecError, match="open_tikcet"):
        agent(scripted("open_ticket", TICKET), guarded).run_sync("printer!")
    assert desk.tickets() == []


def hidden_for_one_step(calls: list[str]) -> FunctionToolset[None]:
    """``open_ticket`` hidden by its ``prepare`` at the first step, offered from the second on."""
    toolset: FunctionToolset[None] = FunctionToolset()

    async def after_a_look(
        ctx: RunContext[None], tool_def: ToolDefinition
    ) -> ToolDefinition | None:
        return tool_def if ctx.run_step > 1 else None

    @toolset.tool_plain(prepare=after_a_look)
    def open_ticket(title: str, detail: str) -> str:
        """Open a support ticket."""
        calls.append("open_ticket")
        return "opened (unguarded)"

    @toolset.tool_plain
    def lookup_order(order_id: str) -> dict[str, str]:
        """Read an order's status."""
        calls.append("lookup_order")
        return {"order_id": order_id, "status": "shipped"}

    return toolset


def look_then_open() -> FunctionModel:
    """Reads the order first (open_ticket is not offered yet), then opens the ticket."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered = {tool.name for tool in info.function_tools}
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            assert "open_ticket" not in offered  # hidden at this step
            return ModelResponse(parts=[ToolCallPart("lookup_order", {"order_id": "o-7"})])
        if len(returns) == 1:
            assert "open_ticket" in offered
            return ModelResponse(parts=[ToolCallPart("open_ticket", dict(TICKET))])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


@pytest.mark.parametrize("how", ["toolset", "capability"])
def test_a_guarded_tool_hidden_by_prepare_for_a_step_is_not_an_error(desk: Desk, how: str) -> None:
    """prepare hides open_ticket at the first step: the run goes on, and the ticket is sent once."""
    calls: list[str] = []
    own = hidden_for_one_step(calls)
    with effects.run(desk.runtime(), "r1"):
        if how == "toolset":
            guarded = TetherToolset(own, kinds={"open_ticket": KINDS["open_ticket"]})
            result = agent(look_then_open(), guarded).run_sync("printer!")
        else:
            capability: TetherCapability[None] = TetherCapability(
                {"open_ticket": KINDS["open_ticket"]}
            )
            result = agent(look_then_open(), own).run_sync("printer!", capabilities=[capability])
    assert result.output == "done"
    assert calls == ["lookup_order"]  # the guarded body never ran: tether sent the ticket
    assert len(desk.tickets()) == 1


def test_a_kinds_entry_naming_no_tool_at_any_step_is_still_refused(desk: Desk) -> None:
    """A typo is told apart from a tool hidden for a step: it names nothing the toolset holds."""
    guarded = TetherToolset(hidden_for_one_step([]), kinds={"open_tikcet": ("http.post", None)})
    with effects.run(desk.runtime(), "r1"), pytest.raises(SpecError, match="open_tikcet"):
        agent(look_then_open(), guarded).run_sync("printer!")
    assert desk.tickets() == []


def test_an_approval_is_deferred_the_pydantic_ai_way_and_a_signed_one_sends_once(
    desk: Desk,
) -> None:
    """needs_approval ends the run with DeferredToolRequests; a bare yes is refused; a signed one sends."""
    gated = policy(
        **{"email.send": {"risk": "medium", "permission": "mail.send", "needs_approval": True}}
    )
    runtime = desk.runtime(policy=gated, trust=TrustRoots.of(ALICE.trust_root()))
    bot = agent(scripted("send_email", MAIL), TetherToolset(tools([]), kinds=KINDS))
    with effects.run(runtime, "r1") as run:
        waiting = bot.run_sync("tell the customer")
        requests = waiting.output
        assert isinstance(requests, DeferredToolRequests)
        (call,) = requests.approvals
        asked = requests.metadata[call.tool_call_id]["tether"]
        assert asked["run_id"] == "r1" and asked["request"]["intent_digest"]
        assert delivered(desk.maildir) == []
        history = waiting.all_messages()
        bare = DeferredToolResults(approvals={call.tool_call_id: True})
        with pytest.raises(ApprovalRequiredError):  # PydanticAI's yes is not a signed approval
            bot.run_sync(message_history=history, deferred_tool_results=bare)
        assert delivered(desk.maildir) == []
        signed = DeferredToolResults(
            approvals={call.tool_call_id: True},
            metadata={
                call.tool_call_id: {
                    APPROVAL_METADATA_KEY: signed_approval(
                        ALICE, run.session.state, datetime.now(UTC)
                    )
                }
            },
        )
        done = bot.run_sync(message_history=history, deferred_tool_results=signed)
        # The continuation run again (a crash before its caller saw it): replayed, not re-approved.
        again = bot.run_sync(message_history=history, deferred_tool_results=signed)
    assert isinstance(done.output, str) and again.output == done.output
    assert len(delivered(desk.maildir)) == 1


def test_an_unknown_outcome_raises_needs_review_and_is_never_retried(desk: Desk) -> None:
    """Plain SMTP that died after the send: the next agent run raises NeedsReviewError, no resend."""
    bot = agent(scripted("send_email", MAIL), TetherToolset(tools([]), kinds=KINDS))
    crashing = desk.runtime(blind_mail=True, crash=CrashPlan(CrashPoint.EFFECT_SENT))
    with pytest.raises(SimulatedCrash), effects.run(crashing, "r1"):
        bot.run_sync("tell the customer")
    with effects.run(desk.runtime(blind_mail=True), "r1"), pytest.raises(NeedsReviewError) as err:
        bot.run_sync("tell the customer")
    assert err.value.case_id is not None
    assert len(delivered(desk.maildir)) == 1


def test_a_call_blocked_by_another_writes_approval_is_not_deferred_as_its_own(desk: Desk) -> None:
    """After a person denies the email in PydanticAI, the next tool raises typed, naming the email."""
    gated = policy(
        **{"email.send": {"risk": "medium", "permission": "mail.send", "needs_approval": True}}
    )
    runtime = desk.runtime(policy=gated, trust=TrustRoots.of(ALICE.trust_root()))
    guarded = TetherToolset(tools([]), kinds=KINDS)
    bot = agent(scripted("send_email", MAIL), guarded)
    with effects.run(runtime, "r1"):
        waiting = bot.run_sync("tell the customer")
        assert isinstance(waiting.output, DeferredToolRequests)
        (call,) = waiting.output.approvals
        email = waiting.output.metadata[call.tool_call_id]["tether"]["action_id"]
        no = DeferredToolResults(approvals={call.tool_call_id: ToolDenied("not now")})
        bot.run_sync(message_history=waiting.all_messages(), deferred_tool_results=no)
        with pytest.raises(ApprovalRequiredError) as caught:
            agent(scripted("open_ticket", TICKET), guarded).run_sync("printer!")
    assert caught.value.action_id == email
    assert desk.tickets() == [] and delivered(desk.maildir) == []


def test_parallel_tool_calls_of_an_async_run_each_send_once(desk: Desk) -> None:
    """Two guarded calls in one model response, run concurrently by agent.run, send one each."""

    def both(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(
            parts=[
                ToolCallPart("open_ticket", dict(TICKET)),
                ToolCallPart("send_email", dict(MAIL)),
            ]
        )

    bot = agent(FunctionModel(both), TetherToolset(tools([]), kinds=KINDS))
    with effects.run(desk.runtime(), "r1"):
        first = asyncio.run(bot.run("printer, and tell the customer"))
        again = asyncio.run(bot.run("printer, and tell the customer"))
    assert len(desk.tickets()) == 1 and len(delivered(desk.maildir)) == 1
    assert sorted(map(str, tool_returns(again))) == sorted(map(str, tool_returns(first)))


def test_an_approval_with_edited_arguments_sends_neither_version(desk: Desk) -> None:
    """A signed approval of the write as asked, given with override_args, is refused typed."""
    gated = policy(
        **{"email.send": {"risk": "medium", "permission": "mail.send", "needs_approval": True}}
    )
    runtime = desk.runtime(policy=gated, trust=TrustRoots.of(ALICE.trust_root()))
    bot = agent(scripted("send_email", MAIL), TetherToolset(tools([]), kinds=KINDS))
    with effects.run(runtime, "r1") as run:
        waiting = bot.run_sync("tell the customer")
        (call,) = waiting.output.approvals
        edited = ToolApproved(override_args={**MAIL, "subject": "something else"})
        answer = DeferredToolResults(
            approvals={call.tool_call_id: edited},
            metadata={
                call.tool_call_id: {
                    APPROVAL_METADATA_KEY: signed_approval(
                        ALICE, run.session.state, datetime.now(UTC)
                    )
                }
            },
        )
        with pytest.raises(EvidenceBindingError):
            bot.run_sync(message_history=waiting.all_messages(), deferred_tool_results=answer)
        assert run.session.awaiting_approval  # the write as asked still waits, unsent
    assert delivered(desk.maildir) == []
