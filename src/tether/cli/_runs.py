"""`tether runs`, `tether resume`, `tether cancel`: which runs wait for whom, and moving them on.

``runs`` answers "which runs need me?" from the store alone (verified when a
keyring is given), a page at a time by run id. ``resume`` makes a parked run claimable again and can
admit its next recovery with a person's signature. ``cancel`` ends a run,
in this process under the run's lease (``--app``).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tether.cli._options import add_store, open_existing, open_read
from tether.cli._recovery import sign_admission
from tether.cli._sign import (
    add_signer_arguments,
    checks,
    confirm_and_deliver,
    read_view,
)
from tether.core import OutcomeKind, Phase, RunNotFoundError, TetherError
from tether.crypto import Keyring, Signer
from tether.runtime import (
    RunSummary,
    load_factory,
    prepare_cancel,
    runs_page,
)
from tether.store import SQLiteStore

#: Runs per page of `tether runs` unless --limit says otherwise.
PAGE_SIZE = 50


def add_runs(sub: Any, seconds: Any) -> None:
    """Register ``runs``, ``resume`` and ``cancel`` on the ``tether`` parser."""
    runs = sub.add_parser(
        "runs",
        help="list runs a page at a time: phase, generation, epoch, what each waits for",
        description="List the store's runs by run id, a page at a time (--limit runs, 50 by "
        "default); the page ends with the --after value that shows the next one. --needs-me "
        "keeps the runs that wait for a person (a pending write waiting for an approval, an "
        "open review case, a run that keeps failing), --phase one phase; both are filtered "
        "in the store, so a page costs the same however many runs it holds. With --keyring "
        "every listed run's checkpoint is verified.",
    )
    add_store(runs)
    runs.add_argument("--marks", type=Path, help="separate SQLite file holding the marks")
    runs.add_argument("--keyring", type=Path, help="verify each run's checkpoint (optional)")
    runs.add_argument("--phase", choices=[p.value for p in Phase], help="only runs in this phase")
    runs.add_argument("--needs-me", action="store_true", help="only runs that wait for a person")
    runs.add_argument(
        "--limit",
        type=_page_size,
        default=PAGE_SIZE,
        help=f"runs per page, 1 to 1000 (default {PAGE_SIZE})",
    )
    runs.add_argument(
        "--after",
        metavar="RUN",
        help="start after this run id (the value the previous page ended with)",
    )
    runs.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"runs": [...], "next": the --after of the next page or null}',
    )
    runs.set_defaults(func=cmd_runs)

    resume = sub.add_parser(
        "resume",
        aliases=["retry"],
        help="make a parked run claimable again; with --key, admit its next recovery",
        description="A run that failed --max-attempts times in a row is parked: no worker "
        "claims it. Once the cause is fixed, this forgets its failed attempts and back-off, "
        "so the next worker poll claims it (a run under a live lease is left alone). With "
        "--key, it also signs an admission (like `tether admit`) that the next recovery "
        "opens its new epoch under.",
    )
    resume.add_argument("run_id", metavar="RUN")
    add_signer_arguments(
        resume,
        seconds,
        key_help="sign an admission of the next recovery with this key (optional)",
        key_required=False,
    )
    resume.set_defaults(func=cmd_resume)

    cancel = sub.add_parser(
        "cancel",
        help="end a run in cancelled: sign a cancel for its next step (--key), or do it here "
        "(--app); a write it may have sent is settled first",
        description="With --key: show what the cancel binds, check it as the runtime will (an "
        "operator's key, or a role the policy's authority.cancel names), ask, sign and leave "
        "it in the store's inbox; the run's next step (or the worker that claims it for it) "
        "ends it. With --app: take the run's lease in this process and end it now "
        "(factory(store, run_id, worker) -> Runtime). Either way a write that never left is "
        "dropped (the ledger says so), one that may have been sent is looked up first: "
        "committed -> recorded, in flight or unreachable -> the cancel waits, absent or "
        "unknowable -> needs_review (a look-up that finds nothing cannot prove a worker that "
        "lost its lease is not still sending: a reviewer decides). A run frozen "
        "for review is ended by a reviewer's abort instead. A cancelled run can't be resumed.",
    )
    cancel.add_argument("run_id", metavar="RUN")
    cancel.add_argument("--reason", required=True, help="why, for the trace")
    cancel.add_argument("--app", help="module:factory building the run's Runtime: cancel here, now")
    add_signer_arguments(
        cancel,
        seconds,
        key_help="the canceller's private key: sign a cancel for the run's next step",
        key_required=False,
    )
    cancel.set_defaults(func=cmd_cancel)


def cmd_runs(args: argparse.Namespace) -> int:
    store = open_read(args.store)
    marks = None if args.marks is None else SQLiteStore(args.marks, read_only=True)
    try:
        keyring = None if args.keyring is None else Keyring.from_file(args.keyring)
        page = runs_page(
            store,
            keyring=keyring,
            marks=marks,
            phase=args.phase,
            needs_person=args.needs_me,
            after=args.after,
            limit=args.limit,
        )
    finally:
        store.close()
        if marks is not None:
            marks.close()
    if page is None:  # unreachable: no version was passed
        raise TetherError("the store returned no page")
    rows = list(page.rows)
    if args.json:
        report = {"runs": [row.to_json() for row in rows], "next": page.after}
        print(json.dumps(report, sort_keys=True))
        return 0
    if not rows:
        print("no runs" + (" need a person" if args.needs_me else ""))
    else:
        print(_table(rows))
    if page.after is not None:
        print(f"more: run again with --after {page.after}")
    return 0


def _page_size(text: str) -> int:
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of runs: {text!r}") from None
    if not 1 <= size <= 1000:
        raise argparse.ArgumentTypeError(f"a page holds 1 to 1000 runs, not {size}")
    return size


def _table(rows: list[RunSummary]) -> str:
    now = datetime.now(UTC)
    lines = [("", "RUN", "PHASE", "GEN", "EPOCH", "SINCE", "WAITING FOR")]
    for row in rows:
        lines.append(
            (
                "!" if row.needs_person else "",
                row.run_id,
                row.phase,
                "?" if row.generation is None else str(row.generation),
                "-" if row.epoch is None else str(row.epoch),
                "-" if row.since is None else _ago(now, row.since),
                row.waiting_for or "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(6)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line[:6])) + "  " + line[6]
        for line in lines
    )


def _ago(now: datetime, then: datetime) -> str:
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def cmd_resume(args: argparse.Namespace) -> int:
    where = args.store
    if args.key is not None:
        # Everything is checked, asked and delivered before anything is cleared.
        code = sign_admission(args, "no recovery signed; nothing cleared")
        if code != 0:
            return code
    # The attempts live with the mark: in the marks file where it is kept apart.
    store = open_existing(str(args.marks) if args.marks is not None else where)
    try:
        before = store.get_mark(args.run_id)
        if before is None:
            raise RunNotFoundError(args.run_id)
        mark = store.retry_now(args.run_id)
    finally:
        store.close()
    if args.json:
        if args.key is None:  # with a key, the admission's JSON was the one object printed
            report = {
                "run_id": args.run_id,
                "phase": mark.phase,
                "failed_attempts_cleared": before.attempts,
            }
            print(json.dumps(report, sort_keys=True))
        return 0
    _say_cleared(args.run_id, mark.phase, before.attempts)
    return 0


def _say_cleared(run_id: str, phase: str, attempts: int) -> None:
    print(
        f"tether resume: run {run_id} ({phase}) had {attempts} failed attempt(s); cleared, "
        "workers claim it on their next poll"
    )


def cmd_cancel(args: argparse.Namespace) -> int:
    if (args.key is None) == (args.app is None):
        raise TetherError(
            "name one way to cancel: --key F (sign a cancel for the run's next step) or "
            "--app module:factory (cancel here, now)"
        )
    if args.key is not None:
        signer = Signer.from_file(args.key)
        prepared = prepare_cancel(
            read_view(args), signer, args.reason, now=datetime.now(UTC), **checks(args)
        )
        return confirm_and_deliver(
            args,
            prepared,
            f"Sign this cancel as {signer.signer_id}?",
            "cancel delivered (inbox #{seq}); run {run} ends at its next step, after "
            "settling any write it may have sent",
            "no cancel signed",
        )
    factory = load_factory(args.app)
    worker_id = f"cancel-{socket.gethostname()}-{os.getpid()}"
    store = open_existing(args.store)
    with store:
        if store.get_mark(args.run_id) is None and store.newest_generation(args.run_id) is None:
            raise RunNotFoundError(args.run_id)  # (a mark lost beside content: recovery says so)
        rt = factory(store, args.run_id, worker_id)
        # The cancel runs under the run's lease: a worker busy with it makes this
        # fail with LeaseHeldError rather than race it.
        rt.lease_ttl_s = rt.lease_ttl_s or 30.0
        session = rt.recover(args.run_id)
        try:
            outcome = session.cancel(args.reason, by=f"cli:{getpass.getuser()}")
        finally:
            session.release()
    if outcome.kind is not OutcomeKind.CANCELLED:
        raise TetherError(
            f"run {args.run_id} is not cancelled: {outcome.kind} ({outcome.reason}): "
            f"{outcome.message}"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "run_id": args.run_id,
                    "phase": outcome.state.phase.value,
                    "generation": outcome.state.generation,
                },
                sort_keys=True,
            )
        )
    else:
        print(
            f"tether cancel: run {args.run_id} is cancelled (generation {outcome.state.generation})"
        )
    return 0
