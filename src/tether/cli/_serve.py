"""`tether serve`: the operator web page, over the store, on loopback by default."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from tether.cli._options import add_store
from tether.cli._sign import load_policy
from tether.core import TetherError

TOKEN_ENV = "TETHER_SERVE_TOKEN"


def add_serve(sub: Any) -> None:
    """Register ``tether serve`` on the ``tether`` parser."""
    serve = sub.add_parser(
        "serve",
        help="serve the operator web page: runs, a run's story, the inbox, signed actions",
        description="Serve a web page over the store: the runs (those waiting for a person "
        "first), one run's state, trace, ledger, pending write and review cases, and the "
        "inbox with refused evidence and why. With --key, approve, review and rewind from "
        "the page: it shows exactly the fields to be signed, signs them in this process with "
        "that key and leaves the document in the store's inbox. Every request needs the "
        "access token printed at start (or given with --token or $" + TOKEN_ENV + ").",
    )
    add_store(serve)
    serve.add_argument(
        "--key",
        type=Path,
        action="append",
        default=[],
        help="the operator's own private key file; repeat for keys of other roles "
        "(none: read-only, no forms)",
    )
    serve.add_argument(
        "--trust", type=Path, help="trust roots: refuse to sign with a key not in them"
    )
    serve.add_argument(
        "--keyring", type=Path, help="verify checkpoints and chains before showing them"
    )
    serve.add_argument(
        "--policy", type=Path, help="the runs' policy file: lifetimes are checked against it"
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8377, help="port (default 8377; 0: any free)")
    serve.add_argument(
        "--token", help=f"the access token (default: ${TOKEN_ENV}, else a random one printed once)"
    )
    serve.add_argument(
        "--json", action="store_true", help="say where the page is as one JSON object"
    )
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from tether.web import WebConfig, serve
        from tether.web._app import open_for
    except ImportError as exc:
        raise TetherError(
            f"tether serve needs the web extra: pip install 'tether[web]' ({exc})"
        ) from exc
    from tether.crypto import Keyring, Signer, TrustRoots

    given = args.token or os.environ.get(TOKEN_ENV)
    token = given or secrets.token_urlsafe(24)
    if len(token) < 16:
        raise TetherError("the access token must be at least 16 characters")
    policy = load_policy(args.policy)
    config = WebConfig(
        store=args.store,
        token=token,
        signers=tuple(Signer.from_file(path) for path in args.key),
        keyring=Keyring.from_file(args.keyring) if args.keyring else None,
        trust=TrustRoots.from_file(args.trust) if args.trust else None,
        policy=policy,
    )
    # Fail now, not on the first page: the store must exist (never created here).
    open_for(args.store, write=False).close()
    if args.host not in {"127.0.0.1", "localhost", "::1"}:
        print(
            f"tether serve: warning: bound to {args.host}, not loopback: anyone who can reach it "
            "and holds the token can use the page (plain HTTP)",
            file=sys.stderr,
        )
    serve(
        config,
        args.host,
        args.port,
        say=lambda address, mode: print(
            json.dumps({"url": address, "mode": mode})
            if args.json
            else f"tether serve: {address} ({mode})",
            flush=True,
        ),
        show_token=given is None,
    )
    return 0


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("a port is from 0 to 65535")
    return value
