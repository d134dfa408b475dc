"""The gateway's one connection to the upstream MCP server, kept open and opened again.

The upstream is a command the gateway starts as its child (stdio) or a URL
(streamable HTTP). The connection is held by a task of its own (the SDK's
client is a context manager that must be left in the task that entered
it); a call that finds it broken marks it so, and the next call opens a new
one (a stdio upstream that died is started again).

What a call's failure means for the effect is said here, once, as the type
raised: :class:`UpstreamRefusedError` (the upstream answered with a
protocol error that refuses the request before any tool ran: an unknown
tool, invalid parameters), :class:`UpstreamDownError` (no connection could
be made: nothing was sent), :class:`UpstreamLostError` (the request may
have reached the upstream and its answer did not come back: the outcome is
unknown).
"""

from __future__ import annotations

import json
import os
import string
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx2
import mcp_types as types
from anyio.abc import TaskGroup
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tether.core import TetherError
from tether.integrations.mcp._wire import Lane, answer_document, laned_stdio

#: JSON-RPC errors with which a server refuses a request it did not carry out.
REFUSING_CODES = frozenset({types.METHOD_NOT_FOUND, types.INVALID_PARAMS})
#: tether's own environment variables (keys, tokens): never given to a stdio upstream.
TETHER_PREFIX = "TETHER_"
#: What the SDK raises itself when the transport failed (no answer came from the server).
LOCAL_FAILURE_CODES = frozenset({types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT})
#: The most pages of tools one listing may take (a paginator that never ends).
MAX_PAGES = 100
#: An effect sent on a connection idle this long is preceded by a ping (:meth:`Upstream.ready`):
#: an upstream that died between calls is found before the call is sent, not by an unknown
#: outcome after.
PING_AFTER_IDLE_S = 1.0


class UpstreamError(TetherError):
    """The upstream MCP server could not be reached, or did not answer a call."""


class UpstreamDownError(UpstreamError):
    """No connection to the upstream could be opened: nothing was sent."""


class UpstreamLostError(UpstreamError):
    """A call was sent, or may have been, and its answer was lost: the outcome is unknown."""


class UpstreamRefusedError(UpstreamError):
    """The upstream refused the request with a protocol error before any tool ran."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"the upstream refused the call (error {code}): {message}")
        self.code = code


def stdio_target(
    argv: Sequence[str], cwd: str | None = None, passed: Sequence[str] = ()
) -> StdioServerParameters:
    """The upstream started as a child: ``argv`` with the gateway's environment, less tether's.

    The SDK passes a child only a few variables by default; an upstream
    configured in a desktop client reads its API keys from the environment
    the client gave the gateway, so that is passed on, all of it but
    tether's own variables (``TETHER_*``: the keyring sealing the run's
    checkpoints, the secret keys, the operator page's token, ...): what
    guards the run never reaches the server it guards. ``passed`` names
    ``TETHER_*`` variables the person lets through (``--pass-env``).
    """
    if not argv:
        raise UpstreamDownError("no upstream command given (after --) and no --upstream URL")
    for name in passed:
        if not name.startswith(TETHER_PREFIX):
            raise UpstreamDownError(
                f"--pass-env {name}: only tether's own variables ({TETHER_PREFIX}*) are kept "
                "from the upstream, every other one is passed already"
            )
    kept = frozenset(passed)
    env = {k: v for k, v in os.environ.items() if not k.startswith(TETHER_PREFIX) or k in kept}
    return StdioServerParameters(command=argv[0], args=list(argv[1:]), env=env, cwd=cwd)


class Upstream:
    """The connection to one upstream MCP server (see the module docstring).

    ``target`` is a :class:`~mcp.StdioServerParameters` (a child) or a
    streamable HTTP URL. ``timeout_s`` bounds one call's wait for its answer.
    """

    def __init__(
        self,
        target: StdioServerParameters | str,
        *,
        timeout_s: float = 300.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if headers and not isinstance(target, str):
            raise UpstreamDownError("headers are for an upstream reached by URL (--upstream)")
        if isinstance(target, str):
            try:
                scheme = urlsplit(target).scheme
            except ValueError:
                scheme = "?"
            if scheme not in {"http", "https"}:
                raise UpstreamDownError(
                    "the upstream URL must be http:// or https:// (streamable HTTP); this one "
                    + (f"is {scheme}://..." if scheme else "has no scheme")
                )
        self.target = target
        self.timeout_s = timeout_s
        self._headers = dict(headers or {})
        self._client: Client | None = None
        # The fast lane of the open connection to a stdio upstream (``_wire``).
        self._lane: Lane | None = None
        self._closing: anyio.Event | None = None
        self._group: TaskGroup | None = None
        self._lock = anyio.Lock()
        self._last_answer = 0.0  # anyio's clock when the connection last answered
        #: The upstream's self-description from its latest connection.
        self.server_info: types.Implementation | None = None
        self.instructions: str | None = None

    @property
    def target_identity(self) -> str:
        """What names this upstream in the run: its command line and directory, or its URL.

        A URL's user and password are left out (credentials change, the
        server does not); headers are not part of it either.
        """
        target = self.target
        if isinstance(target, str):
            try:
                parts = urlsplit(target)
            except ValueError:
                return json.dumps({"url": target})
            netloc = parts.netloc.rsplit("@", 1)[-1]
            return json.dumps({"url": urlunsplit(parts._replace(netloc=netloc))})
        command = [target.command, *target.args]
        cwd = None if target.cwd is None else str(target.cwd)
        return json.dumps({"command": command, "cwd": cwd})

    async def start(self, group: TaskGroup) -> None:
        """Open the first connection, in a task of ``group`` (which must outlive the calls).

        May be called again after :meth:`aclose`, from another event loop.
        """
        self._group = group
        self._client = None
        self._lock = anyio.Lock()  # a lock serves the loop it was first used on
        await self._connect()

    async def aclose(self) -> None:
        """Close the connection (a stdio child is asked to end, then stopped)."""
        if self._closing is not None:
            self._closing.set()
        self._client = None

    async def _connect(self) -> Client:
        async with self._lock:
            if self._client is not None:
                return self._client
            group = self._group
            if group is None:
                raise UpstreamDownError("the upstream connection was never started")
            try:
                client: Client = await group.start(self._hold)
            except Exception as exc:  # whatever the transport raised: nothing was sent
                raise UpstreamDownError(
                    f"cannot connect to the upstream MCP server: {self._failure(exc)}"
                ) from exc
            self._client = client
            self._last_answer = anyio.current_time()  # it answered the handshake just now
            return client

    def _failure(self, exc: BaseException) -> str:
        """What went wrong, in one line: the errors inside the SDK's task groups, not the groups."""
        leaves = _leaves(exc)
        said = "; ".join(dict.fromkeys(f"{type(e).__name__}: {e}" for e in leaves))
        closed = any(isinstance(e, MCPError) and e.code == types.CONNECTION_CLOSED for e in leaves)
        if closed and not isinstance(self.target, str):
            said += (
                f" (the command {self.target.command!r} exited or closed its output before it "
                "answered the MCP handshake: is it an MCP server speaking over stdio?)"
            )
        return said

    async def _hold(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Keep one connection open until it is closed or found broken."""
        closing = anyio.Event()
        held: Client | None = None
        lanes: list[Lane] = []
        try:
            transport = self._transport(lanes)
            async with Client(transport, read_timeout_seconds=self.timeout_s) as client:
                held = client
                self._lane = lanes[0] if lanes else None
                self._closing = closing
                self.server_info = client.server_info
                self.instructions = client.instructions
                task_status.started(client)
                await closing.wait()
        except Exception:
            if held is None:
                raise  # before started(): the caller's start() sees it
            # A broken connection's exit may raise; it is gone either way.
        finally:
            if held is not None and self._client is held:
                self._client = None
                self._lane = None

    def _transport(self, lanes: list[Lane]) -> Any:
        """What the SDK's client connects with: a child's pipes with the fast lane spliced in
        (appended to ``lanes``), the URL, or the URL with its headers."""
        target = self.target
        if not isinstance(target, str):
            return laned_stdio(target, lanes)
        if not self._headers:
            return target
        return _http_with_headers(target, self._headers)

    async def tools(self) -> list[types.Tool]:
        """Every tool the upstream lists (all pages), as it lists them."""
        client = await self._connect()
        found: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            try:
                page = await client.list_tools(cursor=cursor)
            except Exception as exc:
                self._broken(client)
                raise UpstreamDownError(f"the upstream did not list its tools: {exc}") from exc
            found.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return found
        raise UpstreamDownError(f"the upstream's tool listing did not end after {MAX_PAGES} pages")

    async def _client_for(self, name: str, effect: bool) -> Client:
        """The connection a call goes out on: an effect only on the one already open."""
        if not effect:
            # The open connection without the lock (it is taken only to open one).
            return self._client or await self._connect()
        if self._client is None:
            raise UpstreamDownError(
                f"{name}: the connection to the upstream was lost before the call was sent; "
                "nothing was sent"
            )
        return self._client

    def _failed(self, client: Client, name: str, exc: Exception) -> Exception:
        """What a call that failed on ``client`` means: refused (nothing done), or lost."""
        if isinstance(exc, MCPError):
            if exc.code in REFUSING_CODES:
                return UpstreamRefusedError(exc.code, exc.message)
            self._broken(client)
            return UpstreamLostError(
                f"{name}: the upstream's answer was lost (error {exc.code}: {exc.message}); "
                "it may have acted"
            )
        self._broken(client)  # the transport failed with the request in flight
        return UpstreamLostError(
            f"{name}: the connection failed during the call ({type(exc).__name__}: {exc}); "
            "the upstream may have acted"
        )

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None = None,
        *,
        effect: bool = False,
    ) -> types.CallToolResult:
        """Call ``name`` once; its result, or one of the errors of the module docstring.

        An ``effect`` is sent only on the connection :meth:`ready` checked
        before tether's protocol took the call: it never opens a connection
        of its own (a stdio upstream started) after the intent was
        dispatched, where a crash would leave an unknown outcome for
        something never sent. With no connection it is refused
        (:class:`UpstreamDownError`): nothing was sent.
        """
        client = await self._client_for(name, effect)
        try:
            result = await client.call_tool(
                name,
                arguments,
                read_timeout_seconds=self.timeout_s,
                meta=meta,  # type: ignore[arg-type]  # an open map (RequestParamsMeta)
            )
        except Exception as exc:
            raise self._failed(client, name, exc) from exc
        self._last_answer = anyio.current_time()
        return result

    async def answer(
        self,
        name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None = None,
        *,
        effect: bool = False,
    ) -> dict[str, Any]:
        """:meth:`call`, its answer as JSON (:func:`~._wire.answer_document`).

        On a stdio upstream the call takes the connection's fast lane
        (``_wire``): sent and answered as JSON, past the SDK's session. What
        a failure means is said by the same errors as :meth:`call`.
        """
        client = await self._client_for(name, effect)
        lane = self._lane if self._client is client else None
        if lane is None:  # over HTTP: the SDK's session
            return answer_document(await self._dumped(name, arguments, meta, effect=effect))
        try:
            raw = await lane.call(name, arguments, meta, self.timeout_s)
        except Exception as exc:
            raise self._failed(client, name, exc) from exc
        if not isinstance(raw.get("content"), list) or raw.get("resultType", "complete") != (
            "complete"
        ):
            # What the SDK's session would refuse as a result: the answer is not one.
            self._broken(client)
            raise UpstreamLostError(
                f"{name}: the upstream answered something that is not a tool's result "
                f"(resultType {raw.get('resultType')!r}); it may have acted"
            )
        self._last_answer = anyio.current_time()
        return answer_document(raw)

    async def _dumped(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None, *, effect: bool
    ) -> dict[str, Any]:
        result = await self.call(name, arguments, meta, effect=effect)
        doc: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return doc

    async def ready(self) -> None:
        """Make sure a live connection is open before an effect enters tether's protocol.

        A connection idle for :data:`PING_AFTER_IDLE_S` is asked whether it
        is alive; a dead one is replaced (a stdio upstream started again).
        Done before the intent is persisted, so a crash in here leaves a
        call that is simply made again. Raises :class:`UpstreamDownError`
        when no connection can be opened.
        """
        client = self._client or await self._connect()
        if anyio.current_time() - self._last_answer >= PING_AFTER_IDLE_S:
            await self._alive(client)

    async def _alive(self, client: Client) -> Client:
        """``client`` if the upstream answers on it, else a new connection (``UpstreamDownError``).

        Any answer proves the connection alive, an error answer too: a
        server of protocol 2026-07-28, which dropped ``ping``, answers it
        "method not found". Only a failed transport (the connection closed,
        or no answer in time) means it is dead.
        """
        try:
            with anyio.fail_after(min(self.timeout_s, 10.0)):
                # The session's request, not the client's deprecated wrapper: the question is
                # whether anything answers, and every version answers a ping somehow.
                await client.session.send_ping()
            self._last_answer = anyio.current_time()
            return client
        except MCPError as exc:
            if exc.code not in LOCAL_FAILURE_CODES:
                self._last_answer = anyio.current_time()
                return client  # an answer, if a refusal: the connection is alive
            self._broken(client)
        except Exception:  # a dead connection: nothing was sent on it
            self._broken(client)
        return await self._connect()

    def _broken(self, client: Client) -> None:
        """Drop ``client`` so the next call connects again."""
        if self._client is client:
            self._client = None
            self._lane = None
            if self._closing is not None:
                self._closing.set()


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions a nest of exception groups carries (``exc`` itself if it is none)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


@asynccontextmanager
async def _http_with_headers(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """Streamable HTTP to ``url`` with ``headers`` on every request (an upstream's credentials)."""
    timeout = httpx2.Timeout(30.0, read=300.0)  # the SDK's own defaults for MCP over HTTP
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


def expanded_header(text: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """``"Name: value"`` with ``${VAR}`` in the value read from ``environ`` (a secret stays out
    of the command line); a variable that is not set is refused, never sent as written."""
    name, sep, value = text.partition(":")
    if not sep or not name.strip() or not value.strip():
        raise UpstreamDownError(f"a header is 'Name: value', not {text!r}")
    try:
        return name.strip(), string.Template(value.strip()).substitute(environ)
    except (KeyError, ValueError) as exc:
        raise UpstreamDownError(
            f"header {name.strip()}: the environment variable {exc} is not set (or the value "
            "is malformed); nothing was sent"
        ) from None


def log(message: str) -> None:
    """One line on stderr: stdout is the MCP channel of a stdio gateway."""
    print(f"tether mcp: {message}", file=sys.stderr, flush=True)
