"""Run the page: bind the socket, say where it is (once), serve until stopped."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import replace

from tether.web._app import WebConfig, create_app


def hosts_for(host: str, port: int) -> tuple[str, ...] | None:
    """The Host headers a browser sends for ``host:port`` (``None`` on a wildcard bind)."""
    try:
        if ipaddress.ip_address(host).is_unspecified:
            return None  # every interface: the page cannot know its names
    except ValueError:
        pass
    names = {host}
    if host in {"127.0.0.1", "::1", "localhost"}:
        names |= {"127.0.0.1", "localhost", "[::1]"}
    return tuple(sorted(f"{name}:{port}" for name in names))


def serve(
    config: WebConfig,
    host: str = "127.0.0.1",
    port: int = 8377,
    *,
    say: Callable[[str, str], None] = lambda address, mode: print(
        f"tether serve: {address} ({mode})"
    ),
    show_token: bool = True,
) -> None:
    """Serve the page on ``host:port`` (port 0: any free one) until SIGINT or SIGTERM.

    ``say(address, mode)`` is told once where the page is, the address
    carrying the token when ``show_token`` (a token the operator chose is
    not repeated); by default it prints one line.
    """
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(64)
    bound = sock.getsockname()[1]
    config = replace(config, hosts=hosts_for(host, bound))
    app = create_app(config)
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    mode = (
        "read-only"
        if config.read_only
        else "signing as " + ", ".join(f"{s.signer_id} ({s.role.value})" for s in config.signers)
    )
    address = f"http://{shown}:{bound}/"
    if show_token:
        address += f"?token={config.token}"
    if say is None:
        print(f"tether serve: {address} ({mode})", flush=True)
    else:
        say(address, mode)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])
