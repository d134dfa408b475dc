"""tether.effects: a caller's own loop routes each effect through the protocol, on a real SQLite file."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import tether
from tether import effects
from tether.core import (
    ApprovalRequiredError,
    EffectRejectedError,
    LeaseLostError,
    NeedsReviewError,
    NotInRunError,
    OutcomeKind,
    Phase,
    Proposal,
    SpecError,
)
from tether.crypto import Signer, TrustRoots
from tether.runtime import CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.testing import Sandbox

from ..conftest import World, make_policy, make_task, signed_approval

ALICE = Signer.generate("alice", "approver")
GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


def loop_runtime(world: World, crash: CrashPlan | None = None, **kw: Any) -> Runtime:
    """A runtime with no agent: the test's own code is the loop."""
    return world.runtime(None, crash=crash, **kw)


def test_a_call_sends_the_write_once_and_returns_the_adapters_receipt(world: World) -> None:
    """effects.call gates, persists and sends the write; the receipt comes back from the ledger."""
    with effects.run(loop_runtime(world), "r1") as run:
        done = effects.call("file.write", "notes.txt", {"content": "hello\n"})
        assert run.phase is Phase.RUNNING
    assert done.outcome == "executed" and not done.replayed
    assert done.receipt is not None and done.receipt["idempotency_key"]
    assert world.sandbox.write_count() == 1
    assert world.sandbox.files["notes.txt"] == "hello\n"


def test_the_same_effect_called_again_in_a_new_run_block_is_replayed(world: World) -> None:
    """Called again through a new runtime on the same store, the effect's receipt and result come back."""
    with effects.run(loop_runtime(world), "r1"):
        first = effects.call("file.write", "notes.txt", {"content": "hello\n"})
    with effects.run(loop_runtime(world), "r1"):
        again = effects.call("file.write", "notes.txt", {"content": "hello\n"})
    assert again.replayed and again.receipt == first.receipt
    assert again.data["replay_of"] == first.action_id and again.result == first.result
    # What the replay itself stood on, as the caller is handed it: the same receipt and result.
    assert first.receipt is not None and first.result is not None
    assert again.data["receipt_id"] == first.receipt["receipt_id"]
    assert again.data["result"] == first.result
    assert world.sandbox.write_count() == 1


@pytest.mark.parametrize("point", [CrashPoint.INTENT_PERSISTED, CrashPoint.EFFECT_SENT])
def test_a_call_killed_mid_write_and_called_again_sends_once(
    world: World, point: CrashPoint
) -> None:
    """Killed with the intent persisted or the effect sent: the next call settles it, never twice."""
    with (
        pytest.raises(SimulatedCrash),
        effects.run(loop_runtime(world, CrashPlan(point)), "r1"),
    ):
        effects.call("file.write", "notes.txt", {"content": "hello\n"})
    with effects.run(loop_runtime(world), "r1"):
        again = effects.call("file.write", "notes.txt", {"content": "hello\n"})
    # Never sent before the crash: this call sends it. Sent: its receipt is read back.
    assert again.replayed is (point is CrashPoint.EFFECT_SENT)
    assert again.receipt is not None
    assert world.sandbox.write_count() == 1
    assert world.sandbox.files["notes.txt"] == "hello\n"


@pytest.mark.parametrize("point", [CrashPoint.INTENT_PERSISTED, CrashPoint.EFFECT_SENT])
def test_a_send_to_an_adapter_that_dedups_but_cannot_be_asked_answers_executed(
    world: World, point: CrashPoint
) -> None:
    """On an idempotent adapter with no look-up, the call after a crash sends under the key: executed."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", queryable=False, clock=world.clock.now
    )
    world.task = make_task(world.sandbox.environment().state_fingerprint)
    with (
        pytest.raises(SimulatedCrash),
        effects.run(loop_runtime(world, CrashPlan(point)), "r1"),
    ):
        effects.call("file.write", "notes.txt", {"content": "hello\n"})
    with effects.run(loop_runtime(world), "r1"):
        again = effects.call("file.write", "notes.txt", {"content": "hello\n"})
    # Its first send (nothing left before the crash) or a resend the adapter absorbed: this
    # call sent it under the key, so it never claims "nothing was sent" (replayed).
    assert again.outcome == "executed" and not again.replayed
    assert again.receipt is not None
    (held,) = world.sandbox.receipts_after(0)  # the adapter's own record of the one write
    assert again.receipt == held.to_json()
    assert world.sandbox.write_count() == 1
    assert world.sandbox.files["notes.txt"] == "hello\n"


def test_a_call_settles_another_write_a_crash_left_then_carries_out_its_own(world: World) -> None:
    """The write a crash left is settled by its key first; the call's own write follows, in one call."""
    with (
        pytest.raises(SimulatedCrash),
        effects.run(loop_runtime(world, CrashPlan(CrashPoint.INTENT_PERSISTED)), "r1"),
    ):
        effects.call("file.write", "notes.txt", {"content": "first\n"})
    with effects.run(loop_runtime(world), "r1") as run:
        other = effects.call("file.write", "src/todo.txt", {"content": "second\n"})
        trace = [e.kind for e in run.session.trace()]
    assert other.outcome == "executed" and other.receipt is not None
    assert other.receipt["business_object_id"] == "src/todo.txt"
    assert world.sandbox.files == {"notes.txt": "first\n", "src/todo.txt": "second\n"}
    assert world.sandbox.write_count() == 2
    # The crash-left write was settled (found absent, sent once) before this call's own.
    committed = [i for i, kind in enumerate(trace) if kind == "effect_committed"]
    persisted = [i for i, kind in enumerate(trace) if kind == "intent_persisted"]
    assert len(committed) == len(persisted) == 2 and committed[0] < persisted[1]


def killed_after_a_blind_send(world: World) -> None:
    """A write to an adapter that can neither deduplicate nor be asked, crashed after the send."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", idempotent=False, queryable=False
    )
    world.task = make_task(world.sandbox.environment().state_fingerprint)
    with (
        pytest.raises(SimulatedCrash),
        effects.run(loop_runtime(world, CrashPlan(CrashPoint.EFFECT_SENT)), "r1"),
    ):
        effects.call("file.write", "notes.txt", {"content": "hello\n"})


def test_a_call_whose_outcome_cannot_be_known_raises_needs_review(world: World) -> None:
    """A blind adapter killed after the send: the call freezes the run instead of sending again."""
    killed_after_a_blind_send(world)
    with effects.run(loop_runtime(world), "r1") as run, pytest.raises(NeedsReviewError) as caught:
        effects.call("file.write", "notes.txt", {"content": "hello\n"})
    assert caught.value.case_id is not None and caught.value.reason
    assert run.phase is Phase.NEEDS_REVIEW
    assert world.sandbox.write_count() == 1


def test_a_write_that_needs_approval_raises_what_a_person_must_sign(world: World) -> None:
    """The call raises with the approval's fields; once a signed approval is given it sends once."""
    world.policy = make_policy(kinds=GUARDED)
    runtime = loop_runtime(world, trust=TrustRoots.of(ALICE.trust_root()))
    with effects.run(runtime, "r1") as run:
        with pytest.raises(ApprovalRequiredError) as caught:
            effects.call("file.write", "notes.txt", {"content": "hello\n"})
        request = caught.value.request
        assert request["run_id"] == "r1" and request["intent_digest"]
        assert world.sandbox.write_count() == 0
        with pytest.raises(ApprovalRequiredError):  # called again without one: still waiting
            effects.call("file.write", "notes.txt", {"content": "hello\n"})
        run.approve(signed_approval(ALICE, run.session.state, world.clock.now()))
        done = effects.call("file.write", "notes.txt", {"content": "hello\n"})
    assert done.outcome == "executed" and done.receipt is not None  # this call sent it
    assert world.sandbox.write_count() == 1


def test_a_call_the_gate_refuses_raises_and_sends_nothing(world: World) -> None:
    """A path outside the task's scope is refused with the gate's reason; the sandbox is untouched."""
    with effects.run(loop_runtime(world), "r1"), pytest.raises(EffectRejectedError) as caught:
        effects.call("file.write", "secrets.txt", {"content": "x"})
    assert caught.value.reason == "scope_target"
    assert world.sandbox.write_count() == 0


def test_a_read_returns_the_adapters_answer(world: World) -> None:
    """A read kind is observed, and its data comes back to the caller."""
    with effects.run(loop_runtime(world), "r1"):
        read = effects.call("file.read", "notes.txt")
    assert read.outcome == "observed"
    assert read.result["text"] == "draft\n"


def test_finish_runs_the_verifier_and_ends_the_run(world: World) -> None:
    """finish() is the runtime's finish action: the verifier passes and the run completes."""
    with effects.run(loop_runtime(world), "r1") as run:
        effects.call("file.write", "notes.txt", {"content": "hello\n"})
        outcome = run.finish("done")
    assert outcome.kind is OutcomeKind.FINISHED and run.phase is Phase.COMPLETED


def test_an_effect_outside_a_run_is_refused_and_never_performed(world: World) -> None:
    """Without an open run the call raises NotInRunError; the decorated body never runs."""
    ran: list[str] = []

    @tether.effect("file.write")
    def save(path: str, content: str) -> None:
        ran.append(path)

    with pytest.raises(NotInRunError):
        effects.call("file.write", "notes.txt", {"content": "x"})
    with pytest.raises(NotInRunError):
        save("notes.txt", "x")
    assert ran == [] and world.sandbox.write_count() == 0


def test_the_decorator_maps_the_signature_to_the_call(world: World) -> None:
    """The first parameter is the target, the rest (defaults applied) the arguments."""

    @tether.effect("file.write")
    def save(path: str, content: str = "default\n") -> None:
        """Save a note."""

    with effects.run(loop_runtime(world), "r1"):
        save("notes.txt")
        first = world.sandbox.receipts_after(0)[0]
        again = save(path="notes.txt", content="default\n")
    assert again.replayed
    assert again.data["receipt_id"] == first.receipt_id and again.data["result"] == first.result
    assert world.sandbox.files["notes.txt"] == "default\n"
    assert save.__doc__ == "Save a note." and save.__name__ == "save"


def test_the_decorator_checks_its_target_parameter_and_the_call(world: World) -> None:
    """A target naming no parameter fails at decoration; a bad call fails typed, nothing sent."""
    with pytest.raises(SpecError):

        @tether.effect("file.write", target="where")
        def save(path: str, content: str) -> None: ...

    @tether.effect("file.write", target="path")
    def save_to(content: str, path: str) -> None: ...

    with effects.run(loop_runtime(world), "r1"):
        with pytest.raises(SpecError):
            save_to("x")  # no path
        with pytest.raises(SpecError):
            save_to("x", path=3)
        save_to("hello\n", "notes.txt")
    assert world.sandbox.write_count() == 1


def test_an_async_tool_acts_on_the_contexts_run(world: World) -> None:
    """A coroutine function gets an async wrapper that acts on the context's run."""

    @tether.effect("file.write")
    async def save(path: str, content: str) -> None: ...

    with effects.run(loop_runtime(world), "r1"):
        done = asyncio.run(save("notes.txt", "async\n"))
    assert done.outcome == "executed"
    assert world.sandbox.files["notes.txt"] == "async\n"


def test_a_runtime_without_an_agent_cannot_step(world: World) -> None:
    """step() needs an agent; a runtime without one says to use effects.call."""
    session = loop_runtime(world).start("r1")
    with pytest.raises(SpecError, match=r"effects\.call"):
        session.step()


def test_an_approved_read_is_answered_by_the_call_that_asks_again(world: World) -> None:
    """A read held for approval is carried out once approved and answers the next call, once."""
    world.policy = make_policy(
        kinds={"file.read": {"risk": "low", "permission": "workspace.read", "needs_approval": True}}
    )
    runtime = loop_runtime(world, trust=TrustRoots.of(ALICE.trust_root()))
    with effects.run(runtime, "r1") as run:
        with pytest.raises(ApprovalRequiredError):
            effects.call("file.read", "notes.txt")
        run.approve(signed_approval(ALICE, run.session.state, world.clock.now()))
        read = effects.call("file.read", "notes.txt")
        kinds = [event.kind for event in run.session.trace()]
    assert read.outcome == "observed" and read.result["text"] == "draft\n"
    assert kinds.count("approval_requested") == 1 and kinds.count("action_observed") == 1


def test_each_call_gets_its_own_receipt_and_a_copy_of_it(world: World) -> None:
    """Two writes get their own receipts; editing a returned receipt changes no later replay."""
    with effects.run(loop_runtime(world), "r1") as run:
        first = effects.call("file.write", "notes.txt", {"content": "one\n"})
        second = effects.call("file.write", "notes.txt", {"content": "two\n"})
        assert run.session.state.last_write is not None
        assert second.receipt is not None and first.receipt is not None
        assert second.receipt["receipt_id"] == run.session.state.last_write.receipt_id
        assert first.receipt["receipt_id"] != second.receipt["receipt_id"]
        kept = second.receipt["receipt_id"]
        second.receipt["receipt_id"] = "forged"
        again = effects.call("file.write", "notes.txt", {"content": "two\n"})
    assert again.replayed and again.receipt is not None
    assert again.receipt["receipt_id"] == kept
    assert second.result is not None
    assert again.data["receipt_id"] == kept and again.data["result"] == second.result


def test_run_level_kinds_are_not_calls_and_finish_reports_the_verifier(world: World) -> None:
    """call('finish') is refused before anything; a failing verifier is finish()'s outcome."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"}, instance_id="sbx-1", verifier=lambda files: False
    )
    world.task = make_task(world.sandbox.environment().state_fingerprint)
    with effects.run(loop_runtime(world), "r1") as run:
        with pytest.raises(SpecError, match="finish"):
            effects.call("finish")
        outcome = run.finish("done")
        assert outcome.kind is OutcomeKind.VERIFIER_FAILED
        assert run.phase is Phase.RUNNING


def test_finish_on_a_frozen_run_raises_needs_review_like_a_call(world: World) -> None:
    """The same refusal, the same type: finish() on a frozen run names the open case."""
    killed_after_a_blind_send(world)
    with effects.run(loop_runtime(world), "r1") as run:
        with pytest.raises(NeedsReviewError):
            effects.call("file.write", "notes.txt", {"content": "hello\n"})
        with pytest.raises(NeedsReviewError) as caught:
            run.finish()
    assert caught.value.case_id is not None


def test_a_closed_run_refuses_calls_and_its_session_sends_nothing(world: World) -> None:
    """After its block, a run refuses calls; a session whose lease was given up cannot send."""
    runtime = loop_runtime(world, lease_ttl_s=30.0)
    with effects.run(runtime, "r1") as run:
        pass
    with pytest.raises(NotInRunError):
        run.call("file.write", "notes.txt", {"content": "x"})
    with pytest.raises(LeaseLostError):
        run.session.act(Proposal("late", "file.write", "notes.txt", args={"content": "x"}))
    assert world.sandbox.write_count() == 0


def test_the_same_run_cannot_be_opened_twice_in_one_context(world: World) -> None:
    """A nested block for the run already open is refused; re-entering one block keeps its lease."""
    runtime = loop_runtime(world, lease_ttl_s=30.0)
    with effects.run(runtime, "r1") as run:
        with pytest.raises(SpecError, match="already open"), effects.run(runtime, "r1"):
            pass
        with run:
            effects.call("file.write", "notes.txt", {"content": "inner\n"})
        done = effects.call("file.write", "notes.txt", {"content": "outer\n"})
    assert done.outcome == "executed" and world.sandbox.write_count() == 2


def test_the_blocks_own_exception_is_not_masked_by_a_lost_lease(world: World) -> None:
    """Leaving a block because of an error, a lease lost meanwhile does not replace that error."""
    runtime = loop_runtime(world, lease_ttl_s=30.0)
    with pytest.raises(ValueError, match="the tool broke"), effects.run(runtime, "r1") as run:
        lease = run.session.lease
        assert lease is not None
        runtime.checkpointer.marks.release_lease("r1", lease.owner, lease.lease_version)
        world.clock.advance(1)
        runtime.checkpointer.marks.acquire_lease("r1", "someone-else", 30.0)
        raise ValueError("the tool broke")


def test_the_decorator_leaves_out_self_spreads_extra_and_refuses_star_args(world: World) -> None:
    """A method's self is not an argument, **extra becomes arguments, *args is refused."""

    class Notes:
        @tether.effect("file.write")
        def save(self, path: str, **extra: Any) -> None: ...

    with pytest.raises(SpecError):

        @tether.effect("file.write")
        def spread(path: str, *parts: str) -> None: ...

    with effects.run(loop_runtime(world), "r1"):
        done = Notes().save("notes.txt", content="method\n")
    assert done.outcome == "executed" and world.sandbox.files["notes.txt"] == "method\n"


def test_arguments_that_are_not_json_are_refused_before_spending_budget(world: World) -> None:
    """A programming error (bytes, NaN) raises SpecError and the run's budgets do not move."""
    with effects.run(loop_runtime(world), "r1") as run:
        before = run.session.state.spent
        for bad in ({"content": b"x"}, {"content": float("nan")}):
            with pytest.raises(SpecError):
                effects.call("file.write", "notes.txt", bad)
        assert run.session.state.spent == before


def test_the_before_proposal_window_fires_on_the_call_path(world: World) -> None:
    """A crash test can fire before_proposal for a call, and the next call sends once."""
    with (
        pytest.raises(SimulatedCrash),
        effects.run(loop_runtime(world, CrashPlan(CrashPoint.BEFORE_PROPOSAL)), "r1"),
    ):
        effects.call("file.write", "notes.txt", {"content": "hello\n"})
    assert world.sandbox.write_count() == 0
    with effects.run(loop_runtime(world), "r1"):
        done = effects.call("file.write", "notes.txt", {"content": "hello\n"})
    assert done.outcome == "executed" and world.sandbox.write_count() == 1


def test_an_approval_error_says_whether_it_is_for_this_call_or_the_write_ahead(
    world: World,
) -> None:
    """Asking again for the waiting write is 'this call'; another write waits behind it."""
    world.policy = make_policy(kinds=GUARDED)
    runtime = loop_runtime(world, trust=TrustRoots.of(ALICE.trust_root()))
    with effects.run(runtime, "r1"):
        with pytest.raises(ApprovalRequiredError) as first:
            effects.call("file.write", "notes.txt", {"content": "x\n"})
        with pytest.raises(ApprovalRequiredError) as again:
            effects.call("file.write", "notes.txt", {"content": "x\n"})
        with pytest.raises(ApprovalRequiredError) as other:
            effects.call("file.write", "notes.txt", {"content": "y\n"})
    assert first.value.for_this_call and again.value.for_this_call
    assert not other.value.for_this_call
    assert other.value.action_id == first.value.action_id == again.value.action_id
    assert world.sandbox.write_count() == 0
