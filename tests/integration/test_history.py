"""A run's past is read by index and proven on the signed chains: recovery is flat, tamper still fails closed.

Recovery reads the checkpoint, the head rows and the pending write's
entries; a step looks one effect or one action id up by index. What a
decision reads is proven on the chain the signed checkpoint pins; what
nothing reads is checked by ``tether verify``, from the head to genesis.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests._plain import plain, plain_pg
from tests.conftest import ScriptedAgent, World, make_task, write
from tether.cli import main as tether_main
from tether.core import LedgerIntegrityError, Observation, OutcomeKind, TraceIntegrityError
from tether.core._ledger import seal_entry
from tether.runtime import (
    AgentContext,
    Checkpointer,
    CrashPlan,
    CrashPoint,
    Decision,
    Page,
    Runtime,
    SimulatedCrash,
    open_run,
)
from tether.store import SQLiteStore
from tether.testing import Sandbox

EXIT_INTEGRITY = 3


class CountingStore(SQLiteStore):
    """A real SQLite store that counts the statements it runs and the rows they return."""

    statements = 0
    rows = 0

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        found = super()._all(sql, params)
        self.statements += 1
        self.rows += len(found)
        return found

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        found = super()._one(sql, params)
        self.statements += 1
        self.rows += found is not None
        return found


def writer(context: AgentContext, observation: Observation) -> Decision:
    """Step ``n`` writes ``src/f<n>.txt``: a new file, a new effect, a new action id each time."""
    return write(f"src/f{context.plan_cursor}.txt", "x\n")(context, observation)


_SANDBOXES: dict[tuple[Path, str], Sandbox] = {}


def runtime(world: World, run_id: str, agent: Any, **overrides: Any) -> Runtime:
    """A runtime on the test's store over ``run_id``'s own sandbox (each run has one)."""
    key = (world.db, run_id)
    if key not in _SANDBOXES:
        _SANDBOXES[key] = Sandbox(
            {"notes.txt": "draft\n"}, instance_id=f"sbx-{run_id}", clock=world.clock.now
        )
    return world.runtime(agent, adapter=_SANDBOXES[key], **overrides)


def long_world(world: World) -> World:
    world.task = make_task(
        world.sandbox.environment().state_fingerprint, budgets={"proposals": 500, "steps": 500}
    )
    return world


def run(world: World, run_id: str, steps: int) -> None:
    session = runtime(world, run_id, ScriptedAgent([writer])).start(run_id)
    for _ in range(steps):
        assert session.step().kind is OutcomeKind.EXECUTED
    session.land_deferred()  # the last receipt rides on no next commit: land it, as release() does


def counted_recovery(world: World, run_id: str) -> tuple[int, int]:
    store = CountingStore(world.db)
    world.stores.append(store)
    rt = runtime(world, run_id, ScriptedAgent([writer]), store=store)
    store.statements = store.rows = 0
    rt.recover(run_id)
    return store.statements, store.rows


def test_recovery_reads_as_many_rows_after_40_steps_as_after_4(world: World) -> None:
    """The statements a recovery runs and the rows it reads do not grow with the history."""
    long_world(world)
    run(world, "short", 4)
    run(world, "long", 40)
    assert counted_recovery(world, "short") == counted_recovery(world, "long")


def test_recovery_of_a_pending_write_reads_as_much_whatever_came_before(world: World) -> None:
    """Crashed after its effect was sent, a write's recovery reads its entries, not the history."""
    long_world(world)
    counts = []
    for run_id, before in (("short", 2), ("long", 30)):
        run(world, run_id, before)
        rt = runtime(
            world, run_id, ScriptedAgent([writer]), crash=CrashPlan(CrashPoint.EFFECT_SENT)
        )
        with pytest.raises(SimulatedCrash):
            rt.recover(run_id).step()
        counts.append(counted_recovery(world, run_id))
    assert counts[0] == counts[1]


def trace_length(world: World, run_id: str = "r1") -> int:
    return (
        runtime(world, run_id, ScriptedAgent([writer])).checkpointer.load(run_id).state.trace_length
    )


def head_hashes(world: World, run_id: str) -> tuple[str, str, int]:
    state = runtime(world, run_id, ScriptedAgent([writer])).checkpointer.load(run_id).state
    return state.ledger_head, state.trace_head, state.ledger_length


def test_a_tampered_head_row_is_refused_on_recovery(world: World) -> None:
    """The ledger's head row and the trace's head event are checked by every recovery."""
    long_world(world)
    run(world, "r1", 6)
    ledger_head, trace_head, _ = head_hashes(world, "r1")
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        conn.execute(
            "UPDATE tether_ledger SET receipt = replace(receipt, 'x', 'y') WHERE hash = ?",
            (ledger_head,),
        )
    with pytest.raises(LedgerIntegrityError, match="altered"):
        runtime(world, "r1", ScriptedAgent([writer])).recover("r1")
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        conn.execute("DELETE FROM tether_ledger WHERE hash = ?", (ledger_head,))
    with pytest.raises(LedgerIntegrityError, match="lacks entry"):
        runtime(world, "r1", ScriptedAgent([writer])).recover("r1")
    run(world, "r2", 3)
    _, trace_head, _ = head_hashes(world, "r2")
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        conn.execute(
            "UPDATE tether_trace SET data = replace(data, ':', ': ') WHERE hash = ?",
            (trace_head,),
        )
    with pytest.raises(TraceIntegrityError):
        runtime(world, "r2", ScriptedAgent([writer])).recover("r2")


def verify(world: World, run_id: str, *extra: str) -> tuple[int, str]:
    keyring = world.db.parent / "keyring.json"
    world.keyring.write_file(keyring)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = tether_main(["verify", run_id, "--db", str(world.db), "--keyring", str(keyring)])
    return code, out.getvalue() + err.getvalue()


def test_verify_finds_a_tampered_middle_row_that_recovery_does_not_read(world: World) -> None:
    """An edited receipt deep in the ledger: recovery does not read it, tether verify exits 3."""
    long_world(world)
    run(world, "r1", 12)
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        changed = conn.execute(
            "UPDATE tether_ledger SET receipt = replace(receipt, 'x', 'y') "
            "WHERE run_id = 'r1' AND seq = 6"
        ).rowcount
    assert changed == 1
    runtime(world, "r1", ScriptedAgent([writer])).recover("r1")  # nothing it decides from
    code, text = verify(world, "r1")
    assert code == EXIT_INTEGRITY and "LedgerIntegrityError" in text and "altered" in text


def test_a_cleared_index_key_hides_nothing_from_verify(world: World) -> None:
    """An old row's effect key set to NULL (its look-up would miss it): tether verify exits 3."""
    long_world(world)
    run(world, "r1", 12)
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        changed = conn.execute(
            "UPDATE tether_ledger SET effect = NULL WHERE run_id = 'r1' AND seq = 3"
        ).rowcount
    assert changed == 1
    code, text = verify(world, "r1")
    assert code == EXIT_INTEGRITY and "effect index" in text


def test_a_cleared_target_key_hides_nothing_from_verify(world: World) -> None:
    """An old commit's target key set to NULL (A, B, A would miss it): tether verify exits 3."""
    long_world(world)
    run(world, "r1", 12)
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        changed = conn.execute(
            "UPDATE tether_ledger SET target = NULL WHERE run_id = 'r1' AND seq = "
            "(SELECT MIN(seq) FROM tether_ledger WHERE run_id = 'r1' AND target IS NOT NULL)"
        ).rowcount
    assert changed == 1
    code, text = verify(world, "r1")
    assert code == EXIT_INTEGRITY and "target index" in text


def test_an_old_effect_is_found_by_index_after_recovery_and_replayed(world: World) -> None:
    """A write of step 1 proposed again at step 30 after a recovery is replayed, not sent."""
    long_world(world)
    run(world, "r1", 30)
    sandbox = _SANDBOXES[(world.db, "r1")]
    writes = sandbox.write_count()
    again = ScriptedAgent([write("src/f0.txt", "x\n", "again")])
    outcome = runtime(world, "r1", again).recover("r1").step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REPLAYED, "effect_replayed")
    assert sandbox.write_count() == writes


def test_an_old_action_id_is_found_by_index_after_recovery(world: World) -> None:
    """Reusing step 1's action id at step 30, after a recovery, is refused as duplicate_action."""
    long_world(world)
    run(world, "r1", 30)
    reuse = ScriptedAgent([write("src/new.txt", "y\n", "a0")])
    outcome = runtime(world, "r1", reuse).recover("r1").step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "duplicate_action")


def test_a_forged_row_a_look_up_finds_fails_closed(world: World) -> None:
    """A correctly hashed row off the chain that names the proposed effect is refused, never used."""
    long_world(world)
    run(world, "r1", 8)
    rt = runtime(world, "r1", ScriptedAgent([write("src/f0.txt", "x\n", "again")]))
    real = rt.store.ledger("r1")[2]  # a committed entry of step 0's write
    forged = seal_entry(
        "r1",
        real.seq,
        real.prev_hash,
        idempotency_key="idem-forged",
        status=real.status,
        action_id="forged",
        intent_digest=real.intent_digest,
        receipt={"receipt_id": "rcpt-forged"},
        epoch=real.epoch,
        at=real.at,
        terms=real.terms,
    )
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        conn.execute(
            "INSERT INTO tether_ledger (run_id, hash, prev_hash, seq, idempotency_key, status, "
            "action_id, intent_digest, receipt, epoch, at, terms, effect, target) "
            "SELECT run_id, ?, prev_hash, seq, ?, status, ?, intent_digest, ?, epoch, at, terms, "
            "effect, target FROM tether_ledger WHERE hash = ?",
            (forged.hash, "idem-forged", "forged", '{"receipt_id":"rcpt-forged"}', real.hash),
        )
    session = rt.recover("r1")  # the forged row lies far below what a recovery reads
    sandbox = _SANDBOXES[(world.db, "r1")]
    writes = sandbox.write_count()
    with pytest.raises(LedgerIntegrityError, match="not on the signed chain"):
        session.step()
    assert sandbox.write_count() == writes


def test_inspect_pages_give_every_event_and_entry_exactly_once(world: World) -> None:
    """Paging the trace and the ledger newest first, 7 at a time, yields each row once, in order."""
    long_world(world)
    run(world, "r1", 12)
    store = world.store()
    whole = open_run(store, "r1", keyring=world.keyring, page=Page(limit=None))
    assert len(whole.trace) > 7 and len(whole.ledger) > 7
    events: list[Any] = []
    before: int | None = None
    while True:
        view = open_run(store, "r1", keyring=world.keyring, page=Page(7, trace_before=before))
        events = [*view.trace, *events]
        if view.older_trace is None:
            break
        before = view.older_trace
    entries: list[Any] = []
    before = None
    while True:
        view = open_run(store, "r1", keyring=world.keyring, page=Page(7, ledger_before=before))
        entries = [*view.ledger, *entries]
        if view.older_ledger is None:
            break
        before = view.older_ledger
    assert events == list(whole.trace) and entries == list(whole.ledger)


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = tether_main(list(argv))
    return code, out.getvalue()


def test_inspect_and_ledger_print_the_newest_first_and_name_the_older_page(world: World) -> None:
    """The CLI's first page is newest first, says how to get the next, and --all gets everything."""
    long_world(world)
    run(world, "r1", 12)
    keyring = world.db.parent / "keyring.json"
    world.keyring.write_file(keyring)
    where = ("r1", "--db", str(world.db), "--keyring", str(keyring))
    code, raw = cli("inspect", *where, "--json", "--limit", "5")
    shown = json.loads(raw)
    seqs = [e["seq"] for e in shown["trace"]]
    assert code == 0 and seqs == sorted(seqs, reverse=True) and len(seqs) == 5
    assert shown["page"]["trace_older"] == seqs[-1]
    older = json.loads(
        cli("inspect", *where, "--json", "--limit", "5", "--before", str(seqs[-1]))[1]
    )
    assert [e["seq"] for e in older["trace"]] == [s - 5 for s in seqs]
    everything = json.loads(cli("inspect", *where, "--json", "--all")[1])
    assert len(everything["trace"]) == shown["page"]["trace_events"]
    assert everything["page"]["trace_older"] is None
    code, text = cli("ledger", *where, "--limit", "4")
    assert code == 0 and "--before" in text and "newest 4 of" in text


def test_the_run_page_shows_the_newest_events_first_with_a_link_to_older(world: World) -> None:
    """The page lists 50 events newest first and links to the next older page and to all."""
    testclient = pytest.importorskip("starlette.testclient")
    from tether.web import WebConfig, create_app

    long_world(world)
    run(world, "r1", 40)
    token = "t" * 32
    app = create_app(
        WebConfig(store=str(world.db), token=token, keyring=world.keyring, hosts=("testserver",))
    )
    with testclient.TestClient(app) as client:
        client.get(f"/runs?token={token}")
        page = client.get("/runs/r1").text
        shown = [int(s) for s in re.findall(r'<span class="seq">#(\d+)</span>', page)]
        assert len(shown) == 50 and shown == sorted(shown, reverse=True)
        link = re.search(r'id="trace-older" href="([^"]+)"', page)
        assert link is not None and link.group(1) == f"/runs/r1?before={shown[-1]}"
        older = client.get(link.group(1)).text
        below = [int(s) for s in re.findall(r'<span class="seq">#(\d+)</span>', older)]
        assert below == list(range(shown[-1] - 1, 0, -1))
        whole = client.get("/runs/r1?all=1").text
        assert len(re.findall(r'<span class="seq">#(\d+)</span>', whole)) == trace_length(world)


def test_a_store_from_before_the_index_columns_is_migrated_and_read_by_them(world: World) -> None:
    """Migration 10 fills the effect and action id columns of rows written before it."""
    long_world(world)
    run(world, "r1", 6)
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        for index in ("tether_ledger_effect", "tether_trace_action", "tether_trace_landmark"):
            conn.execute(f"DROP INDEX {index}")
        for index in ("tether_checkpoints_generation", "tether_trace_seq"):
            conn.execute(f"DROP INDEX {index}")
        conn.execute("ALTER TABLE tether_ledger DROP COLUMN effect")
        conn.execute("ALTER TABLE tether_trace DROP COLUMN action_id")
        conn.execute("DELETE FROM tether_migrations WHERE version = 10")
    world.store().close()  # opening migrates: the columns come back, filled from the rows
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        filled = conn.execute(
            "SELECT COUNT(*) FROM tether_ledger WHERE effect IS NOT NULL"
        ).fetchone()[0]
        actions = conn.execute(
            "SELECT COUNT(*) FROM tether_trace WHERE action_id IS NOT NULL"
        ).fetchone()[0]
    assert filled == 18 and actions == 6  # 3 entries and 1 intent_persisted per write
    assert verify(world, "r1")[0] == 0
    reuse = ScriptedAgent([write("src/new.txt", "y\n", "a0")])
    outcome = runtime(world, "r1", reuse).recover("r1").step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REJECTED, "duplicate_action")


@pytest.mark.postgres
def test_a_postgresql_store_from_before_the_index_columns_is_migrated_too(world: World) -> None:
    """On PostgreSQL the backfill reads each old row's JSON, one with \\u0000 in it included."""
    import psycopg

    from tests.conformance._pg import fresh_schema, in_schema, pg_dsn, url_in_schema
    from tether.store import open_store

    long_world(world)
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        url = url_in_schema(dsn, schema)
        with open_store(url) as store:
            rt = runtime(world, "p1", ScriptedAgent([writer]), store=store)
            session = rt.start("p1")
            for _ in range(3):
                session.step()
            session.rt.agent = ScriptedAgent([write("src/z.txt", "nul \x00 here\n", "anul")])
            assert session.step().kind is OutcomeKind.EXECUTED  # its intent's data holds NUL
            session.land_deferred()  # its receipt too
        with psycopg.connect(in_schema(dsn, schema), autocommit=True) as conn:
            plain_pg(conn)  # rows as a tether of that time wrote them
            conn.execute("DROP INDEX tether_ledger_effect, tether_trace_action")
            conn.execute("ALTER TABLE tether_ledger DROP COLUMN effect")
            conn.execute("ALTER TABLE tether_trace DROP COLUMN action_id")
            conn.execute(
                "DROP INDEX tether_trace_landmark, tether_checkpoints_generation, tether_trace_seq"
            )
            conn.execute("DELETE FROM tether_migrations WHERE version = 10")
        with open_store(url) as store:  # migrates
            checkpointer = Checkpointer(store, world.keyring)
            state = checkpointer.load("p1").state
            assert len(checkpointer.verified_ledger(state)) == 12  # every row's key checked
            assert len(checkpointer.verified_trace(state)) == state.trace_length
            found = store.trace_for_action("p1", "anul")
            assert [e.kind for e in found] == ["intent_persisted"]
