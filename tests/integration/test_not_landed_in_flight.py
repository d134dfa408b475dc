"""A not_landed signed while the service still carries the request out is refused, never resent.

The reference effects service holds a ticket request in flight (``slow_s``)
past the profile's in-flight limit, so the run freezes with the outcome
unknown; a reviewer who finds no ticket yet signs ``not_landed``. The
runtime asks the service by key before it consumes the decision: in flight,
refused (wait, decide again); once the ticket has landed, refused again,
naming the ticket. Signed ``landed`` with the ticket, the run goes on, and
the service holds one ticket throughout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.conftest import ManualClock
from tests.integration._services import EffectsService, effects_service
from tests.integration.test_review_settle import KEYRING, RITA, TRUST, signed, ticket_runtime
from tether.adapters import REFERENCE_PROFILE, HttpEffect
from tether.core import AdapterUnavailableError, DecisionRefusedError, Phase, RunFrozenError
from tether.runtime import Runtime, case_effect, deliver, open_run, prepare_review

SLOW_S = 4.0
LIMIT_S = 1.0


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EffectsService]:
    with effects_service(tmp_path) as running:
        yield running


def test_not_landed_is_refused_while_in_flight_and_once_landed(
    tmp_path: Path, service: EffectsService
) -> None:
    """In flight: refused, nothing resent; landed: refused naming the ticket; one ticket in all."""
    profile = replace(REFERENCE_PROFILE, in_flight_limit_s=LIMIT_S)
    clock = ManualClock(datetime.now(UTC))
    service.mode(slow_s=SLOW_S)  # the service takes the key, then works on it for 4 s
    sent_at = time.monotonic()
    with HttpEffect(service.url, profile=profile, timeout_s=0.5) as http:
        rt = ticket_runtime(tmp_path, http)
        rt.clock = clock
        session = rt.start("r1")
        session.step()  # the send times out: dispatched, outcome not known yet
        assert session.state.phase is Phase.PENDING
        clock.advance(LIMIT_S + 1)  # past the in-flight limit, by the runtime's clock
        session.step()  # the look-up says 409 in flight, past the limit: a person decides
        assert session.state.phase is Phase.NEEDS_REVIEW
        case = session.state.review_cases[-1]
        assert case.reason == "outcome_unknown" and "still in flight" in case.detail
        ledger = session.rt.store.ledger("r1")
        shown = case_effect(session.state, case, ledger, clock.now())
        assert shown.warning == ""  # it can be asked by key, and the key is a second old
        assert service.tickets() == []  # the reviewer looks: nothing there yet

        with pytest.raises(DecisionRefusedError) as in_flight:
            session.review(signed(session.state, "not_landed"))
        assert in_flight.value.found == "in_flight" and "still in flight" in str(in_flight.value)
        assert "decide again" in str(in_flight.value)
        assert session.state.phase is Phase.NEEDS_REVIEW
        pending = session.state.pending
        assert pending is not None and not pending.resend_ordered
        session.run()  # a worker comes by: the case stays frozen, nothing is sent
        assert session.state.phase is Phase.NEEDS_REVIEW

        time.sleep(max(0.0, SLOW_S + 0.5 - (time.monotonic() - sent_at)))
        tickets = service.tickets()
        assert len(tickets) == 1  # the first request landed after all
        with pytest.raises(DecisionRefusedError) as landed:
            session.review(signed(session.state, "not_landed"))
        assert landed.value.found == "landed" and "sign landed" in str(landed.value)
        assert str(tickets[0]["ticket_id"]) in str(landed.value)
        assert "not_landed" not in landed.value.fits

        refreshed = session.state.review_cases[-1]  # the case now records the receipt
        assert refreshed.receipt is not None
        session.review(signed(session.state, "landed", str(tickets[0]["ticket_id"])))
        assert session.state.phase is Phase.RUNNING
        session.run()
    assert len(service.tickets()) == 1


def test_a_service_that_cannot_be_asked_warns_before_not_landed(
    tmp_path: Path, service: EffectsService
) -> None:
    """Declared without a look-up, the case card warns that the request may still be in flight."""
    blind = replace(REFERENCE_PROFILE, lookup=None, replay="new_effect")
    service.mode(drop_after_commit=True)
    with HttpEffect(service.url, profile=blind, timeout_s=2) as http:
        session = ticket_runtime(tmp_path, http).start("r1")
        session.run()
        assert session.state.phase is Phase.NEEDS_REVIEW
        case = session.state.review_cases[-1]
        effect = case_effect(session.state, case, session.rt.store.ledger("r1"))
        assert "not_landed" in effect.decisions
        assert "in flight" in effect.warning
        assert ("warning", effect.warning) in effect.lines()


RETENTION_S = 2.0


def forgotten_case(tmp_path: Path, service: EffectsService, http: HttpEffect) -> Runtime:
    """A ticket that landed with its reply lost, recovered once the service forgot its key."""
    service.mode(retention_s=RETENTION_S, drop_after_commit=True)
    rt = ticket_runtime(tmp_path, http)
    first = rt.start("r1")
    first.step()  # the ticket lands, the reply is lost: dispatched, outcome unknown
    assert first.state.phase is Phase.PENDING and len(service.tickets()) == 1
    service.mode(drop_after_commit=False)
    time.sleep(RETENTION_S + 0.5)
    other = {"Idempotency-Key": '"someone-else"'}
    service.client.post("/tickets", json={"title": "x"}, headers=other)  # purges old keys
    again = rt.recover("r1")
    again.step()  # absent, but past retention: a person decides
    assert again.state.phase is Phase.NEEDS_REVIEW
    assert again.state.review_cases[-1].reason == "outcome_unknown"
    return rt


def delivered(rt: Runtime, decision: str, evidence: str | None = None) -> int:
    """Rita's ``decision`` on the open case, prepared and left in the inbox as the CLI does."""
    now = datetime.now(UTC)
    view = open_run(rt.store, "r1", keyring=KEYRING, now=now)
    case = view.state.review_cases[-1]
    prepared = prepare_review(
        view,
        RITA,
        case.case_id,
        decision,
        now=now,
        trust=TRUST,
        seen_generation=view.state.generation,
        evidence=evidence,
    )
    return deliver(rt.store, prepared, now=now)


def test_a_forgotten_key_warns_and_not_landed_needs_what_was_searched(
    tmp_path: Path, service: EffectsService
) -> None:
    """Past retention the card says a key look-up proves nothing; a bare not_landed is refused."""
    profile = replace(REFERENCE_PROFILE, retention_s=RETENTION_S)
    with HttpEffect(service.url, profile=profile, timeout_s=2) as http:
        rt = forgotten_case(tmp_path, service, http)
        session = rt.recover("r1")
        case = session.state.review_cases[-1]
        effect = case_effect(session.state, case, rt.store.ledger("r1"), datetime.now(UTC))
        assert "key kept until" in effect.where_to_look and "forgotten" in effect.warning
        assert "not for the key" in effect.warning and "--evidence" in effect.warning
        assert ("warning", effect.warning) in effect.lines()
        key = case.idempotency_key
        assert service.client.get(f"/idempotency/{key}").status_code == 404  # forgotten

        with pytest.raises(DecisionRefusedError) as bare:
            session.review(signed(session.state, "not_landed"))
        assert bare.value.found == "unsearched" and "forgotten" in str(bare.value)
        assert session.state.phase is Phase.NEEDS_REVIEW
        pending = session.state.pending
        assert pending is not None and not pending.resend_ordered

        # Searched by its content, the ticket is there: landed, and nothing is sent again.
        mine = [t for t in service.tickets() if "printer on fire" in str(t["body"])]
        assert len(mine) == 1
        session.review(signed(session.state, "landed", str(mine[0]["ticket_id"])))
        session.run()
        assert session.state.phase is Phase.COMPLETED
    assert len([t for t in service.tickets() if "printer" in str(t["body"])]) == 1


def test_not_landed_while_the_service_is_down_is_refused_and_abort_goes_in_at_once(
    tmp_path: Path, service: EffectsService
) -> None:
    """An unreachable service refuses a not_landed (read, traced), so abort is delivered at once."""
    profile = replace(REFERENCE_PROFILE, retention_s=RETENTION_S)
    with HttpEffect(service.url, profile=profile, timeout_s=2) as http:
        rt = forgotten_case(tmp_path, service, http)
        service.kill()  # an outage: nothing answers on its port
        assert delivered(rt, "not_landed", "searched the tickets by title") == 1
        session = rt.recover("r1")
        with pytest.raises(RunFrozenError):
            session.step()  # reads the not_landed: refused, the cursor moves past it
        assert session.state.inbox_cursor == 1
        trace = open_run(rt.store, "r1", keyring=KEYRING).trace
        refused = [e for e in trace if e.kind == "evidence_refused"]
        assert "could not be asked" in str(refused[-1].data)
        assert "sign abort or landed now" in str(refused[-1].data)

        assert delivered(rt, "abort") == 2  # not held behind the refused one
        # The abort rereads the receipt before it is consumed (the seed's rule): with
        # the service still down it waits in the inbox, unread, until it answers.
        with pytest.raises(AdapterUnavailableError):
            rt.recover("r1").step()
        assert rt.recover("r1").state.inbox_cursor == 1
