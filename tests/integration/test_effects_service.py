"""The reference effects service, a real process on loopback: the draft, and each hostile mode."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration._services import EffectsService, effects_service, start_service, stop
from tether.adapters import HeaderFieldError, fence_header, parse_sf_string, sf_string
from tether.testing.effects_service import listen


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EffectsService]:
    with effects_service(tmp_path) as running:
        yield running


def post(service: EffectsService, key: str | None, body: dict[str, Any], **headers: str) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = sf_string(key)
    return service.client.post("/tickets", json=body, headers=headers)


def test_a_replay_returns_the_first_response_and_creates_nothing(service: EffectsService) -> None:
    """Same key, same payload: the stored first response, marked as a replay; one ticket."""
    first = post(service, "k1", {"title": "printer on fire"})
    again = post(service, "k1", {"title": "printer on fire"})
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    assert len(service.tickets()) == 1


def test_key_reuse_with_another_payload_is_422_and_creates_nothing(
    service: EffectsService,
) -> None:
    """Same key, other payload: 422, and the first ticket stays the only one."""
    post(service, "k1", {"title": "a"})
    reused = post(service, "k1", {"title": "b"})
    assert reused.status_code == 422 and reused.json()["error"] == "idempotency_key_reused"
    assert len(service.tickets()) == 1


@pytest.mark.parametrize("header", [None, "k1", '"a\\b"', '""', '"\u00e9"'])
def test_a_missing_or_malformed_key_is_400(service: EffectsService, header: str | None) -> None:
    """No key, an unquoted key, a bad escape, an empty or non-ASCII key: 400, nothing created."""
    headers = {} if header is None else {"Idempotency-Key": header.encode()}
    answer = service.client.post("/tickets", json={"title": "a"}, headers=headers)
    assert answer.status_code == 400
    assert service.tickets() == []


def test_an_error_is_stored_and_replayed_like_a_success(service: EffectsService) -> None:
    """A refused request's response is the key's response too: the retry gets the same 400."""
    first = post(service, "k1", {"no": "title"})
    again = post(service, "k1", {"no": "title"})
    assert first.status_code == again.status_code == 400 and again.json() == first.json()
    assert service.tickets() == []


def test_look_up_by_key_and_identity_survive_a_restart(tmp_path: Path) -> None:
    """After SIGKILL and restart: same instance id, the key's response, and replays still hold."""
    service = start_service(tmp_path / "s.sqlite", tmp_path / "s.log")
    try:
        created = post(service, "k1", {"title": "a"}).json()
        service.kill()
    finally:
        stop(service)
    again = start_service(tmp_path / "s.sqlite", tmp_path / "s.log")
    try:
        assert again.instance_id == service.instance_id
        found = again.client.get("/idempotency/k1").json()
        assert found["state"] == "completed" and found["response"]["body"] == created
        assert again.client.get("/idempotency/k9").status_code == 404
        assert post(again, "k1", {"title": "a"}).json() == created
        assert len(again.tickets()) == 1
    finally:
        stop(again)


def test_a_key_in_flight_is_409_then_the_first_response(service: EffectsService) -> None:
    """A second request while the first is still committing is refused; afterwards it replays."""
    service.mode(slow_s=0.6)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, service, "k1", {"title": "a"})
        time.sleep(0.2)
        during = post(service, "k1", {"title": "a"})
        assert during.status_code == 409
        assert first.result().status_code == 201
    assert post(service, "k1", {"title": "a"}).json() == first.result().json()
    assert len(service.tickets()) == 1


@pytest.mark.parametrize(("expiry", "after"), [(0.3, 201), (None, 409)])
def test_a_key_abandoned_in_flight_by_a_crash(
    tmp_path: Path, expiry: float | None, after: int
) -> None:
    """Killed between taking a key and committing: freed after the expiry (look-up and POST
    agree), or refused forever."""
    service = start_service(tmp_path / "s.sqlite", tmp_path / "s.log")
    try:
        service.mode(slow_s=5, inflight_expiry_s=expiry)
        with pytest.raises(httpx.HTTPError):
            httpx.post(
                service.url + "/tickets",
                json={"title": "a"},
                headers={"Idempotency-Key": sf_string("k1")},
                timeout=0.5,
            )
        service.kill()
    finally:
        stop(service)
    again = start_service(tmp_path / "s.sqlite", tmp_path / "s.log")
    try:
        again.mode(slow_s=0)
        time.sleep(0.4)
        # The look-up agrees with what a request would find: free, or still in flight.
        looked = again.client.get("/idempotency/k1")
        assert looked.status_code == (404 if after == 201 else 200)
        assert post(again, "k1", {"title": "a"}).status_code == after
        assert len(again.tickets()) == (1 if after == 201 else 0)
    finally:
        stop(again)


def test_a_key_past_retention_executes_again(service: EffectsService) -> None:
    """The draft lets a service forget keys: after retention the same request is a new effect."""
    service.mode(retention_s=0.2)
    post(service, "k1", {"title": "a"})
    time.sleep(0.3)
    assert post(service, "k1", {"title": "a"}).headers.get("Idempotent-Replayed") is None
    assert len(service.tickets()) == 2


def test_partial_services_behave_as_measured_elsewhere(service: EffectsService) -> None:
    """Each partial mode does what real middlewares were measured to do."""
    service.mode(mismatch="new_effect")
    post(service, "a", {"title": "1"})
    assert post(service, "a", {"title": "2"}).status_code == 201  # a second effect
    service.mode(mismatch="replay")
    post(service, "b", {"title": "1"})
    silent = post(service, "b", {"title": "2"})
    assert silent.status_code == 201 and silent.headers["Idempotent-Replayed"] == "true"
    service.mode(replay_status=409)
    assert post(service, "b", {"title": "1"}).status_code == 409  # a replay answered as busy
    service.mode(lying_lookup=True)
    assert service.client.get("/idempotency/a").status_code == 404
    assert len(service.tickets()) == 3


def test_two_concurrent_requests_both_execute_without_an_in_flight_lock(
    service: EffectsService,
) -> None:
    """no_inflight_lock: one key, two requests at once, two tickets."""
    service.mode(no_inflight_lock=True, slow_s=0.3)
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: post(service, "k", {"title": "a"}), range(2)))
    assert [a.status_code for a in answers] == [201, 201]
    assert len(service.tickets()) == 2


def test_commit_then_a_lost_or_false_reply(service: EffectsService) -> None:
    """The ticket lands, then the reply is a 500 or the connection drops; look-up tells the truth."""
    service.mode(commit_then_500=True)
    assert post(service, "a", {"title": "1"}).status_code == 500
    service.mode(commit_then_500=False, drop_after_commit=True)
    with pytest.raises(httpx.RemoteProtocolError):
        post(service, "b", {"title": "2"})
    assert len(service.tickets()) == 2
    for key in ("a", "b"):
        assert service.client.get(f"/idempotency/{key}").json()["response"]["status"] == 201


def test_a_stale_fencing_token_is_refused_and_creates_nothing(service: EffectsService) -> None:
    """Tether-Fence: the highest lease version seen per run wins; a lower one gets 412."""
    assert post(service, "a", {"title": "1"}, **{"Tether-Fence": fence_header("r", 3)}).is_success
    stale = post(service, "b", {"title": "2"}, **{"Tether-Fence": fence_header("r", 2)})
    assert stale.status_code == 412 and stale.json()["highest"] == 3
    assert len(service.tickets()) == 1


@pytest.mark.parametrize("key", ["plain", 'q"uote', "back\\slash", "x" * 255])
def test_structured_strings_round_trip(key: str) -> None:
    """sf_string and parse_sf_string agree on every printable key up to the length cap."""
    assert parse_sf_string(sf_string(key)) == key


@pytest.mark.parametrize("bad", ["", "x" * 256, "tab\t", "\u00e9", "new\nline"])
def test_keys_a_header_cannot_carry_are_refused(bad: str) -> None:
    """Empty, too long, control or non-ASCII characters: a typed error, never a mangled header."""
    with pytest.raises(HeaderFieldError):
        sf_string(bad)


def test_a_slow_handler_whose_key_was_retaken_commits_nothing(service: EffectsService) -> None:
    """The key expired while its first handler was slow and a retry took it: one ticket."""
    service.mode(slow_s=1.2, inflight_expiry_s=0.4)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, service, "k1", {"title": "a"})
        time.sleep(0.6)  # past the expiry: the retry takes the key over
        retry = pool.submit(post, service, "k1", {"title": "a"})
        answers = {first.result().status_code, retry.result().status_code}
    assert answers == {201, 409}  # the superseded first attempt commits nothing
    assert len(service.tickets()) == 1


def test_a_fence_for_an_odd_run_id_is_its_digest() -> None:
    """Run ids a header cannot carry (non-ASCII, long) are sent as a stable digest."""
    odd = fence_header("run-\u00e9t\u00e9", 2)
    assert odd.startswith('"sha256-') and odd == fence_header("run-\u00e9t\u00e9", 2)
    assert fence_header("x" * 300, 1) != fence_header("x" * 299, 1)
    assert fence_header("plain-run", 3) == '"plain-run";v=3'


def test_the_service_socket_sends_replies_without_waiting_for_an_ack() -> None:
    """A connection the service's event loop accepts has Nagle off (TCP_NODELAY), as asyncio sets it."""
    listening = listen(0)
    seen: list[int] = []

    async def serve_one() -> None:
        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            seen.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listening)
        async with server:
            port = listening.getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            while not seen:
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(serve_one())
    assert seen and seen[0] != 0


def test_a_request_for_another_instance_is_421_and_leaves_no_trace(
    service: EffectsService,
) -> None:
    """Tether-Instance naming another database: 421 before the key is taken; the right one passes."""
    wrong = {"Tether-Instance": sf_string("svc-elsewhere")}
    refused = post(service, "k1", {"title": "a"}, **wrong)
    assert refused.status_code == 421 and refused.json()["error"] == "wrong_instance"
    assert parse_sf_string(refused.headers["Tether-Instance"]) == service.instance_id
    assert service.client.get("/idempotency/k1", headers=wrong).status_code == 421
    assert service.client.get("/idempotency/k1").status_code == 404  # the key was never taken
    assert service.tickets() == []
    right = {"Tether-Instance": sf_string(service.instance_id)}
    created = post(service, "k1", {"title": "a"}, **right)
    assert created.status_code == 201
    assert parse_sf_string(created.headers["Tether-Instance"]) == service.instance_id
    found = service.client.get("/idempotency/k1", headers=right)
    assert found.status_code == 200 and "Tether-Instance" in found.headers
    assert len(service.tickets()) == 1
