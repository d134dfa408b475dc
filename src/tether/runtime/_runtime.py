"""The runtime: propose -> gate -> pending -> execute -> receipt -> advance, and recovery.

A :class:`Runtime` is configuration (stores, keys, adapter, task, policy,
agent, clock). :meth:`Runtime.start` and :meth:`Runtime.recover` return a
:class:`RunSession`, one epoch of one run, which advances it step by step.

The order of a write, and why (two durable commits where the adapter is
queryable or idempotent):

1. ONE commit: the checkpoint (phase pending) with the intent, its freshly
   minted key and the ledger's ``intended`` + ``dispatched``, before anything
   leaves the process (a blind adapter, or a write that waits for approval,
   commits ``intended`` here and ``dispatched`` alone right before the call);
2. the adapter executes with that key and returns its receipt;
3. ONE commit: the ledger's ``committed`` with the receipt and the advanced
   state (phase running).

The session holds no rule of its own: every decision is a pure function in
``tether.core`` that returns a :class:`~tether.core.Transition`; the session
commits it, makes the one adapter call it names, and hands the answer on.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import Any

from tether.adapters import Adapter, Fence, UnresolvedWriteError
from tether.core import (
    GENESIS_HASH,
    AdapterUnavailableError,
    Binding,
    CheckpointCorruptError,
    ContractViolationError,
    EffectStatus,
    EnvironmentDriftError,
    Execute,
    ExecuteAnswer,
    ExecuteStatus,
    Facts,
    IdempotencyConflictError,
    Intent,
    LedgerEntry,
    LedgerNote,
    Lookup,
    LookupAnswer,
    LookupStatus,
    MissingHighWaterMarkError,
    Outcome,
    OutcomeKind,
    PendingWrite,
    Phase,
    Policy,
    PreconditionFailedError,
    Proposal,
    RunFrozenError,
    RunState,
    RunTerminalError,
    Spent,
    TaskSpec,
    TraceEvent,
    Transition,
    Verification,
    approval_problem,
    check_effect_move,
    check_phase_move,
    gate,
    risk_of,
    seal_entry,
    seal_event,
    settle_rules,
)
from tether.core import Rejection as GateRejection
from tether.crypto import Keyring, TrustRoots
from tether.runtime import _humans
from tether.runtime._agent import Agent, AgentContext, Decision
from tether.runtime._checkpointer import Checkpointer
from tether.runtime._clock import Clock, IdSource, RandomIds, SystemClock
from tether.runtime._crash import NO_CRASH, CrashPlan, CrashPoint
from tether.store import ContentStore, GenerationStore, Lease

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
            trace_head=GENESIS_HASH,
            trace_length=0,
            ledger_head=GENESIS_HASH,
            ledger_length=0,
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
        session.actions.update(
            e.action_id for e in restored.ledger if e.status is EffectStatus.INTENDED
        )
        if lease is not None:
            session.hold(lease)
        if state.phase.terminal or state.phase is Phase.NEEDS_REVIEW:
            return session  # nothing may change; an operator can still read everything
        # Content beyond the mark said the pending write was dispatched: the
        # ledger records that before anything else happens.
        notes = (LedgerNote(EffectStatus.DISPATCHED),) if restored.maybe_sent else ()
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
                        "maybe_sent": restored.maybe_sent,
                    },
                )
            ],
            ledger=notes,
            effect=state.pending if notes else None,
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
        # Action ids of every write the verified ledger records (a pending one
        # that never dispatched included): the gate's "used before", read from
        # signed history, never from rows a store could hold unverified.
        self.actions: set[str] = set()

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

    def guard(self) -> Fence | None:
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
        ledger: tuple[LedgerNote, ...] = (),
        effect: PendingWrite | None = None,
    ) -> None:
        """Checkpoint ``state`` as the next generation, with its trace events and ledger entries.

        ``ledger`` notes belong to ``effect`` (the write they record); they are
        sealed into the run's ledger chain, whose new head the checkpoint pins,
        and land in the same fenced transaction or not at all.
        """
        if self.state.generation:
            check_phase_move(self.state.phase, state.phase)
        now = self.rt.clock.now()
        head, length = self.state.trace_head, self.state.trace_length
        sealed: list[TraceEvent] = []
        for kind, data in events:
            event = seal_event(state.run_id, length + 1, kind, now, data, head)
            sealed.append(event)
            head, length = event.hash, length + 1
        entries: list[LedgerEntry] = []
        ledger_head, ledger_length = self.state.ledger_head, self.state.ledger_length
        if ledger:
            if effect is None:
                raise CheckpointCorruptError("ledger notes without the effect they record")
            status = self._ledger_status(effect)
            for note in ledger:
                check_effect_move(status, note.status)
                status = note.status
                entry = seal_entry(
                    state.run_id,
                    ledger_length + 1,
                    ledger_head,
                    idempotency_key=effect.idempotency_key,
                    status=note.status,
                    action_id=effect.action_id,
                    intent_digest=effect.intent_digest,
                    receipt=note.receipt,
                    epoch=state.epoch,
                    at=now,
                )
                entries.append(entry)
                ledger_head, ledger_length = entry.hash, ledger_length + 1
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
            ledger_head=ledger_head,
            ledger_length=ledger_length,
            updated_at=max(now, state.started_at),
        )
        self.rt.checkpointer.advance(
            new,
            self.state.generation,
            sealed,
            blobs or None,
            expected_lease_version=0 if self.lease is None else self.lease.lease_version,
            ledger=entries,
        )
        self.state = new
        if effect is not None and any(n.status is EffectStatus.INTENDED for n in ledger):
            self.actions.add(effect.action_id)
        if context is not None:
            self.context = context

    def _ledger_status(self, effect: PendingWrite) -> EffectStatus | None:
        """The ledger's last status for ``effect`` as the signed state knows it."""
        current = self.state.pending
        if current is not None and current.idempotency_key == effect.idempotency_key:
            return current.status
        return None  # a write becoming pending: its first entry is `intended`

    # -- applying transitions --------------------------------------------------

    def apply(self, transition: Transition) -> Outcome:
        """Commit a transition, make the adapter call it names, and feed the answer on."""
        while True:
            effect = self.state.pending
            if transition.state is not None:
                self.commit(
                    transition.state,
                    list(transition.events),
                    ledger=transition.ledger,
                    effect=effect,
                )
            call = transition.call
            if call is None:
                last = transition.events[-1][0] if transition.events else None
                return Outcome(
                    transition.outcome,
                    self.state,
                    transition.reason,
                    transition.message,
                    last if transition.state is not None else None,
                )
            if isinstance(call, Lookup):
                answer = self._lookup(call)
                transition = self._decide(
                    lambda facts, a=answer: settle_rules.after_lookup(self.state, facts, a)
                )
            else:
                result = self._execute(call)
                if result.status is ExecuteStatus.COMMITTED:
                    self.rt.crash.hit(CrashPoint.EFFECT_SENT)
                transition = self._decide(
                    lambda facts, c=call, r=result: settle_rules.after_execute(
                        self.state, facts, c, r
                    )
                )

    def facts(self, *, live: bool = False) -> Facts:
        """What a pure step may need now; the environment is read only where it matters."""
        rt = self.rt
        needs = _humans.needs_approval(rt, self.state)
        env = rt.adapter.environment() if (live or needs) else self.state.environment
        return Facts(
            now=rt.clock.now(),
            live=env,
            needs_approval=needs,
            case_id=rt.ids.new_id("case"),
            capabilities=rt.adapter.capabilities,
            namespace=rt.adapter.namespace,
        )

    def _decide(self, rule: Any) -> Transition:
        """Evaluate a pure rule; a freeze is re-evaluated with the live environment read."""
        facts = self.facts()
        transition: Transition = rule(facts)
        if transition.outcome is OutcomeKind.FROZEN and facts.live is self.state.environment:
            transition = rule(self.facts(live=True))
        return transition

    def _lookup(self, call: Lookup) -> LookupAnswer:
        self.guard()
        try:
            receipt = self.rt.adapter.lookup(call.key)
        except UnresolvedWriteError as exc:
            return LookupAnswer(LookupStatus.IN_PROGRESS, detail=str(exc))
        except AdapterUnavailableError as exc:
            return LookupAnswer(LookupStatus.UNAVAILABLE, detail=str(exc))
        if receipt is None:
            return LookupAnswer(LookupStatus.ABSENT)
        return LookupAnswer(LookupStatus.COMMITTED, receipt)

    def _execute(self, call: Execute) -> ExecuteAnswer:
        fence = self.guard()  # a worker whose lease moved on sends nothing
        try:
            receipt = self.rt.adapter.execute(call.key, call.intent, call.prestate, fence)
        except IdempotencyConflictError as exc:
            return ExecuteAnswer(ExecuteStatus.CONFLICT, exc.receipt, str(exc))
        except PreconditionFailedError as exc:
            return ExecuteAnswer(ExecuteStatus.PRECONDITION_FAILED, detail=str(exc))
        except UnresolvedWriteError as exc:
            return ExecuteAnswer(ExecuteStatus.IN_PROGRESS, detail=str(exc))
        except AdapterUnavailableError as exc:
            return ExecuteAnswer(ExecuteStatus.UNAVAILABLE, detail=str(exc))
        return ExecuteAnswer(ExecuteStatus.COMMITTED, receipt)

    # -- driving -------------------------------------------------------------

    def run(self, max_steps: int | None = None) -> Outcome:
        """Step until the run is terminal, frozen, or waits (or ``max_steps``); the last outcome."""
        taken = 0
        outcome = Outcome(OutcomeKind.WAITED, self.state)
        if self.state.phase is Phase.NEEDS_REVIEW:
            _humans.consume_inbox(self)  # a decision may open it; step() reads the inbox otherwise
            outcome = Outcome(
                OutcomeKind.FROZEN
                if self.state.phase is Phase.NEEDS_REVIEW
                else OutcomeKind.RECORDED,
                self.state,
            )
        while not self.state.phase.terminal and self.state.phase is not Phase.NEEDS_REVIEW:
            if max_steps is not None and taken >= max_steps:
                break
            outcome = self.step()
            taken += 1
            if outcome.kind in _WAITS:
                break  # a person, or the adapter, has to act first; the run waits, durable
        return outcome

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
        problem = approval_problem(
            self.state,
            needs=True,
            now=self.rt.clock.now(),
            live=self.state.environment,
            idempotent=False,
        )
        return problem is not None and problem[0] != "approval_stale"

    def step(self) -> Outcome:
        """Advance the run by one decision (or settle its pending write); the typed outcome."""
        _humans.consume_inbox(self)
        self._refuse_if_stopped()
        self.guard()  # renews a held lease when due, and stops a worker that lost it
        if self.state.phase is Phase.PENDING:
            return self._decide_and_apply(settle_rules.settle)
        state = self.state
        exhausted = self._exhausted()
        if exhausted is not None:
            return self._fail(f"budget_exhausted:{exhausted}")
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
            return self._finish(base, decision, events)
        if decision.proposal is None:
            self.commit(base, [*events, ("agent_waited", {})], context=decision.context)
            return Outcome(OutcomeKind.WAITED, self.state, event="agent_waited")
        return self._propose(base, decision, decision.proposal, events)

    def _decide_and_apply(self, rule: Any) -> Outcome:
        return self.apply(self._decide(lambda facts: rule(self.state, facts)))

    # -- proposing -----------------------------------------------------------

    def _propose(
        self, base: RunState, decision: Decision, proposal: Proposal, events: list[Event]
    ) -> Outcome:
        rt = self.rt
        spent = _spent(base.spent, proposals=1)
        rejection = gate(
            proposal,
            task=rt.task,
            policy=rt.policy,
            phase=base.phase,
            environment=base.environment,
            now=rt.clock.now(),
            action_seen=proposal.action_id in self.actions,
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
            return Outcome(
                OutcomeKind.FAILED if state.phase is Phase.FAILED else OutcomeKind.REJECTED,
                self.state,
                rejection.reason,
                rejection.message,
                "proposal_rejected",
            )
        intent = Intent(
            kind=proposal.kind,
            target=proposal.target,
            args=args,
            risk=risk_of(rt.policy, proposal.kind).value,
        )
        key = rt.ids.new_id("idem")
        expected_post = rt.adapter.derive_post_state(base.environment, intent)
        caps = rt.adapter.capabilities
        needs = _humans.kind_needs_approval(rt, proposal.kind)
        # Sent at once on an adapter that can be asked or dedups: `dispatched`
        # lands with the intent. Otherwise (a blind adapter, or a person must
        # sign first) `dispatched` gets its own commit right before the call.
        at_once = not needs and not caps.blind
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
            status=EffectStatus.DISPATCHED if at_once else EffectStatus.INTENDED,
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
        notes: tuple[LedgerNote, ...] = (LedgerNote(EffectStatus.INTENDED),)
        if at_once:
            notes = (*notes, LedgerNote(EffectStatus.DISPATCHED))
        if needs:
            # It waits, durable, for a person; nothing leaves the process.
            requested: Event = (
                "approval_requested",
                {"action_id": pending.action_id, "idempotency_key": key},
            )
            self.commit(
                state,
                [*events, accepted, requested],
                context=decision.context,
                ledger=notes,
                effect=pending,
            )
            return Outcome(
                OutcomeKind.WAITING_FOR_APPROVAL,
                self.state,
                "approval_required",
                f"the write needs an approval: `tether approve {self.run_id} {pending.action_id}`",
                "approval_requested",
            )
        self.commit(
            state, [*events, accepted], context=decision.context, ledger=notes, effect=pending
        )
        rt.crash.hit(CrashPoint.INTENT_PERSISTED)
        return self._decide_and_apply(settle_rules.dispatch)

    # -- finishing, failing ------------------------------------------------------

    def _finish(self, base: RunState, decision: Decision, events: list[Event]) -> Outcome:
        rt = self.rt
        self.guard()
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
            return Outcome(OutcomeKind.FINISHED, self.state, "verified", event="completed")
        self.commit(state, [*events, verified], context=decision.context)
        reason = "verifier_failed" if judged_here else "verifier_judged_other_state"
        return Outcome(
            OutcomeKind.VERIFIER_FAILED,
            self.state,
            reason,
            result.output_tail[-500:],
            "verifier_ran",
        )

    def _fail(self, reason: str) -> Outcome:
        self.commit(
            self.state.evolve(phase=Phase.FAILED, stop_reason=reason),
            [("failed", {"reason": reason})],
        )
        return Outcome(OutcomeKind.FAILED, self.state, reason, event="failed")

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

    def trace(self, limit: int | None = None) -> list[TraceEvent]:
        """The run's trace up to the current head."""
        return self.rt.store.trace(self.run_id, self.state.trace_head, limit)


# A person or the adapter must act before another step can change anything.
_WAITS = frozenset(
    {OutcomeKind.WAITING_FOR_APPROVAL, OutcomeKind.IN_FLIGHT, OutcomeKind.RETRY_LATER}
)


def _spent(spent: Spent, *, proposals: int = 0, steps: int = 0, cost: int = 0) -> Spent:
    return Spent(
        proposals=spent.proposals + proposals, steps=spent.steps + steps, cost=spent.cost + cost
    )
