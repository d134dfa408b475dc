"""Many runs, few fsyncs: one worker driving 64 runs on SQLite, beside one run alone.

Side by side in one run, on one disk: a `Worker` (the code `tether worker`
runs) drives

- one run alone (``concurrency=1``), with the store's group commit on and
  off (off: every commit a transaction of its own, as before it), and
- 64 runs at once (``concurrency=64``, one thread each), whose commits meet
  in the store's group commit: one transaction, one fsync, for the commits
  queued while the previous transaction was being written, each still
  fenced by its own run's lease and generation.

Each step is one agent proposal that becomes a committed write on an
in-memory sandbox of the run's own (the workload of ``bench/write_steps.py``:
gate, pending checkpoint, execute, receipt riding on the next commit), so
the store's commits are what is measured. Printed for each side: steps
(checkpoints landed),
aggregate steps/s, durable commits (write transactions the store committed,
every one: claims, lease renewals and releases too) per step, the average
number of commits per transaction, and the duplicate effects (writes the
sandboxes received minus effects the ledgers
committed; must be 0). The verdict: at most one durable commit per 4 steps
in aggregate with 64 runs.

The store runs at ``synchronous=FULL`` (the default): every transaction's
COMMIT waits for its fsync.

    .venv/bin/python bench/many_runs.py [--runs 64] [--steps 40] [--alone-steps 200] [--repeat 1]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tether import AgentContext, Decision, Keyring, Policy, Proposal, Runtime, TaskSpec
from tether.runtime import Worker
from tether.store import SQLiteStore
from tether.testing import Sandbox

#: The verdict's bound: durable commits per step, in aggregate.
COMMITS_PER_STEP = 1 / 4


class Writer:
    """Writes ``notes.txt`` again at every step, built on the observed version; then finishes."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def decide(self, context: AgentContext, observation: Any) -> Decision:
        cursor = context.plan_cursor + 1
        if cursor > self.steps:
            return Decision(AgentContext(plan_cursor=cursor), finished=True)
        proposal = Proposal(
            action_id=f"w{cursor}-{uuid.uuid4().hex[:8]}",
            kind="file.write",
            target="notes.txt",
            args={"content": f"version {cursor}\n"},
            based_on_version=observation.environment.version,
        )
        return Decision(AgentContext(plan_cursor=cursor), proposal=proposal)


def task_and_policy(fingerprint: str, steps: int) -> tuple[TaskSpec, Policy]:
    task = TaskSpec.from_json(
        {
            "task_id": "many",
            "task_version": "1",
            "allowed_kinds": ["file.write"],
            "allowed_paths": ["notes.txt"],
            "permissions": ["workspace.write"],
            "budgets": {
                "proposals": steps + 10,
                "steps": steps + 10,
                "wall_time_s": 3600,
                "cost": 0,
            },
            "initial_environment": {"namespace": "sandbox", "state_fingerprint": fingerprint},
            "verifier": {"argv": ["true"], "timeout_s": 5},
        }
    )
    policy = Policy.from_json(
        {
            "policy_id": "many",
            "policy_version": "1",
            "kinds": {
                "file.write": {
                    "risk": "low",
                    "permission": "workspace.write",
                    "needs_approval": False,
                }
            },
            "max_risk": "medium",
            "approval_ttl_s": 600,
        }
    )
    return task, policy


def drive(
    runs: int, steps: int, *, grouped: bool = True, pg: str | None = None
) -> dict[str, float]:
    """Seed ``runs`` runs in a fresh SQLite store; one worker drives them all at once.

    ``grouped=False``: the store writes every commit in a transaction of its
    own (as before group commit), for the single run's side by side. ``pg``:
    a PostgreSQL DSN instead (a fresh schema; the fsyncs counted are the
    server's WAL syncs, ``pg_stat_wal.wal_sync``, of the whole cluster).
    """
    keyring = Keyring.generate("bench")
    # One sandbox per run, kept across the runtimes built for it (the service it writes to).
    sandboxes = {f"run-{i:03d}": Sandbox({"notes.txt": "draft\n"}) for i in range(runs)}

    def factory(store: Any, run_id: str, worker: str) -> Runtime:
        sandbox = sandboxes[run_id]
        task, policy = task_and_policy(sandbox.environment().state_fingerprint, steps)
        return Runtime(
            store=store,
            keyring=keyring,
            adapter=sandbox,
            task=task,
            policy=policy,
            agent=Writer(steps),
            worker=worker,
        )

    with contextlib.ExitStack() as stack:
        if pg is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tether-many-"))
            store: Any = stack.enter_context(SQLiteStore(Path(tmp) / "tether.sqlite"))
        else:
            store = stack.enter_context(_pg_store(pg, runs))
        if not grouped:
            store._group = None
        for run_id in sandboxes:
            factory(store, run_id, "seeder").start(run_id)  # genesis only, no lease
        before = sum(mark.generation for mark in store.runs())
        worker = Worker(
            store, factory, "bench-worker", lease_ttl_s=60, poll_s=0.01, concurrency=runs
        )
        group = store._group
        batches = 0 if group is None else group.batches
        carried = 0 if group is None else group.commits
        syncs = _wal_syncs(pg)
        transactions = store.transactions_committed
        started = time.perf_counter()
        worker.serve(idle_exit=True)
        elapsed = time.perf_counter() - started
        transactions = store.transactions_committed - transactions
        syncs = _wal_syncs(pg) - syncs
        if group is not None:
            batches, carried = group.batches - batches, group.commits - carried
        marks = store.runs()
        landed = sum(mark.generation for mark in marks) - before
        duplicates = 0
        for mark in marks:
            committed = sum(e.status.value == "committed" for e in store.ledger(mark.run_id))
            duplicates += sandboxes[mark.run_id].write_count() - committed
        return {
            "runs": runs,
            "completed": sum(mark.phase == "completed" for mark in marks),
            "steps": landed,
            "seconds": elapsed,
            "rate": landed / elapsed,
            "per_step": transactions / landed,
            "transactions": transactions,
            "batch": carried / batches if batches else 0.0,
            "duplicates": duplicates,
            "syncs": syncs / landed,
        }


@contextlib.contextmanager
def _pg_store(dsn: str, runs: int) -> Iterator[Any]:
    import psycopg

    from tether.store import PostgresStore

    schema = f"bench_many_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        joiner = "&" if "?" in dsn else "?"
        url = f"{dsn}{joiner}options=-csearch_path%3D{schema}"
        with PostgresStore(url, max_connections=min(runs, 16) + 2) as store:
            yield store
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def _wal_syncs(dsn: str | None) -> int:
    """The cluster's WAL syncs so far (PostgreSQL 14+), or 0 (SQLite: counted as transactions)."""
    if dsn is None:
        return 0
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    return 0 if row is None else int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40, help="agent steps per run")
    parser.add_argument(
        "--alone-steps",
        type=int,
        default=200,
        help="agent steps of the single run (more than --steps: one fsync each is noisy)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--pg",
        nargs="?",
        const=os.environ.get("TETHER_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
        help="also drive the runs on PostgreSQL, with the store's group commit and without "
        "(each commit its own transaction, on the pool's connections at once): prints WAL "
        "syncs per step",
    )
    args = parser.parse_args()
    print(
        f"{'side':<16} {'done':>7} {'steps':>6} {'steps/s':>8} {'commits':>8} "
        f"{'commits/step':>12} {'avg batch':>9} {'dup':>3}"
    )
    ratios: list[float] = []
    alone: list[float] = []
    per_step: list[float] = []
    duplicates = 0
    for _ in range(args.repeat):
        sides = [
            ("1 run, ungrouped", drive(1, args.alone_steps, grouped=False)),
            ("1 run alone", drive(1, args.alone_steps)),
            (f"{args.runs} runs", drive(args.runs, args.steps)),
        ]
        for name, side in sides:
            print(
                f"{name:<16} {side['completed']:>3.0f}/{side['runs']:<3.0f} {side['steps']:>6.0f} "
                f"{side['rate']:>8.1f} {side['transactions']:>8.0f} {side['per_step']:>12.3f} "
                f"{side['batch']:>9.1f} {side['duplicates']:>3.0f}"
            )
            duplicates += int(side["duplicates"])
        ungrouped, single, many = (side for _, side in sides)
        alone.append(single["rate"] / ungrouped["rate"])
        ratios.append(many["rate"] / single["rate"])
        per_step.append(many["per_step"])
    worst = max(per_step)
    verdict = "met" if worst <= COMMITS_PER_STEP and duplicates == 0 else "NOT met"
    print(
        f"one run alone, group commit on over off: {statistics.median(alone):.2f}x steps/s "
        f"(median of {len(alone)})"
    )
    print(
        f"aggregate steps/s, {args.runs} runs over 1 run alone: {statistics.median(ratios):.2f}x "
        f"(median of {len(ratios)}); durable commits per step with {args.runs} runs: "
        f"{worst:.3f} (worst of {len(per_step)}); duplicate effects: {duplicates}"
    )
    print(f"verdict (<= 1 commit per 4 steps, 0 duplicates): {verdict}")
    if args.pg:
        print("PostgreSQL (WAL syncs are the whole cluster's, so an upper bound):")
        for name, runs, steps, grouped in (
            ("1 run alone", 1, args.alone_steps, True),
            (f"{args.runs} runs", args.runs, args.steps, True),
            (f"{args.runs}, ungrouped", args.runs, args.steps, False),
        ):
            side = drive(runs, steps, pg=args.pg, grouped=grouped)
            print(
                f"  {name:<16} {side['completed']:>3.0f}/{side['runs']:<3.0f} "
                f"{side['rate']:>8.1f} steps/s, {side['per_step']:.3f} transactions and "
                f"{side['syncs']:.3f} WAL syncs per step, duplicates {side['duplicates']:.0f}"
            )


if __name__ == "__main__":
    main()
