"""The documents the people around a run sign: built, signed and checked before delivery.

The ``prepare_*`` functions build a document, sign it with the person's key
and check it with the same core checks the runtime applies when it reads
the document from the inbox. A document the runtime would refuse (a wrong
role, an untrusted key, a ttl the policy does not allow, a run that moved
on since the person looked) is refused here, with the same typed error,
and never delivered. Nothing here holds the checkpoint key or changes run
state: :func:`deliver` only appends to the inbox, after checking again.
"""

from __future__ import annotations

import secrets as _secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from tether.core import (
    Authority,
    CancelRefusedError,
    Compensation,
    CompensationRefusedError,
    EvidenceError,
    Phase,
    Policy,
    PolicyError,
    Purpose,
    ReviewDecision,
    RewindRefusedError,
    RunState,
    admission_request,
    approval_request,
    decision_request,
    format_time,
    new_admission,
    new_approval,
    new_cancel,
    new_decision,
    new_fork,
)
from tether.core import _replay as replay_rules
from tether.core._admission import check_admission
from tether.core._cancel import check_cancel
from tether.core._compensation import is_compensation
from tether.core._evidence import check_approval, check_decision
from tether.crypto import Role, Signer, TrustRoots
from tether.runtime._cases import case_effect, pretty
from tether.runtime._clock import SystemClock
from tether.runtime._runview import RunView, read_state
from tether.store import ContentStore, GenerationStore

#: The lifetime a document gets when the person names none (never above the policy's).
DEFAULT_TTL_S = 900


class StaleViewError(PolicyError):
    """The run moved on since the person looked: what they saw is not what would be signed."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A signed document, checked as the runtime will check it, not yet delivered.

    ``shown`` is what the person is asked to sign: the body's bound fields
    (everything but the nonce) and a few words of context.
    """

    run_id: str
    kind: str
    document: dict[str, Any]
    shown: dict[str, Any]
    verified: bool
    #: The run's generation when it was prepared (delivery re-checks it).
    generation: int

    @property
    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = self.document["body"]
        return body


def signer_roles(kind: str, view: RunView, policy: Policy | None = None) -> frozenset[str]:
    """The roles whose key may sign a document of ``kind`` for this run.

    From the run's policy (or ``policy``, where the person names one); its
    ``authority`` defaults where the policy is not known.
    """
    rules = policy or view.policy
    authority = Authority() if rules is None else rules.authority
    roles = {
        "approval": frozenset({Role.APPROVER.value}),
        "review_decision": frozenset({Role.REVIEWER.value}),
        "fork": frozenset({Role.REVIEWER.value, Role.OPERATOR.value}),
        "rewind": authority.rewind - {"agent"},
        "admission": authority.recover,
        "cancel": authority.cancel,
    }.get(kind)
    if roles is None:
        raise PolicyError(f"no document of kind {kind!r} is signed by a person")
    return frozenset(roles)


def prepare_approval(
    view: RunView,
    signer: Signer,
    action_id: str,
    *,
    now: datetime,
    ttl_s: float | None = None,
    trust: TrustRoots | None = None,
    policy: Policy | None = None,
    seen_generation: int | None = None,
) -> Prepared:
    """An approval of the run's pending write, refused here if the runtime would refuse it."""
    state = _fresh(view, seen_generation)
    pending = state.pending
    if state.phase is not Phase.PENDING or pending is None:
        raise PolicyError(
            f"run {state.run_id} is {state.phase}; it has no pending write to approve"
        )
    if pending.action_id != action_id:
        raise PolicyError(
            f"run {state.run_id}'s pending action is {pending.action_id!r}, not {action_id!r}"
        )
    _role(signer, Role.APPROVER, "approve a write")
    rules = _policy(view, policy)
    if not replace(view, policy=rules).approvable:
        raise PolicyError(
            f"run {state.run_id}: the pending write {pending.action_id!r} takes no approval "
            f"(it is {pending.status.value}, or its policy lets it through unapproved)",
            run_id=state.run_id,
        )
    body = new_approval(
        state,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=_ttl(ttl_s, rules)),
        nonce=_secrets.token_hex(16),
    )
    document = _signed(signer, body, Role.APPROVER, trust, view)
    if rules is not None:
        check_approval(
            body,
            signer.signer_id,
            state,
            now=now,
            ttl_s=rules.approval_ttl_s,
        )
    shown = {
        **_bound(body),
        "run_generation": state.generation,
        "write": f"{pending.intent.kind} {pending.intent.target}",
        "arguments": pretty(pending.intent.args),  # whole: nobody signs what they did not see
    }
    return Prepared(state.run_id, "approval", document, shown, view.verified, state.generation)


def prepare_review(
    view: RunView,
    signer: Signer,
    case_id: str,
    decision: str,
    *,
    now: datetime,
    ttl_s: float | None = None,
    trust: TrustRoots | None = None,
    policy: Policy | None = None,
    seen_generation: int | None = None,
    evidence: str | None = None,
) -> Prepared:
    """A reviewer decision on an open case, refused here if the runtime would refuse it.

    ``evidence``: what the reviewer found in the world (a message id, a
    receipt id, a URL); ``landed`` needs it, and any decision may carry it
    as a note. What is shown to the person is the signed body and the case's
    effect whole (:func:`~tether.runtime.case_effect`).
    """
    state = _fresh(view, seen_generation)
    case = next((c for c in state.review_cases if c.case_id == case_id), None)
    if state.phase is not Phase.NEEDS_REVIEW or case is None:
        raise PolicyError(f"run {state.run_id} has no open review case {case_id!r}")
    _role(signer, Role.REVIEWER, "decide a review")
    effect = case_effect(state, case, view.ledger, now)
    if decision == ReviewDecision.COMPENSATE.value and is_compensation(effect.action_id):
        raise CompensationRefusedError(
            f"run {state.run_id}: the write {effect.action_id!r} is itself a compensation, "
            "which the runtime never undoes: sign landed or not_landed",
            run_id=state.run_id,
            idempotency_key=effect.idempotency_key,
            compensation="none",
        )
    if decision == ReviewDecision.COMPENSATE.value and effect.compensation not in {
        None,
        Compensation.ADAPTER.value,
    }:
        raise CompensationRefusedError(
            f"run {state.run_id}: the write {effect.action_id!r} is of a kind undone only "
            f"{'by a person' if effect.compensation == 'human' else 'by nobody'} "
            f"({effect.compensation}); the runtime cannot compensate it: sign landed or "
            "not_landed",
            run_id=state.run_id,
            idempotency_key=effect.idempotency_key,
            compensation=effect.compensation or "none",
        )
    rules = _policy(view, policy)
    body = new_decision(
        state,
        case,
        signer.signer_id,
        decision,
        issued_at=now,
        expires_at=now + timedelta(seconds=_ttl(ttl_s, rules)),
        nonce=_secrets.token_hex(16),
        evidence=evidence,
    )
    document = _signed(signer, body, Role.REVIEWER, trust, view)
    if rules is not None:
        check_decision(body, signer.signer_id, state, case, now=now, ttl_s=rules.approval_ttl_s)
    shown = _bound(body)
    for label, text in effect.lines():
        shown.setdefault(label, text)
    return Prepared(
        state.run_id, "review_decision", document, shown, view.verified, state.generation
    )


def prepare_fork(
    view: RunView,
    signer: Signer,
    effect: str,
    *,
    now: datetime,
    ttl_s: float | None = None,
    trust: TrustRoots | None = None,
    policy: Policy | None = None,
    seen_generation: int | None = None,
) -> Prepared:
    """A fork: do a committed effect once more, on purpose (a reviewer or an operator signs)."""
    state = _fresh(view, seen_generation)
    if state.phase.terminal:
        raise PolicyError(f"run {state.run_id} is {state.phase}; nothing to fork")
    role = _role(signer, (Role.REVIEWER, Role.OPERATOR), "sign a fork")
    if effect in view.effect_records:  # read by index, whatever page the view holds
        record = view.effect_records[effect]
    else:
        record = replay_rules.known_effects(list(view.ledger)).get(effect)
    known = None if record is None else record.current
    if known is None:
        raise PolicyError(f"run {state.run_id}'s ledger records no effect {effect}")
    rules = _policy(view, policy)
    body = new_fork(
        state,
        known,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=_ttl(ttl_s, rules)),
        nonce=_secrets.token_hex(16),
    )
    document = _signed(signer, body, role, trust, view)
    shown = {**_bound(body), "earlier_action": known.action_id}
    return Prepared(state.run_id, "fork", document, shown, view.verified, state.generation)


def prepare_rewind(
    view: RunView,
    signer: Signer,
    to: int,
    reason: str,
    *,
    now: datetime,
    scope: str = "aligned",
    ttl_s: float | None = None,
    trust: TrustRoots | None = None,
    policy: Policy | None = None,
    seen_generation: int | None = None,
) -> Prepared:
    """A signed rewind of context and workspace to generation ``to``, applied by the next step."""
    state = _fresh(view, seen_generation)
    if state.phase is not Phase.RUNNING:
        raise RewindRefusedError(
            f"run {state.run_id} is {state.phase}: only a running run is rewound (settle a "
            "pending write, or decide a review, first)",
            run_id=state.run_id,
        )
    if not 1 <= to < state.generation:
        raise RewindRefusedError(
            f"rewind to {to}: name an earlier generation (the run is at {state.generation})",
            run_id=state.run_id,
        )
    if not reason.strip():
        raise RewindRefusedError("a rewind needs a reason, for the trace and the agent")
    return _admission(
        view, signer, Purpose.REWIND, "rewind", now, ttl_s, trust, policy, to, reason, scope
    )


def prepare_admission(
    view: RunView,
    signer: Signer,
    *,
    now: datetime,
    ttl_s: float | None = None,
    trust: TrustRoots | None = None,
    policy: Policy | None = None,
    seen_generation: int | None = None,
) -> Prepared:
    """A person's admission of the run's next recovery (a new epoch under current authority)."""
    state = _fresh(view, seen_generation)
    if state.phase.terminal:
        raise PolicyError(f"run {state.run_id} is {state.phase}; nothing may resume it")
    return _admission(view, signer, Purpose.RECOVERY, "admission", now, ttl_s, trust, policy)


def prepare_cancel(
    view: RunView,
    signer: Signer,
    reason: str,
    *,
    now: datetime,
    ttl_s: float | None = None,
    trust: TrustRoots | None = None,
    policy: Policy | None = None,
    seen_generation: int | None = None,
) -> Prepared:
    """A signed cancel (an operator's, or whoever the policy's ``authority.cancel`` names).

    A frozen run is refused here as the runtime refuses it: a reviewer's
    signed abort is what ends a run in review.
    """
    state = _fresh(view, seen_generation)
    if state.phase.terminal:
        raise PolicyError(f"run {state.run_id} is {state.phase}; nothing to cancel")
    if state.phase is Phase.NEEDS_REVIEW:
        raise CancelRefusedError(
            f"run {state.run_id} is frozen for review; a reviewer's signed abort ends it",
            run_id=state.run_id,
        )
    rules = _policy(view, policy)
    allowed = sorted(signer_roles("cancel", view, rules))
    role = _role(signer, tuple(Role(name) for name in allowed), "cancel a run")
    body = new_cancel(
        state,
        signer.signer_id,
        reason=reason,
        issued_at=now,
        expires_at=now + timedelta(seconds=_ttl(ttl_s, rules)),
        nonce=_secrets.token_hex(16),
    )
    document = _signed(signer, body, role, trust, view)
    if rules is not None:
        check_cancel(body, signer.signer_id, state, now=now, ttl_s=rules.approval_ttl_s)
    return Prepared(state.run_id, "cancel", document, _bound(body), view.verified, state.generation)


def deliver(
    store: ContentStore,
    prepared: Prepared,
    *,
    now: datetime | None = None,
    marks: GenerationStore | None = None,
) -> int:
    """Leave the signed document in the run's inbox; its sequence number there.

    Checked again first, since a person may have taken their time: a document
    that expired meanwhile is refused, and so is one whose bindings no longer
    hold for the run as it is now (see :func:`_still_bound`).
    """
    moment = now if now is not None else SystemClock().now()
    if str(prepared.body.get("expires_at", "")) <= format_time(moment):
        raise PolicyError(
            f"the {prepared.kind} expired before it was delivered: prepare it again",
            run_id=prepared.run_id,
        )
    state, _ = read_state(store, prepared.run_id, marks)
    _still_bound(prepared, state)
    _none_waiting(store, prepared, state)
    return store.put_evidence(prepared.run_id, prepared.kind, prepared.document)


def _none_waiting(store: ContentStore, prepared: Prepared, state: RunState) -> None:
    """Refuse a second decision on a case while one the run has not read yet waits for it.

    The run applies the first it reads and refuses the rest; a person who
    signed from a stale screen (another terminal, an old tab) would otherwise
    believe their decision stood. Once the run has read the waiting one, the
    case is closed or open again, and a person looks again.
    """
    if prepared.kind != "review_decision":
        return
    case_id = prepared.body.get("case_id")
    for item in store.evidence(prepared.run_id, after=state.inbox_cursor):
        body = item.document.get("body")
        if item.kind != "review_decision" or not isinstance(body, dict):
            continue
        if body.get("case_id") == case_id:
            raise StaleViewError(
                f"run {prepared.run_id}: a decision on case {case_id} already waits in the "
                f"inbox (#{item.seq}: {body.get('decision')!s}, signed by "
                f"{item.document.get('signer')!s}); the run applies it at its next step. "
                "Nothing delivered: look again after that step",
                run_id=prepared.run_id,
            )


def _still_bound(prepared: Prepared, state: RunState) -> None:
    """Refuse a document whose bindings the run has moved away from since it was prepared.

    Only what the document binds is compared, as the runtime will: an
    admission or a rewind binds the checkpoint generation; an approval the
    pending write and the environment it was proposed against; a decision
    its open case. A run that merely re-checkpointed (it read and refused
    somebody's document, say) leaves an approval valid. A cancel binds no
    generation, but lands only on a run still live and not frozen.
    """
    run_id, body, kind = prepared.run_id, prepared.body, prepared.kind
    moved: str | None = None
    if kind in {"admission", "rewind"} and state.generation != prepared.generation:
        moved = f"it is at generation {state.generation}, not {prepared.generation}"
    elif kind == "approval":
        if state.phase is not Phase.PENDING or state.pending is None:
            moved = f"it is {state.phase}, with no pending write"
        elif any(body.get(k) != v for k, v in approval_request(state).items()):
            moved = "its pending write is another now"
    elif kind == "review_decision":
        case = next((c for c in state.review_cases if c.case_id == body.get("case_id")), None)
        if state.phase is not Phase.NEEDS_REVIEW or case is None:
            moved = f"case {body.get('case_id')} is closed"
        elif any(body.get(k) != v for k, v in decision_request(state, case).items()):
            moved = f"case {case.case_id} records another world now"
    elif kind in {"fork", "cancel"} and state.phase.terminal:
        moved = f"it is {state.phase}"
    elif kind == "cancel" and state.phase is Phase.NEEDS_REVIEW:
        raise CancelRefusedError(
            f"run {run_id} is frozen for review now; a reviewer's signed abort ends it",
            run_id=run_id,
        )
    if moved is not None:
        raise StaleViewError(
            f"run {run_id} moved since the {kind} was prepared: {moved}; nothing delivered, "
            "look again",
            run_id=run_id,
        )


def _admission(
    view: RunView,
    signer: Signer,
    purpose: Purpose,
    kind: str,
    now: datetime,
    ttl_s: float | None,
    trust: TrustRoots | None,
    policy: Policy | None,
    target: int | None = None,
    reason: str = "",
    scope: str = "aligned",
) -> Prepared:
    state = view.state
    rules = _policy(view, policy, may_differ=True)
    binding = state.binding
    if policy is not None:  # the run continues under the policy the person names
        binding = replace(
            binding,
            policy_id=policy.policy_id,
            policy_version=policy.policy_version,
            policy_fingerprint=policy.fingerprint,
        )
    if rules is not None:
        allowed = rules.authority.rewind if purpose is Purpose.REWIND else rules.authority.recover
        if signer.role.value not in allowed:
            verb = "rewind it" if purpose is Purpose.REWIND else "admit its recovery"
            raise PolicyError(
                f"{signer.signer_id}'s key is {_a(signer.role.value)} key; under policy "
                f"{rules.policy_id} v{rules.policy_version} only {' or '.join(sorted(allowed))} "
                f"keys may {verb}",
                run_id=state.run_id,
            )
    request = admission_request(
        state,
        checkpoint_digest=view.mark.checkpoint_digest,
        policy=binding,
        purpose=purpose,
        target_generation=target,
        reason=reason,
        scope=scope,
    )
    body = new_admission(
        request,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=_ttl(ttl_s, rules)),
        nonce=_secrets.token_hex(16),
    )
    document = _signed(signer, body, signer.role, trust, view)
    if rules is not None:
        check_admission(
            body, signer.signer_id, request, now=now, ttl_s=rules.approval_ttl_s, run_id=view.run_id
        )
    return Prepared(state.run_id, kind, document, _bound(body), view.verified, state.generation)


def _fresh(view: RunView, seen_generation: int | None) -> RunState:
    """The state to sign against, refused if the person saw an older one."""
    state = view.state
    if seen_generation is not None and seen_generation != state.generation:
        raise StaleViewError(
            f"run {state.run_id} is at generation {state.generation}, not the "
            f"{seen_generation} you saw: look again before signing",
            run_id=state.run_id,
        )
    return state


def _role(signer: Signer, wanted: Role | tuple[Role, ...], what: str) -> Role:
    roles = wanted if isinstance(wanted, tuple) else (wanted,)
    if signer.role not in roles:
        names = " or ".join(_a(r.value) for r in roles)
        raise PolicyError(
            f"{signer.signer_id}'s key is {_a(signer.role.value)} key; to {what} it takes "
            f"{names} key"
        )
    return signer.role


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _signed(
    signer: Signer, body: dict[str, Any], role: Role, trust: TrustRoots | None, view: RunView
) -> dict[str, Any]:
    """Sign ``body``, refused first where the runtime's trust roots would refuse the signer.

    ``trust``: the roots the person names (the runtime's, now); else the ones
    the run's epoch opened under, as the store keeps them (:class:`RecordedTrust`).
    """
    if trust is None:
        _check_recorded(view, signer, role)
    document = signer.sign(body)
    if trust is not None:
        trust.verify(document, role)  # an unknown, revoked or other key: refused now
    return document


#: What to do when the run's own roots refuse a signer.
_TRUST_HINT = (
    "add the signer's public half to the runtime's trust file (`tether trust add "
    "NAME.trust.json --out FILE`) and restart it; if it runs with other roots now, "
    "name them (--trust FILE)"
)


def _check_recorded(view: RunView, signer: Signer, role: Role) -> None:
    """Refuse ``signer`` where the trust roots the run keeps in the store would."""
    recorded = view.trust
    if recorded is None:
        return  # a run from before they were recorded: the runtime checks it alone
    run = view.run_id
    if recorded.fingerprint is None:
        raise EvidenceError(
            f"run {run}'s runtime was given no trust roots (trace event {recorded.seq}): it "
            f"accepts no signed document, so {signer.signer_id}'s would be refused; give it "
            "trust roots (Runtime(trust=...), a trust file) and restart it; if it runs with "
            "roots now, name them (--trust FILE)",
            run_id=run,
        )
    if recorded.roots is None:
        raise EvidenceError(
            f"run {run}: the store lacks the trust roots its epoch opened under "
            f"({recorded.fingerprint}, trace event {recorded.seq}); name the runtime's "
            "roots (--trust FILE)",
            run_id=run,
        )
    recorded.roots.check_signer(
        signer,
        role,
        hint=f"run {run}'s runtime would refuse it (its trust roots, trace event "
        f"{recorded.seq}); {_TRUST_HINT}",
    )


def _policy(view: RunView, given: Policy | None, *, may_differ: bool = False) -> Policy | None:
    """The rules a document is judged by: the one the person names, else the run's own.

    Only an admission may name another policy than the run's (the run then
    continues under it, where that policy allows); evidence about the run's
    pending write or open case is judged by the policy the run runs under.
    """
    if given is None:
        return view.policy
    binding = view.state.binding
    if not may_differ and given.fingerprint != binding.policy_fingerprint:
        raise PolicyError(
            f"run {view.run_id} runs under policy {binding.policy_id} version "
            f"{binding.policy_version} ({binding.policy_fingerprint}); the policy given is "
            f"{given.policy_id} version {given.policy_version} ({given.fingerprint})",
            run_id=view.run_id,
        )
    return given


def _ttl(ttl_s: float | None, policy: Policy | None) -> float:
    allowed = None if policy is None else policy.approval_ttl_s
    if ttl_s is None:
        return DEFAULT_TTL_S if allowed is None else min(DEFAULT_TTL_S, allowed)
    if not ttl_s > 0:
        raise PolicyError(f"a ttl of {ttl_s:g} s has already expired: give a positive ttl")
    if allowed is not None and ttl_s > allowed:
        raise PolicyError(
            f"a ttl of {ttl_s:g} s is longer than the policy's approval_ttl_s ({allowed} s): "
            "the runtime would refuse it"
        )
    return ttl_s


def _bound(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key != "nonce"}
