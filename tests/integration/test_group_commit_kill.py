"""A worker driving several runs, SIGKILLed inside a group commit: nothing doubles, all recover.

A real child process (``_groupchild``) runs one ``Worker`` with eight runs at
once on a SQLite store at ``synchronous=FULL`` (or on PostgreSQL); every step writes a file
through the run's own workspace. The child kills itself inside the store's
transaction at a checkpoint write (of any run, from the nth on) while that
transaction carries several runs' commits, so all of them are lost at once. A fresh
worker process then recovers every run. Checked: each run completed, each
workspace received exactly one write per step (a write made for a commit
that was lost would be a second write of that step), and every write's
receipt is in the ledger.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
from tests.integration._groupchild import open_store_of, run_ids, workspace
from tests.integration._services import REPO

RUNS = 8
STEPS = 6
LEASE_TTL_S = 1.0
CHILD_TIMEOUT_S = 120


def _child(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *["-O"] * sys.flags.optimize, "-m", "tests.integration._groupchild"]
        + [str(arg) for arg in args],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )


def _trial(home: Path, kill_at: int, url: str | None) -> int:
    """Seed, kill the worker inside a batch from the ``kill_at``-th checkpoint write, recover,
    check; the number of commits the lost transaction carried."""
    home.mkdir()
    if url is not None:
        (home / "store-url").write_text(url)
    seeded = _child("seed", home, RUNS, STEPS)
    assert seeded.returncode == 0, seeded.stderr
    killed = _child("work", home, STEPS, RUNS, LEASE_TTL_S, kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    batch = int((home / "batch").read_text())
    with open_store_of(home) as store:
        unfinished = [mark.run_id for mark in store.runs() if mark.phase != "completed"]
    assert unfinished  # the kill came mid-way
    time.sleep(LEASE_TTL_S * 1.5)  # the dead worker's leases expire
    recovered = _child("work", home, STEPS, RUNS, LEASE_TTL_S)
    assert recovered.returncode == 0, recovered.stderr
    with open_store_of(home) as store:
        for run_id in run_ids(RUNS):
            mark = store.get_mark(run_id)
            assert mark is not None and mark.phase == "completed", (run_id, mark)
            committed = sum(e.status.value == "committed" for e in store.ledger(run_id))
            with workspace(home, run_id) as ws:
                writes = ws.write_count()
            assert (writes, committed) == (STEPS, STEPS), run_id
            assert (home / "runs" / run_id / "notes.txt").read_text() == f"step {STEPS}\n"
    print(f"kill at {kill_at}: the transaction carried {batch} commit(s)")
    return batch


@pytest.mark.parametrize("where", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_sigkill_inside_a_batch_repeats_no_effect(tmp_path: Path, where: str) -> None:
    """Killed inside a transaction carrying several runs' commits, every run ends once, no write doubled."""
    batches = []
    for kill_at in (5, 17, 30):
        if where == "sqlite":
            batches.append(_trial(tmp_path / str(kill_at), kill_at, None))
            continue
        dsn = pg_dsn()
        with fresh_schema(dsn) as schema:
            batches.append(_trial(tmp_path / str(kill_at), kill_at, url_in_schema(dsn, schema)))
    assert min(batches) >= 2, batches  # each kill lost several runs' commits at once
