"""Aligned rewind: context and workspace restored together, no effect forgotten, nothing deleted."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, make_policy, write
from tether.core import (
    AdmissionRefusedError,
    CheckpointCorruptError,
    EffectStatus,
    OutcomeKind,
    Phase,
    Purpose,
    RewindRefusedError,
    SplitRewindError,
    digest_bytes,
    new_admission,
)
from tether.core._rewind import REWIND_MEMORY_KEY
from tether.crypto import Signer, TrustRoots, open_envelope
from tether.runtime import RunSession, Runtime

OPERATOR = Signer.generate("op-ada", "operator")
TRUST = TrustRoots.of(OPERATOR.trust_root())


def agent() -> ScriptedAgent:
    return ScriptedAgent([write("notes.txt", f"v{i}\n") for i in range(1, 9)])


def three_writes(world: World, **overrides: Any) -> tuple[Runtime, RunSession, dict[int, str]]:
    """Start a run and commit three writes; the rewind point after each and the file then.

    A write's receipt rides on the run's next commit, which records the state at
    rest right after the write (its rest point): the next write's commit, and for
    the last one the commit that lands it (``land_deferred``, as a session letting
    the run go does). That generation is the write's rewind point.
    """
    rt = world.runtime(agent(), **overrides)
    session = rt.start("run-r")
    after: dict[int, str] = {}
    for _ in range(3):
        session.step()
        after[session.state.generation + 1] = world.sandbox.files["notes.txt"]
    session.land_deferred()
    return rt, session, after


def signed_rewind(rt: Runtime, to: int, reason: str, scope: str = "aligned") -> dict[str, Any]:
    request = rt.admission_request(
        "run-r", purpose=Purpose.REWIND, target_generation=to, reason=reason, scope=scope
    )
    now = rt.clock.now()
    body = new_admission(
        request,
        "op-ada",
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce="rewind-nonce-" + reason.replace(" ", "-"),
    )
    return OPERATOR.sign(body)


def mark(world: World) -> int:
    with sqlite3.connect(world.db) as conn:
        (generation,) = conn.execute(
            "SELECT generation FROM tether_marks WHERE run_id = 'run-r'"
        ).fetchone()
    return int(generation)


def test_an_operator_rewind_restores_files_and_context_together(world: World) -> None:
    """The workspace and the context both go back to g, as new generations; the trace only grows."""
    rt, session, after = three_writes(world, trust=TRUST)
    first = min(after)
    target = rt.checkpointer.at_generation(session.state, first)[0]
    before = session.state
    outcome = session.rewind(document=signed_rewind(rt, first, "the second edit was wrong"))
    assert outcome.reason == "rewound"
    state = session.state
    assert world.sandbox.files["notes.txt"] == after[first] == "v1\n"
    assert state.environment.state_fingerprint == target.environment.state_fingerprint
    assert state.environment.version > before.environment.version  # forward, never back
    assert state.generation == before.generation + 2 == mark(world)
    assert state.trace_length > before.trace_length  # the failed suffix stays in the chain
    assert session.context.plan_cursor == target.plan_cursor
    assert state.epoch == before.epoch + 1 and state.epoch_id != before.epoch_id
    kinds = [e.kind for e in session.trace()]
    assert kinds[-2:] == ["rewind_started", "rewound"]
    rewound = session.trace()[-1].data
    assert rewound["by"] == "op-ada" and rewound["reason"] == "the second edit was wrong"
    assert rewound["failed_suffix"]["trace_length"] == before.trace_length
    started = session.trace()[-2].data
    assert (started["principal"], started["signed"]) == ("op-ada", True)


def test_rewound_workspace_writes_are_compensated_and_handed_to_the_agent(world: World) -> None:
    """Writes past g were taken back by the restore: the ledger says so, the agent is told."""
    rt, session, after = three_writes(world, trust=TRUST)
    first = min(after)
    session.rewind(document=signed_rewind(rt, first, "start over"))
    ledger = rt.checkpointer.verified_ledger(session.state)
    compensated = [e for e in ledger if e.status is EffectStatus.COMPENSATED]
    assert len(compensated) == 2  # the second and third write
    assert all(e.receipt and e.receipt["compensated_by"] == "rewind" for e in compensated)
    memory = session.context.memory[REWIND_MEMORY_KEY][-1]
    assert memory["rewound_to_generation"] == first
    assert len(memory["workspace_writes_undone"]) == 2
    assert memory["effects_already_done"] == []
    assert any(item["event"] == "intent_persisted" for item in memory["tried"])
    # The agent goes on from g's cursor and writes again: a new effect, not a replay.
    session.step()
    assert world.sandbox.files["notes.txt"] == "v2\n"
    assert world.sandbox.write_count() == 4


def test_by_default_the_agent_may_not_select_a_rewind_point(world: World) -> None:
    """An unsigned rewind is the agent's; the default policy lets only people choose."""
    _, session, after = three_writes(world)
    with pytest.raises(AdmissionRefusedError) as caught:
        session.rewind(min(after), "agent wants a redo")
    assert caught.value.binding == "principal"
    assert world.sandbox.files["notes.txt"] == "v3\n"


def test_the_agent_may_rewind_where_the_policy_names_it(world: World) -> None:
    """A policy whose authority.rewind names the agent lets the run rewind itself, traced."""
    world.policy = make_policy(authority={"rewind": ["agent", "operator"]})
    _, session, after = three_writes(world)
    outcome = session.rewind(min(after), "agent wants a redo")
    assert outcome.reason == "rewound"
    assert session.trace()[-2].data["principal"] == "agent"


@pytest.mark.parametrize("scope", ["files", "context"])
def test_a_split_rewind_is_refused_and_traced_unless_signed(world: World, scope: str) -> None:
    """Files-only and context-only rewinds leave the two apart: refused, traced; signed, allowed."""
    world.policy = make_policy(authority={"rewind": ["agent", "operator"]})
    rt, session, after = three_writes(world, trust=TRUST)
    first = min(after)
    files = world.sandbox.files
    with pytest.raises(SplitRewindError):
        session.rewind(first, "only half", scope=scope)
    assert session.trace()[-1].kind == "rewind_refused"
    assert world.sandbox.files == files  # nothing restored
    outcome = session.rewind(document=signed_rewind(rt, first, "on purpose", scope=scope))
    assert outcome.reason == "rewound"
    expected = after[first] if scope == "files" else files["notes.txt"]
    assert world.sandbox.files["notes.txt"] == expected


def test_files_restored_behind_tethers_back_freeze_the_run_at_recovery(world: World) -> None:
    """A files-only restore made outside tether leaves context and files apart: frozen, traced."""
    rt, session, after = three_writes(world)
    root = rt.checkpointer.at_generation(session.state, min(after))[0].environment
    world.sandbox.restore_snapshot(root.state_fingerprint, rt.store.get_blob)
    again = world.runtime(agent()).recover("run-r")
    assert again.state.phase is Phase.NEEDS_REVIEW
    assert again.state.review_cases[-1].reason == "environment_ahead"
    assert again.trace()[-1].kind == "needs_review"
    assert world.sandbox.files["notes.txt"] == "v1\n"  # nothing acted on the mismatch


def test_a_rewind_is_refused_while_a_write_is_pending_or_to_a_point_not_on_history(
    world: World,
) -> None:
    """No rewind over a pending write, to the current or a future generation, or to 0."""
    world.policy = make_policy(authority={"rewind": ["agent"]})
    rt, session, after = three_writes(world)
    for bad in (0, session.state.generation, session.state.generation + 5):
        with pytest.raises(RewindRefusedError):
            session.rewind(bad, "nowhere")
    rt.policy = make_policy(
        authority={"rewind": ["agent"]},
        kinds={
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}
        },
    )
    assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL
    assert session.state.phase is Phase.PENDING
    with pytest.raises(RewindRefusedError, match="pending"):
        session.rewind(min(after), "over a pending write")


def test_a_rewind_interrupted_after_its_plan_is_finished_by_the_next_recovery(
    world: World,
) -> None:
    """Killed between the plan's commit and the restore: a fresh process finishes the rewind."""
    world.policy = make_policy(authority={"rewind": ["agent"]})
    rt, session, after = three_writes(world)
    first = min(after)
    real = world.sandbox.restore_snapshot

    def dies(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # the process goes away mid-rewind

    world.sandbox.restore_snapshot = dies  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        session.rewind(first, "interrupted")
    world.sandbox.restore_snapshot = real  # type: ignore[method-assign]
    planned = rt.checkpointer.load("run-r").state
    assert planned.rewinding is not None and planned.rewinding.to_generation == first
    again = world.runtime(agent()).recover("run-r")
    outcome = again.step()
    assert outcome.reason == "rewound"
    assert world.sandbox.files["notes.txt"] == after[first]
    assert again.state.rewinding is None


def test_a_point_with_a_write_pending_is_not_a_rewind_point(world: World) -> None:
    """Its context is past a proposal whose write it does not hold: restoring both loses it."""
    world.policy = make_policy(authority={"rewind": ["agent"]})
    rt = world.runtime(agent())
    session = rt.start("run-r")
    session.step()
    # The write's own checkpoint (its receipt waits for the next commit, which the
    # rewind lands first) holds it pending and carried no rest point.
    pending_points = [
        g for g in range(1, session.state.generation + 1) if _phase_at(rt, g) == "pending"
    ]
    assert pending_points
    with pytest.raises(RewindRefusedError, match="not at rest"):
        session.rewind(pending_points[0], "into a pending write")


def _phase_at(rt: Runtime, generation: int) -> str:
    (envelope,) = rt.store.envelopes("run-r", generation)
    payload = open_envelope(envelope, rt.checkpointer.keyring, run_id="run-r")
    return str(payload["phase"])


def test_a_rewind_to_an_incomplete_snapshot_is_refused_before_anything_moves(
    world: World,
) -> None:
    """A missing file blob is found by walking the snapshot: refused, nothing committed."""
    world.policy = make_policy(authority={"rewind": ["agent"]})
    _, session, after = three_writes(world)
    first = min(after)
    files, before = world.sandbox.files, session.state.generation
    with sqlite3.connect(world.db) as conn:
        # The first write's content blob: the only blob the restore needs to write.
        wanted = digest_bytes(after[first].encode())
        conn.execute("DELETE FROM tether_blobs WHERE digest = ?", (wanted,))
    with pytest.raises(RewindRefusedError, match="not whole"):
        session.rewind(first, "snapshot damaged")
    assert session.state.generation == before == mark(world)
    assert world.sandbox.files == files


def test_a_restore_that_fails_after_the_plan_freezes_the_run_in_one_commit(
    world: World,
) -> None:
    """The plan is dropped and the run parked in ONE commit: it never runs on unreviewed."""
    world.policy = make_policy(authority={"rewind": ["agent"]})
    _, session, after = three_writes(world)
    files, before = world.sandbox.files, session.state.generation

    def damaged(*args: Any, **kwargs: Any) -> Any:
        raise CheckpointCorruptError("snapshot blob sha256:00 is missing from the store")

    world.sandbox.restore_snapshot = damaged  # type: ignore[method-assign]
    outcome = session.rewind(min(after), "restore fails")
    assert outcome.kind is OutcomeKind.FROZEN
    state = session.state
    assert state.phase is Phase.NEEDS_REVIEW and state.rewinding is None
    assert state.review_cases[-1].reason == "rewind_failed"
    assert state.review_cases[-1].evidence[-1]["kind"] == "rewind_plan"
    kinds = [e.kind for e in session.trace()]
    assert kinds[-3:] == ["rewind_started", "rewind_abandoned", "needs_review"]
    # The plan's commit, then ONE commit for the last two: the abandoned plan never stands alone.
    assert state.generation == before + 2 == mark(world)
    assert world.sandbox.files == files


def test_a_point_inside_a_stretch_an_earlier_rewind_left_is_refused(world: World) -> None:
    """After 7 -> 3, generation 5 belongs to the abandoned suffix: it is not a rewind point."""
    world.policy = make_policy(authority={"rewind": ["agent"]})
    _rt, session, after = three_writes(world)
    first, last = min(after), max(after)
    session.rewind(first, "first rewind")
    with pytest.raises(RewindRefusedError, match="left behind"):
        session.rewind(last, "back into the abandoned stretch")
    session.step()  # the agent writes v2 again, a new effect
    session.rewind(first, "second rewind")
    memory = session.context.memory[REWIND_MEMORY_KEY]
    assert [m["reason"] for m in memory] == ["first rewind", "second rewind"]


def test_a_signed_rewind_is_applied_as_signed_or_not_at_all(world: World) -> None:
    """A caller cannot change the target, reason or scope a person signed."""
    rt, session, after = three_writes(world, trust=TRUST)
    first = min(after)
    document = signed_rewind(rt, first, "as signed")
    with pytest.raises(RewindRefusedError, match="as signed or not at all"):
        session.rewind(first + 1, document=document)
    with pytest.raises(RewindRefusedError, match="as signed or not at all"):
        session.rewind(document=document, scope="files")
    assert session.rewind(document=document).reason == "rewound"


def test_an_agent_without_rewind_authority_cannot_make_the_run_record_anything(
    world: World,
) -> None:
    """The split check comes after admission: a refused principal adds no generation."""
    _, session, after = three_writes(world)
    before = session.state.generation
    with pytest.raises(AdmissionRefusedError):
        session.rewind(min(after), "split without authority", scope="files")
    assert session.state.generation == before == mark(world)


def test_a_rewind_delivered_through_the_inbox_is_read_once(world: World) -> None:
    """Applied by the next step after a recovery: the recovery's record is kept, no refusal traced."""
    rt, _session, after = three_writes(world, trust=TRUST)
    first = min(after)
    rt.store.put_evidence("run-r", "rewind", signed_rewind(rt, first, "from the inbox"))
    again = world.runtime(agent(), trust=TRUST).recover("run-r")
    again.step()
    again.step()
    kinds = [e.kind for e in again.trace()]
    assert "rewound" in kinds and "evidence_refused" not in kinds
    started = next(e for e in again.trace() if e.kind == "rewind_started").data
    assert rt.store.has_blob(started["recovered"]["admission"])
    assert again.state.inbox_cursor == 1


def test_a_session_asks_the_store_about_blobs_once_then_takes_a_steps_new_ones_as_new(
    world: World,
) -> None:
    """A recovered session's first snapshot asks the store; its later write steps read nothing first."""
    _, session, _ = three_writes(world)
    session.release()
    again = world.runtime(agent())
    asked: list[int] = []
    stored_blobs = again.store.stored_blobs

    def counting(digests: Any) -> set[str]:
        asked.append(len(list(digests)))
        return stored_blobs(digests)

    again.store.stored_blobs = counting  # type: ignore[method-assign]
    resumed = again.recover("run-r")
    resumed.step()
    resumed.step()  # its commit records the first write's rest point: a snapshot
    first = len(asked)
    assert first >= 1
    resumed.step()
    resumed.step()
    assert len(asked) == first
    assert world.sandbox.files["notes.txt"] == "v7\n"
