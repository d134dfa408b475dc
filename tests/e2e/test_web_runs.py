"""The page's runs list is paged and refreshes only what changed: over HTTP, and in a browser.

The runs are committed by the real runtime into a real SQLite file; the app
runs in-process for the HTTP checks and as a `tether serve` child under
Debian's chromium for the browser's.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tests.e2e import _webkit

pytest.importorskip("starlette.testclient", reason="the web extra is not installed")
pytest.importorskip("jinja2", reason="the web extra is not installed")

from starlette.testclient import TestClient

from tether.web import WebConfig, create_app

TOKEN = "t" * 32
GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


def _runs(world: World, count: int) -> list[str]:
    """``count`` runs by the real runtime; the first waits for an approval of its write."""
    guarded = world.runtime(
        ScriptedAgent([write("notes.txt", "v1\n", action_id="w1"), finish]),
        policy=make_policy(kinds=GUARDED),
    )
    guarded.start("run-00").step()
    plain = world.runtime(ScriptedAgent([finish]))
    ids = [f"run-{i:02d}" for i in range(count)]
    for run_id in ids[1:]:
        plain.start(run_id)
    return ids


def _client(world: World, **config: Any) -> TestClient:
    app = create_app(WebConfig(store=str(world.db), token=TOKEN, hosts=("testserver",), **config))
    c = TestClient(app)
    c.get(f"/runs?token={TOKEN}")
    return c


def _listed(html: str) -> list[str]:
    return re.findall(r'data-run="([^"]+)"', html)


def _link(html: str, name: str) -> str | None:
    found = re.search(rf'id="{name}" href="([^"]+)"', html)
    return None if found is None else found.group(1).replace("&amp;", "&")


def test_the_runs_list_pages_by_run_id_with_links_that_keep_the_filters(world: World) -> None:
    """?limit cuts pages; Next page follows them to the end, each run once; First page goes back."""
    ids = _runs(world, 7)
    c = _client(world)
    seen: list[str] = []
    url: str | None = "/runs?limit=3"
    pages = 0
    while url is not None:
        html = c.get(url).text
        seen += _listed(html)
        url = _link(html, "next-page")
        pages += 1
        if pages > 1:
            assert _link(html, "first-page") == "/runs?limit=3"
    assert seen == ids and pages == 3
    needing = c.get("/runs?needs=1&limit=3").text
    assert _listed(needing) == ["run-00"] and _link(needing, "next-page") is None
    assert 'id="needs-filter" checked' in needing
    pending = c.get("/runs?phase=running&limit=2").text
    assert _listed(pending) == ["run-01", "run-02"]
    assert _link(pending, "next-page") == "/runs?phase=running&limit=2&after=run-02"


def test_a_refresh_of_an_unchanged_list_is_answered_304_and_a_change_is_not(
    world: World,
) -> None:
    """The page's ETag comes back as 304 while nothing it shows moved; a new run makes a new page."""
    _runs(world, 3)
    c = _client(world, keyring=world.keyring)
    first = c.get("/runs")
    tag = first.headers["etag"]
    assert f'data-etag="{tag}"' in first.text.replace("&#34;", '"')
    again = c.get("/runs", headers={"If-None-Match": tag})
    assert again.status_code == 304 and again.text == ""
    other_page = c.get("/runs?limit=1", headers={"If-None-Match": tag})
    assert other_page.status_code == 200  # another page is another version
    world.runtime(ScriptedAgent([finish])).start("run-new")
    moved = c.get("/runs", headers={"If-None-Match": tag})
    assert moved.status_code == 200 and "run-new" in _listed(moved.text)
    assert moved.headers["etag"] != tag
    stranger = TestClient(c.app)
    stranger.get(f"/runs?token={TOKEN}")  # another session: another CSRF token in its page
    assert (
        stranger.get("/runs", headers={"If-None-Match": moved.headers["etag"]}).status_code == 200
    )


# -- in a browser ------------------------------------------------------------------------

browser_needed = pytest.mark.skipif(
    _webkit.why_no_browser() is not None, reason=str(_webkit.why_no_browser())
)
if _webkit.why_no_browser() is not None and os.environ.get("TETHER_REQUIRE_BROWSER") == "1":
    raise RuntimeError(f"TETHER_REQUIRE_BROWSER=1 but {_webkit.why_no_browser()}")


@pytest.fixture
def page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=shutil.which("chromium"), args=["--no-sandbox"]
        )
        context = chromium.new_context()
        context.set_default_timeout(20_000)
        yield context.new_page()
        context.close()
        chromium.close()


@browser_needed
def test_in_a_browser_next_and_first_page_walk_the_list_and_the_refresh_sends_nothing_new(
    world: World, page: Any
) -> None:
    """Clicking Next page walks every run once; the quiet refresh gets 304s and leaves the rows."""
    from playwright.sync_api import expect

    ids = _runs(world, 5)
    with _webkit.serve(world.db) as served:
        statuses: list[int] = []
        page.on(
            "response",
            lambda r: statuses.append(r.status) if "/runs?limit=2" in r.url else None,
        )
        page.goto(served.login("/runs") + "&limit=2")
        page.goto(served.base + "/runs?limit=2")
        rows = page.locator("tr[data-run]")
        expect(rows).to_have_count(2)
        seen = [rows.nth(i).get_attribute("data-run") for i in range(2)]
        while page.locator("#next-page").count():
            page.click("#next-page")
            expect(page.locator("#first-page")).to_be_visible()
            rows = page.locator("tr[data-run]")
            seen += [rows.nth(i).get_attribute("data-run") for i in range(rows.count())]
        assert seen == ids
        page.click("#first-page")
        expect(page.locator("tr[data-run]").first).to_have_attribute("data-run", "run-00")
        # The page refreshes itself every 3 s: unchanged, the server answers 304.
        page.wait_for_timeout(3500)
        assert 304 in statuses, statuses
        expect(page.locator("tr[data-run]")).to_have_count(2)
