"""Run ids with any characters on the page: listed, linked, opened and signed for.

A run id is whatever the application chose: a ``/``, a ``%``, a ``?``, a
``#``, spaces, letters beyond ASCII, even ``..``. The runs are committed by
the real runtime into a real SQLite file; the page runs in-process for the
HTTP checks and as a `tether serve` child under Debian's chromium for the
browser's.
"""

from __future__ import annotations

import html
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tests.e2e import _webkit

pytest.importorskip("starlette.testclient", reason="the web extra is not installed")
pytest.importorskip("jinja2", reason="the web extra is not installed")

from starlette.testclient import TestClient

from tether.crypto import Signer, TrustRoots
from tether.runtime import open_run
from tether.web import WebConfig, create_app

TOKEN = "t" * 32
GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}
#: The run waiting for an approval, and the others (each only started).
WAITING = "team/alpha"
ODD = ["50% done?#1", "ünï code", "a/prepare", "..", ".", "x/../y", "in side  spaces"]
APPROVER = Signer.generate("amy", "approver")


def _runs(world: World) -> list[str]:
    """WAITING (its write waits for amy's approval) and the ODD ids, by the real runtime."""
    trust = TrustRoots.of(APPROVER.trust_root())
    guarded = world.runtime(
        ScriptedAgent([write("notes.txt", "v1\n", action_id="w1"), finish]),
        policy=make_policy(kinds=GUARDED),
        trust=trust,
    )
    guarded.start(WAITING).step()
    plain = world.runtime(ScriptedAgent([finish]), trust=trust)
    for run_id in ODD:
        plain.start(run_id)
    return sorted([WAITING, *ODD])


def _client(world: World) -> TestClient:
    app = create_app(
        WebConfig(store=str(world.db), token=TOKEN, hosts=("testserver",), signers=(APPROVER,))
    )
    c = TestClient(app)
    c.get(f"/runs?token={TOKEN}")
    return c


def _heading(page: str) -> str:
    found = re.search(r"<h1>Run <code>([^<]*)</code>", page)
    assert found is not None, page[:400]
    return html.unescape(found.group(1))


def test_every_run_id_is_listed_with_a_link_that_opens_its_own_page(world: World) -> None:
    """Each odd run id's link on /runs (percent-encoded, or ?id= for . and ..) opens that run."""
    ids = _runs(world)
    c = _client(world)
    listing = c.get("/runs").text
    links = {
        html.unescape(run_id): html.unescape(href)
        for href, run_id in re.findall(r'<td><a href="([^"]+)">([^<]*)</a>', listing)
    }
    assert sorted(links) == ids
    assert links[WAITING] == "/runs/team%2Falpha"
    assert links[".."] == "/run?id=.." and links["."] == "/run?id=."
    for run_id, href in links.items():
        page = c.get(href)
        assert page.status_code == 200, (run_id, href)
        assert _heading(page.text) == run_id


def test_a_run_id_with_a_slash_is_approved_from_its_page(world: World) -> None:
    """The form of team/alpha posts to its own encoded path; the signed approval lands in its inbox."""
    _runs(world)
    c = _client(world)
    page = c.get("/runs/team%2Falpha").text
    assert 'action="/runs/team%2Falpha/prepare"' in page
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    seen = re.search(r'name="seen" value="(\d+)"', page)
    assert csrf is not None and seen is not None
    form = {"csrf": csrf.group(1), "seen": seen.group(1), "action": "approve", "action_id": "w1"}
    shown = c.post("/runs/team%2Falpha/prepare", data=form)
    assert shown.status_code == 200, shown.text
    draft = re.search(r'name="prepared" value="([^"]+)"', shown.text)
    assert draft is not None and 'action="/runs/team%2Falpha/sign"' in shown.text
    done = c.post(
        "/runs/team%2Falpha/sign",
        data={"csrf": csrf.group(1), "prepared": draft.group(1)},
        follow_redirects=False,
    )
    assert done.status_code == 303
    assert done.headers["location"].startswith("/runs/team%2Falpha?done=approval")
    assert [e.kind for e in world.store().evidence(WAITING)] == ["approval"]
    view = open_run(world.store(), WAITING)
    assert [(i.kind, i.status) for i in view.inbox] == [("approval", "waiting")]


def test_a_login_link_to_an_odd_run_keeps_its_encoding(world: World) -> None:
    """Opening /runs/50%25%20done%3F%231?token=... redirects to that same run, not a cut-off one."""
    _runs(world)
    app = create_app(WebConfig(store=str(world.db), token=TOKEN, hosts=("testserver",)))
    c = TestClient(app)
    first = c.get(f"/runs/50%25%20done%3F%231?token={TOKEN}", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/runs/50%25%20done%3F%231"
    assert _heading(c.get(first.headers["location"]).text) == "50% done?#1"


def test_an_unknown_odd_run_id_is_a_404_that_names_it(world: World) -> None:
    """/runs/no%2Fsuch is "No such run" (404), its back link encoded like every other."""
    _runs(world)
    page = _client(world).get("/runs/no%2Fsuch")
    assert page.status_code == 404 and "No such run" in page.text
    assert 'href="/runs/no%2Fsuch" id="back"' in page.text


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
def test_in_a_browser_every_odd_run_id_opens_and_one_with_a_slash_is_approved(
    world: World, tmp_path: Path, page: Any
) -> None:
    """Chromium clicks each run's link on /runs and lands on that run; team/alpha is approved from its page."""
    from playwright.sync_api import expect

    ids = _runs(world)
    key = tmp_path / "amy.key"
    APPROVER.write_file(key)
    with _webkit.serve(world.db, "--key", str(key)) as served:
        page.goto(served.login("/runs"))
        for run_id in ids:
            page.goto(served.base + "/runs")
            page.locator(
                "tr[data-run] td a", has_text=re.compile("^" + re.escape(run_id) + "$")
            ).click()
            expect(page.locator("h1 code").first).to_have_text(run_id)
        page.goto(served.base + "/runs")
        page.locator("tr[data-run] td a", has_text=WAITING).click()
        page.click("#approve")
        expect(page.locator("#signed-fields")).to_contain_text("w1")
        page.click("#sign")
        expect(page.locator("#done")).to_contain_text("approval")
        expect(page.locator("h1 code").first).to_have_text(WAITING)
    assert [e.kind for e in world.store().evidence(WAITING)] == ["approval"]
