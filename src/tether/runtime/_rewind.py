"""Aligned rewind in a session: admit, checkpoint the plan, restore, hand over the memory.

The rules (what crossed the boundary, what the agent is told) are pure, in
:mod:`tether.core._rewind`; this module does the I/O in the order that makes
a crash anywhere finishable:

1. admit the rewind (a person's signed document, or the agent where the
   policy's ``authority.rewind`` names it) and commit ``rewind_started`` with
   the plan: a new epoch begins here;
2. restore the workspace to the rewind point's content-addressed snapshot
   (the adapter writes only what differs, and doing it again is harmless);
3. commit ``rewound``: the rewind point's context with the rewind memory,
   the restored environment, the plan cleared.

A crash after 1 leaves the plan in the checkpoint; the next step (in this
process or after a recovery) does 2 and 3. Nothing is deleted: the mark, the
trace and the ledger only move forward, and the failed suffix stays in the
trace, linked from the ``rewound`` event.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import replace
from typing import Any

from tether.adapters import capabilities_of, missing_blobs, offers_snapshots
from tether.core import (
    AdapterUnavailableError,
    EffectStatus,
    EnvironmentDriftError,
    LeaseError,
    Outcome,
    OutcomeKind,
    OutcomeReason,
    Phase,
    Purpose,
    ReviewReason,
    RewindRefusedError,
    SplitRewindError,
    StoreUnavailableError,
    TetherError,
)
from tether.core._rewind import (
    REWIND_MEMORY_KEY,
    RewindPlan,
    RewindScope,
    crossed_effects,
    rewind_memory,
    tried_in,
    with_memory,
)
from tether.core._transition import EffectRef, LedgerNote
from tether.runtime import _stopping
from tether.runtime._admit import admit
from tether.runtime._view import Session


def rewind(
    session: Session,
    to: int | None = None,
    reason: str = "",
    *,
    document: Any = None,
    scope: RewindScope | str = RewindScope.ALIGNED,
    cursor: int | None = None,
) -> Outcome:
    """Rewind the run to generation ``to`` (or as ``document``, a signed rewind, says).

    Raises :class:`~tether.core.AdmissionRefusedError` (who may not, or a
    stale document), :class:`~tether.core.RewindRefusedError` (no such point,
    a point that was not at rest, a write still pending, no snapshot of that
    workspace) and :class:`~tether.core.SplitRewindError` (files or context
    alone, without a signed decision that records the split on purpose;
    traced). ``cursor`` is the inbox entry the document came by.
    """
    rt = session.rt
    session.land_deferred()  # the rewind reads the run's past by the state's heads
    state = session.state
    if isinstance(document, dict) and isinstance(document.get("body"), dict):
        to, reason, scope = _as_signed(state, document["body"], to, reason, scope)
    try:
        scope = RewindScope(scope)
    except ValueError:
        raise RewindRefusedError(
            f"run {state.run_id}: unknown rewind scope {scope!r}; use aligned, files or context",
            run_id=state.run_id,
        ) from None
    if not isinstance(to, int) or isinstance(to, bool):
        raise RewindRefusedError(
            f"run {state.run_id}: name a generation to rewind to", run_id=state.run_id
        )
    _refuse_unless_running(state)
    target, _ = rt.checkpointer.at_generation(state, to)
    if scope is not RewindScope.CONTEXT:
        _refuse_without_snapshot(session, target)
    # Who asks comes first: nobody without the authority to rewind can make
    # the run record anything, a refusal included.
    admitted = admit(
        rt,
        state,
        checkpoint_digest=session.digest or "",
        document=document,
        purpose=Purpose.REWIND,
        target_generation=to,
        reason=reason,
        scope=scope.value,
        secrets_released=session.release_secrets,
    )
    if scope is not RewindScope.ALIGNED and document is None:
        _refuse_split(session, target, to, scope)
    plan = RewindPlan(
        to_generation=to,
        from_generation=state.generation,
        target=target.environment,
        context_digest=target.agent_context_digest,
        plan_cursor=target.plan_cursor,
        scope=scope,
        reason=reason,
        by=str(admitted.event["principal"]),
        admission=admitted.digest,
        boundary=target.ledger_length,
        prefix_length=target.trace_length,
        suffix_head=state.trace_head,
        suffix_length=state.trace_length,
    )
    # Signed while the run was down, the rewind names the checkpoint at the mark
    # and the interrupted epoch: it opens the new epoch itself, and the
    # recovery's own facts (and its admission record) travel with it.
    recovered, recovered_blobs = session.take_opening()
    started = state.evolve(
        epoch=state.epoch + 1,
        worker=rt.worker,
        rewinding=plan,
        inbox_cursor=state.inbox_cursor if cursor is None else max(state.inbox_cursor, cursor),
        **admitted.changes,
    )
    event = {
        **admitted.event,
        **({} if recovered is None else {"recovered": recovered}),
        "to_generation": to,
        "from_generation": state.generation,
        "scope": scope.value,
        "reason": reason,
        "previous_epoch": state.epoch,
    }
    session.commit(
        started,
        [("rewind_started", event)],
        blobs={**recovered_blobs, admitted.digest: admitted.body},
    )
    return finish(session)


def _as_signed(
    state: Any, body: dict[str, Any], to: Any, reason: str, scope: Any
) -> tuple[Any, str, Any]:
    """The target, reason and scope a signed rewind names; a caller's other values are refused."""
    signed = (body.get("target_generation"), body.get("reason"), body.get("scope"))
    asked = (to, reason or None, None if scope == RewindScope.ALIGNED else scope)
    for name, mine, theirs in zip(
        ("target generation", "reason", "scope"), asked, signed, strict=True
    ):
        if mine is not None and mine != theirs:
            raise RewindRefusedError(
                f"run {state.run_id}: the signed rewind names {name} {theirs!r}, the caller "
                f"asked for {mine!r}; a signed rewind is applied as signed or not at all",
                run_id=state.run_id,
            )
    return signed[0], signed[1] if isinstance(signed[1], str) else "", signed[2] or scope


def _refuse_split(session: Session, target: Any, to: int, scope: RewindScope) -> None:
    """Context and workspace would point at different causal positions: traced, refused."""
    state = session.state
    context_env = (target if scope is RewindScope.CONTEXT else state).environment
    workspace_env = (state if scope is RewindScope.CONTEXT else target).environment
    message = (
        f"run {state.run_id}: a {scope.value}-only rewind to generation {to} leaves the "
        f"context having observed version {context_env.version} and the workspace at "
        f"version {workspace_env.version}; only a signed decision may split them"
    )
    refused = {"to_generation": to, "scope": scope.value, "reason": "split", "message": message}
    session.commit(state, [("rewind_refused", refused)])
    raise SplitRewindError(
        message,
        run_id=state.run_id,
        context_env=context_env.to_json(),
        workspace_env=workspace_env.to_json(),
    )


def finish(session: Session) -> Outcome:
    """Restore the workspace as the checkpointed plan says and commit the rewound state."""
    rt = session.rt
    state = session.state
    plan = state.rewinding
    if plan is None:
        raise RewindRefusedError(f"run {state.run_id}: no rewind under way", run_id=state.run_id)
    fence = session.guard()  # a worker whose lease moved on restores nothing
    try:
        if plan.scope is RewindScope.CONTEXT:
            live = rt.adapter.environment()
        else:
            live = rt.adapter.restore_snapshot(  # type: ignore[attr-defined]
                plan.target.state_fingerprint, rt.store.get_blob, fence
            )
        if live.instance_id != state.environment.instance_id:
            raise RewindRefusedError(
                f"run {state.run_id}: the adapter now serves another environment instance",
                run_id=state.run_id,
            )
    except (AdapterUnavailableError, StoreUnavailableError, LeaseError, EnvironmentDriftError):
        # Passing (the workspace changed under the restore, too): the plan stays
        # and the next step restores again, which finishes the job.
        raise
    except TetherError as exc:
        return _abandon(session, plan, exc)
    checkpointer = rt.checkpointer
    # Everything the failed suffix tried, up to the moment the rewind was admitted.
    suffix = [
        e
        for e in checkpointer.verified_trace(state)
        if plan.prefix_length < e.seq <= plan.suffix_length
    ]
    ledger = checkpointer.verified_ledger(state)
    beyond = crossed_effects(ledger, plan.boundary)
    # Each note carries its effect's own terms, from the ledger read here once.
    terms = {e.idempotency_key: e.terms for e in reversed(ledger) if e.terms is not None}
    # Writes to the restored workspace were taken back by the restore itself:
    # the ledger says so (committed -> compensated), so none is ever replayed
    # as if it still held. Everything else crossed the boundary for good.
    restored = plan.scope is not RewindScope.CONTEXT
    undone = [
        c
        for c in beyond
        if restored
        and c["status"] == EffectStatus.COMMITTED.value
        and capabilities_of(rt.adapter, c["kind"] if isinstance(c["kind"], str) else None).stateful
    ]
    crossed = [c for c in beyond if c not in undone]
    notes = tuple(
        LedgerNote(
            EffectStatus.COMPENSATED,
            receipt={
                "compensated_by": "rewind",
                "admission": plan.admission,
                "restored_to": live.to_json(),
            },
            subject=EffectRef(
                _text(c["idempotency_key"]),
                _text(c["action_id"]),
                _text(c["intent_digest"]),
                EffectStatus.COMMITTED,
                terms.get(_text(c["idempotency_key"])),
            ),
        )
        for c in undone
    )
    memory = rewind_memory(plan, tried=tried_in(suffix), crossed=crossed, undone=undone)
    if plan.scope is RewindScope.FILES:
        base = session.context
        cursor = state.plan_cursor
    else:
        base = checkpointer.context(
            state.evolve(agent_context_digest=plan.context_digest),
            release=session.release_secrets,
        )
        cursor = plan.plan_cursor
    # Every rewind's memory is kept, also when this one goes back past an earlier one.
    earlier = session.context.memory.get(REWIND_MEMORY_KEY, [])
    kept = {**base.memory, REWIND_MEMORY_KEY: earlier if isinstance(earlier, list) else []}
    context = replace(base, memory=with_memory(kept, memory), plan_cursor=cursor)
    rewound = state.evolve(
        environment=live,
        observed_version=live.version,
        plan_cursor=cursor,
        results_digest=None,
        verification=None,
        rewinding=None,
    )
    event = {
        "to_generation": plan.to_generation,
        "from_generation": plan.from_generation,
        "scope": plan.scope.value,
        "by": plan.by,
        "reason": plan.reason,
        "admission": plan.admission,
        "environment": {"from": state.environment.to_json(), "to": live.to_json()},
        "crossed": list(crossed),
        "undone": list(undone),
        # The failed suffix stays in the chain; this is where it ended.
        "failed_suffix": {"trace_head": plan.suffix_head, "trace_length": plan.suffix_length},
        "prefix_length": plan.prefix_length,
    }
    # The workspace is now a tree this session did not snapshot: its next
    # snapshot asks the store what it holds.
    session.forget_snapshot()
    session.commit(rewound, [("rewound", event)], context=context, ledger=notes)
    session.reopen(session.state)  # ids of the suffix left behind are free again
    return Outcome(
        OutcomeKind.RECORDED, session.state, OutcomeReason.REWOUND, plan.reason, "rewound"
    )


def _abandon(session: Session, plan: RewindPlan, exc: Exception) -> Outcome:
    """A restore that cannot be done (a missing or damaged snapshot blob, a workspace in
    another state than the plan allows): in ONE commit the plan is dropped, traced, and
    the run frozen for a person, so no failure in between leaves it running unreviewed."""
    detail = f"{type(exc).__name__}: {exc}"[-500:]
    return _stopping.park(
        session,
        ReviewReason.REWIND_FAILED,
        f"the rewind to generation {plan.to_generation} could not restore the workspace "
        f"({detail}); nothing may have been restored, or part of it. Decide replan (go on "
        "from the workspace as it is) or abort.",
        (),
    )


def _accepts(method: Any, name: str) -> bool:
    # Asked at every snapshot: the answer is the function's, so it is kept per function.
    function = getattr(method, "__func__", None)
    if function is None:
        return _takes(method, name)
    try:
        return _takes_cached(function, name)
    except TypeError:  # an unhashable callable
        return _takes(function, name)


@functools.lru_cache(maxsize=64)
def _takes_cached(function: Any, name: str) -> bool:
    return _takes(function, name)


def _takes(function: Any, name: str) -> bool:
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def snapshot_blobs(
    rt: Any, root: str, known: set[str], *, since_known: bool = False
) -> dict[str, bytes] | None:
    """The snapshot blobs of the workspace at ``root`` the store lacks (``None``: it moved on).

    ``known`` holds digests this session saw committed: asked first, so an
    unchanged file beside a changed one costs no store round trip.
    ``since_known``: ``known`` holds what the session's last snapshot was
    made of, and the workspace moved on from it by the run's own steps; then
    the adapter's FIRST question (a flat tree's every digest, or a walked
    tree's root), if it names at most a handful of digests ``known`` lacks
    (what a step changed), is answered "new" without asking the store. Later
    questions (a walk's lower levels, whose unchanged subtrees this session
    may never have looked into) ask the store as before. A blob taken as new
    that the store did hold is sent with the commit and ignored there (blobs
    are shared by content): a few blobs sent twice, never a wrong answer.
    """
    store = rt.store
    first = [since_known]

    def trusted(unknown: list[str]) -> bool:
        trust, first[0] = first[0] and len(unknown) <= _NEW_WITHOUT_ASKING, False
        return trust

    def have(blob_digest: str) -> bool:
        held = blob_digest in known
        trust = trusted([] if held else [blob_digest])
        return held or (not trust and store.has_blob(blob_digest))

    def have_many(digests: list[str]) -> set[str]:
        unknown = [d for d in digests if d not in known]
        trust = trusted(unknown)
        found = store.stored_blobs(unknown) if unknown and not trust else set()
        known.update(found)  # a hint for the next snapshot of this session
        return {d for d in digests if d in known} | found

    method = rt.adapter.snapshot_blobs
    try:
        # An adapter written to the two-argument form still works.
        if _accepts(method, "have_many"):
            return dict(method(root, have, have_many=have_many))
        return dict(method(root, have))
    except EnvironmentDriftError:
        return None  # the tree is no longer at root; a rewind here will say "no snapshot"


#: At most this many digests a session has not seen are taken as new without asking
#: the store (see ``snapshot_blobs``): a step's write changes a file and the trees
#: above it; more than this (a checkout, a restore) is asked about.
_NEW_WITHOUT_ASKING = 8


def _refuse_unless_running(state: Any) -> None:
    phase = state.phase
    if state.rewinding is not None:
        raise RewindRefusedError(
            f"run {state.run_id}: a rewind is already under way; step the run to finish it",
            run_id=state.run_id,
        )
    if phase is Phase.RUNNING:
        return
    why = {
        Phase.PENDING: "a write is pending; settle it first (step the run)",
        Phase.NEEDS_REVIEW: "it is frozen for review; a signed decision opens it first",
    }.get(phase, "it is over")
    raise RewindRefusedError(
        f"run {state.run_id} is {phase}: cannot rewind, {why}", run_id=state.run_id
    )


def _refuse_without_snapshot(session: Session, target: Any) -> None:
    """Refuse, before anything is committed, a target whose snapshot is not whole in the store."""
    rt = session.rt
    root = target.environment.state_fingerprint
    if not offers_snapshots(rt.adapter):
        raise RewindRefusedError(
            f"run {target.run_id}: the adapter keeps no snapshots; its workspace cannot be "
            "rewound (a context-only rewind needs a signed split)",
            run_id=target.run_id,
        )
    store = rt.store
    missing = missing_blobs(root, store.get_blob, store.stored_blobs)
    if missing:
        raise RewindRefusedError(
            f"run {target.run_id}: the snapshot of generation {target.generation}'s workspace "
            f"({root}) is not whole in the store: {len(missing)} blob(s) missing, e.g. "
            f"{missing[0]}",
            run_id=target.run_id,
        )
