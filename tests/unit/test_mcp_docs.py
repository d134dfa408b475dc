"""The MCP gateway's docs page: every JSON block on it is what the gateway accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")

from mcp.types import Tool

from tether.cli import build_parser
from tether.core import EnvironmentState
from tether.integrations.mcp import GatewayPolicy, key_declaration, run_rules

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "mcp.md"


def blocks() -> list[Any]:
    """The ```json blocks of the page "Any MCP server", parsed."""
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)```", PAGE.read_text(), re.DOTALL)]


def test_the_client_configuration_starts_the_gateway_in_front_of_the_server() -> None:
    """The mcpServers entry a user pastes is a `tether mcp` command line the CLI accepts."""
    config = next(b for b in blocks() if "mcpServers" in b)
    (server,) = config["mcpServers"].values()
    assert server["command"] == "tether"
    args = build_parser().parse_args(server["args"])
    assert args.command[-3:] == ["npx", "-y", "@acme/issues-mcp"]
    assert args.run == "issues-agent" and args.store.startswith("sqlite:///")
    assert args.policy.name == "issues-policy.json"


def test_the_policy_file_on_the_page_derives_a_run() -> None:
    """The page's policy file parses strictly and gates what it says it gates."""
    policy = GatewayPolicy.from_json(next(b for b in blocks() if "reads" in b))
    tools = ["search_issues", "get_issue", "delete_repo", "send_email", "create_issue"]
    env = EnvironmentState("mcp", "issues", 0, "sha256:" + "0" * 64)
    rules = run_rules(policy, tools, env, "mcp:issues").policy.kinds
    assert [n for n, r in rules.items() if r.needs_approval] == ["delete_repo"]
    assert rules["send_email"].sensitive
    assert policy.rule("create_issue").errors_are_refusals


def test_the_key_declaration_on_the_page_is_the_one_the_gateway_reads() -> None:
    """A tool listed as the page shows accepts a key remembered for a day."""
    listing = next(b for b in blocks() if b.get("name") == "charge")
    assert key_declaration(Tool.model_validate(listing)) == (True, 86400.0)
