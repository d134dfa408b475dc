"""A worker's claim is served by an index in its own order, on SQLite and PostgreSQL.

The order is the run claimable longest first (a run created free is claimable
from its creation, by the store's clock), then, on a tie, the run taken least
recently, then run id; finished runs and runs parked for a person are not
in the index at all; evidence wakes a parked run as it lands; and a
database written before the index existed upgrades to it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tether.store import PostgresStore, SQLiteStore
from tether.store._schema import CLAIM_SCOPE, FAILED_CLAIMS, PARKED, migrations
from tether.testing.store_conformance import make_commit

LONG = 60.0
WORKER_PHASES = ("running", "pending", "needs_review")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def connect(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Connections to one fresh database of each store tether ships."""
    if request.param == "sqlite":
        yield lambda: SQLiteStore(tmp_path / "claims.sqlite")
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield lambda: PostgresStore(in_schema(dsn, schema), max_connections=2)


def _claim_one(store: Any, worker: str = "w") -> str | None:
    got = store.claim_expired(worker, LONG, limit=1, phases=WORKER_PHASES)
    return got[0].run_id if got else None


def test_the_claim_order_is_the_run_claimable_longest_first(
    connect: Callable[[], Any],
) -> None:
    """Runs by when they became claimable (created, deferred, lease run out), whatever their ids; nothing early."""
    with connect() as store:
        # b created before a: claimable longer, though a's id sorts first.
        for run_id in ("b-created", "a-created"):
            store.commit(make_commit(run_id, 1), 0)
            time.sleep(0.02)
        for run_id in ("c-deferred", "d-expired", "e-later", "f-done"):
            phase = "completed" if run_id == "f-done" else "running"
            store.commit(make_commit(run_id, 1, phase=phase), 0)
        deferred = store.acquire_lease("c-deferred", "old", LONG)
        store.defer("c-deferred", "old", deferred.lease_version, 0.0, "boom")
        time.sleep(0.02)
        store.acquire_lease("d-expired", "dead", 0.05)  # its worker dies holding it
        later = store.acquire_lease("e-later", "old", LONG)
        store.defer("e-later", "old", later.lease_version, LONG, "not yet")
        time.sleep(0.1)
        # Created after d's lease ran out: behind d, though its id sorts first.
        store.commit(make_commit("0-created-last", 1), 0)
        order = [_claim_one(store, f"w{i}") for i in range(6)]
    assert order == ["b-created", "a-created", "c-deferred", "d-expired", "0-created-last", None]


def test_a_run_released_after_work_waits_behind_runs_claimable_longer(
    connect: Callable[[], Any],
) -> None:
    """Fairness: a deferred run that just became due goes behind one deferred before it."""
    with connect() as store:
        for run_id in ("r1", "r2"):
            store.commit(make_commit(run_id, 1), 0)
        first = store.claim_expired("w", LONG, limit=2)
        by_id = {lease.run_id: lease for lease in first}
        store.defer("r2", "w", by_id["r2"].lease_version, 0.0, "first to fail")
        time.sleep(0.02)
        store.defer("r1", "w", by_id["r1"].lease_version, 0.0, "second to fail")
        assert [_claim_one(store), _claim_one(store)] == ["r2", "r1"]


def test_a_parked_run_is_woken_by_evidence_even_if_it_landed_before_it_parked(
    connect: Callable[[], Any],
) -> None:
    """Evidence after the run read its inbox keeps it claimable; later evidence wakes a parked one."""
    with connect() as store:
        store.commit(make_commit("early", 1, phase="needs_review"), 0)
        store.commit(make_commit("late", 1, phase="pending"), 0)
        leases = {x.run_id: x for x in store.claim_expired("w", LONG, 2, WORKER_PHASES)}
        # "early" read its inbox up to 0; a decision lands before the worker parks it.
        store.put_evidence("early", "review_decision", {"signed": "early"})
        store.wait_for_evidence("early", "w", leases["early"].lease_version, 0, 0)
        store.wait_for_evidence("late", "w", leases["late"].lease_version, 0, 0)
        assert store.get_mark("early").waiting_after is None
        assert store.get_mark("late").waiting_after == 0
        assert _claim_one(store) == "early"
        assert _claim_one(store) is None  # "late" waits: nothing new for it
        store.put_evidence("late", "approval", {"signed": "late"})
        assert _claim_one(store) == "late"


def test_a_claim_of_ended_runs_still_works_without_the_index(connect: Callable[[], Any]) -> None:
    """Phases outside the index (an operator's sweep of completed runs) are still claimable."""
    with connect() as store:
        store.commit(make_commit("done", 1, phase="completed"), 0)
        store.commit(make_commit("live", 1), 0)
        (only,) = store.claim_expired("w", LONG, limit=5, phases=("completed",))
        assert only.run_id == "done"


def _claim_statement(store: Any, suspects: bool | None = None) -> tuple[str, tuple[Any, ...]]:
    """The SQL and parameters of one claim, as the store sends them (the claim still runs)."""

    def claim() -> None:
        store.claim_expired(
            "probe", LONG, limit=1, phases=WORKER_PHASES, max_attempts=5, suspects=suspects
        )

    (found,) = [
        (sql, params)
        for sql, params in _recorded(store, claim)
        if sql.startswith("UPDATE tether_marks")
    ]
    return found


def _sqlite_plan(path: Path, sql: str, params: tuple[Any, ...]) -> dict[str, list[str]]:
    """EXPLAIN QUERY PLAN of ``sql``: each step's detail, under the name of every
    step it sits below (a sort below "CO-ROUTINE due" sorts the due runs)."""
    with sqlite3.connect(path) as conn:
        rows = list(conn.execute("EXPLAIN QUERY PLAN " + sql, params))
    detail = {row[0]: row[3] for row in rows}
    parent = {row[0]: row[1] for row in rows}
    below: dict[str, list[str]] = {"": []}
    for node, step in detail.items():
        below[""].append(step)
        up = parent[node]
        while up in detail:
            below.setdefault(detail[up], []).append(step)
            up = parent[up]
    return below


def _sqlite_claim_plan(tmp_path: Path, analyze: bool, suspects: bool | None = None) -> Any:
    path = tmp_path / "plan.sqlite"
    with SQLiteStore(path) as store:
        _seed_many(store, 3000)
        if analyze:
            # Statistics taken while some runs were suspects (of none, SQLite keeps none).
            store._conn.execute(
                "UPDATE tether_marks SET lease_owner = 'dead', lease_expires_at = 1, attempts = 2 "
                "WHERE run_id IN ('run-000010', 'run-000020', 'run-000030')"
            )
            store._conn.commit()
            store._conn.execute("ANALYZE")
        sql, params = _claim_statement(store, suspects)
    return _sqlite_plan(path, sql, params)


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "never-analyzed"])
def test_sqlite_plans_the_claim_on_its_index(tmp_path: Path, analyze: bool) -> None:
    """The claim searches tether_marks_due and sorts none of its rows, with or without ANALYZE
    (tether never runs it); the runs parked at the mark it reads by tether_marks_parked."""
    plan = _sqlite_claim_plan(tmp_path, analyze)
    due, parked = plan["CO-ROUTINE due"], plan["CO-ROUTINE parked"]
    assert any("USING INDEX tether_marks_due" in step and "<expr>" in step for step in due), plan
    assert not any("TEMP B-TREE" in step for step in due), plan
    # Those under the worker's ceiling only (none here), by a range of the index's key.
    assert any("USING INDEX tether_marks_parked (<expr><?)" in step for step in parked), plan
    assert not any(step.startswith("SCAN tether_marks") for step in plan[""]), plan


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "never-analyzed"])
def test_sqlite_plans_a_claim_of_suspects_on_their_own_index(tmp_path: Path, analyze: bool) -> None:
    """A claim of suspects alone searches tether_marks_suspect, not the due runs before them."""
    plan = _sqlite_claim_plan(tmp_path, analyze, suspects=True)
    due, parked = plan["CO-ROUTINE due"], plan["CO-ROUTINE parked"]
    assert any("USING INDEX tether_marks_suspect" in step for step in due), plan
    assert not any("TEMP B-TREE" in step for step in due), plan
    assert any("USING INDEX tether_marks_parked" in step for step in parked), plan
    assert not any(step.startswith("SCAN tether_marks") for step in plan[""]), plan


def _postgres_plan(suspects: bool | None = None) -> dict[str, Any]:
    """EXPLAIN (FORMAT JSON) of the claim on 6,000 runs, one in 14 unfinished and none
    parked, in a fresh schema, after ANALYZE (with a flag PostgreSQL could not count, a
    probe of the empty parked index looked dearer than reading every unfinished run)."""
    import psycopg

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        conninfo = in_schema(dsn, schema)
        with PostgresStore(conninfo, max_connections=2) as store:
            _seed_many(store, 6000, unfinished_every=14)
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("ANALYZE tether_marks")
                sql, params = _claim_statement(store, suspects=suspects)
                (row,) = conn.execute(
                    "EXPLAIN (FORMAT JSON) " + sql.replace("?", "%s"), params
                ).fetchall()
                plan: dict[str, Any] = row[0][0]["Plan"]
                return plan


def _scans(plan: dict[str, Any], above: tuple[str, ...] = ()) -> list[tuple[str, tuple[str, ...]]]:
    """Each index scan in a PostgreSQL plan, with the node types above it."""
    found = []
    if "Index Name" in plan:
        found.append((plan["Index Name"], above))
    for child in plan.get("Plans", []):
        found += _scans(child, (*above, plan["Node Type"]))
    return found


def _check_postgres_plan(plan: dict[str, Any], index: str) -> None:
    scans = dict(_scans(plan))
    assert index in scans, plan
    # The due runs are read in the index's order, bounded by the clock: nothing between
    # the scan and the merge of the two indexes' fronts (twice the limit at most) sorts.
    above = scans[index]
    merge = max(i for i, node in enumerate(above) if node in ("Append", "Merge Append"))
    assert "Sort" not in above[merge:], plan
    # The runs parked at the mark: those under the worker's ceiling only (none here), by
    # a probe of their own index, not a read of every unfinished run to find there are none.
    assert "tether_marks_parked" in scans and "tether_marks_phase" not in scans, plan
    assert "Seq Scan" not in str(plan), plan


@pytest.mark.postgres
def test_postgres_plans_a_claim_of_suspects_on_their_own_index() -> None:
    """After ANALYZE, a claim of suspects alone is an index scan of tether_marks_suspect."""
    _check_postgres_plan(_postgres_plan(suspects=True), "tether_marks_suspect")


@pytest.mark.postgres
def test_postgres_plans_the_claim_on_its_index_with_statistics() -> None:
    """After ANALYZE, EXPLAIN of the claim is an index scan of tether_marks_due bounded by the clock."""
    plan = _postgres_plan()
    _check_postgres_plan(plan, "tether_marks_due")
    assert "Index Cond" in str(plan), plan


def _seed_many(store: Any, count: int, unfinished_every: int = 10) -> None:
    """``count`` runs, one in ``unfinished_every`` running and the rest completed, written the
    way commits write marks (fast, in SQL)."""
    store.commit(make_commit("seed", 1), 0)
    # Each created free a microsecond after the one before (claimable from then).
    clone = (
        "INSERT INTO tether_marks (run_id, generation, checkpoint_digest, state_version, "
        "lease_version, phase, updated_at, attempts, retry_at) SELECT ?, generation, "
        "checkpoint_digest, state_version, lease_version, ?, updated_at, 0, retry_at + ? "
        "FROM tether_marks WHERE run_id = 'seed'"
    )

    def body(sql: Any) -> None:
        for i in range(count):
            phase = "running" if i % unfinished_every == 0 else "completed"
            sql.run(clone, (f"run-{i:06d}", phase, i + 1))

    store.transaction(body)


# -- an old database upgrades ----------------------------------------------------------


def _schema_7(execute: Callable[[str], Any], blob: str) -> None:
    """Create the tables exactly as a tether at schema version 7 left them."""
    execute(
        "CREATE TABLE tether_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    for version, statements in migrations(blob):
        if version > 7:
            break
        for statement in statements:
            execute(statement)
        execute(f"INSERT INTO tether_migrations VALUES ({version}, '2026-12-01T00:00:00Z')")


_OLD_ROWS = [
    # A run parked for a person whose evidence landed before the upgrade, one still
    # waiting, and a free one.
    "INSERT INTO tether_marks (run_id, generation, checkpoint_digest, state_version, phase, "
    "updated_at, waiting_after) VALUES ('woken', 1, 'sha256:x', 1, 'pending', 't', 0)",
    "INSERT INTO tether_marks (run_id, generation, checkpoint_digest, state_version, phase, "
    "updated_at, waiting_after) VALUES ('waiting', 1, 'sha256:y', 1, 'needs_review', 't', 3)",
    "INSERT INTO tether_marks (run_id, generation, checkpoint_digest, state_version, phase, "
    "updated_at) VALUES ('free', 1, 'sha256:z', 1, 'running', 't')",
    "INSERT INTO tether_inbox VALUES ('woken', 1, 'approval', '{}', 't')",
    "INSERT INTO tether_inbox VALUES ('waiting', 3, 'review_decision', '{}', 't')",
]


def _check_upgraded(store: Any) -> None:
    assert store.schema_version() >= 8
    assert store.get_mark("woken").waiting_after is None
    assert store.get_mark("waiting").waiting_after == 3
    claimed = sorted(x.run_id for x in store.claim_expired("w", LONG, 10, WORKER_PHASES))
    assert claimed == ["free", "woken"]


def test_a_sqlite_database_at_schema_7_upgrades_to_the_claim_index(tmp_path: Path) -> None:
    """Opening an old file migrates it: the index exists, the old one is gone, woken runs claimable."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        _schema_7(conn.execute, "BLOB")
        for statement in _OLD_ROWS:
            conn.execute(statement)
    with SQLiteStore(path) as store:
        _check_upgraded(store)
    with sqlite3.connect(path) as conn:
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "tether_marks_due" in indexes and "tether_marks_claim" not in indexes


@pytest.mark.postgres
def test_a_postgres_database_at_schema_7_upgrades_to_the_claim_index() -> None:
    """Opening an old schema migrates it the same way."""
    import psycopg

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        conninfo = in_schema(dsn, schema)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            _schema_7(conn.execute, "BYTEA")
            for statement in _OLD_ROWS:
                conn.execute(statement)
        with PostgresStore(conninfo, max_connections=2) as store:
            _check_upgraded(store)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            indexes = {
                row[0]
                for row in conn.execute(
                    "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,)
                )
            }
    assert "tether_marks_due" in indexes and "tether_marks_claim" not in indexes


# -- runs parked at the mark -----------------------------------------------------------

CEILING = 5
MANY_PARKED = 2000


def _parked_templates(store: Any) -> None:
    """Two runs parked at the mark by the store's own statements, as a worker of
    ``max_attempts`` 5 leaves them: one deferred after each of its 5 claims, one
    whose worker died holding it 5 times (a suspect). No claim of that worker takes either."""
    store.commit(make_commit("parked-deferred", 1), 0)
    for _ in range(CEILING):
        (lease,) = store.claim_expired("w", LONG, 1, WORKER_PHASES, CEILING)
        store.defer(lease.run_id, "w", lease.lease_version, 0.0, "RuntimeError: it failed")
    store.commit(make_commit("parked-died", 1), 0)
    for _ in range(CEILING):
        (lease,) = store.claim_expired("w", 0.001, 1, WORKER_PHASES, CEILING)
        time.sleep(0.005)  # its worker dies: the lease runs out held
    assert store.claim_expired("w", LONG, 5, WORKER_PHASES, CEILING) == []


def _park_many(store: Any, count: int) -> None:
    """``count`` copies of the two parked templates (every column), claimable since before
    every other run: they sit at the front of the claim's order."""

    def body(sql: Any) -> None:
        described = store._local.conn.execute("SELECT * FROM tether_marks WHERE 1 = 0")
        columns = [d[0] for d in described.description]
        listed = ", ".join(columns)
        for i in range(count):
            template = "parked-deferred" if i % 2 else "parked-died"
            chosen = ", ".join("?" if c == "run_id" else c for c in columns)
            sql.run(
                f"INSERT INTO tether_marks ({listed}) SELECT {chosen} FROM tether_marks "
                "WHERE run_id = ?",
                (f"parked-{i:05d}", template),
            )

    store.transaction(body)


def _recorded(store: Any, call: Callable[[], Any]) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements ``call`` sends through ``store`` (it still runs), with their parameters."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    real = store._execute

    def recording(sql: str, params: Any = ()) -> Any:
        seen.append((sql, tuple(params)))
        return real(sql, params)

    store._execute = recording
    try:
        call()
    finally:
        del store._execute
    return seen


def _calls(store: Any) -> dict[str, Callable[[], Any]]:
    """What a worker asks the store while runs are parked: its three claims and the probe."""

    def claim(suspects: bool | None) -> Callable[[], Any]:
        def once() -> Any:
            got = store.claim_expired("w", LONG, 1, WORKER_PHASES, CEILING, suspects=suspects)
            for lease in got:  # back in the queue, as before
                store.release_lease(lease.run_id, "w", lease.lease_version)
            return got

        return once

    return {
        "claim": claim(None),
        "claim of no suspect": claim(False),
        "claim of suspects": claim(True),
        "suspect_waiting": lambda: store.suspect_waiting(WORKER_PHASES, CEILING),
    }


def _sqlite_steps(store: Any, call: Callable[[], Any]) -> int:
    """The virtual-machine steps SQLite takes for ``call``: they grow with every row it reads."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    store._conn.set_progress_handler(count, 1)
    try:
        call()
    finally:
        store._conn.set_progress_handler(None, 1)
    return steps


def test_a_sqlite_claim_reads_past_none_of_the_runs_parked_at_the_mark(tmp_path: Path) -> None:
    """2,000 runs parked at the mark, first in claim order, cost each claim and the probe nothing."""
    with SQLiteStore(tmp_path / "parked.sqlite") as store:
        _parked_templates(store)
        for i in range(3):
            store.commit(make_commit(f"free-{i}", 1), 0)
        calls = _calls(store)
        for call in calls.values():
            call()  # the statements compiled once (their first run costs more)
        before = {name: _sqlite_steps(store, call) for name, call in calls.items()}
        _park_many(store, MANY_PARKED)
        after = {name: _sqlite_steps(store, call) for name, call in calls.items()}
        assert store.claim_expired("w", LONG, 10, WORKER_PHASES, CEILING)  # the free runs
    # A row read is tens of steps; 2,000 of them would be tens of thousands.
    assert all(after[name] <= before[name] + 100 for name in calls), (before, after)


def _rows_read(plan: dict[str, Any]) -> int:
    """Rows the scans of tether_marks in an EXPLAIN ANALYZE plan read (kept or filtered out),
    its lookups by run id aside."""
    read = 0
    if plan.get("Relation Name") == "tether_marks" and plan.get("Index Name") != (
        "tether_marks_pkey"
    ):
        loops = plan.get("Actual Loops", 1)
        read += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
        read += plan.get("Rows Removed by Index Recheck", 0)
    for child in plan.get("Plans", []):
        read += _rows_read(child)
    return read


@pytest.mark.postgres
def test_a_postgres_claim_reads_past_none_of_the_runs_parked_at_the_mark() -> None:
    """The same on PostgreSQL after ANALYZE: EXPLAIN ANALYZE counts the rows each scan reads."""
    import psycopg

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        conninfo = in_schema(dsn, schema)
        with PostgresStore(conninfo, max_connections=2) as store:
            _parked_templates(store)
            for i in range(3):
                store.commit(make_commit(f"free-{i}", 1), 0)
            statements = {}
            for name, call in _calls(store).items():
                sent = _recorded(store, call)
                statements[name] = next(
                    (sql, params)
                    for sql, params in sent
                    if sql.startswith("UPDATE tether_marks SET lease_owner = ?")
                    or (sql.startswith("SELECT") and "lease_owner IS NOT NULL" in sql)
                )

            def read_by_each() -> dict[str, tuple[int, set[str]]]:
                found = {}
                with psycopg.connect(conninfo) as conn:
                    conn.execute("ANALYZE tether_marks")
                    for name, (sql, params) in statements.items():
                        (row,) = conn.execute(
                            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.replace("?", "%s"), params
                        ).fetchall()
                        plan = row[0][0]["Plan"]
                        found[name] = (_rows_read(plan), {index for index, _ in _scans(plan)})
                        conn.rollback()  # the claim took nothing, whatever it found
                return found

            before = read_by_each()
            _park_many(store, MANY_PARKED)
            after = read_by_each()
    assert all(after[name][0] <= before[name][0] + 5 for name in statements), (before, after)
    for name, (_, indexes) in after.items():
        assert "tether_marks_parked" in indexes, after
        suspects = name in ("claim of suspects", "suspect_waiting")
        unparked = "tether_marks_suspect" if suspects else "tether_marks_due"
        assert unparked in indexes, after


def _schema_19(execute: Callable[[str], Any], store: type[Any]) -> None:
    """Create the tables exactly as a tether at schema version 19 left them (``store``'s dialect)."""
    execute(
        "CREATE TABLE tether_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )
    for version, statements in migrations(
        store.blob_type, store.index_backfill, store.turn_counter
    ):
        if version > 19:
            break
        for statement in statements:
            execute(statement)
        execute(f"INSERT INTO tether_migrations VALUES ({version}, '2026-12-01T00:00:00Z')")


_MARK = (
    "INSERT INTO tether_marks (run_id, generation, checkpoint_digest, state_version, phase, "
    "updated_at, lease_owner, lease_expires_at, attempts, retry_at, claimed_gen) "
)
_ROWS_19 = [
    # Claimable since long ago, in this order: parked by a worker of max_attempts 5
    # (deferred; died holding it), one failed claim, none.
    _MARK + "VALUES ('old-deferred', 1, 'sha256:a', 1, 'running', 't', NULL, NULL, 5, 1, 1)",
    _MARK + "VALUES ('old-died', 1, 'sha256:b', 1, 'running', 't', 'dead', 2, 5, NULL, 1)",
    _MARK + "VALUES ('old-once', 1, 'sha256:c', 1, 'pending', 't', NULL, NULL, 1, 3, 1)",
    _MARK + "VALUES ('old-fresh', 1, 'sha256:d', 1, 'running', 't', NULL, NULL, 0, 4, NULL)",
]


def _check_upgraded_19(store: Any) -> None:
    """The runs parked before the upgrade stay parked and move to their index; the rest go."""
    assert store.schema_version() >= 20
    got = [x.run_id for _ in range(3) for x in store.claim_expired("w", LONG, 1, max_attempts=5)]
    assert got == ["old-once", "old-fresh"]
    assert store.suspect_waiting(max_attempts=5) is False
    assert store.suspect_waiting(max_attempts=6) is True
    got = [x.run_id for _ in range(3) for x in store.claim_expired("w", LONG, 1, max_attempts=6)]
    assert got == ["old-deferred", "old-died"]


def test_a_sqlite_database_at_schema_19_upgrades_to_the_parked_index(tmp_path: Path) -> None:
    """Opening a file of schema 19 adds parks_at and the index of runs parked at the mark."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        _schema_19(conn.execute, SQLiteStore)
        for statement in _ROWS_19:
            conn.execute(statement)
    with SQLiteStore(path) as store:
        with sqlite3.connect(path) as conn:
            parked = conn.execute(
                "SELECT run_id FROM tether_marks INDEXED BY tether_marks_parked "
                f"WHERE {CLAIM_SCOPE} AND {PARKED} AND {FAILED_CLAIMS} >= 0 ORDER BY run_id"
            ).fetchall()
        assert parked == [("old-deferred",), ("old-died",), ("old-once",)]
        _check_upgraded_19(store)


@pytest.mark.postgres
def test_a_postgres_database_at_schema_19_upgrades_to_the_parked_index() -> None:
    """Opening a schema of version 19 migrates it the same way."""
    import psycopg

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        conninfo = in_schema(dsn, schema)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            _schema_19(conn.execute, PostgresStore)
            for statement in _ROWS_19:
                conn.execute(statement)
        with PostgresStore(conninfo, max_connections=2) as store:
            _check_upgraded_19(store)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            indexes = {
                row[0]
                for row in conn.execute(
                    "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,)
                )
            }
    assert {"tether_marks_due", "tether_marks_suspect", "tether_marks_parked"} <= indexes


def _parked_flag(store: Any, run_id: str) -> int:
    """The run's ``parked`` column as the store holds it."""
    row = store.read(
        lambda sql: sql.one("SELECT parked FROM tether_marks WHERE run_id = ?", (run_id,))
    )
    return int(row[0])


def test_a_run_held_at_its_last_attempt_leaves_the_parked_index_once_it_moves_on(
    connect: Callable[[], Any],
) -> None:
    """A worker of max_attempts 1 flags each run it takes as parked (were the claim to fail);
    the commit that moves the run past the claim's own recovery clears the flag, so runs in
    flight do not wait in the parked index, where every claim that may take parked runs reads."""
    with connect() as store:
        store.commit(make_commit("held", 1), 0)
        (lease,) = store.claim_expired("w", LONG, 1, WORKER_PHASES, 1)
        assert _parked_flag(store, "held") == 1
        store.commit(make_commit("held", 2), 1, lease.lease_version)  # the recovery's own commit
        assert _parked_flag(store, "held") == 1
        store.commit(make_commit("held", 3), 2, lease.lease_version)  # moved on
        assert _parked_flag(store, "held") == 0
        # A neighbour's claim neither takes the held run nor is kept from the free one.
        store.commit(make_commit("free", 1), 0)
        assert [lease.run_id for lease in store.claim_expired("w2", LONG, 2, WORKER_PHASES, 1)] == [
            "free"
        ]
