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
from dataclasses import dataclass
from typing import Any

from tether.core import EffectStatus, RunState, Transition
from tether.core import _settle as settle_rules


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
        return real(state, replace(facts, capabilities=caps), answer)  # type: ignore[no-any-return]

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
    def gate(proposal: Any, **kw: Any) -> Any:
        from dataclasses import replace

        from tether.core import Risk

        return real(proposal, **{**kw, "policy": replace(kw["policy"], max_risk=Risk.CRITICAL)})

    return gate


def _lease_unchecked(real: Any) -> Any:
    return lambda self, run_id, lease_version: None


def _no_renewal(real: Any) -> Any:
    return lambda self: None


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
    def ledger(self: Any, run_id: str) -> Any:
        entries = real(self, run_id)
        # A restore that keeps only the newest status of each effect.
        newest: dict[str, Any] = {}
        for entry in entries:
            newest[entry.idempotency_key] = entry
        return sorted(newest.values(), key=lambda e: (e.idempotency_key, e.seq))

    return ledger


def _mutants() -> dict[str, Mutant]:
    from tether.runtime import _lease, _session
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
                ((_session, "gate", _risk_unchecked),),
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
                    (_lease.LeaseHolder, "renew_if_due", _no_renewal),
                    (_leases.LeaseSQL, "check_lease", _lease_unchecked),
                    (_sql.SQLBase, "_cas_mark", _cas_any_lease),
                ),
            ),
            Mutant(
                "ledger_forgets",
                "the ledger as read back keeps only each effect's newest entry",
                ((_sql.SQLBase, "ledger", _ledger_forgets),),
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
