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
  a tool that cannot be asked by key; the agent is answered as the upstream
  answers, after the first two, while the receipt's is made);
- **keyed** (``charge`` with fresh arguments; its listing declares it takes
  a key, kept ``retentionSeconds``): the intent, its key and the dispatch
  persisted in one commit, the call forwarded with the key, the receipt
  committed while the agent is answered (two commits; direct and proxy: the
  same call, no key);
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

Run: ``.venv/bin/python bench/mcp.py [--calls 40] [--rounds 6] [--dir PATH]
[--baseline CHECKOUT] [--gap-ms MS]`` (``--baseline``: another checkout's
gateway, e.g. a worktree of main, as a fourth side of every round: before
and after paired; ``--gap-ms``: an agent's own time between two calls, not
timed: back to back, the gateway's work after an answer is paid by the next
call);
``--profile`` instead drives the gateway's own call path in this process
and shows where its time goes (``bench/_mcp_profile.py``); ``--cpu`` the
same path's CPU per call by thread, without a profiler (``bench/_mcp_cpu.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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


def child_env(src: Path | None = None) -> dict[str, str]:
    paths = [str(src or ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
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


async def timed(
    calls: int, make: Callable[[int], Awaitable[Any]], gap_s: float = 0.0
) -> list[float]:
    out = []
    for i in range(calls):
        start = time.perf_counter()
        answer = await make(i)
        out.append((time.perf_counter() - start) * 1000)
        if gap_s:  # an agent's own time between two calls (its model's), not timed
            await asyncio.sleep(gap_s)
        if getattr(answer, "is_error", False):  # an error answer is fast and measures nothing
            raise SystemExit(f"bench/mcp.py: a call was answered with an error: {answer}")
    return out


def rows(path: Path, table: str = "notes") -> int:
    """The rows an upstream's SQLite file holds: the effects that side's upstream received."""
    with sqlite3.connect(path) as con:
        return int(con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


async def main(
    calls: int, rounds: int, where: Path, baseline: Path | None = None, gap_ms: float = 0.0
) -> None:
    from tether.crypto import Keyring

    Keyring.generate("bench-mcp").write_file(where / "keyring.json")
    # add_note makes a note of its own per call: a collection, so the replay of "again"
    # after other notes is answered from the record (undeclared, it would go to a person).
    (where / "policy.json").write_text(
        '{"reads": ["count_notes"], "tools": {"add_note": {"targets": "collection"}}}'
    )
    upstream = [sys.executable, "-m", "tests.integration._mcp_upstream"]

    def started(*args: str, src: Path | None = None) -> StdioServerParameters:
        return StdioServerParameters(
            command=sys.executable, args=list(args), env=child_env(src), cwd=str(ROOT)
        )

    def tether_mcp(name: str, src: Path | None = None) -> StdioServerParameters:
        return started(
            "-m",
            "tether.cli",
            "mcp",
            "--store",
            f"sqlite:///{where / f'{name}.tether.sqlite'}",
            "--run",
            "bench",
            "--policy",
            str(where / "policy.json"),
            "--keyring",
            str(where / "keyring.json"),
            "--",
            *upstream,
            str(where / f"{name}.sqlite"),
            src=src,
        )

    direct = started(*upstream[1:], str(where / "direct.sqlite"))
    proxy = started(str(_HERE / "mcp.py"), "--serve-proxy", *upstream, str(where / "proxy.sqlite"))
    gateway = tether_mcp("gated")
    # --baseline: the same gateway from another checkout (its src/), as a fourth side.
    earlier = tether_mcp("before", baseline / "src") if baseline is not None else None
    names: tuple[str, ...] = ("direct", "proxy", "gateway", *(("before",) if earlier else ()))
    kinds = ("read", "effect", "keyed", "replay")
    results: dict[tuple[str, str], list[float]] = {}
    rounds_of: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], float] = {}  # CPU seconds the middle process spent, by side, kind
    async with contextlib.AsyncExitStack() as stack:
        servers = {"direct": direct, "proxy": proxy, "gateway": gateway, "before": earlier}
        sides = {
            name: await stack.enter_async_context(Client(servers[name]))
            for name in names
            if servers[name] is not None
        }
        middle = {
            "proxy": _pid_of(b"--serve-proxy", str(where).encode()),
            "gateway": _pid_of(b"tether.cli", str(where / "gated.tether.sqlite").encode()),
            "before": _pid_of(b"tether.cli", str(where / "before.tether.sqlite").encode()),
        }
        for side in sides.values():  # warm all: imports, first commits, the replayed call
            await side.call_tool("count_notes", {})
            await side.call_tool("add_note", {"text": "again"})
            await side.call_tool("charge", {"account": "warm", "cents": 1})
        serial = 0
        for round_no in range(rounds):
            # Each side first, middle and last in turn.
            turn = round_no % len(names)
            order = names[turn:] + names[:turn]
            for name in order:
                client = sides[name]
                base = serial

                async def read(i: int, c: Client = client) -> Any:
                    return await c.call_tool("count_notes", {})

                async def effect(i: int, c: Client = client, b: int = base) -> Any:
                    return await c.call_tool("add_note", {"text": f"note {b + i}"})

                async def keyed(i: int, c: Client = client, b: int = base) -> Any:
                    return await c.call_tool("charge", {"account": f"a{b + i}", "cents": 1})

                async def replay(i: int, c: Client = client) -> Any:
                    return await c.call_tool("add_note", {"text": "again"})

                for kind, make in zip(kinds, (read, effect, keyed, replay), strict=True):
                    before = _cpu_s(middle.get(name))
                    times = await timed(calls, make, gap_ms / 1000)
                    cpu[(name, kind)] = (
                        cpu.get((name, kind), 0.0) + _cpu_s(middle.get(name)) - before
                    )
                    results.setdefault((name, kind), []).extend(times)
                    rounds_of.setdefault((name, kind), []).append(statistics.median(times))
            serial += calls
    commit = bare_commit_ms(where)
    # Every effect reached each upstream once; the gateway's replays reached it never.
    sent = rounds * calls + 1
    files = zip(names, ("direct", "proxy", "gated", "before"), strict=False)
    received = {n: rows(where / f"{f}.sqlite") for n, f in files}
    expected = {n: sent if n in {"gateway", "before"} else sent + rounds * calls for n in names}
    if received != expected:
        raise SystemExit(f"bench/mcp.py: upstream rows {received}, expected {expected}")
    files = zip(names, ("direct", "proxy", "gated", "before"), strict=False)
    charged = {n: rows(where / f"{f}.sqlite", "charges") for n, f in files}
    if charged != dict.fromkeys(names, sent):
        raise SystemExit(f"bench/mcp.py: upstream charges {charged}, expected {sent} each")

    def added(side: str, base: str, kind: str) -> float:
        """The median over rounds of the per-round difference of medians."""
        pairs = zip(rounds_of[(side, kind)], rounds_of[(base, kind)], strict=True)
        return statistics.median(a - b for a, b in pairs)

    print(f"MCP over stdio, {rounds} rounds x {calls} calls per kind and side, files in {where}")
    if gap_ms:
        print(f"  {gap_ms:g} ms between two calls (an agent's own time), not timed")
    print(f"  one bare synchronous=FULL SQLite commit here: {commit:.2f} ms; load: {_load()}")
    print(
        f"  {'call':<7} {'direct':>7} {'proxy':>7} {'gateway':>8} {'SDK floor':>10} "
        f"{'tether':>7} {'added':>7}  | CPU per call: {'proxy':>6} {'gateway':>8}   (ms)"
    )
    total = rounds * calls
    for kind in kinds:
        d, x, g = (statistics.median(results[(n, kind)]) for n in names[:3])
        print(
            f"  {kind:<7} {d:>7.2f} {x:>7.2f} {g:>8.2f} {added('proxy', 'direct', kind):>10.2f} "
            f"{added('gateway', 'proxy', kind):>7.2f} {added('gateway', 'direct', kind):>7.2f}  |"
            f"{'':>14}{cpu[('proxy', kind)] / total * 1000:>6.2f} "
            f"{cpu[('gateway', kind)] / total * 1000:>8.2f}"
        )
    if "before" in names:
        print(f"  --baseline {baseline}: the gateway of that checkout, a fourth side in each round")
        print(
            f"  {'call':<7} {'before':>7} {'added before':>13} {'now - before':>13}  | CPU before"
        )
        for kind in kinds:
            print(
                f"  {kind:<7} {statistics.median(results[('before', kind)]):>7.2f} "
                f"{added('before', 'direct', kind):>13.2f} "
                f"{added('gateway', 'before', kind):>13.2f}  |"
                f"{cpu[('before', kind)] / total * 1000:>11.2f}"
            )
    print(
        "  direct: the client straight to the upstream; proxy: through a bare MCP proxy written "
        "with the SDK (its server and client, no tether); gateway: through tether mcp. SDK floor "
        "= proxy - direct (a second MCP hop, what any proxy costs); tether = gateway - proxy; "
        "added = gateway - direct (each the median over rounds of the round's medians' "
        "difference). An effect with no key makes three durable commits (intent, dispatched, "
        "receipt), a keyed one two (intent and dispatch in one, receipt); the agent is answered "
        "as the upstream answers, while the receipt's is made. A read makes none of its own (its record rides "
        "on the next), a replay one; the "
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
        "--baseline",
        type=Path,
        help="another checkout (e.g. a worktree of main): its gateway measured as a fourth side",
    )
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="ms between two calls, not timed (an agent's own time; default: back to back)",
    )
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
            asyncio.run(main(args.calls, args.rounds, home, args.baseline, args.gap_ms))
    finally:
        shutil.rmtree(home, ignore_errors=True)
