"""PostgreSQL for tests: the DSN from the environment and a fresh schema per test.

Tests that need PostgreSQL skip with a one-line reason when
``TETHER_TEST_PG_DSN`` is unset, and fail instead when ``TETHER_REQUIRE_PG=1``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def pg_dsn() -> str:
    """The test server's DSN, or skip (fail under TETHER_REQUIRE_PG=1) when it is not set."""
    dsn = os.environ.get("TETHER_TEST_PG_DSN", "").strip()
    if dsn:
        return dsn
    if os.environ.get("TETHER_REQUIRE_PG") == "1":
        pytest.fail("TETHER_REQUIRE_PG=1 but TETHER_TEST_PG_DSN is not set")
    pytest.skip(
        "PostgreSQL tests need TETHER_TEST_PG_DSN (e.g. postgresql://postgres@127.0.0.1/test)"
    )


def in_schema(dsn: str, schema: str, **extra: str) -> str:
    """``dsn`` with ``search_path`` set to ``schema`` (libpq key=value form)."""
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, options=f"-csearch_path={schema}", **extra)


def url_in_schema(dsn: str, schema: str) -> str:
    """``dsn`` as a postgresql:// URL with ``search_path`` set to ``schema``."""
    if not dsn.startswith(("postgresql://", "postgres://")):
        pytest.skip("TETHER_TEST_PG_DSN is not a postgresql:// URL")
    joiner = "&" if "?" in dsn else "?"
    return f"{dsn}{joiner}options=-csearch_path%3D{schema}"


@contextmanager
def fresh_schema(dsn: str) -> Iterator[str]:
    """Create an empty schema, yield its name, drop it (and everything in it) afterwards."""
    import psycopg

    schema = f"tether_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
