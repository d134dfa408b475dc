"""Hand-built run states for the unit tests of the pure rules, built in one place.

A table test of a rule that settles or judges a held action needs a run at
some generation holding that action; each test says only what its cells are
about (the action's status, its approvals, the run's spending) and takes the
rest from here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tether.core import (
    Binding,
    EffectStatus,
    EnvironmentState,
    Intent,
    PendingWrite,
    Phase,
    RunState,
    Spent,
)
from tether.core._state import GENESIS_HASH

#: The task and policy the hand-built runs are bound to.
BINDING = Binding("t1", "1", "f", "p1", "1", "f", "s")


def pending_write(
    intent: Intent,
    *,
    prestate: EnvironmentState,
    expected_post: EnvironmentState,
    at: datetime,
    status: EffectStatus = EffectStatus.INTENDED,
    key: str = "idem-1",
    action_id: str = "a1",
    cost: int = 0,
    mutating: bool = True,
    approvals: tuple[dict[str, Any], ...] = (),
) -> PendingWrite:
    """``intent`` held as action ``action_id`` under ``key``, proposed ``at`` generation 2."""
    return PendingWrite(
        action_id=action_id,
        intent=intent,
        intent_digest=intent.digest,
        idempotency_key=key,
        prestate=prestate,
        expected_post=expected_post,
        generation=2,
        proposed_at=at,
        cost=cost,
        status=status,
        approvals=approvals,
        mutating=mutating,
    )


def pending_state(pending: PendingWrite, *, at: datetime, **changes: Any) -> RunState:
    """A run at generation 2, phase pending, holding ``pending`` in its prestate.

    ``changes`` set any other field (``spent``, ``policy_change``, ...).
    """
    env = pending.prestate
    state = RunState(
        run_id="r1",
        generation=2,
        epoch=1,
        worker="w",
        binding=BINDING,
        phase=Phase.PENDING,
        stop_reason=None,
        started_at=at,
        updated_at=at,
        plan_cursor=0,
        agent_context_digest="sha256:" + "0" * 64,
        spent=Spent(),
        environment=env,
        adapter_version="1",
        observed_version=env.version,
        pending=pending,
        last_write=None,
        writes_committed=0,
        verification=None,
        review_cases=(),
        quarantined_keys=(),
        trace_head=GENESIS_HASH,
        trace_length=0,
        ledger_head=GENESIS_HASH,
        ledger_length=0,
    )
    return state.evolve(**changes) if changes else state
