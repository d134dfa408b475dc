"""A PydanticAI agent on PydanticAI's offline FunctionModel whose tools open tickets and send mail.

The model is scripted: asked anything, it calls one tool with fixed
arguments; given the tool's return, it answers with that return as text. So
the agent run is deterministic, and running the agent again (a resumed run,
or a fresh process after a crash) asks for the same effect again, as a real
model re-reading the same conversation would.

It is also the child of the SIGKILL trial (``python -m tests.integration._pydantic_ai_kit
zygote``): a process that imports PydanticAI and tether once and then forks one
real child process per trial phase on request, so twenty trials do not pay
twenty-times-two interpreter starts. A forked child is a process of its own:
killed with SIGKILL, nothing of it survives but what it made durable.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.toolsets import FunctionToolset

from tests.conftest import make_policy, make_task
from tests.integration._zygote import serve
from tether import effects
from tether.adapters import REFERENCE_PROFILE, Adapter, HttpEffect
from tether.core import Policy, TaskSpec
from tether.crypto import Keyring
from tether.integrations.pydantic_ai import Guard, TetherToolset
from tether.runtime import CrashPlan, CrashPoint, Runtime
from tether.store import open_store

CUSTOMER = "customer@example.com"
RULES = {
    "http.post": {"risk": "low", "permission": "service.write", "needs_approval": False},
    "email.send": {"risk": "medium", "permission": "mail.send", "needs_approval": False},
}
# open_ticket's parameters are the ticket; HttpEffect takes {"json": ticket} for "tickets".
OPEN_TICKET = Guard("http.post", call=lambda args: ("tickets", {"json": args}))
KINDS: dict[str, Any] = {"open_ticket": OPEN_TICKET, "send_email": ("email.send", "to")}


def scripted(tool: str, args: dict[str, Any]) -> FunctionModel:
    """A model that calls ``tool`` with ``args`` once, then answers with what the tool returned."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart):
                return ModelResponse(parts=[TextPart(json.dumps(part.content, sort_keys=True))])
        return ModelResponse(parts=[ToolCallPart(tool, dict(args))])

    return FunctionModel(respond)


def tools(calls: list[str], url: str = "") -> FunctionToolset[None]:
    """The agent's own tools; ``calls`` records every body that really ran.

    ``open_ticket`` and ``send_email`` are the mutating ones (their bodies stand
    for what an unguarded agent would do); ``lookup_order`` is read-only.
    ``post_ticket`` is the control's unguarded write: a real POST under a fresh
    key each time it runs, as a tool that knows nothing of earlier attempts.
    """
    toolset: FunctionToolset[None] = FunctionToolset()

    @toolset.tool_plain
    def open_ticket(title: str, detail: str) -> str:
        """Open a support ticket."""
        calls.append("open_ticket")
        return "opened (unguarded)"

    @toolset.tool_plain
    def send_email(to: str, subject: str, body: str) -> str:
        """Email a customer."""
        calls.append("send_email")
        return "sent (unguarded)"

    @toolset.tool_plain
    def lookup_order(order_id: str) -> dict[str, str]:
        """Read an order's status."""
        calls.append("lookup_order")
        return {"order_id": order_id, "status": "shipped"}

    @toolset.tool_plain
    def post_ticket(title: str, detail: str) -> str:
        """Open a ticket with a plain POST (the control: no tether)."""
        calls.append("post_ticket")
        headers = {"Idempotency-Key": f'"plain-{uuid.uuid4().hex}"'}
        body = {"title": title, "detail": detail}
        answer = httpx.post(f"{url}/tickets", json=body, headers=headers, timeout=10)
        answer.raise_for_status()
        if os.environ.get(ARMED) == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        return answer.text

    return toolset


def agent(model: FunctionModel, toolset: Any) -> Agent[None, str | DeferredToolRequests]:
    """An agent over ``toolset`` that can end waiting for a person (deferred tool requests)."""
    return Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])


def task(adapter: Adapter, kinds: tuple[str, ...] = ("http.post", "email.send")) -> TaskSpec:
    """A task allowing the ticket and the customer's mail, from ``adapter``'s environment."""
    return make_task(
        adapter.environment().state_fingerprint,
        allowed_kinds=list(kinds),
        allowed_paths=["tickets", CUSTOMER],
        permissions=["service.write", "mail.send"],
        initial_environment={"namespace": adapter.namespace},
    )


def policy(**rules: Any) -> Policy:
    return make_policy(kinds={**RULES, **rules})


# -- the SIGKILL trial's child --------------------------------------------------------------

ARMED = "TETHER_PAI_ARMED"


def phase(request: dict[str, Any]) -> None:
    """One process of a trial: run the agent in the tether run; armed, die right after the send."""
    title = request["title"]
    armed = request["armed"]
    calls: list[str] = []
    if request["guarded"]:
        base = Path(request["base"])
        http = HttpEffect(request["url"], profile=REFERENCE_PROFILE, timeout_s=10)
        keyring = Keyring.from_file(base / "keyring.json")
        with open_store(request["store"]) as store:
            runtime = Runtime(
                store=store,
                keyring=keyring,
                adapter=http,
                task=task(http, ("http.post",)),
                policy=policy(),
                agent=None,
                crash=CrashPlan(CrashPoint.EFFECT_SENT, mode="kill") if armed else CrashPlan(),
                worker=f"pid-{os.getpid()}",
            )
            guarded = TetherToolset(tools(calls), kinds=KINDS)
            model = scripted("open_ticket", {"title": title, "detail": "paper jam"})
            with effects.run(runtime, request["run_id"]):
                result = agent(model, guarded).run_sync("open a ticket for the printer")
        http.close()
    else:
        os.environ[ARMED] = "1" if armed else "0"
        model = scripted("post_ticket", {"title": title, "detail": "paper jam"})
        result = agent(model, tools(calls, request["url"])).run_sync("open a ticket")
    if armed:
        raise SystemExit("the armed child was not killed")
    Path(request["answer"]).write_text(str(result.output))  # what the model was told


def child(request: dict[str, Any]) -> int:
    """One phase of a trial, in a process ``_zygote.serve`` forked after the imports."""
    phase(request)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["zygote"]:
        raise SystemExit("usage: python -m tests.integration._pydantic_ai_kit zygote")
    serve(child)
