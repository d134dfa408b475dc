"""One epoch of one run: observe -> ask the agent -> apply a transition -> call the adapter.

The order of a write, and why (one durable commit per write step where the
adapter is queryable with final absence, or idempotent):

1. ONE commit: the checkpoint (phase pending) with the intent, its freshly
   minted key and the ledger's ``intended`` + ``dispatched``, before anything
   leaves the process (a blind adapter, or a write that waits for approval,
   commits ``intended`` here and ``dispatched`` alone right before the call);
   a receipt deferred by the step before lands in this same transaction;
2. the adapter executes with that key and returns its receipt;
3. the ledger's ``committed`` with the receipt and the advanced state (phase
   running), sealed now and, where core says it may be deferred
   (``settle_rules.receipt_durability``), written with the run's NEXT commit
   (1 of the next write step, or any other checkpoint; :meth:`land_deferred`
   when the session lets the run go); otherwise ONE commit of its own now.

The session holds no rule of its own: every decision is a pure function in
``tether.core`` that returns a :class:`~tether.core.Transition`; the session
commits it, makes the one adapter call it names, and hands the answer on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from tether.adapters import (
    absence_outlives_takeover,
    capabilities_for,
    namespace_of,
    where_to_look,
)
from tether.core import (
    ActionResult,
    CommitOutcomeUnknownError,
    EffectStatus,
    EnvironmentState,
    LedgerEntry,
    Observation,
    Outcome,
    OutcomeKind,
    OutcomeReason,
    PendingWrite,
    Phase,
    PolicyError,
    Proposal,
    ReviewReason,
    RunFrozenError,
    RunState,
    RunTerminalError,
    SpecError,
    TetherError,
    TraceEvent,
    format_time,
)
from tether.core import _replay as replay_rules
from tether.core import _settle as settle_rules
from tether.core import _steps as step_rules
from tether.core._case_rules import absence_doubt
from tether.core._case_table import KEY_KEPT_HINT, KEY_LOOKUP_HINT
from tether.core._commit import noted_write
from tether.core._evidence import awaits_approval
from tether.core._held import AfterSettle, HeldKind, after_settle, held_kind
from tether.core._retry import step_progressed
from tether.core._terms import settling_capabilities
from tether.core._transition import (
    Durability,
    Execute,
    ExecuteAnswer,
    ExecuteStatus,
    Facts,
    Lookup,
    LookupAnswer,
    LookupStatus,
    ReadEnvironment,
    Transition,
)
from tether.runtime import _calls as calls
from tether.runtime import _carry, _compensate, _humans, _propose, _replaying, _rewind, _stopping
from tether.runtime._agent import Agent, AgentContext
from tether.runtime._committing import Committing
from tether.runtime._crash import CrashPoint
from tether.runtime._deferred import Deferred
from tether.runtime._history import History
from tether.runtime._view import Event, Runtime


class RunSession(Committing):
    """One epoch of one run: the current state and the agent's context."""

    rt: Runtime

    def __init__(self, runtime: Runtime, state: RunState, context: AgentContext) -> None:
        self.rt = runtime
        self.state = state
        self.context = context
        self._init_lease(runtime.clock.now())
        # A recovery's "recovered" event, waiting for the session's first commit.
        self._opening: dict[str, Any] | None = None
        # What the admission changes in the state, and its record (a blob).
        self._admitted: tuple[dict[str, Any], dict[str, bytes]] = ({}, {})
        #: The digest of the checkpoint ``state`` is (``None`` before the first commit).
        self.digest: str | None = None
        # A commit whose outcome is unknown: nothing acts until reload() settles it.
        self._unsettled: CommitOutcomeUnknownError | None = None
        #: A receipt this session was handed whose recording commit failed: the
        #: next settle of that same dispatched write records it instead of asking
        #: the adapter again (or, for a blind one, sending it to review).
        self.unrecorded: calls.Unrecorded | None = None
        #: The run's past as this session may ask it: the gate's "used before"
        #: and replay-or-fork's known effects, looked up by index and proven on
        #: the signed chains, never read whole (kept up to date as commits land).
        self.history = History(runtime.checkpointer, state, self._landed_state)
        # A commit sealed and waiting to ride on the run's next one (a deferred
        # receipt): ``state`` is sealed on top of it, the store has not seen it.
        self._deferred: Deferred | None = None
        self._results: tuple[str, tuple[ActionResult, ...]] | None = None
        # Inbox admissions the recovery that opened this session tried: seq ->
        # "used", or why it was refused (the next inbox read records them).
        self.admissions_read: dict[int, str] = {}
        # The workspace root whose snapshot is known to be stored.
        self._snapshotted: str | None = None
        # Blob digests this session saw committed (the snapshots' files and trees).
        self._blobs_known: set[str] = set()
        #: Whether this epoch's reader may see the context's secret items (set by the runtime).
        self.release_secrets = False
        #: Why an adapter could not be asked during this session (it was down), or ``None``.
        #: A look-up no outcome reports (the recovery's check for a store put back) is
        #: recorded too: a worker that then parks the run for a person keeps its back-off,
        #: so a person's quick answer does not send the next claim straight back.
        self.unreachable: str | None = None
        #: When this session began: its working time counts from here, never the downtime before.
        self.resumed_at = runtime.clock.now()
        # The key of a write an earlier worker dispatched and left unsettled: with
        # leases on, that worker's lease lapsed and it may still be sending.
        pending = state.pending
        self._inherited: str | None = (
            pending.idempotency_key
            if pending is not None and pending.status is EffectStatus.DISPATCHED
            else None
        )
        #: The key of a write an earlier session sent and left unsettled (dispatched, or
        #: frozen with its outcome unknown): with leases on, the worker that sent it may
        #: have lost its lease inside the call (the not_landed check judges by it).
        self.sent_before: str | None = (
            pending.idempotency_key
            if pending is not None
            and pending.status in {EffectStatus.DISPATCHED, EffectStatus.OUTCOME_UNKNOWN}
            else None
        )

    def sent_by_another(self, key: str) -> bool:
        """Whether the write under ``key`` was sent by an earlier worker that held a lease
        (so it may have lost it inside the call and still be about to send)."""
        return self.lease is not None and self.sent_before == key

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def receipt_waiting(self) -> bool:
        """Whether a write's receipt waits for the run's next commit (``Runtime.defer_receipts``).

        Until it lands the store holds the generation before, with the write
        ``dispatched``; the commit that carries it (the next generation) is the
        write's rewind point. :meth:`land_deferred` writes it at once.
        """
        return self._deferred is not None

    @property
    def effects(self) -> Mapping[str, replay_rules.EffectHistory]:
        """Every effect digest the ledger records, and what it knows of it (what replay matches).

        A look-up reads that effect's entries by index; iterating reads the whole ledger.
        """
        return self.history.effects

    # -- applying transitions --------------------------------------------------

    def apply(
        self,
        transition: Transition,
        *,
        prefix: list[Event] | None = None,
        context: AgentContext | None = None,
    ) -> Outcome:
        """Commit a transition, make the adapter call it names, and feed the answer on.

        ``prefix`` (events the step saw before deciding) and ``context`` (the
        agent's new context) land with the first commit.
        """
        committed: LedgerEntry | None = None
        # A receipt in hand whose recording commit has not landed yet.
        in_hand: calls.Unrecorded | None = None
        while True:
            transition = step_rules.note_outcome(transition)  # the agent hears how it ended
            # Notes record the write pending before the step, or the one it makes pending.
            effect = noted_write(
                self.state.pending, None if transition.state is None else transition.state.pending
            )
            # A receipt core lets ride on the run's next commit is sealed now and
            # written with that commit (the first commit of a step carries what
            # the step saw before deciding and the agent's context: never deferred).
            later = (
                transition.durability is Durability.DEFERRED
                and self.rt.defer_receipts
                and not prefix
                # The caller's own loop hands the context on unchanged: nothing new to seal.
                and (context is None or context is self.context)
                and self._opening is None
            )
            if transition.state is not None:
                try:
                    if later:
                        entries = self.defer(
                            transition.state,
                            list(transition.events),
                            blobs=dict(transition.blobs),
                            ledger=transition.ledger,
                            effect=effect,
                        )
                    else:
                        entries = self.commit(
                            transition.state,
                            [*(prefix or ()), *transition.events],
                            context=context,
                            blobs=dict(transition.blobs),
                            ledger=transition.ledger,
                            effect=effect,
                        )
                except TetherError:
                    if in_hand is not None:
                        self.unrecorded = in_hand  # kept: the write is still dispatched
                    raise
                if in_hand is not None and self.unrecorded is in_hand:
                    self.unrecorded = None
                in_hand = None
                if later and transition.ledger:  # a receipt held (a read's record has none)
                    self.rt.crash.hit(CrashPoint.RECEIPT_DEFERRED)
                for entry in entries:
                    if entry.status is EffectStatus.COMMITTED:
                        committed = entry
                prefix, context = None, None
                self._remember(transition)
            call = transition.call
            if call is None:
                last = transition.events[-1][0] if transition.events else None
                return Outcome(
                    transition.outcome,
                    self.state,
                    transition.reason,
                    transition.message,
                    last if transition.state is not None else None,
                    committed=committed,
                )
            if isinstance(call, Lookup):
                answer = self.ask(call)
                transition = self.decide(
                    lambda facts, a=answer: settle_rules.after_lookup(self.state, facts, a),
                    aged=True,  # read after the look-up answered: an upper bound on its time
                )
            elif isinstance(call, ReadEnvironment):  # decide() answers it; never committed
                raise ValueError("a transition that reads the environment was not decided")
            else:
                result = self._execute(call)
                if result.status is ExecuteStatus.COMMITTED:
                    in_hand = calls.Unrecorded(call, result)
                    self.rt.crash.hit(CrashPoint.EFFECT_SENT)
                transition = self.decide(
                    lambda facts, c=call, r=result: settle_rules.after_execute(
                        self.state, facts, c, r
                    )
                )

    def facts(self, *, aged: bool = False) -> Facts:
        """What a pure step may need now (the environment unread: a rule asks for it).

        ``aged``: the step may judge the pending write's key against its
        adapter's retention, so the key's age by the store's clock is read
        too (one indexed read; never on a first send).
        """
        rt = self.rt
        kind = None if self.state.pending is None else self.state.pending.intent.kind
        pending = self.state.pending
        caps = capabilities_for(rt.adapter, None if pending is None else pending.intent)
        if (
            pending is not None
            and caps.absent_is_final
            and self.lease is not None
            and pending.idempotency_key == self._inherited
            and not absence_outlives_takeover(rt.adapter, pending.intent)
        ):
            # Taken over from a worker whose lease lapsed: a look-up that finds
            # nothing cannot prove that worker is not still about to send.
            caps = replace(caps, absent_is_final=False)
        return Facts(
            now=rt.clock.now(),
            live=None,
            needs_approval=_humans.needs_approval(rt, self.state),
            case_id=rt.ids.new_id("case"),
            capabilities=caps,
            namespace=namespace_of(rt.adapter, kind),
            forbidden=rt.held_problem(self.state),  # judged again before any send
            policy_version=rt.binding.policy_version,
            sent_under=self.history.sent_under(pending, rt.effect_digest),
            key_age_s=self.history.pending_age(pending, rt.effect_digest)
            if aged and caps.retention_s is not None
            else None,
        )

    def decide(self, rule: Any, *, aged: bool = False) -> Transition:
        """Evaluate a pure rule; one that asks for the environment is given it, and asked again.

        ``aged``: as for :meth:`facts` (after a look-up, or settling a write already sent).
        """
        facts = self.facts(aged=aged)
        transition: Transition = rule(facts)
        if isinstance(transition.call, ReadEnvironment):
            live = self.rt.adapter.environment()
            transition = rule(replace(facts, live=live, hint=self.hint()))
        if isinstance(transition.call, ReadEnvironment):  # a rule's bug: it had one
            raise ValueError("a rule asked for the environment it was given")
        return transition

    def hint(self) -> dict[str, str] | None:
        """Where a person would look for the pending write (its adapter's hints), if one is pending.

        Read only where the world is read for a freeze or an approval gate,
        never on a step that settles by itself.
        """
        pending = self.state.pending
        if pending is None or not pending.mutating:
            return None
        hints = dict(where_to_look(self.rt.adapter, pending.idempotency_key, pending.intent))
        hints.update(self._key_hints(pending))
        return hints or None

    def _key_hints(self, pending: PendingWrite) -> dict[str, str]:
        """What the case card needs to warn that a look-up by ``pending``'s key may prove nothing.

        Recorded with the freeze: absence not declared final, or a send by a
        worker whose lease may have lapsed inside the call
        (:data:`KEY_LOOKUP_HINT`); and, where the adapter declares a retention,
        when it forgets the key (:data:`KEY_KEPT_HINT`), which the card judges
        by the time it is shown.
        """
        rt = self.rt
        caps = settling_capabilities(
            capabilities_for(rt.adapter, pending.intent),
            self.history.sent_under(pending, rt.effect_digest),
        )
        if not caps.queryable:
            return {}  # the card's own warning covers a write that cannot be asked
        hints: dict[str, str] = {}
        if caps.retention_s is not None:
            forgotten = pending.proposed_at + timedelta(seconds=caps.retention_s)
            hints[KEY_KEPT_HINT] = format_time(forgotten)
        taken_over = self.sent_by_another(pending.idempotency_key) and not (
            absence_outlives_takeover(rt.adapter, pending.intent)
        )
        doubt = absence_doubt(
            absent_is_final=caps.absent_is_final, remembered=True, taken_over=taken_over
        )
        if doubt:
            hints[KEY_LOOKUP_HINT] = doubt
        return hints

    def ask(self, call: Lookup) -> LookupAnswer:
        """Ask the adapter about a write by its key (the lease is checked first)."""
        self.guard()
        answer = calls.ask(self.rt.adapter, call)
        if answer.status is LookupStatus.UNAVAILABLE:
            self.unreachable = answer.detail or "the adapter could not be asked"
        return answer

    def _execute(self, call: Execute) -> ExecuteAnswer:
        fence = self.guard()  # a worker whose lease moved on sends nothing
        return calls.send(self.rt.adapter, call, fence)

    # -- driving -------------------------------------------------------------

    def run(self, max_steps: int | None = None, *, land: bool = True) -> Outcome:
        """Step until the run is terminal or frozen, or a step gets nowhere (or ``max_steps``).

        A step gets nowhere (:func:`~tether.core.step_progressed`) when it waits for a
        person's approval, for the adapter (in flight, unreachable), or for its agent,
        which asked for nothing: then ``run`` returns that outcome and the run waits,
        durable, instead of asking again at once. Call it again later (a
        :class:`~tether.runtime.Worker` does, backing off). The last outcome is returned.
        A write's receipt that would ride on the next commit is written before ``run``
        returns (``max_steps`` reached right after a write), so the run waits durable;
        ``land=False`` leaves it for the next step (a loop that steps again at once).
        """
        taken = 0
        self.reload()
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
            if not step_progressed(outcome.kind):
                break  # a person, the adapter or the agent has to act first; it waits, durable
        if land:
            self.land_deferred()
            outcome = replace(outcome, state=self.state)
        return outcome

    def consume_inbox(self) -> RunState:
        """Apply signed evidence waiting in the store's inbox (also done by every step)."""
        self.reload()
        _humans.consume_inbox(self)
        return self.state

    def approve(self, document: Any) -> RunState:
        """Record a signed approval for the pending write (see ``tether.crypto.Signer``)."""
        self.reload()
        return _humans.approve(self, document)

    def review(self, document: Any) -> RunState:
        """Apply a signed reviewer decision to its open review case.

        ``landed`` (the write is recorded committed by the reviewer, with their
        evidence; nothing is sent), ``not_landed`` (it is sent once more under
        its key at the next step), ``compensate``, ``replan``, ``abort`` or
        ``accept``, as the case takes it (``tether.core.case_rules``); a
        decision the case does not take is refused, traced, and raised.
        """
        self.reload()
        return _humans.review(self, document)

    def rewind(
        self,
        to: int | None = None,
        reason: str = "",
        *,
        document: Any = None,
        scope: str = "aligned",
    ) -> Outcome:
        """Rewind context and workspace together to generation ``to``, as a new generation.

        ``document`` is a person's signed rewind (an admission with purpose
        ``rewind``: who, why, the target, bound to the run as it is now);
        without one the agent selects the point, where the policy's
        ``authority.rewind`` names ``agent``. See :mod:`tether.runtime._rewind`.
        """
        self.reload()
        with self.working():
            return _rewind.rewind(self, to, reason, document=document, scope=scope)

    def rewind_from_inbox(self, document: Any, *, cursor: int) -> Outcome:
        """A signed rewind read from the store's inbox (``tether rewind``); refusals are traced."""
        try:
            return _rewind.rewind(self, document=document, cursor=cursor)
        except PolicyError as exc:
            _humans.refuse(self, "rewind", document, exc, cursor)
            raise

    def decide_effect(self, document: Any) -> Outcome:
        """Apply a signed effect decision (accept, or compensate) about one effect in the ledger.

        ``accept`` is recorded (and closes an open review case about the
        effect, as a replan does); ``compensate`` makes the compensation the
        pending write, keyed and durable, and carries it out like any write.
        A refused document is traced and raised (see ``runtime._compensate``).
        """
        self.reload()
        with self.working():
            return self.effect_decision(document, cursor=None)

    def effect_decision(self, document: Any, *, cursor: int | None) -> Outcome:
        """:meth:`decide_effect` as the inbox applies it (``cursor``: its inbox entry)."""
        transition = _compensate.decide(self, document, cursor=cursor)
        outcome = self.apply(transition)
        if (
            self.state.phase is not Phase.PENDING
            or outcome.reason != OutcomeReason.COMPENSATION_ORDERED
        ):
            return outcome
        self.rt.crash.hit(CrashPoint.INTENT_PERSISTED)
        return self._decide_and_apply(settle_rules.dispatch)

    def fork(self, document: Any) -> RunState:
        """Record a signed fork: the next proposal of its effect runs as a new effect, once.

        Without one, a write equal to an effect the run already committed is
        replayed (its receipt returned, nothing sent). ``document`` is signed
        by a reviewer or an operator over :func:`tether.core.new_fork`'s body.
        """
        self.reload()
        return _humans.fork(self, document)

    def cancel(self, reason: str, *, by: str = "operator") -> Outcome:
        """End the run in ``cancelled``; a write pending now is settled first, never abandoned.

        Never sent (``intended``): dropped, the ledger says so. Maybe sent: the
        adapter is asked; committed -> recorded, then cancelled; in flight or
        unreachable -> the outcome says wait and nothing changes; absent or
        unknowable -> ``needs_review`` (nothing can prove an older worker is
        not still sending). A frozen run is ended by a reviewer's signed
        abort; a finished one cannot be cancelled.
        """
        self.reload()
        self._refuse_if_stopped()
        if not isinstance(reason, str) or not reason.strip():
            raise SpecError("reason", "a cancel needs a reason a person can read later")
        with self.working():
            return _stopping.cancel(self, reason, by)

    def park(
        self, reason: ReviewReason | str, detail: str, *, evidence: tuple[dict[str, Any], ...] = ()
    ) -> Outcome:
        """Freeze the run for a person: something keeps failing where no rule can decide.

        A :class:`~tether.runtime.Worker` parks a run whose drive failed too
        often (reason ``worker_error``), a recovery one whose environment is
        ahead of its checkpoint (``environment_ahead``); ``evidence`` goes
        into the case. A signed replan resumes it.
        """
        if reason not in set(ReviewReason):
            known = ", ".join(sorted(ReviewReason))
            raise SpecError("reason", f"a review reason (one of {known}), not {reason!r}")
        self.reload()
        self._refuse_if_stopped()
        with self.working():
            return _stopping.park(self, ReviewReason(reason), detail, evidence)

    @property
    def awaiting_approval(self) -> bool:
        """Whether the pending write needs an approval it does not have (or whose time ran out)."""
        return awaits_approval(
            self.state,
            needs=_humans.needs_approval(self.rt, self.state),
            now=self.rt.clock.now(),
            policy_version=self.rt.binding.policy_version,
        )

    def step(self) -> Outcome:
        """Advance the run by one action (or settle its pending one); the typed outcome.

        The lease is kept alive by the heartbeat while the step works (a long
        agent call, a slow adapter), within the runtime's ``heartbeat_max_s``.
        """
        agent = self.rt.agent
        if agent is None:
            raise SpecError(
                "agent",
                "this runtime drives no agent: its effects go through tether.effects.call",
            )
        self.reload()  # a commit whose outcome was unknown is settled first
        with self.working():
            return self._step(agent)

    def _step(self, agent: Agent) -> Outcome:
        settled = self._settle_first()
        if settled is not None:
            return settled
        observed = self._observe()
        if isinstance(observed, Outcome):
            return observed
        base, events, env = observed
        observation = Observation(
            env, self.results(), self.state.last_write, self.state.last_outcome
        )
        self.rt.crash.hit(CrashPoint.BEFORE_PROPOSAL)
        decision = agent.decide(self.context, observation)
        if decision.context.plan_cursor != base.plan_cursor:
            base = base.evolve(plan_cursor=decision.context.plan_cursor)
        proposal = decision.proposal
        if decision.finished:
            proposal = self.finish_proposal(decision.summary)
        if proposal is None:
            self.commit(base, [*events, ("agent_waited", {})], context=decision.context)
            return Outcome(OutcomeKind.WAITED, self.state, event="agent_waited")
        return _propose.act(
            self, base, decision.context, proposal, events, runtime_finish=decision.finished
        )

    def act(self, proposal: Proposal, *, finish: bool = False) -> Outcome:
        """Carry out one proposal made by the caller's own loop, not by an :class:`Agent`.

        The same step as :meth:`step`, with ``proposal`` where the agent's
        decision would be: the inbox read, a write left pending by a crash
        settled first (by its key, never sent blindly again), the budgets
        charged, the environment observed, then the gate, the pending intent
        and its key, the adapter's call and the receipt. The context is kept
        as it is. A proposal without ``based_on_version`` is built on the
        version observed here. ``finish``: ``proposal`` is :meth:`finish_proposal`'s.
        """
        self.reload()
        with self.working():
            held = self.state.pending
            settled = self._settle_first()
            asked = settled is not None and held is not None and self.rt.same_action(held, proposal)
            then = after_settle(self.state, settled=settled is not None, asked=asked)
            if then is AfterSettle.ANSWER and settled is not None and held is not None:
                # The held action this call asks for, carried out now: its answer is
                # this call's, never a "replay" of itself.
                return replace(settled, action_id=held.action_id)
            if then is AfterSettle.STOPPED:
                self._refuse_if_stopped()
            if then is not AfterSettle.PROCEED and settled is not None:
                return settled
            observed = self._observe()
            if isinstance(observed, Outcome):
                return observed
            base, events, _ = observed
            self.rt.crash.hit(CrashPoint.BEFORE_PROPOSAL)
            if proposal.based_on_version is None and not finish:
                # The caller's loop saw the world through its own tools, not an
                # Observation: the call is built on the version read just now.
                proposal = replace(proposal, based_on_version=base.environment.version)
            return _propose.act(self, base, self.context, proposal, events, runtime_finish=finish)

    def finish_proposal(self, summary: str = "") -> Proposal:
        """The runtime's finish action: its id names the generation it is taken at."""
        args = {"summary": summary} if summary else {}
        return Proposal(f"finish@{self.state.generation}", "finish", args=args)

    def _settle_first(self) -> Outcome | None:
        """What a step must do before anything new: the inbox, a rewind, a pending write."""
        was = self.state.phase
        _humans.consume_inbox(self)
        if self.state.phase.terminal and not was.terminal:
            # The inbox ended the run (a signed cancel, a review's abort): that is this step.
            ended, event = _ENDED.get(self.state.phase, (OutcomeKind.FAILED, "failed"))
            return Outcome(ended, self.state, self.state.stop_reason, event=event)
        self._refuse_if_stopped()
        if self.state.rewinding is not None:
            return _rewind.finish(self)  # a rewind admitted before a crash: finish it first
        self.keep()  # renews a held lease when due; a lost one is refused at the commit
        pending = self.state.pending
        if self.state.phase is not Phase.PENDING or pending is None:
            return None
        kind = self.rt.kinds.get(pending.intent.kind)
        held = held_kind(pending, kind_mutates=None if kind is None else kind.mutating)
        if held is HeldKind.REPLAY:
            return _replaying.carry_out_held(self, pending)
        if held is HeldKind.ACTION:
            return _carry.carry_out_approved(self, pending)
        kept, self.unrecorded = self.unrecorded, None
        if kept is not None and kept.answers(pending):
            # This session was handed the receipt and could not record it: it is
            # recorded now (the adapter's own answer, under this very key and intent).
            return self._decide_and_apply(
                lambda state, facts: settle_rules.after_execute(
                    state, facts, kept.call, kept.answer
                )
            )
        return self._decide_and_apply(settle_rules.settle, aged=True)

    def _observe(self) -> Outcome | tuple[RunState, list[Event], EnvironmentState]:
        """The budgets checked, then the environment read: the state a new action starts from."""
        state = self.state
        exhausted = step_rules.exhausted(
            state, self.rt.task.budgets, self.rt.clock.now(), resumed_at=self.resumed_at
        )
        if exhausted is not None:
            return self.apply(exhausted)
        env = self.rt.adapter.environment()
        base, events = step_rules.begin_step(state, env)
        return base, events, env

    def _decide_and_apply(self, rule: Any, *, aged: bool = False) -> Outcome:
        return self.apply(self.decide(lambda facts: rule(self.state, facts), aged=aged))

    def results(self) -> tuple[ActionResult, ...]:
        """The results of the actions the agent took at its previous step (from the checkpoint)."""
        wanted = self.state.results_digest
        if wanted is None:
            return ()
        cached = self._results
        if cached is not None and cached[0] == wanted:
            return cached[1]
        results = self.rt.checkpointer.results(self.state)
        self._results = (wanted, results)
        return results

    # -- helpers ---------------------------------------------------------------

    def _refuse_if_stopped(self) -> None:
        phase = self.state.phase
        if phase.terminal:
            raise RunTerminalError(
                f"run {self.run_id} is {phase} ({self.state.stop_reason}): nothing more happens "
                f"in it; start new work under a new run id (`tether inspect {self.run_id}` shows "
                "what it did)",
                run_id=self.run_id,
            )
        if phase is Phase.NEEDS_REVIEW:
            raise RunFrozenError(
                f"run {self.run_id} is frozen for review; only a signed decision opens it",
                run_id=self.run_id,
            )

    def trace(self, limit: int | None = None) -> list[TraceEvent]:
        """The run's trace up to the current head (never walking past its signed length)."""
        bound = self.state.trace_length + 1  # one more than signed: a cycle shows, never hangs
        limit = bound if limit is None else min(limit, bound)
        riding = self._deferred
        if riding is None:
            return self.rt.store.trace(self.run_id, self.state.trace_head, limit)
        stored = riding.stored_length + 1
        return riding.trace(
            lambda head, n: self.rt.store.trace(self.run_id, head, min(n, stored)), limit
        )


# How a run the inbox ended reads as a step's outcome.
_ENDED = {
    Phase.CANCELLED: (OutcomeKind.CANCELLED, "run_cancelled"),
    Phase.FAILED: (OutcomeKind.FAILED, "failed"),
}
