"""Rows kept deflated (migration 17) read back as sealed, old plain rows still load, damage fails closed."""

from __future__ import annotations

import contextlib
import io
import sqlite3
from collections.abc import Callable

import pytest

from tests._plain import plain
from tests.conftest import ScriptedAgent, World, finish, write
from tether.cli import EXIT_INTEGRITY
from tether.cli import main as tether_main
from tether.core import (
    CheckpointCorruptError,
    LedgerIntegrityError,
    Phase,
    TetherError,
    TraceIntegrityError,
)
from tether.store import SQLiteStore
from tether.store._codec import DEFLATE, PACK_MAX, inflate, pack, unpack
from tether.store._schema import migrations

NEWEST = max(version for version, _ in migrations("BLOB"))


def agent() -> ScriptedAgent:
    return ScriptedAgent(
        [write("notes.txt", "one"), write("notes.txt", "two", "b"), write("a.txt", "3"), finish]
    )


def verify(world: World, run_id: str = "r1") -> tuple[int, str]:
    keyring = world.db.parent / "keyring.json"
    world.keyring.write_file(keyring)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = tether_main(["verify", run_id, "--db", str(world.db), "--keyring", str(keyring)])
    return code, out.getvalue() + err.getvalue()


def counts(world: World) -> dict[str, int]:
    with sqlite3.connect(world.db) as conn:
        found = {
            "envelopes": conn.execute(
                "SELECT COUNT(*) FROM tether_checkpoints WHERE codec = 'd1'"
            ).fetchone()[0],
            "blobs": conn.execute(
                "SELECT COUNT(*) FROM tether_blobs WHERE codec = 'd1'"
            ).fetchone()[0],
            "trace": conn.execute(
                "SELECT COUNT(*) FROM tether_trace WHERE packed IS NOT NULL AND data = ''"
            ).fetchone()[0],
            "ledger": conn.execute(
                "SELECT COUNT(*) FROM tether_ledger WHERE packed IS NOT NULL "
                "AND receipt IS NULL AND terms IS NULL AND payload IS NULL"
            ).fetchone()[0],
        }
    conn.close()
    return found


def test_a_run_keeps_its_rows_deflated_and_reads_them_back_as_sealed(world: World) -> None:
    """Envelopes, blobs, trace data and ledger documents are stored deflated; recovery and verify read them whole."""
    session = world.runtime(agent()).start("r1")
    session.run(max_steps=2)
    assert all(n > 0 for n in counts(world).values()), counts(world)
    store = world.store()
    digest = store.get_mark("r1").checkpoint_digest  # type: ignore[union-attr]
    envelope = store.get_checkpoint("r1", digest)
    assert envelope is not None and envelope.startswith(b'{"checksum":')
    assert store.envelopes("r1")[-1] == envelope
    again = world.runtime(agent()).recover("r1")
    assert again.state == session.state
    again.run()
    assert again.state.phase is Phase.COMPLETED
    code, text = verify(world)
    assert code == 0, text


def test_rows_written_before_migration_17_still_load_and_the_run_finishes(world: World) -> None:
    """A store of schema 16 (plain rows, no codec columns) is migrated; its run recovers and verifies."""
    session = world.runtime(agent()).start("r1")
    session.run(max_steps=2)
    before = session.state
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        # The claim's indexes as migration 12 left them: migrations 18 and 20 index
        # claimed_gen and parked, which a store of schema 16 lacks.
        for index in ("tether_marks_suspect", "tether_marks_parked", "tether_marks_due"):
            conn.execute(f"DROP INDEX {index}")
        conn.execute(
            next(
                sql
                for version, statements in migrations("BLOB")
                if version == 12
                for sql in statements
                if sql.startswith("CREATE INDEX tether_marks_due")
            )
        )
        for table, column in (
            ("tether_checkpoints", "codec"),
            ("tether_blobs", "codec"),
            ("tether_trace", "packed"),
            ("tether_ledger", "packed"),
            ("tether_marks", "claimed_gen"),  # migration 18's
            ("tether_marks", "parks_at"),  # migration 20's
            ("tether_marks", "parked"),
        ):
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("DELETE FROM tether_migrations WHERE version >= 17")
    conn.close()
    again = world.runtime(agent()).recover("r1")  # opening the store applies migration 17 on
    assert world.store().schema_version() == NEWEST
    assert again.state.binding == before.binding and again.state.ledger_head == before.ledger_head
    again.run()
    assert again.state.phase is Phase.COMPLETED
    code, text = verify(world)
    assert code == 0, text


def flip(stored: bytes) -> bytes:
    """``stored`` with one byte in its middle changed."""
    at = len(stored) // 2
    return stored[:at] + bytes([stored[at] ^ 0x5A]) + stored[at + 1 :]


def damage_trace_head(conn: sqlite3.Connection, head: str) -> None:
    (packed,) = conn.execute("SELECT packed FROM tether_trace WHERE hash = ?", (head,)).fetchone()
    conn.execute("UPDATE tether_trace SET packed = ? WHERE hash = ?", (flip(packed), head))


def damage_ledger_head(conn: sqlite3.Connection, head: str) -> None:
    (packed,) = conn.execute("SELECT packed FROM tether_ledger WHERE hash = ?", (head,)).fetchone()
    conn.execute("UPDATE tether_ledger SET packed = ? WHERE hash = ?", (flip(packed), head))


def plain_beside_packed(conn: sqlite3.Connection, head: str) -> None:
    conn.execute("UPDATE tether_ledger SET receipt = '{}' WHERE hash = ?", (head,))


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (damage_trace_head, TraceIntegrityError),
        (damage_ledger_head, LedgerIntegrityError),
        (plain_beside_packed, LedgerIntegrityError),
    ],
)
def test_a_damaged_packed_head_row_fails_recovery_closed(
    world: World, damage: Callable[[sqlite3.Connection, str], None], error: type[TetherError]
) -> None:
    """A head row whose packed bytes were changed (or given plain text beside them) is a typed integrity error."""
    session = world.runtime(agent()).start("r1")
    session.run(max_steps=2)
    head = session.state.ledger_head if error is LedgerIntegrityError else session.state.trace_head
    with sqlite3.connect(world.db) as conn:
        damage(conn, head)
    conn.close()
    with pytest.raises(error):
        world.runtime(agent()).recover("r1")


@pytest.mark.parametrize("table", ["tether_checkpoints", "tether_blobs"])
@pytest.mark.parametrize("how", ["flip", "codec"])
def test_a_damaged_deflated_envelope_or_blob_fails_closed(
    world: World, table: str, how: str
) -> None:
    """Changed deflated bytes, or a codec this tether does not know, fail recovery with CheckpointCorruptError."""
    session = world.runtime(agent()).start("r1")
    session.run(max_steps=2)
    column = "envelope" if table == "tether_checkpoints" else "body"
    with sqlite3.connect(world.db) as conn:
        rows = conn.execute(f"SELECT rowid, {column} FROM {table} WHERE codec = 'd1'").fetchall()
        for rowid, stored in rows:
            if how == "flip":
                conn.execute(
                    f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (flip(stored), rowid)
                )
            else:
                conn.execute(f"UPDATE {table} SET codec = 'zz' WHERE rowid = ?", (rowid,))
    conn.close()
    with pytest.raises(CheckpointCorruptError):
        world.runtime(agent()).recover("r1")
    code, _ = verify(world)
    assert code == EXIT_INTEGRITY


def test_the_codec_keeps_short_or_incompressible_bytes_as_they_are() -> None:
    """Bytes that do not shrink, or are too short or too long to pay, are stored with no codec."""
    text = b'{"idempotency_key":"idem-1","intent_digest":"sha256:' + b"ab" * 40 + b'"}'
    stored, codec = pack(text)
    assert codec == DEFLATE and len(stored) < len(text)
    assert unpack(stored, codec, "x") == inflate(stored) == text
    assert pack(b"{}") == (b"{}", None)
    noise = bytes(range(256)) * 2
    assert pack(noise)[1] is None or len(pack(noise)[0]) < len(noise)
    huge = b"a" * (PACK_MAX + 1)
    assert pack(huge) == (huge, None)


def test_an_inflating_row_past_the_bound_is_damage() -> None:
    """A stored stream that would inflate past PACK_MAX is refused, not read into memory whole."""
    import zlib

    from tether.store import _codec

    packer = zlib.compressobj(
        6, zlib.DEFLATED, -_codec._WBITS, _codec._MEM_LEVEL, zdict=_codec._DICTIONARY
    )
    bomb = packer.compress(b"\0" * (PACK_MAX + 10)) + packer.flush()
    with pytest.raises(ValueError, match="DEFLATE"):
        inflate(bomb)
    with pytest.raises(CheckpointCorruptError):
        unpack(bomb, DEFLATE, "blob x")


def test_a_listing_reads_deflated_envelopes(world: World) -> None:
    """A page of runs with their envelopes returns each as sealed, whatever its stored form."""
    world.runtime(agent()).start("r1").run(max_steps=1)
    store: SQLiteStore = world.store()
    page = store.runs_page(limit=10, envelopes=True)
    (listed,) = page.runs
    assert listed.envelope == store.get_checkpoint("r1", listed.mark.checkpoint_digest)
