"""The simulator has teeth: each planted defect is caught by a seed of the CI corpus.

A seed catches a mutant when it passes on the real code and fails with the
mutant planted (``tether.testing.simulate._mutants``). The lead adds the
replay-rule mutants after the rule rewrite.
"""

from __future__ import annotations

import logging

import pytest

from tether.testing.simulate._mutants import catches, mutants, planted

logging.getLogger("tether").setLevel(logging.CRITICAL)

#: mutant -> a seed of the CI corpus that catches it.
CAUGHT = {
    "settle_never_asks": 17,
    "blind_not_frozen": 17,
    "approval_unchecked": 4,
    "ledger_forgets": 1,
    "retention_ignored": 149,
}


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_a_planted_defect_is_caught_by_its_seed(name: str) -> None:
    """The seed passes on the real code and breaks an invariant with the mutant planted."""
    assert catches(name, CAUGHT[name])


def test_planting_restores_the_real_functions() -> None:
    """After the block, every patched function is the real one again."""
    for name, mutant in mutants().items():
        before = [getattr(owner, attr) for owner, attr, _ in mutant.patches]
        with planted(name):
            during = [getattr(owner, attr) for owner, attr, _ in mutant.patches]
        after = [getattr(owner, attr) for owner, attr, _ in mutant.patches]
        assert after == before and during != before, name
