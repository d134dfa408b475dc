"""SIGKILL trials with a blind adapter: what cannot be asked or deduplicated is never resent.

The file workspace can be asked by key, so its crash matrix always finds the
truth. A service that is neither idempotent nor queryable cannot: once
``dispatched`` is durable, recovery cannot tell "sent" from "not sent", and the
run must go to review instead of sending again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration import _blindkit as kit
from tether.core import EffectStatus, Phase
from tether.core._ledger import verify_ledger
from tether.core._state import GENESIS_HASH
from tether.crypto import Keyring
from tether.runtime import Checkpointer, CrashPoint
from tether.store import SQLiteStore

P = CrashPoint
# A blind trial is two short child processes; each cell runs a fifth of the
# main matrix's trials (4 on the first pass of `make test`, at least 2).
TRIALS = max(2, int(os.environ.get("TETHER_CRASH_TRIALS", "20")) // 5)
REPO = Path(__file__).resolve().parents[2]

# Where the process dies -> (phase after recovery, effects in the world).
# For an adapter that cannot be asked, `dispatched` gets a commit of its own
# right before the send: up to it, recovery knows nothing left and sends once;
# after it, "sent" and "not sent" look alike and the run goes to review.
EXPECTED = {
    (P.BEFORE_PROPOSAL, 1): (Phase.COMPLETED, 1),
    (P.BEFORE_PROPOSAL, 2): (Phase.COMPLETED, 1),  # after the advance: the receipt is durable
    (P.INTENT_PERSISTED, 1): (Phase.COMPLETED, 1),  # intended only: nothing left the process
    (P.EFFECT_SENT, 1): (Phase.NEEDS_REVIEW, 1),
    (P.RECEIPT_PERSISTED, 1): (Phase.NEEDS_REVIEW, 1),  # the advance died with the process
    (P.CHECKPOINT_WRITE, 1): (Phase.COMPLETED, 1),  # the genesis never landed: start again
    (P.CHECKPOINT_WRITE, 2): (Phase.COMPLETED, 1),  # the intent's checkpoint
    (P.CHECKPOINT_WRITE, 3): (Phase.COMPLETED, 1),  # the dispatched record: it never landed
    (P.CHECKPOINT_WRITE, 4): (Phase.NEEDS_REVIEW, 1),  # the advance after the send
    (P.CHECKPOINT_WRITE, 5): (Phase.COMPLETED, 1),  # the completion
}


def child(*argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, *["-O"] * sys.flags.optimize, "-m", "tests.integration._blindkit"]
    return subprocess.run(
        [*cmd, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


@dataclass(frozen=True, slots=True)
class Trial:
    """What one kill-and-recover trial left behind."""

    killed: int
    recovered: int
    stderr: str
    phase: Phase
    reason: str | None
    effects: int
    committed: int
    again: int  # a second recovery of the result: it must not fail either


def trial(base: Path, point: CrashPoint, hit: int) -> Trial:
    base.mkdir()
    kit.prepare(base)
    killed = child("start", str(base), point.value, str(hit))
    recovered = child("recover", str(base))
    again = child("recover", str(base))
    db, _, keyring = kit.paths(base)
    with SQLiteStore(db) as store:
        state = Checkpointer(store, Keyring.from_file(keyring)).load(kit.RUN_ID).state
        chain, _ = verify_ledger(
            kit.RUN_ID,
            store.ledger(kit.RUN_ID),
            state.ledger_head,
            state.ledger_length,
            GENESIS_HASH,
            orphans_possible=False,
        )
    cases = state.review_cases
    return Trial(
        killed=killed.returncode,
        recovered=recovered.returncode,
        stderr=recovered.stderr + again.stderr,
        phase=state.phase,
        reason=cases[0].reason if cases else None,
        effects=kit.effects(base),
        committed=sum(entry.status is EffectStatus.COMMITTED for entry in chain),
        again=again.returncode,
    )


@pytest.mark.parametrize(("point", "hit"), sorted(EXPECTED), ids=lambda v: str(v))
def test_a_blind_effect_is_sent_at_most_once_and_an_unknown_one_goes_to_review(
    point: CrashPoint, hit: int, tmp_path: Path
) -> None:
    """SIGKILL at the point, recover twice in fresh processes: at most one effect, never a loop."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        trials = list(pool.map(lambda n: trial(tmp_path / f"t{n}", point, hit), range(TRIALS)))
    phase, effects = EXPECTED[point, hit]
    for each in trials:
        assert each.killed == -9, each  # the child really died by SIGKILL at the point
        assert (each.recovered, each.again) == (0, 0), each.stderr
        assert (each.phase, each.effects) == (phase, effects), each
        if phase is Phase.COMPLETED:
            assert each.committed == 1
        else:
            assert each.committed == 0  # nothing claims a receipt the adapter never gave
            assert each.reason == "outcome_unknown", each


def test_the_table_names_every_pass_of_every_point(tmp_path: Path) -> None:
    """An unarmed run passes each point exactly as often as the table assumes."""
    from tether.runtime import CrashPlan

    seen: dict[CrashPoint, int] = {}
    for point in CrashPoint:
        base = tmp_path / point.value
        base.mkdir()
        kit.prepare(base)
        plan = CrashPlan(point, nth=10**6, mode="raise")
        with SQLiteStore(kit.paths(base)[0]) as store:
            kit.runtime(base, store, plan).start(kit.RUN_ID).run()
        seen[point] = plan.hits
    expected = {point: 0 for point in CrashPoint}  # content_before_mark: only with marks apart
    for point, hit in EXPECTED:
        expected[point] = max(expected[point], hit)
    assert seen == expected
