"""A run frozen on an email whose outcome is unknown: a real SMTP server on loopback, a real SQLite file.

The server delivers the message and drops the line before its final reply,
so the run cannot tell whether it landed: the case a person settles, from
the page or from ``tether review``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ScriptedAgent, finish, make_policy, make_task, write
from tests.integration._services import smtp_adapter, smtp_server
from tether.core import Phase
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import Runtime
from tether.store import SQLiteStore

#: A body long enough that the old pages cut it (400 and 2,000 characters): it must scroll.
BODY = "Your order shipped. " + " ".join(f"line {n}: tracking details follow." for n in range(200))


@dataclass
class Frozen:
    """A run frozen on an email whose outcome is unknown, and what a person needs to act on it."""

    db: Path
    keyring: Path
    reviewer_key: Path
    maildir: Path
    port: int
    reviewer: Signer

    def runtime(self) -> Runtime:
        smtp = smtp_adapter(self.port)
        task = make_task(
            smtp.environment().state_fingerprint,
            allowed_kinds=["email.send"],
            allowed_paths=["customer@example.com"],
            permissions=["mail.send"],
            initial_environment={"namespace": "smtp"},
            verifier=None,
        )
        rule = {"risk": "medium", "permission": "mail.send", "needs_approval": False}
        send = write(
            "customer@example.com",
            "",
            kind="email.send",
            args={"subject": "Order 42", "body": BODY},
        )
        return Runtime(
            store=SQLiteStore(self.db),
            keyring=Keyring.from_file(self.keyring),
            adapter=smtp,
            task=task,
            policy=make_policy(kinds={"email.send": rule}),
            agent=ScriptedAgent([send, finish]),
            trust=TrustRoots.of(self.reviewer.trust_root()),
        )


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[Frozen]:
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "drop_after_data") as port:
        keyring = tmp_path / "keyring.json"
        Keyring.generate("k1").write_file(keyring)
        reviewer = Signer.generate("rita", "reviewer")
        key = tmp_path / "rita.key"
        reviewer.write_file(key)
        run = Frozen(tmp_path / "tether.sqlite", keyring, key, maildir, port, reviewer)
        session = run.runtime().start("r1")
        session.run()
        assert session.state.phase is Phase.NEEDS_REVIEW
        session.rt.store.close()
        yield run
