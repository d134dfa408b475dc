"""The operator page: runs, one run, the inbox, and the forms that sign documents.

Every page is read from the store on request (one store connection per
request, closed after it), so the page shows what workers committed a moment
ago. Forms exist only when the server was given a key. A form never signs
directly: it prepares the document and shows exactly the fields that will be
signed; a second click signs that very body and leaves it in the inbox.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from tether.core import (
    IntegrityError,
    MissingHighWaterMarkError,
    Phase,
    Policy,
    PolicyError,
    RunNotFoundError,
    StoreError,
    TetherError,
    format_time,
)
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import InboxItem, Page, deliver, open_run, runs_page
from tether.store import SQLBase, open_store
from tether.web import _actions as actions
from tether.web import _read as read
from tether.web._guard import Guard, Sessions, raw_path

HERE = Path(__file__).parent
#: A prepared document must be signed within this many seconds, or prepared again.
DRAFT_TTL_S = 300.0
#: Runs on one page of the runs list (``?limit=`` asks for another number, up to MAX_PAGE).
PAGE_SIZE = 50
MAX_PAGE = 1000


@dataclass(frozen=True, slots=True)
class WebConfig:
    """What ``tether serve`` was given.

    ``store``: a store URL or a SQLite file path. ``signers``: the operator's
    own keys (none: read-only, no forms). ``keyring``: verify checkpoints and
    chains before showing them. ``trust``: refuse to sign with a key the
    runtime would not trust. ``policy``: the run's policy, to check lifetimes.
    ``hosts``: the Host headers accepted, with their port (``None``: any).
    """

    store: str
    token: str
    signers: tuple[Signer, ...] = ()
    keyring: Keyring | None = None
    trust: TrustRoots | None = None
    policy: Policy | None = None
    hosts: tuple[str, ...] | None = None
    refresh_s: float = 3.0

    @property
    def read_only(self) -> bool:
        return not self.signers


def open_for(where: str, *, write: bool) -> SQLBase:
    """The store ``where`` names (a URL or a SQLite path); it must already exist.

    Pages are read read-only (nothing created or migrated); only signing writes.
    """
    return open_store(where, existing=True, read_only=not write)


def create_app(config: WebConfig) -> Starlette:
    """The page as an ASGI app, behind the token guard."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["epoch_ms"] = _epoch_ms
    templates.env.filters["when"] = _when
    templates.env.filters["run_path"] = run_path
    templates.env.filters["with_query"] = with_query
    sessions = Sessions(config.token)
    lock = threading.Lock()
    # Signed documents shown but not yet delivered, by a random id: (session, when,
    # draft). Delivery takes the document from here, never from the form, so what
    # was shown is what goes to the inbox.
    drafts: dict[str, tuple[str, float, actions.Draft]] = {}

    @contextmanager
    def store(*, write: bool = False) -> Iterator[SQLBase]:
        opened = open_for(config.store, write=write)
        try:
            yield opened
        finally:
            opened.close()

    def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        sid = request.scope["state"]["sid"]
        context.update(
            csrf=sessions.csrf(sid),
            read_only=config.read_only,
            signers=[(s.signer_id, s.role.value) for s in config.signers],
            verified_by_keyring=config.keyring is not None,
            refresh_s=config.refresh_s,
        )
        return templates.TemplateResponse(request, name, context, status_code=status)

    def failure(request: Request, exc: Exception) -> Response:
        if isinstance(exc, (MissingHighWaterMarkError, RunNotFoundError)):
            status, title = 404, "No such run"
        elif isinstance(exc, IntegrityError):
            status, title = 500, "Integrity failure: nothing of this run is shown"
        elif isinstance(exc, PolicyError):
            status, title = 409, "Refused before signing"
        elif isinstance(exc, StoreError):
            status, title = 503, "Store unavailable"
        else:
            status, title = 400, "Refused"
        return render(
            request,
            "error.html",
            status,
            title=title,
            error=f"{type(exc).__name__}: {exc}",
            run_id=request.scope.get("state", {}).get("run_id"),
        )

    async def home(request: Request) -> Response:
        return RedirectResponse("/runs", status_code=303)

    def runs(request: Request) -> Response:
        query = request.query_params
        phase = query.get("phase") or None
        if phase is not None and phase not in {p.value for p in Phase}:
            phase = None
        needs = query.get("needs") == "1"
        after = query.get("after") or None
        size = query.get("limit", "")
        limit = int(size) if size.isdigit() and 1 <= int(size) <= MAX_PAGE else PAGE_SIZE
        # The page's own identity besides its rows (who is signed in, with what):
        # a refresh that finds both unchanged is answered 304 without a render.
        sid = request.scope["state"]["sid"]
        signing = [(signer.signer_id, signer.role.value) for signer in config.signers]
        context = hashlib.sha256(
            repr((sessions.csrf(sid), signing, config.keyring is not None)).encode()
        ).hexdigest()[:16]
        try:
            with store() as s:
                page = runs_page(
                    s,
                    keyring=config.keyring,
                    phase=phase,
                    needs_person=needs,
                    after=after,
                    limit=limit,
                    unless=_shown_version(request, context),
                )
        except TetherError as exc:
            return failure(request, exc)
        if page is None:
            # Nothing the page shows changed: no checkpoint read, nothing rendered.
            return Response(
                status_code=304, headers={"ETag": request.headers.get("if-none-match", "")}
            )
        etag = _etag(page.version, context)
        filters = {
            "phase": phase or "",
            "needs": "1" if needs else "",
            "limit": "" if limit == PAGE_SIZE else str(limit),
        }
        kept = {key: value for key, value in filters.items() if value}
        answer = render(
            request,
            "runs.html",
            rows=page.rows,
            phase=phase,
            needs=needs,
            after=after,
            first_url="/runs" + (f"?{urlencode(kept)}" if kept else ""),
            next_url=None
            if page.after is None
            else f"/runs?{urlencode({**kept, 'after': page.after})}",
            phases=[p.value for p in Phase],
            etag=etag,
        )
        answer.headers["ETag"] = etag
        return answer

    def run(request: Request) -> Response:
        run_id = _run_of(request)
        try:
            wanted = read.page_of(request.query_params)
            with store() as s:
                page = read.arrange(
                    open_run(s, run_id, keyring=config.keyring, page=wanted), s.evidence(run_id)
                )
        except TetherError as exc:
            return failure(request, exc)
        return render(
            request,
            "run.html",
            page=page,
            view=page.view,
            state=page.view.state,
            decision_help=actions.DECISION_HELP,
            pretty=read.pretty,
            done=request.query_params.get("done"),
        )

    def inbox(request: Request) -> Response:
        items: list[tuple[str, InboxItem]] = []
        try:
            with store() as s:
                for mark in s.runs(damaged=[]):  # a damaged mark is listed on /runs
                    if not s.evidence(mark.run_id):
                        continue  # nothing delivered: no history to walk for it
                    try:
                        # The inbox's statuses come from landmark events, not a page.
                        view = open_run(s, mark.run_id, keyring=config.keyring, page=Page(1))
                    except TetherError:
                        continue  # listed on /runs as unreadable; one damaged run hides no other
                    items += [(mark.run_id, item) for item in view.inbox]
        except TetherError as exc:
            return failure(request, exc)
        order = {"refused": 0, "waiting": 1, "applied": 2}
        items.sort(key=lambda pair: (order.get(pair[1].status, 3), pair[1].received_at))
        return render(request, "inbox.html", items=items)

    async def prepare(request: Request) -> Response:
        form = await request.form()
        refused = _writable(request, form, sessions, config)
        if refused is not None:
            return refused
        run_id = _run_of(request)
        fields = {key: str(value) for key, value in form.items() if isinstance(value, str)}
        try:
            with store() as s:
                view = open_run(s, run_id, keyring=config.keyring, page=Page(1))
            draft = actions.prepare(
                view, fields, list(config.signers), trust=config.trust, policy=config.policy
            )
        except TetherError as exc:
            return failure(request, exc)
        pid = secrets.token_urlsafe(16)
        sid = request.scope["state"]["sid"]
        with lock:
            now = time.monotonic()
            for key in [k for k, (_, at, _) in drafts.items() if now - at > DRAFT_TTL_S]:
                del drafts[key]
            drafts[pid] = (sid, now, draft)
        return render(request, "confirm.html", draft=draft, pid=pid, run_id=run_id)

    async def sign(request: Request) -> Response:
        form = await request.form()
        refused = _writable(request, form, sessions, config)
        if refused is not None:
            return refused
        run_id = _run_of(request)
        sid = request.scope["state"]["sid"]
        with lock:
            entry = drafts.pop(str(form.get("prepared", "")), None)
        if entry is None or entry[0] != sid or entry[2].prepared.run_id != run_id:
            return failure(
                request, actions.ActionRefusedError("nothing prepared to sign; start again")
            )
        _, at, draft = entry
        if time.monotonic() - at > DRAFT_TTL_S:
            return failure(
                request, actions.ActionRefusedError("prepared too long ago; start again")
            )
        try:
            with store(write=True) as s:
                # Re-checked at delivery: expired meanwhile, or (all but a cancel) the run moved.
                seq = deliver(s, draft.prepared)
        except TetherError as exc:
            return failure(request, exc)
        kind = draft.prepared.kind
        done = with_query(run_path(run_id), done=f"{kind} inbox #{seq}")
        return RedirectResponse(done, status_code=303)

    async def run_action(request: Request) -> Response:
        action = _run_target(request)[1]
        if action == "prepare":
            return await prepare(request)
        if action == "sign":
            return await sign(request)
        return PlainTextResponse("not found\n", 404)

    async def run_page(request: Request) -> Response:
        if not _run_target(request)[0]:
            return RedirectResponse("/runs", status_code=303)
        return run(request)

    routes = [
        Route("/", home),
        Route("/runs", runs),
        Route("/inbox", inbox),
        # A run id may hold any character: it travels percent-encoded as one path
        # segment (read from the raw path), or as ?id= where a segment cannot carry it.
        Route("/runs/{rest:path}", run_page, methods=["GET"]),
        Route("/runs/{rest:path}", run_action, methods=["POST"]),
        Route("/run", run_page, methods=["GET"]),
        Route("/run/{rest:path}", run_action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes)
    app.add_middleware(Guard, sessions=sessions, hosts=config.hosts)
    return app


#: What a form posts to, after a run's path.
_ACTIONS = ("prepare", "sign")
#: Run ids a browser would resolve as path segments (also written %2E), so never one.
_DOT_SEGMENTS = (".", "..")


def run_path(run_id: str, action: str | None = None) -> str:
    """The address of ``run_id``'s page (or of its form's ``action``), for any run id."""
    tail = "" if action is None else f"/{action}"
    if run_id in _DOT_SEGMENTS:
        return f"/run{tail}?{urlencode({'id': run_id})}"
    return f"/runs/{quote(run_id, safe='')}{tail}"


def with_query(url: str, **params: Any) -> str:
    """``url`` with ``params`` added to its query (``None`` values left out)."""
    kept = {key: str(value) for key, value in params.items() if value is not None}
    if not kept:
        return url
    return url + ("&" if "?" in url else "?") + urlencode(kept)


def _run_target(request: Request) -> tuple[str, str | None]:
    """The run id and the form action (``None``: the page) a request's path names."""
    path = raw_path(request.scope)
    target: tuple[str, str | None]
    if path == "/run" or path.startswith("/run/"):
        # The query form (a run id no path segment can carry): /run?id=, /run/ACTION?id=.
        action = unquote(path[len("/run/") :]) if path.startswith("/run/") else None
        target = (request.query_params.get("id", ""), action)
    else:
        rest = path[len("/runs/") :]
        head, _, last = rest.rpartition("/")
        if request.method != "POST":
            # Our links send the id as one segment; typed by a person it may hold a raw "/".
            target = (unquote(rest), None)
        elif head and last in _ACTIONS:
            target = (unquote(head), last)
        else:
            target = (unquote(rest), "")
    request.scope.setdefault("state", {})["run_id"] = target[0]
    return target


def _run_of(request: Request) -> str:
    return _run_target(request)[0]


def _writable(
    request: Request, form: FormData, sessions: Sessions, config: WebConfig
) -> Response | None:
    """None when this POST may act: a key was given and the form's CSRF token is the session's."""
    if config.read_only:
        return PlainTextResponse("read-only: tether serve was started without --key\n", 403)
    sid = request.scope["state"]["sid"]
    if not sessions.csrf_matches(sid, str(form.get("csrf", ""))):
        return PlainTextResponse("forbidden: missing or wrong CSRF token\n", 403)
    return None


def _etag(version: str, context: str) -> str:
    """The runs page's entity tag: what it shows (``version``) and for whom (``context``)."""
    return f'W/"{version}.{context}"'


def _shown_version(request: Request, context: str) -> str | None:
    """The page version the browser already shows, if its tag was made for this context."""
    tag = request.headers.get("if-none-match", "").strip()
    if tag.startswith("W/"):
        tag = tag[2:]
    version, _, made_for = tag.strip('"').partition(".")
    return version if version and made_for == context else None


def _when(value: Any) -> str:
    """A time as evidence and traces write it (UTC, RFC 3339); '' for none."""
    return (
        format_time(value) if isinstance(value, datetime) else ("" if value is None else str(value))
    )


def _epoch_ms(value: Any) -> int | str:
    """An RFC 3339 time (as evidence carries it) as milliseconds, for the countdown script.

    Inbox documents are shown unverified, so a malformed time is shown as no
    time (the countdown script leaves it alone), never an error page.
    """
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return ""
    if moment.tzinfo is None:
        return ""
    return int(moment.timestamp() * 1000)
