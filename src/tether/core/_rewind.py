"""Aligned rewind, as pure values: what crosses the boundary, what the agent is told.

A rewind to generation g restores the agent's context and the workspace
together to g's causal position, as NEW generations: the mark only moves
forward, the trace and the ledger only grow. Two commits, so a crash between
them is finished, never guessed:

1. ``rewind_started``: the admitted plan (target generation, the
   environment to restore, the scope, the admission) is checkpointed;
2. the workspace is restored to g's snapshot (idempotent: doing it again
   after a crash finishes it);
3. ``rewound``: the context of g plus the rewind memory, the restored
   environment, a new epoch.

Effects committed after g *crossed the boundary*: a directory snapshot
cannot retract an email. They stay in the ledger, are listed in the
``rewound`` event and handed to the agent as rewind memory, so a recovered
agent knows they happened and must not be repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tether.core._canonical import JSONValue
from tether.core._errors import PolicyError
from tether.core._fields import Fields
from tether.core._ledger import LedgerEntry
from tether.core._model import EnvironmentState
from tether.core._phases import EffectStatus
from tether.core._trace import TraceEvent

#: Where the rewind memory lives in the agent's context memory.
REWIND_MEMORY_KEY = "rewind_memory"
#: At most this many events of the failed suffix are summarized for the agent.
TRIED_SHOWN = 50
_TAIL = 500

# Trace events that say what the failed suffix tried, and how it went.
_TRIED = frozenset(
    {
        "intent_persisted",
        "proposal_rejected",
        "action_observed",
        "verifier_ran",
        "effect_committed",
        "effect_reconciled",
        "effect_rejected",
        "effect_replayed",
        "needs_review",
        "failed",
        "environment_changed",
    }
)
_KEPT_FIELDS = (
    "action_id",
    "kind",
    "target",
    "reason",
    "message",
    "passed",
    "exit_code",
    "output_tail",
    "receipt_id",
    "idempotency_key",
)


class RewindScope(StrEnum):
    """What a rewind restores: both (aligned), or, only on purpose, one of the two."""

    ALIGNED = "aligned"
    FILES = "files"  # the workspace only: the context stays where it is
    CONTEXT = "context"  # the agent's context only: the workspace stays


class RewindRefusedError(PolicyError):
    """The rewind cannot be done as asked (no such point, a write pending, no snapshot)."""


class SplitRewindError(PolicyError):
    """Context and workspace would point at different causal positions.

    Restoring only the files, or only the context, leaves the agent reasoning
    about a workspace it did not observe. Refused unless a signed decision
    records the split on purpose.
    """

    def __init__(self, message: str, *, run_id: str, context_env: Any, workspace_env: Any) -> None:
        self.context_env = context_env
        self.workspace_env = workspace_env
        super().__init__(message, run_id=run_id)


@dataclass(frozen=True, slots=True)
class RestPoint:
    """The run at rest right after a write whose receipt rode on a later commit.

    A write step's receipt may be written with the run's next commit (see
    ``core.Durability``), so the state at rest right after the write is never
    a checkpoint of its own. The commit that carries it records it here when
    its own state is not at rest (the next write pending, say): a rewind to
    that commit's generation goes back to this point (the write done, before
    the step that followed), with the workspace snapshot stored beside it.
    """

    environment: EnvironmentState
    context_digest: str
    plan_cursor: int
    trace_head: str
    trace_length: int
    ledger_head: str
    ledger_length: int

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "environment": self.environment.to_json(),
            "context_digest": self.context_digest,
            "plan_cursor": self.plan_cursor,
            "trace_head": self.trace_head,
            "trace_length": self.trace_length,
            "ledger_head": self.ledger_head,
            "ledger_length": self.ledger_length,
        }

    @classmethod
    def parse(cls, f: Fields) -> RestPoint:
        point = cls(
            environment=EnvironmentState.parse(f.obj("environment")),
            context_digest=f.str("context_digest"),
            plan_cursor=f.int("plan_cursor"),
            trace_head=f.str("trace_head"),
            trace_length=f.int("trace_length"),
            ledger_head=f.str("ledger_head"),
            ledger_length=f.int("ledger_length"),
        )
        f.done()
        return point


@dataclass(frozen=True, slots=True)
class RewindPlan:
    """A rewind under way: checkpointed before the workspace is touched."""

    to_generation: int
    from_generation: int
    #: The environment at the rewind point: what the workspace is restored to.
    target: EnvironmentState
    #: The agent context of the rewind point (the retained prefix).
    context_digest: str
    plan_cursor: int
    scope: RewindScope
    reason: str
    #: Who selected the rewind point (the admitted principal).
    by: str
    admission: str
    #: The ledger's length at the rewind point: entries beyond it crossed.
    boundary: int
    #: The trace's length at the rewind point: the retained prefix.
    prefix_length: int
    #: The trace as it stood before the rewind: the failed suffix ends here.
    suffix_head: str
    suffix_length: int

    def to_json(self) -> dict[str, JSONValue]:
        return {
            "to_generation": self.to_generation,
            "from_generation": self.from_generation,
            "target": self.target.to_json(),
            "context_digest": self.context_digest,
            "plan_cursor": self.plan_cursor,
            "scope": self.scope.value,
            "reason": self.reason,
            "by": self.by,
            "admission": self.admission,
            "boundary": self.boundary,
            "prefix_length": self.prefix_length,
            "suffix_head": self.suffix_head,
            "suffix_length": self.suffix_length,
        }

    @classmethod
    def parse(cls, f: Fields) -> RewindPlan:
        scope = f.str("scope")
        if scope not in {s.value for s in RewindScope}:
            f.fail(f.name("scope"), f"unknown rewind scope {scope!r}")
        plan = cls(
            to_generation=f.int("to_generation", minimum=1),
            from_generation=f.int("from_generation", minimum=1),
            target=EnvironmentState.parse(f.obj("target")),
            context_digest=f.str("context_digest"),
            plan_cursor=f.int("plan_cursor"),
            scope=RewindScope(scope),
            reason=f.str("reason", nonempty=False),
            by=f.str("by"),
            admission=f.str("admission"),
            boundary=f.int("boundary"),
            prefix_length=f.int("prefix_length"),
            suffix_head=f.str("suffix_head"),
            suffix_length=f.int("suffix_length"),
        )
        f.done()
        return plan


def crossed_effects(entries: list[LedgerEntry], boundary: int) -> list[dict[str, JSONValue]]:
    """Every effect with a ledger entry beyond the rewind point, at its latest status.

    ``boundary`` is the ledger length at the rewind point. An effect only
    *intended* there (never dispatched) did not cross: nothing left.
    """
    latest: dict[str, LedgerEntry] = {}
    first: dict[str, LedgerEntry] = {}
    for entry in entries:
        if entry.seq <= boundary:
            continue
        first.setdefault(entry.idempotency_key, entry)
        latest[entry.idempotency_key] = entry
    crossed: list[dict[str, JSONValue]] = []
    for key, entry in latest.items():
        if entry.status is EffectStatus.INTENDED:
            continue
        terms = entry.terms or first[key].terms
        receipt = entry.receipt or {}
        crossed.append(
            {
                "idempotency_key": key,
                "action_id": entry.action_id,
                "intent_digest": entry.intent_digest,
                "status": entry.status.value,
                "adapter": None if terms is None else terms.adapter,
                "kind": None if terms is None else terms.kind,
                "target": None if terms is None else terms.target,
                "retry": None if terms is None else terms.retry.value,
                "receipt_id": receipt.get("receipt_id")
                if isinstance(receipt.get("receipt_id"), str)
                else None,
                "epoch": entry.epoch,
            }
        )
    return crossed


def tried_in(suffix: list[TraceEvent]) -> list[dict[str, JSONValue]]:
    """What the failed suffix tried and how it went, bounded, from its trace."""
    tried: list[dict[str, JSONValue]] = []
    for event in suffix:
        if event.kind not in _TRIED:
            continue
        item: dict[str, JSONValue] = {"event": event.kind, "generation_seq": event.seq}
        for name in _KEPT_FIELDS:
            value = event.data.get(name)
            if isinstance(value, str):
                item[name] = value[-_TAIL:]
            elif isinstance(value, bool | int) or (value is None and name in event.data):
                item[name] = value
        tried.append(item)
    return tried[-TRIED_SHOWN:]


def rewind_memory(
    plan: RewindPlan,
    *,
    tried: list[dict[str, JSONValue]],
    crossed: list[dict[str, JSONValue]],
    undone: list[dict[str, JSONValue]],
) -> dict[str, JSONValue]:
    """What the agent is told after a rewind, alongside the retained prefix.

    ``crossed`` are the effects beyond the rewind point that the restore
    could not undo (a message, a ticket); ``undone`` the workspace writes the
    restore itself took back.
    """
    done = [c for c in crossed if c["status"] == "committed"]
    compensated = [c for c in crossed if c["status"] == "compensated"]
    unknown = [
        c for c in crossed if c["status"] in {EffectStatus.OUTCOME_UNKNOWN, EffectStatus.DISPATCHED}
    ]
    return {
        "rewound_to_generation": plan.to_generation,
        "from_generation": plan.from_generation,
        "by": plan.by,
        "reason": plan.reason,
        "tried": list(tried),
        "effects_already_done": list(done),
        "effects_outcome_unknown": list(unknown),
        "effects_compensated": list(compensated),
        "workspace_writes_undone": list(undone),
        "note": (
            "The workspace and your context were restored to an earlier point. The effects "
            "listed as already done happened in the world and were NOT undone: do not repeat "
            "them (proposing one again returns its recorded receipt). Effects of unknown "
            "outcome need a person before they can be tried again. The workspace writes "
            "listed as undone were taken back by the restore."
        ),
    }


def with_memory(memory: dict[str, Any], entry: dict[str, JSONValue]) -> dict[str, Any]:
    """``memory`` with ``entry`` appended to its rewind memory (every rewind is kept)."""
    earlier = memory.get(REWIND_MEMORY_KEY)
    kept = list(earlier) if isinstance(earlier, list) else []
    return {**memory, REWIND_MEMORY_KEY: [*kept, entry]}
