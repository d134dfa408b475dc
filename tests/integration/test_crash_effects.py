"""SIGKILL at every crash window of a run with three real adapters: never a second effect.

The support-desk run (``_deskkit``) writes a file, opens a ticket over HTTP
and sends an email over SMTP, on SQLite and on PostgreSQL. Each trial kills
the child at one pass through one crash point, recovers in a fresh process,
and counts what the workspace, the ticket service and the mailbox received.
An email whose send cannot be confirmed may freeze the run for review (a
mailbox look-up that finds nothing is not proof it never left); nothing is
ever sent twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
from tests.integration import _deskkit as kit
from tests.integration._services import EffectsService, effects_service, smtp_server
from tether.core import Phase
from tether.crypto import Keyring
from tether.runtime import Checkpointer, CrashPlan, CrashPoint
from tether.store import SQLiteStore, open_store

P = CrashPoint
TRIALS = int(os.environ.get("TETHER_CRASH_TRIALS", "20"))
REPO = Path(__file__).resolve().parents[2]

# How often an unarmed run passes each point (checked below): four steps,
# three effects, a checkpoint for the start and for each effect's intent;
# the file's receipt rides on the next intent's commit (the workspace is asked
# by key and keeps its keys for ever); the ticket's is committed at once (the
# service declares a retention, past which its key proves nothing), as are
# the email's own dispatched commit and its receipt's (a mailbox search
# cannot prove it was never sent); and the completion.
PASSES = {
    P.BEFORE_PROPOSAL: 4,
    P.INTENT_PERSISTED: 3,
    P.EFFECT_SENT: 3,
    P.RECEIPT_DEFERRED: 1,
    P.RECEIPT_PERSISTED: 3,
    P.CHECKPOINT_WRITE: 8,
    P.CONTENT_BEFORE_MARK: 0,
}
# The windows of the seed around each send (intent persisted, effect sent,
# receipt deferred, receipt persisted) get the full count of trials for the
# ticket (hit 2) and the email (hit 3), effect_sent and receipt_deferred for
# the file too; every other pass of every point a few.
CELLS = [(point, hit) for point, count in PASSES.items() for hit in range(1, count + 1)]
_WINDOWS = {P.INTENT_PERSISTED, P.EFFECT_SENT, P.RECEIPT_DEFERRED, P.RECEIPT_PERSISTED}


def trials_for(point: CrashPoint, hit: int) -> int:
    if point in {P.EFFECT_SENT, P.RECEIPT_DEFERRED} or (point in _WINDOWS and hit in {2, 3}):
        return TRIALS
    return min(2, TRIALS)


@dataclass
class World:
    """One service, one mail server and one store for a module's trials (runs kept apart)."""

    base: Path
    service: EffectsService
    smtp_port: int
    maildir: Path
    store_url: str


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    base = tmp_path_factory.mktemp(f"desk-{request.param}")
    kit.prepare_base(base)
    with effects_service(base) as service, smtp_server(base / "Maildir") as port:
        if request.param == "sqlite":
            yield World(
                base, service, port, base / "Maildir", f"sqlite:///{base / 'tether.sqlite'}"
            )
            return
        dsn = pg_dsn()
        with fresh_schema(dsn) as schema:
            yield World(base, service, port, base / "Maildir", url_in_schema(dsn, schema))


def child(
    world: World, stage: str, run_id: str, *crash: str, blind_mail: bool = False
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, *["-O"] * sys.flags.optimize, "-m", "tests.integration._deskkit"]
    cmd += [stage, str(world.base), run_id, world.store_url, world.service.url]
    cmd += [str(world.smtp_port), str(world.maildir), *crash]
    return subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        timeout=120,
        env={**os.environ, kit.BLIND_MAIL: "1" if blind_mail else "0"},
    )


@dataclass(frozen=True, slots=True)
class Trial:
    killed: int
    recovered: int
    stderr: str
    phase: Phase
    pending_kind: str | None
    reason: str | None
    received: tuple[int, int, int]
    #: The killed child's own stderr: why it ended, when it was not the SIGKILL.
    start_stderr: str = ""


def trial(world: World, point: CrashPoint, hit: int, *, blind_mail: bool = False) -> Trial:
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    kit.prepare(world.base, run_id)
    killed = child(world, "start", run_id, point.value, str(hit), blind_mail=blind_mail)
    recovered = child(world, "recover", run_id, blind_mail=blind_mail)
    with open_store(world.store_url) as store:
        keyring = Keyring.from_file(world.base / "keyring.json")
        state = Checkpointer(store, keyring).load(run_id).state
    cases = state.review_cases
    return Trial(
        killed=killed.returncode,
        recovered=recovered.returncode,
        stderr=recovered.stderr[-2000:],
        start_stderr=killed.stderr[-2000:],
        phase=state.phase,
        pending_kind=None if state.pending is None else state.pending.intent.kind,
        reason=cases[0].reason if cases else None,
        received=kit.effects(world.base, run_id, world.service.url, world.maildir),
    )


@pytest.mark.slow
@pytest.mark.parametrize(("point", "hit"), CELLS, ids=lambda v: str(v))
def test_every_window_of_every_effect_survives_sigkill(
    world: World, point: CrashPoint, hit: int
) -> None:
    """Kill at the point, recover in a fresh process: at most one of each effect, no loops."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda _: trial(world, point, hit), range(trials_for(point, hit))))
    for each in done:
        assert each.killed == -9, each  # the child really died by SIGKILL at the point
        assert each.recovered == 0, each.stderr
        files, tickets, _emails = each.received
        assert max(each.received) <= 1, each  # never a second effect anywhere
        if each.phase is Phase.COMPLETED:
            assert each.received == (1, 1, 1), each
        else:
            # Only an email can be unconfirmable: a mailbox that lacks it proves nothing.
            assert each.phase is Phase.NEEDS_REVIEW, each
            assert (each.pending_kind, each.reason) == ("email.send", "outcome_unknown"), each
            assert (files, tickets) == (1, 1), each


@pytest.mark.slow
@pytest.mark.parametrize(
    "point", [P.INTENT_PERSISTED, P.EFFECT_SENT, P.RECEIPT_PERSISTED], ids=lambda v: str(v)
)
def test_plain_smtp_freezes_every_uncertain_email_and_never_sends_twice(
    world: World, point: CrashPoint
) -> None:
    """No mailbox to ask: killed after the email may have left, every trial is in review."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda _: trial(world, point, 3, blind_mail=True), range(TRIALS)))
    for each in done:
        assert each.killed == -9, each
        assert each.recovered == 0, each.stderr
        assert each.received == (1, 1, 1), each  # the email left exactly once
        if point is P.INTENT_PERSISTED:
            # Plain SMTP commits intended alone: killed there, nothing had left.
            assert each.phase is Phase.COMPLETED, each
        else:
            assert each.phase is Phase.NEEDS_REVIEW, each
            assert (each.pending_kind, each.reason) == ("email.send", "outcome_unknown"), each


def test_the_table_names_every_pass_of_every_point(tmp_path: Path) -> None:
    """An unarmed run passes each point as often as the cells assume."""
    kit.prepare_base(tmp_path)
    with effects_service(tmp_path) as service, smtp_server(tmp_path / "Maildir") as port:
        seen = {}
        for point in CrashPoint:
            run_id = f"count-{point.value}"
            kit.prepare(tmp_path, run_id)
            combined = kit.adapters(tmp_path, run_id, service.url, port, tmp_path / "Maildir")
            plan = CrashPlan(point, nth=10**6, mode="raise")
            with SQLiteStore(tmp_path / f"{run_id}.sqlite") as store:
                outcome = kit.runtime(store, tmp_path, run_id, combined, plan).start(run_id).run()
            assert outcome.state.phase is Phase.COMPLETED
            seen[point] = plan.hits
    assert seen == PASSES
