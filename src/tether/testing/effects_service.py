"""A reference effects service: a ticket API that honours the Idempotency-Key draft.

It ships with tether for tests and the demo. It stores the first response
for a key (errors included), fingerprints the payload, answers ``400`` for a
missing or malformed key, ``409`` while the same key is in flight, ``422`` for
a key reused with another payload, forgets keys after a retention period,
and can be asked by key (``GET /idempotency/{key}``; no record: ``404
{"error": "unknown_key", "idempotency_key": KEY}``). Data lives in its own
SQLite file, so a restarted service remembers everything. What it promises
is declared by ``tether.adapters.REFERENCE_PROFILE``; an ``HttpEffect``
without that profile assumes none of it.

A ticket can be compensated: ``POST /tickets/{id}/cancel`` under its own
``Idempotency-Key`` cancels it once (stored, replayed and looked up exactly
like a ticket request; a second cancel of the same ticket under another key
is refused, ``400 already_cancelled``), and ``GET /compensations`` lists
every cancellation, so a test can count them.

It verifies ``Tether-Instance``: a ticket request or a look-up that names
another instance than the one its database holds is refused with ``421``
before anything else happens, checked in the same transaction that would
take the key, and every answer of those two routes names the instance that
gave it. That is what lets a client skip asking ``GET /instance`` before
each request without ever sending a ticket to a database it was not bound to.

Real services follow the draft only in part. A hostile ``mode``, switched per
test through ``POST /_admin/mode``, makes it behave as measured elsewhere:

=====================  ==========================================================
``drop_after_commit``  commit the ticket, then drop the connection mid-reply
``commit_then_500``    commit the ticket, then answer 500
``slow_s``             seconds between taking the key and committing (in-flight 409s)
``lying_lookup``       the look-up answers its own 404 (no record) for every key
``no_inflight_lock``   two concurrent requests with one key both execute
``mismatch``           ``"422"`` (faithful), ``"400"`` (Stripe's ``idempotency_error``),
                       ``"new_effect"`` or ``"replay"``
``replay_status``      status of a replay: the first response's (0) or e.g. 409
``ignore_keys``        no idempotency at all: every request executes, keys unrecorded
``lookup_route``       ``"ok"``; ``"missing"`` (the route does not exist: Starlette's
                       plain-text 404), ``"json_404"`` (``{"detail": "Not Found"}``,
                       as FastAPI answers an unknown route) or ``"redirect"`` (302
                       to a login page)
``inflight_expiry_s``  an abandoned in-flight key is freed after this; ``null``: never
``retention_s``        keys older than this are forgotten (then a request executes again)
``id_offset``          added to ticket ids in replies (ids past 2**53, as 64-bit services use)
``ignore_instance``    neither check nor name ``Tether-Instance`` (a service without the check)
=====================  ==========================================================

Run it as ``python -m tether.testing.effects_service --db FILE [--port 0]``;
it prints one JSON line ``{"url": ..., "instance_id": ...}`` when it listens.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import secrets
import socket
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tether.adapters._httpfields import (
    FENCE,
    IDEMPOTENCY_KEY,
    INSTANCE,
    HeaderFieldError,
    parse_fence,
    parse_sf_string,
    sf_string,
)
from tether.core import format_time

DEFAULT_MODE: dict[str, Any] = {
    "drop_after_commit": False,
    "commit_then_500": False,
    "slow_s": 0.0,
    "lying_lookup": False,
    "no_inflight_lock": False,
    "mismatch": "422",
    "replay_status": 0,
    "inflight_expiry_s": 30.0,
    "retention_s": 24 * 3600.0,
    "id_offset": 0,
    "ignore_instance": False,
    "ignore_keys": False,
    "lookup_route": "ok",
}
_MISMATCH = {"422", "400", "new_effect", "replay"}
_LOOKUP_ROUTES = {"ok", "missing", "json_404", "redirect"}

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS keys (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL,"
    " state TEXT NOT NULL, status INTEGER, body TEXT, created_us INTEGER NOT NULL,"
    " attempt TEXT)",
    "CREATE TABLE IF NOT EXISTS tickets (ticket_id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " idempotency_key TEXT, body TEXT NOT NULL, created_us INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS fences (run_id TEXT PRIMARY KEY, version INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS compensations (compensation_id INTEGER PRIMARY KEY"
    " AUTOINCREMENT, ticket_id INTEGER NOT NULL UNIQUE, idempotency_key TEXT,"
    " body TEXT NOT NULL, created_us INTEGER NOT NULL)",
)


def _now_us() -> int:
    return time.time_ns() // 1000


class ServiceData:
    """The service's SQLite file: keys, tickets, fences, its identity and its mode."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with self.connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            for statement in _SCHEMA:
                conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO meta (name, value) VALUES ('instance_id', ?)",
                ("svc-" + secrets.token_hex(8),),
            )
            conn.execute(
                "INSERT OR IGNORE INTO meta (name, value) VALUES ('mode', ?)",
                (json.dumps(DEFAULT_MODE),),
            )

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self.connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                conn.rollback()
                raise

    def meta(self, name: str) -> str:
        with self.connect() as conn:
            row = conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return str(row[0])

    def mode(self) -> dict[str, Any]:
        return {**DEFAULT_MODE, **json.loads(self.meta("mode"))}

    def set_mode(self, changes: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(changes) - set(DEFAULT_MODE))
        if unknown:
            raise ValueError(f"unknown mode fields {unknown}")
        if "mismatch" in changes and changes["mismatch"] not in _MISMATCH:
            raise ValueError(f"mismatch must be one of {sorted(_MISMATCH)}")
        if "lookup_route" in changes and changes["lookup_route"] not in _LOOKUP_ROUTES:
            raise ValueError(f"lookup_route must be one of {sorted(_LOOKUP_ROUTES)}")
        mode = {**self.mode(), **changes}
        with self.transaction() as conn:
            conn.execute("UPDATE meta SET value = ? WHERE name = 'mode'", (json.dumps(mode),))
        return mode


def fingerprint(method: str, path: str, body: bytes) -> str:
    """What the service compares when a key comes back: method, path and body bytes."""
    digest = hashlib.sha256(method.encode() + b" " + path.encode() + b"\n" + body)
    return "sha256:" + digest.hexdigest()


class _DropMidReply(Response):
    """Starts a reply and dies before its body: the client sees the connection drop."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-length", b"4096"), (b"content-type", b"application/json")],
            }
        )
        raise ConnectionAbortedError("hostile mode: connection dropped after the commit")


def _json(status: int, body: dict[str, Any], **headers: str) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers or None)


def _instance_in(conn: sqlite3.Connection) -> str:
    """The instance id of the database ``conn`` is open on, read in the caller's transaction."""
    row = conn.execute("SELECT value FROM meta WHERE name = 'instance_id'").fetchone()
    return str(row[0])


def _check_instance(own: str, expected: str | None, mode: dict[str, Any]) -> Response | None:
    """``421`` for a request that names another instance than ``own``; ``None`` to go on."""
    if expected is None or mode["ignore_instance"]:
        return None
    try:
        named = parse_sf_string(expected, "a Tether-Instance")
    except HeaderFieldError as exc:
        return _json(400, {"error": "malformed_instance", "detail": str(exc)})
    if named != own:
        # 421 Misdirected Request (RFC 9110): meant for a server this one is not.
        return _json(421, {"error": "wrong_instance", "instance_id": own, "expected": named})
    return None


def _named(response: Response, own: str, mode: dict[str, Any]) -> Response:
    """``response``, naming the instance that gave it (unless playing a service that does not)."""
    if not mode["ignore_instance"]:
        response.headers[INSTANCE] = sf_string(own, "an instance id")
    return response


class EffectsService:
    """The Starlette application over one :class:`ServiceData`."""

    def __init__(self, data: ServiceData) -> None:
        self.data = data
        self.app = Starlette(
            routes=[
                Route("/tickets", self.create_ticket, methods=["POST"]),
                Route("/tickets", self.list_tickets, methods=["GET"]),
                Route("/tickets/{ticket_id:int}/cancel", self.cancel_ticket, methods=["POST"]),
                Route("/compensations", self.list_compensations, methods=["GET"]),
                Route("/idempotency/{key:path}", self.look_up, methods=["GET"]),
                Route("/instance", self.instance, methods=["GET"]),
                Route("/_admin/mode", self.change_mode, methods=["POST"]),
            ]
        )

    # -- the API -------------------------------------------------------------

    async def create_ticket(self, request: Request) -> Response:
        return await self._keyed(request, "/tickets", self._commit)

    async def cancel_ticket(self, request: Request) -> Response:
        """Compensate a ticket: cancel it, once, under the request's own Idempotency-Key."""
        named = int(request.path_params["ticket_id"])
        commit = functools.partial(self._commit_cancel, named)
        return await self._keyed(request, f"/tickets/{named}/cancel", commit)

    async def _keyed(self, request: Request, path: str, commit: Any) -> Response:
        body = await request.body()
        header = request.headers.get(IDEMPOTENCY_KEY)
        if header is None:
            return _json(400, {"error": "missing_idempotency_key"})
        try:
            key = parse_sf_string(header)
        except HeaderFieldError as exc:
            return _json(400, {"error": "malformed_idempotency_key", "detail": str(exc)})
        try:
            payload = json.loads(body)
        except ValueError:
            return _json(400, {"error": "body_not_json"})
        if not isinstance(payload, dict):
            return _json(400, {"error": "body_not_an_object"})
        fence = request.headers.get(FENCE)
        expected = request.headers.get(INSTANCE)
        payload_fp = fingerprint("POST", path, body)
        return await run_in_threadpool(
            self._create, key, payload_fp, body, payload, fence, expected, commit
        )

    def _create(
        self,
        key: str,
        payload_fp: str,
        body: bytes,
        payload: dict[str, Any],
        fence: str | None,
        expected: str | None,
        commit: Any,
    ) -> Response:
        mode = self.data.mode()
        now = _now_us()
        with self.data.transaction() as conn:
            own = _instance_in(conn)
            taken = self._take_key(conn, mode, own, expected, key, payload_fp, fence, now)
        if isinstance(taken, Response):
            return _named(taken, own, mode)
        return _named(commit(mode, key, taken, payload_fp, body, payload, now), own, mode)

    def _take_key(
        self,
        conn: sqlite3.Connection,
        mode: dict[str, Any],
        own: str,
        expected: str | None,
        key: str,
        payload_fp: str,
        fence: str | None,
        now: int,
    ) -> Response | str:
        """The refusal or replay for this request, or the attempt id that now holds the key.

        The instance check comes first, in the transaction that takes the key,
        so a request meant for another database is refused before this one
        records anything.
        """
        refused = _check_instance(own, expected, mode)
        if refused is not None:
            return refused
        if mode["ignore_keys"]:
            # A service with no idempotency at all: the key is never recorded.
            return secrets.token_hex(8)
        conn.execute(
            "DELETE FROM keys WHERE created_us < ?",
            (now - int(float(mode["retention_s"]) * 1e6),),
        )
        row = conn.execute(
            "SELECT fingerprint, state, status, body, created_us FROM keys WHERE key = ?",
            (key,),
        ).fetchone()
        if row is not None:
            answer = self._seen(conn, mode, key, payload_fp, row, now)
            if answer is not None:
                return answer
        if fence is not None:
            refused = self._check_fence(conn, fence)
            if refused is not None:
                return refused
        attempt = secrets.token_hex(8)
        if not mode["no_inflight_lock"]:
            conn.execute(
                "INSERT OR REPLACE INTO keys (key, fingerprint, state, created_us, attempt)"
                " VALUES (?, ?, 'in_flight', ?, ?)",
                (key, payload_fp, now, attempt),
            )
        return attempt

    def _commit(
        self,
        mode: dict[str, Any],
        key: str,
        attempt: str,
        payload_fp: str,
        body: bytes,
        payload: dict[str, Any],
        now: int,
    ) -> Response:
        """Carry out the request whose key ``attempt`` took; store and return its response."""
        if mode["slow_s"]:
            time.sleep(float(mode["slow_s"]))
        title = payload.get("title")
        keyless = mode["no_inflight_lock"] or mode["ignore_keys"]
        with self.data.transaction() as conn:
            if not keyless:
                # Still ours? A key freed as abandoned may have been taken by a retry
                # while this handler was merely slow: then this attempt commits nothing.
                owner = conn.execute("SELECT attempt FROM keys WHERE key = ?", (key,)).fetchone()
                if owner is None or owner[0] != attempt:
                    return _json(409, {"error": "request_superseded", "idempotency_key": key})
            if isinstance(title, str) and title:
                cursor = conn.execute(
                    "INSERT INTO tickets (idempotency_key, body, created_us) VALUES (?, ?, ?)",
                    (key, body.decode("utf-8", "replace"), _now_us()),
                )
                created = format_time(datetime.now(UTC))  # RFC 3339 UTC, as receipts keep it
                reply = {
                    "ticket_id": int(cursor.lastrowid or 0) + int(mode["id_offset"]),
                    "idempotency_key": key,
                    "created_at": created,
                }
                status = 201
            else:
                # An error is a response too: stored, so the same request gets it again.
                status, reply = 400, {"error": "invalid_ticket", "detail": "title is required"}
            if not mode["ignore_keys"]:
                conn.execute(
                    "INSERT OR REPLACE INTO keys (key, fingerprint, state, status, body, "
                    "created_us) VALUES (?, ?, 'completed', ?, ?, ?)",
                    (key, payload_fp, status, json.dumps(reply), now),
                )
        if status != 201:
            return _json(status, reply)
        if mode["drop_after_commit"]:
            return _DropMidReply()
        if mode["commit_then_500"]:
            return _json(500, {"error": "internal"})
        return _json(201, reply)

    def _commit_cancel(
        self,
        named: int,
        mode: dict[str, Any],
        key: str,
        attempt: str,
        payload_fp: str,
        body: bytes,
        payload: dict[str, Any],
        now: int,
    ) -> Response:
        """Cancel the ticket the path names, as :meth:`_commit` creates one (same hostile modes)."""
        if mode["slow_s"]:
            time.sleep(float(mode["slow_s"]))
        ticket_id = named - int(mode["id_offset"])  # replies name ids with the offset
        with self.data.transaction() as conn:
            if not (mode["no_inflight_lock"] or mode["ignore_keys"]):
                owner = conn.execute("SELECT attempt FROM keys WHERE key = ?", (key,)).fetchone()
                if owner is None or owner[0] != attempt:
                    return _json(409, {"error": "request_superseded", "idempotency_key": key})
            exists = conn.execute(
                "SELECT 1 FROM tickets WHERE ticket_id = ?", (ticket_id,)
            ).fetchone()
            done = conn.execute(
                "SELECT 1 FROM compensations WHERE ticket_id = ?", (ticket_id,)
            ).fetchone()
            if exists is None:
                status, reply = 404, {"error": "unknown_ticket", "ticket_id": ticket_id}
            elif done is not None:
                status, reply = 400, {"error": "already_cancelled", "ticket_id": ticket_id}
            else:
                created = format_time(datetime.now(UTC))
                cursor = conn.execute(
                    "INSERT INTO compensations (ticket_id, idempotency_key, body, created_us)"
                    " VALUES (?, ?, ?, ?)",
                    (ticket_id, key, body.decode("utf-8", "replace"), _now_us()),
                )
                status = 200
                reply = {
                    "compensation_id": int(cursor.lastrowid or 0),
                    "ticket_id": ticket_id + int(mode["id_offset"]),
                    "idempotency_key": key,
                    "cancelled_at": created,
                }
            # Stored like any response, refusals included: the same request gets it again.
            if not mode["ignore_keys"]:
                conn.execute(
                    "INSERT OR REPLACE INTO keys (key, fingerprint, state, status, body, "
                    "created_us) VALUES (?, ?, 'completed', ?, ?, ?)",
                    (key, payload_fp, status, json.dumps(reply), now),
                )
        if status != 200:
            return _json(status, reply)
        if mode["drop_after_commit"]:
            return _DropMidReply()
        if mode["commit_then_500"]:
            return _json(500, {"error": "internal"})
        return _json(200, reply)

    def _seen(
        self,
        conn: sqlite3.Connection,
        mode: dict[str, Any],
        key: str,
        payload_fp: str,
        row: tuple[Any, ...],
        now: int,
    ) -> Response | None:
        """The answer for a key already known, or ``None`` to execute (again)."""
        stored_fp, state, status, body, created_us = row
        if state == "in_flight":
            expiry = mode["inflight_expiry_s"]
            if expiry is not None and now - created_us > float(expiry) * 1e6:
                return None  # abandoned by a crashed handler; its ticket never committed
            if mode["no_inflight_lock"]:
                return None
            return _json(409, {"error": "request_in_flight", "idempotency_key": key})
        if stored_fp != payload_fp:
            if mode["mismatch"] == "new_effect":
                return None
            if mode["mismatch"] == "422":
                return _json(422, {"error": "idempotency_key_reused", "idempotency_key": key})
            if mode["mismatch"] == "400":
                # As Stripe answers it: a 400 whose error type names idempotency.
                error = {
                    "type": "idempotency_error",
                    "message": "Keys for idempotent requests can only be used with the same "
                    "parameters they were first used with.",
                }
                return _json(400, {"error": error})
        replay_status = int(mode["replay_status"]) or int(status)
        return JSONResponse(
            json.loads(body), status_code=replay_status, headers={"Idempotent-Replayed": "true"}
        )

    def _check_fence(self, conn: sqlite3.Connection, fence: str) -> Response | None:
        try:
            run_id, version = parse_fence(fence)
        except HeaderFieldError as exc:
            return _json(400, {"error": "malformed_fence", "detail": str(exc)})
        row = conn.execute("SELECT version FROM fences WHERE run_id = ?", (run_id,)).fetchone()
        if row is not None and version < int(row[0]):
            return _json(412, {"error": "stale_fence", "highest": int(row[0])})
        conn.execute(
            "INSERT OR REPLACE INTO fences (run_id, version) VALUES (?, ?)", (run_id, version)
        )
        return None

    async def look_up(self, request: Request) -> Response:
        key = request.path_params["key"]
        mode = self.data.mode()
        route = mode["lookup_route"]
        if route == "missing":
            return PlainTextResponse("Not Found", status_code=404)  # as for any unknown path
        if route == "json_404":
            return _json(404, {"detail": "Not Found"})
        if route == "redirect":
            return Response(status_code=302, headers={"location": "/login"})
        with self.data.connect() as conn:
            conn.execute("BEGIN")  # one snapshot: the instance checked is the one that answers
            own = _instance_in(conn)
            row = conn.execute(
                "SELECT fingerprint, state, status, body, created_us FROM keys WHERE key = ?",
                (key,),
            ).fetchone()
            conn.execute("COMMIT")
        refused = _check_instance(own, request.headers.get(INSTANCE), mode)
        if refused is not None:
            return _named(refused, own, mode)
        return _named(self._recorded(mode, key, row), own, mode)

    def _recorded(self, mode: dict[str, Any], key: str, row: tuple[Any, ...] | None) -> Response:
        """What the look-up answers for ``key`` from its row in ``keys`` (``None``: unknown)."""
        if row is None or mode["lying_lookup"]:
            return _json(404, {"error": "unknown_key", "idempotency_key": key})
        stored_fp, state, status, body, created_us = row
        expiry = mode["inflight_expiry_s"]
        if state == "in_flight" and expiry is not None and _now_us() - created_us > expiry * 1e6:
            # Abandoned by a crashed handler (its ticket never committed): a request
            # with this key would execute now, so the look-up says so too.
            return _json(404, {"error": "unknown_key", "idempotency_key": key})
        answer: dict[str, Any] = {
            "idempotency_key": key,
            "fingerprint": stored_fp,
            "state": state,
            "created_us": created_us,
        }
        if state == "completed":
            answer["response"] = {"status": status, "body": json.loads(body)}
        return _json(200, answer)

    async def list_tickets(self, request: Request) -> Response:
        with self.data.connect() as conn:
            rows = conn.execute(
                "SELECT ticket_id, idempotency_key, body FROM tickets ORDER BY ticket_id"
            ).fetchall()
        tickets = [{"ticket_id": r[0], "idempotency_key": r[1], "body": r[2]} for r in rows]
        return _json(200, {"tickets": tickets})

    async def list_compensations(self, request: Request) -> Response:
        """Every compensation carried out (one per cancelled ticket), for tests to count."""
        with self.data.connect() as conn:
            rows = conn.execute(
                "SELECT compensation_id, ticket_id, idempotency_key FROM compensations"
                " ORDER BY compensation_id"
            ).fetchall()
        done = [{"compensation_id": r[0], "ticket_id": r[1], "idempotency_key": r[2]} for r in rows]
        return _json(200, {"compensations": done})

    async def instance(self, request: Request) -> Response:
        return _json(200, {"instance_id": self.data.meta("instance_id")})

    async def change_mode(self, request: Request) -> Response:
        try:
            changes = json.loads(await request.body())
            if not isinstance(changes, dict):
                raise ValueError("the mode must be a JSON object")
            return _json(200, self.data.set_mode(changes))
        except ValueError as exc:
            return _json(400, {"error": "bad_mode", "detail": str(exc)})


def build_app(db: Path) -> Starlette:
    """The ASGI application over the SQLite file ``db`` (created if missing)."""
    return EffectsService(ServiceData(db)).app


def listen(port: int) -> socket.socket:
    """A loopback socket listening on ``port`` (0: any free one), for uvicorn to serve.

    Made with ``proto=IPPROTO_TCP``, not 0: asyncio sets ``TCP_NODELAY`` only
    on connections whose socket names TCP, and uvicorn writes a reply's head
    and body apart, so without it every reply waits ~40 ms for the client's
    delayed ACK (Nagle): a stall no real service has, that would swamp what
    a benchmark or a test measures.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)  # connections queue from now on, before uvicorn starts serving
    return sock


def main(argv: list[str] | None = None) -> int:
    """Serve on loopback; print the URL and identity once listening."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m tether.testing.effects_service")
    parser.add_argument("--db", type=Path, required=True, help="the service's SQLite file")
    parser.add_argument("--port", type=int, default=0, help="loopback port (0: any free one)")
    args = parser.parse_args(argv)
    data = ServiceData(args.db)
    sock = listen(args.port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        EffectsService(data).app, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    print(
        json.dumps({"url": f"http://127.0.0.1:{port}", "instance_id": data.meta("instance_id")}),
        flush=True,
    )
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
