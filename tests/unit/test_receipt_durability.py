"""When a receipt's commit must be durable: the table in ``tether.core._settle``, and the deferred seal.

A receipt of the step's own send rides on the run's next commit (``deferred``)
exactly where the adapter settles "sent, receipt not persisted" by key without
a person: idempotent, or queryable with final absence; never for a look-up's
receipt, an approved write or a compensation. Every other transition is durable
at once.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tests._states import pending_state, pending_write
from tether.core import (
    Capabilities,
    CheckpointCorruptError,
    EffectStatus,
    EnvironmentState,
    Intent,
    Phase,
    Receipt,
    RunState,
    format_time,
)
from tether.core import _settle as settle_rules
from tether.core._commit import at_rest, deferred, rest_point, rewind_point, seal_commit
from tether.core._terms import SentTerms, settling_capabilities
from tether.core._transition import (
    Durability,
    Execute,
    ExecuteAnswer,
    ExecuteStatus,
    Facts,
    LookupAnswer,
    LookupStatus,
)

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
PRE = EnvironmentState("ns", "inst", 3, "sha256:" + "a" * 64)
POST = EnvironmentState("ns", "inst", 4, "sha256:" + "b" * 64)
INTENT = Intent("file.write", "a.txt", {"content": "x"}, "low")
KEY = "idem-1"

CAPS = [
    Capabilities(
        idempotent=i,
        queryable=q,
        conditional_writes=False,
        fencing=False,
        absent_is_final=f,
        retention_s=r,
    )
    for i, q, f in itertools.product([False, True], repeat=3)
    for r in (None, 86_400.0)
]


def receipt() -> Receipt:
    return Receipt(
        namespace="ns",
        adapter_version="1",
        receipt_id="rcpt-1",
        idempotency_key=KEY,
        intent_digest=INTENT.digest,
        result={"ok": True},
        business_object_id="a.txt",
        committed_at=format_time(NOW - timedelta(seconds=1)),
        post_state=POST,
    )


def facts(caps: Capabilities, *, approval: bool = False) -> Facts:
    return Facts(
        now=NOW,
        live=PRE,
        needs_approval=approval,
        case_id="case-1",
        capabilities=caps,
        namespace="ns",
    )


def dispatched(*, approved: bool = False) -> RunState:
    approvals: tuple[dict[str, object], ...] = ()
    if approved:
        body = {
            "state_fingerprint": PRE.state_fingerprint,
            "environment_instance_id": PRE.instance_id,
            "expires_at": format_time(NOW + timedelta(minutes=5)),
            "nonce": "n" * 16,
        }
        approvals = ({"body": body},)
    pending = pending_write(
        INTENT,
        prestate=PRE,
        expected_post=POST,
        at=NOW,
        status=EffectStatus.DISPATCHED,
        approvals=approvals,
    )
    return pending_state(pending, at=NOW)


def settles_by_key(caps: Capabilities) -> bool:
    """The table's adapter column, restated: it dedups, or its look-up's absence is final, for ever."""
    by_key = caps.idempotent or (caps.queryable and caps.absent_is_final)
    return by_key and caps.retention_s is None


@pytest.mark.parametrize("caps", CAPS, ids=repr)
@pytest.mark.parametrize("fresh", [True, False])
@pytest.mark.parametrize("approved", [False, True])
@pytest.mark.parametrize("undoes", [False, True])
def test_receipt_durability_follows_the_table(
    caps: Capabilities, fresh: bool, approved: bool, undoes: bool
) -> None:
    """Deferred only for this step's own send, unapproved, not a compensation, on an adapter that settles by key."""
    got = settle_rules.receipt_durability(caps, fresh=fresh, approved=approved, undoes=undoes)
    expected = fresh and not approved and not undoes and settles_by_key(caps)
    assert got is (Durability.DEFERRED if expected else Durability.NOW)


@pytest.mark.parametrize("caps", CAPS, ids=repr)
@pytest.mark.parametrize("approval", [False, True])
def test_an_executed_receipt_is_deferred_only_where_the_table_says(
    caps: Capabilities, approval: bool
) -> None:
    """after_execute's advance carries the table's durability; the state and ledger are the same either way."""
    state = dispatched(approved=approval)
    call = Execute(KEY, INTENT, PRE, retry=False)
    answer = ExecuteAnswer(ExecuteStatus.COMMITTED, receipt())
    t = settle_rules.after_execute(state, facts(caps, approval=approval), call, answer)
    assert t.state is not None and t.state.pending is None
    assert [n.status for n in t.ledger] == [EffectStatus.COMMITTED]
    deferrable = settles_by_key(caps) and not approval
    assert t.durability is (Durability.DEFERRED if deferrable else Durability.NOW)
    assert t.durable is not deferrable  # durable now, or with the run's next commit


SENT = [
    SentTerms(idempotent=i, queryable=q, absent_is_final=f)
    for i, q, f in itertools.product([None, False, True], repeat=3)
]


@pytest.mark.parametrize("caps", CAPS, ids=repr)
@pytest.mark.parametrize("sent", SENT, ids=repr)
def test_a_receipt_waits_only_where_the_terms_it_was_sent_under_settle_it_by_key(
    caps: Capabilities, sent: SentTerms
) -> None:
    """A write whose earlier sends were made under weaker terms than today's is settled under those, so its receipt is durable at once unless they settle it by key."""
    state = dispatched()
    call = Execute(KEY, INTENT, PRE, retry=True)
    answer = ExecuteAnswer(ExecuteStatus.COMMITTED, receipt())
    t = settle_rules.after_execute(state, replace(facts(caps), sent_under=sent), call, answer)
    assert t.state is not None and t.state.pending is None
    deferrable = settles_by_key(settling_capabilities(caps, sent))
    assert t.durability is (Durability.DEFERRED if deferrable else Durability.NOW)
    if sent.idempotent is False and sent.absent_is_final is False:
        assert t.durability is Durability.NOW  # nothing recovery could settle by key


@pytest.mark.parametrize("caps", CAPS, ids=repr)
def test_a_receipt_read_back_by_a_look_up_is_committed_at_once(caps: Capabilities) -> None:
    """A recovery's reconcile (nothing sent this step) is durable before anything else happens."""
    caps = replace(caps, queryable=True)
    answer = LookupAnswer(LookupStatus.COMMITTED, receipt())
    t = settle_rules.after_lookup(dispatched(), facts(caps), answer)
    assert t.state is not None and t.events[0][0] == "effect_reconciled"
    assert t.durability is Durability.NOW


@pytest.mark.parametrize("caps", CAPS, ids=repr)
@pytest.mark.parametrize(
    "answer",
    [
        ExecuteAnswer(ExecuteStatus.PRECONDITION_FAILED, detail="changed"),
        ExecuteAnswer(ExecuteStatus.UNAVAILABLE, detail="down"),
        ExecuteAnswer(
            ExecuteStatus.CONFLICT,
            replace(receipt(), intent_digest="sha256:" + "d" * 64),
            "other intent",
        ),
    ],
    ids=["precondition", "unavailable", "conflict"],
)
def test_only_an_advance_is_ever_deferred(caps: Capabilities, answer: ExecuteAnswer) -> None:
    """A rejection, a freeze or a wait is durable at once (or commits nothing)."""
    call = Execute(KEY, INTENT, PRE, retry=False)
    t = settle_rules.after_execute(dispatched(), facts(caps), call, answer)
    assert t.durability is Durability.NOW


def test_a_deferred_seal_keeps_the_generation_and_chains_its_rows() -> None:
    """The deferred state pins its events and entries at the old generation; the next seal takes the next one."""
    before = dispatched()
    call = Execute(KEY, INTENT, PRE, retry=False)
    caps = Capabilities(idempotent=True, queryable=True, conditional_writes=False)
    t = settle_rules.after_execute(
        before,
        facts(caps),
        call,
        ExecuteAnswer(ExecuteStatus.COMMITTED, receipt()),
    )
    assert t.state is not None and t.durability is Durability.DEFERRED
    effect = before.pending
    sealed = seal_commit(before, t.state, t.events, now=NOW, ledger=t.ledger, effect=effect)
    held = deferred(sealed, before)
    assert held.state.generation == before.generation
    assert held.state.ledger_head == sealed.entries[-1].hash
    assert held.state.trace_head == sealed.events[-1].hash
    assert held.state.ledger_length == before.ledger_length + 1
    following = seal_commit(held.state, held.state, [("agent_waited", {})], now=NOW)
    assert following.state.generation == before.generation + 1
    assert following.events[0].prev_hash == held.state.trace_head
    with pytest.raises(CheckpointCorruptError):
        deferred(held, before)


def test_the_carrying_commit_records_the_rest_point_its_rewind_goes_back_to() -> None:
    """A commit not at rest that carries a receipt records the state at rest after it; the next commit does not keep it."""
    before = dispatched()
    caps = Capabilities(idempotent=True, queryable=True, conditional_writes=False)
    t = settle_rules.after_execute(
        before, facts(caps), Execute(KEY, INTENT, PRE, retry=False), answer_committed()
    )
    assert t.state is not None
    carried = deferred(
        seal_commit(before, t.state, t.events, now=NOW, ledger=t.ledger, effect=before.pending),
        before,
    ).state
    assert at_rest(carried) and carried.environment == POST
    waiting = carried.evolve(agent_context_digest="sha256:" + "e" * 64, plan_cursor=7)
    assert rest_point(carried, waiting) is None  # at rest itself: its own rewind point
    nxt = pending_write(
        INTENT, prestate=POST, expected_post=PRE, at=NOW, key="idem-2", action_id="a2"
    )
    pending_next = waiting.evolve(phase=Phase.PENDING, pending=nxt)
    point = rest_point(carried, pending_next)
    assert point is not None
    assert (point.environment, point.trace_length, point.ledger_length) == (
        POST,
        carried.trace_length,
        carried.ledger_length,
    )
    sealed = seal_commit(carried, pending_next, [("intent_persisted", {})], now=NOW, rest=point)
    assert sealed.state.rest == point and not at_rest(sealed.state)
    back = rewind_point(sealed.state)
    assert at_rest(back) and back.environment == POST
    assert (back.trace_head, back.ledger_head) == (carried.trace_head, carried.ledger_head)
    assert back.agent_context_digest == carried.agent_context_digest
    assert back.generation == sealed.state.generation
    after = seal_commit(sealed.state, sealed.state, [], now=NOW)
    assert after.state.rest is None  # recorded by the commit that carried it, never again
    assert rewind_point(carried) is carried


def answer_committed() -> ExecuteAnswer:
    return ExecuteAnswer(ExecuteStatus.COMMITTED, receipt())
