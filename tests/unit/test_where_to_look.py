"""Where a person looks for a write tether cannot settle: each adapter's hints, routed and bounded."""

from __future__ import annotations

from typing import Any

from tether.adapters import Adapters, FunctionEffect, HttpEffect, SmtpEffect, where_to_look
from tether.adapters._base import HINT_TEXT_MAX, HINTS_MAX
from tether.core import Intent
from tether.testing import Sandbox


def notify(to: str, text: str) -> dict[str, Any]:
    """A tool whose body would call a chat service."""
    return {"id": "m1"}


def test_a_function_effect_names_itself_and_the_key_its_body_was_given() -> None:
    """The hint names the function (module and name) and the key, routed by kind through Adapters."""
    fn = FunctionEffect("chat.notify", notify)
    both = Adapters(Sandbox(namespace="files"), fn)
    intent = Intent("chat.notify", "ops", {"text": "hi"}, "low")
    hints = where_to_look(both, "idem-7", intent)
    assert hints["function"].endswith("test_where_to_look.notify")
    assert hints["key"] == "idem-7" and "current_key" in hints["how"]


def test_smtp_and_http_name_what_to_search_for() -> None:
    """SMTP: the Message-ID the key maps to, recipient and subject; HTTP: the URL and the key header."""
    smtp = SmtpEffect("127.0.0.1", 2525, sender="a@shop.test", domain="shop.test", instance_id="m")
    mail = Intent("email.send", "c@example.com", {"subject": "Order 42", "body": "b"}, "low")
    hints = smtp.where_to_look("idem-1", mail)
    assert hints["Message-ID"].endswith("@shop.test>") and hints["subject"] == "Order 42"
    assert hints["recipient"] == "c@example.com" and "mailbox" not in hints
    with HttpEffect("http://127.0.0.1:9") as http:
        post = Intent("http.post", "tickets", {"json": {"title": "t"}}, "low")
        shown = http.where_to_look("idem-2", post)
    assert shown["request"] == "POST http://127.0.0.1:9/tickets"
    assert shown["Idempotency-Key header"] == '"idem-2"'


class Loud(Sandbox):
    """A sandbox whose hints are too many, too long, or fail."""

    fail = False

    def where_to_look(self, key: str, intent: Intent) -> dict[str, str]:
        if self.fail:
            raise RuntimeError("the hint hook broke")
        return {f"label {n}": "x" * (HINT_TEXT_MAX * 2) for n in range(HINTS_MAX * 2)}


def test_hints_are_bounded_and_a_failing_hook_gives_none() -> None:
    """At most HINTS_MAX hints, each text cut to HINT_TEXT_MAX; a hook that raises yields {}, an adapter without one {}."""
    loud = Loud()
    intent = Intent("file.write", "a.txt", {"content": "x"}, "low")
    hints = where_to_look(loud, "k", intent)
    assert len(hints) == HINTS_MAX and all(len(v) == HINT_TEXT_MAX for v in hints.values())
    loud.fail = True
    assert where_to_look(loud, "k", intent) == {}
    assert where_to_look(Sandbox(), "k", intent) == {}
