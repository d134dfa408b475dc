"""What one checkpoint commit writes, computed from values: the sealed trace and ledger.

The session hands over the state before and after a step, the step's events
and ledger notes, and the clock reading; :func:`seal_commit` checks the
phase move and every effect-status move, chains the events onto the trace
and the notes onto the ledger, and returns the next generation's state
pinning both heads. The store then writes it all in one fenced transaction.

A commit whose durability is ``deferred`` (a receipt that may ride on the
run's next commit, see :class:`~tether.core.Durability`) is sealed the same
way and then :func:`deferred` keeps its state at the generation before: no
checkpoint is written for it; the next commit is sealed on top of it and its
store transaction writes the deferred rows with its own, as one generation.
That commit records the state at rest the deferred one left (:func:`rest_point`)
when it is not at rest itself, so every write step still leaves a rewind
point (:func:`rewind_point`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from tether.core._errors import CheckpointCorruptError, IllegalTransitionError
from tether.core._evidence import remember_replay_approval
from tether.core._ledger import EffectTerms, LedgerEntry, seal_entry
from tether.core._model import PendingWrite
from tether.core._phases import EffectStatus, Phase, check_effect_move, check_phase_move
from tether.core._rewind import RestPoint
from tether.core._state import RunState, working_ms
from tether.core._trace import TraceEvent, seal_event
from tether.core._transition import Event, LedgerNote


@dataclass(frozen=True, slots=True)
class Sealed:
    """A commit ready for the store: the new state, its trace events, its ledger entries."""

    state: RunState
    events: tuple[TraceEvent, ...]
    entries: tuple[LedgerEntry, ...]


def seal_commit(
    before: RunState,
    after: RunState,
    events: Iterable[Event],
    *,
    now: datetime,
    ledger: tuple[LedgerNote, ...] = (),
    effect: PendingWrite | None = None,
    terms: EffectTerms | None = None,
    resumed_at: datetime | None = None,
    rest: RestPoint | None = None,
) -> Sealed:
    """Seal ``after`` as the generation following ``before``.

    ``ledger`` notes record ``effect`` (the write pending before the step, or
    the one it makes pending) under ``terms`` (what kind of effect it is);
    an illegal phase or effect-status move raises
    :class:`~tether.core.IllegalTransitionError` and nothing is sealed.
    The working time since ``before`` (see :func:`~tether.core.working_ms`;
    ``resumed_at``: when this epoch began) is added to ``spent``. ``rest``:
    the rest point this commit records (:func:`rest_point`); none otherwise.
    """
    if before.generation:
        check_phase_move(before.phase, after.phase)
        pending = before.pending
        if after.phase is Phase.COMPLETED and pending is not None and pending.mutating:
            # pending -> completed exists for a held finish only; a write settles first.
            raise IllegalTransitionError("a pending write cannot complete the run")
    head, length = before.trace_head, before.trace_length
    sealed: list[TraceEvent] = []
    for kind, data in events:
        event = seal_event(after.run_id, length + 1, kind, now, data, head)
        sealed.append(event)
        head, length = event.hash, length + 1
    entries: list[LedgerEntry] = []
    ledger_head, ledger_length = before.ledger_head, before.ledger_length
    if ledger:
        if effect is None and any(note.subject is None for note in ledger):
            raise CheckpointCorruptError("ledger notes without the effect they record")
        status = None if effect is None else _status(before, effect)
        for note in ledger:
            subject = note.subject
            if subject is not None:
                # Another effect's next status (a compensation's original): its
                # own last status, never the pending write's, judges the move.
                check_effect_move(subject.status, note.status)
                entry = seal_entry(
                    after.run_id,
                    ledger_length + 1,
                    ledger_head,
                    idempotency_key=subject.idempotency_key,
                    status=note.status,
                    action_id=subject.action_id,
                    intent_digest=subject.intent_digest,
                    receipt=note.receipt,
                    epoch=after.epoch,
                    at=now,
                    terms=subject.terms,
                )
                entries.append(entry)
                ledger_head, ledger_length = entry.hash, ledger_length + 1
                continue
            if effect is None:  # refused above; keeps the type checker honest
                raise CheckpointCorruptError("ledger notes without the effect they record")
            check_effect_move(status, note.status)
            status = note.status
            entry = seal_entry(
                after.run_id,
                ledger_length + 1,
                ledger_head,
                idempotency_key=effect.idempotency_key,
                status=note.status,
                action_id=effect.action_id,
                intent_digest=effect.intent_digest,
                receipt=note.receipt,
                epoch=after.epoch,
                at=now,
                terms=terms,
                # The arguments once, with the entry that makes the effect known.
                payload=dict(effect.intent.args) if note.status is EffectStatus.INTENDED else None,
            )
            entries.append(entry)
            ledger_head, ledger_length = entry.hash, ledger_length + 1
    if (
        effect is not None
        and effect.approvals
        and terms is not None
        and terms.effect is not None
        and any(note.subject is None and note.status is EffectStatus.COMMITTED for note in ledger)
    ):
        # The approval that let the effect happen lets its replay be answered while it lives.
        body = effect.approvals[-1].get("body")
        approval = body if isinstance(body, dict) else None
        after = remember_replay_approval(after, terms.effect, approval, now=now)
    worked = working_ms(before, now, resumed_at)
    spent = after.spent
    if worked:
        spent = replace(spent, wall_time_ms=spent.wall_time_ms + worked)
    state = after.evolve(
        generation=before.generation + 1,
        trace_head=head,
        trace_length=length,
        ledger_head=ledger_head,
        ledger_length=ledger_length,
        updated_at=max(now, after.started_at),
        spent=spent,
        rest=rest,
    )
    return Sealed(state, tuple(sealed), tuple(entries))


def noted_write(before: PendingWrite | None, after: PendingWrite | None) -> PendingWrite | None:
    """The write a step's ledger notes record when they name no ``subject``.

    The write pending before the step, unless the step makes another write
    pending (a new proposal; a compensation ordered for the write before,
    whose own notes then name it as their subject): then the new one.
    """
    if after is not None and (before is None or before.idempotency_key != after.idempotency_key):
        return after
    return before


def deferred(sealed: Sealed, before: RunState) -> Sealed:
    """``sealed`` (sealed on ``before``) as a commit that rides on the run's next one.

    Its events and entries are chained and its state pins them, but the state
    keeps ``before``'s generation: it is the base the next commit is sealed on
    (which takes the next generation and writes these rows with its own), never
    a checkpoint of its own.
    """
    if sealed.state.generation != before.generation + 1:
        raise CheckpointCorruptError("a deferred commit must be sealed on the state before it")
    return Sealed(sealed.state.evolve(generation=before.generation), sealed.events, sealed.entries)


def at_rest(state: RunState) -> bool:
    """Whether ``state`` is at rest: running, nothing pending, no rewind under way, no case open.

    Only such a state is a rewind point: one with a write pending has a context
    already past an effect whose workspace it does not yet hold.
    """
    return (
        state.phase is Phase.RUNNING
        and state.pending is None
        and state.rewinding is None
        and not state.review_cases
    )


def rest_point(carried: RunState, after: RunState) -> RestPoint | None:
    """What a commit carrying the deferred ``carried`` records of it: its state at rest.

    Recorded only when ``carried`` is at rest and ``after`` (the commit's own
    state) is not: a checkpoint at rest is its own rewind point.
    """
    if not at_rest(carried) or at_rest(after):
        return None
    return RestPoint(
        environment=carried.environment,
        context_digest=carried.agent_context_digest,
        plan_cursor=carried.plan_cursor,
        trace_head=carried.trace_head,
        trace_length=carried.trace_length,
        ledger_head=carried.ledger_head,
        ledger_length=carried.ledger_length,
    )


def rewind_point(checkpoint: RunState) -> RunState:
    """The state a rewind to ``checkpoint``'s generation goes back to.

    The checkpoint itself, or, where it is not at rest and carried a write's
    receipt, the state at rest it recorded (the write done, before the step
    this checkpoint took); a state that is neither stays as it is, and the
    rewind refuses it as not at rest.
    """
    rest = checkpoint.rest
    if rest is None or at_rest(checkpoint):
        return checkpoint
    return checkpoint.evolve(
        phase=Phase.RUNNING,
        pending=None,
        rewinding=None,
        review_cases=(),
        stop_reason=None,
        environment=rest.environment,
        agent_context_digest=rest.context_digest,
        plan_cursor=rest.plan_cursor,
        trace_head=rest.trace_head,
        trace_length=rest.trace_length,
        ledger_head=rest.ledger_head,
        ledger_length=rest.ledger_length,
        rest=None,
    )


def _status(before: RunState, effect: PendingWrite) -> EffectStatus | None:
    """The ledger's last status for ``effect`` as the signed state knows it."""
    current = before.pending
    if current is not None and current.idempotency_key == effect.idempotency_key:
        return current.status
    return None  # a write becoming pending: its first entry is `intended`


def with_subject_terms(
    notes: tuple[LedgerNote, ...], entries: Iterable[LedgerEntry]
) -> tuple[LedgerNote, ...]:
    """``notes`` whose subjects carry their effect's own terms, found in the verified ``entries``.

    A note about another effect (its ``compensated``) is recorded under that
    effect's terms, so every reader of the ledger (the replay rule above all)
    sees which effect moved.
    """
    terms: dict[str, EffectTerms] = {}
    for entry in entries:
        if entry.terms is not None:
            terms.setdefault(entry.idempotency_key, entry.terms)
    out: list[LedgerNote] = []
    for note in notes:
        subject = note.subject
        if subject is not None and subject.terms is None:
            found = terms.get(subject.idempotency_key)
            out.append(replace(note, subject=replace(subject, terms=found)))
        else:
            out.append(note)
    return tuple(out)
