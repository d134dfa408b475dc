"""The runs list over runs the real runtime committed: what a row says, what a page costs.

A row says what one run's full view says (the same rules, fed from the
listing the commit recorded); a page is a fixed number of statements
whatever the number of runs, on SQLite and on PostgreSQL; a run committed
before listings existed is read from its checkpoint; under a keyring an
edited listing is caught; a page's version moves exactly when what it
shows does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tether.core import Phase
from tether.runtime import list_runs, open_run, runs_page
from tether.store import PostgresStore, SQLBase

GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, world: World) -> Iterator[SQLBase]:
    """The store the runtimes of the test commit to: the world's SQLite file, or a PostgreSQL schema."""
    if request.param == "sqlite":
        yield world.store()
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema, PostgresStore(in_schema(dsn, schema)) as pg:
        yield pg


def _populate(world: World, store: SQLBase, extra: int = 0) -> None:
    """One run waiting for an approval, one completed, one running, one failing, ``extra`` more."""
    guarded = world.runtime(
        ScriptedAgent([write("notes.txt", "v1\n", action_id="w1"), finish]),
        store=store,
        policy=make_policy(kinds=GUARDED),
    )
    session = guarded.start("run-approval")
    session.step()
    if session.state.phase is not Phase.PENDING:
        raise AssertionError(f"setup: expected pending, got {session.state.phase}")
    done = world.runtime(ScriptedAgent([finish]), store=store).start("run-done")
    while not done.state.phase.terminal:
        done.step()
    plain = world.runtime(ScriptedAgent([finish]), store=store)
    plain.start("run-failing")
    leases = {lease.run_id: lease for lease in store.claim_expired("w", 60.0, limit=5)}
    store.defer("run-failing", "w", leases["run-failing"].lease_version, 60.0, "adapter down")
    store.release_lease("run-approval", "w", leases["run-approval"].lease_version)
    for i in range(extra + 1):
        plain.start(f"run-plain-{i:03d}")


def test_a_list_row_says_what_the_runs_own_view_says(world: World, store: SQLBase) -> None:
    """Waiting for, needs a person, epoch and the recorded listing agree with open_run, run by run."""
    _populate(world, store)
    now = world.clock.now()
    page = runs_page(store, now=now)
    assert page is not None and page.after is None
    rows = {row.run_id: row for row in page.rows}
    assert sorted(rows) == ["run-approval", "run-done", "run-failing", "run-plain-000"]
    recorded = {listed.mark.run_id: listed.listing for listed in store.runs_page().runs}
    for run_id, row in rows.items():
        view = open_run(store, run_id, keyring=world.keyring, now=now)
        assert recorded[run_id] == view.listing, run_id
        assert (row.waiting_for, row.needs_person, row.epoch, row.phase) == (
            view.waiting_for,
            view.needs_person,
            view.state.epoch,
            view.state.phase.value,
        ), run_id
    assert rows["run-approval"].needs_person and "approval of w1" in str(
        rows["run-approval"].waiting_for
    )
    assert rows["run-failing"].needs_person and "adapter down" in str(
        rows["run-failing"].waiting_for
    )
    needing = runs_page(store, needs_person=True, now=now)
    assert needing is not None
    assert [r.run_id for r in needing.rows] == ["run-approval", "run-failing"]
    verified = runs_page(store, keyring=world.keyring, now=now)
    assert verified is not None and verified.rows == page.rows


def _counting(store: SQLBase) -> Callable[[], int]:
    """A counter of the statements ``store`` sends from now on (the test's own hook)."""
    sent: list[str] = []
    real = store._execute

    def execute(sql: str, params: Any = ()) -> Any:
        sent.append(sql)
        return real(sql, params)

    store._execute = execute  # type: ignore[method-assign]
    return lambda: len(sent)


def test_a_page_costs_the_same_statements_for_4_runs_as_for_40(
    world: World, store: SQLBase
) -> None:
    """Plain, needs-me and verified pages: a fixed count of statements, whatever the runs."""
    now = world.clock.now()
    counts: list[tuple[int, ...]] = []
    for extra in (0, 36):
        if extra:
            plain = world.runtime(ScriptedAgent([finish]), store=store)
            for i in range(1, extra + 1):
                plain.start(f"run-plain-{i:03d}")
        else:
            _populate(world, store)
        count = _counting(store)
        shapes = (
            {},
            {"needs_person": True},
            {"keyring": world.keyring},
            {"keyring": world.keyring, "needs_person": True},
        )
        per_page = []
        for shape in shapes:
            before = count()
            runs_page(store, now=now, limit=10, **shape)
            per_page.append(count() - before)
        del store._execute  # type: ignore[method-assign]
        counts.append(tuple(per_page))
    assert counts[0] == counts[1], counts
    assert counts[0][0] == 1 and counts[0][1] == 1, counts  # one SELECT, no checkpoint read
    # Verified: the page (envelopes included), the state parts its checkpoints name (one
    # query for the page), and each distinct policy its runs name (two here).
    assert counts[0][2] == counts[0][3] == 4, counts


def test_a_page_sends_one_statement_to_sqlite(world: World) -> None:
    """SQLite's own trace: a page of `tether runs` is one SELECT on the connection."""
    store = world.store()
    _populate(world, store, extra=20)
    traced: list[str] = []
    store._conn.set_trace_callback(traced.append)
    try:
        page = runs_page(store, now=world.clock.now(), limit=5)
        needing = runs_page(store, now=world.clock.now(), limit=5, needs_person=True)
    finally:
        store._conn.set_trace_callback(None)
    assert page is not None and len(page.rows) == 5 and page.after == page.rows[-1].run_id
    assert needing is not None and [r.run_id for r in needing.rows] == [
        "run-approval",
        "run-failing",
    ]
    assert len(traced) == 2 and all(t.startswith("SELECT") for t in traced), traced


def test_a_run_committed_without_a_listing_is_read_from_its_checkpoint(
    world: World, store: SQLBase
) -> None:
    """Rows from before listings existed (NULL columns) say the same, and --needs-me keeps them."""
    _populate(world, store)
    now = world.clock.now()
    before = runs_page(store, now=now)
    store.transaction(
        lambda sql: sql.run(
            "UPDATE tether_marks SET epoch = NULL, subject = NULL, pending_action = NULL, "
            "gate = NULL, approved_until = NULL"
        )
    )
    assert all(listed.listing is None for listed in store.runs_page().runs)
    after = runs_page(store, now=now)
    assert before is not None and after is not None and after.rows == before.rows
    needing = runs_page(store, needs_person=True, now=now)
    assert needing is not None
    assert [r.run_id for r in needing.rows] == ["run-approval", "run-failing"]


def test_under_a_keyring_a_listing_that_is_not_what_was_signed_is_refused(
    world: World, store: SQLBase
) -> None:
    """An edited listing column lists the run as unreadable when verified; others are unaffected."""
    _populate(world, store)
    store.transaction(
        lambda sql: sql.run(
            "UPDATE tether_marks SET gate = NULL WHERE run_id = ?", ("run-approval",)
        )
    )
    page = runs_page(store, keyring=world.keyring, now=world.clock.now())
    assert page is not None
    rows = {row.run_id: row for row in page.rows}
    edited = rows["run-approval"]
    assert edited.needs_person and "does not match its signed checkpoint" in str(edited.waiting_for)
    assert rows["run-done"].waiting_for is None and not rows["run-done"].needs_person


def test_a_pages_version_moves_exactly_when_what_it_shows_does(
    world: World, store: SQLBase
) -> None:
    """Unchanged: None for `unless`; a commit, a lease change or an approval lapsing: a new page."""
    _populate(world, store)
    now = world.clock.now()
    first = runs_page(store, now=now)
    assert first is not None
    assert runs_page(store, now=now, unless=first.version) is None
    assert runs_page(store, now=now + timedelta(seconds=5), unless=first.version) is None
    assert len(store.claim_expired("w2", 60.0, limit=1)) == 1  # its row shows the attempt
    leased = runs_page(store, now=now, unless=first.version)
    assert leased is not None and leased.version != first.version
    world.runtime(ScriptedAgent([finish]), store=store).start("run-new")
    grown = runs_page(store, now=now, unless=leased.version)
    assert grown is not None and "run-new" in [r.run_id for r in grown.rows]


def test_list_runs_still_reads_every_run_page_by_page(world: World, store: SQLBase) -> None:
    """The library call that wants them all gets them all, in run id order."""
    _populate(world, store, extra=4)
    rows = list_runs(store, now=world.clock.now())
    assert [r.run_id for r in rows] == sorted(r.run_id for r in rows)
    assert len(rows) == 8


def test_a_store_from_before_listings_lists_its_runs_and_fills_them_as_they_commit(
    world: World,
) -> None:
    """A store at schema 8 gains the listing columns NULL; the next commit of a run fills its own."""
    path = world.db
    rt = world.runtime(ScriptedAgent([finish, finish]))
    rt.start("run-old")
    with sqlite3.connect(path) as conn:
        conn.execute("DROP INDEX tether_marks_phase")
        conn.execute("DROP INDEX tether_marks_attention")
        for column in ("epoch", "subject", "pending_action", "gate", "approved_until"):
            conn.execute(f"ALTER TABLE tether_marks DROP COLUMN {column}")
        conn.execute("DELETE FROM tether_migrations WHERE version = 9")
    conn.close()
    store = world.store()
    assert store.schema_version() >= 9
    (listed,) = store.runs_page().runs
    assert listed.listing is None
    page = runs_page(store, now=world.clock.now())
    assert page is not None and page.rows[0].epoch == 1
    session = world.runtime(ScriptedAgent([finish, finish])).recover("run-old")
    session.step()
    (listed,) = store.runs_page().runs
    assert listed.listing is not None and listed.listing.epoch == session.state.epoch
