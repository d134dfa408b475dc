"""The agent's stdio channel of ``tether mcp``: tool calls answered past the SDK's server.

The SDK's stdio transport reads each line in a worker thread and writes
each in two more hops, and its server validates every message into models
and back. A tool call is the gateway's hot path and all its work: here
stdin and stdout are the event loop's own pipes, and a ``tools/call`` is
read as JSON, handed to the gateway, and its answer written as one line,
shaped as the SDK's server shapes it for the request's protocol era (a
2026-07-28 result says ``resultType`` and carries the server's info in its
``_meta``). Every other message (the handshake or ``server/discover``,
``tools/list``, ``ping``, a call that carries a person's answer, a call the
gateway hands back, anything the lane does not recognise) goes to the SDK's
server unchanged, which answers it as before.

As the SDK's transport does, fd 0 and fd 1 are taken over while serving
(fd 1 points at stderr), so nothing else in the process writes on the MCP
channel.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import anyio
import mcp_types as types
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage
from mcp_types import PROTOCOL_VERSION_META_KEY, SERVER_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

Answer = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any] | None]]
"""``answer(tool, arguments)``: the call's result as JSON, or ``None`` (the SDK's server
answers the request instead)."""

#: A call carrying these is a second leg of a question put to the person (2026-07-28).
_SECOND_LEG = frozenset({"inputResponses", "requestState"})


def lane_call(message: Any, *, initialized: bool) -> tuple[str, dict[str, Any], bool] | None:
    """(tool, arguments, modern) of a ``tools/call`` the lane answers, or ``None``.

    ``initialized``: a handshake-era client finished its handshake (a call of
    that era before it is the SDK's to refuse).
    """
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    if message.get("jsonrpc") != "2.0" or type(message.get("id")) not in (int, str):
        return None
    params = message.get("params")
    if not isinstance(params, dict) or _SECOND_LEG & params.keys():
        return None
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, dict | None):
        return None
    meta = params.get("_meta")
    version = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
    if version is None:
        return (name, dict(arguments or {}), False) if initialized else None
    if version in MODERN_PROTOCOL_VERSIONS:
        return name, dict(arguments or {}), True
    return None


def shaped(result: dict[str, Any], *, modern: bool, server_info: dict[str, Any]) -> dict[str, Any]:
    """``result`` as the SDK's server sends it in the request's era."""
    doc = dict(result)
    if not modern:
        doc.pop("resultType", None)
        return doc
    if doc.get("resultType") is None:
        doc["resultType"] = "complete"
    meta = dict(doc.get("_meta") or {})
    meta.setdefault(SERVER_INFO_META_KEY, server_info)
    doc["_meta"] = meta
    return doc


def _line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _claim(fd: int, replacement: int) -> int:
    """A private duplicate of ``fd``, with ``fd`` itself pointed at ``replacement``."""
    private = os.dup(fd)
    os.set_inheritable(private, False)
    os.dup2(replacement, fd)
    return private


class AgentChannel:
    """stdin and stdout of the gateway, with its tool-call lane (module docstring)."""

    def __init__(self, answer: Answer, server_info: dict[str, Any]) -> None:
        self._answer = answer
        self._server_info = server_info
        self._initialized = False
        self._out: asyncio.StreamWriter | None = None
        self._in: asyncio.StreamReader | None = None
        self._reading: asyncio.ReadTransport | None = None
        self._ending = False  # a SIGTERM came

    @contextmanager
    def ended_by_sigterm(self) -> Iterator[None]:
        """While inside, SIGTERM ends the agent's side as its EOF does (:meth:`end`); where
        the loop takes no signal handler, SIGTERM ends the process as before."""
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGTERM, self._terminated, loop)
        except (NotImplementedError, RuntimeError, ValueError):
            yield
            return
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    def _terminated(self, loop: asyncio.AbstractEventLoop) -> None:
        """SIGTERM: the first ends the agent's side (:meth:`end`); a second ends the process.

        The calls under way may not end (an upstream that hangs, up to the
        call timeout): a second SIGTERM then does what SIGTERM did before, at
        once. A write sent and not recorded is left dispatched, for its key or
        a person to settle, as any crash leaves it.
        """
        if self._ending:
            loop.remove_signal_handler(signal.SIGTERM)  # the default action again
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self._ending = True
        self.end()

    def end(self) -> None:
        """End the agent's side as its EOF would (the calls under way are still answered)."""
        if self._in is not None and not self._in.at_eof():
            if self._reading is not None:
                self._reading.pause_reading()  # nothing more is fed after the end
            self._in.feed_eof()

    @asynccontextmanager
    async def streams(self) -> AsyncIterator[tuple[Any, Any]]:
        """The read and write streams the SDK's server runs on, the lane serving beside them.

        Raises ``ValueError`` (before taking anything over) where stdin or
        stdout is not a pipe, socket or terminal the event loop can watch.
        """
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**26)
        devnull = os.open(os.devnull, os.O_RDONLY)
        private_in = _claim(0, devnull)
        private_out = _claim(1, 2)
        os.close(devnull)
        in_file = os.fdopen(private_in, "rb", buffering=0)
        out_file = os.fdopen(private_out, "wb", buffering=0)
        try:
            self._reading, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), in_file
            )
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, out_file
            )
            self._out = asyncio.StreamWriter(transport, protocol, None, loop)
            self._in = reader
            to_server, server_in = create_context_streams[SessionMessage | Exception](0)
            server_out, from_server = create_context_streams[SessionMessage](0)
            async with anyio.create_task_group() as group:
                group.start_soon(self._read, reader, to_server)
                group.start_soon(self._relay, from_server)
                try:
                    yield server_in, server_out
                finally:
                    group.cancel_scope.cancel()
        finally:
            self._out = self._in = self._reading = None
            with suppress(OSError):
                os.dup2(private_in, 0)
            with suppress(OSError):
                os.dup2(private_out, 1)
            in_file.close()
            out_file.close()

    async def _read(self, reader: asyncio.StreamReader, to_server: Any) -> None:
        async with to_server, anyio.create_task_group() as calls:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, OSError) as exc:  # a line past the limit, a broken pipe
                    await to_server.send(exc)
                    break
                if not line:
                    break  # EOF: the calls under way are answered, then the server ends
                try:
                    message = json.loads(line)
                except ValueError:
                    message = None
                found = lane_call(message, initialized=self._initialized)
                if found is not None:
                    calls.start_soon(self._call, to_server, line, message, *found)
                    continue
                if isinstance(message, dict) and message.get("method") == (
                    "notifications/initialized"
                ):
                    self._initialized = True
                await self._to_server(to_server, line)

    async def _to_server(self, to_server: Any, line: bytes) -> None:
        try:
            parsed = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except Exception as exc:  # the server answers a malformed message, as from its transport
            await to_server.send(exc)
            return
        await to_server.send(SessionMessage(parsed))

    async def _call(
        self,
        to_server: Any,
        line: bytes,
        message: dict[str, Any],
        name: str,
        arguments: dict[str, Any],
        modern: bool,
    ) -> None:
        try:
            result = await self._answer(name, arguments)
        except Exception as exc:  # what the SDK's server answers a handler that raised
            error = {"code": types.INTERNAL_ERROR, "message": str(exc)}
            await self._write({"jsonrpc": "2.0", "id": message["id"], "error": error})
            return
        if result is None:  # the SDK's server answers it (a question for the person)
            await self._to_server(to_server, line)
            return
        body = shaped(result, modern=modern, server_info=self._server_info)
        await self._write({"jsonrpc": "2.0", "id": message["id"], "result": body})

    async def _relay(self, from_server: Any) -> None:
        async with from_server:
            async for sent in from_server:
                data = sent.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                await self._send(data.encode())

    async def _write(self, message: dict[str, Any]) -> None:
        await self._send(_line(message))

    async def _send(self, data: bytes) -> None:
        out = self._out
        if out is None:
            return
        try:
            out.write(data)
            await out.drain()
        except (ConnectionError, OSError) as exc:  # the agent went away: nothing to tell
            print(f"tether mcp: the agent's channel closed ({exc})", file=sys.stderr, flush=True)
