"""A run that kills its worker's process, among healthy ones: only it is parked.

Real child processes (``_poisonchild``) run ``Worker(concurrency=4)`` on a
SQLite file (or PostgreSQL) over four runs that write a file at every step;
``run-00`` ends the process from its second step on (its agent, or its
adapter as the write is sent). The worker is started again, as a supervisor
would, until it exits with nothing left to claim. Checked: the poison run is
parked at the mark after ``max_attempts`` claims that moved nothing, and each
healthy run completed with exactly one write per step. A second case kills
a one-thread worker right after every write it sends: each claim settled the
write the last one left and sent the next, so the run is never parked.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
from tests.integration._groupchild import open_store_of, run_ids, workspace
from tests.integration._services import REPO

RUNS = 4
STEPS = 4
LEASE_TTL_S = 1.0
#: Worker processes started at most: the poison run's claims, each healthy run's.
STARTS = 16
MAX_ATTEMPTS = 5  # the worker's default


def _child(module: str, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *["-O"] * sys.flags.optimize, "-m", f"tests.integration.{module}"]
        + [str(arg) for arg in args],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _until_idle(home: Path, *args: object) -> list[int]:
    """Start the worker again after each death, until it exits idle; each start's exit code."""
    codes = []
    for _ in range(STARTS):
        done = _child("_poisonchild", *args)
        codes.append(done.returncode)
        if done.returncode == 0:
            return codes
        time.sleep(LEASE_TTL_S * 1.5)  # the dead worker's leases expire
    raise AssertionError(f"the worker never ran out of runs: {codes}")


def _healthy_runs_completed_once(
    home: Path, healthy: list[str], steps: int, codes: list[int]
) -> None:
    with open_store_of(home) as store:
        for run_id in healthy:
            mark = store.get_mark(run_id)
            assert mark is not None and mark.phase == "completed", (run_id, mark, codes)
            committed = sum(e.status.value == "committed" for e in store.ledger(run_id))
            with workspace(home, run_id) as ws:
                assert (ws.write_count(), committed) == (steps, steps), run_id


def _poison_trial(home: Path, how: str, url: str | None) -> list[int]:
    home.mkdir()
    if url is not None:
        (home / "store-url").write_text(url)
    seeded = _child("_groupchild", "seed", home, RUNS, STEPS)
    assert seeded.returncode == 0, seeded.stderr
    codes = _until_idle(home, "poison", home, STEPS, 4, LEASE_TTL_S, how)
    _healthy_runs_completed_once(home, run_ids(RUNS)[1:], STEPS, codes)
    with open_store_of(home) as store:
        mark = store.get_mark("run-00")
        assert mark is not None and mark.phase in {"running", "pending"}, mark
        assert mark.attempts == MAX_ATTEMPTS, mark  # parked at the mark: no claim takes it
    with workspace(home, "run-00") as ws:
        assert ws.write_count() == 1  # its poison write was never made
    if how == "send":  # `tether runs` says who must act on the parked write, and how
        listed = _child("_poisonchild", "list", home)
        (row,) = [row for row in json.loads(listed.stdout)["runs"] if row["run_id"] == "run-00"]
        assert row["needs_person"] and "a worker to settle w2" in row["waiting_for"], row
        assert "tether resume" in row["waiting_for"], row
    return codes


@pytest.mark.parametrize("how", ["decide", "send"])
@pytest.mark.parametrize("where", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_run_that_kills_the_process_parks_alone(tmp_path: Path, where: str, how: str) -> None:
    """A run ending its worker's process is parked after max_attempts; its neighbours all complete."""
    if where == "sqlite":
        codes = _poison_trial(tmp_path / "home", how, None)
    else:
        dsn = pg_dsn()
        with fresh_schema(dsn) as schema:
            codes = _poison_trial(tmp_path / "home", how, url_in_schema(dsn, schema))
    assert codes.count(3) >= MAX_ATTEMPTS, codes  # each death was the poison run's


def test_a_worker_killed_mid_step_every_time_never_parks_a_run_that_moves(tmp_path: Path) -> None:
    """SIGKILLed after every write it sends, a worker still brings the run to its end."""
    home = tmp_path / "home"
    home.mkdir()
    steps = MAX_ATTEMPTS + 3
    seeded = _child("_groupchild", "seed", home, 1, steps)
    assert seeded.returncode == 0, seeded.stderr
    codes = _until_idle(home, "midstep", home, steps, LEASE_TTL_S)
    assert codes.count(-signal.SIGKILL) == steps, codes  # killed in every step
    _healthy_runs_completed_once(home, ["run-00"], steps, codes)
