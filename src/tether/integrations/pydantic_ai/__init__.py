"""PydanticAI with tether's effect protocol (the ``[pydantic-ai]`` extra).

    from tether.integrations.pydantic_ai import TetherToolset

    guarded = TetherToolset(tools, kinds={"send_email": ("email.send", "to")})
    agent = Agent(model, toolsets=[guarded], output_type=[str, DeferredToolRequests])
    with tether.effects.run(runtime, "order-7"):
        agent.run_sync("tell the customer their order shipped")

A guarded tool is carried out by the adapter owning its kind, once per run:
the agent re-run after a crash gets the recorded receipt as the tool's
result, and sends nothing. See :mod:`tether.integrations.pydantic_ai._toolset`
for how approvals and reviews reach the agent.
"""

from tether.integrations.pydantic_ai._capability import TetherCapability
from tether.integrations.pydantic_ai._toolset import (
    APPROVAL_METADATA_KEY,
    Guard,
    TetherToolset,
)

__all__ = ["APPROVAL_METADATA_KEY", "Guard", "TetherCapability", "TetherToolset"]
