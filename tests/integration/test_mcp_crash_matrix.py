"""The MCP gateway through tether's crash harness: SIGKILLed at every pass of every crash point.

Each trial is real processes: a gateway process (the harness's child, the
gateway's own call path) with the SDK upstream as its child over stdio,
killed with SIGKILL at one pass of one crash point, then recovered in a
fresh process that asks the same tool calls again. The upstream's SQLite
rows are what the world received: never two notes, never two charges.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="needs the [mcp] extra")

from tether.runtime import CrashPoint
from tether.testing.crash_harness import Verdict, run_crash_harness

pytestmark = pytest.mark.slow

P = CrashPoint
# Each trial costs a few real processes; TETHER_CRASH_TRIALS (20 by default) / 10 per pass.
TRIALS = max(1, int(os.environ.get("TETHER_CRASH_TRIALS", "20")) // 10)
#: The clean run's passes: four calls (a read, add_note, charge, add_note's replay) and the
#: finish; a checkpoint per step, the effects' two; content and mark in one database.
PASSES = {
    P.BEFORE_PROPOSAL: 5,
    P.INTENT_PERSISTED: 2,
    P.EFFECT_SENT: 2,
    P.RECEIPT_PERSISTED: 2,
}


def test_the_gateway_killed_at_every_crash_point_never_makes_an_effect_twice(
    tmp_path: Path,
) -> None:
    """Every pass of every point, killed and recovered: one note and one charge at most, and a review only where add_note's outcome is unknown."""
    report = run_crash_harness(
        "tests.integration._mcp_crash_app:app",
        trials=TRIALS,
        workdir=tmp_path / "work",
        jobs=2,
        recoveries=1,
    )
    assert report.passed, report.render()
    assert report.baseline.effects == {"add_note": 1, "charge": 1}
    passes = dict(report.baseline.passes)
    assert {p: passes[p] for p in PASSES} == PASSES, passes
    assert passes[P.CHECKPOINT_WRITE] >= sum(PASSES.values()) - PASSES[P.BEFORE_PROPOSAL]
    # Content and mark commit together; charge's server declares how long it keeps keys
    # (retentionSeconds), so its receipt is committed at once rather than deferred.
    assert report.unreached == (P.RECEIPT_DEFERRED, P.CONTENT_BEFORE_MARK)
    for cell in report.cells:
        for trial in cell.trials:
            assert trial.effects["add_note"] <= 1 and trial.effects["charge"] <= 1, trial
            if trial.verdict is Verdict.REVIEW:
                # Only add_note, which takes no key, killed between its send and its receipt.
                assert cell.point in {P.EFFECT_SENT, P.RECEIPT_PERSISTED, P.CHECKPOINT_WRITE}
                assert trial.effects == {"add_note": 1, "charge": 0}, trial
            else:
                assert trial.verdict is Verdict.OK, report.render()
                assert trial.phase == "completed"
                assert trial.effects == {"add_note": 1, "charge": 1}, trial
