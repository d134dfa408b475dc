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
from tether.store._schema import migrations
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
    seen: list[tuple[str, tuple[Any, ...]]] = []
    real = store._all

    def recording(sql: str, params: Any = ()) -> Any:
        seen.append((sql, tuple(params)))
        return real(sql, params)

    store._all = recording
    try:
        store.claim_expired(
            "probe", LONG, limit=1, phases=WORKER_PHASES, max_attempts=5, suspects=suspects
        )
    finally:
        del store._all
    (claim,) = [(sql, params) for sql, params in seen if sql.startswith("UPDATE tether_marks")]
    return claim


def test_sqlite_plans_the_claim_on_its_index(tmp_path: Path) -> None:
    """EXPLAIN QUERY PLAN of the claim searches tether_marks_due; nothing sorts (no temp b-tree)."""
    path = tmp_path / "plan.sqlite"
    with SQLiteStore(path) as store:
        _seed_many(store, 3000)
        store._conn.execute("ANALYZE")
        sql, params = _claim_statement(store)
    with sqlite3.connect(path) as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    assert any("USING INDEX tether_marks_due" in step and "<expr>" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


def test_sqlite_plans_a_claim_of_suspects_on_their_own_index(tmp_path: Path) -> None:
    """A claim of suspects alone searches tether_marks_suspect, not the due runs before them."""
    path = tmp_path / "plan.sqlite"
    with SQLiteStore(path) as store:
        _seed_many(store, 3000)
        # Statistics taken while some runs were suspects (of none, SQLite keeps none).
        store._conn.execute(
            "UPDATE tether_marks SET lease_owner = 'dead', lease_expires_at = 1, attempts = 2 "
            "WHERE run_id IN ('run-000010', 'run-000020', 'run-000030')"
        )
        store._conn.commit()
        store._conn.execute("ANALYZE")
        sql, params = _claim_statement(store, suspects=True)
    with sqlite3.connect(path) as conn:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
    assert any("USING INDEX tether_marks_suspect" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


def _postgres_plan(suspects: bool | None = None) -> str:
    """EXPLAIN of the claim on 3,000 runs in a fresh schema, after ANALYZE."""
    import psycopg

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        conninfo = in_schema(dsn, schema)
        with PostgresStore(conninfo, max_connections=2) as store:
            _seed_many(store, 3000)
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("ANALYZE tether_marks")
                sql, params = _claim_statement(store, suspects=suspects)
                return "\n".join(
                    str(row[0]) for row in conn.execute("EXPLAIN " + sql.replace("?", "%s"), params)
                )


@pytest.mark.postgres
def test_postgres_plans_a_claim_of_suspects_on_their_own_index() -> None:
    """After ANALYZE, a claim of suspects alone is an index scan of tether_marks_suspect."""
    plan = _postgres_plan(suspects=True)
    assert "tether_marks_suspect" in plan and "Sort" not in plan, plan


@pytest.mark.postgres
def test_postgres_plans_the_claim_on_its_index_with_statistics() -> None:
    """After ANALYZE, EXPLAIN of the claim is an index scan of tether_marks_due bounded by the clock."""
    plan = _postgres_plan()
    assert "Index Scan using tether_marks_due" in plan, plan
    assert "Index Cond" in plan and "Sort" not in plan, plan


def _seed_many(store: Any, count: int) -> None:
    """``count`` runs, nine in ten completed, written the way commits write marks (fast, in SQL)."""
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
            sql.run(clone, (f"run-{i:06d}", "running" if i % 10 == 0 else "completed", i + 1))

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
