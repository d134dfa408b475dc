"""Your own function as an effect: httpx against the real ticket service, runs on a real SQLite file.

The functions are the example's (``examples/own_function/tickets.py``): a
POST with an ``Idempotency-Key`` the body reads from tether, declared
idempotent with a look-up, or declaring nothing. What the world received is
counted from the service's own table.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from examples.own_function import config
from examples.own_function.tickets import (
    KIND,
    TicketRefused,
    find_ticket,
    open_ticket,
    open_ticket_unproven,
    tickets,
)

import tether
from tests.conftest import make_policy, make_task
from tests.integration._services import EffectsService, effects_service
from tether import effects
from tether.adapters import Adapters, FunctionEffect
from tether.core import (
    EffectNotSettledError,
    EffectRejectedError,
    EffectStatus,
    NeedsReviewError,
    OutcomeKind,
    Phase,
    SpecError,
    new_effect_decision,
)
from tether.core._compensation import EffectRecord
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import SQLiteStore
from tether.testing import Sandbox

KEYS = Keyring.generate("fn-1")
REVIEWER = Signer.generate("rev", "reviewer")


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EffectsService]:
    """The reference ticket service on loopback; the example's functions find it in TICKETS_URL."""
    with effects_service(tmp_path) as running:
        monkeypatch.setenv("TICKETS_URL", running.url)
        yield running


def runtime(
    tmp_path: Path, adapter: FunctionEffect, crash: CrashPlan | None = None, **extra: Any
) -> Runtime:
    """The example's runtime over this test's SQLite file (a fresh store object each time)."""
    rt = config.runtime(adapter, SQLiteStore(tmp_path / "runs.sqlite"), KEYS, crash)
    for name, value in extra.items():
        setattr(rt, name, value)
    return rt


def crash_after_send(tmp_path: Path, fn: Any, title: str) -> None:
    """Call ``fn(title)`` in run r1 and die after the service took it, before the receipt."""
    rt = runtime(tmp_path, fn.adapter, CrashPlan(CrashPoint.EFFECT_SENT))
    with pytest.raises(SimulatedCrash), effects.run(rt, "r1"):
        fn(title)


def test_the_body_runs_once_under_its_key_and_its_reply_is_the_receipt(
    tmp_path: Path, service: EffectsService
) -> None:
    """One POST carrying tether's key; the receipt holds the reply; asked again, it is replayed."""
    with effects.run(runtime(tmp_path, open_ticket.adapter), "r1") as run:
        done = open_ticket("printer on fire")
        again = open_ticket("printer on fire")
        run.finish("opened")
    (row,) = service.tickets()
    assert done.outcome == "executed" and done.receipt is not None
    assert row["idempotency_key"] == done.receipt["idempotency_key"]  # the key the body passed on
    assert done.result["ticket_id"] == row["ticket_id"]
    assert done.receipt["business_object_id"] == str(row["ticket_id"])
    assert done.receipt["committed_at"] == done.result["created_at"]
    assert again.replayed and again.result == done.result
    assert run.phase is Phase.COMPLETED


def test_the_key_is_in_the_signed_ledger_before_the_body_starts(tmp_path: Path) -> None:
    """Inside the body, another connection already reads the key on the run's ledger, dispatched."""
    found: list[list[str]] = []

    @tether.effect(KIND, target=None)
    def look_first(title: str) -> dict[str, str]:
        key = tether.current_key()
        with SQLiteStore(tmp_path / "runs.sqlite", read_only=True) as other:
            found.append([e.status.value for e in other.ledger("r1") if e.idempotency_key == key])
        return {"title": title}

    with effects.run(runtime(tmp_path, look_first.adapter), "r1"):
        done = look_first("printer on fire")
    assert found and found[0][-1] == "dispatched"  # committed (and signed) before the send
    assert done.receipt is not None and done.outcome == "executed"


def test_killed_after_the_send_the_look_up_settles_it_by_key(
    tmp_path: Path, service: EffectsService
) -> None:
    """A crash between the send and its receipt: the look-up finds the ticket; nothing is resent."""
    crash_after_send(tmp_path, open_ticket, "printer on fire")
    assert len(service.tickets()) == 1
    with effects.run(runtime(tmp_path, open_ticket.adapter), "r1"):
        again = open_ticket("printer on fire")
    assert again.replayed and again.result["ticket_id"] == service.tickets()[0]["ticket_id"]
    assert len(service.tickets()) == 1


def test_idempotent_without_a_look_up_is_called_again_with_the_same_key(
    tmp_path: Path, service: EffectsService
) -> None:
    """Declared idempotent only: after the crash the body runs again, same key; one ticket."""
    keys: list[str] = []

    @tether.effect(KIND, target=None, idempotent=True)
    def open_again(title: str) -> dict[str, Any]:
        keys.append(tether.current_key())
        return dict(open_ticket.adapter.function(title, idempotency_key=keys[-1]))

    crash_after_send(tmp_path, open_again, "printer on fire")
    with effects.run(runtime(tmp_path, open_again.adapter), "r1"):
        again = open_again("printer on fire")
    assert len(keys) == 2 and keys[0] == keys[1]
    assert again.receipt is not None and again.receipt["idempotency_key"] == keys[0]
    assert len(service.tickets()) == 1  # the service answered the second call from its record


def test_an_unproven_body_killed_after_the_send_goes_to_review_and_is_never_run_again(
    tmp_path: Path, service: EffectsService
) -> None:
    """Nothing declared: after the crash the run freezes (outcome unknown), and stays frozen."""
    crash_after_send(tmp_path, open_ticket_unproven, "printer on fire")
    for _ in range(2):  # asked twice: the same refusal, never a second POST
        with effects.run(runtime(tmp_path, open_ticket_unproven.adapter), "r1") as run:
            with pytest.raises(NeedsReviewError) as caught:
                open_ticket_unproven("printer on fire")
            assert run.phase is Phase.NEEDS_REVIEW
        assert caught.value.reason == "outcome_unknown"
    assert len(service.tickets()) == 1


def test_a_lost_reply_is_unknown_for_an_unproven_body_and_found_for_a_proven_one(
    tmp_path: Path, service: EffectsService
) -> None:
    """The service commits then drops the reply: review without proofs; with them, found by key."""
    service.mode(drop_after_commit=True)
    blind = runtime(tmp_path, open_ticket_unproven.adapter)
    with effects.run(blind, "blind"), pytest.raises(NeedsReviewError):
        open_ticket_unproven("blind one")
    with effects.run(runtime(tmp_path, open_ticket.adapter), "proven"):
        with pytest.raises(EffectNotSettledError):  # unknown for now: asked by key next time
            open_ticket("proven one")
        service.mode(drop_after_commit=False)
        found = open_ticket("proven one")
    assert found.replayed and found.result is not None
    assert [t["ticket_id"] for t in tickets("proven one")] == [found.result["ticket_id"]]
    assert len(tickets("blind one")) == 1


def test_a_declared_refusal_rejects_the_effect_and_the_run_goes_on(
    tmp_path: Path, service: EffectsService
) -> None:
    """The service refuses an empty title (400): rejected, nothing made, the next call works."""
    with effects.run(runtime(tmp_path, open_ticket.adapter), "r1") as run:
        with pytest.raises(EffectRejectedError, match="TicketRefused"):
            open_ticket("")
        assert run.phase is Phase.RUNNING
        open_ticket("a real title")
        rt = run.session.rt
    assert [t["body"] for t in service.tickets()] == ['{"title":"a real title"}']
    (refused,) = [e for e in rt.store.ledger("r1") if e.status is EffectStatus.REJECTED]
    with pytest.raises(TicketRefused):  # the service stored its refusal: its look-up says so
        find_ticket(refused.idempotency_key)


def test_a_compensation_cancels_the_ticket_once_under_its_own_key(
    tmp_path: Path, service: EffectsService
) -> None:
    """A reviewer orders the undo: the compensate function runs under a fresh key, once."""
    trust = TrustRoots.of(REVIEWER.trust_root())
    rt = runtime(tmp_path, open_ticket.adapter, trust=trust)
    with effects.run(rt, "r1") as run:
        done = open_ticket("printer on fire")
        assert done.receipt is not None
        key = done.receipt["idempotency_key"]
        run.session.land_deferred()  # its receipt rides on the next commit: read it stored
        state = run.session.state
        record = EffectRecord.find(rt.checkpointer.verified_ledger(state), key)
        assert record is not None
        now = datetime.now(UTC)
        body = new_effect_decision(
            state,
            record,
            REVIEWER.signer_id,
            "compensate",
            issued_at=now,
            expires_at=now + timedelta(minutes=5),
            nonce=secrets.token_hex(16),
        )
        outcome = run.session.decide_effect(REVIEWER.sign(body))
    assert outcome.kind is OutcomeKind.EXECUTED
    (undone,) = service.compensations()
    assert undone["ticket_id"] == done.result["ticket_id"] and undone["idempotency_key"] != key
    ledger = [e.status for e in rt.store.ledger("r1") if e.idempotency_key == key]
    assert ledger[-1] is EffectStatus.COMPENSATED


def test_a_function_whose_body_would_not_run_is_refused_before_anything(
    tmp_path: Path, service: EffectsService
) -> None:
    """Proofs declared but another adapter owns the kind, or another body does: refused, nothing sent."""
    with effects.run(runtime(tmp_path, open_ticket.adapter), "r1") as run:
        before = run.session.state.generation
        with pytest.raises(SpecError, match="open_ticket's"):
            open_ticket_unproven("not mine")  # open_ticket's body performs tickets.open here
        assert run.session.state.generation == before
    sandbox = Sandbox({"notes.txt": "x"}, instance_id="sbx")

    @tether.effect("file.write", idempotent=True)
    def write(path: str, content: str) -> None: ...

    rt = Runtime(
        store=SQLiteStore(tmp_path / "other.sqlite"),
        keyring=KEYS,
        adapter=Adapters(sandbox, open_ticket.adapter),
        task=make_task(sandbox.environment().state_fingerprint),
        policy=make_policy(),
    )
    with effects.run(rt, "r2"), pytest.raises(SpecError, match=r"write\.adapter"):
        write("notes.txt", "y")  # the sandbox owns file.write: this body would never run
    assert service.tickets() == [] and sandbox.write_count() == 0


def test_an_effects_body_cannot_make_another_effect(
    tmp_path: Path, service: EffectsService
) -> None:
    """A nested call is refused inside the body (no deadlock); the outer outcome is unknown."""

    @tether.effect(KIND, target=None, idempotent=True)
    def nested(title: str) -> dict[str, Any]:
        open_ticket(title)  # through the run, from inside a body: refused
        return {}

    rt = runtime(tmp_path, nested.adapter)
    with effects.run(rt, "r1"), pytest.raises(EffectNotSettledError) as caught:
        nested("inner")
    assert "cannot make another effect" in str(caught.value)
    assert service.tickets() == []
