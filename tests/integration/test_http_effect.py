"""HttpEffect against the reference effects service, a real process on loopback."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from tests.integration._services import EffectsService, effects_service, start_service, stop
from tether.adapters import (
    REFERENCE_PROFILE,
    Fence,
    HttpConfigError,
    HttpEffect,
    KeyInFlightError,
    KeyReusedError,
    NotQueryableError,
    RequestRefusedError,
    ServiceProfile,
)
from tether.adapters._errors import FenceRejectedError
from tether.core import (
    AdapterUnavailableError,
    CanonicalJSONError,
    ContractViolationError,
    EnvironmentDriftError,
    IdempotencyConflictError,
    Intent,
    Phase,
    PreconditionFailedError,
    VerifierRefusedError,
)
from tether.crypto import Keyring
from tether.runtime import CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import SQLiteStore

KEYRING = Keyring.generate("k1")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EffectsService]:
    with effects_service(tmp_path) as running:
        yield running


@pytest.fixture
def http(service: EffectsService) -> Iterator[HttpEffect]:
    with HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=2) as adapter:
        yield adapter


def ticket(adapter: HttpEffect, title: str = "printer on fire") -> Intent:
    args = adapter.normalize("http.post", "tickets", {"json": {"title": title}})
    return Intent("http.post", "tickets", args, "low")


def test_a_receipt_and_the_look_up_agree_field_for_field(
    http: HttpEffect, service: EffectsService
) -> None:
    """The reply's receipt is the one a look-up rebuilds later: replay comparisons hold."""
    intent = ticket(http)
    receipt = http.execute("k1", intent, http.environment())
    assert receipt.intent_digest == intent.digest and receipt.result["status"] == 201
    assert receipt.business_object_id == str(service.tickets()[0]["ticket_id"])
    assert http.lookup_intent("k1", intent) == receipt
    assert http.lookup("k9") is None


def test_the_same_key_and_intent_replays_without_a_second_ticket(
    http: HttpEffect, service: EffectsService
) -> None:
    """A resend under the same key gets the first receipt; the service holds one ticket."""
    intent = ticket(http)
    first = http.execute("k1", intent, http.environment())
    assert http.execute("k1", intent, http.environment()) == first
    assert len(service.tickets()) == 1


def test_the_same_key_with_another_intent_is_a_conflict(
    http: HttpEffect, service: EffectsService
) -> None:
    """422 is a key conflict the runtime freezes on; a look-up judges the other intent foreign."""
    first = ticket(http, "a")
    http.execute("k1", first, http.environment())
    other = ticket(http, "b")
    with pytest.raises(KeyReusedError) as caught:
        http.execute("k1", other, http.environment())
    assert isinstance(caught.value, IdempotencyConflictError) and "422" in str(caught.value)
    found = http.lookup_intent("k1", other)
    assert found is not None and found.intent_digest != other.digest
    assert len(service.tickets()) == 1


def test_a_key_in_flight_is_asked_again_with_the_same_key(service: EffectsService) -> None:
    """409 while the first request commits: the adapter waits and resends the SAME key."""
    service.mode(slow_s=0.5)
    with (
        HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=5) as a,
        HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=5) as b,
    ):
        intent = ticket(a)
        results = []
        first = threading.Thread(
            target=lambda: results.append(a.execute("k1", intent, a.environment()))
        )
        first.start()
        time.sleep(0.15)
        second = b.execute("k1", intent, b.environment())  # 409s, then the first response
        first.join()
    assert results == [second]
    assert len(service.tickets()) == 1


def test_a_key_still_in_flight_after_the_bounded_wait_is_unresolved(
    service: EffectsService,
) -> None:
    """After its retries the adapter reports the write in flight; it never mints a new key."""
    service.mode(slow_s=1.5)
    profile = replace(REFERENCE_PROFILE, in_flight_retries=2, in_flight_wait_s=0.05)
    with (
        HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=5) as a,
        HttpEffect(service.url, profile=profile) as b,
    ):
        intent = ticket(a)
        first = threading.Thread(target=lambda: a.execute("k1", intent, a.environment()))
        first.start()
        time.sleep(0.15)
        with pytest.raises(KeyInFlightError):
            b.execute("k1", intent, b.environment())
        with pytest.raises(KeyInFlightError):
            b.lookup_intent("k1", intent)  # the service says so too
        first.join()
    assert len(service.tickets()) == 1


@pytest.mark.parametrize("mode", ["drop_after_commit", "commit_then_500"])
def test_a_lost_or_false_reply_is_unknown_and_the_look_up_finds_the_ticket(
    http: HttpEffect, service: EffectsService, mode: str
) -> None:
    """The ticket landed but the reply was lost or said 500: outcome unknown; the key tells."""
    service.mode(**{mode: True})
    intent = ticket(http)
    with pytest.raises(AdapterUnavailableError, match="unknown"):
        http.execute("k1", intent, http.environment())
    found = http.lookup_intent("k1", intent)
    assert found is not None and found.intent_digest == intent.digest
    assert len(service.tickets()) == 1


def test_a_timeout_after_sending_is_unknown(service: EffectsService) -> None:
    """The service is slower than the client's timeout: unknown, and the ticket lands anyway."""
    service.mode(slow_s=1.0)
    with HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=0.3) as http:
        intent = ticket(http)
        with pytest.raises(AdapterUnavailableError, match="unknown"):
            http.execute("k1", intent, http.environment())
        time.sleep(1.0)
        assert http.lookup_intent("k1", intent) is not None
    assert len(service.tickets()) == 1


def test_a_refused_request_is_a_rejection_and_no_look_up_receipt(
    http: HttpEffect, service: EffectsService
) -> None:
    """A 400 about the payload applied nothing: a refusal, and the key holds no receipt."""
    args = http.normalize("http.post", "tickets", {"json": {"no": "title"}})
    intent = Intent("http.post", "tickets", args, "low")
    with pytest.raises(RequestRefusedError) as caught:
        http.execute("k1", intent, http.environment())
    assert isinstance(caught.value, PreconditionFailedError) and caught.value.status == 400
    with pytest.raises(RequestRefusedError):
        http.lookup_intent("k1", intent)  # the service stored its refusal of this request
    assert http.lookup("k1") is None  # no receipt: nothing landed
    assert service.tickets() == []


def test_a_superseded_fencing_token_is_refused(http: HttpEffect, service: EffectsService) -> None:
    """Tether-Fence: once lease version 3 wrote, version 2 is refused and writes nothing."""
    http.execute("k1", ticket(http, "a"), http.environment(), Fence("r1", 3))
    with pytest.raises(FenceRejectedError):
        http.execute("k2", ticket(http, "b"), http.environment(), Fence("r1", 2))
    assert len(service.tickets()) == 1


def test_the_environment_names_the_service_instance(tmp_path: Path) -> None:
    """Restarted on its own data it is the same instance; another database is another."""
    one = start_service(tmp_path / "a.sqlite", tmp_path / "a.log")
    try:
        with HttpEffect(one.url, profile=REFERENCE_PROFILE) as http:
            before = http.environment()
        assert one.instance_id in before.instance_id
    finally:
        stop(one)
    again = start_service(tmp_path / "a.sqlite", tmp_path / "a.log")
    other = start_service(tmp_path / "b.sqlite", tmp_path / "b.log")
    try:
        with HttpEffect(again.url, profile=REFERENCE_PROFILE) as http:
            assert http.environment().instance_id.split("#")[1] == one.instance_id
        with (
            HttpEffect(other.url, profile=REFERENCE_PROFILE) as http,
            pytest.raises(EnvironmentDriftError),
        ):
            http.execute("k1", ticket(http), before)  # an intent for another instance
    finally:
        stop(again)
        stop(other)


def test_capabilities_follow_the_declared_profile(service: EffectsService) -> None:
    """Idempotent only where a resend is safe; queryable with a look-up; absence final only then."""
    with HttpEffect(service.url, profile=REFERENCE_PROFILE) as http:
        caps = http.capabilities
        assert (caps.idempotent, caps.queryable, caps.absent_is_final) == (True, True, True)
        assert caps.retention_s == REFERENCE_PROFILE.retention_s and caps.fencing
    partial = replace(REFERENCE_PROFILE, replay="new_effect")
    with HttpEffect(service.url, profile=partial) as http:
        assert not http.capabilities.idempotent and http.capabilities.absent_is_final is False
    resend_only = replace(REFERENCE_PROFILE, lookup=None)
    with HttpEffect(service.url, profile=resend_only) as http:
        assert http.capabilities.idempotent and not http.capabilities.queryable
        with pytest.raises(NotQueryableError):
            http.lookup("k1")
    with HttpEffect(service.url) as http:  # no profile: nothing promised
        caps = http.capabilities
        assert caps.blind and not caps.absent_is_final and not caps.fencing
        assert http.environment().instance_id == service.url + "#"  # no identity path asked


def test_a_lying_look_up_finds_nothing(http: HttpEffect, service: EffectsService) -> None:
    """A look-up that says 404 for a landed key is why absence is only final where keys dedupe."""
    intent = ticket(http)
    http.execute("k1", intent, http.environment())
    service.mode(lying_lookup=True)
    assert http.lookup_intent("k1", intent) is None
    assert http.execute("k1", intent, http.environment()).result["status"] == 201  # deduped
    assert len(service.tickets()) == 1


def test_an_unreachable_service_is_unavailable(tmp_path: Path) -> None:
    """Nothing listening: identity and sends are typed unavailability, never a traceback."""
    running = start_service(tmp_path / "s.sqlite", tmp_path / "s.log")
    url = running.url
    stop(running)
    with (
        HttpEffect(url, profile=REFERENCE_PROFILE, timeout_s=1) as http,
        pytest.raises(AdapterUnavailableError),
    ):
        http.environment()


@pytest.mark.parametrize("args", [{}, {"json": [1]}, {"json": {"a": 1}, "extra": 2}])
def test_bad_arguments_are_contract_violations(http: HttpEffect, args: dict[str, object]) -> None:
    """http.post takes exactly {"json": OBJECT}."""
    with pytest.raises(ContractViolationError):
        http.normalize("http.post", "tickets", args)


def test_a_payload_without_canonical_json_is_refused(http: HttpEffect) -> None:
    """NaN has no RFC 8785 form: refused before a key or a request exists."""
    with pytest.raises(CanonicalJSONError):
        http.normalize("http.post", "tickets", {"json": {"n": float("nan")}})


def test_configuration_is_checked_up_front() -> None:
    """Bad URLs, timeouts and profiles are HttpConfigError before any request."""
    with pytest.raises(HttpConfigError):
        HttpEffect("ftp://example")
    with pytest.raises(HttpConfigError):
        HttpEffect("http://127.0.0.1:9", timeout_s=0)
    with pytest.raises(HttpConfigError):
        ServiceProfile(replay="sometimes")
    with pytest.raises(HttpConfigError):
        ServiceProfile(lookup="idempotency")
    with pytest.raises(HttpConfigError):
        ServiceProfile(retention_s=-1)
    with pytest.raises(HttpConfigError):
        ServiceProfile(identity=None, verifies_instance=True)


def test_an_http_service_runs_no_verifier(http: HttpEffect) -> None:
    """Verifiers run on a workspace; asking a service to run one is a typed refusal."""
    with pytest.raises(VerifierRefusedError):
        http.verify(("python", "-c", "pass"), 5)


# --- through the runtime: the crash windows settle by key ---------------------


def http_run(tmp_path: Path, http: HttpEffect, crash: object = None) -> Runtime:
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
    )


def committed(rt: Runtime) -> list[str]:
    return [e.status.value for e in rt.store.ledger("r1")]


@pytest.mark.parametrize("mode", ["drop_after_commit", "commit_then_500", None])
def test_a_reply_lost_after_the_ticket_landed_is_reconciled_by_key(
    tmp_path: Path, service: EffectsService, mode: str | None
) -> None:
    """Crash after the send (or a lost/false reply): recovery asks by key, records, never resends."""
    if mode is not None:
        service.mode(**{mode: True})
    with HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=2) as http:
        rt = http_run(tmp_path, http, CrashPlan(CrashPoint.EFFECT_SENT, mode="raise"))
        session = rt.start("r1")
        if mode is None:
            with pytest.raises(SimulatedCrash):
                session.step()
        else:
            session.step()  # the reply was lost: the write stays dispatched
        service.mode(drop_after_commit=False, commit_then_500=False)
        again = http_run(tmp_path, http).recover("r1")
        again.step()
        assert again.state.writes_committed == 1 and again.state.pending is None
        assert committed(again.rt)[-1] == "committed"
    assert len(service.tickets()) == 1


def test_without_a_look_up_a_lost_reply_goes_to_review(
    tmp_path: Path, service: EffectsService
) -> None:
    """A service that cannot be asked by key: the unknown send freezes; no resend, one ticket."""
    service.mode(drop_after_commit=True)
    blind = replace(REFERENCE_PROFILE, lookup=None, replay="new_effect")  # promises nothing
    with HttpEffect(service.url, profile=blind, timeout_s=2) as http:
        session = http_run(tmp_path, http).start("r1")
        session.step()
        assert session.state.phase is Phase.NEEDS_REVIEW
        assert session.state.review_cases[0].reason == "outcome_unknown"
    assert len(service.tickets()) == 1


def test_a_dispatched_key_past_retention_goes_to_review(
    tmp_path: Path, service: EffectsService
) -> None:
    """The service may have forgotten the key: no look-up verdict is trusted, no resend."""
    service.mode(drop_after_commit=True, retention_s=0.3)
    short = replace(REFERENCE_PROFILE, retention_s=0.3)
    with HttpEffect(service.url, profile=short, timeout_s=2) as http:
        session = http_run(tmp_path, http).start("r1")
        session.step()
        time.sleep(0.5)  # the key outlives the service's memory of it
        service.mode(drop_after_commit=False)
        other = {"Idempotency-Key": '"someone-else"'}
        service.client.post("/tickets", json={"title": "x"}, headers=other)  # purges old keys
        again = http_run(tmp_path, http).recover("r1")
        again.step()
        assert again.state.phase is Phase.NEEDS_REVIEW
        assert again.state.review_cases[0].reason == "outcome_unknown"
        assert "past the" in again.state.review_cases[0].detail
    assert len(service.tickets()) == 2  # ours, once, and the other caller's


def test_a_reply_with_an_id_past_2_53_is_still_a_receipt(
    http: HttpEffect, service: EffectsService
) -> None:
    """A 64-bit ticket id has no RFC 8785 form: the receipt keeps its digest, equal by look-up."""
    service.mode(id_offset=2**60)
    intent = ticket(http)
    receipt = http.execute("k1", intent, http.environment())
    assert receipt.business_object_id == str(2**60 + 1)
    assert "body_sha256" in receipt.result["body"]
    assert http.lookup_intent("k1", intent) == receipt


@pytest.mark.parametrize(
    ("verifies", "said"),
    [(True, "refused the request before applying anything"), (False, "nothing was sent")],
)
def test_another_service_instance_at_the_same_address_is_refused(
    tmp_path: Path, verifies: bool, said: str
) -> None:
    """A new database at the URL gets nothing: it refuses Tether-Instance, or a re-read spots it."""
    first = start_service(tmp_path / "a.sqlite", tmp_path / "a.log")
    port = int(first.url.rsplit(":", 1)[1])
    profile = replace(REFERENCE_PROFILE, verifies_instance=verifies)
    http = HttpEffect(first.url, profile=profile, timeout_s=2)
    try:
        intent = ticket(http)
        bound = http.environment()
        stop(first)
        other = start_service(tmp_path / "b.sqlite", tmp_path / "b.log", port=port)
        try:
            with pytest.raises(EnvironmentDriftError, match=said) as caught:
                http.execute("k1", intent, bound)
            assert caught.value.expected == bound.instance_id
            assert caught.value.actual == f"{other.url}#{other.instance_id}"
            with pytest.raises(EnvironmentDriftError):
                http.lookup_intent("k1", intent)
            assert other.tickets() == []
            assert other.client.get("/idempotency/k1").status_code == 404  # no key taken
        finally:
            stop(other)
    finally:
        http.close()


@pytest.mark.parametrize("recovered", [False, True])
def test_a_refusal_whose_reply_was_lost_is_a_rejection_not_a_review(
    tmp_path: Path, service: EffectsService, recovered: bool
) -> None:
    """Sent once, refused and stored, the reply timed out: the look-up says refused, no resend,
    in the same session and in a recovery that reads 'resent' from the checkpoint."""
    from tests.conftest import ScriptedAgent, write

    service.mode(slow_s=1.0)
    with HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=0.3) as http:
        rt = http_run(tmp_path, http)
        bad = write("tickets", "", kind="http.post", args={"json": {"no": "title"}})
        rt.agent = ScriptedAgent([bad])
        session = rt.start("r1")
        assert session.step().reason == "adapter_unavailable"  # sent; the reply never came
        time.sleep(1.0)  # the service has answered 400 and stored it under the key
        service.mode(slow_s=0)
        if recovered:
            session = http_run(tmp_path, http).recover("r1")  # the state as signed
        assert session.state.pending is not None and not session.state.pending.resent
        outcome = session.step()
    assert outcome.reason == "refused" and outcome.state.phase is Phase.RUNNING
    assert committed(session.rt)[-1] == "rejected"
    assert service.tickets() == []


def test_a_key_stuck_in_flight_goes_to_review_after_the_profiles_limit(
    tmp_path: Path, service: EffectsService
) -> None:
    """A handler that holds the key past in_flight_limit_s: review, never a new key or a resend."""
    service.mode(slow_s=3.0)
    quick = replace(REFERENCE_PROFILE, in_flight_limit_s=0.5, in_flight_retries=0)
    with HttpEffect(service.url, profile=quick, timeout_s=0.3) as http:
        session = http_run(tmp_path, http).start("r1")
        assert session.step().reason == "adapter_unavailable"  # sent, timed out: unknown
        assert session.step().reason == "in_flight"  # the service still holds the key
        time.sleep(0.6)
        outcome = session.step()
        assert outcome.state.phase is Phase.NEEDS_REVIEW
        assert outcome.state.review_cases[0].reason == "outcome_unknown"
        assert "in flight" in outcome.state.review_cases[0].detail
    time.sleep(2.5)  # the slow handler finishes: one ticket, from the one request
    assert len(service.tickets()) == 1


def test_a_service_that_does_not_check_the_instance_it_is_told_is_a_profile_error(
    service: EffectsService,
) -> None:
    """Declared verifies_instance, but the answers name no instance: a typed configuration error."""
    with HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=2) as http:
        intent = ticket(http)
        env = http.environment()
        service.mode(ignore_instance=True)
        with pytest.raises(HttpConfigError, match="names no instance"):
            http.execute("k1", intent, env)
        with pytest.raises(HttpConfigError, match="names no instance"):
            http.lookup_intent("k1", intent)
    without = replace(REFERENCE_PROFILE, verifies_instance=False)
    with HttpEffect(service.url, profile=without, timeout_s=2) as http:
        assert http.execute("k1", intent, http.environment()).result["status"] == 201
    assert len(service.tickets()) == 1  # the unverified send landed once; the resend replayed


class _NoContent(BaseHTTPRequestHandler):
    """A real HTTP server that answers every POST 204 and counts what it received."""

    received: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        self.rfile.read(length)
        type(self).received.append(self.headers.get("Idempotency-Key", ""))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_204_no_content_is_a_committed_effect() -> None:
    """A success with no body is a receipt, not an unknown outcome."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoContent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    profile = ServiceProfile(lookup=None, identity=None, verifies_instance=False)
    try:
        with HttpEffect(f"http://127.0.0.1:{server.server_port}", profile=profile) as plain:
            receipt = plain.execute("k1", ticket(plain), plain.environment())
    finally:
        server.shutdown()
        server.server_close()
    assert receipt.result == {"status": 204, "body": None}
    assert _NoContent.received == ['"k1"']


def test_two_services_in_one_run_each_own_their_kind(tmp_path: Path) -> None:
    """Two HttpEffects under their own kinds and namespaces share a run; one ticket each."""
    from tests.conftest import ScriptedAgent, make_policy, make_task, write
    from tether.adapters import Adapters

    with (
        effects_service(tmp_path, "a") as first,
        effects_service(tmp_path, "b") as second,
        HttpEffect(
            first.url, profile=REFERENCE_PROFILE, kind="desk.post", namespace="desk"
        ) as desk,
        HttpEffect(
            second.url, profile=REFERENCE_PROFILE, kind="billing.post", namespace="billing"
        ) as billing,
    ):
        both = Adapters(desk, billing)
        rule = {"risk": "low", "permission": "service.write", "needs_approval": False}
        task = make_task(
            both.environment().state_fingerprint,
            allowed_kinds=["desk.post", "billing.post"],
            allowed_paths=["tickets"],
            permissions=["service.write"],
            initial_environment={"namespace": both.namespace},
        )
        rt = Runtime(
            store=SQLiteStore(tmp_path / "tether.sqlite"),
            keyring=KEYRING,
            adapter=both,
            task=task,
            policy=make_policy(kinds={"desk.post": rule, "billing.post": rule}),
            agent=ScriptedAgent(
                [
                    write("tickets", "", kind="desk.post", args={"json": {"title": "desk"}}),
                    write("tickets", "", kind="billing.post", args={"json": {"title": "bill"}}),
                ]
            ),
        )
        session = rt.start("r1")
        session.step()
        session.step()
        assert session.state.writes_committed == 2
        assert [t["body"] for t in first.tickets()] == ['{"title":"desk"}']
        assert [t["body"] for t in second.tickets()] == ['{"title":"bill"}']
        adapters = {e.terms.adapter for e in rt.store.ledger("r1") if e.terms is not None}
        assert adapters == {"desk", "billing"}
    with pytest.raises(HttpConfigError, match="dotted"):
        HttpEffect("http://127.0.0.1:1", kind="Post")
