"""The people's view of runs and the documents they sign, checked as the runtime checks them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tether.core import (
    EvidenceSignatureError,
    Phase,
    PolicyError,
    TrustRootsRequiredError,
    UnknownSignerError,
    new_approval,
)
from tether.crypto import Signer, TrustRoots
from tether.runtime import (
    StaleViewError,
    deliver,
    list_runs,
    open_run,
    prepare_approval,
    prepare_cancel,
)

APPROVER = Signer.generate("amy", "approver")
REVIEWER = Signer.generate("rev", "reviewer")
STRANGER = Signer.generate("amy", "approver")  # same id, another key
TRUST = TrustRoots.of(APPROVER.trust_root(), REVIEWER.trust_root())
GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


@pytest.fixture
def guarded(world: World) -> World:
    world.policy = make_policy(kinds=GUARDED, approval_ttl_s=300)
    return world


def agent() -> ScriptedAgent:
    return ScriptedAgent([write("notes.txt", "v1\n", action_id="w1"), finish])


def waiting(world: World, run_id: str = "run-a") -> Any:
    """A run whose write waits for an approval, and its runtime."""
    rt = world.runtime(agent(), trust=TRUST)
    session = rt.start(run_id)
    session.step()
    if session.state.phase is not Phase.PENDING:
        raise RuntimeError(f"setup: the run is {session.state.phase}, not pending")
    return rt


def test_a_run_waiting_for_an_approval_is_listed_first_and_says_what_it_waits_for(
    guarded: World,
) -> None:
    """list_runs puts the run that needs a person before a running one and names the write."""
    waiting(guarded, "run-a")
    free = guarded.runtime(ScriptedAgent([finish]), policy=make_policy()).start("run-b")
    del free
    rows = list_runs(guarded.store(), now=guarded.clock.now())
    assert [r.run_id for r in rows] == ["run-a", "run-b"]
    first = rows[0]
    assert first.needs_person and first.phase == "pending"
    assert first.waiting_for is not None and "approval of w1" in first.waiting_for
    assert not rows[1].needs_person
    assert [r.run_id for r in list_runs(guarded.store(), needs_person=True)] == ["run-a"]
    assert [r.run_id for r in list_runs(guarded.store(), phase="running")] == ["run-b"]


def test_the_runs_policy_is_kept_in_the_store_for_the_tools_to_check_against(
    guarded: World,
) -> None:
    """open_run finds the run's own policy by its fingerprint, so a ttl check needs no file."""
    waiting(guarded)
    view = open_run(guarded.store(), "run-a", keyring=guarded.keyring)
    assert view.verified
    assert view.policy is not None and view.policy.fingerprint == guarded.policy.fingerprint


@pytest.mark.parametrize(
    ("signer", "options", "error"),
    [
        (REVIEWER, {}, PolicyError),  # a reviewer's key cannot approve
        (STRANGER, {"trust": TRUST}, EvidenceSignatureError),  # a trusted id, another key
        (Signer.generate("eve", "approver"), {"trust": TRUST}, UnknownSignerError),
        (APPROVER, {"ttl_s": -5}, PolicyError),
        (APPROVER, {"ttl_s": 0}, PolicyError),
        (APPROVER, {"ttl_s": 301}, PolicyError),  # over the stored policy's 300 s
        (APPROVER, {"seen_generation": 1}, StaleViewError),
    ],
)
def test_an_approval_the_runtime_would_refuse_is_refused_before_signing(
    guarded: World, signer: Signer, options: dict[str, Any], error: type[Exception]
) -> None:
    """Wrong role, untrusted key, bad ttl or a stale view: refused, and nothing is delivered."""
    waiting(guarded)
    store = guarded.store()
    view = open_run(store, "run-a", keyring=guarded.keyring, now=guarded.clock.now())
    with pytest.raises(error):
        prepare_approval(view, signer, "w1", now=guarded.clock.now(), **options)
    assert store.evidence("run-a") == []


def test_a_prepared_approval_is_accepted_by_the_runtime_and_the_write_happens(
    guarded: World,
) -> None:
    """What the tool checked and delivered, the runtime accepts: the run completes, one write."""
    rt = waiting(guarded)
    store = guarded.store()
    view = open_run(store, "run-a", keyring=guarded.keyring, now=guarded.clock.now())
    prepared = prepare_approval(
        view,
        APPROVER,
        "w1",
        now=guarded.clock.now(),
        trust=TRUST,
        seen_generation=view.state.generation,
    )
    assert prepared.shown["action_id"] == "w1" and "nonce" not in prepared.shown
    assert deliver(store, prepared, now=guarded.clock.now()) == 1
    assert open_run(store, "run-a").inbox[0].status == "waiting"
    session = rt.recover("run-a")
    while not session.state.phase.terminal:
        session.step()
    assert session.state.phase is Phase.COMPLETED
    assert guarded.sandbox.files["notes.txt"] == "v1\n"
    after = open_run(store, "run-a", keyring=guarded.keyring)
    assert [(i.seq, i.status) for i in after.inbox] == [(1, "applied")]
    assert not after.needs_person and after.waiting_for is None


def test_a_refused_document_shows_in_the_inbox_with_the_reason(guarded: World) -> None:
    """A document signed past the tools (an untrusted key) is refused by the run; the view says why."""
    rt = waiting(guarded)
    store = guarded.store()
    state = open_run(store, "run-a").state
    now = guarded.clock.now()
    body = new_approval(
        state, "eve", issued_at=now, expires_at=now + timedelta(seconds=60), nonce="n" * 32
    )
    store.put_evidence("run-a", "approval", Signer.generate("eve", "approver").sign(body))
    session = rt.recover("run-a")
    session.step()
    view = open_run(store, "run-a", keyring=guarded.keyring, now=guarded.clock.now())
    (item,) = view.inbox
    assert item.status == "refused" and item.signer == "eve"
    assert item.why is not None and "UnknownSignerError" in item.why
    assert view.needs_person  # still waiting for a valid approval


OPERATOR = Signer.generate("ops", "operator")
#: Roots a person names (--trust) where the run's own lack the operator.
WITH_OPERATOR = TrustRoots.of(APPROVER.trust_root(), OPERATOR.trust_root())


def test_a_cancel_is_refused_before_signing_unless_an_operator_signs_it(guarded: World) -> None:
    """An approver's key cannot cancel (the policy's authority.cancel names operators); an operator's ends the run."""
    rt = waiting(guarded)
    store = guarded.store()
    view = open_run(store, "run-a", keyring=guarded.keyring, now=guarded.clock.now())
    with pytest.raises(PolicyError):
        prepare_cancel(view, APPROVER, "not needed", now=guarded.clock.now())
    prepared = prepare_cancel(
        view,
        OPERATOR,
        "not needed",
        now=guarded.clock.now(),
        trust=TrustRoots.of(OPERATOR.trust_root()),
    )
    assert prepared.kind == "cancel" and prepared.shown["reason"] == "not needed"
    deliver(store, prepared, now=guarded.clock.now())
    session = world_recover(guarded, rt)
    assert session.state.phase is Phase.CANCELLED
    assert (
        "notes.txt" not in guarded.sandbox.files or guarded.sandbox.files["notes.txt"] == "draft\n"
    )


def world_recover(world: World, rt: Any) -> Any:
    """Recover the run under a runtime that trusts the operator too, and take one step."""
    trusting = world.runtime(
        agent(),
        trust=TrustRoots.of(APPROVER.trust_root(), REVIEWER.trust_root(), OPERATOR.trust_root()),
    )
    del rt
    session = trusting.recover("run-a")
    session.step()
    return session


def test_a_run_a_worker_holds_is_not_said_to_need_a_person(guarded: World) -> None:
    """A claim counts an attempt; only an attempt that ended in an error flags the run."""
    guarded.runtime(ScriptedAgent([finish]), policy=make_policy()).start("run-b")
    store = guarded.store()
    (lease,) = store.claim_expired("w-busy", 60)
    (row,) = list_runs(store)
    assert row.attempts == 1 and not row.needs_person and row.waiting_for is None
    store.defer("run-b", "w-busy", lease.lease_version, 0.0, "adapter down")
    (row,) = list_runs(store)
    assert row.needs_person and row.waiting_for is not None and "adapter down" in row.waiting_for


def test_an_approval_of_a_write_that_takes_none_is_refused_before_signing(world: World) -> None:
    """The policy lets the write through unapproved: the runtime would refuse the approval, so does the tool."""
    from tether.runtime import CrashPlan, CrashPoint, SimulatedCrash

    rt = world.runtime(agent(), crash=CrashPlan(CrashPoint.INTENT_PERSISTED))
    session = rt.start("run-a")
    with pytest.raises(SimulatedCrash):
        session.step()
    view = open_run(world.store(), "run-a", keyring=world.keyring, now=world.clock.now())
    assert view.state.phase is Phase.PENDING and not view.needs_approval
    with pytest.raises(PolicyError, match="takes no approval"):
        prepare_approval(view, APPROVER, "w1", now=world.clock.now())


def test_delivery_rechecks_what_the_document_binds_not_the_generation(guarded: World) -> None:
    """Expired meanwhile: refused. A re-checkpointed run keeps an approval valid; an ended one refuses a cancel."""
    rt = waiting(guarded)
    store = guarded.store()
    now = guarded.clock.now()
    view = open_run(store, "run-a", keyring=guarded.keyring, now=now)
    approval = prepare_approval(view, APPROVER, "w1", now=now, ttl_s=5)
    lasting = prepare_approval(view, APPROVER, "w1", now=now)
    # The runtime trusts no operator: naming roots that do lets the cancel be made anyway.
    cancel = prepare_cancel(view, OPERATOR, "stop", now=now, ttl_s=300, trust=WITH_OPERATOR)
    with pytest.raises(PolicyError, match="expired before it was delivered"):
        deliver(store, approval, now=now + timedelta(seconds=6))
    # Somebody's junk document is read and refused: the run re-checkpoints, still pending.
    store.put_evidence("run-a", "approval", {"not": "signed"})
    rt.recover("run-a").step()
    moved = open_run(store, "run-a")
    assert moved.state.generation > lasting.generation and moved.state.pending is not None
    assert deliver(store, lasting, now=now) == 2  # binds the pending write, which is the same
    rt.recover("run-a").run(max_steps=5)
    assert open_run(store, "run-a").state.phase is Phase.COMPLETED
    with pytest.raises(StaleViewError, match="completed"):
        deliver(store, cancel, now=now)


def test_a_cancel_nobody_here_may_sign_stops_the_inbox_unread_on_a_live_run(
    guarded: World,
) -> None:
    """Without canceller roots the runtime stops at the cancel, unread: a valid cancel is not burned."""
    rt = waiting(guarded)
    store = guarded.store()
    now = guarded.clock.now()
    view = open_run(store, "run-a", keyring=guarded.keyring, now=now)
    with pytest.raises(UnknownSignerError, match="run run-a's runtime would refuse it"):
        prepare_cancel(view, OPERATOR, "stop", now=now)  # refused by the roots the run keeps
    # Made anyway under roots the person names, it reaches the inbox; the run cannot read it.
    deliver(store, prepare_cancel(view, OPERATOR, "stop", now=now, trust=WITH_OPERATOR), now=now)
    with pytest.raises(TrustRootsRequiredError):
        rt.recover("run-a").step()
    after = open_run(store, "run-a", keyring=guarded.keyring, now=now)
    assert [(i.kind, i.status) for i in after.inbox] == [("cancel", "waiting")]


def test_a_run_that_goes_on_under_a_new_policy_is_judged_by_it(world: World) -> None:
    """After a new work occurrence under policy v2, open_run reads v2, whose ttl the tools enforce."""
    world.policy = make_policy(authority={"policy_change": "new_occurrence"})
    world.runtime(agent()).start("run-a")
    v2 = make_policy(
        policy_version="2", approval_ttl_s=60, authority={"policy_change": "new_occurrence"}
    )
    world.runtime(agent(), policy=v2).recover("run-a").step()
    view = open_run(world.store(), "run-a", keyring=world.keyring)
    assert view.policy is not None and view.policy.fingerprint == v2.fingerprint


def test_a_sent_write_whose_approval_lapsed_can_be_approved_again(guarded: World) -> None:
    """The adapter was down when the approved write went out; once the approval lapses the tools make a fresh one the runtime takes."""
    rt = waiting(guarded)
    store = guarded.store()
    now = guarded.clock.now()
    view = open_run(store, "run-a", now=now)
    deliver(store, prepare_approval(view, APPROVER, "w1", now=now, ttl_s=60), now=now)
    guarded.sandbox.fail_next(after_commit=False)
    rt.recover("run-a").step()
    guarded.clock.advance(120)
    rt.recover("run-a").step()
    now = guarded.clock.now()
    view = open_run(store, "run-a", keyring=guarded.keyring, now=now)
    assert view.state.pending is not None and view.state.pending.status.value == "dispatched"
    assert view.approvable
    deliver(store, prepare_approval(view, APPROVER, "w1", now=now), now=now)
    session = rt.recover("run-a")
    while not session.state.phase.terminal:
        session.step()
    assert session.state.phase is Phase.COMPLETED and guarded.sandbox.write_count() == 1


def test_a_run_whose_worker_died_holding_it_needs_a_person(guarded: World) -> None:
    """A claim whose lease ran out with no error recorded (the worker was killed) counts as a failure."""
    guarded.runtime(ScriptedAgent([finish]), policy=make_policy()).start("run-b")
    store = guarded.store()
    store.claim_expired("w-dead", 0.05)
    import time

    time.sleep(0.1)  # the worker died; its lease runs out
    (row,) = list_runs(store)
    assert (
        row.needs_person
        and row.waiting_for is not None
        and "stopped while holding" in row.waiting_for
    )
