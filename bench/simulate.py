"""The simulator's own figures: events/s, seeds per minute, and mutants caught out of planted.

    python bench/simulate.py [--seconds 60] [--mutant-seeds 60]

An event is one scheduler decision of a scenario's event list (a worker's
step or drive, a person's action, a crash armed, a clock advance, a fault
armed) plus each decision of the drain at the end (a step, an approval, a
review). Events that find nothing to do (an approval with nothing pending)
count too; they are cheap, and the figure says so by also printing the
share of steps. Setup (a fresh database, two runtimes) is inside the timing.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tether.testing.simulate import CI_KNOBS, draw, simulate
from tether.testing.simulate._mutants import hunt, mutants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--mutant-seeds", type=int, default=60)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    started = time.perf_counter()
    seeds = events = steps = checks = 0
    while time.perf_counter() - started < args.seconds:
        scenario = draw(seeds)
        result = simulate(scenario)
        seeds += 1
        events += result.events
        checks += result.checks
        steps += sum(1 for e in scenario.events if e.kind in {"step", "drive"})
    elapsed = time.perf_counter() - started
    print(f"simulated events/s: {events / elapsed:,.0f} ({events} events in {elapsed:.1f} s)")
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
    print(f"mutants caught: {caught} of {len(planted)} within seeds 0..{args.mutant_seeds - 1}")


if __name__ == "__main__":
    main()
