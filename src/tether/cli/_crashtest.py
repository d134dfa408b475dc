"""`tether crashtest`: the crash harness (tether.testing.crash_harness) from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tether.cli import _progress
from tether.cli._options import add_store, as_url
from tether.runtime import CrashPoint

#: The harness found a duplicate or missing effect, a lost or phantom receipt, or a trial it
#: could not judge.
EXIT_CRASHTEST_FAILED = 4


def add_crashtest(sub: Any, count: Any) -> None:
    """Register ``tether crashtest`` on the CLI's subparsers (``count``: a whole-number type)."""
    p = sub.add_parser(
        "crashtest",
        help="SIGKILL your app at every crash point, recover it, count what the world received",
        description="Run the app's clean run once, then for every pass of every crash point "
        "start a fresh run in a child process that SIGKILLs itself there, recover it in fresh "
        "processes, and compare what the real systems received (the app's effects()) with the "
        "clean run and the run's signed ledger. --app names factory(workdir) returning an app "
        "with prepare(run_id), runtime(store, run_id, crash) and effects(run_id); see "
        "tether.testing.crash_harness. Exit 4 on any duplicate or missing effect, lost or "
        "phantom receipt, or trial that could not be judged.",
    )
    p.add_argument("--app", required=True, help="module:factory; the module is imported from . too")
    p.add_argument(
        "--trials", type=count(10_000), default=3, help="trials per pass of each point (default 3)"
    )
    p.add_argument(
        "--points",
        nargs="+",
        metavar="POINT",
        choices=[point.value for point in CrashPoint],
        help="only these crash points (default: all)",
    )
    add_store(
        p,
        required=False,
        help="the store for the runs: a SQLite file path, sqlite:///path or postgresql://... "
        "(default: a SQLite file in the working directory)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        help="directory for the app's worlds and the store, kept afterwards "
        "(default: a temporary one, removed if everything passed)",
    )
    p.add_argument("--jobs", type=count(64), default=1, help="trials run side by side (default 1)")
    p.add_argument(
        "--recoveries",
        type=count(10),
        default=2,
        help="recoveries per trial, each in a fresh process (default 2: recovery must be "
        "idempotent too)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_crashtest)


def cmd_crashtest(args: argparse.Namespace) -> int:
    from tether.testing.crash_harness import run_crash_harness

    # `tether` is a console script, so unlike `python -m` the working directory
    # is not on the import path; an app module next to the user should load.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    with _progress.bar("crashtest", enabled=_progress.wanted(args.json)) as update:
        report = run_crash_harness(
            args.app,
            trials=args.trials,
            points=None if args.points is None else [CrashPoint(p) for p in args.points],
            store_url=None if args.store is None else as_url(args.store),
            workdir=args.workdir,
            jobs=args.jobs,
            recoveries=args.recoveries,
            progress=update,
        )
    if args.json:
        print(json.dumps(report.to_json(), sort_keys=True))
    else:
        print(report.render())
        if not report.passed:
            print(f"the runs, their worlds and the store are kept in {report.workdir}")
    return 0 if report.passed else EXIT_CRASHTEST_FAILED
