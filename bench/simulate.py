"""The simulator's own figures: events/s, seeds per minute, and mutants caught out of planted.

    python bench/simulate.py [--seconds 60] [--jobs 1] [--mutant-seeds 60]

An event is one scheduler decision the simulator applies: each entry of a
scenario's event list (a worker's step or drive, a person's act, a crash
armed, a clock advance, a fault armed or a service taken down) and each
decision of the drain at the end (a step, an approval, a review). Events
that find nothing to do (an approval with nothing pending) count too; they
are cheap, so the share of events that step the runtime is printed beside
the rate. Setup (a fresh database, two runtimes) is inside the timing.
``--jobs N`` runs N processes side by side on separate seeds (the rate is
their sum); the single-process figure is the one to compare over time.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tether.testing.simulate import CI_KNOBS, draw, simulate
from tether.testing.simulate._mutants import hunt, mutants


def _simulate_for(job: tuple[int, int, float]) -> tuple[int, int, int, int]:
    """Seeds ``first``, ``first + stride``, ... for ``seconds``: (seeds, events, steps, checks)."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--mutant-seeds", type=int, default=60)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    jobs = [(n, args.jobs, args.seconds) for n in range(args.jobs)]
    started = time.perf_counter()
    if args.jobs == 1:
        totals = [_simulate_for(jobs[0])]
    else:
        with multiprocessing.Pool(args.jobs) as pool:
            totals = pool.map(_simulate_for, jobs)
    elapsed = time.perf_counter() - started
    seeds, events, steps, checks = (sum(t[i] for t in totals) for i in range(4))
    where = f"{args.jobs} processes" if args.jobs > 1 else "one process"
    print(
        f"simulated events/s: {events / elapsed:,.0f} ({events} events in {elapsed:.1f} s, {where})"
    )
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
