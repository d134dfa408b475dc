"""cProfile of one recovery worker driving seeded runs on PostgreSQL: where a commit's time goes.

Seeds runs exactly as ``bench/workers.py`` does (same agent, task, policy,
workspace, one fresh schema), then serves them with one in-process
``Worker`` under cProfile and prints the functions that cost the most,
per commit. The network and the server do not show up here (a round trip
is time spent inside psycopg's wait); ``bench/breakdown.py`` measures them.

    .venv/bin/python bench/profile_worker.py [--runs 4] [--steps 60] [--sort tottime] [--top 40]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workers  # a sibling script, not a package


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=workers.DEFAULT_DSN)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument(
        "--clock",
        default="cpu",
        choices=["cpu", "wall"],
        help="cpu: this process's CPU time (waits for the server cost nothing); wall: real time",
    )
    parser.add_argument(
        "--plain", action="store_true", help="no profiler: only CPU per commit, undistorted"
    )
    parser.add_argument("--out", help="also write the raw profile here (for snakeviz etc.)")
    args = parser.parse_args(argv)

    import psycopg

    from tether.runtime import Worker
    from tether.store import open_store

    schema = f"tether_prof_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    url = workers.schema_url(args.dsn, schema)
    home = Path(tempfile.mkdtemp(prefix="tether-prof-"))
    try:
        workers.seed(url, home, args.runs, args.steps)
        with open_store(url) as store:
            before = sum(m.generation for m in store.runs())

            def factory(store: object, run_id: str, worker: str) -> object:
                return workers.make_runtime(store, home, run_id, worker, args.steps)

            worker = Worker(store, factory, "prof", lease_ttl_s=30, poll_s=0.05)  # type: ignore[arg-type]
            timer = time.process_time if args.clock == "cpu" else time.perf_counter
            profile = cProfile.Profile(timer)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            if not args.plain:
                profile.enable()
            worker.serve(idle_exit=True)
            profile.disable()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            commits = sum(m.generation for m in store.runs()) - before
        how = "plain" if args.plain else "profiled"
        print(
            f"{commits} commits in {wall:.2f} s wall, {cpu:.2f} s process CPU ({how}): "
            f"{wall / commits * 1e6:.0f} µs wall, {cpu / commits * 1e6:.0f} µs CPU per commit"
        )
        if args.plain:
            return 0
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        stats.sort_stats(args.sort).print_stats(args.top)
        print(text.getvalue())
        if args.out:
            stats.dump_stats(args.out)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
