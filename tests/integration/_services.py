"""Real services on loopback for tests: the reference effects service as a child process."""

from __future__ import annotations

import json
import mailbox
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tether.adapters import MaildirLookup, SmtpEffect


@dataclass
class EffectsService:
    """A running ``python -m tether.testing.effects_service`` and a client for it."""

    db: Path
    url: str
    instance_id: str
    process: subprocess.Popen[str]
    client: httpx.Client

    def mode(self, **changes: Any) -> dict[str, Any]:
        """Switch the service's (hostile) mode; returns the whole mode now in force."""
        answer = self.client.post("/_admin/mode", json=changes)
        answer.raise_for_status()
        return dict(answer.json())

    def tickets(self) -> list[dict[str, Any]]:
        """Every ticket the service's database holds: what the world received."""
        return list(self.client.get("/tickets").json()["tickets"])

    def compensations(self) -> list[dict[str, Any]]:
        """Every ticket cancellation the service carried out (its compensations)."""
        return list(self.client.get("/compensations").json()["compensations"])

    def kill(self) -> None:
        """SIGKILL the service process (no clean shutdown)."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


def start_service(db: Path, log: Path, port: int = 0) -> EffectsService:
    """Start the service on loopback (a free port, or ``port``) over ``db``; log to ``log``."""
    argv = ["--db", str(db), "--port", str(port)]
    with open(log, "a") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "tether.testing.effects_service", *argv],
            stdout=subprocess.PIPE,
            stderr=sink,
            stdin=subprocess.DEVNULL,
            text=True,
        )
    if process.stdout is None:
        raise RuntimeError("no stdout pipe")
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=10)
        raise RuntimeError(f"effects service did not start: {log.read_text()[-2000:]}")
    info = json.loads(line)
    client = httpx.Client(base_url=info["url"], timeout=10)
    return EffectsService(db, info["url"], info["instance_id"], process, client)


@contextmanager
def effects_service(tmp_path: Path, name: str = "service") -> Iterator[EffectsService]:
    """A fresh service with its own SQLite file under ``tmp_path``, stopped afterwards."""
    service = start_service(tmp_path / f"{name}.sqlite", tmp_path / f"{name}.log")
    try:
        yield service
    finally:
        stop(service)


def stop(service: EffectsService) -> None:
    """Terminate the service if it still runs and close the client."""
    service.client.close()
    if service.process.poll() is None:
        service.process.terminate()
        try:
            service.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            service.process.kill()
            service.process.wait(timeout=10)
    if service.process.stdout is not None:
        service.process.stdout.close()


# -- SMTP: aiosmtpd delivering into a Maildir -----------------------------------

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def smtp_server(maildir: Path, mode: str = "ok") -> Iterator[int]:
    """``tests.integration._smtpserver`` as a child process; yields its port."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.integration._smtpserver", str(maildir), mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        if process.stdout is None:
            raise RuntimeError("no stdout pipe")
        line = process.stdout.readline()
        if not line:
            raise RuntimeError("the SMTP server did not start")
        yield int(line)
    finally:
        process.kill()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def delivered(maildir: Path) -> list[str]:
    """Message-IDs in the Maildir: what the recipient side really received."""
    if not maildir.exists():
        return []
    box = mailbox.Maildir(maildir, create=False)
    return [str(box.get_message(k)["Message-ID"]) for k in box.iterkeys()]


def smtp_adapter(port: int, maildir: Path | None = None, timeout_s: float = 5) -> SmtpEffect:
    return SmtpEffect(
        "127.0.0.1",
        port,
        sender="agent@shop.test",
        domain="shop.test",
        instance_id="mail-1",
        mailbox_lookup=None if maildir is None else MaildirLookup(maildir),
        timeout_s=timeout_s,
    )
