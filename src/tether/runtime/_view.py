"""What the runtime's helper modules see of a runtime and of a session, structurally.

The session delegates the steps it does not take itself (approvals and
reviews, compensation, cancel and park, read-only actions, rewinds) to
modules of their own; they reach the session only through these two
protocols, so none of them imports the session module (which imports them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Protocol

from tether.adapters import Adapter, Fence
from tether.core import (
    ActionKind,
    Binding,
    EffectTerms,
    Intent,
    LedgerEntry,
    Outcome,
    PendingWrite,
    Policy,
    Proposal,
    RunState,
    TaskSpec,
)
from tether.core import _replay as replay_rules
from tether.core._actions import Rejection
from tether.core._transition import LedgerNote, Lookup, LookupAnswer, Transition
from tether.crypto import Signer, TrustRoots
from tether.runtime._agent import Agent, AgentContext
from tether.runtime._checkpointer import Checkpointer
from tether.runtime._clock import Clock, IdSource
from tether.runtime._crash import CrashPlan
from tether.runtime._history import History
from tether.store import ContentStore, LeaseRequest

#: A trace event before it is sealed: its kind and data.
Event = tuple[str, dict[str, Any]]


class Runtime(Protocol):
    """What a session and its helpers read of their runtime (the runtime module imports them)."""

    store: ContentStore
    adapter: Adapter
    task: TaskSpec
    policy: Policy
    agent: Agent | None
    clock: Clock
    ids: IdSource
    crash: CrashPlan
    defer_receipts: bool
    worker: str
    trust: TrustRoots | None
    lease_ttl_s: float | None
    heartbeat_max_s: float
    checkpointer: Checkpointer
    kinds: dict[str, ActionKind]
    binding: Binding
    principal: Signer | None

    def effect_terms(self, intent: Intent) -> EffectTerms: ...

    def effect_digest(self, intent: Intent) -> str: ...

    def same_action(self, held: PendingWrite, proposal: Proposal) -> bool: ...

    def held_problem(self, state: RunState) -> Rejection | None: ...


class Session(Protocol):
    """What the helper modules use of a :class:`~tether.runtime.RunSession`."""

    rt: Runtime
    state: RunState
    context: AgentContext
    digest: str | None
    release_secrets: bool
    history: History
    admissions_read: dict[int, str]
    unreachable: str | None

    @property
    def run_id(self) -> str: ...

    @property
    def riding(self) -> int: ...

    def sent_by_another(self, key: str) -> bool: ...

    @property
    def effects(self) -> Mapping[str, replay_rules.EffectHistory]: ...

    def reopen(self, state: RunState) -> None: ...

    def commit(
        self,
        state: RunState,
        events: list[Event],
        *,
        context: AgentContext | None = None,
        blobs: dict[str, bytes] | None = None,
        ledger: tuple[LedgerNote, ...] = (),
        effect: PendingWrite | None = None,
        lease_to: LeaseRequest | None = None,
    ) -> tuple[LedgerEntry, ...]: ...

    def apply(
        self,
        transition: Transition,
        *,
        prefix: list[Event] | None = None,
        context: AgentContext | None = None,
    ) -> Outcome: ...

    def decide(self, rule: Any, *, aged: bool = False) -> Transition: ...

    def land_deferred(self) -> None: ...

    def forget_snapshot(self) -> None: ...

    def ask(self, call: Lookup) -> LookupAnswer: ...

    def hint(self) -> dict[str, str] | None: ...

    def guard(self) -> Fence | None: ...

    def working(self) -> contextlib.AbstractContextManager[None]: ...

    def take_opening(self) -> tuple[dict[str, Any] | None, dict[str, bytes]]: ...

    def effect_decision(self, document: Any, *, cursor: int | None) -> Outcome: ...

    def rewind_from_inbox(self, document: Any, *, cursor: int) -> Outcome: ...
