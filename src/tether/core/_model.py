"""Value objects: environments, intents, receipts, pending writes, evidence.

Each has ``to_json`` (canonical-ready dicts) and a strict ``parse`` that uses
:class:`~tether.core._fields.Fields`, so checkpoints, ledgers and receipts
all refuse unknown or mistyped fields the same way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from tether.core._canonical import JSONValue, digest
from tether.core._fields import Fields
from tether.core._phases import EffectStatus

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds; naive datetimes are refused."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("datetimes must be timezone-aware")
    return _utc_text(moment)


# One commit formats the same clock reading a dozen times (every event, entry
# and state field); equal aware datetimes are one instant, one text.
@functools.lru_cache(maxsize=64)
def _utc_text(moment: datetime) -> str:
    # isoformat is C and pads the year to four digits (strftime's %Y does not).
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time_text(text: object) -> datetime:
    """The inverse of :func:`format_time`; raises ``ValueError`` for anything else."""
    return _parsed(str(text))


# A recovery parses every stored time of the run again (ledger, trace, marks): the
# same few texts, each a strptime call. A refused text raises, and is not kept.
@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> datetime:
    return datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=UTC)


def parse_time(f: Fields, key: str) -> datetime:
    text = f.str(key)
    try:
        return parse_time_text(text)
    except ValueError:
        f.fail(f.name(key), f"expected a UTC time like 2026-01-31T12:00:00.000000Z, got {text!r}")


class Targets(StrEnum):
    """What a write's target is, as declared (tether cannot tell a topic from an inbox).

    Read by the replay rule where the adapter cannot read the target: an
    effect equal to one committed earlier, with a different effect
    committed on the same target since (A, B, A).
    """

    #: The target holds one state that each write replaces (a PUT to a URL, a
    #: record's field): A, B, A writes A again, a new effect.
    STATE = "state"
    #: Each effect makes its own object (POST /tickets, an email sent), or
    #: nothing was declared (the default): the third is the first again,
    #: replayed, never a duplicate, and a program rerun from its top sends
    #: nothing it sent before.
    COLLECTION = "collection"
    #: Declared so: a person decides whether A, B, A is a revert or a
    #: duplicate (review, ``repeat_or_revert``); nothing is sent meanwhile.
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an adapter can promise.

    ``idempotent``: executing the same key twice produces one effect and
    returns the first receipt. ``queryable``: :meth:`Adapter.lookup` is
    authoritative for a key. ``conditional_writes``: a write is refused unless
    the target is in the expected prior state. ``fencing``: the adapter
    refuses a fencing token lower than the highest it has seen for a run.
    """

    idempotent: bool
    queryable: bool
    conditional_writes: bool
    fencing: bool = False
    #: With ``queryable``: a look-up that finds nothing proves the write never
    #: landed and never will (no eventual consistency, no request still in flight).
    absent_is_final: bool = True
    #: Keys are remembered at least this many seconds (``None``: for ever).
    #: Past it, a look-up that finds nothing proves nothing and a send under
    #: the same key may be a second effect: an older unsettled write goes to
    #: review.
    retention_s: float | None = None
    #: A key the adapter still reports in flight this many seconds after it was
    #: dispatched is stuck (a handler that crashed holding it, say): the effect
    #: may never finish or may have landed, so a person decides (``None``: wait
    #: for ever).
    in_flight_limit_s: float | None = None
    #: The adapter's environment records its effects (a workspace): a receipt's
    #: post-state is the environment after the write. ``False`` for a remote
    #: service or a mail server, whose environment is its identity alone: their
    #: effects live in the ledger, and the environment does not move.
    stateful: bool = True
    #: Without a stateful environment, the adapter can still tell whether a
    #: write's target holds now what that write leaves (a function effect
    #: declaring ``holds``): an equal write after a commit is a new effect when
    #: the target moved since (A, B, A writes A again), as on a stateful one.
    target_state: bool = False
    #: What a write's target is (:class:`Targets`), where the adapter cannot read
    #: it: decides A, B, A (see :func:`tether.core._replay.judge`). The default,
    #: ``COLLECTION``, answers an equal re-proposal from the record, never sending
    #: a known effect twice (a program rerun from its top re-proposes its whole
    #: history: A, B, A there is not a revert); ``STATE`` writes A again, and
    #: ``UNKNOWN`` asks a person, each only where the user declares it.
    targets: Targets = Targets.COLLECTION

    @property
    def tracks_targets(self) -> bool:
        """Whether the replay rule can learn that a write's target moved (see ``target_state``)."""
        return self.stateful or self.target_state

    @property
    def blind(self) -> bool:
        """Neither idempotent nor queryable: a sent write can never be confirmed again."""
        return not (self.idempotent or self.queryable)


@dataclass(frozen=True, slots=True)
class EnvironmentState:
    """What an adapter says its environment is: identity, revision, content digest."""

    namespace: str
    instance_id: str
    version: int
    state_fingerprint: str

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "namespace": self.namespace,
            "instance_id": self.instance_id,
            "version": self.version,
            "state_fingerprint": self.state_fingerprint,
        }

    @classmethod
    def parse(cls, f: Fields) -> EnvironmentState:
        env = cls(
            namespace=f.str("namespace"),
            instance_id=f.str("instance_id"),
            version=f.int("version"),
            state_fingerprint=f.str("state_fingerprint"),
        )
        f.done()
        return env


@dataclass(frozen=True, slots=True)
class Intent:
    """A normalized proposed write. Its digest is the identity retries are bound to.

    The digest is computed once, when the intent is made (``args`` is not to
    be changed afterwards; every caller builds a new intent instead).
    """

    kind: str
    target: str
    args: dict[str, Any]
    risk: str
    digest: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", digest(self.to_json()))

    def to_json(self) -> dict[str, JSONValue]:
        return {"kind": self.kind, "target": self.target, "args": self.args, "risk": self.risk}

    @classmethod
    def parse(cls, f: Fields) -> Intent:
        args = f.raw("args")
        if not isinstance(args, dict):
            f.fail(f.name("args"), "expected an object")
        intent = cls(
            kind=f.str("kind"),
            target=f.str("target", nonempty=False),
            args=args,
            risk=f.str("risk"),
        )
        f.done()
        return intent


@dataclass(frozen=True, slots=True)
class Receipt:
    """The adapter's authoritative record of one committed write."""

    namespace: str
    adapter_version: str
    receipt_id: str
    idempotency_key: str
    intent_digest: str
    result: dict[str, Any]
    business_object_id: str
    committed_at: str
    post_state: EnvironmentState
    #: Digest of every field, computed once: two receipts are the same only if
    #: this is equal.
    fingerprint: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fingerprint", digest(self.to_json()))

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "namespace": self.namespace,
            "adapter_version": self.adapter_version,
            "receipt_id": self.receipt_id,
            "idempotency_key": self.idempotency_key,
            "intent_digest": self.intent_digest,
            "result": self.result,
            "business_object_id": self.business_object_id,
            "committed_at": self.committed_at,
            "post_state": self.post_state.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any, error: Any = None) -> Receipt:
        """Parse a receipt document strictly (``error`` builds the exception)."""
        from tether.core._errors import IntegrityError

        def default(field_name: str, problem: str) -> Exception:
            return IntegrityError(f"receipt {field_name}: {problem}")

        return cls.parse(Fields(data, "", error or default))

    @classmethod
    def parse(cls, f: Fields) -> Receipt:
        result = f.raw("result")
        if not isinstance(result, dict):
            f.fail(f.name("result"), "expected an object")
        receipt = cls(
            namespace=f.str("namespace"),
            adapter_version=f.str("adapter_version"),
            receipt_id=f.str("receipt_id"),
            idempotency_key=f.str("idempotency_key"),
            intent_digest=f.str("intent_digest"),
            result=result,
            business_object_id=f.str("business_object_id"),
            committed_at=f.str("committed_at"),
            post_state=EnvironmentState.parse(f.obj("post_state")),
        )
        f.done()
        return receipt


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A write whose intent and key are durable and whose effect is not yet settled.

    ``status`` is the effect's ledger status as the signed state knows it:
    ``intended`` (nothing was sent: the write may go only after a commit that
    says ``dispatched``), ``dispatched`` (it may have been sent), and, once
    frozen for review, ``committed`` or ``outcome_unknown``. ``approvals``
    holds the approval in force; ``nonces`` every approval nonce consumed for
    this write, superseded ones included, so a replayed approval is refused
    for as long as the write is pending and the state stays flat as runs grow.

    ``mutating`` is false for a read, a test run or a finish that waits for
    a person's approval: it changes nothing, so it has no ledger entries; its
    key exists only to bind the approval to it.
    """

    action_id: str
    intent: Intent
    intent_digest: str
    idempotency_key: str
    prestate: EnvironmentState
    expected_post: EnvironmentState
    generation: int
    proposed_at: datetime
    cost: int
    status: EffectStatus = EffectStatus.INTENDED
    approvals: tuple[dict[str, Any], ...] = ()
    nonces: tuple[str, ...] = ()
    mutating: bool = True
    #: When the latest send under the key began, by the signed state (``None``
    #: before the first): the in-flight limit counts from it.
    dispatched_at: datetime | None = None
    #: The write was sent again under its key after its first send (committed
    #: before the resend): a refusal found later may be the resend's, and the
    #: first attempt may have landed.
    resent: bool = False
    #: A reviewer signed ``not_landed`` for this write, whose outcome was
    #: unknown: the next step sends it once more under its key (status still
    #: ``outcome_unknown`` until the commit that says ``dispatched``, which
    #: clears this). Never set on any other write.
    resend_ordered: bool = False

    def to_json(self) -> dict[str, JSONValue]:
        body: dict[str, JSONValue] = {
            "action_id": self.action_id,
            "intent": self.intent.to_json(),
            "intent_digest": self.intent_digest,
            "idempotency_key": self.idempotency_key,
            "prestate": self.prestate.to_json(),
            "expected_post": self.expected_post.to_json(),
            "generation": self.generation,
            "proposed_at": format_time(self.proposed_at),
            "cost": self.cost,
            "status": self.status.value,
            "approvals": list(self.approvals),
            "nonces": list(self.nonces),
            "mutating": self.mutating,
            "dispatched_at": None
            if self.dispatched_at is None
            else format_time(self.dispatched_at),
            "resent": self.resent,
        }
        # Only when set, so every other pending write encodes as it always did.
        if self.resend_ordered:
            body["resend_ordered"] = True
        return body

    @classmethod
    def parse(cls, f: Fields) -> PendingWrite:
        approvals = f.list("approvals")
        if not all(isinstance(a, dict) for a in approvals):
            f.fail(f.name("approvals"), "expected a list of objects")
        status_text = f.str("status")
        try:
            status = EffectStatus(status_text)
        except ValueError:
            f.fail(f.name("status"), f"unknown effect status {status_text!r}")
        pending = cls(
            action_id=f.str("action_id"),
            intent=Intent.parse(f.obj("intent")),
            intent_digest=f.str("intent_digest"),
            idempotency_key=f.str("idempotency_key"),
            prestate=EnvironmentState.parse(f.obj("prestate")),
            expected_post=EnvironmentState.parse(f.obj("expected_post")),
            generation=f.int("generation", minimum=1),
            proposed_at=parse_time(f, "proposed_at"),
            cost=f.int("cost"),
            status=status,
            approvals=tuple(approvals),
            nonces=f.str_list("nonces"),
            mutating=f.bool("mutating"),
            # Absent from checkpoints written before the field existed.
            dispatched_at=None
            if f.optional_raw("dispatched_at") is None
            else parse_time(f, "dispatched_at"),
            # Unknown in older checkpoints: a sent write may have been resent.
            resent=status is not EffectStatus.INTENDED
            if f.optional_raw("resent") is None
            else f.bool("resent"),
            resend_ordered=f.has("resend_ordered") and f.bool("resend_ordered"),
        )
        f.done()
        return pending


@dataclass(frozen=True, slots=True)
class CompletedWrite:
    """Summary of the last committed write; the full receipt lives in the ledger."""

    action_id: str
    idempotency_key: str
    intent_digest: str
    receipt_id: str
    receipt_fingerprint: str
    result_digest: str
    post_version: int

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "action_id": self.action_id,
            "idempotency_key": self.idempotency_key,
            "intent_digest": self.intent_digest,
            "receipt_id": self.receipt_id,
            "receipt_fingerprint": self.receipt_fingerprint,
            "result_digest": self.result_digest,
            "post_version": self.post_version,
        }

    @classmethod
    def parse(cls, f: Fields) -> CompletedWrite:
        done = cls(
            action_id=f.str("action_id"),
            idempotency_key=f.str("idempotency_key"),
            intent_digest=f.str("intent_digest"),
            receipt_id=f.str("receipt_id"),
            receipt_fingerprint=f.str("receipt_fingerprint"),
            result_digest=f.str("result_digest"),
            post_version=f.int("post_version"),
        )
        f.done()
        return done


@dataclass(frozen=True, slots=True)
class Verification:
    """A verifier run, bound to the environment version and state it judged."""

    env_version: int
    state_fingerprint: str
    passed: bool
    exit_code: int
    output_digest: str
    at: datetime

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "env_version": self.env_version,
            "state_fingerprint": self.state_fingerprint,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "output_digest": self.output_digest,
            "at": format_time(self.at),
        }

    @classmethod
    def parse(cls, f: Fields) -> Verification:
        verification = cls(
            env_version=f.int("env_version"),
            state_fingerprint=f.str("state_fingerprint"),
            passed=f.bool("passed"),
            exit_code=f.int("exit_code", minimum=None),
            output_digest=f.str("output_digest"),
            at=parse_time(f, "at"),
        )
        f.done()
        return verification


@dataclass(frozen=True, slots=True)
class ReviewCase:
    """A frozen conflict awaiting a signed human decision; its evidence is kept whole."""

    case_id: str
    reason: str
    action_id: str
    idempotency_key: str
    intent_digest: str
    receipt: dict[str, Any] | None
    receipt_fingerprint: str | None
    environment: EnvironmentState
    opened_at: datetime
    detail: str = ""
    evidence: tuple[dict[str, Any], ...] = field(default=())

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "case_id": self.case_id,
            "reason": self.reason,
            "action_id": self.action_id,
            "idempotency_key": self.idempotency_key,
            "intent_digest": self.intent_digest,
            "receipt": self.receipt,
            "receipt_fingerprint": self.receipt_fingerprint,
            "environment": self.environment.to_json(),
            "opened_at": format_time(self.opened_at),
            "detail": self.detail,
            "evidence": list(self.evidence),
        }

    @classmethod
    def parse(cls, f: Fields) -> ReviewCase:
        receipt = f.optional_raw("receipt")
        if receipt is not None and not isinstance(receipt, dict):
            f.fail(f.name("receipt"), "expected an object or null")
        evidence = f.list("evidence")
        if not all(isinstance(e, dict) for e in evidence):
            f.fail(f.name("evidence"), "expected a list of objects")
        case = cls(
            case_id=f.str("case_id"),
            reason=f.str("reason"),
            # Empty for a case about the run rather than a write (worker_error).
            action_id=f.str("action_id", nonempty=False),
            idempotency_key=f.str("idempotency_key", nonempty=False),
            intent_digest=f.str("intent_digest", nonempty=False),
            receipt=receipt,
            receipt_fingerprint=f.optional_str("receipt_fingerprint"),
            environment=EnvironmentState.parse(f.obj("environment")),
            opened_at=parse_time(f, "opened_at"),
            detail=f.str("detail", nonempty=False),
            evidence=tuple(evidence),
        )
        f.done()
        return case


#: Bounds of a :class:`LastOutcome`, so a checkpoint stays the same size whatever happened.
OUTCOME_MESSAGE_MAX = 1000
OUTCOME_OUTPUT_MAX = 4096


@dataclass(frozen=True, slots=True)
class LastOutcome:
    """How the agent's last action ended, as its next observation carries it.

    ``kind`` is an :class:`~tether.core.OutcomeKind` word (``rejected``,
    ``verifier_failed``, ``executed``, ``waiting_for_approval``...),
    ``reason`` its stable reason word (the gate's ``kind_not_allowed``, the
    adapter's ``precondition_failed``...), ``message`` what a person would be
    told, ``output`` the tail of what a verifier or test run printed. Each
    text is bounded (the last 4 KB of output): the checkpoint holding it
    stays flat, and a recovered agent hears the same thing.
    """

    kind: str
    action_id: str | None = None
    reason: str | None = None
    message: str = ""
    output: str = ""

    @classmethod
    def bounded(
        cls,
        kind: str,
        *,
        action_id: str | None = None,
        reason: str | None = None,
        message: str = "",
        output: str = "",
    ) -> LastOutcome:
        """One with each text cut to its bound (the end of an output is what explains it)."""
        return cls(
            kind=kind,
            action_id=action_id[:200] if action_id else None,
            reason=None if reason is None else reason[:200],
            message=message[:OUTCOME_MESSAGE_MAX],
            output=output[-OUTCOME_OUTPUT_MAX:] if output else "",
        )

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "kind": self.kind,
            "action_id": self.action_id,
            "reason": self.reason,
            "message": self.message,
            "output": self.output,
        }

    @classmethod
    def parse(cls, f: Fields) -> LastOutcome:
        outcome = cls(
            kind=f.str("kind"),
            action_id=f.optional_str("action_id"),
            reason=f.optional_str("reason"),
            message=f.str("message", nonempty=False),
            output=f.str("output", nonempty=False),
        )
        if len(outcome.message) > OUTCOME_MESSAGE_MAX or len(outcome.output) > OUTCOME_OUTPUT_MAX:
            f.fail(f.name("output"), "longer than a last outcome may be")
        f.done()
        return outcome
