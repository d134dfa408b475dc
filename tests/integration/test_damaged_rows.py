"""One regression test per family of damage the fuzzer found reaching a reader untyped.

Each edits one column of a real store (four real runs, see ``_fuzzkit``) the
way someone with the file could, then calls the reader or command that used
to fail with a ValueError, a TypeError, the wrong exit code, or not at all.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._plain import plain
from tests.integration import _fuzzkit
from tether.cli import EXIT_ERROR, EXIT_INTEGRITY, main
from tether.core import CheckpointCorruptError, MigrationError, TraceIntegrityError
from tether.crypto import Keyring, Signer, TrustError
from tether.runtime import Checkpointer
from tether.store import SQLiteStore


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    copy = tmp_path / "home"
    shutil.copytree(_fuzzkit.base_for_process(), copy)
    yield copy


def edit(home: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    plain(home / "store.sqlite")  # the edit lands on the text as sealed (see tests/_plain.py)
    with sqlite3.connect(home / "store.sqlite", isolation_level=None) as conn:
        conn.execute(sql, params)
    conn.close()


@pytest.fixture
def store(home: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(home / "store.sqlite")
    yield opened
    opened.close()


def cli(home: Path, *argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(argv))
    assert "Traceback" not in err.getvalue()
    return code, err.getvalue()


def verify(home: Path, run_id: str) -> tuple[int, str]:
    db, keyring = str(home / "store.sqlite"), str(home / "keyring.json")
    return cli(home, "verify", run_id, "--db", db, "--keyring", keyring)


def loosen(home: Path, table: str) -> None:
    """Drop the table's keys and types, as a rebuilt table would have them."""
    with sqlite3.connect(home / "store.sqlite", isolation_level=None) as conn:
        conn.execute(f"CREATE TABLE t AS SELECT * FROM {table}")
        conn.execute(f"DROP TABLE {table}")
        conn.execute(f"ALTER TABLE t RENAME TO {table}")
    conn.close()


def test_a_migration_version_that_is_not_an_integer_is_a_migration_error(home: Path) -> None:
    """An edited tether_migrations row refuses the store with MigrationError, not ValueError."""
    loosen(home, "tether_migrations")
    edit(home, "UPDATE tether_migrations SET version = 'v2' WHERE version = 2")
    with pytest.raises(MigrationError):
        SQLiteStore(home / "store.sqlite")


def test_a_checkpoint_generation_stored_as_text_is_corruption(
    home: Path, store: SQLiteStore
) -> None:
    """newest_generation over a text generation raises CheckpointCorruptError."""
    edit(home, "UPDATE tether_checkpoints SET generation = 'x' WHERE run_id = 'done'")
    with pytest.raises(CheckpointCorruptError):
        store.newest_generation("done")


def test_an_envelope_stored_as_text_is_corruption(home: Path, store: SQLiteStore) -> None:
    """envelopes() refuses a row whose envelope is not bytes instead of failing in bytes()."""
    edit(
        home,
        "UPDATE tether_checkpoints SET envelope = CAST(envelope AS TEXT) WHERE run_id = 'wait'",
    )
    with pytest.raises(CheckpointCorruptError):
        store.envelopes("wait")


@pytest.mark.parametrize(
    ("column", "value"),
    [("received_at", "1.0e+308"), ("seq", "two"), ("document", "[1]"), ("document", "{")],
)
def test_a_malformed_inbox_row_is_corruption(
    home: Path, store: SQLiteStore, column: str, value: str
) -> None:
    """evidence() turns a bad time, a text seq or a non-object document into CheckpointCorruptError."""
    edit(home, f"UPDATE tether_inbox SET {column} = ? WHERE run_id = 'wait' AND seq = 2", (value,))
    with pytest.raises(CheckpointCorruptError):
        store.evidence("wait")


def test_appending_after_a_damaged_inbox_seq_is_refused_typed(
    home: Path, store: SQLiteStore
) -> None:
    """put_evidence refuses to number an entry after a text MAX(seq)."""
    edit(home, "UPDATE tether_inbox SET seq = 'x' WHERE run_id = 'wait' AND seq = 2")
    with pytest.raises(CheckpointCorruptError):
        store.put_evidence("wait", "approval", {"probe": 1})


@pytest.mark.parametrize(
    ("column", "value"), [("lease_version", "zero"), ("lease_expires_at", 1.5)]
)
def test_damaged_lease_columns_are_corruption(
    home: Path, store: SQLiteStore, column: str, value: object
) -> None:
    """check_lease reads its columns as exact integers or raises CheckpointCorruptError."""
    edit(
        home,
        "UPDATE tether_marks SET lease_owner = 'w', lease_expires_at = 1 WHERE run_id = 'live'",
    )
    edit(home, f"UPDATE tether_marks SET {column} = ? WHERE run_id = 'live'", (value,))
    with pytest.raises(CheckpointCorruptError):
        store.check_lease("live", 0)


@pytest.mark.parametrize(
    ("table", "column"),
    [("tether_blobs", "body"), ("tether_trace", "kind"), ("tether_ledger", "status")],
)
def test_text_that_is_not_utf8_makes_verify_exit_3(home: Path, table: str, column: str) -> None:
    """SQLite's undecodable text is an integrity failure (exit 3), not an unavailable store."""
    edit(home, f"UPDATE {table} SET {column} = CAST(X'FF' AS TEXT)")
    code, err = verify(home, "done")
    assert code == EXIT_INTEGRITY, err
    assert "CheckpointCorruptError" in err


@pytest.mark.parametrize("column", ["last_error", "state_version", "run_id"])
def test_one_undecodable_mark_row_does_not_fail_every_claim(
    home: Path, store: SQLiteStore, column: str
) -> None:
    """The claim skips (and holds) the damaged row and still hands out the healthy runs."""
    edit(home, f"UPDATE tether_marks SET {column} = CAST(X'EDA080' AS TEXT) WHERE run_id = 'live'")
    leases = store.claim_expired("w", 30.0, limit=4, phases=("running", "pending", "needs_review"))
    assert {lease.run_id for lease in leases} == {"wait", "frozen"}
    assert store.claim_expired("w2", 30.0, limit=4) == []  # the damaged one stays claimed


def test_one_malformed_mark_row_is_listed_and_hides_no_other_run(home: Path) -> None:
    """`tether runs` lists the damaged run as needing a person, beside every healthy one."""
    edit(home, "UPDATE tether_marks SET state_version = 'x' WHERE run_id = 'live'")
    db = str(home / "store.sqlite")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["runs", "--db", db, "--keyring", str(home / "keyring.json"), "--json"])
    rows = {row["run_id"]: row for row in json.loads(out.getvalue())["runs"]}
    assert code == 0
    assert set(rows) == set(_fuzzkit.RUNS)
    assert rows["live"]["needs_person"] and "malformed" in rows["live"]["waiting_for"]
    assert rows["live"]["generation"] is None
    assert all(row["generation"] is not None for name, row in rows.items() if name != "live")


def test_a_worker_ends_when_the_only_waiting_run_is_damaged(home: Path) -> None:
    """tether worker --idle-exit exits instead of retrying a failing claim forever."""
    url = f"sqlite:///{home / 'store.sqlite'}"
    edit(home, "UPDATE tether_marks SET run_id = CAST(X'FF' AS TEXT) WHERE run_id = 'live'")
    edit(home, "UPDATE tether_marks SET phase = 'completed' WHERE run_id IN ('wait', 'frozen')")
    started = time.monotonic()
    with _fuzzkit._home(home):
        code, err = cli(
            home,
            "worker",
            "--store",
            url,
            "--app",
            "tests.integration._fuzzkit:factory",
            "--poll",
            "0.01",
            "--idle-exit",
        )
    assert code == 0, err
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("run_id", _fuzzkit.RUNS)
def test_a_trace_row_pointing_at_the_head_ends_the_walk(home: Path, run_id: str) -> None:
    """A cycle planted in the trace: trace() returns within a second and verify exits 3."""
    keyring = Keyring.from_file(home / "keyring.json")
    with SQLiteStore(home / "store.sqlite") as store:
        state = Checkpointer(store, keyring).load(run_id).state
        first = store.trace(run_id, state.trace_head)[0]
    edit(
        home,
        "UPDATE tether_trace SET prev_hash = ? WHERE run_id = ? AND hash = ?",
        (state.trace_head, run_id, first.hash),
    )
    with SQLiteStore(home / "store.sqlite") as store:
        started = time.monotonic()
        walked = store.trace(run_id, state.trace_head)
        assert time.monotonic() - started < 1.0
        assert len(walked) == state.trace_length
        with pytest.raises(TraceIntegrityError):
            Checkpointer(store, keyring).verified_trace(state)
    started = time.monotonic()
    code, err = verify(home, run_id)
    assert code == EXIT_INTEGRITY, err
    assert time.monotonic() - started < 1.0


def test_approving_over_an_envelope_that_is_not_json_fails_typed(home: Path) -> None:
    """approve without --keyring reads the envelope unverified; garbage is CheckpointCorruptError."""
    edit(
        home,
        "UPDATE tether_checkpoints SET envelope = X'7B22FF' WHERE checkpoint_digest = "
        "(SELECT checkpoint_digest FROM tether_marks WHERE run_id = 'wait')",
    )
    db, key = str(home / "store.sqlite"), str(home / "approver.key")
    code, err = cli(home, "approve", "wait", "fix-calc", "--db", db, "--key", key, "--yes")
    assert code == EXIT_ERROR
    assert "CheckpointCorruptError" in err


def malformed(home: Path) -> None:
    """Bit flips that leave the file openable but one of its pages malformed (fuzz seed 80934)."""
    # The seed depends on the bytes the fuzz home holds: a change to what a run
    # stores (the ledger's effect digest moved 22054's flips), which pages a claim
    # reads (the claim index moved 43779's) or the file's layout (the history
    # indexes and the listing columns together moved 21225's) can move it again.
    _fuzzkit.damage(home, random.Random(80934))


def test_a_malformed_database_page_is_an_integrity_failure(home: Path) -> None:
    """SQLite's "database disk image is malformed" is CheckpointCorruptError, not a bare StoreError."""
    malformed(home)
    with SQLiteStore(home / "store.sqlite") as store, pytest.raises(CheckpointCorruptError):
        store.claim_expired("w", 30.0)


def test_signing_with_a_key_of_the_wrong_length_is_refused_at_load(home: Path) -> None:
    """A signing key file whose Ed25519 key is not 32 bytes is a TrustError when read, not a ValueError later."""
    doc = json.loads((home / "approver.key").read_text())
    doc["private_key"] = doc["private_key"][:20]
    (home / "approver.key").write_text(json.dumps(doc))
    with pytest.raises(TrustError):
        Signer.from_file(home / "approver.key")


def test_an_inbox_at_the_largest_seq_refuses_the_next_entry_typed(
    home: Path, store: SQLiteStore
) -> None:
    """put_evidence after seq 2**63-1 raises CheckpointCorruptError instead of OverflowError."""
    edit(home, "UPDATE tether_inbox SET seq = ? WHERE run_id = 'wait' AND seq = 2", (2**63 - 1,))
    with pytest.raises(CheckpointCorruptError):
        store.put_evidence("wait", "approval", {"probe": 1})


def test_a_worker_with_idle_exit_ends_on_a_store_it_can_never_claim_from(home: Path) -> None:
    """tether worker --idle-exit over a malformed database file exits instead of looping forever."""
    malformed(home)
    url = f"sqlite:///{home / 'store.sqlite'}"
    app = "tests.integration._fuzzkit:factory"
    try:
        with _fuzzkit._home(home), _fuzzkit._deadline(3.0):
            code, _ = cli(
                home, "worker", "--store", url, "--app", app, "--poll", "0.01", "--idle-exit"
            )
    except _fuzzkit.Hung:
        pytest.fail("tether worker --idle-exit was still claiming after 3 s")
    assert code == EXIT_ERROR  # it ends, and says the store failed


@pytest.mark.postgres
def test_a_trace_cycle_on_postgresql_ends_the_walk_too() -> None:
    """The same planted cycle in PostgreSQL: trace() ends within a second and verification fails."""
    import psycopg

    from tests.conformance._pg import fresh_schema, in_schema, pg_dsn, url_in_schema
    from tests.conftest import (
        CountingIds,
        ManualClock,
        ScriptedAgent,
        finish,
        make_policy,
        make_task,
        write,
    )
    from tether.runtime import Runtime
    from tether.store import open_store
    from tether.testing import Sandbox

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema, open_store(url_in_schema(dsn, schema)) as store:
        clock = ManualClock()
        sandbox = Sandbox({"notes.txt": "draft\n"}, instance_id="sbx-1", clock=clock.now)
        keyring = Keyring.generate("k1")
        Runtime(
            store=store,
            keyring=keyring,
            adapter=sandbox,
            task=make_task(sandbox.environment().state_fingerprint),
            policy=make_policy(),
            agent=ScriptedAgent([write("notes.txt", "x"), finish]),
            clock=clock,
            ids=CountingIds(),
        ).start("r1").run()
        state = Checkpointer(store, keyring).load("r1").state
        first = store.trace("r1", state.trace_head)[0]
        with psycopg.connect(in_schema(dsn, schema), autocommit=True) as conn:
            conn.execute(
                "UPDATE tether_trace SET prev_hash = %s WHERE run_id = 'r1' AND hash = %s",
                (state.trace_head, first.hash),
            )
        started = time.monotonic()
        assert len(store.trace("r1", state.trace_head)) == state.trace_length
        assert time.monotonic() - started < 1.0
        with pytest.raises(TraceIntegrityError):
            Checkpointer(store, keyring).verified_trace(state)


@pytest.mark.parametrize(
    "change",
    [
        "terms = NULL",  # stripped: the row hashes as an entry without terms
        'terms = replace(terms, \'"retry":"idempotent"\', \'"retry":"neither"\')',
        "terms = replace(terms, '\"sensitive\":false', '\"sensitive\":1')",
        "terms = '{\"adapter\": '",
        "terms = '[]'",
        'payload = \'{"content":"forged"}\' WHERE payload IS NOT NULL AND 1',
        "payload = 'null' WHERE status = 'intended' AND 1",
    ],
)
def test_an_edited_effect_description_in_the_ledger_fails_verify(home: Path, change: str) -> None:
    """A ledger row's terms and payload are covered by its hash: any edit is integrity failure."""
    where = "" if " WHERE " in change else " WHERE 1"
    edit(home, f"UPDATE tether_ledger SET {change}{where} AND run_id = 'done'")
    code, err = verify(home, "done")
    assert code == EXIT_INTEGRITY, err
    assert "LedgerIntegrityError" in err
