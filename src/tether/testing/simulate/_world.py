"""The simulated world: a clock, ids, and the adapters whose receptions are the truth.

Every effect that REACHES the world is one :class:`Reception`, recorded by
the adapter at the moment it is applied, whatever tether believes. A world
that does not deduplicate records a resend as a second reception: that is
how a duplicate becomes visible. Faults (a lost reply, a hostile look-up,
a service down, a request in flight, keys forgotten past retention, a
look-up route that answers 404, read as "nothing" by an adapter that lies or
as inconclusive by one that does not) are armed by the simulator's events.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tether.adapters import Fence, KeyInFlightError, NotQueryableError
from tether.adapters._errors import FenceRejectedError
from tether.adapters._remote import RemoteEffect
from tether.core import (
    ActionClass,
    ActionKind,
    AdapterUnavailableError,
    Capabilities,
    ContractViolationError,
    EnvironmentState,
    IdempotencyConflictError,
    Intent,
    LookupInconclusiveError,
    Receipt,
    TargetKind,
    Targets,
    canonical_bytes,
    digest,
    format_time,
)
from tether.testing._sandbox import Sandbox

EPOCH = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
TICKET = ActionKind("ticket.create", ActionClass.WRITE, TargetKind.PATH, frozenset({"title"}))
#: A status board: each write sets what its one target shows (a state no adapter reads).
BOARD = ActionKind("board.set", ActionClass.WRITE, TargetKind.PATH, frozenset({"value"}))


class SimClock:
    """Simulated time: it moves only when the simulator says so."""

    def __init__(self) -> None:
        self.seconds = 0.0
        # The last answer, by the seconds it was made at: read many times between advances.
        self._now = (self.seconds, EPOCH)

    def now(self) -> datetime:
        at, moment = self._now
        if at != self.seconds:
            moment = EPOCH + timedelta(seconds=self.seconds)
            self._now = (self.seconds, moment)
        return moment

    def advance(self, seconds: float) -> None:
        self.seconds += seconds

    def micros(self) -> int:
        """The store's lease clock, in integer microseconds since the Unix epoch."""
        return int((EPOCH.timestamp() + self.seconds) * 1_000_000)


class SimIds:
    """Deterministic ids: prefix-1, prefix-2, ..."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._counter)}"

    def bare(self) -> str:
        return f"{next(self._counter):08d}"


@dataclass(frozen=True, slots=True)
class Reception:
    """One effect that reached the world."""

    seq: int
    namespace: str
    key: str
    intent_digest: str
    kind: str
    target: str
    identity: str  # what makes it the effect it is: target and content, or title
    at: float
    sent_at: float  # when the request left the caller (earlier than ``at`` if it was in flight)
    lease_version: int | None
    changed: bool  # a file write that changed the target (a remote effect: always)
    #: It landed from in flight, after its send: judged when it was sent, not now
    #: (``sent_at`` may equal ``at`` all the same, when the clock did not move).
    late: bool = False


@dataclass
class Faults:
    """What the simulator armed for one adapter."""

    lost_reply: int = 0  # the next N sends apply, then the reply is lost
    hostile: int = 0  # the next N look-ups answer with another intent's receipt
    in_flight: int = 0  # the next N sends stay in flight for IN_FLIGHT_S
    stuck: int = 0  # the next N sends stay in flight until the world heals (a hung handler)
    down_until: float = -1.0  # unavailable until this simulated second
    route_404: bool = False  # the look-up route does not exist: always "nothing"
    #: The look-up route does not exist, and the adapter says so (as HttpEffect reads a
    #: "no such route" 404): every look-up is inconclusive, never "nothing".
    route_gone: bool = False


IN_FLIGHT_S = 30.0


@dataclass
class World:
    """What reached the world, and the hook that judges each reception as it lands."""

    clock: SimClock
    ids: SimIds
    receptions: list[Reception] = field(default_factory=list)
    #: Called with each reception as it lands (the simulator's invariants).
    judge: Callable[[Reception], None] = lambda r: None
    #: Called with (namespace, key, fence's lease version) at each send attempt.
    attempt: Callable[[str, str, int | None], None] = lambda ns, k, v: None
    #: Called with (namespace, key) at each look-up, before any fault answers it.
    asked: Callable[[str, str], None] = lambda ns, k: None
    #: Called after the workspace was put back to a snapshot (a rewind).
    restored: Callable[[], None] = lambda: None

    def receive(self, *, sent_at: float | None = None, **fields: Any) -> Reception:
        now = self.clock.seconds
        reception = Reception(
            seq=len(self.receptions) + 1,
            at=now,
            sent_at=now if sent_at is None else sent_at,
            late=sent_at is not None,
            **fields,
        )
        self.receptions.append(reception)
        self.judge(reception)
        return reception


def _fence_version(fence: Fence | None) -> int | None:
    return None if fence is None else fence.lease_version


class _Fenced:
    """The fencing check both adapters share (refuses a token below the highest seen)."""

    _highest: dict[str, int]
    _caps: Capabilities

    def _check_fence(self, fence: Fence | None) -> None:
        if not self._caps.fencing or fence is None:
            return
        highest = self._highest.get(fence.run_id)
        if highest is not None and fence.lease_version < highest:
            raise FenceRejectedError(fence.run_id, fence.lease_version, highest)
        self._highest[fence.run_id] = fence.lease_version


class SimWorkspace(Sandbox, _Fenced):
    """A file workspace (stateful): the receipt's post-state is the environment."""

    def __init__(self, world: World, caps: Capabilities, files: dict[str, str]) -> None:
        super().__init__(
            files,
            instance_id="ws-1",
            id_source=world.ids.bare,
            clock=world.clock.now,
            idempotent=caps.idempotent,
            queryable=caps.queryable,
            conditional_writes=caps.conditional_writes,
        )
        self._capabilities = caps
        self._caps = caps
        self.world = world
        self.faults = Faults()
        self._highest = {}
        self._sent_at: dict[str, float] = {}

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        self.world.attempt(self.namespace, key, _fence_version(fence))
        self._check_fence(fence)
        if self.world.clock.seconds < self.faults.down_until:
            raise AdapterUnavailableError("simulated: the workspace is down")
        before = self.files.get(intent.target)
        writes = self.write_count()
        lost = self.faults.lost_reply > 0
        if lost:
            self.faults.lost_reply -= 1
            self.fail_next(after_commit=True)
        try:
            receipt = super().execute(key, intent, prestate, fence)
        finally:
            if self.write_count() != writes:
                content = str(intent.args.get("content"))
                self._sent_at[key] = self.world.clock.seconds
                self.world.receive(
                    namespace=self.namespace,
                    key=key,
                    intent_digest=intent.digest,
                    kind=intent.kind,
                    target=intent.target,
                    identity=f"{intent.target}={content}",
                    lease_version=_fence_version(fence),
                    changed=before != content,
                )
        return receipt

    def lookup(self, key: str) -> Receipt | None:
        if not self._caps.queryable:
            raise NotQueryableError("simulated: the workspace cannot look up keys")
        self.world.asked(self.namespace, key)
        if self.world.clock.seconds < self.faults.down_until:
            raise AdapterUnavailableError("simulated: the workspace is down")
        if self.faults.route_404:
            return None
        if self.faults.route_gone:
            raise LookupInconclusiveError("simulated: the look-up route answered 404 Not Found")
        found = super().lookup(key)
        return _maybe_hostile(self.faults, found, key, self.environment(), self.namespace)

    def held(self, key: str) -> Receipt | None:
        """The receipt the workspace holds under ``key`` (no fault applies: the truth)."""
        return self._receipts.get(key)

    def drop_newest(self, settled: set[str], *, tamper: bool = False) -> None:
        """Lose the newest receipt of a settled write (deleted after the commit), or
        (``tamper``) rewrite its result: either way the adapter no longer agrees with the
        ledger's copy."""
        keys = [k for k in self._sent_at if k in settled]
        if keys:
            key = max(keys, key=lambda k: self._sent_at[k])
            if tamper:
                self.tamper_receipt(key, result={"tampered": True})
                return
            self.delete_receipt(key)
            del self._sent_at[key]

    def restore_snapshot(
        self, root: str, get_blob: Callable[[str], bytes | None], fence: Fence | None = None
    ) -> EnvironmentState:
        env = super().restore_snapshot(root, get_blob, fence)
        self.world.restored()
        return env

    def forget(self, retention_s: float) -> list[str]:
        """Drop every key older than ``retention_s`` (the service's declared retention)."""
        now = self.world.clock.seconds
        old = [k for k, at in self._sent_at.items() if now - at > retention_s]
        for key in old:
            self.delete_receipt(key)
            del self._sent_at[key]
        return old


class SimTickets(RemoteEffect, _Fenced):
    """A remote ticket service (not stateful): its effects live in the ledger."""

    def __init__(self, world: World, caps: Capabilities) -> None:
        self._kind = TICKET
        self._namespace = "tickets"
        # Each ticket filed is its own object: declared so (A, B, A replays the first).
        self._capabilities = replace(caps, stateful=False, targets=Targets.COLLECTION)
        self._caps = self._capabilities
        self.world = world
        self.faults = Faults()
        self._highest = {}
        self._receipts: dict[str, tuple[Receipt, float]] = {}
        self._in_flight: dict[str, tuple[Intent, EnvironmentState, float, Fence | None]] = {}
        self._in_flight_sent: dict[str, float] = {}

    @property
    def instance_id(self) -> str:
        return "tickets-1"

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        self._check_kind(kind)
        if set(args) != {"title"} or not isinstance(args["title"], str):
            raise ContractViolationError("bad_args", "ticket.create takes a title only")
        return {"title": args["title"]}

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        self.world.attempt(self._namespace, key, _fence_version(fence))
        self._check_send(key, intent, prestate)
        self._check_fence(fence)
        now = self.world.clock.seconds
        if now < self.faults.down_until:
            raise AdapterUnavailableError("simulated: the ticket service is down")
        self._land_due()
        if key in self._in_flight:
            raise KeyInFlightError(key, "simulated: still running")
        existing = self._receipts.get(key)
        if existing is not None and self._caps.idempotent:
            if existing[0].intent_digest == intent.digest:
                return existing[0]
            raise IdempotencyConflictError(key, intent.digest, existing[0])
        if self.faults.in_flight > 0 or self.faults.stuck > 0:
            hung = self.faults.stuck > 0
            if hung:
                self.faults.stuck -= 1
            else:
                self.faults.in_flight -= 1
            until = float("inf") if hung else now + IN_FLIGHT_S
            self._in_flight[key] = (intent, prestate, until, fence)
            self._in_flight_sent[key] = now
            raise KeyInFlightError(key, "simulated: accepted, still running")
        receipt = self._apply(key, intent, prestate, fence)
        if self.faults.lost_reply > 0:
            self.faults.lost_reply -= 1
            raise AdapterUnavailableError("simulated: the ticket was filed, the reply lost")
        return receipt

    def lookup(self, key: str) -> Receipt | None:
        if not self._caps.queryable:
            raise NotQueryableError("simulated: the ticket service cannot look up keys")
        self.world.asked(self._namespace, key)
        if self.world.clock.seconds < self.faults.down_until:
            raise AdapterUnavailableError("simulated: the ticket service is down")
        self._land_due()
        if key in self._in_flight:
            raise KeyInFlightError(key, "simulated: still running")
        if self.faults.route_404:
            return None
        if self.faults.route_gone:
            raise LookupInconclusiveError("simulated: the look-up route answered 404 Not Found")
        found = self._receipts.get(key)
        return _maybe_hostile(
            self.faults, None if found is None else found[0], key, self.environment(), "tickets"
        )

    def forget(self, retention_s: float) -> list[str]:
        """Drop every key older than ``retention_s`` (the service's declared retention)."""
        now = self.world.clock.seconds
        old = [k for k, (_, at) in self._receipts.items() if now - at > retention_s]
        for key in old:
            del self._receipts[key]
        return old

    def in_flight(self, key: str) -> bool:
        """Whether a request under ``key`` is still being carried out (the truth)."""
        return key in self._in_flight

    def held(self, key: str) -> Receipt | None:
        """The receipt the service holds under ``key`` (no fault applies: the truth)."""
        found = self._receipts.get(key)
        return None if found is None else found[0]

    def drop_newest(self, settled: set[str], *, tamper: bool = False) -> None:
        """Lose the newest receipt of a settled write (deleted after the commit), or
        (``tamper``) rewrite its result."""
        keys = [k for k in self._receipts if k in settled]
        if keys:
            key = max(keys, key=lambda k: self._receipts[k][1])
            if tamper:
                receipt, at = self._receipts[key]
                self._receipts[key] = (replace(receipt, result={"tampered": True}), at)
                return
            del self._receipts[key]

    def heal(self) -> None:
        """The world heals: a hung request lands now, and no fault is armed any more."""
        self.faults = Faults()
        for key, (intent, prestate, _, fence) in list(self._in_flight.items()):
            self._in_flight[key] = (intent, prestate, self.world.clock.seconds, fence)

    def _land_due(self) -> None:
        now = self.world.clock.seconds
        for key, (intent, prestate, until, fence) in list(self._in_flight.items()):
            if now >= until:
                del self._in_flight[key]
                self._apply(key, intent, prestate, fence, self._in_flight_sent.pop(key, None))

    def _apply(
        self,
        key: str,
        intent: Intent,
        prestate: EnvironmentState,
        fence: Fence | None,
        sent_at: float | None = None,
    ) -> Receipt:
        seq = len(self.world.receptions) + 1
        receipt = Receipt(
            namespace=self._namespace,
            adapter_version=self.ADAPTER_VERSION,
            receipt_id=f"tk-{seq}",
            idempotency_key=key,
            intent_digest=intent.digest,
            result={"ticket": seq},
            business_object_id=f"ticket-{seq}",
            committed_at=format_time(self.world.clock.now()),
            post_state=prestate,
        )
        self._receipts[key] = (receipt, self.world.clock.seconds)
        self.world.receive(
            namespace=self._namespace,
            key=key,
            intent_digest=intent.digest,
            kind=intent.kind,
            target=intent.target,
            identity=f"{intent.target}:{canonical_bytes(dict(intent.args)).decode()}",
            lease_version=_fence_version(fence),
            changed=True,
            sent_at=sent_at,
        )
        return receipt


class SimBoard(SimTickets):
    """A remote status board: each write replaces what its target shows (declared a state).

    Nothing reads it back for the run (no ``holds``): only the ledger can tell
    that another value was set since an equal write (A, B, A). :attr:`shows`
    is the truth the judge reads.
    """

    def __init__(self, world: World, caps: Capabilities) -> None:
        super().__init__(world, caps)
        self._kind = BOARD
        self._namespace = "board"
        self._capabilities = replace(caps, stateful=False, targets=Targets.STATE)
        self._caps = self._capabilities
        #: Target -> what the board shows now.
        self.shows: dict[str, str] = {}

    @property
    def instance_id(self) -> str:
        return "board-1"

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        self._check_kind(kind)
        if set(args) != {"value"} or not isinstance(args["value"], str):
            raise ContractViolationError("bad_args", "board.set takes a value only")
        return {"value": args["value"]}

    def _apply(
        self,
        key: str,
        intent: Intent,
        prestate: EnvironmentState,
        fence: Fence | None,
        sent_at: float | None = None,
    ) -> Receipt:
        value = str(intent.args.get("value"))
        before = self.shows.get(intent.target)
        self.shows[intent.target] = value
        seq = len(self.world.receptions) + 1
        receipt = Receipt(
            namespace=self._namespace,
            adapter_version=self.ADAPTER_VERSION,
            receipt_id=f"bd-{seq}",
            idempotency_key=key,
            intent_digest=intent.digest,
            result={"shows": value},
            business_object_id=intent.target,
            committed_at=format_time(self.world.clock.now()),
            post_state=prestate,
        )
        self._receipts[key] = (receipt, self.world.clock.seconds)
        self.world.receive(
            namespace=self._namespace,
            key=key,
            intent_digest=intent.digest,
            kind=intent.kind,
            target=intent.target,
            identity=f"{intent.target}={value}",
            lease_version=_fence_version(fence),
            changed=before != value,
            sent_at=sent_at,
        )
        return receipt


def _maybe_hostile(
    faults: Faults, found: Receipt | None, key: str, env: EnvironmentState, namespace: str
) -> Receipt | None:
    """A hostile look-up: a receipt under the key for an intent that is not the one sent.

    Where nothing landed under the key, the receipt is made up whole (a
    service that answers for another client's request under a reused key).
    """
    if faults.hostile <= 0:
        return found
    faults.hostile -= 1
    if found is not None:
        return replace(found, intent_digest=digest({"hostile": found.intent_digest}))
    return Receipt(
        namespace=namespace,
        adapter_version="1",
        receipt_id=f"hostile-{key}",
        idempotency_key=key,
        intent_digest=digest({"hostile": key}),
        result={},
        business_object_id=f"hostile-{key}",
        committed_at=format_time(EPOCH),
        post_state=env,
    )
