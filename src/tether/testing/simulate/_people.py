"""The people around a run: they sign approvals, reviews, cancels, rewinds, admissions, forks.

Each act reads the run as a person would (the verified checkpoint the mark
names), signs with a test key whose role the runtime trusts, and leaves the
document in the run's inbox, where the next step reads it, as ``tether
approve`` and its siblings do. Nonces are deterministic (the simulator's
own counter), so a seed replays exactly. What they signed is kept, so the
invariants can tell an approved send or a signed fork from one nobody asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from tether.core import (
    Phase,
    Purpose,
    TetherError,
    admission_request,
    new_admission,
    new_approval,
    new_cancel,
    new_decision,
    new_fork,
)
from tether.core import _replay as replay_rules
from tether.core._case_table import CaseKind, case_kind, earlier_key
from tether.core._evidence import consumed_nonces
from tether.crypto import Signer, TrustRoots
from tether.testing.simulate._scenario import RUN_ID, Event

#: The simulation these acts apply to (its runner; typed loosely so the runner, which
#: dispatches to these acts, is the only one of the two that imports the other).
Simulation = Any


APPROVER = Signer.generate("alice", "approver")
REVIEWER = Signer.generate("rita", "reviewer")
OPERATOR = Signer.generate("oscar", "operator")
TRUST = TrustRoots.of(APPROVER.trust_root(), REVIEWER.trust_root(), OPERATOR.trust_root())
LIFETIME = timedelta(seconds=300)


@dataclass
class People:
    """What the people signed: approvals by (key, digest) and by action id, forks by key."""

    #: (key, digest) -> the policy version each approval was signed under -> until when
    #: the longest-lived of them lives (simulated seconds).
    approvals: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    approved_actions: set[str] = field(default_factory=set)
    #: Action id -> until when its approval lives (simulated seconds).
    approved_until: dict[str, float] = field(default_factory=dict)
    #: Key of a committed gated effect -> until when a replay of it stands approved
    #: (the approval it was sent under, or a person's approval of one replay of it).
    replays_approved: dict[str, float] = field(default_factory=dict)
    #: Idempotency keys of committed effects a signed fork asked to do once more.
    forked: list[str] = field(default_factory=list)
    #: A nonce the run had consumed -> the case a reviewer's decision reused it for.
    reused: dict[str, str] = field(default_factory=dict)
    nonce: int = 0

    def next_nonce(self) -> str:
        self.nonce += 1
        return f"{self.nonce:032x}"

    def approval_until(self, key: str, digest: str, versions: Iterable[str]) -> float | None:
        """Until when an approval of (key, digest) signed under one of ``versions`` lives."""
        signed, wanted = self.approvals.get((key, digest), {}), set(versions)
        found = [until for version, until in signed.items() if version in wanted]
        return max(found) if found else None


def _deliver(sim: Simulation, kind: str, signer: Signer, body: dict[str, Any]) -> None:

    sim.observer.put_evidence(RUN_ID, kind, signer.sign(body))


def approve(sim: Simulation, event: Event) -> None:
    """Approve the pending gated write (``short``: for five seconds; ``refuse``: not at all)."""
    state = sim.state("pending")
    pending = None if state is None else state.pending
    if state is None or state.phase is not Phase.PENDING or pending is None:
        return
    if not sim._gated(pending.intent.kind) or event.arg == "refuse":
        return
    ttl = 5.0 if event.arg == "short" else LIFETIME.total_seconds()
    now = sim.clock.now()
    body = new_approval(
        state,
        APPROVER.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl),
        nonce=sim.people.next_nonce(),
    )
    bound = (pending.idempotency_key, pending.intent.digest)
    # The longest-lived approval counts: an earlier one may already be recorded. It
    # is an approval under the policy version the run is bound to, and no other.
    signed = sim.people.approvals.setdefault(bound, {})
    version = state.binding.policy_version
    signed[version] = max(signed.get(version, -1.0), sim.clock.seconds + ttl)
    sim.people.approved_actions.add(pending.action_id)
    sim.people.approved_until[pending.action_id] = max(
        sim.people.approved_until.get(pending.action_id, -1.0), sim.clock.seconds + ttl
    )
    _deliver(sim, "approval", APPROVER, body)


#: Cases whose write's outcome is unknown: a person can look in the world and settle them.
UNKNOWN = frozenset(
    {CaseKind.UNKNOWN_OUTCOME, CaseKind.UNKNOWN_ON_CANCEL, CaseKind.UNKNOWN_EARLIER}
)


def review(sim: Simulation, event: Event) -> None:
    """Decide the open review case: ``replan``, ``abort``, ``accept`` or ``settle``.

    ``settle`` (and ``accept``, which only a drift case takes: on a write whose
    outcome is unknown the person settles it instead) looks in the world, as a
    person looks in the mailbox or the service: a reception under the case's
    key is signed ``landed`` with what was found, none ``not_landed`` (an
    earlier attempt a replan set aside takes only ``landed``); while the
    service is still carrying a request under the key out and tether cannot ask
    it by key, the person waits (where it can, the runtime refuses the
    ``not_landed``, and the person decides again another day). The judge is
    told, so nothing may be sent under a key signed landed, and a key signed
    not_landed may reach the world once.
    """
    state = sim.state("needs_review")
    if state is None or state.phase is not Phase.NEEDS_REVIEW or not state.review_cases:
        return
    case = state.review_cases[-1]
    decision, evidence, key = event.arg, None, ""
    kind = case_kind(case, state)
    if decision in {"settle", "accept"} and kind in UNKNOWN:
        key = earlier_key(case) if kind is CaseKind.UNKNOWN_EARLIER else case.idempotency_key
        found = [r for r in sim.world.receptions if r.key == key]
        if not found and sim.tickets.in_flight(key) and not sim.tickets.capabilities.queryable:
            # The service is still carrying it out, and tether cannot ask it (the case
            # card warns so): a careful person waits to see it land rather than sign
            # not_landed (exploration seeds 70797, 72229, 74202). Where it can be asked,
            # the person signs, and the runtime must refuse the not_landed itself.
            return
        if found:
            decision, evidence = "landed", f"{found[0].namespace}:{found[0].identity}"
        elif kind is CaseKind.UNKNOWN_EARLIER:
            return  # nothing to find: its effect is sent again only by a fork
        else:
            # What was searched, as a person must say where a key look-up proves nothing
            # (past retention, absence not final, a takeover): the world itself.
            decision, evidence = "not_landed", f"no reception under {key} in the world"
    now = sim.clock.now()
    try:
        body = new_decision(
            state,
            case,
            REVIEWER.signer_id,
            decision,
            issued_at=now,
            expires_at=now + LIFETIME,
            nonce=sim.people.next_nonce(),
            evidence=evidence,
        )
    except TetherError:
        return  # a decision the case does not take: the person picks another day
    if key:
        sim.judge.settled[key] = decision
    _deliver(sim, "review_decision", REVIEWER, body)


def reuse(sim: Simulation, event: Event) -> None:
    """A reviewer decides the open case with a nonce the run consumed before (another case's,
    an approval's, a fork's or a cancel's): the runtime must refuse it."""
    state = sim.state("needs_review")
    if state is None or state.phase is not Phase.NEEDS_REVIEW or not state.review_cases:
        return
    consumed = sorted(consumed_nonces(state))
    if not consumed:
        return
    case = state.review_cases[-1]
    now = sim.clock.now()
    try:
        body = new_decision(
            state,
            case,
            REVIEWER.signer_id,
            event.arg,
            issued_at=now,
            expires_at=now + LIFETIME,
            nonce=consumed[0],
        )
    except TetherError:
        return
    sim.people.reused[consumed[0]] = case.case_id
    _deliver(sim, "review_decision", REVIEWER, body)


def cancel(sim: Simulation, event: Event) -> None:
    """An operator cancels a run that is neither over nor frozen."""
    state = sim.state("running", "pending")
    if state is None or state.phase.terminal or state.phase is Phase.NEEDS_REVIEW:
        return
    now = sim.clock.now()
    body = new_cancel(
        state,
        OPERATOR.signer_id,
        reason="the simulator's operator cancels",
        issued_at=now,
        expires_at=now + LIFETIME,
        nonce=sim.people.next_nonce(),
    )
    _deliver(sim, "cancel", OPERATOR, body)


def _admission(sim: Simulation, purpose: Purpose, target: int | None, kind: str) -> None:

    restored = sim.load()
    if restored is None:
        return
    state = restored.state
    if state.phase.terminal:
        return
    now = sim.clock.now()
    request = admission_request(
        state,
        checkpoint_digest=restored.mark.checkpoint_digest,
        policy=state.binding,
        purpose=purpose,
        target_generation=target,
        reason="the simulator's operator" if purpose is Purpose.RECOVERY else "go back",
    )
    body = new_admission(
        request,
        OPERATOR.signer_id,
        issued_at=now,
        expires_at=now + LIFETIME,
        nonce=sim.people.next_nonce(),
    )
    _deliver(sim, kind, OPERATOR, body)


def rewind(sim: Simulation, event: Event) -> None:
    """An operator rewinds context and workspace to an earlier generation (``num``: how far)."""
    state = sim.state("running")
    if state is None or state.phase is not Phase.RUNNING or state.generation < 2:
        return
    target = max(1, int(state.generation * event.num))
    if target >= state.generation:
        target = state.generation - 1
    _admission(sim, Purpose.REWIND, target, "rewind")


def admit(sim: Simulation, event: Event) -> None:
    """An operator admits the run's next recovery (a signed admission in the inbox)."""
    _admission(sim, Purpose.RECOVERY, None, "admission")


def fork(sim: Simulation, event: Event) -> None:
    """A reviewer asks for a committed effect once more (the newest one the ledger records)."""

    state = sim.state("running", "pending", "needs_review")
    if state is None:
        return
    known = replay_rules.known_effects(sim.ledger())
    current = [k.current for k in known.values() if k.current is not None]
    committed = [c for c in current if c.receipt_id is not None]
    if not committed:
        return
    chosen = committed[-1]
    now = sim.clock.now()
    body = new_fork(
        state,
        chosen,
        REVIEWER.signer_id,
        issued_at=now,
        expires_at=now + LIFETIME,
        nonce=sim.people.next_nonce(),
    )
    sim.people.forked.append(chosen.idempotency_key)
    _deliver(sim, "fork", REVIEWER, body)


ACTS: dict[str, Callable[[Simulation, Event], None]] = {
    "approve": approve,
    "review": review,
    "reuse": reuse,
    "cancel": cancel,
    "rewind": rewind,
    "admit": admit,
    "fork": fork,
}
