"""How fast a tether write step could be with no Python at all: its SQL alone, beside LangGraph.

Records every statement one steady-state tether write step sends to SQLite
(``bench/compare.py``'s tether side: a ~2 KB state rewritten each step, one
guarded write on the ``Sandbox``), as SQLite expands them with their values,
then replays that stream on a copy of the database taken just before the
recording: the same transactions, rows, indexes and fsyncs, and none of
tether's work (gate, encoding, sealing, deflating, building rows). Beside
it, in the same process and in interleaved rounds, LangGraph's super-step
on its own ``SqliteSaver`` (``durability="sync"``), and the real tether
step. Both stores run ``journal_mode=WAL``, ``synchronous=FULL``.

The floor answers one question of the "ahead of every peer" issue: can
taking Python off the hot path alone bring a write step to LangGraph's, or
must the statements themselves change?

    .venv/bin/python bench/sql_floor.py [--steps 300] [--rounds 6] [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _compare_side as sides

REPO = Path(__file__).resolve().parent.parent


def record(side: sides.TetherSide, steps: int) -> list[list[str]]:
    """The statements of each of ``steps`` write steps, as SQLite ran them (values inlined)."""
    conn: sqlite3.Connection = side.store._conn
    current: list[str] = []
    conn.set_trace_callback(current.append)
    per_step = []
    try:
        for _ in range(steps):
            side.steps(1)
            per_step.append(list(current))
            current.clear()
    finally:
        conn.set_trace_callback(None)
    return per_step


def replayer(path: Path) -> sqlite3.Connection:
    """A connection to the copy, opened as tether opens its store (WAL, FULL, autocommit)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="tether steps recorded")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dir", type=Path, default=REPO.parent)
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="tether-floor-", dir=args.dir))
    try:
        (base / "t").mkdir()
        (base / "g").mkdir()
        tether = sides.TetherSide("sqlite", base / "t", "", "", 2048, False)
        tether.steps(100)  # steady state: the receipt of each write rides on the next commit
        tether.store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        shutil.copy(tether.path, base / "copy.sqlite")
        recorded = record(tether, args.steps)
        statements = statistics.median(len(s) for s in recorded)
        copy = replayer(base / "copy.sqlite")
        graph = sides.GraphSide("langgraph-sqlite", base / "g", "", "", 2048, False)
        graph.steps(100)
        chunk = max(1, len(recorded) // args.rounds)
        rates: dict[str, list[float]] = {"sql floor": [], "langgraph": [], "tether": []}
        for r in range(args.rounds):
            batch = recorded[r * chunk : (r + 1) * chunk]
            began = time.perf_counter()
            for step in batch:
                for sql in step:
                    copy.execute(sql)
            rates["sql floor"].append(len(batch) / (time.perf_counter() - began))
            began = time.perf_counter()
            graph.steps(len(batch))
            rates["langgraph"].append(len(batch) / (time.perf_counter() - began))
            began = time.perf_counter()
            tether.steps(len(batch))
            rates["tether"].append(len(batch) / (time.perf_counter() - began))
        copy.close()
        graph.close()
        tether.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"tether write step on SQLite: {statements:.0f} statements (BEGIN and COMMIT included)")
    for name, rate in median.items():
        print(
            f"  {name:10s}: {rate:7.0f} steps/s  (rounds {min(rates[name]):.0f}..{max(rates[name]):.0f})"
        )
    lg = median["langgraph"]
    print(
        f"sql floor / langgraph = {median['sql floor'] / lg:.2f}x; "
        f"tether / langgraph = {median['tether'] / lg:.2f}x; "
        f"tether / sql floor = {median['tether'] / median['sql floor']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
