"""The operator page's refusals over HTTP, without a browser: the app in-process, a real SQLite store."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._plain import plain
from tests.e2e import _webkit
from tether import _demo
from tether.crypto import Keyring, Signer, TrustRoots
from tether.store import SQLiteStore

pytest.importorskip("starlette.testclient", reason="the web extra is not installed")
pytest.importorskip("jinja2", reason="the web extra is not installed")

from starlette.testclient import TestClient

from tether.core import Policy
from tether.web import WebConfig, create_app

TOKEN = "t" * 32


def client(paths: _demo.DemoPaths, *roles: str, **config: Any) -> TestClient:
    """A logged-in client of the page over the demo's store, signing with the demo's keys of ``roles``."""
    config.setdefault("keyring", Keyring.from_file(paths.keyring))
    app = create_app(
        WebConfig(
            store=str(paths.db),
            token=TOKEN,
            signers=tuple(Signer.from_file(paths.signer_key(role)) for role in roles),
            hosts=("testserver",),
            **config,
        )
    )
    c = TestClient(app)
    c.get(f"/runs?token={TOKEN}")
    return c


def csrf(c: TestClient, path: str = "/runs/demo-run") -> tuple[str, int]:
    """The session's CSRF token and the generation the run page shows."""
    page = c.get(path).text
    token = re.search(r'name="csrf" value="([^"]+)"', page)
    seen = re.search(r'name="seen" value="(\d+)"', page)
    if token is None or seen is None:
        raise AssertionError("the run page has no form")
    return token.group(1), int(seen.group(1))


def inbox(paths: _demo.DemoPaths) -> list[Any]:
    store = SQLiteStore(paths.db, read_only=True)
    try:
        return store.evidence("demo-run")
    finally:
        store.close()


@pytest.fixture
def waiting(tmp_path: Path) -> _demo.DemoPaths:
    return _webkit.approval_run(tmp_path)


def test_a_host_header_not_the_servers_is_refused(waiting: _demo.DemoPaths) -> None:
    """A request naming another host (DNS rebinding) gets 403 and no data, even with the token."""
    c = client(waiting)
    answer = c.get(f"/runs?token={TOKEN}", headers={"Host": "evil.example"})
    assert answer.status_code == 403 and "demo-run" not in answer.text


def test_refusals_come_before_signing_and_reach_no_inbox(
    tmp_path: Path, waiting: _demo.DemoPaths
) -> None:
    """A key of the wrong role, an untrusted key, a ttl over the policy's or a stale view: 409, nothing delivered."""
    reviewer_only = client(waiting, "reviewer")
    token, seen = csrf(reviewer_only)
    form = {"csrf": token, "seen": str(seen), "action": "approve", "action_id": "fix-calc"}
    wrong_role = reviewer_only.post("/runs/demo-run/prepare", data=form)
    assert wrong_role.status_code == 409 and "approver" in wrong_role.text

    stranger = Signer.generate("mallory", "approver")
    untrusted = client(waiting, "approver", trust=TrustRoots.of(stranger.trust_root()))
    token, seen = csrf(untrusted)
    refused = untrusted.post("/runs/demo-run/prepare", data={**form, "csrf": token})
    assert refused.status_code == 409 and "not a trusted approver" in refused.text

    policy = Policy.from_json(waiting.policy.read_bytes())
    approver = client(waiting, "approver", policy=policy)
    token, seen = csrf(approver)
    too_long = approver.post(
        "/runs/demo-run/prepare",
        data={**form, "csrf": token, "ttl": str(policy.approval_ttl_s + 1)},
    )
    assert too_long.status_code == 409 and "approval_ttl_s" in too_long.text
    stale = approver.post(
        "/runs/demo-run/prepare", data={**form, "csrf": token, "seen": str(seen - 1)}
    )
    assert stale.status_code == 409 and "StaleViewError" in stale.text
    assert inbox(waiting) == []


def test_a_document_shown_is_not_delivered_once_the_run_moved(waiting: _demo.DemoPaths) -> None:
    """Confirming a draft after the run took another approval and wrote is refused; only the other one is in the inbox."""
    c = client(waiting, "approver")
    token, seen = csrf(c)
    form = {"csrf": token, "seen": str(seen), "action": "approve", "action_id": "fix-calc"}
    shown = c.post("/runs/demo-run/prepare", data=form)
    assert shown.status_code == 200 and 'id="signed-fields"' in shown.text
    draft = re.search(r'name="prepared" value="([^"]+)"', shown.text)
    assert draft is not None
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.cli",
            "approve",
            "demo-run",
            "fix-calc",
            "--db",
            str(waiting.db),
            "--key",
            str(waiting.signer_key("approver")),
            "--yes",
        ],
        check=True,
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    _webkit.take_evidence(waiting)
    done = _webkit.worker(waiting)  # the write goes out under the other approval: no pending write
    assert done.returncode == 0, done.stderr
    late = c.post("/runs/demo-run/sign", data={"csrf": token, "prepared": draft.group(1)})
    assert late.status_code == 409 and "moved since the approval was prepared" in late.text
    assert len(inbox(waiting)) == 1
    again = c.post("/runs/demo-run/sign", data={"csrf": token, "prepared": draft.group(1)})
    assert again.status_code == 409 and "nothing prepared" in again.text  # a draft is used once


def test_a_damaged_checkpoint_is_shown_as_such_and_nothing_of_it(waiting: _demo.DemoPaths) -> None:
    """With a keyring, a tampered checkpoint gives an integrity page with no run data, and the list flags the run."""
    c = client(waiting, "approver")
    pending_key = re.search(r'id="pending-key">([^<]+)<', c.get("/runs/demo-run").text)
    assert pending_key is not None
    plain(waiting.db)
    with sqlite3.connect(waiting.db) as db:
        rows = db.execute("SELECT checkpoint_digest, envelope FROM tether_checkpoints").fetchall()
        for digest, envelope in rows:
            db.execute(
                "UPDATE tether_checkpoints SET envelope = ? WHERE checkpoint_digest = ?",
                (bytes(envelope).replace(b"calc.py", b"calx.py"), digest),
            )
        # A schema-4 checkpoint keeps its big parts (the pending write) by digest.
        for digest, body in db.execute("SELECT digest, body FROM tether_blobs").fetchall():
            db.execute(
                "UPDATE tether_blobs SET body = ? WHERE digest = ?",
                (bytes(body).replace(b"calc.py", b"calx.py"), digest),
            )
    db.close()
    page = c.get("/runs/demo-run")
    assert page.status_code == 500 and "Integrity" in page.text
    assert pending_key.group(1) not in page.text and "calx.py" not in page.text
    listed = c.get("/runs")
    assert listed.status_code == 200 and "cannot read it" in listed.text


def test_an_unknown_run_is_404(waiting: _demo.DemoPaths) -> None:
    """A run the store does not hold is a 404 page."""
    assert client(waiting).get("/runs/no-such-run").status_code == 404


def test_serve_refuses_a_missing_store_and_a_short_token(tmp_path: Path) -> None:
    """`tether serve` on a path with no database exits 1 and creates nothing; a short token is refused."""
    missing = tmp_path / "typo.sqlite"
    real = _webkit.approval_run(tmp_path / "real").db
    for store, extra, said in (
        (missing, [], "typo.sqlite"),
        (real, ["--token", "short"], "at least 16 characters"),
    ):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tether.cli",
                "serve",
                "--store",
                str(store),
                "--port",
                "0",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert said in done.stderr
    assert not missing.exists()


def test_a_rewind_signed_in_the_page_is_applied_by_the_runs_next_step(tmp_path: Path) -> None:
    """The page shows a rewind's bound fields, delivers it, and the recovered run restores to that generation."""
    paths = _webkit.running_run(tmp_path)
    c = client(paths, "reviewer")
    token, seen = csrf(c)
    form = {"csrf": token, "seen": str(seen), "action": "rewind", "to": "1", "reason": "start over"}
    shown = c.post("/runs/demo-run/prepare", data={**form, "scope": "aligned"})
    assert shown.status_code == 200, shown.text
    assert re.search(r"<th>purpose</th><td><code>rewind</code>", shown.text)
    assert re.search(r"<th>target_generation</th><td><code>1</code>", shown.text)
    draft = re.search(r'name="prepared" value="([^"]+)"', shown.text)
    assert draft is not None
    done = c.post(
        "/runs/demo-run/sign",
        data={"csrf": token, "prepared": draft.group(1)},
        follow_redirects=False,
    )
    assert done.status_code == 303 and "rewind" in done.headers["location"]
    (item,) = inbox(paths)
    assert item.kind == "rewind"
    _webkit.recover(paths)
    page = c.get("/runs/demo-run").text
    assert "rewind_started" in page and "inbox-applied" in page


def test_the_inbox_page_lists_refused_evidence_with_why(waiting: _demo.DemoPaths) -> None:
    """An approval signed by a key the runtime does not trust is listed as refused, with the runtime's reason."""
    from datetime import UTC, datetime, timedelta

    from tether.core import new_approval
    from tether.runtime import open_run

    store = SQLiteStore(waiting.db)
    try:
        state = open_run(store, "demo-run").state
        now = datetime.now(UTC)
        mallory = Signer.generate("mallory", "approver")
        body = new_approval(
            state, "mallory", issued_at=now, expires_at=now + timedelta(seconds=60), nonce="n" * 32
        )
        store.put_evidence("demo-run", "approval", mallory.sign(body))
    finally:
        store.close()
    _webkit.take_evidence(waiting)
    page = client(waiting).get("/inbox").text
    row = re.search(r'<tr class="inbox-refused">(.*?)</tr>', page, re.S)
    assert row is not None and "mallory" in row.group(1)
    assert "UnknownSignerError" in row.group(1)


def test_the_runs_page_filters_by_phase(waiting: _demo.DemoPaths) -> None:
    """?phase= lists only runs in that phase; an unknown phase lists all."""
    c = client(waiting)
    assert 'data-run="demo-run"' in c.get("/runs?phase=pending").text
    assert 'data-run="demo-run"' not in c.get("/runs?phase=completed").text
    assert 'data-run="demo-run"' in c.get("/runs?phase=bogus").text


def test_the_web_package_exports_exactly_these_names() -> None:
    """tether.web's public names are pinned; each has a docstring."""
    import tether.web

    assert sorted(tether.web.__all__) == [
        "ActionRefusedError",
        "Draft",
        "WebConfig",
        "create_app",
        "serve",
    ]
    for name in tether.web.__all__:
        assert getattr(tether.web, name).__doc__, name


def test_a_cancel_signed_in_the_page_ends_the_run_at_its_next_step(tmp_path: Path) -> None:
    """An operator's cancel from the page: its bound fields are shown, it is delivered, the run ends cancelled."""
    import json

    paths = _webkit.approval_run(tmp_path)
    operator = Signer.generate("demo-operator", "operator")
    operator.write_file(paths.signer_key("operator"))
    roots = json.loads(paths.trust.read_text())
    roots["signers"].append(operator.trust_root())
    paths.trust.write_text(json.dumps(roots))
    # The run's own roots (kept in the store) lack the operator until it restarts with
    # these: the page is told the roots the runtime runs with now (serve --trust).
    refused = client(paths, "approver", "operator")
    token, seen = csrf(refused)
    form = {"csrf": token, "seen": str(seen), "action": "cancel", "reason": "wrong customer"}
    early = refused.post("/runs/demo-run/prepare", data=form)
    assert early.status_code == 409 and "is not a trusted operator" in early.text
    c = client(paths, "approver", "operator", trust=TrustRoots.from_file(paths.trust))
    token, seen = csrf(c)
    form = {"csrf": token, "seen": str(seen), "action": "cancel", "reason": "wrong customer"}
    shown = c.post("/runs/demo-run/prepare", data=form)
    assert shown.status_code == 200, shown.text
    assert re.search(r"<th>reason</th><td><code>wrong customer</code>", shown.text)
    draft = re.search(r'name="prepared" value="([^"]+)"', shown.text)
    assert draft is not None
    done = c.post(
        "/runs/demo-run/sign",
        data={"csrf": token, "prepared": draft.group(1)},
        follow_redirects=False,
    )
    assert done.status_code == 303
    (item,) = inbox(paths)
    assert item.kind == "cancel" and item.document["signer"] == "demo-operator"
    _webkit.recover(paths)
    page = c.get("/runs/demo-run").text
    assert "run_cancelled" in page and "inbox-applied" in page
    assert (paths.workspace / "calc.py").read_text() != _demo.FIXED  # the write never happened
