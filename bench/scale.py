"""Scale benchmark: what a person or a worker waits for, at 1,000 runs and at 100,000.

Side by side in ONE run, on SQLite and on PostgreSQL, each store holding a
small and a large deployment:

- ``tether runs --json``: the first page, as the command prints it (store
  opened and closed, in process);
- ``tether runs --needs-me --json --limit 25``: the first page of runs
  waiting for a person (full at both sizes);
- the page's runs list (``GET /runs`` of ``tether serve``'s app, in process):
  time and bytes of the first page, and of its 3-second refresh when nothing
  changed (``If-None-Match``: a 304);
- one worker's claim (``claim_expired`` as ``tether worker`` calls it, then a
  release), with work waiting and idle (nothing due), after ``ANALYZE``;
- ``--parts parked``: the same claim (of any run, of no suspect, of suspects
  alone) and ``suspect_waiting``, at the small size with no run parked at the
  mark and with ``--parked`` (40,000) of them: runs a worker's ``max_attempts``
  (5) stopped claiming, half deferred that often, half suspects whose worker
  died each time. They stay unfinished for a person to resume, so nothing a
  worker waits for may grow with them: the verdict is the ratio, at most 2x.

Each figure is the median over rounds that alternate the two sizes (and
swap which goes first), and the verdict is the large/small ratio against
the target: at most 2x. The plans are printed too: the claim must use
``tether_marks_due``, a page the primary key or ``tether_marks_attention``.

**How the runs are made.** The real runtime and the real ``Worker`` drive
one template run of each kind into a fresh store (a completed run; a write
waiting for an approval, parked by the worker; a run whose step raised,
backed off by the worker; a run a worker holds; a free run). Each template's
rows, its mark (with the listing the commit recorded) and the checkpoint it
names, are then copied under new run ids in SQL, so a deployment of 100,000
runs is seeded in seconds and its rows are exactly what the runtime wrote.
The copies' envelopes still name their template's run id (nothing here
verifies them), and their trace and ledger rows are not copied (neither
the list nor a claim reads them). The mix per 100 runs: 93 completed, 2
waiting for an approval, 1 failing, 2 held by a worker, 2 free.

**History figures.** :func:`history_figures` prints what
``bench/_history.py`` measures when that module exists (its ``measure(places)``
returns figures of one run at 10 and at 10,000 steps, as :class:`Figure` or
dicts with the same fields); the run says it was not measured otherwise.

Run: ``.venv/bin/python bench/scale.py [--sizes 1000,100000] [--stores sqlite,postgres]
[--rounds 9] [--parts pages,claims,parked] [--parked 40000] [--dir PATH] [--save FILE]``; PostgreSQL needs ``TETHER_TEST_PG_DSN``
(each size gets a schema of its own, dropped afterwards).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _progress import rounds as progress_rounds

from tether.cli import main as tether_main
from tether.core import Observation, Policy, Proposal, TaskSpec
from tether.crypto import Keyring
from tether.runtime import AgentContext, Decision, Runtime, Worker
from tether.store import PostgresStore, SQLBase, SQLiteStore
from tether.testing import Sandbox
from tether.testing.store_conformance import make_commit

TARGET = 2.0
#: The --needs-me page measured: 3 in 100 runs need a person, so at 1,000 runs a
#: page of 25 is full at both sizes (a fuller page costs more, whatever the size).
NEEDS_PAGE = 25
WORKER_PHASES = ("running", "pending", "needs_review")
#: Per 100 run ids: which template each copies (the rest are completed runs).
MIX = {"approval": range(0, 2), "failing": range(2, 3), "held": range(3, 5), "free": range(5, 7)}
KINDS = ("done", "approval", "failing", "held", "free")
#: What a run may measure (``--parts``): the lists people read, a worker's claim,
#: and that claim beside many runs parked at the mark.
PARTS = ("pages", "claims", "parked")
#: Runs parked at the mark seeded beside the small deployment (``--parked``).
PARKED = 40_000
#: The worker's ceiling (``Worker``'s default ``max_attempts``) the parked runs reached.
CEILING = 5


# -- the templates, driven by the real runtime ----------------------------------------


class TemplateAgent:
    """Writes notes.txt once, then finishes; a run named ``failing-*`` raises instead."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        if self.run_id.startswith("failing"):
            raise RuntimeError("the agent's model endpoint is down")
        cursor = context.plan_cursor
        if cursor == 0:
            proposal = Proposal(
                action_id="write-1",
                kind="file.write",
                target="notes.txt",
                args={"content": "written by a template run\n"},
                based_on_version=observation.environment.version,
            )
            return Decision(AgentContext(context.messages, context.memory, 1), proposal)
        return Decision(AgentContext(context.messages, context.memory, cursor + 1), finished=True)


def _policy(approval: bool) -> Policy:
    return Policy.from_json(
        {
            "policy_id": "scale",
            "policy_version": "1",
            "kinds": {
                "file.write": {
                    "risk": "low",
                    "permission": "workspace.write",
                    "needs_approval": approval,
                }
            },
            "max_risk": "medium",
            "approval_ttl_s": 900,
        }
    )


def _task(sandbox: Sandbox) -> TaskSpec:
    return TaskSpec.from_json(
        {
            "task_id": "scale",
            "task_version": "1",
            "allowed_kinds": ["file.write"],
            "allowed_paths": ["notes.txt"],
            "permissions": ["workspace.write"],
            "budgets": {"proposals": 100, "steps": 100, "wall_time_s": 10**6, "cost": 0},
            "initial_environment": {
                "namespace": sandbox.namespace,
                "state_fingerprint": sandbox.environment().state_fingerprint,
            },
            "verifier": {"argv": ["true"], "timeout_s": 60},
        }
    )


def make_templates(store: SQLBase) -> dict[str, str]:
    """One run of each kind, by the real Runtime and Worker; kind -> its run id."""
    keyring = Keyring.generate("scale")
    sandboxes: dict[str, Sandbox] = {}

    def runtime(store: Any, run_id: str, worker: str = "seed") -> Runtime:
        sandbox = sandboxes.setdefault(run_id, Sandbox({"notes.txt": "a template\n"}))
        return Runtime(
            store=store,
            keyring=keyring,
            adapter=sandbox,
            task=_task(sandbox),
            policy=_policy(run_id.startswith("approval")),
            agent=TemplateAgent(run_id),
        )

    ids = {kind: f"{kind}-template" for kind in KINDS}
    for kind in ("done", "approval", "failing"):
        runtime(store, ids[kind]).start(ids[kind])
    # The worker a deployment runs: it completes one, parks one for a person,
    # backs the failing one off (an hour, so it stays "failing" while measured).
    # Its log would say so (the failure is the point): quiet here.
    quiet = logging.getLogger("tether")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        Worker(store, runtime, "seed-worker", backoff_s=3600, max_backoff_s=3600).serve(
            idle_exit=True
        )
    finally:
        quiet.setLevel(level)
    runtime(store, ids["held"]).start(ids["held"])
    (held,) = store.claim_expired(
        "busy-worker", 3600.0, limit=1, phases=WORKER_PHASES, max_attempts=CEILING
    )
    if held.run_id != ids["held"]:
        raise RuntimeError(f"the claim took {held.run_id}, not the held template")
    runtime(store, ids["free"]).start(ids["free"])
    marks = {m.run_id: m for m in store.runs()}
    expected = {"done": "completed", "approval": "pending", "failing": "running"}
    for kind, phase in expected.items():
        if marks[ids[kind]].phase != phase:
            raise RuntimeError(f"template {kind} is {marks[ids[kind]].phase}, not {phase}")
    if marks[ids["approval"]].waiting_after is None or marks[ids["failing"]].last_error is None:
        raise RuntimeError("the worker did not park or back off the templates")
    return ids


def make_parked_templates(store: SQLBase) -> dict[str, str]:
    """Two runs parked at the mark by the store's own statements, as workers leave them.

    One whose step failed :data:`CEILING` times (each claim deferred it,
    counted), and one whose worker died holding it each time (its lease ran
    out unreleased: a suspect). No claim of a worker with that ceiling takes
    either. Made in a store holding nothing else, so each claim takes its own.
    """
    ids = {"deferred": "parked-deferred-template", "died": "parked-died-template"}
    store.commit(make_commit(ids["deferred"], 1), 0)
    for _ in range(CEILING):
        (lease,) = store.claim_expired("seed", 60.0, 1, WORKER_PHASES, CEILING)
        store.defer(lease.run_id, "seed", lease.lease_version, 0.0, "RuntimeError: it failed")
    store.commit(make_commit(ids["died"], 1), 0)
    for _ in range(CEILING):
        (lease,) = store.claim_expired("seed", 0.001, 1, WORKER_PHASES, CEILING)
        time.sleep(0.005)  # the worker dies: its lease runs out held
    if store.claim_expired("seed", 60.0, 5, WORKER_PHASES, CEILING):
        raise RuntimeError("a parked template is still claimable")
    return ids


def clone_parked(store: SQLBase, templates: Mapping[str, str], count: int, dialect: str) -> None:
    """``count`` copies of the parked templates (half each), marks and checkpoints, in SQL."""
    pad = "substr('0000000' || n.i, -7)" if dialect == "sqlite" else "lpad(n.i::text, 7, '0')"
    odd = "n.i % 2" if dialect == "sqlite" else "mod(n.i, 2)"
    numbers = "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "

    def body(sql: Any) -> None:
        for half, template in enumerate((templates["deferred"], templates["died"])):
            for table in ("tether_marks", "tether_checkpoints"):
                columns = _columns(store, table)
                chosen = ", ".join(
                    f"'parked-' || {pad}" if c == "run_id" else f"t.{c}" for c in columns
                )
                sql.run(
                    f"{numbers}INSERT INTO {table} ({', '.join(columns)}) "
                    f"SELECT {chosen} FROM n, {table} t WHERE t.run_id = ? AND {odd} = {half}",
                    (count, template),
                )

    store.transaction(body)


def clone(store: SQLBase, templates: Mapping[str, str], count: int, dialect: str) -> None:
    """``count`` runs copied from the templates in SQL: marks, the checkpoint each names, inbox."""
    pad = "substr('0000000' || n.i, -7)" if dialect == "sqlite" else "lpad(n.i::text, 7, '0')"
    bucket = "n.i % 100" if dialect == "sqlite" else "mod(n.i, 100)"
    numbers = "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
    tables = {
        "tether_marks": _columns(store, "tether_marks"),
        "tether_checkpoints": _columns(store, "tether_checkpoints"),
        "tether_inbox": _columns(store, "tether_inbox"),
    }

    def body(sql: Any) -> None:
        for kind, template in templates.items():
            if kind == "done":
                taken = " OR ".join(
                    f"({bucket}) BETWEEN {r.start} AND {r.stop - 1}" for r in MIX.values()
                )
                which = f"NOT ({taken})"
            else:
                span = MIX[kind]
                which = f"({bucket}) BETWEEN {span.start} AND {span.stop - 1}"
            for table, columns in tables.items():
                chosen = ", ".join(
                    f"'run-' || {pad}" if c == "run_id" else f"t.{c}" for c in columns
                )
                join = ""
                if table == "tether_checkpoints":
                    join = (
                        " JOIN tether_marks m ON m.run_id = t.run_id "
                        "AND m.checkpoint_digest = t.checkpoint_digest"
                    )
                sql.run(
                    f"{numbers}INSERT INTO {table} ({', '.join(columns)}) "
                    f"SELECT {chosen} FROM n, {table} t{join} WHERE t.run_id = ? AND {which}",
                    (count, template),
                )

    store.transaction(body)


def _columns(store: SQLBase, table: str) -> list[str]:
    """The table's columns, as the database lists them (the bench reads a cursor description)."""

    def names(_: Any) -> list[str]:
        cursor = store._local.conn.execute(f"SELECT * FROM {table} WHERE 1 = 0")
        return [d[0] for d in cursor.description]

    return store.read(names)


# -- the stores ------------------------------------------------------------------------


@dataclass
class Deployment:
    """One seeded store: where it is (a URL the CLI takes), how to open it, its size."""

    store: str
    runs: int
    url: str
    open: Callable[[], SQLBase]
    analyze: Callable[[], None]
    drop: Callable[[], None]


def sqlite_deployment(directory: Path, runs: int, parked: int = 0) -> Deployment:
    path = directory / f"scale-{runs}-{parked}.sqlite"
    store = SQLiteStore(path, synchronous="OFF")
    try:
        stuck = make_parked_templates(store) if parked else {}
        clone(store, make_templates(store), runs, "sqlite")
        if parked:
            clone_parked(store, stuck, parked, "sqlite")
        store._conn.execute("DELETE FROM tether_marks WHERE run_id LIKE ?", ("%-template",))
        store._conn.execute("ANALYZE")
    finally:
        store.close()

    def analyze() -> None:
        with SQLiteStore(path) as s:
            s._conn.execute("ANALYZE")

    return Deployment(
        "sqlite", runs, f"sqlite:///{path}", lambda: SQLiteStore(path), analyze, lambda: None
    )


def postgres_deployment(dsn: str, runs: int, parked: int = 0) -> Deployment:
    import psycopg
    from psycopg.conninfo import make_conninfo

    schema = f"tether_scale_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    conninfo = make_conninfo(dsn, options=f"-csearch_path={schema}")
    joiner = "&" if "?" in dsn else "?"
    url = f"{dsn}{joiner}options=-csearch_path%3D{schema}"
    with PostgresStore(conninfo) as store:
        stuck = make_parked_templates(store) if parked else {}
        clone(store, make_templates(store), runs, "postgres")
        if parked:
            clone_parked(store, stuck, parked, "postgres")
        store.transaction(
            lambda sql: sql.run("DELETE FROM tether_marks WHERE run_id LIKE ?", ("%-template",))
        )

    def analyze() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("ANALYZE")

    def drop() -> None:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    analyze()
    return Deployment(
        "postgres", runs, url, lambda: PostgresStore(conninfo, max_connections=2), analyze, drop
    )


# -- what is measured ------------------------------------------------------------------


def cli_page(deployment: Deployment, *flags: str) -> tuple[float, int]:
    """``tether runs --json [flags]`` in process: seconds, and runs on the page."""
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = tether_main(["runs", "--store", deployment.url, "--json", *flags])
    elapsed = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"tether runs exited {code}")
    return elapsed, len(json.loads(out.getvalue())["runs"])


class PageClient:
    """The page's app in process over one deployment, logged in."""

    def __init__(self, deployment: Deployment) -> None:
        from starlette.testclient import TestClient

        from tether.web import WebConfig, create_app

        token = "s" * 32
        self.client = TestClient(
            create_app(WebConfig(store=deployment.url, token=token, hosts=("testserver",)))
        )
        self.client.get(f"/runs?token={token}")
        self.etag = ""

    def first_page(self) -> tuple[float, int]:
        started = time.perf_counter()
        answer = self.client.get("/runs")
        elapsed = time.perf_counter() - started
        if answer.status_code != 200:
            raise RuntimeError(f"GET /runs answered {answer.status_code}")
        self.etag = answer.headers["etag"]
        return elapsed, len(answer.content)

    def refresh(self) -> tuple[float, int]:
        started = time.perf_counter()
        answer = self.client.get("/runs", headers={"If-None-Match": self.etag})
        elapsed = time.perf_counter() - started
        if answer.status_code != 304:
            raise RuntimeError(f"an unchanged refresh answered {answer.status_code}")
        return elapsed, len(answer.content)


def claims(store: SQLBase, count: int) -> float:
    """Median seconds of one claim (work waiting), each released again untimed."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        got = store.claim_expired("bench", 30.0, limit=1, phases=WORKER_PHASES, max_attempts=5)
        times.append(time.perf_counter() - started)
        if len(got) != 1:
            raise RuntimeError("no run was claimable")
        store.release_lease(got[0].run_id, "bench", got[0].lease_version)
    return statistics.median(times)


@contextlib.contextmanager
def idle(store: SQLBase) -> Iterator[None]:
    """Every free run claimed by another worker meanwhile: a claim finds nothing due."""
    taken = []
    while batch := store.claim_expired("hog", 600.0, limit=500, phases=WORKER_PHASES):
        taken += batch
    try:
        yield
    finally:
        for lease in taken:
            store.release_lease(lease.run_id, "hog", lease.lease_version)


def picks(store: SQLBase, count: int, suspects: bool | None = None) -> float:
    """Median seconds of the claim's pick alone: its SELECT, read-only (no commit, no fsync)."""
    # As the claim spells it, bar the lock of the rows picked (a read takes none).
    sql = store._claim_pick(sorted(WORKER_PHASES), 1, CEILING, suspects, "?", lock=False)
    times = []
    for _ in range(count):
        now = int(time.time() * 1_000_000)
        started = time.perf_counter()
        store.read(lambda stmts, now=now: stmts.all(sql, (now, now)))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def idle_claims(store: SQLBase, count: int) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        got = store.claim_expired("bench", 30.0, limit=1, phases=WORKER_PHASES, max_attempts=5)
        times.append(time.perf_counter() - started)
        if got:
            raise RuntimeError("an idle claim found work")
    return statistics.median(times)


def plans(deployment: Deployment) -> dict[str, str]:
    """Which index the claim and each kind of page use (EXPLAIN with statistics)."""
    from tether.store._listing import NEEDS_PERSON
    from tether.store._schema import ATTENTION

    bound = "?" if deployment.store == "sqlite" else "%s"
    now = int(time.time() * 1e6)
    store = deployment.open()
    queries = {
        "claim": (
            store._claim_pick(sorted(WORKER_PHASES), 1, CEILING, None, bound, lock=False),
            (now, now),
        ),
        "page": ("SELECT run_id FROM tether_marks ORDER BY run_id LIMIT 50", ()),
        "needs-me page": (
            f"SELECT run_id FROM tether_marks WHERE {ATTENTION} AND "
            f"{NEEDS_PERSON.replace('?', bound)} ORDER BY run_id LIMIT 50",
            ("2026-01-01T00:00:00.000000Z", int(time.time() * 1e6)),
        ),
    }
    found = {}
    try:
        for name, (sql, params) in queries.items():

            def explain(stmts: Any, sql: str = sql, params: Any = params) -> list[Any]:
                conn = store._local.conn
                prefix = "EXPLAIN QUERY PLAN " if deployment.store == "sqlite" else "EXPLAIN "
                return [tuple(r) for r in conn.execute(prefix + sql, params).fetchall()]

            rows = store.read(explain)
            text = " | ".join(str(r[-1] if deployment.store == "sqlite" else r[0]) for r in rows)
            found[name] = text
    finally:
        store.close()
    return found


# -- the run ---------------------------------------------------------------------------


@dataclass
class Figure:
    """One figure at the small and the large size (what :func:`history_figures` also takes)."""

    what: str
    store: str
    small: float
    large: float
    unit: str = "ms"
    target: float = TARGET
    small_label: str = "1k runs"
    large_label: str = "100k runs"
    #: The median of the rounds' own large/small ratios, when measured in pairs.
    paired: float | None = None

    @property
    def ratio(self) -> float:
        if self.paired is not None:
            return self.paired
        return self.large / self.small if self.small > 0 else float("inf")

    @property
    def verdict(self) -> str:
        if self.target <= 0:
            return "(info)"
        return "ok" if self.ratio <= self.target else "OVER TARGET"


def measure(
    small: Deployment, large: Deployment, rounds: int, parts: frozenset[str] = frozenset(PARTS)
) -> list[Figure]:
    """Every figure of ``parts`` at both sizes, rounds alternating the sizes.

    Each figure is the median of its rounds at each size; its ratio is the
    median of the rounds' own ratios (a round measures both sizes back to
    back, so a burst of load on this shared machine lands on both).
    """
    values: dict[str, dict[int, list[float]]] = {}

    def note(name: str, size: int, value: float) -> None:
        values.setdefault(name, {}).setdefault(size, []).append(value)

    pages = {d.runs: PageClient(d) for d in (small, large)} if "pages" in parts else {}
    stores = {d.runs: d.open() for d in (small, large)}
    try:
        for r in progress_rounds(range(rounds + 1), f"{small.store}: rounds", rounds + 1):
            if r == 0:
                # A first round warms caches and connections; it is not counted.
                for d in (small, large):
                    if "pages" in parts:
                        cli_page(d)
                        cli_page(d, "--needs-me")
                        pages[d.runs].first_page()
                        pages[d.runs].refresh()
                    if "claims" in parts:
                        claims(stores[d.runs], 5)
                        picks(stores[d.runs], 20)
                continue
            order = (small, large) if r % 2 == 0 else (large, small)
            for d in order:
                if "pages" in parts:
                    measure_pages(d, pages[d.runs], note)
                if "claims" in parts:
                    measure_claims(stores[d.runs], d.runs, note)
    finally:
        for store in stores.values():
            store.close()
    figures = []
    for name, by_size in values.items():
        unit = "bytes" if name.endswith("bytes") else "ms"
        pairs = zip(by_size[small.runs], by_size[large.runs], strict=True)
        figures.append(
            Figure(
                name,
                small.store,
                statistics.median(by_size[small.runs]),
                statistics.median(by_size[large.runs]),
                unit,
                small_label=f"{small.runs:,} runs",
                large_label=f"{large.runs:,} runs",
                paired=statistics.median(b / a for a, b in pairs if a > 0),
            )
        )
    return figures


def measure_pages(d: Deployment, page: PageClient, note: Callable[[str, int, float], None]) -> None:
    """One round of the list figures at one size: the CLI's pages and the page's."""
    seconds, _ = cli_page(d)
    note("tether runs --json (first page)", d.runs, seconds * 1000)
    seconds, _ = cli_page(d, "--needs-me", "--limit", str(NEEDS_PAGE))
    note(f"tether runs --needs-me --json (page of {NEEDS_PAGE})", d.runs, seconds * 1000)
    seconds, size = page.first_page()
    note("page: runs list, first page", d.runs, seconds * 1000)
    note("page: runs list, bytes", d.runs, size)
    seconds, _ = page.refresh()
    note("page: refresh, nothing changed (304)", d.runs, seconds * 1000)


def measure_claims(store: SQLBase, runs: int, note: Callable[[str, int, float], None]) -> None:
    """One round of a worker's figures at one size: a claim with work waiting, its pick, idle."""
    note("claim, work waiting (a write: its commit)", runs, claims(store, 60) * 1000)
    note("claim's pick alone (its SELECT)", runs, picks(store, 100) * 1000)
    with idle(store):
        note("claim, idle (nothing due)", runs, idle_claims(store, 100) * 1000)


def suspect_claims(store: SQLBase, count: int) -> float:
    """Median seconds of a claim of suspects alone that finds none due (a busy worker's ask)."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        got = store.claim_expired(
            "bench", 30.0, limit=1, phases=WORKER_PHASES, max_attempts=CEILING, suspects=True
        )
        times.append(time.perf_counter() - started)
        if got:
            raise RuntimeError(f"a claim of suspects took {got[0].run_id}: none is due")
    return statistics.median(times)


def waiting_reads(store: SQLBase, count: int) -> float:
    """Median seconds of ``suspect_waiting`` (none is due: the parked suspects are not)."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        found = store.suspect_waiting(WORKER_PHASES, CEILING)
        times.append(time.perf_counter() - started)
        if found:
            raise RuntimeError("suspect_waiting found a suspect due: none is")
    return statistics.median(times)


def sorting_claims(store: SQLBase, count: int) -> float:
    """Median seconds of a claim of no suspect (work waiting), each released again untimed."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        got = store.claim_expired(
            "bench", 30.0, limit=1, phases=WORKER_PHASES, max_attempts=CEILING, suspects=False
        )
        times.append(time.perf_counter() - started)
        if len(got) != 1:
            raise RuntimeError("no run was claimable")
        store.release_lease(got[0].run_id, "bench", got[0].lease_version)
    return statistics.median(times)


def claim_plans(deployment: Deployment) -> dict[str, str]:
    """EXPLAIN of the claims as the store sends them (each recorded from a real claim, released)."""
    found = {}
    store = deployment.open()
    try:
        for suspects in (None, False, True):
            seen: list[tuple[str, tuple[Any, ...]]] = []
            real = store._all

            def recording(
                sql: str, params: Any = (), seen: list[Any] = seen, real: Any = real
            ) -> Any:
                seen.append((sql, tuple(params)))
                return real(sql, params)

            store._all = recording  # type: ignore[method-assign]
            try:
                got = store.claim_expired(
                    "plan", 30.0, 1, WORKER_PHASES, CEILING, suspects=suspects
                )
            finally:
                del store._all
            for lease in got:
                store.release_lease(lease.run_id, "plan", lease.lease_version)
            sql, params = next(x for x in seen if x[0].startswith("UPDATE tether_marks"))
            sqlite = deployment.store == "sqlite"

            def explain(_: Any, sql: str = sql, params: Any = params, sqlite: bool = sqlite) -> Any:
                prefix = "EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN "
                text = sql if sqlite else sql.replace("?", "%s")
                return store._local.conn.execute(prefix + text, params).fetchall()

            lines = [str(r[-1] if sqlite else r[0]).strip() for r in store.read(explain)]
            # PostgreSQL's nodes only (its filters repeat the whole statement).
            found[f"claim (suspects={suspects})"] = " | ".join(
                line.split("  (cost=")[0]
                for line in lines
                if sqlite or "Cond" in line or "(cost=" in line
            )
    finally:
        store.close()
    return found


def measure_parked(clear: Deployment, parked: Deployment, count: int, rounds: int) -> list[Figure]:
    """A worker's claims beside no parked run and beside ``count``, rounds alternating the two."""
    values: dict[str, dict[str, list[float]]] = {}
    stores = {"clear": clear.open(), "parked": parked.open()}
    measures: dict[str, Callable[[SQLBase], float]] = {
        "claim, work waiting, any run (suspects=None)": lambda s: claims(s, 30),
        "claim, work waiting, no suspect (suspects=False)": lambda s: sorting_claims(s, 30),
        "claim of suspects, none due (suspects=True)": lambda s: suspect_claims(s, 30),
        "suspect_waiting, none due": lambda s: waiting_reads(s, 60),
        # The part the parked runs could slow, without the commit's fsync around it.
        "claim's pick alone (its SELECT), suspects=None": lambda s: picks(s, 60),
        "claim's pick alone (its SELECT), suspects=False": lambda s: picks(s, 60, False),
        "claim's pick alone (its SELECT), suspects=True": lambda s: picks(s, 60, True),
    }
    try:
        for r in progress_rounds(range(rounds + 1), f"{clear.store}: parked rounds", rounds + 1):
            order = ("clear", "parked") if r % 2 == 0 else ("parked", "clear")
            for which in order:
                for name, measure_one in measures.items():
                    seconds = measure_one(stores[which])
                    if r > 0:  # the first round warms caches and connections
                        values.setdefault(name, {}).setdefault(which, []).append(seconds * 1000)
    finally:
        for store in stores.values():
            store.close()
    return [
        Figure(
            name,
            clear.store,
            statistics.median(by["clear"]),
            statistics.median(by["parked"]),
            small_label=f"{clear.runs:,} runs, none parked",
            large_label=f"{count:,} parked beside",
            paired=statistics.median(
                b / a for a, b in zip(by["clear"], by["parked"], strict=True) if a > 0
            ),
        )
        for name, by in values.items()
    ]


def history_figures(places: Mapping[str, str]) -> list[Figure]:
    """Figures of one run's history (10 vs 10,000 steps) from bench/_history.py, if it exists.

    The section another bench fills in: ``_history.measure(places)`` returns
    figures with the fields of :class:`Figure` (objects or dicts; e.g.
    ``small_label="10 steps"``, ``large_label="10,000 steps"``, ``target=1.2``),
    printed in the same table and saved with the rest. ``places`` names
    where each store asked for (``--stores``) may make databases of its own:
    ``"sqlite"`` -> a directory, ``"postgres"`` -> the server's DSN (make a
    schema there and drop it after).
    """
    try:
        import _history  # type: ignore[import-not-found]
    except ImportError:
        return []
    found = []
    for item in _history.measure(places):
        found.append(item if isinstance(item, Figure) else Figure(**dict(item)))
    return found


def show(figures: list[Figure]) -> None:
    by_store: dict[str, list[Figure]] = {}
    for figure in figures:
        by_store.setdefault(figure.store, []).append(figure)
    for store, rows in by_store.items():
        print(f"\n{store}")
        width = max(len(f.what) for f in rows)
        print(f"  {'':<{width}}  {'small':>12}  {'large':>12}  {'ratio':>7}  verdict (target)")
        for f in rows:

            def fmt(v: float, unit: str = f.unit) -> str:
                return f"{v:,.0f} B" if unit == "bytes" else f"{v:,.2f} {unit}"

            target = "info" if f.target <= 0 else f"<= {f.target:g}x"
            print(
                f"  {f.what:<{width}}  {fmt(f.small):>12}  {fmt(f.large):>12}  "
                f"{f.ratio:>6.2f}x  {f.verdict} ({target}; {f.small_label} vs {f.large_label})"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,100000", help="small,large run counts")
    parser.add_argument("--stores", default="sqlite,postgres", help="which stores to measure")
    parser.add_argument("--rounds", type=int, default=9, help="rounds alternating the sizes")
    parser.add_argument(
        "--parked", type=int, default=PARKED, help="runs parked at the mark (--parts parked)"
    )
    parser.add_argument("--dir", type=Path, help="where the SQLite files go (default: a temp dir)")
    parser.add_argument("--save", type=Path, help="write the raw figures as JSON here")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="what to measure: pages (the lists), claims (a worker's claim), parked (that "
        "claim beside runs parked at the mark); any of them, comma-separated",
    )
    args = parser.parse_args()
    small_n, large_n = (int(x) for x in args.sizes.split(","))
    wanted = args.stores.split(",")
    parts = frozenset(args.parts.split(","))
    if not parts or not parts <= set(PARTS):
        parser.error(f"--parts takes a comma-separated subset of {', '.join(PARTS)}")
    directory = args.dir or Path(tempfile.mkdtemp(prefix="tether-scale-"))
    directory.mkdir(parents=True, exist_ok=True)
    dsn = os.environ.get("TETHER_TEST_PG_DSN", "").strip()
    figures: list[Figure] = []
    made: list[Deployment] = []
    print(
        f"tether scale: {small_n:,} vs {large_n:,} runs (93% completed, 2% waiting for an "
        "approval, 1% failing, 2% held, 2% free), seeded by copying runtime-written rows; "
        f"target: large/small <= {TARGET:g}x"
    )
    try:
        for store in wanted:
            if store == "postgres" and not dsn:
                print("postgres: skipped (set TETHER_TEST_PG_DSN)")
                continue
            if "parked" in parts:
                started = time.perf_counter()
                both = []
                for parked in (0, args.parked):
                    d = (
                        sqlite_deployment(directory, small_n, parked)
                        if store == "sqlite"
                        else postgres_deployment(dsn, small_n, parked)
                    )
                    made.append(d)
                    d.analyze()
                    both.append(d)
                print(
                    f"{store}: seeded {small_n:,} runs alone and beside {args.parked:,} parked "
                    f"in {time.perf_counter() - started:.1f} s"
                )
                for name, plan in claim_plans(both[1]).items():
                    print(f"  plan of the {name} beside {args.parked:,} parked: {plan}")
                figures += measure_parked(both[0], both[1], args.parked, args.rounds)
            if not parts & {"pages", "claims"}:
                continue
            started = time.perf_counter()
            pair = []
            for n in (small_n, large_n):
                d = (
                    sqlite_deployment(directory, n)
                    if store == "sqlite"
                    else postgres_deployment(dsn, n)
                )
                made.append(d)
                d.analyze()
                pair.append(d)
            print(f"{store}: seeded both sizes in {time.perf_counter() - started:.1f} s")
            for name, plan in plans(pair[1]).items():
                print(f"  plan of the {name} at {large_n:,} runs: {plan}")
            figures += measure(pair[0], pair[1], args.rounds, parts - {"parked"})
        places = {"sqlite": str(directory)} if "sqlite" in wanted else {}
        if "postgres" in wanted and dsn:
            places["postgres"] = dsn
        history = history_figures(places) if "pages" in parts else []
        show(figures + history)
        if not history:
            why = "bench/_history.py is absent" if "pages" in parts else "--parts without pages"
            print(f"\nhistory (10 vs 10,000 steps): not measured here ({why})")
        if args.save is not None:
            args.save.write_text(json.dumps([asdict(f) for f in figures + history], indent=2))
    finally:
        for d in made:
            d.drop()
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    over = [f for f in figures if f.target > 0 and f.unit != "bytes" and f.ratio > f.target]
    return 1 if over else 0  # history figures, when measured, carry their own verdicts


if __name__ == "__main__":
    sys.exit(main())
