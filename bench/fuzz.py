"""Feed ≥ 100,000 damaged stores, envelopes and documents to every reader and CLI command.

Each input is one seed: a copy of a real home (SQLite store with four real
runs, keyring, trust roots, signing keys, task and policy files, signed
evidence) damaged as the seed says, then read by every library reader and
every ``tether`` command in-process (tests/integration/_fuzzkit.py). It
prints how many inputs ran, the typed errors by class, the calls that
accepted their input, and the untyped failures (target 0), grouped, with the
first seeds of each group and the command that replays one.

    .venv/bin/python bench/fuzz.py [--inputs 100000] [--processes 2] [--start 0]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration import _fuzzkit, _fuzzpool


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--show", type=int, default=5, help="seeds shown per failure group")
    parser.add_argument(
        "--full", action="store_true", help="every run and every command for each input (slower)"
    )
    args = parser.parse_args()
    started = time.monotonic()
    typed: collections.Counter[str] = collections.Counter()
    families: collections.Counter[str] = collections.Counter()
    groups: dict[str, list[int]] = collections.defaultdict(list)
    accepted = calls = inputs = failed = 0
    for result in _fuzzkit_results(args):
        inputs += 1
        families[result.family] += 1
        typed.update(result.typed)
        accepted += result.accepted
        calls += result.accepted + sum(result.typed.values()) + len(result.untyped)
        if result.untyped:
            failed += 1
            for text in result.untyped:
                groups[_fuzzkit.signature(text)].append(result.seed)
        if inputs % 5000 == 0:
            print(
                f"  ... {inputs} inputs, {failed} with untyped failures "
                f"({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    took = time.monotonic() - started
    print(
        f"inputs: {inputs} (seeds {args.start}..{args.start + args.inputs - 1}) in {took:.0f} s "
        f"on {args.processes} processes"
    )
    print("families: " + ", ".join(f"{k} {v}" for k, v in sorted(families.items())))
    print(f"reader and command calls: {calls}")
    print(f"accepted as valid: {accepted}")
    print(f"typed errors: {sum(typed.values())}")
    for name, count in typed.most_common():
        print(f"  {name:32} {count}")
    print(
        f"untyped failures: {failed} inputs, {sum(len(s) for s in groups.values())} calls "
        f"(target 0)"
    )
    for sig, seeds in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        firsts = sorted(set(seeds))[: args.show]
        print(f"  {len(seeds):6}  {sig}")
        print(f"          seeds {firsts}; replay: {_fuzzkit.replay_command(firsts[0], args.full)}")
    return 0 if not groups else 1


def _fuzzkit_results(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    seeds = range(args.start, args.start + args.inputs)
    return _fuzzpool.run_many(seeds, processes=args.processes, full=args.full)


if __name__ == "__main__":
    sys.exit(main())
