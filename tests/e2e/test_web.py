"""The operator page (`tether serve`) driven in a real browser: Debian's chromium under Playwright.

One browser for the module; each test starts its own `tether serve` child
over a real SQLite store holding a demo run, and a fresh browser context.
Screenshots (the approval's signed fields, the approved run, a review case)
are kept in tests/e2e/artifacts/ (ignored by git).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import _webkit
from tether.store import SQLiteStore

pytestmark = pytest.mark.skipif(
    _webkit.why_no_browser() is not None, reason=str(_webkit.why_no_browser())
)
# CI installs chromium and sets this, so a missing browser fails there instead of skipping.
if _webkit.why_no_browser() is not None and os.environ.get("TETHER_REQUIRE_BROWSER") == "1":
    raise RuntimeError(f"TETHER_REQUIRE_BROWSER=1 but {_webkit.why_no_browser()}")

TIMEOUT_MS = 20_000


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


def inbox_of(db: Path) -> list[Any]:
    store = SQLiteStore(db, read_only=True)
    try:
        return store.evidence("demo-run")
    finally:
        store.close()


def test_approval_in_the_page_lets_a_worker_write_once_and_the_page_shows_it(
    tmp_path: Path, page: Any
) -> None:
    """A run waiting for approval is approved in the page, a worker completes it, the page shows the write."""
    from playwright.sync_api import expect

    paths = _webkit.approval_run(tmp_path)
    keys = ["--key", str(paths.signer_key("approver"))]
    trusted = [
        "--keyring",
        str(paths.keyring),
        "--trust",
        str(paths.trust),
        "--policy",
        str(paths.policy),
    ]
    with _webkit.serve(paths.db, *keys, *trusted) as served:
        page.goto(served.login())
        assert "token=" not in page.url  # the token left the address bar once the session opened
        row = page.locator("tr[data-run='demo-run']")
        expect(row).to_contain_text("needs a person")
        expect(row).to_contain_text("an approval of fix-calc")
        row.get_by_role("link", name="demo-run").click()
        expect(page.locator("#phase")).to_have_text("pending")
        key = page.locator("#pending-key").inner_text()
        page.locator("#approve").click()

        fields = page.locator("#signed-fields")
        expect(fields).to_contain_text("approver_id")
        shown = dict(
            zip(
                fields.locator("th").all_inner_texts(),
                fields.locator("td").all_inner_texts(),
                strict=True,
            )
        )
        assert shown["idempotency_key"] == key and shown["action_id"] == "fix-calc"
        assert shown["approver_id"] == "demo-approver"
        _webkit.ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(_webkit.ARTIFACTS / "approval-fields.png"), full_page=True)
        page.locator("#sign").click()
        expect(page.locator("#done")).to_contain_text("approval inbox #1")
        # The delivered approval waits in the inbox with a live countdown to its expiry.
        countdown = page.locator("#run-inbox tr.inbox-waiting .countdown")
        expect(countdown).to_contain_text(re.compile(r"1[45] min \d+ s left"))

        (delivered,) = inbox_of(paths.db)
        # The signed body is exactly what the page showed.
        assert delivered.kind == "approval"
        assert {k: str(v) for k, v in delivered.document["body"].items()} == shown

        worked = _webkit.worker(paths)
        assert worked.returncode == 0, worked.stderr
        assert json.loads(worked.stdout)["completed"] == 1

        # No reload: the page refreshes itself.
        expect(page.locator("#phase")).to_have_text("completed")
        expect(page.locator("#last-write")).to_contain_text("fix-calc: receipt")
        expect(page.locator("tr.effect-committed")).to_contain_text("calc.py")
        expect(page.locator("#run-inbox tr.inbox-applied")).to_contain_text("demo-approver")
        expect(page.locator("#verified")).to_contain_text("verified under the keyring")
        _webkit.ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(_webkit.ARTIFACTS / "run-approved.png"), full_page=True)
        html = page.content()
    with _demo_workspace(paths) as ws:
        assert ws.write_count() == 1
    private = json.loads(paths.signer_key("approver").read_text())["private_key"]
    assert private not in html and served.token not in html


def _demo_workspace(paths: Any) -> Any:
    from tether import _demo

    return _demo.workspace(paths)


def test_a_review_decision_signed_in_the_page_unfreezes_the_run(tmp_path: Path, page: Any) -> None:
    """A run frozen by same key / different intent shows both intents, and a replan signed in the page lets it finish."""
    from playwright.sync_api import expect

    paths = _webkit.conflict_run(tmp_path)
    args = ["--key", str(paths.signer_key("reviewer")), "--keyring", str(paths.keyring)]
    with _webkit.serve(paths.db, *args) as served:
        page.goto(served.login("/runs/demo-run"))
        expect(page.locator("#phase")).to_have_text("needs_review")
        case = page.locator("section.case")
        expect(case).to_contain_text("The write in question")
        expect(case).to_contain_text("sha256:c0ffee")  # the receipt's other intent, side by side
        _webkit.ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(_webkit.ARTIFACTS / "review-case.png"), full_page=True)
        case.locator("button.decision-replan").click()
        shown = page.locator("#signed-fields")
        expect(shown).to_contain_text("receipt_fingerprint")
        expect(shown).to_contain_text("replan")
        page.locator("#sign").click()
        expect(page.locator("#done")).to_contain_text("review_decision inbox #1")
        expect(page.locator("#run-inbox tr.inbox-waiting")).to_contain_text("review_decision")

        _webkit.recover(paths)
        expect(page.locator("#phase")).to_have_text("completed")
        expect(page.locator("#run-inbox tr.inbox-applied")).to_contain_text("demo-reviewer")
        expect(page.locator("#trace")).to_contain_text("review_sealed")


def test_without_the_token_the_page_answers_401_or_403_and_shows_no_data(
    tmp_path: Path, page: Any
) -> None:
    """No token is 401, a wrong token or a forged cookie is 403, and none of those answers names the run."""
    paths = _webkit.approval_run(tmp_path)
    with _webkit.serve(paths.db, "--key", str(paths.signer_key("approver"))) as served:
        for path, status in (("/runs", 401), ("/runs/demo-run", 401), ("/inbox", 401)):
            response = page.goto(served.base + path)
            assert response.status == status
            assert "demo-run" not in page.content()
        # One character changed: always another token (appending "x" after dropping
        # the last one was the same token whenever it ended in "x", 1 run in 64).
        wrong = served.token[:-1] + ("y" if served.token.endswith("x") else "x")
        response = page.goto(f"{served.base}/runs/demo-run?token={wrong}")
        assert response.status == 403 and "demo-run" not in page.content()
        page.context.add_cookies(
            [{"name": "tether_session", "value": "abc.def", "url": served.base}]
        )
        response = page.goto(served.base + "/runs/demo-run")
        assert response.status == 403 and "demo-run" not in page.content()
        response = page.goto(served.login())
        assert response.status == 200 and "demo-run" in page.content()


class _Attacker(BaseHTTPRequestHandler):
    """Another site: its page posts a form to the operator page as soon as it loads."""

    target = ""

    def do_GET(self) -> None:
        body = (
            f'<form id="f" method="post" action="{self.target}">'
            '<input name="action" value="approve"><input name="action_id" value="fix-calc">'
            '<input name="csrf" value="guessed"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_cross_site_posts_and_forged_csrf_tokens_are_refused(tmp_path: Path, page: Any) -> None:
    """A logged-in browser tricked by another site, or a POST without the session's CSRF token, signs nothing."""
    paths = _webkit.approval_run(tmp_path)
    with _webkit.serve(paths.db, "--key", str(paths.signer_key("approver"))) as served:
        page.goto(served.login())
        target = f"{served.base}/runs/demo-run/prepare"
        for csrf in (None, "guessed"):
            form = {"action": "approve", "action_id": "fix-calc"}
            if csrf is not None:
                form["csrf"] = csrf
            refused = page.request.post(target, form=form)
            assert refused.status == 403 and "CSRF" in refused.text()
        foreign = page.request.post(
            target, form={"action": "approve"}, headers={"Origin": "http://evil.example"}
        )
        assert foreign.status == 403

        _Attacker.target = target
        other = ThreadingHTTPServer(("127.0.0.1", 0), _Attacker)
        thread = threading.Thread(target=other.serve_forever, daemon=True)
        thread.start()
        try:
            with page.expect_response(target) as answer:
                page.goto(f"http://localhost:{other.server_address[1]}/")
            assert answer.value.status in {401, 403}
        finally:
            other.shutdown()
            other.server_close()
    assert inbox_of(paths.db) == []


def test_without_a_key_the_page_is_read_only(tmp_path: Path, page: Any) -> None:
    """Started without --key, the page has no forms and refuses any POST."""
    paths = _webkit.approval_run(tmp_path)
    with _webkit.serve(paths.db) as served:
        page.goto(served.login("/runs/demo-run"))
        assert page.locator("#mode").inner_text() == "read-only"
        assert page.locator("form[method=post]").count() == 0
        assert "fix-calc" in page.locator("#pending").inner_text()
        refused = page.request.post(
            f"{served.base}/runs/demo-run/prepare", form={"action": "approve", "csrf": "x"}
        )
        assert refused.status == 403 and "read-only" in refused.text()
    assert inbox_of(paths.db) == []
