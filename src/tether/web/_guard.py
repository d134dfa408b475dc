"""Who may use the page: the access token, the session cookie, the Host and Origin checks.

The token is printed once when the server starts (or given by the
operator). A first visit with ``?token=`` opens a session: a random id in an
HttpOnly, SameSite=Strict cookie, MACed with a per-process secret so a
guessed cookie is refused in constant time. Every other request needs that
cookie; without it the answer is 401 (no token) or 403 (a wrong one), and it
carries no data. Each session has its own CSRF token, which every form
carries in a hidden field and every POST must return.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable
from hashlib import sha256
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "tether_session"
#: Sessions kept at once; the oldest is forgotten first (its browser simply logs in again).
MAX_SESSIONS = 256

#: Sent with every answer: nothing from elsewhere runs, frames or is referred to.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer would make form POSTs say Origin: null
    "Cache-Control": "no-store",
}


class Sessions:
    """The sessions opened with the token, each with its CSRF token (in memory only)."""

    def __init__(self, token: str) -> None:
        if len(token) < 16:
            # A short token can be guessed over loopback faster than a person types it.
            raise ValueError("the access token must be at least 16 characters")
        self._token = token.encode()
        self._secret = secrets.token_bytes(32)
        self._csrf: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def open(self) -> str:
        """A new session; returns the cookie value."""
        sid = secrets.token_urlsafe(24)
        with self._lock:
            self._csrf[sid] = secrets.token_urlsafe(24)
            while len(self._csrf) > MAX_SESSIONS:
                self._csrf.popitem(last=False)
        return f"{sid}.{self._mac(sid)}"

    def session_of(self, cookie: str | None) -> str | None:
        """The session id a cookie names, if the cookie is ours and the session still open."""
        if not cookie or "." not in cookie:
            return None
        sid, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac.encode(), self._mac(sid).encode()):
            return None
        with self._lock:
            return sid if sid in self._csrf else None

    def csrf(self, sid: str) -> str:
        with self._lock:
            return self._csrf.get(sid, "")

    def csrf_matches(self, sid: str, given: str) -> bool:
        expected = self.csrf(sid)
        return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())

    def _mac(self, sid: str) -> str:
        return hmac.new(self._secret, sid.encode(), sha256).hexdigest()


def raw_path(scope: Scope) -> str:
    """The request's path as the client sent it, still percent-encoded (no query).

    ``scope["path"]`` is decoded, so a run id's ``%2F`` reads there as a ``/``;
    servers that cannot give the raw path leave only that to go by.
    """
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes):
        return quote(str(scope.get("path", "/")))
    return raw.split(b"?", 1)[0].decode("latin-1")


def _refuse(status: int, text: str) -> Response:
    return PlainTextResponse(text + "\n", status_code=status, headers=SECURITY_HEADERS)


class Guard:
    """ASGI middleware: Host check, token or session, Origin check on writes, security headers."""

    def __init__(self, app: ASGIApp, sessions: Sessions, hosts: Iterable[str] | None) -> None:
        self.app = app
        self.sessions = sessions
        #: Host headers accepted (``None``: any, when bound to every interface).
        self.hosts = None if hosts is None else frozenset(h.lower() for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        response = self._check(request)
        if response is not None:
            await response(scope, receive, send)
            return

        async def with_headers(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))  # type: ignore[call-overload]
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)  # type: ignore[arg-type]

    def _check(self, request: Request) -> Response | None:
        host = request.headers.get("host", "").lower()
        if self.hosts is not None and host not in self.hosts:
            # A page reached under another name (DNS rebinding) is not ours to serve.
            return _refuse(403, "forbidden: unexpected Host header")
        given = request.query_params.get("token")
        if given is not None:
            if not self.sessions.token_matches(given):
                return _refuse(403, "forbidden: wrong access token")
            # Open a session and drop the token from the address bar and history.
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            # The path as sent: a run id's %2F or %3F must survive the redirect.
            target = raw_path(request.scope) + (f"?{urlencode(rest)}" if rest else "")
            response = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
            response.set_cookie(
                COOKIE, self.sessions.open(), httponly=True, samesite="strict", path="/"
            )
            return response
        sid = self.sessions.session_of(request.cookies.get(COOKIE))
        if sid is None:
            if request.cookies.get(COOKIE):
                return _refuse(403, "forbidden: unknown session; open the URL with ?token=")
            return _refuse(401, "unauthorized: open the URL tether serve printed (?token=...)")
        request.scope.setdefault("state", {})["sid"] = sid
        if request.method not in {"GET", "HEAD"}:
            origin = request.headers.get("origin")
            if origin is not None and origin.lower() != f"{request.url.scheme}://{host}":
                return _refuse(403, "forbidden: cross-origin request")
            site = request.headers.get("sec-fetch-site")
            if site is not None and site not in {"same-origin", "none"}:
                return _refuse(403, "forbidden: cross-site request")
        return None
