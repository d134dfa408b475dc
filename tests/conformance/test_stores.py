"""The store conformance suite against SQLite (a temp file) and PostgreSQL (a fresh schema).

Also the checks that only make sense for tether's own stores: opening from a
URL, the PostgreSQL driver being optional, concurrent migrators, and lost
connections on a real server.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn, url_in_schema
from tether.core import StoreError, StoreUnavailableError
from tether.store import PostgresStore, SQLiteStore, Store, open_store
from tether.store._schema import migrations
from tether.testing.store_conformance import *  # noqa: F403
from tether.testing.store_conformance import make_commit

#: The newest migration this tether knows (every test store is migrated to it).
NEWEST = max(version for version, _ in migrations("BLOB"))


@dataclass
class Backend:
    """One test's database: how to connect to it and how to fake a newer schema in it."""

    connect: Callable[[], Any]
    bump: Callable[[], None]


def _sqlite_backend(path: Path) -> Backend:
    def bump() -> None:
        with sqlite3.connect(path) as conn:
            conn.execute("INSERT INTO tether_migrations VALUES (99, 'later')")

    return Backend(lambda: SQLiteStore(path), bump)


def _postgres_backend(conninfo: str) -> Backend:
    def bump() -> None:
        import psycopg

        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("INSERT INTO tether_migrations VALUES (99, 'later')")

    return Backend(lambda: PostgresStore(conninfo, max_connections=4), bump)


@pytest.fixture
def postgres() -> Iterator[str]:
    """A libpq conninfo whose search_path is a fresh schema, dropped after the test."""
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield in_schema(dsn, schema)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each store tether ships, on a database of its own."""
    if request.param == "sqlite":
        yield _sqlite_backend(tmp_path / "store.sqlite")
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield _postgres_backend(in_schema(dsn, schema))


@pytest.fixture
def tether_store_factory(backend: Backend) -> Callable[[], Any]:
    """The conformance suite's entry point: connections to the test's one database."""
    return backend.connect


@pytest.fixture
def tether_schema_bump(backend: Backend) -> Callable[[], None]:
    """Lets the suite check that a newer schema is refused."""
    return backend.bump


# -- opening from a URL ------------------------------------------------------------


def test_sqlite_urls_open_relative_and_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three slashes name a path relative to the working directory, four an absolute one."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with open_store("sqlite:///sub/rel.sqlite") as store:
        assert isinstance(store, SQLiteStore)
        store.commit(make_commit("r", 1), 0)
    assert (tmp_path / "sub" / "rel.sqlite").exists()
    absolute = tmp_path / "abs.sqlite"
    with Store.from_url(f"sqlite:///{absolute}") as store:
        assert isinstance(store, SQLiteStore) and store.path == absolute
    assert str(absolute).startswith("/")


def test_sqlite_url_options_reach_the_store(tmp_path: Path) -> None:
    """Query options set synchronous and the busy timeout; unknown ones are refused."""
    with open_store(f"sqlite:///{tmp_path}/s.sqlite?synchronous=NORMAL&busy_timeout_ms=500") as s:
        assert isinstance(s, SQLiteStore)
        assert s._conn.execute("PRAGMA synchronous").fetchone()[0] == 1
        assert s._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 500
    with pytest.raises(StoreError, match="unknown SQLite store option"):
        open_store(f"sqlite:///{tmp_path}/s.sqlite?cache=huge")


def test_unknown_and_malformed_urls_are_refused(tmp_path: Path) -> None:
    """An unknown scheme, a two-slash SQLite URL, an empty path or name, a key=value DSN raise StoreError."""
    with pytest.raises(StoreError, match="unknown store URL scheme 'mysql'"):
        open_store("mysql://root@localhost/db")
    with pytest.raises(StoreError, match="three slashes"):
        Store.from_url("sqlite://localhost/s.sqlite")
    with pytest.raises(StoreError, match="names no file"):
        open_store("sqlite:///")
    for nothing in ("", "  "):
        with pytest.raises(StoreError, match="no store named"):
            open_store(nothing)
    with pytest.raises(StoreError, match="not a key=value DSN"):
        open_store("host=localhost dbname=tether")
    assert list(tmp_path.iterdir()) == []


def test_a_plain_path_names_a_sqlite_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store named without a scheme is that SQLite file: created for a writer, never for a reader."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreUnavailableError, match="no SQLite store"):
        open_store("just-a-path.sqlite", read_only=True)
    with pytest.raises(StoreUnavailableError, match="no SQLite store"):
        open_store("just-a-path.sqlite", existing=True)
    assert list(tmp_path.iterdir()) == []
    with open_store("just-a-path.sqlite") as store:
        assert isinstance(store, SQLiteStore) and store.schema_version() == NEWEST
    with open_store(tmp_path / "just-a-path.sqlite", read_only=True) as again:
        assert again.schema_version() == NEWEST


@pytest.mark.postgres
def test_postgres_urls_open_a_postgres_store() -> None:
    """postgresql:// and postgres:// URLs both open a PostgresStore."""
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        url = url_in_schema(dsn, schema)
        for variant in (url, url.replace("postgresql://", "postgres://", 1)):
            with Store.from_url(variant) as store:
                assert isinstance(store, PostgresStore)
                assert store.schema_version() == NEWEST


# -- the driver is optional ----------------------------------------------------------


def test_without_psycopg_tether_imports_and_postgres_says_how_to_install() -> None:
    """With psycopg hidden, tether still imports and PostgresStore names the extra to install."""
    script = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "import tether, tether.store\n"
        "from tether.core import StoreUnavailableError\n"
        "try:\n"
        "    tether.store.open_store('postgresql://nobody@127.0.0.1:1/none')\n"
        "except StoreUnavailableError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'tether[postgres]'" in out.stdout, out.stdout + out.stderr


def test_an_unreachable_server_is_a_store_unavailable_error() -> None:
    """A server that refuses connections raises StoreUnavailableError within the timeout."""
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="cannot reach PostgreSQL") as caught:
        PostgresStore("postgresql://nobody:secret@127.0.0.1:1/none", timeout_s=1)
    assert time.monotonic() - started < 10
    assert "secret" not in str(caught.value)


# -- PostgreSQL on a real server -------------------------------------------------------


@pytest.mark.postgres
def test_concurrent_migrators_apply_each_migration_once(postgres: str) -> None:
    """Four stores opened at once on an empty schema all succeed and record migration 1 once."""
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []
    stores: list[PostgresStore] = []

    def open_one() -> None:
        try:
            barrier.wait(timeout=30)
            stores.append(PostgresStore(postgres, max_connections=1))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert errors == []
        import psycopg

        with psycopg.connect(postgres) as conn:
            rows = conn.execute("SELECT version FROM tether_migrations").fetchall()
        assert rows == [(v,) for v in range(1, NEWEST + 1)]
    finally:
        for store in stores:
            store.close()


def _terminate(conninfo: str, application: str) -> int:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (application,),
        ).fetchall()
    return len(rows)


@pytest.mark.postgres
def test_connections_lost_while_idle_are_replaced(postgres: str) -> None:
    """After the server drops every pooled connection, the next read and write still succeed."""
    victim = postgres + " application_name=tether_idle_victim"
    with PostgresStore(victim, max_connections=3) as store:
        store.commit(make_commit("r", 1), 0)
        assert _terminate(postgres, "tether_idle_victim") >= 1
        time.sleep(0.1)
        assert store.get_mark("r") is not None
        assert _terminate(postgres, "tether_idle_victim") >= 1
        time.sleep(0.1)
        store.commit(make_commit("r", 2), 1)
        assert store.get_mark("r").generation == 2


@pytest.mark.postgres
def test_a_connection_lost_inside_a_write_is_translated_and_lands_nothing(postgres: str) -> None:
    """A connection killed mid-transaction raises StoreUnavailableError, chains psycopg's error, moves nothing."""
    import psycopg

    victim = postgres + " application_name=tether_busy_victim"
    with PostgresStore(victim, max_connections=2) as store:
        first = make_commit("r", 1)
        store.commit(first, 0)
        doomed = make_commit("r", 2, b"doomed")

        def kill_own_connection() -> None:
            _terminate(postgres, "tether_busy_victim")

        with pytest.raises(StoreUnavailableError) as caught:
            store.commit(doomed, 1, before_commit=kill_own_connection)
        assert isinstance(caught.value.__cause__, psycopg.Error)
        mark = store.get_mark("r")
        assert mark is not None and mark.checkpoint_digest == first.checkpoint_digest
        assert store.get_checkpoint("r", doomed.checkpoint_digest) is None


@pytest.mark.postgres
def test_lease_expiry_comes_from_the_servers_clock(postgres: str) -> None:
    """A lease's expiry is the server's clock_timestamp() plus the ttl, whatever this process thinks."""
    import psycopg

    with PostgresStore(postgres) as store:
        store.commit(make_commit("r", 1), 0)
        lease = store.acquire_lease("r", "w", 60)
        with psycopg.connect(postgres) as conn:
            row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        server_now: datetime = row[0].astimezone(UTC)
        assert abs(lease.expires_at - (server_now + timedelta(seconds=60))) < timedelta(seconds=2)


@pytest.mark.postgres
def test_a_postgres_checkpoint_commit_is_one_round_trip(postgres: str) -> None:
    """After genesis, a commit (mark, checkpoint, events, ledger, blobs) is ONE statement, no BEGIN."""
    from tether.testing.store_conformance import make_events

    with PostgresStore(postgres, max_connections=1) as store:
        store.commit(make_commit("r", 1), 0)
        sent: list[str] = []
        blocks: list[int] = []
        execute, transaction = store._execute, store._transaction

        def counted(sql: str, params: Any = ()) -> Any:
            sent.append(sql)
            return execute(sql, params)

        def counted_block(conn: Any) -> Any:
            blocks.append(1)
            return transaction(conn)

        store._execute, store._transaction = counted, counted_block  # type: ignore[method-assign]
        events = make_events("r", 3)
        store.commit(make_commit("r", 2, events=events, blobs={"sha256:b": b"blob"}), 1)
        assert (len(sent), blocks) == (1, [])
        store._execute, store._transaction = execute, transaction  # type: ignore[method-assign]
        assert store.get_mark("r").generation == 2
        assert [e.hash for e in store.trace("r", events[-1].hash)] == [e.hash for e in events]
        assert store.get_blob("sha256:b") == b"blob"


@pytest.mark.postgres
def test_a_commit_works_when_the_connection_has_a_high_descriptor(postgres: str) -> None:
    """A process with over 1024 open files still commits (the idle probe uses poll, not select)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"needs at least 1200 open files, the limit is {soft}")
    held = [open(os.devnull) for _ in range(1100)]  # noqa: SIM115
    try:
        with PostgresStore(postgres, max_connections=1) as store:
            store.commit(make_commit("r", 1), 0)
            store.commit(make_commit("r", 2), 1)
            assert store.get_mark("r").generation == 2
    finally:
        for handle in held:
            handle.close()


@pytest.mark.postgres
def test_postgres_connections_run_read_committed_whatever_the_default() -> None:
    """A server (or DSN) defaulting to SERIALIZABLE still gets READ COMMITTED connections."""
    from psycopg.conninfo import make_conninfo

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        options = f"-csearch_path={schema} -cdefault_transaction_isolation=serializable"
        with PostgresStore(make_conninfo(dsn, options=options), max_connections=1) as store:
            row = store._read(lambda: store._one("SHOW transaction_isolation"))
            path = store._read(lambda: store._one("SHOW search_path"))
    assert row == ("read committed",)
    assert path == (schema,)  # the store's own schema, nothing written elsewhere


class IgnoresTheLease(SQLiteStore):
    """A broken store for the suite's own test: its commit ignores the lease version.

    It also waits before committing, so a racing takeover always gets in first.
    """

    def commit(
        self,
        commit: Any,
        expected_generation: int,
        expected_lease_version: int = 0,
        before_commit: Any = None,
        **options: Any,
    ) -> Any:
        time.sleep(0.2)
        mark = self.get_mark(commit.run_id)
        held = expected_lease_version if mark is None else mark.lease_version
        return super().commit(commit, expected_generation, held, before_commit, **options)


def test_the_takeover_race_check_fails_a_store_that_ignores_the_lease(tmp_path: Path) -> None:
    """The conformance suite can fail: a store whose commit ignores the lease is caught."""
    from tether.testing._lease_conformance import (
        test_a_late_commit_racing_a_takeover_never_lands_after_it as race_check,
    )

    path = tmp_path / "mutant.sqlite"
    opened: list[SQLiteStore] = []

    def connect() -> SQLiteStore:
        store = IgnoresTheLease(path)
        opened.append(store)
        return store

    try:
        with pytest.raises(AssertionError, match="a late commit landed after it"):
            race_check(connect(), connect)
    finally:
        for store in opened:
            store.close()


def test_content_is_kept_deflated_and_plain_rows_of_before_read_back_the_same(
    backend: Backend,
) -> None:
    """Envelopes, blobs, trace data and ledger documents land deflated (migration 17) on both
    commit paths; the same rows rewritten plain, as written before it, read back unchanged."""
    from tether.core import EffectStatus
    from tether.store._codec import inflate, unpack
    from tether.testing.store_conformance import chained, make_events

    store = backend.connect()
    label = "a label long enough to be worth deflating " * 4
    events = make_events("r", 4, label=label)
    ledger = chained(
        "idem-1",
        [EffectStatus.INTENDED, EffectStatus.DISPATCHED, EffectStatus.COMMITTED],
        run_id="r",
        receipt={"receipt_id": "rcpt-1", "note": label},
    )
    blob = (label * 3).encode()
    blob_digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    first = make_commit("r", 1, label.encode(), events=events[:2], ledger=ledger[:1])
    store.commit(first, 0)
    second = make_commit(
        "r", 2, label.encode(), events=events[2:], ledger=ledger[1:], blobs={blob_digest: blob}
    )
    store.commit(second, 1)  # on PostgreSQL, the one-statement path

    def read_back() -> None:
        assert store.get_checkpoint("r", first.checkpoint_digest) == first.envelope
        assert store.envelopes("r") == [first.envelope, second.envelope]
        assert store.get_blob(blob_digest) == blob and store.get_blobs([blob_digest]) == {
            blob_digest: blob
        }
        assert store.trace("r", events[-1].hash) == events
        assert store.ledger("r") == ledger

    read_back()

    def forms(sql: Any) -> list[Any]:
        return [
            sql.one("SELECT COUNT(*) FROM tether_checkpoints WHERE codec = 'd1'")[0],
            sql.one("SELECT COUNT(*) FROM tether_blobs WHERE codec = 'd1'")[0],
            sql.one("SELECT COUNT(*) FROM tether_trace WHERE packed IS NOT NULL")[0],
            sql.one("SELECT COUNT(*) FROM tether_ledger WHERE packed IS NOT NULL")[0],
        ]

    # Ledger rows with no receipt, terms or payload have nothing worth deflating.
    assert store.transaction(forms) == [2, 1, 4, 1]

    def make_plain(sql: Any) -> None:
        for digest, envelope, codec in sql.all(
            "SELECT checkpoint_digest, envelope, codec FROM tether_checkpoints"
        ):
            sql.run(
                "UPDATE tether_checkpoints SET envelope = ?, codec = NULL "
                "WHERE checkpoint_digest = ?",
                (unpack(bytes(envelope), codec, "envelope"), digest),
            )
        for digest, body, codec in sql.all("SELECT digest, body, codec FROM tether_blobs"):
            sql.run(
                "UPDATE tether_blobs SET body = ?, codec = NULL WHERE digest = ?",
                (unpack(bytes(body), codec, "blob"), digest),
            )
        for hash_, packed in sql.all("SELECT hash, packed FROM tether_trace"):
            sql.run(
                "UPDATE tether_trace SET data = ?, packed = NULL WHERE hash = ?",
                (inflate(bytes(packed)).decode(), hash_),
            )
        for entry in ledger:
            receipt, terms, payload = entry.column_texts()
            sql.run(
                "UPDATE tether_ledger SET receipt = ?, terms = ?, payload = ?, packed = NULL "
                "WHERE hash = ?",
                (receipt, terms, payload, entry.hash),
            )

    store.transaction(make_plain)
    assert store.transaction(forms) == [0, 0, 0, 0]
    read_back()
