"""An upstream MCP server written with the official SDK, whose effects can be counted.

``python -m tests.integration._mcp_upstream DB`` serves over stdio;
``... DB --http PORT`` over streamable HTTP on loopback. Its tools:

- ``add_note(text)``: destructive, takes no key: inserts one row in its own
  SQLite table ``notes`` (the test counts real effects there);
- ``count_notes()``: read-only, counts the rows;
- ``charge(account, cents)``: declares in its listing that it accepts an
  idempotency key in ``_meta`` and deduplicates by it: one row in
  ``charges`` per key, the first answer returned again for the same key.

Over HTTP with ``NOTES_TOKEN`` set, ``add_note`` and ``count_notes`` answer
an error to a request without ``Authorization: Bearer <token>``.

``NOTES_TEST_KILL`` (a file path): when it exists at a call of ``add_note``
or ``charge``, the row is committed, the file removed, and then the named
process is SIGKILLed before the answer is written: ``parent`` kills the
gateway that started this server (the gateway killed after forwarding),
``self`` kills this server (the upstream killed mid-call); ``hang`` makes
this call sleep two minutes instead (an upstream that hangs); ``lock PATH``
makes it hold the SQLite file PATH's write lock for four seconds from its
answer (a store busy when the gateway commits the receipt).

``NOTES_TEST_SLOW_START`` (a file path): when it exists as the server
starts, it is removed and the server waits five seconds before it serves
(an upstream slow to start again).

``NOTES_TEST_ENV_FILE`` (a file path): the server writes there, as it
starts, the names of the ``TETHER_*`` variables it was given.

``NOTES_TEST_EXTRA=1`` adds tools that each insert one row in the table
``calls`` (the tool's name and its arguments, as received):

- ``finish(summary)``, ``cancel(reason)``, ``tests.run(suite)``: named like a
  run's own actions;
- ``big_number(n)``: answers ``{"n": n, "next": n + 1}`` (integers of any size);
- ``report(lines)``: a structured answer with an output schema, about 60
  bytes per line (``lines=400`` is over 16 KiB).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import threading
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel

KEY_META = "idempotencyKey"


def build(db: str) -> MCPServer:
    """The server, its tables in the SQLite file ``db``."""
    server = MCPServer("notes", instructions="A notebook and a till, for tests.")
    setup = sqlite3.connect(db)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, text TEXT)")
    setup.execute(
        "CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, key TEXT UNIQUE, "
        "account TEXT, cents INTEGER)"
    )
    setup.execute("CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY, tool TEXT, args TEXT)")
    setup.commit()
    setup.close()

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(db, timeout=10)

    def maybe_die() -> None:
        marker = os.environ.get("NOTES_TEST_KILL")
        if not marker or not os.path.exists(marker):
            return
        with open(marker) as f:
            who = f.read().strip()
        os.remove(marker)
        if who == "hang":  # the row is in; the answer never comes (within a test)
            time.sleep(120)
            return
        if who.startswith("lock "):  # "lock PATH": hold that SQLite file's write lock 4 s
            held = sqlite3.connect(
                who.removeprefix("lock "), isolation_level=None, check_same_thread=False
            )
            held.execute("BEGIN IMMEDIATE")
            threading.Timer(4.0, held.close).start()  # past the answer: its commit waits
            return
        os.kill(os.getppid() if who == "parent" else os.getpid(), signal.SIGKILL)
        os._exit(0)  # never answer: the gateway is gone, and this server goes with it

    def check_token(ctx: Context) -> None:
        """Over HTTP with ``NOTES_TOKEN`` set, a call without ``Authorization: Bearer TOKEN`` fails."""
        token = os.environ.get("NOTES_TOKEN")
        if token and (ctx.headers or {}).get("authorization") != f"Bearer {token}":
            raise ToolError("no valid bearer token")

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False))
    def add_note(text: str, ctx: Context) -> dict[str, Any]:
        """Add a note to the notebook; returns its id."""
        check_token(ctx)
        with connect() as con:
            row = con.execute("INSERT INTO notes (text) VALUES (?)", (text,)).lastrowid
        maybe_die()
        return {"id": row, "text": text}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def count_notes(ctx: Context) -> int:
        """How many notes the notebook holds."""
        check_token(ctx)
        with connect() as con:
            return int(con.execute("SELECT COUNT(*) FROM notes").fetchone()[0])

    @server.tool(meta={KEY_META: {"accepted": True, "retentionSeconds": 86400}})
    def charge(account: str, cents: int, ctx: Context) -> dict[str, Any]:
        """Charge an account; deduplicated by the idempotency key in the call's _meta."""
        meta = ctx.request_context.meta or {}
        key = meta.get(KEY_META)
        with connect() as con:
            if isinstance(key, str):
                found = con.execute(
                    "SELECT id, account, cents FROM charges WHERE key = ?", (key,)
                ).fetchone()
                if found is not None:
                    return {"charge_id": found[0], "account": found[1], "cents": found[2]}
            row = con.execute(
                "INSERT INTO charges (key, account, cents) VALUES (?, ?, ?)",
                (key, account, cents),
            ).lastrowid
        maybe_die()
        return {"charge_id": row, "account": account, "cents": cents}

    if os.environ.get("NOTES_TEST_EXTRA") == "1":
        extra_tools(server, connect)
    return server


class Report(BaseModel):
    """A long structured answer."""

    count: int
    lines: list[str]


def extra_tools(server: MCPServer, connect: Any) -> None:
    """The tools ``NOTES_TEST_EXTRA=1`` adds (see the module docstring)."""

    def record(tool: str, args: dict[str, Any]) -> int:
        with connect() as con:
            row = con.execute(
                "INSERT INTO calls (tool, args) VALUES (?, ?)", (tool, json.dumps(args))
            ).lastrowid
        return int(row or 0)

    @server.tool(name="finish")
    def finish_tool(summary: str) -> dict[str, Any]:
        """Mark a job finished (a tool, not the run's own finish)."""
        return {"row": record("finish", {"summary": summary}), "finished": summary}

    @server.tool(name="cancel")
    def cancel_tool(reason: str) -> dict[str, Any]:
        """Cancel a job (a tool, not the run's own cancel)."""
        return {"row": record("cancel", {"reason": reason}), "cancelled": reason}

    @server.tool(name="tests.run")
    def tests_run(suite: str) -> dict[str, Any]:
        """Start a test suite (a tool, not the run's own tests.run)."""
        return {"row": record("tests.run", {"suite": suite}), "ran": suite}

    @server.tool()
    def big_number(n: int) -> dict[str, Any]:
        """Store a number of any size; answer it and the next one."""
        record("big_number", {"n": n})
        return {"n": n, "next": n + 1}

    @server.tool()
    def report(lines: int) -> Report:
        """Write a report of ``lines`` lines and answer it whole."""
        record("report", {"lines": lines})
        body = [f"line {i:05d}: " + "x" * 48 for i in range(lines)]
        return Report(count=lines, lines=body)


def main(argv: list[str]) -> None:
    """Serve over stdio, or over streamable HTTP with ``--http PORT``."""
    seen = os.environ.get("NOTES_TEST_ENV_FILE")
    if seen:
        with open(seen, "w") as f:
            json.dump(sorted(k for k in os.environ if k.startswith("TETHER_")), f)
    slow = os.environ.get("NOTES_TEST_SLOW_START")
    if slow and os.path.exists(slow):
        os.remove(slow)
        time.sleep(5)
    server = build(argv[0])
    if "--http" in argv:
        port = int(argv[argv.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run()


if __name__ == "__main__":
    main(sys.argv[1:])
