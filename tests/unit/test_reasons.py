"""Review and outcome reasons are each one StrEnum, defined once, and no rule spells one by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tether
from tether.core import OutcomeReason, ReviewReason
from tether.core import _replay as replay_rules
from tether.core import _steps as step_rules

SRC = Path(tether.__file__).parent

#: Calls whose first positional argument is a reason word (a refusal's, a verdict's after it).
_REASON_FIRST = {"Rejection", "GateRejection", "_rejected"}


def _literal_reasons(path: Path) -> list[tuple[int, str]]:
    """Every place in ``path`` that passes a reason as a string literal instead of a member."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg in {"reason", "stop_reason"}:
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.append((value.lineno, value.value))
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        args = node.args
        candidates: list[ast.expr] = []
        if name in _REASON_FIRST and args:
            candidates.append(args[0])
        if name == "Judgement" and len(args) > 1:
            candidates.append(args[1])
        if name in {"Outcome", "failed"} and len(args) > 2 - (name == "failed"):
            candidates.append(args[2 - (name == "failed")])
        for arg in candidates:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((arg.lineno, arg.value))
    return found


@pytest.mark.parametrize("layer", ["core", "runtime"])
def test_no_rule_spells_a_reason_by_hand(layer: str) -> None:
    """core and runtime name every outcome and review reason by its enum member, never a string."""
    offenders = [
        f"{path.relative_to(SRC)}:{line}: {word!r}"
        for path in sorted((SRC / layer).rglob("*.py"))
        for line, word in _literal_reasons(path)
    ]
    assert offenders == []


def test_review_and_outcome_reasons_share_no_word() -> None:
    """A word means one thing: no outcome reason is also a review case's reason."""
    assert {r.value for r in OutcomeReason} & {r.value for r in ReviewReason} == set()


@pytest.mark.parametrize(
    ("which", "member"),
    [
        ("steps", OutcomeReason.EXHAUSTED_STEPS),
        ("proposals", OutcomeReason.EXHAUSTED_PROPOSALS),
        ("cost", OutcomeReason.EXHAUSTED_COST),
        ("wall_time", OutcomeReason.EXHAUSTED_WALL_TIME),
        ("deadline", OutcomeReason.EXHAUSTED_DEADLINE),
    ],
)
def test_every_spent_budget_has_its_member(which: str, member: OutcomeReason) -> None:
    """The stop reason of each budget spent_budget can name is an outcome reason member."""
    assert step_rules.budget_reason(which) is member


def test_a_budget_nobody_defined_is_refused() -> None:
    """A budget word spent_budget never returns is no reason at all (a caller's bug, raised)."""
    with pytest.raises(ValueError):
        step_rules.budget_reason("patience")


def test_replay_review_reasons_are_review_reasons() -> None:
    """The replay rule's review verdicts are ReviewReason members; it keeps no alias of its own."""
    for alias in ("REPLAY_OF_UNKNOWN", "RECEIPT_MISSING", "RECEIPT_DRIFT", "KEY_CONFLICT"):
        assert not hasattr(replay_rules, alias)
