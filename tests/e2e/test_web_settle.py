"""A person settles an unknown outcome in the operator page, in Debian's chromium under Playwright.

The run is real: an email sent through a real SMTP server on loopback that
delivers the message and drops the line before its reply, so the run
freezes with the outcome unknown. The page is `tether serve` as a child
process over the run's SQLite file; the run is driven in this process
after the person signs, and the page is watched refreshing itself.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import _webkit
from tests.e2e._settlekit import BODY, Frozen, frozen
from tests.integration._services import delivered
from tether.core import Phase, new_decision
from tether.crypto import Keyring
from tether.runtime import Checkpointer
from tether.store import SQLiteStore

pytestmark = pytest.mark.skipif(
    _webkit.why_no_browser() is not None, reason=str(_webkit.why_no_browser())
)
if _webkit.why_no_browser() is not None and os.environ.get("TETHER_REQUIRE_BROWSER") == "1":
    raise RuntimeError(f"TETHER_REQUIRE_BROWSER=1 but {_webkit.why_no_browser()}")

TIMEOUT_MS = 20_000
__all__ = ["frozen"]  # the fixture, shared with the CLI's tests


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=shutil.which("chromium"), args=["--no-sandbox"]
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    yield context.new_page()
    context.close()


def test_the_card_shows_the_email_whole_and_landed_signed_in_the_page_settles_it(
    frozen: Frozen, page: Any
) -> None:
    """The card shows action, recipient, the whole body (scrolling), key, when sent and the Message-ID to look for; landed, signed with it, waits, is not offered again, then applies: one message."""
    from playwright.sync_api import expect

    args = ["--key", str(frozen.reviewer_key), "--keyring", str(frozen.keyring)]
    with _webkit.serve(frozen.db, *args) as served:
        page.goto(served.login("/runs/r1"))
        expect(page.locator("#phase")).to_have_text("needs_review")
        case = page.locator("section.case")
        expect(case.locator(".case-action")).to_have_text("a0")
        expect(case.locator(".case-target")).to_have_text("customer@example.com")
        key = case.locator(".case-key").inner_text()
        assert key.startswith("idem-") or len(key) > 8
        expect(case.locator(".case-sent time")).not_to_be_empty()
        shown_args = json.loads(case.locator("pre.case-args").inner_text())
        assert shown_args["body"] == BODY and shown_args["subject"] == "Order 42"  # whole
        scrolls = case.locator("pre.case-args").evaluate("el => el.scrollHeight > el.clientHeight")
        assert scrolls, "a long argument scrolls inside its box"
        hints = case.locator("table.hints")
        expect(hints).to_contain_text("Message-ID")
        (mid,) = delivered(frozen.maildir)
        expect(hints).to_contain_text(mid)  # the case names what the reviewer finds
        # Only the decisions this case takes: no accept, no compensate for an email.
        for decision in ("landed", "not_landed", "replan", "abort"):
            expect(case.locator(f"button.decision-{decision}")).to_have_count(1)
        expect(case.locator("button.decision-accept")).to_have_count(0)
        expect(case.locator("button.decision-compensate")).to_have_count(0)
        # SMTP cannot be asked by key: not_landed stands on the person's word, so warned.
        expect(case.locator(".case-warning")).to_contain_text("is still in flight")
        _webkit.ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(_webkit.ARTIFACTS / "settle-case.png"), full_page=True)

        landed = case.locator("form.decision-form-landed")
        landed.locator("button").click()  # no evidence yet: the browser does not submit it
        expect(page.locator("#phase")).to_have_text("needs_review")
        landed.locator("input[name=evidence]").fill(mid)
        landed.locator("button").click()

        fields = page.locator("#signed-fields")
        expect(fields).to_contain_text("landed")
        expect(fields).to_contain_text(mid)
        context = page.locator("#context-fields")
        whole = context.locator("pre.scroll").filter(has_text='"subject": "Order 42"')
        assert json.loads(whole.inner_text())["body"] == BODY
        page.screenshot(path=str(_webkit.ARTIFACTS / "settle-confirm.png"), full_page=True)
        page.locator("#sign").click()

        expect(page.locator("#done")).to_contain_text("review_decision inbox #1")
        expect(case.locator(".case-signed")).to_contain_text("landed")
        expect(case.locator(".case-signed")).to_contain_text("waiting")
        expect(case.locator("button")).to_have_count(0)  # not offered again while it waits
        page.screenshot(path=str(_webkit.ARTIFACTS / "settle-waiting.png"), full_page=True)

        again = frozen.runtime().recover("r1")
        again.run()
        assert again.state.phase is Phase.COMPLETED
        again.rt.store.close()
        # No reload: the page refreshes itself.
        expect(page.locator("#phase")).to_have_text("completed")
        expect(page.locator("section.case")).to_have_count(0)
        expect(page.locator("#run-inbox tr.inbox-applied")).to_contain_text("rita")
        expect(page.locator("tr.effect-committed")).to_contain_text("review:")
        expect(page.locator("#trace")).to_contain_text("effect_landed_by_review")
    assert delivered(frozen.maildir) == [mid]


def test_a_decision_the_run_refuses_is_shown_refused_and_the_case_offered_again(
    frozen: Frozen, page: Any
) -> None:
    """landed signed without evidence (by hand, past the page): the run refuses it, the card says why and offers the decisions again."""
    from playwright.sync_api import expect

    store = SQLiteStore(frozen.db)
    state = Checkpointer(store, Keyring.from_file(frozen.keyring)).load("r1").state
    now = datetime.now(UTC)
    body = new_decision(
        state,
        state.review_cases[-1],
        "rita",
        "abort",
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    store.put_evidence(
        "r1", "review_decision", frozen.reviewer.sign({**body, "decision": "landed"})
    )
    args = ["--key", str(frozen.reviewer_key), "--keyring", str(frozen.keyring)]
    with _webkit.serve(frozen.db, *args) as served:
        page.goto(served.login("/runs/r1"))
        case = page.locator("section.case")
        expect(case.locator(".case-signed")).to_contain_text("waiting")
        expect(case.locator("button")).to_have_count(0)
        again = frozen.runtime().recover("r1")
        again.run()
        assert again.state.phase is Phase.NEEDS_REVIEW
        again.rt.store.close()
        expect(case.locator(".case-refused")).to_contain_text("DecisionRefusedError")
        expect(case.locator("button.decision-landed")).to_have_count(1)
    store.close()
    assert len(delivered(frozen.maildir)) == 1


def test_an_approval_signed_in_the_page_waits_and_is_not_offered_again(
    tmp_path: Path, page: Any
) -> None:
    """After signing, the pending card shows the approval waiting (not "None yet") and no second Approve; applied, the run completes."""
    from playwright.sync_api import expect

    paths = _webkit.approval_run(tmp_path)
    keys = ["--key", str(paths.signer_key("approver")), "--keyring", str(paths.keyring)]
    with _webkit.serve(paths.db, *keys) as served:
        page.goto(served.login("/runs/demo-run"))
        expect(page.locator("#no-approval")).to_have_text("None yet.")
        page.locator("#approve").click()
        page.locator("#sign").click()
        expect(page.locator("#done")).to_contain_text("approval inbox #1")
        expect(page.locator("#approval-signed")).to_contain_text("demo-approver")
        expect(page.locator("#approval-signed")).to_contain_text("waiting")
        expect(page.locator("#no-approval")).to_have_count(0)
        expect(page.locator("#approve")).to_have_count(0)
        worked = _webkit.worker(paths)
        assert worked.returncode == 0, worked.stderr
        expect(page.locator("#phase")).to_have_text("completed")
