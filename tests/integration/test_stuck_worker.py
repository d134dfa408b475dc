"""Stuck runs move again: drift in a real workspace goes to review, a worker applies the decision.

Real files edited outside the run, real SQLite and PostgreSQL stores, the
real Worker loop claiming runs whose inbox holds evidence they have not read.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
from tests.conftest import ScriptedAgent, finish, make_policy, make_task, write
from tether.adapters import FileWorkspace
from tether.core import Observation, Phase, new_cancel, new_decision
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import (
    AgentContext,
    CrashPlan,
    CrashPoint,
    Decision,
    Runtime,
    SimulatedCrash,
    Worker,
)
from tether.store import open_store

CHECK = (
    "python",
    "-c",
    "import sys; text = open('notes.txt').read(); print('notes.txt says', repr(text)); "
    "sys.exit(0 if text == 'two\\n' else 1)",
)


CLI = (sys.executable, "-m", "tether.cli")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tether.sqlite'}"
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield url_in_schema(dsn, schema)


class Listening:
    """Scripted writes and a finish; keeps every observation it was shown."""

    def __init__(self) -> None:
        self.script = ScriptedAgent(
            [write("notes.txt", "one\n"), write("notes.txt", "two\n"), finish]
        )
        self.observations: list[Observation] = []

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        self.observations.append(observation)
        return self.script.decide(context, observation)


class Site:
    """A real workspace tree, one store URL, and the people who sign for the run."""

    def __init__(self, tmp_path: Path, url: str, *, needs_approval: bool = False) -> None:
        self.url = url
        self.root = tmp_path / "tree"
        self.root.mkdir()
        (self.root / "notes.txt").write_text("draft\n")
        (self.root / "README").write_text("team notes\n")
        self.workspace = FileWorkspace(self.root, tmp_path / "journal", verifier_allowlist=[CHECK])
        self.keyring = Keyring.generate("k1")
        self.reviewer = Signer.generate("rev", "reviewer")
        self.operator = Signer.generate("ops", "operator")
        self.trust = TrustRoots.of(self.reviewer.trust_root(), self.operator.trust_root())
        self.task = make_task(
            self.workspace.environment().state_fingerprint,
            initial_environment={"namespace": "file-workspace"},
            verifier={"argv": list(CHECK), "timeout_s": 30},
        )
        rule = {"risk": "low", "permission": "workspace.write", "needs_approval": needs_approval}
        self.policy = make_policy(kinds={"file.write": rule})
        self.agent = Listening()

    def runtime(self, store: Any, run_id: str = "r", worker: str = "starter", **kw: Any) -> Runtime:
        return Runtime(
            store=store,
            keyring=self.keyring,
            adapter=self.workspace,
            task=self.task,
            policy=self.policy,
            agent=self.agent,
            worker=worker,
            trust=self.trust,
            lease_ttl_s=0.2,
            **kw,
        )

    def serve(self, until: Any, seconds: float = 20) -> Worker:
        """One real worker polls until ``until(mark)`` holds or ``seconds`` pass."""
        with open_store(self.url) as store:
            worker = Worker(store, self.runtime, "w1", lease_ttl_s=0.2, poll_s=0.01, max_attempts=3)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not until(store.get_mark("r")):
                worker.serve(idle_exit=True)
                time.sleep(0.02)
            return worker

    def state(self) -> Any:
        with open_store(self.url) as store:
            return self.runtime(store, worker="reader").checkpointer.load("r").state

    def trace(self) -> list[Any]:
        state = self.state()
        with open_store(self.url) as store:
            return store.trace("r", state.trace_head, state.trace_length + 1)

    def deliver(self, kind: str, document: dict[str, Any]) -> int:
        with open_store(self.url) as store:
            return int(store.put_evidence("r", kind, document))

    def decision(self, choice: str, signer: Signer | None = None) -> dict[str, Any]:
        state, now = self.state(), datetime.now(UTC)
        body = new_decision(
            state,
            state.review_cases[-1],
            (signer or self.reviewer).signer_id,
            choice,
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
        return (signer or self.reviewer).sign(body)

    def crash_after_first_write(self) -> None:
        """Die before the second proposal, the first write's receipt committed at once
        (``defer_receipts=False``): the run is at rest, a drift is about the run."""
        with open_store(self.url) as store, pytest.raises(SimulatedCrash):
            crash = CrashPlan(CrashPoint.BEFORE_PROPOSAL, nth=2)
            self.runtime(store, crash=crash, defer_receipts=False).start("r").run()
        time.sleep(0.25)  # the crashed process's lease runs out


@pytest.fixture
def site(tmp_path: Path, store_url: str) -> Iterator[Site]:
    made = Site(tmp_path, store_url)
    yield made
    made.workspace.close()


def phase_is(phase: str) -> Any:
    return lambda mark: mark is not None and mark.phase == phase


@pytest.mark.parametrize(("choice", "end"), [("accept", "completed"), ("replan", "completed")])
def test_a_colleagues_edit_goes_to_review_and_a_signed_decision_lets_the_worker_finish(
    site: Site, choice: str, end: str
) -> None:
    """Edit outside the run after a crash: needs_review with both states; accept/replan completes."""
    site.crash_after_first_write()
    checkpoint = site.state().environment
    (site.root / "README").write_text("team notes\nplus one line from a colleague\n")
    observed = site.workspace.environment()
    site.serve(phase_is("needs_review"))
    state = site.state()
    (case,) = state.review_cases
    (evidence,) = case.evidence
    assert case.reason == "environment_drift" and case.environment == observed
    assert (evidence["checkpoint"], evidence["observed"]) == (
        checkpoint.to_json(),
        observed.to_json(),
    )
    site.deliver("review_decision", site.decision(choice))
    site.serve(phase_is(end))
    state = site.state()
    assert state.phase.value == end
    assert (site.root / "notes.txt").read_text() == "two\n"
    assert "colleague" in (site.root / "README").read_text()  # the edit was kept
    kinds = [event.kind for event in site.trace()]
    assert "needs_review" in kinds and "review_sealed" in kinds
    assert ("environment_accepted" in kinds) == (choice == "accept")


def test_a_signed_abort_of_drift_fails_the_run_through_the_worker(site: Site) -> None:
    """A reviewer aborts the drift case; the worker applies it and the run ends failed."""
    site.crash_after_first_write()
    (site.root / "notes.txt").write_text("one\nand a hand edit\n")
    site.serve(phase_is("needs_review"))
    site.deliver("review_decision", site.decision("abort"))
    site.serve(phase_is("failed"))
    state = site.state()
    assert state.phase is Phase.FAILED and state.stop_reason == "aborted_by_review"
    assert (site.root / "notes.txt").read_text() == "one\nand a hand edit\n"


def test_a_frozen_run_without_news_is_not_claimed_and_refused_evidence_does_not_spin(
    site: Site,
) -> None:
    """Parked: no claims; an untrusted decision is claimed once, traced refused, and parked again."""
    site.crash_after_first_write()
    (site.root / "README").write_text("changed\n")
    first = site.serve(phase_is("needs_review"))
    assert first.stats.waiting >= 1
    idle = site.serve(lambda mark: False, seconds=0.5)
    assert idle.stats.claimed == 0  # nothing new in the inbox: never claimed
    stranger = Signer.generate("mallory", "reviewer")
    site.deliver("review_decision", site.decision("accept", signer=stranger))
    once = site.serve(lambda mark: False, seconds=1.0)
    assert once.stats.claimed == 1 and once.stats.errors == 0
    state = site.state()
    assert state.phase is Phase.NEEDS_REVIEW
    refused = [e for e in site.trace() if e.kind == "evidence_refused"]
    assert len(refused) == 1 and refused[0].data["error"] == "UnknownSignerError"
    with open_store(site.url) as store:
        mark = store.get_mark("r")
        assert mark.lease_owner is None and mark.waiting_after == state.inbox_cursor


def test_a_signed_cancel_wakes_a_run_parked_for_approval_and_cancels_it(
    tmp_path: Path, store_url: str
) -> None:
    """A write waits for approval (parked); an operator's signed cancel is claimed and applied."""
    site = Site(tmp_path, store_url, needs_approval=True)
    try:
        with open_store(site.url) as store:
            session = site.runtime(store).start("r")
            session.run()
            session.release()
        assert site.state().phase is Phase.PENDING
        site.serve(lambda mark: mark is not None and mark.waiting_after is not None, seconds=5)
        now = datetime.now(UTC)
        body = new_cancel(
            site.state(),
            "ops",
            reason="the ticket was withdrawn",
            issued_at=now,
            expires_at=now + timedelta(seconds=300),
            nonce=secrets.token_hex(16),
        )
        site.deliver("cancel", site.operator.sign(body))
        site.serve(phase_is("cancelled"))
        state = site.state()
        assert state.phase is Phase.CANCELLED and state.pending is None
        assert (site.root / "notes.txt").read_text() == "draft\n"  # the write never left
        (event,) = [e for e in site.trace() if e.kind == "run_cancelled"]
        assert event.data["by"] == "operator:ops" and event.data["evidence"]["body"] == body
    finally:
        site.workspace.close()


def test_the_agent_hears_the_verifiers_output_from_a_real_command(site: Site) -> None:
    """finish too early: the next observation carries verifier_failed and the command's output."""
    site.agent.script = ScriptedAgent(
        [finish, write("notes.txt", "one\n"), write("notes.txt", "two\n"), finish]
    )
    with open_store(site.url) as store:
        session = site.runtime(store).start("r")
        session.run()
        assert session.state.phase is Phase.COMPLETED
    heard = site.agent.observations[1].last_outcome
    assert heard is not None and heard.kind == "verifier_failed"
    assert "notes.txt says 'draft\\n'" in heard.output


def test_tether_review_accept_from_the_command_line_unfreezes_a_drifted_run(
    tmp_path: Path,
) -> None:
    """`tether review RUN CASE --decision accept` signs it; the worker applies it and finishes."""
    db = tmp_path / "tether.sqlite"
    site = Site(tmp_path, f"sqlite:///{db}")
    try:
        keys = tmp_path / "keys"
        made = subprocess.run(
            [*CLI, "keys", "new", "--role", "reviewer", "--id", "rev", "--out", str(keys)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        site.reviewer = Signer.from_file(keys / "rev.key")
        site.trust = TrustRoots.of(site.reviewer.trust_root(), site.operator.trust_root())
        site.crash_after_first_write()
        (site.root / "README").write_text("edited by hand\n")
        site.serve(phase_is("needs_review"))
        (case,) = site.state().review_cases
        key = str(keys / "rev.key")
        options = ["--decision", "accept", "--key", key, "--db", str(db), "--ttl", "300", "--yes"]
        signed = subprocess.run(
            [*CLI, "review", "r", case.case_id, *options],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        assert signed.returncode == 0, signed.stderr
        site.serve(phase_is("completed"))
        assert site.state().phase is Phase.COMPLETED
        assert (site.root / "notes.txt").read_text() == "two\n"
    finally:
        site.workspace.close()
