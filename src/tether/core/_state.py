"""Run state: what a checkpoint holds, its strict codec and its invariants.

The state has a fixed size per step: the trace and the effect ledger live in
the store and the state carries only their head, so a checkpoint at step
10,000 costs what one at step 10 does.
"""

from __future__ import annotations

import collections
import operator
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from itertools import repeat
from typing import Any

from tether.core._canonical import JSONValue
from tether.core._contract import Contract
from tether.core._errors import InvariantError, SpecError, UnknownFieldError
from tether.core._fields import Fields
from tether.core._model import (
    CompletedWrite,
    EnvironmentState,
    LastOutcome,
    PendingWrite,
    ReviewCase,
    Verification,
    format_time,
    parse_time,
)
from tether.core._phases import EffectStatus, Phase
from tether.core._rewind import RestPoint, RewindPlan
from tether.core._spec import Policy, PolicyChange, TaskSpec

SCHEMA_VERSION = 4
GENESIS_HASH = "sha256:" + "0" * 64
# A write still in flight; committed or unknown outcomes only exist frozen for review.
_LIVE_STATUSES = frozenset({EffectStatus.INTENDED, EffectStatus.DISPATCHED})


@dataclass(frozen=True, slots=True)
class Binding:
    """Which exact task, policy and scenario a run executes under."""

    task_id: str
    task_version: str
    task_fingerprint: str
    policy_id: str
    policy_version: str
    policy_fingerprint: str
    scenario_fingerprint: str

    @classmethod
    def of(cls, task: TaskSpec, policy: Policy) -> Binding:
        return cls(
            task_id=task.task_id,
            task_version=task.task_version,
            task_fingerprint=task.fingerprint,
            policy_id=policy.policy_id,
            policy_version=policy.policy_version,
            policy_fingerprint=policy.fingerprint,
            scenario_fingerprint=task.scenario_fingerprint,
        )

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "task_id": self.task_id,
            "task_version": self.task_version,
            "task_fingerprint": self.task_fingerprint,
            "policy_id": self.policy_id,
            "policy_version": self.policy_version,
            "policy_fingerprint": self.policy_fingerprint,
            "scenario_fingerprint": self.scenario_fingerprint,
        }

    @classmethod
    def parse(cls, f: Fields) -> Binding:
        binding = cls(
            task_id=f.str("task_id"),
            task_version=f.str("task_version"),
            task_fingerprint=f.str("task_fingerprint"),
            policy_id=f.str("policy_id"),
            policy_version=f.str("policy_version"),
            policy_fingerprint=f.str("policy_fingerprint"),
            scenario_fingerprint=f.str("scenario_fingerprint"),
        )
        f.done()
        return binding


@dataclass(frozen=True, slots=True)
class Spent:
    """Budgets consumed so far.

    ``wall_time_ms`` is the run's own working time: what passed between its
    commits while it was running or had a write out. Time spent down (a
    crash until the recovery) or waiting for a person (an approval, a review
    case) is not in it; the calendar since ``started_at`` is bounded
    separately, by the task's optional ``deadline_s``.
    """

    proposals: int = 0
    steps: int = 0
    cost: int = 0
    wall_time_ms: int = 0

    def to_json(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "proposals": self.proposals,
            "steps": self.steps,
            "cost": self.cost,
        }
        if self.wall_time_ms:  # absent from checkpoints written before it was counted
            body["wall_time_ms"] = self.wall_time_ms
        return body

    @classmethod
    def parse(cls, f: Fields) -> Spent:
        spent = cls(
            proposals=f.int("proposals"),
            steps=f.int("steps"),
            cost=f.int("cost"),
            wall_time_ms=f.int("wall_time_ms", minimum=0) if f.has("wall_time_ms") else 0,
        )
        f.done()
        return spent


@dataclass(frozen=True, slots=True)
class ReplayApproval:
    """An approval that lets a gated effect be answered by replay while it lives."""

    effect: str
    until: datetime
    policy_version: str

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "effect": self.effect,
            "until": format_time(self.until),
            "policy_version": self.policy_version,
        }

    @classmethod
    def parse(cls, f: Fields) -> ReplayApproval:
        approval = cls(
            effect=f.str("effect"),
            until=parse_time(f, "until"),
            policy_version=f.str("policy_version", nonempty=False),
        )
        f.done()
        return approval


@dataclass(frozen=True, slots=True)
class SpentNonce:
    """An approval's nonce the run consumed, kept until the approval that carried it expires.

    Past ``until`` the approval is refused as expired whatever its nonce, so
    the run may forget it (see :func:`tether.core.keep_approval_nonce`).
    """

    nonce: str
    until: datetime

    def to_json(self) -> dict[str, JSONValue]:
        return {"nonce": self.nonce, "until": format_time(self.until)}

    @classmethod
    def parse(cls, f: Fields) -> SpentNonce:
        spent = cls(nonce=f.str("nonce"), until=parse_time(f, "until"))
        f.done()
        return spent


@dataclass(frozen=True, slots=True)
class RunState:
    """Everything a checkpoint records about one run at one generation."""

    run_id: str
    generation: int
    epoch: int
    worker: str
    binding: Binding
    phase: Phase
    stop_reason: str | None
    started_at: datetime
    updated_at: datetime
    plan_cursor: int
    agent_context_digest: str
    spent: Spent
    environment: EnvironmentState
    adapter_version: str
    observed_version: int
    pending: PendingWrite | None
    last_write: CompletedWrite | None
    writes_committed: int
    verification: Verification | None
    review_cases: tuple[ReviewCase, ...]
    quarantined_keys: tuple[str, ...]
    trace_head: str
    trace_length: int
    # The effect ledger's chain: restore refuses a ledger that does not end here.
    ledger_head: str
    ledger_length: int
    # Signed evidence arrives in the store's inbox; this is the last entry read.
    inbox_cursor: int = 0
    # The results of the last step's actions, stored by content digest: what
    # the agent's next observation carries (also after a recovery).
    results_digest: str | None = None
    # Every signed reviewer decision this state was shaped by (a replan's
    # quarantine, an abort's failure): restoring it needs the reviewers' trust
    # roots again. One per closed review case, so it stays small.
    decisions: tuple[dict[str, Any], ...] = ()
    #: The epoch's own id (minted when it was admitted; ``epoch`` counts them).
    epoch_id: str = ""
    #: Digest of the admission record (a blob) that let this epoch begin
    #: (``None`` for the first epoch, which the run's start admitted).
    admission: str | None = None
    #: The work occurrence: the run's id, until an admission under a changed
    #: policy opens a new occurrence linked to the old one.
    occurrence_id: str = ""
    #: A rewind admitted and checkpointed, its workspace restore not yet
    #: recorded: the next step finishes it before anything else.
    rewinding: RewindPlan | None = None
    # The deployment contract the run was begun under (see ``core._contract``);
    # checkpoints written before it existed were all ``standard``.
    contract: Contract = Contract.STANDARD
    # Effect digests a signed fork allows once more (consumed by the write that
    # uses it), and every fork nonce ever recorded, so a fork cannot be replayed.
    forks: tuple[str, ...] = ()
    fork_nonces: tuple[str, ...] = ()
    #: Nonces of signed cancels the run read without ending (refused while it
    #: was frozen, or acted on by a freeze): such a cancel is never read twice.
    cancel_nonces: tuple[str, ...] = ()
    #: Effects whose replay a person approved, and until when (the approval the
    #: effect was sent under counts too): a gated kind's replay needs one alive.
    replay_approvals: tuple[ReplayApproval, ...] = ()
    #: Every approval nonce the run consumed whose approval has not expired yet
    #: (with its expiry): one-time across every document and case, and bounded
    #: by the approvals alive, not by the run's history.
    approval_nonces: tuple[SpentNonce, ...] = ()
    #: How the agent's last action ended (the gate's refusal, the adapter's,
    #: the verifier's verdict and output): its next observation carries it.
    last_outcome: LastOutcome | None = None
    #: The ``authority.policy_change`` clause of the policy in force (the one
    #: ``binding`` names): whether another policy may be adopted is its call,
    #: never the newcomer's. Checkpoints written before it read as ``refuse``.
    policy_change: PolicyChange = PolicyChange.REFUSE
    #: Set only on a checkpoint that carried a deferred receipt and is not at
    #: rest itself: the state at rest the run passed through right after that
    #: write (its rewind point; see :class:`~tether.core.RestPoint`).
    rest: RestPoint | None = None

    def evolve(self, **changes: Any) -> RunState:
        """A copy with ``changes`` applied (the state itself is immutable).

        Every step evolves the state several times, so this copies the slots
        directly instead of going through ``dataclasses.replace`` (which looks
        at every field's metadata): the same result, a quarter of the time.
        """
        unknown = changes.keys() - _FIELD_NAMES
        if unknown:
            raise TypeError(f"RunState has no field {sorted(unknown)[0]!r}")
        new = object.__new__(RunState)
        put = object.__setattr__
        # The loop over the slots runs in C (map drained by a zero-length deque).
        _drain(map(put, repeat(new, _FIELD_COUNT), _FIELD_NAMES_ORDERED, _all_fields(self)))
        for name, value in changes.items():
            put(new, name, value)
        return new

    def to_json(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "generation": self.generation,
            "epoch": self.epoch,
            "worker": self.worker,
            "binding": self.binding.to_json(),
            "phase": self.phase.value,
            "stop_reason": self.stop_reason,
            "started_at": format_time(self.started_at),
            "updated_at": format_time(self.updated_at),
            "plan_cursor": self.plan_cursor,
            "agent_context_digest": self.agent_context_digest,
            "spent": self.spent.to_json(),
            "environment": self.environment.to_json(),
            "adapter_version": self.adapter_version,
            "observed_version": self.observed_version,
            "pending": None if self.pending is None else self.pending.to_json(),
            "last_write": None if self.last_write is None else self.last_write.to_json(),
            "writes_committed": self.writes_committed,
            "verification": None if self.verification is None else self.verification.to_json(),
            "review_cases": [case.to_json() for case in self.review_cases],
            "quarantined_keys": list(self.quarantined_keys),
            "trace_head": self.trace_head,
            "trace_length": self.trace_length,
            "ledger_head": self.ledger_head,
            "ledger_length": self.ledger_length,
            "inbox_cursor": self.inbox_cursor,
            "results_digest": self.results_digest,
            "decisions": list(self.decisions),
            "epoch_id": self.epoch_id,
            "admission": self.admission,
            "occurrence_id": self.occurrence_id,
            "rewinding": None if self.rewinding is None else self.rewinding.to_json(),
            "contract": self.contract.value,
        }
        # Written only once used, so a run that never forks keeps its payload as it was.
        if self.forks:
            body["forks"] = list(self.forks)
        if self.fork_nonces:
            body["fork_nonces"] = list(self.fork_nonces)
        if self.cancel_nonces:
            body["cancel_nonces"] = list(self.cancel_nonces)
        if self.replay_approvals:
            body["replay_approvals"] = [a.to_json() for a in self.replay_approvals]
        if self.approval_nonces:
            body["approval_nonces"] = [n.to_json() for n in self.approval_nonces]
        if self.last_outcome is not None:
            body["last_outcome"] = self.last_outcome.to_json()
        if self.policy_change is not PolicyChange.REFUSE:
            body["policy_change"] = self.policy_change.value
        if self.rest is not None:
            body["rest"] = self.rest.to_json()
        return body

    @classmethod
    def from_json(cls, data: Any) -> RunState:
        """Parse a payload strictly. Schema version is checked by the caller first."""
        f = Fields(data, "", lambda field, problem: UnknownFieldError(field, problem))
        f.int("schema_version")
        phase_text = f.str("phase")
        try:
            phase = Phase(phase_text)
        except ValueError:
            f.fail("phase", f"unknown phase {phase_text!r}")
        pending = f.optional_obj("pending")
        last_write = f.optional_obj("last_write")
        verification = f.optional_obj("verification")
        rewinding = f.optional_obj("rewinding")
        last_outcome = f.optional_obj("last_outcome") if f.has("last_outcome") else None
        rest = f.obj("rest") if f.has("rest") else None
        state = cls(
            run_id=f.str("run_id"),
            generation=f.int("generation", minimum=1),
            epoch=f.int("epoch", minimum=1),
            worker=f.str("worker"),
            binding=Binding.parse(f.obj("binding")),
            phase=phase,
            stop_reason=f.optional_str("stop_reason"),
            started_at=parse_time(f, "started_at"),
            updated_at=parse_time(f, "updated_at"),
            plan_cursor=f.int("plan_cursor"),
            agent_context_digest=f.str("agent_context_digest"),
            spent=Spent.parse(f.obj("spent")),
            environment=EnvironmentState.parse(f.obj("environment")),
            adapter_version=f.str("adapter_version"),
            observed_version=f.int("observed_version"),
            pending=None if pending is None else PendingWrite.parse(pending),
            last_write=None if last_write is None else CompletedWrite.parse(last_write),
            writes_committed=f.int("writes_committed"),
            verification=None if verification is None else Verification.parse(verification),
            review_cases=tuple(ReviewCase.parse(c) for c in f.items("review_cases")),
            quarantined_keys=f.str_list("quarantined_keys"),
            trace_head=f.str("trace_head"),
            trace_length=f.int("trace_length"),
            ledger_head=f.str("ledger_head"),
            ledger_length=f.int("ledger_length"),
            inbox_cursor=f.int("inbox_cursor"),
            results_digest=f.optional_str("results_digest"),
            decisions=_documents(f, "decisions"),
            # Absent from checkpoints written before admissions existed.
            epoch_id=f.str("epoch_id", nonempty=False) if f.has("epoch_id") else "",
            admission=f.optional_str("admission"),
            occurrence_id=f.str("occurrence_id", nonempty=False) if f.has("occurrence_id") else "",
            rewinding=None if rewinding is None else RewindPlan.parse(rewinding),
            contract=_contract(f),
            forks=f.str_list("forks") if f.has("forks") else (),
            fork_nonces=f.str_list("fork_nonces") if f.has("fork_nonces") else (),
            cancel_nonces=f.str_list("cancel_nonces") if f.has("cancel_nonces") else (),
            replay_approvals=tuple(
                ReplayApproval.parse(item) for item in f.items("replay_approvals")
            )
            if f.has("replay_approvals")
            else (),
            approval_nonces=tuple(SpentNonce.parse(item) for item in f.items("approval_nonces"))
            if f.has("approval_nonces")
            else (),
            last_outcome=None if last_outcome is None else LastOutcome.parse(last_outcome),
            policy_change=_policy_change(f),
            rest=None if rest is None else RestPoint.parse(rest),
        )
        f.done()
        return state


_FIELD_NAMES_ORDERED = tuple(f.name for f in fields(RunState))
_FIELD_NAMES = frozenset(_FIELD_NAMES_ORDERED)
_FIELD_COUNT = len(_FIELD_NAMES_ORDERED)
_all_fields = operator.attrgetter(*_FIELD_NAMES_ORDERED)
_sink: collections.deque[None] = collections.deque(maxlen=0)
_drain: Callable[[Iterable[None]], None] = _sink.extend


#: The longest run id a run may take: it names the run in every row, URL and command.
MAX_RUN_ID = 200


def check_run_id(run_id: object) -> str:
    """``run_id`` if a new run may take it, else :class:`SpecError` saying what to change.

    A run id is typed back by people (``tether inspect RUN``), put in URLs and
    stored in every row: it must be a non-empty string of at most
    :data:`MAX_RUN_ID` characters, with no control characters (a NUL, a
    newline) and no whitespace at either end. Any other character is kept.
    """
    if not isinstance(run_id, str):
        raise SpecError("run_id", f"a run id is a string, not {type(run_id).__name__}")
    if not run_id.strip():
        raise SpecError("run_id", "a run id may not be empty or blank; name the run")
    if run_id != run_id.strip():
        raise SpecError("run_id", f"{run_id!r} has whitespace at an end; drop it")
    if len(run_id) > MAX_RUN_ID:
        raise SpecError(
            "run_id", f"a run id has at most {MAX_RUN_ID} characters, not {len(run_id)}"
        )
    # Control characters, invisible formatting (zero-width spaces, direction
    # overrides: two ids that look alike on a screen), line separators and lone
    # surrogates (not text at all) would each make an id a person cannot type back.
    bad = next((c for c in run_id if unicodedata.category(c) in _UNTYPABLE), None)
    if bad is not None:
        raise SpecError(
            "run_id",
            f"{run_id!r} holds {_UNTYPABLE[unicodedata.category(bad)]} U+{ord(bad):04X}; drop it",
        )
    return run_id


#: Unicode categories a run id may not hold, and what a person is told they are.
_UNTYPABLE = {
    "Cc": "the control character",
    "Cf": "the invisible formatting character",
    "Cs": "the lone surrogate",
    "Zl": "the line separator",
    "Zp": "the paragraph separator",
}


def working_ms(state: RunState, now: datetime, resumed_at: datetime | None = None) -> int:
    """The run's working time since ``state`` was committed, in milliseconds.

    Counted only while the run works: running, or with a write sent and its
    outcome awaited. A run frozen for review, finished, or holding an action
    that was never sent (where a person's approval is awaited) is not
    working. ``resumed_at`` is when this epoch began: a recovery's session
    counts from then, so the time the run was down is never counted.
    """
    if state.generation == 0:
        return 0
    pending = state.pending
    working = state.phase is Phase.RUNNING or (
        state.phase is Phase.PENDING
        and pending is not None
        and pending.status is not EffectStatus.INTENDED
    )
    if not working:
        return 0
    since = state.updated_at if resumed_at is None else max(state.updated_at, resumed_at)
    return max(0, (now - since) // _MILLISECOND)


_MILLISECOND = timedelta(milliseconds=1)


def _contract(f: Fields) -> Contract:
    value = f.optional_raw("contract")
    if value is None:
        return Contract.STANDARD  # absent from checkpoints written before the field existed
    if not isinstance(value, str) or value not in {c.value for c in Contract}:
        f.fail(f.name("contract"), f"unknown contract {value!r}")
    return Contract(value)


def _policy_change(f: Fields) -> PolicyChange:
    value = f.optional_raw("policy_change")
    if value is None:
        # Absent from checkpoints written before the field existed, and written
        # only when it is not ``refuse``: absence is the safe answer.
        return PolicyChange.REFUSE
    if not isinstance(value, str) or value not in {c.value for c in PolicyChange}:
        f.fail(f.name("policy_change"), f"unknown policy change clause {value!r}")
    return PolicyChange(value)


def _documents(f: Fields, name: str) -> tuple[dict[str, Any], ...]:
    items = f.list(name)
    if not all(isinstance(item, dict) for item in items):
        f.fail(f.name(name), "expected a list of objects")
    return tuple(items)


def check_state(state: RunState) -> None:
    """Check cross-object invariants (``validate_state`` also checks serializability).

    Raises :class:`InvariantError` at the first breach.
    """

    def breach(message: str) -> InvariantError:
        return InvariantError(f"run {state.run_id}: {message}", run_id=state.run_id)

    phase = state.phase
    if phase is Phase.PENDING and state.pending is None:
        raise breach("phase pending without a pending write")
    if phase in {Phase.RUNNING, Phase.COMPLETED} and state.pending is not None:
        raise breach(f"phase {phase} with a pending write")
    open_cases = state.review_cases
    if phase is Phase.NEEDS_REVIEW and not open_cases:
        raise breach("needs_review without an open review case")
    if phase is not Phase.NEEDS_REVIEW and phase is not Phase.FAILED and open_cases:
        raise breach(f"open review case in phase {phase}")
    if phase.terminal and not state.stop_reason:
        raise breach(f"terminal phase {phase} without a stop reason")
    if not phase.terminal and state.stop_reason is not None:
        raise breach(f"stop reason set in live phase {phase}")
    if phase is Phase.COMPLETED:
        v = state.verification
        if v is None or not v.passed:
            raise breach("completed without a passing verifier event")
        if (
            v.env_version != state.environment.version
            or v.state_fingerprint != state.environment.state_fingerprint
        ):
            raise breach("completed, but the verifier judged another environment version")
    pending = state.pending
    if pending is not None:
        if pending.prestate.instance_id != state.environment.instance_id:
            raise breach("pending write was proposed against another environment instance")
        if pending.prestate != state.environment:
            raise breach("pending write's prestate is not the checkpointed environment")
        if pending.intent.digest != pending.intent_digest:
            raise breach("pending write's intent digest does not match its intent")
        if pending.generation > state.generation:
            raise breach("pending write is newer than the checkpoint")
        if pending.idempotency_key in state.quarantined_keys:
            raise breach("pending write uses a quarantined key")
    if state.rewinding is not None and (phase is not Phase.RUNNING or pending is not None):
        raise breach(f"a rewind under way in phase {phase}")
    if state.observed_version > state.environment.version:
        raise breach("observed a version newer than the recorded environment")
    if state.trace_length == 0 and state.trace_head != GENESIS_HASH:
        raise breach("empty trace with a non-genesis head")
    if state.updated_at < state.started_at:
        raise breach("updated before it started")
    if state.ledger_length == 0 and state.ledger_head != GENESIS_HASH:
        raise breach("empty effect ledger with a non-genesis head")
    rest = state.rest
    if rest is not None and (
        rest.trace_length > state.trace_length or rest.ledger_length > state.ledger_length
    ):
        raise breach("a rest point past the checkpoint's own trace or ledger")
    spent = [n.nonce for n in state.approval_nonces]
    if len(set(spent)) != len(spent):
        raise breach("an approval nonce is recorded as consumed twice")
    if pending is not None:
        if len(set(pending.nonces)) != len(pending.nonces):
            raise breach("a nonce is recorded as consumed twice")
        if pending.resend_ordered and (
            pending.status is not EffectStatus.OUTCOME_UNKNOWN or not pending.mutating
        ):
            raise breach("a resend is ordered only for a write whose outcome is unknown")
        if (
            phase is Phase.PENDING
            and pending.status not in _LIVE_STATUSES
            and not pending.resend_ordered
        ):
            raise breach(f"pending write in status {pending.status}")
        if not pending.mutating and (
            phase is not Phase.PENDING
            or pending.status is not EffectStatus.INTENDED
            or pending.expected_post != pending.prestate
        ):
            raise breach("a non-mutating pending action must wait, unchanged, for its approval")
