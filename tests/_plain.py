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
            for table, key, column in (
                ("tether_checkpoints", "checkpoint_digest", "envelope"),
                ("tether_blobs", "digest", "body"),
            ):
                rows = conn.execute(
                    f"SELECT rowid, {column}, codec FROM {table} WHERE codec IS NOT NULL"
                ).fetchall()
                for rowid, stored, codec in rows:
                    conn.execute(
                        f"UPDATE {table} SET {column} = ?, codec = NULL WHERE rowid = ?",
                        (unpack(bytes(stored), codec, f"{table} {key}"), rowid),
                    )
            for rowid, packed in conn.execute(
                "SELECT rowid, packed FROM tether_trace WHERE packed IS NOT NULL"
            ).fetchall():
                conn.execute(
                    "UPDATE tether_trace SET data = ?, packed = NULL WHERE rowid = ?",
                    (inflate(bytes(packed)).decode("utf-8"), rowid),
                )
            for rowid, packed in conn.execute(
                "SELECT rowid, packed FROM tether_ledger WHERE packed IS NOT NULL"
            ).fetchall():
                receipt, terms, payload = (
                    None if doc is None else canonical_bytes(doc).decode("utf-8")
                    for doc in json.loads(inflate(bytes(packed)))
                )
                conn.execute(
                    "UPDATE tether_ledger SET receipt = ?, terms = ?, payload = ?, packed = NULL "
                    "WHERE rowid = ?",
                    (receipt, terms, payload, rowid),
                )
    finally:
        conn.close()


def plain_pg(conn: Any) -> None:
    """:func:`plain` for a PostgreSQL store: ``conn`` a psycopg connection in its schema."""
    for table, key, column in (
        ("tether_checkpoints", "checkpoint_digest", "envelope"),
        ("tether_blobs", "digest", "body"),
    ):
        rows = conn.execute(
            f"SELECT ctid, {column}, codec FROM {table} WHERE codec IS NOT NULL"
        ).fetchall()
        for ctid, stored, codec in rows:
            conn.execute(
                f"UPDATE {table} SET {column} = %s, codec = NULL WHERE ctid = %s",
                (unpack(bytes(stored), codec, f"{table} {key}"), ctid),
            )
    for ctid, packed in conn.execute(
        "SELECT ctid, packed FROM tether_trace WHERE packed IS NOT NULL"
    ).fetchall():
        conn.execute(
            "UPDATE tether_trace SET data = %s, packed = NULL WHERE ctid = %s",
            (inflate(bytes(packed)).decode("utf-8"), ctid),
        )
    for ctid, packed in conn.execute(
        "SELECT ctid, packed FROM tether_ledger WHERE packed IS NOT NULL"
    ).fetchall():
        receipt, terms, payload = (
            None if doc is None else canonical_bytes(doc).decode("utf-8")
            for doc in json.loads(inflate(bytes(packed)))
        )
        conn.execute(
            "UPDATE tether_ledger SET receipt = %s, terms = %s, payload = %s, packed = NULL "
            "WHERE ctid = %s",
            (receipt, terms, payload, ctid),
        )
