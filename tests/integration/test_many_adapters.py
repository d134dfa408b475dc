"""One run, three real adapters: a workspace, an HTTP service and an SMTP server on loopback."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests._plain import plain
from tests.conftest import ScriptedAgent, finish, make_policy, make_task, write
from tests.integration._services import (
    EffectsService,
    delivered,
    effects_service,
    smtp_adapter,
    smtp_server,
    start_service,
    stop,
)
from tether.adapters import (
    REFERENCE_PROFILE,
    Adapters,
    AdaptersConfigError,
    FileWorkspace,
    HttpEffect,
    SmtpEffect,
)
from tether.core import (
    Compensation,
    EffectStatus,
    EnvironmentDriftError,
    Phase,
    RetrySemantics,
)
from tether.crypto import Keyring
from tether.runtime import CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import SQLiteStore
from tether.testing import Sandbox
from tether.testing.counting import Calls, count_calls

VERIFIER = ("python", "-c", "pass")
CUSTOMER = "customer@example.com"
KEYRING = Keyring.generate("k1")


@dataclass
class Desk:
    """A support desk: the reply file, the ticket service and the mail server of one test."""

    tmp: Path
    root: Path
    service: EffectsService
    smtp_port: int
    maildir: Path
    mailbox_lookup: bool = True
    task: Any = None  # fixed when the run starts, as a real task file is
    sensitive_email: bool = False
    #: Every send and look-up that reached any member, across every "process" of the test.
    calls: Calls = field(default_factory=Calls)

    def adapters(self, service_url: str | None = None) -> Adapters:
        workspace = FileWorkspace(self.root, self.tmp / "journal", verifier_allowlist=[VERIFIER])
        http = HttpEffect(service_url or self.service.url, profile=REFERENCE_PROFILE, timeout_s=2)
        smtp: SmtpEffect = smtp_adapter(
            self.smtp_port, self.maildir if self.mailbox_lookup else None
        )
        for member in (workspace, http, smtp):
            count_calls(member, into=self.calls)
        return Adapters(workspace, http, smtp)

    def runtime(self, adapters: Adapters, crash: CrashPlan | None = None) -> Runtime:
        steps = [
            write("reply.txt", "Sorry about the printer; a technician is on the way.\n"),
            write("tickets", "", kind="http.post", args={"json": {"title": "printer on fire"}}),
            write(
                CUSTOMER,
                "",
                kind="email.send",
                args={"subject": "Your ticket", "body": "We opened a ticket for you."},
            ),
            finish,
        ]
        rules = {
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False},
            "http.post": {"risk": "low", "permission": "service.write", "needs_approval": False},
            "email.send": {
                "risk": "medium",
                "permission": "mail.send",
                "needs_approval": False,
                "sensitive": self.sensitive_email,
            },
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
            agent=ScriptedAgent(steps),
            crash=crash or CrashPlan(),
        )

    def received(self) -> tuple[int, int, int]:
        """What each real system holds: files written, tickets, delivered messages."""
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


def test_one_run_edits_a_file_opens_a_ticket_and_sends_an_email(desk: Desk) -> None:
    """Each effect goes to its owner, the verifier runs on the workspace, one of each lands."""
    rt = desk.runtime(desk.adapters())
    outcome = rt.start("r1").run()
    assert outcome.state.phase is Phase.COMPLETED
    assert desk.received() == (1, 1, 1)
    committed = [e for e in rt.store.ledger("r1") if e.status is EffectStatus.COMMITTED]
    spaces = [e.receipt["namespace"] for e in committed if e.receipt is not None]
    assert spaces == ["file-workspace", "http", "smtp"]


def test_the_ledger_says_who_carried_each_effect_and_what_it_can_promise(desk: Desk) -> None:
    """Each entry names its adapter, kind, target, retry semantics, compensation path and epoch."""
    rt = desk.runtime(desk.adapters())
    rt.start("r1").run()
    entries = rt.store.ledger("r1")
    terms = {e.idempotency_key: e.terms.to_json() if e.terms is not None else None for e in entries}
    assert sorted(
        (t["kind"], t["adapter"], t["target"], t["retry"], t["compensation"])
        for t in terms.values()
        if t is not None
    ) == [
        ("email.send", "smtp", CUSTOMER, RetrySemantics.QUERYABLE, Compensation.HUMAN),
        ("file.write", "file-workspace", "reply.txt", RetrySemantics.IDEMPOTENT, Compensation.NONE),
        # The reference service replays a key (its profile settles a lost reply by a
        # resend, the strongest promise) and can cancel a ticket (a compensate path).
        ("http.post", "http", "tickets", RetrySemantics.IDEMPOTENT, Compensation.ADAPTER),
    ]
    assert len(terms) == 3 and all(e.terms is not None and e.epoch == 1 for e in entries)
    intended = {
        e.terms.kind: e.payload for e in entries if e.status is EffectStatus.INTENDED and e.terms
    }
    assert intended["http.post"] == {"json": {"title": "printer on fire"}}
    assert intended["email.send"] == {
        "subject": "Your ticket",
        "body": "We opened a ticket for you.",
    }
    # The arguments are kept once, on the entry that makes the effect known.
    assert all(e.payload is None for e in entries if e.status is not EffectStatus.INTENDED)


def test_a_sensitive_kind_leaves_only_digests_in_the_ledger(desk: Desk) -> None:
    """The policy marks email sensitive: no body, no subject, no result text in any ledger row."""
    desk.sensitive_email = True
    rt = desk.runtime(desk.adapters())
    assert rt.start("r1").run().state.phase is Phase.COMPLETED
    emails = [
        e for e in rt.store.ledger("r1") if e.terms is not None and e.terms.kind == "email.send"
    ]
    assert [e.status for e in emails] == [
        EffectStatus.INTENDED,
        EffectStatus.DISPATCHED,
        EffectStatus.COMMITTED,
    ]
    assert all(e.payload is None and e.terms is not None and e.terms.sensitive for e in emails)
    receipt = emails[-1].receipt
    assert receipt is not None and receipt["result"]["redacted"] is True
    assert receipt["result"]["digest"].startswith("sha256:")
    plain(desk.tmp / "tether.sqlite")  # the text as sealed, not as deflated
    raw = (
        sqlite3.connect(desk.tmp / "tether.sqlite")
        .execute(
            "SELECT group_concat(coalesce(receipt, '') || coalesce(payload, '') || coalesce(terms, ''))"
            " FROM tether_ledger"
        )
        .fetchone()[0]
    )
    assert "We opened a ticket" not in raw and "Your ticket" not in raw
    assert "printer on fire" in raw  # the ticket's kind is not sensitive: its payload is kept
    assert desk.received() == (1, 1, 1)


@pytest.mark.parametrize("hit", [1, 2, 3])
def test_a_crash_after_each_send_is_reconciled_by_its_own_adapter(desk: Desk, hit: int) -> None:
    """Die after the file, the ticket or the email left: each owner is asked; one of each."""
    with pytest.raises(SimulatedCrash):
        desk.runtime(desk.adapters(), CrashPlan(CrashPoint.EFFECT_SENT, nth=hit)).start("r1").run()
    outcome = desk.runtime(desk.adapters()).recover("r1").run()
    assert outcome.state.phase is Phase.COMPLETED
    assert desk.received() == (1, 1, 1)
    # The workspace and the service absorb a resend under the same key; the calls do not.
    sent = desk.calls.sent()
    assert list(sent.values()) == [1, 1, 1], f"a write was sent again: {sent}"
    crashed = list(sent)[hit - 1]
    assert desk.calls.lookups(crashed) >= 1, "recovery never asked the owner of the crashed write"


def test_an_email_that_cannot_be_confirmed_goes_to_review_alone(desk: Desk) -> None:
    """No mailbox to search: a crash after the send freezes the run; nothing is sent twice."""
    desk.mailbox_lookup = False
    with pytest.raises(SimulatedCrash):
        desk.runtime(desk.adapters(), CrashPlan(CrashPoint.EFFECT_SENT, nth=3)).start("r1").run()
    session = desk.runtime(desk.adapters()).recover("r1")
    session.run()
    assert session.state.phase is Phase.NEEDS_REVIEW
    (case,) = session.state.review_cases
    assert case.reason == "outcome_unknown" and session.state.pending is not None
    assert session.state.pending.intent.kind == "email.send"
    assert desk.received() == (1, 1, 1)


def test_recovery_against_another_service_instance_is_refused(desk: Desk) -> None:
    """The run is bound to the ticket service it used: another database is drift, refused."""
    with pytest.raises(SimulatedCrash):
        desk.runtime(desk.adapters(), CrashPlan(CrashPoint.EFFECT_SENT, nth=2)).start("r1").run()
    other = start_service(desk.tmp / "other.sqlite", desk.tmp / "other.log")
    try:
        with pytest.raises(EnvironmentDriftError):
            desk.runtime(desk.adapters(other.url)).recover("r1")
        assert other.tickets() == []
    finally:
        stop(other)


class KindlessSandbox(Sandbox):
    """A stateful adapter that declares no kinds (only to show two with state clash)."""

    @property
    def kinds(self) -> tuple[Any, ...]:
        return ()


def test_adapters_that_cannot_share_a_run_are_refused() -> None:
    """Two adapters claiming one kind, two with state, or none at all fail when combined."""
    with pytest.raises(AdaptersConfigError, match="declared by both"):
        Adapters(Sandbox(namespace="a"), Sandbox(namespace="b"))
    with pytest.raises(AdaptersConfigError, match="at most one adapter with state"):
        Adapters(Sandbox(namespace="a"), KindlessSandbox(namespace="b"))
    with pytest.raises(AdaptersConfigError, match="at least one"):
        Adapters()


def test_the_order_adapters_are_listed_in_does_not_change_the_run(desk: Desk) -> None:
    """Identity is by namespace: a run started with one order recovers with another."""
    with pytest.raises(SimulatedCrash):
        desk.runtime(desk.adapters(), CrashPlan(CrashPoint.EFFECT_SENT, nth=2)).start("r1").run()
    workspace, http, smtp = desk.adapters().members
    reordered = Adapters(smtp, http, workspace)
    assert desk.runtime(reordered).recover("r1").run().state.phase is Phase.COMPLETED
    assert desk.received() == (1, 1, 1)
