"""``python -m tether.testing.simulate``: replay a seed exactly, or explore new ones.

python -m tether.testing.simulate --seed 12            # replay, print the event log
python -m tether.testing.simulate --minutes 5          # explore new seeds
python -m tether.testing.simulate --seed 12 --all      # every knob on (known defects too)
"""

from __future__ import annotations

import argparse
import logging
import random
import sys

from tether.testing.simulate._directed import case_of, directed
from tether.testing.simulate._run import bar, explore, run, shrink
from tether.testing.simulate._runner import Result, simulate
from tether.testing.simulate._scenario import ALL_KNOBS, CI_KNOBS, KNOWN_DEFECTS


def _knobs(args: argparse.Namespace) -> frozenset[str]:
    knobs = set(ALL_KNOBS if args.all else CI_KNOBS)
    knobs |= set(args.on or ())
    knobs -= set(args.off or ())
    unknown = knobs - ALL_KNOBS
    if unknown:
        raise SystemExit(f"unknown knob(s) {sorted(unknown)}; known: {sorted(ALL_KNOBS)}")
    return frozenset(knobs)


def _report(result: Result, *, shrunk: bool) -> None:
    print(result.scenario.describe())
    print(f"phase at the end: {result.phase}; {result.receptions} effects reached the world")
    for violation in result.violations:
        print(violation)
    if not result.ok and not shrunk:
        small = shrink(result)
        print(f"\nshrunk to {len(small.scenario.events)} events:")
        print(small.scenario.describe())
        for violation in small.violations:
            print(violation)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tether.testing.simulate", description=__doc__)
    parser.add_argument("--seed", type=int, help="replay this seed exactly")
    parser.add_argument(
        "--directed", type=int, help="replay the directed scenario numbered N (1000001...)"
    )
    parser.add_argument("--minutes", type=float, help="explore new seeds for this long")
    parser.add_argument("--seeds", type=int, help="explore this many seeds")
    parser.add_argument("--first", type=int, help="first seed to explore (default: random)")
    parser.add_argument("--events", type=int, default=60, help="events per seed (default 60)")
    parser.add_argument("--all", action="store_true", help="every knob on, known defects too")
    parser.add_argument("--on", action="append", help="switch a knob on (repeatable)")
    parser.add_argument("--off", action="append", help="switch a knob off (repeatable)")
    parser.add_argument("--no-shrink", action="store_true", help="print failures unshrunk")
    args = parser.parse_args(argv)
    # The runtime's own warnings about lost leases are expected here; the
    # process-wide switch is put back after (main() may run inside a test).
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        return _main(args)
    finally:
        logging.disable(previous)


def _main(args: argparse.Namespace) -> int:
    knobs = _knobs(args)
    if args.directed is not None:
        chosen = [s for s in directed(knobs) if s.seed == args.directed]
        if not chosen:
            raise SystemExit(f"no directed scenario {args.directed} under these knobs")
        print(f"directed case: {case_of(chosen[0])}")
        result = simulate(chosen[0])
        _report(result, shrunk=args.no_shrink)
        return 0 if result.ok else 1
    if args.seed is not None:
        result = run(args.seed, knobs=knobs, events=args.events)
        _report(result, shrunk=args.no_shrink)
        return 0 if result.ok else 1
    first = args.first if args.first is not None else random.SystemRandom().randrange(10**9)
    minutes = args.minutes if args.minutes is not None else 1.0
    print(f"exploring from seed {first}; knobs on: {', '.join(sorted(knobs))}", file=sys.stderr)
    off = sorted(set(KNOWN_DEFECTS) - knobs)
    if off:
        print(f"known defects switched off: {', '.join(off)}", file=sys.stderr)
    found = explore(
        first,
        minutes=minutes,
        seeds=args.seeds,
        knobs=knobs,
        events=args.events,
        progress=lambda f: bar(f, minutes, args.seeds),
    )
    print(file=sys.stderr)
    rate = found.events / max(1e-9, found.seconds)
    per_cpu = found.events / max(1e-9, found.cpu)
    print(
        f"{found.seeds} seeds, {found.events} events ({rate:,.0f} events/s, "
        f"{per_cpu:,.0f} per CPU second), "
        f"{found.checks} invariant checks, {len(found.failures or [])} failing seeds"
    )
    for result in found.failures or []:
        first_violation = result.violations[0]
        print(f"seed {result.scenario.seed}: {first_violation}")
        flags = "".join(f" --on {k}" for k in sorted(knobs - CI_KNOBS))
        flags += "".join(f" --off {k}" for k in sorted(CI_KNOBS - knobs))
        print(
            f"  replay: python -m tether.testing.simulate --seed {result.scenario.seed}"
            f" --events {args.events}{flags}"
        )
    return 0 if not found.failures else 1


if __name__ == "__main__":
    sys.exit(main())
