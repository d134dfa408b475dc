"""SmtpEffect against a real SMTP server (aiosmtpd) on loopback, delivering into a Maildir."""

from __future__ import annotations

import smtplib
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path

import pytest

from tests.integration._services import delivered, smtp_server
from tests.integration._services import smtp_adapter as adapter
from tether.adapters import (
    MaildirLookup,
    NotQueryableError,
    RequestRefusedError,
    SmtpConfigError,
    SmtpEffect,
    message_id,
)
from tether.adapters._smtp import INTENT_HEADER
from tether.core import (
    AdapterUnavailableError,
    ContractViolationError,
    Intent,
    Phase,
)
from tether.crypto import Keyring
from tether.runtime import Runtime
from tether.store import SQLiteStore


def notification(smtp: SmtpEffect, body: str = "Your order shipped.") -> Intent:
    args = smtp.normalize(
        "email.send", "customer@example.com", {"subject": "Order 42", "body": body}
    )
    return Intent("email.send", "customer@example.com", args, "medium")


def test_a_send_is_delivered_once_and_its_receipt_is_found_by_key(tmp_path: Path) -> None:
    """One send, one delivered message; the mailbox look-up rebuilds the same receipt."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir) as port:
        smtp = adapter(port, maildir)
        intent = notification(smtp)
        receipt = smtp.execute("k1", intent, smtp.environment())
    assert delivered(maildir) == [receipt.business_object_id]
    assert smtp.lookup("k1") == receipt
    assert smtp.lookup("never-sent") is None


#: Subjects whose header folds when sent: a 70-character word (folded right after
#: "Subject:"), long runs of words, a long word beside non-ASCII text.
FOLDING = [
    "Ticket " + "x" * 70,
    "y" * 70,
    "Re: your order " + "A" * 70 + " shipped",
    "Hello " + "z" * 70 + " and " + "w" * 75,
    " ".join(["word"] * 40),
    "Grüße " + "ü" * 70,
]


@pytest.mark.parametrize("subject", FOLDING, ids=range(len(FOLDING)))
def test_a_message_whose_subject_folds_is_found_by_its_own_key(
    tmp_path: Path, subject: str
) -> None:
    """The mailbox holds the subject folded; the look-up unfolds it and recognises its message."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "drop_after_data") as port:
        smtp = adapter(port, maildir)
        args = smtp.normalize(
            "email.send", "customer@example.com", {"subject": subject, "body": "hi"}
        )
        intent = Intent("email.send", "customer@example.com", args, "medium")
        with pytest.raises(AdapterUnavailableError, match="unknown"):
            smtp.execute("k1", intent, smtp.environment())
    assert len(delivered(maildir)) == 1
    found = smtp.lookup_intent("k1", intent)
    assert found is not None and found.intent_digest == intent.digest  # ours, not foreign
    other = dict(args, subject=subject + " (2)")
    mistaken = smtp.lookup_intent(
        "k1", Intent("email.send", "customer@example.com", other, "medium")
    )
    assert mistaken is not None and mistaken.intent_digest.startswith("foreign:")


def test_a_reply_lost_after_data_is_unknown_and_the_mailbox_has_it(tmp_path: Path) -> None:
    """The server took the message and dropped the line: unknown, delivered once, found by key."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "drop_after_data") as port:
        smtp = adapter(port, maildir)
        intent = notification(smtp)
        with pytest.raises(AdapterUnavailableError, match="unknown"):
            smtp.execute("k1", intent, smtp.environment())
    assert len(delivered(maildir)) == 1
    found = smtp.lookup("k1")
    assert found is not None and found.intent_digest == intent.digest


def test_a_timeout_waiting_for_the_final_reply_is_unknown(tmp_path: Path) -> None:
    """The client gives up before the server answers DATA: unknown, though it was delivered."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "slow_reply") as port:
        smtp = adapter(port, maildir, timeout_s=0.5)
        with pytest.raises(AdapterUnavailableError, match="unknown"):
            smtp.execute("k1", notification(smtp), smtp.environment())
    assert len(delivered(maildir)) == 1


@pytest.mark.parametrize(("mode", "code"), [("tempfail", 451), ("reject", 550)])
def test_a_refusal_before_acceptance_is_a_rejection_and_delivers_nothing(
    tmp_path: Path, mode: str, code: int
) -> None:
    """451 to DATA or 550 to RCPT: nothing was accepted, so it is a refusal, not unknown."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, mode) as port:
        smtp = adapter(port, maildir)
        with pytest.raises(RequestRefusedError) as caught:
            smtp.execute("k1", notification(smtp), smtp.environment())
    assert caught.value.status == code
    assert delivered(maildir) == []


def test_nothing_listening_is_a_refusal(tmp_path: Path) -> None:
    """A connection refused sent nothing: a refusal the runtime may record as rejected."""
    with smtp_server(tmp_path / "Maildir") as port:
        pass  # the port is free again
    with pytest.raises(RequestRefusedError):
        smtp = adapter(port)
        smtp.execute("k1", notification(smtp), smtp.environment())


def test_capabilities_are_honest(tmp_path: Path) -> None:
    """Never idempotent; queryable only with a mailbox; absence is never final."""
    blind = adapter(25)
    assert blind.capabilities.blind
    with pytest.raises(NotQueryableError):
        blind.lookup("k1")
    searching = adapter(25, tmp_path)
    caps = searching.capabilities
    assert (caps.idempotent, caps.queryable, caps.absent_is_final) == (False, True, False)


@pytest.mark.parametrize(
    ("target", "args"),
    [
        ("not-an-address", {"subject": "s", "body": "b"}),
        ("a@b.test, c@d.test", {"subject": "s", "body": "b"}),
        ("customer@example.com", {"subject": "s\r\nBcc: x@y.test", "body": "b"}),
        ("customer@example.com", {"subject": "s"}),
        ("customer@example.com", {"subject": "s", "body": "b", "cc": "x@y.test"}),
    ],
)
def test_bad_messages_are_contract_violations(target: str, args: dict[str, str]) -> None:
    """One recipient, a one-line subject (no header injection), subject and body only."""
    with pytest.raises(ContractViolationError):
        adapter(25).normalize("email.send", target, args)


def test_configuration_is_checked_up_front() -> None:
    """A sender that is no address, a bad domain or a missing instance id fail at once."""
    for changes in ({"sender": "nobody"}, {"domain": "a@b"}, {"instance_id": ""}):
        kwargs = {"sender": "a@shop.test", "domain": "shop.test", "instance_id": "m", **changes}
        with pytest.raises(SmtpConfigError):
            SmtpEffect("127.0.0.1", 25, **kwargs)  # type: ignore[arg-type]


# --- through the runtime ---------------------------------------------------------


def email_run(tmp_path: Path, smtp: SmtpEffect) -> Callable[[], Runtime]:
    from tests.conftest import ScriptedAgent, make_policy, make_task, write

    task = make_task(
        smtp.environment().state_fingerprint,
        allowed_kinds=["email.send"],
        allowed_paths=["customer@example.com"],
        permissions=["mail.send"],
        initial_environment={"namespace": "smtp"},
    )
    rule = {"risk": "medium", "permission": "mail.send", "needs_approval": False}
    send = write(
        "customer@example.com",
        "",
        kind="email.send",
        args={"subject": "Order 42", "body": "Your order shipped."},
    )
    keyring = Keyring.generate("k1")
    return lambda: Runtime(
        store=SQLiteStore(tmp_path / "tether.sqlite"),
        keyring=keyring,
        adapter=smtp,
        task=task,
        policy=make_policy(kinds={"email.send": rule}),
        agent=ScriptedAgent([send]),
    )


def test_an_uncertain_email_goes_to_review_and_is_never_sent_again(tmp_path: Path) -> None:
    """The seed's notification: the reply is lost, recovery cannot ask, a person decides."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "drop_after_data") as port:
        build = email_run(tmp_path, adapter(port))
        session = build().start("r1")
        session.step()
        assert session.state.phase is Phase.NEEDS_REVIEW
        assert session.state.review_cases[0].reason == "outcome_unknown"
        again = build().recover("r1")
        again.run()
        assert again.state.phase is Phase.NEEDS_REVIEW
    assert len(delivered(maildir)) == 1  # in the customer's inbox once; never resent


def test_with_a_mailbox_an_uncertain_email_is_reconciled(tmp_path: Path) -> None:
    """The same lost reply, with the mailbox to search: found by Message-ID, recorded, once."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir, "drop_after_data") as port:
        build = email_run(tmp_path, adapter(port, maildir))
        session = build().start("r1")
        session.step()  # unknown: still dispatched, retried later
        again = build().recover("r1")
        again.step()
        assert again.state.writes_committed == 1 and again.state.pending is None
    assert len(delivered(maildir)) == 1


@pytest.mark.parametrize(
    ("target", "subject"),
    [
        ("j\u00f6@example.com", "s"),
        ("a\x00b@example.com", "s"),
        ("customer@example.com", "line\u2028break"),
        ("customer@example.com", "tab\x0bhere"),
        ("customer@example.com", "next\x85line"),
    ],
)
def test_what_smtp_or_a_header_cannot_carry_is_refused_before_sending(
    target: str, subject: str
) -> None:
    """Non-ASCII or control characters in the recipient, any line break in the subject."""
    with pytest.raises(ContractViolationError):
        adapter(25).normalize("email.send", target, {"subject": subject, "body": "b"})


def forge(port: int, smtp: SmtpEffect, intent: Intent, *, sender: str, body: str) -> None:
    """Mail the box a message claiming our key's Message-ID and our intent digest."""
    forged = EmailMessage()
    forged["From"] = sender  # a header is text any client writes
    forged["To"] = intent.target
    forged["Subject"] = intent.args["subject"]
    # The key and the intent digest are in the trace, the ledger and `tether inspect`.
    forged["Message-ID"] = message_id("k1", smtp.domain)
    forged[INTENT_HEADER] = intent.digest
    forged.set_content(body)
    with smtplib.SMTP("127.0.0.1", port) as client:
        client.send_message(forged, from_addr="mallory@elsewhere.test")


@pytest.mark.parametrize(
    ("sender", "body", "why"),
    [
        ("mallory@elsewhere.test", "Your order shipped.", "foreign:another sender"),
        (None, "not what the run would have sent", "foreign:another message"),
    ],
)
def test_a_forged_message_with_our_message_id_is_never_our_receipt(
    tmp_path: Path, sender: str | None, body: str, why: str
) -> None:
    """Another sender, or our From header over another body: evidence, never a settled send."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir) as port:
        smtp = adapter(port, maildir)
        intent = notification(smtp)
        forge(port, smtp, intent, sender=sender or smtp.sender, body=body)
        found = smtp.lookup_intent("k1", intent)
    assert found is not None and found.intent_digest == why != intent.digest


def test_with_a_seal_key_only_a_message_this_adapter_sealed_is_a_receipt(tmp_path: Path) -> None:
    """A forgery copying every header and the body lacks the HMAC seal; our own send has it."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir) as port:
        sealed = SmtpEffect(
            "127.0.0.1",
            port,
            sender="desk@shop.test",
            domain="shop.test",
            instance_id="mail-1",
            mailbox_lookup=MaildirLookup(maildir),
            seal_key=b"s" * 32,
        )
        intent = notification(sealed)
        forge(port, sealed, intent, sender=sealed.sender, body=intent.args["body"])
        forged = sealed.lookup_intent("k1", intent)
        assert forged is not None and forged.intent_digest == "foreign:no valid seal"
        receipt = sealed.execute("k2", intent, sealed.environment())
        assert sealed.lookup_intent("k2", intent) == receipt
    with pytest.raises(SmtpConfigError):
        SmtpEffect("h", 25, sender="a@b.c", domain="b.c", instance_id="i", seal_key=b"short")


@pytest.mark.parametrize(
    "body",
    [
        "x" * 5000,  # one long line: sent quoted-printable
        "Dear customer,\n" + "Your order shipped today. " * 60,  # over 1000 bytes
        "a\n.\nb",  # a line that is one dot (dot-stuffing)
        ".hidden\nok",
        "line one\r\nline two\rline three",  # the agent's own line breaks
        "",
        "ends with two\n\n",
    ],
)
def test_a_delivered_email_is_found_as_the_send_it_is(tmp_path: Path, body: str) -> None:
    """Whatever normalize() accepts is delivered intact and the look-up matches it to its intent."""
    maildir = tmp_path / "Maildir"
    with smtp_server(maildir) as port:
        smtp = adapter(port, maildir)
        intent = notification(smtp, body)
        receipt = smtp.execute("k1", intent, smtp.environment())
        found = smtp.lookup_intent("k1", intent)
    assert found == receipt and found.intent_digest == intent.digest


@pytest.mark.parametrize("subject", [" Order 42", "Order 42 ", "=?utf-8?q?hi?="])
def test_a_subject_a_header_would_change_is_refused_before_sending(subject: str) -> None:
    """Surrounding blanks and encoded-word lookalikes would not arrive as written: refused."""
    smtp = SmtpEffect("127.0.0.1", 25, sender="a@b.test", domain="b.test", instance_id="i")
    with pytest.raises(ContractViolationError):
        smtp.normalize("email.send", "customer@example.com", {"subject": subject, "body": "ok"})


class Traced:
    """A user's delegating wrapper (metrics, logging): every attribute is the inner adapter's."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_a_wrapped_mail_adapter_still_checks_what_it_found(tmp_path: Path) -> None:
    """Through a wrapper judged before around another adapter, a forgery still never settles."""
    from tether.adapters import look_up
    from tether.testing import Sandbox

    maildir = tmp_path / "Maildir"
    with smtp_server(maildir) as port:
        smtp = adapter(port, maildir)
        intent = notification(smtp)
        forge(port, smtp, intent, sender=smtp.sender, body="Your refund was declined.")
        look_up(Traced(Sandbox()), "k1", intent)  # a wrapper without lookup_intent, first
        found = look_up(Traced(smtp), "k1", intent)
    assert found is not None and found.intent_digest == "foreign:another message"
