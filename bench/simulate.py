"""The simulator's own figures: events/s, seeds per minute, and mutants caught out of planted.

    python bench/simulate.py [--seconds 60] [--jobs 1] [--mutant-seeds 60]
    python bench/simulate.py --against REV [--seeds 400] [--rounds 8]

An event is one scheduler decision the simulator applies: each entry of a
scenario's event list (a worker's step or drive, a person's act, a crash
armed, a clock advance, a fault armed or a service taken down) and each
decision of the drain at the end (a step, an approval, a review). Events
that find nothing to do (an approval with nothing pending) count too; they
are cheap, so the share of events that step the runtime is printed beside
the rate. Setup (a fresh database, two runtimes) is inside the timing.
``--jobs N`` runs N processes side by side on separate seeds (the rate is
their sum); the single-process figure is the one to compare over time.

This machine's speed varies about 2x from minute to minute, so every figure
is printed beside a fixed pure-Python loop timed in the same process
(``reference``: loops per microsecond), and ``--against REV`` compares this
tree with git revision ``REV`` (its ``src`` extracted to a temporary
directory) on the same seeds, in one process each, chunk by chunk in turn,
so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "--tree" not in sys.argv:
    sys.path.insert(0, str(ROOT / "src"))


def reference() -> float:
    """Loops of a fixed pure-Python body per microsecond (the machine's speed right now)."""
    started = time.perf_counter()
    total = 0
    for n in range(2_000_000):
        total += n & 7
    return 2_000_000 / ((time.perf_counter() - started) * 1e6)


def _simulate_for(job: tuple[int, int, float]) -> tuple[int, int, int, int]:
    """Seeds ``first``, ``first + stride``, ... for ``seconds``: (seeds, events, steps, checks)."""
    from tether.testing.simulate import draw, simulate

    first, stride, seconds = job
    logging.disable(logging.CRITICAL)
    started = time.perf_counter()
    seeds = events = steps = checks = 0
    seed = first
    while time.perf_counter() - started < seconds:
        scenario = draw(seed)
        result = simulate(scenario)
        seeds += 1
        events += result.events
        checks += result.checks
        steps += sum(1 for e in scenario.events if e.kind in {"step", "drive"})
        seed += stride
    return seeds, events, steps, checks


def _chunk(seeds: list[int]) -> None:
    """(In a child process, on the tree its path names) simulate ``seeds``; print the totals."""
    from tether.testing.simulate import draw, simulate

    logging.disable(logging.CRITICAL)
    simulate(draw(10**9))  # imports, the template store: not part of the timing
    machine = reference()
    started, cpu = time.perf_counter(), time.process_time()
    events = 0
    for seed in seeds:
        events += simulate(draw(seed)).events
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(json.dumps({"events": events, "seconds": seconds, "cpu": cpu, "reference": machine}))


def _extract(rev: str, into: Path) -> Path:
    """``rev``'s ``src`` tree, written under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def _run_chunk(src: Path, seeds: list[int]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    argv = [sys.executable, __file__, "--tree", str(src), "--chunk", ",".join(map(str, seeds))]
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def against(rev: str, seeds: int, rounds: int) -> None:
    """This tree and ``rev`` on the same seeds, chunk by chunk in turn; both rates."""
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as scratch:
        trees = {rev: _extract(rev, Path(scratch)), "this tree": ROOT / "src"}
        totals = {
            name: dict.fromkeys(("events", "seconds", "cpu", "reference"), 0.0) for name in trees
        }
        every = list(range(seeds))
        for n in range(rounds):
            chunk = every[n::rounds]
            order = list(trees.items()) if n % 2 == 0 else list(trees.items())[::-1]
            for name, src in order:
                got = _run_chunk(src, chunk)
                for field in ("events", "seconds", "cpu"):
                    totals[name][field] += got[field]
                totals[name]["reference"] += got["reference"] / rounds
        print(f"{seeds} seeds in {rounds} chunks, each tree in turn, one process each:")
        rates, cpu = {}, {}
        for name, t in totals.items():
            rates[name] = t["events"] / t["seconds"]
            cpu[name] = t["events"] / t["cpu"]
            print(
                f"  {name:>12}: {rates[name]:,.0f} events/s ({t['events']:.0f} events in "
                f"{t['seconds']:.1f} s; {cpu[name]:,.0f} per CPU second; "
                f"reference loop {t['reference']:.1f}/us)"
            )
        print(
            f"  ratio: {rates['this tree'] / rates[rev]:.2f}x "
            f"({cpu['this tree'] / cpu[rev]:.2f}x per CPU second)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--mutant-seeds", type=int, default=60)
    parser.add_argument("--against", help="a git revision to compare this tree with")
    parser.add_argument("--seeds", type=int, default=400, help="seeds per tree (--against)")
    parser.add_argument("--rounds", type=int, default=8, help="chunks per tree (--against)")
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.chunk is not None:
        _chunk([int(s) for s in args.chunk.split(",")])
        return
    if args.against is not None:
        against(args.against, args.seeds, args.rounds)
        return
    from tether.testing.simulate import CI_KNOBS
    from tether.testing.simulate._mutants import hunt, mutants

    logging.disable(logging.CRITICAL)
    machine = reference()
    jobs = [(n, args.jobs, args.seconds) for n in range(args.jobs)]
    started = time.perf_counter()
    if args.jobs == 1:
        totals = [_simulate_for(jobs[0])]
    else:
        with multiprocessing.Pool(args.jobs) as pool:
            totals = pool.map(_simulate_for, jobs)
    elapsed = time.perf_counter() - started
    machine = (machine + reference()) / 2
    seeds, events, steps, checks = (sum(t[i] for t in totals) for i in range(4))
    where = f"{args.jobs} processes" if args.jobs > 1 else "one process"
    print(
        f"simulated events/s: {events / elapsed:,.0f} ({events} events in {elapsed:.1f} s, {where})"
    )
    print(f"reference loop: {machine:.1f}/us (the machine's speed while it ran)")
    print(f"seeds per minute: {seeds / elapsed * 60:,.0f}")
    print(f"share of events that step the runtime (step or drive): {steps / max(1, events):.0%}")
    print(f"invariant checks: {checks}")
    planted = mutants()
    caught = 0
    for name, mutant in planted.items():
        seed = hunt(name, range(args.mutant_seeds))  # the directed cases first
        caught += seed is not None
        knobs = sorted(mutant.knobs - CI_KNOBS)
        extra = f" (with {', '.join(knobs)})" if knobs else ""
        print(f"  {name}: {'seed ' + str(seed) if seed is not None else 'escaped'}{extra}")
    print(
        f"mutants caught: {caught} of {len(planted)} "
        f"(directed cases, then seeds 0..{args.mutant_seeds - 1})"
    )


if __name__ == "__main__":
    main()
