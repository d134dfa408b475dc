"""Tool calls to a stdio upstream sent past the SDK's client session: the gateway's hot path.

The SDK's client session turns each ``tools/call`` into models, a request
context, a result model and a JSON Schema check of the structured output
(the agent's own client checks that again), and its stdio transport
decodes, validates and hands on every line through streams of its own. The
gateway only forwards: it needs the answer as JSON. So the child's pipes
are read and written here, line by line, started and stopped as the SDK
does: a ``tools/call`` the gateway sends is written as one JSON line under
an id of its own (``tether-N``, which the session never uses), and the
line answering that id is taken before the session sees it. Every other
line (the handshake or discover, ``tools/list``, ``ping``, whatever the
upstream sends unasked) is validated and handed to the SDK's session as its
own transport would.

A request of the 2026-07-28 era carries the connection's envelope in its
``_meta`` (protocol version, client info, capabilities): the lane copies
the one the session last sent, so its requests read as the session's would.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import StdioServerParameters

# The SDK's own process handling for a stdio server (its spawn in a new session, and the
# spec's shutdown: stdin closed, a grace period, the process tree stopped): the lane reads
# and writes the child's pipes itself, and starts and stops it exactly as the SDK does.
from mcp.client.stdio import (
    _create_platform_compatible_process,
    _get_executable_command,
    _stop_server_process,
    get_default_environment,
)
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

    def __init__(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        self._write = write
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

    def taken(self, line: bytes) -> bool:
        """Whether ``line`` answers one of the lane's requests (it is then the lane's)."""
        if not self._pending or b'"tether-' not in line:
            return False
        try:
            got = json.loads(line)
        except ValueError:
            return False
        key = got.get("id") if isinstance(got, dict) else None
        waiting = self._pending.pop(key, None) if isinstance(key, str) else None
        if waiting is None:
            return False
        if not waiting.done():
            result, error = got.get("result"), got.get("error")
            if isinstance(error, dict):
                code = error.get("code")
                waiting.set_exception(
                    MCPError(
                        code if isinstance(code, int) else types.INTERNAL_ERROR,
                        str(error.get("message", "")),
                    )
                )
            elif isinstance(result, dict):
                waiting.set_result(result)
            else:
                waiting.set_exception(
                    MCPError(types.INTERNAL_ERROR, "the answer holds neither a result nor an error")
                )
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
        request = {"jsonrpc": "2.0", "id": key, "method": "tools/call", "params": params}
        line = (json.dumps(request, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        waiting: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[key] = waiting
        try:
            try:
                await self._write(line)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
                raise MCPError(types.CONNECTION_CLOSED, "the upstream's connection closed") from exc
            try:
                with anyio.fail_after(timeout_s):
                    return await waiting
            except TimeoutError:
                raise MCPError(types.REQUEST_TIMEOUT, f"no answer in {timeout_s:g} s") from None
        finally:
            self._pending.pop(key, None)


def _errlog() -> TextIO:
    """Where the upstream's stderr goes: the gateway's own stderr, as a file with a descriptor.

    (A test's captured ``sys.stderr`` has none; the process's original one does,
    which is what the SDK's own ``stdio_client`` binds by default.)
    """
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
    return sys.stderr


@asynccontextmanager
async def laned_stdio(
    target: StdioServerParameters, found: list[Lane]
) -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """The child ``target`` started, its pipes read and written here with a :class:`Lane`
    (appended to ``found``); yields the streams the SDK's client session reads and writes."""
    command = await _get_executable_command(target.command)
    process = await _create_platform_compatible_process(
        command=command,
        args=target.args,
        env=get_default_environment() | (target.env or {}),
        errlog=_errlog(),
        cwd=target.cwd,
    )
    stdin, stdout = process.stdin, process.stdout
    if stdin is None or stdout is None:  # pragma: no cover - spawned with pipes
        raise OSError("the upstream was started without pipes")
    writing = anyio.Lock()

    async def write(data: bytes) -> None:
        async with writing:  # one line at a time on the pipe, whoever writes it
            await stdin.send(data)

    lane = Lane(write)
    found.append(lane)
    to_session, session_in = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    session_out, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    stopping = False

    async def down() -> None:
        buffer = b""
        try:
            async with to_session:
                while True:
                    try:
                        chunk = await stdout.receive()
                    except (anyio.EndOfStream, anyio.ClosedResourceError, OSError):
                        return
                    lines = (buffer + chunk).split(b"\n")
                    buffer = lines.pop()
                    for line in lines:
                        if stopping or not line.strip() or lane.taken(line):
                            continue
                        try:
                            parsed = types.jsonrpc_message_adapter.validate_json(
                                line, by_name=False
                            )
                        except ValueError as exc:  # the session surfaces it, as the SDK's would
                            await to_session.send(exc)
                            continue
                        await to_session.send(SessionMessage(parsed))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the session is gone
        finally:
            lane.close()

    async def up() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    lane.noted(message)
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await write((text + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The child's stdin is gone: the session sees its read stream end.
            await to_session.aclose()

    async with anyio.create_task_group() as group:
        group.start_soon(down)
        group.start_soon(up)
        try:
            yield session_in, session_out
        finally:
            stopping = True  # what the child still says is drained, not delivered
            lane.close()
            with anyio.CancelScope(shield=True):
                await _stop_server_process(process)
            group.cancel_scope.cancel()
