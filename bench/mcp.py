"""The MCP gateway's added latency per tool call over stdio, side by side with no gateway.

Two MCP connections held open in ONE process, both the official SDK's
client over stdio, both to the same test upstream (written with the SDK,
``tests/integration/_mcp_upstream.py``, each effect a row in its SQLite
file):

- **direct**: the client straight to the upstream;
- **gateway**: the client to ``tether mcp`` (``python -m tether.cli mcp``,
  a real process, store on ``--dir``), which forwards to its own child
  upstream.

Three kinds of call, each timed per call:

- **read** (``count_notes``, named a read by the policy): one traced step
  of the run (one checkpoint commit) and the upstream's answer;
- **effect** (``add_note`` with fresh arguments): the intent and its key
  persisted before the call is forwarded, the answer recorded after (two
  durable commits, as tether's protocol needs for a tool that cannot be
  asked by key);
- **replay** (``add_note`` with arguments already committed): the recorded
  answer, the upstream not reached (direct: the same call, sent again).

The sides alternate in short rounds; the figure is the median per call and
the median paired difference (what the gateway adds, in ms). Beside it, the
disk's bare cost of one ``synchronous=FULL`` SQLite commit in ``--dir``:
a durable commit is the floor of an effect's added latency, and the target
(<= 2 ms added per call) assumes a disk whose commit costs well under a
millisecond; ``--dir /dev/shm`` shows what the gateway adds with the disk
taken out. Back-to-back calls never idle long enough for the liveness ping
that precedes an effect after a second's quiet (one more round trip).

Run: ``.venv/bin/python bench/mcp.py [--calls 40] [--rounds 5] [--dir PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

# This file is named mcp.py, and a script's own directory comes first on sys.path:
# take it off, so `import mcp` finds the SDK and not this file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from mcp import Client, StdioServerParameters  # noqa: E402

ROOT = _HERE.parent


def child_env() -> dict[str, str]:
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


def bare_commit_ms(where: Path, n: int = 100) -> float:
    """The median cost of one synchronous=FULL SQLite commit (WAL) in ``where``."""
    con = sqlite3.connect(where / "bare.sqlite", isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("CREATE TABLE t (x INTEGER)")
    times = []
    for i in range(n):
        start = time.perf_counter()
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO t VALUES (?)", (i,))
        con.execute("COMMIT")
        times.append(time.perf_counter() - start)
    con.close()
    return statistics.median(times) * 1000


async def timed(calls: int, make: Callable[[int], Awaitable[Any]]) -> list[float]:
    out = []
    for i in range(calls):
        start = time.perf_counter()
        await make(i)
        out.append((time.perf_counter() - start) * 1000)
    return out


async def main(calls: int, rounds: int, where: Path) -> None:
    from tether.crypto import Keyring

    Keyring.generate("bench-mcp").write_file(where / "keyring.json")
    (where / "policy.json").write_text('{"reads": ["count_notes"]}')
    upstream = [sys.executable, "-m", "tests.integration._mcp_upstream"]
    direct = StdioServerParameters(
        command=sys.executable,
        args=[*upstream[1:], str(where / "direct.sqlite")],
        env=child_env(),
        cwd=str(ROOT),
    )
    gateway = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "tether.cli",
            "mcp",
            "--store",
            f"sqlite:///{where / 'tether.sqlite'}",
            "--run",
            "bench",
            "--policy",
            str(where / "policy.json"),
            "--keyring",
            str(where / "keyring.json"),
            "--",
            *upstream,
            str(where / "gated.sqlite"),
        ],
        env=child_env(),
        cwd=str(ROOT),
    )
    results: dict[tuple[str, str], list[float]] = {}
    pairs: dict[str, list[float]] = {"read": [], "effect": [], "replay": []}
    async with Client(direct) as plain, Client(gateway) as guarded:
        sides = {"direct": plain, "gateway": guarded}
        for side in sides.values():  # warm both: imports, first commits, the replayed call
            await side.call_tool("count_notes", {})
            await side.call_tool("add_note", {"text": "again"})
        serial = 0
        for round_no in range(rounds):
            order = ["direct", "gateway"] if round_no % 2 == 0 else ["gateway", "direct"]
            medians: dict[tuple[str, str], float] = {}
            for name in order:
                client = sides[name]
                base = serial

                async def read(i: int, c: Client = client) -> Any:
                    return await c.call_tool("count_notes", {})

                async def effect(i: int, c: Client = client, b: int = base) -> Any:
                    return await c.call_tool("add_note", {"text": f"note {b + i}"})

                async def replay(i: int, c: Client = client) -> Any:
                    return await c.call_tool("add_note", {"text": "again"})

                for kind, make in (("read", read), ("effect", effect), ("replay", replay)):
                    times = await timed(calls, make)
                    results.setdefault((name, kind), []).extend(times)
                    medians[(name, kind)] = statistics.median(times)
            serial += calls
            for kind, added in pairs.items():
                added.append(medians[("gateway", kind)] - medians[("direct", kind)])
    commit = bare_commit_ms(where)
    print(f"MCP gateway over stdio, {rounds} rounds x {calls} calls per kind, store in {where}")
    print(f"  one bare synchronous=FULL SQLite commit here: {commit:.2f} ms")
    print(f"  {'call':<8} {'direct ms':>10} {'gateway ms':>11} {'added ms':>9} {'ratio':>6}")
    for kind in ("read", "effect", "replay"):
        d = statistics.median(results[("direct", kind)])
        g = statistics.median(results[("gateway", kind)])
        added = statistics.median(pairs[kind])
        print(f"  {kind:<8} {d:>10.2f} {g:>11.2f} {added:>9.2f} {g / d:>6.2f}")
    print(
        "  added = median over rounds of (gateway median - direct median); an effect makes two "
        "durable commits, a read one, a replay one (the step that answers from the record)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="calls per kind per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where the store and the upstreams' files go")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench-mcp-"))
    try:
        asyncio.run(main(args.calls, args.rounds, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
