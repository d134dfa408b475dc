"""Retrying a run that made no progress, as pure functions of values.

A step that only resends or waits is not progress: the adapter said "later"
or "still in flight", or the agent asked for nothing. The worker then gives
the run up for a while and drives another, and the wait grows with each such
attempt in a row:

=================================  ============================================
question                           rule
=================================  ============================================
was this step progress?            :func:`step_progressed`: not for an
                                   in-flight or retry-later answer, a wait for
                                   a person, or an agent that asked for nothing;
                                   every other outcome moved the run on
what does the claim do next?       :func:`after_step`: a run waiting for a
                                   person is parked (backed off all the same
                                   if the claim met an adapter that was down);
                                   progress goes on; anything else is deferred
how long before the next attempt?  :func:`retry_delay`: ``base_s * 2**attempt``
                                   capped at ``cap_s``; half of it fixed, half
                                   scaled by the caller's random draw in [0, 1)
must a resend be recorded again?   :func:`records_resend`: the first resend,
                                   always; a write already recorded as resent,
                                   only once its record is older than the
                                   margin (:func:`resend_margin`) the in-flight
                                   limit allows
when is a resent key stuck?        :func:`in_flight_allowance`: the adapter's
                                   limit, plus that margin for a resent write
how many failed claims precede     :func:`failed_claims`: none when the last
this one?                          claim's worker died after it moved the run
                                   past what a recovery commits of its own
                                   (:data:`RECOVERY_COMMITS`); else the count
                                   on the mark. A claim is taken while that is
                                   below ``max_attempts``, and counts itself
=================================  ============================================

The jitter keeps a floor of half the step ("equal jitter"): a run of draws
near zero still backs off, so sends stay bounded while an adapter is down.
Core takes no randomness of its own; the draw is the caller's.

Why a resend need not be recorded each time: the fact that matters for
safety, "this write was sent more than once" (so a later refusal reads as an
unknown outcome, never a rejection), is already durable after the first
resend. What a repeat would refresh is only when the latest send began, which
the in-flight limit counts from. So a repeat within the margin records
nothing (no checkpoint, no ledger row), and a resent key is judged stuck only
past the limit plus that margin: never earlier than the limit after the latest
send, at most a margin later.
"""

from __future__ import annotations

import math
from enum import StrEnum

from tether.core._errors import TetherError
from tether.core._transition import OutcomeKind

#: Outcomes of a step that did not move the run on.
NO_PROGRESS = frozenset(
    {
        OutcomeKind.IN_FLIGHT,
        OutcomeKind.RETRY_LATER,
        OutcomeKind.WAITING_FOR_APPROVAL,
        OutcomeKind.WAITED,
    }
)

#: The share of an adapter's in-flight limit within which a repeated resend
#: records nothing: a resent key is judged stuck at most this much late.
RESEND_MARGIN_SHARE = 0.1

#: The commits a claim may make of its own before its run moves on: one, the
#: recorded resend of a write its run holds (the recovery's admission, its
#: "recovered" event, rides on the session's first commit and is no commit of
#: its own). A resend is not progress: an effect whose send kills the worker
#: commits no more than this, so its run still reaches ``max_attempts`` and is
#: parked. Settling a write and proposing the next is two: progress.
RECOVERY_COMMITS = 1

#: Failed claims in a row (claims whose worker died holding the lease without
#: moving the run) after which a worker of many threads drives the run alone: a
#: run killed once beside others is claimed as usual (most deaths are a deploy or
#: a host, not the run), one killed twice is a suspect, so a run that ends its
#: process kills its neighbours at most twice, below the default ``max_attempts``.
ALONE_AFTER = 2

# 2**60 seconds is past any cap; larger exponents only risk overflow.
_MAX_DOUBLINGS = 60


class RetrySettingsError(TetherError):
    """A back-off setting or draw is out of range (negative, NaN, a draw outside [0, 1])."""


def step_progressed(kind: OutcomeKind) -> bool:
    """Whether a step with outcome ``kind`` moved the run on.

    Decided from what the step did, never from whether a checkpoint was
    written: a step that records a resend and is told "later" wrote one and
    still did nothing.
    """
    return kind not in NO_PROGRESS


class AfterStep(StrEnum):
    """What a worker's claim does after one step (:func:`after_step`)."""

    #: The step moved the run on: step again within this claim.
    GO_ON = "go_on"
    #: A person must act: let the run go until evidence lands, claimable at once then.
    PARK = "park"
    #: A person must act, and the claim met an adapter that was down: let the run go
    #: until evidence lands, and not before the back-off either.
    PARK_BACKED_OFF = "park_backed_off"
    #: No progress (later, in flight, nothing asked): let the run go for the back-off.
    DEFER = "defer"


def after_step(kind: OutcomeKind, *, frozen: bool, met_outage: bool) -> AfterStep:
    """What a claim does after a step with outcome ``kind``.

    ``frozen``: the run is in ``needs_review`` now; ``met_outage``: an adapter
    could not be asked during this claim (a look-up no outcome reports, the
    recovery's check for a store put back, included). A park keeps the back-off
    of an outage the claim met: the back-off is the run's (on its mark), so an
    answer landing a moment later sends no worker's claim straight back to a
    service just found down (issue 25, seed 141457).
    """
    if kind is OutcomeKind.WAITING_FOR_APPROVAL or frozen:
        return AfterStep.PARK_BACKED_OFF if met_outage else AfterStep.PARK
    if step_progressed(kind):
        return AfterStep.GO_ON
    return AfterStep.DEFER


def retry_delay(attempt: int, *, base_s: float, cap_s: float, jitter: float) -> float:
    """Seconds to wait before trying a run again after ``attempt`` earlier tries in a row.

    ``attempt`` 0 is the first wait. The step is ``base_s * 2**attempt``
    capped at ``cap_s``; the delay is half the step plus ``jitter`` (a draw
    in [0, 1)) times the other half, so it lies in [step / 2, step).
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise RetrySettingsError(f"attempt must be a whole number >= 0, not {attempt!r}")
    for name, value in (("base_s", base_s), ("cap_s", cap_s)):
        if not _seconds(value):
            raise RetrySettingsError(f"{name} must be a finite number >= 0, not {value!r}")
    if not _number(jitter) or not 0.0 <= jitter < 1.0:
        raise RetrySettingsError(f"jitter must be a draw in [0, 1), not {jitter!r}")
    step = min(cap_s, base_s * 2.0 ** min(attempt, _MAX_DOUBLINGS))
    return step / 2 + jitter * step / 2


def resend_margin(in_flight_limit_s: float | None) -> float | None:
    """How long after a recorded resend an identical one records nothing; ``None``: always.

    Without an in-flight limit nothing reads when a send began, so no repeat
    needs recording.
    """
    if in_flight_limit_s is None:
        return None
    return in_flight_limit_s * RESEND_MARGIN_SHARE


def records_resend(*, resent: bool, since_s: float, in_flight_limit_s: float | None) -> bool:
    """Whether a resend must commit ``resent`` and its start before the call.

    ``resent``: the signed pending write already says it was sent more than
    once; ``since_s``: seconds since the send it records began.
    """
    if not resent:
        return True  # the fact a later refusal is read by must be durable first
    margin = resend_margin(in_flight_limit_s)
    return margin is not None and since_s >= margin


def in_flight_allowance(in_flight_limit_s: float | None, *, resent: bool) -> float | None:
    """How long after its recorded send a key may stay in flight before it is stuck.

    A resent write's latest send may have begun up to the margin after the
    one recorded (repeats within it record nothing), so the margin is added:
    never judged stuck before the limit has passed since the latest send.
    """
    margin = resend_margin(in_flight_limit_s)
    if in_flight_limit_s is None or margin is None or not resent:
        return in_flight_limit_s
    return in_flight_limit_s + margin


def failed_claims(attempts: int, *, generation: int, claimed_at: int | None, unclean: bool) -> int:
    """How many claims in a row before this one failed, as a new claim of the run counts them.

    ``attempts``: the count on the mark (each claim counted itself before
    anything ran); ``generation``: the mark's now; ``claimed_at``: the mark's
    generation when the last claim took it (``None``: never recorded);
    ``unclean``: that claim's lease ran out unreleased (its worker died or hung).
    A worker that dies says nothing of how its claim went, so its commits
    say it: one that moved the run past a recorded resend made progress, and is no failure (a deploy that kills workers mid-step parks
    nothing that moves). A claim that ended cleanly set the count itself.
    """
    for name, value in (("attempts", attempts), ("generation", generation)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RetrySettingsError(f"{name} must be a whole number >= 0, not {value!r}")
    if claimed_at is not None and (isinstance(claimed_at, bool) or not isinstance(claimed_at, int)):
        raise RetrySettingsError(f"claimed_at must be a generation or None, not {claimed_at!r}")
    if unclean and claimed_at is not None and claim_progressed(generation, claimed_at):
        return 0
    return attempts


def claimed_alone(failed: int) -> bool:
    """Whether a run with ``failed`` claims in a row behind it (:func:`failed_claims`)
    is driven alone by a worker of many threads (a suspect)."""
    return failed >= ALONE_AFTER


def claim_progressed(generation: int, claimed_at: int) -> bool:
    """Whether a claim that took its run at generation ``claimed_at`` moved it on, at ``generation``.

    More commits than a recovery makes of its own (:data:`RECOVERY_COMMITS`):
    the claim settled or proposed something. A worker asks it of a claim it
    drives too: a run it drives alone (a suspect) need not be, once it moved.
    """
    return generation > claimed_at + RECOVERY_COMMITS


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _seconds(value: object) -> bool:
    return _number(value) and math.isfinite(value) and value >= 0  # type: ignore[arg-type,operator]
