"""FunctionEffect's answers, as a table: what the body or the look-up did, and what the run does.

Each row runs a real function through the adapter the way the runtime's
call does (``tether.runtime._calls``), then hands the answer to the settle
rules of ``tether.core._settle`` for a write dispatched under that key: the
adapter's answer and the run's next move are both written out here.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import tether
from tests.conftest import make_task
from tests.unit.test_settle import KEY, facts, state_with, summary
from tether.adapters import FunctionEffect, KeyInFlightError
from tether.core import (
    ActionClass,
    ActionKind,
    AdapterUnavailableError,
    Compensation,
    ContractViolationError,
    EffectStatus,
    Intent,
    NotInRunError,
    OutcomeKind,
    Phase,
    SpecError,
    TargetKind,
    Targets,
)
from tether.core import _settle as settle_rules
from tether.core._transition import Execute, ExecuteStatus, LookupStatus
from tether.runtime._calls import ask, send

KIND = "notes.post"


class Refused(Exception):
    """The callee refused: nothing happened."""


class Reused(Exception):
    """The callee holds the key for another request."""


def intent_of(adapter: FunctionEffect, text: str = "hello") -> Intent:
    return Intent(KIND, "", adapter.normalize(KIND, "", {"text": text}), "low")


def body_that(behaviour: str, seen: list[str]) -> Callable[..., Any]:
    """A body that records its key, then returns or raises as ``behaviour`` says."""

    def post(text: str, idempotency_key: str) -> Any:
        seen.append(idempotency_key)
        if behaviour == "returns":
            return {"id": 7, "text": text}
        if behaviour == "returns a number":
            return 7
        if behaviour == "refuses":
            raise Refused("no such channel")
        if behaviour == "conflicts":
            raise Reused("key held for another body")
        raise ConnectionResetError("connection reset after the request was written")

    return post


# (row, declared, body behaviour, send again?, adapter's answer, run's outcome, phase after)
EXECUTE_ROWS = [
    (
        "executed",
        {},
        "returns",
        False,
        ExecuteStatus.COMMITTED,
        OutcomeKind.EXECUTED,
        Phase.RUNNING,
    ),
    (
        "refusal",
        {"refusals": (Refused,)},
        "refuses",
        False,
        ExecuteStatus.PRECONDITION_FAILED,
        OutcomeKind.REJECTED,
        Phase.RUNNING,
    ),
    (
        "refusal of a resend",
        {"refusals": (Refused,), "idempotent": True},
        "refuses",
        True,
        ExecuteStatus.PRECONDITION_FAILED,
        OutcomeKind.FROZEN,
        Phase.NEEDS_REVIEW,
    ),
    (
        "undeclared exception, nothing declared",
        {},
        "refuses",
        False,
        ExecuteStatus.UNAVAILABLE,
        OutcomeKind.FROZEN,
        Phase.NEEDS_REVIEW,
    ),
    (
        "unknown, nothing declared",
        {},
        "resets",
        False,
        ExecuteStatus.UNAVAILABLE,
        OutcomeKind.FROZEN,
        Phase.NEEDS_REVIEW,
    ),
    (
        "unknown, idempotent",
        {"idempotent": True},
        "resets",
        False,
        ExecuteStatus.UNAVAILABLE,
        OutcomeKind.RETRY_LATER,
        None,
    ),
    (
        "unknown, with a look-up",
        {"lookup": lambda key: None},
        "resets",
        False,
        ExecuteStatus.UNAVAILABLE,
        OutcomeKind.RETRY_LATER,
        None,
    ),
    (
        "key conflict",
        {"conflicts": (Reused,)},
        "conflicts",
        False,
        ExecuteStatus.CONFLICT,
        OutcomeKind.FROZEN,
        Phase.NEEDS_REVIEW,
    ),
]


@pytest.mark.parametrize(
    ("declared", "behaviour", "resend", "answer", "outcome", "phase"),
    [row[1:] for row in EXECUTE_ROWS],
    ids=[row[0] for row in EXECUTE_ROWS],
)
def test_a_bodys_answer_and_the_runs_next_move_follow_the_table(
    declared: dict[str, Any],
    behaviour: str,
    resend: bool,
    answer: ExecuteStatus,
    outcome: OutcomeKind,
    phase: Phase | None,
) -> None:
    """What the body did maps to the adapter's answer, and the settle rule moves the run as listed."""
    seen: list[str] = []
    adapter = FunctionEffect(KIND, body_that(behaviour, seen), target=None, **declared)
    intent = intent_of(adapter)
    call = Execute(KEY, intent, adapter.environment(), retry=resend)
    got = send(adapter, call, None)
    assert got.status is answer
    assert seen == [KEY]  # the body ran once, under the key minted for the intent
    if answer is ExecuteStatus.COMMITTED:
        return  # the receipt's own rows are below
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    moved = settle_rules.after_execute(
        state, facts(adapter.capabilities, "not_needed", state.environment), call, got
    )
    assert moved.outcome is outcome
    assert (None if moved.state is None else moved.state.phase) is phase
    if outcome is OutcomeKind.FROZEN:
        reason = "key_conflict" if answer is ExecuteStatus.CONFLICT else "outcome_unknown"
        assert moved.state is not None and moved.state.review_cases[-1].reason == reason


def test_the_receipt_is_what_the_body_returned_under_its_key_and_intent() -> None:
    """A JSON object is the result as it is; the receipt names key, intent, object and instance."""
    seen: list[str] = []
    adapter = FunctionEffect(
        KIND, body_that("returns", seen), target=None, object_id="id", instance="notes-1"
    )
    intent = intent_of(adapter)
    receipt = adapter.execute(KEY, intent, adapter.environment())
    assert receipt.result == {"id": 7, "text": "hello"}
    assert (receipt.idempotency_key, receipt.intent_digest) == (KEY, intent.digest)
    assert receipt.business_object_id == "7" and receipt.namespace == KIND
    assert receipt.receipt_id == f"notes-1/{KEY}" and receipt.post_state == adapter.environment()
    wrapped = FunctionEffect(KIND, body_that("returns a number", seen), target=None)
    assert wrapped.execute(KEY, intent, wrapped.environment()).result == {"value": 7}


def test_a_result_too_large_or_not_json_is_kept_as_a_digest_or_a_name() -> None:
    """The effect happened all the same: a huge value keeps its digest, a non-JSON one its type."""
    big = FunctionEffect(KIND, lambda text: "x" * 20_000, target=None)
    kept = big.execute(KEY, intent_of(big), big.environment()).result
    assert set(kept) == {"value_sha256"}
    odd = FunctionEffect(KIND, lambda text: {1, 2}, target=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert odd.execute(KEY, intent_of(odd), odd.environment()).result == {
            "not_json": "set",
            "why": "not JSON",
        }
    assert caught and "not JSON" in str(caught[0].message)


def finder(answer: str) -> Callable[[str], Any]:
    def find(key: str) -> Any:
        if answer == "found":
            return {"id": 7}
        if answer == "absent":
            return None
        if answer == "in flight":
            raise KeyInFlightError(key, "still running")
        if answer == "refused":
            raise Refused("the callee stored its refusal")
        raise TimeoutError("the look-up timed out")

    return find


# (row, look-up answers, declared, adapter's answer, run's outcome, the call it makes)
LOOKUP_ROWS = [
    ("found", "found", {}, LookupStatus.COMMITTED, OutcomeKind.REPLAYED, None),
    ("absent, final", "absent", {"absent_is_final": True}, LookupStatus.ABSENT,
     OutcomeKind.EXECUTED, "execute"),
    ("absent, idempotent", "absent", {"idempotent": True}, LookupStatus.ABSENT,
     OutcomeKind.EXECUTED, "execute"),
    ("absent, not final", "absent", {}, LookupStatus.ABSENT, OutcomeKind.FROZEN, None),
    ("in flight", "in flight", {}, LookupStatus.IN_PROGRESS, OutcomeKind.IN_FLIGHT, None),
    ("refusal recorded", "refused", {"refusals": (Refused,)}, LookupStatus.REFUSED,
     OutcomeKind.REJECTED, None),
    ("look-up fails", "fails", {}, LookupStatus.UNAVAILABLE, OutcomeKind.RETRY_LATER, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "declared", "status", "outcome", "calls"),
    [row[1:] for row in LOOKUP_ROWS],
    ids=[row[0] for row in LOOKUP_ROWS],
)
def test_a_look_ups_answer_and_the_runs_next_move_follow_the_table(
    answer: str,
    declared: dict[str, Any],
    status: LookupStatus,
    outcome: OutcomeKind,
    calls: str | None,
) -> None:
    """The look-up function's answer maps to the adapter's, and absence counts only if declared."""
    adapter = FunctionEffect(
        KIND, lambda text: {"id": 7}, target=None, lookup=finder(answer), **declared
    )
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    pending = state.pending
    assert pending is not None
    first = settle_rules.settle(state, facts(adapter.capabilities, "not_needed", state.environment))
    assert summary(first)[3] == "lookup"  # queryable: asked first, never sent blindly
    got = ask(adapter, first.call)  # type: ignore[arg-type]
    assert got.status is status
    if status is LookupStatus.COMMITTED:
        assert got.receipt is not None and got.receipt.intent_digest == pending.intent.digest
        return  # reconciled by the receipt (its post-state is the remote identity)
    moved = settle_rules.after_lookup(
        state, facts(adapter.capabilities, "not_needed", state.environment), got
    )
    assert moved.outcome is outcome
    made = summary(moved)[3]
    assert (made[0] if isinstance(made, tuple) else made) == calls


def test_declared_proofs_become_the_adapters_capabilities() -> None:
    """Nothing declared is blind; idempotent and look-up are the promises the settle rules read."""

    def post(text: str) -> None: ...

    blind = FunctionEffect(KIND, post, target=None).capabilities
    assert blind.blind and not blind.stateful
    assert FunctionEffect(KIND, post, target=None, idempotent=True).capabilities.idempotent
    asked = FunctionEffect(KIND, post, target=None, lookup=lambda key: None).capabilities
    assert asked.queryable and not asked.absent_is_final and not asked.idempotent
    final = FunctionEffect(
        KIND, post, target=None, lookup=lambda key: None, absent_is_final=True, retention_s=60
    ).capabilities
    assert final.absent_is_final and final.retention_s == 60.0


def test_what_a_target_is_is_declared_never_guessed() -> None:
    """Undeclared is a collection (an equal call is answered from its record); targets= says state, collection or unknown; holds= reads a state."""

    def post(channel: str, text: str) -> None: ...

    assert FunctionEffect(KIND, post).capabilities.targets is Targets.COLLECTION
    assert FunctionEffect(KIND, post, targets="unknown").capabilities.targets is Targets.UNKNOWN
    assert FunctionEffect(KIND, post, targets="state").capabilities.targets is Targets.STATE
    declared = FunctionEffect(KIND, post, targets=Targets.COLLECTION).capabilities
    assert declared.targets is Targets.COLLECTION and not declared.tracks_targets
    read = FunctionEffect(KIND, post, holds=lambda **call: True).capabilities
    assert read.targets is Targets.STATE and read.tracks_targets
    with pytest.raises(SpecError, match="targets"):
        FunctionEffect(KIND, post, targets="sometimes")
    with pytest.raises(SpecError, match="holds reads"):
        FunctionEffect(KIND, post, holds=lambda **call: True, targets="collection")


def test_an_idempotent_body_is_called_again_with_the_same_key() -> None:
    """After a crash in the sent window, settle sends again under the key the body saw first."""
    seen: list[str] = []
    adapter = FunctionEffect(KIND, body_that("returns", seen), target=None, idempotent=True)
    state = state_with(EffectStatus.DISPATCHED, "not_needed")
    again = settle_rules.settle(state, facts(adapter.capabilities, "not_needed", state.environment))
    assert isinstance(again.call, Execute) and again.call.retry and again.call.key == KEY
    intent, env = intent_of(adapter), adapter.environment()
    first = send(adapter, Execute(KEY, intent, env, retry=False), None)
    resent = send(adapter, Execute(again.call.key, intent, env, retry=True), None)
    assert first.receipt == resent.receipt  # the callee's answer to the key, both times
    assert seen == [KEY, KEY]


def test_the_key_is_read_from_current_key_and_nowhere_outside_a_body() -> None:
    """current_key() answers inside the body (sync and async) and refuses outside any."""
    seen: list[str] = []

    def plain(text: str) -> None:
        seen.append(tether.current_key())

    async def later(text: str) -> None:
        await asyncio.sleep(0)
        seen.append(tether.current_key())

    for fn in (plain, later):
        adapter = FunctionEffect(KIND, fn, target=None)
        adapter.execute(KEY, intent_of(adapter), adapter.environment())
    assert seen == [KEY, KEY]
    with pytest.raises(NotInRunError):
        tether.current_key()


def test_normalize_applies_defaults_and_refuses_what_the_function_cannot_take() -> None:
    """Defaults make one intent of two spellings; unknown, missing and key arguments are refused."""

    def post(channel: str, text: str, urgent: bool = False, idempotency_key: str = "") -> None: ...

    adapter = FunctionEffect(KIND, post)
    assert adapter.normalize(KIND, "ops", {"text": "hi"}) == {"text": "hi", "urgent": False}
    for bad in ({}, {"text": "hi", "colour": "red"}, {"text": "hi", "idempotency_key": "mine"}):
        with pytest.raises(ContractViolationError):
            adapter.normalize(KIND, "ops", bad)
    (kind,) = adapter.kinds
    assert (kind.target, kind.required, kind.optional) == (
        TargetKind.NAME,
        frozenset({"text"}),
        frozenset({"urgent"}),
    )
    assert kind.compensation is Compensation.HUMAN


def test_an_async_body_called_synchronously_from_its_loop_is_refused_first() -> None:
    """From inside a running loop, a blocking call of an async body is refused before any key."""

    async def post(text: str) -> None: ...

    adapter = FunctionEffect(KIND, post, target=None)

    async def inside() -> None:
        with pytest.raises(ContractViolationError, match="blocking_call"):
            adapter.normalize(KIND, "", {"text": "x"})

    asyncio.run(inside())


def test_declarations_that_cannot_hold_are_refused_when_built() -> None:
    """A method, positional-only or **extra parameters, or final absence without a look-up."""

    class Notes:
        def post(self, text: str) -> None: ...

    def positional(text: str, /) -> None: ...

    def spread(channel: str, **extra: Any) -> None: ...

    def post(text: str) -> None: ...

    for build in (
        lambda: FunctionEffect(KIND, Notes.post),
        lambda: FunctionEffect(KIND, positional),
        lambda: FunctionEffect(KIND, spread),
        lambda: FunctionEffect(KIND, post, target=None, absent_is_final=True),
        lambda: FunctionEffect(KIND, post, target=None, refusals=(str,)),  # type: ignore[arg-type]
        lambda: FunctionEffect(KIND, post, target=None, compensate=lambda: None),
        lambda: FunctionEffect("", post, target=None),
    ):
        with pytest.raises(SpecError):
            build()
    declared = ActionKind(
        KIND, ActionClass.WRITE, TargetKind.PATH, frozenset({"text"}), frozenset({"tags"})
    )
    fine = FunctionEffect(declared, spread)  # **extra: the kind names the arguments
    assert fine.normalize(KIND, "ops", {"text": "x"}) == {"text": "x"}


def test_a_decorated_function_hides_its_key_and_carries_its_adapter() -> None:
    """The signature a caller (or a tool schema) sees has no key; .adapter is its FunctionEffect."""

    @tether.effect(KIND, target="channel", idempotent=True)
    def post(channel: str, text: str, idempotency_key: str) -> dict[str, str]:
        return {"channel": channel}

    assert list(inspect.signature(post).parameters) == ["channel", "text"]
    assert "idempotency_key" not in post.__annotations__
    assert isinstance(post.adapter, FunctionEffect) and post.adapter.capabilities.idempotent
    with pytest.raises(SpecError, match="already"):
        FunctionEffect(KIND, post)


NAME_TARGETS = [
    ("#general", None),
    ("https://hooks.example.com/T0/B1?x=1", None),
    ("/v1/charges", None),
    ("../../etc/passwd", None),  # text, never opened: the function's body decides what it means
    ("", None),
    ("x" * 4096, None),
    ("x" * 4097, "schema"),
    ("tab\tin it", "schema"),
    ("nul\x00", "schema"),
]


@pytest.mark.parametrize(("target", "refused"), NAME_TARGETS)
def test_a_name_target_is_text_scoped_by_its_kind_not_by_the_tasks_paths(
    target: str, refused: str | None
) -> None:
    """A function's target is checked as text (bounded, no control characters), never as a path."""
    from tether.core._actions import _scope

    def post(channel: str, text: str) -> None: ...

    (kind,) = FunctionEffect(KIND, post).kinds
    task = make_task("sha256:" + "0" * 64)  # its allowed_paths name none of these
    got = _scope(kind, target, task)
    assert (None if got is None else got.reason) == refused


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a coroutine left unawaited would warn
def test_a_plain_def_look_up_or_holds_returning_a_coroutine_proves_nothing() -> None:
    """A hidden coroutine from a look-up is "unavailable" (never a refusal); holds= must be sync."""

    async def found(key: str) -> dict[str, str]:
        return {"id": key}

    def post(text: str) -> None: ...

    adapter = FunctionEffect(KIND, post, target=None, lookup=lambda key: found(key))
    with pytest.raises(AdapterUnavailableError, match="returned a coroutine"):
        adapter.lookup("k-1")

    async def reads(text: str) -> bool:
        return True

    with pytest.raises(SpecError, match="plain function"):
        FunctionEffect(KIND, post, target=None, holds=reads)
