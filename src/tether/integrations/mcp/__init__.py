"""An MCP gateway: any agent's tools, guarded (the ``[mcp]`` extra).

``tether mcp --store URL --run RUN [--policy FILE] -- COMMAND...`` (or
``--upstream URL``) serves, over stdio, the tools of an upstream MCP server
unchanged, and carries each call through a tether run that outlives the
agent: reads the policy names pass through, traced; every other tool is an
effect, forwarded once under a key persisted first, its answer recorded,
and never forwarded again for the same tool and arguments in the run. See
:mod:`tether.integrations.mcp._gateway` for what the agent is told when a
person must act, :mod:`tether.integrations.mcp._policy` for the policy
file, and :mod:`tether.integrations.mcp._tools` for how an upstream
declares that a tool accepts an idempotency key.
"""

from tether.integrations.mcp._answers import CALL_META
from tether.integrations.mcp._gateway import Gateway, GatewayConfig, shown_store
from tether.integrations.mcp._policy import (
    GatewayPolicy,
    RunRules,
    ToolRule,
    kind_of,
    run_rules,
    tool_of,
)
from tether.integrations.mcp._tools import (
    IDEMPOTENCY_KEY_META,
    UpstreamTools,
    forwarding_effect,
    key_declaration,
    result_document,
)
from tether.integrations.mcp._upstream import (
    Upstream,
    UpstreamDownError,
    UpstreamError,
    UpstreamLostError,
    UpstreamRefusedError,
    expanded_header,
    stdio_target,
)

__all__ = [
    "CALL_META",
    "IDEMPOTENCY_KEY_META",
    "Gateway",
    "GatewayConfig",
    "GatewayPolicy",
    "RunRules",
    "ToolRule",
    "Upstream",
    "UpstreamDownError",
    "UpstreamError",
    "UpstreamLostError",
    "UpstreamRefusedError",
    "UpstreamTools",
    "expanded_header",
    "forwarding_effect",
    "key_declaration",
    "kind_of",
    "result_document",
    "run_rules",
    "shown_store",
    "stdio_target",
    "tool_of",
]
