"""The simulator has teeth: each planted defect is caught by a seed of the CI corpus.

A seed catches a mutant when it passes on the real code and fails with the
mutant planted (``tether.testing.simulate._mutants``). The lead adds the
replay-rule mutants after the rule rewrite.
"""

from __future__ import annotations

import pytest

from tether.testing.simulate._mutants import catches, mutants, planted

#: mutant -> a seed of the CI corpus that catches it (from 1,000,001: a directed scenario).
CAUGHT = {
    "settle_never_asks": 0,
    "blind_not_frozen": 0,
    "retention_ignored": 1_000_097,
    "approval_unchecked": 4,
    "approval_expiry_ignored": 9,
    "risk_unchecked": 14,
    "absence_always_final": 1_000_087,
    "reconcile_any_digest": 26,
    "lease_unchecked": 10,
    "ledger_forgets": 0,
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
