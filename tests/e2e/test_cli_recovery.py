"""`tether demo --scenario notify`, `tether rewind`, `admit`, `epochs`, `ledger`, as a person types them."""

from __future__ import annotations

import json
import mailbox
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import demo, tether
from tests.integration._services import smtp_server
from tether import _demo, _notify
from tether.adapters import Adapters, FileWorkspace, SmtpEffect
from tether.core import Phase
from tether.crypto import Role, TrustRoots


def notify(tmp_path: Path) -> dict[str, Any]:
    return dict(demo(tmp_path, "--scenario", "notify"))


def test_the_notify_demo_leaves_one_message_and_both_epochs_in_the_trace(tmp_path: Path) -> None:
    """Ship, email, fail, rewind before the send: one message, the email crossed, two epochs."""
    report = notify(tmp_path)
    inbox = mailbox.Maildir(report["maildir"], create=False)
    assert len(inbox) == 1  # counted in the mail server's own Maildir
    assert report["delivered"] == 1 and report["replayed"] == 1
    assert report["phase"] == "completed"
    assert [c["kind"] for c in report["crossed"]] == ["email.send"]
    assert [u["kind"] for u in report["undone"]] == ["file.write"]
    assert [e["event"] for e in report["epochs"]] == ["run_started", "rewind_started"]
    assert report["epochs"][1]["principal"] == "demo-operator" and report["epochs"][1]["signed"]
    assert "tracking" in Path(report["workspace"], "order.txt").read_text()
    where = ("--db", report["db"], "--keyring", report["keyring"])
    epochs = json.loads(tether("epochs", report["run_id"], *where, "--json").stdout)
    assert [e["opened_by"] for e in epochs["epochs"]] == ["start", "rewind"]
    assert epochs["epochs"][1]["admission"] == report["epochs"][1]["admission"]
    ledger = json.loads(tether("ledger", report["run_id"], *where, "--json").stdout)
    statuses = [(e["kind"], e["status"]) for e in ledger["effects"]]
    assert statuses.count(("email.send", "committed")) == 1
    assert ("file.write", "compensated") in statuses
    text = tether("ledger", report["run_id"], *where).stdout
    assert "email.send" in text and "compensated" in text


def test_the_notify_demo_refuses_a_workspace_it_did_not_create(tmp_path: Path) -> None:
    """Like every scenario, notify will not write into a non-empty workspace."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "mine.txt").write_text("keep me\n")
    result = tether(
        "demo",
        "--scenario",
        "notify",
        "--db",
        str(tmp_path / "t.sqlite"),
        "--workspace",
        str(tmp_path / "ws"),
        check=False,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (tmp_path / "ws" / "mine.txt").read_text() == "keep me\n"


def adapters(ws: FileWorkspace, port: int) -> Adapters:
    return Adapters(
        ws,
        SmtpEffect(
            "127.0.0.1", port, sender="o@shop.test", domain="shop.test", instance_id="demo-mail"
        ),
    )


@pytest.fixture
def stopped_run(tmp_path: Path) -> Iterator[tuple[Any, int]]:
    """The notify demo's files with a run stopped after its wrong edit; its mail server's port."""
    paths = _demo.DemoPaths.under(tmp_path, tmp_path / "t.sqlite", tmp_path / "ws")
    _notify.prepare(paths)
    with smtp_server(tmp_path / "Maildir") as port:
        with FileWorkspace(paths.workspace, paths.journal) as ws:
            store = _demo.open_demo_store(paths)
            rt = _demo.runtime(paths, adapters(ws, port), store=store, agent=_notify.NotifyAgent())
            session = rt.start(_notify.RUN_ID)
            for _ in range(3):
                session.step()
            session.release()  # the process lets the run go: a waiting receipt lands
            store.close()
        yield paths, port


def test_tether_rewind_signs_a_rewind_the_next_step_applies(stopped_run: Any) -> None:
    """The command signs over the run as it is now and leaves it in the inbox, asking nothing."""
    paths, _ = stopped_run
    result = tether(
        "rewind",
        _notify.RUN_ID,
        "--to",
        "3",
        "--reason",
        "redo the outcome",
        "--key",
        str(paths.signer_key("operator")),
        "--db",
        str(paths.db),
        "--yes",
        "--json",
    )
    signed = json.loads(result.stdout)
    assert signed["kind"] == "rewind" and signed["signed"]["target_generation"] == 3
    assert signed["signed"]["principal_id"] == "demo-operator"
    store = _demo.open_demo_store(paths)
    try:
        (item,) = store.evidence(_notify.RUN_ID)
        assert item.kind == "rewind"
        body = TrustRoots.from_file(paths.trust).verify(item.document, Role.OPERATOR)
        assert body["purpose"] == "rewind" and body["reason"] == "redo the outcome"
    finally:
        store.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "0"], "earlier generation"),
        (["--to", "999"], "earlier generation"),
    ],
)
def test_tether_rewind_refuses_a_point_that_is_not_earlier(
    stopped_run: Any, args: list[str], message: str
) -> None:
    """A generation at or past the run's, or 0, is refused before anything is signed."""
    paths, _ = stopped_run
    result = tether(
        "rewind",
        _notify.RUN_ID,
        *args,
        "--reason",
        "x",
        "--key",
        str(paths.signer_key("operator")),
        "--db",
        str(paths.db),
        "--yes",
        check=False,
    )
    assert result.returncode == 1 and message in result.stderr
    store = _demo.open_demo_store(paths)
    try:
        assert store.evidence(_notify.RUN_ID) == []
    finally:
        store.close()


def test_tether_admit_signs_an_admission_the_next_recovery_uses(stopped_run: Any) -> None:
    """A person-admitted recovery: the recovery finds the admission in the inbox and records it."""
    paths, port = stopped_run
    tether(
        "admit",
        _notify.RUN_ID,
        "--key",
        str(paths.signer_key("operator")),
        "--db",
        str(paths.db),
        "--yes",
    )
    with FileWorkspace(paths.workspace, paths.journal) as ws:
        store = _demo.open_demo_store(paths)
        try:
            rt = _demo.runtime(paths, adapters(ws, port), store=store, agent=_notify.NotifyAgent())
            session = rt.recover(_notify.RUN_ID)
            session.step()
            opened = [e for e in session.trace() if e.kind == "recovered"][-1].data
            assert (opened["principal"], opened["signed"]) == ("demo-operator", True)
            assert session.state.phase is Phase.RUNNING
        finally:
            store.close()
