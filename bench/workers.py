"""Checkpoint throughput of N recovery workers against one PostgreSQL database.

For N = 1, 2, 4, 8 worker processes, this seeds independent runs in a fresh
schema and lets real `Worker` processes (the same code `tether worker` runs)
claim and drive them to completion under leases. Each step is one signed
checkpoint commit (generation CAS + lease-version check + trace event) and a
guarded file write through a `FileWorkspace` (one per run; the write's
receipt rides on the next step's commit), so the duplicate-effect count is
measured on real effects: for each run, writes the workspace received minus
effects the ledger committed. It must be 0.

The baseline is measured side by side in the same run: N processes, each
committing single-row UPDATEs of a row of the same size as an envelope, on
the same server. Printed at each N: tether commits/s over bare commits/s.
Judged at N = 8 (issue 26): client CPU per write step ≤ 0.5 ms, and the
server's CPU per tether commit ≤ 2x its CPU per bare UPDATE.

Rates are measured over the steady window (every worker up, none finished),
so process start-up and the tail where workers leave one by one are not
counted; the whole-run rate is printed beside it. CPU per commit is read
from /proc for the worker processes (client) and for the PostgreSQL
backends serving them (server), for tether and for the baseline.

    .venv/bin/python bench/workers.py [--steps 60] [--runs-per-worker 2] [--repeat 1] [--dsn DSN]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _progress import rounds as progress_rounds

DEFAULT_DSN = os.environ.get("TETHER_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
VERIFIER = ("python", "-c", "pass")


def schema_url(dsn: str, schema: str) -> str:
    """The DSN in ``schema``; its connections are named after it (see ServerCPU)."""
    joiner = "&" if "?" in dsn else "?"
    return f"{dsn}{joiner}options=-csearch_path%3D{schema}&application_name={schema}"


class BenchAgent:
    """A file write every step, then finish; deterministic from context.

    Every step is a guarded write: a step that asks for nothing is not progress,
    and a worker defers such a run for its back-off, so idle steps would measure
    the back-off, not the step.
    """

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def decide(self, context: Any, observation: Any) -> Any:
        from tether import AgentContext, Decision, Proposal

        cursor = context.plan_cursor
        nxt = AgentContext(context.messages, context.memory, cursor + 1)
        if cursor >= self.steps:
            return Decision(nxt, finished=True)
        proposal = Proposal(
            action_id=f"w{cursor}",
            kind="file.write",
            target="notes.txt",
            args={"content": f"step {cursor}\n"},
            based_on_version=observation.environment.version,
        )
        return Decision(nxt, proposal)


def task_and_policy(fingerprint: str, steps: int) -> tuple[Any, Any]:
    from tether import Policy, TaskSpec

    task = TaskSpec.from_json(
        {
            "task_id": "bench",
            "task_version": "1",
            "allowed_kinds": ["file.write"],
            "allowed_paths": ["notes.txt"],
            "permissions": ["workspace.write"],
            "budgets": {"proposals": steps + 5, "steps": steps + 5, "wall_time_s": 3600, "cost": 0},
            "initial_environment": {
                "namespace": "file-workspace",
                "state_fingerprint": fingerprint,
            },
            "verifier": {"argv": list(VERIFIER), "timeout_s": 60},
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
    return task, policy


def workspace(home: Path, run_id: str) -> Any:
    from tether import FileWorkspace

    return FileWorkspace(
        home / "runs" / run_id, home / "runs" / f"{run_id}.journal", verifier_allowlist=[VERIFIER]
    )


def make_runtime(store: Any, home: Path, run_id: str, worker: str, steps: int) -> Any:
    from tether import Keyring, Runtime

    ws = workspace(home, run_id)
    task, policy = task_and_policy((home / "fingerprint").read_text(), steps)
    return Runtime(
        store=store,
        keyring=Keyring.from_file(home / "keyring.json"),
        adapter=ws,
        task=task,
        policy=policy,
        agent=BenchAgent(steps),
        worker=worker,
    )


def seed(url: str, home: Path, runs: int, steps: int) -> None:
    from tether import Keyring
    from tether.store import open_store

    Keyring.generate("bench").write_file(home / "keyring.json")
    for index in range(runs):
        run_id = f"run-{index:03d}"
        (home / "runs" / run_id).mkdir(parents=True)
        (home / "runs" / run_id / "notes.txt").write_text("start\n")
        if index == 0:
            with workspace(home, run_id) as ws:
                (home / "fingerprint").write_text(ws.environment().state_fingerprint)
    with open_store(url) as store:
        for index in range(runs):
            run_id = f"run-{index:03d}"
            make_runtime(store, home, run_id, "seeder", steps).start(run_id)  # genesis only


def worker_main(url: str, home: str, worker_id: str, steps: int, ready: Any, go: Any) -> None:
    from tether.runtime import Worker
    from tether.store import open_store

    with open_store(url) as store:

        def factory(store: Any, run_id: str, worker: str) -> Any:
            return make_runtime(store, Path(home), run_id, worker, steps)

        worker = Worker(store, factory, worker_id, lease_ttl_s=30, poll_s=0.05)
        ready.wait()
        go.wait()
        worker.serve(idle_exit=True)


# -- CPU accounting ----------------------------------------------------------
#
# Both sides run on this machine, so CPU is read from /proc: a process's
# utime + stime, in clock ticks. The server's share is the backends serving
# this measurement's connections (found by application_name), so other
# databases' work on a shared server is not counted; the WAL writer and the
# other background processes are left out for tether and baseline alike.

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int, *, system_only: bool = False) -> float:
    """Seconds of CPU the process has used (0 if it is gone); ``system_only``: in the kernel."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (0 if system_only else int(fields[11])) * TICK_S + int(fields[12]) * TICK_S


class ServerCPU:
    """CPU used by the backends named ``name``, accumulated across samples.

    A backend that appears between samples counts from its start; one that
    leaves loses at most the last interval.
    """

    def __init__(self, probe: Any, name: str) -> None:
        self.probe = probe
        self.name = name
        self.total = 0.0
        self._seen: dict[int, float] = {}
        self.sample()
        self.total = 0.0

    def sample(self) -> float:
        rows = self.probe.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.name,)
        ).fetchall()
        seen: dict[int, float] = {}
        for (pid,) in rows:
            seen[pid] = cpu_of(pid)
            self.total += max(0.0, seen[pid] - self._seen.get(pid, 0.0))
        self._seen = seen
        return self.total


def bare_main(dsn: str, row: int, size: int, seconds: float, go: Any, out: Any, done: Any) -> None:
    import psycopg

    body = os.urandom(size)
    with psycopg.connect(dsn, autocommit=True) as conn:
        go.wait()
        cpu = time.process_time()
        deadline = time.perf_counter() + seconds
        count = 0
        while time.perf_counter() < deadline:
            conn.execute("UPDATE bench_bare SET v = v + 1, body = %s WHERE id = %s", (body, row))
            count += 1
        out.put((count, time.process_time() - cpu))
        done.wait()  # the backend stays up until the server's CPU has been read


def measure_tether(dsn: str, n: int, runs_per_worker: int, steps: int) -> dict[str, float]:
    """Rate and CPU per commit over the steady window: every worker up, none finished.

    Process start, the first claims and the tail (workers leaving one by
    one as the runs run out) are outside it; the whole-run rate is kept too.
    """
    import psycopg

    from tether.store import open_store

    schema = f"tether_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    url = schema_url(dsn, schema)
    home = Path(tempfile.mkdtemp(prefix=f"tether-bench-n{n}-"))
    runs = n * runs_per_worker
    try:
        seed(url, home, runs, steps)
        with open_store(url) as store:
            before = sum(m.generation for m in store.runs())
            size = len(
                store.get_checkpoint(store.runs()[0].run_id, store.runs()[0].checkpoint_digest)
                or b""
            )
        ctx = mp.get_context("spawn")
        barrier_ready = ctx.Barrier(n + 1)
        go = ctx.Event()
        procs = [
            ctx.Process(
                target=worker_main, args=(url, str(home), f"w{i}", steps, barrier_ready, go)
            )
            for i in range(n)
        ]
        for proc in procs:
            proc.start()
        barrier_ready.wait()
        with psycopg.connect(dsn, autocommit=True) as probe:
            server = ServerCPU(probe, schema)

            def sample() -> tuple[float, int, float, float, float]:
                row = probe.execute(
                    f'SELECT sum(generation) FROM "{schema}".tether_marks'
                ).fetchone()
                moved = int(row[0] if row and row[0] is not None else 0) - before
                pids = [p.pid for p in procs if p.pid is not None]
                client = sum(cpu_of(pid) for pid in pids)
                kernel = sum(cpu_of(pid, system_only=True) for pid in pids)
                return time.perf_counter(), moved, client, server.sample(), kernel

            started = time.perf_counter()
            go.set()
            first: tuple[float, int, float, float, float] | None = None
            last = sample()
            while all(p.is_alive() for p in procs):
                now = sample()
                # Warm: every worker has had time to claim and take a few steps.
                if first is None and now[1] >= 3 * n:
                    first = now
                if all(p.is_alive() for p in procs):
                    last = now
                time.sleep(0.05)
        for proc in procs:
            proc.join()
        elapsed = time.perf_counter() - started
        duplicates = 0
        with open_store(url) as store:
            marks = store.runs()
            after = sum(m.generation for m in marks)
            completed = sum(m.phase == "completed" for m in marks)
            for mark in marks:
                committed = sum(e.status.value == "committed" for e in store.ledger(mark.run_id))
                with workspace(home, mark.run_id) as ws:
                    duplicates += ws.write_count() - committed
        if first is None or last[1] <= first[1]:
            raise SystemExit(f"N={n}: no steady window (raise --steps)")
        window = last[0] - first[0]
        steady = last[1] - first[1]
        return {
            "commits": after - before,
            "seconds": elapsed,
            "whole": (after - before) / elapsed,
            "rate": steady / window,
            "window": window,
            "client_us": (last[2] - first[2]) / steady * 1e6,
            "client_sys": (last[4] - first[4]) / max(1e-9, last[2] - first[2]),
            "server_us": (last[3] - first[3]) / steady * 1e6,
            "completed": completed,
            "runs": runs,
            "duplicates": duplicates,
            "size": size,
        }
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def measure_bare(dsn: str, n: int, size: int, seconds: float) -> dict[str, float]:
    import psycopg

    schema = f"tether_bare_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    url = schema_url(dsn, schema)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_bare (id INT PRIMARY KEY, v BIGINT, body BYTEA)")
            for row in range(n):
                conn.execute("INSERT INTO bench_bare VALUES (%s, 0, %s)", (row, b""))
        ctx = mp.get_context("spawn")
        go, out, done = ctx.Event(), ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(target=bare_main, args=(url, i, size, seconds, go, out, done))
            for i in range(n)
        ]
        for proc in procs:
            proc.start()
        time.sleep(0.5)
        probe = psycopg.connect(dsn, autocommit=True)
        server = ServerCPU(probe, schema)
        go.set()
        results = []
        while len(results) < n:
            with contextlib.suppress(queue.Empty):
                results.append(out.get(timeout=0.05))
            server.sample()
        probe.close()
        done.set()
        for proc in procs:
            proc.join()
        total = sum(count for count, _ in results)
        return {
            "rate": total / seconds,
            "client_us": sum(cpu for _, cpu in results) / total * 1e6,
            "server_us": server.total / total * 1e6,
        }
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--steps", type=int, default=60, help="agent steps per run")
    parser.add_argument("--runs-per-worker", type=int, default=2)
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure each N this many times (a row each); the verdict takes the median ratio",
    )
    args = parser.parse_args(argv)
    import psycopg

    with psycopg.connect(args.dsn) as conn:
        server = conn.execute("SHOW server_version").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
    print(
        f"tether bench/workers.py: {os.cpu_count()} cores, PostgreSQL {server[0] if server else '?'}"
        f" (synchronous_commit={sync[0] if sync else '?'}), Python {sys.version.split()[0]}"
    )
    print(
        "steady window: all N workers up, none finished; CPU per commit in µs "
        "(client = worker processes, server = their backends)"
    )
    print(
        f"{'N':>2} {'runs':>4} {'commits':>7} {'whole/s':>8} {'tether/s':>8} {'bare/s':>7} "
        f"{'ratio':>5} {'done':>5} {'dup':>3} {'t.client':>8} {'t.server':>8} "
        f"{'b.client':>8} {'b.server':>8} {'t.sys%':>6}"
    )
    verdict = ""
    for n in (int(x) for x in args.workers.split(",")):
        ratios: list[float] = []
        clients: list[float] = []  # µs of worker CPU per write step
        servers: list[float] = []  # server CPU per tether commit over per bare UPDATE
        duplicates = 0.0
        for _ in progress_rounds(range(args.repeat), f"{n} worker(s)", args.repeat):
            tether = measure_tether(args.dsn, n, args.runs_per_worker, args.steps)
            window = max(2.0, min(tether["window"], 8.0))
            bare = measure_bare(args.dsn, n, int(tether["size"]), window)
            ratio = tether["rate"] / bare["rate"]
            ratios.append(ratio)
            clients.append(tether["client_us"])
            servers.append(tether["server_us"] / max(1e-9, bare["server_us"]))
            duplicates += tether["duplicates"]
            print(
                f"{n:>2} {tether['runs']:>4.0f} {tether['commits']:>7.0f} {tether['whole']:>8.1f} "
                f"{tether['rate']:>8.1f} {bare['rate']:>7.1f} {ratio:>5.2f} "
                f"{tether['completed']:>2.0f}/{tether['runs']:<2.0f} {tether['duplicates']:>3.0f} "
                f"{tether['client_us']:>8.0f} {tether['server_us']:>8.0f} "
                f"{bare['client_us']:>8.0f} {bare['server_us']:>8.0f} "
                f"{100 * tether['client_sys']:>6.0f}"
            )
        if n == 8:
            client = statistics.median(clients)
            server = statistics.median(servers)
            verdict = "\n".join(
                [
                    f"at N=8, median of {len(ratios)}: tether/bare commits/s "
                    f"{statistics.median(ratios):.2f} (informational)",
                    f"client CPU per write step {client / 1000:.2f} ms (target ≤ 0.5 ms): "
                    f"{'PASS' if client <= 500 else 'FAIL'}",
                    f"server CPU per commit {server:.2f}x the bare UPDATE's (target ≤ 2x): "
                    f"{'PASS' if server <= 2 else 'FAIL'}",
                    f"duplicate effects: {duplicates:.0f} (must be 0): "
                    f"{'PASS' if duplicates == 0 else 'FAIL'}",
                ]
            )
    if verdict:
        print(verdict)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
