"""Which tool calls the gateway's stdio lanes carry themselves, and how their answers are shaped."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")

from tether.integrations.mcp._stdio import lane_call, shaped
from tether.integrations.mcp._wire import answer_document

MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}


def call(params: Any, **extra: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params} | extra


@pytest.mark.parametrize(
    ("message", "initialized", "expected"),
    [
        (call({"name": "t", "arguments": {"a": 1}}), True, ("t", {"a": 1}, False)),
        (call({"name": "t"}), True, ("t", {}, False)),
        (call({"name": "t", "arguments": None}), True, ("t", {}, False)),
        # A handshake-era call before the handshake ended is the SDK's to refuse.
        (call({"name": "t", "arguments": {}}), False, None),
        (call({"name": "t", "arguments": {}, "_meta": MODERN}), False, ("t", {}, True)),
        # A version the lane does not know: the SDK's server answers it.
        (
            call({"name": "t", "_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}}),
            True,
            None,
        ),
        # The second leg of a question put to the person goes to the SDK's server.
        (call({"name": "t", "requestState": "x", "_meta": MODERN}), True, None),
        (call({"name": "t", "inputResponses": {}, "_meta": MODERN}), True, None),
        (call({"name": 3}), True, None),
        (call({"name": "t", "arguments": [1]}), True, None),
        (call({"name": "t"}, id=True), True, None),
        (call({"name": "t"}, id=None), True, None),
        (call({"name": "t"}, jsonrpc="1.0"), True, None),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, True, None),
        ({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "t"}}, True, None),
        (None, True, None),
        ([call({"name": "t"})], True, None),
    ],
)
def test_the_lane_takes_only_well_formed_tool_calls_of_an_era_it_knows(
    message: Any, initialized: bool, expected: Any
) -> None:
    """A tools/call request well formed, of a known era (and past the handshake), is the lane's; anything else goes to the SDK's server."""
    assert lane_call(message, initialized=initialized) == expected


def test_an_answer_is_shaped_as_the_sdk_server_shapes_it_per_era() -> None:
    """A 2026-07-28 answer says its result type and the server's info; a handshake-era one neither."""
    info = {"name": "tether", "version": "1"}
    result = {"content": [], "_meta": {"tether/call": {"run_id": "r"}}, "resultType": "complete"}
    assert shaped(result, modern=False, server_info=info) == {
        "content": [],
        "_meta": {"tether/call": {"run_id": "r"}},
    }
    modern = shaped({"content": []}, modern=True, server_info=info)
    assert modern == {
        "content": [],
        "resultType": "complete",
        "_meta": {"io.modelcontextprotocol/serverInfo": info},
    }


def test_the_upstreams_answer_loses_only_what_its_connection_stamped() -> None:
    """The result type and the io.modelcontextprotocol/ keys of _meta are dropped; the rest is kept as sent."""
    raw = {
        "content": [{"type": "text", "text": "1"}],
        "resultType": "complete",
        "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "u"}, "mine": 1},
    }
    assert answer_document(raw) == {
        "content": [{"type": "text", "text": "1"}],
        "_meta": {"mine": 1},
    }
    assert answer_document({"content": [], "_meta": {"io.modelcontextprotocol/x": 1}}) == {
        "content": []
    }
