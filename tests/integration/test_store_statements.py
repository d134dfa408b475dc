"""The SQL stores' public surface for integrations: statements of their own in the store's units of work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tether.core import StoreError
from tether.store import PostgresStore, SQLBase, SQLiteStore, SQLStatements

TABLE = "CREATE TABLE IF NOT EXISTS ext_rows (k TEXT PRIMARY KEY, v TEXT NOT NULL)"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLBase]:
    """Each SQL store tether ships, on a database of its own, with one table of the test's own."""
    opened: SQLBase
    if request.param == "sqlite":
        opened = SQLiteStore(tmp_path / "store.sqlite")
        with opened:
            opened.transaction(lambda tx: tx.run(TABLE))
            yield opened
        return
    dsn = pg_dsn()  # skips without a server, fails instead under TETHER_REQUIRE_PG=1
    with fresh_schema(dsn) as schema, PostgresStore(in_schema(dsn, schema)) as opened:
        opened.transaction(lambda tx: tx.run(TABLE))
        yield opened


def _rows(store: SQLBase) -> list[tuple[object, ...]]:
    return store.read(lambda tx: tx.all("SELECT k, v FROM ext_rows ORDER BY k"))


def test_a_transactions_statements_land_together(store: SQLBase) -> None:
    """Every statement of a transaction body is there afterwards, and the body's value comes back."""

    def body(tx: SQLStatements) -> int:
        tx.run("INSERT INTO ext_rows (k, v) VALUES (?, ?)", ("a", "1"))
        tx.run("INSERT INTO ext_rows (k, v) VALUES (?, ?)", ("b", "2"))
        return tx.run("UPDATE ext_rows SET v = ? WHERE k = ?", ("3", "b"))

    assert store.transaction(body) == 1
    assert _rows(store) == [("a", "1"), ("b", "3")]
    assert store.read(lambda tx: tx.one("SELECT v FROM ext_rows WHERE k = ?", ("a",))) == ("1",)
    assert store.read(lambda tx: tx.one("SELECT v FROM ext_rows WHERE k = ?", ("z",))) is None


def test_a_body_that_raises_lands_nothing(store: SQLBase) -> None:
    """A transaction whose body raises rolls back every statement it ran."""

    def body(tx: SQLStatements) -> None:
        tx.run("INSERT INTO ext_rows (k, v) VALUES (?, ?)", ("a", "1"))
        raise StoreError("the body refuses")

    with pytest.raises(StoreError, match="the body refuses"):
        store.transaction(body)
    assert _rows(store) == []


def test_insert_ignore_inserts_once_and_keeps_the_first_row(store: SQLBase) -> None:
    """The dialect's insert-if-absent counts 1 for a new row and 0, changing nothing, for an existing one."""

    def insert(v: str) -> int:
        return store.transaction(
            lambda tx: tx.run(tx.insert_ignore("ext_rows", ("k", "v")), ("a", v))
        )

    assert insert("first") == 1
    assert insert("second") == 0
    assert _rows(store) == [("a", "first")]


def test_a_driver_error_comes_back_as_a_typed_store_error(store: SQLBase) -> None:
    """A statement the database refuses raises tether's StoreError, not the driver's exception."""
    store.transaction(lambda tx: tx.run("INSERT INTO ext_rows (k, v) VALUES ('a', '1')"))
    with pytest.raises(StoreError):
        store.transaction(lambda tx: tx.run("INSERT INTO ext_rows (k, v) VALUES ('a', '2')"))
    assert _rows(store) == [("a", "1")]


def test_statements_kept_past_their_body_are_refused(store: SQLBase) -> None:
    """A handle used after its transaction returned raises StoreError instead of running outside it."""
    kept = store.transaction(lambda tx: tx)
    with pytest.raises(StoreError, match="outside the transaction"):
        kept.run("INSERT INTO ext_rows (k, v) VALUES ('a', '1')")
    assert _rows(store) == []


def test_statements_kept_past_their_body_are_refused_inside_a_later_unit(store: SQLBase) -> None:
    """A leaked handle is bound to its own unit of work, not to a later one on the same connection."""
    kept = store.transaction(lambda tx: tx)

    def later(tx: SQLStatements) -> None:
        tx.run("INSERT INTO ext_rows (k, v) VALUES ('b', '2')")
        kept.run("INSERT INTO ext_rows (k, v) VALUES ('a', '1')")

    with pytest.raises(StoreError, match="outside the transaction"):
        store.transaction(later)
    assert _rows(store) == []


def test_a_transaction_inside_a_read_is_refused(store: SQLBase) -> None:
    """A read holds no transaction, so a write body inside one is refused and lands nothing."""

    def inner(tx: SQLStatements) -> None:
        tx.run("INSERT INTO ext_rows (k, v) VALUES ('a', '1')")

    with pytest.raises(StoreError, match="inside a read"):
        store.read(lambda _: store.transaction(inner))
    assert _rows(store) == []
