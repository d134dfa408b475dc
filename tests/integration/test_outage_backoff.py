"""A service that is down is not hammered: the worker backs off, records no attempt, serves others.

Real parts only: HttpEffect over loopback HTTP to a server that is down (its
write path answers 503, or it hangs up on every request), the reference
effects service for the healthy run, and the Worker on a real SQLite file or
PostgreSQL schema. Bounds are on counts (sends, generations, ledger rows),
never on speed.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
from tests.conftest import ScriptedAgent, make_policy, make_task, write
from tests.integration._services import EffectsService, effects_service
from tether.adapters import REFERENCE_PROFILE, HttpEffect
from tether.core import AdapterUnavailableError
from tether.crypto import Keyring
from tether.runtime import Runtime, Worker
from tether.store import open_store
from tether.testing import Sandbox

KEYRING = Keyring.generate("k1")
BACKOFF_S = 0.05
MAX_BACKOFF_S = 0.4
#: A profile the stand-in server can honour: it names itself at /instance but
#: does not verify Tether-Instance or fencing; it deduplicates (so a key it
#: says it never saw may be sent again, the path that resends).
DOWN_PROFILE = replace(REFERENCE_PROFILE, verifies_instance=False, fencing=False)


class DownService:
    """A loopback HTTP server standing in for a service that is down, counting what reaches it.

    ``writes_down``: it names itself and answers look-ups (no such key), but
    every POST gets 503 (the write path is down behind its gateway).
    ``hangs_up``: every request is met by a closed connection.
    """

    mode: ClassVar[str] = "writes_down"

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _count(self) -> bool:
                kind = "POST" if self.command == "POST" else self.path.strip("/").split("/")[0]
                with outer.lock:
                    outer.requests[kind] += 1
                if outer.mode == "hangs_up":
                    self.close_connection = True
                    return False
                return True

            def do_GET(self) -> None:
                if not self._count():
                    return
                if self.path == "/instance":
                    self._answer(200, b'{"instance_id": "down-1"}')
                else:
                    self._answer(404, b'{"error": "no such key"}')

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                if not self._count():
                    return
                self._answer(503, b'{"error": "service unavailable"}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def sends(self) -> int:
        with self.lock:
            return self.requests["POST"]

    def total(self) -> int:
        with self.lock:
            return sum(self.requests.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tether.sqlite'}"
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield url_in_schema(dsn, schema)


@pytest.fixture
def down() -> Iterator[DownService]:
    server = DownService()
    server.mode = "writes_down"
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[EffectsService]:
    with effects_service(tmp_path) as running:
        yield running


class Fleet:
    """Runs of one ticket each, every run with its own HTTP adapter; builds their runtimes."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.adapters: dict[str, HttpEffect] = {}
        self.tasks: dict[str, Any] = {}

    def add(self, run_id: str, adapter: HttpEffect) -> None:
        self.adapters[run_id] = adapter
        with open_store(self.url) as store:
            self.runtime(store, run_id, "starter").start(run_id)

    def runtime(self, store: Any, run_id: str, worker: str) -> Runtime:
        http = self.adapters[run_id]
        task = self.tasks.get(run_id) or replace(
            make_task(
                http.environment().state_fingerprint,
                allowed_kinds=["http.post"],
                allowed_paths=["tickets"],
                permissions=["service.write"],
                initial_environment={"namespace": "http"},
            ),
            verifier=None,  # a service runs no verifier: the run ends on the agent's finish
        )
        self.tasks[run_id] = task
        rule = {"risk": "low", "permission": "service.write", "needs_approval": False}
        post = write("tickets", "", kind="http.post", args={"json": {"title": run_id}})
        return Runtime(
            store=store,
            keyring=KEYRING,
            adapter=http,
            task=task,
            policy=make_policy(kinds={"http.post": rule}),
            agent=ScriptedAgent([post, _finish]),
            worker=worker,
        )

    def mark(self, run_id: str) -> Any:
        with open_store(self.url) as store:
            return store.get_mark(run_id)

    def ledger_rows(self, run_id: str) -> int:
        with open_store(self.url) as store:
            return len(store.ledger(run_id))

    def close(self) -> None:
        for adapter in self.adapters.values():
            adapter.close()


def _finish(context: Any, observation: Any) -> Any:
    from tests.conftest import finish

    return finish(context, observation)


class Serving:
    """One real Worker loop in a thread on its own store connection, until stopped."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.ready = threading.Event()
        self.worker: Worker | None = None
        self.thread = threading.Thread(target=self._loop)
        self.started = time.monotonic()
        self.thread.start()
        self.ready.wait(30)

    def _loop(self) -> None:
        with open_store(self.fleet.url) as store:
            self.worker = Worker(
                store,
                self.fleet.runtime,
                "w1",
                lease_ttl_s=30,
                poll_s=0.01,
                backoff_s=BACKOFF_S,
                max_backoff_s=MAX_BACKOFF_S,
            )
            self.ready.set()
            self.worker.serve()

    def stop(self) -> float:
        """Stop the worker; the seconds it served."""
        assert self.worker is not None
        self.worker.stop()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        return time.monotonic() - self.started


def until(condition: Callable[[], bool], seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def claim_when_due(store: Any, worker: str) -> Any:
    """The run's lease for ``worker``, claimed as soon as its back-off has passed."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        claimed = store.claim_expired(worker, 30)
        if claimed:
            return claimed[0]
        time.sleep(0.005)
    raise AssertionError("the run never became claimable again")


def most_claims_within(seconds: float) -> int:
    """The most claims the back-off allows in ``seconds``: every delay at its floor (half a step).

    One more is allowed for the store's clock (PostgreSQL's ``now()`` is when
    the deferring transaction began).
    """
    claims, spent, step = 2, 0.0, BACKOFF_S
    while True:
        spent += step / 2
        if spent > seconds:
            return claims
        claims += 1
        step = min(MAX_BACKOFF_S, step * 2)


def test_a_run_whose_service_is_down_backs_off_and_the_healthy_run_completes(
    store_url: str, down: DownService, service: EffectsService
) -> None:
    """One worker: the down run sends once per claim, grows by no row per attempt; the other ends."""
    fleet = Fleet(store_url)
    try:
        # The down run is started first, so the worker claims it first.
        fleet.add("down", HttpEffect(down.url, profile=DOWN_PROFILE, timeout_s=2))
        fleet.add("healthy", HttpEffect(service.url, profile=REFERENCE_PROFILE, timeout_s=2))
        serving = Serving(fleet)
        try:
            assert until(lambda: fleet.mark("healthy").phase == "completed")
            # The first resend is recorded (it makes a later refusal read as unknown);
            # from then on, the repeats record nothing.
            assert until(lambda: down.sends() >= 3)
            generation, rows = fleet.mark("down").generation, fleet.ledger_rows("down")
            sends_then = down.sends()
            assert until(lambda: down.sends() >= sends_then + 4)
        finally:
            served = serving.stop()
        assert serving.worker is not None
        claims = serving.worker.stats.runs.count("down")
        after = fleet.mark("down")
        assert len(service.tickets()) == 1  # the healthy run's ticket, once
        assert after.phase == "pending" and after.attempts == 0  # an outage is not a failure
        assert (after.generation, fleet.ledger_rows("down")) == (generation, rows)
        assert rows <= 3  # intended, dispatched, the one recorded resend
        assert down.sends() <= claims  # within one claim, at most one send
        assert claims <= most_claims_within(served)
    finally:
        fleet.close()


def test_a_service_that_hangs_up_on_everything_is_waited_out_without_a_commit(
    store_url: str, down: DownService
) -> None:
    """Nothing answers: no checkpoint and no ledger row per claim, requests bounded by the claims."""
    fleet = Fleet(store_url)
    try:
        fleet.add("down", HttpEffect(down.url, profile=DOWN_PROFILE, timeout_s=2))
        serving = Serving(fleet)
        try:
            assert until(lambda: down.sends() >= 1)  # its first send met the outage
            assert until(lambda: fleet.mark("down").retry_at is not None)
            down.mode = "hangs_up"
            generation, rows = fleet.mark("down").generation, fleet.ledger_rows("down")
            requests_then = down.total()
            assert until(lambda: down.total() >= requests_then + 6)
        finally:
            served = serving.stop()
        assert serving.worker is not None
        claims = serving.worker.stats.runs.count("down")
        after = fleet.mark("down")
        assert (after.generation, fleet.ledger_rows("down")) == (generation, rows)
        assert after.attempts == 0
        # Each claim asks who the service is and looks the key up at most: a few requests.
        assert down.total() - requests_then <= 4 * claims
        assert claims <= most_claims_within(served)
    finally:
        fleet.close()


def test_a_run_whose_agent_asks_for_nothing_is_backed_off_more_each_time(tmp_path: Path) -> None:
    """An agent that only waits: asked once per claim, each claim defers it twice as long,
    and once another worker has moved the run on, the back-off starts from the base again."""
    from tether.core import Observation
    from tether.runtime import AgentContext, Decision
    from tether.testing import Sandbox

    asked: list[int] = []

    def waits(context: AgentContext, observation: Observation) -> Decision:
        asked.append(1)
        return Decision(context, None)

    sandbox = Sandbox({"notes.txt": "draft\n"})
    task = make_task(sandbox.environment().state_fingerprint)

    def factory(store: Any, run_id: str, worker: str) -> Runtime:
        return Runtime(
            store=store,
            keyring=KEYRING,
            adapter=sandbox,
            task=task,
            policy=make_policy(),
            agent=ScriptedAgent([waits]),
            worker=worker,
        )

    def drive_once(worker: Worker) -> tuple[float, float]:
        """Claim the run when due and drive it: the least and most delay its defer can have set."""
        lease = claim_when_due(store, worker.worker_id)
        before = time.time()
        worker.drive(lease)
        after = time.time()
        mark = store.get_mark("r1")
        assert mark.attempts == 0 and mark.lease_owner is None  # a wait is not a failure
        due = mark.retry_at.timestamp()  # the store's clock while it deferred, plus the delay
        return due - after, due - before

    def scheduled(got: tuple[float, float], expected: float) -> bool:
        low, high = got
        return low - 0.01 <= expected <= high + 0.01

    with open_store(f"sqlite:///{tmp_path / 'tether.sqlite'}") as store:
        factory(store, "r1", "starter").start("r1")
        w1 = Worker(store, factory, "w1", backoff_s=0.04, max_backoff_s=10.0, draw=lambda: 0.0)
        w2 = Worker(store, factory, "w2", backoff_s=0.04, max_backoff_s=10.0, draw=lambda: 0.0)
        # The lowest draw gives half of each doubled step: 0.02, 0.04, 0.08, 0.16 s.
        for attempt, expected in enumerate((0.02, 0.04, 0.08, 0.16)):
            got = drive_once(w1)
            assert len(asked) == attempt + 1  # one step per claim, then the run is given up
            assert scheduled(got, expected), (attempt, got, expected)
        assert scheduled(drive_once(w2), 0.02)  # w2 has no streak for it: the base
        assert scheduled(drive_once(w1), 0.02)  # moved on since w1 left it: the base again
    assert w1.stats.waiting == 5 and w1.stats.errors == 0


class GoesDown(Sandbox):
    """The reference sandbox, with an outage switch: while down, every look-up and send
    raises AdapterUnavailableError (and is counted: it reached a service that was down)."""

    def __init__(self, files: dict[str, str]) -> None:
        super().__init__(files)
        self.down = False
        self.met_down = 0

    def _check_up(self) -> None:
        if self.down:
            self.met_down += 1
            raise AdapterUnavailableError("the workspace service is down")

    def lookup(self, key: str) -> Any:
        self._check_up()
        return super().lookup(key)

    def execute(self, key: str, intent: Any, prestate: Any, fence: Any = None) -> Any:
        self._check_up()
        return super().execute(key, intent, prestate, fence)


def test_a_run_parked_for_a_person_keeps_the_back_off_of_the_outage_its_claim_met(
    tmp_path: Path,
) -> None:
    """A claim that met the service down and then parked the run for an approval backs it off,
    so the approval landing at once wakes it for no worker's claim until the back-off passed."""
    # Issue 25, seed 141457: the park set no floor, and two workers' claims reached the
    # service that was down with no back-off between them.
    import secrets
    from datetime import UTC, datetime, timedelta

    from tether.core import OutcomeKind, new_approval
    from tether.crypto import Signer, TrustRoots

    alice = Signer.generate("alice", "approver")
    sandbox = GoesDown({"notes.txt": "draft\n"})
    task = make_task(sandbox.environment().state_fingerprint)
    gated = {"risk": "low", "permission": "workspace.write", "needs_approval": True}

    def factory(store: Any, run_id: str, worker: str) -> Runtime:
        return Runtime(
            store=store,
            keyring=KEYRING,
            adapter=sandbox,
            task=task,
            policy=make_policy(kinds={"file.write": gated}),
            agent=ScriptedAgent([write("notes.txt", "done\n"), _finish]),
            worker=worker,
            trust=TrustRoots.of(alice.trust_root()),
        )

    backoff_s = 2.0  # the first wait, at the lowest draw: 1 s
    with open_store(f"sqlite:///{tmp_path / 'tether.sqlite'}") as store:
        session = factory(store, "r1", "starter").start("r1")
        assert session.step().kind is OutcomeKind.WAITING_FOR_APPROVAL  # the intent is durable
        session.release()
        sandbox.down = True
        w1 = Worker(store, factory, "w1", backoff_s=backoff_s, draw=lambda: 0.0)
        w2 = Worker(store, factory, "w2", backoff_s=backoff_s, draw=lambda: 0.0)
        (lease,) = store.claim_expired("w1", 30)
        parked_at = time.time()
        w1.drive(lease)
        assert sandbox.met_down == 1  # the recovery's look-up of the intended write's key
        mark = store.get_mark("r1")
        assert mark.waiting_after is not None and mark.attempts == 0  # parked, no failure
        assert mark.retry_at is not None and mark.retry_at.timestamp() >= parked_at + 0.9
        state = factory(store, "r1", "reader").checkpointer.load("r1").state
        now = datetime.now(UTC)
        body = new_approval(
            state,
            "alice",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
        store.put_evidence("r1", "approval", alice.sign(body))
        # The approval woke it, but no worker's claim takes it while the back-off runs.
        assert store.claim_expired("w2", 30) == []
        assert sandbox.met_down == 1
        sandbox.down = False
        w2.drive(claim_when_due(store, "w2"))
        assert store.get_mark("r1").phase == "completed"
    assert sandbox.write_count() == 1
