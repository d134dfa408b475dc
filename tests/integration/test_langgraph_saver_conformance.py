"""TetherSaver against langgraph-checkpoint-conformance, the suite LangGraph publishes for savers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.conformance", reason="needs the [langgraph] extra")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import CapabilityReport

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tether.crypto import Keyring
from tether.integrations.langgraph import TetherSaver
from tether.store import PostgresStore, SQLBase, SQLiteStore

#: What every saver must pass; the extended ones (copy_thread, prune,
#: delete_for_runs) TetherSaver does not implement and the suite skips.
BASE = {"put", "put_writes", "get_tuple", "list", "delete_thread"}


def _run_suite(name: str, open_store: Callable[[], SQLBase]) -> CapabilityReport:
    keyring = Keyring.generate("k1")

    async def factory() -> AsyncGenerator[TetherSaver, None]:
        store = open_store()  # a fresh database per capability suite
        try:
            yield TetherSaver(store, keyring)
        finally:
            store.close()

    registered = checkpointer_test(name=name)(factory)
    return asyncio.run(validate(registered))


def _check(report: CapabilityReport) -> None:
    failures = {cap: result.failures for cap, result in report.results.items() if result.failures}
    assert failures == {}
    assert {cap for cap, r in report.results.items() if r.passed} == BASE
    assert report.passed_all()


def test_sqlite_saver_passes_the_langgraph_conformance_suite(tmp_path: Path) -> None:
    """Every base capability of the LangGraph conformance suite passes on a SQLite store."""
    counter = itertools.count()
    report = _run_suite(
        "TetherSaver[sqlite]", lambda: SQLiteStore(tmp_path / f"lg{next(counter)}.sqlite")
    )
    _check(report)


@pytest.fixture
def pg_schemas() -> Iterator[Callable[[], SQLBase]]:
    """Opens PostgresStores, each in a fresh schema dropped after the test."""
    dsn = pg_dsn()
    with ExitStack() as stack:

        def open_one() -> SQLBase:
            schema = stack.enter_context(fresh_schema(dsn))
            return PostgresStore(in_schema(dsn, schema), max_connections=2)

        yield open_one


@pytest.mark.postgres
def test_postgres_saver_passes_the_langgraph_conformance_suite(
    pg_schemas: Callable[[], SQLBase],
) -> None:
    """Every base capability of the LangGraph conformance suite passes on a PostgreSQL store."""
    _check(_run_suite("TetherSaver[postgres]", pg_schemas))
