"""Where tether's bytes per write step go: each table and index, and each column's content.

Runs the same side ``bench/compare.py`` runs (``tether-sqlite``, ``tether-pg``:
one ``RunSession.step()`` per step, a ~2 KB state rewritten every step), and
after ``--warm`` steps reads the store twice, ``--window`` steps apart:

- **physical**: what each table, index and TOAST relation grows by per step
  (SQLite: the ``dbstat`` pages of each b-tree, after folding the WAL in;
  PostgreSQL: ``pg_relation_size`` of each relation), which sums to what
  ``bench/compare.py`` reports as bytes per step;
- **logical**: per table, rows written per step and the bytes of each column
  (SQLite ``length()``, PostgreSQL ``pg_column_size``), so the envelope, the
  parts, the trace and the ledger can be told apart from page overhead.

``--peers`` adds the DBOS side (its store's bytes per step) in the same run.
``--base DIR`` also measures the tether of another checkout (its ``src``
first on the path, in a child process), for a before/after in one run.

    .venv/bin/python bench/bytes.py [--warm 100] [--window 200] [--pg DSN] [--peers]
                                    [--base ../other-checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _compare_side as side_mod

HERE = Path(__file__).resolve().parent
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
TABLES = ("tether_checkpoints", "tether_blobs", "tether_trace", "tether_ledger", "tether_marks")


def sqlite_objects(path: Path) -> dict[str, int]:
    """Bytes in pages of each table and index of the SQLite file (WAL folded in)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
        return {str(name): int(size) for name, size in rows}
    finally:
        conn.close()


def pg_objects(dsn: str, schema: str) -> dict[str, int]:
    """Bytes of each table, index and TOAST relation of ``schema``."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        rows = conn.execute(
            "SELECT c.relname, pg_relation_size(c.oid), "
            "coalesce(pg_total_relation_size(c.reltoastrelid), 0) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'i')",
            (schema,),
        ).fetchall()
    found: dict[str, int] = {}
    for name, size, toast in rows:
        found[str(name)] = int(size)
        if toast:
            found[f"{name} (toast)"] = int(toast)
    return found


def columns_of(conn: Any, table: str, pg: bool) -> list[str]:
    if pg:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = %s AND table_schema = current_schema() ORDER BY ordinal_position",
            (table,),
        ).fetchall()
    else:
        rows = conn.execute(f"SELECT name FROM pragma_table_info('{table}')").fetchall()
    return [str(r[0]) for r in rows]


def logical(conn: Any, pg: bool) -> dict[str, dict[str, int]]:
    """Per table: ``{"rows": n, column: bytes, ...}`` of everything stored now."""
    found: dict[str, dict[str, int]] = {}
    for table in TABLES:
        cols = columns_of(conn, table, pg)
        size = "pg_column_size({})" if pg else "length(CAST({} AS BLOB))"
        sums = ", ".join(f"coalesce(sum({size.format(c)}), 0)" for c in cols)
        row = conn.execute(f"SELECT count(*), {sums} FROM {table}").fetchone()
        found[table] = {"rows": int(row[0])}
        for name, value in zip(cols, row[1:], strict=True):
            found[table][name] = int(value)
    return found


def snapshot(side: Any, kind: str, dsn: str, schema: str) -> tuple[dict[str, int], Any]:
    if kind == "sqlite":
        physical = sqlite_objects(side.path)
        conn = sqlite3.connect(side.path)
        try:
            return physical, logical(conn, pg=False)
        finally:
            conn.close()
    import psycopg

    physical = pg_objects(dsn, schema)
    with psycopg.connect(side_mod.with_schema(dsn, schema), autocommit=True) as conn:
        return physical, logical(conn, pg=True)


def measure(kind: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    schema = f"bytes_{uuid.uuid4().hex[:8]}"
    dsn = args.pg
    if kind == "pg":
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
    side = side_mod.TetherSide(kind, base, dsn, schema, args.state_bytes, False)
    try:
        side.steps(args.warm)
        phys0, log0 = snapshot(side, kind, dsn, schema)
        total0 = side.size()
        side.steps(args.window)
        phys1, log1 = snapshot(side, kind, dsn, schema)
        total1 = side.size()
    finally:
        side.close()
        if kind == "pg":
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    n = args.window
    physical = {
        name: (phys1.get(name, 0) - phys0.get(name, 0)) / n
        for name in sorted(set(phys0) | set(phys1))
    }
    per_table = {
        table: {col: (log1[table][col] - log0[table].get(col, 0)) / n for col in log1[table]}
        for table in TABLES
    }
    return {"total": (total1 - total0) / n, "physical": physical, "logical": per_table}


def peer_bytes(name: str, args: argparse.Namespace, base: Path) -> float:
    schema = f"bytes_{uuid.uuid4().hex[:8]}"
    side = side_mod.make(name, base, args.pg, schema, args.state_bytes, False)
    try:
        side.steps(args.warm)
        before = side.size()
        side.steps(args.window)
        return (side.size() - before) / args.window
    finally:
        side.close()
        if name.endswith("-pg"):
            import psycopg

            with psycopg.connect(args.pg, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def report(kind: str, found: dict[str, Any]) -> None:
    print(f"\n## tether, {kind}: {found['total']:,.0f} bytes per write step (the compare metric)\n")
    print("| object | bytes/step |")
    print("| --- | ---: |")
    for name, value in sorted(found["physical"].items(), key=lambda kv: -kv[1]):
        if abs(value) >= 1:
            print(f"| {name} | {value:,.0f} |")
    print("\n| table | rows/step | column bytes/step |")
    print("| --- | ---: | --- |")
    for table, cols in found["logical"].items():
        rows = cols.pop("rows")
        shown = ", ".join(f"{c} {v:,.0f}" for c, v in sorted(cols.items(), key=lambda kv: -kv[1]))
        print(f"| {table} | {rows:.2f} | {shown} (sum {sum(cols.values()):,.0f}) |")


def child(kind: str, args: argparse.Namespace, tree: str) -> dict[str, Any]:
    """``measure`` in a child process whose ``tether`` is the one under ``tree``/src."""
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve() / "src")}
    argv = [sys.executable, __file__, "--one", kind, "--warm", str(args.warm)]
    argv += ["--window", str(args.window), "--state-bytes", str(args.state_bytes), "--pg", args.pg]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measuring {kind} under {tree} failed:\n{done.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=100, help="steps before the window")
    parser.add_argument("--window", type=int, default=200, help="steps measured")
    parser.add_argument("--state-bytes", type=int, default=2048)
    parser.add_argument("--pg", default=DEFAULT_PG)
    parser.add_argument("--stores", default="sqlite,pg")
    parser.add_argument("--peers", action="store_true", help="DBOS on the same stores too")
    parser.add_argument("--base", help="another checkout whose tether to measure beside this one")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child: one store, JSON out
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tether-bytes-") as tmp:
        if args.one:
            base = Path(tmp) / args.one
            base.mkdir()
            print(json.dumps(measure(args.one, args, base)))
            return 0
        summary: list[tuple[str, str, float]] = []
        for kind in args.stores.split(","):
            if args.base:
                before = child(kind, args, args.base)
                summary.append((f"tether ({args.base})", kind, before["total"]))
                report(f"{kind}, {args.base}", before)
            after = child(kind, args, str(HERE.parent))
            summary.append(("tether (this tree)", kind, after["total"]))
            report(f"{kind}, this tree", after)
            if args.peers:
                peer = Path(tmp) / f"dbos-{kind}"
                peer.mkdir()
                summary.append(("DBOS", kind, peer_bytes(f"dbos-{kind}", args, peer)))
        print(f"\n## bytes per write step, steps {args.warm} to {args.warm + args.window}\n")
        print("| side | store | bytes/step |")
        print("| --- | --- | ---: |")
        for name, kind, value in summary:
            print(f"| {name} | {kind} | {value:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
