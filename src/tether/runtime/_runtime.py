"""The runtime: what a run needs besides its state, and how a run begins or comes back.

A :class:`Runtime` is configuration (stores, keys, adapter, task, policy,
agent, clock). :meth:`Runtime.start` and :meth:`Runtime.recover` return a
:class:`~tether.runtime.RunSession` (``_session``), one epoch of one run,
which advances it step by step. Recovery runs every restore check, failing
closed, before a session exists.
"""

from __future__ import annotations

import contextlib
import os
import socket
from secrets import token_hex  # the keyword `secrets` is the secret box
from typing import Any

from tether.adapters import (
    Adapter,
    ListsReceipts,
    UnresolvedWriteError,
    capabilities_for,
    effect_identity,
    external_effects,
    look_up,
    namespace_of,
)
from tether.core import (
    ActionKind,
    AdapterError,
    AdapterUnavailableError,
    AdmissionRefusedError,
    Binding,
    BindingMismatchError,
    Compensation,
    Contract,
    EffectStatus,
    EffectTerms,
    EnvironmentDriftError,
    Intent,
    MissingHighWaterMarkError,
    PendingWrite,
    Phase,
    Policy,
    PolicyMismatchError,
    Proposal,
    Purpose,
    Receipt,
    ReviewReason,
    RunState,
    SpecError,
    Spent,
    TaskSpec,
    TetherError,
    admission_request,
    canonical_bytes,
    digest_bytes,
)
from tether.core import _policy_change as policy_rules
from tether.core._actions import Rejection, catalog, check_contract
from tether.core._contract import check_local_only, check_recovery_contract, parse_contract
from tether.core._held import answers_held
from tether.core._ledger import retry_semantics
from tether.core._policy_change import Adoption
from tether.core._replay import effect_digest
from tether.core._spec import MAX_TIMEOUT_S
from tether.core._state import GENESIS_HASH, check_run_id
from tether.core._transition import LedgerNote
from tether.crypto import Keyring, SecretBox, Signer, TrustRoots
from tether.runtime import _humans, _liveness
from tether.runtime._admit import Admitted, admit, policy_changed, rules_changes
from tether.runtime._agent import Agent, AgentContext, Withheld
from tether.runtime._checkpointer import Checkpointer, Restored, check_binding
from tether.runtime._clock import Clock, IdSource, RandomIds, SystemClock
from tether.runtime._crash import NO_CRASH, CrashPlan
from tether.runtime._heartbeat import DEFAULT_MAX_S
from tether.runtime._session import RunSession
from tether.store import ContentStore, GenerationStore, Lease, LeaseRequest

#: What to do when a run cannot start from the environment it finds.
START_DRIFT_HINT = (
    "the task's initial_environment is the state a run must start from: put the environment "
    "back in that state, or set initial_environment to the state found (`tether init` computes "
    "a workspace's), or leave it out of the task so a run takes the state it finds at start"
)

#: At most this many intents' effect digests and terms are kept per runtime
#: (one write asks several times; an intent may carry a big payload).
_REMEMBERED = 16


class Runtime:
    """Everything a run needs besides its state.

    ``agent`` is the code that decides each step (:meth:`RunSession.step`);
    leave it out for a run driven by the caller's own loop, whose effects go
    through :func:`tether.effects.call` (see :mod:`tether.runtime._effects`).
    ``defer_receipts`` (default ``True``): where the adapter can be asked by
    key or deduplicates, a write's receipt rides on the run's next commit, so
    a write step is one durable commit (a crash before it is settled by asking
    the adapter); ``False`` commits every receipt at once, on its own. The same
    flag lets a read's record ride on the next commit
    (``core._steps.observation_durability``), or not.
    """

    def __init__(
        self,
        *,
        store: ContentStore,
        keyring: Keyring,
        adapter: Adapter,
        task: TaskSpec,
        policy: Policy,
        agent: Agent | None = None,
        marks: GenerationStore | None = None,
        clock: Clock | None = None,
        ids: IdSource | None = None,
        crash: CrashPlan = NO_CRASH,
        worker: str | None = None,
        trust: TrustRoots | None = None,
        lease_ttl_s: float | None = None,
        heartbeat_max_s: float = DEFAULT_MAX_S,
        principal: Signer | None = None,
        secrets: SecretBox | None = None,
        on_secrets_withheld: Withheld | str | None = None,
        contract: Contract | str = Contract.STANDARD,
        defer_receipts: bool = True,
    ) -> None:
        self.store = store
        self.adapter = adapter
        self.task = task
        self.policy = policy
        self.agent = agent
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.ids: IdSource = ids if ids is not None else RandomIds()
        self.crash = crash
        # A receipt core says may ride on the run's next commit does (one durable
        # commit per write step); False commits every receipt on its own, at once.
        self.defer_receipts = defer_receipts
        # Unique per process by default: two processes never share a worker id.
        self.worker = worker or f"{socket.gethostname()}-{os.getpid()}-{token_hex(3)}"
        self.trust = trust
        # Who this runtime recovers as: it signs its own admissions with this
        # key, checked against ``trust`` (the deployment's roots now).
        self.principal = principal
        # None: one process owns its runs (no lease). A number: every start and
        # recovery takes the run's lease for that long and renews it as it works.
        self.lease_ttl_s = lease_ttl_s
        # A step's heartbeat keeps the lease for at most this long (a stuck step loses it).
        if isinstance(heartbeat_max_s, bool) or not 0 < heartbeat_max_s <= MAX_TIMEOUT_S:
            raise SpecError(
                "heartbeat_max_s",
                f"must be between 0 and {MAX_TIMEOUT_S:g} s, not {heartbeat_max_s!r}",
            )
        self.heartbeat_max_s = heartbeat_max_s
        # Secret context items are released on recovery only with a box, to a
        # principal whose current roles hold the policy's read-secrets right.
        self.secrets = secrets
        # None: as the policy's authority.secrets_withheld says.
        self.on_secrets_withheld = (
            None
            if on_secrets_withheld is None
            else Withheld.of(on_secrets_withheld, "on_secrets_withheld")
        )
        self.checkpointer = Checkpointer(store, keyring, marks=marks, crash=crash, secrets=secrets)
        # Answers kept per intent object (each holds its intent, so no other
        # object can take its id meanwhile): see effect_digest and effect_terms.
        self._effects: dict[int, tuple[Intent, str]] = {}
        self._terms: dict[int, tuple[Intent, Policy, EffectTerms]] = {}
        self.binding = Binding.of(task, policy)
        # Every kind the run may propose; a name nobody defines fails here, at load.
        self.kinds: dict[str, ActionKind] = catalog(adapter.kinds)
        check_contract(task, policy, self.kinds)
        # The deployment contract (see tether.core._contract): recorded in every
        # checkpoint; local-only is refused here for adapters that reach the world.
        self.contract = parse_contract(contract)
        check_local_only(self.contract, external_effects(adapter))

    def effect_terms(self, intent: Intent) -> EffectTerms:
        """What the ledger records about an effect of ``intent``: who, what, and its promises.

        Asked at every commit of a write: the answer for one intent object
        (immutable) under one adapter and policy is kept, so a write's ledger
        entries share one terms object and its encoding.
        """
        cached = self._terms.get(id(intent))
        if cached is not None and cached[0] is intent and cached[1] is self.policy:
            return cached[2]
        terms = self._terms_of(intent)
        if len(self._terms) >= _REMEMBERED:
            self._terms.clear()
        self._terms[id(intent)] = (intent, self.policy, terms)
        return terms

    def _terms_of(self, intent: Intent) -> EffectTerms:
        declared = self.kinds.get(intent.kind)
        rule = self.policy.kinds.get(intent.kind)
        caps = capabilities_for(self.adapter, intent)
        return EffectTerms(
            adapter=namespace_of(self.adapter, intent.kind),
            kind=intent.kind,
            target=intent.target,
            retry=retry_semantics(caps),
            compensation=Compensation.NONE if declared is None else declared.compensation,
            sensitive=rule is not None and rule.sensitive,
            effect=self.effect_digest(intent),
            queryable=caps.queryable,
            absent_is_final=caps.queryable and caps.absent_is_final,
        )

    def held_problem(self, state: RunState) -> Rejection | None:
        """Why this runtime's policy forbids the action ``state`` holds (``None``: it may go).

        Asked before every send: an action held under another policy (a
        recovery adopted this one since) meets the whole action contract again.
        """
        return policy_rules.held_problem(
            state, kinds=self.kinds, task=self.task, policy=self.policy
        )

    def effect_digest(self, intent: Intent) -> str:
        """What ``intent`` does, whatever its action id or key: equal digests, the same effect.

        Kept per intent object (immutable): one write asks several times.
        """
        cached = self._effects.get(id(intent))
        if cached is not None and cached[0] is intent:
            return cached[1]
        found = self.effect_of(intent.kind, intent.target, intent.args)
        if len(self._effects) >= _REMEMBERED:
            self._effects.clear()
        self._effects[id(intent)] = (intent, found)
        return found

    def same_action(self, held: PendingWrite, proposal: Proposal) -> bool:
        """Whether ``proposal`` asks for the action ``held`` pending (core's
        :func:`~tether.core.answers_held`, given the effect digests this adapter
        makes of both), for a step and for :func:`tether.effects.call` alike."""
        if held.action_id == proposal.action_id or not held.mutating:
            return answers_held(held, proposal)
        try:
            args = self.adapter.normalize(proposal.kind, proposal.target, dict(proposal.args))
        except TetherError:
            args = None  # what the gate refuses is no held write's twin
        effect = None if args is None else self.effect_of(proposal.kind, proposal.target, args)
        return answers_held(
            held, proposal, effect=effect, held_effect=self.effect_digest(held.intent)
        )

    def effect_of(self, kind: str, target: str, args: dict[str, Any]) -> str:
        """The effect digest of a write of ``kind`` to ``target`` with normalized ``args``."""
        identity = effect_identity(self.adapter, kind, target, dict(args))
        return effect_digest(namespace_of(self.adapter, kind), kind, target, identity)

    def start(self, run_id: str | None = None, context: AgentContext | None = None) -> RunSession:
        """Begin a new run in the task's expected initial environment.

        Without a lease the run is held for this process first (another live
        process that has it open: :class:`~tether.core.RunBusyError`; see
        :mod:`tether.runtime._liveness`).
        """
        run_id = check_run_id(run_id) if run_id is not None else self.ids.new_id("run")
        with _liveness.opening(self.checkpointer.marks, self.lease_ttl_s, run_id) as keep:
            return keep(self._start(run_id, context))

    def _start(self, run_id: str, context: AgentContext | None) -> RunSession:
        env = self.adapter.environment()
        expected = self.task.initial_environment
        if expected is not None and (
            env.namespace != expected.namespace
            or env.state_fingerprint != expected.state_fingerprint
        ):
            raise EnvironmentDriftError(
                f"run {run_id} cannot start: the environment is not the task's initial state",
                expected={
                    "namespace": expected.namespace,
                    "state_fingerprint": expected.state_fingerprint,
                },
                actual=env.to_json(),
                hint=START_DRIFT_HINT,
                run_id=run_id,
            )
        now = self.clock.now()
        context = context if context is not None else AgentContext()
        context = context.seal(run_id=run_id, box=self.secrets)
        context_digest, body = context.encode()
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
            epoch_id=self.ids.new_id("epoch"),
            occurrence_id=run_id,
            contract=self.contract,
            policy_change=self.policy.authority.policy_change,
        )
        session = RunSession(self, genesis, context)
        session.release_secrets = True  # the caller handed them in
        # With leases on, the run is created already held: no claim gets in between.
        ttl = self.lease_ttl_s
        trust, trust_blobs = self._trust_record()
        session.commit(
            genesis,
            [
                (
                    "run_started",
                    {"task": self.binding.to_json(), "environment": env.to_json(), "trust": trust},
                )
            ],
            # The task, the policy and the trust roots' public halves, content-addressed,
            # so the people's tools check a document against what the run keeps.
            blobs={context_digest: body, **self._rules(), **trust_blobs},
            lease_to=None if ttl is None else LeaseRequest(self.worker, ttl),
        )
        return session

    def start_or_recover(self, run_id: str, context: AgentContext | None = None) -> RunSession:
        """Recover ``run_id``, or start it if its first checkpoint never landed.

        A run with no mark whose content never got past generation 1 never
        dispatched anything (a write needs a landed pending checkpoint after
        the first), so starting it again is safe. Any later content without a
        mark means the mark was lost: that fails closed.
        """
        if self.checkpointer.marks.get_mark(check_run_id(run_id)) is None:
            newest = self.store.newest_generation(run_id)
            if newest is not None and newest > 1:
                raise MissingHighWaterMarkError(run_id)
            return self.start(run_id, context)
        return self.recover(run_id)

    def recover(
        self, run_id: str, lease: Lease | None = None, *, admission: Any = None
    ) -> RunSession:
        """Restore the newest checkpoint (every check, failing closed) and open a new epoch.

        The new epoch is admitted first (see :mod:`tether.runtime._admit`):
        ``admission`` is a person's signed admission document; without one the
        runtime's ``principal`` signs its own, and without that the worker
        recovers unsigned, only while the trust roots name no worker principals.
        A refusal raises :class:`~tether.core.AdmissionRefusedError`.

        With leases on, the run's lease is taken first (or ``lease``, one the
        caller already claimed, is used), so two recovering workers never both
        advance the run: the loser gets :class:`~tether.core.LeaseHeldError`.
        Without, the run is held for this process first, so a second live
        process gets :class:`~tether.core.RunBusyError` (see
        :mod:`tether.runtime._liveness`).
        """
        with _liveness.opening(self.checkpointer.marks, self.lease_ttl_s, run_id, lease) as keep:
            return keep(self._recover(run_id, lease, admission))

    def _recover(self, run_id: str, lease: Lease | None, admission: Any) -> RunSession:
        taken = None
        if lease is None and self.lease_ttl_s is not None:
            lease = taken = self.checkpointer.marks.acquire_lease(
                run_id, self.worker, self.lease_ttl_s
            )
        try:
            session = self._restore(run_id, lease, admission)
            if not self.store.has_blob(self.binding.policy_fingerprint):
                # A run that goes on under another policy (a new work occurrence): the
                # people's tools judge its documents by the rules it now runs under.
                self.store.put_blobs(self._rules())
        except TetherError:
            if taken is not None:
                # A refused restore must not leave the run locked for a ttl
                # (a process that dies here leaves it, as any death would).
                with contextlib.suppress(TetherError):
                    self.checkpointer.marks.release_lease(run_id, taken.owner, taken.lease_version)
            raise
        return session

    def _rules(self) -> dict[str, bytes]:
        """The task and the policy, content-addressed by their fingerprints (see :meth:`start`)."""
        return {
            self.binding.task_fingerprint: canonical_bytes(self.task.to_json()),
            self.binding.policy_fingerprint: canonical_bytes(self.policy.to_json()),
        }

    def _trust_record(self) -> tuple[str | None, dict[str, bytes]]:
        """The public halves of this runtime's trust roots: their digest, and the blob to keep.

        ``None``: the runtime has no trust roots (it accepts no signed document).
        """
        if self.trust is None:
            return None, {}
        body = canonical_bytes(self.trust.published())
        digest = digest_bytes(body)
        return digest, {digest: body}

    def admission_request(
        self,
        run_id: str,
        *,
        purpose: Purpose = Purpose.RECOVERY,
        target_generation: int | None = None,
        reason: str = "",
        scope: str = "aligned",
    ) -> dict[str, Any]:
        """The fields a signed admission of ``run_id`` as it is now must carry.

        Read from the verified checkpoint the mark names; a principal adds its
        id, a lifetime and a nonce (:func:`tether.core.new_admission`) and signs.
        """
        restored = self.checkpointer.load(run_id)
        self.checkpointer.check_generation(restored)
        return admission_request(
            restored.state,
            checkpoint_digest=restored.mark.checkpoint_digest,
            policy=self.binding,
            purpose=purpose,
            target_generation=target_generation,
            reason=reason,
            scope=scope,
        )

    def _restore(self, run_id: str, lease: Lease | None, admission: Any) -> RunSession:
        # Whether another policy may be adopted is the policy in force's call
        # (its clause is in the signed state), never this runtime's: admission
        # decides, below; a run that is over is only read, where it could be.
        try:
            restored = self.checkpointer.restore(
                run_id, self.binding, self.adapter, policy_may_change=True
            )
            state = restored.state
            if state.phase.terminal:
                _readable_under(state, self.binding)
        except BindingMismatchError as exc:
            raise self._explained(exc, run_id) from None
        check_recovery_contract(run_id, state.contract, self.contract)
        seen: dict[int, str] = {}
        if state.phase.terminal:
            admitted = None  # nothing resumes: an operator can still read everything
            if admission is not None:
                admit(
                    self,
                    state,
                    checkpoint_digest=restored.mark.checkpoint_digest,
                    document=admission,
                )  # refused: a run that is over is never admitted
        else:
            admitted, seen = self._admit(state, restored.mark.checkpoint_digest, admission)
        # Secret items go only to a principal with the read-secrets right now.
        release = self.secrets is not None and admitted is not None and admitted.may_read_secrets
        withheld = self.on_secrets_withheld
        if withheld is None:
            withheld = Withheld.of(self.policy.authority.secrets_withheld.value)
        context = self.checkpointer.context(state, release=release, on_withheld=withheld)
        _humans.check_restorable(self, state)
        session = RunSession(self, state, context)
        session.release_secrets = release
        session.digest = restored.mark.checkpoint_digest
        # The gate's "used before" and replay-or-fork's known effects are looked
        # up by index when a proposal asks, each row proven on the signed chains
        # (History): a recovery reads none of the run's past for them.
        session.reopen(state)
        session.results()  # missing or damaged results fail closed here, not mid-run
        if lease is not None:
            session.hold(lease)
        if admitted is None:
            return session
        opening = {
            "from_generation": state.generation,
            "previous_epoch": state.epoch,
            "previous_worker": state.worker,
            "phase": state.phase.value,
            "maybe_sent": restored.maybe_sent,
            **admitted.event,
        }
        if context.redacted:
            opening["secrets_withheld"] = list(context.redacted)  # names only
        # The roots this epoch runs under: a signer they lack is refused before signing.
        opening["trust"], trust_blobs = self._trust_record()
        # The new epoch is recorded with the first commit this session makes: a
        # reclaim that changes nothing (the adapter still busy, nothing to do
        # yet) writes nothing.
        session.admissions_read = seen
        session.open_epoch(
            opening, admitted.changes, {admitted.digest: admitted.body, **trust_blobs}
        )
        if state.phase is Phase.NEEDS_REVIEW:
            return session  # frozen: the epoch lands with the decision that opens it
        if restored.maybe_sent:
            # Content beyond the mark said the pending write was dispatched:
            # the ledger records that before anything else happens (a park too).
            session.commit(
                state,
                [],
                ledger=(LedgerNote(EffectStatus.DISPATCHED),),
                effect=state.pending,
            )
        if policy_changed(state, self.binding) and session.state.generation == state.generation:
            # Adopting another policy is itself a change, recorded at once: what a
            # person signs from here on (an approval, a decision) binds the policy
            # in force, and an approval signed under the old one is no approval.
            session.commit(state, [])
        behind = self._behind_the_world(restored, session)
        if behind is not None:
            detail, evidence = behind
            session.park(ReviewReason.ENVIRONMENT_AHEAD, detail, evidence=evidence)
        elif restored.drifted is not None:
            reason, detail, evidence = drift_case(session.state, restored.drifted)
            session.park(reason, detail, evidence=evidence)
        return session

    def _explained(self, exc: BindingMismatchError, run_id: str) -> BindingMismatchError:
        """``exc`` again, saying what changed in the task or policy since the run started."""
        policy = isinstance(exc, PolicyMismatchError)
        try:
            made_under = self.checkpointer.load(run_id).state.binding
        except TetherError:
            return exc
        changes = rules_changes(
            self,
            made_under.policy_fingerprint if policy else made_under.task_fingerprint,
            self.policy.to_json() if policy else self.task.to_json(),
        )
        if not changes:
            return exc
        return type(exc)(exc.what, exc.expected, exc.actual, run_id=run_id, changes=changes)

    def _admit(
        self, state: RunState, checkpoint_digest: str, document: Any
    ) -> tuple[Admitted, dict[int, str]]:
        """Admit the recovery: by ``document``, else a person's admission in the inbox, else itself.

        Inbox admissions of this very checkpoint and epoch (``tether admit``)
        are tried newest first; one that does not verify is skipped, never a
        block on the run, and every one tried is reported (seq -> "used" or
        why it was refused) so the step that reads the inbox records it.
        """
        seen: dict[int, str] = {}
        if document is None:
            for item in reversed(self.store.evidence(state.run_id, after=state.inbox_cursor)):
                body = item.document.get("body") if isinstance(item.document, dict) else None
                if not (
                    item.kind == "admission"
                    and isinstance(body, dict)
                    and body.get("purpose") == Purpose.RECOVERY.value
                    and body.get("checkpoint_digest") == checkpoint_digest
                    and body.get("interrupted_epoch_id") == state.epoch_id
                ):
                    continue
                try:
                    admitted = admit(
                        self, state, checkpoint_digest=checkpoint_digest, document=item.document
                    )
                except AdmissionRefusedError as exc:
                    seen[item.seq] = str(exc)
                    continue
                seen[item.seq] = "used"
                return admitted, seen
        return admit(self, state, checkpoint_digest=checkpoint_digest, document=document), seen

    def _behind_the_world(
        self, restored: Restored, session: RunSession
    ) -> tuple[str, tuple[dict[str, Any], ...]] | None:
        """Whether the restored history is behind what the adapter shows happened.

        Two durable records outside the store can say so: the environment is
        further along than the checkpoint can explain, or the adapter holds a
        receipt for a pending write the signed state says never left (it is
        sent only after ``dispatched`` commits). Either means the store was
        put back (a backup restore) or another runtime acted here; no rule can
        tell which, so a person decides, with the adapter's receipts the
        ledger lacks as evidence. ``None`` when nothing says so.
        """
        state = restored.state
        pending = state.pending
        receipt = None
        if (
            pending is not None
            and pending.mutating
            and pending.status is EffectStatus.INTENDED
            and capabilities_for(self.adapter, pending.intent).queryable
        ):
            try:
                receipt = look_up(self.adapter, pending.idempotency_key, pending.intent)
            except AdapterUnavailableError as exc:
                # Cannot tell now; settling asks again, by the same key. The outage is
                # the session's to report: the claim met a service that is down.
                session.unreachable = str(exc)
            except (UnresolvedWriteError, AdapterError):
                receipt = None  # cannot tell now; settling asks again, by the same key
        if restored.ahead is None and receipt is None:
            return None
        live = restored.ahead if restored.ahead is not None else self.adapter.environment()
        # A person is about to be asked: worth one read of the whole verified ledger.
        # (Its entries for the pending write were checked by the restore against
        # the signed state; ``state`` may say "dispatched" where they say intended.)
        whole = self.checkpointer.verified_ledger(state.evolve(pending=None))
        known = {entry.idempotency_key for entry in whole}
        found: list[Receipt] = [] if receipt is None else [receipt]
        if isinstance(self.adapter, ListsReceipts):
            found += self.adapter.receipts_after(
                state.environment.version, limit=_RECEIPTS_SHOWN + 1
            )
        # The pending write's key is in the ledger as intended only: its
        # receipt is news too.
        if receipt is not None:
            known.discard(receipt.idempotency_key)
        unknown: dict[str, Receipt] = {}
        for each in found:
            if each.idempotency_key not in known:
                unknown.setdefault(each.idempotency_key, each)
        evidence: list[dict[str, Any]] = [
            {
                "kind": ReviewReason.ENVIRONMENT_AHEAD.value,
                "checkpoint": state.environment.to_json(),
                "live": live.to_json(),
                "generation": state.generation,
            }
        ]
        listed = list(unknown.values())
        more = len(listed) > _RECEIPTS_SHOWN
        evidence += [
            {"kind": "unrecorded_receipt", **r.to_json()} for r in listed[:_RECEIPTS_SHOWN]
        ]
        count = (
            f"more than {_RECEIPTS_SHOWN} (the first {_RECEIPTS_SHOWN} shown)"
            if more
            else str(len(listed))
        )
        detail = (
            f"the environment is ahead of the restored checkpoint (version "
            f"{state.environment.version} -> {live.version}) and the adapter holds "
            f"{count} receipt(s) the ledger does not: the store was restored from an "
            "older backup, or another runtime wrote here. Nothing is repeated; decide replan "
            "(continue from the world as it is) or abort."
        )
        return detail, tuple(evidence)


def _readable_under(state: RunState, current: Binding) -> None:
    """A finished run is read under another policy only where the one in force lets it change."""
    changed = policy_changed(state, current)
    if policy_rules.adoption(state.policy_change, changed=changed, admitted_by=None) is (
        Adoption.REFUSED
    ):
        check_binding(state, current)  # raises PolicyMismatchError, naming what differs


def drift_case(state: RunState, live: Any) -> tuple[str, str, tuple[dict[str, Any], ...]]:
    """The review case a drift opens: its reason, what a person is told, both states.

    The environment changed outside the run (a colleague's edit, a ticket
    filed by hand) between the checkpoint and this recovery. No rule can say
    whether the run's plan still holds, so a person decides: ``accept`` the
    observed state (the run re-observes and goes on from it), ``replan`` or
    ``abort``. A decision is bound to the observed environment, so if the
    world moves again before it lands, the case is refreshed.
    """
    recorded = state.environment
    pending = state.pending
    evidence = {
        "kind": ReviewReason.ENVIRONMENT_DRIFT.value,
        "checkpoint": recorded.to_json(),
        "observed": live.to_json(),
        "generation": state.generation,
    }
    if pending is not None and pending.mutating:
        evidence["pending_expected_post"] = pending.expected_post.to_json()
    detail = (
        f"the environment changed outside the run since generation {state.generation} "
        f"(version {recorded.version} -> {live.version}, fingerprint "
        f"{recorded.state_fingerprint[:19]} -> {live.state_fingerprint[:19]}). Nothing was "
        "done about it; decide "
        + (
            "replan (the pending write's key is quarantined) or abort."
            if pending is not None and pending.mutating
            else "accept (go on from the environment as observed), replan or abort."
        )
    )
    return ReviewReason.ENVIRONMENT_DRIFT, detail, (evidence,)


#: At most this many unrecorded receipts are copied into a review case.
_RECEIPTS_SHOWN = 50
