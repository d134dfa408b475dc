"""Replay or fork: the pure rule, and a run that re-proposes an effect it already made."""

from __future__ import annotations

import secrets
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, finish, write
from tether.cli import main
from tether.core import (
    Capabilities,
    EffectStatus,
    EnvironmentState,
    EvidenceBindingError,
    NonceReusedError,
    OutcomeKind,
    Phase,
    Proposal,
    Receipt,
    RunState,
    Targets,
    UnknownSignerError,
    new_decision,
    new_fork,
)
from tether.core import _replay as replay_rules
from tether.core import _steps as step_rules
from tether.core._ledger import redact_receipt
from tether.core._replay import EffectHistory, KnownEffect
from tether.core._transition import LookupAnswer, LookupStatus
from tether.crypto import Signer, TrustRoots
from tether.runtime import CrashPlan, CrashPoint, RunSession, SimulatedCrash
from tether.testing import Sandbox

REVIEWER = Signer.generate("rev", "reviewer")
OPERATOR = Signer.generate("ops", "operator")
MALLORY = Signer.generate("mallory", "reviewer")
TRUST = TrustRoots.of(REVIEWER.trust_root(), OPERATOR.trust_root())

EFFECT = "sha256:" + "e" * 64
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ENV = EnvironmentState("sandbox", "sbx-1", 3, "sha256:" + "f" * 64)
INTENT = "sha256:" + "1" * 64
OTHER_INTENT = "sha256:" + "2" * 64
ADAPTER_RECEIPT = Receipt(
    "sandbox", "1", "rcpt-1", "idem-1", INTENT, {"ok": True}, "obj-1", "2026-01-01T00:00:00Z", ENV
)
RECEIPT: dict[str, Any] = ADAPTER_RECEIPT.to_json()
COMMITTED = KnownEffect(EFFECT, "a0", "idem-1", INTENT, RECEIPT, T0)
UNSETTLED = KnownEffect(EFFECT, "a0", "idem-1", INTENT, None, T0)
DEDUPS = Capabilities(idempotent=True, queryable=True, conditional_writes=True)
FINAL = Capabilities(idempotent=False, queryable=True, conditional_writes=True)
GUESSES = Capabilities(
    idempotent=False, queryable=True, conditional_writes=True, absent_is_final=False
)
BLIND = Capabilities(idempotent=False, queryable=False, conditional_writes=True)
DEDUPS_ONLY = Capabilities(idempotent=True, queryable=False, conditional_writes=True)
REMOTE = Capabilities(idempotent=False, queryable=True, conditional_writes=False, stateful=False)
# A function effect declaring `holds`: no environment, but it can read a target's state.
TRACKED = replace(REMOTE, target_state=True)
TRACKED_BLIND = replace(TRACKED, queryable=False)
# Untracked targets, as declared: what A, B, A is where nothing can read the target.
STATE = replace(REMOTE, targets=Targets.STATE)
COLLECTION = replace(REMOTE, targets=Targets.COLLECTION)
UNKNOWN = replace(REMOTE, targets=Targets.UNKNOWN)
STATE_BLIND = replace(STATE, queryable=False)
COLLECTION_BLIND = replace(COLLECTION, queryable=False)
TRACKED_COLLECTION = replace(TRACKED, targets=Targets.COLLECTION)
FORGETS = Capabilities(idempotent=False, queryable=True, conditional_writes=True, retention_s=60)

ST = LookupStatus
DONE = EffectHistory(committed=COMMITTED)
OPEN = EffectHistory(unsettled=UNSETTLED)
BOTH = EffectHistory(COMMITTED, UNSETTLED)


def _found(receipt: Receipt = ADAPTER_RECEIPT) -> LookupAnswer:
    return LookupAnswer(ST.COMMITTED, receipt)


DRIFTED = replace(ADAPTER_RECEIPT, result={"ok": False})
FOREIGN = replace(ADAPTER_RECEIPT, intent_digest=OTHER_INTENT, receipt_id="rcpt-x")
V = replay_rules.Verdict
OW = replay_rules.Overwrite

# (what the ledger knows, capabilities, extra facts, look-up answer) -> (verdict, reason, by)
JUDGE_CASES: list[tuple[str, EffectHistory | None, Capabilities, dict[str, Any], Any, Any]] = [
    ("nothing known", None, BLIND, {}, None, (V.PROCEED, "new_effect", "")),
    ("an empty history", EffectHistory(), DEDUPS, {}, None, (V.PROCEED, "new_effect", "")),
    ("a fork armed", DONE, DEDUPS, {"forked": True}, None, (V.FORKED, "fork_used", "")),
    ("a fork beats an unknown", OPEN, BLIND, {"forked": True}, None, (V.FORKED, "fork_used", "")),
    # an unsettled attempt: only the adapter, asked by its key, can say
    ("unsettled, blind", OPEN, BLIND, {}, None, (V.REVIEW, "replay_of_unknown_effect", "")),
    ("unsettled, dedups only", OPEN, DEDUPS_ONLY, {}, None,
     (V.REVIEW, "replay_of_unknown_effect", "")),
    ("unsettled beside a commit", BOTH, BLIND, {}, None,
     (V.REVIEW, "replay_of_unknown_effect", "")),
    ("unsettled, it landed", OPEN, DEDUPS, {}, _found(), (V.REPLAY, "effect_replayed", "lookup")),
    ("unsettled, it landed, target since moved", OPEN, DEDUPS, {"target_moved": True}, _found(),
     (V.PROCEED, "target_moved", "")),
    ("unsettled, another intent under the key", OPEN, DEDUPS, {}, _found(FOREIGN),
     (V.REVIEW, "key_conflict", "")),
    ("unsettled, refused", OPEN, DEDUPS, {}, LookupAnswer(ST.REFUSED),
     (V.PROCEED, "never_landed", "")),
    ("unsettled, absent and final", OPEN, FINAL, {}, LookupAnswer(ST.ABSENT),
     (V.PROCEED, "never_landed", "")),
    ("unsettled, absent, not final", OPEN, GUESSES, {}, LookupAnswer(ST.ABSENT),
     (V.REVIEW, "replay_of_unknown_effect", "")),
    ("unsettled, absent within retention", OPEN, FORGETS,
     {"now": T0 + timedelta(seconds=60), "key_age_s": 60.0},
     LookupAnswer(ST.ABSENT), (V.PROCEED, "never_landed", "")),
    ("unsettled, absent past retention", OPEN, FORGETS,
     {"now": T0 + timedelta(seconds=61), "key_age_s": 61.0},
     LookupAnswer(ST.ABSENT), (V.REVIEW, "replay_of_unknown_effect", "")),
    # The key's age on the store's clock: a runtime clock behind cannot make it younger.
    ("unsettled, absent, runtime clock 30 s behind the store", OPEN, FORGETS,
     {"now": T0 + timedelta(seconds=40), "key_age_s": 70.0},
     LookupAnswer(ST.ABSENT), (V.REVIEW, "replay_of_unknown_effect", "")),
    ("unsettled, absent, the store says young, the runtime old", OPEN, FORGETS,
     {"now": T0 + timedelta(seconds=70), "key_age_s": 5.0},
     LookupAnswer(ST.ABSENT), (V.REVIEW, "replay_of_unknown_effect", "")),
    ("unsettled, absent, the store cannot say: a skew margin", OPEN, FORGETS,
     {"now": T0 + timedelta(seconds=1)},
     LookupAnswer(ST.ABSENT), (V.REVIEW, "replay_of_unknown_effect", "")),
    ("unsettled, in flight", OPEN, DEDUPS, {}, LookupAnswer(ST.IN_PROGRESS),
     (V.WAIT, "in_flight", "")),
    ("unsettled, unreachable", OPEN, DEDUPS, {}, LookupAnswer(ST.UNAVAILABLE),
     (V.WAIT, "adapter_unavailable", "")),
    # a commit: the adapter, where it can be asked, must agree field for field
    ("committed, blind", DONE, BLIND, {}, None, (V.REPLAY, "effect_replayed", "ledger")),
    ("committed, dedups only", DONE, DEDUPS_ONLY, {}, None,
     (V.REPLAY, "effect_replayed", "ledger")),
    ("committed, the adapter agrees", DONE, DEDUPS, {}, _found(),
     (V.REPLAY, "effect_replayed", "adapter")),
    ("committed remotely, the adapter agrees", DONE, REMOTE, {"target_moved": True}, _found(),
     (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, the result drifted", DONE, DEDUPS, {}, _found(DRIFTED),
     (V.REVIEW, "receipt_drift", "")),
    ("committed, another intent's receipt", DONE, DEDUPS, {}, _found(FOREIGN),
     (V.REVIEW, "receipt_drift", "")),
    ("committed, the receipt is gone", DONE, DEDUPS, {}, LookupAnswer(ST.ABSENT),
     (V.REVIEW, "receipt_missing", "")),
    ("committed, past retention", DONE, FORGETS, {"now": T0 + timedelta(days=9)},
     LookupAnswer(ST.ABSENT), (V.REVIEW, "receipt_missing", "")),
    ("committed, refused", DONE, DEDUPS, {}, LookupAnswer(ST.REFUSED),
     (V.REVIEW, "receipt_missing", "")),
    ("committed, unreachable", DONE, DEDUPS, {}, LookupAnswer(ST.UNAVAILABLE),
     (V.WAIT, "adapter_unavailable", "")),
    ("committed, the target moved (A, B, A)", DONE, DEDUPS, {"target_moved": True}, None,
     (V.PROCEED, "target_moved", "")),
    ("committed, blind, the target moved", DONE, BLIND, {"target_moved": True}, None,
     (V.PROCEED, "target_moved", "")),
    # a tracked target without an environment (a function declaring `holds`)
    ("committed, tracked, the target holds it", DONE, TRACKED, {}, _found(),
     (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, tracked, the target moved (A, B, A)", DONE, TRACKED, {"target_moved": True},
     None, (V.PROCEED, "target_moved", "")),
    ("committed, tracked, the target unreadable", DONE, TRACKED, {"target_moved": None}, None,
     (V.WAIT, "adapter_unavailable", "")),
    ("committed, tracked blind, the target holds it", DONE, TRACKED_BLIND, {}, None,
     (V.REPLAY, "effect_replayed", "ledger")),
    ("committed, tracked blind, the target moved", DONE, TRACKED_BLIND, {"target_moved": True},
     None, (V.PROCEED, "target_moved", "")),
    ("committed remotely, untracked, unreadable", DONE, REMOTE, {"target_moved": None}, _found(),
     (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, stateful, the target unreadable", DONE, BLIND, {"target_moved": None}, None,
     (V.WAIT, "adapter_unavailable", "")),
    ("unsettled, tracked, it landed, the target moved", OPEN, TRACKED, {"target_moved": True},
     _found(), (V.PROCEED, "target_moved", "")),
    ("unsettled, tracked, it landed, unreadable", OPEN, TRACKED, {"target_moved": None},
     _found(), (V.WAIT, "adapter_unavailable", "")),
    ("unsettled, tracked, absent and final", OPEN, TRACKED, {"target_moved": True},
     LookupAnswer(ST.ABSENT), (V.PROCEED, "never_landed", "")),
    # A, B, A on a target nothing can read: the ledger saw B committed on it since
    ("committed, state, overwritten since", DONE, STATE, {"overwritten": OW.YES}, None,
     (V.PROCEED, "target_moved", "")),
    ("committed, state blind, overwritten since", DONE, STATE_BLIND, {"overwritten": OW.YES},
     None, (V.PROCEED, "target_moved", "")),
    ("committed, collection, overwritten since", DONE, COLLECTION, {"overwritten": OW.YES},
     _found(), (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, collection blind, overwritten since", DONE, COLLECTION_BLIND,
     {"overwritten": OW.YES}, None, (V.REPLAY, "effect_replayed", "ledger")),
    ("committed, unknown, overwritten since", DONE, UNKNOWN, {"overwritten": OW.YES}, None,
     (V.REVIEW, "repeat_or_revert", "")),
    ("committed, unknown blind, overwritten since", DONE, replace(UNKNOWN, queryable=False),
     {"overwritten": OW.YES}, None, (V.REVIEW, "repeat_or_revert", "")),
    ("committed, unknown, nothing since", DONE, UNKNOWN, {}, _found(),
     (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, undeclared (a collection), overwritten since", DONE, REMOTE,
     {"overwritten": OW.YES}, _found(), (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, state, nothing since", DONE, STATE, {}, _found(),
     (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, tracked, overwritten but the target holds it", DONE, TRACKED_COLLECTION,
     {"overwritten": OW.YES}, _found(), (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, stateful, overwritten but the target holds it", DONE, DEDUPS,
     {"overwritten": OW.YES}, _found(), (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, unknown, overwritten, gated", DONE, UNKNOWN,
     {"overwritten": OW.YES, "needs_approval": True}, None, (V.REVIEW, "repeat_or_revert", "")),
    ("unsettled, unknown, it landed, overwritten since", OPEN, UNKNOWN,
     {"overwritten": OW.YES}, _found(), (V.REVIEW, "repeat_or_revert", "")),
    ("unsettled, state, it landed, overwritten since", OPEN, STATE, {"overwritten": OW.YES},
     _found(), (V.PROCEED, "target_moved", "")),
    ("unsettled, collection, it landed, overwritten since", OPEN, COLLECTION,
     {"overwritten": OW.YES}, _found(), (V.REPLAY, "effect_replayed", "lookup")),
    ("unsettled, state, absent, overwritten since", OPEN, replace(STATE, absent_is_final=True),
     {"overwritten": OW.YES}, LookupAnswer(ST.ABSENT), (V.PROCEED, "never_landed", "")),
    # A, B?, A: B was sent to the target since, its outcome unknown (it may land yet)
    ("committed, state, another's outcome unknown since", DONE, STATE, {"overwritten": OW.MAYBE},
     None, (V.REVIEW, "repeat_or_revert", "")),
    ("committed, state blind, another's outcome unknown since", DONE, STATE_BLIND,
     {"overwritten": OW.MAYBE}, None, (V.REVIEW, "repeat_or_revert", "")),
    ("committed, unknown, another's outcome unknown since", DONE, UNKNOWN,
     {"overwritten": OW.MAYBE}, None, (V.REVIEW, "repeat_or_revert", "")),
    ("committed, collection blind, another's outcome unknown since", DONE, COLLECTION_BLIND,
     {"overwritten": OW.MAYBE}, None, (V.REPLAY, "effect_replayed", "ledger")),
    ("committed, collection, another's outcome unknown since", DONE, COLLECTION,
     {"overwritten": OW.MAYBE}, _found(), (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, tracked, another's outcome unknown but the target holds it", DONE,
     TRACKED_COLLECTION, {"overwritten": OW.MAYBE}, _found(),
     (V.REPLAY, "effect_replayed", "adapter")),
    ("committed, state, gated, another's outcome unknown since", DONE, STATE,
     {"overwritten": OW.MAYBE, "needs_approval": True}, None, (V.REVIEW, "repeat_or_revert", "")),
    ("unsettled, state, it landed, another's outcome unknown since", OPEN, STATE,
     {"overwritten": OW.MAYBE}, _found(), (V.REVIEW, "repeat_or_revert", "")),
    ("unsettled, state blind, another's outcome unknown since", OPEN, STATE_BLIND,
     {"overwritten": OW.MAYBE}, None, (V.REVIEW, "replay_of_unknown_effect", "")),
    # a gated kind: a replay waits for its approval
    ("committed, gated", DONE, DEDUPS, {"needs_approval": True}, _found(),
     (V.HOLD, "approval_required", "adapter")),
    ("committed, gated, approved", DONE, DEDUPS, {"needs_approval": True, "approved": True},
     _found(), (V.REPLAY, "effect_replayed", "adapter")),
    ("unsettled, gated, it landed", OPEN, DEDUPS, {"needs_approval": True}, _found(),
     (V.HOLD, "approval_required", "lookup")),
    ("gated, but nothing known", None, DEDUPS, {"needs_approval": True}, None,
     (V.PROCEED, "new_effect", "")),
    ("gated, unknown outcome", OPEN, BLIND, {"needs_approval": True}, None,
     (V.REVIEW, "replay_of_unknown_effect", "")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("record", "caps", "extra", "answer", "expected"),
    [case[1:] for case in JUDGE_CASES],
    ids=[case[0] for case in JUDGE_CASES],
)
def test_the_replay_rule_table(
    record: EffectHistory | None,
    caps: Capabilities,
    extra: dict[str, Any],
    answer: LookupAnswer | None,
    expected: tuple[replay_rules.Verdict, str, str],
) -> None:
    """Each row of the replay rule: replay, proceed, hold, wait or review, and by whose word."""
    facts = replay_rules.ReplayFacts(
        record=record, capabilities=caps, now=extra.pop("now", T0), answer=answer, **extra
    )
    judgement = replay_rules.judge(facts)
    assert (judgement.verdict, judgement.reason, judgement.settled_by) == expected
    if judgement.verdict in {V.REPLAY, V.HOLD}:
        assert judgement.receipt == RECEIPT  # the replay answers with the receipt itself
        assert judgement.fingerprint == ADAPTER_RECEIPT.fingerprint


def test_a_sensitive_kinds_redacted_copy_agrees_with_the_adapters_whole_receipt() -> None:
    """The ledger holds a sensitive result as its digest; the adapter's whole receipt still agrees."""
    redacted = KnownEffect(EFFECT, "a0", "idem-1", INTENT, redact_receipt(RECEIPT), T0)
    facts = replay_rules.ReplayFacts(
        record=EffectHistory(committed=redacted), capabilities=DEDUPS, now=T0, answer=_found()
    )
    judgement = replay_rules.judge(facts)
    assert (judgement.verdict, judgement.settled_by) == (V.REPLAY, "adapter")
    assert replay_rules.same_receipt(redact_receipt(RECEIPT) or {}, DRIFTED) is False


LOOKUP_CASES = [
    (None, DEDUPS, {}, None),
    (DONE, BLIND, {}, None),
    (OPEN, BLIND, {}, None),
    (DONE, DEDUPS, {"forked": True}, None),
    (OPEN, DEDUPS, {}, "idem-1"),
    (DONE, DEDUPS, {}, "idem-1"),
    (DONE, DEDUPS, {"target_moved": True}, None),
    (DONE, REMOTE, {"target_moved": True}, "idem-1"),
    (OPEN, DEDUPS, {"target_moved": True}, "idem-1"),
    (DONE, TRACKED, {}, "idem-1"),
    (DONE, TRACKED, {"target_moved": True}, None),
    (DONE, TRACKED, {"target_moved": None}, None),
    (DONE, REMOTE, {"target_moved": None}, "idem-1"),
    (OPEN, TRACKED, {"target_moved": None}, "idem-1"),
    (DONE, STATE, {"overwritten": OW.YES}, None),
    (DONE, UNKNOWN, {"overwritten": OW.YES}, None),
    (DONE, COLLECTION, {"overwritten": OW.YES}, "idem-1"),
    (DONE, STATE, {}, "idem-1"),
    (OPEN, REMOTE, {"overwritten": OW.YES}, "idem-1"),
    (DONE, STATE, {"overwritten": OW.MAYBE}, None),
    (DONE, COLLECTION, {"overwritten": OW.MAYBE}, "idem-1"),
    (OPEN, STATE, {"overwritten": OW.MAYBE}, "idem-1"),
]


ES = EffectStatus
B = "sha256:" + "b" * 64
# (the target's rows newest first as (key, effect, status), keys met before) -> what came since
SINCE_CASES: list[tuple[str, list[tuple[str, str, EffectStatus]], set[str], Any]] = [
    ("no rows: older rows decide", [], set(), None),
    ("ours is the newest", [("k1", EFFECT, ES.COMMITTED)], set(), OW.NO),
    ("another committed since", [("k2", B, ES.COMMITTED), ("k1", EFFECT, ES.COMMITTED)],
     set(), OW.YES),
    ("another compensated since (it was there)", [("k2", B, ES.COMPENSATED)], set(), OW.YES),
    ("another dispatched since", [("k2", B, ES.DISPATCHED), ("k1", EFFECT, ES.COMMITTED)],
     set(), OW.MAYBE),
    ("another's outcome unknown since", [("k2", B, ES.OUTCOME_UNKNOWN),
     ("k2", B, ES.DISPATCHED), ("k1", EFFECT, ES.COMMITTED)], set(), OW.MAYBE),
    ("another refused since: it never landed", [("k2", B, ES.REJECTED),
     ("k2", B, ES.DISPATCHED), ("k1", EFFECT, ES.COMMITTED)], set(), OW.NO),
    ("another cancelled since: it never landed", [("k2", B, ES.CANCELLED),
     ("k1", EFFECT, ES.COMMITTED)], set(), OW.NO),
    ("an intent alone never left", [("k2", B, ES.INTENDED), ("k1", EFFECT, ES.COMMITTED)],
     set(), OW.NO),
    ("a key's newest row is its status: settled newer, sent older",
     [("k2", B, ES.COMMITTED), ("k1", EFFECT, ES.COMMITTED), ("k2", B, ES.DISPATCHED)],
     set(), OW.YES),
    ("our own newer attempt refused, another committed before it",
     [("k3", EFFECT, ES.REJECTED), ("k2", B, ES.COMMITTED), ("k1", EFFECT, ES.COMMITTED)],
     set(), OW.YES),
    ("our own attempt unsettled is the newest", [("k3", EFFECT, ES.OUTCOME_UNKNOWN),
     ("k2", B, ES.COMMITTED)], set(), OW.NO),
    ("a key met on a newer page is passed over", [("k2", B, ES.DISPATCHED),
     ("k1", EFFECT, ES.COMMITTED)], {"k2"}, OW.NO),
    ("only settled misses: older rows decide", [("k2", B, ES.REJECTED)], set(), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "seen", "expected"),
    [case[1:] for case in SINCE_CASES],
    ids=[case[0] for case in SINCE_CASES],
)
def test_what_came_onto_a_target_since(
    rows: list[tuple[str, str, EffectStatus]], seen: set[str], expected: Any
) -> None:
    """The newest attempt on a target that may have landed decides: ours, a commit, or an unknown."""
    assert replay_rules.since_on_target(rows, EFFECT, set(seen)) == expected


@pytest.mark.parametrize(("record", "caps", "extra", "key"), LOOKUP_CASES)
def test_whom_the_rule_asks_first(
    record: EffectHistory | None, caps: Capabilities, extra: dict[str, Any], key: str | None
) -> None:
    """The key asked before judging: an unsettled attempt's, or a commit's the adapter can confirm."""
    assert replay_rules.lookup_key(record, caps, **extra) == key


def _state(world: World, run_id: str = "r1") -> RunState:
    return world.runtime(ScriptedAgent([finish])).start(run_id).state


def _decide(world: World, state: RunState, judgement: Any, budget: int = 50) -> Any:
    budgets = replace(world.task.budgets, proposals=budget)
    return replay_rules.decide(
        state,
        Proposal("a5", "file.write", "notes.txt", {"content": "x"}),
        judgement,
        effect=EFFECT,
        budgets=budgets,
        case_id="case-1",
        now=world.clock.now(),
        live=state.environment,
    )


def test_a_replay_answers_with_the_receipt_and_result_and_writes_nothing(world: World) -> None:
    """The agent's result carries the earlier action, the key, the receipt id and the result."""
    state = _state(world)
    decided = _decide(world, state, replay_rules.judge(replay_rules.ReplayFacts(
        record=DONE, capabilities=DEDUPS, now=T0, answer=_found())))  # fmt: skip
    assert decided.outcome is OutcomeKind.REPLAYED and decided.ledger == () and decided.call is None
    assert decided.state.writes_committed == state.writes_committed
    assert decided.state.spent.proposals == state.spent.proposals + 1
    kind, data = decided.events[0]
    assert kind == "effect_replayed" and data["replay_of"] == "a0"
    assert (data["receipt_id"], data["settled_by"]) == ("rcpt-1", "adapter")
    body = dict(decided.blobs)[decided.state.results_digest]
    (result,) = step_rules.decode_results(decided.state.results_digest, body)
    assert result.data["result"] == {"ok": True} and result.data["business_object_id"] == "obj-1"


def test_a_replay_that_spends_the_last_proposal_ends_the_run(world: World) -> None:
    """The budget's last proposal, spent on a replay, fails the run at once and traces it."""
    state = _state(world)
    judgement = replay_rules.judge(
        replay_rules.ReplayFacts(record=DONE, capabilities=BLIND, now=T0)
    )
    decided = _decide(world, state, judgement, budget=state.spent.proposals + 1)
    assert decided.state.phase is Phase.FAILED
    assert decided.state.stop_reason == "budget_exhausted:proposals"
    assert [kind for kind, _ in decided.events] == ["effect_replayed", "failed"]


def test_a_review_verdict_freezes_with_the_earlier_attempt_as_evidence(world: World) -> None:
    """Nothing sent, nothing replayed: the case names the earlier key and the reason."""
    state = _state(world)
    judgement = replay_rules.judge(
        replay_rules.ReplayFacts(
            record=DONE, capabilities=DEDUPS, now=T0, answer=LookupAnswer(ST.ABSENT)
        )
    )
    decided = _decide(world, state, judgement)
    assert (decided.outcome, decided.reason) == (OutcomeKind.FROZEN, "receipt_missing")
    assert decided.state.pending is None and decided.call is None
    evidence = decided.state.review_cases[0].evidence[0]
    assert evidence["earlier_idempotency_key"] == "idem-1"
    assert evidence["earlier_receipt_fingerprint"] == COMMITTED.receipt_fingerprint


def test_a_wait_verdict_moves_nothing(world: World) -> None:
    """An earlier attempt in flight: retry later, no state."""
    judgement = replay_rules.judge(
        replay_rules.ReplayFacts(
            record=OPEN, capabilities=DEDUPS, now=T0, answer=LookupAnswer(ST.IN_PROGRESS)
        )
    )
    decided = _decide(world, _state(world), judgement)
    assert decided.outcome is OutcomeKind.RETRY_LATER and decided.state is None


def test_an_armed_fork_lets_the_effect_proceed_once(world: World) -> None:
    """A fork armed for the digest is consumed by the proposal, which then proceeds."""
    state = _state(world).evolve(forks=(EFFECT,), fork_nonces=("n" * 16,))
    judgement = replay_rules.judge(
        replay_rules.ReplayFacts(record=DONE, capabilities=BLIND, now=T0, forked=True)
    )
    decided = _decide(world, state, judgement)
    assert isinstance(decided, replay_rules.Proceed)
    assert decided.state.forks == () and decided.state.fork_nonces == ("n" * 16,)
    assert decided.events[0][0] == "fork_used"
    again = RunState.from_json(state.to_json())
    assert again.forks == (EFFECT,) and again.fork_nonces == ("n" * 16,)
    assert "forks" not in _state(world, "r2").to_json()  # a run that never forks keeps its payload


def test_the_ledger_fold_keeps_when_an_attempt_was_first_sent(world: World) -> None:
    """A resend's dispatched entry keeps the first send's time: retention counts from then."""
    session = session_of(world, [*SAME[:1], finish])
    session.step()
    (record,) = session.effects.values()
    assert record.committed is not None and record.committed.sent_at is not None


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
    # The run's own roots lack ops2 until the recovery below: name the roots it will run with.
    now_trusted = ["--trust", str(tmp_path / "ops2.trust.json")]
    assert main([*command, "--keyring", str(keyring), "--ttl", "300", "--yes", *now_trusted]) == 0
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


def test_a_remembered_replay_approval_lives_as_long_as_its_approval_and_no_longer(
    world: World,
) -> None:
    """Alive until its expiry, under its own policy version only; at most 32 are kept."""
    from tether.core._evidence import remember_replay_approval, replay_approved

    state = _state(world)
    body = {"expires_at": "2026-01-01T00:05:00.000000Z", "policy_version": "1"}
    kept = remember_replay_approval(state, EFFECT, body, now=T0)
    assert replay_approved(kept, EFFECT, now=T0, policy_version="1")
    assert not replay_approved(kept, EFFECT, now=T0, policy_version="2")
    assert not replay_approved(kept, EFFECT, now=T0 + timedelta(minutes=5), policy_version="1")
    assert not replay_approved(kept, "sha256:" + "0" * 64, now=T0, policy_version="1")
    assert RunState.from_json(kept.to_json()).replay_approvals == kept.replay_approvals
    later = remember_replay_approval(kept, "other", None, now=T0 + timedelta(minutes=6))
    assert later.replay_approvals == ()  # expired ones are dropped
    many = state
    for i in range(40):
        many = remember_replay_approval(many, f"e{i}", body, now=T0)
    assert [a.effect for a in many.replay_approvals] == [f"e{i}" for i in range(8, 40)]


def test_a_hold_verdict_makes_the_proposal_a_held_action_that_sends_nothing(world: World) -> None:
    """The replay waits for a person: pending, not a write, keyed to bind the approval, traced."""
    from tether.core import Intent

    state = _state(world)
    judgement = replay_rules.judge(
        replay_rules.ReplayFacts(
            record=DONE, capabilities=DEDUPS, now=T0, answer=_found(), needs_approval=True
        )
    )
    held = Intent("file.write", "notes.txt", {"content": "x"}, "low")
    decided = replay_rules.decide(
        state,
        Proposal("a5", "file.write", "notes.txt", {"content": "x"}),
        judgement,
        effect=EFFECT,
        budgets=world.task.budgets,
        case_id="case-1",
        now=world.clock.now(),
        live=state.environment,
        held=held,
        hold_key="idem-held",
    )
    assert decided.outcome is OutcomeKind.WAITING_FOR_APPROVAL and decided.call is None
    pending = decided.state.pending
    assert pending is not None and not pending.mutating and pending.idempotency_key == "idem-held"
    assert decided.ledger == () and [k for k, _ in decided.events][-1] == "replay_held"
    with pytest.raises(ValueError, match="held form"):
        _decide(world, state, judgement)
