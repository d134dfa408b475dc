"""Checkpoint benchmark: tether's durable commit rate and its per-step cost, side by side.

Both questions are answered in ONE run, on ONE file system, at ONE durability
(WAL journal, ``synchronous=FULL``) for everything that is compared.

1. **Commit rate.** Signed checkpoints per second through
   :class:`~tether.store.SQLiteStore`, against bare SQLite committing one row
   of the same byte size. The tether side is exactly what a step's commit does
   (``RunSession.commit``): take the real ``RunState`` of a run driven by the
   real ``Runtime`` over the ``Sandbox`` adapter, evolve it, seal one trace
   event, validate, sign, and in one transaction compare-and-set the mark and
   write the checkpoint and the event. The bare side is ``BEGIN IMMEDIATE;
   INSERT INTO t(run_id, gen, body) VALUES (?, ?, ?); COMMIT`` on a plain
   ``sqlite3`` connection with the same pragmas, in its own file in the same
   directory, with a body exactly as long as the sealed envelope. Why it is
   fair: the sides alternate in many short rounds (and swap which goes first),
   so a burst of disk noise or a WAL checkpoint lands on both; each round is
   paired with its neighbour and we report the median paired ratio.
   Target: tether/bare >= 0.7.

2. **Step cost against history.** One run is driven through 10,000 real
   ``RunSession.step()`` calls, each a full write (gate, pending checkpoint,
   two ledger appends, the adapter executing with its key, the advancing
   checkpoint), so the measure includes every query a step makes against the
   run's growing trace and ledger. The late windows are the run's last steps:
   9,836-10,000 at ``synchronous=FULL`` (the target) and, just before them,
   9,671-9,835 at NORMAL, where fsync noise cannot drown a growing CPU cost.
   Each 11-step late window is paired with steps 5-15 of a fresh 20-step run
   in the SAME database file, the two runs stepping in turn, so early and
   late meet the same disk, the same database size and the same moment: what
   differs is only the run's own history. We report the median of the paired
   ratios (wall time; CPU time beside it). Target: late/early <= 1.2 at FULL.
   The steps between the windows run at NORMAL, then the run is recovered
   through a FULL handle on the same file: the fsync policy decides when
   bytes reach the disk, never which bytes, so the history is the one a FULL
   run would have. The envelope at step 10 and at 10,000 must not grow
   (beyond the extra digits of larger counters). If the run cannot reach its
   windows within a time cap, the script says so, measures where it stopped,
   and fails.

Run: ``.venv/bin/python bench/checkpoint.py [--dir PATH] [--quick] [--cap SECONDS]``;
``--profile`` instead prints where a tether commit's time goes (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import platform
import pstats
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from _progress import rounds as progress_rounds

from tether.core import Observation, Policy, Proposal, TaskSpec
from tether.crypto import Keyring
from tether.runtime import AgentContext, Decision, RunSession, Runtime
from tether.store import SQLiteStore
from tether.testing import Sandbox

REPO = Path(__file__).resolve().parent.parent
COMMIT_TARGET = 0.7
GROWTH_TARGET = 1.2
# Counters in the state (generation, trace length, steps, proposals, versions,
# writes, action ids) each gain up to three digits between step 10 and step
# 10,000 (about 20 of them in a step's checkpoint, its pending write included):
# the envelope is compared with every counter written as 0 (``shape_size``),
# and growth beyond this is real growth.
DIGIT_SLACK = 8
# A string's trailing counter ("write-9999"); a hex digest's tail is preceded by hex.
_TRAILING_COUNTER = re.compile(r"(?<![0-9a-f])\d+$")
# An early window: steps 5-15 of a run, i.e. around step 10.
EARLY_FIRST, EARLY_STEPS = 5, 11
INITIAL_FILES = {"notes.txt": "step 0\n", "README.md": "a benchmark workspace\n"}
POLICY = {
    "policy_id": "bench",
    "policy_version": "1",
    "kinds": {
        "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False}
    },
    "max_risk": "medium",
    "approval_ttl_s": 900,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """How much work each part does; ``--quick`` shrinks everything."""

    name: str
    rounds: int
    commits_per_round: int
    long_steps: int
    windows: int
    drive_cap_s: float


FULL = Settings(
    name="full",
    rounds=20,
    commits_per_round=150,
    long_steps=10_000,
    windows=15,
    drive_cap_s=100,
)
QUICK = replace(
    FULL,
    name="quick",
    rounds=8,
    commits_per_round=60,
    long_steps=1_000,
    windows=5,
    drive_cap_s=30,
)


# -- a run to measure ------------------------------------------------------------------


class WriterAgent:
    """Rewrites one file every step and never finishes; its context stays one size."""

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        cursor = context.plan_cursor + 1
        return Decision(
            context=AgentContext(context.messages, context.memory, cursor),
            proposal=Proposal(
                action_id=f"write-{cursor}",
                kind="file.write",
                target="notes.txt",
                args={"content": f"step {cursor}\n"},
                based_on_version=observation.environment.version,
            ),
        )


def task_for(sandbox: Sandbox) -> TaskSpec:
    """A task whose budgets never stop a benchmark run."""
    return TaskSpec.from_json(
        {
            "task_id": "bench-writes",
            "task_version": "1",
            "allowed_kinds": ["file.write"],
            "allowed_paths": ["notes.txt"],
            "permissions": ["workspace.write"],
            "budgets": {"proposals": 10**9, "steps": 10**9, "wall_time_s": 10**6, "cost": 0},
            "initial_environment": {
                "namespace": sandbox.namespace,
                "state_fingerprint": sandbox.environment().state_fingerprint,
            },
            "verifier": {"argv": ["true"], "timeout_s": 60},
        }
    )


def start_run(store: SQLiteStore, keyring: Keyring) -> RunSession:
    """A new run on a fresh sandbox, sharing ``store`` (and its connection)."""
    sandbox = Sandbox(INITIAL_FILES)
    runtime = Runtime(
        store=store,
        keyring=keyring,
        adapter=sandbox,
        task=task_for(sandbox),
        policy=Policy.from_json(POLICY),
        agent=WriterAgent(),
    )
    return runtime.start()


def envelope_size(store: SQLiteStore, session: RunSession) -> tuple[int, int]:
    """Bytes of the sealed checkpoint the run's mark names now, and of its shape.

    The shape is the envelope with every counter written as 0 (integers, and a
    string's trailing counter such as an action id's): what is left to grow
    with history once digits are set aside.
    """
    mark = store.get_mark(session.run_id)
    envelope = None if mark is None else store.get_checkpoint(mark.run_id, mark.checkpoint_digest)
    if envelope is None:
        raise RuntimeError(f"run {session.run_id} has no checkpoint")
    return len(envelope), shape_size(json.loads(envelope))


def shape_size(value: object) -> int:
    """The JSON length of ``value`` with every counter in it written as 0."""

    def zeroed(item: object) -> object:
        if isinstance(item, bool) or item is None or isinstance(item, float):
            return item
        if isinstance(item, int):
            return 0
        if isinstance(item, str):
            return _TRAILING_COUNTER.sub("0", item)
        if isinstance(item, list):
            return [zeroed(x) for x in item]
        if isinstance(item, dict):
            return {k: zeroed(v) for k, v in item.items()}
        return item

    return len(json.dumps(zeroed(value), separators=(",", ":")))


# -- part 1: commit rate ---------------------------------------------------------------


class BareTable:
    """The baseline: one plain SQLite row per commit, with the store's pragmas."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._conn.execute(
            "CREATE TABLE t (run_id TEXT NOT NULL, gen INTEGER NOT NULL, body BLOB NOT NULL, "
            "PRIMARY KEY (run_id, gen))"
        )
        self._gen = itertools.count(1)

    def commit(self, body: bytes) -> None:
        """One durable single-row transaction."""
        self._conn.execute("BEGIN IMMEDIATE")
        self._conn.execute(
            "INSERT INTO t (run_id, gen, body) VALUES (?, ?, ?)", ("bare", next(self._gen), body)
        )
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()


def tether_commit(session: RunSession) -> None:
    """One step's commit: the next generation of the real state, with one trace event."""
    state = session.state
    session.commit(
        state.evolve(observed_version=state.environment.version),
        [("agent_waited", {"observed_version": state.environment.version})],
    )


@dataclass(frozen=True, slots=True)
class Timing:
    """``n`` operations (commits or steps): wall and CPU seconds."""

    n: int
    wall: float
    cpu: float

    @property
    def rate(self) -> float:
        return self.n / self.wall

    @property
    def wall_ms(self) -> float:
        return self.wall * 1000 / self.n

    @property
    def cpu_ms(self) -> float:
        return self.cpu * 1000 / self.n

    def plus(self, other: Timing) -> Timing:
        return Timing(self.n + other.n, self.wall + other.wall, self.cpu + other.cpu)


def timed(operation: Callable[[], object], n: int) -> Timing:
    """Run ``operation`` ``n`` times back to back."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        operation()
    return Timing(n, time.perf_counter() - wall, time.process_time() - cpu)


@dataclass(frozen=True, slots=True)
class CommitResult:
    """Rounds of each side; round ``i`` of one side ran next to round ``i`` of the other."""

    tether: list[Timing]
    bare: list[Timing]
    envelope_bytes: int

    @property
    def ratio(self) -> float:
        return statistics.median(
            t.rate / b.rate for t, b in zip(self.tether, self.bare, strict=True)
        )


def measure_commits(base: Path, settings: Settings, keyring: Keyring) -> CommitResult:
    """Interleaved rounds of tether commits and bare commits of an equal-sized row."""
    store = SQLiteStore(base / "commits-tether.sqlite", synchronous="FULL")
    bare = BareTable(base / "commits-bare.sqlite", "FULL")
    try:
        session = start_run(store, keyring)
        session.run(max_steps=3)  # a state with a landed write, as mid-run states have
        tether_commit(session)
        body = os.urandom(envelope_size(store, session)[0])
        sides = {"tether": lambda: tether_commit(session), "bare": lambda: bare.commit(body)}
        for commit in sides.values():
            timed(commit, settings.commits_per_round)  # warm caches and both WAL files
        rounds: dict[str, list[Timing]] = {"tether": [], "bare": []}
        for index in progress_rounds(range(settings.rounds), "commit rounds", settings.rounds):
            # Swap who goes first, so neither side always inherits the other's WAL checkpoint.
            order = ["tether", "bare"] if index % 2 == 0 else ["bare", "tether"]
            for name in order:
                rounds[name].append(timed(sides[name], settings.commits_per_round))
        return CommitResult(rounds["tether"], rounds["bare"], len(body))
    finally:
        store.close()
        bare.close()


# -- part 2: step cost against history ----------------------------------------------------


def let_go(session: RunSession) -> None:
    """Land a write's receipt that waits for the next commit (as a session letting go does),
    so the run is recovered at rest rather than by settling that write."""
    land = getattr(session, "land_deferred", None)  # absent in trees before receipts waited
    if land is not None:
        land()


def reopen(session: RunSession, store: SQLiteStore, keyring: Keyring) -> RunSession:
    """The same run, recovered through another handle on its database (a new epoch)."""
    rt = session.rt
    runtime = Runtime(
        store=store,
        keyring=keyring,
        adapter=rt.adapter,
        task=rt.task,
        policy=rt.policy,
        agent=rt.agent,
    )
    return runtime.recover(session.run_id)


def paired_window(fresh: RunSession, long_run: RunSession, steps: int) -> tuple[Timing, Timing]:
    """``steps`` real steps of ``fresh`` and of ``long_run``, stepping them in turn.

    One step of each, alternately, so a slow fsync or a WAL checkpoint hits
    both runs' windows alike.
    """
    sessions = {"fresh": fresh, "long": long_run}
    totals = {name: Timing(0, 0.0, 0.0) for name in sessions}
    for index in range(steps):
        for name in ("fresh", "long") if index % 2 == 0 else ("long", "fresh"):
            totals[name] = totals[name].plus(timed(sessions[name].step, 1))
    return totals["fresh"], totals["long"]


def drive(session: RunSession, until_step: int, deadline: float) -> None:
    """Step ``session`` up to ``until_step``, or until the ``perf_counter`` deadline."""
    while session.state.spent.steps < until_step and time.perf_counter() < deadline:
        session.run(max_steps=min(250, until_step - session.state.spent.steps))


@dataclass(frozen=True, slots=True)
class Windows:
    """Early and late step windows measured in pairs at one durability."""

    synchronous: str
    early: list[Timing]
    late: list[Timing]
    late_from: int
    late_to: int

    @property
    def ratio(self) -> float:
        """Median over the pairs of late/early wall time per step."""
        pairs = zip(self.early, self.late, strict=True)
        return statistics.median(late.wall / early.wall for early, late in pairs)

    @property
    def cpu_ratio(self) -> float:
        """The same for CPU time, which disk noise barely touches."""
        pairs = zip(self.early, self.late, strict=True)
        return statistics.median(late.cpu / early.cpu for early, late in pairs)


def measure_windows(
    store: SQLiteStore,
    long_run: RunSession,
    settings: Settings,
    keyring: Keyring,
    synchronous: str,
) -> Windows:
    """Late windows of ``long_run``, each paired with steps 5-15 of a fresh run in ``store``."""
    late_from = long_run.state.spent.steps + 1
    early, late = [], []
    for _ in progress_rounds(range(settings.windows), f"windows ({synchronous})", settings.windows):
        fresh = start_run(store, keyring)
        fresh.run(max_steps=EARLY_FIRST - 1)
        fresh_timing, long_timing = paired_window(fresh, long_run, EARLY_STEPS)
        early.append(fresh_timing)
        late.append(long_timing)
        fresh.run(max_steps=5)  # the rest of its 20 steps
    return Windows(synchronous, early, late, late_from, long_run.state.spent.steps)


@dataclass(frozen=True, slots=True)
class GrowthResult:
    """One long run: its step windows at both durabilities, and its envelope sizes."""

    full: Windows
    normal: Windows
    same_run_early: float
    envelope_early: tuple[int, int]  # (bytes, bytes with counters zeroed)
    envelope_late: tuple[int, int]
    reached: int
    target_steps: int
    seconds: float

    @property
    def complete(self) -> bool:
        return self.reached == self.target_steps


def measure_growth(base: Path, settings: Settings, keyring: Keyring) -> GrowthResult:
    """One run of real steps to ``long_steps``, in one database file.

    The fsync policy changes when bytes reach the disk, never which bytes: so
    the filler steps run at NORMAL (less waiting) and the run is then
    recovered through a FULL handle on the same file for the FULL windows.
    """
    started = time.perf_counter()
    path = base / "growth.sqlite"
    late_span = settings.windows * EARLY_STEPS
    with SQLiteStore(path, synchronous="FULL") as store:
        long_run = start_run(store, keyring)
        long_run.run(max_steps=EARLY_FIRST - 1)
        same_run = timed(long_run.step, EARLY_STEPS)  # steps 5-15 of the long run itself
        let_go(long_run)
    with SQLiteStore(path, synchronous="NORMAL") as store:
        long_run = reopen(long_run, store, keyring)
        # Sized after a recovery and a step, as the late envelope is: a recovered
        # run's checkpoint carries its admission, and a step's its pending write.
        long_run.step()
        envelope_early = envelope_size(store, long_run)
        drive(long_run, settings.long_steps - 2 * late_span - 1, started + settings.drive_cap_s)
        normal = measure_windows(store, long_run, settings, keyring, "NORMAL")
        let_go(long_run)
    with SQLiteStore(path, synchronous="FULL") as store:
        long_run = reopen(long_run, store, keyring)
        long_run.step()  # sized as the early envelope was: after a recovery and a step
        envelope_late = envelope_size(store, long_run)
        full = measure_windows(store, long_run, settings, keyring, "FULL")
    return GrowthResult(
        full=full,
        normal=normal,
        same_run_early=same_run.wall_ms,
        envelope_early=envelope_early,
        envelope_late=envelope_late,
        reached=long_run.state.spent.steps,
        target_steps=settings.long_steps,
        seconds=time.perf_counter() - started,
    )


# -- reporting --------------------------------------------------------------------------


def header(base: Path, settings: Settings) -> None:
    """What ran where: the figures below mean little without it."""
    print(f"tether checkpoint benchmark ({settings.name})")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"  machine    : {os.cpu_count()} cores, {platform.platform()}, load {load}")
    print(f"  directory  : {base} ({_filesystem(base)})")
    print(f"  python     : {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}")
    print("  durability : journal_mode=WAL, synchronous=FULL on both sides unless labelled")
    print()


def _filesystem(path: Path) -> str:
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


def report_commits(result: CommitResult, settings: Settings) -> None:
    """Part 1: both sides' rates, their CPU per commit, and the ratio."""
    print(
        f"1. commit rate: {settings.rounds} interleaved rounds x {settings.commits_per_round} "
        f"commits per side; envelope and bare row {result.envelope_bytes} bytes"
    )
    tether = statistics.median(r.rate for r in result.tether)
    bare = statistics.median(r.rate for r in result.bare)
    print(f"   tether SQLiteStore.commit : {_rates(result.tether)}")
    print(f"   bare sqlite3 INSERT       : {_rates(result.bare)}")
    print(
        f"   ratio tether/bare         : {result.ratio:.2f} (median of paired rounds; "
        f"ratio of the median rates {tether / bare:.2f})"
    )
    print()


def _rates(rounds: list[Timing]) -> str:
    rates = [r.rate for r in rounds]
    cpu = statistics.median(r.cpu_ms for r in rounds)
    return (
        f"median {statistics.median(rates):6.0f} commits/s, {cpu:.3f} ms CPU per commit "
        f"(rounds {min(rates):.0f} .. {max(rates):.0f}/s)"
    )


def report_growth(result: GrowthResult, settings: Settings) -> None:
    """Part 2: early and late windows at each durability, their ratios, envelope sizes."""
    print(
        f"2. step cost: one run of real write steps to step {result.reached} "
        f"({result.seconds:.0f} s); the steps between the windows ran at synchronous=NORMAL"
    )
    if not result.complete:
        wanted = result.target_steps - 2 * settings.windows * EARLY_STEPS
        print(
            f"   STOPPED: the run did not reach step {wanted} within the "
            f"{settings.drive_cap_s:.0f} s cap (--cap); late windows measured where it stopped"
        )
    for windows in (result.full, result.normal):
        tag = windows.synchronous
        _row(f"{tag}: early, steps 5-15 of fresh runs", _windows(windows.early))
        _row(f"{tag}: late, steps {windows.late_from}-{windows.late_to}", _windows(windows.late))
        _row(
            f"{tag}: ratio late/early",
            f"{windows.ratio:.2f} (median of paired windows; CPU time {windows.cpu_ratio:.2f})",
        )
    _row("FULL: the long run's own steps 5-15", f"{result.same_run_early:.2f} ms/step (one window)")
    _row(
        "envelope bytes",
        f"step 16 = {result.envelope_early[0]}, late = "
        f"{result.envelope_late[0]} ({result.envelope_late[0] - result.envelope_early[0]:+d}; "
        f"counters zeroed {result.envelope_late[1] - result.envelope_early[1]:+d})",
    )
    print()


def _row(label: str, value: str) -> None:
    print(f"   {label:<40}: {value}")


def _windows(timings: list[Timing]) -> str:
    wall = [t.wall_ms for t in timings]
    cpu = statistics.median(t.cpu_ms for t in timings)
    return (
        f"median {statistics.median(wall):6.2f} ms/step, {cpu:.2f} ms CPU "
        f"(windows {min(wall):.2f} .. {max(wall):.2f})"
    )


def verdicts(commits: CommitResult, growth: GrowthResult) -> None:
    """One PASS/FAIL line per target, with its figure."""
    print("verdict")
    _verdict(
        commits.ratio >= COMMIT_TARGET,
        f"commits/s tether/bare = {commits.ratio:.3f} (target >= {COMMIT_TARGET})",
    )
    short = "" if growth.complete else f" (stopped short of {growth.target_steps}: not measured)"
    for windows in (growth.full, growth.normal):
        label = "" if windows.synchronous == "FULL" else "  [informational]"
        _verdict(
            growth.complete and windows.ratio <= GROWTH_TARGET,
            f"step cost at step {windows.late_to}{short} / step 10 at "
            f"synchronous={windows.synchronous} = "
            f"{windows.ratio:.3f} (target <= {GROWTH_TARGET}){label}",
        )
    grown = growth.envelope_late[1] - growth.envelope_early[1]
    _verdict(
        grown <= DIGIT_SLACK,
        f"envelope growth step 16 -> late, counters zeroed = {grown:+d} bytes "
        f"(target <= {DIGIT_SLACK})",
    )


def _verdict(passed: bool, text: str) -> None:
    print(f"  {'PASS' if passed else 'FAIL'}  {text}")


def profile_commits(base: Path, keyring: Keyring, n: int = 1000) -> None:
    """Where a tether commit's time goes, by cProfile (fsync shows up in ``execute``)."""
    store = SQLiteStore(base / "profile.sqlite", synchronous="FULL")
    try:
        session = start_run(store, keyring)
        session.run(max_steps=3)
        timed(lambda: tether_commit(session), 100)
        profiler = cProfile.Profile()
        profiler.runcall(timed, lambda: tether_commit(session), n)
    finally:
        store.close()
    print(f"profile of {n} tether commits (synchronous=FULL)")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(15)
    stats.sort_stats("cumulative").print_stats(25)


# -- main ---------------------------------------------------------------------------------


@contextmanager
def bench_dir(parent: Path) -> Iterator[Path]:
    """A fresh temp dir under ``parent`` for every database, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="tether-bench-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="tether checkpoint commit and step-cost benchmark")
    parser.add_argument(
        "--dir",
        type=Path,
        # Beside the repo, not /tmp: /tmp is often a tmpfs, where fsync costs nothing.
        default=REPO.parent,
        help="where to create the temp dir for the databases (default: the repo's parent)",
    )
    parser.add_argument("--quick", action="store_true", help="a shorter run (1,000 steps)")
    parser.add_argument(
        "--cap",
        type=float,
        help="seconds the long run may take to reach its last windows "
        f"(default {FULL.drive_cap_s:.0f}, quick {QUICK.drive_cap_s:.0f}; 0: no cap)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="only profile tether commits with cProfile"
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.cap is not None:
        settings = replace(settings, drive_cap_s=args.cap if args.cap > 0 else float("inf"))
    keyring = Keyring.generate("bench-1")
    with bench_dir(args.dir) as base:
        if args.profile:
            profile_commits(base, keyring)
            return 0
        header(base, settings)
        commits = measure_commits(base, settings, keyring)
        report_commits(commits, settings)
        growth = measure_growth(base, settings, keyring)
        report_growth(growth, settings)
        verdicts(commits, growth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
