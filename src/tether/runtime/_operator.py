"""What the people around a run see of it, and the documents they sign.

One set of rules for every tool a person uses (the ``tether`` command and
the operator page): :func:`open_run` reads a run back (verified when a
keyring is given), :func:`list_runs` says which runs wait for whom, and the
``prepare_*`` functions build, sign and check a document BEFORE it goes
anywhere, with the same core checks the runtime applies when it reads the
document from the inbox. A document the runtime would refuse (a wrong role,
an untrusted key, a ttl the policy does not allow, a run that moved on since
the person looked) is refused here, with the same typed error, and never
delivered. Nothing here holds the checkpoint key or changes run state:
:func:`deliver` only appends to the inbox.
"""

from __future__ import annotations

import json
import secrets as _secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from tether.core import (
    ActionClass,
    ActionKind,
    CancelRefusedError,
    CanonicalJSONError,
    CheckpointCorruptError,
    LedgerEntry,
    Phase,
    Policy,
    PolicyError,
    Purpose,
    RewindRefusedError,
    RunNotFoundError,
    RunState,
    SpecError,
    TetherError,
    TraceEvent,
    admission_request,
    check_admission,
    check_approval,
    check_cancel,
    check_decision,
    digest_bytes,
    format_time,
    needs_approval,
    new_admission,
    new_approval,
    new_cancel,
    new_decision,
    new_fork,
    replay_rules,
    strict_loads,
    validate_state,
)
from tether.crypto import Keyring, Role, Signer, TrustRoots
from tether.runtime._checkpointer import Checkpointer
from tether.runtime._clock import SystemClock
from tether.store import ContentStore, Evidence, GenerationStore, Mark

#: The lifetime a document gets when the person names none (never above the policy's).
DEFAULT_TTL_S = 900


class StaleViewError(PolicyError):
    """The run moved on since the person looked: what they saw is not what would be signed."""


@dataclass(frozen=True, slots=True)
class InboxItem:
    """One document in a run's inbox and what became of it.

    ``status``: ``waiting`` (the run has not read it yet), ``applied`` (read
    and accepted), ``refused`` (read and refused; ``why`` says why), or
    ``read`` when the view was opened without its history.
    """

    seq: int
    kind: str
    signer: str | None
    received_at: datetime
    status: str
    why: str | None = None


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as a person sees it: its checkpoint, trace, ledger and inbox.

    ``verified`` says whether the checkpoint, the trace chain and the ledger
    chain were checked under the keyring; unverified views are for display
    only (the runtime re-checks everything a signed document binds).
    ``policy`` is the run's policy when the store holds it (runs started
    by this version keep it, content-addressed by its fingerprint).
    """

    state: RunState
    mark: Mark
    verified: bool
    trace: tuple[TraceEvent, ...]
    ledger: tuple[LedgerEntry, ...]
    inbox: tuple[InboxItem, ...]
    policy: Policy | None
    #: When it was read: what "expired" and "waiting since" are measured against.
    read_at: datetime

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def waiting_for(self) -> str | None:
        """Who or what the run waits for, in a few words (``None``: nothing, or it ended)."""
        state = self.state
        if state.phase is Phase.NEEDS_REVIEW:
            cases = ", ".join(f"{c.case_id} ({c.reason})" for c in state.review_cases)
            return f"a reviewer's decision on {cases or 'the run'}"
        if state.phase is Phase.PENDING and state.pending is not None:
            pending = state.pending
            if self.needs_approval:
                return f"an approval of {pending.action_id} ({pending.intent.kind} {pending.intent.target})"
            return f"a worker to settle {pending.action_id}"
        if state.phase.terminal:
            return None
        if self.mark.attempts:
            return f"a retry after {self.mark.attempts} failed attempt(s): {self.mark.last_error}"
        return None

    @property
    def needs_approval(self) -> bool:
        """The pending write waits for an approval no valid document gives yet."""
        pending = self.state.pending
        if self.state.phase is not Phase.PENDING or pending is None:
            return False
        if self.policy is not None:
            kind = ActionKind(pending.intent.kind, ActionClass.WRITE)
            if not needs_approval(self.policy, kind):
                return False
        # An approval in force that has not expired: the worker goes on by itself.
        return not any(
            # Compared as the canonical UTC text they are signed in.
            str(document.get("body", {}).get("expires_at", "")) > format_time(self.read_at)
            for document in pending.approvals
        )

    @property
    def needs_person(self) -> bool:
        """Nothing happens to this run until a person acts (or it keeps failing)."""
        if self.state.phase is Phase.NEEDS_REVIEW or self.needs_approval:
            return True
        return not self.state.phase.terminal and self.mark.attempts > 0

    @property
    def refused(self) -> tuple[InboxItem, ...]:
        return tuple(item for item in self.inbox if item.status == "refused")

    def epochs(self) -> list[dict[str, Any]]:
        """Every epoch of the run, from its trace: how it was opened, by whom, from where, why."""
        epochs: list[dict[str, Any]] = []
        for event in self.trace:
            data = event.data
            at = format_time(event.at)
            if event.kind == "run_started":
                epochs.append({"epoch": 1, "opened_by": "start", "at": at, "generation": None})
            elif event.kind in {"recovered", "rewind_started"}:
                epochs.append(
                    {
                        "epoch": len(epochs) + 1,
                        "opened_by": "recovery" if event.kind == "recovered" else "rewind",
                        "at": at,
                        "epoch_id": data.get("epoch_id"),
                        "previous_epoch_id": data.get("previous_epoch_id"),
                        "principal": data.get("principal"),
                        "role": data.get("role"),
                        "signed": data.get("signed"),
                        "admission": data.get("admission"),
                        "generation": data.get("from_generation"),
                        "to_generation": data.get("to_generation"),
                        "reason": data.get("reason") or None,
                    }
                )
        return epochs

    def effects(self) -> list[dict[str, Any]]:
        """The ledger grouped by effect: its terms, its status now and every status it had."""
        by_key: dict[str, dict[str, Any]] = {}
        for entry in self.ledger:
            item = by_key.setdefault(
                entry.idempotency_key,
                {"key": entry.idempotency_key, "action_id": entry.action_id, "history": []},
            )
            if entry.terms is not None and "kind" not in item:
                item.update(
                    kind=entry.terms.kind,
                    target=entry.terms.target,
                    adapter=entry.terms.adapter,
                    retry=entry.terms.retry.value,
                    compensation=entry.terms.compensation.value,
                )
            receipt_id = (entry.receipt or {}).get("receipt_id")
            item.update(status=entry.status.value, epoch=entry.epoch)
            if receipt_id:
                item["receipt_id"] = receipt_id
            item["history"].append(
                {
                    "seq": entry.seq,
                    "status": entry.status.value,
                    "epoch": entry.epoch,
                    "receipt_id": receipt_id,
                }
            )
        return list(by_key.values())


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One line of ``tether runs``: where a run is and what it waits for, since when."""

    run_id: str
    phase: str
    generation: int
    epoch: int | None
    waiting_for: str | None
    since: datetime | None
    needs_person: bool
    attempts: int
    last_error: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "phase": self.phase,
            "generation": self.generation,
            "epoch": self.epoch,
            "waiting_for": self.waiting_for,
            "since": None if self.since is None else self.since.isoformat(),
            "needs_person": self.needs_person,
            "attempts": self.attempts,
            "last_error": self.last_error,
        }


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

    @property
    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = self.document["body"]
        return body


def open_run(
    store: ContentStore,
    run_id: str,
    *,
    keyring: Keyring | None = None,
    marks: GenerationStore | None = None,
    now: datetime | None = None,
    history: bool = True,
) -> RunView:
    """Read ``run_id`` back: verified under ``keyring`` (every check), else read as stored.

    ``now`` (default: the system clock) is what approval expiry is judged by.
    ``history=False`` reads the checkpoint alone (no trace, no ledger, and so
    no reasons for refused documents): enough to say what the run waits for.
    """
    trace: tuple[TraceEvent, ...] = ()
    ledger: tuple[LedgerEntry, ...] = ()
    if keyring is not None:
        checkpointer = Checkpointer(store, keyring, marks=marks)
        restored = checkpointer.load(run_id)
        state, mark = restored.state, restored.mark
        if history:
            trace = tuple(checkpointer.verified_trace(state))
            ledger = tuple(checkpointer.verified_ledger(state))
    else:
        state, mark = _unverified_state(store, run_id, marks)
        if history:
            trace = tuple(store.trace(run_id, state.trace_head))
            ledger = tuple(store.ledger(run_id))
    return RunView(
        state=state,
        mark=mark,
        verified=keyring is not None,
        trace=trace,
        ledger=ledger,
        inbox=_inbox(store.evidence(run_id), state, trace if history else None),
        policy=_stored_policy(store, state),
        read_at=now if now is not None else SystemClock().now(),
    )


def list_runs(
    store: ContentStore,
    *,
    keyring: Keyring | None = None,
    marks: GenerationStore | None = None,
    phase: str | None = None,
    needs_person: bool = False,
    now: datetime | None = None,
) -> list[RunSummary]:
    """Every run the store holds, those that need a person first, then the longest waiting.

    A run that cannot be read back (a damaged checkpoint, a key the keyring
    lacks) is listed too, as needing a person, with the reason.
    """
    found = (marks if marks is not None else _marks_of(store)).runs()
    rows: list[RunSummary] = []
    for mark in found:
        if phase is not None and mark.phase != phase:
            continue
        try:
            view = open_run(
                store, mark.run_id, keyring=keyring, marks=marks, now=now, history=False
            )
        except TetherError as exc:
            rows.append(
                RunSummary(
                    mark.run_id,
                    mark.phase,
                    mark.generation,
                    None,
                    f"a person: cannot read it ({type(exc).__name__}: {exc})",
                    None,
                    True,
                    mark.attempts,
                    mark.last_error,
                )
            )
            continue
        rows.append(
            RunSummary(
                view.run_id,
                view.state.phase.value,
                view.state.generation,
                view.state.epoch,
                view.waiting_for,
                view.state.updated_at,
                view.needs_person,
                mark.attempts,
                mark.last_error,
            )
        )
    if needs_person:
        rows = [row for row in rows if row.needs_person]
    rows.sort(key=lambda r: (not r.needs_person, r.since is None, r.since or 0, r.run_id))
    return rows


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
    body = new_approval(
        state,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=_ttl(ttl_s, rules)),
        nonce=_secrets.token_hex(16),
    )
    document = _signed(signer, body, Role.APPROVER, trust)
    if rules is not None:
        check_approval(
            body,
            signer.signer_id,
            state,
            now=now,
            ttl_s=rules.approval_ttl_s,
            consumed=frozenset(pending.nonces),
        )
    shown = {
        **_bound(body),
        "run_generation": state.generation,
        "write": f"{pending.intent.kind} {pending.intent.target}",
        "arguments": _short(pending.intent.args),
    }
    return Prepared(state.run_id, "approval", document, shown, view.verified)


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
) -> Prepared:
    """A reviewer decision on an open case, refused here if the runtime would refuse it."""
    state = _fresh(view, seen_generation)
    case = next((c for c in state.review_cases if c.case_id == case_id), None)
    if state.phase is not Phase.NEEDS_REVIEW or case is None:
        raise PolicyError(f"run {state.run_id} has no open review case {case_id!r}")
    _role(signer, Role.REVIEWER, "decide a review")
    rules = _policy(view, policy)
    body = new_decision(
        state,
        case,
        signer.signer_id,
        decision,
        issued_at=now,
        expires_at=now + timedelta(seconds=_ttl(ttl_s, rules)),
        nonce=_secrets.token_hex(16),
    )
    document = _signed(signer, body, Role.REVIEWER, trust)
    if rules is not None:
        check_decision(body, signer.signer_id, state, case, now=now, ttl_s=rules.approval_ttl_s)
    shown = {**_bound(body), "reason": case.reason, "detail": case.detail}
    return Prepared(state.run_id, "review_decision", document, shown, view.verified)


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
    document = _signed(signer, body, role, trust)
    shown = {**_bound(body), "earlier_action": known.action_id}
    return Prepared(state.run_id, "fork", document, shown, view.verified)


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
    allowed = ("operator",) if rules is None else tuple(sorted(rules.authority.cancel))
    role = _role(signer, tuple(Role(name) for name in allowed), "cancel a run")
    body = new_cancel(
        state,
        signer.signer_id,
        reason=reason,
        issued_at=now,
        expires_at=now + timedelta(seconds=_ttl(ttl_s, rules)),
        nonce=_secrets.token_hex(16),
    )
    document = _signed(signer, body, role, trust)
    if rules is not None:
        check_cancel(body, signer.signer_id, state, now=now, ttl_s=rules.approval_ttl_s)
    return Prepared(state.run_id, "cancel", document, _bound(body), view.verified)


def deliver(store: ContentStore, prepared: Prepared) -> int:
    """Leave the signed document in the run's inbox; its sequence number there."""
    return store.put_evidence(prepared.run_id, prepared.kind, prepared.document)


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
            raise PolicyError(
                f"{signer.signer_id} is a {signer.role.value}; under policy "
                f"{rules.policy_id} v{rules.policy_version} only {sorted(allowed)} may "
                f"{purpose.value}",
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
    document = _signed(signer, body, signer.role, trust)
    if rules is not None:
        check_admission(
            body, signer.signer_id, request, now=now, ttl_s=rules.approval_ttl_s, run_id=view.run_id
        )
    return Prepared(state.run_id, kind, document, _bound(body), view.verified)


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
        names = " or ".join(
            f"an {r.value}" if r.value[0] in "aeiou" else f"a {r.value}" for r in roles
        )
        raise PolicyError(
            f"{signer.signer_id}'s key is a {signer.role.value} key; to {what} it takes {names} key"
        )
    return signer.role


def _signed(
    signer: Signer, body: dict[str, Any], role: Role, trust: TrustRoots | None
) -> dict[str, Any]:
    """Sign ``body``; with the trust roots the runtime uses, check it verifies under them."""
    document = signer.sign(body)
    if trust is not None:
        trust.verify(document, role)  # an unknown, revoked or other key: refused now
    return document


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


def _short(value: Any, limit: int = 400) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + " ..."


def _marks_of(store: ContentStore) -> GenerationStore:
    if not isinstance(store, GenerationStore):
        raise TetherError("this store keeps no high-water marks: name the marks store")
    return store


def _unverified_state(
    store: ContentStore, run_id: str, marks: GenerationStore | None
) -> tuple[RunState, Mark]:
    mark = (marks if marks is not None else _marks_of(store)).get_mark(run_id)
    if mark is None:
        raise RunNotFoundError(run_id)
    envelope = store.get_checkpoint(run_id, mark.checkpoint_digest)
    if envelope is None:
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint the mark names is missing", run_id=run_id
        )
    try:
        document = strict_loads(envelope)
    except CanonicalJSONError as exc:
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint is not a well-formed envelope: {exc}", run_id=run_id
        ) from exc
    if not isinstance(document, dict) or not isinstance(document.get("payload"), dict):
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint envelope carries no payload object", run_id=run_id
        )
    state = RunState.from_json(document["payload"])
    # What is shown must at least be what is signed: the invariants tie the
    # displayed intent to its digest, which the documents bind.
    validate_state(state)
    return state, mark


def _stored_policy(store: ContentStore, state: RunState) -> Policy | None:
    fingerprint = state.binding.policy_fingerprint
    data = store.get_blob(fingerprint)
    if data is None or digest_bytes(data) != fingerprint:
        return None
    try:
        policy = Policy.from_json(data)
    except SpecError:
        return None
    return policy if policy.fingerprint == fingerprint else None


def _inbox(
    found: list[Evidence], state: RunState, trace: tuple[TraceEvent, ...] | None
) -> tuple[InboxItem, ...]:
    refusals = {
        event.data.get("seq"): f"{event.data.get('error')}: {event.data.get('message')}"
        for event in trace or ()
        if event.kind == "evidence_refused"
    }
    items = []
    for item in found:
        signer = item.document.get("signer")
        if item.seq > state.inbox_cursor:
            status, why = "waiting", None
        elif trace is None:  # read, but without the trace nobody can say how it went
            status, why = "read", None
        elif item.seq in refusals:
            status, why = "refused", refusals[item.seq]
        else:
            status, why = "applied", None
        items.append(
            InboxItem(
                item.seq,
                item.kind,
                signer if isinstance(signer, str) else None,
                item.received_at,
                status,
                why,
            )
        )
    return tuple(items)
