"""The crash harness's rule: a recovered run's world and ledger judged against a clean run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.runtime import CrashPoint
from tether.testing.crash_harness import (
    Baseline,
    Cell,
    CrashReport,
    Settled,
    Trial,
    Verdict,
    judge,
)

CLEAN = {"file.write": 1, "message.send": 1}


def settled(phase: str = "completed", *reviews: str, **counts: dict[str, int]) -> Settled:
    return Settled(phase, reviews, counts.get("committed", CLEAN), counts.get("held", {}))


def test_a_recovered_run_like_the_clean_one_is_ok() -> None:
    """The same effects, each with its receipt, and the same end: ok, nothing counted against it."""
    found = judge(CLEAN, "completed", CLEAN, settled())
    assert found.verdict is Verdict.OK
    assert (found.duplicates, found.missing, found.lost, found.phantom) == ({}, {}, {}, {})


def test_an_effect_received_twice_is_a_duplicate() -> None:
    """One message more than the clean run sent is a duplicate, even with a receipt for it."""
    found = judge(CLEAN, "completed", {"file.write": 1, "message.send": 2}, settled())
    assert found.verdict is Verdict.DUPLICATE
    assert found.duplicates == {"message.send": 1}
    assert found.lost == {}


def test_an_effect_without_a_receipt_is_a_lost_receipt() -> None:
    """The world got the message, the completed run has no committed receipt for it."""
    found = judge(CLEAN, "completed", CLEAN, settled(committed={"file.write": 1}))
    assert found.verdict is Verdict.LOST
    assert found.lost == {"message.send": 1}


def test_a_receipt_without_an_effect_is_a_phantom() -> None:
    """The run holds a receipt for a message the world never received."""
    found = judge(CLEAN, "completed", {"file.write": 1, "message.send": 0}, settled())
    assert found.verdict is Verdict.PHANTOM
    assert (found.phantom, found.missing) == ({"message.send": 1}, {})


def test_an_effect_a_completed_run_never_made_is_missing() -> None:
    """The run completed as the clean one did, without the message and without a receipt for it."""
    found = judge(CLEAN, "completed", {"file.write": 1}, settled(committed={"file.write": 1}))
    assert found.verdict is Verdict.MISSING
    assert (found.missing, found.lost, found.phantom) == ({"message.send": 1}, {}, {})


def test_a_duplicate_of_one_kind_and_a_missing_effect_of_another_are_both_counted() -> None:
    """A second reply file and no message: a duplicate (the worse verdict) and a missing effect."""
    world = {"file.write": 2, "message.send": 0}
    found = judge(CLEAN, "completed", world, settled(committed={"file.write": 1}))
    assert found.verdict is Verdict.DUPLICATE
    assert (found.duplicates, found.missing) == ({"file.write": 1}, {"message.send": 1})


def test_effects_a_run_frozen_for_review_has_not_reached_are_not_missing() -> None:
    """Frozen over the message it could not confirm, the post after it is not made yet: review."""
    clean = {**CLEAN, "http.post": 1}
    state = settled(
        "needs_review", "outcome_unknown", committed={"file.write": 1}, held={"message.send": 1}
    )
    found = judge(clean, "completed", {"file.write": 1, "message.send": 0}, state)
    assert (found.verdict, found.missing) == (Verdict.REVIEW, {})


def test_a_run_that_ended_elsewhere_is_stuck_not_missing_what_it_did_not_make() -> None:
    """A recovered run that failed says itself it did not finish: stuck, nothing counted missing."""
    state = Settled("failed", (), {"file.write": 1}, {})
    found = judge(CLEAN, "completed", {"file.write": 1}, state)
    assert (found.verdict, found.missing) == (Verdict.STUCK, {})


@pytest.mark.parametrize("landed", [0, 1])
def test_an_uncertain_effect_held_for_review_is_review_not_a_loss(landed: int) -> None:
    """Frozen over the one email it could not confirm, landed or not: review, no loss."""
    state = settled(
        "needs_review", "outcome_unknown", committed={"file.write": 1}, held={"message.send": 1}
    )
    found = judge(CLEAN, "completed", {"file.write": 1, "message.send": landed}, state)
    assert (found.verdict, found.lost, found.phantom) == (Verdict.REVIEW, {}, {})


@pytest.mark.parametrize(
    "state",
    [
        Settled("needs_review", ("environment_ahead",), CLEAN, {}),
        Settled("running", (), CLEAN, {}),
        Settled("failed", (), CLEAN, {}),
    ],
    ids=["review-for-another-reason", "still-running", "failed"],
)
def test_a_run_that_ends_elsewhere_is_stuck(state: Settled) -> None:
    """Every effect once, but the run neither ended as the clean one nor waits on an uncertain effect."""
    assert judge(CLEAN, "completed", CLEAN, state).verdict is Verdict.STUCK


def report(*verdicts: Verdict) -> CrashReport:
    return report_of(
        *(Trial(CrashPoint.EFFECT_SENT, 1, f"r{n}", v, CLEAN) for n, v in enumerate(verdicts))
    )


def report_of(*trials: Trial) -> CrashReport:
    return CrashReport(
        app="m:f",
        store_url="sqlite:///x",
        workdir=Path("w"),
        trials=len(trials),
        recoveries=2,
        baseline=Baseline("completed", CLEAN, {CrashPoint.EFFECT_SENT: 1}),
        cells=(Cell(CrashPoint.EFFECT_SENT, 1, trials),),
        unreached=(),
    )


@pytest.mark.parametrize(
    ("verdicts", "passed", "worst"),
    [
        ((Verdict.OK, Verdict.REVIEW, Verdict.STUCK), True, Verdict.STUCK),
        ((Verdict.OK, Verdict.ERROR), False, Verdict.ERROR),
        ((Verdict.OK, Verdict.MISSING), False, Verdict.MISSING),
        ((Verdict.MISSING, Verdict.PHANTOM), False, Verdict.PHANTOM),
        ((Verdict.LOST, Verdict.DUPLICATE, Verdict.PHANTOM), False, Verdict.DUPLICATE),
    ],
)
def test_only_broken_promises_and_unjudged_trials_fail_the_report(
    verdicts: tuple[Verdict, ...], passed: bool, worst: Verdict
) -> None:
    """Review and stuck are reported but pass; a duplicate, a missing effect, a lost or phantom receipt or an error fail."""
    made = report(*verdicts)
    assert made.passed is passed
    assert made.cells[0].verdict is worst
    assert made.to_json()["passed"] is passed
    assert made.render().rstrip().endswith("PASS" if passed else "FAIL")


def test_a_trial_that_breaks_two_promises_names_both_in_the_report() -> None:
    """A trial with a duplicate and a missing effect: its problem line counts both, worst first."""
    world = {"file.write": 2, "message.send": 0}
    found = judge(CLEAN, "completed", world, settled(committed={"file.write": 1}))
    trial = Trial(
        CrashPoint.EFFECT_SENT,
        1,
        "r0",
        found.verdict,
        world,
        found.duplicates,
        found.lost,
        found.phantom,
        found.missing,
        "completed",
    )
    made = report_of(trial)
    assert (
        "DUPLICATE effect_sent hit 1 run r0: extra effects file.write=1; "
        "never made, though the clean run did message.send=1"
    ) in made.render()
    assert made.to_json()["totals"]["missing_effects"] == 1
