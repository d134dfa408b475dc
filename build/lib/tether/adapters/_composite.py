"""Adapters: several adapters in one run, each owning the action kinds it declares.

A run edits files in a workspace, opens a ticket over HTTP and emails a
customer: three adapters, one transition core, one fenced ledger. At most
one member has state (the workspace); the others are remote services whose
environment is their identity alone (``Capabilities.stateful`` false).

The run's environment is the stateful member's, with every member's
identity folded into the instance id: recovering against another service
instance (another ticket database, another mail system) is environment
drift, refused like a workspace from elsewhere. The stateful member's
receipts are translated to that combined identity, deterministically, so a
look-up rebuilds them field for field; remote members' receipts pass
through as they are, and the runtime judges each effect by its owner's
capabilities (:func:`~tether.adapters.capabilities_of`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tether.adapters._base import (
    Adapter,
    Fence,
    ListsReceipts,
    VerifierResult,
    compensate_with,
    effect_identity,
    look_up,
    offers_snapshots,
)
from tether.adapters._filewrite import check_instance
from tether.core import (
    ActionKind,
    AdapterError,
    Capabilities,
    EnvironmentState,
    Intent,
    JSONValue,
    Receipt,
    VerifierRefusedError,
    digest,
)


class AdaptersConfigError(AdapterError):
    """The adapters given to one run cannot be combined (clashing kinds, two with state)."""


class Adapters:
    """Several adapters as one: routes each action kind to the member that declares it."""

    def __init__(self, *members: Adapter) -> None:
        if not members:
            raise AdaptersConfigError("give at least one adapter")
        owners: dict[str, Adapter] = {}
        for member in members:
            for kind in member.kinds:
                if kind.name in owners:
                    raise AdaptersConfigError(
                        f"action kind {kind.name!r} is declared by both "
                        f"{owners[kind.name].namespace!r} and {member.namespace!r}"
                    )
                owners[kind.name] = member
        stateful = [m for m in members if m.capabilities.stateful]
        if len(stateful) > 1:
            raise AdaptersConfigError(
                "at most one adapter with state (a workspace) per run; "
                f"these have state: {[m.namespace for m in stateful]}"
            )
        namespaces = [m.namespace for m in members]
        if len(set(namespaces)) != len(namespaces):
            raise AdaptersConfigError(f"adapter namespaces must differ: {namespaces}")
        self.members = members
        # Identity is by namespace, not by the order a caller listed them in.
        self._by_namespace = sorted(members, key=lambda m: m.namespace)
        self._owners = owners
        self._state = stateful[0] if stateful else None
        self._kinds = tuple(kind for member in members for kind in member.kinds)
        # Snapshots are the stateful member's: offered exactly when it offers them
        # (the abilities are found by attribute, so they are set only then).
        if self._state is not None and offers_snapshots(self._state):
            self.snapshot_blobs = self._snapshot_blobs
            self.restore_snapshot = self._restore_snapshot

    def _snapshot_blobs(
        self,
        root: str,
        have: Callable[[str], bool],
        have_many: Callable[[list[str]], set[str]] | None = None,
    ) -> dict[str, bytes]:
        member: Any = self._state
        method = member.snapshot_blobs
        if have_many is not None and "have_many" in inspect.signature(method).parameters:
            return dict(method(root, have, have_many=have_many))
        return dict(method(root, have))

    def _restore_snapshot(
        self, root: str, get_blob: Callable[[str], bytes | None], fence: Fence | None = None
    ) -> EnvironmentState:
        member: Any = self._state
        return self._outward(member.restore_snapshot(root, get_blob, fence))

    # --- routing ------------------------------------------------------

    def owner(self, kind: str) -> Adapter:
        """The member that carries out ``kind`` (see RoutesKinds)."""
        member = self._owners.get(kind)
        if member is None:
            from tether.core import ContractViolationError

            raise ContractViolationError("unknown_kind", f"no adapter carries out {kind!r}")
        return member

    # --- identity -----------------------------------------------------

    @property
    def namespace(self) -> str:
        """The stateful member's namespace (``"adapters"`` without one)."""
        return self._state.namespace if self._state is not None else "adapters"

    @property
    def version(self) -> str:
        """Every member's code version, by namespace."""
        return ",".join(f"{m.namespace}={m.version}" for m in self._by_namespace)

    @property
    def instance_id(self) -> str:
        """Every member's identity: another service instance is another environment."""
        return "|".join(f"{m.namespace}={m.instance_id}" for m in self._by_namespace)

    @property
    def capabilities(self) -> Capabilities:
        """The weakest promise of all members (per-kind promises: ``capabilities_of``)."""
        caps = [m.capabilities for m in self.members]
        retention = [c.retention_s for c in caps if c.retention_s is not None]
        limits = [c.in_flight_limit_s for c in caps if c.in_flight_limit_s is not None]
        return Capabilities(
            idempotent=all(c.idempotent for c in caps),
            queryable=all(c.queryable for c in caps),
            conditional_writes=all(c.conditional_writes for c in caps),
            fencing=any(c.fencing for c in caps),  # members that do not fence ignore it
            absent_is_final=all(c.absent_is_final for c in caps),
            retention_s=min(retention) if retention else None,
            in_flight_limit_s=min(limits) if limits else None,
            stateful=self._state is not None,
        )

    def environment(self) -> EnvironmentState:
        """The stateful member's state under the combined identity."""
        if self._state is None:
            return EnvironmentState(self.namespace, self.instance_id, 0, digest(self.instance_id))
        return self._outward(self._state.environment())

    @property
    def kinds(self) -> tuple[ActionKind, ...]:
        """Every member's kinds."""
        return self._kinds

    # --- acting -------------------------------------------------------

    def read(
        self, kind: str, target: str, args: dict[str, Any], scope: Callable[[str], bool]
    ) -> dict[str, JSONValue]:
        """Read through the member that owns ``kind``."""
        return self.owner(kind).read(kind, target, args, scope)

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """Normalize with the member that owns ``kind``."""
        return self.owner(kind).normalize(kind, target, args)

    def effect_identity(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """The identity the member that owns ``kind`` declares (see DeclaresEffectIdentity)."""
        return effect_identity(self.owner(kind), kind, target, args)

    def derive_post_state(self, prestate: EnvironmentState, intent: Intent) -> EnvironmentState:
        """A stateful member's derived state; a remote effect leaves the environment as is."""
        check_instance(prestate, self.namespace, self.instance_id)
        member = self.owner(intent.kind)
        if member is not self._state:
            return prestate
        return self._outward(member.derive_post_state(self._inward(prestate), intent))

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        """Carry out ``intent`` with its owner; a stateful member's receipt is translated."""
        check_instance(prestate, self.namespace, self.instance_id)
        member = self.owner(intent.kind)
        if member is self._state:
            return self._translated(member.execute(key, intent, self._inward(prestate), fence))
        return member.execute(key, intent, member.environment(), fence)

    def lookup(self, key: str) -> Receipt | None:
        """Ask every queryable member (keys are minted per intent, so at most one answers)."""
        for member in self.members:
            if member.capabilities.queryable:
                found = member.lookup(key)
                if found is not None:
                    return self._translated(found) if member is self._state else found
        return None

    def lookup_intent(self, key: str, intent: Intent) -> Receipt | None:
        """Ask the owner of ``intent``'s kind, judged against it (see LooksUpIntents)."""
        member = self.owner(intent.kind)
        found = look_up(member, key, intent)
        if found is not None and member is self._state:
            return self._translated(found)
        return found

    def compensate(self, key: str, intent: Intent, fence: Fence | None = None) -> Receipt:
        """Undo an effect with the member that owns its kind (see CompensatesEffects)."""
        member = self.owner(intent.kind)
        receipt = compensate_with(member, key, intent, fence)
        return self._translated(receipt) if member is self._state else receipt

    def receipts_after(self, version: int, limit: int = 100) -> list[Receipt]:
        """The stateful member's receipts past ``version`` (see ListsReceipts)."""
        if self._state is None or not isinstance(self._state, ListsReceipts):
            return []
        return [self._translated(r) for r in self._state.receipts_after(version, limit)]

    def verify(self, argv: tuple[str, ...], timeout_s: int) -> VerifierResult:
        """The verifier runs where the state is: on the stateful member."""
        if self._state is None:
            raise VerifierRefusedError("no adapter with state to run the verifier on")
        result = self._state.verify(argv, timeout_s)
        return replace(result, environment=self._outward(result.environment))

    # --- the stateful member's identity, inward and outward -----------

    def _outward(self, member_state: EnvironmentState) -> EnvironmentState:
        return replace(member_state, namespace=self.namespace, instance_id=self.instance_id)

    def _inward(self, state: EnvironmentState) -> EnvironmentState:
        if self._state is None:
            return state
        return replace(state, namespace=self._state.namespace, instance_id=self._state.instance_id)

    def _translated(self, receipt: Receipt) -> Receipt:
        return replace(receipt, post_state=self._outward(receipt.post_state))
