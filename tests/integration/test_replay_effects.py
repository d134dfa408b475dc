"""The measured attack, on real parts: a recovered agent re-proposes a committed effect.

After a crash right after a committed write, the restored agent proposes the
same effect under a new action id with other prose around it. tether must
return the recorded receipt (outcome ``replayed``), never write it twice: on
a real workspace, a real HTTP ticket service and a real SMTP server.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, Step, finish, make_policy, make_task
from tests.integration._services import (
    EffectsService,
    delivered,
    effects_service,
    smtp_adapter,
    smtp_server,
)
from tether.adapters import REFERENCE_PROFILE, Adapters, FileWorkspace, HttpEffect
from tether.core import ActionResult, EffectStatus, Observation, OutcomeKind, Phase, Proposal
from tether.crypto import Keyring
from tether.runtime import AgentContext, CrashPlan, CrashPoint, Decision, Runtime, SimulatedCrash
from tether.store import SQLiteStore

VERIFIER = ("python", "-c", "pass")
CUSTOMER = "customer@example.com"
KEYRING = Keyring.generate("k1")
REPLY = "Sorry about the printer; a technician is on the way.\n"


def propose(action_id: str, kind: str, target: str, args: dict[str, Any], summary: str) -> Step:
    """A step proposing one write, with the agent's own prose kept in its context."""

    def step(context: AgentContext, obs: Observation) -> Decision:
        note = {"summary": summary, "step": context.plan_cursor}
        after = AgentContext((*context.messages, note), context.memory, context.plan_cursor + 1)
        version = obs.environment.version
        return Decision(after, Proposal(action_id, kind, target, args, based_on_version=version))

    return step


@dataclass
class Watching(ScriptedAgent):
    """The scripted agent, keeping every observation it was handed (what the caller gets back)."""

    observations: list[Observation] = field(default_factory=list)

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        self.observations.append(observation)
        return super().decide(context, observation)


@dataclass
class Desk:
    tmp: Path
    root: Path
    service: EffectsService
    smtp_port: int
    maildir: Path
    task: Any = None
    agent: Watching | None = None

    def answers(self, action_id: str) -> list[ActionResult]:
        """Every result the agent was handed for ``action_id``, in order."""
        seen = [] if self.agent is None else self.agent.observations
        return [r for obs in seen for r in obs.results if r.action_id == action_id]

    def adapters(self) -> Adapters:
        workspace = FileWorkspace(self.root, self.tmp / "journal", verifier_allowlist=[VERIFIER])
        http = HttpEffect(self.service.url, profile=REFERENCE_PROFILE, timeout_s=2)
        return Adapters(workspace, http, smtp_adapter(self.smtp_port, self.maildir))

    def runtime(self, steps: list[Step], crash: CrashPlan | None = None) -> Runtime:
        adapters = self.adapters()
        self.agent = Watching([*steps, finish])
        rules = {
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False},
            "http.post": {"risk": "low", "permission": "service.write", "needs_approval": False},
            "email.send": {"risk": "medium", "permission": "mail.send", "needs_approval": False},
        }
        self.task = self.task or make_task(
            adapters.environment().state_fingerprint,
            allowed_kinds=["file.read", "file.write", "http.post", "email.send"],
            allowed_paths=["reply.txt", "tickets", CUSTOMER],
            permissions=["workspace.read", "workspace.write", "service.write", "mail.send"],
            initial_environment={"namespace": adapters.namespace},
            verifier={"argv": list(VERIFIER), "timeout_s": 30},
        )
        return Runtime(
            store=SQLiteStore(self.tmp / "tether.sqlite"),
            keyring=KEYRING,
            adapter=adapters,
            task=self.task,
            policy=make_policy(kinds=rules),
            agent=self.agent,
            crash=crash or CrashPlan(),
        )

    def received(self) -> tuple[int, int, int]:
        with FileWorkspace(self.root, self.tmp / "journal") as workspace:
            files = workspace.write_count()
        return files, len(self.service.tickets()), len(delivered(self.maildir))


@pytest.fixture
def desk(tmp_path: Path) -> Iterator[Desk]:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "reply.txt").write_text("draft\n")
    with ExitStack() as stack:
        service = stack.enter_context(effects_service(tmp_path))
        port = stack.enter_context(smtp_server(tmp_path / "Maildir"))
        yield Desk(tmp_path, root, service, port, tmp_path / "Maildir")


FILE = ("file.write", "reply.txt", {"content": REPLY})
TICKET = ("http.post", "tickets", {"json": {"title": "printer on fire"}})


def crash_after_commit(desk: Desk, steps: list[Step], point: CrashPoint) -> Runtime:
    """Commit the first write, die at ``point``, and come back in a fresh runtime."""
    nth = 2 if point is CrashPoint.BEFORE_PROPOSAL else 1
    with pytest.raises(SimulatedCrash):
        desk.runtime(steps, CrashPlan(point, nth=nth)).start("r1").run()
    return desk.runtime(steps)


@pytest.mark.parametrize("point", [CrashPoint.RECEIPT_PERSISTED, CrashPoint.BEFORE_PROPOSAL])
@pytest.mark.parametrize("effect", [FILE, TICKET], ids=["file", "ticket"])
def test_a_recovered_agent_re_proposing_a_committed_effect_gets_it_replayed(
    desk: Desk, point: CrashPoint, effect: tuple[str, str, dict[str, Any]]
) -> None:
    """New action id, new prose, same effect after a crash: replayed, written once."""
    steps = [
        propose("a-before-crash", *effect, summary="Drafting the reply for the customer."),
        propose("a-regenerated", *effect, summary="Restored: I will now write the reply."),
    ]
    runtime = crash_after_commit(desk, steps, point)
    session = runtime.recover("r1")
    outcomes = []
    while not session.state.phase.terminal:
        outcomes.append(session.step())
    # (a crash inside the receipt's commit first reconciles that write by its own key)
    replayed = [o for o in outcomes if o.reason == "effect_replayed"]
    assert [(o.kind, o.event) for o in replayed] == [(OutcomeKind.REPLAYED, "effect_replayed")]
    assert session.state.phase is Phase.COMPLETED
    assert session.state.writes_committed == 1
    files, tickets, _ = desk.received()
    assert (files, tickets) == ((1, 0) if effect is FILE else (0, 1))
    event = next(e for e in session.trace() if e.kind == "effect_replayed")
    assert event.data["action_id"] == "a-regenerated"
    assert event.data["replay_of"] == "a-before-crash"
    # What the agent is handed is the first write's receipt and result, not a bare "done".
    (committed,) = [e for e in runtime.store.ledger("r1") if e.status is EffectStatus.COMMITTED]
    assert committed.receipt is not None
    (answer,) = desk.answers("a-regenerated")
    assert answer.outcome == OutcomeKind.REPLAYED.value
    assert answer.data["receipt_id"] == committed.receipt["receipt_id"]
    assert committed.receipt["result"] is not None
    assert answer.data["result"] == committed.receipt["result"]
    assert answer.data["business_object_id"] == committed.receipt.get("business_object_id")


def test_an_email_whose_message_id_would_differ_is_the_same_effect(desk: Desk) -> None:
    """Message-ID comes from the key; subject, body and recipient make the email: replayed."""
    mail = ("email.send", CUSTOMER, {"subject": "Your ticket", "body": "We opened one.\n"})
    other = ("email.send", CUSTOMER, {"subject": "Your ticket", "body": "It is fixed.\n"})
    steps = [
        propose("m1", *mail, summary="Tell the customer."),
        propose("m2", *mail, summary="I should tell the customer."),
        propose("m3", *other, summary="Now say it is fixed."),
    ]
    session = desk.runtime(steps).start("r1")
    assert session.run().phase is Phase.COMPLETED
    assert len(delivered(desk.maildir)) == 2
    kinds = [e.kind for e in session.trace()]
    assert kinds.count("effect_replayed") == 1 and kinds.count("effect_committed") == 2
    first = next(e for e in session.rt.store.ledger("r1") if e.status is EffectStatus.COMMITTED)
    assert first.receipt is not None
    (answer,) = desk.answers("m2")
    assert (answer.outcome, answer.data["replay_of"]) == (OutcomeKind.REPLAYED.value, "m1")
    assert answer.data["receipt_id"] == first.receipt["receipt_id"]
    assert first.receipt["result"] is not None
    assert answer.data["result"] == first.receipt["result"]
