"""Setup without hand-written JSON: a runtime from a store and the effects it guards.

``tether.guard("sqlite:///runs.sqlite", send_email)`` is the shortest path to a
:class:`~tether.runtime.Runtime`; every piece it fills in can still be given
explicitly (``Runtime(store=..., keyring=..., adapter=..., task=..., policy=...)``
is unchanged):

- the **task** allows every kind the effects declare, on any target
  (``allowed_paths: ["*"]``), within generous budgets, with no verifier (a
  finish completes the run as it is) and no fixed initial environment (the
  adapters' state is read when a run starts and bound into its first
  checkpoint);
- the **policy** rules each kind (``low`` risk for a read, ``medium`` for a
  write), needs a person's approval only for the kinds named in ``approve``;
- the **keyring** is :meth:`~tether.crypto.Keyring.default` (the environment's,
  else ``~/.local/share/tether/keyring.json``, made on first use);
- **trust roots** are optional until someone must sign: an approval asked
  for without them says which commands make them.

``task=`` and ``policy=`` take a whole :class:`~tether.core.TaskSpec` or
:class:`~tether.core.Policy`, or a mapping merged over the defaults, object
by object (``task={"budgets": {"steps": 50}}`` changes one budget; a list
replaces the default's). A run binds the task and policy it started under:
change them and its recovery is refused, saying what changed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from tether.adapters import Adapter, Adapters, FunctionEffect
from tether.adapters._function import owner_of
from tether.core import ANY_TARGET, ActionKind, Policy, SpecError, TaskSpec
from tether.crypto import Keyring, TrustRoots
from tether.runtime._runtime import Runtime
from tether.store import ContentStore, SQLiteStore, open_store

#: What a task built for you may spend: generous, but a loop that keeps asking ends.
DEFAULT_BUDGETS = {"proposals": 1000, "steps": 10_000, "wall_time_s": 24 * 3600, "cost": 1000}
#: How long a person's approval (or decision) may live, in seconds.
DEFAULT_APPROVAL_TTL_S = 3600
#: The id of a task and a policy built for you (runs bind their fingerprints too).
DEFAULT_ID = "default"


def guard(
    store: str | os.PathLike[str] | ContentStore,
    *effects: Any,
    approve: Iterable[Any] = (),
    task: TaskSpec | Mapping[str, Any] | None = None,
    policy: Policy | Mapping[str, Any] | None = None,
    keyring: Keyring | None = None,
    trust: TrustRoots | None = None,
    **options: Any,
) -> Runtime:
    """A :class:`~tether.runtime.Runtime` for ``effects``, its runs kept in ``store``.

    ``store``: a URL (``sqlite:///runs.sqlite``, ``postgresql://...``), a
    SQLite file's path, or a store. ``effects``: ``@tether.effect`` functions
    whose bodies perform their effects, and adapters (``FileWorkspace``,
    ``HttpEffect``, ``SmtpEffect``...), each owning the kinds it declares.
    ``approve``: the kinds (or effect functions) a person must approve
    before each is carried out. ``options`` go to the ``Runtime`` as they
    are (``agent``, ``lease_ttl_s``, ``clock``, ...). See the module docstring
    for the defaults and how to override them.
    """
    adapter = _adapter(effects)
    kinds = tuple(kind for kind in adapter.kinds if kind.name not in _RUNTIME_OWNED)
    approvals = _approvals(approve, kinds)
    _check_commit_times(adapter, approvals)
    if isinstance(policy, Policy) and approvals:
        raise SpecError(
            "approve", "say which kinds need approval in the Policy you pass (needs_approval)"
        )
    return Runtime(
        store=_store(store),
        keyring=keyring if keyring is not None else Keyring.default(),
        adapter=adapter,
        task=task if isinstance(task, TaskSpec) else default_task(kinds, task),
        policy=policy if isinstance(policy, Policy) else default_policy(kinds, approvals, policy),
        trust=trust,
        **options,
    )


def default_task(
    kinds: Iterable[ActionKind], overrides: Mapping[str, Any] | None = None
) -> TaskSpec:
    """The task :func:`guard` builds for ``kinds``, with ``overrides`` merged over it."""
    names = sorted({kind.name for kind in kinds})
    document: dict[str, Any] = {
        "task_id": DEFAULT_ID,
        "task_version": "1",
        "allowed_kinds": names,
        "allowed_paths": [ANY_TARGET],
        "permissions": names,
        "budgets": dict(DEFAULT_BUDGETS),
    }
    return TaskSpec.from_json(_merged(document, overrides, "task"))


def default_policy(
    kinds: Iterable[ActionKind],
    approve: Iterable[str] = (),
    overrides: Mapping[str, Any] | None = None,
) -> Policy:
    """The policy :func:`guard` builds for ``kinds``, with ``overrides`` merged over it."""
    gated = set(approve)
    declared = {kind.name: kind for kind in kinds}
    rules = {
        name: {
            "risk": "medium" if kind.mutating else "low",
            "permission": name,
            "needs_approval": name in gated,
        }
        for name, kind in sorted(declared.items())
    }
    document: dict[str, Any] = {
        "policy_id": DEFAULT_ID,
        "policy_version": "1",
        "kinds": rules,
        "max_risk": "medium" if any(k.mutating for k in declared.values()) else "low",
        "approval_ttl_s": DEFAULT_APPROVAL_TTL_S,
    }
    return Policy.from_json(_merged(document, overrides, "policy"))


#: Kinds the runtime itself declares (tests.run, finish, cancel): never an effect's.
_RUNTIME_OWNED = frozenset({"tests.run", "finish", "cancel"})


def _adapter(effects: tuple[Any, ...]) -> Adapter:
    """One adapter for the run: the effect functions' own, and the adapters, together."""
    if not effects:
        raise SpecError(
            "effects",
            "name at least one effect: a @tether.effect function whose body performs it, or an "
            "adapter (FileWorkspace, HttpEffect, SmtpEffect, ...)",
        )
    members: list[Adapter] = []
    for index, each in enumerate(effects):
        kind = getattr(each, "__tether_effect__", None)
        if kind is not None:
            own = getattr(each, "adapter", None)
            if own is None:
                name = getattr(each, "__qualname__", kind)
                raise SpecError(
                    f"effects[{index}]",
                    f"{name} cannot perform {kind!r} itself (a method or a **extra function): "
                    "give the adapter that performs it instead (tether.function_effect(...))",
                )
            members.append(own)
        elif isinstance(each, Adapter):
            members.append(each)
        else:
            raise SpecError(
                f"effects[{index}]",
                f"{each!r} is neither a @tether.effect function nor an adapter",
            )
    return members[0] if len(members) == 1 else Adapters(*members)


def _approvals(approve: Iterable[Any], kinds: tuple[ActionKind, ...]) -> tuple[str, ...]:
    """The kinds ``approve`` names (by kind, or by the effect function), each one declared."""
    if isinstance(approve, str):
        approve = (approve,)  # one kind, not its letters
    declared = sorted(kind.name for kind in kinds)
    names: list[str] = []
    for index, each in enumerate(approve):
        name = each if isinstance(each, str) else getattr(each, "__tether_effect__", None)
        if not isinstance(name, str) or name not in declared:
            raise SpecError(
                f"approve[{index}]",
                f"{each!r} is not a kind these effects declare; they declare {declared}",
            )
        names.append(name)
    return tuple(names)


def _check_commit_times(adapter: Adapter, approvals: tuple[str, ...]) -> None:
    """Refuse an approval of a function effect whose receipt cannot say when it committed.

    The approval's expiry is checked against the receipt's commit time; a
    receipt without one goes to review after every send, so the setup that
    would make it is refused before anything runs.
    """
    for index, kind in enumerate(approvals):
        owner = owner_of(adapter, kind)
        if isinstance(owner, FunctionEffect) and owner.committed_at is None:
            name = getattr(owner.function, "__qualname__", kind)
            raise SpecError(
                f"approve[{index}]",
                f"{kind!r} is to need an approval, and {name} does not say when its effect "
                "committed, so every send would go to review (the approval's expiry is checked "
                "against it): declare committed_at='FIELD' in @tether.effect and return that "
                "field, the commit time as tether.core.format_time(datetime.now(UTC)) writes it",
            )


def _store(store: str | os.PathLike[str] | ContentStore) -> ContentStore:
    if isinstance(store, str) and "://" in store:
        return open_store(store)
    if isinstance(store, str | os.PathLike):
        if not os.fspath(store):
            raise SpecError("store", "name a store: sqlite:///runs.sqlite, or a SQLite file's path")
        return SQLiteStore(store)
    return store


def _merged(
    default: dict[str, Any], overrides: Mapping[str, Any] | None, what: str
) -> dict[str, Any]:
    """``default`` with ``overrides`` laid over it, object by object (a list replaces)."""
    if overrides is None:
        return default
    if not isinstance(overrides, Mapping):
        raise SpecError(what, f"give a {what} object or a mapping of fields, not {overrides!r}")
    merged = dict(default)
    for key, value in overrides.items():
        here = merged.get(key)
        if isinstance(here, dict) and isinstance(value, Mapping):
            merged[key] = _merged(here, value, f"{what}.{key}")
        else:
            merged[key] = value
    return merged
