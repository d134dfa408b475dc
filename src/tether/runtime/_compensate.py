"""Signed effect decisions: verified here, decided in ``core._compensation``.

A reviewer's ``effect_decision`` names one effect of the run's ledger by its
key. It is verified against the trust roots (reviewers only), then bound
field by field to the ledger as it is now (the verified chain, never rows
alone), its nonce checked against every decision the state records, and,
for ``compensate``, checked against what the effect's kind declared and
what its adapter offers. A refusal is traced (``evidence_refused``) exactly
as a refused approval or review is, and raised; it changes nothing else.

The transition it yields is committed and carried out by the session
(``RunSession.decide_effect``): an accepted effect is recorded; an ordered
compensation becomes the pending write and goes through the same dispatch,
look-up and reconcile as any write.
"""

from __future__ import annotations

from typing import Any

from tether.adapters import capabilities_for, offers_compensation
from tether.core import (
    ActionClass,
    ActionKind,
    EffectDecision,
    EvidenceError,
    PolicyError,
    RunTerminalError,
)
from tether.core import _compensation as compensation_rules
from tether.core import _people as people
from tether.core._actions import risk_of
from tether.core._compensation import EffectRecord, check_effect_decision
from tether.core._transition import Transition
from tether.crypto import Role
from tether.runtime import _hints
from tether.runtime._view import Session


def decide(session: Session, document: Any, *, cursor: int | None) -> Transition:
    """The transition a signed effect decision asks for, or its refusal (traced, then raised)."""
    session.land_deferred()  # the decision reads the ledger by the state's heads
    rt, state = session.rt, session.state
    try:
        if state.phase.terminal:
            raise RunTerminalError(
                f"run {state.run_id} is {state.phase}; its effects are decided by hand now",
                run_id=state.run_id,
            )
        if rt.trust is None:
            raise EvidenceError(_hints.trust_roots(Role.REVIEWER))
        body = rt.trust.verify(document, Role.REVIEWER)
        ledger = rt.checkpointer.verified_ledger(state)
        effect = EffectRecord.find(ledger, body.get("idempotency_key"))
        decision = check_effect_decision(
            body,
            document["signer"],
            state,
            effect,
            now=rt.clock.now(),
            ttl_s=rt.policy.approval_ttl_s,
        )
        if effect is None:  # check_effect_decision refuses it; keeps the type checker honest
            raise EvidenceError("no such effect")
        if decision is EffectDecision.ACCEPT:
            return compensation_rules.accept_effect(state, effect, document, body, cursor=cursor)
        kind = "" if effect.terms is None else effect.terms.kind
        compensation_rules.check_compensable(
            state, effect, offered=bool(kind) and offers_compensation(rt.adapter, kind)
        )
    except (EvidenceError, PolicyError) as exc:
        if not state.phase.terminal:
            refused = people.refused(state, "effect_decision", document, exc, cursor=cursor)
            if refused.state is not None:
                session.commit(refused.state, list(refused.events))
        raise
    # A kind the catalog no longer declares is judged as the write it was.
    declared = rt.kinds.get(kind) or ActionKind(kind, ActionClass.WRITE)
    intent = compensation_rules.compensation_intent(effect, risk=risk_of(rt.policy, declared).value)
    return compensation_rules.order_compensation(
        state,
        effect,
        document,
        body,
        intent,
        key=rt.ids.new_id("idem"),  # minted once, before anything is sent; never again
        expected_post=rt.adapter.derive_post_state(state.environment, intent),
        now=rt.clock.now(),
        capabilities=capabilities_for(rt.adapter, intent),
        cursor=cursor,
    )
