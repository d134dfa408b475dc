"""Workspace benchmark: a step on a 50,000-file tree against a step on a 10-file tree.

Two modes side by side: ``scan`` (the default workspace: every look walks the
tree and stats every file) and ``watched`` (``FileWorkspace(watch=True)``:
an inotify watcher says what changed, with its default 60 s verification).
Each mode gets its own big and small tree; all four are built in temp
directories in ONE run, on ONE file system, and stepped in turn (big, small,
big, small, ...) so disk noise and the other processes on the machine land
on all of them. A step is what a session's write step
asks of the adapter (``runtime/_session.py``): ``environment()``,
``normalize`` of one ``file.write``, ``derive_post_state``, ``execute`` and
``environment()`` again. Between two steps another actor changes 10 files of
the big tree (so every big step re-hashes 11 files), and after each step the
new snapshot blobs are stored in a real :class:`~tether.store.SQLiteStore`
(a rewind point), whose bytes are compared with the bytes that changed.

The trees are backdated past the stat cache's racy window before the cold
step, as a checked-out repository is; the cold step (empty stat cache, every
file read and hashed) is reported on its own.

    python bench/workspace.py            # 50,000 files, 20 steps
    python bench/workspace.py --quick    # 10,000 files, 10 steps

Targets: warm ms/step big/small <= 2x (in at least one mode); snapshot bytes per rewind point in
proportion to the changed bytes, not to the tree.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _progress import rounds as progress_rounds

from tether.adapters import FileWorkspace
from tether.adapters._statcache import RACY_WINDOW_NS
from tether.core import Intent, Observation, Policy, Proposal, TaskSpec
from tether.crypto import Keyring
from tether.runtime import AgentContext, Decision, Runtime
from tether.store import SQLiteStore

CHANGED_PER_STEP = 10


def build(root: Path, files: int) -> list[str]:
    """A tree of ``files`` small files, nested like a source repository (3 directory levels)."""
    paths: list[str] = []
    per_leaf, fanout = 10, max(1, round((files / 10) ** (1 / 3)))
    n = 0
    for a in range(fanout):
        for b in range(fanout):
            for c in range(fanout):
                if n >= files:
                    break
                leaf = root / f"pkg{a}" / f"mod{b}" / f"sub{c}"
                leaf.mkdir(parents=True)
                for f in range(min(per_leaf, files - n)):
                    rel = f"pkg{a}/mod{b}/sub{c}/file{f}.py"
                    (root / rel).write_bytes(_body(n, 0))
                    paths.append(rel)
                    n += 1
    while n < files:  # the cube root left a remainder: one more flat directory
        rel = f"extra/file{n}.py"
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_bytes(_body(n, 0))
        paths.append(rel)
        n += 1
    return paths


def _body(n: int, version: int) -> bytes:
    # 300-600 bytes: the size of a small source file.
    line = f"def f{n}_{version}(x):\n    return x + {n * 7 + version}\n"
    return (line * (1 + n % 10)).encode()[: 300 + n % 300].ljust(300, b"#")


class Stepper:
    """One tree, one workspace, one store: steps through the adapter and stores snapshots."""

    def __init__(self, base: Path, name: str, files: int, change: int, watch: bool) -> None:
        self.watch = watch
        self.root = base / name / "tree"
        self.root.mkdir(parents=True)
        self.paths = build(self.root, files)
        self.journal = base / name / "journal"
        self.store = SQLiteStore(base / name / "store.sqlite")
        self.change = change
        self.step_no = 0
        self.ws: FileWorkspace | None = None
        self.times: list[float] = []
        self.snapshot_bytes: list[int] = []
        self.changed_bytes: list[int] = []
        self.snapshot_ms: list[float] = []
        self.hashed: list[int] = []
        self.listed: list[int] = []

    def open(self) -> FileWorkspace:
        self.ws = FileWorkspace(self.root, self.journal, watch=self.watch)
        if self.watch and not self.ws.watching:
            raise SystemExit(f"cannot watch {self.root}: {self.ws.watch_problem}")
        return self.ws

    def others_change_files(self) -> int:
        """Another actor edits ``change`` files between steps; returns the bytes written."""
        written = 0
        for i in range(self.change):
            index = (self.step_no * 7919 + i * 104729) % len(self.paths)
            data = _body(index, self.step_no + 1)
            (self.root / self.paths[index]).write_bytes(data)
            written += len(data)
        return written

    def step(self) -> tuple[float, int]:
        """One timed adapter step; returns (seconds, bytes the write changed)."""
        ws = self.ws
        assert ws is not None
        self.step_no += 1
        target = self.paths[len(self.paths) // 2]
        content = f"step {self.step_no}\n" * 20
        start = time.perf_counter()
        pre = ws.environment()
        args = ws.normalize("file.write", target, {"content": content})
        intent = Intent("file.write", target, args, "low")
        post = ws.derive_post_state(pre, intent)
        ws.execute(f"bench-{self.step_no}", intent, pre)
        after = ws.environment()
        elapsed = time.perf_counter() - start
        if after.state_fingerprint != post.state_fingerprint:
            raise SystemExit("derived post-state and the tree disagree: the bench is broken")
        return elapsed, len(content.encode())

    def snapshot(self) -> int:
        """Store the new snapshot's missing blobs (a rewind point); returns their bytes."""
        ws = self.ws
        assert ws is not None
        start = time.perf_counter()
        root = ws.environment().state_fingerprint
        blobs = ws.snapshot_blobs(root, self.store.has_blob)
        self.store.put_blobs(blobs)
        self.snapshot_ms.append((time.perf_counter() - start) * 1000)
        return sum(len(b) for b in blobs.values())

    def round(self) -> None:
        ws = self.ws
        assert ws is not None
        changed = self.others_change_files()
        hashed, listed = ws.files_hashed, ws.dirs_listed
        elapsed, written = self.step()
        self.hashed.append(ws.files_hashed - hashed)
        self.listed.append(ws.dirs_listed - listed)
        self.times.append(elapsed * 1000)
        self.changed_bytes.append(changed + written)
        self.snapshot_bytes.append(self.snapshot())

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        self.store.close()


class Writer:
    """The bench's agent: one ``file.write`` of ``target`` per step, forever."""

    def __init__(self, target: str) -> None:
        self.target = target

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        cursor = context.plan_cursor
        proposal = Proposal(
            f"w{cursor}",
            "file.write",
            self.target,
            {"content": f"runtime step {cursor}\n" * 20},
            observation.environment.version,
        )
        return Decision(AgentContext(context.messages, context.memory, cursor + 1), proposal)


class RunStepper:
    """A real run over one watched tree: ``session.step()`` as a user's run takes it.

    A step here is everything the runtime does for one write: observe, ask
    the agent, gate, the intent's commit, the adapter's write, the receipt's
    commit, and the snapshot of the new workspace stored with it.
    """

    def __init__(self, base: Path, name: str, files: int, change: int) -> None:
        self.inner = Stepper(base, name, files, change, watch=True)
        self.times: list[float] = []
        self.session: Any = None

    def open(self) -> float:
        """Start the run (its first commit snapshots the whole tree); the ms it took."""
        ws = self.inner.open()
        target = self.inner.paths[len(self.inner.paths) // 2]
        fingerprint = ws.environment().state_fingerprint
        many = 10**9
        task = TaskSpec.from_json(
            {
                "task_id": "bench",
                "task_version": "1",
                "allowed_kinds": ["file.write"],
                "allowed_paths": [target],
                "permissions": ["workspace.write"],
                "budgets": {"proposals": many, "steps": many, "wall_time_s": 10**6, "cost": many},
                "initial_environment": {
                    "namespace": "file-workspace",
                    "state_fingerprint": fingerprint,
                },
                "verifier": {"argv": ["true"], "timeout_s": 10},
            }
        )
        policy = Policy.from_json(
            {
                "policy_id": "bench",
                "policy_version": "1",
                "kinds": {
                    "file.write": {
                        "risk": "low",
                        "permission": "workspace.write",
                        "needs_approval": False,
                    }
                },
                "max_risk": "low",
                "approval_ttl_s": 60,
            }
        )
        runtime = Runtime(
            store=self.inner.store,
            keyring=Keyring.generate("bench"),
            adapter=ws,
            task=task,
            policy=policy,
            agent=Writer(target),
        )
        start = time.perf_counter()
        self.session = runtime.start("bench")
        return (time.perf_counter() - start) * 1000

    def round(self) -> None:
        self.inner.step_no += 1
        self.inner.others_change_files()
        start = time.perf_counter()
        outcome = self.session.step()
        self.times.append((time.perf_counter() - start) * 1000)
        if outcome.kind.value != "executed":
            raise SystemExit(f"the bench's run did not write: {outcome}")

    def close(self) -> None:
        self.inner.close()


def bare_stat_walk(root: Path) -> int:
    """os.scandir + lstat of every file and nothing else: the floor of a per-file-stat scan."""
    count, stack = 0, [str(root)]
    while stack:
        with os.scandir(stack.pop()) as listing:
            for item in listing:
                if item.is_dir(follow_symlinks=False):
                    stack.append(item.path)
                else:
                    item.stat(follow_symlinks=False)
                    count += 1
    return count


def scan_floor(stepper: Stepper, rounds: int = 5) -> tuple[float, float]:
    """Median ms of one warm environment() and of the bare stat walk, alternating."""
    ws = stepper.ws
    assert ws is not None
    env_ms, bare_ms = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        ws.environment()
        env_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        bare_stat_walk(stepper.root)
        bare_ms.append((time.perf_counter() - start) * 1000)
    return statistics.median(env_ms), statistics.median(bare_ms)


def backdate(base: Path) -> None:
    """Wait out the racy window: the trees are then as old as a checkout is to the cache."""
    time.sleep(RACY_WINDOW_NS / 1e9 + 0.2)
    del base


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="tether workspace step and snapshot benchmark")
    parser.add_argument("--quick", action="store_true", help="10,000 files and 10 steps")
    parser.add_argument("--dir", type=Path, default=None, help="where to build the trees")
    options = parser.parse_args(argv)
    files, steps = (10_000, 10) if options.quick else (50_000, 20)
    with tempfile.TemporaryDirectory(prefix="tether-bench-ws-", dir=options.dir) as tmp:
        base = Path(tmp)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"tether workspace benchmark ({files:,} vs 10 files, {steps} steps each)")
        print(f"  machine : {os.cpu_count()} cores, {platform.platform()}, load {load}")
        print(f"  python  : {sys.version.split()[0]}; trees in {base}")
        built = time.perf_counter()
        modes = {
            mode: (
                Stepper(base, f"big-{mode}", files, CHANGED_PER_STEP, mode == "watched"),
                Stepper(base, f"small-{mode}", 10, 0, mode == "watched"),
            )
            for mode in ("scan", "watched")
        }
        steppers = [s for pair in modes.values() for s in pair]
        print(f"  built the trees in {time.perf_counter() - built:.1f} s")
        backdate(base)
        try:
            cold = {}
            for stepper in steppers:
                ws = stepper.open()
                start = time.perf_counter()
                ws.environment()
                cold[stepper] = (time.perf_counter() - start) * 1000, ws.files_hashed
                stepper.snapshot_bytes.append(stepper.snapshot())
            time.sleep(RACY_WINDOW_NS / 1e9 + 0.2)  # the first snapshot's cache rows age too
            for _ in progress_rounds(range(steps), "workspace steps", steps):
                for stepper in steppers:
                    stepper.round()
            report(modes, cold, files)
            runs(base, files, steps)
            env_ms, bare_ms = scan_floor(modes["scan"][0])
            print()
            print(f"one warm environment() on {files:,} files: {env_ms:.1f} ms; a bare")
            print(
                f"os.scandir+lstat walk of the same tree: {bare_ms:.1f} ms (the per-file stat floor)"
            )
        finally:
            for stepper in steppers:
                stepper.close()
    return 0


def runs(base: Path, files: int, steps: int) -> None:
    """The same comparison for whole runtime steps (commits and snapshots included), watched."""
    big = RunStepper(base, "run-big", files, CHANGED_PER_STEP)
    small = RunStepper(base, "run-small", 10, 0)
    try:
        backdate(base)
        started = {label: s.open() for label, s in (("big", big), ("small", small))}
        time.sleep(RACY_WINDOW_NS / 1e9 + 0.2)
        for _ in range(steps):
            big.round()
            small.round()
    finally:
        big.close()
        small.close()
    b, s = statistics.median(big.times), statistics.median(small.times)
    print()
    print("runtime, watched: session.step() of one write (observe, decide, gate, two commits,")
    print("the write, the snapshot stored with the receipt)")
    for label, stepper, med in ((f"{files:,} files", big, b), ("10 files", small, s)):
        spread = statistics.quantiles(stepper.times, n=4)
        print(
            f"   {label:<14}: median {med:8.1f} ms/step (quartiles {spread[0]:.1f}-"
            f"{spread[-1]:.1f}, min {min(stepper.times):.1f}, max {max(stepper.times):.1f})"
        )
    print(
        f"   ratio big/small: {b / s:.2f}x of medians, {min(big.times) / min(small.times):.2f}x "
        f"of minimums (target <= 2x); the run's start (whole-tree snapshot) took "
        f"{started['big']:.0f} ms vs {started['small']:.0f} ms"
    )


def report(
    modes: dict[str, tuple[Stepper, Stepper]],
    cold: dict[Stepper, tuple[float, int]],
    files: int,
) -> None:
    big, small = modes["scan"]
    print()
    print("cold: first environment() with an empty stat cache (every file read and hashed)")
    for label, stepper in ((f"{files:,} files", big), ("10 files", small)):
        ms, hashed = cold[stepper]
        first = stepper.snapshot_bytes[0]
        print(f"   {label:<14}: {ms:9.1f} ms, {hashed:,} files hashed; first snapshot {first:,} B")
    ratios = {}
    for mode, (big, small) in modes.items():
        print()
        print(f"warm, {mode}: environment + normalize + derive_post_state + execute + environment")
        b, s = statistics.median(big.times), statistics.median(small.times)
        for label, stepper, med in ((f"{files:,} files", big, b), ("10 files", small, s)):
            spread = statistics.quantiles(stepper.times, n=4) if len(stepper.times) > 1 else [med]
            print(
                f"   {label:<14}: median {med:8.1f} ms/step (quartiles {spread[0]:.1f}-"
                f"{spread[-1]:.1f}, min {min(stepper.times):.1f}, max {max(stepper.times):.1f}); "
                f"per step re-hashed {statistics.median(stepper.hashed):.0f} files, "
                f"listed {statistics.median(stepper.listed):.0f} dirs"
            )
        ratios[mode] = b / s
        floor = min(big.times) / min(small.times)
        print(f"   ratio big/small: {b / s:.2f}x of medians  (target <= 2x)")
        print(f"   (of minimums, the least disturbed steps on a loaded machine: {floor:.2f}x)")
    print()
    met = [mode for mode, ratio in ratios.items() if ratio <= 2]
    verdict = f"MET by {', '.join(met)}" if met else "NOT MET"
    shown = ", ".join(f"{mode} {ratio:.2f}x" for mode, ratio in ratios.items())
    print(f"target (step on {files:,} files <= 2x the 10-file step): {verdict} ({shown})")
    print()
    print("snapshot per rewind point: new blob bytes stored vs bytes changed in the step")
    for mode, (big, small) in modes.items():
        for label, stepper in ((f"{files:,} files", big), ("10 files", small)):
            snap = statistics.median(stepper.snapshot_bytes[1:])
            changed = statistics.median(stepper.changed_bytes)
            print(
                f"   {mode:<7} {label:<14}: changed {changed:8,.0f} B -> snapshot {snap:8,.0f} B "
                f"({snap / changed:.2f}x), snapshot_blobs + put_blobs "
                f"{statistics.median(stepper.snapshot_ms):.1f} ms"
            )
    total = modes["scan"][0].snapshot_bytes[0]
    print(f"   (the whole {files:,}-file tree's first snapshot: {total:,} B)")


if __name__ == "__main__":
    raise SystemExit(main())
