"""`tether start`: create runs for workers to claim.

A worker claims runs that exist and that nobody holds; this is how a run
comes to exist without a process that also drives it. The run's first
checkpoint is committed with no lease, so the next worker poll takes it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
from typing import Any

from tether.cli._options import add_store


def add_start(sub: Any) -> None:
    """Register ``tether start`` on the ``tether`` parser."""
    p = sub.add_parser(
        "start",
        help="create runs (their first checkpoint) for workers to claim",
        description="For each RUN, build the run's Runtime with --app (factory(store, run_id, "
        "worker) -> Runtime, the same factory `tether worker` uses), check the environment is "
        "the task's expected initial one, and commit the run's first checkpoint unleased: the "
        "next `tether worker` poll claims it. Nothing is stepped here. A run id that exists "
        "is refused.",
    )
    p.add_argument("run_ids", nargs="+", metavar="RUN", help="the ids of the runs to create")
    add_store(p)
    p.add_argument("--app", required=True, help="module:factory building a Runtime per run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_start)


def cmd_start(args: argparse.Namespace) -> int:
    from tether.core import TetherError
    from tether.runtime import load_factory
    from tether.store import open_store

    factory = load_factory(args.app)
    who = f"start-{socket.gethostname()}-{os.getpid()}"
    started: list[dict[str, Any]] = []
    store = open_store(args.store)
    try:
        for run_id in args.run_ids:
            if store.get_mark(run_id) is not None:
                raise TetherError(f"run {run_id!r} already exists in the store; pick another id")
            rt = factory(store, run_id, who)
            rt.lease_ttl_s = None  # unleased: the first worker poll claims it
            try:
                session = rt.start(run_id)
                started.append(
                    {
                        "run_id": run_id,
                        "phase": session.state.phase.value,
                        "generation": session.state.generation,
                    }
                )
            finally:
                close = getattr(rt.adapter, "close", None)
                if callable(close):
                    with contextlib.suppress(Exception):
                        close()
            if not args.json:
                print(f"run {run_id} started ({session.state.phase}); a worker claims it next")
    finally:
        store.close()
    if args.json:
        print(json.dumps({"started": started}, sort_keys=True))
    return 0
