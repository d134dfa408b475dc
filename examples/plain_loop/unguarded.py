"""A support desk's tool-calling loop, twice: ``unguarded.py`` and ``guarded.py`` differ only
where tether comes in (a test keeps that under 20 changed lines).

The "model" (``desk.next_step``) asks for a tool; the loop calls it and
hands the answer back as text, until the model answers. The tools write
the reply into the workspace, open a ticket over HTTP and email the
customer.

``unguarded.py`` is the loop as people write it today: each tool does its
work itself. Kill it after the ticket went out and run the case again, and
the case gets a second ticket (a fresh ``Idempotency-Key`` per call does
not survive the process); killed after the email, a second email.

``guarded.py`` marks each tool ``@tether.effect(kind)`` and runs the loop
inside ``tether.effects.run``: a call persists the intent and its key, then
the adapter that owns the kind (``tether_config.adapters``) performs it and
its receipt is recorded. The tool's body is never run, so it is gone. Run
the case again after a crash and the loop proposes the same calls: each one
that happened returns its recorded receipt and sends nothing; one a crash
left in doubt is asked after by its key first.

    python -m examples.plain_loop.unguarded CASE
    python -m examples.plain_loop.guarded CASE
"""

from __future__ import annotations

import smtplib
import sys
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from examples.plain_loop.desk import Config, next_step, request

CONFIG = Config.from_env()


def write_file(path: str, content: str) -> Any:
    """Replace the file ``path`` in the support workspace with ``content``."""
    return (CONFIG.workspace / path).write_text(content)


def open_ticket(json: dict[str, Any], path: str = "tickets") -> Any:
    """Open a ticket on the ticket service: ``json`` is the ticket (title, customer)."""
    key = {"Idempotency-Key": f'"{uuid.uuid4()}"'}  # the service wants one; a new one per call
    return httpx.post(f"{CONFIG.tickets_url}/{path}", json=json, headers=key).json()


def send_email(to: str, subject: str, body: str) -> Any:
    """Email one address."""
    with smtplib.SMTP(CONFIG.smtp_host, CONFIG.smtp_port) as smtp:
        return smtp.sendmail(CONFIG.sender, [to], f"Subject: {subject}\n\n{body}")


TOOLS: dict[str, Callable[..., Any]] = {
    "write_file": write_file,
    "open_ticket": open_ticket,
    "send_email": send_email,
}


def agent_loop(asked: dict[str, str]) -> str:
    """Ask the model for a tool call, make it, give it the answer; until the model answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": asked}]
    while True:
        step = next_step(messages)
        if "answer" in step:
            return str(step["answer"])
        output = TOOLS[step["tool"]](**step["args"])
        messages.append({"role": "tool", "name": step["tool"], "content": str(output)})


def main(case: str) -> None:
    """Answer the complaint filed as ``case``."""
    print(agent_loop(request(case)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "case-1")
