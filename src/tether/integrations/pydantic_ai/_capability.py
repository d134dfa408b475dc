"""TetherCapability: the same guard for every toolset of an agent, as a PydanticAI capability."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import AbstractToolset

from tether.integrations.pydantic_ai._toolset import GuardSpec, TetherToolset


@dataclass
class TetherCapability(AbstractCapability[AgentDepsT]):
    """Wraps the agent's assembled toolset in a :class:`TetherToolset` with ``kinds``, each run.

        agent = Agent(model, tools=[send_email, lookup],
                      capabilities=[TetherCapability({"send_email": ("email.send", "to")})])

    Use it when the mutating tools come from several toolsets (the agent's
    own ``tools=``, MCP servers...); output tools are not wrapped.
    """

    kinds: Mapping[str, GuardSpec] = field(default_factory=dict)

    def get_wrapper_toolset(
        self, toolset: AbstractToolset[AgentDepsT]
    ) -> AbstractToolset[AgentDepsT]:
        return TetherToolset(toolset, kinds=self.kinds)
