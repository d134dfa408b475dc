"""The simulator has teeth: each planted defect is caught by a seed of the CI corpus.

A seed catches a mutant when it passes on the real code and fails with the
mutant planted (``tether.testing.simulate._mutants``): the rules of settle,
replay, retry, approval and policy, the lease fence and the ledger's read-back,
a worker's turn, the first seed's action contract, and what a reviewer's
landed / not_landed buys (no send; exactly one send).
"""

from __future__ import annotations

import pytest

from tether.testing.simulate._mutants import catches, mutants, planted
from tether.testing.simulate._scenario import FOUND_DEFECTS

#: mutant -> a seed of the CI corpus that catches it (from 1,000,001: a directed scenario).
CAUGHT = {
    "settle_never_asks": 1_000_001,
    "deferred_receipt_unasked": 1_000_014,
    "blind_not_frozen": 1_000_011,
    "retention_ignored": 1_000_001,
    "approval_unchecked": 1_000_013,
    "approval_expiry_ignored": 41,
    "risk_unchecked": 12,
    "absence_always_final": 1_000_105,
    "reconcile_any_digest": 1_000_025,
    "ledger_forgets": 1_000_001,
    "lease_unchecked": 1_000_019,
    "resend_is_progress": 1_000_139,
    "resend_recorded_each_time": 189,
    "park_forgets_outage": 141457,
    "held_write_not_rejudged": 12,
    "replay_receipts_unchecked": 1_000_037,
    "replay_never_asks": 1_000_031,
    "replay_absence_past_retention": 1_000_001,
    "replay_swallows_reverts": 37,
    "replay_swallows_state_reverts": 1_005_001,
    "replay_unsettled_between_ignored": 143033,
    "replay_foreign_receipt": 79,
    "replay_unapproved": 57,
    "replay_result_dropped": 1_000_003,
    "worker_never_yields": 1_000_145,
    "no_backoff_across_claims": 1_000_232,
    "released_run_claimed_first": 1_000_226,
    "claim_ties_by_run_id": 50767,
    "stale_reads_unchecked": 1_000_157,
    "refusal_fails_untraced": 1_000_167,
    "replay_budget_left_open": 1_000_160,
    "decision_nonce_reused": 1_000_176,
    "approval_any_policy_version": 1_000_179,
    "landed_resends": 1_000_188,
    "resend_order_survives": 1_000_204,
}

#: Each defect the simulator found in the rules as they were (issue 25), and the mutants
#: that plant it again: the corpus must catch every one of them.
REPLANTED = {
    "reverted_writes": (
        "replay_swallows_reverts",
        "replay_swallows_state_reverts",
        "replay_unsettled_between_ignored",
    ),
    "retention_past": ("replay_absence_past_retention", "retention_ignored"),
    "hostile_answers": ("replay_foreign_receipt",),
    "receipt_drift": ("replay_never_asks", "replay_receipts_unchecked"),
    "gated_repeats": ("replay_unapproved",),
    "service_down": ("resend_is_progress", "resend_recorded_each_time", "park_forgets_outage"),
    "policy_change": ("held_write_not_rejudged", "risk_unchecked"),
    "drawn_neighbours": ("released_run_claimed_first", "claim_ties_by_run_id"),
}


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_a_planted_defect_is_caught_by_its_seed(name: str) -> None:
    """The seed passes on the real code and breaks an invariant with the mutant planted."""
    assert catches(name, CAUGHT[name])


#: Planted and not caught by the corpus (none today; name one here rather than hide it).
ESCAPED: set[str] = set()


def test_every_planted_defect_is_pinned_or_named_as_escaped() -> None:
    """No mutant is planted without either a catching seed or an honest escape entry."""
    assert set(mutants()) == set(CAUGHT) | ESCAPED
    assert len(mutants()) >= 10


def test_planting_restores_the_real_functions() -> None:
    """After the block, every patched function is the real one again."""
    for name, mutant in mutants().items():
        before = [getattr(owner, attr) for owner, attr, _ in mutant.patches]
        with planted(name):
            during = [getattr(owner, attr) for owner, attr, _ in mutant.patches]
        after = [getattr(owner, attr) for owner, attr, _ in mutant.patches]
        assert after == before and during != before, name


def test_every_defect_the_simulator_found_is_planted_again_and_caught() -> None:
    """Each defect found in the old rules has a mutant that plants it back, pinned above."""
    assert set(REPLANTED) == set(FOUND_DEFECTS)
    assert {name for names in REPLANTED.values() for name in names} <= set(CAUGHT)
