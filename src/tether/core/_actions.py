"""The action contract: every kind an agent may propose, and the gate that judges it.

Every action is a :class:`Proposal` of one declared :class:`ActionKind`:
reads and writes an adapter declares, and the runtime's own ``tests.run``,
``finish`` and ``cancel``. The task says which kinds and targets the run may
use; the policy names each kind's risk class, permission and whether a
person must approve it first (reads and test runs too).

The gate is pure: the caller passes the clock reading, the current
environment and whether the action id was used before. A rejection is a
value with a stable reason word, not an exception, so the runtime can trace
it and charge it to the proposal budget.

=====================  ======================================================
reason                 refused because
=====================  ======================================================
pending_exists         the run is not running (one action at a time)
schema                 a field of the proposal has the wrong type, or is unknown
embedded_approval      the arguments claim an approval (people sign those)
unknown_kind           no adapter and not the runtime declares the kind
scope_kind             the task does not allow the kind
missing_argument       a required argument is absent
unknown_argument       an argument the kind does not declare is present
scope_target           the target is not a canonical path inside the task's paths
test_target            a ``tests.run`` target is not on the task's allowlist
agent_key              the proposal carries an idempotency key (the runtime
                       mints keys; a non-mutating action has none at all)
no_rule                the policy names no rule for the kind
permission             the task lacks the permission the kind needs
risk_mismatch          the declared risk is not the policy's risk for the kind
risk                   the kind's risk is above what the policy allows
missing_version        a mutation does not say which version it was built on
stale_version          the action (any kind: a read and a test run too) names
                       another environment version than the current one
deadline               the proposal's deadline has passed
duplicate_action       the action id was used before in this run (a pending
                       write that never dispatched included)
budget_cost            the cost would exceed the task's cost budget
=====================  ======================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from tether.core._canonical import JSONValue, canonical_bytes
from tether.core._errors import CanonicalJSONError, SpecError
from tether.core._fields import Fields
from tether.core._model import CompletedWrite, EnvironmentState, LastOutcome
from tether.core._phases import Compensation, OutcomeReason, Phase
from tether.core._spec import KindRule, Policy, Risk, TaskSpec, check_canonical_path

# Fields an agent may never put in its own proposal: approval is given by a
# person outside the runtime, never claimed by the proposer.
_FORBIDDEN_ARGS = frozenset({"approval", "approvals", "approved", "approved_by"})


class ActionClass(StrEnum):
    """What an action does to the world. Only ``write`` changes it."""

    READ = "read"
    WRITE = "write"
    TEST = "test"
    FINISH = "finish"
    CANCEL = "cancel"


class TargetKind(StrEnum):
    """What an action's ``target`` names."""

    PATH = "path"  # a canonical relative path inside the task's allowed paths
    TEST = "test"  # a name on the task's test allowlist
    NONE = "none"  # nothing: the target must be empty
    #: Any text naming what the effect acts on (a channel, a customer id, an
    #: address, a URL), never read as a file path: the kind alone scopes it.
    NAME = "name"


#: The longest target a ``name`` kind takes (it is bound into keys and receipts).
MAX_NAME_TARGET = 4096


@dataclass(frozen=True, slots=True)
class ActionKind:
    """One kind of action: its class, what its target names, and the arguments it takes."""

    name: str
    action_class: ActionClass
    target: TargetKind = TargetKind.PATH
    required: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()
    #: How a committed effect of this kind can be undone; the ledger records it.
    compensation: Compensation = Compensation.NONE

    @property
    def mutating(self) -> bool:
        """Whether the action changes the environment (and so needs a key and a ledger)."""
        return self.action_class is ActionClass.WRITE


TESTS_RUN = ActionKind("tests.run", ActionClass.TEST, TargetKind.TEST)
FINISH = ActionKind("finish", ActionClass.FINISH, TargetKind.NONE, optional=frozenset({"summary"}))
CANCEL = ActionKind("cancel", ActionClass.CANCEL, TargetKind.NONE, required=frozenset({"reason"}))
RUNTIME_KINDS = (TESTS_RUN, FINISH, CANCEL)

# Every run can end: without a policy rule of their own, finish and cancel are
# low risk and need no permission and no approval. A policy that names a rule
# for them (finish under approval, say) is obeyed like any other.
CONTROL_RULE = KindRule(Risk.LOW, "", False)
_CONTROL = frozenset({ActionClass.FINISH, ActionClass.CANCEL})


def catalog(adapter_kinds: Iterable[ActionKind]) -> dict[str, ActionKind]:
    """Every kind a run may propose: the adapter's declared kinds plus the runtime's own."""
    kinds = {kind.name: kind for kind in RUNTIME_KINDS}
    for kind in adapter_kinds:
        if kind.name in kinds:
            raise SpecError("kinds", f"the adapter declares {kind.name!r}, which is already taken")
        kinds[kind.name] = kind
    return kinds


def rule_for(policy: Policy, kind: ActionKind) -> KindRule | None:
    """The policy's rule for ``kind`` (the default for finish and cancel), or ``None``."""
    rule = policy.kinds.get(kind.name)
    if rule is None and kind.action_class in _CONTROL:
        return CONTROL_RULE
    return rule


def check_contract(task: TaskSpec, policy: Policy, kinds: Mapping[str, ActionKind]) -> None:
    """Refuse, when a task meets its policy and adapter, any name nobody defines.

    A kind the task allows must be declared (by the adapter or the runtime)
    and ruled by the policy; a permission the task grants must be one the
    policy's rules name (a typo would otherwise grant nothing, silently).
    """
    for index, name in enumerate(task.allowed_kinds):
        kind = kinds.get(name)
        if kind is None:
            raise SpecError(
                f"allowed_kinds[{index}]",
                f"unknown action kind {name!r}; this adapter and the runtime declare "
                f"{sorted(kinds)}",
            )
        if rule_for(policy, kind) is None:
            raise SpecError(
                f"allowed_kinds[{index}]",
                f"the policy {policy.policy_id!r} has no rule for {name!r}",
            )
    for control in (FINISH, CANCEL):
        # Every run must be able to end: a rule for finish or cancel may not
        # ask for what this task can never have.
        rule = rule_for(policy, control)
        if rule is not None and rule.permission and rule.permission not in task.permissions:
            raise SpecError(
                f"kinds.{control.name}",
                f"needs permission {rule.permission!r}, which the task does not grant",
            )
        if rule is not None and rule.risk.rank > policy.max_risk.rank:
            raise SpecError(
                f"kinds.{control.name}", f"is {rule.risk} risk; the policy allows {policy.max_risk}"
            )
    named = {rule.permission for rule in policy.kinds.values()}
    for index, permission in enumerate(task.permissions):
        if permission not in named:
            raise SpecError(
                f"permissions[{index}]",
                f"unknown permission {permission!r}; the policy names {sorted(named)}",
            )


@dataclass(frozen=True, slots=True)
class Proposal:
    """An action the agent asks for.

    ``based_on_version`` is the environment version the agent observed; a
    mutation must give it, and any action that gives it is refused when the
    environment has moved on (:func:`version_problem`). ``risk`` is optional: when given it must be the
    policy's risk for the kind. ``idempotency_key`` exists only to be refused:
    the runtime mints every key itself, after the gate.
    """

    action_id: str
    kind: str
    target: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    based_on_version: int | None = None
    cost: int = 0
    deadline: datetime | None = None
    risk: str | None = None
    idempotency_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why the gate refused a proposal; ``reason`` is a stable machine-readable word."""

    reason: str
    message: str


def gate(
    proposal: Proposal,
    *,
    kinds: Mapping[str, ActionKind],
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
        return Rejection(OutcomeReason.PENDING_EXISTS, f"run is {phase}; one action at a time")
    shape = _shape(proposal)
    if shape is not None:
        return shape
    embedded = _FORBIDDEN_ARGS & set(proposal.args)
    if embedded:
        return Rejection(
            OutcomeReason.EMBEDDED_APPROVAL,
            f"a proposal may not carry its own approval ({sorted(embedded)}); approvals are signed "
            "outside the runtime",
        )
    kind = kinds.get(proposal.kind)
    if kind is None:
        return _unknown_kind(proposal.kind)
    allowed = _allowed_kind(kind, task)
    if allowed is not None:
        return allowed
    missing = kind.required - set(proposal.args)
    if missing:
        return Rejection(OutcomeReason.MISSING_ARGUMENT, f"{kind.name} needs {sorted(missing)}")
    unknown = set(proposal.args) - kind.required - kind.optional
    if unknown:
        return Rejection(OutcomeReason.UNKNOWN_ARGUMENT, f"{kind.name} takes no {sorted(unknown)}")
    scope = _scope(kind, proposal.target, task)
    if scope is not None:
        return scope
    text = _text_args(kind, proposal.args)
    if text is not None:
        return text
    if proposal.idempotency_key is not None:
        what = (
            "a mutation's key is minted by the runtime"
            if kind.mutating
            else (f"{kind.name} changes nothing, so it has no idempotency key")
        )
        return Rejection(
            OutcomeReason.AGENT_KEY, f"the proposal carries an idempotency key; {what}"
        )
    ruled = _ruled(kind, task, policy)
    if ruled is not None:
        return ruled
    risk = risk_of(policy, kind)  # ruled: the policy has a rule for the kind
    if proposal.risk is not None and proposal.risk != risk.value:
        return Rejection(
            OutcomeReason.RISK_MISMATCH,
            f"the proposal declares {proposal.risk!r} risk; {kind.name} is {risk} risk",
        )
    risky = _within_risk(kind, policy)
    if risky is not None:
        return risky
    version = version_problem(kind, proposal.based_on_version, environment)
    if version is not None:
        return version
    if proposal.deadline is not None and now >= proposal.deadline:
        return Rejection(OutcomeReason.DEADLINE, "the proposal's deadline has passed")
    if action_seen:
        return Rejection(
            OutcomeReason.DUPLICATE_ACTION, f"action id {proposal.action_id!r} was used before"
        )
    return _affordable(proposal.cost, cost_spent, task)


def contract_problem(
    kind_name: str,
    target: str,
    cost: int,
    *,
    kinds: Mapping[str, ActionKind],
    task: TaskSpec,
    policy: Policy,
    cost_spent: int,
) -> Rejection | None:
    """The gate's checks of what the catalog, the task and the policy allow, and nothing else.

    A fresh proposal meets these inside :func:`gate` (in the same order);
    an action already held (pending, not yet sent) is judged by them again
    when the policy it would go out under is not the one that let it in
    (see :mod:`tether.core._policy_change`). The proposal's form (its
    arguments, version, deadline, id), judged once when it was made, is
    not re-judged: nothing about it can change while it is held.
    """
    kind = kinds.get(kind_name)
    if kind is None:
        return _unknown_kind(kind_name)
    return (
        _allowed_kind(kind, task)
        or _scope(kind, target, task)
        or _ruled(kind, task, policy)
        or _within_risk(kind, policy)
        or _affordable(cost, cost_spent, task)
    )


def _unknown_kind(name: str) -> Rejection:
    return Rejection(OutcomeReason.UNKNOWN_KIND, f"no adapter declares the kind {name!r}")


def _allowed_kind(kind: ActionKind, task: TaskSpec) -> Rejection | None:
    if kind.action_class not in _CONTROL and kind.name not in task.allowed_kinds:
        return Rejection(OutcomeReason.SCOPE_KIND, f"kind {kind.name!r} is not allowed by the task")
    return None


def _ruled(kind: ActionKind, task: TaskSpec, policy: Policy) -> Rejection | None:
    rule = rule_for(policy, kind)
    if rule is None:
        return Rejection(OutcomeReason.NO_RULE, f"the policy has no rule for kind {kind.name!r}")
    if rule.permission and rule.permission not in task.permissions:
        return Rejection(
            OutcomeReason.PERMISSION, f"kind {kind.name!r} needs permission {rule.permission!r}"
        )
    return None


def _within_risk(kind: ActionKind, policy: Policy) -> Rejection | None:
    risk = risk_of(policy, kind)
    if risk.rank > policy.max_risk.rank:
        return Rejection(
            OutcomeReason.RISK,
            f"kind {kind.name!r} is {risk} risk; the policy allows {policy.max_risk}",
        )
    return None


def _affordable(cost: int, cost_spent: int, task: TaskSpec) -> Rejection | None:
    if cost_spent + cost > task.budgets.cost:
        return Rejection(OutcomeReason.BUDGET_COST, "the proposal would exceed the cost budget")
    return None


def version_problem(
    kind: ActionKind, based_on: int | None, environment: EnvironmentState
) -> Rejection | None:
    """Why an action built on environment version ``based_on`` may not act now, or ``None``.

    One rule for every kind: an action that names the version it was built on
    is refused (``stale_version``) unless the environment is still at it, a
    read or a test run as much as a write (a read of a moved file answers
    a question the agent no longer has; a test run judges code it has not
    seen). ``None`` keeps its meaning per class: a mutation must name its
    version (``missing_version``), since its intent and the approval binding
    it are about the world it saw; any other action is built on the
    environment as it is observed at this step (the effects API and
    ``RunSession.act`` fill that version in; the runtime's own finish is
    judged by the verifier on the state as it is).
    """
    if based_on is None:
        if kind.mutating:
            return Rejection(
                OutcomeReason.MISSING_VERSION,
                "a mutation must say which environment version it was built on",
            )
        return None
    if based_on != environment.version:
        return Rejection(
            OutcomeReason.STALE_VERSION,
            f"{kind.name} was built on version {based_on}, the environment is at "
            f"{environment.version}; observe again",
        )
    return None


def _shape(proposal: Proposal) -> Rejection | None:
    if not isinstance(proposal.action_id, str) or not proposal.action_id:
        return Rejection(OutcomeReason.SCHEMA, "action_id must be a non-empty string")
    if not isinstance(proposal.kind, str) or not isinstance(proposal.target, str):
        return Rejection(OutcomeReason.SCHEMA, "kind and target must be strings")
    if not isinstance(proposal.args, dict):
        return Rejection(OutcomeReason.SCHEMA, "args must be an object")
    if not all(isinstance(name, str) for name in proposal.args):
        return Rejection(OutcomeReason.SCHEMA, "argument names must be strings")
    try:
        canonical_bytes(proposal.args)
    except CanonicalJSONError as exc:
        return Rejection(OutcomeReason.SCHEMA, f"args must be JSON: {exc}")
    if proposal.extra:
        return Rejection(OutcomeReason.SCHEMA, f"unknown proposal fields {sorted(proposal.extra)}")
    if isinstance(proposal.cost, bool) or not isinstance(proposal.cost, int) or proposal.cost < 0:
        return Rejection(OutcomeReason.SCHEMA, "cost must be a non-negative integer")
    version = proposal.based_on_version
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        return Rejection(OutcomeReason.SCHEMA, "based_on_version must be an integer")
    if proposal.risk is not None and not isinstance(proposal.risk, str):
        return Rejection(OutcomeReason.SCHEMA, "risk must be a string")
    if proposal.deadline is not None and (
        not isinstance(proposal.deadline, datetime) or proposal.deadline.tzinfo is None
    ):
        return Rejection(OutcomeReason.SCHEMA, "deadline must be a timezone-aware datetime")
    return None


def _text_args(kind: ActionKind, args: dict[str, Any]) -> Rejection | None:
    """A cancel needs a reason a person can read later; a finish's summary is text."""
    if kind.action_class is ActionClass.CANCEL:
        reason = args.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            return Rejection(OutcomeReason.SCHEMA, "cancel needs a non-empty reason")
    if kind.action_class is ActionClass.FINISH and not isinstance(args.get("summary", ""), str):
        return Rejection(OutcomeReason.SCHEMA, "a finish's summary must be text")
    return None


def _scope(kind: ActionKind, target: str, task: TaskSpec) -> Rejection | None:
    if kind.target is TargetKind.NONE:
        if target:
            return Rejection(OutcomeReason.SCHEMA, f"{kind.name} takes no target")
        return None
    if kind.target is TargetKind.NAME:
        if len(target) > MAX_NAME_TARGET or any(ord(c) < 32 or ord(c) == 127 for c in target):
            return Rejection(
                OutcomeReason.SCHEMA,
                f"{kind.name}'s target must be text of at most {MAX_NAME_TARGET} characters "
                "without control characters",
            )
        return None
    if kind.target is TargetKind.TEST:
        if target not in task.tests:
            return Rejection(
                OutcomeReason.TEST_TARGET,
                f"{target!r} is not on the task's test allowlist {sorted(task.tests)}",
            )
        return None
    try:
        check_canonical_path(target, "target")
    except SpecError as exc:
        return Rejection(OutcomeReason.SCOPE_TARGET, exc.problem)
    if not task.allows_target(target):
        return Rejection(
            OutcomeReason.SCOPE_TARGET, f"target {target!r} is outside the task's paths"
        )
    return None


def risk_of(policy: Policy, kind: ActionKind) -> Risk:
    """The policy's risk class for ``kind`` (the gate has already refused unruled kinds)."""
    rule = rule_for(policy, kind)
    return Risk.LOW if rule is None else rule.risk


def needs_approval(policy: Policy, kind: ActionKind) -> bool:
    """Whether the policy makes a person approve ``kind`` before it is carried out."""
    rule = rule_for(policy, kind)
    return rule is not None and rule.needs_approval


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What an action the agent took came back with; the next observation carries it.

    ``outcome`` is an :class:`~tether.core.OutcomeKind` word (``observed``,
    ``rejected``, ``verifier_failed``...), ``reason`` its stable reason word,
    ``data`` what the adapter answered (a file's text, a test run's exit code).
    """

    action_id: str
    kind: str
    target: str
    outcome: str
    reason: str | None = None
    data: dict[str, JSONValue] = field(default_factory=dict)

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "action_id": self.action_id,
            "kind": self.kind,
            "target": self.target,
            "outcome": self.outcome,
            "reason": self.reason,
            "data": self.data,
        }

    @classmethod
    def parse(cls, f: Fields) -> ActionResult:
        data = f.raw("data")
        if not isinstance(data, dict):
            f.fail(f.name("data"), "expected an object")
        result = cls(
            action_id=f.str("action_id"),
            kind=f.str("kind"),
            target=f.str("target", nonempty=False),
            outcome=f.str("outcome"),
            reason=f.optional_str("reason"),
            data=data,
        )
        f.done()
        return result


@dataclass(frozen=True, slots=True)
class Observation:
    """What the agent sees before it decides: never the whole world, only what it asked for.

    ``environment`` is the environment's identity, version and fingerprint
    as read now; ``results`` the answers to the actions the agent took at its
    previous step (a read's text, a test run's exit code, a rejection's
    reason); ``last_write`` the newest write the run committed, with its
    receipt. A recovered run sees the same results its checkpoint recorded.
    ``last_outcome`` says how the agent's last action ended, whatever kind
    it was: the gate's or the adapter's refusal (reason word and message),
    the verifier's verdict with the tail of its output, a write executed or
    waiting for approval, a reviewer's decision; ``None`` when nothing has
    ended since the agent last looked. It is checkpointed, so it survives a
    crash between steps.
    """

    environment: EnvironmentState
    results: tuple[ActionResult, ...] = ()
    last_write: CompletedWrite | None = None
    last_outcome: LastOutcome | None = None

    def result(self, action_id: str) -> ActionResult | None:
        """The result of the action ``action_id``, if the previous step took it."""
        return next((r for r in self.results if r.action_id == action_id), None)
