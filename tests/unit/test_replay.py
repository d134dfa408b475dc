"""Replay or fork: the pure rule, and a run that re-proposes an effect it already made."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, finish, write
from tether.adapters import Sandbox
from tether.cli import main
from tether.core import (
    Capabilities,
    EffectHistory,
    EffectStatus,
    EvidenceBindingError,
    KnownEffect,
    LookupAnswer,
    LookupStatus,
    NonceReusedError,
    OutcomeKind,
    Phase,
    Proposal,
    Receipt,
    RunState,
    UnknownSignerError,
    new_decision,
    new_fork,
    replay_rules,
)
from tether.crypto import Signer, TrustRoots
from tether.runtime import CrashPlan, CrashPoint, RunSession, SimulatedCrash

REVIEWER = Signer.generate("rev", "reviewer")
OPERATOR = Signer.generate("ops", "operator")
MALLORY = Signer.generate("mallory", "reviewer")
TRUST = TrustRoots.of(REVIEWER.trust_root(), OPERATOR.trust_root())

EFFECT = "sha256:" + "e" * 64
RECEIPT: dict[str, Any] = {"receipt_id": "rcpt-1", "result": {"ok": True}}
COMMITTED = KnownEffect(EFFECT, "a0", "idem-1", "sha256:" + "1" * 64, RECEIPT)
UNSETTLED = KnownEffect(EFFECT, "a0", "idem-1", "sha256:" + "1" * 64, None)
DEDUPS = Capabilities(idempotent=True, queryable=True, conditional_writes=True)
FINAL = Capabilities(idempotent=False, queryable=True, conditional_writes=True)
GUESSES = Capabilities(
    idempotent=False, queryable=True, conditional_writes=True, absent_is_final=False
)
BLIND = Capabilities(idempotent=False, queryable=False, conditional_writes=True)


def _state(world: World, run_id: str = "r1") -> RunState:
    return world.runtime(ScriptedAgent([finish])).start(run_id).state


def _answer(status: LookupStatus, world: World | None = None) -> LookupAnswer:
    if status is not LookupStatus.COMMITTED or world is None:
        return LookupAnswer(status)
    env = world.sandbox.environment()
    receipt = Receipt("sandbox", "1", "rcpt-9", "idem-1", "sha256:x", {}, "b", "t", env)
    return LookupAnswer(status, receipt)


# record, capabilities, look-up answer -> what decide returns (outcome, or "proceed"/reason)
CASES = [
    (None, BLIND, None, "proceed"),
    (EffectHistory(), BLIND, None, "proceed"),
    (EffectHistory(committed=COMMITTED), BLIND, None, OutcomeKind.REPLAYED),
    (EffectHistory(committed=COMMITTED), DEDUPS, None, OutcomeKind.REPLAYED),
    (EffectHistory(unsettled=UNSETTLED), BLIND, None, replay_rules.REPLAY_OF_UNKNOWN),
    (EffectHistory(COMMITTED, UNSETTLED), BLIND, None, replay_rules.REPLAY_OF_UNKNOWN),
    (EffectHistory(unsettled=UNSETTLED), DEDUPS, LookupStatus.COMMITTED, OutcomeKind.REPLAYED),
    (EffectHistory(unsettled=UNSETTLED), FINAL, LookupStatus.ABSENT, "proceed"),
    (EffectHistory(unsettled=UNSETTLED), DEDUPS, LookupStatus.REFUSED, "proceed"),
    (
        EffectHistory(unsettled=UNSETTLED),
        GUESSES,
        LookupStatus.ABSENT,
        replay_rules.REPLAY_OF_UNKNOWN,
    ),
    (EffectHistory(unsettled=UNSETTLED), DEDUPS, LookupStatus.IN_PROGRESS, OutcomeKind.RETRY_LATER),
    (EffectHistory(unsettled=UNSETTLED), DEDUPS, LookupStatus.UNAVAILABLE, OutcomeKind.RETRY_LATER),
]


@pytest.mark.parametrize(("record", "caps", "status", "expected"), CASES)
def test_the_replay_rule_table(
    world: World,
    record: EffectHistory | None,
    caps: Capabilities,
    status: LookupStatus | None,
    expected: object,
) -> None:
    """Each row of the rule: replay a commit, settle an unsettled attempt by its key, or freeze."""
    state = _state(world)
    decided = replay_rules.decide(
        state,
        Proposal("a5", "file.write", "notes.txt", {"content": "x"}),
        effect=EFFECT,
        record=record,
        capabilities=caps,
        answer=None if status is None else _answer(status, world),
        case_id="case-1",
        now=world.clock.now(),
        live=state.environment,
    )
    if expected == "proceed":
        assert isinstance(decided, replay_rules.Proceed) and decided.state is state
        return
    assert not isinstance(decided, replay_rules.Proceed)
    if expected == replay_rules.REPLAY_OF_UNKNOWN:
        assert decided.outcome is OutcomeKind.FROZEN and decided.reason == expected
        assert decided.state is not None and decided.state.pending is None
        return
    assert decided.outcome is expected
    if expected is OutcomeKind.REPLAYED:
        assert decided.state is not None
        assert decided.state.writes_committed == state.writes_committed
        assert decided.state.spent.proposals == state.spent.proposals + 1
        assert decided.ledger == () and decided.call is None
        kind, data = decided.events[0]
        assert kind == "effect_replayed" and data["replay_of"] == "a0"
    else:
        assert decided.state is None  # nothing moves while the earlier attempt is unsettled


def test_an_armed_fork_lets_the_effect_proceed_once(world: World) -> None:
    """A fork armed for the digest is consumed by the proposal, which then proceeds."""
    state = _state(world).evolve(forks=(EFFECT,), fork_nonces=("n" * 16,))
    decided = replay_rules.decide(
        state,
        Proposal("a5", "file.write", "notes.txt", {"content": "x"}),
        effect=EFFECT,
        record=EffectHistory(committed=COMMITTED),
        capabilities=BLIND,
        answer=None,
        case_id="case-1",
        now=world.clock.now(),
        live=state.environment,
    )
    assert isinstance(decided, replay_rules.Proceed)
    assert decided.state.forks == () and decided.state.fork_nonces == ("n" * 16,)
    assert decided.events[0][0] == "fork_used"
    again = RunState.from_json(state.to_json())
    assert again.forks == (EFFECT,) and again.fork_nonces == ("n" * 16,)
    assert "forks" not in _state(world, "r2").to_json()  # a run that never forks keeps its payload


# -- a run --------------------------------------------------------------------


def session_of(world: World, steps: list[Any], **kw: Any) -> RunSession:
    return world.runtime(ScriptedAgent(steps), trust=TRUST, **kw).start("r1")


def fork_document(
    world: World, session: RunSession, effect: str, signer: Signer = REVIEWER, **changes: Any
) -> dict[str, Any]:
    known = session.effects[effect].current
    assert known is not None
    now = world.clock.now()
    body = new_fork(
        session.state,
        known,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    body.update(changes)
    return signer.sign(body)


SAME = [write("notes.txt", "hello\n", f"a{i}") for i in range(4)]


def test_the_same_effect_twice_in_one_epoch_is_replayed(world: World) -> None:
    """The second proposal of the same content returns the first receipt and writes nothing."""
    session = session_of(world, [*SAME[:2], finish])
    assert session.step().kind is OutcomeKind.EXECUTED
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REPLAYED, "effect_replayed")
    assert world.sandbox.write_count() == 1
    assert session.state.writes_committed == 1
    result = session.results()[0]
    assert (result.action_id, result.outcome, result.data["replay_of"]) == ("a1", "replayed", "a0")
    event = session.trace()[-1]
    first_key = world.store().ledger("r1")[0].idempotency_key
    assert event.kind == "effect_replayed" and event.data["idempotency_key"] == first_key
    assert [e.status for e in world.store().ledger("r1")][-1] is EffectStatus.COMMITTED
    assert len(world.store().ledger("r1")) == 3  # intended, dispatched, committed: no more
    assert session.run().phase is Phase.COMPLETED


def test_different_content_is_a_new_effect(world: World) -> None:
    """Another content to the same path executes."""
    session = session_of(world, [write("notes.txt", "one\n"), write("notes.txt", "two\n"), finish])
    assert session.run().phase is Phase.COMPLETED
    assert world.sandbox.write_count() == 2


def test_every_ledger_entry_names_its_effect_digest(world: World) -> None:
    """The digest sits under each entry's hash; the chain verifies with it."""
    session = session_of(world, [*SAME[:1], finish])
    session.run()
    entries = world.store().ledger("r1")
    digests = {e.terms.effect for e in entries if e.terms is not None}
    assert len(digests) == 1 and None not in digests
    assert world.runtime(ScriptedAgent([finish])).checkpointer.verified_ledger(session.state)


def test_a_signed_fork_lets_the_effect_happen_exactly_once_more(world: World) -> None:
    """Replayed, then forked: the next proposal writes again; the one after is replayed again."""
    session = session_of(world, [*SAME, finish])
    session.step()
    assert session.step().kind is OutcomeKind.REPLAYED
    effect = next(iter(session.effects))
    session.fork(fork_document(world, session, effect, signer=OPERATOR))
    assert session.state.forks == (effect,)
    assert session.step().kind is OutcomeKind.EXECUTED
    assert world.sandbox.write_count() == 2 and session.state.forks == ()
    assert session.step().kind is OutcomeKind.REPLAYED
    assert world.sandbox.write_count() == 2
    kinds = [e.kind for e in session.trace()]
    assert kinds.count("fork_recorded") == 1 and kinds.count("fork_used") == 1


def test_forged_mis_bound_and_replayed_forks_are_refused_and_traced(world: World) -> None:
    """An unknown signer, another receipt, or a used nonce: refused, traced, nothing armed."""
    session = session_of(world, [*SAME, finish])
    session.step()
    effect = next(iter(session.effects))
    with pytest.raises(UnknownSignerError):
        session.fork(fork_document(world, session, effect, signer=MALLORY))
    with pytest.raises(EvidenceBindingError):
        session.fork(fork_document(world, session, effect, receipt_id="rcpt-other"))
    document = fork_document(world, session, effect)
    session.fork(document)
    assert session.step().kind is OutcomeKind.EXECUTED  # the fork is used
    with pytest.raises(EvidenceBindingError):  # bound to the receipt that stood then
        session.fork(document)
    refused = [e for e in session.trace() if e.kind == "evidence_refused"]
    assert [e.data["kind"] for e in refused] == ["fork", "fork", "fork"]
    assert session.state.forks == () and world.sandbox.write_count() == 2


def test_a_fork_nonce_is_never_accepted_twice(world: World) -> None:
    """The same signed fork delivered twice arms once."""
    session = session_of(world, [*SAME, finish])
    session.step()
    effect = next(iter(session.effects))
    document = fork_document(world, session, effect)
    session.fork(document)
    with pytest.raises(NonceReusedError):
        session.fork(document)
    assert session.state.forks == (effect,)


def test_a_fork_left_in_the_inbox_is_consumed_by_the_next_step(world: World) -> None:
    """Delivered through the store like other evidence, and it survives a recovery."""
    session = session_of(world, [*SAME, finish])
    session.step()
    effect = next(iter(session.effects))
    world.store().put_evidence("r1", "fork", fork_document(world, session, effect))
    recovered = world.runtime(ScriptedAgent([*SAME, finish]), trust=TRUST).recover("r1")
    assert set(recovered.effects) == {effect}
    assert recovered.step().kind is OutcomeKind.EXECUTED
    assert world.sandbox.write_count() == 2
    assert recovered.step().kind is OutcomeKind.REPLAYED


def test_replaying_an_effect_of_unknown_outcome_on_a_blind_adapter_needs_review(
    world: World,
) -> None:
    """Sent, outcome unknown, replanned: the same effect proposed again freezes, sends nothing."""
    world.sandbox = Sandbox(
        {"notes.txt": "draft\n"},
        instance_id="sbx-1",
        idempotent=False,
        queryable=False,
        clock=world.clock.now,
    )
    steps = [*SAME, finish]
    with pytest.raises(SimulatedCrash):
        session_of(world, steps, crash=CrashPlan(CrashPoint.EFFECT_SENT)).run()
    session = world.runtime(ScriptedAgent(steps), trust=TRUST).recover("r1")
    session.step()
    assert session.state.review_cases[0].reason == "outcome_unknown"
    now = world.clock.now()
    body = new_decision(
        session.state,
        session.state.review_cases[0],
        REVIEWER.signer_id,
        "replan",
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    session.review(REVIEWER.sign(body))
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.FROZEN, "replay_of_unknown_effect")
    assert world.sandbox.write_count() == 1
    case = session.state.review_cases[0]
    first_key = world.store().ledger("r1")[0].idempotency_key
    assert case.evidence[0]["earlier_idempotency_key"] == first_key


def test_tether_fork_signs_a_fork_a_run_reads_from_its_inbox(world: World, tmp_path: Path) -> None:
    """`tether fork` binds the effect's receipt from the verified ledger; the run uses it once."""
    world.clock.moment = datetime.now(UTC)  # the command signs on the wall clock
    session = session_of(world, [*SAME, finish])
    session.step()
    effect = next(iter(session.effects))
    keyring = tmp_path / "keyring.json"
    world.keyring.write_file(keyring)
    assert main(["keys", "new", "--role", "operator", "--id", "ops2", "--out", str(tmp_path)]) == 0
    command = ["fork", "r1", effect, "--key", str(tmp_path / "ops2.key"), "--db", str(world.db)]
    assert main([*command, "--keyring", str(keyring), "--ttl", "300", "--yes"]) == 0
    trust = TrustRoots.from_file(tmp_path / "ops2.trust.json")
    recovered = world.runtime(ScriptedAgent([*SAME, finish]), trust=trust).recover("r1")
    assert recovered.step().kind is OutcomeKind.EXECUTED
    assert recovered.step().kind is OutcomeKind.REPLAYED
    assert world.sandbox.write_count() == 2
    unknown = [*command[:2], "sha256:" + "0" * 64, *command[3:]]
    assert main([*unknown, "--ttl", "300", "--yes"]) == 1  # an effect no ledger records


def test_an_unsettled_earlier_attempt_is_settled_by_its_own_key_not_sent_again(
    world: World,
) -> None:
    """Sent, parked and replanned unsettled: the same effect again is looked up by the old key."""
    steps = [*SAME, finish]
    with pytest.raises(SimulatedCrash):
        session_of(world, steps, crash=CrashPlan(CrashPoint.EFFECT_SENT)).run()
    session = world.runtime(ScriptedAgent(steps), trust=TRUST).recover("r1")
    session.park("worker_error", "the drive kept failing")
    now = world.clock.now()
    body = new_decision(
        session.state,
        session.state.review_cases[0],
        REVIEWER.signer_id,
        "replan",
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    session.review(REVIEWER.sign(body))
    effect = next(iter(session.effects))
    assert session.effects[effect].unsettled is not None
    outcome = session.step()
    assert (outcome.kind, outcome.reason) == (OutcomeKind.REPLAYED, "effect_replayed")
    assert session.trace()[-1].data["settled_by"] == "lookup"
    assert world.sandbox.write_count() == 1
