"""Stopping a run on purpose: cancelling it, or parking it for a person.

Both settle a write that may have left first (by its key, never by sending
again), then commit the transition a pure rule returns; the session's
:meth:`~tether.runtime.RunSession.cancel` and ``park`` hold the lease and
the heartbeat around these.
"""

from __future__ import annotations

from typing import Any

from tether.adapters import capabilities_for
from tether.core import AdapterUnavailableError, EffectStatus, Outcome, Phase, ReviewReason
from tether.core import _settle as settle_rules
from tether.core import _steps as step_rules
from tether.core._cancel import cancel_read
from tether.core._transition import Lookup, LookupStatus
from tether.runtime._view import Session


def _without_rewind(session: Session) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    """The state with an unfinished rewind plan dropped, and the event that says so.

    A run stopped on purpose does not finish a rewind first: the plan goes
    into the trace (and a park's evidence) in the same commit that stops it.
    """
    state, plan = session.state, session.state.rewinding
    if plan is None:
        return state, []
    return state.evolve(rewinding=None), [
        ("rewind_abandoned", {"to_generation": plan.to_generation, "plan": plan.to_json()})
    ]


def cancel(
    session: Session,
    reason: str,
    by: str,
    *,
    document: dict[str, Any] | None = None,
    cursor: int | None = None,
) -> Outcome:
    """Settle a write that may have been sent, then end the run in ``cancelled``.

    ``document``: a person's signed cancel, read from inbox entry ``cursor``;
    it goes into the trace with the commit that ends the run (or freezes it).
    """
    session.guard()
    pending = session.state.pending
    if pending is not None and pending.mutating and pending.status is not EffectStatus.INTENDED:
        ask = Lookup(pending.idempotency_key, pending.intent)
        caps = capabilities_for(session.rt.adapter, pending.intent)
        answer = session.ask(ask) if caps.queryable else None
        settled = session.decide(
            lambda facts: settle_rules.cancel_pending(session.state, facts, answer)
        )
        frozen = settled.state is not None and settled.state.phase is not Phase.RUNNING
        if document is not None and frozen:
            settled = cancel_read(settled, document, cursor)
        outcome = session.apply(settled)
        if session.state.phase is not Phase.RUNNING:
            return outcome  # frozen for review, or still in flight: not cancelled
    base, events = _without_rewind(session)
    return session.apply(
        step_rules.cancel(base, reason, by=by, document=document, cursor=cursor), prefix=events
    )


def park(
    session: Session, reason: ReviewReason, detail: str, evidence: tuple[dict[str, Any], ...]
) -> Outcome:
    """Freeze the run for a person, with the world as it is now as the case's evidence."""
    # The case records the world as it is now (and the receipt, if the
    # write landed), so the decision it asks for can be checked against it.
    rt = session.rt
    live = rt.adapter.environment()
    receipt = None
    pending = session.state.pending
    if (
        pending is not None
        and pending.mutating
        and capabilities_for(rt.adapter, pending.intent).queryable
    ):
        answer = session.ask(Lookup(pending.idempotency_key, pending.intent))
        if answer.status in {LookupStatus.IN_PROGRESS, LookupStatus.UNAVAILABLE}:
            raise AdapterUnavailableError(
                f"run {session.run_id}: cannot park it while its write's outcome is unknown "
                f"to the adapter ({answer.status}): {answer.detail}"
            )
        receipt = answer.receipt
    if pending is not None and pending.mutating:
        evidence = (*evidence, *settle_rules.hint_evidence(pending.idempotency_key, session.hint()))
    base, events = _without_rewind(session)
    if base is not session.state and session.state.rewinding is not None:
        evidence = (*evidence, {"kind": "rewind_plan", **session.state.rewinding.to_json()})
    transition = step_rules.park(
        base,
        case_id=rt.ids.new_id("case"),
        reason=reason,
        detail=detail,
        now=rt.clock.now(),
        live=live,
        receipt=receipt,
        evidence=evidence,
    )
    return session.apply(transition, prefix=events)
