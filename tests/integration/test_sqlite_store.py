"""SQLiteStore on a real file: pragmas, migrations, compare-and-set, write-once, errors."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import ScriptedAgent, World, finish, write
from tether.core import (
    CheckpointCorruptError,
    GenerationConflictError,
    MigrationError,
    StoreError,
    StoreUnavailableError,
    WriteOnceError,
)
from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash
from tether.store import Commit, SQLiteStore
from tether.store._schema import migrations

#: The newest migration this tether knows (every test store is migrated to it).
NEWEST = max(version for version, _ in migrations("BLOB"))


def commit(run_id: str, generation: int, body: bytes = b"{}") -> Commit:
    envelope = body + str(generation).encode()
    return Commit(run_id, generation, "sha256:" + hashlib.sha256(envelope).hexdigest(), envelope)


def test_opened_for_safe_concurrency(tmp_path: Path) -> None:
    """WAL, synchronous FULL, foreign keys and a busy timeout are set on open."""
    with SQLiteStore(tmp_path / "s.sqlite") as store:
        pragma = lambda name: store._conn.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("synchronous") == 2
        assert pragma("foreign_keys") == 1
        assert pragma("busy_timeout") == 30_000


def test_migrations_are_numbered_recorded_and_idempotent(tmp_path: Path) -> None:
    """Opening twice applies each migration once and records it."""
    SQLiteStore(tmp_path / "s.sqlite").close()
    with SQLiteStore(tmp_path / "s.sqlite") as store:
        assert store.schema_version() == NEWEST
    rows = (
        sqlite3.connect(tmp_path / "s.sqlite")
        .execute("SELECT version FROM tether_migrations")
        .fetchall()
    )
    assert rows == [(n,) for n in range(1, NEWEST + 1)]


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """A database migrated by a newer tether is refused with MigrationError."""
    SQLiteStore(tmp_path / "s.sqlite").close()
    with sqlite3.connect(tmp_path / "s.sqlite") as conn:
        conn.execute("INSERT INTO tether_migrations VALUES (99, 'later')")
    with pytest.raises(MigrationError, match="newer"):
        SQLiteStore(tmp_path / "s.sqlite")


def test_the_mark_moves_only_by_compare_and_set(tmp_path: Path) -> None:
    """Creating twice, skipping a generation or a stale expectation all lose with a typed error."""
    with SQLiteStore(tmp_path / "s.sqlite") as store:
        store.commit(commit("r", 1), 0)
        with pytest.raises(GenerationConflictError):
            store.commit(commit("r", 1, b"x"), 0)
        with pytest.raises(GenerationConflictError):
            store.commit(commit("r", 3), 2)
        store.commit(commit("r", 2), 1)
        with pytest.raises(GenerationConflictError) as caught:
            store.commit(commit("r", 2, b"late"), 1)
        assert (caught.value.expected, caught.value.actual) == (1, 2)
        mark = store.get_mark("r")
        assert mark is not None and mark.generation == 2


def test_a_losing_commit_writes_no_content(tmp_path: Path) -> None:
    """The CAS is checked before content is written, so a loser leaves nothing behind."""
    with SQLiteStore(tmp_path / "s.sqlite") as store:
        store.commit(commit("r", 1), 0)
        loser = commit("r", 1, b"loser")
        with pytest.raises(GenerationConflictError):
            store.commit(loser, 0)
        assert store.get_checkpoint("r", loser.checkpoint_digest) is None


def test_content_is_write_once_and_addressed_by_digest(tmp_path: Path) -> None:
    """A digest that does not address its bytes is refused."""
    with SQLiteStore(tmp_path / "s.sqlite") as store:
        good = commit("r", 1)
        with pytest.raises(WriteOnceError):
            store.commit(Commit("r", 1, good.checkpoint_digest, b"other bytes"), 0)
        assert store.get_mark("r") is None


def test_a_torn_transaction_is_invisible(world: World) -> None:
    """A crash inside a checkpoint transaction leaves the previous generation and no new rows."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    rt = world.runtime(agent, crash=CrashPlan(CrashPoint.CHECKPOINT_WRITE, nth=2))
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    store = world.store()
    mark = store.get_mark("r1")
    assert mark is not None and mark.generation == 1
    assert store.newest_generation("r1") == 1
    assert world.runtime(agent).recover("r1").run().phase.value == "completed"
    assert world.sandbox.write_count() == 1


def test_separate_mark_store_crash_between_content_and_mark(world: World, tmp_path: Path) -> None:
    """With the mark in its own file, a crash after content leaves the previous generation."""
    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    marks_path = tmp_path / "marks.sqlite"
    rt = world.runtime(
        agent, marks=SQLiteStore(marks_path), crash=CrashPlan(CrashPoint.CONTENT_BEFORE_MARK, nth=2)
    )
    assert not rt.checkpointer.colocated
    with pytest.raises(SimulatedCrash):
        rt.start("r1").run()
    with SQLiteStore(marks_path) as marks:
        mark = marks.get_mark("r1")
        assert mark is not None and mark.generation == 1
    assert world.store().newest_generation("r1") == 2  # orphaned, unreachable content
    assert world.store().get_mark("r1") is None  # the content file holds no mark at all
    session = world.runtime(agent, marks=SQLiteStore(marks_path)).recover("r1")
    assert session.run().phase.value == "completed"
    assert world.sandbox.write_count() == 1


def test_a_failing_write_rolls_back_and_leaves_no_transaction_open(tmp_path: Path) -> None:
    """A write whose body raises lands nothing, and the connection is free for the next one."""

    def fails(q: object) -> None:
        q.run("INSERT INTO tether_blobs (digest, body) VALUES (?, ?)", ("d", b"x"))  # type: ignore[attr-defined]
        raise RuntimeError("the body failed")

    with SQLiteStore(tmp_path / "s.sqlite") as store:
        with pytest.raises(RuntimeError):
            store.transaction(fails)
        assert not store._conn.in_transaction
        assert store.read(lambda q: q.one("SELECT count(*) FROM tether_blobs")) == (0,)
        store.transaction(
            lambda q: q.run("INSERT INTO tether_blobs (digest, body) VALUES ('e', x'00')")
        )
        assert store.read(lambda q: q.one("SELECT count(*) FROM tether_blobs")) == (1,)


def test_driver_errors_are_translated(tmp_path: Path) -> None:
    """A directory or a garbage file as the database raises StoreError subclasses, not sqlite3."""
    with pytest.raises(StoreUnavailableError):
        SQLiteStore(tmp_path)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError) as caught:
        SQLiteStore(garbage)
    assert not isinstance(caught.value, sqlite3.Error)
    assert isinstance(caught.value.__cause__, sqlite3.Error)


@pytest.mark.parametrize(
    ("code", "damaged"),
    [(11, True), (267, True), (523, True), (779, True), (26, False), (5, False), (None, False)],
)
def test_every_corrupt_code_sqlite_reports_is_damage(
    tmp_path: Path, code: int | None, damaged: bool
) -> None:
    """SQLITE_CORRUPT and its extended codes (_VTAB, _SEQUENCE, _INDEX) are CheckpointCorruptError."""
    error = sqlite3.DatabaseError("database disk image is malformed")
    if code is not None:
        error.sqlite_errorcode = code  # what the sqlite3 module sets on what SQLite raised
    with SQLiteStore(tmp_path / "store.sqlite") as store:
        typed = store._translate(error)
    assert isinstance(typed, CheckpointCorruptError) is damaged, typed


def test_a_bad_synchronous_mode_is_refused(tmp_path: Path) -> None:
    """Only SQLite's real synchronous modes are accepted."""
    with pytest.raises(StoreError, match="synchronous"):
        SQLiteStore(tmp_path / "s.sqlite", synchronous="sometimes")


def test_mark_in_postgresql_content_in_sqlite_survives_a_crash_between_them(
    world: World, tmp_path: Path
) -> None:
    """The high-water mark in PostgreSQL, content in SQLite: a crash after content keeps the old mark."""
    from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
    from tether.store import open_store

    agent = ScriptedAgent([write("notes.txt", "x"), finish])
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        url = url_in_schema(dsn, schema)
        with open_store(url) as marks:
            rt = world.runtime(
                agent, marks=marks, crash=CrashPlan(CrashPoint.CONTENT_BEFORE_MARK, nth=2)
            )
            assert not rt.checkpointer.colocated
            with pytest.raises(SimulatedCrash):
                rt.start("r1").run()
            mark = marks.get_mark("r1")
            assert mark is not None and mark.generation == 1
        assert world.store().newest_generation("r1") == 2
        with open_store(url) as marks:
            session = world.runtime(agent, marks=marks).recover("r1")
            assert session.run().phase.value == "completed"
            final = marks.get_mark("r1")
            assert final is not None and final.generation == session.state.generation
    assert world.sandbox.write_count() == 1


def test_a_store_that_cannot_enter_wal_mode_is_refused() -> None:
    """WAL is checked after the pragma: an in-memory database (journal "memory") is refused."""
    from tether.core import StoreUnavailableError

    with pytest.raises(StoreUnavailableError, match="WAL"):
        SQLiteStore(":memory:")


def test_read_only_open_reads_a_live_store_and_refuses_writes(world: World) -> None:
    """Beside a writer, a read-only store sees committed checkpoints; its writes are typed errors."""
    world.runtime(ScriptedAgent([write("notes.txt", "x"), finish])).start("r1").run()
    with SQLiteStore(world.db) as writer, SQLiteStore(world.db, read_only=True) as reader:
        assert reader.get_mark("r1") == writer.get_mark("r1")
        version = reader.schema_version()
        with pytest.raises(StoreError):
            reader.put_evidence("r1", "approval", {"a": 1})
        assert reader.evidence("r1", 0) == [] and reader.schema_version() == version


def test_read_only_open_refuses_a_missing_file_or_a_foreign_database(tmp_path: Path) -> None:
    """No file is created, and a database that is not a tether store is left untouched."""
    missing = tmp_path / "typo.sqlite"
    with pytest.raises(StoreUnavailableError, match="no SQLite store"):
        SQLiteStore(missing, read_only=True)
    assert not missing.exists()
    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    with pytest.raises(StoreUnavailableError, match="not a tether store"):
        SQLiteStore(foreign, read_only=True)
    with sqlite3.connect(foreign) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
    conn.close()
    assert tables == ["notes"]


def test_a_write_steps_commits_run_one_insert_per_table(world: World) -> None:
    """A write step's one commit is BEGIN, the mark's UPDATE, at most one INSERT per table, COMMIT."""
    session = world.runtime(
        ScriptedAgent([write("notes.txt", "one"), write("notes.txt", "two", "b"), finish])
    ).start("r1")
    session.step()
    seen: list[str] = []
    session.rt.store._conn.set_trace_callback(lambda sql: seen.append(sql.split("(")[0].strip()))
    session.step()
    session.rt.store._conn.set_trace_callback(None)
    commits: list[list[str]] = []
    for statement in seen:
        if statement == "BEGIN IMMEDIATE":
            commits.append([])
        elif commits and statement != "COMMIT" and not statement.startswith("SELECT"):
            commits[-1].append(statement)
    assert len(commits) == 1  # the intent, carrying the previous write's receipt
    for statements in commits:
        assert statements[0].startswith("UPDATE tether_marks")
        inserts = statements[1:]
        assert all(s.startswith("INSERT OR IGNORE INTO tether_") for s in inserts)
        assert len(inserts) == len(set(inserts)) <= 4  # checkpoint, trace, ledger, blobs
