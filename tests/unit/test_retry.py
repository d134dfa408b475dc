"""The retry rules, case by case: progress, a claim's next move, back-off delay, recording a
resend, the stuck margin, the failed claims a new claim counts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether.core import OutcomeKind, RetrySettingsError
from tether.core._retry import (
    ALONE_AFTER,
    NO_PROGRESS,
    RECOVERY_COMMITS,
    AfterStep,
    after_step,
    claim_progressed,
    claimed_alone,
    failed_claims,
    in_flight_allowance,
    records_resend,
    resend_margin,
    retry_delay,
    step_progressed,
)

PROGRESS = {
    OutcomeKind.EXECUTED: True,
    OutcomeKind.REPLAYED: True,
    OutcomeKind.REJECTED: True,
    OutcomeKind.WAITING_FOR_APPROVAL: False,
    OutcomeKind.FROZEN: True,
    OutcomeKind.FINISHED: True,
    OutcomeKind.FAILED: True,
    OutcomeKind.CANCELLED: True,
    OutcomeKind.WAITED: False,
    OutcomeKind.VERIFIER_FAILED: True,
    OutcomeKind.IN_FLIGHT: False,
    OutcomeKind.RETRY_LATER: False,
    OutcomeKind.RECORDED: True,
    OutcomeKind.RECOVERED: True,
    OutcomeKind.OBSERVED: True,
}


def test_the_progress_table_names_every_outcome() -> None:
    """Every outcome kind has a row in the progress table, so a new kind must be decided here."""
    assert set(PROGRESS) == set(OutcomeKind)
    assert {kind for kind, moved in PROGRESS.items() if not moved} == NO_PROGRESS


@pytest.mark.parametrize(("kind", "moved"), sorted(PROGRESS.items()))
def test_a_resend_or_a_wait_is_not_progress(kind: OutcomeKind, moved: bool) -> None:
    """A step is progress by its outcome: in flight, later, a wait, or nothing asked are not."""
    assert step_progressed(kind) is moved


#: What a claim does after a step: (outcome, frozen now, met an outage) -> next.
AFTER = [
    (OutcomeKind.EXECUTED, False, False, AfterStep.GO_ON),
    # The outage is behind it (the step moved on); if the service is still down, the
    # next step meets it and is deferred.
    (OutcomeKind.EXECUTED, False, True, AfterStep.GO_ON),
    (OutcomeKind.OBSERVED, False, True, AfterStep.GO_ON),
    (OutcomeKind.RETRY_LATER, False, False, AfterStep.DEFER),
    (OutcomeKind.RETRY_LATER, False, True, AfterStep.DEFER),
    (OutcomeKind.IN_FLIGHT, False, False, AfterStep.DEFER),
    (OutcomeKind.WAITED, False, False, AfterStep.DEFER),
    (OutcomeKind.WAITING_FOR_APPROVAL, False, False, AfterStep.PARK),
    # Seed 141457: the recovery's look-up met the service down, then the write waited
    # for its approval; an approval landing at once must not send a claim straight back.
    (OutcomeKind.WAITING_FOR_APPROVAL, False, True, AfterStep.PARK_BACKED_OFF),
    (OutcomeKind.FROZEN, True, False, AfterStep.PARK),
    (OutcomeKind.FROZEN, True, True, AfterStep.PARK_BACKED_OFF),
    (OutcomeKind.RECOVERED, True, False, AfterStep.PARK),  # still frozen: a person decides
    (OutcomeKind.REJECTED, True, True, AfterStep.PARK_BACKED_OFF),  # a refused decision
    (OutcomeKind.FINISHED, False, False, AfterStep.GO_ON),  # the loop sees the run ended
]


@pytest.mark.parametrize(("kind", "frozen", "met_outage", "expected"), AFTER)
def test_a_claim_goes_on_parks_or_defers_by_the_step_it_took(
    kind: OutcomeKind, frozen: bool, met_outage: bool, expected: AfterStep
) -> None:
    """A person's turn parks the run (backed off if the claim met an outage), progress goes on,
    and anything else is deferred."""
    assert after_step(kind, frozen=frozen, met_outage=met_outage) is expected


@pytest.mark.parametrize("kind", sorted(PROGRESS))
def test_every_step_outcome_has_one_next_move_agreeing_with_the_progress_table(
    kind: OutcomeKind,
) -> None:
    """For every outcome, frozen or not, outage or not: parks exactly for a person, backed off
    exactly after an outage, and otherwise goes on exactly when the step was progress."""
    for frozen in (False, True):
        for met_outage in (False, True):
            got = after_step(kind, frozen=frozen, met_outage=met_outage)
            person = frozen or kind is OutcomeKind.WAITING_FOR_APPROVAL
            if person:
                parked = AfterStep.PARK_BACKED_OFF if met_outage else AfterStep.PARK
                assert got is parked, (kind, frozen, met_outage)
            else:
                assert got is (AfterStep.GO_ON if PROGRESS[kind] else AfterStep.DEFER), kind


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "jitter", "expected"),
    [
        (0, 1.0, 300.0, 0.0, 0.5),  # the first wait: half the base at the lowest draw
        (0, 1.0, 300.0, 0.5, 0.75),
        (1, 1.0, 300.0, 0.0, 1.0),  # doubled
        (3, 1.0, 300.0, 0.0, 4.0),
        (3, 1.0, 300.0, 0.999, 4.0 + 0.999 * 4.0),
        (8, 1.0, 300.0, 0.0, 128.0),  # 256, under the cap: half of it
        (9, 1.0, 300.0, 0.0, 150.0),  # 512 capped at 300: half of it
        (10_000, 1.0, 300.0, 0.5, 225.0),  # a huge streak neither overflows nor passes the cap
        (2, 0.05, 0.2, 0.0, 0.1),  # 0.2 capped at 0.2
        (0, 5.0, 1.0, 0.0, 0.5),  # a cap below the base wins
        (4, 0.0, 300.0, 0.7, 0.0),  # a zero base means no wait (the caller's choice)
    ],
)
def test_the_delay_doubles_per_attempt_is_capped_and_keeps_a_floor(
    attempt: int, base: float, cap: float, jitter: float, expected: float
) -> None:
    """Delay = half the capped exponential step, plus the draw times the other half."""
    assert retry_delay(attempt, base_s=base, cap_s=cap, jitter=jitter) == pytest.approx(expected)


@given(
    attempt=st.integers(min_value=0, max_value=200),
    base=st.floats(min_value=0.001, max_value=100.0),
    cap=st.floats(min_value=0.001, max_value=3600.0),
    jitter=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_every_delay_lies_between_half_the_step_and_the_step(
    attempt: int, base: float, cap: float, jitter: float
) -> None:
    """Whatever the draw, a delay is never under half the capped step nor over the cap."""
    step = min(cap, base * 2.0 ** min(attempt, 60))
    delay = retry_delay(attempt, base_s=base, cap_s=cap, jitter=jitter)
    assert step / 2 <= delay <= step and delay <= cap


@given(
    attempt=st.integers(min_value=0, max_value=100),
    jitter=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_the_floor_never_shrinks_from_one_attempt_to_the_next(attempt: int, jitter: float) -> None:
    """The lowest possible wait after attempt n+1 is at least the lowest after attempt n."""
    low = retry_delay(attempt, base_s=1.0, cap_s=300.0, jitter=0.0)
    assert retry_delay(attempt + 1, base_s=1.0, cap_s=300.0, jitter=jitter) >= low


@pytest.mark.parametrize(
    "bad",
    [
        {"attempt": -1},
        {"attempt": True},
        {"attempt": 1.5},
        {"base_s": -0.1},
        {"base_s": math.nan},
        {"cap_s": math.inf},
        {"cap_s": "1"},
        {"jitter": 1.0},
        {"jitter": -0.01},
        {"jitter": math.nan},
        {"jitter": False},
    ],
)
def test_a_setting_or_draw_out_of_range_is_refused(bad: dict[str, object]) -> None:
    """Negative, NaN, infinite, boolean or out-of-[0, 1) values raise a typed error."""
    args: dict[str, object] = {"attempt": 0, "base_s": 1.0, "cap_s": 10.0, "jitter": 0.5, **bad}
    with pytest.raises(RetrySettingsError):
        retry_delay(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("resent", "since", "limit", "records"),
    [
        (False, 0.0, None, True),  # the first resend: its fact must be durable first
        (False, 0.0, 900.0, True),
        (False, 5000.0, 900.0, True),
        (True, 0.0, None, False),  # no limit: nothing reads when the latest send began
        (True, 10**9, None, False),
        (True, 0.0, 900.0, False),  # resent moments ago: nothing new to record
        (True, 89.9, 900.0, False),  # within a tenth of the limit
        (True, 90.0, 900.0, True),  # a tenth of the limit old: refresh when it began
        (True, 1200.0, 900.0, True),
        (True, -5.0, 900.0, False),  # a clock that stepped back records nothing new
    ],
)
def test_a_resend_is_recorded_first_then_only_when_its_record_is_old(
    resent: bool, since: float, limit: float | None, records: bool
) -> None:
    """Only the first resend, or one whose record is a margin old, commits before the call."""
    assert records_resend(resent=resent, since_s=since, in_flight_limit_s=limit) is records


@pytest.mark.parametrize(
    ("limit", "resent", "margin", "allowance"),
    [
        (None, False, None, None),
        (None, True, None, None),
        (900.0, False, 90.0, 900.0),  # a write sent once: its send time is exact
        (900.0, True, 90.0, 990.0),  # resent: the latest send may be a margin younger
        (0.5, True, 0.05, 0.55),
    ],
)
def test_a_resent_key_is_judged_stuck_only_past_the_limit_plus_the_margin(
    limit: float | None, resent: bool, margin: float | None, allowance: float | None
) -> None:
    """The stuck allowance adds the resend margin for a resent write, and only then."""
    assert resend_margin(limit) == (None if margin is None else pytest.approx(margin))
    got = in_flight_allowance(limit, resent=resent)
    assert got == (None if allowance is None else pytest.approx(allowance))


#: (attempts on the mark, generation now, generation at the last claim, that claim
#: ended unclean) -> failed claims before the new one.
FAILED_CLAIMS = [
    # A worker that died after moving the run past its own commits made progress.
    (4, 13, 10, True, 0),
    (4, 10 + RECOVERY_COMMITS + 1, 10, True, 0),
    # Admission and one resend are a recovery's own: a poison send keeps counting.
    (4, 10 + RECOVERY_COMMITS, 10, True, 4),
    (4, 11, 10, True, 4),
    (4, 10, 10, True, 4),
    (0, 10, 10, True, 0),
    # No generation recorded (a mark from before, or never claimed): the count stands.
    (3, 99, None, True, 3),
    # A claim that ended cleanly (deferred, released, parked for a person) set the count.
    (3, 99, 10, False, 3),
    (0, 99, 10, False, 0),
]


@pytest.mark.parametrize(
    ("attempts", "generation", "claimed_at", "unclean", "failed"), FAILED_CLAIMS
)
def test_failed_claims_follows_the_table(
    attempts: int, generation: int, claimed_at: int | None, unclean: bool, failed: int
) -> None:
    """failed_claims restarts the count only after an unclean claim that moved the run on."""
    got = failed_claims(attempts, generation=generation, claimed_at=claimed_at, unclean=unclean)
    assert got == failed
    if claimed_at is not None and unclean and attempts:
        assert claim_progressed(generation, claimed_at) is (failed == 0)


@pytest.mark.parametrize(
    ("attempts", "generation", "claimed_at"),
    [(-1, 1, 1), (1, -1, 1), (True, 1, 1), (1, 1.0, 1), (1, 1, "1"), (1, 1, False)],
)
def test_failed_claims_refuses_what_is_not_a_count(
    attempts: object, generation: object, claimed_at: object
) -> None:
    """A count or generation that is not a whole number >= 0 is refused, not guessed."""
    with pytest.raises(RetrySettingsError):
        failed_claims(attempts, generation=generation, claimed_at=claimed_at, unclean=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("failed", "alone"), [(0, False), (1, False), (ALONE_AFTER, True), (ALONE_AFTER + 3, True)]
)
def test_a_run_whose_claims_died_twice_in_a_row_is_driven_alone(failed: int, alone: bool) -> None:
    """A run killed once beside others is claimed as usual; twice in a row, it is a suspect."""
    assert claimed_alone(failed) is alone
    assert ALONE_AFTER < 5  # the default max_attempts: a neighbour is never parked with it
