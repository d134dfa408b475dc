"""The adapter conformance suite against every shipped adapter, and a broken one it must fail."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from examples.own_function.tickets import KIND, open_ticket

from tests.integration._services import delivered, effects_service, smtp_adapter, smtp_server
from tether.adapters import IETF_DRAFT, REFERENCE_PROFILE, FileWorkspace, HttpEffect
from tether.core import ActionKind, Compensation, EnvironmentState, Intent, Receipt
from tether.testing import Sandbox, adapter_conformance
from tether.testing.adapter_conformance import *  # noqa: F403
from tether.testing.adapter_conformance import AdapterSubject


def file_write(n: int) -> tuple[str, str, dict[str, Any]]:
    return "file.write", "notes.txt", {"content": f"version {n}\n"}


@pytest.fixture(
    params=["sandbox", "workspace", "http", "http-ietf", "http-nothing", "smtp", "function"]
)
def tether_adapter(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AdapterSubject]:
    if request.param == "sandbox":
        sandbox = Sandbox({"notes.txt": "draft\n"})
        yield AdapterSubject(
            make=lambda: sandbox,  # in memory: the world IS this object
            write=file_write,
            effects=sandbox.write_count,
            lose_next_reply=lambda: sandbox.fail_next(after_commit=True),
        )
        return
    if request.param == "workspace":
        root = tmp_path / "tree"
        root.mkdir()
        (root / "notes.txt").write_text("draft\n")
        opened: list[FileWorkspace] = []

        def make() -> FileWorkspace:
            opened.append(FileWorkspace(root, tmp_path / "journal"))
            return opened[-1]

        counter = make()
        yield AdapterSubject(make=make, write=file_write, effects=counter.write_count)
        for workspace in opened:
            workspace.close()
        return
    if request.param == "smtp":
        maildir = tmp_path / "Maildir"

        def lose_next_reply() -> None:
            maildir.with_name("Maildir.next").write_text("drop_after_data")

        with smtp_server(maildir) as port:
            yield AdapterSubject(
                make=lambda: smtp_adapter(port, maildir),
                write=lambda n: (
                    "email.send",
                    "customer@example.com",
                    {"subject": f"message {n}", "body": "hello"},
                ),
                effects=lambda: len(delivered(maildir)),
                lose_next_reply=lose_next_reply,
            )
        return
    if request.param == "function":
        # examples/own_function: httpx in a function body, idempotent, with a look-up and
        # a compensation. A function effect keeps no state, so one object is any object.
        with effects_service(tmp_path) as service:
            monkeypatch.setenv("TICKETS_URL", service.url)
            yield AdapterSubject(
                make=lambda: open_ticket.adapter,
                write=lambda n: (KIND, "", {"title": f"ticket {n}"}),
                effects=lambda: len(service.tickets()),
                lose_next_reply=lambda: service.mode(drop_after_commit=True) and None,
                compensations=lambda: len(service.compensations()),
            )
        return
    # The reference service and its profile; the draft preset (no look-up) on it;
    # and no profile at all, on the service playing a keyless third-party server.
    profile = {"http": REFERENCE_PROFILE, "http-ietf": IETF_DRAFT, "http-nothing": None}
    with effects_service(tmp_path) as service:
        if request.param == "http-nothing":
            service.mode(ignore_keys=True, lookup_route="missing", ignore_instance=True)
        clients: list[HttpEffect] = []

        def make_http() -> HttpEffect:
            chosen = profile[request.param]
            clients.append(HttpEffect(service.url, profile=chosen, timeout_s=2))
            return clients[-1]

        yield AdapterSubject(
            make=make_http,
            write=lambda n: ("http.post", "tickets", {"json": {"title": f"ticket {n}"}}),
            effects=lambda: len(service.tickets()),
            lose_next_reply=lambda: service.mode(drop_after_commit=True) and None,
            compensations=lambda: len(service.compensations()),
            unproven_lookup=lambda: service.mode(lookup_route="missing") and None,
        )
        for client in clients:
            client.close()


class WritesTwice(Sandbox):
    """Claims idempotent, but sends again on every call: the suite must catch it."""

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Any = None
    ) -> Receipt:
        receipt = super().execute(key, intent, prestate, fence)
        self.delete_receipt(key)  # forgets the key, so the next call writes again
        return receipt


class LeaksDriverErrors(Sandbox):
    """Refuses bad input with a bare ValueError instead of a typed TetherError."""

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Any = None
    ) -> Receipt:
        if not key or prestate.instance_id != self.instance_id:
            raise ValueError("bad input")
        return super().execute(key, intent, prestate, fence)


def writes_twice() -> WritesTwice:
    return WritesTwice({"notes.txt": "draft\n"}, conditional_writes=False)


def broken(adapter: Sandbox) -> AdapterSubject:
    return AdapterSubject(make=lambda: adapter, write=file_write, effects=adapter.write_count)


def test_the_suite_fails_an_adapter_that_claims_idempotent_but_writes_twice() -> None:
    """The replay check can fail: an adapter that writes twice under one key is caught."""
    subject = broken(writes_twice())
    with pytest.raises(AssertionError, match="second effect"):
        adapter_conformance.test_an_idempotent_adapter_replays_without_a_second_effect(subject)


def test_the_suite_fails_an_adapter_that_leaks_untyped_errors() -> None:
    """The typed-refusal check can fail: a bare ValueError is caught and named."""
    subject = broken(LeaksDriverErrors({"notes.txt": "draft\n"}))
    with pytest.raises(AssertionError, match="not a TetherError"):
        adapter_conformance.test_bad_input_is_a_typed_refusal(subject)


def test_the_suite_fails_an_adapter_whose_look_up_forgets() -> None:
    """The look-up check can fail: a queryable adapter that loses receipts is caught."""
    subject = broken(writes_twice())
    with pytest.raises(AssertionError, match="look-up"):
        adapter_conformance.test_a_queryable_adapter_answers_by_key_from_a_fresh_object(subject)


class CallsALostReplyARefusal(Sandbox):
    """Lands the write, then reports a refusal: the runtime would think nothing happened."""

    lose = False

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Any = None
    ) -> Receipt:
        receipt = super().execute(key, intent, prestate, fence)
        if self.lose:
            self.lose = False
            from tether.core import PreconditionFailedError

            raise PreconditionFailedError(intent.target, "x", "y")
        return receipt


def test_the_suite_fails_an_adapter_that_calls_a_landed_write_a_refusal() -> None:
    """The lost-reply check can fail: a refusal for a write that landed is caught."""
    liar = CallsALostReplyARefusal({"notes.txt": "draft\n"})

    def lose() -> None:
        liar.lose = True

    subject = AdapterSubject(
        make=lambda: liar, write=file_write, effects=liar.write_count, lose_next_reply=lose
    )
    with pytest.raises(AssertionError, match="a refusal"):
        adapter_conformance.test_a_landed_write_whose_reply_was_lost_is_found_by_key(subject)


class ClaimsUndo(Sandbox):
    """Declares adapter compensation for its writes but offers no compensate()."""

    @property
    def kinds(self) -> tuple[ActionKind, ...]:
        return tuple(replace(k, compensation=Compensation.ADAPTER) for k in super().kinds)


def test_the_suite_fails_an_adapter_that_declares_a_compensation_it_cannot_do() -> None:
    """The compensation check can fail: adapter compensation without compensate() is caught."""
    subject = broken(ClaimsUndo({"notes.txt": "draft\n"}))
    with pytest.raises(AssertionError, match="no compensate"):
        adapter_conformance.test_an_offered_compensation_is_one_effect_under_its_own_key(subject)


class ReadsNoRouteAsNothing(Sandbox):
    """Once its look-up route is gone, answers every key with "nothing" (the old HTTP default)."""

    route_gone = False

    def lookup(self, key: str) -> Receipt | None:
        return None if self.route_gone else super().lookup(key)


def test_the_suite_fails_an_adapter_that_reads_no_route_as_nothing() -> None:
    """The declared-route check can fail: a "no such route" answer read as absence is caught."""
    liar = ReadsNoRouteAsNothing({"notes.txt": "draft\n"})

    def break_route() -> None:
        liar.route_gone = True

    subject = AdapterSubject(
        make=lambda: liar, write=file_write, effects=liar.write_count, unproven_lookup=break_route
    )
    with pytest.raises(AssertionError, match="never proves"):
        adapter_conformance.test_a_look_up_from_no_declared_route_is_never_absence(subject)
