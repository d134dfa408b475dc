"""ServiceProfile presets and the no-assumption default, against real HTTP servers on loopback.

Each preset is played against the reference effects service switched into
the behaviour the preset describes (a real process, its own SQLite file):
the draft (replay, 409 in flight, 422), Stripe-style replay (400
``idempotency_error`` on another payload), and 409 for every key already
held. A third-party server with no idempotency and no look-up route is the
same service with keys ignored and the route gone. The crash windows run
through the crash harness (child processes killed with SIGKILL).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.integration._presetapp import SERVICE_ENV, tickets
from tests.integration._services import EffectsService, effects_service
from tether.adapters import (
    CONFLICT_409,
    PRESETS,
    REFERENCE_PROFILE,
    STRIPE_REPLAY,
    HttpConfigError,
    HttpEffect,
    KeyHeldError,
    KeyReusedError,
    ServiceProfile,
)
from tether.core import (
    AdapterUnavailableError,
    Intent,
    LookupInconclusiveError,
    Phase,
)
from tether.crypto import Keyring
from tether.runtime import CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import SQLiteStore
from tether.testing.crash_harness import Verdict, run_crash_harness

KEYRING = Keyring.generate("k1")
P = CrashPoint
EFFECT_WINDOWS = (P.INTENT_PERSISTED, P.EFFECT_SENT, P.RECEIPT_PERSISTED)
TRIALS = max(1, int(os.environ.get("TETHER_CRASH_TRIALS", "20")) // 10)
#: The reference service's modes that make it behave as each preset says.
BEHAVES = {
    "IETF_DRAFT": {},
    "STRIPE_REPLAY": {"mismatch": "400"},
    "CONFLICT_409": {"replay_status": 409, "mismatch": "replay"},
}
#: A third-party server with neither keys nor a look-up route (nor the instance check).
THIRD_PARTY = {"ignore_keys": True, "lookup_route": "missing", "ignore_instance": True}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EffectsService]:
    with effects_service(tmp_path) as running:
        yield running


def ticket(adapter: HttpEffect, title: str = "printer on fire") -> Intent:
    args = adapter.normalize("http.post", "tickets", {"json": {"title": title}})
    return Intent("http.post", "tickets", args, "low")


def http_run(
    tmp_path: Path, http: HttpEffect, crash: CrashPlan | None = None, **kw: Any
) -> Runtime:
    from tests.conftest import ScriptedAgent, make_policy, make_task, write

    task = make_task(
        http.environment().state_fingerprint,
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
        adapter=http,
        task=task,
        policy=make_policy(kinds={"http.post": rule}),
        agent=ScriptedAgent([post]),
        crash=crash or CrashPlan(),
        **kw,
    )


# --- the default promises nothing -------------------------------------------


def test_the_default_profile_promises_nothing() -> None:
    """ServiceProfile(): no look-up, no identity, no deduplication; HttpEffect(url) uses it."""
    nothing = ServiceProfile()
    assert (nothing.lookup, nothing.identity, nothing.replay) == (None, None, "new_effect")
    assert not nothing.resend_safe and not nothing.refuses_in_flight
    with HttpEffect("http://127.0.0.1:9") as http:
        assert http.profile == nothing and http.capabilities.blind


def test_a_third_party_server_without_keys_sends_a_lost_reply_to_review(
    tmp_path: Path, service: EffectsService
) -> None:
    """No profile, a server with neither keys nor a look-up, the reply lost: review, one ticket."""
    service.mode(**THIRD_PARTY, drop_after_commit=True)
    with HttpEffect(service.url, timeout_s=2) as http:
        session = http_run(tmp_path, http).start("r1")
        session.step()
        assert session.state.phase is Phase.NEEDS_REVIEW
        assert [c.reason for c in session.state.review_cases] == ["outcome_unknown"]
        service.mode(drop_after_commit=False)
        again = http_run(tmp_path, http).recover("r1")
        again.run()
        assert again.state.phase is Phase.NEEDS_REVIEW
    assert len(service.tickets()) == 1


@pytest.mark.parametrize("route", ["missing", "json_404", "redirect"])
def test_a_look_up_answer_from_no_declared_route_is_never_absence(
    tmp_path: Path, service: EffectsService, route: str
) -> None:
    """A declared look-up answered by 'no such route', a bare JSON 404 or a redirect: review."""
    service.mode(**{**THIRD_PARTY, "lookup_route": route})
    declared = ServiceProfile(lookup="idempotency/{key}")  # a look-up, no deduplication
    with HttpEffect(service.url, profile=declared, timeout_s=2) as http:
        intent = ticket(http)
        http.execute("k1", intent, http.environment())
        with pytest.raises(LookupInconclusiveError, match="proves nothing"):
            http.lookup_intent("k1", intent)
        crash = CrashPlan(P.EFFECT_SENT, mode="raise")
        session = http_run(tmp_path, http, crash).start("r1")
        with pytest.raises(SimulatedCrash):
            session.step()
        again = http_run(tmp_path, http).recover("r1")
        again.run()
        assert again.state.phase is Phase.NEEDS_REVIEW
        assert "proved nothing" in again.state.review_cases[0].detail
    assert len(service.tickets()) == 2  # the direct execute above, and the run's one


def test_a_look_up_in_its_declared_shape_is_absence(service: EffectsService) -> None:
    """The reference route's own 404 (key echoed) is 'no record'; a server error is not."""
    with HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=2) as http:
        assert http.lookup("never-sent") is None
        service.mode(lookup_route="json_404")
        with pytest.raises(LookupInconclusiveError):
            http.lookup("never-sent")
    strict = replace(REFERENCE_PROFILE, lookup_absent={"idempotency_key": "{key}", "gone": "yes"})
    service.mode(lookup_route="ok")
    with (
        HttpEffect(service.url, profile=strict, timeout_s=2) as http,
        pytest.raises(LookupInconclusiveError),
    ):
        http.lookup("never-sent")  # the service's 404 lacks a field the profile declares
    service.kill()
    unbound = replace(REFERENCE_PROFILE, identity=None, verifies_instance=False)
    with (
        HttpEffect(service.url, profile=unbound, timeout_s=1) as http,
        pytest.raises(AdapterUnavailableError),
    ):
        http.lookup("never-sent")


def test_a_misdeclared_absence_shape_is_refused_up_front() -> None:
    """An absence that echoes no key, or a 3xx/5xx absence status, cannot be declared."""
    with pytest.raises(HttpConfigError, match="key"):
        ServiceProfile(lookup="idempotency/{key}", lookup_absent={"error": "not_found"})
    with pytest.raises(HttpConfigError):
        ServiceProfile(lookup="idempotency/{key}", lookup_absent_status=302)
    with pytest.raises(HttpConfigError):
        ServiceProfile(detects_mismatch=True, mismatch_status=409)


# --- the presets, against servers that behave so -----------------------------


@pytest.mark.parametrize("name", ["IETF_DRAFT", "STRIPE_REPLAY"])
def test_a_replaying_preset_settles_a_lost_reply_by_resending_the_same_key(
    tmp_path: Path, service: EffectsService, name: str
) -> None:
    """No look-up, the reply lost, the process gone: the same key again gets the stored response."""
    service.mode(**BEHAVES[name], drop_after_commit=True)
    with HttpEffect(service.url, profile=PRESETS[name], timeout_s=2) as http:
        caps = http.capabilities
        assert caps.idempotent and not caps.queryable
        session = http_run(tmp_path, http).start("r1")
        session.step()  # sent, landed, reply lost: still dispatched
        assert session.state.phase is Phase.PENDING
        service.mode(drop_after_commit=False)
        again = http_run(tmp_path, http).recover("r1")
        again.step()
        assert again.state.writes_committed == 1 and again.state.pending is None
        assert again.state.review_cases == ()
    assert len(service.tickets()) == 1


@pytest.mark.parametrize("name", ["IETF_DRAFT", "STRIPE_REPLAY"])
def test_a_replaying_preset_reads_the_servers_key_reuse_as_a_conflict(
    service: EffectsService, name: str
) -> None:
    """The draft's 422, Stripe's 400 idempotency_error: a key conflict, one ticket."""
    service.mode(**BEHAVES[name])
    with HttpEffect(service.url, profile=PRESETS[name], timeout_s=2) as http:
        first = http.execute("k1", ticket(http, "a"), http.environment())
        assert http.execute("k1", ticket(http, "a"), http.environment()) == first  # replayed
        with pytest.raises(KeyReusedError) as caught:
            http.execute("k1", ticket(http, "b"), http.environment())
    assert caught.value.status == PRESETS[name].mismatch_status
    assert len(service.tickets()) == 1


def test_a_stripe_style_400_that_is_not_about_the_key_is_a_refusal(
    service: EffectsService,
) -> None:
    """Stripe answers bad parameters with 400 too: without 'idempotency' it is a plain refusal."""
    from tether.adapters import RequestRefusedError

    service.mode(**BEHAVES["STRIPE_REPLAY"])
    with (
        HttpEffect(service.url, profile=STRIPE_REPLAY, timeout_s=2) as http,
        pytest.raises(RequestRefusedError),
    ):
        http.execute("k1", ticket(http, ""), http.environment())  # no title: 400
    assert service.tickets() == []


@pytest.mark.parametrize("name", ["IETF_DRAFT", "STRIPE_REPLAY"])
def test_a_replaying_preset_waits_out_a_key_in_flight(service: EffectsService, name: str) -> None:
    """409 while the first request commits: asked again with the same key, one ticket."""
    service.mode(**BEHAVES[name], slow_s=0.5)
    with (
        HttpEffect(service.url, profile=PRESETS[name], timeout_s=5) as a,
        HttpEffect(service.url, profile=PRESETS[name], timeout_s=5) as b,
    ):
        intent = ticket(a)
        results = []
        first = threading.Thread(
            target=lambda: results.append(a.execute("k1", intent, a.environment()))
        )
        first.start()
        time.sleep(0.15)
        second = b.execute("k1", intent, b.environment())
        first.join()
    assert results == [second]
    assert len(service.tickets()) == 1


def test_the_409_preset_never_sends_twice_and_asks_a_person(
    tmp_path: Path, service: EffectsService
) -> None:
    """409 for a held key: a resend is refused, so a lost reply goes to review, one ticket."""
    service.mode(**BEHAVES["CONFLICT_409"])
    with HttpEffect(service.url, profile=CONFLICT_409, timeout_s=2) as http:
        assert http.capabilities.blind  # safe to resend, but a resend settles nothing
        http.execute("k1", ticket(http, "a"), http.environment())
        for again in (ticket(http, "a"), ticket(http, "b")):  # the same request, or another
            with pytest.raises(KeyHeldError, match="in flight or done"):
                http.execute("k1", again, http.environment())
        service.mode(drop_after_commit=True)
        session = http_run(tmp_path, http).start("r1")
        session.step()  # landed, the reply lost: no resend could say more
        assert session.state.phase is Phase.NEEDS_REVIEW
        assert session.state.review_cases[0].reason == "outcome_unknown"
        service.mode(drop_after_commit=False)
        recovered = http_run(tmp_path, http).recover("r1")
        recovered.run()
        assert recovered.state.phase is Phase.NEEDS_REVIEW
    assert len(service.tickets()) == 2  # "a" sent directly above, and the run's one


def test_the_409_preset_sends_a_write_a_crash_kept_from_leaving(
    tmp_path: Path, service: EffectsService
) -> None:
    """Crashed after the intent, before the send: the same key goes out once and lands."""
    service.mode(**BEHAVES["CONFLICT_409"])
    with HttpEffect(service.url, profile=CONFLICT_409, timeout_s=2) as http:
        crash = CrashPlan(P.INTENT_PERSISTED, mode="raise")
        with pytest.raises(SimulatedCrash):
            http_run(tmp_path, http, crash).start("r1").step()
        recovered = http_run(tmp_path, http).recover("r1")
        recovered.step()
        assert recovered.state.writes_committed == 1 and recovered.state.review_cases == ()
    assert len(service.tickets()) == 1


# --- killed at every effect window (the crash harness) ------------------------


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EffectsService]:
    """One service for every run of a harness; its URL in the environment the children inherit."""
    with effects_service(tmp_path, "shared") as running:
        monkeypatch.setenv(SERVICE_ENV, running.url)
        yield running


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ietf", "stripe"])
def test_a_replaying_preset_killed_at_every_effect_window_makes_one_ticket(
    tmp_path: Path, shared: EffectsService, name: str
) -> None:
    """SIGKILLed in each effect window and recovered twice: one ticket, the run completed."""
    shared.mode(**BEHAVES["IETF_DRAFT" if name == "ietf" else "STRIPE_REPLAY"])
    report = run_crash_harness(
        f"tests.integration._presetapp:{name}",
        trials=TRIALS,
        points=EFFECT_WINDOWS,
        workdir=tmp_path / "work",
        jobs=2,
    )
    assert report.passed, report.render()
    for cell in report.cells:
        for trial in cell.trials:
            assert trial.verdict is Verdict.OK, report.render()
            assert dict(trial.effects) == {"file.write": 1, "http.post": 1}, report.render()
            assert len(tickets(shared.url, trial.run_id)) == 1


@pytest.mark.slow
def test_the_409_preset_killed_after_its_send_holds_one_ticket(
    tmp_path: Path, shared: EffectsService
) -> None:
    """Killed after the POST: the resend meets 409 and goes to review (never a second ticket)."""
    shared.mode(**BEHAVES["CONFLICT_409"])
    report = run_crash_harness(
        "tests.integration._presetapp:conflict",
        trials=TRIALS,
        points=EFFECT_WINDOWS,
        workdir=tmp_path / "work",
        jobs=2,
    )
    assert report.passed, report.render()
    for cell in report.cells:
        # Past the POST (the receipt's commit is where receipt_persisted fires).
        post = cell.point in (P.EFFECT_SENT, P.RECEIPT_PERSISTED) and cell.hit == 2
        for trial in cell.trials:  # the write is committed apart from its send: no resend
            assert trial.effects["http.post"] == 1, report.render()
            if post:  # the ticket landed, its reply went with the process: a person decides
                assert trial.verdict is Verdict.REVIEW, report.render()
                assert trial.reviews == ("outcome_unknown",)
            else:
                assert trial.verdict is Verdict.OK, report.render()


@pytest.mark.slow
def test_no_profile_killed_after_its_send_goes_to_review_with_one_ticket(
    tmp_path: Path, shared: EffectsService
) -> None:
    """HttpEffect(url) on a server without keys, killed after the POST: review, never a resend."""
    shared.mode(**THIRD_PARTY)
    report = run_crash_harness(
        "tests.integration._presetapp:nothing",
        trials=TRIALS,
        points=[P.EFFECT_SENT],
        workdir=tmp_path / "work",
        jobs=2,
    )
    assert report.passed, report.render()
    file_write, post = report.cells
    assert file_write.verdict is Verdict.OK
    assert post.verdict is Verdict.REVIEW, report.render()
    for trial in post.trials:
        assert trial.effects["http.post"] == 1
        assert (trial.phase, trial.reviews) == ("needs_review", ("outcome_unknown",))
