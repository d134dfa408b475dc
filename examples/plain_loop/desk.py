"""What both versions of the loop share: where the systems are, and the "model".

Nothing here knows tether. ``Config`` says where the workspace, the ticket
service and the mail server are (from ``PLAIN_LOOP_*`` environment
variables, which ``run_demo.py`` sets). ``next_step`` stands in for the
language model: given the conversation so far it answers with the next tool
call or with the final answer, deterministically and without a network, so
a rerun after a crash proposes the same calls, as a real loop replaying its
conversation would hope to.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DRAFT = "draft\n"
REPLY = "Sorry about the printer. A technician is on the way; your ticket is open.\n"
SENDER = "desk@shop.test"


@dataclass(frozen=True, slots=True)
class Config:
    """Where the loop's three systems are."""

    workspace: Path
    tickets_url: str
    smtp_host: str
    smtp_port: int
    #: The mail server's Maildir: where a guarded run looks up a message it may have sent.
    maildir: Path
    #: tether's own files (store, keyring, journal); unused by the unguarded loop.
    state: Path
    sender: str = SENDER

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read ``PLAIN_LOOP_WORKSPACE``, ``_TICKETS_URL``, ``_SMTP_HOST``, ``_SMTP_PORT``,
        ``_MAILDIR`` and ``_STATE`` from ``env`` (default: this process's environment)."""
        env = os.environ if env is None else env
        return cls(
            workspace=Path(env.get("PLAIN_LOOP_WORKSPACE", "plain-loop/workspace")),
            tickets_url=env.get("PLAIN_LOOP_TICKETS_URL", "http://127.0.0.1:8000"),
            smtp_host=env.get("PLAIN_LOOP_SMTP_HOST", "127.0.0.1"),
            smtp_port=int(env.get("PLAIN_LOOP_SMTP_PORT", "8025")),
            maildir=Path(env.get("PLAIN_LOOP_MAILDIR", "plain-loop/Maildir")),
            state=Path(env.get("PLAIN_LOOP_STATE", "plain-loop/tether")),
        )


def request(case: str, customer: str = "customer@example.com") -> dict[str, str]:
    """The customer's complaint the loop answers; ``case`` names it in the ticket and the email."""
    return {"case": case, "customer": customer, "complaint": "The printer is on fire."}


def next_step(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The "model": the next tool call (``{"tool", "args"}``) or the answer (``{"answer"}``).

    It reads tool results as text, as a model does: the ticket's number is
    whatever follows ``'ticket_id':`` in the ticket tool's answer.
    """
    asked = messages[0]["content"]
    case, customer = asked["case"], asked["customer"]
    answers = {m["name"]: m["content"] for m in messages if m["role"] == "tool"}
    if "write_file" not in answers:
        return {"tool": "write_file", "args": {"path": "reply.txt", "content": REPLY}}
    if "open_ticket" not in answers:
        ticket = {"title": f"[{case}] {asked['complaint']}", "customer": customer}
        return {"tool": "open_ticket", "args": {"json": ticket}}
    if "send_email" not in answers:
        number = re.search(r"'ticket_id': (\d+)", answers["open_ticket"])
        subject = f"[{case}] your ticket #{number.group(1) if number else '?'}"
        return {"tool": "send_email", "args": {"to": customer, "subject": subject, "body": REPLY}}
    return {"answer": f"{case}: reply written, ticket opened, {customer} emailed"}
