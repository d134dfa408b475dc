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

from tether._demo import SCENARIOS
from tether.cli._crashtest import add_crashtest
from tether.cli._demo_cmd import cmd_demo, cmd_demo_child
from tether.cli._inspect import add_reader, cmd_inspect, cmd_verify
from tether.cli._recovery import add_recovery
from tether.cli._sign import cmd_approve, cmd_fork, cmd_keys_new, cmd_review
from tether.core import MAX_APPROVAL_TTL_S, IntegrityError, TetherError
from tether.runtime import CrashPoint

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTEGRITY = 3


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tether`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code: int = args.func(args)
        return code
    except IntegrityError as exc:
        _error(f"integrity: {type(exc).__name__}: {exc}")
        return EXIT_INTEGRITY if args.command in {"verify", "inspect"} else EXIT_ERROR
    except TetherError as exc:
        _error(f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR


@functools.cache
def _parser() -> argparse.ArgumentParser:
    # Built once per process: parsing does not change it, and building it costs
    # more than most commands (a caller that runs many commands in-process).
    return build_parser()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tether",
        description="Recoverable agent runs that never repeat a real-world side effect.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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
        type=int,
        default=1,
        help="fire at the N-th time the point is reached (default 1)",
    )
    demo.add_argument(
        "--list-crash-points",
        action="store_true",
        help="print the crash point names, one a line, and exit",
    )
    demo.add_argument("--db", type=Path, help="SQLite store file (default: in a new temp dir)")
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

    child = sub.add_parser("_demo-child", help=argparse.SUPPRESS)
    child.add_argument("stage", choices=["start", "recover", "take-evidence"])
    child.add_argument("--db", type=Path, required=True)
    child.add_argument("--marks", type=Path)
    child.add_argument("--store", help="store URL instead of the SQLite file (e.g. PostgreSQL)")
    child.add_argument("--lease-ttl", type=float, help="take the run's lease for this long")
    child.add_argument("--workspace", type=Path, required=True)
    child.add_argument("--crash-at", choices=[p.value for p in CrashPoint])
    child.add_argument("--crash-hit", type=int, default=1)
    child.add_argument("--scenario", choices=list(SCENARIOS), default="repair")
    child.set_defaults(func=cmd_demo_child)

    for name, helptext, func in (
        ("inspect", "show a run's state, pending write, ledger and trace", cmd_inspect),
        (
            "verify",
            "check a run's newest checkpoint against the key and the mark (exit 3 if unsound)",
            cmd_verify,
        ),
    ):
        add_reader(sub, name, helptext, func)
    keys = sub.add_parser(
        "keys",
        help="make signing keys for approvers and reviewers",
        description="Make signing keys for the people who approve writes or decide reviews.",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    new = keys_sub.add_parser(
        "new",
        help="write an Ed25519 key pair: NAME.key (0600) and NAME.trust.json (public)",
        description="Write an Ed25519 key pair. The private key file is mode 0600 and stays "
        "with the person; only NAME.trust.json (the public half) is given to the runtime.",
    )
    new.add_argument(
        "--role",
        choices=["approver", "reviewer", "operator", "worker"],
        required=True,
        help="what the key may sign: approver (approvals), reviewer (review decisions, "
        "forks, rewinds), operator (forks, rewinds, admissions), worker (its own recoveries)",
    )
    new.add_argument("--id", required=True, help="the signer's id, e.g. alice")
    new.add_argument("--out", default=".", help="directory for the two files (default: .)")
    new.set_defaults(func=cmd_keys_new)

    approve = sub.add_parser(
        "approve",
        help="sign an approval for a run's pending write",
        description="Show the fields an approval binds, ask, sign with --key and leave the "
        "signed approval in the store's inbox for the run's next step.",
    )
    approve.add_argument("run_id", metavar="RUN")
    approve.add_argument("action", metavar="ACTION", help="the pending action id")
    approve.add_argument("--key", type=Path, required=True, help="the approver's private key file")
    where = approve.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=Path, help="SQLite store file")
    where.add_argument("--store", help="store URL: sqlite:///path or postgresql://...")
    approve.add_argument(
        "--ttl",
        type=_seconds(MAX_APPROVAL_TTL_S),
        help="seconds the approval lives (default: the policy's approval_ttl_s, at most 900)",
    )
    approve.add_argument(
        "--policy", type=Path, help="the run's policy file: the ttl is checked against it"
    )
    approve.add_argument(
        "--keyring", type=Path, help="verify the checkpoint before showing it (optional)"
    )
    approve.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    approve.set_defaults(func=cmd_approve)

    review = sub.add_parser(
        "review",
        help="sign a decision (replan or abort) for an open review case",
        description="Show the case, ask, sign the decision with --key and leave it in the "
        "store's inbox; the runtime rereads the adapter's receipt before applying it.",
    )
    review.add_argument("run_id", metavar="RUN")
    review.add_argument("case", metavar="CASE", help="the review case id")
    review.add_argument(
        "--decision",
        choices=["replan", "abort", "accept"],
        required=True,
        help="replan: quarantine the key and plan anew; abort: fail the run",
    )
    review.add_argument("--key", type=Path, required=True, help="the reviewer's private key file")
    review.add_argument(
        "--ttl",
        type=_seconds(MAX_APPROVAL_TTL_S),
        help="seconds the decision stays valid (default: the policy's ttl, at most 900)",
    )
    review.add_argument(
        "--policy", type=Path, help="the run's policy file: the ttl is checked against it"
    )
    where = review.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=Path, help="SQLite store file")
    where.add_argument("--store", help="store URL: sqlite:///path or postgresql://...")
    review.add_argument(
        "--keyring", type=Path, help="verify the checkpoint before showing it (optional)"
    )
    review.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    review.set_defaults(func=cmd_review)

    fork = sub.add_parser(
        "fork",
        help="sign a fork: do an effect the run already committed once more, on purpose",
        description="Without a fork, a proposal equal to an effect the run committed is "
        "replayed (its receipt returned, nothing sent). Show the effect's earlier receipt, "
        "ask, sign with --key (a reviewer's or operator's) and leave it in the store's inbox.",
    )
    fork.add_argument("run_id", metavar="RUN")
    fork.add_argument("effect", metavar="EFFECT", help="the effect digest (see effect_replayed)")
    fork.add_argument("--key", type=Path, required=True, help="the signer's private key file")
    fork.add_argument(
        "--ttl",
        type=_seconds(MAX_APPROVAL_TTL_S),
        help="seconds the fork stays valid (default: the policy's ttl, at most 900)",
    )
    fork.add_argument(
        "--policy", type=Path, help="the run's policy file: the ttl is checked against it"
    )
    where = fork.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", type=Path, help="SQLite store file")
    where.add_argument("--store", help="store URL: sqlite:///path or postgresql://...")
    fork.add_argument(
        "--keyring", type=Path, help="verify the checkpoint and ledger before showing them"
    )
    fork.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    fork.set_defaults(func=cmd_fork)
    worker = sub.add_parser(
        "worker",
        help="run a recovery worker that claims runs whose lease expired",
        description="Claim runs whose lease has expired (PostgreSQL: FOR UPDATE SKIP LOCKED), "
        "admit and resume them, renew the lease while working, and on SIGTERM finish the "
        "current step and release the lease. --app names factory(store, run_id, worker) -> "
        "Runtime.",
    )
    worker.add_argument("--store", required=True, help="sqlite:///path.sqlite or postgresql://...")
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
        type=_seconds(3600, real=True),
        default=0.5,
        help="seconds between claims when idle (at most an hour)",
    )
    worker.add_argument("--max-runs", type=_count(10**9), help="stop after claiming this many runs")
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
        help="first retry delay after a failed step, doubled per failure (default 1 s)",
    )
    worker.add_argument(
        "--max-backoff",
        type=_seconds(366 * 24 * 3600, real=True),
        default=300.0,
        help="cap on the retry delay (default 300 s)",
    )
    worker.add_argument(
        "--idle-exit", action="store_true", help="exit when no run is waiting to be claimed"
    )
    worker.set_defaults(func=cmd_worker)
    cancel = sub.add_parser(
        "cancel",
        help="end a run in cancelled; a write it may have sent is settled first",
        description="Take the run's lease, then end it in cancelled. A write that never left "
        "is dropped (the ledger says so); one that may have been sent is looked up first: "
        "committed -> recorded, absent -> dropped, unknowable -> needs_review. A cancelled run "
        "can't be resumed. --app names factory(store, run_id, worker) -> Runtime.",
    )
    cancel.add_argument("run_id", help="the run to cancel")
    cancel.add_argument("--store", required=True, help="sqlite:///path.sqlite or postgresql://...")
    cancel.add_argument("--app", required=True, help="module:factory building the run's Runtime")
    cancel.add_argument("--reason", required=True, help="why, for the trace")
    cancel.set_defaults(func=cmd_cancel)
    retry = sub.add_parser(
        "retry",
        help="clear a run's failed attempts so workers claim it again",
        description="A run that failed --max-attempts times before it could even be restored "
        "is parked at the mark: no claim takes it. Once the cause is fixed, this forgets its "
        "attempts and back-off; the next worker poll claims it. A run under a live lease is "
        "left alone.",
    )
    retry.add_argument("run_id", help="the run to try again")
    retry.add_argument("--store", required=True, help="sqlite:///path.sqlite or postgresql://...")
    retry.set_defaults(func=cmd_retry)
    add_recovery(sub, _seconds(MAX_APPROVAL_TTL_S))
    add_crashtest(sub, _count)
    return parser


def cmd_retry(args: argparse.Namespace) -> int:
    from tether.cli._sign import open_existing

    store = open_existing(args.store)
    try:
        before = store.get_mark(args.run_id)
        mark = store.retry_now(args.run_id)
    finally:
        store.close()
    tried = 0 if before is None else before.attempts
    print(
        f"tether retry: run {args.run_id} ({mark.phase}) had {tried} failed attempt(s); "
        "cleared, workers claim it on their next poll"
    )
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    import getpass
    import os
    import socket

    from tether.core import OutcomeKind
    from tether.runtime import load_factory
    from tether.store import open_store

    factory = load_factory(args.app)
    worker_id = f"cancel-{socket.gethostname()}-{os.getpid()}"
    with open_store(args.store) as store:
        rt = factory(store, args.run_id, worker_id)
        # The cancel runs under the run's lease: a worker busy with it makes this
        # fail with LeaseHeldError rather than race it.
        rt.lease_ttl_s = rt.lease_ttl_s or 30.0
        session = rt.recover(args.run_id)
        try:
            outcome = session.cancel(args.reason, by=f"cli:{getpass.getuser()}")
        finally:
            session.release()
    if outcome.kind is OutcomeKind.CANCELLED:
        print(
            f"tether cancel: run {args.run_id} is cancelled (generation {outcome.state.generation})"
        )
        return 0
    _error(
        f"run {args.run_id} is not cancelled: {outcome.kind} ({outcome.reason}): {outcome.message}"
    )
    return EXIT_ERROR


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


def _seconds(maximum: int, *, real: bool = False) -> Any:
    """An argparse type: a positive number of seconds up to ``maximum`` (else a usage error)."""

    def parse(text: str) -> float | int:
        try:
            value: float | int = float(text) if real else int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not 0 < value <= maximum:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be more than 0 and at most {maximum} seconds")
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


def _error(message: str) -> None:
    print(f"tether: error: {message}", file=sys.stderr)
