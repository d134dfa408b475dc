"""A, B, A on targets tether cannot read: real HTTP on loopback, and a function's own body.

The third write is the first one's effect again. Whether it must be sent
(a state written back) or answered from the first's receipt (a collection:
sending it would be a duplicate) is what the target is, as declared: PUT
is a state by its method's definition, a POST says so only when declared,
and an undeclared one goes to a person.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import tether
from tests.conftest import ScriptedAgent, finish, make_policy, make_task, signed_decision, write
from tether import effects
from tether.adapters import HttpEffect
from tether.core import NeedsReviewError, OutcomeKind, Phase, ReviewReason, new_decision
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import SQLiteStore


@dataclass
class Service:
    """What the loopback service holds: one value per settings path, and every ticket."""

    url: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    puts: list[tuple[str, Any]] = field(default_factory=list)
    tickets: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def service() -> Iterator[Service]:
    held = Service()

    class Handler(BaseHTTPRequestHandler):
        def _body(self) -> Any:
            return json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))

        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            body = self._body()
            with held.lock:
                held.settings[self.path] = body
                held.puts.append((self.path, body))
            self._answer(200, {"path": self.path, "value": body})

        def do_POST(self) -> None:
            body = self._body()
            with held.lock:
                held.tickets.append(body)
                number = len(held.tickets)
            self._answer(201, {"ticket_id": number, **body})

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    held.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield held
    finally:
        server.shutdown()
        server.server_close()


def _calls(rt: tether.Runtime, run_id: str, kind: str, target: str, bodies: list[Any]) -> list[str]:
    """Each body sent in turn to ``target``; the outcome of each (a review case: its reason)."""
    seen: list[str] = []
    with effects.run(rt, run_id):
        for body in bodies:
            try:
                seen.append(effects.call(kind, target, {"json": body}).outcome)
            except NeedsReviewError as exc:
                seen.append(str(exc.reason))
                break
    return seen


def test_put_a_b_a_declared_a_state_writes_a_again_and_the_service_holds_a(
    tmp_path: Path, service: Service
) -> None:
    """PUT declared a state, A, B, A: three requests reach the service and it holds A; A once more is replayed."""
    with HttpEffect(service.url, method="PUT", targets="state", timeout_s=5) as put:
        rt = tether.guard(tmp_path / "runs.sqlite", put)
        a, b = {"theme": "dark"}, {"theme": "light"}
        outcomes = _calls(rt, "r1", "http.put", "settings/theme", [a, b, a, a])
    assert outcomes == ["executed", "executed", "executed", "replayed"]
    assert [body for _, body in service.puts] == [a, b, a]
    assert service.settings == {"/settings/theme": a}


def test_put_a_b_a_across_a_restart_reads_the_ledger_by_index(
    tmp_path: Path, service: Service
) -> None:
    """A and B in one process, A in the next (a new session over the same file): sent again."""
    a, b = {"theme": "dark"}, {"theme": "light"}
    with HttpEffect(service.url, method="PUT", targets="state", timeout_s=5) as put:
        rt = tether.guard(tmp_path / "runs.sqlite", put)
        assert _calls(rt, "r1", "http.put", "settings/theme", [a, b]) == ["executed"] * 2
    with HttpEffect(service.url, method="PUT", targets="state", timeout_s=5) as put:
        rt = tether.guard(tmp_path / "runs.sqlite", put)
        assert _calls(rt, "r1", "http.put", "settings/theme", [a, a]) == ["executed", "replayed"]
    assert service.settings == {"/settings/theme": a} and len(service.puts) == 3


@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_a_program_rerun_from_its_top_sends_nothing_it_sent_before(
    tmp_path: Path, service: Service, method: str
) -> None:
    """Undeclared (the default): A, B in one process, the same program rerun from the top asks A, B again: both replayed, nothing sent twice (outside attack b3, b5)."""
    kind, target = ("http.post", "tickets") if method == "POST" else ("http.put", "site/mode")
    a, b = {"title": "A", "on": True}, {"title": "B", "on": False}
    for _ in range(2):
        with HttpEffect(service.url, method=method, timeout_s=5) as effect:
            rt = tether.guard(tmp_path / "runs.sqlite", effect)
            outcomes = _calls(rt, "r1", kind, target, [a, b])
    assert outcomes == ["replayed", "replayed"]
    sent = service.tickets if method == "POST" else [body for _, body in service.puts]
    assert sent == [a, b]


def test_an_undeclared_post_a_b_a_replays_the_third(tmp_path: Path, service: Service) -> None:
    """POST with nothing declared (a collection by default), A, B, A: the third is the first's receipt; two tickets."""
    with HttpEffect(service.url, timeout_s=5) as post:
        rt = tether.guard(tmp_path / "runs.sqlite", post)
        printer, laptop = {"title": "printer"}, {"title": "laptop"}
        outcomes = _calls(rt, "r1", "http.post", "tickets", [printer, laptop, printer])
    assert outcomes == ["executed", "executed", "replayed"]
    assert service.tickets == [printer, laptop]


def test_a_post_declared_unknown_a_b_a_goes_to_a_person_and_sends_nothing(
    tmp_path: Path, service: Service
) -> None:
    """POST declared targets="unknown", A, B, A: the third is neither sent nor replayed; two tickets."""
    with HttpEffect(service.url, targets="unknown", timeout_s=5) as post:
        rt = tether.guard(tmp_path / "runs.sqlite", post)
        printer, laptop = {"title": "printer"}, {"title": "laptop"}
        outcomes = _calls(rt, "r1", "http.post", "tickets", [printer, laptop, printer])
        assert outcomes == ["executed", "executed", ReviewReason.REPEAT_OR_REVERT.value]
        session = rt.recover("r1")
    assert session.state.phase is Phase.NEEDS_REVIEW
    case = session.state.review_cases[-1]
    assert "tether fork" in case.detail and "duplicate" in case.detail
    assert service.tickets == [printer, laptop]


def test_a_function_effect_declared_a_state_sets_its_target_back(tmp_path: Path) -> None:
    """A function effect declared targets="state", A, B, A: the body runs three times."""
    bodies: list[str] = []

    @tether.effect("topic.set", targets="state")
    def set_topic(channel: str, topic: str) -> dict[str, str]:
        bodies.append(topic)
        return {"topic": topic}

    @tether.effect("note.add", targets="unknown")
    def add_note(channel: str, text: str) -> dict[str, str]:
        bodies.append(text)
        return {"text": text}

    rt = tether.guard(tmp_path / "runs.sqlite", set_topic, add_note)
    with effects.run(rt, "r1"):
        done = [set_topic("#ops", t) for t in ("A", "B", "A", "A")]
        assert [d.outcome for d in done] == ["executed", "executed", "executed", "replayed"]
        add_note("#ops", "hi")
        add_note("#ops", "bye")
        with pytest.raises(NeedsReviewError) as caught:
            add_note("#ops", "hi")  # declared unknown: a revert or a duplicate, a person says
    assert caught.value.reason == ReviewReason.REPEAT_OR_REVERT
    assert bodies == ["A", "B", "A", "hi", "bye"]


REVIEWER = Signer.generate("rev", "reviewer")
KEYRING = Keyring.generate("k1")


def _put_runtime(tmp_path: Path, put: HttpEffect, steps: list[Any], crash: CrashPlan) -> Runtime:
    """A runtime whose agent PUTs each of ``steps`` to one settings path, then finishes."""
    task = make_task(
        put.environment().state_fingerprint,
        allowed_kinds=["http.put"],
        allowed_paths=["settings/theme"],
        permissions=["service.write"],
        initial_environment={"namespace": "http"},
        verifier=None,
    )
    rule = {"risk": "low", "permission": "service.write", "needs_approval": False}
    return Runtime(
        store=SQLiteStore(tmp_path / "tether.sqlite"),
        keyring=KEYRING,
        adapter=put,
        task=task,
        policy=make_policy(kinds={"http.put": rule}),
        agent=ScriptedAgent(steps),
        crash=crash,
        trust=TrustRoots.of(REVIEWER.trust_root()),
    )


def _b_killed_and_replanned(tmp_path: Path, put: HttpEffect, steps: list[Any]) -> Any:
    """A executed, B killed after its send, recovered (outcome unknown) and replanned: the session."""
    killed = _put_runtime(tmp_path, put, [*steps, finish], CrashPlan(CrashPoint.EFFECT_SENT, 2))
    session = killed.start("r1")
    assert session.step().kind is OutcomeKind.EXECUTED
    with pytest.raises(SimulatedCrash):
        session.step()  # B reached the service; its reply never reached the ledger
    session = _put_runtime(tmp_path, put, [*steps, finish], CrashPlan()).recover("r1")
    session.step()
    assert session.state.review_cases[-1].reason == ReviewReason.OUTCOME_UNKNOWN
    session.review(signed_decision(REVIEWER, session.state, datetime.now(UTC)))
    return session


def test_put_a_then_b_unknown_then_a_again_goes_to_a_person_and_sends_nothing(
    tmp_path: Path, service: Service
) -> None:
    """PUT declared a state: A, then B killed after its send and replanned, then A again: neither replayed nor sent; a person decides."""
    a, b = {"theme": "dark"}, {"theme": "light"}
    steps = [
        write("settings/theme", "", f"a{i}", kind="http.put", args={"json": body})
        for i, body in enumerate((a, b, a))
    ]
    with HttpEffect(service.url, method="PUT", targets="state", timeout_s=5) as put:
        session = _b_killed_and_replanned(tmp_path, put, steps)
        outcome = session.step()  # A again: B may have landed (it did), or may land yet
        assert (outcome.kind, outcome.reason) == (OutcomeKind.FROZEN, "repeat_or_revert")
    assert session.state.phase is Phase.NEEDS_REVIEW
    assert [body for _, body in service.puts] == [a, b]
    assert service.settings == {"/settings/theme": b}


def test_b_found_landed_by_a_person_after_c_was_written_is_written_again(
    tmp_path: Path, service: Service
) -> None:
    """PUT declared a state: B killed after its send, replanned, C written, B proposed again, a person signs that B's first send landed: B is sent again, the service holds B (outside attack F1)."""
    a, b, c = {"theme": "dark"}, {"theme": "light"}, {"theme": "sepia"}
    steps = [
        write("settings/theme", "", f"a{i}", kind="http.put", args={"json": body})
        for i, body in enumerate((a, b, c, b, b))
    ]
    with HttpEffect(service.url, method="PUT", targets="state", timeout_s=5) as put:
        session = _b_killed_and_replanned(tmp_path, put, steps)
        assert session.step().kind is OutcomeKind.EXECUTED  # C
        outcome = session.step()  # B again: its first send's outcome is still unknown
        assert (outcome.kind, outcome.reason) == (OutcomeKind.FROZEN, "replay_of_unknown_effect")
        now = datetime.now(UTC)
        landed = new_decision(
            session.state,
            session.state.review_cases[-1],
            REVIEWER.signer_id,
            "landed",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
            evidence="the service's log shows B's first PUT",
        )
        session.review(REVIEWER.sign(landed))
        # Proposed again: its first send landed before or after C's, a state is written again.
        assert session.step().kind is OutcomeKind.EXECUTED
    assert [body for _, body in service.puts] == [a, b, c, b]
    assert service.settings == {"/settings/theme": b}
