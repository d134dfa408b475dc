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
from tests.integration.test_review_settle import signed, ticket_runtime
from tether.adapters import REFERENCE_PROFILE, HttpEffect
from tether.core import DecisionRefusedError, Phase
from tether.runtime import case_effect

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
        assert case_effect(session.state, case, ledger).warning == ""  # it can be asked by key
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
