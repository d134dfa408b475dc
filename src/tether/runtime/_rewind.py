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

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tether.adapters import capabilities_of, offers_snapshots
from tether.core import (
    EffectRef,
    EffectStatus,
    EnvironmentDriftError,
    LedgerNote,
    Outcome,
    OutcomeKind,
    Phase,
    Purpose,
    RewindPlan,
    RewindRefusedError,
    RewindScope,
    SplitRewindError,
    crossed_effects,
    rewind_memory,
    step_rules,
    tried_in,
    with_memory,
)
from tether.runtime._admit import admit

if TYPE_CHECKING:
    from tether.runtime._session import RunSession


def rewind(
    session: RunSession,
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
    a write still pending, no snapshot of that workspace) and
    :class:`~tether.core.SplitRewindError` (files or context alone, without
    a signed decision that records the split on purpose; traced).
    """
    rt = session.rt
    state = session.state
    if isinstance(document, dict) and isinstance(document.get("body"), dict):
        body = document["body"]  # the signature is checked by admission, against these
        to = body.get("target_generation") if isinstance(body.get("target_generation"), int) else to
        reason = body.get("reason") if isinstance(body.get("reason"), str) else reason
        scope = body.get("scope") if isinstance(body.get("scope"), str) else scope
    try:
        scope = RewindScope(scope)
    except ValueError:
        raise RewindRefusedError(
            f"run {state.run_id}: unknown rewind scope {scope!r}; use aligned, files or context",
            run_id=state.run_id,
        ) from None
    if to is None:
        raise RewindRefusedError(f"run {state.run_id}: name a generation to rewind to")
    _refuse_unless_running(state)
    target, _ = rt.checkpointer.at_generation(state, to)
    if scope is not RewindScope.CONTEXT:
        _refuse_without_snapshot(session, target)
    if scope is not RewindScope.ALIGNED and document is None:
        # Context and workspace would point at different causal positions.
        context_env = (target if scope is RewindScope.CONTEXT else state).environment
        workspace_env = (state if scope is RewindScope.CONTEXT else target).environment
        message = (
            f"run {state.run_id}: a {scope.value}-only rewind to generation {to} leaves the "
            f"context having observed version {context_env.version} and the workspace at "
            f"version {workspace_env.version}; only a signed decision may split them"
        )
        session.commit(
            state,
            [
                (
                    "rewind_refused",
                    {
                        "to_generation": to,
                        "scope": scope.value,
                        "reason": "split",
                        "message": message,
                    },
                )
            ],
        )
        raise SplitRewindError(
            message,
            run_id=state.run_id,
            context_env=context_env.to_json(),
            workspace_env=workspace_env.to_json(),
        )
    admitted = admit(
        rt,
        state,
        checkpoint_digest=session.digest or "",
        document=document,
        purpose=Purpose.REWIND,
        target_generation=to,
        reason=reason,
        scope=scope.value,
    )
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
    started = state.evolve(
        epoch=state.epoch + 1, worker=rt.worker, rewinding=plan, **admitted.changes
    )
    # Signed while the run was down, the rewind names the checkpoint at the mark
    # and the interrupted epoch: it opens the new epoch itself, and the
    # recovery's own facts travel inside its event.
    recovered = session.take_opening()
    event = {
        **admitted.event,
        **({} if recovered is None else {"recovered": recovered}),
        "to_generation": to,
        "from_generation": state.generation,
        "scope": scope.value,
        "reason": reason,
        "previous_epoch": state.epoch,
    }
    session.commit(started, [("rewind_started", event)], blobs={admitted.digest: admitted.body})
    return finish(session)


def finish(session: RunSession) -> Outcome:
    """Restore the workspace as the checkpointed plan says and commit the rewound state."""
    rt = session.rt
    state = session.state
    plan = state.rewinding
    if plan is None:
        raise RewindRefusedError(f"run {state.run_id}: no rewind under way", run_id=state.run_id)
    fence = session.guard()  # a worker whose lease moved on restores nothing
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
    checkpointer = rt.checkpointer
    # Everything the failed suffix tried, up to the moment the rewind was admitted.
    suffix = [
        e
        for e in checkpointer.verified_trace(state)
        if plan.prefix_length < e.seq <= plan.suffix_length
    ]
    beyond = crossed_effects(checkpointer.verified_ledger(state), plan.boundary)
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
    context = replace(base, memory=with_memory(base.memory, memory), plan_cursor=cursor)
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
    session.commit(rewound, [("rewound", event)], context=context, ledger=notes)
    session.actions = step_rules.actions_taken(checkpointer.verified_trace(session.state))
    return Outcome(OutcomeKind.RECORDED, session.state, "rewound", plan.reason, "rewound")


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def snapshot_blobs(rt: Any, root: str) -> dict[str, bytes] | None:
    """The snapshot blobs of the workspace at ``root`` the store lacks (``None``: it moved on)."""
    store = rt.store
    try:
        return dict(rt.adapter.snapshot_blobs(root, store.has_blob))
    except EnvironmentDriftError:
        return None  # the tree is no longer at root; a rewind here will say "no snapshot"


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


def _refuse_without_snapshot(session: RunSession, target: Any) -> None:
    rt = session.rt
    root = target.environment.state_fingerprint
    if not offers_snapshots(rt.adapter):
        raise RewindRefusedError(
            f"run {target.run_id}: the adapter keeps no snapshots; its workspace cannot be "
            "rewound (a context-only rewind needs a signed split)",
            run_id=target.run_id,
        )
    if not rt.store.has_blob(root):
        raise RewindRefusedError(
            f"run {target.run_id}: no snapshot of generation {target.generation}'s workspace "
            f"({root}) is stored",
            run_id=target.run_id,
        )
