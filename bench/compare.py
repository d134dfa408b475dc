"""tether side by side with LangGraph and DBOS: durable steps/s, bytes per step, duplicate effects.

All in ONE run, on one disk and one PostgreSQL server
(``postgresql://postgres@127.0.0.1:5432/test`` unless ``--pg``), each side
in a child process of its own over a fresh SQLite file or a fresh schema
(see ``bench/_compare_side.py`` for exactly what one step of each side is):

- **tether**: one ``RunSession.step()`` of the real ``Runtime`` over the
  ``Sandbox``: a write gated, its key minted and its intent persisted (one
  checkpoint commit, which also carries the previous step's receipt), the
  adapter's execute, the receipt and the advanced state (sealed, and written
  with the next step's commit: the ``Sandbox`` can be asked by key). That is
  the step whose effect tether promises never to repeat, so it is what
  tether's "one durable step" costs: one durable commit, as the peers' steps.
- **LangGraph** ``SqliteSaver`` / ``PostgresSaver``, and tether's own
  ``TetherSaver`` as an extra row: one super-step of a one-node
  ``StateGraph`` looping on itself, ``durability="sync"``.
- **DBOS** on SQLite / PostgreSQL: one ``@DBOS.step`` of a workflow.

Every side carries the same ~2 KB user state, rewritten at every step.

1. **Durable steps/s**, each side also divided by the bare commit rate of
   its store in the same run: one ``BEGIN IMMEDIATE; INSERT; COMMIT`` of a
   2 KB row on SQLite at the journal mode the side runs with
   (``synchronous=FULL``), one autocommit INSERT on PostgreSQL. The sides
   step in interleaved rounds (the order rotates each round) so disk noise
   lands on all; ratios are medians over rounds of same-round pairs.
2. **Bytes per step**: what the side's store grows by per step (SQLite:
   pages in use after folding the WAL in; PostgreSQL: the schema's tables
   with indexes and TOAST), over a window of steps from step ~100 and
   from step ~2,000 of ONE history. Workload: the fixed ~2 KB state.
3. **Duplicates**: ``--trials`` SIGKILL-after-effect trials per framework
   (``bench/_compare_kill.py``); the service counts the requests it saw.

Target: tether >= 5x each peer's durable steps/s on the same store, tether's
bytes per step flat in history, 0 duplicates for tether where every peer has
more than 0. The script prints the ratios, whether each target is met, and
writes the Markdown report to ``--out`` (default ``bench/compare.md``), the
run's figures beside it as JSON (``bench/compare.json``) and, when ``--out``
is the default, the table between the ``<!-- compare:begin`` and
``<!-- compare:end`` lines of the docs' benchmarks page,
``docs/explanation/benchmarks.md`` (all three rendered by
``bench/_compare_report.py`` from those figures). ``--readme-only`` measures
nothing and renders that page's table again from the saved JSON.

Run: ``make bench-compare`` (installs the peers), or
``.venv/bin/python bench/compare.py [--rounds 10] [--steps 100] [--late 2000]
[--trials 10] [--jobs 2] [--pg DSN] [--dir PATH]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _compare_kill as kill
import _compare_report as compare_report
from _progress import rounds as progress_rounds

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_OUT = HERE / "compare.md"
#: The docs page whose compare-marked table a default run rewrites (the README links to it).
BENCHMARKS_PAGE = REPO / "docs" / "explanation" / "benchmarks.md"
FLAT_TARGET = 1.25  # bytes/step late over early; pages make small windows lumpy
# The rows of the table, what they run on, and the bare store each is divided by.
ROWS = {
    "tether-sqlite": ("tether Runtime", "SQLite", "bare-sqlite-wal"),
    "langgraph-sqlite": ("LangGraph SqliteSaver", "SQLite", "bare-sqlite-wal"),
    "dbos-sqlite": ("DBOS", "SQLite", "bare-sqlite-delete"),
    "tethersaver-sqlite": ("LangGraph on TetherSaver", "SQLite", "bare-sqlite-wal"),
    "tethercommit-sqlite": ("tether checkpoint commit, no effect", "SQLite", "bare-sqlite-wal"),
    "tether-pg": ("tether Runtime", "PostgreSQL", "bare-pg"),
    "langgraph-pg": ("LangGraph PostgresSaver", "PostgreSQL", "bare-pg"),
    "dbos-pg": ("DBOS", "PostgreSQL", "bare-pg"),
    "tethersaver-pg": ("LangGraph on TetherSaver", "PostgreSQL", "bare-pg"),
    "tethercommit-pg": ("tether checkpoint commit, no effect", "PostgreSQL", "bare-pg"),
}
BARES = ("bare-sqlite-wal", "bare-sqlite-delete", "bare-pg")
STEP_WORDS = [
    "tether Runtime: one `RunSession.step()` over the `Sandbox` adapter: the write gated, "
    "its key minted and intent persisted (one checkpoint commit, carrying the previous "
    "step's receipt), executed, receipt and advanced state sealed (written with the next "
    "step's commit); the state lives in `AgentContext`",
    "tether checkpoint commit (informational): one `RunSession.commit` of the next signed "
    "generation with the state rewritten in the agent context and one trace event, no "
    "effect (the unit `bench/checkpoint.py` measures)",
    "LangGraph (SqliteSaver, PostgresSaver, TetherSaver): one super-step of a one-node "
    '`StateGraph` looping on itself, `durability="sync"`',
    "DBOS: one `@DBOS.step` in a `@DBOS.workflow` of --steps steps (its output recorded)",
    "bare: one committed single-row INSERT of the state's size",
    "duplicates: SIGKILL right after a real `POST /tickets` to a loopback service, "
    "then recovery/resume in a new process; the service counts the requests it saw. "
    "LangGraph on TetherSaver sends it through `tether.effects` (a guarded call), as "
    "tether's LangGraph integration is used; the other LangGraph rows with a plain POST",
]
# The speed targets (issue 26), each (ours, peer): ours' steps/s over the peer's, paired.
# tether's guarded write step against LangGraph's unguarded super-step; LangGraph on
# TetherSaver against LangGraph on its own saver.
SPEED_TARGETS = {
    ("tether-sqlite", "langgraph-sqlite"): 1.0,
    ("tether-pg", "langgraph-pg"): 1.0,
    ("tethersaver-sqlite", "langgraph-sqlite"): 0.9,
    ("tethersaver-pg", "langgraph-pg"): 0.9,
}
# The bytes target: tether's bytes per write step at most DBOS's on the same workload.
BYTES_TARGETS = {"tether-sqlite": "dbos-sqlite", "tether-pg": "dbos-pg"}
# Printed beside the targets, not judged: the rest of the pairs a reader compares.
INFORMATIONAL = {
    "tether-sqlite": ("dbos-sqlite",),
    "tether-pg": ("dbos-pg",),
    "tethercommit-sqlite": ("langgraph-sqlite", "dbos-sqlite"),
    "tethercommit-pg": ("langgraph-pg", "dbos-pg"),
}


# -- the side processes --------------------------------------------------------------------


class SideProcess:
    """A side's child process and the lines it answers."""

    def __init__(
        self, name: str, base: Path, dsn: str, schema: str, state_bytes: int, workload: str
    ) -> None:
        self.name = name
        where = base / name
        where.mkdir()
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "_compare_side.py"),
                name,
                "--dir",
                str(where),
                "--pg",
                dsn,
                "--schema",
                schema,
                "--state-bytes",
                str(state_bytes),
                "--workload",
                workload,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ask_line()  # {"ready": true}
        self.at = 0

    def ask_line(self, command: str | None = None) -> dict[str, Any]:
        if self.process.stdin is None or self.process.stdout is None:
            raise SystemExit("side process without pipes")
        if command is not None:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"side {self.name} died (exit {self.process.wait()})")
        return dict(json.loads(line))

    def steps(self, k: int) -> float:
        """Wall seconds for ``k`` more steps, timed inside the side's process."""
        answer = self.ask_line(f"steps {k}")
        self.at = int(answer["at"])
        return float(answer["wall"])

    def size(self) -> int:
        return int(self.ask_line("size")["bytes"])

    def close(self) -> None:
        if self.process.poll() is None and self.process.stdin is not None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        self.process.wait(timeout=60)
        if self.process.stdout is not None:
            self.process.stdout.close()


@contextmanager
def sides(
    names: list[str], base: Path, dsn: str, state_bytes: int, workload: str
) -> Iterator[dict[str, SideProcess]]:
    """Every side started, each over a fresh file or schema; schemas dropped afterwards."""
    import psycopg

    schemas: list[str] = []
    started: dict[str, SideProcess] = {}
    try:
        for name in names:
            schema = f"compare_{name.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
            if name.endswith("-pg"):
                with psycopg.connect(dsn, autocommit=True) as admin:
                    if not name.startswith("dbos-"):  # DBOS creates its own schema
                        admin.execute(f"CREATE SCHEMA {schema}")
                schemas.append(schema)
            started[name] = SideProcess(name, base, dsn, schema, state_bytes, workload)
        yield started
    finally:
        for side in started.values():
            side.close()
        with psycopg.connect(dsn, autocommit=True) as admin:
            for schema in schemas:
                admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- the measurements ----------------------------------------------------------------------


@dataclass
class Results:
    """Everything one run measured."""

    names: list[str]
    durability: dict[str, str] = field(default_factory=dict)
    rates: dict[str, list[float]] = field(default_factory=dict)  # steps/s per round
    early: dict[str, tuple[int, float]] = field(default_factory=dict)  # (from step, bytes/step)
    late: dict[str, tuple[int, float]] = field(default_factory=dict)
    trials: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def rate(self, name: str) -> float:
        return statistics.median(self.rates[name])

    def paired(self, a: str, b: str) -> float:
        """Median over rounds of a's rate / b's rate in the same round."""
        return statistics.median(x / y for x, y in zip(self.rates[a], self.rates[b], strict=True))


def bytes_window(side: SideProcess, until: int, window: int) -> tuple[int, float]:
    """Drive ``side`` to step ``until``, then its store's growth per step over ``window`` steps."""
    while side.at < until:
        side.steps(min(250, until - side.at))
    before = side.size()
    side.steps(window)
    return until, (side.size() - before) / window


def measure(running: dict[str, SideProcess], args: argparse.Namespace, results: Results) -> None:
    names = list(running)
    for name, side in running.items():
        results.durability[name] = str(side.ask_line("info")["durability"])
        side.steps(20)  # imports, connections, first pages: not measured
    for name in progress_rounds(names, "bytes at step ~100", len(names)):
        results.early[name] = bytes_window(running[name], args.early, args.window)
    results.rates = {name: [] for name in names}
    for index in progress_rounds(range(args.rounds), "interleaved rounds", args.rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            results.rates[name].append(args.steps / running[name].steps(args.steps))
    for name in progress_rounds(names, f"bytes at step ~{args.late}", len(names)):
        if name not in BARES:
            results.late[name] = bytes_window(running[name], args.late, args.window)


def run_trials(base: Path, args: argparse.Namespace, frameworks: list[str]) -> dict[str, Any]:
    """``args.trials`` kill trials per framework, ``args.jobs`` at a time."""
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in frameworks}
    work = [(name, i) for i in range(args.trials) for name in frameworks]
    where = base / "kill"
    where.mkdir()
    with kill.service(where) as url, ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(kill.trial, name, i, where, args.pg, url) for name, i in work]
        for future in progress_rounds(futures, "kill trials", len(futures)):
            row = future.result()
            found[row["framework"]].append(row)
    return found


# -- the report ----------------------------------------------------------------------------


def machine(args: argparse.Namespace, base: Path) -> dict[str, str]:
    """Date and machine lines: the figures mean little without them."""
    import psycopg

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with psycopg.connect(args.pg, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        pg_version = str(row[0]) if row else "?"
        row = conn.execute("SHOW synchronous_commit").fetchone()
        sync_commit = str(row[0]) if row else "?"
        row = conn.execute("SHOW fsync").fetchone()
        fsync = str(row[0]) if row else "?"
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "date": now,
        "machine": f"{os.cpu_count()} cores, {cpu}, {platform.platform()}",
        "stack": f"Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, "
        f"PostgreSQL {pg_version} (synchronous_commit={sync_commit}, fsync={fsync})",
        "disk": filesystem(base),
        "versions": f"tether {ver('tether')}, langgraph {ver('langgraph')}, "
        f"langgraph-checkpoint-sqlite {ver('langgraph-checkpoint-sqlite')}, "
        f"langgraph-checkpoint-postgres {ver('langgraph-checkpoint-postgres')}, dbos {ver('dbos')}",
        "settings": f"{args.rounds} interleaved rounds x {args.steps} steps per side, "
        f"workload {workload(args)}, bytes/step over {args.window} steps from step "
        f"{args.early} and from step {args.late}, {args.trials} kill trials per framework",
    }


def workload(args: argparse.Namespace) -> str:
    """The workload in words, for the header."""
    if args.workload == "fixed":
        return f"'fixed' (a {args.state_bytes}-byte state rewritten every step)"
    return f"'messages' (a {args.state_bytes}-byte message appended to a growing list every step)"


def filesystem(path: Path) -> str:
    """The file-system type of the mount holding ``path``, from /proc/mounts."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "file system unknown"
    resolved, best, kind = str(path.resolve()), "", "file system unknown"
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1]
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, f"{fields[2]} on {mount}"
    return kind


def duplicates(rows: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(trials that saw the effect more than once, extra requests in all, failed trials)."""
    good = [r for r in rows if not r["error"]]
    return (
        sum(1 for r in good if r["seen"] > 1),
        sum(max(0, r["seen"] - 1) for r in good),
        len(rows) - len(good),
    )


def table(results: Results) -> tuple[list[str], list[list[str]]]:
    """The table's column names and its rows of formatted cells."""
    early = next(iter(results.early.values()))[0]
    late = next(iter(results.late.values()))[0]
    columns = [
        "framework",
        "store",
        "durable steps/s",
        "÷ bare commits/s",
        f"bytes/step @~{early:,}",
        f"bytes/step @~{late:,}",
        "duplicates (trials)",
    ]
    rows = []
    for name, (label, store, bare) in ROWS.items():
        if name not in results.rates:
            continue
        trials = results.trials.get(name, [])
        if trials:
            dup, extra, failed = duplicates(trials)
            dups = f"{dup} of {len(trials) - failed} ({extra} extra requests)"
            if failed:
                dups += f", {failed} failed"
        else:
            dups = "not run"
        early_bytes = results.early[name][1]
        late_bytes = results.late[name][1] if name in results.late else float("nan")
        rows.append(
            [
                label,
                store,
                f"{results.rate(name):,.0f}",
                f"{results.paired(name, bare):.2f}x",
                f"{early_bytes:,.0f}",
                f"{late_bytes:,.0f}",
                dups,
            ]
        )
    for bare in BARES:
        if bare in results.rates:
            rows.append(
                [
                    f"bare commit ({bare.removeprefix('bare-')})",
                    "PostgreSQL" if bare == "bare-pg" else "SQLite",
                    f"{results.rate(bare):,.0f}",
                    "1.00x",
                    f"{results.early[bare][1]:,.0f}",
                    "",
                    "",
                ]
            )
    return columns, rows


def speed_line(results: Results, ours: str, peer: str, target: float | None) -> str:
    """One pair's paired steps/s ratio, in bare units too, and its verdict if judged."""
    speed = results.paired(ours, peer)
    normal = results.paired(ours, ROWS[ours][2]) / results.paired(peer, ROWS[peer][2])
    if target is None:
        tail = "informational"
    else:
        met = "met" if speed >= target else "MISSED"
        tail = f"target ≥ {target:.1f}x: **{met}**"
    return (
        f"{ROWS[ours][0]} / {ROWS[peer][0]} on {ROWS[ours][1]}: {speed:.2f}x steps/s "
        f"({normal:.2f}x in units of each one's bare store); {tail}"
    )


def speeds(results: Results, pairs: dict[str, tuple[str, ...]]) -> list[str]:
    """One informational line per (tether row, peer) both measured."""
    return [
        speed_line(results, ours, peer, None)
        for ours, peers in pairs.items()
        if ours in results.rates
        for peer in peers
        if peer in results.rates
    ]


def verdicts(results: Results) -> list[str]:
    lines = [
        speed_line(results, ours, peer, target)
        for (ours, peer), target in SPEED_TARGETS.items()
        if ours in results.rates and peer in results.rates
    ]
    for ours, peer in BYTES_TARGETS.items():
        if ours in results.early and peer in results.early:
            mine, theirs = results.early[ours][1], results.early[peer][1]
            met = "met" if mine <= theirs else "MISSED"
            lines.append(
                f"{ROWS[ours][0]} on {ROWS[ours][1]}: {mine:,.0f} bytes/step against "
                f"{ROWS[peer][0]}'s {theirs:,.0f} ({mine / theirs:.2f}x; target ≤ 1.0x): "
                f"**{met}**"
            )
    for ours in BYTES_TARGETS:
        if ours in results.late:
            (at_early, early), (at_late, late) = results.early[ours], results.late[ours]
            ratio = late / early if early else float("inf")
            met = "met" if ratio <= FLAT_TARGET else "MISSED"
            lines.append(
                f"{ROWS[ours][0]} on {ROWS[ours][1]}: bytes/step at ~{at_late:,} / at "
                f"~{at_early:,} = "
                f"{ratio:.2f} (flat: ≤ {FLAT_TARGET}): **{met}**"
            )
    if results.trials:
        ours_zero = all(
            duplicates(results.trials[n])[0] == 0 and duplicates(results.trials[n])[2] == 0
            for n in results.trials
            if n.startswith("tether-")
        )
        peers_all = all(
            duplicates(results.trials[n])[0] > 0
            for n in results.trials
            if n.startswith(("langgraph-", "dbos-"))
        )
        met = "met" if ours_zero and peers_all else "MISSED"
        lines.append(
            f"duplicates: tether Runtime 0 in every trial: {ours_zero}; every peer > 0: "
            f"{peers_all}: **{met}**"
        )
    return lines


def figures(results: Results, header: dict[str, str], command: str) -> dict[str, Any]:
    """What the run found, formatted: the one source of bench/compare.md and the README table."""
    columns, rows = table(results)
    return {
        "command": command,
        **header,
        "columns": columns,
        "rows": rows,
        "durability": [[name, text] for name, text in results.durability.items()],
        "steps": STEP_WORDS,
        "targets": verdicts(results),
        "informational": speeds(results, INFORMATIONAL),
        "measured": {
            "rates": results.rates,
            "early": results.early,
            "late": results.late,
            "trials": results.trials,
        },
    }


def check_figures(saved: dict[str, Any]) -> None:
    """Refuse saved figures whose table or verdicts are not what their own measurements give.

    A run saves its raw measurements beside the formatted cells; a cell or a
    verdict edited by hand no longer matches them. Figures saved without
    measurements (converted from an older report) are taken as they are.
    """
    measured = saved.get("measured")
    if measured is None:
        return
    try:
        results = Results(
            names=list(measured["rates"]),
            rates=measured["rates"],
            early={k: (int(v[0]), float(v[1])) for k, v in measured["early"].items()},
            late={k: (int(v[0]), float(v[1])) for k, v in measured["late"].items()},
            trials=measured["trials"],
        )
        derived = {
            "rows": table(results)[1],
            "targets": verdicts(results),
            "informational": speeds(results, INFORMATIONAL),
        }
    except (KeyError, TypeError, ValueError, IndexError, statistics.StatisticsError) as exc:
        raise compare_report.FiguresError(f"the saved measurements are malformed: {exc}") from exc
    for part, value in derived.items():
        if saved.get(part) != value:
            raise compare_report.FiguresError(
                f"the saved {part} are not what the saved measurements give (edited by hand?)"
            )


# -- main ----------------------------------------------------------------------------------


def profile(base: Path, args: argparse.Namespace, n: int = 1000) -> None:
    """Where one tether Runtime step's time goes (cProfile, SQLite, this process)."""
    import cProfile
    import pstats
    import time

    import _compare_side

    side = _compare_side.TetherSide(
        "sqlite", base, args.pg, "", args.state_bytes, args.workload == "messages"
    )
    side.steps(100)
    profiler = cProfile.Profile()
    wall, cpu = time.perf_counter(), time.process_time()
    profiler.runcall(side.steps, n)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    side.close()
    print(
        f"profile of {n} tether Runtime steps on SQLite (synchronous=FULL), under cProfile: "
        f"{wall * 1e3 / n:.2f} ms wall, {cpu * 1e3 / n:.2f} ms CPU per step"
    )
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(15)
    stats.sort_stats("cumulative").print_stats(30)


@contextmanager
def bench_dir(parent: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tether-compare-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    parser.add_argument("--steps", type=int, default=100, help="steps per side per round")
    parser.add_argument("--early", type=int, default=100, help="first bytes window from here")
    parser.add_argument("--late", type=int, default=2000, help="second bytes window from here")
    parser.add_argument("--window", type=int, default=100, help="steps per bytes window")
    parser.add_argument(
        "--state-bytes",
        type=int,
        help="the user state's size (fixed, default 2048) or each message's (messages, "
        "default 100)",
    )
    parser.add_argument(
        "--workload",
        choices=["fixed", "messages"],
        default="fixed",
        help="fixed (default): ~2 KB state rewritten every step; messages: a message "
        "appended to a growing list every step (the history-growth workload)",
    )
    parser.add_argument("--trials", type=int, default=10, help="kill trials per framework")
    parser.add_argument("--jobs", type=int, default=2, help="kill trials run side by side")
    parser.add_argument(
        "--pg",
        default=os.environ.get("TETHER_TEST_PG_DSN", DEFAULT_PG),
        help=f"the PostgreSQL server (default $TETHER_TEST_PG_DSN or {DEFAULT_PG})",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=REPO.parent,  # not /tmp: a tmpfs makes fsync free
        help="where the temp dir for the databases goes (default: the repo's parent)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="only profile tether Runtime steps (cProfile)"
    )
    parser.add_argument("--only", nargs="*", help="these sides only (names as in the table keys)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the Markdown goes")
    parser.add_argument(
        "--readme",
        type=Path,
        help="the page whose compare-marked table the run rewrites (default: "
        "docs/explanation/benchmarks.md when --out is bench/compare.md, none otherwise)",
    )
    parser.add_argument(
        "--readme-only",
        action="store_true",
        help="measure nothing: render the page's table again from the figures saved "
        "beside --out (bench/compare.json)",
    )
    args = parser.parse_args(argv)
    saved = args.out.with_suffix(".json")
    readme = args.readme
    if readme is None and args.out.resolve() == DEFAULT_OUT.resolve():
        readme = BENCHMARKS_PAGE
    try:
        if args.readme_only:
            figures_saved = compare_report.load(saved)
            check_figures(figures_saved)
            rewrite_readme(readme or BENCHMARKS_PAGE, figures_saved)
            return 0
        if readme is not None:  # refuse before an hour of measuring, not after
            compare_report.check_markers(readme.read_text())
    except (compare_report.ReadmeMarkersError, compare_report.FiguresError, OSError) as exc:
        print(f"bench/compare.py: {exc}", file=sys.stderr)
        return 2
    if args.state_bytes is None:
        args.state_bytes = 2048 if args.workload == "fixed" else 100
    names = [n for n in ROWS if not args.only or n in args.only]
    needed = {ROWS[n][2] for n in names}
    names += [b for b in BARES if b in needed]
    results = Results(names)
    if args.profile:
        with bench_dir(args.dir) as base:
            profile(base, args)
        return 0
    with bench_dir(args.dir) as base:
        header = machine(args, base)
        print("\n".join(f"- {key}: {value}" for key, value in header.items()), flush=True)
        with ExitStack() as stack:
            running = stack.enter_context(
                sides(names, base, args.pg, args.state_bytes, args.workload)
            )
            measure(running, args, results)
        if args.trials > 0:
            frameworks = [n for n in kill.FRAMEWORKS if n in names]
            results.trials = run_trials(base, args, frameworks)
    shown = sys.argv[1:] if argv is None else argv
    found = figures(results, header, " ".join(["bench/compare.py", *shown]))
    text = compare_report.report(found)
    print()
    print(text)
    for name, rows in results.trials.items():
        for row in rows:
            if row["error"]:
                print(f"trial error ({name}): {row['error']}", file=sys.stderr)
    args.out.write_text(text)
    compare_report.save(saved, found)
    print(f"(written to {args.out} and {saved})")
    if readme is not None:
        rewrite_readme(readme, found)
    return 0


def rewrite_readme(readme: Path, found: dict[str, Any]) -> None:
    """Render the page's compare-marked table from ``found``; the rest stays as it was."""
    text = readme.read_text()
    new = compare_report.readme_with(text, found)
    if new != text:
        readme.write_text(new)
    print(f"({readme}: the comparison table {'rewritten' if new != text else 'already current'})")


if __name__ == "__main__":
    sys.exit(main())
