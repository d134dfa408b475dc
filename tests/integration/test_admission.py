"""Admission: every recovery is a new decision under current authority, on a real SQLite file."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, make_policy, signed_decision, write
from tether.core import (
    AdmissionRefusedError,
    GenerationConflictError,
    Phase,
    Purpose,
    new_admission,
    strict_loads,
)
from tether.crypto import SecretBox, Signer, TrustRoots
from tether.runtime import AgentContext, Runtime

OPERATOR = Signer.generate("op-ada", "operator")
WORKER = Signer.generate("worker-7", "worker")
REVIEWER = Signer.generate("rev-bo", "reviewer")


def keeping(step: Any) -> Any:
    """``step``, keeping the context's secrets (the shared steps build a fresh context)."""

    def kept(context: AgentContext, observation: Any) -> Any:
        decision = step(context, observation)
        return replace(decision, context=replace(decision.context, secrets=context.secrets))

    return kept


def agent() -> ScriptedAgent:
    return ScriptedAgent([keeping(write("notes.txt", f"v{i}\n")) for i in range(8)])


def started(world: World, steps: int = 1, **overrides: Any) -> None:
    session = world.runtime(agent(), **overrides).start("run-a")
    for _ in range(steps):
        session.step()


def mark(world: World) -> int:
    with sqlite3.connect(world.db) as conn:
        (generation,) = conn.execute(
            "SELECT generation FROM tether_marks WHERE run_id = 'run-a'"
        ).fetchone()
    return int(generation)


def signed(rt: Runtime, signer: Signer, **changes: Any) -> dict[str, Any]:
    request = rt.admission_request("run-a")
    now = rt.clock.now()
    body = new_admission(
        request,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce="n" * 16 + signer.signer_id,
    )
    body.update(changes)
    return signer.sign(body)


def recovered_event(world: World, rt: Runtime) -> dict[str, Any]:
    session = rt.recover("run-a")
    session.step()
    opened = [e for e in session.trace() if e.kind == "recovered"]
    return opened[-1].data


def test_an_unsigned_recovery_is_recorded_as_such_and_opens_a_linked_epoch(world: World) -> None:
    """Where nobody is named, the worker recovers as itself and the record says unsigned."""
    started(world)
    rt = world.runtime(agent())
    before = rt.checkpointer.load("run-a").state
    data = recovered_event(world, rt)
    after = rt.checkpointer.load("run-a").state
    assert (data["principal"], data["role"], data["signed"]) == (rt.worker, "worker", False)
    assert data["previous_epoch_id"] == before.epoch_id != after.epoch_id == data["epoch_id"]
    assert after.epoch == before.epoch + 1
    assert after.admission == data["admission"]
    record = strict_loads(rt.store.get_blob(data["admission"]) or b"")
    assert record["bindings"]["checkpoint_generation"] == before.generation
    assert record["bindings"]["interrupted_epoch_id"] == before.epoch_id
    assert record["bindings"]["ledger_head"] == before.ledger_head
    assert record["principal"] == {"id": rt.worker, "role": "worker", "signed": False}
    assert after.occurrence_id == "run-a" == record["occurrence_id"]


def test_a_worker_signs_its_own_admission_with_its_principal_key(world: World) -> None:
    """A worker named in the trust roots admits its recovery with its own signature."""
    trust = TrustRoots.of(WORKER.trust_root())
    started(world, trust=trust, principal=WORKER)
    rt = world.runtime(agent(), trust=trust, principal=WORKER)
    data = recovered_event(world, rt)
    assert (data["principal"], data["role"], data["signed"]) == ("worker-7", "worker", True)
    record = strict_loads(rt.store.get_blob(data["admission"]) or b"")
    assert record["document"]["signer"] == "worker-7"


def test_a_revoked_worker_is_refused_and_nothing_moves(world: World) -> None:
    """A worker key removed from the current trust roots cannot recover the run."""
    other = Signer.generate("worker-8", "worker")
    started(world)
    before = mark(world)
    rt = world.runtime(agent(), trust=TrustRoots.of(other.trust_root()), principal=WORKER)
    with pytest.raises(AdmissionRefusedError) as caught:
        rt.recover("run-a")
    assert caught.value.binding == "principal"
    assert mark(world) == before


def test_named_workers_forbid_an_unsigned_recovery(world: World) -> None:
    """Once the deployment names worker principals, a runtime without a key is refused."""
    started(world)
    rt = world.runtime(agent(), trust=TrustRoots.of(WORKER.trust_root()))
    with pytest.raises(AdmissionRefusedError, match="principal"):
        rt.recover("run-a")
    # Operators named (for forks or rewinds) do not make workers identities.
    assert world.runtime(agent(), trust=TrustRoots.of(OPERATOR.trust_root())).recover("run-a")


def test_a_policy_that_lets_only_operators_recover_refuses_the_worker(world: World) -> None:
    """The policy's authority, not the worker's presence, decides who may recover."""
    world.policy = make_policy(authority={"recover": ["operator"]})
    started(world)
    with pytest.raises(AdmissionRefusedError) as caught:
        world.runtime(agent()).recover("run-a")
    assert caught.value.binding == "principal"


def test_an_operator_admission_is_used_once_then_its_epoch_is_superseded(world: World) -> None:
    """A signed admission opens one epoch; given again it names a superseded epoch."""
    trust = TrustRoots.of(OPERATOR.trust_root())
    started(world, trust=trust)
    rt = world.runtime(agent(), trust=trust)
    document = signed(rt, OPERATOR)
    session = rt.recover("run-a", admission=document)
    session.step()
    opened = [e for e in session.trace() if e.kind == "recovered"][-1].data
    assert (opened["principal"], opened["role"], opened["signed"]) == ("op-ada", "operator", True)
    with pytest.raises(AdmissionRefusedError) as caught:
        world.runtime(agent(), trust=trust).recover("run-a", admission=document)
    assert caught.value.binding in {"checkpoint", "epoch"}


@pytest.mark.parametrize(
    ("field", "value", "binding"),
    [
        ("interrupted_epoch_id", "epoch-elsewhere", "epoch"),
        ("checkpoint_generation", 1, "checkpoint"),
        ("ledger_length", 0, "effects"),
        ("policy_version", "0", "policy"),
        ("run_id", "run-b", "run"),
        ("principal_id", "op-eve", "principal"),
    ],
)
def test_each_binding_of_a_signed_admission_is_checked(
    world: World, field: str, value: Any, binding: str
) -> None:
    """An admission bound to another epoch, checkpoint, ledger, policy, run or signer is refused."""
    trust = TrustRoots.of(OPERATOR.trust_root())
    started(world, steps=2, trust=trust)
    rt = world.runtime(agent(), trust=trust)
    before = mark(world)
    with pytest.raises(AdmissionRefusedError) as caught:
        rt.recover("run-a", admission=signed(rt, OPERATOR, **{field: value}))
    assert caught.value.binding == binding
    assert mark(world) == before


def test_a_reviewer_may_not_admit_a_recovery_by_default(world: World) -> None:
    """Roles matter: a trusted reviewer is not, by default, someone who may recover."""
    trust = TrustRoots.of(REVIEWER.trust_root(), OPERATOR.trust_root())
    started(world, trust=trust)
    rt = world.runtime(agent(), trust=trust)
    with pytest.raises(AdmissionRefusedError, match="reviewer"):
        rt.recover("run-a", admission=signed(rt, REVIEWER))


def test_a_changed_policy_is_adopted_only_as_the_policy_in_force_allows(world: World) -> None:
    """Under a v1 that allows it, policy v2 opens a linked work occurrence, and v2's clause rules next."""
    world.policy = make_policy(authority={"policy_change": "new_occurrence"})
    started(world)
    v2 = make_policy(policy_version="2")  # v2 itself refuses the next change
    rt = world.runtime(agent(), policy=v2)
    data = recovered_event(world, rt)
    state = rt.checkpointer.load("run-a").state
    assert data["previous_occurrence_id"] == "run-a"
    assert data["occurrence_id"] == state.occurrence_id != "run-a"
    assert data["previous_policy"]["policy_version"] == "1"
    assert state.binding.policy_version == "2"
    # From now on the run is bound to v2: recovering it under v2 is an ordinary recovery.
    again = world.runtime(agent(), policy=v2)
    assert "previous_occurrence_id" not in recovered_event(world, again)
    # And v2 is now the policy in force: its refusal holds against a v3 that allows anything.
    v3 = make_policy(policy_version="3", authority={"policy_change": "new_occurrence"})
    with pytest.raises(AdmissionRefusedError) as caught:
        world.runtime(agent(), policy=v3).recover("run-a")
    assert caught.value.binding == "policy"


def test_a_refusing_policy_in_force_is_left_only_by_an_operators_admission(world: World) -> None:
    """Under the default (refuse), v2 is refused unsigned and self-signed, and adopted when an operator signs."""
    trust = TrustRoots.of(OPERATOR.trust_root(), WORKER.trust_root(), REVIEWER.trust_root())
    started(world, trust=trust, principal=WORKER)
    before = mark(world)
    v2 = make_policy(policy_version="2", authority={"policy_change": "new_occurrence"})
    with pytest.raises(AdmissionRefusedError) as caught:
        world.runtime(agent(), policy=v2, trust=trust, principal=WORKER).recover("run-a")
    assert caught.value.binding == "policy" and "operator" in str(caught.value)
    rt = world.runtime(agent(), policy=v2, trust=trust)
    with pytest.raises(AdmissionRefusedError):
        rt.recover("run-a", admission=signed(rt, WORKER))  # a worker is not a person's decision
    assert mark(world) == before
    session = rt.recover("run-a", admission=signed(rt, OPERATOR))
    session.step()
    state = rt.checkpointer.load("run-a").state
    assert state.binding.policy_version == "2" and state.occurrence_id != "run-a"


def test_a_cancelled_run_is_never_admitted(world: World) -> None:
    """An admission of a run that is over is refused; reading it still works."""
    trust = TrustRoots.of(OPERATOR.trust_root())
    started(world, trust=trust)
    rt = world.runtime(agent(), trust=trust)
    document = signed(rt, OPERATOR)
    rt.recover("run-a", admission=signed(rt, OPERATOR)).cancel("no longer wanted")
    with pytest.raises(AdmissionRefusedError) as caught:
        world.runtime(agent(), trust=trust).recover("run-a", admission=document)
    assert caught.value.binding == "run"
    session = world.runtime(agent(), trust=trust).recover("run-a")
    assert session.state.phase is Phase.CANCELLED


def test_two_admissions_of_one_epoch_cannot_both_land(world: World) -> None:
    """Two workers admitted from the same epoch: the second one's first commit is refused."""
    started(world)
    first = world.runtime(agent()).recover("run-a")
    second = world.runtime(agent()).recover("run-a")
    first.step()
    with pytest.raises(GenerationConflictError):
        second.step()


def test_secrets_are_withheld_from_a_principal_without_the_right(world: World) -> None:
    """A worker outside the policy's read_secrets gets the run with its secrets redacted."""
    world.policy = make_policy(authority={"read_secrets": ["operator"]})
    box = SecretBox.generate()
    session = world.runtime(agent(), secrets=box).start(
        "run-a", AgentContext(secrets={"token": "s3cr3t-value"})
    )
    session.step()
    worker = world.runtime(agent(), secrets=box).recover("run-a")
    assert worker.context.redacted == ("token",)
    assert "s3cr3t-value" not in json.dumps(worker.context.secrets)
    trust = TrustRoots.of(OPERATOR.trust_root())
    rt = world.runtime(agent(), secrets=box, trust=trust)
    operator = rt.recover("run-a", admission=signed(rt, OPERATOR))
    assert operator.context.secrets == {"token": "s3cr3t-value"}


def test_admission_request_names_the_rewind_purpose(world: World) -> None:
    """The request a person signs says what it admits (recovery or rewind, and where to)."""
    started(world, steps=2)
    rt = world.runtime(agent())
    request = rt.admission_request("run-a", purpose=Purpose.REWIND, target_generation=2)
    assert (request["purpose"], request["target_generation"]) == ("rewind", 2)
    assert request["checkpoint_generation"] == mark(world)


def test_an_admission_in_the_inbox_that_does_not_verify_never_blocks_the_run(
    world: World,
) -> None:
    """An approver's or an expired admission is skipped and recorded; a valid one is used."""
    approver = Signer.generate("app", "approver")
    trust = TrustRoots.of(OPERATOR.trust_root(), approver.trust_root())
    started(world, trust=trust)
    rt = world.runtime(agent(), trust=trust)
    good = signed(rt, OPERATOR)
    rt.store.put_evidence("run-a", "admission", good)
    rt.store.put_evidence("run-a", "admission", signed(rt, approver))  # newest, refused
    session = world.runtime(agent(), trust=trust).recover("run-a")
    session.step()
    opened = [e for e in session.trace() if e.kind == "recovered"][-1].data
    assert (opened["principal"], opened["signed"]) == ("op-ada", True)
    kinds = [(e.kind, e.data.get("seq")) for e in session.trace()]
    assert ("admission_read", 1) in kinds and ("evidence_refused", 2) in kinds
    assert session.state.inbox_cursor == 2
    # Only an invalid one: the worker recovers as itself, unblocked.
    rt.store.put_evidence("run-a", "admission", signed(rt, approver))
    again = world.runtime(agent(), trust=trust).recover("run-a")
    again.step()
    opened = [e for e in again.trace() if e.kind == "recovered"][-1].data
    assert (opened["role"], opened["signed"]) == ("worker", False)


def test_an_admission_may_not_reuse_a_nonce_a_review_decision_consumed(world: World) -> None:
    """Nonces are one-time across kinds: an operator's admission reusing one is refused."""
    trust = TrustRoots.of(OPERATOR.trust_root(), REVIEWER.trust_root())
    session = world.runtime(agent(), trust=trust).start("run-a")
    session.step()
    session.park("worker_error", "the drive kept failing")
    used = "d" * 32
    session.review(signed_decision(REVIEWER, session.state, world.clock.now(), nonce=used))
    rt = world.runtime(agent(), trust=trust)
    with pytest.raises(AdmissionRefusedError, match="consumed"):
        rt.recover("run-a", admission=signed(rt, OPERATOR, nonce=used))
    assert rt.recover("run-a", admission=signed(rt, OPERATOR)).state.phase is Phase.RUNNING
