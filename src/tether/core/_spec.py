"""Task specs and policies, loaded strictly from JSON.

A task spec is the external, versioned description of the work; a policy is
the versioned rule set it runs under. Both are identified by a fingerprint
(the digest of their canonical JSON), so a checkpoint can prove which exact
documents it was made under, and a changed document is noticed even when
someone forgot to bump its version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tether.core._canonical import JSONValue, digest, strict_loads
from tether.core._errors import CanonicalJSONError, SpecError
from tether.core._fields import Fields

#: The largest numbers a task or policy may name. Past these a value is a
#: typo, and one that would overflow a time calculation later (a run must
#: never load and then wedge on it).
MAX_APPROVAL_TTL_S = 30 * 24 * 3600  # an approval lives at most 30 days
MAX_TIMEOUT_S = 24 * 3600  # a verifier or test command runs at most a day
MAX_WALL_TIME_S = 366 * 24 * 3600  # a run's wall-time budget: at most a year
MAX_COUNT = 10**12  # proposals, steps, cost


class Risk(StrEnum):
    """Risk class of an action kind, in increasing order."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _RISK_ORDER.index(self)


_RISK_ORDER = (Risk.LOW, Risk.MEDIUM, Risk.HIGH, Risk.CRITICAL)


def check_canonical_path(path: str, field: str, *, allow_dir: bool = False) -> str:
    """Return ``path`` if it is a canonical relative POSIX path, else raise ``SpecError``.

    Canonical: relative, ``/``-separated, no empty, ``.`` or ``..`` segment, no
    backslash or NUL. With ``allow_dir`` a single trailing ``/`` marks a
    directory prefix ("src/").
    """
    if not path:
        raise SpecError(field, "path must not be empty")
    if "\x00" in path or "\\" in path:
        raise SpecError(field, f"path {path!r} contains a NUL or backslash")
    if path.startswith("/"):
        raise SpecError(field, f"path {path!r} must be relative")
    body = path[:-1] if allow_dir and path.endswith("/") else path
    for segment in body.split("/"):
        if segment in {"", ".", ".."}:
            raise SpecError(field, f"path {path!r} is not canonical (segment {segment!r})")
    return path


@dataclass(frozen=True, slots=True)
class Budgets:
    """Limits on proposals, steps, wall time (seconds) and cost (integer units).

    ``wall_time_s`` bounds the run's own working time (see
    :class:`~tether.core.Spent`): downtime and waiting for a person do not
    count. ``deadline_s``, when set, bounds the calendar: seconds from the
    run's start, whatever it was doing.
    """

    proposals: int
    steps: int
    wall_time_s: int
    cost: int
    deadline_s: int | None = None


@dataclass(frozen=True, slots=True)
class Verifier:
    """A command the adapter runs from the task's allowlist: the verifier, or a test target."""

    argv: tuple[str, ...]
    timeout_s: int


#: An ``allowed_paths`` entry that lets a run touch any target its adapters accept
#: (a canonical relative path, an address): what a task built for you allows.
ANY_TARGET = "*"


@dataclass(frozen=True, slots=True)
class InitialEnvironment:
    """What the environment must look like when a run starts."""

    namespace: str
    state_fingerprint: str


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """The external, versioned description of one task."""

    task_id: str
    task_version: str
    allowed_kinds: tuple[str, ...]
    allowed_paths: tuple[str, ...]
    permissions: tuple[str, ...]
    budgets: Budgets
    #: The state a run must start from; ``None``: whatever the adapters show
    #: when the run starts (read then, and bound into its first checkpoint).
    initial_environment: InitialEnvironment | None
    #: What ``finish`` runs to judge the final state; ``None``: the task names
    #: nothing to test, and the run completes on the agent's finish, recorded
    #: as such (``no_verifier`` in the trace, stop reason ``finished_unverified``).
    verifier: Verifier | None
    #: The test targets a ``tests.run`` action may name, each a command the
    #: adapter runs (the verifier is what ``finish`` runs, and is not one).
    tests: dict[str, Verifier] = field(default_factory=dict)
    #: (fingerprint, scenario fingerprint), made at the first ask (see ``fingerprint``).
    _fingerprints: tuple[str, str] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def to_json(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "task_id": self.task_id,
            "task_version": self.task_version,
            "allowed_kinds": list(self.allowed_kinds),
            "allowed_paths": list(self.allowed_paths),
            "permissions": list(self.permissions),
            "budgets": {
                "proposals": self.budgets.proposals,
                "steps": self.budgets.steps,
                "wall_time_s": self.budgets.wall_time_s,
                "cost": self.budgets.cost,
                # Only when set, so a task without a deadline keeps its fingerprint.
                **(
                    {}
                    if self.budgets.deadline_s is None
                    else {"deadline_s": self.budgets.deadline_s}
                ),
            },
        }
        if self.initial_environment is not None:
            # Only when named, so a task that reads it at start says so in its fingerprint.
            body["initial_environment"] = {
                "namespace": self.initial_environment.namespace,
                "state_fingerprint": self.initial_environment.state_fingerprint,
            }
        if self.verifier is not None:
            # Only when named, so a task without a verifier says so in its fingerprint.
            body["verifier"] = {
                "argv": list(self.verifier.argv),
                "timeout_s": self.verifier.timeout_s,
            }
        if self.tests:
            # Only when present, so a task without tests keeps its fingerprint.
            body["tests"] = {
                name: {"argv": list(test.argv), "timeout_s": test.timeout_s}
                for name, test in sorted(self.tests.items())
            }
        return body

    @property
    def fingerprint(self) -> str:
        return self._digests()[0]

    @property
    def scenario_fingerprint(self) -> str:
        """Digest of the fixed scenario: initial environment and verifier."""
        return self._digests()[1]

    def _digests(self) -> tuple[str, str]:
        # Made once per task object: it is a frozen value (nothing changes its
        # tests in place), and every runtime built on it and every commit asks.
        found = self._fingerprints
        if found is None:
            body = self.to_json()
            scenario = {
                name: body[name] for name in ("initial_environment", "verifier") if name in body
            }
            found = (digest(body), digest(scenario))
            object.__setattr__(self, "_fingerprints", found)
        return found

    def allows_target(self, target: str) -> bool:
        for allowed in self.allowed_paths:
            if allowed == ANY_TARGET:
                return True
            if allowed.endswith("/") and target.startswith(allowed):
                return True
            if target == allowed:
                return True
        return False

    @classmethod
    def from_json(cls, data: bytes | str | dict[str, Any]) -> TaskSpec:
        """Parse a task spec strictly; raise ``SpecError`` naming the bad field."""
        f = Fields(_document(data), "", SpecError)
        budgets = f.obj("budgets")
        initial = f.optional_obj("initial_environment")
        verifier = f.optional_obj("verifier")
        paths = f.str_list("allowed_paths")
        for index, path in enumerate(paths):
            if path != ANY_TARGET:
                check_canonical_path(path, f"allowed_paths[{index}]", allow_dir=True)
        tests: dict[str, Verifier] = {}
        tests_obj = f.optional_obj("tests")
        if tests_obj is not None:
            for name in f.raw("tests"):
                if not name:
                    tests_obj.fail("tests", "a test target needs a non-empty name")
                tests[name] = _command(tests_obj.obj(name))
            tests_obj.done()
        spec = cls(
            task_id=f.str("task_id"),
            task_version=f.str("task_version"),
            allowed_kinds=f.str_list("allowed_kinds"),
            allowed_paths=paths,
            permissions=f.str_list("permissions"),
            budgets=Budgets(
                proposals=budgets.int("proposals", minimum=1, maximum=MAX_COUNT),
                steps=budgets.int("steps", minimum=1, maximum=MAX_COUNT),
                wall_time_s=budgets.int("wall_time_s", minimum=1, maximum=MAX_WALL_TIME_S),
                cost=budgets.int("cost", minimum=0, maximum=MAX_COUNT),
                deadline_s=budgets.int("deadline_s", minimum=1, maximum=MAX_WALL_TIME_S)
                if budgets.optional_raw("deadline_s") is not None
                else None,
            ),
            initial_environment=None
            if initial is None
            else InitialEnvironment(
                namespace=initial.str("namespace"),
                state_fingerprint=initial.str("state_fingerprint"),
            ),
            verifier=None if verifier is None else _command(verifier),
            tests=tests,
        )
        for part in (budgets, initial, f):
            if part is not None:
                part.done()
        return spec


@dataclass(frozen=True, slots=True)
class KindRule:
    """What the policy says about one action kind."""

    risk: Risk
    permission: str
    needs_approval: bool
    #: The effect's payload is sensitive: the ledger keeps its digest, never
    #: its body (the arguments, and the result inside the receipt).
    sensitive: bool = False


#: The roles a principal can hold in the deployment's trust roots, and
#: ``agent`` (the run's own agent), which only a rewind can name.
PRINCIPAL_ROLES = frozenset({"worker", "operator", "reviewer", "approver"})
REWIND_ROLES = PRINCIPAL_ROLES | {"agent"}
#: Who may sign a cancel: a person who runs the fleet, or one who reviews runs.
CANCEL_ROLES = frozenset({"operator", "reviewer"})
_CANCEL_DEFAULT = frozenset({"operator"})


class WithheldSecrets(StrEnum):
    """What a recovery by a principal without the read-secrets right gets."""

    REDACT = "redact"  # the run resumes with secret items withheld; the agent is told
    REFUSE = "refuse"  # the admission is refused


class PolicyChange(StrEnum):
    """What a recovery under another policy version than the checkpoint's is."""

    REFUSE = "refuse"
    NEW_OCCURRENCE = "new_occurrence"  # a new work occurrence, linked to the old one


@dataclass(frozen=True, slots=True)
class Authority:
    """Who may recover, rewind and read secrets, by role, under this policy.

    Admission checks these against the recovering principal's CURRENT roles
    (the deployment's trust roots now), never the roles it had when the run
    began: recovery is a new decision, not old authority thawed.
    """

    recover: frozenset[str] = frozenset({"worker", "operator"})
    rewind: frozenset[str] = frozenset({"operator", "reviewer"})
    read_secrets: frozenset[str] = frozenset({"worker", "operator"})
    secrets_withheld: WithheldSecrets = WithheldSecrets.REDACT
    policy_change: PolicyChange = PolicyChange.REFUSE
    #: Who may sign a cancel document (``tether cancel``): operators unless the
    #: policy says otherwise (``["operator", "reviewer"]``, or only reviewers).
    cancel: frozenset[str] = _CANCEL_DEFAULT

    def to_json(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "recover": sorted(self.recover),
            "rewind": sorted(self.rewind),
            "read_secrets": sorted(self.read_secrets),
            "secrets_withheld": self.secrets_withheld.value,
            "policy_change": self.policy_change.value,
        }
        # Written only when set, so a policy written before it keeps its fingerprint.
        if self.cancel != _CANCEL_DEFAULT:
            body["cancel"] = sorted(self.cancel)
        return body

    @classmethod
    def parse(cls, f: Fields) -> Authority:
        default = cls()

        def roles(key: str, allowed: frozenset[str], fallback: frozenset[str]) -> frozenset[str]:
            if f.optional_raw(key) is None:
                return fallback
            names = f.str_list(key)
            unknown = sorted(set(names) - allowed)
            if unknown:
                f.fail(f.name(key), f"unknown roles {unknown}; use {sorted(allowed)}")
            return frozenset(names)

        def choice(key: str, enum: Any, fallback: Any) -> Any:
            if f.optional_raw(key) is None:
                return fallback
            text = f.str(key)
            try:
                return enum(text)
            except ValueError:
                f.fail(f.name(key), f"unknown value {text!r}; use one of {[e.value for e in enum]}")

        authority = cls(
            recover=roles("recover", PRINCIPAL_ROLES, default.recover),
            rewind=roles("rewind", REWIND_ROLES, default.rewind),
            read_secrets=roles("read_secrets", PRINCIPAL_ROLES, default.read_secrets),
            secrets_withheld=choice("secrets_withheld", WithheldSecrets, default.secrets_withheld),
            policy_change=choice("policy_change", PolicyChange, default.policy_change),
            cancel=roles("cancel", CANCEL_ROLES, default.cancel),
        )
        if not authority.cancel:
            f.fail(f.name("cancel"), "name at least one role; a run must stay cancellable")
        f.done()
        return authority


@dataclass(frozen=True, slots=True)
class Policy:
    """Versioned rules a run executes under."""

    policy_id: str
    policy_version: str
    kinds: dict[str, KindRule]
    max_risk: Risk
    approval_ttl_s: int
    #: Who may recover, rewind and read secrets (defaults when the policy is silent).
    authority: Authority = field(default_factory=Authority)
    #: The fingerprint, made at the first ask (see ``fingerprint``).
    _fingerprint: str | None = field(default=None, init=False, repr=False, compare=False)

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "policy_id": self.policy_id,
            "policy_version": self.policy_version,
            "kinds": {kind: _rule_json(rule) for kind, rule in sorted(self.kinds.items())},
            "max_risk": self.max_risk.value,
            "approval_ttl_s": self.approval_ttl_s,
            # Written only when set, so a policy silent on it keeps its fingerprint.
            **({} if self.authority == Authority() else {"authority": self.authority.to_json()}),
        }

    @property
    def fingerprint(self) -> str:
        # Made once per policy object: it is a frozen value (nothing changes its
        # kinds in place), and every commit's listing asks.
        found = self._fingerprint
        if found is None:
            found = digest(self.to_json())
            object.__setattr__(self, "_fingerprint", found)
        return found

    @classmethod
    def from_json(cls, data: bytes | str | dict[str, Any]) -> Policy:
        """Parse a policy strictly; raise ``SpecError`` naming the bad field."""
        f = Fields(_document(data), "", SpecError)
        kinds_obj = f.obj("kinds")
        kinds: dict[str, KindRule] = {}
        raw_kinds = f.raw("kinds")
        for kind in raw_kinds:
            rule = kinds_obj.obj(kind)
            kinds[kind] = KindRule(
                risk=_risk(rule, "risk"),
                permission=rule.str("permission"),
                needs_approval=rule.bool("needs_approval"),
                # Optional, but when given it is true or false (never null).
                sensitive="sensitive" in raw_kinds[kind] and rule.bool("sensitive"),
            )
            rule.done()
        policy = cls(
            policy_id=f.str("policy_id"),
            policy_version=f.str("policy_version"),
            kinds=kinds,
            max_risk=_risk(f, "max_risk"),
            approval_ttl_s=f.int("approval_ttl_s", minimum=1, maximum=MAX_APPROVAL_TTL_S),
            authority=Authority()
            if f.optional_raw("authority") is None
            else Authority.parse(f.obj("authority")),
        )
        kinds_obj.done()
        f.done()
        return policy


def _rule_json(rule: KindRule) -> dict[str, JSONValue]:
    body: dict[str, JSONValue] = {
        "risk": rule.risk.value,
        "permission": rule.permission,
        "needs_approval": rule.needs_approval,
    }
    # Written only when set, so a policy that never names it keeps the
    # fingerprint it had before the field existed (and its runs restore).
    if rule.sensitive:
        body["sensitive"] = True
    return body


def _command(f: Fields) -> Verifier:
    argv = f.str_list("argv", unique=False)
    if not argv:
        f.fail(f.name("argv"), "must name a command")
    command = Verifier(argv=argv, timeout_s=f.int("timeout_s", minimum=1, maximum=MAX_TIMEOUT_S))
    f.done()
    return command


def _risk(f: Fields, key: str) -> Risk:
    value = f.str(key)
    try:
        return Risk(value)
    except ValueError:
        f.fail(f.name(key), f"unknown risk class {value!r}; use one of {[r.value for r in Risk]}")


def _document(data: bytes | str | dict[str, Any]) -> Any:
    if isinstance(data, dict):
        return data
    try:
        return strict_loads(data)
    except CanonicalJSONError as exc:
        raise SpecError("document", str(exc)) from exc


def describe_changes(before: Any, after: Any, *, limit: int = 6) -> tuple[str, ...]:
    """What differs between two versions of a task or policy document, one line per field.

    Nested objects are compared field by field (``kinds.email.send.needs_approval:
    false -> true``); a value too long to read is shown by its size. At most
    ``limit`` lines, the last saying how many more there were.
    """
    lines: list[str] = []
    _diff(before, after, "", lines)
    if len(lines) > limit:
        lines[limit - 1 :] = [f"... and {len(lines) - limit + 1} more"]
    return tuple(lines)


def _diff(before: Any, after: Any, path: str, lines: list[str]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            name = f"{path}.{key}" if path else str(key)
            if key not in before:
                lines.append(f"{name}: added ({_short(after[key])})")
            elif key not in after:
                lines.append(f"{name}: removed (was {_short(before[key])})")
            else:
                _diff(before[key], after[key], name, lines)
    elif before != after:
        lines.append(f"{path or 'document'}: {_short(before)} -> {_short(after)}")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 80 else f"<{len(text)} characters>"
