"""The human gates: signed approvals for pending writes, signed decisions for review cases.

Evidence is signed outside the runtime; here it is verified against trust
roots, bound field by field to the run as it is now, and only then recorded.
A refused decision leaves the run exactly as frozen as it was, and the
refusal is traced.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tether.adapters import (
    UnresolvedWriteError,
    absence_outlives_takeover,
    capabilities_for,
    look_up,
    offers_compensation,
)
from tether.core import (
    ActionClass,
    ActionKind,
    AdapterUnavailableError,
    CanonicalJSONError,
    EffectRecord,
    EffectStatus,
    EnvironmentState,
    EvidenceError,
    LookupInconclusiveError,
    Phase,
    PolicyError,
    PreconditionFailedError,
    Receipt,
    ReviewCase,
    ReviewDriftError,
    RunFrozenError,
    RunState,
    TrustRootsRequiredError,
    UnknownSignerError,
    strict_loads,
)
from tether.core import _case_rules as case_rules
from tether.core import _compensation as compensation_rules
from tether.core import _forks as fork_rules
from tether.core import _people as people
from tether.core._actions import needs_approval as core_needs_approval
from tether.core._actions import risk_of
from tether.core._case_rules import Undo
from tether.core._case_table import ReviewDecision, Settlement, earlier_key, settlement
from tether.core._compensation import compensated_effect
from tether.core._evidence import check_approval, check_decision
from tether.core._retention import remembered
from tether.core._terms import settling_capabilities
from tether.core._transition import EffectRef, Lookup, LookupAnswer, LookupStatus, Transition
from tether.crypto import Role, TrustRoots
from tether.runtime import _cancel, _hints
from tether.runtime._view import Runtime, Session


def needs_approval(rt: Runtime, state: RunState) -> bool:
    """Whether the policy requires an approval before the pending action is carried out."""
    pending = state.pending
    if pending is None or compensated_effect(pending.intent) is not None:
        # A compensation's authority is the signed effect decision that ordered it.
        return False
    # A kind the catalog no longer declares is judged as the write it was.
    kind = rt.kinds.get(pending.intent.kind) or ActionKind(pending.intent.kind, ActionClass.WRITE)
    return core_needs_approval(rt.policy, kind)


def consume_inbox(session: Session) -> None:
    """Apply the signed evidence people left in the store's inbox since the last read.

    Each entry is read once: accepted or refused, the cursor moves past it in
    the same checkpoint that records the outcome, so a refused document is
    traced once and never retried. A runtime given no trust roots reads
    nothing, and one whose roots lack the role an entry needs stops at it
    (:class:`TrustRootsRequiredError`): evidence is never consumed unread.
    A cancel reaching a run frozen for review is the exception: the run
    refuses it anyway, so it is refused at once rather than left to block the
    reviewer's decision behind it.
    """
    state = session.state
    trust = session.rt.trust
    if state.phase.terminal or trust is None:
        return
    roles = frozenset(role.value for role in trust.roles())
    for item in session.rt.store.evidence(session.state.run_id, after=session.state.inbox_cursor):
        verdict = people.inbox_read(session.rt.policy, item.kind, roles, session.state.phase)
        if verdict is not people.InboxRead.READ:
            needed = " or ".join(
                r + "s" for r in sorted(people.signers_of(session.rt.policy, item.kind))
            )
            if verdict is people.InboxRead.REFUSE:
                why = f"this runtime's trust roots name no {needed}, who may cancel"
                _refuse(session, item.kind, item.document, EvidenceError(why), item.seq)
                continue
            # The runtime's configuration is at fault, not the document: refusing it
            # would burn a valid signature. Stop here; the cursor stays put.
            roles_needed = sorted(people.signers_of(session.rt.policy, item.kind))
            raise TrustRootsRequiredError(
                f"run {state.run_id}: inbox entry #{item.seq} is {item.kind} evidence and this "
                f"runtime's trust roots name no {needed}; add them, and it is read then"
                + (
                    f" ({_hints.trust_roots(roles_needed[0], given=True)})"
                    if len(roles_needed) == 1
                    else ""
                ),
                run_id=state.run_id,
            )
        if session.state.phase.terminal:
            return  # a rewind may not follow an abort in the same inbox read
        with contextlib.suppress(EvidenceError, PolicyError):  # traced where refused
            if item.kind == "admission":
                # Admissions are read by a recovery, before any step. The one that
                # opened this epoch is recorded as used; any other was refused
                # then, or names an epoch that was admitted otherwise.
                read = session.admissions_read.get(item.seq)
                if read is None and _opened_this_epoch(session, item.document):
                    read = "used"  # by a recovery whose session did not live to read the inbox
                if read == "used":
                    _commit(session, people.noted_admission(session.state, item.seq))
                else:
                    _refuse(
                        session,
                        item.kind,
                        item.document,
                        PolicyError(read or "an admission not used by a recovery: superseded"),
                        item.seq,
                    )
            elif item.kind == "rewind":
                session.rewind_from_inbox(item.document, cursor=item.seq)
            elif item.kind == "approval":
                approve(session, item.document, cursor=item.seq)
            elif item.kind == "effect_decision":
                session.effect_decision(item.document, cursor=item.seq)
            elif item.kind == "fork":
                fork(session, item.document, cursor=item.seq)
            elif item.kind == "cancel":
                _cancel.from_inbox(session, item.document, cursor=item.seq)
                if session.state.inbox_cursor < item.seq:
                    return  # not landed yet (a write in flight): read again next step
            else:
                review(session, item.document, cursor=item.seq)


def _opened_this_epoch(session: Session, document: Any) -> bool:
    """Whether ``document`` is the signed admission the current epoch's record holds."""
    digest = session.state.admission
    body = None if digest is None else session.rt.store.get_blob(digest)
    if body is None:
        return False
    try:
        record = strict_loads(body)
    except CanonicalJSONError:
        return False
    used = record.get("document") if isinstance(record, dict) else None
    return used is not None and people.evidence_digest(used) == people.evidence_digest(document)


def refuse(session: Session, kind: str, document: Any, exc: Exception, cursor: int | None) -> None:
    """Trace a refused document (public: the rewind and admission paths refuse the same way)."""
    _refuse(session, kind, document, exc, cursor)


def _refuse(session: Session, kind: str, document: Any, exc: Exception, cursor: int | None) -> None:
    """Trace a refused document the same way whichever path it came by (then the caller raises)."""
    state = session.state
    if state.phase.terminal:
        return  # nothing may be committed to a finished run; the caller still raises
    _commit(session, people.refused(state, kind, document, exc, cursor=cursor))


def _commit(session: Session, transition: Transition) -> None:
    if transition.state is not None:
        session.commit(transition.state, list(transition.events))


def approve(session: Session, document: Any, *, cursor: int | None = None) -> RunState:
    """Verify and record a signed approval for the pending write; a refusal is traced, then raised."""
    rt, state = session.rt, session.state
    try:
        _refuse_unless(state, Phase.PENDING, "approve")
        if not needs_approval(rt, state):
            raise PolicyError(f"run {state.run_id}: the pending write needs no approval")
        pending = state.pending
        if pending is None:  # checked by _refuse_unless; keeps the type checker honest
            raise PolicyError("no pending write", run_id=state.run_id)
        body = _trust(rt, Role.APPROVER).verify(document, Role.APPROVER)
        check_approval(
            body,
            document["signer"],
            state,
            now=rt.clock.now(),
            ttl_s=rt.policy.approval_ttl_s,
        )
    except (EvidenceError, PolicyError) as exc:
        _refuse(session, "approval", document, exc, cursor)
        raise
    recorded = people.record_approval(state, document, body, cursor=cursor, now=rt.clock.now())
    _commit(session, recorded)
    return session.state


def review(session: Session, document: Any, *, cursor: int | None = None) -> RunState:
    """Verify a signed reviewer decision and apply it; any doubt leaves the case frozen.

    What a fitting decision does is the table's (``tether.core._case_table``)
    and the transition ``case_rules.settle_case`` builds; here the world is
    read for it: the environment and the adapter's receipt again (drift
    refuses it), the ledger's record of the effect a ``landed_earlier`` or a
    ``compensate`` names, and, for a compensation, its intent and a fresh key.
    """
    session.land_deferred()  # the settlement reads the ledger by the state's heads
    rt, state = session.rt, session.state
    drift: tuple[str, EnvironmentState, Receipt | None] | None = None
    case = None
    try:
        _refuse_unless(state, Phase.NEEDS_REVIEW, "review")
        body = _trust(rt, Role.REVIEWER).verify(document, Role.REVIEWER)
        case = next((c for c in state.review_cases if c.case_id == body.get("case_id")), None)
        if case is None:
            raise ReviewDriftError(f"no open review case {body.get('case_id')!r}")
        decision = check_decision(
            body,
            document["signer"],
            state,
            case,
            now=rt.clock.now(),
            ttl_s=rt.policy.approval_ttl_s,
        )
        if decision == ReviewDecision.NOT_LANDED:
            # The adapter's word first: a write it holds, or still carries out, did
            # not "not land" (a refusal names what it found; drift refreshes the case).
            # One it cannot be asked now refuses the decision rather than leaving it
            # unread: unread, it would hold the case against an abort or a landed.
            try:
                drift = _reread(rt, state, case, body)
                _check_not_landed(session, state, case, settlement(case, state, decision), body)
            except AdapterUnavailableError as exc:
                session.unreachable = str(exc)  # the run stays frozen: its park backs off
                unreachable = LookupAnswer(LookupStatus.UNAVAILABLE, detail=str(exc))
                refused = case_rules.refuse_not_landed(
                    case, state, case_rules.NotLandedCheck.UNREACHABLE, unreachable
                )
                if refused is None:  # the rule refuses every unreachable answer
                    raise
                raise refused from exc
        else:
            drift = _reread(rt, state, case, body)
        if drift is not None:
            raise ReviewDriftError(drift[0])
        settled = settlement(case, state, decision)
        earlier, undo = _read_for(rt, state, case, settled, body, document)
    except (EvidenceError, PolicyError) as exc:
        _refuse(session, "review_decision", document, exc, cursor)
        if drift is not None and case is not None:
            why, live, receipt = drift
            _commit(
                session,
                people.refresh_case(
                    session.state,
                    case,
                    live=live,
                    receipt=receipt,
                    case_id=rt.ids.new_id("case"),
                    now=rt.clock.now(),
                    why=why,
                ),
            )
        raise
    session.apply(
        case_rules.settle_case(
            state,
            case,
            settled,
            document,
            body,
            cursor=cursor,
            now=rt.clock.now(),
            earlier=earlier,
            undo=undo,
        )
    )
    return session.state


def _check_not_landed(
    session: Session,
    state: RunState,
    case: ReviewCase,
    settled: Settlement,
    body: dict[str, Any],
) -> None:
    """Ask the adapter by the case's key before a ``not_landed`` is consumed.

    Refused (:class:`~tether.core.DecisionRefusedError`, naming what was
    found) when it holds a receipt, reports the request still in flight, or
    cannot be reached, and when its absence proves nothing now (the key past
    its retention, absence not final, or a takeover since the send) unless
    the decision's evidence says what the person searched. Where it cannot be
    asked at all, the person's word stands (the case card warned them).
    """
    pending = state.pending
    if (
        settled not in case_rules.NOT_LANDED
        or pending is None
        or pending.idempotency_key != case.idempotency_key
    ):
        return
    rt = session.rt
    caps = capabilities_for(rt.adapter, pending.intent)
    answer = (
        session.ask(Lookup(pending.idempotency_key, pending.intent)) if caps.queryable else None
    )
    # Absence is final only under the terms every send was made under, and only
    # while the key is young on the store's clock as well as this runtime's.
    settling = settling_capabilities(caps, session.history.sent_under(pending, rt.effect_digest))
    age = (
        session.history.pending_age(pending, rt.effect_digest)
        if answer is not None and settling.retention_s is not None
        else None
    )
    # The settle rule's own: sent by an earlier worker (leases on, so its lease
    # lapsed or it let go), its absence proves nothing unless the adapter's
    # absence outlives a takeover (it fences the older worker out).
    taken_over = session.sent_by_another(pending.idempotency_key) and not absence_outlives_takeover(
        rt.adapter, pending.intent
    )
    kept = remembered(settling.retention_s, rt.clock.now(), pending.proposed_at, age)
    check = case_rules.check_not_landed(
        answer,
        absent_is_final=settling.absent_is_final,
        remembered=kept,
        taken_over=taken_over,
        evidence=bool(str(body.get("evidence") or "").strip()),
    )
    doubt = case_rules.absence_doubt(
        absent_is_final=settling.absent_is_final, remembered=kept, taken_over=taken_over
    )
    refused = case_rules.refuse_not_landed(case, state, check, answer, doubt=doubt)
    if refused is not None:
        raise refused


def _read_for(
    rt: Runtime,
    state: RunState,
    case: ReviewCase,
    settled: Settlement,
    body: dict[str, Any],
    document: dict[str, Any],
) -> tuple[EffectRef | None, Undo | None]:
    """What a settlement needs of the world: the earlier attempt it records, or the undo it orders.

    Refused (typed, the case stays frozen) when the earlier attempt is
    settled already, or the effect cannot be undone by the runtime (its kind
    declared no compensation, or its adapter offers none).
    """
    if settled is Settlement.LANDED_EARLIER:
        key = earlier_key(case)
        record = EffectRecord.find(rt.checkpointer.verified_ledger(state), key)
        if record is None or record.status not in {
            EffectStatus.DISPATCHED,
            EffectStatus.OUTCOME_UNKNOWN,
        }:
            now = "not in the ledger" if record is None else record.status.value
            raise ReviewDriftError(
                f"the earlier attempt under key {key} is {now}: nothing of it is unknown now"
            )
        ref = EffectRef(key, record.action_id, record.intent_digest, record.status)
        return ref, None
    if settled not in {Settlement.COMPENSATE, Settlement.LANDED_COMPENSATE}:
        return None, None
    found = EffectRecord.find(rt.checkpointer.verified_ledger(state), case.idempotency_key)
    if found is None:
        raise ReviewDriftError(f"the ledger records no effect under key {case.idempotency_key}")
    effect = found
    if settled is Settlement.LANDED_COMPENSATE:
        effect = case_rules.landed_record(state, case, body, document, found.terms)
    kind = "" if effect.terms is None else effect.terms.kind
    compensation_rules.check_undoable(
        state, effect, offered=bool(kind) and offers_compensation(rt.adapter, kind)
    )
    # A kind the catalog no longer declares is judged as the write it was.
    declared = rt.kinds.get(kind) or ActionKind(kind, ActionClass.WRITE)
    intent = compensation_rules.compensation_intent(effect, risk=risk_of(rt.policy, declared).value)
    undo = Undo(
        effect=effect,
        intent=intent,
        key=rt.ids.new_id("idem"),  # minted once, before anything is sent; never again
        expected_post=rt.adapter.derive_post_state(case.environment, intent),
        capabilities=capabilities_for(rt.adapter, intent),
    )
    return None, undo


def fork(session: Session, document: Any, *, cursor: int | None = None) -> RunState:
    """Verify a signed fork and arm its effect for one new execution; a refusal is traced, then raised.

    Signed by a reviewer or an operator; bound to this run, its policy, the
    effect digest and the effect's current attempt (receipt id, fingerprint,
    key), alive now, with a nonce never recorded before.
    """
    rt, state = session.rt, session.state
    try:
        if state.phase.terminal:
            raise RunFrozenError(f"run {state.run_id} is {state.phase}; nothing to fork")
        body = _verify_fork(_trust(rt, Role.REVIEWER), document)
        fork_rules.check_fork(
            body,
            document["signer"],
            state,
            session.effects,
            now=rt.clock.now(),
            ttl_s=rt.policy.approval_ttl_s,
        )
    except (EvidenceError, PolicyError) as exc:
        _refuse(session, "fork", document, exc, cursor)
        raise
    at = state.inbox_cursor if cursor is None else cursor
    _commit(
        session, fork_rules.record_fork(state, body, people.evidence_digest(document), cursor=at)
    )
    return session.state


def _verify_fork(trust: TrustRoots, document: Any) -> dict[str, Any]:
    """The fork's body, signed by a trusted reviewer, or else by a trusted operator."""
    try:
        return trust.verify(document, Role.REVIEWER)
    except UnknownSignerError:
        return trust.verify(document, Role.OPERATOR)


def check_restorable(rt: Runtime, state: RunState) -> None:
    """A checkpoint carrying signed evidence restores only where its signers are trusted again.

    Approvals of the pending write need the approvers' roots; the reviewer
    decisions the state was shaped by (a replan, an abort) the reviewers'.
    """
    pending = state.pending
    approvals = () if pending is None else pending.approvals
    for role, documents in ((Role.APPROVER, approvals), (Role.REVIEWER, state.decisions)):
        if not documents:
            continue
        trust = rt.trust
        if trust is None or role not in trust.roles():
            raise TrustRootsRequiredError(
                f"run {state.run_id} carries signed {role} evidence; pass the {role}s' trust "
                f"roots to restore it ({_hints.trust_roots(role, given=trust is not None)})",
                run_id=state.run_id,
            )
        for document in documents:
            try:
                trust.verify(document, role)
            except EvidenceError as exc:
                raise TrustRootsRequiredError(
                    f"run {state.run_id}: {role} evidence does not verify under the given "
                    f"trust roots: {exc}",
                    run_id=state.run_id,
                ) from exc


def _reread(
    rt: Runtime, state: RunState, case: Any, body: dict[str, Any]
) -> tuple[str, EnvironmentState, Receipt | None] | None:
    """Before a decision is consumed, the environment and the adapter's receipt must be
    as the case recorded them; else why, and the world as it is now."""
    live = rt.adapter.environment()
    pending = state.pending
    intent = (
        pending.intent
        if pending is not None and pending.idempotency_key == case.idempotency_key
        else None
    )
    queryable = capabilities_for(rt.adapter, intent).queryable and bool(case.idempotency_key)
    receipt = _receipt_under(rt, case.idempotency_key, intent) if queryable else None
    if live != case.environment:
        why = f"the environment changed since the case was opened (now version {live.version})"
        return why, live, receipt
    now = None if receipt is None else receipt.fingerprint
    if queryable and now != body["receipt_fingerprint"]:
        return (
            "the adapter's authoritative receipt changed since the decision was signed",
            live,
            receipt,
        )
    return None


def _receipt_under(rt: Runtime, key: str, intent: Any) -> Receipt | None:
    """The adapter's receipt under ``key``; a request it recorded as refused has none, and
    one it still reports in flight has none yet (a case opened because the key is stuck in
    flight must stay decidable: no receipt then, no receipt now), nor one whose look-up
    proves nothing (the case it opened had none either). An adapter that cannot be
    reached raises, and the decision waits for it."""
    try:
        return look_up(rt.adapter, key, intent)
    except (PreconditionFailedError, UnresolvedWriteError, LookupInconclusiveError):
        return None


def _trust(rt: Runtime, role: Role) -> TrustRoots:
    if rt.trust is None:
        raise EvidenceError(_hints.trust_roots(role))
    return rt.trust


def _refuse_unless(state: RunState, phase: Phase, what: str) -> None:
    if state.phase is not phase:
        if state.phase.terminal:
            raise RunFrozenError(f"run {state.run_id} is {state.phase}; nothing to {what}")
        raise PolicyError(
            f"run {state.run_id} is {state.phase}, not {phase}; nothing to {what}",
            run_id=state.run_id,
        )
