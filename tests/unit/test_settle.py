"""The settle rules, exhaustively: every cell of the table in ``tether.core._settle``.

Each cell combines the adapter's capabilities (idempotent x queryable x
conditional x fencing), the signed status of the pending write, the
adapter's answer, the approval state and the live environment. The
expected outcome of each cell is written here a second time, as a plain
restatement of the table, so the two must agree everywhere.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests._states import pending_state, pending_write
from tether.core import (
    Capabilities,
    EffectStatus,
    EnvironmentState,
    Intent,
    OutcomeKind,
    Phase,
    Receipt,
    RunState,
    format_time,
)
from tether.core import _settle as settle_rules
from tether.core._payload import validate_state
from tether.core._transition import (
    Execute,
    ExecuteAnswer,
    ExecuteStatus,
    Facts,
    Lookup,
    LookupAnswer,
    LookupStatus,
    Transition,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
PRE = EnvironmentState("ns", "inst", 3, "sha256:" + "a" * 64)
POST = EnvironmentState("ns", "inst", 4, "sha256:" + "b" * 64)
OTHER = EnvironmentState("ns", "inst", 4, "sha256:" + "c" * 64)
INTENT = Intent("file.write", "a.txt", {"content": "x"}, "low")
KEY = "idem-1"

CAPS = [
    Capabilities(idempotent=i, queryable=q, conditional_writes=c, fencing=f)
    for i, q, c, f in itertools.product([False, True], repeat=4)
]
STATUSES = [EffectStatus.INTENDED, EffectStatus.DISPATCHED]
APPROVALS = ["not_needed", "valid", "missing", "expired"]
LIVES = {"prestate": PRE, "expected_post": POST, "other": OTHER}


def receipt(*, intent_digest: str | None = None, post: EnvironmentState = POST) -> Receipt:
    return Receipt(
        namespace="ns",
        adapter_version="1",
        receipt_id="rcpt-1",
        idempotency_key=KEY,
        intent_digest=intent_digest or INTENT.digest,
        result={"ok": True},
        business_object_id="a.txt",
        committed_at=format_time(NOW - timedelta(seconds=5)),
        post_state=post,
    )


def state_with(status: EffectStatus, approval: str) -> RunState:
    approvals: tuple[dict[str, Any], ...] = ()
    if approval in {"valid", "expired"}:
        expires = NOW + timedelta(minutes=5) if approval == "valid" else NOW - timedelta(seconds=1)
        approvals = (
            {
                "body": {
                    "state_fingerprint": PRE.state_fingerprint,
                    "environment_instance_id": PRE.instance_id,
                    "expires_at": format_time(expires),
                    "nonce": "n" * 16,
                }
            },
        )
    pending = pending_write(
        INTENT, prestate=PRE, expected_post=POST, at=NOW, status=status, approvals=approvals
    )
    return pending_state(pending, at=NOW)


def facts(caps: Capabilities, approval: str, live: EnvironmentState) -> Facts:
    return Facts(
        now=NOW,
        live=live,
        needs_approval=approval != "not_needed",
        case_id="case-1",
        capabilities=caps,
        namespace="ns",
    )


def gate_blocks(caps: Capabilities, approval: str, live: EnvironmentState) -> bool:
    """The approval gate, restated: needed and (missing, expired, or the world moved)."""
    if approval == "not_needed":
        return False
    if approval in {"missing", "expired"}:
        return True
    allowed = {PRE.state_fingerprint} | ({POST.state_fingerprint} if caps.idempotent else set())
    return live.state_fingerprint not in allowed


def summary(t: Transition) -> tuple[Any, ...]:
    """What a cell is judged by: outcome, reason, ledger statuses, the call, the next phase."""
    call: Any = None
    if isinstance(t.call, Lookup):
        call = "lookup"
    elif isinstance(t.call, Execute):
        call = ("execute", "retry" if t.call.retry else "first")
        if t.call.known_absent:
            call = ("execute", "retry", "known_absent")
    phase = None if t.state is None else t.state.phase
    return (t.outcome, t.reason, tuple(n.status for n in t.ledger), call, phase)


def check_committable(t: Transition) -> None:
    """Every state a rule returns passes the invariants a commit checks first."""
    if t.state is not None:
        validate_state(t.state)


WAIT = (OutcomeKind.WAITING_FOR_APPROVAL,)


@pytest.mark.parametrize("caps", CAPS, ids=repr)
@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("approval", APPROVALS)
@pytest.mark.parametrize("live_name", sorted(LIVES))
def test_settle_follows_the_table(
    caps: Capabilities, status: EffectStatus, approval: str, live_name: str
) -> None:
    """settle() picks the first move from the signed status alone, as the table says."""
    live = LIVES[live_name]
    t = settle_rules.settle(state_with(status, approval), facts(caps, approval, live))
    check_committable(t)
    got = summary(t)
    if status is EffectStatus.INTENDED:
        if gate_blocks(caps, approval, live):
            assert got[0] is OutcomeKind.WAITING_FOR_APPROVAL and t.state is None
        else:
            assert got == (
                OutcomeKind.EXECUTED,
                None,
                (EffectStatus.DISPATCHED,),
                ("execute", "first"),
                Phase.PENDING,
            )
            assert t.state is not None and t.state.pending is not None
            assert t.state.pending.status is EffectStatus.DISPATCHED
    elif caps.queryable:
        assert got == (OutcomeKind.IN_FLIGHT, None, (), "lookup", None)
    elif caps.idempotent:
        if gate_blocks(caps, approval, live):
            assert got[0] is OutcomeKind.WAITING_FOR_APPROVAL and t.state is None
        else:
            # A resend commits first that it is one: the ledger's second dispatch.
            resent = (EffectStatus.DISPATCHED,)
            assert got == (OutcomeKind.EXECUTED, None, resent, ("execute", "retry"), Phase.PENDING)
            assert t.state is not None and t.state.pending is not None
            assert t.state.pending.resent and t.state.pending.dispatched_at == NOW
    else:
        assert got == (
            OutcomeKind.FROZEN,
            "outcome_unknown",
            (EffectStatus.OUTCOME_UNKNOWN,),
            None,
            Phase.NEEDS_REVIEW,
        )


LOOKUPS = {
    "committed_same": LookupAnswer(LookupStatus.COMMITTED, receipt()),
    "committed_other": LookupAnswer(
        LookupStatus.COMMITTED, receipt(intent_digest="sha256:" + "d" * 64)
    ),
    "committed_other_post": LookupAnswer(LookupStatus.COMMITTED, receipt(post=OTHER)),
    "absent": LookupAnswer(LookupStatus.ABSENT),
    "in_progress": LookupAnswer(LookupStatus.IN_PROGRESS, detail="busy"),
    "unavailable": LookupAnswer(LookupStatus.UNAVAILABLE, detail="down"),
    "refused": LookupAnswer(LookupStatus.REFUSED, detail="400 title is required"),
    "inconclusive": LookupAnswer(LookupStatus.INCONCLUSIVE, detail="404 from no such route"),
}


@pytest.mark.parametrize("caps", [c for c in CAPS if c.queryable], ids=repr)
@pytest.mark.parametrize("final", [True, False])
@pytest.mark.parametrize("answer_name", sorted(LOOKUPS))
@pytest.mark.parametrize("approval", APPROVALS)
@pytest.mark.parametrize("live_name", sorted(LIVES))
def test_after_lookup_follows_the_table(
    caps: Capabilities, final: bool, answer_name: str, approval: str, live_name: str
) -> None:
    """after_lookup() acts on the adapter's answer; the ledger copy is never consulted."""
    caps = replace(caps, absent_is_final=final)
    live = LIVES[live_name]
    state = state_with(EffectStatus.DISPATCHED, approval)
    t = settle_rules.after_lookup(state, facts(caps, approval, live), LOOKUPS[answer_name])
    check_committable(t)
    got = summary(t)
    committed = (EffectStatus.COMMITTED,)
    if answer_name == "committed_same":
        if approval in {"missing"}:
            assert got == (
                OutcomeKind.FROZEN,
                "approval_boundary",
                committed,
                None,
                Phase.NEEDS_REVIEW,
            )
        elif approval == "expired":
            # Committed five seconds ago, inside an approval that expired one second ago.
            assert got == (OutcomeKind.REPLAYED, None, committed, None, Phase.RUNNING)
        else:
            assert got == (OutcomeKind.REPLAYED, None, committed, None, Phase.RUNNING)
            assert t.state is not None and t.state.writes_committed == 1
    elif answer_name == "committed_other":
        assert got == (OutcomeKind.FROZEN, "key_conflict", (), None, Phase.NEEDS_REVIEW)
    elif answer_name == "committed_other_post":
        assert got == (
            OutcomeKind.FROZEN,
            "receipt_mismatch",
            committed,
            None,
            Phase.NEEDS_REVIEW,
        )
    elif answer_name == "in_progress":
        assert got == (OutcomeKind.IN_FLIGHT, "in_flight", (), None, None)
    elif answer_name == "unavailable":
        assert got == (OutcomeKind.RETRY_LATER, "adapter_unavailable", (), None, None)
    elif answer_name == "refused":
        assert got == (
            OutcomeKind.REJECTED,
            "refused",
            (EffectStatus.REJECTED,),
            None,
            Phase.RUNNING,
        )
    elif answer_name == "inconclusive" and caps.idempotent:
        # Never absence, final or not: resent only because a resend is safe.
        if gate_blocks(caps, approval, live):
            assert got[0] in WAIT and t.state is None
        else:
            assert got == (
                OutcomeKind.EXECUTED,
                None,
                (EffectStatus.DISPATCHED,),
                ("execute", "retry"),
                Phase.PENDING,
            )
    elif answer_name == "absent" and (final or caps.idempotent):
        if gate_blocks(caps, approval, live):
            assert got[0] in WAIT and t.state is None
        else:
            assert got == (
                OutcomeKind.EXECUTED,
                None,
                (EffectStatus.DISPATCHED,),
                ("execute", "retry", "known_absent") if final else ("execute", "retry"),
                Phase.PENDING,
            )
            assert t.state is not None and t.state.pending is not None
            assert t.state.pending.resent
    else:
        assert got == (
            OutcomeKind.FROZEN,
            "outcome_unknown",
            (EffectStatus.OUTCOME_UNKNOWN,),
            None,
            Phase.NEEDS_REVIEW,
        )


EXECUTES = {
    "committed": ExecuteAnswer(ExecuteStatus.COMMITTED, receipt()),
    "conflict": ExecuteAnswer(
        ExecuteStatus.CONFLICT, receipt(intent_digest="sha256:" + "d" * 64), "other intent"
    ),
    "precondition": ExecuteAnswer(ExecuteStatus.PRECONDITION_FAILED, detail="changed"),
    "in_progress": ExecuteAnswer(ExecuteStatus.IN_PROGRESS, detail="busy"),
    "unavailable": ExecuteAnswer(ExecuteStatus.UNAVAILABLE, detail="down"),
}


@pytest.mark.parametrize("caps", CAPS, ids=repr)
@pytest.mark.parametrize("retry", [False, True])
@pytest.mark.parametrize("answer_name", sorted(EXECUTES))
@pytest.mark.parametrize("approval", ["not_needed", "valid", "missing"])
def test_after_execute_follows_the_table(
    caps: Capabilities, retry: bool, answer_name: str, approval: str
) -> None:
    """after_execute() settles a send; a refused retry is unknown, never a silent rejection."""
    state = state_with(EffectStatus.DISPATCHED, approval)
    call = Execute(KEY, INTENT, PRE, retry=retry)
    t = settle_rules.after_execute(state, facts(caps, approval, PRE), call, EXECUTES[answer_name])
    check_committable(t)
    got = summary(t)
    if answer_name == "committed":
        # This step's own send returned it, first or again: executed, never "replayed".
        if approval == "missing":
            assert got[:3] == (OutcomeKind.FROZEN, "approval_boundary", (EffectStatus.COMMITTED,))
        else:
            executed = (OutcomeKind.EXECUTED, None, (EffectStatus.COMMITTED,), None, Phase.RUNNING)
            assert got == executed
            assert t.events[0][0] == "effect_committed"
    elif answer_name == "conflict":
        assert got == (OutcomeKind.FROZEN, "key_conflict", (), None, Phase.NEEDS_REVIEW)
    elif answer_name == "precondition":
        if retry:
            assert got[:3] == (
                OutcomeKind.FROZEN,
                "outcome_unknown",
                (EffectStatus.OUTCOME_UNKNOWN,),
            )
        else:
            assert got == (
                OutcomeKind.REJECTED,
                "precondition_failed",
                (EffectStatus.REJECTED,),
                None,
                Phase.RUNNING,
            )
    elif answer_name == "in_progress":
        assert got == (OutcomeKind.IN_FLIGHT, "in_flight", (), None, None)
    elif caps.blind:
        assert got[:3] == (
            OutcomeKind.FROZEN,
            "outcome_unknown",
            (EffectStatus.OUTCOME_UNKNOWN,),
        )
    else:
        assert got == (OutcomeKind.RETRY_LATER, "adapter_unavailable", (), None, None)


def test_a_freeze_keeps_the_pending_intent_and_opens_one_case() -> None:
    """A frozen state keeps the pending write, records the case and the live environment."""
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    caps = Capabilities(idempotent=False, queryable=False, conditional_writes=False)
    t = settle_rules.settle(state, facts(caps, "not_needed", OTHER))
    assert t.state is not None and t.state.pending is not None
    assert t.state.pending.idempotency_key == KEY
    assert t.state.pending.status is EffectStatus.OUTCOME_UNKNOWN
    (case,) = t.state.review_cases
    assert (case.case_id, case.reason, case.environment) == ("case-1", "outcome_unknown", OTHER)
    assert t.events[0][0] == "needs_review"


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("age", [10, 3601])
def test_a_key_past_the_adapters_retention_is_never_sent_again(idempotent: bool, age: int) -> None:
    """Absent after a look-up, or a dedup send: within retention it goes; past it, review."""
    caps = Capabilities(
        idempotent=idempotent, queryable=True, conditional_writes=False, retention_s=3600
    )
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    later = replace(facts(caps, "not_needed", PRE), now=NOW + timedelta(seconds=age))
    looked = settle_rules.after_lookup(state, later, LookupAnswer(LookupStatus.ABSENT))
    blind_caps = replace(caps, queryable=False)
    resent = settle_rules.settle(state, replace(later, capabilities=blind_caps))
    fresh = age <= 3600
    assert (summary(looked)[0] is OutcomeKind.EXECUTED) is fresh
    if idempotent:
        assert (summary(resent)[0] is OutcomeKind.EXECUTED) is fresh
    for t in (looked, resent) if idempotent else (looked,):
        if not fresh:
            assert t.reason == "outcome_unknown" and t.state is not None
            assert t.state.phase is Phase.NEEDS_REVIEW
            assert [n.status for n in t.ledger] == [EffectStatus.OUTCOME_UNKNOWN]


def test_a_look_up_carries_the_pending_intent() -> None:
    """The look-up a dispatched write asks for names its intent, for adapters that judge it."""
    caps = Capabilities(idempotent=False, queryable=True, conditional_writes=False)
    t = settle_rules.settle(
        state_with(EffectStatus.DISPATCHED, "not_needed"), facts(caps, "not_needed", PRE)
    )
    assert t.call == Lookup(KEY, INTENT)


@pytest.mark.parametrize("age", [60, 901])
@pytest.mark.parametrize("by", ["lookup", "execute"])
def test_a_key_in_flight_past_the_adapters_limit_goes_to_review(age: int, by: str) -> None:
    """In flight is waited out up to the limit, counted from dispatch; past it, review."""
    caps = Capabilities(
        idempotent=False, queryable=True, conditional_writes=False, in_flight_limit_s=900
    )
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    pending = state.pending
    assert pending is not None
    # Proposed long ago (it waited for a person), dispatched `age` seconds before now.
    state = state.evolve(
        pending=replace(
            pending, proposed_at=NOW - timedelta(days=2), dispatched_at=NOW - timedelta(seconds=age)
        )
    )
    f = facts(caps, "not_needed", PRE)
    if by == "lookup":
        t = settle_rules.after_lookup(
            state, f, LookupAnswer(LookupStatus.IN_PROGRESS, detail="busy")
        )
    else:
        call = Execute(KEY, INTENT, PRE, retry=True)
        t = settle_rules.after_execute(state, f, call, ExecuteAnswer(ExecuteStatus.IN_PROGRESS))
    check_committable(t)
    if age <= 900:
        assert summary(t) == (OutcomeKind.IN_FLIGHT, "in_flight", (), None, None)
    else:
        assert summary(t) == (
            OutcomeKind.FROZEN,
            "outcome_unknown",
            (EffectStatus.OUTCOME_UNKNOWN,),
            None,
            Phase.NEEDS_REVIEW,
        )
        assert t.state is not None and "in flight" in t.state.review_cases[0].detail


def test_dispatch_records_when_the_write_first_left() -> None:
    """The commit that says dispatched stamps the time the in-flight limit counts from."""
    caps = Capabilities(idempotent=True, queryable=True, conditional_writes=False)
    t = settle_rules.settle(
        state_with(EffectStatus.INTENDED, "not_needed"), facts(caps, "not_needed", PRE)
    )
    assert t.state is not None and t.state.pending is not None
    assert t.state.pending.dispatched_at == NOW
    doc = t.state.to_json()
    again = RunState.from_json(doc).pending
    assert again is not None and again.dispatched_at == NOW
    # A checkpoint written before the field existed still parses, with no time.
    del doc["pending"]["dispatched_at"]  # type: ignore[index, union-attr, attr-defined]
    older = RunState.from_json(doc).pending
    assert older is not None and older.dispatched_at is None


DEDUP = Capabilities(
    idempotent=False,
    queryable=True,
    conditional_writes=False,
    absent_is_final=True,
    in_flight_limit_s=900,
)


def test_the_in_flight_limit_counts_from_the_send_that_is_in_flight() -> None:
    """A resend made just now and answered 409 is waited for, however old the first send is."""
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    pending = state.pending
    assert pending is not None
    state = state.evolve(pending=replace(pending, dispatched_at=NOW - timedelta(minutes=20)))
    f = facts(DEDUP, "not_needed", PRE)
    again = settle_rules.after_lookup(state, f, LookupAnswer(LookupStatus.ABSENT))
    assert isinstance(again.call, Execute) and again.call.retry and again.state is not None
    t = settle_rules.after_execute(
        again.state, f, again.call, ExecuteAnswer(ExecuteStatus.IN_PROGRESS, detail="409")
    )
    assert t.outcome is OutcomeKind.IN_FLIGHT, t.message


@pytest.mark.parametrize("resent", [False, True])
def test_a_stored_refusal_is_a_rejection_only_for_a_write_sent_once(resent: bool) -> None:
    """Found refused after one send: rejected; after a resend: the same reading as a refused resend."""
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    pending = state.pending
    assert pending is not None
    state = state.evolve(pending=replace(pending, resent=resent))
    f = facts(DEDUP, "not_needed", PRE)
    by_lookup = settle_rules.after_lookup(
        state, f, LookupAnswer(LookupStatus.REFUSED, detail="4xx")
    )
    check_committable(by_lookup)
    if not resent:
        assert summary(by_lookup)[:3] == (OutcomeKind.REJECTED, "refused", (EffectStatus.REJECTED,))
        return
    resend = Execute(KEY, INTENT, PRE, retry=True, known_absent=True)
    by_execute = settle_rules.after_execute(
        state, f, resend, ExecuteAnswer(ExecuteStatus.PRECONDITION_FAILED, detail="4xx")
    )
    assert summary(by_lookup) == summary(by_execute)
    assert summary(by_lookup)[:2] == (OutcomeKind.FROZEN, "outcome_unknown")


def test_a_write_whose_absence_proves_nothing_is_sent_only_after_its_own_dispatch_commit() -> None:
    """Queryable but not final (a mailbox search): intended alone first, so a crash there sent nothing."""
    from tether.core import Proposal
    from tether.core import _steps as step_rules

    state = state_with(EffectStatus.DISPATCHED, "not_needed").evolve(
        phase=Phase.RUNNING, pending=None
    )
    proposal = Proposal(action_id="a2", kind="file.write", target="a.txt", args={"content": "x"})
    for caps, statuses in [
        (replace(DEDUP, absent_is_final=False), (EffectStatus.INTENDED,)),
        (DEDUP, (EffectStatus.INTENDED, EffectStatus.DISPATCHED)),
        (replace(DEDUP, queryable=False), (EffectStatus.INTENDED,)),
    ]:
        t = step_rules.propose_write(
            state,
            proposal,
            INTENT,
            key="k2",
            expected_post=POST,
            now=NOW,
            needs_approval=False,
            capabilities=caps,
        )
        assert tuple(n.status for n in t.ledger) == statuses, caps


@pytest.mark.parametrize("resent", [False, True])
def test_a_pending_write_reads_back_exactly_as_signed(resent: bool) -> None:
    """Every field of a pending write, 'resent' and 'dispatched_at' included, survives a checkpoint."""
    state = state_with(EffectStatus.DISPATCHED, "valid")
    pending = state.pending
    assert pending is not None
    state = state.evolve(pending=replace(pending, resent=resent, dispatched_at=NOW))
    assert RunState.from_json(state.to_json()) == state


# --- a repeated resend while the adapter stays down ---------------------------


def resent_state(ago_s: float, approval: str = "not_needed") -> RunState:
    """A dispatched write already signed as resent, its last recorded send ``ago_s`` before now."""
    state = state_with(EffectStatus.DISPATCHED, approval)
    pending = state.pending
    assert pending is not None
    when = NOW - timedelta(seconds=ago_s)
    return state.evolve(pending=replace(pending, resent=True, dispatched_at=when))


@pytest.mark.parametrize(
    ("caps", "resent", "ago", "records"),
    [
        (DEDUP, False, 0, True),  # the first resend: "resent" is durable before the call
        (DEDUP, True, 0, False),  # an identical resend moments later records nothing
        (DEDUP, True, 89, False),  # within a tenth of the 900 s in-flight limit
        (DEDUP, True, 90, True),  # a tenth old: refresh the time the limit counts from
        (replace(DEDUP, in_flight_limit_s=None), True, 10**6, False),  # nothing reads the time
    ],
)
def test_a_resend_commits_only_what_a_later_answer_needs(
    caps: Capabilities, resent: bool, ago: int, records: bool
) -> None:
    """Absent by key, sent again: the first resend commits; a recent identical one commits nothing."""
    state = resent_state(ago) if resent else state_with(EffectStatus.DISPATCHED, "not_needed")
    t = settle_rules.after_lookup(
        state, facts(caps, "not_needed", PRE), LookupAnswer(LookupStatus.ABSENT)
    )
    check_committable(t)
    assert isinstance(t.call, Execute) and t.call.retry and t.call.known_absent
    assert t.call.key == KEY and t.call.intent == INTENT
    if records:
        assert t.state is not None and t.state.pending is not None
        assert t.state.pending.resent and t.state.pending.dispatched_at == NOW
        assert tuple(n.status for n in t.ledger) == (EffectStatus.DISPATCHED,)
        assert [kind for kind, _ in t.events] == ["effect_resent"]
    else:
        assert (t.state, t.ledger, t.events) == (None, (), ())


def test_a_recent_repeat_resend_by_an_idempotent_adapter_records_nothing() -> None:
    """settle() on a resent write of an idempotent, unqueryable adapter sends again, uncommitted."""
    caps = Capabilities(idempotent=True, queryable=False, conditional_writes=False)
    t = settle_rules.settle(resent_state(5), facts(caps, "not_needed", PRE))
    assert summary(t) == (OutcomeKind.EXECUTED, None, (), ("execute", "retry"), None)
    assert t.state is None


def test_an_uncommitted_resend_still_passes_the_approval_gate() -> None:
    """A repeat resend of a gated write without a live approval waits; nothing is sent."""
    caps = Capabilities(idempotent=True, queryable=False, conditional_writes=False)
    t = settle_rules.settle(resent_state(5, approval="expired"), facts(caps, "expired", PRE))
    assert t.outcome is OutcomeKind.WAITING_FOR_APPROVAL and t.call is None and t.state is None


@pytest.mark.parametrize(
    ("how", "ok"),
    [("precondition", False), ("unavailable", True), ("in_progress", True)],
)
def test_an_uncommitted_resend_is_read_as_a_resend(how: str, ok: bool) -> None:
    """After a repeat resend the signed 'resent' still decides: a refusal is unknown, later waits."""
    state = resent_state(5)
    f = facts(DEDUP, "not_needed", PRE)
    again = settle_rules.after_lookup(state, f, LookupAnswer(LookupStatus.ABSENT))
    assert isinstance(again.call, Execute) and again.state is None
    answer = {
        "precondition": ExecuteAnswer(ExecuteStatus.PRECONDITION_FAILED, detail="412"),
        "unavailable": ExecuteAnswer(ExecuteStatus.UNAVAILABLE, detail="503"),
        "in_progress": ExecuteAnswer(ExecuteStatus.IN_PROGRESS, detail="409"),
    }[how]
    t = settle_rules.after_execute(state, f, again.call, answer)
    check_committable(t)
    if ok:
        assert t.outcome in {OutcomeKind.RETRY_LATER, OutcomeKind.IN_FLIGHT} and t.state is None
    else:
        assert (t.outcome, t.reason) == (OutcomeKind.FROZEN, "outcome_unknown")


@pytest.mark.parametrize(
    ("resent", "age", "stuck"),
    [
        (False, 900, False),
        (False, 901, True),  # sent once: the limit, exactly, from the signed send
        (True, 901, False),  # resent: a repeat may have begun up to 90 s later, unsigned
        (True, 990, False),
        (True, 991, True),
    ],
)
def test_a_resent_key_is_stuck_only_past_the_limit_plus_the_resend_margin(
    resent: bool, age: int, stuck: bool
) -> None:
    """An in-flight answer freezes a resent write only once no unsigned repeat can be under the limit."""
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    pending = state.pending
    assert pending is not None
    when = NOW - timedelta(seconds=age)
    state = state.evolve(pending=replace(pending, resent=resent, dispatched_at=when))
    t = settle_rules.after_lookup(
        state,
        facts(DEDUP, "not_needed", PRE),
        LookupAnswer(LookupStatus.IN_PROGRESS, detail="busy"),
    )
    assert t.outcome is (OutcomeKind.FROZEN if stuck else OutcomeKind.IN_FLIGHT)


# The approval boundary: which commit time the expiry is judged against.
# (receipt's committed_at, when the receipt reached the runtime) -> reconciled under it?
EXPIRES = NOW + timedelta(minutes=5)
BOUNDARY_TABLE = [
    # The receipt's own commit time decides where it has one.
    (EXPIRES - timedelta(seconds=1), EXPIRES + timedelta(hours=1), True),
    (EXPIRES, EXPIRES - timedelta(seconds=1), False),
    (EXPIRES + timedelta(seconds=1), EXPIRES - timedelta(seconds=1), False),
    # None (a function's body): received before the expiry bounds the commit inside it.
    (None, NOW, True),
    (None, EXPIRES - timedelta(microseconds=1), True),
    (None, EXPIRES, False),
    (None, EXPIRES + timedelta(days=1), False),
    # A commit time that is not a time proves nothing, whenever it was received.
    ("yesterday", NOW, False),
]


@pytest.mark.parametrize(("committed_at", "received_at", "inside"), BOUNDARY_TABLE)
def test_the_approval_boundary_uses_the_receipts_time_or_when_it_arrived(
    committed_at: datetime | str | None, received_at: datetime, inside: bool
) -> None:
    """A receipt without a commit time is bounded by its arrival: before the expiry, reconciled."""
    state = state_with(EffectStatus.DISPATCHED, "valid")
    text = (
        ""
        if committed_at is None
        else committed_at
        if isinstance(committed_at, str)
        else format_time(committed_at)
    )
    got = settle_rules.committed_within_approval(
        state, replace(receipt(), committed_at=text), received_at=received_at
    )
    assert (got is None) == inside, got
    executed = settle_rules.after_execute(
        state,
        replace(facts(CAPS[-1], "valid", POST), now=received_at),
        Execute(KEY, INTENT, PRE, retry=False),
        ExecuteAnswer(ExecuteStatus.COMMITTED, replace(receipt(), committed_at=text)),
    )
    want = OutcomeKind.EXECUTED if inside else OutcomeKind.FROZEN
    assert executed.outcome is want
