"""A worker whose clock runs behind cannot take a forgotten key's absence as final.

The reference effects service forgets keys after 5 s and says so; the key's
age against that retention is measured on the store's clock (SQLite's is
the host's own; PostgreSQL's the server's ``clock_timestamp()``), so a
recovering runtime whose injected clock is 30 s behind still sees the key
as too old to trust an absence, freezes the write for a person and sends
nothing twice. With clocks that agree and a key within retention, the
absence stays final and the write goes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tests.conftest import ManualClock, ScriptedAgent, make_policy, make_task, write
from tests.integration._services import EffectsService, effects_service
from tether.adapters import REFERENCE_PROFILE, HttpEffect
from tether.core import Phase
from tether.crypto import Keyring
from tether.runtime import CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import PostgresStore, SQLiteStore

KEYRING = Keyring.generate("k1")
RETENTION_S = 5.0
SKEW_S = 30.0


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(dialect, where): a real SQLite file, or a fresh schema in the test PostgreSQL."""
    if request.param == "sqlite":
        yield "sqlite", str(tmp_path / "tether.sqlite")
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield "postgres", in_schema(dsn, schema)


def open_store(where: tuple[str, str]) -> Any:
    dialect, at = where
    return SQLiteStore(at) if dialect == "sqlite" else PostgresStore(at)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EffectsService]:
    with effects_service(tmp_path) as running:
        running.mode(retention_s=RETENTION_S)
        yield running


def runtime(
    store: Any, http: HttpEffect, clock: ManualClock, crash: CrashPlan | None = None
) -> Runtime:
    """Open one ticket on the service; ``clock`` is the worker's own (injected) clock."""
    task = make_task(
        http.environment().state_fingerprint,
        allowed_kinds=["http.post"],
        allowed_paths=["tickets"],
        permissions=["service.write"],
        initial_environment={"namespace": "http"},
        verifier=None,
    )
    rule = {"risk": "low", "permission": "service.write", "needs_approval": False}
    post = write("tickets", "", kind="http.post", args={"json": {"title": "printer on fire"}})
    return Runtime(
        store=store,
        keyring=KEYRING,
        adapter=http,
        task=task,
        policy=make_policy(kinds={"http.post": rule}),
        agent=ScriptedAgent([post]),
        clock=clock,
        crash=crash or CrashPlan(),
    )


def http(service: EffectsService) -> HttpEffect:
    """The reference service, declared as it is: deduplicating, queryable, keys kept 5 s."""
    return HttpEffect(
        service.url, profile=replace(REFERENCE_PROFILE, retention_s=RETENTION_S), timeout_s=5
    )


def wall() -> datetime:
    return datetime.now(UTC)


def test_a_clock_30_s_behind_does_not_take_a_forgotten_key_as_absent(
    store_url: tuple[str, str], service: EffectsService
) -> None:
    """A key 5.5 s old by the store reads -24.5 s on a clock 30 s behind: still no resend."""
    store = open_store(store_url)
    with http(service) as effect, store:
        service.mode(drop_after_commit=True)  # the ticket lands, the reply is lost
        first = runtime(store, effect, ManualClock(wall())).start("r1")
        first.step()
        assert first.state.phase is Phase.PENDING
        assert len(service.tickets()) == 1
        service.mode(drop_after_commit=False)
        time.sleep(RETENTION_S + 0.5)  # the key outlives the service's memory of it
        other = {"Idempotency-Key": '"someone-else"'}
        service.client.post("/tickets", json={"title": "x"}, headers=other)  # purges old keys
        behind = ManualClock(wall() - timedelta(seconds=SKEW_S))
        again = runtime(store, effect, behind).recover("r1")
        again.step()
        assert again.state.phase is Phase.NEEDS_REVIEW
        case = again.state.review_cases[-1]
        assert case.reason == "outcome_unknown"
        assert "past the 5 s" in case.detail and "the larger of the store" in case.detail
    assert len(service.tickets()) == 2  # ours, once, and the other caller's


def test_clocks_that_agree_within_retention_still_send(
    store_url: tuple[str, str], service: EffectsService
) -> None:
    """A crash before the send leaves the key unknown to the service: absent, final, sent once."""
    store = open_store(store_url)
    with http(service) as effect, store:
        crash = CrashPlan(CrashPoint.INTENT_PERSISTED)
        first = runtime(store, effect, ManualClock(wall()), crash)
        with pytest.raises(SimulatedCrash):
            first.start("r1").step()
        assert service.tickets() == []
        again = runtime(store, effect, ManualClock(wall())).recover("r1")
        again.step()
        assert again.state.phase is Phase.RUNNING
        assert again.state.last_write is not None
    assert len(service.tickets()) == 1


def test_a_key_whose_first_row_predates_the_store_clock_has_no_store_age(
    store_url: tuple[str, str], service: EffectsService
) -> None:
    """One row of a key written before the store kept times (stored_us NULL): the store says nothing of its age, even though a later row has a time."""
    store = open_store(store_url)
    with http(service) as effect, store:
        service.mode(drop_after_commit=True)
        session = runtime(store, effect, ManualClock(wall())).start("r1")
        session.step()
        pending = session.state.pending
        assert pending is not None
        key, effect_digest = pending.idempotency_key, effect_of(session)
        assert store.key_age_s("r1", effect_digest, key) is not None  # every row stamped
        first = min(e.seq for e in store.ledger("r1") if e.idempotency_key == key)
        erase = "UPDATE tether_ledger SET stored_us = NULL WHERE run_id = 'r1' AND seq = "
        if store_url[0] == "sqlite":
            import sqlite3

            with sqlite3.connect(store_url[1]) as con:
                con.execute(erase + str(first))
        else:
            import psycopg

            with psycopg.connect(store_url[1], autocommit=True) as con:
                con.execute(erase + str(first))
        assert store.key_age_s("r1", effect_digest, key) is None  # the runtime's margin applies


def effect_of(session: Any) -> str:
    """The effect digest of the session's one pending write."""
    pending = session.state.pending
    return str(session.rt.effect_digest(pending.intent))
