"""SmtpEffect: an email that can be sent once and never taken back.

SMTP has no idempotency keys and no way to ask whether a message was
accepted. The key becomes the ``Message-ID`` (so a mailbox can be searched
for it), the intent digest and send time travel in headers, and the send is
taken apart so the one uncertain moment is known: everything up to the end
of ``DATA`` either fails cleanly (nothing was accepted: a refusal) or not at
all; a connection lost or a timeout while waiting for the final reply to
``DATA`` is an unknown outcome. The runtime then cannot resend: SmtpEffect
is neither idempotent nor, by default, queryable, so an uncertain send goes
to review.

Given a :class:`MaildirLookup` (a mailbox the recipient side delivers into,
as a test server or a journaling mailbox does), the adapter becomes
queryable: a look-up by ``Message-ID`` reconciles a landed send. A message
not (yet) found proves nothing (mail can be queued), so absence is never
final and an unfound uncertain send still goes to review.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import mailbox
import re
import smtplib
from collections.abc import Callable
from datetime import UTC, datetime
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

from tether.adapters._base import Fence
from tether.adapters._errors import NotQueryableError, RequestRefusedError
from tether.adapters._remote import RemoteEffect
from tether.core import (
    ActionClass,
    ActionKind,
    AdapterError,
    AdapterUnavailableError,
    Capabilities,
    Compensation,
    ContractViolationError,
    EnvironmentState,
    Intent,
    Receipt,
    TargetKind,
    Targets,
    format_time,
)

ADAPTER_VERSION = "1"
# A sent email cannot be recalled: only a person can make amends.
EMAIL_SEND = ActionKind(
    "email.send",
    ActionClass.WRITE,
    TargetKind.PATH,
    frozenset({"subject", "body"}),
    compensation=Compensation.HUMAN,
)
INTENT_HEADER = "X-Tether-Intent"
SENT_HEADER = "X-Tether-Sent-At"
SEAL_HEADER = "X-Tether-Seal"
_MAX_BODY = 1_000_000


class SmtpConfigError(AdapterError):
    """SmtpEffect was configured in a way that cannot send or be identified."""


def message_id(key: str, domain: str) -> str:
    """The ``Message-ID`` a key maps to: stable, and free of anything a header cannot carry."""
    return f"<tether-{hashlib.sha256(key.encode()).hexdigest()[:40]}@{domain}>"


class MaildirLookup:
    """Find a delivered message by ``Message-ID`` in a Maildir (``new`` and ``cur``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def find(self, wanted: str) -> EmailMessage | None:
        """The delivered message with ``Message-ID`` ``wanted``, or ``None``."""
        try:
            box = mailbox.Maildir(self.path, create=False)
            keys = list(box.keys())
        except OSError as exc:
            raise AdapterUnavailableError(f"mailbox {self.path} cannot be read: {exc}") from exc
        for key in keys:
            try:
                raw = box.get_bytes(key)
            except (OSError, KeyError):
                continue  # moved between listing and reading: it is listed again later
            message = message_from_bytes(raw, policy=default_policy)
            if str(message.get("Message-ID", "")).strip() == wanted:
                return message
        return None


class SmtpEffect(RemoteEffect):
    """An adapter sending ``email.send`` actions through one SMTP server."""

    ADAPTER_VERSION = ADAPTER_VERSION

    def __init__(
        self,
        host: str,
        port: int,
        *,
        sender: str,
        domain: str,
        instance_id: str,
        mailbox_lookup: MaildirLookup | None = None,
        seal_key: bytes | None = None,
        timeout_s: float = 30.0,
        namespace: str = "smtp",
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if not host or not 0 < int(port) < 65536:
            raise SmtpConfigError("host must be named and port within 1-65535")
        if not _is_address(sender):
            raise SmtpConfigError(f"sender {sender!r} is not an email address")
        if not domain or any(c in domain for c in "<>@ \r\n"):
            raise SmtpConfigError(f"domain {domain!r} cannot name Message-IDs")
        if not instance_id:
            raise SmtpConfigError("instance_id must name the mail system (it binds the run)")
        if not 0 < timeout_s <= 3600:
            raise SmtpConfigError("timeout_s must be positive and at most an hour")
        if seal_key is not None and (not isinstance(seal_key, bytes) or len(seal_key) < 16):
            raise SmtpConfigError("seal_key must be at least 16 bytes")
        self.host, self.port, self.sender, self.domain = host, int(port), sender, domain
        self._namespace = namespace
        self._kind = EMAIL_SEND
        self._instance = f"smtp://{host}:{port}/{domain}#{instance_id}"
        self._lookup = mailbox_lookup
        self._seal_key = seal_key
        self._timeout = timeout_s
        self._clock = clock or (lambda: datetime.now(UTC))
        self._capabilities = Capabilities(
            idempotent=False,
            queryable=mailbox_lookup is not None,
            conditional_writes=False,
            absent_is_final=False,
            stateful=False,
            # Each send delivers a message of its own: the same mail again after
            # another (A, B, A) is the first one, replayed, never a second copy.
            targets=Targets.COLLECTION,
        )

    # --- identity -----------------------------------------------------

    @property
    def instance_id(self) -> str:
        """Server, mail domain and the configured instance id of the mail system."""
        return self._instance

    # --- sending ------------------------------------------------------

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """``{"subject": one line, "body": text}``; the target is one recipient address."""
        self._check_kind(kind)
        if not _is_address(target):
            raise ContractViolationError("bad_target", f"{target!r} is not one email address")
        subject, body = args.get("subject"), args.get("body")
        if set(args) != {"subject", "body"} or not isinstance(subject, str):
            raise ContractViolationError("bad_args", "email.send takes subject and body only")
        if not isinstance(body, str) or len(body) > _MAX_BODY:
            raise ContractViolationError("bad_args", f"body must be text up to {_MAX_BODY} chars")
        # isprintable() is false for every line break str.splitlines knows (\u2028,
        # \x85, \x1c...) and every control character: no header injection, and
        # nothing the email library refuses after the connection is open.
        if not subject.isprintable() or len(subject) > 998:
            raise ContractViolationError("bad_args", "subject must be one printable line")
        # What a header cannot carry as written (the parser drops surrounding
        # blanks and decodes encoded words): refused, so the delivered subject
        # is the one proposed and a mailbox look-up can recognise it.
        if subject != subject.strip() or "=?" in subject:
            raise ContractViolationError(
                "bad_args", "subject must not start or end with blanks or contain '=?'"
            )
        # Line breaks travel as CRLF whatever the agent wrote: one form, one digest.
        body = body.replace("\r\n", "\n").replace("\r", "\n")
        return {"subject": subject, "body": body}

    def effect_identity(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """Subject and body (the recipient is the target): not the Message-ID, the date or
        the intent header, which name one attempt (they come from its key and clock)."""
        return {"subject": args.get("subject"), "body": args.get("body")}

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        """Send once. Clean failures before ``DATA`` completes are refusals; after, unknown."""
        self._check_send(key, intent, prestate)
        mid = message_id(key, self.domain)
        sent_at = format_time(self._clock())
        try:  # built whole before connecting: a message that cannot be built sends nothing
            message = EmailMessage()
            message["From"] = self.sender
            message["To"] = intent.target
            message["Subject"] = intent.args["subject"]
            message["Message-ID"] = mid
            message[INTENT_HEADER] = intent.digest
            message[SENT_HEADER] = sent_at
            if self._seal_key is not None:
                message[SEAL_HEADER] = self._seal(mid, intent.digest)
            message.set_content(intent.args["body"])
            # SMTP lines end in CRLF: smtplib converts a str but not bytes, and a
            # bare LF makes the whole message one over-long line (or is refused).
            raw = message.as_bytes(policy=message.policy.clone(linesep="\r\n"))
        except (ValueError, TypeError, UnicodeError) as exc:
            raise ContractViolationError("bad_args", f"the message cannot be built: {exc}") from exc
        try:
            client = smtplib.SMTP(self.host, self.port, timeout=self._timeout)
        except OSError as exc:
            raise RequestRefusedError(intent.target, 0, f"cannot connect: {exc}") from exc
        try:
            self._envelope(client, intent.target)
            try:
                code, reply = client.data(raw)
            except smtplib.SMTPDataError as exc:
                raise RequestRefusedError(
                    intent.target, exc.smtp_code, str(exc.smtp_error)
                ) from exc
            except (OSError, smtplib.SMTPServerDisconnected, smtplib.SMTPResponseException) as exc:
                # The message may be in the server's hands: only its final reply was lost.
                raise AdapterUnavailableError(
                    f"the send of {mid} to {intent.target} lost its final reply "
                    f"({type(exc).__name__}: {exc}); the outcome is unknown"
                ) from exc
        finally:
            try:
                client.quit()
            except (OSError, smtplib.SMTPException):
                client.close()
        if 400 <= code < 600:
            # A final reply that refuses the message means the server did not take it.
            raise RequestRefusedError(intent.target, code, reply.decode("utf-8", "replace"))
        if code != 250:
            raise AdapterUnavailableError(f"DATA for {mid} answered {code} {reply!r}: unknown")
        return self._receipt(key, intent.digest, mid, intent.target, sent_at)

    def _envelope(self, client: smtplib.SMTP, recipient: str) -> None:
        """EHLO, MAIL, RCPT: any failure here means nothing was accepted."""
        try:
            client.ehlo()
            code, reply = client.mail(self.sender)
            if code != 250:
                raise RequestRefusedError(recipient, code, reply.decode("utf-8", "replace"))
            code, reply = client.rcpt(recipient)
            if code not in (250, 251):
                raise RequestRefusedError(recipient, code, reply.decode("utf-8", "replace"))
        except (OSError, smtplib.SMTPException) as exc:
            raise RequestRefusedError(recipient, 0, f"{type(exc).__name__}: {exc}") from exc

    def _receipt(self, key: str, intent_digest: str, mid: str, to: str, sent_at: str) -> Receipt:
        """Built from what the message itself carries, so a mailbox look-up rebuilds it."""
        return Receipt(
            namespace=self._namespace,
            adapter_version=ADAPTER_VERSION,
            receipt_id=mid,
            idempotency_key=key,
            intent_digest=intent_digest,
            result={"message_id": mid, "to": to},
            business_object_id=mid,
            committed_at=sent_at,
            post_state=self.environment(),
        )

    def where_to_look(self, key: str, intent: Intent) -> dict[str, str]:
        """Where a person finds the message ``key`` sent: its Message-ID, the server, the mailbox."""
        hints = {
            "Message-ID": message_id(key, self.domain),
            "recipient": intent.target,
            "subject": str(intent.args.get("subject", "")),
            "server": f"smtp://{self.host}:{self.port} (sender {self.sender})",
        }
        if isinstance(self._lookup, MaildirLookup):
            hints["mailbox"] = str(self._lookup.path)
        hints["how"] = (
            "search the recipient's mailbox (or the server's delivery log) for that "
            "Message-ID: found, sign landed with it; not there, sign not_landed"
        )
        return hints

    # --- asking the mailbox -------------------------------------------

    def lookup(self, key: str) -> Receipt | None:
        """The delivered message sent under ``key``, from the mailbox; ``None`` if not found.

        Headers are text any sender writes: a message not from this adapter's
        sender, or (with a ``seal_key``) without a valid seal over its
        Message-ID and intent, gets a receipt no intent matches.
        """
        return self._look_up(key, None)

    def lookup_intent(self, key: str, intent: Intent) -> Receipt | None:
        """As :meth:`lookup`, and the message must also carry ``intent`` itself:
        its recipient, subject and body, not only the intent digest header.

        The subject is compared as the mail system stores it: a long one is
        folded over lines on the way, and is unfolded on both sides first.
        """
        return self._look_up(key, intent)

    def _look_up(self, key: str, intent: Intent | None) -> Receipt | None:
        if self._lookup is None:
            raise NotQueryableError(f"{self._instance} has no mailbox to search")
        mid = message_id(key, self.domain)
        found = self._lookup.find(mid)
        if found is None:
            return None
        claimed = str(found.get(INTENT_HEADER, "")).strip()
        to = str(found.get("To", "")).strip()
        problem = self._foreign(found, mid, claimed, to, intent)
        return self._receipt(
            key,
            claimed if problem is None else f"foreign:{problem}",
            mid,
            to,
            str(found.get(SENT_HEADER, "")).strip(),
        )

    def _foreign(
        self, found: EmailMessage, mid: str, claimed: str, to: str, intent: Intent | None
    ) -> str | None:
        """Why the found message is not one this adapter sent for ``intent`` (``None``: it is)."""
        if str(found.get("From", "")).strip() != self.sender:
            return "another sender"
        if self._seal_key is not None:
            seal = str(found.get(SEAL_HEADER, "")).strip()
            if not hmac.compare_digest(seal, self._seal(mid, claimed)):
                return "no valid seal"
        if intent is None:
            return None
        if claimed != intent.digest or to != intent.target:
            return "another intent"
        try:
            body = found.get_content() if found.get_content_type() == "text/plain" else None
        except (KeyError, LookupError, ValueError):
            body = None
        stored = _unfolded(str(found.get("Subject", "")))
        if stored != _as_stored(str(intent.args.get("subject"))) or not isinstance(body, str):
            return "another message"
        sent = str(intent.args.get("body", ""))
        # set_content ends the body with exactly one added line break, if it lacks one.
        if body != (sent if sent.endswith("\n") else sent + "\n"):
            return "another message"
        return None

    def _seal(self, mid: str, intent_digest: str) -> str:
        key = self._seal_key or b""
        return hmac.new(key, f"{mid}\n{intent_digest}".encode(), hashlib.sha256).hexdigest()


def _unfolded(text: str) -> str:
    """A header's unstructured value as RFC 5322 reads it: folds removed, no edge blanks.

    Unfolding drops each line break that precedes a blank; a fold right after
    the field name leaves that blank at the front, where it is no part of
    the value (and a proposed subject never starts or ends with one).
    """
    return re.sub(r"\r?\n(?=[ \t])", "", text).replace("\r", "").replace("\n", "").strip(" \t")


@functools.lru_cache(maxsize=256)
def _as_stored(subject: str) -> str:
    """``subject`` as the mail system stores it and a look-up reads it back, unfolded.

    Rendered as :meth:`SmtpEffect.execute` renders it (folded at 78
    characters, non-ASCII as encoded words) and parsed back as the look-up
    parses a delivered message: the form the mailbox holds, whatever the
    folding did to it.
    """
    probe = EmailMessage()
    probe["Subject"] = subject
    raw = probe.as_bytes(policy=probe.policy.clone(linesep="\r\n"))
    return _unfolded(str(message_from_bytes(raw, policy=default_policy).get("Subject", "")))


def _is_address(text: str) -> bool:
    """One plain ASCII address: no SMTPUTF8, no control characters, nothing a header splits."""
    if not isinstance(text, str) or len(text) > 254 or text.count("@") != 1:
        return False
    if not text.isascii() or not text.isprintable():
        return False
    local, _, domain = text.partition("@")
    bad = set(' <>,;:"()[]\\')
    return bool(local) and "." in domain and not (bad & set(text))
