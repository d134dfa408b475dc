"""The support-desk demo: one run, three real systems, each counted on its own side.

The agent edits ``reply.txt`` in a workspace, opens a ticket on the reference
effects service over HTTP and emails the customer through a real SMTP server
that delivers into a Maildir. Both services run as child processes on free
loopback ports for the length of one demo; the run's own processes (which
the demo kills) find them through ``services.json`` in the demo's desk
directory, ``DB.desk`` beside the run's database ``DB.sqlite``.

What the demo reports as received comes from the systems themselves: the
workspace's write count, the tickets in the service's database, the messages
in the Maildir. The run's ledger is reported beside them, never instead. Each
demo gets a ticket database and a Maildir of its own, so a whole-system count
is this run's count; an earlier demo in the same directory is not in it.
"""

from __future__ import annotations

import importlib
import json
import mailbox
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tether import _demo
from tether.adapters import (
    REFERENCE_PROFILE,
    Adapters,
    FileWorkspace,
    HttpEffect,
    MaildirLookup,
    SmtpEffect,
    message_id,
)
from tether.core import LedgerEntry, Observation, Proposal, TaskSpec, TetherError
from tether.crypto import Keyring, Signer
from tether.runtime import AgentContext, CrashPlan, Decision, Runtime

CUSTOMER = "customer@example.com"
SENDER = "desk@shop.test"
MAIL_DOMAIN = "shop.test"
MAIL_INSTANCE = "demo-mail"  # names the mail system the run is bound to
DRAFT = "draft\n"
REPLY = "Sorry about the printer. A technician is on the way; your ticket is open.\n"
# The verifier judges the workspace, the one system whose state the run owns.
VERIFIER = (
    "python",
    "-c",
    "import pathlib, sys; sys.exit('technician' not in pathlib.Path('reply.txt').read_text())",
)
#: The three effects, in the order the agent makes them: action id -> what it is.
EFFECTS = {
    "write-reply": "reply.txt in the workspace",
    "open-ticket": "ticket on the effects service",
    "email-customer": f"email to {CUSTOMER}",
}
#: What the demo needs beyond tether's own dependencies, with the extra that brings it.
EXTRAS = ("httpx", "starlette", "uvicorn", "aiosmtpd")


class DemoSetupError(TetherError):
    """The demo cannot start its services (a missing extra, a service that would not listen)."""


def require_extras() -> None:
    """Fail in one line, before anything starts, if a module the services need is missing."""
    missing = []
    for name in EXTRAS:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise DemoSetupError(
            f"the support-desk demo needs {', '.join(missing)}: pip install 'tether[demo]'"
        )


class DeskAgent:
    """Writes the reply, opens the ticket, emails the customer, then finishes.

    Deterministic from its context: a recovered run picks up at the same plan
    cursor. After a reviewer's replan the cursor is already past the email
    the run could not confirm, so the agent does not write it again.
    """

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        cursor = context.plan_cursor
        version = observation.environment.version
        steps = (
            Proposal(
                action_id="write-reply",
                kind="file.write",
                target="reply.txt",
                args={"content": REPLY},
                based_on_version=version,
            ),
            Proposal(
                action_id="open-ticket",
                kind="http.post",
                target="tickets",
                args={"json": {"title": "Printer on fire", "customer": CUSTOMER}},
                based_on_version=version,
            ),
            Proposal(
                action_id="email-customer",
                kind="email.send",
                target=CUSTOMER,
                args={"subject": "Your printer ticket", "body": REPLY},
                based_on_version=version,
            ),
        )
        if cursor < len(steps):
            note = {"role": "agent", "text": f"next: {EFFECTS[steps[cursor].action_id]}"}
            return Decision(
                context=AgentContext((*context.messages, note), context.memory, cursor + 1),
                proposal=steps[cursor],
            )
        note = {"role": "agent", "text": "reply, ticket and email done; asking the verifier"}
        return Decision(
            context=AgentContext((*context.messages, note), context.memory, cursor + 1),
            finished=True,
            summary="customer answered",
        )


def policy_doc() -> dict[str, object]:
    """The desk's policy: no approvals, the email one risk step above the rest."""
    return {
        "policy_id": "demo-desk",
        "policy_version": "1",
        "kinds": {
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False},
            "http.post": {"risk": "low", "permission": "service.write", "needs_approval": False},
            # The customer's email is personal: the ledger keeps its digests only.
            "email.send": {
                "risk": "medium",
                "permission": "mail.send",
                "needs_approval": False,
                "sensitive": True,
            },
        },
        "max_risk": "medium",
        "approval_ttl_s": 900,
    }


def prepare(paths: _demo.DemoPaths) -> None:
    """Seed the workspace with the draft; write keys, trust roots, task and policy files."""
    paths.workspace.mkdir(parents=True, exist_ok=True)
    paths.db.parent.mkdir(parents=True, exist_ok=True)
    (paths.workspace / "reply.txt").write_text(DRAFT)
    if not paths.keyring.exists():
        Keyring.generate("demo-1").write_file(paths.keyring)
    with workspace(paths) as ws:
        fingerprint = ws.environment().state_fingerprint
    task = {
        "task_id": "support-desk",
        "task_version": "1",
        "allowed_kinds": ["file.write", "http.post", "email.send"],
        "allowed_paths": ["reply.txt", "tickets", CUSTOMER],
        "permissions": ["workspace.write", "service.write", "mail.send"],
        "budgets": {"proposals": 6, "steps": 12, "wall_time_s": 600, "cost": 10},
        # The combined adapters keep the workspace's namespace and fingerprint.
        "initial_environment": {"namespace": "file-workspace", "state_fingerprint": fingerprint},
        "verifier": {"argv": list(VERIFIER), "timeout_s": 60},
    }
    TaskSpec.from_json(_demo._json(task))  # the demo's own task must pass the strict loader
    paths.task.write_text(_demo._json(task))
    paths.policy.write_text(_demo._json(policy_doc()))
    if not paths.trust.exists():
        reviewer = Signer.generate("demo-reviewer", "reviewer")
        reviewer.write_file(paths.signer_key("reviewer"))
        paths.trust.write_text(_demo._json({"signers": [reviewer.trust_root()]}))


def workspace(paths: _demo.DemoPaths) -> FileWorkspace:
    return FileWorkspace(paths.workspace, paths.journal, verifier_allowlist=[VERIFIER])


# -- the two services --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeskServices:
    """Where the demo's ticket service and mail server listen, and what they keep."""

    ticket_url: str
    ticket_db: Path
    smtp_host: str
    smtp_port: int
    maildir: Path
    #: Whether the run's SMTP adapter may search the Maildir (then it is queryable).
    mail_lookup: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "ticket_url": self.ticket_url,
            "ticket_db": str(self.ticket_db),
            "smtp_host": self.smtp_host,
            "smtp_port": self.smtp_port,
            "maildir": str(self.maildir),
            "mail_lookup": self.mail_lookup,
        }

    @classmethod
    def load(cls, paths: _demo.DemoPaths) -> DeskServices:
        """The services the demo started, as recorded in its home."""
        where = services_file(paths)
        try:
            doc = json.loads(where.read_text())
            return cls(
                ticket_url=str(doc["ticket_url"]),
                ticket_db=Path(doc["ticket_db"]),
                smtp_host=str(doc["smtp_host"]),
                smtp_port=int(doc["smtp_port"]),
                maildir=Path(doc["maildir"]),
                mail_lookup=bool(doc["mail_lookup"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DemoSetupError(
                f"{where} does not say where the desk's services run ({exc}); "
                "start them with `tether demo --scenario support-desk`"
            ) from exc


def desk_dir(paths: _demo.DemoPaths) -> Path:
    """This demo's ticket database, Maildir, service logs and ``services.json``: one per --db."""
    return paths.db.with_name(paths.db.stem + ".desk")


def services_file(paths: _demo.DemoPaths) -> Path:
    return desk_dir(paths) / "services.json"


def require_fresh(paths: _demo.DemoPaths) -> None:
    """Refuse a desk directory left by an earlier demo: its tickets and mail would be counted."""
    where = desk_dir(paths)
    if where.exists() or where.is_symlink():
        raise _demo.DemoPathError(
            where,
            f"{where} holds an earlier support-desk demo's tickets and mail, which would count "
            f"as this run's; give the demo a fresh --store or remove {where}",
        )


@contextmanager
def running_services(paths: _demo.DemoPaths, *, mail_lookup: bool) -> Iterator[DeskServices]:
    """Start the ticket service and the mail server as child processes; stop both on exit.

    They outlive every run process the demo kills: a SIGKILLed run must find
    the same service instance and the same mailbox when it is recovered.
    """
    home = desk_dir(paths)
    home.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        tickets = stack.enter_context(
            _child_service(
                ["tether.testing.effects_service", "--db", str(home / "tickets.sqlite")],
                home / "tickets.log",
            )
        )
        mail = stack.enter_context(
            _child_service(
                ["tether.testing.mail_server", "--maildir", str(home / "Maildir")],
                home / "mail.log",
            )
        )
        services = DeskServices(
            ticket_url=str(tickets["url"]),
            ticket_db=home / "tickets.sqlite",
            smtp_host=str(mail["host"]),
            smtp_port=int(mail["port"]),
            maildir=home / "Maildir",
            mail_lookup=mail_lookup,
        )
        services_file(paths).write_text(json.dumps(services.to_json(), sort_keys=True))
        yield services


@contextmanager
def _child_service(module_argv: list[str], log: Path) -> Iterator[dict[str, Any]]:
    """``python -m MODULE ...`` with its first stdout line (where it listens) as JSON.

    Stopped on the way out, whatever the way (an error, Ctrl-C, the demo's
    SIGTERM handler); on Linux the kernel also kills it if the demo is SIGKILLed.
    """
    process: subprocess.Popen[str] | None = None
    try:
        with open(log, "a") as sink, _demo.signals_held():
            process = subprocess.Popen(
                [sys.executable, "-m", *module_argv],
                stdout=subprocess.PIPE,
                stderr=sink,
                stdin=subprocess.DEVNULL,
                text=True,
                preexec_fn=_demo.die_with_parent(),  # noqa: PLW1509 - the demo starts no threads
            )
        line = _first_line(process.stdout)
        if not line:
            process.wait(timeout=10)
            raise DemoSetupError(
                f"{module_argv[0]} did not start (exit {process.returncode}); see {log}"
            )
        yield dict(json.loads(line))
    finally:
        if process is not None:
            _stop(process)


def _first_line(stream: IO[str] | None) -> str:
    return stream.readline() if stream is not None else ""


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


# -- the run -----------------------------------------------------------------------


def adapters(paths: _demo.DemoPaths, services: DeskServices) -> Adapters:
    """The workspace, the ticket service and the mail server as one run's adapters."""
    smtp = SmtpEffect(
        services.smtp_host,
        services.smtp_port,
        sender=SENDER,
        domain=MAIL_DOMAIN,
        instance_id=MAIL_INSTANCE,
        mailbox_lookup=MaildirLookup(services.maildir) if services.mail_lookup else None,
        timeout_s=10,
    )
    return Adapters(
        workspace(paths),
        # Each POST files a ticket of its own: the same ticket again is a replay.
        HttpEffect(
            services.ticket_url, profile=REFERENCE_PROFILE, targets="collection", timeout_s=10
        ),
        smtp,
    )


def runtime(
    paths: _demo.DemoPaths,
    combined: Adapters,
    crash: CrashPlan | None = None,
    *,
    lease_ttl_s: float | None = None,
) -> Runtime:
    """The demo's runtime (store, keys, task, policy) over the desk's adapters and agent."""
    return _demo.runtime(paths, combined, crash, lease_ttl_s=lease_ttl_s, agent=DeskAgent())


# -- what the world received ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Received:
    """Counted by each real system, not by the run."""

    file_writes: int
    tickets: int
    messages: int

    def to_json(self) -> dict[str, int]:
        return {"file_writes": self.file_writes, "tickets": self.tickets, "messages": self.messages}


def received(paths: _demo.DemoPaths, services: DeskServices) -> Received:
    """Writes the workspace journaled, tickets the service holds, messages in the Maildir."""
    import httpx

    with workspace(paths) as ws:
        files = ws.write_count()
    try:
        answer = httpx.get(services.ticket_url + "/tickets", timeout=10)
        tickets = len(answer.json()["tickets"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise DemoSetupError(f"the ticket service did not list its tickets: {exc}") from exc
    return Received(files, tickets, len(delivered(services.maildir)))


def delivered(maildir: Path) -> list[str]:
    """The Message-IDs in the Maildir: what the recipient side really holds."""
    if not maildir.exists():
        return []
    box = mailbox.Maildir(maildir, create=False)
    return [str(box.get_message(key)["Message-ID"]) for key in box.iterkeys()]


def message_for(idempotency_key: str) -> str:
    """The Message-ID the run's email under ``idempotency_key`` carries (what a reviewer seeks)."""
    return message_id(idempotency_key, MAIL_DOMAIN)


def effect_outcomes(ledger: list[LedgerEntry]) -> dict[str, dict[str, Any]]:
    """Per effect: its newest ledger status, every status it passed through, and the epochs."""
    outcomes: dict[str, dict[str, Any]] = {}
    for entry in ledger:
        seen = outcomes.setdefault(
            entry.action_id, {"status": None, "statuses": [], "epochs": [], "key": None}
        )
        seen["status"] = entry.status.value
        seen["statuses"].append(entry.status.value)
        seen["key"] = entry.idempotency_key
        if entry.epoch not in seen["epochs"]:
            seen["epochs"].append(entry.epoch)
    return outcomes
