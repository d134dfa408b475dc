"""What a list of runs shows of one run, and who each run waits for: one rule, two readers.

``tether runs`` and the operator page list thousands of runs a page at a
time. Reading every run's checkpoint to say what it waits for would cost a
parse per run, so the runtime, which holds the state when it commits,
records a :class:`Listing` beside the run's mark in the same commit; the
list reads those columns, a page per query.

Whether a run waits for a person is decided here once, from the listing,
the mark's lease columns and the time (an approval expires, a lease runs
out): :func:`awaits_approval`, :func:`failing`, :func:`needs_person` and
:func:`waiting_for` serve both a list row and one run's full view. The
store filters ``--needs-me`` in SQL by the same rule (a test holds the two
together).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tether.core._actions import ActionClass, ActionKind, needs_approval
from tether.core._compensation import compensated_effect
from tether.core._model import PendingWrite, format_time
from tether.core._phases import Phase
from tether.core._spec import Policy
from tether.core._state import RunState


@dataclass(frozen=True, slots=True)
class Listing:
    """What a list shows of a run, recorded with its mark at every commit.

    ``subject``: for a run frozen for review, its open cases (``"c1 (reason),
    ..."``); for a pending write, its kind and target. ``pending_action``:
    the pending write's action id. ``gate``: the pending write's ledger
    status when an approval of it is something the runtime would take, else
    ``None``. ``approved_until``: the latest ``expires_at`` among the
    approvals the pending write holds, as signed (RFC 3339 text).
    """

    epoch: int
    subject: str | None = None
    pending_action: str | None = None
    gate: str | None = None
    approved_until: str | None = None


def approvable(pending: PendingWrite | None, policy: Policy | None) -> bool:
    """An approval of ``pending`` is something the runtime would take.

    Not for a compensation (the signed decision that ordered it is its
    authority) or a kind the policy lets through unapproved. A write already
    sent takes one too: if the adapter cannot settle it, it goes again only
    under an approval in force. With no policy known, the runtime decides:
    the tools do not guess no.
    """
    if pending is None or compensated_effect(pending.intent) is not None:
        return False
    if policy is None:
        return True
    return needs_approval(policy, ActionKind(pending.intent.kind, ActionClass.WRITE))


def listing_of(state: RunState, policy: Policy | None) -> Listing:
    """The listing of ``state`` under ``policy``, if that is the policy ``state`` is bound to.

    Any other policy is not the run's rules: the listing is then made as if
    none were known (an approval is taken to apply), as a reader who finds
    no policy for the run would make it.
    """
    if policy is not None and policy.fingerprint != state.binding.policy_fingerprint:
        policy = None
    pending = state.pending
    subject = None
    if state.phase is Phase.NEEDS_REVIEW:
        subject = ", ".join(f"{c.case_id} ({c.reason})" for c in state.review_cases)
    elif state.phase is Phase.PENDING and pending is not None:
        subject = f"{pending.intent.kind} {pending.intent.target}"
    gate = approved = None
    if pending is not None and approvable(pending, policy):
        gate = pending.status.value
        expiries = [_expires_at(document) for document in pending.approvals]
        approved = max(expiries) if expiries else None
    return Listing(
        epoch=state.epoch,
        subject=subject,
        pending_action=None if pending is None else pending.action_id,
        gate=gate,
        approved_until=approved,
    )


def _expires_at(document: object) -> str:
    """An approval's ``expires_at`` as signed ('' when it has none: then it is in force never)."""
    body = document.get("body") if isinstance(document, dict) else None
    return str(body.get("expires_at", "")) if isinstance(body, dict) else ""


def awaits_approval(phase: str, listing: Listing, waiting_after: int | None, now: datetime) -> bool:
    """The pending write waits for an approval that no document in force gives yet.

    A write that was never sent waits for one whenever an approval applies; a
    write already sent does only once the worker parked the run for a person
    (``waiting_after``): until then the adapter settles it. An approval is
    in force while its signed ``expires_at`` is after ``now`` (compared as
    the canonical UTC text both are written in).
    """
    if phase != Phase.PENDING.value or listing.gate is None:
        return False
    if listing.gate != "intended" and waiting_after is None:
        return False
    return listing.approved_until is None or listing.approved_until <= format_time(now)


def failing(
    attempts: int,
    last_error: str | None,
    lease_owner: str | None,
    lease_expires_at: datetime | None,
    now: datetime,
) -> bool:
    """Claims of the run keep ending badly: in an error, or in a worker that died holding it.

    A claim counts an attempt when it is taken, so a claim being worked on
    (a live lease, no error yet) is not a failure.
    """
    held = lease_owner is not None and lease_expires_at is not None and lease_expires_at > now
    return attempts > 0 and (last_error is not None or not held)


def needs_person(phase: str, approval: bool, failing: bool) -> bool:
    """Nothing happens to the run until a person acts (or it keeps failing)."""
    if phase == Phase.NEEDS_REVIEW.value or approval:
        return True
    return not Phase(phase).terminal and failing


def waiting_for(
    phase: str,
    listing: Listing,
    *,
    approval: bool,
    failing: bool,
    attempts: int,
    last_error: str | None,
) -> str | None:
    """Who or what the run waits for, in a few words (``None``: nothing, or it ended)."""
    if phase == Phase.NEEDS_REVIEW.value:
        return f"a reviewer's decision on {listing.subject or 'the run'}"
    # No claim takes a run with --max-attempts failures (a worker's setting, not the
    # store's): a person says when to try again.
    failed = (
        f"after {attempts} failed attempt(s): {last_error or 'a worker stopped while holding it'}"
        " (from --max-attempts on it is parked: `tether resume RUN` once the cause is fixed)"
    )
    if phase == Phase.PENDING.value and listing.pending_action is not None:
        if approval:
            return f"an approval of {listing.pending_action} ({listing.subject})"
        settle = f"a worker to settle {listing.pending_action}"
        return f"{settle}, {failed}" if failing else settle
    if Phase(phase).terminal:
        return None
    if failing:
        return f"a retry {failed}"
    return None
