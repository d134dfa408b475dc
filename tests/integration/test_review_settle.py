"""A person settles what tether cannot: landed, not_landed, compensate, abort, against real servers.

Each test freezes a run on a write whose outcome is unknown (a real SMTP
server on loopback that drops the line, the reference effects service that
drops its reply), looks where the case says (the Maildir, the service's
tickets), signs a decision, and counts the world afterwards, on the
system's own side.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, finish, make_policy, make_task, write
from tests.integration._services import (
    EffectsService,
    delivered,
    effects_service,
    smtp_adapter,
    smtp_server,
)
from tether.adapters import REFERENCE_PROFILE, HttpEffect, SmtpEffect, message_id
from tether.core import (
    DecisionRefusedError,
    EvidenceBindingError,
    NonceReusedError,
    Phase,
    ReviewCase,
    RunState,
    new_decision,
)
from tether.core._case_table import REVIEW_NAMESPACE
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import (
    CrashPlan,
    CrashPoint,
    RunSession,
    Runtime,
    SimulatedCrash,
    StaleViewError,
    case_effect,
    deliver,
    open_run,
    prepare_review,
)
from tether.store import SQLiteStore

KEYRING = Keyring.generate("k1")
RITA = Signer.generate("rita", "reviewer")
TRUST = TrustRoots.of(RITA.trust_root())


def email_runtime(tmp_path: Path, smtp: SmtpEffect, crash: CrashPlan | None = None) -> Runtime:
    """Send one email to the customer, then finish (no verifier: a mail server runs none)."""
    task = make_task(
        smtp.environment().state_fingerprint,
        allowed_kinds=["email.send"],
        allowed_paths=["customer@example.com"],
        permissions=["mail.send"],
        initial_environment={"namespace": "smtp"},
        verifier=None,
    )
    rule = {"risk": "medium", "permission": "mail.send", "needs_approval": False}
    send = write(
        "customer@example.com",
        "",
        kind="email.send",
        args={"subject": "Order 42", "body": "Your order shipped. " + "x" * 3000},
    )
    return Runtime(
        store=SQLiteStore(tmp_path / "tether.sqlite"),
        keyring=KEYRING,
        adapter=smtp,
        task=task,
        policy=make_policy(kinds={"email.send": rule}),
        agent=ScriptedAgent([send, finish]),
        trust=TRUST,
        crash=crash or CrashPlan(),
    )


def ticket_runtime(tmp_path: Path, http: HttpEffect) -> Runtime:
    """Open one ticket on the effects service, then finish."""
    task = make_task(
        http.environment().state_fingerprint,
        allowed_kinds=["http.post"],
        allowed_paths=["tickets"],
        permissions=["service.write"],
        initial_environment={"namespace": "http"},
        verifier=None,
    )
    rule = {"risk": "low", "permission": "service.write", "needs_approval": False}
    post = write("tickets", "", kind="http.post", args={"json": {"title": "printer on fire"}})
    return Runtime(
        store=SQLiteStore(tmp_path / "tether.sqlite"),
        keyring=KEYRING,
        adapter=http,
        task=task,
        policy=make_policy(kinds={"http.post": rule}),
        agent=ScriptedAgent([post, finish]),
        trust=TRUST,
    )


def signed(
    state: RunState, decision: str, evidence: str | None = None, nonce: str = ""
) -> dict[str, Any]:
    """Rita's signed ``decision`` on the run's open case, alive five minutes."""
    now = datetime.now(UTC)
    body = new_decision(
        state,
        state.review_cases[-1],
        RITA.signer_id,
        decision,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=nonce or secrets.token_hex(16),
        evidence=evidence,
    )
    return RITA.sign(body)


def hints(case: ReviewCase) -> dict[str, str]:
    """Where the case says to look (the adapter's hints, recorded with the freeze)."""
    found = [e["hints"] for e in case.evidence if e.get("kind") == "where_to_look"]
    assert len(found) == 1, case.evidence
    return dict(found[0])


def statuses(rt: Runtime, key: str) -> list[tuple[str, dict[str, Any] | None]]:
    return [(e.status.value, e.receipt) for e in rt.store.ledger("r1") if e.idempotency_key == key]


def next_message(maildir: Path, mode: str) -> None:
    """The test SMTP server treats the next message only as ``mode`` says."""
    maildir.with_name(maildir.name + ".next").write_text(mode)


def frozen_email(tmp_path: Path, port: int) -> tuple[Runtime, RunState]:
    rt = email_runtime(tmp_path, smtp_adapter(port))
    session = rt.start("r1")
    session.run()
    assert session.state.phase is Phase.NEEDS_REVIEW
    assert session.state.review_cases[-1].reason == "outcome_unknown"
    return rt, session.state


def test_an_email_found_in_the_mailbox_is_signed_landed_and_never_sent_again(
    tmp_path: Path,
) -> None:
    """The server took the message and dropped the line; the reviewer finds it by the case's Message-ID and signs landed: one message, committed by rita."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "drop_after_data") as port:
        rt, state = frozen_email(tmp_path, port)
        key = state.pending.idempotency_key if state.pending else ""
        shown = hints(state.review_cases[-1])
        assert shown["Message-ID"] == message_id(key, "shop.test")
        assert shown["recipient"] == "customer@example.com" and shown["subject"] == "Order 42"
        assert shown["Message-ID"] in delivered(maildir)  # looked where the case said: there
        rt.store.put_evidence("r1", "review_decision", signed(state, "landed", shown["Message-ID"]))
        again = email_runtime(tmp_path, smtp_adapter(port)).recover("r1")
        again.run()
        assert again.state.phase is Phase.COMPLETED
        assert again.state.writes_committed == 1
    assert delivered(maildir) == [shown["Message-ID"]]
    last, receipt = statuses(again.rt, key)[-1]
    assert last == "committed" and receipt is not None
    assert receipt["namespace"] == REVIEW_NAMESPACE
    assert receipt["business_object_id"] == shown["Message-ID"]
    assert receipt["result"]["reviewer_id"] == "rita"
    assert receipt["result"]["evidence"] == shown["Message-ID"]
    kinds = [e.kind for e in again.trace()]
    assert "effect_landed_by_review" in kinds and "effect_resent" not in kinds


def test_an_email_that_never_left_is_signed_not_landed_and_sent_once_under_the_same_key(
    tmp_path: Path,
) -> None:
    """The line dropped before delivery; the mailbox has nothing; not_landed sends it once more, same key, same Message-ID: one message."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "ok") as port:
        next_message(maildir, "drop_before_delivery")
        rt, state = frozen_email(tmp_path, port)
        key = state.pending.idempotency_key if state.pending else ""
        wanted = hints(state.review_cases[-1])["Message-ID"]
        assert delivered(maildir) == []  # looked where the case said: nothing
        rt.store.put_evidence(
            "r1", "review_decision", signed(state, "not_landed", "searched the Maildir: absent")
        )
        again = email_runtime(tmp_path, smtp_adapter(port)).recover("r1")
        again.run()
        assert again.state.phase is Phase.COMPLETED
    assert delivered(maildir) == [wanted]
    path = [status for status, _ in statuses(again.rt, key)]
    assert path == ["intended", "dispatched", "outcome_unknown", "dispatched", "committed"]
    resent = [e for e in again.trace() if e.kind == "effect_resent"]
    assert len(resent) == 1 and resent[0].data["ordered_by"] == "review"


def test_a_resend_whose_outcome_is_lost_again_freezes_again_and_is_never_sent_a_third_time(
    tmp_path: Path,
) -> None:
    """not_landed buys exactly one send: killed right after it, recovery finds it unknown again and asks a person; the mailbox holds one message."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "ok") as port:
        next_message(maildir, "drop_before_delivery")
        rt, state = frozen_email(tmp_path, port)
        rt.store.put_evidence("r1", "review_decision", signed(state, "not_landed"))
        killed = email_runtime(tmp_path, smtp_adapter(port), CrashPlan(CrashPoint.EFFECT_SENT))
        with pytest.raises(SimulatedCrash):
            killed.recover("r1").run()
        again = email_runtime(tmp_path, smtp_adapter(port)).recover("r1")
        again.run()
        assert again.state.phase is Phase.NEEDS_REVIEW
        assert again.state.review_cases[-1].reason == "outcome_unknown"
        again.run()
    assert len(delivered(maildir)) == 1


def test_a_nonce_spent_on_one_decision_is_refused_on_the_next(tmp_path: Path) -> None:
    """not_landed, whose resend is lost again; the next decision under the same nonce is refused (NonceReusedError), the case stays; a fresh one sends once."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "ok") as port:
        next_message(maildir, "drop_before_delivery")
        _, state = frozen_email(tmp_path, port)
        nonce = secrets.token_hex(16)
        session = email_runtime(tmp_path, smtp_adapter(port)).recover("r1")
        session.review(signed(state, "not_landed", nonce=nonce))
        next_message(maildir, "drop_before_delivery")
        session.run()
        assert session.state.phase is Phase.NEEDS_REVIEW
        with pytest.raises(NonceReusedError):
            session.review(signed(session.state, "not_landed", nonce=nonce))
        assert session.state.phase is Phase.NEEDS_REVIEW
        assert [e.kind for e in session.trace()][-1] == "evidence_refused"
        session.review(signed(session.state, "not_landed"))
        session.run()
        assert session.state.phase is Phase.COMPLETED
    assert len(delivered(maildir)) == 1


def test_a_second_decision_on_a_case_is_refused_while_the_first_waits_unread(
    tmp_path: Path,
) -> None:
    """Two screens on one frozen case: the first decision delivered waits in the inbox; the second is refused (StaleViewError) and the run applies only the first."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "drop_after_data") as port:
        rt, state = frozen_email(tmp_path, port)
        case_id = state.review_cases[-1].case_id
        found = hints(state.review_cases[-1])["Message-ID"]
        now = datetime.now(UTC)
        first = prepare_review(
            open_run(rt.store, "r1"), RITA, case_id, "landed", now=now, evidence=found
        )
        stale = prepare_review(open_run(rt.store, "r1"), RITA, case_id, "not_landed", now=now)
        seq = deliver(rt.store, first)
        with pytest.raises(StaleViewError, match=f"already waits in the inbox \\(#{seq}: landed"):
            deliver(rt.store, stale)
        assert [item.seq for item in rt.store.evidence("r1")] == [seq]  # nothing left behind
        again = email_runtime(tmp_path, smtp_adapter(port)).recover("r1")
        again.run()
        assert again.state.phase is Phase.COMPLETED
        with pytest.raises(StaleViewError, match="is closed"):
            deliver(rt.store, stale)  # read now: the case it named is gone
    assert delivered(maildir) == [found]


def test_an_earlier_attempt_set_aside_by_a_replan_is_shown_whole_and_found_landed(
    tmp_path: Path,
) -> None:
    """Replanned, then the same email proposed again: the replay case names the earlier attempt in full (no blanks); landed with its Message-ID, the proposal is replayed: one message."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "drop_after_data") as port:
        smtp = smtp_adapter(port)
        again_send = write(
            "customer@example.com",
            "",
            action_id="resend-after-replan",
            kind="email.send",
            args={"subject": "Order 42", "body": "Your order shipped. " + "x" * 3000},
        )
        once_more = write(
            "customer@example.com",
            "",
            action_id="and-once-more",
            kind="email.send",
            args={"subject": "Order 42", "body": "Your order shipped. " + "x" * 3000},
        )
        rt = email_runtime(tmp_path, smtp)
        first = rt.agent.steps[0]  # type: ignore[union-attr]
        rt.agent = ScriptedAgent([first, again_send, once_more, finish])
        session = rt.start("r1")
        session.run()
        session.review(signed(session.state, "replan"))
        session.run()
        assert session.state.phase is Phase.NEEDS_REVIEW
        case = session.state.review_cases[-1]
        assert case.reason == "replay_of_unknown_effect" and case.action_id == ""
        shown = case_effect(session.state, case)
        assert shown.action_id == "a0" and shown.kind == "email.send"
        assert shown.target == "customer@example.com"
        assert shown.arguments["subject"] == "Order 42" and shown.sent_at
        mid = shown.where_to_look["Message-ID"]
        assert delivered(maildir) == [mid] and shown.idempotency_key
        assert shown.decisions == ("landed", "replan", "abort")
        session.review(signed(session.state, "landed", mid))
        session.run()
        assert session.state.phase is Phase.COMPLETED
        # The same email proposed a third time is replayed from the reviewer's record.
        replayed = [e for e in session.trace() if e.kind == "effect_replayed"]
        assert len(replayed) == 1 and replayed[0].data["settled_by"] == "review"
    assert delivered(maildir) == [mid]


def test_a_cancel_that_met_an_unknown_email_ends_cancelled_once_a_person_finds_it_landed(
    tmp_path: Path,
) -> None:
    """Killed after the send, then cancelled: frozen (cancel_outcome_unknown); landed records the email committed and the run ends cancelled, nothing sent again."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "ok") as port:
        killed = email_runtime(tmp_path, smtp_adapter(port), CrashPlan(CrashPoint.EFFECT_SENT))
        with pytest.raises(SimulatedCrash):
            killed.start("r1").run()
        session = email_runtime(tmp_path, smtp_adapter(port)).recover("r1")
        session.cancel("the customer called: stop")
        assert session.state.phase is Phase.NEEDS_REVIEW
        case = session.state.review_cases[-1]
        assert case.reason == "cancel_outcome_unknown"
        mid = hints(case)["Message-ID"]
        assert delivered(maildir) == [mid]
        with pytest.raises(DecisionRefusedError):  # a cancel's case takes no compensate
            signed(session.state, "compensate", mid)
        session.review(signed(session.state, "landed", mid))
        assert session.state.phase is Phase.CANCELLED
        statuses_now = [status for status, _ in statuses(session.rt, case.idempotency_key)]
        assert statuses_now[-1] == "committed"
    assert delivered(maildir) == [mid]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EffectsService]:
    with effects_service(tmp_path) as running:
        yield running


def blind_http(service: EffectsService, **changes: Any) -> HttpEffect:
    """The reference service declared as one that cannot be asked by key."""
    return HttpEffect(
        service.url, profile=replace(REFERENCE_PROFILE, lookup=None, replay="new_effect", **changes)
    )


def frozen_ticket(tmp_path: Path, service: EffectsService, http: HttpEffect) -> RunState:
    service.mode(drop_after_commit=True)
    session = ticket_runtime(tmp_path, http).start("r1")
    session.run()
    service.mode(drop_after_commit=False)
    assert session.state.phase is Phase.NEEDS_REVIEW
    return session.state


def decided(
    tmp_path: Path, http: HttpEffect, state: RunState, decision: str, evidence: str | None = None
) -> RunSession:
    """Rita's signed ``decision`` delivered, then the run recovered and driven, as a worker would."""
    rt = ticket_runtime(tmp_path, http)
    rt.store.put_evidence("r1", "review_decision", signed(state, decision, evidence))
    again = rt.recover("r1")
    again.run()
    return again


def test_a_ticket_found_at_the_service_is_signed_landed(
    tmp_path: Path, service: EffectsService
) -> None:
    """The reply was lost after the ticket landed; the case names the URL and the key header; landed with the ticket's id: one ticket, none sent again."""
    with blind_http(service) as http:
        state = frozen_ticket(tmp_path, service, http)
        shown = hints(state.review_cases[-1])
        key = state.pending.idempotency_key if state.pending else ""
        assert shown["request"] == f"POST {service.url}/tickets"
        assert key in shown["Idempotency-Key header"]
        (found,) = service.tickets()
        again = decided(tmp_path, http, state, "landed", f"ticket {found['ticket_id']}")
        assert again.state.phase is Phase.COMPLETED
    assert len(service.tickets()) == 1


def test_a_reviewer_who_wrongly_signs_not_landed_still_makes_one_ticket(
    tmp_path: Path, service: EffectsService
) -> None:
    """The resend goes under the same key, so a service that deduplicates answers it with the first ticket: still one."""
    with blind_http(service) as http:
        state = frozen_ticket(tmp_path, service, http)
        again = decided(tmp_path, http, state, "not_landed")
        assert again.state.phase is Phase.COMPLETED
    assert len(service.tickets()) == 1


def test_compensate_undoes_a_ticket_whose_outcome_was_unknown_once(
    tmp_path: Path, service: EffectsService
) -> None:
    """compensate with the ticket's id: recorded committed by the reviewer, then cancelled once by the service's compensate path."""
    with blind_http(service) as http:
        state = frozen_ticket(tmp_path, service, http)
        key = state.pending.idempotency_key if state.pending else ""
        (found,) = service.tickets()
        again = decided(tmp_path, http, state, "compensate", str(found["ticket_id"]))
        assert again.state.phase is Phase.COMPLETED
        path = [status for status, _ in statuses(again.rt, key)]
    assert path[-2:] == ["committed", "compensated"]
    assert len(service.tickets()) == 1 and len(service.compensations()) == 1


def test_abort_fails_the_run_and_sends_nothing(tmp_path: Path, service: EffectsService) -> None:
    """abort: the run fails, the ledger keeps the outcome unknown, the service holds one ticket."""
    with blind_http(service) as http:
        state = frozen_ticket(tmp_path, service, http)
        again = decided(tmp_path, http, state, "abort")
        assert again.state.phase is Phase.FAILED
        assert [e.status.value for e in again.rt.store.ledger("r1")][-1] == "outcome_unknown"
    assert len(service.tickets()) == 1


def test_a_decision_the_case_does_not_take_is_refused_typed_and_the_case_stays(
    tmp_path: Path, service: EffectsService
) -> None:
    """accept on an unknown outcome, landed without evidence, an unknown decision: each refused, typed and traced; the case stays frozen."""
    with blind_http(service) as http:
        state = frozen_ticket(tmp_path, service, http)
        with pytest.raises(DecisionRefusedError) as no_evidence:
            signed(state, "landed")
        assert no_evidence.value.decision == "landed"
        with pytest.raises(DecisionRefusedError) as wrong:
            signed(state, "accept")
        assert "landed" in str(wrong.value)
        rt = ticket_runtime(tmp_path, http)
        session = rt.recover("r1")
        # A body built by hand, without the evidence landed needs: the runtime refuses it.
        now = datetime.now(UTC)
        bare = new_decision(
            session.state,
            session.state.review_cases[-1],
            "rita",
            "abort",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
        with pytest.raises(DecisionRefusedError):
            session.review(RITA.sign({**bare, "decision": "landed"}))
        with pytest.raises(EvidenceBindingError):
            session.review(RITA.sign({**bare, "decision": "landed_maybe"}))
        assert session.state.phase is Phase.NEEDS_REVIEW
        refused = [e for e in session.trace() if e.kind == "evidence_refused"]
        assert [e.data["error"] for e in refused] == [
            "DecisionRefusedError",
            "EvidenceBindingError",
        ]
        # A wrong decision changed nothing: the right one still applies.
        session.review(signed(session.state, "not_landed"))
        session.run()
        assert session.state.phase is Phase.COMPLETED
    assert len(service.tickets()) == 1
