"""The gateway's policy file: which upstream tools are reads, which effects need a person.

An MCP server says what its tools do in annotations (``readOnlyHint``,
``destructiveHint``, ``idempotentHint``) that the MCP specification calls
hints a client must never base decisions on when the server is untrusted.
So the gateway never reads them to decide: **every tool the policy does not
name as a read is an effect**, guarded by tether's protocol. The file:

.. code-block:: json

    {
      "policy_id": "notes-gateway",
      "policy_version": "1",
      "reads": ["search_notes", "count_notes"],
      "default": {"risk": "medium", "needs_approval": false},
      "tools": {
        "transfer": {"needs_approval": true, "risk": "high"},
        "send_email": {"sensitive": true},
        "create_issue": {"errors_are_refusals": true, "targets": "collection"},
        "charge": {"accepts_key": true},
        "write_file": {"targets": "state"}
      },
      "approval_ttl_s": 900
    }

Every field is optional (no file at all: every tool an effect, none gated).
``default`` is the rule of every effect the ``tools`` map does not name.
Per tool: ``risk`` (``low``..``critical``), ``needs_approval`` (a person
signs first, ``tether approve``), ``sensitive`` (the ledger keeps digests of
the arguments and the result, never their text), ``errors_are_refusals``
(the upstream's ``isError`` answer means nothing happened, so the agent may
ask again; by default an error answer is recorded like any answer: the
tool may have acted before failing), ``accepts_key`` (``true``: the
operator vouches that the tool deduplicates by the key in ``_meta``;
``false``: ignore the server's own declaration of it), ``targets`` (what
a call acts on, for a call equal to an earlier one with another call of
the tool between them, A, B, A: ``"state"``, each call sets what the tool's
target holds, so A is sent again; ``"collection"``, each call makes its own
object, so the third is the first, replayed; not declared, a person
decides, ``repeat_or_revert``: the server's hints are never read for it).
``authority`` is passed to tether's :class:`~tether.core.Policy` as it is.

A name the upstream does not offer is refused when the gateway starts: a
typo must not leave a tool ungated. :func:`run_rules` turns the file and the
upstream's tool names into the task and the policy of the run, the same
ones for the same inputs (a restarted gateway continues its run).

The file names tools as the upstream does. In the run, each tool is an
action kind of the same name (:func:`kind_of`), except a tool named like
one of a run's own actions (``finish``, ``cancel``, ``tests.run``), whose
kind is ``mcp:`` and its name: the run's own ``finish`` ends the run, a
tool's is only forwarded. So that no two tools share a kind, a tool whose
name starts with ``mcp:`` is prefixed too. The agent sees the upstream's
names unchanged either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tether.core import CanonicalJSONError as _JSONError
from tether.core import EnvironmentState, Policy, Risk, SpecError, Targets, TaskSpec, strict_loads
from tether.core._actions import RUNTIME_KINDS
from tether.core._fields import Fields
from tether.core._spec import MAX_APPROVAL_TTL_S, MAX_COUNT, MAX_WALL_TIME_S

#: The one permission every tool's rule names. One for reads and effects alike, so the
#: run's task is the tool list alone: a changed policy file is a policy change (which
#: tether's admission rules decide), never another task.
PERMISSION = "mcp.tools"
#: The default approval lifetime: fifteen minutes.
DEFAULT_APPROVAL_TTL_S = 900
#: What a tool's kind starts with when its own name is taken (see the module docstring).
ESCAPE = "mcp:"
#: The names a run's own actions take: a tool so named gets another kind.
_TAKEN = frozenset(kind.name for kind in RUNTIME_KINDS)


def kind_of(tool: str) -> str:
    """The action kind tool ``tool`` is in the run: its name, unless a run's action has it.

    One-to-one: a name that is taken, or starts with :data:`ESCAPE`, is
    prefixed with it; no other name is, so no two tools share a kind, and no
    kind is a run's own action.
    """
    return ESCAPE + tool if tool in _TAKEN or tool.startswith(ESCAPE) else tool


def tool_of(kind: str) -> str:
    """The upstream tool of action kind ``kind`` (the inverse of :func:`kind_of`)."""
    return kind.removeprefix(ESCAPE)


@dataclass(frozen=True, slots=True)
class ToolRule:
    """What the policy says of one effect tool (see the module docstring)."""

    risk: Risk = Risk.MEDIUM
    needs_approval: bool = False
    sensitive: bool = False
    errors_are_refusals: bool = False
    #: ``None``: as the upstream's tool listing declares.
    accepts_key: bool | None = None
    #: What a call acts on (A, B, A): declared per tool, never by a hint; by
    #: default an equal call made before is answered from its record.
    targets: Targets = Targets.COLLECTION


@dataclass(frozen=True, slots=True)
class GatewayPolicy:
    """The parsed policy file: reads, per-tool rules, and the tether policy's identity."""

    policy_id: str = "mcp-gateway"
    policy_version: str = "1"
    reads: frozenset[str] = frozenset()
    default: ToolRule = field(default_factory=ToolRule)
    tools: Mapping[str, ToolRule] = field(default_factory=dict)
    approval_ttl_s: int = DEFAULT_APPROVAL_TTL_S
    authority: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, data: bytes | str | dict[str, Any]) -> GatewayPolicy:
        """Parse a policy file strictly; :class:`~tether.core.SpecError` names the bad field."""
        if isinstance(data, dict):
            document: Any = data
        else:
            try:
                document = strict_loads(data)
            except _JSONError as exc:
                raise SpecError("document", str(exc)) from exc
        f = Fields(document, "", SpecError)
        reads = frozenset(f.str_list("reads")) if f.has("reads") else frozenset()
        default_obj = f.optional_obj("default")
        default = ToolRule() if default_obj is None else _rule(default_obj, ToolRule(), top=True)
        tools: dict[str, ToolRule] = {}
        tools_obj = f.optional_obj("tools")
        if tools_obj is not None:
            for name in f.raw("tools"):
                if name in reads:
                    tools_obj.fail(tools_obj.name(name), "is listed in reads: a read has no rule")
                tools[name] = _rule(tools_obj.obj(name), default, top=False)
            tools_obj.done()
        ttl = (
            f.int("approval_ttl_s", minimum=1, maximum=MAX_APPROVAL_TTL_S)
            if f.has("approval_ttl_s")
            else DEFAULT_APPROVAL_TTL_S
        )
        authority = f.optional_raw("authority")
        if authority is not None and not isinstance(authority, dict):
            f.fail("authority", "expected an object")
        policy = cls(
            policy_id=f.str("policy_id") if f.has("policy_id") else "mcp-gateway",
            policy_version=f.str("policy_version") if f.has("policy_version") else "1",
            reads=reads,
            default=default,
            tools=tools,
            approval_ttl_s=ttl,
            authority=authority,
        )
        f.done()
        return policy

    def rule(self, tool: str) -> ToolRule:
        """The rule of effect ``tool``: its own, or the default."""
        return self.tools.get(tool, self.default)

    @property
    def gates(self) -> bool:
        """Whether the file makes any tool wait for a person's approval (a rule or the default)."""
        return self.default.needs_approval or any(r.needs_approval for r in self.tools.values())

    def is_read(self, tool: str) -> bool:
        """Whether ``tool`` is a read: only if the policy names it so, never by a hint."""
        return tool in self.reads

    def check_names(self, offered: Iterable[str]) -> None:
        """Refuse names the upstream does not offer (a typo would leave a tool ungated)."""
        have = set(offered)
        for what, names in (("reads", self.reads), ("tools", set(self.tools))):
            missing = sorted(set(names) - have)
            if missing:
                raise SpecError(
                    what,
                    f"the upstream offers no tool {missing} (it offers {sorted(have)}); a name "
                    "that matches nothing would leave the tool it meant ungated",
                )


def _rule(f: Fields, base: ToolRule, *, top: bool) -> ToolRule:
    risk = base.risk
    if f.has("risk"):
        text = f.str("risk")
        try:
            risk = Risk(text)
        except ValueError:
            f.fail(f.name("risk"), f"unknown risk {text!r}; use one of {[r.value for r in Risk]}")
    rule = ToolRule(
        risk=risk,
        needs_approval=f.bool("needs_approval") if f.has("needs_approval") else base.needs_approval,
        sensitive=f.bool("sensitive") if f.has("sensitive") else base.sensitive,
        errors_are_refusals=(
            f.bool("errors_are_refusals")
            if f.has("errors_are_refusals")
            else base.errors_are_refusals
        ),
        accepts_key=None if top or not f.has("accepts_key") else f.bool("accepts_key"),
        targets=Targets.COLLECTION if top or not f.has("targets") else _targets(f),
    )
    f.done()
    return rule


def _targets(f: Fields) -> Targets:
    text = f.str("targets")
    try:
        return Targets(text)
    except ValueError:
        f.fail(
            f.name("targets"), f"unknown targets {text!r}; use one of {[t.value for t in Targets]}"
        )


@dataclass(frozen=True, slots=True)
class RunRules:
    """The task and the policy a gateway's run is bound to."""

    task: TaskSpec
    policy: Policy


def run_rules(
    gateway: GatewayPolicy, tools: Iterable[str], environment: EnvironmentState, task_id: str
) -> RunRules:
    """The run's task and policy, from the policy file and the upstream's tool names.

    A pure function of its inputs: the same configuration gives the same
    fingerprints, so a restarted gateway recovers its run. The budgets are
    the largest tether allows (a gateway's run lasts as long as its agent
    keeps working); a tool list that changed is another task.
    """
    names = sorted(set(tools))
    gateway.check_names(names)
    kinds: dict[str, Any] = {}
    risks = [Risk.LOW]
    for name in names:
        if gateway.is_read(name):
            kinds[kind_of(name)] = {
                "risk": "low",
                "permission": PERMISSION,
                "needs_approval": False,
            }
            continue
        rule = gateway.rule(name)
        risks.append(rule.risk)
        body: dict[str, Any] = {
            "risk": rule.risk.value,
            "permission": PERMISSION,
            "needs_approval": rule.needs_approval,
        }
        if rule.sensitive:
            body["sensitive"] = True
        kinds[kind_of(name)] = body
    policy: dict[str, Any] = {
        "policy_id": gateway.policy_id,
        "policy_version": gateway.policy_version,
        "max_risk": max(risks, key=lambda r: r.rank).value,
        "approval_ttl_s": gateway.approval_ttl_s,
        "kinds": kinds,
    }
    if gateway.authority is not None:
        policy["authority"] = dict(gateway.authority)
    task = TaskSpec.from_json(
        {
            "task_id": task_id,
            "task_version": "1",
            "allowed_kinds": sorted(kinds),
            "allowed_paths": [],
            "permissions": [PERMISSION],
            "budgets": {
                "proposals": MAX_COUNT,
                "steps": MAX_COUNT,
                "wall_time_s": MAX_WALL_TIME_S,
                "cost": MAX_COUNT,
            },
            "initial_environment": {
                "namespace": environment.namespace,
                "state_fingerprint": environment.state_fingerprint,
            },
        }
    )
    return RunRules(task=task, policy=Policy.from_json(policy))
