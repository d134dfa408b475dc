"""The contract gate: every proposed write is checked here before it may become pending.

Pure: the caller passes the clock reading, the current environment and
whether the action id was used before. A rejection is a value, not an
exception, so the runtime can trace it and charge it to the proposal budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tether.core._errors import SpecError
from tether.core._model import EnvironmentState
from tether.core._phases import Phase
from tether.core._spec import Policy, Risk, TaskSpec, check_canonical_path

# Fields an agent may never put in its own proposal: approval is given by a
# person outside the runtime, never claimed by the proposer.
_FORBIDDEN_ARGS = frozenset({"approval", "approvals", "approved", "approved_by"})


@dataclass(frozen=True, slots=True)
class Proposal:
    """A write the agent asks for, built on the observation at ``based_on_version``."""

    action_id: str
    kind: str
    target: str
    args: dict[str, Any]
    based_on_version: int
    cost: int = 0
    deadline: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why the gate refused a proposal; ``reason`` is a stable machine-readable word."""

    reason: str
    message: str


def gate(
    proposal: Proposal,
    *,
    task: TaskSpec,
    policy: Policy,
    phase: Phase,
    environment: EnvironmentState,
    now: datetime,
    action_seen: bool,
    cost_spent: int,
) -> Rejection | None:
    """Return ``None`` when ``proposal`` passes every check, else the first failure."""
    if phase is not Phase.RUNNING:
        return Rejection("pending_exists", f"run is {phase}; one write at a time")
    if not proposal.action_id or not isinstance(proposal.action_id, str):
        return Rejection("schema", "action_id must be a non-empty string")
    if not isinstance(proposal.args, dict):
        return Rejection("schema", "args must be an object")
    if proposal.extra:
        return Rejection("schema", f"unknown proposal fields {sorted(proposal.extra)}")
    if isinstance(proposal.cost, bool) or not isinstance(proposal.cost, int) or proposal.cost < 0:
        return Rejection("schema", "cost must be a non-negative integer")
    embedded = _FORBIDDEN_ARGS & set(proposal.args)
    if embedded:
        return Rejection(
            "embedded_approval",
            f"a proposal may not carry its own approval ({sorted(embedded)}); approvals are signed "
            "outside the runtime",
        )
    if proposal.kind not in task.allowed_kinds:
        return Rejection("scope_kind", f"kind {proposal.kind!r} is not allowed by the task")
    try:
        check_canonical_path(proposal.target, "target")
    except SpecError as exc:
        return Rejection("scope_target", exc.problem)
    if not task.allows_target(proposal.target):
        return Rejection("scope_target", f"target {proposal.target!r} is outside the task's paths")
    rule = policy.kinds.get(proposal.kind)
    if rule is None:
        return Rejection("risk", f"the policy has no rule for kind {proposal.kind!r}")
    if rule.permission not in task.permissions:
        return Rejection(
            "permission", f"kind {proposal.kind!r} needs permission {rule.permission!r}"
        )
    if rule.risk.rank > policy.max_risk.rank:
        return Rejection(
            "risk",
            f"kind {proposal.kind!r} is {rule.risk} risk; the policy allows {policy.max_risk}",
        )
    if proposal.based_on_version != environment.version:
        return Rejection(
            "stale_version",
            f"proposal was built on version {proposal.based_on_version}, the environment is at "
            f"{environment.version}; observe again",
        )
    if proposal.deadline is not None and now >= proposal.deadline:
        return Rejection("deadline", "the proposal's deadline has passed")
    if action_seen:
        return Rejection("duplicate_action", f"action id {proposal.action_id!r} was used before")
    if cost_spent + proposal.cost > task.budgets.cost:
        return Rejection("budget_cost", "the proposal would exceed the cost budget")
    return None


def risk_of(policy: Policy, kind: str) -> Risk:
    """The policy's risk class for ``kind`` (the gate has already refused unknown kinds)."""
    return policy.kinds[kind].risk
