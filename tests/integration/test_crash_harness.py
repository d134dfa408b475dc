"""The crash harness on real child processes: a sound app passes, lying adapters are caught.

Each trial is three real interpreters (killed by SIGKILL at the point, then
two recoveries), so the counts stay small: a tenth of the crash matrix's
trials per pass (2 on the first pass of ``make test``, 1 under ``-O``), and
the broken apps only at the window where their lie shows.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tether.runtime import CrashPoint
from tether.testing.crash_harness import CrashHarnessError, Verdict, run_crash_harness

P = CrashPoint
TRIALS = max(1, int(os.environ.get("TETHER_CRASH_TRIALS", "20")) // 10)
# Two writes (the reply file, then the message) and a finish: the clean run's
# passes of each point. Both adapters can be asked by key, so each receipt
# rides on the next commit (the message's intent, then the completion): four
# checkpoints. With content and mark in one database the mark is never apart,
# so content_before_mark is never passed.
PASSES = {
    P.BEFORE_PROPOSAL: 3,
    P.INTENT_PERSISTED: 2,
    P.EFFECT_SENT: 2,
    P.RECEIPT_DEFERRED: 2,
    P.RECEIPT_PERSISTED: 2,
    P.CHECKPOINT_WRITE: 4,
}
CLEAN = {"file.write": 1, "message.send": 1}


@pytest.mark.slow
def test_a_sound_app_passes_every_pass_of_every_point(tmp_path: Path) -> None:
    """Killed at each pass of each point and recovered twice: each effect once, each run completed."""
    report = run_crash_harness(
        "tether.testing.crash_example:app", trials=TRIALS, workdir=tmp_path, jobs=2
    )
    assert report.passed, report.render()
    assert dict(report.baseline.passes) == PASSES
    assert report.unreached == (P.CONTENT_BEFORE_MARK,)
    assert [(c.point, c.hit) for c in report.cells] == [
        (point, hit) for point, count in PASSES.items() for hit in range(1, count + 1)
    ]
    for cell in report.cells:
        assert len(cell.trials) == TRIALS
        for trial in cell.trials:
            assert trial.verdict is Verdict.OK, report.render()
            assert (trial.phase, dict(trial.effects)) == ("completed", CLEAN)


def test_a_blind_adapter_goes_to_review_and_still_passes(tmp_path: Path) -> None:
    """A message that cannot be confirmed freezes the run for review: reported, sent once, a pass."""
    report = run_crash_harness(
        "tether.testing.crash_example:blind_app",
        trials=TRIALS,
        points=[P.EFFECT_SENT],
        workdir=tmp_path,
        jobs=2,
    )
    assert report.passed, report.render()
    file_write, message = report.cells
    assert file_write.verdict is Verdict.OK  # the workspace can be asked by key
    assert message.verdict is Verdict.REVIEW
    for trial in message.trials:
        assert (trial.phase, trial.reviews) == ("needs_review", ("outcome_unknown",))
        assert dict(trial.effects) == CLEAN
    assert "review" in report.render()


def test_an_adapter_that_lies_about_deduplicating_is_caught(tmp_path: Path) -> None:
    """Claims idempotent and queryable but sends again: the harness counts the second message and fails."""
    report = run_crash_harness(
        "tests.integration._brokenapp:twice",
        trials=TRIALS,
        points=[P.EFFECT_SENT],
        workdir=tmp_path,
        jobs=2,
    )
    assert not report.passed
    file_write, message = report.cells
    assert file_write.verdict is Verdict.OK
    assert message.verdict is Verdict.DUPLICATE
    assert message.duplicates == TRIALS
    for trial in message.trials:
        assert dict(trial.effects) == {"file.write": 1, "message.send": 2}
        assert dict(trial.duplicates) == {"message.send": 1}
    assert report.to_json()["totals"]["duplicates"] == TRIALS
    assert "DUPLICATE effect_sent hit 2" in report.render()


def test_a_look_up_that_vouches_for_an_unsent_message_is_caught(tmp_path: Path) -> None:
    """Killed before the send, recovery trusts an invented receipt: a phantom receipt, and a fail."""
    report = run_crash_harness(
        "tests.integration._brokenapp:phantom",
        trials=1,
        points=[P.INTENT_PERSISTED],
        workdir=tmp_path,
    )
    assert not report.passed
    message = report.cells[1]
    assert message.verdict is Verdict.PHANTOM
    assert dict(message.trials[0].effects) == {"file.write": 1, "message.send": 0}


def test_a_look_up_that_reports_an_unsent_message_as_refused_is_caught(tmp_path: Path) -> None:
    """Killed before the send, recovery records a made-up refusal and completes: a missing effect."""
    report = run_crash_harness(
        "tests.integration._brokenapp:refusing",
        trials=1,
        points=[P.INTENT_PERSISTED],
        workdir=tmp_path,
    )
    assert not report.passed, report.render()
    file_write, message = report.cells
    assert file_write.verdict is Verdict.OK
    assert message.verdict is Verdict.MISSING
    (trial,) = message.trials
    assert (trial.phase, dict(trial.effects)) == ("completed", {"file.write": 1, "message.send": 0})
    assert dict(trial.missing) == {"message.send": 1}
    assert (dict(trial.lost), dict(trial.phantom)) == ({}, {})
    assert "MISSING_EFFECT intent_persisted hit 2" in report.render()


def test_a_trial_whose_world_cannot_be_counted_is_that_trials_error(tmp_path: Path) -> None:
    """effects() raising after one trial's recoveries makes that trial an error; the others are judged."""
    report = run_crash_harness(
        "tests.integration._brokenapp:uncountable",
        trials=1,
        points=[P.EFFECT_SENT],
        workdir=tmp_path,
    )
    assert not report.passed
    file_write, message = report.cells
    assert file_write.verdict is Verdict.OK, report.render()
    (trial,) = message.trials
    assert (trial.verdict, trial.phase, dict(trial.effects)) == (Verdict.ERROR, "completed", {})
    assert "app.effects(" in trial.detail and "the outbox's disk went away" in trial.detail


def test_a_trial_whose_world_cannot_be_prepared_is_that_trials_error(tmp_path: Path) -> None:
    """prepare() raising for one trial makes that trial an error; the others are judged."""
    report = run_crash_harness(
        "tests.integration._brokenapp:unpreparable",
        trials=1,
        points=[P.EFFECT_SENT],
        workdir=tmp_path,
    )
    assert not report.passed
    file_write, message = report.cells
    assert file_write.verdict is Verdict.OK, report.render()
    (trial,) = message.trials
    assert (trial.verdict, trial.phase) == (Verdict.ERROR, None)
    assert "app.prepare(" in trial.detail and "no space left" in trial.detail


def test_a_failed_report_keeps_its_temporary_directory() -> None:
    """Without a workdir, a failing report's runs and store stay on disk for a person to open."""
    report = run_crash_harness(
        "tests.integration._brokenapp:twice", trials=1, points=[P.EFFECT_SENT]
    )
    try:
        assert not report.passed
        assert (report.workdir / "tether.sqlite").exists()
    finally:
        shutil.rmtree(report.workdir)


def test_an_app_that_ignores_the_crash_plan_is_refused(tmp_path: Path) -> None:
    """A runtime built without the harness's plan never passes a point: a typed error says so."""
    with pytest.raises(CrashHarnessError, match="crash=crash"):
        run_crash_harness("tests.integration._brokenapp:deaf", workdir=tmp_path)


def test_a_workdir_that_is_a_file_is_a_typed_error(tmp_path: Path) -> None:
    """A workdir naming a file is refused with the harness's error, not a FileExistsError."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(CrashHarnessError, match="not a directory"):
        run_crash_harness("tether.testing.crash_example:app", workdir=afile)


def test_an_app_module_that_raises_on_import_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module that raises while being imported is refused with the harness's error, naming it."""
    (tmp_path / "explodes_on_import.py").write_text("raise RuntimeError('no config file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "explodes_on_import", raising=False)
    with pytest.raises(CrashHarnessError, match="RuntimeError: no config file"):
        run_crash_harness("explodes_on_import:app", workdir=tmp_path / "work")
