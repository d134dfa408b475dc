"""The ``tether`` command: a thin layer over the public API.

Library errors become CLI errors in one place (:func:`main`). Exit codes:
0 success; 1 a tether error; 2 bad usage; 3 (``verify``) an integrity
failure: the checkpoint is not sound; 4 (``crashtest``) the app repeated an
effect, lost or invented a receipt, or a trial could not be judged.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether import __version__
from tether._demo import SCENARIOS
from tether.cli import _guard
from tether.cli._crashtest import add_crashtest
from tether.cli._demo_child import CHILD_COMMAND
from tether.cli._demo_cmd import child_parser, cmd_demo
from tether.cli._inspect import add_paging, add_reader, cmd_inspect, cmd_verify
from tether.cli._mcp import add_mcp
from tether.cli._onboard import add_onboarding
from tether.cli._options import add_store, sqlite_file
from tether.cli._recovery import add_recovery
from tether.cli._runs import add_runs
from tether.cli._serve import add_serve
from tether.cli._sign import add_signing
from tether.cli._start import add_start
from tether.core._spec import MAX_APPROVAL_TTL_S
from tether.runtime import CrashPoint, Worker

EXIT_ERROR = _guard.EXIT_ERROR
EXIT_USAGE = _guard.EXIT_USAGE
EXIT_INTEGRITY = _guard.EXIT_INTEGRITY


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tether`` console script."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == [CHILD_COMMAND]:
        # The demo's own child process: not a command a person types, so not in --help.
        parser = child_parser()
        args_in = args_in[1:]
    else:
        parser = _parser()

    def body() -> int:
        args = parser.parse_args(args_in)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USAGE
        code: int = args.func(args)
        return code

    return _guard.guarded(args_in, body, json_out=_guard.wants_json(args_in))


@functools.cache
def _parser() -> argparse.ArgumentParser:
    # Built once per process: parsing does not change it, and building it costs
    # more than most commands (a caller that runs many commands in-process).
    return build_parser()


def build_parser() -> argparse.ArgumentParser:
    parser = _guard.TopParser(
        prog="tether",
        description="Recoverable agent runs that never repeat a real-world side effect.",
        epilog="Every command takes --help. Commands that read or write runs name the store "
        "with --store: a SQLite file path, sqlite:///path.sqlite or postgresql://user@host/db. "
        "Commands that make files name where with --out.",
    )
    parser.add_argument("--version", action="version", version=f"tether {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_guard.Parser)
    parser.commands = sub

    demo = sub.add_parser(
        "demo",
        help="repair a file in a real workspace, optionally crashing and recovering",
        description="Run a scripted agent that repairs calc.py in a temporary workspace, "
        "verifies it with a test command and finishes. With --crash-at it kills itself "
        "(SIGKILL) at that point and recovers the run in a new process. "
        "--scenario support-desk runs a reply file, a ticket service over HTTP and a mail "
        "server over SMTP instead, and counts what each of them received.",
    )
    demo.add_argument(
        "--crash-at",
        metavar="POINT",
        choices=[p.value for p in CrashPoint],
        help="SIGKILL the run at this crash point, then recover it",
    )
    demo.add_argument(
        "--crash-hit",
        metavar="N",
        type=_count(10**6),
        default=1,
        help="fire at the N-th time the point is reached (default 1)",
    )
    demo.add_argument(
        "--list-crash-points",
        action="store_true",
        help="print the crash point names, one a line, and exit",
    )
    where = demo.add_mutually_exclusive_group()
    where.add_argument(
        "--store",
        dest="db",
        metavar="STORE",
        type=sqlite_file,
        help="the SQLite store file to create, by path or sqlite:///path (default: in a new "
        "temp dir)",
    )
    where.add_argument("--db", dest="db", type=sqlite_file, help=argparse.SUPPRESS)
    demo.add_argument(
        "--marks", type=Path, help="keep the high-water mark in this separate SQLite file"
    )
    demo.add_argument("--workspace", type=Path, help="workspace directory (default: temp dir)")
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        default="repair",
        help="approval: an approval expires while the run is down and a person refreshes it; "
        "conflict: same key, different intent, resolved by a signed replan; "
        "support-desk: write a reply file, open a ticket over HTTP and email the customer "
        "over SMTP (needs tether[demo]); notify: email a customer, fail, and have an "
        "operator rewind context and workspace to before the send; the email is not sent "
        "again (needs tether[demo])",
    )
    demo.add_argument(
        "--mail-lookup",
        action="store_true",
        help="support-desk: let the SMTP adapter search the mail server's Maildir, so an "
        "uncertain email is reconciled instead of going to review",
    )
    demo.set_defaults(func=cmd_demo)

    inspect = add_reader(
        sub, "inspect", "show a run's state, pending write, ledger and trace", cmd_inspect
    )
    inspect.add_argument(
        "--full",
        action="store_true",
        help="print every trace event's data whole (default: one bounded line each)",
    )
    add_paging(inspect, trace=True)
    add_reader(
        sub,
        "verify",
        "check a run's newest checkpoint against the key and the mark (exit 3 if unsound)",
        cmd_verify,
    )
    add_signing(sub, _seconds(MAX_APPROVAL_TTL_S))
    add_onboarding(sub)
    add_start(sub)
    worker = sub.add_parser(
        "worker",
        help="run a recovery worker that claims runs whose lease expired",
        description="Claim runs whose lease has expired (PostgreSQL: FOR UPDATE SKIP LOCKED), "
        "admit and resume them, renew the lease while working, and on SIGTERM finish the "
        "current step and release the lease. --app names factory(store, run_id, worker) -> "
        "Runtime.",
    )
    add_store(worker)
    worker.add_argument("--app", required=True, help="module:factory building a Runtime per run")
    worker.add_argument("--id", help="this worker's id (default: host-pid-random)")
    worker.add_argument(
        "--lease-ttl",
        type=_seconds(24 * 3600, real=True),
        default=15.0,
        help="lease seconds (default 15, at most a day)",
    )
    worker.add_argument(
        "--poll",
        type=_seconds(3600, real=True, minimum=Worker.MIN_POLL_S),
        default=0.5,
        help=f"seconds between claims when idle (at least {Worker.MIN_POLL_S:g}, at most an hour)",
    )
    worker.add_argument("--max-runs", type=_count(10**9), help="stop after claiming this many runs")
    worker.add_argument(
        "--concurrency",
        type=_count(1024),
        default=1,
        help="drive this many runs at once, one thread each; their commits that meet are "
        "written together (one transaction, one fsync on SQLite), each fenced by its own "
        "lease (default 1, at most 1024)",
    )
    worker.add_argument(
        "--max-attempts",
        type=_count(1000),
        default=5,
        help="park a run in needs_review (worker_error) after this many failed steps in a row "
        "(default 5)",
    )
    worker.add_argument(
        "--backoff",
        type=_seconds(24 * 3600, real=True),
        default=1.0,
        help="how long to leave a run alone before trying it again, when a step failed or "
        "got nowhere (the service was down, a request was still in flight, the agent asked "
        "for nothing); the wait doubles each time in a row, with some randomness, and other "
        "runs are worked on meanwhile (default 1 s)",
    )
    worker.add_argument(
        "--max-backoff",
        type=_seconds(366 * 24 * 3600, real=True),
        default=300.0,
        help="the longest that wait grows to (default 300 s)",
    )
    worker.add_argument(
        "--idle-exit", action="store_true", help="exit when no run is waiting to be claimed"
    )
    worker.add_argument(
        "--json",
        action="store_true",
        help="the summary at exit is one JSON object on stdout either way (logs go to stderr)",
    )
    worker.set_defaults(func=cmd_worker)
    add_runs(sub, _seconds(MAX_APPROVAL_TTL_S))
    add_recovery(sub, _seconds(MAX_APPROVAL_TTL_S))
    add_crashtest(sub, _count)
    add_serve(sub)
    add_mcp(sub, _seconds(24 * 3600, real=True))
    return parser


def cmd_worker(args: argparse.Namespace) -> int:
    import json
    import logging
    import os
    import secrets
    import socket

    from tether.runtime import Worker, install_signal_handlers, load_factory
    from tether.store import open_store

    logging.basicConfig(level=logging.INFO, format="tether worker: %(message)s")
    factory = load_factory(args.app)
    worker_id = args.id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
    with open_store(args.store) as store:
        worker = Worker(
            store,
            factory,
            worker_id,
            lease_ttl_s=args.lease_ttl,
            poll_s=args.poll,
            max_attempts=args.max_attempts,
            backoff_s=args.backoff,
            max_backoff_s=args.max_backoff,
            concurrency=args.concurrency,
        )
        install_signal_handlers(worker)
        stats = worker.serve(max_runs=args.max_runs, idle_exit=args.idle_exit)
    print(
        json.dumps(
            {
                "worker": worker_id,
                "claimed": stats.claimed,
                "completed": stats.completed,
                "waiting": stats.waiting,
                "lost": stats.lost,
                "errors": stats.errors,
                "parked": stats.parked,
                "runs": stats.runs,
            },
            sort_keys=True,
        )
    )
    return 0


def _seconds(maximum: int, *, real: bool = False, minimum: float = 0.0) -> Any:
    """An argparse type: a number of seconds above 0 (and at least ``minimum``) up to
    ``maximum`` (else a usage error)."""

    def parse(text: str) -> float | int:
        try:
            value: float | int = float(text) if real else int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not (0 < value <= maximum and value >= minimum):  # also refuses nan
            least = f"at least {minimum:g}" if minimum else "more than 0"
            raise argparse.ArgumentTypeError(f"must be {least} and at most {maximum} seconds")
        return value

    return parse


def _count(maximum: int) -> Any:
    """An argparse type: a whole number from 1 to ``maximum`` (else a usage error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not 1 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be from 1 to {maximum}")
        return value

    return parse
