"""A real PydanticAI agent (an offline FunctionModel) whose MCP server is `tether mcp`.

The agent reaches the upstream's tools through PydanticAI's own MCP client
(``MCPToolset`` over stdio), exactly as it would any MCP server. Killed
with SIGKILL the moment its model saw the tool's return, and run again with
the same configuration, it asks for the same call: through the gateway the
upstream holds one row; straight to the upstream (the control), two.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")
pytest.importorskip("fastmcp", reason="needs pydantic-ai-slim[mcp] (the dev extra)")

from tests.integration._mcp_agent import run_agent
from tests.integration._mcp_kit import ROOT, Setup, child_env
from tether.crypto import Keyring

pytestmark = pytest.mark.slow


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    Keyring.generate("k1").write_file(tmp_path / "keyring.json")
    return Setup(tmp_path)


def killed_agent(setup: Setup, through: str, text: str) -> int:
    """Run the agent in its own process; it is SIGKILLed right after the tool returned."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration._mcp_agent", str(setup.base), through, text],
        env=child_env(),
        cwd=str(ROOT),
        timeout=120,
        check=False,
    )
    return done.returncode


@pytest.mark.parametrize(("through", "rows"), [("gateway", 1), ("direct", 2)])
def test_an_agent_killed_after_the_tool_returned_and_run_again(
    setup: Setup, through: str, rows: int
) -> None:
    """Through the gateway the re-run agent gets the recorded answer (1 row); straight to the upstream, 2."""
    code = killed_agent(setup, through, "buy milk")
    assert code == -signal.SIGKILL
    assert setup.rows() == 1
    output = anyio.run(lambda: run_agent(setup, "buy milk", through=through))
    assert setup.rows() == rows
    if through == "gateway":
        assert json.loads(output) == {"id": 1, "text": "buy milk"}
