"""The support-desk run in a child process, to be SIGKILLed at a crash point and recovered.

The run edits ``reply.txt`` in its own workspace, opens a ticket on the
reference effects service over HTTP and emails the customer through a real
SMTP server: three adapters in one run (``Adapters``). Titles and subjects
carry the run id, so many trials can share one service and one mail server
and each trial's effects are still counted apart.

``python -m tests.integration._deskkit STAGE BASE RUN STORE_URL SERVICE_URL SMTP_PORT MAILDIR
[POINT HIT]``: ``start`` begins the run (armed to SIGKILL itself at the
``HIT``-th pass through ``POINT``), ``recover`` recovers it and runs it as far
as it may go.
"""

from __future__ import annotations

import mailbox
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ScriptedAgent, finish, make_policy, make_task, write
from tether.adapters import (
    REFERENCE_PROFILE,
    Adapters,
    FileWorkspace,
    HttpEffect,
    MaildirLookup,
    SmtpEffect,
)
from tether.crypto import Keyring
from tether.runtime import CrashPlan, CrashPoint, Runtime
from tether.store import open_store
from tether.testing import Sandbox

VERIFIER = ("python", "-c", "pass")
BLIND_MAIL = "TETHER_DESK_BLIND_MAIL"
CUSTOMER = "customer@example.com"
INITIAL = Sandbox({"reply.txt": "draft\n"})  # fingerprints agree with the workspace's
RULES = {
    "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False},
    "http.post": {"risk": "low", "permission": "service.write", "needs_approval": False},
    "email.send": {"risk": "medium", "permission": "mail.send", "needs_approval": False},
}


def prepare_base(base: Path) -> None:
    """The keyring every trial under ``base`` shares (made once, before the trials)."""
    Keyring.generate("k1").write_file(base / "keyring.json")


def prepare(base: Path, run_id: str) -> None:
    """A fresh workspace for ``run_id``."""
    root = base / run_id / "tree"
    root.mkdir(parents=True)
    (root / "reply.txt").write_text("draft\n")


def adapters(base: Path, run_id: str, service_url: str, smtp_port: int, maildir: Path) -> Adapters:
    workspace = FileWorkspace(
        base / run_id / "tree", base / run_id / "journal", verifier_allowlist=[VERIFIER]
    )
    http = HttpEffect(service_url, profile=REFERENCE_PROFILE, timeout_s=10)
    smtp = SmtpEffect(
        "127.0.0.1",
        smtp_port,
        sender="desk@shop.test",
        domain="shop.test",
        instance_id="mail-1",
        # TETHER_DESK_BLIND_MAIL=1: plain SMTP, which can neither be asked nor dedup.
        mailbox_lookup=None if os.environ.get(BLIND_MAIL) == "1" else MaildirLookup(maildir),
        timeout_s=10,
    )
    return Adapters(workspace, http, smtp)


def runtime(store: Any, base: Path, run_id: str, combined: Adapters, crash: CrashPlan) -> Runtime:
    steps = [
        write("reply.txt", f"[{run_id}] a technician is on the way.\n"),
        write("tickets", "", kind="http.post", args={"json": {"title": f"[{run_id}] printer"}}),
        write(
            CUSTOMER,
            "",
            kind="email.send",
            args={"subject": f"[{run_id}] your ticket", "body": "We opened a ticket."},
        ),
        finish,
    ]
    task = make_task(
        INITIAL.environment().state_fingerprint,  # the tree as prepared: one draft file
        allowed_kinds=["file.read", "file.write", "http.post", "email.send"],
        allowed_paths=["reply.txt", "tickets", CUSTOMER],
        permissions=["workspace.read", "workspace.write", "service.write", "mail.send"],
        initial_environment={"namespace": combined.namespace},
        verifier={"argv": list(VERIFIER), "timeout_s": 30},
    )
    return Runtime(
        store=store,
        keyring=Keyring.from_file(base / "keyring.json"),
        adapter=combined,
        task=task,
        policy=make_policy(kinds=RULES),
        agent=ScriptedAgent(steps),
        crash=crash,
        worker=f"pid-{os.getpid()}",
    )


def effects(base: Path, run_id: str, service_url: str, maildir: Path) -> tuple[int, int, int]:
    """What each real system received for ``run_id``: file writes, tickets, messages."""
    with FileWorkspace(base / run_id / "tree", base / run_id / "journal") as workspace:
        files = workspace.write_count()
    tickets = httpx.get(service_url + "/tickets", timeout=10).json()["tickets"]
    ours = sum(f"[{run_id}]" in t["body"] for t in tickets)
    messages = 0
    if maildir.exists():
        box = mailbox.Maildir(maildir, create=False)
        messages = sum(f"[{run_id}]" in str(box.get_message(k)["Subject"]) for k in box.iterkeys())
    return files, ours, messages


def main(argv: list[str]) -> int:
    stage, base, run_id, url, service_url = argv[0], Path(argv[1]), argv[2], argv[3], argv[4]
    smtp_port, maildir = int(argv[5]), Path(argv[6])
    combined = adapters(base, run_id, service_url, smtp_port, maildir)
    with open_store(url) as store:
        if stage == "start":
            plan = CrashPlan(CrashPoint(argv[7]), nth=int(argv[8]), mode="kill")
            runtime(store, base, run_id, combined, plan).start(run_id).run()
        else:
            rt = runtime(store, base, run_id, combined, CrashPlan())
            rt.start_or_recover(run_id).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
