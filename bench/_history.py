"""History length: recovery, a write step, inspect and the run page at 10 and at 10,000 steps.

:func:`measure_store` seeds two runs in one store through the real runtime (a
``Runtime`` driving guarded ``file.write`` steps on a queryable, idempotent
``Sandbox``, each step a new effect under a new action id), one 10 steps long
and one 10,000, and then measures each figure on both side by side,
alternating short and long so the machine's noise lands on both:

- recovery: ``Runtime.recover(run_id)`` from a fresh runtime (median);
- a write step at the end of history, in a recovered session (median of the
  per-step times; the session looks up its action ids and effects by index);
- ``tether inspect RUN`` (its first page, text), in-process: time and bytes;
- the operator page's ``/runs/RUN``, in-process over HTTP: time and bytes.

Each figure comes with the ratio long/short; recovery and the step carry a
verdict against the issue's target (at most 1.2x). ``bench/scale.py`` calls
:func:`measure` (the same figures, one row each, for the stores it names); run alone, this prints a table for SQLite, and for
PostgreSQL too when ``TETHER_TEST_PG_DSN`` is set (in a schema of its own,
dropped afterwards):

    python bench/_history.py                  # 10 vs 10,000 steps
    python bench/_history.py --long 2000      # a quicker look
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from _progress import rounds

import tether
from tether import AgentContext, Decision, Keyring, Policy, Proposal, Runtime, TaskSpec
from tether.store import open_store
from tether.testing import Sandbox

#: The issue's target for recovery and for a step: at most this, long over short.
FLAT = 1.2


class Writer:
    """Writes ``notes.txt`` again at every step, built on the observed version: a new effect each time."""

    def decide(self, context: AgentContext, observation: Any) -> Decision:
        cursor = context.plan_cursor + 1
        proposal = Proposal(
            action_id=f"w{cursor}-{uuid.uuid4().hex[:8]}",
            kind="file.write",
            target="notes.txt",
            args={"content": f"version {cursor}\n"},
            based_on_version=observation.environment.version,
        )
        return Decision(AgentContext(plan_cursor=cursor), proposal=proposal)


def _runtime(store: Any, keyring: Keyring, sandbox: Sandbox, budget: int) -> Runtime:
    task = TaskSpec.from_json(
        {
            "task_id": "history",
            "task_version": "1",
            "allowed_kinds": ["file.write"],
            "allowed_paths": ["notes.txt"],
            "permissions": ["workspace.write"],
            "budgets": {"proposals": budget, "steps": budget, "wall_time_s": 86_400, "cost": 0},
            "initial_environment": {
                "namespace": "sandbox",
                "state_fingerprint": Sandbox({"notes.txt": "draft\n"})
                .environment()
                .state_fingerprint,
            },
            "verifier": {"argv": ["true"], "timeout_s": 5},
        }
    )
    policy = Policy.from_json(
        {
            "policy_id": "p",
            "policy_version": "1",
            "kinds": {
                "file.write": {
                    "risk": "low",
                    "permission": "workspace.write",
                    "needs_approval": False,
                }
            },
            "max_risk": "medium",
            "approval_ttl_s": 600,
        }
    )
    return Runtime(
        store=store, keyring=keyring, adapter=sandbox, task=task, policy=policy, agent=Writer()
    )


def _seed(store: Any, keyring: Keyring, run_id: str, steps: int, budget: int) -> Sandbox:
    sandbox = Sandbox({"notes.txt": "draft\n"}, instance_id=f"sbx-{run_id}")
    session = _runtime(store, keyring, sandbox, budget).start(run_id)
    for _ in rounds(range(steps), f"seeding {run_id}", steps):
        session.step()
    return sandbox


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _side_by_side(
    repeats: int, short: Callable[[], Any], long: Callable[[], Any]
) -> tuple[list[float], list[float], Any, Any]:
    """Times of ``short`` and ``long``, alternated (first round a warm-up, not counted)."""
    times: tuple[list[float], list[float]] = ([], [])
    last: list[Any] = [None, None]
    for round_ in range(repeats + 1):
        for index, fn in ((0, short), (1, long)) if round_ % 2 else ((1, long), (0, short)):
            elapsed, last[index] = _timed(fn)
            if round_:
                times[index].append(elapsed)
    return times[0], times[1], last[0], last[1]


def _inspect(url: str, keyring_file: Path, run_id: str) -> int:
    """``tether inspect RUN`` in-process; the bytes it prints."""
    from tether.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["inspect", run_id, "--store", url, "--keyring", str(keyring_file)])
    if code != 0:
        raise RuntimeError(f"tether inspect {run_id} exited {code}")
    return len(out.getvalue().encode())


@contextlib.contextmanager
def _page_client(url: str, keyring: Keyring) -> Iterator[Any]:
    from starlette.testclient import TestClient

    from tether.web import WebConfig, create_app

    token = "h" * 32
    app = create_app(WebConfig(store=url, token=token, keyring=keyring, hosts=("testserver",)))
    with TestClient(app) as client:
        client.get(f"/runs?token={token}")
        yield client


def _page(client: Any, run_id: str) -> int:
    answer = client.get(f"/runs/{run_id}")
    if answer.status_code != 200:
        raise RuntimeError(f"/runs/{run_id} answered {answer.status_code}")
    return len(answer.content)


def _pair(short: list[float], long: list[float], *, target: float | None = None) -> dict[str, Any]:
    """Medians in milliseconds and the ratio long/short; with a target, the verdict.

    The ratio is the median of the rounds' own ratios: each round times the
    short and the long run back to back, so a burst of load on this shared
    machine lands on both sides of one ratio instead of on one side only.
    """
    a, b = statistics.median(short) * 1000, statistics.median(long) * 1000
    ratio = statistics.median(y / x for x, y in zip(short, long, strict=True) if x > 0)
    figure: dict[str, Any] = {"short_ms": a, "long_ms": b, "ratio": ratio}
    if target is not None:
        figure["target"] = target
        figure["verdict"] = "pass" if ratio <= target else "FAIL"
    return figure


@contextlib.contextmanager
def _counting(store: Any) -> Iterator[list[int]]:
    """Count the statements ``store`` runs and the rows they return (a bench may look inside)."""
    counts = [0, 0]
    all_, one = store._all, store._one

    def counted_all(sql: str, params: Any = ()) -> Any:
        rows = all_(sql, params)
        counts[0] += 1
        counts[1] += len(rows)
        return rows

    def counted_one(sql: str, params: Any = ()) -> Any:
        row = one(sql, params)
        counts[0] += 1
        counts[1] += row is not None
        return row

    store._all, store._one = counted_all, counted_one
    try:
        yield counts
    finally:
        store._all, store._one = all_, one


def measure_store(
    store_url: str,
    *,
    short: int = 10,
    long: int = 10_000,
    repeats: int = 9,
    steps: int = 30,
    recoveries: int = 41,
) -> dict[str, Any]:
    """Seed a ``short`` and a ``long`` run in the store at ``store_url`` and measure both.

    Returns ``{"store", "short_steps", "long_steps", "seeded_s", "recovery",
    "step", "step_cpu", "inspect", "page"}``; each figure holds ``short_ms``,
    ``long_ms`` (medians) and ``ratio`` (the median of paired ratios), the
    inspect and page figures ``short_bytes`` and ``long_bytes`` too, recovery
    the ``(statements, rows)`` each recovery read (``short_reads``,
    ``long_reads``), and recovery and the step (wall and CPU time) a
    ``verdict`` against :data:`FLAT`. The store should be
    empty (two runs with random ids are added to it). Recovery is timed
    ``recoveries`` times per run (it is well under a millisecond), ``steps``
    write steps at the end of each history, inspect and the page ``repeats``
    times.
    """
    store = open_store(store_url)
    keyring = Keyring.generate("history-bench")
    budget = long + steps + recoveries + 100
    ids = (f"h{short}-{uuid.uuid4().hex[:8]}", f"h{long}-{uuid.uuid4().hex[:8]}")
    try:
        started = time.perf_counter()
        sandboxes = (
            _seed(store, keyring, ids[0], short, budget),
            _seed(store, keyring, ids[1], long, budget),
        )
        seeded_s = time.perf_counter() - started

        # Recovery: a fresh runtime each time, the recover() call timed alone.
        times: tuple[list[float], list[float]] = ([], [])
        sessions: list[Any] = [None, None]
        for round_ in range(recoveries + 1):
            for index in (0, 1) if round_ % 2 else (1, 0):
                rt = _runtime(store, keyring, sandboxes[index], budget)
                elapsed, sessions[index] = _timed(lambda rt=rt, i=index: rt.recover(ids[i]))
                if round_:
                    times[index].append(elapsed)
        recovery = _pair(*times, target=FLAT)
        # What a recovery reads, counted: the same whatever the history's length.
        reads = []
        for index in (0, 1):
            rt = _runtime(store, keyring, sandboxes[index], budget)
            with _counting(store) as counts:
                rt.recover(ids[index])
            reads.append(tuple(counts))
        recovery["short_reads"], recovery["long_reads"] = reads

        # A write step at the end of each history, in the sessions recovered last:
        # wall time (its durable commit, so the disk's fsync is much of it) and
        # this process's CPU time (what tether itself spends).
        walls: tuple[list[float], list[float]] = ([], [])
        cpus: tuple[list[float], list[float]] = ([], [])
        for round_ in range(steps):
            for index in (0, 1) if round_ % 2 else (1, 0):
                cpu = time.process_time()
                elapsed, outcome = _timed(sessions[index].step)
                cpus[index].append(time.process_time() - cpu)
                if outcome.kind.value != "executed":
                    raise RuntimeError(
                        f"a bench step did not write: {outcome.kind} {outcome.reason}"
                    )
                walls[index].append(elapsed)
        step = _pair(*walls, target=FLAT)
        step_cpu = _pair(*cpus, target=FLAT)

        with tempfile.TemporaryDirectory() as tmp:
            keyring_file = Path(tmp) / "keyring.json"
            keyring.write_file(keyring_file)
            a, b, bytes_a, bytes_b = _side_by_side(
                repeats,
                lambda: _inspect(store_url, keyring_file, ids[0]),
                lambda: _inspect(store_url, keyring_file, ids[1]),
            )
            inspect = {**_pair(a, b), "short_bytes": bytes_a, "long_bytes": bytes_b}
        with _page_client(store_url, keyring) as client:
            a, b, bytes_a, bytes_b = _side_by_side(
                repeats, lambda: _page(client, ids[0]), lambda: _page(client, ids[1])
            )
            page = {**_pair(a, b), "short_bytes": bytes_a, "long_bytes": bytes_b}
    finally:
        store.close()
    return {
        "store": store_url.split("://", 1)[0],
        "short_steps": short,
        "long_steps": long,
        "seeded_s": seeded_s,
        "recovery": recovery,
        "step": step,
        "step_cpu": step_cpu,
        "inspect": inspect,
        "page": page,
    }


#: The figures :func:`measure` hands ``bench/scale.py``: key, what, target (0: shown only).
_ROWS = (
    ("recovery", "history: recovery", FLAT),
    ("step", "history: write step at the end", FLAT),
    ("step_cpu", "history: its CPU time", FLAT),
    ("inspect", "history: inspect, first page", 0.0),
    ("page", "history: run page", 0.0),
)


def measure(places: Mapping[str, str], **sizes: int) -> list[dict[str, Any]]:
    """:func:`measure_store` on each store ``places`` names, as ``bench/scale.py``'s figures.

    ``places``: ``"sqlite"`` -> a directory to make the database in,
    ``"postgres"`` -> a DSN (the run gets a schema of its own, dropped
    after). Each figure is a dict with the fields of ``scale.Figure``;
    ``sizes`` go to :func:`measure_store` (``short``, ``long``, ...).
    """
    results = []
    if "sqlite" in places:
        path = Path(places["sqlite"]) / f"history-{uuid.uuid4().hex[:8]}.sqlite"
        try:
            results.append(("sqlite", measure_store(f"sqlite:///{path}", **sizes)))
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
    if "postgres" in places:
        with _pg_schema(places["postgres"]) as url:
            results.append(("postgres", measure_store(url, **sizes)))
    figures = []
    for store, result in results:
        labels = {
            "small_label": f"{result['short_steps']:,} steps",
            "large_label": f"{result['long_steps']:,} steps",
        }
        for key, what, target in _ROWS:
            f = result[key]
            common = {"store": store, "target": target, **labels}
            figures.append(
                {
                    "what": what,
                    "small": f["short_ms"],
                    "large": f["long_ms"],
                    "paired": f["ratio"],
                    **common,
                }
            )
            if "short_bytes" in f:
                figures.append(
                    {
                        "what": f"{what} (bytes)",
                        "small": float(f["short_bytes"]),
                        "large": float(f["long_bytes"]),
                        "unit": "bytes",
                        **common,
                    }
                )
    return figures


def table(figures: dict[str, Any]) -> str:
    """One store's figures as a text table."""
    s, n = figures["short_steps"], figures["long_steps"]
    lines = [
        f"{figures['store']}: a run of {s:,} steps against one of {n:,} "
        f"(seeded in {figures['seeded_s']:.0f} s)",
        f"  {'':<28} {f'{s:,} steps':>14} {f'{n:,} steps':>14} {'ratio':>7}  verdict",
    ]
    for key, what in (
        ("recovery", "recovery (ms)"),
        ("step", "write step at the end (ms)"),
        ("step_cpu", "  its CPU time (ms)"),
        ("inspect", "inspect, first page (ms)"),
        ("page", "run page (ms)"),
    ):
        f = figures[key]
        verdict = f"{f['verdict']} (<= {f['target']}x)" if "verdict" in f else ""
        if key == "recovery":
            (qs, rs), (ql, rl) = f["short_reads"], f["long_reads"]
            verdict += f"; reads {qs} statements/{rs} rows vs {ql}/{rl}"
        lines.append(
            f"  {what:<28} {f['short_ms']:>14.2f} {f['long_ms']:>14.2f} "
            f"{f['ratio']:>6.2f}x  {verdict}"
        )
        if "short_bytes" in f:
            lines.append(
                f"  {'  bytes':<28} {f['short_bytes']:>14,} {f['long_bytes']:>14,} "
                f"{f['long_bytes'] / max(f['short_bytes'], 1):>6.2f}x"
            )
    return "\n".join(lines)


@contextlib.contextmanager
def _pg_schema(dsn: str) -> Iterator[str]:
    """A store URL in a fresh schema of ``dsn``'s database, dropped afterwards."""
    import psycopg

    schema = f"tether_bench_history_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        joiner = "&" if "?" in dsn else "?"
        yield f"{dsn}{joiner}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=10)
    parser.add_argument("--long", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--recoveries", type=int, default=41)
    parser.add_argument("--steps", type=int, default=30, help="write steps timed at the end")
    parser.add_argument("--pg", default=os.environ.get("TETHER_TEST_PG_DSN", ""))
    args = parser.parse_args(argv)
    print(f"tether from {Path(tether.__file__).parent.parent}")
    sizes = {
        "short": args.short,
        "long": args.long,
        "repeats": args.repeats,
        "steps": args.steps,
        "recoveries": args.recoveries,
    }
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        results.append(measure_store(f"sqlite:///{Path(tmp) / 'history.sqlite'}", **sizes))
        print(table(results[-1]), flush=True)
    if args.pg:
        with _pg_schema(args.pg) as url:
            results.append(measure_store(url, **sizes))
            print(table(results[-1]), flush=True)
    failed = [
        f"{r['store']} {key}"
        for r in results
        for key in ("recovery", "step", "step_cpu")
        if r[key]["verdict"] != "pass"
    ]
    print("verdict: " + ("every target met" if not failed else "missed: " + ", ".join(failed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
