"""Tool calls to a stdio upstream sent past the SDK's client session: the gateway's hot path.

The SDK's client session turns each ``tools/call`` into models, a request
context, a result model and a JSON Schema check of the structured output
(the agent's own client checks that again). The gateway only forwards: it
needs the answer as JSON. So the connection to a stdio upstream is the
SDK's own transport (its process handling, its shutdown) with this lane
spliced between the transport and the session: a ``tools/call`` the
gateway sends goes onto the transport's write stream directly, under an id
of its own (``tether-N``, which the session never uses), and the answer
with that id is taken off the read stream before the session sees it.
Everything else (the handshake or discover, ``tools/list``, ``ping``,
whatever the upstream sends unasked) passes through to the session as
before.

A request of the 2026-07-28 era carries the connection's envelope in its
``_meta`` (protocol version, client info, capabilities): the lane copies
the one the session last sent, so its requests read as the session's would.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared._stream_protocols import WriteStream
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

#: The prefix of the envelope's keys in a request's ``_meta`` (2026-07-28), and of the keys
#: the SDK stamps on a result per connection: neither is part of a tool's answer.
ENVELOPE_PREFIX = "io.modelcontextprotocol/"


def answer_document(result: dict[str, Any]) -> dict[str, Any]:
    """A tool's answer as JSON, without what the connection stamped on it (its result type,
    the server's info in ``_meta``)."""
    doc = dict(result)
    doc.pop("resultType", None)
    meta = doc.get("_meta")
    if isinstance(meta, dict):
        kept = {k: v for k, v in meta.items() if not k.startswith(ENVELOPE_PREFIX)}
        if kept:
            doc["_meta"] = kept
        else:
            doc.pop("_meta")
    return doc


class Lane:
    """The gateway's own requests on one connection, and their answers (module docstring)."""

    def __init__(self, send: WriteStream[SessionMessage]) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._envelope: dict[str, Any] = {}
        self._closed = False

    def noted(self, message: SessionMessage) -> None:
        """Keep the envelope of a request the session sends (the lane's requests carry it)."""
        sent = message.message
        if isinstance(sent, types.JSONRPCRequest) and isinstance(sent.params, dict):
            meta = sent.params.get("_meta")
            if isinstance(meta, dict):
                self._envelope = {k: v for k, v in meta.items() if k.startswith(ENVELOPE_PREFIX)}

    def taken(self, message: SessionMessage | Exception) -> bool:
        """Whether ``message`` answers one of the lane's requests (it is then the lane's)."""
        if not isinstance(message, SessionMessage):
            return False
        got = message.message
        if not isinstance(got, types.JSONRPCResponse | types.JSONRPCError):
            return False
        key = got.id if isinstance(got.id, str) else None
        waiting = None if key is None else self._pending.pop(key, None)
        if waiting is None:
            return False
        if not waiting.done():
            if isinstance(got, types.JSONRPCError):
                waiting.set_exception(MCPError(got.error.code, got.error.message))
            else:
                waiting.set_result(got.result)
        return True

    def close(self) -> None:
        """The connection ended: every request still waiting has lost its answer."""
        self._closed = True
        pending, self._pending = self._pending, {}
        for waiting in pending.values():
            if not waiting.done():
                waiting.set_exception(
                    MCPError(types.CONNECTION_CLOSED, "the upstream's connection closed")
                )

    async def call(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None, timeout_s: float
    ) -> dict[str, Any]:
        """Send ``tools/call`` and wait for its result (JSON), or raise ``MCPError`` as the SDK
        would: the upstream's error answer, or a closed connection or a timeout (local codes)."""
        if self._closed:
            raise MCPError(types.CONNECTION_CLOSED, "the upstream's connection closed")
        key = f"tether-{next(self._ids)}"
        envelope = self._envelope | (meta or {})
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if envelope:
            params["_meta"] = envelope
        waiting: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[key] = waiting
        try:
            request = types.JSONRPCRequest(
                jsonrpc="2.0", id=key, method="tools/call", params=params
            )
            try:
                await self._send.send(SessionMessage(request))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
                raise MCPError(types.CONNECTION_CLOSED, "the upstream's connection closed") from exc
            try:
                with anyio.fail_after(timeout_s):
                    return await waiting
            except TimeoutError:
                raise MCPError(types.REQUEST_TIMEOUT, f"no answer in {timeout_s:g} s") from None
        finally:
            self._pending.pop(key, None)


@asynccontextmanager
async def laned_stdio(
    target: StdioServerParameters, found: list[Lane]
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """The SDK's stdio transport to ``target`` with a :class:`Lane` spliced in (appended to
    ``found``); yields the streams the SDK's client session reads and writes."""
    async with stdio_client(target) as (wire_in, wire_out):
        lane = Lane(wire_out)
        found.append(lane)
        to_session, session_in = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        session_out, from_session = anyio.create_memory_object_stream[SessionMessage](0)

        async def down() -> None:
            try:
                async with to_session:
                    async for message in wire_in:
                        if not lane.taken(message):
                            await to_session.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the session is gone
            finally:
                lane.close()

        async def up() -> None:
            try:
                async with from_session:
                    async for message in from_session:
                        lane.noted(message)
                        await wire_out.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the transport is gone: the session sees its read stream end

        async with anyio.create_task_group() as group:
            group.start_soon(down)
            group.start_soon(up)
            try:
                yield session_in, session_out
            finally:
                lane.close()
                group.cancel_scope.cancel()
