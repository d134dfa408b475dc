"""Write steps per second through the whole protocol, on SQLite and PostgreSQL.

Each step is one agent proposal that becomes a committed write on a
queryable, idempotent in-memory sandbox: gate, pending checkpoint, the
adapter's execute, receipt, advance. Run it with this tree's tether and with
an older one on ``PYTHONPATH`` to compare them side by side:

    python bench/write_steps.py                       # this tree
    PYTHONPATH=/path/to/old/src python bench/write_steps.py

It prints steps/s, durable commits (SQLite) or client round trips (PostgreSQL)
per write step, and this process's CPU per write step, for each store.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tether
from tether import AgentContext, Decision, Keyring, Policy, Proposal, Runtime, TaskSpec
from tether.testing import Sandbox


class Writer:
    """Writes ``notes.txt`` again at every step, built on the observed version."""

    def decide(self, context: AgentContext, observation: Any) -> Decision:
        cursor = context.plan_cursor + 1
        proposal = Proposal(
            action_id=f"w{cursor}-{uuid.uuid4().hex[:8]}",
            kind="file.write",
            target="notes.txt",
            args={"content": f"version {cursor}\n"},
            based_on_version=observation.environment.version,
        )
        return Decision(AgentContext(plan_cursor=cursor), proposal=proposal)


def runtime(store: Any, steps: int) -> Runtime:
    sandbox = Sandbox({"notes.txt": "draft\n"}, instance_id="bench")
    task = TaskSpec.from_json(
        {
            "task_id": "t",
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
            "initial_environment": {
                "namespace": "sandbox",
                "state_fingerprint": sandbox.environment().state_fingerprint,
            },
            "verifier": {"argv": ["true"], "timeout_s": 5},
        }
    )
    policy = Policy.from_json(
        {
            "policy_id": "p",
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
    return Runtime(
        store=store,
        keyring=Keyring.generate("bench"),
        adapter=sandbox,
        task=task,
        policy=policy,
        agent=Writer(),
    )


def measure(store: Any, steps: int, commits: list[int]) -> tuple[float, float, float]:
    """Write steps/s, durable transactions per write step (``commits`` counts COMMITs), and
    this process's CPU milliseconds per write step (what a loaded machine does not blur)."""
    session = runtime(store, steps).start(f"bench-{uuid.uuid4().hex[:8]}")
    session.step()  # warm up
    before = commits[0]
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        session.step()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return steps / elapsed, (commits[0] - before) / steps, cpu * 1000 / steps


def count_sqlite_commits(store: Any) -> list[int]:
    """Count COMMIT statements on the store's connection (a bench may look inside)."""
    counter = [0]

    def trace(statement: str) -> None:
        if statement.strip().upper() == "COMMIT":
            counter[0] += 1

    store._conn.set_trace_callback(trace)
    return counter


def count_pg_round_trips(store: Any) -> list[int]:
    """Count client round trips: each statement, plus BEGIN and COMMIT of a transaction block."""
    counter = [0]
    execute, transaction = store._execute, store._transaction

    def counted_execute(sql: str, params: Any = ()) -> Any:
        counter[0] += 1
        return execute(sql, params)

    @contextmanager
    def counted_transaction(conn: Any) -> Iterator[None]:
        counter[0] += 2
        with transaction(conn):
            yield

    store._execute, store._transaction = counted_execute, counted_transaction
    return counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pg", default=os.environ.get("TETHER_TEST_PG_DSN", ""))
    args = parser.parse_args(argv)
    where = Path(tether.__file__).parent.parent
    print(f"tether from {where}")
    with tempfile.TemporaryDirectory() as tmp:
        store = tether.SQLiteStore(Path(tmp) / "bench.sqlite")
        rate, commits, cpu = measure(store, args.steps, count_sqlite_commits(store))
        store.close()
        print(
            f"  sqlite   : {rate:7.1f} write steps/s, {commits:.1f} durable commits per write "
            f"step, {cpu:.2f} ms CPU per write step"
        )
    if args.pg:
        import psycopg

        from tether.store import PostgresStore

        schema = f"bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(args.pg, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
            try:
                sep = "&" if "?" in args.pg else "?"
                pg = PostgresStore(f"{args.pg}{sep}options=-csearch_path%3D{schema}")
                rate, trips, cpu = measure(pg, args.steps, count_pg_round_trips(pg))
                pg.close()
                print(
                    f"  postgres : {rate:7.1f} write steps/s, {trips:.1f} round trips per write "
                    f"step, {cpu:.2f} ms client CPU per write step"
                )
            finally:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
