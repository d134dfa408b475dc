"""The simulator's database: reused from seed to seed as if new, read back incrementally."""

from __future__ import annotations

from dataclasses import astuple

from tether.testing.simulate import Result, _store, draw, simulate
from tether.testing.simulate._runner import Simulation
from tether.testing.simulate._scenario import RUN_ID
from tether.testing.simulate._store import SimDatabase, SimStore, borrow, give_back


def _seen(result: Result) -> tuple[object, ...]:
    violations = tuple(astuple(v) for v in result.violations)
    return (result.events, result.checks, result.phase, result.world, result.neighbour, violations)


def _rows(store: SimStore) -> dict[str, list[tuple[object, ...]]]:
    def read(q: object) -> dict[str, list[tuple[object, ...]]]:
        tables = [
            r[0]
            for r in q.all(  # type: ignore[attr-defined]
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
            )
        ]
        return {t: q.all(f"SELECT * FROM {t} ORDER BY rowid") for t in tables}  # type: ignore[attr-defined]

    return store.read(read)


def test_a_seed_on_a_reused_database_runs_as_on_a_new_one() -> None:
    """A seed run on a database another seed used first gives the same events, world and end."""
    _store._IDLE.clear()  # the first run below opens a new database
    fresh = simulate(draw(3))
    simulate(draw(11))
    again = simulate(draw(3))
    assert _seen(again) == _seen(fresh)


def test_a_database_given_back_holds_only_a_new_stores_rows() -> None:
    """After a simulation its database holds exactly the rows of a freshly migrated store."""
    new = SimDatabase()
    template = _rows(new.store(lambda: 0, None))
    sim = Simulation(draw(5), new)
    for event in sim.scenario.events:
        sim.apply(event)
    assert _rows(sim.observer) != template
    give_back(new, clean=True)
    assert _rows(borrow().store(lambda: 0, None)) == template


def test_a_database_left_inside_a_transaction_is_thrown_away() -> None:
    """A database whose connection is mid-transaction is closed, never lent to the next seed."""
    _store._IDLE.clear()
    database = borrow()
    store = database.store(lambda: 0, None)
    store._conn.execute("BEGIN IMMEDIATE")
    give_back(database, clean=True)
    assert borrow() is not database


def test_the_observer_reads_new_ledger_rows_and_everything_when_a_row_vanished() -> None:
    """The ledger read after each event equals a full read, also after a row was deleted."""
    sim = Simulation(draw(0), borrow())
    for event in sim.scenario.events:
        sim.apply(event)
        assert sim.ledger() == sim.observer.ledger(RUN_ID)
    assert len(sim.ledger()) > 1
    sim.observer.transaction(
        lambda q: q.run(
            "DELETE FROM tether_ledger WHERE rowid = (SELECT min(rowid) FROM tether_ledger)"
        )
    )
    assert sim.ledger() == sim.observer.ledger(RUN_ID)
    give_back(sim.database, clean=False)


def test_a_mark_is_read_again_once_any_store_of_the_simulation_wrote() -> None:
    """The observer's mark is its cached read until a store sharing the counter writes."""
    sim = Simulation(draw(0), borrow())
    first = sim.observer.read_mark(RUN_ID)
    assert first is not None and sim.observer.read_mark(RUN_ID) is first
    worker = sim.slots[0].store
    worker.transaction(
        lambda q: q.run(
            "UPDATE tether_marks SET attempts = attempts + 1 WHERE run_id = ?", (RUN_ID,)
        )
    )
    after = sim.observer.read_mark(RUN_ID)
    assert after is not None and after.attempts == first.attempts + 1
    give_back(sim.database, clean=False)
