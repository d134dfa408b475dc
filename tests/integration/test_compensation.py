"""Compensation and signed effect decisions against real services on loopback."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, make_policy, make_task, write
from tests.integration._services import (
    EffectsService,
    delivered,
    effects_service,
    smtp_adapter,
    smtp_server,
)
from tether.adapters import REFERENCE_PROFILE, Adapter, HttpEffect
from tether.core import (
    CompensationRefusedError,
    EffectStatus,
    EvidenceError,
    NonceReusedError,
    Observation,
    OutcomeKind,
    Phase,
    RunState,
    new_effect_decision,
)
from tether.core._compensation import EffectRecord
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import (
    AgentContext,
    CrashPlan,
    CrashPoint,
    Decision,
    Runtime,
    SimulatedCrash,
    case_effect,
    open_run,
    prepare_review,
)
from tether.store import SQLiteStore

KEYRING = Keyring.generate("k1")
REVIEWER = Signer.generate("rev", "reviewer")
TRUST = TrustRoots.of(REVIEWER.trust_root())


def wait(context: AgentContext, obs: Observation) -> Decision:
    """A step that asks for nothing: the run stays running, its effects on record."""
    return Decision(AgentContext(context.messages, context.memory, context.plan_cursor + 1))


def http_runtime(
    tmp_path: Path, adapter: Adapter, crash: CrashPlan | None = None, **extra: Any
) -> Runtime:
    task = make_task(
        adapter.environment().state_fingerprint,
        allowed_kinds=["http.post"],
        allowed_paths=["tickets"],
        permissions=["service.write"],
        initial_environment={"namespace": "http"},
    )
    rule = {"risk": "low", "permission": "service.write", "needs_approval": False}
    post = write("tickets", "", kind="http.post", args={"json": {"title": "printer on fire"}})
    return Runtime(
        store=SQLiteStore(tmp_path / "tether.sqlite"),
        keyring=KEYRING,
        adapter=adapter,
        task=task,
        policy=make_policy(kinds={"http.post": rule}),
        agent=ScriptedAgent([post, wait]),
        crash=crash or CrashPlan(),
        trust=TRUST,
        **extra,
    )


def effect(rt: Runtime, state: RunState, key: str) -> EffectRecord:
    found = EffectRecord.find(rt.checkpointer.verified_ledger(state), key)
    if found is None:
        raise LookupError(key)
    return found


def signed(
    rt: Runtime,
    state: RunState,
    key: str,
    decision: str,
    *,
    signer: Signer = REVIEWER,
    ttl: float = 300,
    **changes: Any,
) -> dict[str, Any]:
    now = datetime.now(UTC)
    body = new_effect_decision(
        state,
        effect(rt, state, key),
        signer.signer_id,
        decision,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl),
        nonce=secrets.token_hex(16),
    )
    return signer.sign({**body, **changes})


def statuses(rt: Runtime, key: str) -> list[str]:
    return [e.status.value for e in rt.store.ledger("r1") if e.idempotency_key == key]


def compensations(service: EffectsService) -> list[dict[str, Any]]:
    return service.compensations()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EffectsService]:
    with effects_service(tmp_path) as running:
        yield running


@pytest.fixture
def http(service: EffectsService) -> Iterator[HttpEffect]:
    with HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=2) as adapter:
        yield adapter


def posted(rt: Runtime) -> tuple[Any, str]:
    """Start r1, let it open one ticket and then wait; the session and the ticket's key."""
    session = rt.start("r1")
    assert session.step().kind is OutcomeKind.EXECUTED
    assert session.step().kind is OutcomeKind.WAITED
    last = session.state.last_write
    assert last is not None
    return session, last.idempotency_key


def test_an_ordered_compensation_cancels_once_and_the_ledger_says_compensated(
    tmp_path: Path, http: HttpEffect, service: EffectsService
) -> None:
    """A signed compensate: one cancellation at the service, committed -> compensated with its receipt."""
    rt = http_runtime(tmp_path, http)
    session, key = posted(rt)
    outcome = session.decide_effect(signed(rt, session.state, key, "compensate"))
    assert outcome.kind is OutcomeKind.EXECUTED and session.state.phase is Phase.RUNNING
    done = compensations(service)
    assert len(done) == 1 and done[0]["ticket_id"] == service.tickets()[0]["ticket_id"]
    assert statuses(rt, key) == ["intended", "dispatched", "committed", "compensated"]
    compensated = next(e for e in rt.store.ledger("r1") if e.status is EffectStatus.COMPENSATED)
    receipt = compensated.receipt
    assert receipt is not None and receipt["idempotency_key"] == done[0]["idempotency_key"] != key
    assert receipt["result"]["body"]["compensation_id"] == done[0]["compensation_id"]
    assert statuses(rt, receipt["idempotency_key"]) == ["intended", "dispatched", "committed"]
    kinds = [e.kind for e in session.trace()]
    assert kinds[-4:] == [
        "compensation_ordered",
        "intent_persisted",
        "effect_committed",
        "effect_compensated",
    ]
    # Compensated once: a second order, even signed against the ledger now, sends nothing.
    with pytest.raises(CompensationRefusedError) as caught:
        session.decide_effect(signed(rt, session.state, key, "compensate"))
    assert caught.value.compensation == "not_committed"
    assert len(compensations(service)) == 1


@pytest.mark.parametrize("how", ["crash_before_send", "crash_after_send", "reply_lost"])
def test_a_compensation_whose_receipt_was_not_stored_is_settled_by_its_key(
    tmp_path: Path, http: HttpEffect, service: EffectsService, how: str
) -> None:
    """Intent durable but receipt not stored (a crash, a lost reply): settled by key; one undo."""
    points = {"crash_before_send": CrashPoint.INTENT_PERSISTED, "crash_after_send": None}
    point = points.get(how, CrashPoint.EFFECT_SENT) or CrashPoint.EFFECT_SENT
    # The ticket's own write hit the point first; the compensation is the second hit.
    crash = CrashPlan(point, nth=2) if how != "reply_lost" else None
    rt = http_runtime(tmp_path, http, crash)
    session, key = posted(rt)
    document = signed(rt, session.state, key, "compensate")
    if how == "reply_lost":
        service.mode(drop_after_commit=True)
        outcome = session.decide_effect(document)
        assert outcome.kind is OutcomeKind.RETRY_LATER  # outcome unknown: stays dispatched
        service.mode(drop_after_commit=False)
    else:
        with pytest.raises(SimulatedCrash):
            session.decide_effect(document)
    sent = how != "crash_before_send"
    assert len(compensations(service)) == (1 if sent else 0)
    assert statuses(rt, key)[-1] == "committed"
    again = http_runtime(tmp_path, http).recover("r1")
    assert again.state.phase is Phase.PENDING
    # Found by key (never sent again), or, never sent, sent now under the same key.
    expected = OutcomeKind.REPLAYED if sent else OutcomeKind.EXECUTED
    assert again.step().kind is expected
    assert len(compensations(service)) == 1
    assert statuses(again.rt, key) == ["intended", "dispatched", "committed", "compensated"]
    with pytest.raises(EvidenceError):  # the document was consumed with the order
        again.decide_effect(document)
    assert len(compensations(service)) == 1


def test_an_email_is_never_compensated_by_the_runtime(tmp_path: Path) -> None:
    """Human compensation: a compensate order is refused, traced, and nothing is sent."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir) as port:
        smtp = smtp_adapter(port, maildir)
        task = make_task(
            smtp.environment().state_fingerprint,
            allowed_kinds=["email.send"],
            allowed_paths=["customer@example.com"],
            permissions=["mail.send"],
            initial_environment={"namespace": "smtp"},
        )
        rule = {"risk": "medium", "permission": "mail.send", "needs_approval": False}
        send = write(
            "customer@example.com", "", kind="email.send", args={"subject": "S", "body": "B"}
        )
        rt = Runtime(
            store=SQLiteStore(tmp_path / "tether.sqlite"),
            keyring=KEYRING,
            adapter=smtp,
            task=task,
            policy=make_policy(kinds={"email.send": rule}),
            agent=ScriptedAgent([send, wait]),
            trust=TRUST,
        )
        session = rt.start("r1")
        session.step()
        session.step()
        last = session.state.last_write
        assert last is not None
        before = session.state
        with pytest.raises(CompensationRefusedError) as caught:
            session.decide_effect(signed(rt, before, last.idempotency_key, "compensate"))
        assert caught.value.compensation == "human"
        assert session.trace()[-1].kind == "evidence_refused"
        assert session.state.decisions == before.decisions  # the order was not consumed
        assert statuses(rt, last.idempotency_key)[-1] == "committed"
        # A person undoes it by hand and accepts it as done.
        accepted = session.decide_effect(signed(rt, session.state, last.idempotency_key, "accept"))
        assert accepted.reason == "effect_accepted"
    assert len(delivered(maildir)) == 1


def test_a_service_without_a_compensate_path_is_human_compensation(
    tmp_path: Path, service: EffectsService
) -> None:
    """The same kind, a profile that cannot undo it: refused, nothing cancelled."""
    with HttpEffect(service.url, profile=replace(REFERENCE_PROFILE, compensate=None)) as http:
        rt = http_runtime(tmp_path, http)
        session, key = posted(rt)
        with pytest.raises(CompensationRefusedError):
            session.decide_effect(signed(rt, session.state, key, "compensate"))
    assert compensations(service) == []


def test_a_signed_accept_is_recorded_and_changes_no_effect(
    tmp_path: Path, http: HttpEffect, service: EffectsService
) -> None:
    """Accept: traced and its nonce kept; the ledger and the service are untouched."""
    rt = http_runtime(tmp_path, http)
    session, key = posted(rt)
    document = signed(rt, session.state, key, "accept")
    outcome = session.decide_effect(document)
    assert outcome.kind is OutcomeKind.RECORDED and session.trace()[-1].kind == "effect_accepted"
    assert session.state.decisions[-1] == document
    assert statuses(rt, key) == ["intended", "dispatched", "committed"]
    with pytest.raises(NonceReusedError):
        session.decide_effect(document)  # replayed: refused, traced
    assert session.trace()[-1].kind == "evidence_refused"
    assert compensations(service) == []


def test_accepting_an_unknown_outcome_closes_its_review_case(
    tmp_path: Path, service: EffectsService
) -> None:
    """An unknown outcome frozen for review: a signed accept reopens the run, key quarantined."""
    service.mode(drop_after_commit=True)
    blind = replace(REFERENCE_PROFILE, lookup=None, replay="new_effect")  # promises nothing
    with HttpEffect(service.url, profile=blind, timeout_s=2) as http:
        rt = http_runtime(tmp_path, http)
        session = rt.start("r1")
        session.step()
        assert session.state.phase is Phase.NEEDS_REVIEW
        pending = session.state.pending
        assert pending is not None
        key = pending.idempotency_key
        document = signed(rt, session.state, key, "accept")
        assert document["body"]["ledger_status"] == "outcome_unknown"
        session.decide_effect(document)
    assert session.state.phase is Phase.RUNNING and session.state.review_cases == ()
    assert key in session.state.quarantined_keys
    kinds = [e.kind for e in session.trace()]
    assert kinds[-3:] == ["review_sealed", "key_quarantined", "effect_accepted"]
    assert len(service.tickets()) == 1


@pytest.mark.parametrize("flaw", ["forged", "expired", "wrong_run", "stale", "approver"])
def test_a_refused_effect_decision_is_traced_and_changes_nothing(
    tmp_path: Path, http: HttpEffect, service: EffectsService, flaw: str
) -> None:
    """Forged, expired, mis-bound or stale: refused, traced as evidence_refused, nothing sent."""
    rt = http_runtime(tmp_path, http)
    session, key = posted(rt)
    state = session.state
    if flaw == "forged":
        document = signed(rt, state, key, "compensate", signer=Signer.generate("rev", "reviewer"))
    elif flaw == "expired":
        document = signed(rt, state, key, "compensate", ttl=-1)
    elif flaw == "wrong_run":
        document = signed(rt, state, key, "compensate", run_id="r2")
    elif flaw == "approver":
        document = signed(rt, state, key, "compensate", signer=Signer.generate("al", "approver"))
    else:
        document = signed(rt, state, key, "compensate")
        session.decide_effect(signed(rt, state, key, "accept"))  # fine; the ledger is unchanged
        # A compensation by another document moves the ledger: this one is stale now.
        session.decide_effect(signed(rt, session.state, key, "compensate"))
        state = session.state
    with pytest.raises(EvidenceError):
        session.decide_effect(document)
    assert session.trace()[-1].kind == "evidence_refused"
    assert session.state.ledger_head == state.ledger_head
    assert session.state.decisions == state.decisions
    assert len(compensations(service)) == (1 if flaw == "stale" else 0)


def test_an_effect_decision_in_the_inbox_is_applied_by_the_next_step(
    tmp_path: Path, http: HttpEffect, service: EffectsService
) -> None:
    """The store's inbox delivers an effect decision like any other evidence."""
    rt = http_runtime(tmp_path, http)
    session, key = posted(rt)
    rt.store.put_evidence("r1", "effect_decision", signed(rt, session.state, key, "compensate"))
    session.consume_inbox()
    assert len(compensations(service)) == 1
    assert statuses(rt, key)[-1] == "compensated"
    assert session.state.inbox_cursor == 1
    bad = signed(rt, session.state, key, "accept", signer=Signer.generate("x", "reviewer"))
    rt.store.put_evidence("r1", "effect_decision", bad)
    session.consume_inbox()  # refused, traced once, the cursor moves past it
    assert session.state.inbox_cursor == 2 and session.trace()[-1].kind == "evidence_refused"


def test_an_unknown_outcome_of_a_blind_compensation_goes_to_review(
    tmp_path: Path, service: EffectsService
) -> None:
    """No look-up by key: a compensation whose reply was lost is frozen, never sent again."""
    blind = replace(REFERENCE_PROFILE, lookup=None, replay="new_effect")  # promises nothing
    with HttpEffect(service.url, profile=blind, timeout_s=2) as http:
        rt = http_runtime(tmp_path, http)
        session, key = posted(rt)
        service.mode(drop_after_commit=True)
        outcome = session.decide_effect(signed(rt, session.state, key, "compensate"))
        assert outcome.kind is OutcomeKind.FROZEN and session.state.phase is Phase.NEEDS_REVIEW
        case = session.state.review_cases[0]
        assert case.reason == "outcome_unknown"
        assert statuses(rt, case.idempotency_key) == ["intended", "dispatched", "outcome_unknown"]
        assert statuses(rt, key)[-1] == "committed"  # not proven undone: the ledger does not say so
        again = http_runtime(tmp_path, http).recover("r1")
        again.run()
        assert again.state.phase is Phase.NEEDS_REVIEW
        # A compensation is never itself undone: the case does not offer it, nor takes it.
        effect = case_effect(again.state, case, again.rt.store.ledger("r1"))
        assert effect.decisions == ("landed", "not_landed", "replan", "abort")
        with pytest.raises(CompensationRefusedError, match="itself a compensation"):
            prepare_review(
                open_run(rt.store, "r1"),
                Signer.generate("rita", "reviewer"),
                case.case_id,
                "compensate",
                now=datetime.now(UTC),
                evidence="found",
            )
    assert len(compensations(service)) == 1
