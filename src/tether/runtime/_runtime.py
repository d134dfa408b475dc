"""The runtime: propose -> gate -> pending -> execute -> receipt -> advance, and recovery.

A :class:`Runtime` is configuration (stores, keys, adapter, task, policy,
agent, clock). :meth:`Runtime.start` and :meth:`Runtime.recover` return a
:class:`RunSession`, one epoch of one run, which advances it step by step.

The order of a write, and why:

1. the intent and its freshly minted key are checkpointed (phase pending)
   before anything leaves the process;
2. the ledger records ``intended`` and ``dispatched``;
3. the adapter executes with that key and returns its receipt;
4. the ledger records ``committed`` with the receipt;
5. the state advances (checkpoint, phase running).

Recovery from any point between 1 and 5 goes through :meth:`RunSession.step`,
which asks the adapter (the authority) before it acts, and freezes the run
for review when the truth cannot be known.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import Any

from tether.adapters import Adapter, Fence
from tether.core import (
    GENESIS_HASH,
    ApprovalExpiredError,
    ApprovalRequiredError,
    Binding,
    CheckpointCorruptError,
    ContractViolationError,
    EffectStatus,
    EnvironmentDriftError,
    Intent,
    MissingHighWaterMarkError,
    PendingWrite,
    Phase,
    Policy,
    Proposal,
    Receipt,
    ReviewCase,
    RunFrozenError,
    RunState,
    RunTerminalError,
    Spent,
    TaskSpec,
    TraceEvent,
    Verification,
    check_phase_move,
    digest,
    gate,
    risk_of,
    seal_event,
)
from tether.core import Rejection as GateRejection
from tether.core._evidence import parse_utc
from tether.crypto import Keyring, TrustRoots
from tether.runtime import _humans, _settle
from tether.runtime._agent import Agent, AgentContext, Decision
from tether.runtime._checkpointer import Checkpointer
from tether.runtime._clock import Clock, IdSource, RandomIds, SystemClock
from tether.runtime._crash import NO_CRASH, CrashPlan, CrashPoint
from tether.store import ContentStore, GenerationStore, Lease, LedgerEntry

Event = tuple[str, dict[str, Any]]


class Runtime:
    """Everything a run needs besides its state."""

    def __init__(
        self,
        *,
        store: ContentStore,
        keyring: Keyring,
        adapter: Adapter,
        task: TaskSpec,
        policy: Policy,
        agent: Agent,
        marks: GenerationStore | None = None,
        clock: Clock | None = None,
        ids: IdSource | None = None,
        crash: CrashPlan = NO_CRASH,
        worker: str | None = None,
        trust: TrustRoots | None = None,
        lease_ttl_s: float | None = None,
    ) -> None:
        self.store = store
        self.adapter = adapter
        self.task = task
        self.policy = policy
        self.agent = agent
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.ids: IdSource = ids if ids is not None else RandomIds()
        self.crash = crash
        # Unique per process by default: two processes never share a worker id.
        self.worker = worker or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.trust = trust
        # None: one process owns its runs (no lease). A number: every start and
        # recovery takes the run's lease for that long and renews it as it works.
        self.lease_ttl_s = lease_ttl_s
        self.checkpointer = Checkpointer(store, keyring, marks=marks, crash=crash)
        self.binding = Binding.of(task, policy)

    def start(self, run_id: str | None = None, context: AgentContext | None = None) -> RunSession:
        """Begin a new run in the task's expected initial environment."""
        env = self.adapter.environment()
        expected = self.task.initial_environment
        if (
            env.namespace != expected.namespace
            or env.state_fingerprint != expected.state_fingerprint
        ):
            raise EnvironmentDriftError(
                "the environment is not the task's expected initial state",
                expected={
                    "namespace": expected.namespace,
                    "fingerprint": expected.state_fingerprint,
                },
                actual=env.to_json(),
            )
        context = context if context is not None else AgentContext()
        context_digest, body = context.encode()
        now = self.clock.now()
        run_id = run_id if run_id is not None else self.ids.new_id("run")
        genesis = RunState(
            run_id=run_id,
            generation=0,
            epoch=1,
            worker=self.worker,
            binding=self.binding,
            phase=Phase.RUNNING,
            stop_reason=None,
            started_at=now,
            updated_at=now,
            plan_cursor=context.plan_cursor,
            agent_context_digest=context_digest,
            spent=Spent(),
            environment=env,
            adapter_version=self.adapter.version,
            observed_version=env.version,
            pending=None,
            last_write=None,
            writes_committed=0,
            verification=None,
            review_cases=(),
            quarantined_keys=(),
            consumed_nonces=(),
            trace_head=GENESIS_HASH,
            trace_length=0,
        )
        session = RunSession(self, genesis, context)
        session.commit(
            genesis,
            [("run_started", {"task": self.binding.to_json(), "environment": env.to_json()})],
            blobs={context_digest: body},
        )
        if self.lease_ttl_s is not None:
            session.hold(
                self.checkpointer.marks.acquire_lease(run_id, self.worker, self.lease_ttl_s)
            )
        return session

    def start_or_recover(self, run_id: str, context: AgentContext | None = None) -> RunSession:
        """Recover ``run_id``, or start it if its first checkpoint never landed.

        A run with no mark whose content never got past generation 1 never
        dispatched anything (a write needs a landed pending checkpoint after
        the first), so starting it again is safe. Any later content without a
        mark means the mark was lost: that fails closed.
        """
        if self.checkpointer.marks.get_mark(run_id) is None:
            newest = self.store.newest_generation(run_id)
            if newest is not None and newest > 1:
                raise MissingHighWaterMarkError(run_id)
            return self.start(run_id, context)
        return self.recover(run_id)

    def recover(self, run_id: str, lease: Lease | None = None) -> RunSession:
        """Restore the newest checkpoint (every check, failing closed) and open a new epoch.

        With leases on, the run's lease is taken first (or ``lease``, one the
        caller already claimed, is used), so two recovering workers never both
        advance the run: the loser gets :class:`~tether.core.LeaseHeldError`.
        """
        if lease is None and self.lease_ttl_s is not None:
            lease = self.checkpointer.marks.acquire_lease(run_id, self.worker, self.lease_ttl_s)
        restored = self.checkpointer.restore(run_id, self.binding, self.adapter)
        state = restored.state
        body = self.store.get_blob(state.agent_context_digest)
        if body is None:
            raise CheckpointCorruptError(
                f"run {run_id}: agent context {state.agent_context_digest} is missing",
                run_id=run_id,
            )
        context = AgentContext.decode(state.agent_context_digest, body)
        _humans.check_restorable(self, state)
        session = RunSession(self, state, context)
        if lease is not None:
            session.hold(lease)
        if state.phase.terminal or state.phase is Phase.NEEDS_REVIEW:
            return session  # nothing may change; an operator can still read everything
        session.commit(
            state.evolve(epoch=state.epoch + 1, worker=self.worker),
            [
                (
                    "recovered",
                    {
                        "from_generation": state.generation,
                        "previous_epoch": state.epoch,
                        "previous_worker": state.worker,
                        "phase": state.phase.value,
                    },
                )
            ],
        )
        return session


class RunSession:
    """One epoch of one run: the current state and the agent's context."""

    def __init__(self, runtime: Runtime, state: RunState, context: AgentContext) -> None:
        self.rt = runtime
        self.state = state
        self.context = context
        self.lease: Lease | None = None
        self._renewed = 0.0

    # -- the lease -------------------------------------------------------------

    def hold(self, lease: Lease) -> None:
        """Work under ``lease``: its version fences every commit and adapter call."""
        self.lease = lease
        self._renewed = time.monotonic()

    def release(self) -> None:
        """Give the lease up (a clean shutdown), so another worker may take the run at once."""
        if self.lease is not None:
            self.rt.checkpointer.marks.release_lease(
                self.run_id, self.lease.owner, self.lease.lease_version
            )
            self.lease = None

    def _guard(self) -> Fence | None:
        """Before every effect: renew if a third of the ttl has passed, then check the lease.

        Returns the fencing token for adapters that can check it.
        """
        lease, ttl = self.lease, self.rt.lease_ttl_s
        if lease is None:
            return None
        marks = self.rt.checkpointer.marks
        if ttl is not None and time.monotonic() - self._renewed > ttl / 3:
            lease = marks.renew_lease(self.run_id, lease.owner, lease.lease_version, ttl)
            self.hold(lease)
        marks.check_lease(self.run_id, lease.lease_version)
        if not self.rt.adapter.capabilities.fencing:
            return None
        return Fence(self.run_id, lease.lease_version, lease.expires_at)

    @property
    def run_id(self) -> str:
        return self.state.run_id

    # -- committing ----------------------------------------------------------

    def commit(
        self,
        state: RunState,
        events: list[Event],
        *,
        context: AgentContext | None = None,
        blobs: dict[str, bytes] | None = None,
    ) -> None:
        """Append ``events`` to the trace and checkpoint ``state`` as the next generation."""
        if self.state.generation:
            check_phase_move(self.state.phase, state.phase)
        now = self.rt.clock.now()
        head, length = self.state.trace_head, self.state.trace_length
        sealed: list[TraceEvent] = []
        for kind, data in events:
            event = seal_event(state.run_id, length + 1, kind, now, data, head)
            sealed.append(event)
            head, length = event.hash, length + 1
        blobs = dict(blobs or {})
        if context is not None:
            context_digest, body = context.encode()
            if context_digest != self.state.agent_context_digest:
                blobs[context_digest] = body
            state = state.evolve(agent_context_digest=context_digest)
        new = state.evolve(
            generation=self.state.generation + 1,
            trace_head=head,
            trace_length=length,
            updated_at=max(now, state.started_at),
        )
        self.rt.checkpointer.advance(
            new,
            self.state.generation,
            sealed,
            blobs or None,
            expected_lease_version=0 if self.lease is None else self.lease.lease_version,
        )
        self.state = new
        if context is not None:
            self.context = context

    # -- driving -------------------------------------------------------------

    def run(self, max_steps: int | None = None) -> RunState:
        """Step until the run is terminal, frozen, or waits for an approval (or ``max_steps``)."""
        taken = 0
        if self.state.phase is Phase.NEEDS_REVIEW:
            _humans.consume_inbox(self)  # a decision may open it; step() reads the inbox otherwise
        while not self.state.phase.terminal and self.state.phase is not Phase.NEEDS_REVIEW:
            if max_steps is not None and taken >= max_steps:
                break
            try:
                self.step()
            except (ApprovalRequiredError, ApprovalExpiredError):
                break  # a person has to act; the run waits, durable, in pending
            taken += 1
        return self.state

    def consume_inbox(self) -> RunState:
        """Apply signed evidence waiting in the store's inbox (also done by every step)."""
        _humans.consume_inbox(self)
        return self.state

    def approve(self, document: Any) -> RunState:
        """Record a signed approval for the pending write (see ``tether.crypto.Signer``)."""
        return _humans.approve(self, document)

    def review(self, document: Any) -> RunState:
        """Apply a signed reviewer decision (replan or abort) to the open review case."""
        return _humans.review(self, document)

    @property
    def awaiting_approval(self) -> bool:
        """Whether the pending write needs an approval it does not have (or whose time ran out)."""
        if not _humans.needs_approval(self.rt, self.state):
            return False
        body = _humans.active_approval(self.state)
        return body is None or self.rt.clock.now() >= parse_utc(body, "expires_at")

    def step(self) -> RunState:
        """Advance the run by one decision (or settle its pending write)."""
        _humans.consume_inbox(self)
        self._refuse_if_stopped()
        self._guard()  # renews a held lease when due, and stops a worker that lost it
        if self.state.phase is Phase.PENDING:
            _settle.settle(self)
            return self.state
        state = self.state
        exhausted = self._exhausted()
        if exhausted is not None:
            self._fail(f"budget_exhausted:{exhausted}")
            return self.state
        observation = self.rt.adapter.observe()
        env = observation.environment
        events: list[Event] = []
        if env.instance_id != state.environment.instance_id:
            raise EnvironmentDriftError(
                "the adapter now serves another environment instance; refusing to act",
                expected=state.environment.to_json(),
                actual=env.to_json(),
            )
        if env != state.environment:
            events.append(
                ("environment_changed", {"from": state.environment.to_json(), "to": env.to_json()})
            )
        self.rt.crash.hit(CrashPoint.BEFORE_PROPOSAL)
        decision = self.rt.agent.decide(self.context, observation)
        base = state.evolve(
            environment=env,
            observed_version=env.version,
            plan_cursor=decision.context.plan_cursor,
            spent=_spent(state.spent, steps=1),
            # Evidence about an older environment proves nothing about this one.
            verification=state.verification
            if state.verification is not None
            and state.verification.env_version == env.version
            and state.verification.state_fingerprint == env.state_fingerprint
            else None,
        )
        if decision.finished:
            self._finish(base, decision, events)
        elif decision.proposal is None:
            self.commit(base, [*events, ("agent_waited", {})], context=decision.context)
        else:
            self._propose(base, decision, decision.proposal, events)
        return self.state

    # -- proposing -----------------------------------------------------------

    def _propose(
        self, base: RunState, decision: Decision, proposal: Proposal, events: list[Event]
    ) -> None:
        rt = self.rt
        spent = _spent(base.spent, proposals=1)
        rejection = gate(
            proposal,
            task=rt.task,
            policy=rt.policy,
            phase=base.phase,
            environment=base.environment,
            now=rt.clock.now(),
            action_seen=rt.store.action_seen(base.run_id, proposal.action_id),
            cost_spent=base.spent.cost,
        )
        args: dict[str, Any] = {}
        if rejection is None:
            try:
                args = rt.adapter.normalize(proposal.kind, proposal.target, proposal.args)
            except ContractViolationError as exc:
                rejection = GateRejection(exc.reason, str(exc))
        if rejection is not None:
            state = base.evolve(spent=spent)
            rejected: Event = (
                "proposal_rejected",
                {
                    "action_id": str(proposal.action_id),
                    "reason": rejection.reason,
                    "message": rejection.message,
                },
            )
            if spent.proposals >= rt.task.budgets.proposals:
                state = state.evolve(phase=Phase.FAILED, stop_reason="budget_exhausted:proposals")
            self.commit(state, [*events, rejected], context=decision.context)
            return
        intent = Intent(
            kind=proposal.kind,
            target=proposal.target,
            args=args,
            risk=risk_of(rt.policy, proposal.kind).value,
        )
        key = rt.ids.new_id("idem")
        expected_post = rt.adapter.derive_post_state(base.environment, intent)
        pending = PendingWrite(
            action_id=proposal.action_id,
            intent=intent,
            intent_digest=intent.digest,
            idempotency_key=key,
            prestate=base.environment,
            expected_post=expected_post,
            generation=base.generation + 1,
            proposed_at=rt.clock.now(),
            cost=proposal.cost,
        )
        state = base.evolve(
            phase=Phase.PENDING,
            pending=pending,
            spent=_spent(spent, cost=proposal.cost),
        )
        accepted: Event = (
            "intent_persisted",
            {
                "action_id": pending.action_id,
                "idempotency_key": key,
                "intent_digest": pending.intent_digest,
                "kind": intent.kind,
                "target": intent.target,
                "expected_post": expected_post.to_json(),
            },
        )
        if _humans.needs_approval(rt, state):
            # It waits, durable, for a person; nothing leaves the process.
            requested: Event = (
                "approval_requested",
                {"action_id": pending.action_id, "idempotency_key": key},
            )
            self.commit(state, [*events, accepted, requested], context=decision.context)
            return
        self.commit(state, [*events, accepted], context=decision.context)
        rt.crash.hit(CrashPoint.INTENT_PERSISTED)
        _settle.settle(self)

    # -- finishing, failing, freezing -------------------------------------------

    def _finish(self, base: RunState, decision: Decision, events: list[Event]) -> None:
        rt = self.rt
        self._guard()
        result = rt.adapter.verify(rt.task.verifier.argv, rt.task.verifier.timeout_s)
        verification = Verification(
            env_version=result.environment.version,
            state_fingerprint=result.environment.state_fingerprint,
            passed=result.passed,
            exit_code=result.exit_code,
            output_digest=result.output_digest,
            at=rt.clock.now(),
        )
        judged_here = result.environment == base.environment
        verified: Event = (
            "verifier_ran",
            {
                **verification.to_json(),
                "judged_current_state": judged_here,
                "output_tail": result.output_tail[-500:],
            },
        )
        state = base.evolve(verification=verification)
        if result.passed and judged_here:
            state = state.evolve(phase=Phase.COMPLETED, stop_reason="verified")
            self.commit(
                state,
                [*events, verified, ("completed", {"summary": decision.summary})],
                context=decision.context,
            )
        else:
            self.commit(state, [*events, verified], context=decision.context)

    def _fail(self, reason: str) -> None:
        self.commit(
            self.state.evolve(phase=Phase.FAILED, stop_reason=reason),
            [("failed", {"reason": reason})],
        )

    def _freeze(
        self,
        reason: str,
        receipt: Receipt | None,
        detail: str,
        *,
        cached: dict[str, Any] | None = None,
    ) -> None:
        """Enter needs_review, keeping the pending intent and every piece of evidence."""
        rt = self.rt
        pending = self._pending()
        environment = rt.adapter.environment()
        evidence: tuple[dict[str, Any], ...] = ()
        if cached is not None:
            evidence = (
                {"kind": "ledger_receipt", "receipt": cached, "fingerprint": digest(cached)},
            )
        case = ReviewCase(
            case_id=rt.ids.new_id("case"),
            reason=reason,
            action_id=pending.action_id,
            idempotency_key=pending.idempotency_key,
            intent_digest=pending.intent_digest,
            receipt=None if receipt is None else receipt.to_json(),
            receipt_fingerprint=None if receipt is None else receipt.fingerprint,
            environment=environment,
            opened_at=rt.clock.now(),
            detail=detail,
            evidence=evidence,
        )
        self.commit(
            self.state.evolve(
                phase=Phase.NEEDS_REVIEW, review_cases=(*self.state.review_cases, case)
            ),
            [("needs_review", case.to_json())],
        )

    # -- helpers ---------------------------------------------------------------

    def _refuse_if_stopped(self) -> None:
        phase = self.state.phase
        if phase.terminal:
            raise RunTerminalError(f"run {self.run_id} is {phase}", run_id=self.run_id)
        if phase is Phase.NEEDS_REVIEW:
            raise RunFrozenError(
                f"run {self.run_id} is frozen for review; only a signed decision opens it",
                run_id=self.run_id,
            )

    def _pending(self) -> PendingWrite:
        pending = self.state.pending
        if pending is None:
            raise RunFrozenError(f"run {self.run_id} has no pending write", run_id=self.run_id)
        return pending

    def _exhausted(self) -> str | None:
        budgets, spent = self.rt.task.budgets, self.state.spent
        if spent.steps >= budgets.steps:
            return "steps"
        if spent.proposals >= budgets.proposals:
            return "proposals"
        if spent.cost > budgets.cost:
            return "cost"
        elapsed = (self.rt.clock.now() - self.state.started_at).total_seconds()
        if elapsed > budgets.wall_time_s:
            return "wall_time"
        return None

    def _ledger(self, *statuses: EffectStatus, receipt: dict[str, Any] | None) -> None:
        pending = self._pending()
        now = self.rt.clock.now()
        self.rt.store.append_ledger(
            *(
                LedgerEntry(
                    run_id=self.run_id,
                    idempotency_key=pending.idempotency_key,
                    seq=0,
                    status=status,
                    action_id=pending.action_id,
                    intent_digest=pending.intent_digest,
                    receipt=receipt,
                    epoch=self.state.epoch,
                    at=now,
                )
                for status in statuses
            )
        )

    def trace(self, limit: int | None = None) -> list[TraceEvent]:
        """The run's trace up to the current head."""
        return self.rt.store.trace(self.run_id, self.state.trace_head, limit)


def _spent(spent: Spent, *, proposals: int = 0, steps: int = 0, cost: int = 0) -> Spent:
    return Spent(
        proposals=spent.proposals + proposals, steps=spent.steps + steps, cost=spent.cost + cost
    )
