"""Rewrite a SQLite store's rows in their plain stored form, for tests that edit rows by hand.

A store keeps envelopes, blobs, trace data and ledger documents deflated
(``tether.store._codec``, migration 17) and reads rows of either form. Tests
that damage a row with SQL (``replace(data, ...)``) first call
:func:`plain`, so their edit lands on the text as sealed; the packed form's
own damage is tested in ``tests/integration/test_packed_rows.py``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from tether.core import canonical_bytes
from tether.store._codec import inflate, unpack


def plain(db: Path | str) -> None:
    """Every packed row of the store at ``db`` rewritten as the plain row it stands for."""
    conn = sqlite3.connect(db)
    try:
        with conn:
            _rewrite(conn, "rowid", "?")
    finally:
        conn.close()


def plain_pg(conn: Any) -> None:
    """:func:`plain` for a PostgreSQL store: ``conn`` a psycopg connection in its schema."""
    _rewrite(conn, "ctid", "%s")


def _rewrite(conn: Any, rowid: str, mark: str) -> None:
    """The rewrite, over either driver: ``rowid`` names a row, ``mark`` is the placeholder."""
    for table, key, column in (
        ("tether_checkpoints", "checkpoint_digest", "envelope"),
        ("tether_blobs", "digest", "body"),
    ):
        rows = conn.execute(
            f"SELECT {rowid}, {column}, codec FROM {table} WHERE codec IS NOT NULL"
        ).fetchall()
        for row, stored, codec in rows:
            conn.execute(
                f"UPDATE {table} SET {column} = {mark}, codec = NULL WHERE {rowid} = {mark}",
                (unpack(bytes(stored), codec, f"{table} {key}"), row),
            )
    for row, packed in conn.execute(
        f"SELECT {rowid}, packed FROM tether_trace WHERE packed IS NOT NULL"
    ).fetchall():
        conn.execute(
            f"UPDATE tether_trace SET data = {mark}, packed = NULL WHERE {rowid} = {mark}",
            (inflate(bytes(packed)).decode("utf-8"), row),
        )
    for row, packed in conn.execute(
        f"SELECT {rowid}, packed FROM tether_ledger WHERE packed IS NOT NULL"
    ).fetchall():
        receipt, terms, payload = (
            None if doc is None else canonical_bytes(doc).decode("utf-8")
            for doc in json.loads(inflate(bytes(packed)))
        )
        conn.execute(
            f"UPDATE tether_ledger SET receipt = {mark}, terms = {mark}, payload = {mark}, "
            f"packed = NULL WHERE {rowid} = {mark}",
            (receipt, terms, payload, row),
        )
