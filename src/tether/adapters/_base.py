"""The adapter protocol: how the runtime talks to the world it changes.

An adapter owns one environment instance. It is the authority on what
happened there: its receipts are the truth, the runtime's ledger a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, cast, runtime_checkable

from tether.core import (
    ActionKind,
    AdapterUnavailableError,
    Capabilities,
    EnvironmentState,
    Intent,
    JSONValue,
    Receipt,
    Verification,
)
from tether.core._compensation import compensated_effect


@dataclass(frozen=True, slots=True)
class VerifierResult:
    """The outcome of the task's verifier command at one environment state."""

    passed: bool
    exit_code: int
    output_digest: str
    output_tail: str
    environment: EnvironmentState

    def verification(self, at: datetime) -> Verification:
        """The evidence a checkpoint keeps: which state was judged, and how."""
        return Verification(
            env_version=self.environment.version,
            state_fingerprint=self.environment.state_fingerprint,
            passed=self.passed,
            exit_code=self.exit_code,
            output_digest=self.output_digest,
            at=at,
        )

    def summary(self) -> dict[str, JSONValue]:
        """What a ``tests.run`` hands the agent: the verdict and the output's tail."""
        return {
            "passed": self.passed,
            "exit_code": self.exit_code,
            "output_digest": self.output_digest,
            "output_tail": self.output_tail[-2000:],
            "env_version": self.environment.version,
        }


@dataclass(frozen=True, slots=True)
class Fence:
    """A monotonic token proving the caller holds the run's lease at ``lease_version``.

    ``expires_at`` is when the lease runs out by the store's clock; an adapter
    that checks it by its own clock refuses a token that has expired (a skewed
    adapter clock makes that check stricter or looser, never the version check).
    """

    run_id: str
    lease_version: int
    expires_at: datetime | None = None


@runtime_checkable
class Adapter(Protocol):
    """The contract every adapter implements."""

    @property
    def namespace(self) -> str:
        """Stable name of the kind of environment ("file-workspace")."""
        ...

    @property
    def version(self) -> str:
        """Adapter code version; bound into receipts and checkpoints."""
        ...

    @property
    def instance_id(self) -> str:
        """Identity of this environment instance; a copy elsewhere has another."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """What this adapter can promise (see :class:`Capabilities`)."""
        ...

    def environment(self) -> EnvironmentState:
        """The current identity, revision and state fingerprint."""
        ...

    @property
    def kinds(self) -> tuple[ActionKind, ...]:
        """The action kinds this adapter carries out (its reads and its writes)."""
        ...

    def read(
        self, kind: str, target: str, args: dict[str, Any], scope: Callable[[str], bool]
    ) -> dict[str, JSONValue]:
        """Answer a read of a declared ``read`` kind; changes nothing.

        ``scope`` says which targets the task may see (its allowed paths): a
        read that names many (a listing) answers only for those in scope.
        Raises :class:`~tether.core.ContractViolationError` for a read the
        adapter cannot answer, :class:`~tether.core.AdapterUnavailableError`
        when it cannot be reached.
        """
        ...

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """Canonical arguments for a proposed write (e.g. add the expected prior hash).

        Raises :class:`~tether.core.ContractViolationError` for arguments the
        adapter cannot accept.
        """
        ...

    def derive_post_state(self, prestate: EnvironmentState, intent: Intent) -> EnvironmentState:
        """The exact state that executing ``intent`` on ``prestate`` produces."""
        ...

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        """Perform ``intent`` once under ``key`` and return its receipt.

        Same key and same intent digest returns the first receipt without a
        second effect (when idempotent); same key and another digest raises
        :class:`~tether.core.IdempotencyConflictError` carrying the receipt.
        """
        ...

    def lookup(self, key: str) -> Receipt | None:
        """The receipt recorded under ``key``, or ``None`` (when queryable)."""
        ...

    def verify(self, argv: tuple[str, ...], timeout_s: int) -> VerifierResult:
        """Run a command from the task's allowlist (the verifier, or a test target) here."""
        ...


@runtime_checkable
class ListsReceipts(Protocol):
    """An adapter that can list the receipts it holds (optional).

    After a store is restored from a backup, the adapter may hold receipts
    of writes the restored ledger never saw; listing them lets the review
    case show a person exactly which effects happened.
    """

    def receipts_after(self, version: int, limit: int = 100) -> list[Receipt]:
        """Receipts whose post-state version is above ``version``, oldest first, at most ``limit``."""
        ...


@runtime_checkable
class LooksUpIntents(Protocol):
    """An adapter that judges what it recorded under a key against an intent (optional).

    A service that keeps its own fingerprint of a request (an HTTP API with
    ``Idempotency-Key``) cannot name tether's intent digest from the key
    alone; given the intent, it can say whether its record is this intent
    (the receipt carries ``intent.digest``) or another one (a different
    digest: a conflict).
    """

    def lookup_intent(self, key: str, intent: Intent) -> Receipt | None:
        """The receipt under ``key``, its ``intent_digest`` equal to ``intent.digest`` only if
        the adapter's record is that intent; ``None`` if nothing is recorded."""
        ...


def _offers(adapter: object, method: str) -> bool:
    """Whether ``adapter`` offers the one method of an optional protocol below.

    The same test ``isinstance`` against a runtime-checkable protocol makes
    (the attribute is there), asked of this very object, so a delegating
    wrapper is judged by what it wraps; without walking the protocol's
    attributes on every call, which cost tens of microseconds several times
    a step.
    """
    return callable(getattr(adapter, method, None))


def offers_snapshots(adapter: object) -> bool:
    """Whether ``adapter`` keeps content-addressed snapshots (so its workspace can be rewound).

    Two methods: ``snapshot_blobs(root, have, have_many=None)`` returns the
    blobs of the snapshot whose root digest is ``root`` (the environment's
    state fingerprint) that ``have`` (one digest) or ``have_many`` (which of
    many digests, one store round trip) says the store lacks; ``restore_snapshot(root,
    get_blob)`` makes the environment that snapshot, writing only what
    differs, and returns the environment after.
    """
    return _offers(adapter, "snapshot_blobs") and _offers(adapter, "restore_snapshot")


def look_up(adapter: Adapter, key: str, intent: Intent | None = None) -> Receipt | None:
    """Ask ``adapter`` for the receipt under ``key``, judged against ``intent`` where it can."""
    if intent is not None and _offers(adapter, "lookup_intent"):
        return cast(LooksUpIntents, adapter).lookup_intent(key, intent)
    return adapter.lookup(key)


@runtime_checkable
class DeclaresEffectIdentity(Protocol):
    """An adapter that says which arguments make an effect what it is (optional).

    Two proposals are the same effect (the second is replayed, not sent)
    when namespace, kind, target and this identity are equal. Leave out
    what does not change the effect in the world: a precondition hash, a
    client request id, a timestamp. Without the hook the identity is the
    normalized arguments, whole.
    """

    def effect_identity(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """The effect-relevant part of ``args`` (as :meth:`Adapter.normalize` returned them)."""
        ...


def effect_identity(
    adapter: Adapter, kind: str, target: str, args: dict[str, Any]
) -> dict[str, Any]:
    """What makes a write of ``kind`` with normalized ``args`` the effect it is (see above)."""
    if _offers(adapter, "effect_identity"):
        return cast(DeclaresEffectIdentity, adapter).effect_identity(kind, target, args)
    return dict(args)


@runtime_checkable
class RoutesKinds(Protocol):
    """An adapter made of several, each owning the action kinds it declares (optional)."""

    def owner(self, kind: str) -> Adapter:
        """The member adapter that carries out ``kind``."""
        ...


def capabilities_of(adapter: Adapter, kind: str | None) -> Capabilities:
    """What the adapter that carries out ``kind`` promises (the whole adapter's if ``None``)."""
    if kind is not None and _offers(adapter, "owner"):
        return cast(RoutesKinds, adapter).owner(kind).capabilities
    return adapter.capabilities


def capabilities_for(adapter: Adapter, intent: Intent | None) -> Capabilities:
    """What the adapter promises for ``intent``: a compensation's own proofs where it declares
    them apart (``compensation_capabilities``), else its kind's (see :func:`capabilities_of`).

    An adapter whose undo is a different call from its write (a function
    effect's ``compensate``) cannot lend the write's proofs to the undo: a
    refund resent because the charge was idempotent is a second refund.
    """
    if intent is None:
        return capabilities_of(adapter, None)
    owner: Any = adapter
    if _offers(adapter, "owner"):
        owner = cast(RoutesKinds, adapter).owner(intent.kind)
    if compensated_effect(intent) is not None:
        caps = getattr(owner, "compensation_capabilities", None)
        if isinstance(caps, Capabilities):
            return caps
    return capabilities_of(adapter, intent.kind)


def wants_fence(adapter: Adapter) -> bool:
    """Whether the runtime hands ``adapter`` its fencing token: it fences, or a function
    effect (itself or a member) hands it to a body (:func:`~tether.current_fence`)."""
    if adapter.capabilities.fencing:
        return True
    members = getattr(adapter, "members", None) or (adapter,)
    return any(getattr(m, "absence_needs_fence", False) is True for m in members)


def absence_outlives_takeover(adapter: Adapter, intent: Intent) -> bool:
    """Whether a final absence still proves "never landed" once another worker's lease lapsed.

    An adapter says no with ``absence_needs_fence = True`` (a function effect:
    its look-up cannot see a request an older worker, paused inside the body,
    has not sent yet) unless its capabilities declare ``fencing`` (the callee
    refuses the older worker's stale fence).
    """
    owner: Any = adapter
    if _offers(adapter, "owner"):
        owner = cast(RoutesKinds, adapter).owner(intent.kind)
    if getattr(owner, "absence_needs_fence", False) is not True:
        return True
    return capabilities_for(adapter, intent).fencing


def target_moved(adapter: Adapter, intent: Intent) -> bool | None:
    """Whether ``intent``'s target no longer holds what it leaves (writing it now changes it).

    Asked of an adapter that declares ``target_state`` without a stateful
    environment (a function effect's ``holds``): ``None`` where it could not
    tell (its reader failed); ``False`` for any other adapter.
    """
    owner: Any = adapter
    if _offers(adapter, "owner"):
        owner = cast(RoutesKinds, adapter).owner(intent.kind)
    holds = getattr(owner, "target_holds", None)
    if not callable(holds):
        return False
    try:
        answer = holds(intent)
    except AdapterUnavailableError:
        return None
    return answer is False  # None: the adapter tracks no target state for this kind


def namespace_of(adapter: Adapter, kind: str | None) -> str:
    """The namespace whose receipts ``kind`` produces."""
    if kind is not None and _offers(adapter, "owner"):
        return cast(RoutesKinds, adapter).owner(kind).namespace
    return adapter.namespace


@runtime_checkable
class CompensatesEffects(Protocol):
    """An adapter that can undo a committed effect of its own (optional).

    Offered for the kinds that declare ``Compensation.ADAPTER``. The
    compensation is an effect like any write: ``intent`` is a compensation
    intent (its one argument, ``tether.compensates``, names the original
    effect: key, action id, intent digest, receipt id and fingerprint,
    business object id), ``key`` its own, freshly minted idempotency key, and
    ``fence`` the run's lease. Same contract as :meth:`Adapter.execute`: the
    same key and intent returns the first receipt without a second
    compensation; the receipt carries ``key`` and ``intent.digest``; a
    look-up by ``key`` (where the adapter is queryable) answers for it too.
    """

    def compensate(self, key: str, intent: Intent, fence: Fence | None = None) -> Receipt:
        """Undo the effect ``intent`` names, once under ``key``; the compensation's receipt."""
        ...


def offers_compensation(adapter: Adapter, kind: str) -> bool:
    """Whether the adapter that carries out ``kind`` offers :meth:`CompensatesEffects.compensate`."""
    owner = cast(RoutesKinds, adapter).owner(kind) if _offers(adapter, "owner") else adapter
    return _offers(owner, "compensate")


def compensate_with(adapter: Adapter, key: str, intent: Intent, fence: Fence | None) -> Receipt:
    """Carry out the compensation ``intent`` under ``key`` with the adapter that owns its kind."""
    if not offers_compensation(adapter, intent.kind):
        from tether.core import ContractViolationError

        raise ContractViolationError(
            "no_compensation", f"the adapter for {intent.kind!r} offers no compensate()"
        )
    return cast(CompensatesEffects, adapter).compensate(key, intent, fence)


def external_effects(adapter: Adapter) -> tuple[str, ...]:
    """Namespaces of the adapters (members of a composite too) whose effects leave the process.

    An adapter declares that its effects stay in local, versioned storage
    with a ``local_effects = True`` attribute (the file workspace, the
    sandbox); any other is taken to reach the world: undeclared is external.
    """
    members = getattr(adapter, "members", None) if _offers(adapter, "owner") else None
    found: list[str] = []
    for member in members if isinstance(members, tuple) else (adapter,):
        if getattr(member, "local_effects", False) is not True:
            found.append(member.namespace)
    return tuple(found)


@runtime_checkable
class PointsToEvidence(Protocol):
    """An adapter that tells a person where to look for a write it cannot settle (optional).

    When a write's outcome is unknown, a reviewer settles it by looking in
    the world (the recipient's mailbox, the service's records) and signing
    what they found. ``where_to_look`` names, as short labelled texts, what
    to search for and where: the ``Message-ID`` a key maps to and the
    mailbox, the URL and the ``Idempotency-Key`` header, a business id. It
    is recorded in the review case when the run freezes (the operator page
    and ``tether review`` show it; neither holds the adapter). It never
    holds a secret: it is stored in the checkpoint and shown to people.
    """

    def where_to_look(self, key: str, intent: Intent) -> dict[str, str]:
        """Labelled hints for finding the effect ``intent`` sent under ``key``."""
        ...


#: At most this many hints, each label and text cut to these lengths (a checkpoint stays bounded).
HINTS_MAX, HINT_LABEL_MAX, HINT_TEXT_MAX = 12, 80, 500


def where_to_look(adapter: Adapter, key: str, intent: Intent) -> dict[str, str]:
    """What the adapter that owns ``intent``'s kind says a person should look for (may be empty).

    A hint is advice for a person, never evidence: an adapter whose hook
    fails gives none rather than stopping the freeze it would have annotated.
    """
    owner: Any = adapter
    try:
        if _offers(adapter, "owner"):
            owner = cast(RoutesKinds, adapter).owner(intent.kind)
        if not _offers(owner, "where_to_look"):
            return {}
        found = cast(PointsToEvidence, owner).where_to_look(key, intent)
    except Exception:
        return {}
    if not isinstance(found, dict):
        return {}
    hints: dict[str, str] = {}
    for label, text in list(found.items())[:HINTS_MAX]:
        hints[str(label)[:HINT_LABEL_MAX]] = str(text)[:HINT_TEXT_MAX]
    return hints
