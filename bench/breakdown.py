"""Where one checkpoint commit's time goes on PostgreSQL: each part of the statement, alone.

A tether commit is ONE statement (``_COMMIT_STATEMENT`` in
``tether/store/_postgres.py``): the mark's compare-and-set, the envelope,
the step's trace events, its ledger entries and its blobs. This script
builds tether's real schema in a fresh schema, then commits K steps of a run
with rows shaped like the worker benchmark's (sizes taken from a real
seeded checkpoint) for a ladder of statements, each adding one part, and
prints per commit: the client's CPU (this process), the server's CPU (the
one backend, from /proc), and the wall time. The last rung is tether's own
statement; the first is the bare single-row UPDATE the benchmark compares
against.

    .venv/bin/python bench/breakdown.py [--commits 2000] [--dsn DSN]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workers  # a sibling script, not a package

TRACE_DATA = '{"action_id":"w3","kind":"file.write","target":"notes.txt"}'


def h(*parts: object) -> str:
    return "sha256:" + hashlib.sha256(repr(parts).encode()).hexdigest()


def rows(run: str, step: int, envelope_size: int) -> dict[str, Any]:
    """One step's rows: two trace events, one ledger entry, one 200-byte blob."""
    trace = [
        {
            "h": h(run, step, "t", i),
            "p": h(run, step, "t", i - 1),
            "s": 2 * step + i,
            "k": "agent_waited",
            "a": "2026-12-04T00:00:00.000000Z",
            "d": TRACE_DATA,
        }
        for i in range(2)
    ]
    ledger = [
        {
            "h": h(run, step, "l"),
            "p": h(run, step - 1, "l"),
            "s": step,
            "k": f"idem-{run}-{step}",
            "st": "intended",
            "ac": f"a{step}",
            "i": h("intent", step),
            "r": None,
            "ep": 1,
            "a": "2026-12-04T00:00:00.000000Z",
        }
    ]
    blobs = [{"g": h(run, step, "b"), "b": os.urandom(200).hex()}]
    return {
        "digest": h(run, step, "c"),
        "envelope": os.urandom(envelope_size),
        "trace": json.dumps(trace),
        "ledger": json.dumps(ledger),
        "blobs": json.dumps(blobs),
    }


def ladder(
    commit_statement: str,
) -> list[tuple[str, str, Callable[[str, int, Any], tuple[Any, ...]]]]:
    """(name, statement, params) rungs, each adding one part of the commit."""
    cas = (
        "UPDATE tether_marks SET generation = %s, checkpoint_digest = %s, "
        "state_version = state_version + 1, phase = %s, updated_at = %s "
        "WHERE run_id = %s AND generation = %s AND lease_version = %s "
        "AND (lease_version = 0 OR lease_owner IS NOT NULL)"
    )

    def cas_params(run: str, step: int, r: Any) -> tuple[Any, ...]:
        return (step + 1, r["digest"], "running", "2026-12-04T00:00:00Z", run, step, 0)

    def with_cte(*parts: str) -> str:
        ctes = [f"cas AS ({cas} RETURNING run_id, generation, checkpoint_digest)"]
        if "checkpoint" in parts:
            ctes.append(
                "c AS (INSERT INTO tether_checkpoints (run_id, checkpoint_digest, generation, "
                "envelope) SELECT run_id, checkpoint_digest, generation, %s::bytea FROM cas)"
            )
        if "trace" in parts:
            ctes.append(
                "t AS (INSERT INTO tether_trace (run_id, hash, prev_hash, seq, kind, at, data) "
                "SELECT cas.run_id, e.h, e.p, e.s, e.k, e.a, e.d FROM cas, json_to_recordset(%s::json) "
                "AS e(h text, p text, s bigint, k text, a text, d text))"
            )
        return "WITH " + ", ".join(ctes) + " SELECT count(*) FROM cas"

    return [
        (
            "bare UPDATE (the baseline)",
            "UPDATE bench_bare SET v = v + 1, body = %s WHERE id = %s",
            lambda run, step, r: (r["envelope"], int(run.split("-")[1])),
        ),
        ("mark CAS alone", cas, cas_params),
        (
            "+ envelope row",
            with_cte("checkpoint"),
            lambda run, s, r: (*cas_params(run, s, r), r["envelope"]),
        ),
        (
            "+ 2 trace rows",
            with_cte("checkpoint", "trace"),
            lambda run, s, r: (*cas_params(run, s, r), r["envelope"], r["trace"]),
        ),
        (
            "tether's statement (+ ledger row, blob)",
            commit_statement,
            lambda run, s, r: (
                *cas_params(run, s, r),
                r["envelope"],
                r["trace"],
                r["ledger"],
                r["blobs"],
            ),
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=workers.DEFAULT_DSN)
    parser.add_argument("--commits", type=int, default=2000)
    args = parser.parse_args(argv)

    import psycopg

    from tether.store import open_store
    from tether.store._postgres import _COMMIT_STATEMENT

    schema = f"tether_brk_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    url = workers.schema_url(args.dsn, schema)
    try:
        with open_store(url):
            pass  # the real schema, by tether's migrations
        envelope_size = 2200
        print(
            f"per commit, {args.commits} commits each, one connection; envelope {envelope_size} B, "
            "2 trace rows, 1 ledger row, 1 blob of 200 B (json parameters)"
        )
        print(f"{'statement':<42} {'client µs':>9} {'server µs':>9} {'wall µs':>8}")
        for index, (name, sql, params) in enumerate(ladder(_COMMIT_STATEMENT)):
            with psycopg.connect(url, autocommit=True) as conn:
                run = f"run-{index}"
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS bench_bare (id INT PRIMARY KEY, v BIGINT, body BYTEA)"
                )
                conn.execute("INSERT INTO bench_bare VALUES (%s, 0, '')", (index,))
                conn.execute(
                    "INSERT INTO tether_marks (run_id, generation, checkpoint_digest, state_version, "
                    "updated_at) VALUES (%s, 1, 'x', 1, 'x')",
                    (run,),
                )
                pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
                prepared = [rows(run, step, envelope_size) for step in range(1, args.commits + 1)]
                cpu, server, wall = time.process_time(), workers.cpu_of(pid), time.perf_counter()
                for step, r in enumerate(prepared, start=1):
                    conn.execute(sql, params(run, step, r))
                wall = time.perf_counter() - wall
                cpu = time.process_time() - cpu
                server = workers.cpu_of(pid) - server
            per = 1e6 / args.commits
            print(f"{name:<42} {cpu * per:>9.0f} {server * per:>9.0f} {wall * per:>8.0f}")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
