"""The MCP gateway's added latency per tool call over stdio, beside the SDK's own floor.

Three MCP connections held open in ONE process, each the official SDK's
client over stdio to the same test upstream (written with the SDK,
``tests/integration/_mcp_upstream.py``, each effect a row in its SQLite
file):

- **direct**: the client straight to the upstream;
- **proxy**: the client to a bare MCP proxy written with the SDK alone (its
  lowlevel server and its client, forwarding ``tools/call``; no tether:
  ``--serve-proxy`` below), which forwards to its own child upstream. What
  it adds is the floor of any MCP gateway built on the SDK: a second hop,
  JSON-RPC and validation in Python once more;
- **gateway**: the client to ``tether mcp`` (``python -m tether.cli mcp``,
  a real process, store on ``--dir``), which forwards to its own child
  upstream.

Three kinds of call, each timed per call:

- **read** (``count_notes``, named a read by the policy): one traced step
  of the run (its record rides on the run's next commit: no commit of its
  own) and the upstream's answer;
- **effect** (``add_note`` with fresh arguments; it takes no key): the
  intent and its key persisted, the dispatch recorded, the call forwarded,
  its answer recorded (three durable commits, as tether's protocol needs for
  a tool that cannot be asked by key; a tool that accepts a key takes two);
- **replay** (``add_note`` with arguments already committed): the recorded
  answer, the upstream not reached (direct and proxy: the same call, sent).

The sides rotate in short rounds; the figures are the median per call and
the medians over rounds of the rounds' paired differences: SDK floor (proxy
- direct), tether (gateway - proxy), added (gateway - direct). Beside them,
the CPU per call the middle process itself spent (all its threads, read
from /proc), which other load on a shared machine disturbs least, and the
disk's bare cost of one ``synchronous=FULL`` SQLite commit in ``--dir``: a
durable commit is the floor of a step's added latency, so ``--dir
/dev/shm`` shows what the gateway adds with the disk taken out.

Run: ``.venv/bin/python bench/mcp.py [--calls 40] [--rounds 6] [--dir PATH]``;
``--profile`` instead drives the gateway's own call path in this process
and shows where its time goes (``bench/_mcp_profile.py``); ``--cpu`` the
same path's CPU per call by thread, without a profiler (``bench/_mcp_cpu.py``).
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
        answer = await make(i)
        out.append((time.perf_counter() - start) * 1000)
        if getattr(answer, "is_error", False):  # an error answer is fast and measures nothing
            raise SystemExit(f"bench/mcp.py: a call was answered with an error: {answer}")
    return out


def rows(path: Path) -> int:
    """The notes an upstream's SQLite file holds: the effects that side's upstream received."""
    with sqlite3.connect(path) as con:
        return int(con.execute("SELECT COUNT(*) FROM notes").fetchone()[0])


async def main(calls: int, rounds: int, where: Path) -> None:
    from tether.crypto import Keyring

    Keyring.generate("bench-mcp").write_file(where / "keyring.json")
    # add_note makes a note of its own per call: a collection, so the replay of "again"
    # after other notes is answered from the record (undeclared, it would go to a person).
    (where / "policy.json").write_text(
        '{"reads": ["count_notes"], "tools": {"add_note": {"targets": "collection"}}}'
    )
    upstream = [sys.executable, "-m", "tests.integration._mcp_upstream"]

    def started(*args: str) -> StdioServerParameters:
        return StdioServerParameters(
            command=sys.executable, args=list(args), env=child_env(), cwd=str(ROOT)
        )

    direct = started(*upstream[1:], str(where / "direct.sqlite"))
    proxy = started(str(_HERE / "mcp.py"), "--serve-proxy", *upstream, str(where / "proxy.sqlite"))
    gateway = started(
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
    )
    names = ("direct", "proxy", "gateway")
    kinds = ("read", "effect", "replay")
    results: dict[tuple[str, str], list[float]] = {}
    rounds_of: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], float] = {}  # CPU seconds the middle process spent, by side, kind
    async with Client(direct) as plain, Client(proxy) as proxied, Client(gateway) as guarded:
        sides = {"direct": plain, "proxy": proxied, "gateway": guarded}
        middle = {
            "proxy": _pid_of(b"--serve-proxy", str(where).encode()),
            "gateway": _pid_of(b"tether.cli", str(where / "tether.sqlite").encode()),
        }
        for side in sides.values():  # warm all: imports, first commits, the replayed call
            await side.call_tool("count_notes", {})
            await side.call_tool("add_note", {"text": "again"})
        serial = 0
        for round_no in range(rounds):
            # Each side first, middle and last in turn.
            order = names[round_no % 3 :] + names[: round_no % 3]
            for name in order:
                client = sides[name]
                base = serial

                async def read(i: int, c: Client = client) -> Any:
                    return await c.call_tool("count_notes", {})

                async def effect(i: int, c: Client = client, b: int = base) -> Any:
                    return await c.call_tool("add_note", {"text": f"note {b + i}"})

                async def replay(i: int, c: Client = client) -> Any:
                    return await c.call_tool("add_note", {"text": "again"})

                for kind, make in zip(kinds, (read, effect, replay), strict=True):
                    before = _cpu_s(middle.get(name))
                    times = await timed(calls, make)
                    cpu[(name, kind)] = (
                        cpu.get((name, kind), 0.0) + _cpu_s(middle.get(name)) - before
                    )
                    results.setdefault((name, kind), []).extend(times)
                    rounds_of.setdefault((name, kind), []).append(statistics.median(times))
            serial += calls
    commit = bare_commit_ms(where)
    # Every effect reached each upstream once; the gateway's replays reached it never.
    sent = rounds * calls + 1
    files = zip(names, ("direct", "proxy", "gated"), strict=True)
    received = {n: rows(where / f"{f}.sqlite") for n, f in files}
    expected = {"direct": sent + rounds * calls, "proxy": sent + rounds * calls, "gateway": sent}
    if received != expected:
        raise SystemExit(f"bench/mcp.py: upstream rows {received}, expected {expected}")

    def added(side: str, base: str, kind: str) -> float:
        """The median over rounds of the per-round difference of medians."""
        pairs = zip(rounds_of[(side, kind)], rounds_of[(base, kind)], strict=True)
        return statistics.median(a - b for a, b in pairs)

    print(f"MCP over stdio, {rounds} rounds x {calls} calls per kind and side, files in {where}")
    print(f"  one bare synchronous=FULL SQLite commit here: {commit:.2f} ms; load: {_load()}")
    print(
        f"  {'call':<7} {'direct':>7} {'proxy':>7} {'gateway':>8} {'SDK floor':>10} "
        f"{'tether':>7} {'added':>7}  | CPU per call: {'proxy':>6} {'gateway':>8}   (ms)"
    )
    total = rounds * calls
    for kind in kinds:
        d, x, g = (statistics.median(results[(n, kind)]) for n in names)
        print(
            f"  {kind:<7} {d:>7.2f} {x:>7.2f} {g:>8.2f} {added('proxy', 'direct', kind):>10.2f} "
            f"{added('gateway', 'proxy', kind):>7.2f} {added('gateway', 'direct', kind):>7.2f}  |"
            f"{'':>14}{cpu[('proxy', kind)] / total * 1000:>6.2f} "
            f"{cpu[('gateway', kind)] / total * 1000:>8.2f}"
        )
    print(
        "  direct: the client straight to the upstream; proxy: through a bare MCP proxy written "
        "with the SDK (its server and client, no tether); gateway: through tether mcp. SDK floor "
        "= proxy - direct (a second MCP hop, what any proxy costs); tether = gateway - proxy; "
        "added = gateway - direct (each the median over rounds of the round's medians' "
        "difference). An effect with no key makes three durable commits (intent, dispatched, "
        "receipt), a read none of its own (its record rides on the next), a replay one; the "
        "proxy sends the replay on to the upstream. "
        "CPU per call: what the middle process (the proxy, or the gateway) itself spent, all "
        "its threads, from /proc: the measure least disturbed by other load on the machine."
    )


def _pid_of(*parts: bytes) -> int | None:
    """The process whose command line holds every one of ``parts`` (read from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if all(part in argv for part in parts):
            return int(entry.name)
    return None


def _cpu_s(pid: int | None) -> float:
    """The CPU seconds (user and system, all threads, not its children) process ``pid`` used."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


async def serve_proxy(argv: list[str]) -> None:
    """A bare MCP proxy over stdio, the SDK's server and client and nothing else: the floor."""
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    target = StdioServerParameters(command=argv[0], args=argv[1:], env=child_env(), cwd=str(ROOT))
    async with Client(target) as upstream:
        tools = (await upstream.list_tools()).tools

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=tools)

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await upstream.call_tool(params.name, dict(params.arguments or {}))

        server = Server("proxy", on_list_tools=list_tools, on_call_tool=call_tool)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="calls per kind per round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dir", type=Path, help="where the store and the upstreams' files go")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead: where the gateway's time per call goes (bench/_mcp_profile.py)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="instead: the gateway's CPU per call by thread, no profiler (bench/_mcp_cpu.py)",
    )
    if sys.argv[1:2] == ["--serve-proxy"]:  # the proxy side's own process
        asyncio.run(serve_proxy(sys.argv[2:]))
        sys.exit(0)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench-mcp-"))
    try:
        if args.profile:
            sys.path.insert(0, str(ROOT))
            from bench._mcp_profile import profile

            asyncio.run(profile(home, args.calls))
        elif args.cpu:
            sys.path.insert(0, str(ROOT))
            from bench._mcp_cpu import cpu

            asyncio.run(cpu(home, args.calls))
        else:
            asyncio.run(main(args.calls, args.rounds, home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
