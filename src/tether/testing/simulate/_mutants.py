"""Planted defects ("it has teeth"): each is one real tether function swapped for a broken twin.

:func:`planted` is a context manager that plants one mutant; the mutation
check runs the CI corpus under it and says which seed caught it (a seed
that passes on the real code and fails with the mutant). ``knobs`` are the
features a mutant needs switched on beyond the CI corpus (a mutant of the
retention rule is invisible where no adapter forgets its keys).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from tether.core import EffectStatus, RunState
from tether.core import _settle as settle_rules
from tether.core._transition import Transition


@dataclass(frozen=True, slots=True)
class Mutant:
    """One planted defect: what it breaks, and the features it needs to be seen."""

    name: str
    text: str
    patches: tuple[tuple[Any, str, Callable[[Any], Any]], ...]
    knobs: frozenset[str] = frozenset()


def _settle_without_asking(real: Any) -> Any:
    def settle(state: RunState, facts: Any) -> Transition:
        pending = state.pending
        if pending is not None and pending.status is not EffectStatus.INTENDED:
            return settle_rules.send_again(state, facts)  # never asks the adapter
        return real(state, facts)  # type: ignore[no-any-return]

    return settle


def _deferred_taken_as_committed(real: Any) -> Any:
    def settle(state: RunState, facts: Any) -> Transition:
        from tether.core import Receipt, format_time
        from tether.core._transition import Durability

        pending = state.pending
        caps = facts.capabilities
        deferrable = settle_rules.receipt_durability(
            caps, fresh=True, approved=facts.needs_approval, undoes=False
        )
        if (
            pending is not None
            and pending.status is EffectStatus.DISPATCHED
            and deferrable is Durability.DEFERRED
        ):
            # "Its receipt must have been waiting for the next commit": taken as
            # landed, the adapter never asked (a crash before the send says otherwise).
            assumed = Receipt(
                namespace=facts.namespace,
                adapter_version="assumed",
                receipt_id=f"assumed-{pending.idempotency_key}",
                idempotency_key=pending.idempotency_key,
                intent_digest=pending.intent_digest,
                result={},
                business_object_id=pending.intent.target,
                committed_at=format_time(facts.now),
                post_state=pending.expected_post,
            )
            return settle_rules.advance(state, assumed, fresh=False, stateful=caps.stateful)
        return real(state, facts)  # type: ignore[no-any-return]

    return settle


def _blind_resent(real: Any) -> Any:
    def settle(state: RunState, facts: Any) -> Transition:
        pending = state.pending
        caps = facts.capabilities
        if pending is not None and pending.status is not EffectStatus.INTENDED and caps.blind:
            return settle_rules.send_again(state, facts)  # no freeze for a blind adapter
        return real(state, facts)  # type: ignore[no-any-return]

    return settle


def _no_retention(real: Any) -> Any:
    return lambda state, facts: None


def _no_approval(real: Any) -> Any:
    return lambda state, facts: None


def _absence_final(real: Any) -> Any:
    def after_lookup(state: RunState, facts: Any, answer: Any) -> Transition:
        from dataclasses import replace

        caps = replace(facts.capabilities, absent_is_final=True)
        # The terms the write was sent under say so too (they are recorded with it).
        sent = facts.sent_under
        sent = None if sent is None else replace(sent, absent_is_final=True)
        told = replace(facts, capabilities=caps, sent_under=sent)
        return real(state, told, answer)  # type: ignore[no-any-return]

    return after_lookup


def _reconcile_any_digest(real: Any) -> Any:
    def reconcile(state: RunState, facts: Any, receipt: Any, *, fresh: bool) -> Transition:
        from dataclasses import replace

        pending = state.pending
        if pending is not None:
            receipt = replace(receipt, intent_digest=pending.intent_digest)  # digest not compared
        return real(state, facts, receipt, fresh=fresh)  # type: ignore[no-any-return]

    return reconcile


def _expiry_ignored(real: Any) -> Any:
    def approval_problem(state: RunState, **kw: Any) -> Any:
        problem = real(state, **kw)
        return None if problem is not None and problem[0] == "approval_expired" else problem

    return approval_problem


def _risk_unchecked(real: Any) -> Any:
    return lambda kind, policy: None  # no kind is above the policy's max_risk


def _lease_unchecked(real: Any) -> Any:
    return lambda self, run_id, lease_version: None


def _no_renewal(real: Any) -> Any:
    return lambda self: False  # the held lease is never renewed, so never found lost


def _cas_any_lease(real: Any) -> Any:
    def cas(
        self: Any, run_id: str, expected: int, new: int, digest: str, lease: int, *a: Any
    ) -> Any:
        mark = self.get_mark(run_id) if expected else None
        if mark is not None:
            lease = mark.lease_version  # whoever holds the lease, this commit lands
        return real(self, run_id, expected, new, digest, lease, *a)

    return cas


def _ledger_forgets(real: Any) -> Any:
    def ledger(self: Any, run_id: str, *args: Any) -> Any:
        entries = real(self, run_id, *args)
        # A restore that keeps only the newest status of each effect.
        newest: dict[str, Any] = {}
        for entry in entries:
            newest[entry.idempotency_key] = entry
        return sorted(newest.values(), key=lambda e: (e.idempotency_key, e.seq))

    return ledger


def _receipts_always_agree(real: Any) -> Any:
    return lambda recorded, receipt: True  # a drifted receipt is replayed as if equal


def _never_asks_about_a_commit(real: Any) -> Any:
    def lookup_key(record: Any, capabilities: Any, **kw: Any) -> Any:
        if record is not None and record.unsettled is None:
            return None  # a commit is answered from the ledger alone
        return real(record, capabilities, **kw)

    return lookup_key


def _commit_from_the_ledger(real: Any) -> Any:
    def judge_committed(facts: Any, known: Any, recorded: Any) -> Any:
        from tether.core import OutcomeReason
        from tether.core import _replay as replay_rules

        return replay_rules.Judgement(
            replay_rules.Verdict.REPLAY,
            OutcomeReason.EFFECT_REPLAYED,
            known,
            recorded,
            "",
            "ledger",
        )

    return judge_committed


def _forever_remembered(real: Any) -> Any:
    return lambda facts, known: True  # absence past retention taken as proof


def _reverts_swallowed(real: Any) -> Any:
    def judge(facts: Any) -> Any:
        from dataclasses import replace

        return real(replace(facts, target_moved=False))  # A, B, A answered by A's receipt

    return judge


def _state_reverts_swallowed(real: Any) -> Any:
    def overwritten_verdict(capabilities: Any, overwritten: bool) -> Any:
        from tether.core import Targets

        if capabilities.targets is Targets.STATE:
            return None  # A, B, A on a declared state answered by A's receipt, as a collection
        return real(capabilities, overwritten)

    return overwritten_verdict


def _unsettled_between_ignored(real: Any) -> Any:
    def since_on_target(rows: Any, effect: str, seen: set[str]) -> Any:
        from tether.core import EffectStatus

        open_ = {EffectStatus.DISPATCHED, EffectStatus.OUTCOME_UNKNOWN}
        # Only commits count as in between (the target index before migration 16).
        return real(((k, e, s) for k, e, s in rows if s not in open_), effect, seen)

    return since_on_target


def _foreign_receipt_answers(real: Any) -> Any:
    def judge_unsettled(facts: Any, known: Any) -> Any:
        from dataclasses import replace

        answer = facts.answer
        if answer is not None and answer.receipt is not None:
            ours = replace(
                answer.receipt,
                idempotency_key=known.idempotency_key,
                intent_digest=known.intent_digest,
            )
            facts = replace(facts, answer=replace(answer, receipt=ours))
        return real(facts, known)

    return judge_unsettled


def _replay_unapproved(real: Any) -> Any:
    return lambda facts, judgement: judgement  # a gated kind's replay needs no approval


def _always_progress(real: Any) -> Any:
    return lambda kind: True  # a resend or a wait counted as progress: no back-off


def _park_forgets_outage(real: Any) -> Any:
    def after_step(kind: Any, *, frozen: bool, met_outage: bool) -> Any:
        # The claim met a service that is down, then parked for a person with no floor:
        # an answer landing a moment later sends the next claim straight back to it.
        return real(kind, frozen=frozen, met_outage=False)

    return after_step


def _resend_always_recorded(real: Any) -> Any:
    return lambda **kw: True  # a checkpoint and a ledger row per resend


def _held_never_rejudged(real: Any) -> Any:
    return lambda self, state: None  # only the approval rule re-checked after a policy change


def _result_dropped(real: Any) -> Any:
    def replayed(state: Any, proposal: Any, effect: Any, known: Any, receipt: Any, *a: Any) -> Any:
        return real(state, proposal, effect, known, {**receipt, "result": None}, *a)

    return replayed


def _tries_again_at_once(real: Any) -> Any:
    def again(self: Any, lease: Any, session: Any, exc: Any, *args: Any) -> None:
        self.drive(lease)  # the same run again, in the same turn: it never yields it

    return again


def _let_go_at_once(real: Any) -> Any:
    def defer(self: Any, run_id: str, worker: str, lease_version: int, *a: Any, **kw: Any) -> Any:
        self.release_lease(run_id, worker, lease_version)  # no back-off: claimable at once
        return self.get_mark(run_id)

    return defer


def _released_claimable_since_ever(real: Any) -> Any:
    def release_lease(self: Any, run_id: str, worker: str, lease_version: int) -> None:
        real(self, run_id, worker, lease_version)
        # The old release: no "claimable from" time, so it sorts before every waiting run.
        self._write(
            lambda: self._run(
                "UPDATE tether_marks SET retry_at = NULL WHERE run_id = ? AND lease_owner IS NULL",
                (run_id,),
            )
        )

    return release_lease


def _ties_by_run_id(real: Any) -> Any:
    from tether.store._schema import CLAIMABLE_AT

    return f"{CLAIMABLE_AT}, run_id"  # the old tie-break: the smaller run id, every time


def _reads_never_stale(real: Any) -> Any:
    def version_problem(kind: Any, based_on: Any, environment: Any) -> Any:
        return real(kind, based_on, environment) if kind.mutating else None  # only writes

    return version_problem


def _untraced_failure(real: Any) -> Any:
    def charged_last(state: Any, budgets: Any) -> Any:
        after, _ = real(state, budgets)
        return after, ()  # failed, and the trace never says so

    return charged_last


def _budget_left_open(real: Any) -> Any:
    return lambda state, budgets: (state, ())  # the run fails at its next step, not now


def _nonces_not_one_time(real: Any) -> Any:
    return lambda state: frozenset()  # a decision or an approval: no nonce was ever consumed


def _any_policy_version(real: Any) -> Any:
    def checked(state: Any, **kw: Any) -> Any:
        return real(state, **{**kw, "policy_version": None})  # signed under any version

    return checked


def _landed_resends(real: Any) -> Any:
    from tether.core._case_table import Settlement

    def settle_case(state: Any, case: Any, settled: Any, *args: Any, **kw: Any) -> Any:
        if settled is Settlement.LANDED:
            settled = Settlement.RESEND  # a person's "it landed" taken as "send it again"
        return real(state, case, settled, *args, **kw)

    return settle_case


def _resend_uncommitted(real: Any) -> Any:
    def resend(state: RunState, facts: Any) -> Transition:
        transition: Transition = real(state, facts)
        if transition.call is not None and transition.state is not None:
            # Sent without first committing that it was: the order survives a crash.
            return replace(transition, state=None, events=(), ledger=())
        return transition

    return resend


def _mutants() -> dict[str, Mutant]:
    from tether.core import _actions as actions_rules
    from tether.core import _budgets as budget_rules
    from tether.core import _case_rules as case_rules
    from tether.core import _evidence as evidence_rules
    from tether.core import _replay as replay_rules
    from tether.core import _retry as retry_rules
    from tether.core import _steps as step_rules
    from tether.runtime import _carry, _lease, _replaying, _runtime, _session, _worker
    from tether.store import _leases, _sql

    return {
        m.name: m
        for m in (
            Mutant(
                "settle_never_asks",
                "recovery re-sends a dispatched write without asking the adapter",
                ((settle_rules, "settle", _settle_without_asking),),
            ),
            Mutant(
                "deferred_receipt_unasked",
                "a dispatched write whose receipt could ride on the next commit is taken as "
                "committed at recovery, the adapter never asked",
                ((settle_rules, "settle", _deferred_taken_as_committed),),
            ),
            Mutant(
                "blind_not_frozen",
                "a blind adapter's unknown outcome is re-sent instead of frozen",
                ((settle_rules, "settle", _blind_resent),),
            ),
            Mutant(
                "retention_ignored",
                "absence taken as final past the adapter's retention",
                ((settle_rules, "_past_retention", _no_retention),),
                frozenset({"retention_past"}),
            ),
            Mutant(
                "approval_unchecked",
                "the approval gate lets every write through",
                ((settle_rules, "_waiting", _no_approval),),
            ),
            Mutant(
                "approval_expiry_ignored",
                "an approval that expired still lets its write through",
                ((settle_rules, "approval_problem", _expiry_ignored),),
            ),
            Mutant(
                "risk_unchecked",
                "the gate lets a kind above the policy's max_risk through",
                ((actions_rules, "_within_risk", _risk_unchecked),),
                frozenset({"policy_change"}),
            ),
            Mutant(
                "absence_always_final",
                "a look-up's 'nothing' taken as final where the adapter says it is not",
                ((settle_rules, "after_lookup", _absence_final),),
            ),
            Mutant(
                "reconcile_any_digest",
                "reconcile accepts a receipt without comparing the intent digest",
                ((settle_rules, "reconcile", _reconcile_any_digest),),
                frozenset({"hostile_answers"}),
            ),
            Mutant(
                "lease_unchecked",
                "the lease is not checked before an effect, nor by the store's compare-and-set",
                (
                    (_lease.LeaseHolder, "_renew_due", _no_renewal),
                    (_leases.LeaseSQL, "check_lease", _lease_unchecked),
                    (_sql.SQLBase, "_cas_mark", _cas_any_lease),
                ),
            ),
            Mutant(
                "replay_receipts_unchecked",
                "a replay does not compare the adapter's receipt with the ledger's",
                ((replay_rules, "same_receipt", _receipts_always_agree),),
            ),
            Mutant(
                "replay_never_asks",
                "a replay of a commit is answered from the ledger, the adapter never asked",
                (
                    (replay_rules, "lookup_key", _never_asks_about_a_commit),
                    (replay_rules, "_judge_committed", _commit_from_the_ledger),
                ),
            ),
            Mutant(
                "replay_absence_past_retention",
                "a replay takes an absence past the adapter's retention as proof",
                ((replay_rules, "_remembered", _forever_remembered),),
            ),
            Mutant(
                "replay_swallows_reverts",
                "a replay answers a write whose target no longer holds what it left (A, B, A)",
                ((replay_rules, "judge", _reverts_swallowed),),
            ),
            Mutant(
                "replay_swallows_state_reverts",
                "a replay answers A, B, A on a target declared a state that nothing reads",
                ((replay_rules, "overwritten_verdict", _state_reverts_swallowed),),
            ),
            Mutant(
                "replay_unsettled_between_ignored",
                "a replay answers A, B?, A on a state: B's outcome unknown, and not counted",
                ((replay_rules, "since_on_target", _unsettled_between_ignored),),
            ),
            Mutant(
                "replay_foreign_receipt",
                "a receipt under a key answers another intent's replay",
                ((replay_rules, "_judge_unsettled", _foreign_receipt_answers),),
            ),
            Mutant(
                "replay_unapproved",
                "a gated kind's replay needs no approval",
                ((replay_rules, "_approved", _replay_unapproved),),
            ),
            Mutant(
                "replay_result_dropped",
                "a replay hands the agent no result",
                ((replay_rules, "_replayed", _result_dropped),),
            ),
            Mutant(
                "resend_is_progress",
                "a worker counts a resend or a wait as progress, so it never backs off",
                ((retry_rules, "step_progressed", _always_progress),),
            ),
            Mutant(
                "park_forgets_outage",
                "a run parked for a person after its claim met a service that was down keeps "
                "no back-off: the answer sends the next claim straight back to the service",
                ((_worker, "after_step", _park_forgets_outage),),
            ),
            Mutant(
                "resend_recorded_each_time",
                "every resend to a service that is down adds a checkpoint and a ledger row",
                ((settle_rules, "records_resend", _resend_always_recorded),),
            ),
            Mutant(
                "held_write_not_rejudged",
                "a held write is re-checked only for its approval after a policy change",
                ((_runtime.Runtime, "held_problem", _held_never_rejudged),),
            ),
            Mutant(
                "worker_never_yields",
                "a worker tries a failing run again at once, in the same turn, never the next",
                (
                    (_worker.Worker, "_failed", _tries_again_at_once),
                    (_worker.Worker, "_outage", _tries_again_at_once),
                ),
            ),
            Mutant(
                "no_backoff_across_claims",
                "a run that made no progress is let go without a back-off: claimed again at once",
                ((_leases.LeaseSQL, "defer", _let_go_at_once),),
            ),
            Mutant(
                "released_run_claimed_first",
                "a run let go without a deferral is claimed before every run waiting its turn",
                ((_leases.LeaseSQL, "release_lease", _released_claimable_since_ever),),
            ),
            Mutant(
                "claim_ties_by_run_id",
                "runs claimable at the same instant are claimed by run id, not least recently "
                "taken first: a run let go as another became claimable is taken again and again",
                ((_leases, "CLAIM_ORDER", _ties_by_run_id),),
            ),
            Mutant(
                "stale_reads_unchecked",
                "a read or a test run is never checked against the version it was built on",
                (
                    (actions_rules, "version_problem", _reads_never_stale),
                    (_carry, "version_problem", _reads_never_stale),
                ),
            ),
            Mutant(
                "refusal_fails_untraced",
                "a refusal that spends the last proposal fails the run without a failed event",
                ((step_rules, "charged_last", _untraced_failure),),
            ),
            Mutant(
                "replay_budget_left_open",
                "a replay that spends the last proposal leaves the run going until its next step",
                ((budget_rules, "charged_last", _budget_left_open),),
            ),
            Mutant(
                "decision_nonce_reused",
                "a decision carrying a nonce another case (or an approval) consumed is accepted",
                ((evidence_rules, "consumed_nonces", _nonces_not_one_time),),
            ),
            Mutant(
                "approval_any_policy_version",
                "an approval signed under an older policy version lets a send go under a newer one",
                (
                    (settle_rules, "approval_problem", _any_policy_version),
                    (_session, "awaits_approval", _any_policy_version),
                    (_carry, "approval_problem", _any_policy_version),
                    (_replaying, "approval_problem", _any_policy_version),
                ),
                frozenset({"policy_change"}),
            ),
            Mutant(
                "landed_resends",
                "a reviewer's signed landed sends the write again (as not_landed would)",
                ((case_rules, "settle_case", _landed_resends),),
            ),
            Mutant(
                "resend_order_survives",
                "the resend a reviewer's not_landed ordered leaves before its commit says so",
                ((settle_rules, "resend_ordered", _resend_uncommitted),),
            ),
            Mutant(
                "ledger_forgets",
                "the ledger as read back keeps only each effect's newest entry",
                (
                    (_sql.SQLBase, "ledger", _ledger_forgets),
                    # What a recovery and a replay look-up read of it, too.
                    (_sql.SQLBase, "ledger_between", _ledger_forgets),
                    (_sql.SQLBase, "ledger_for_effect", _ledger_forgets),
                ),
            ),
        )
    }


def mutants() -> dict[str, Mutant]:
    """Every planted defect, by name."""
    return _mutants()


@contextlib.contextmanager
def planted(name: str) -> Iterator[Mutant]:
    """Plant the mutant ``name`` for the duration of the block; the real functions come back."""
    mutant = mutants()[name]
    saved: list[tuple[Any, str, Any]] = []
    try:
        for owner, attribute, twin in mutant.patches:
            real = getattr(owner, attribute)
            saved.append((owner, attribute, real))
            setattr(owner, attribute, twin(real))
        yield mutant
    finally:
        for owner, attribute, real in reversed(saved):
            setattr(owner, attribute, real)


def catches(name: str, seed: int, *, events: int = 60) -> bool:
    """Whether ``seed`` catches mutant ``name``: it passes on the real code and fails with it.

    Seeds from 1,000,001 on name the directed scenarios (``_directed``).
    """
    from tether.testing.simulate._scenario import CI_KNOBS, draw

    knobs = CI_KNOBS | mutants()[name].knobs
    if seed > 1_000_000:
        from tether.testing.simulate._directed import directed

        chosen = [s for s in directed(knobs) if s.seed == seed]
        return bool(chosen) and catches_scenario(name, chosen[0])
    return catches_scenario(name, draw(seed, knobs, events=events))


def catches_scenario(name: str, scenario: Any) -> bool:
    """Whether ``scenario`` passes on the real code and breaks an invariant with ``name`` planted."""
    from tether.testing.simulate._runner import simulate

    with planted(name):
        if simulate(scenario).ok:
            return False
    return simulate(scenario).ok


def hunt(name: str, seeds: range, *, events: int = 60) -> int | None:
    """The first directed scenario, then seed of ``seeds``, that catches mutant ``name``."""
    from tether.testing.simulate._directed import directed
    from tether.testing.simulate._scenario import CI_KNOBS

    for scenario in directed(CI_KNOBS | mutants()[name].knobs):
        if catches_scenario(name, scenario):
            return scenario.seed
    for seed in seeds:
        if catches(name, seed, events=events):
            return seed
    return None
