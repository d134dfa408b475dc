"""A PydanticAI agent whose only tools are an MCP server's: the gateway, or the upstream itself.

The model is PydanticAI's offline ``FunctionModel``, scripted: asked
anything, it calls ``add_note`` with a fixed text; handed the tool's return,
it answers with that return. Run again after a crash, it asks for the same
call again, as a real model re-reading the same conversation would.

``python -m tests.integration._mcp_agent BASE gateway|direct TEXT`` runs
the agent in a process of its own that SIGKILLs itself the moment the
model sees the tool's return (the agent killed right after the tool
returned).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.integration._mcp_kit import Setup


def scripted(text: str, *, die_on_return: bool = False) -> FunctionModel:
    """A model that calls ``add_note(text)`` once, then answers with what the tool returned."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart):
                if die_on_return:
                    os.kill(os.getpid(), signal.SIGKILL)
                return ModelResponse(parts=[TextPart(json.dumps(part.content, sort_keys=True))])
        return ModelResponse(parts=[ToolCallPart("add_note", {"text": text})])

    return FunctionModel(respond)


def toolset(setup: Setup, *, through: str) -> MCPToolset[None]:
    """The MCP server the agent uses: ``gateway`` (`tether mcp`) or ``direct`` (the upstream)."""
    from fastmcp.client.transports import StdioTransport

    server = setup.gateway() if through == "gateway" else setup.direct()
    transport = StdioTransport(
        command=server.command,
        args=list(server.args),
        env=dict(server.env or {}),
        cwd=str(server.cwd),
        keep_alive=False,
    )
    # PydanticAI waits 5 s for the handshake by default; the gateway answers it once its
    # upstream is started and its run opened (after a killed gateway's lease ran out), which
    # takes longer than that on a loaded machine.
    return MCPToolset(transport, tool_error_behavior="error", init_timeout=60)


async def run_agent(setup: Setup, text: str, *, through: str, die_on_return: bool = False) -> Any:
    """One agent run over the MCP server; its output (the tool's return, as text)."""
    agent = Agent(
        scripted(text, die_on_return=die_on_return), toolsets=[toolset(setup, through=through)]
    )
    async with agent:
        result = await agent.run("note it down")
    return result.output


if __name__ == "__main__":
    base, through, text = sys.argv[1:4]
    anyio.run(lambda: run_agent(Setup(Path(base)), text, through=through, die_on_return=True))
