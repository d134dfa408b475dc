"""`tether demo --scenario support-desk`, run as a person types it, counted on each system's side.

Every count these tests trust is read from the real system after the demo
has stopped it: the workspace's journal, the ticket service's SQLite file
and the mail server's Maildir. The demo's own report is checked against
them, never used instead of them.
"""

from __future__ import annotations

import contextlib
import json
import mailbox
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tether import _demo
from tether.adapters import FileWorkspace

pytestmark = pytest.mark.slow


DEMO = (sys.executable, "-m", "tether.cli", "demo", "--scenario", "support-desk")


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    """``tether demo --scenario support-desk ARGS`` as a person types it, to its exit."""
    return subprocess.run(
        [*DEMO, *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def desk(tmp_path: Path, *args: str) -> dict[str, Any]:
    """The demo's JSON report; the demo must exit 0."""
    result = run_demo(
        *("--json", "--db", str(tmp_path / "t.sqlite"), "--workspace", str(tmp_path / "ws")),
        *args,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def world(tmp_path: Path, report: dict[str, Any]) -> tuple[int, int, int]:
    """File writes the workspace journaled, tickets in the service's file, delivered messages."""
    paths = _demo.DemoPaths.under(tmp_path, tmp_path / "t.sqlite", tmp_path / "ws")
    with FileWorkspace(paths.workspace, paths.journal) as workspace:
        files = workspace.write_count()
    services = report["services"]
    with sqlite3.connect(services["ticket_db"]) as db:
        (tickets,) = db.execute("SELECT count(*) FROM tickets").fetchone()
    messages = len(list(mailbox.Maildir(services["maildir"], create=False).iterkeys()))
    return files, tickets, messages


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def test_support_desk_without_a_crash_lands_one_of_each_and_stops_its_services(
    tmp_path: Path,
) -> None:
    """One process writes the reply, opens one ticket, sends one email, and both services stop."""
    report = desk(tmp_path)
    assert report["phase"] == "completed" and report["crash"] is None and report["review"] is None
    assert world(tmp_path, report) == (1, 1, 1)
    assert report["received"] == {"file_writes": 1, "tickets": 1, "messages": 1}
    assert {a: e["status"] for a, e in report["effects"].items()} == {
        "write-reply": "committed",
        "open-ticket": "committed",
        "email-customer": "committed",
    }
    services = report["services"]
    host, url_port = services["ticket_url"].removeprefix("http://").split(":")
    assert not listening(host, int(url_port))
    assert not listening(services["smtp_host"], services["smtp_port"])


@pytest.mark.parametrize("hit", [1, 2])
def test_a_kill_after_the_file_or_the_ticket_left_is_reconciled(tmp_path: Path, hit: int) -> None:
    """SIGKILL after the reply or the ticket was sent: the new process asks its owner; one each."""
    report = desk(tmp_path, "--crash-at", "effect_sent", "--crash-hit", str(hit))
    assert report["phase"] == "completed" and report["review"] is None
    assert report["crash"] == {"point": "effect_sent", "hit": hit, "signal": "SIGKILL"}
    assert world(tmp_path, report) == (1, 1, 1)
    in_flight = ["write-reply", "open-ticket"][hit - 1]
    assert report["processes"][0]["in_flight"] == in_flight
    assert "effect_reconciled" in report["processes"][1]["events"]


def test_a_kill_after_the_email_left_goes_to_review_and_a_signed_landed_resolves_it(
    tmp_path: Path,
) -> None:
    """SIGKILL after the email: frozen in needs_review, the reviewer finds it delivered and signs landed with its Message-ID, 1 message."""
    report = desk(tmp_path, "--crash-at", "effect_sent", "--crash-hit", "3")
    assert world(tmp_path, report) == (1, 1, 1)
    review = report["review"]
    assert review["case"]["reason"] == "outcome_unknown"
    assert review["case"]["action_id"] == "email-customer"
    assert review["found_in_mailbox"] is True and review["decision"] == "landed"
    maildir = mailbox.Maildir(report["services"]["maildir"], create=False)
    assert [m["Message-ID"] for m in maildir] == [review["searched_for"]]
    # Process 2 froze the run; process 3 took the signed decision and finished.
    assert "needs_review" in report["processes"][1]["events"]
    assert "review_sealed" in report["processes"][2]["events"]
    assert report["phase"] == "completed" and report["epoch"] == 3
    email = report["effects"]["email-customer"]
    # Committed by the reviewer, with the Message-ID found: not sent again, not set aside.
    assert email["status"] == "committed" and email["quarantined"] is False


def test_with_the_mailbox_searchable_the_uncertain_email_is_reconciled(tmp_path: Path) -> None:
    """--mail-lookup: the same kill is settled by finding the Message-ID, with no review."""
    report = desk(tmp_path, "--mail-lookup", "--crash-at", "effect_sent", "--crash-hit", "3")
    assert report["phase"] == "completed" and report["review"] is None
    assert report["effects"]["email-customer"]["status"] == "committed"
    assert world(tmp_path, report) == (1, 1, 1)


def test_text_output_tells_the_kill_the_review_and_the_counts(tmp_path: Path) -> None:
    """Without --json the demo narrates each process, the reviewer and what each system got."""
    result = subprocess.run(
        [
            *(sys.executable, "-m", "tether.cli", "demo", "--scenario", "support-desk"),
            *("--crash-at", "effect_sent", "--crash-hit", "3", "--db", str(tmp_path / "t.sqlite")),
            *("--workspace", str(tmp_path / "ws")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=True,
    )
    out = result.stdout
    assert "killed (SIGKILL) at effect_sent hit 3: the email was sent" in out
    assert "froze in needs_review" in out and "signed landed as demo-reviewer" in out
    assert "workspace 1 file write(s), ticket service 1 ticket(s), mail server 1 message(s)" in out
    assert "tether review demo-run case-" in out


def test_a_missing_mail_server_package_is_one_clear_line(tmp_path: Path) -> None:
    """Without aiosmtpd the demo exits 1 with one line naming the extra, before it starts anything."""
    script = (
        "import sys; sys.modules['aiosmtpd'] = None\n"  # what an absent package looks like
        "from tether.cli import main\n"
        f"sys.exit(main(['demo', '--scenario', 'support-desk', "
        f"'--db', {str(tmp_path / 'd' / 't.sqlite')!r}, '--workspace', {str(tmp_path / 'd' / 'ws')!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "tether: error: DemoSetupError: the support-desk demo needs aiosmtpd: "
        "pip install 'tether[demo]'"
    ]
    assert not (tmp_path / "d").exists()


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The demo failed with exit 1 and exactly one ``tether: error:`` line on stderr."""
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tether: error: "), result.stderr[-600:]
    return lines[0]


def test_a_second_demo_in_the_same_directory_counts_only_its_own_run(tmp_path: Path) -> None:
    """A second demo beside the first (another --db) gets its own systems and counts one of each."""
    reports = []
    for name in ("a", "b"):
        result = run_demo(
            *("--json", "--db", str(tmp_path / f"{name}.sqlite")),
            *("--workspace", str(tmp_path / f"ws-{name}")),
        )
        assert result.returncode == 0, result.stderr
        reports.append(json.loads(result.stdout))
    assert reports[1]["phase"] == "completed" and reports[1]["one_each"] is True
    assert reports[1]["received"] == {"file_writes": 1, "tickets": 1, "messages": 1}
    assert reports[0]["services"]["maildir"] != reports[1]["services"]["maildir"]
    assert reports[0]["services"]["ticket_db"] != reports[1]["services"]["ticket_db"]


def test_a_desk_directory_left_by_an_earlier_demo_is_refused(tmp_path: Path) -> None:
    """With the database gone but its tickets and mail still there, the demo refuses to count them."""
    desk(tmp_path)
    (tmp_path / "t.sqlite").unlink()
    line = one_error_line(
        run_demo("--db", str(tmp_path / "t.sqlite"), "--workspace", str(tmp_path / "ws2"))
    )
    assert line.startswith("tether: error: DemoPathError: ") and "t.desk" in line
    assert not (tmp_path / "ws2").exists()


def test_a_workspace_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """--workspace naming a file fails with tether's one error line, and the file is untouched."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    line = one_error_line(run_demo("--db", str(tmp_path / "t.sqlite"), "--workspace", str(afile)))
    assert line.startswith("tether: error: DemoPathError: ") and "not a directory" in line
    assert afile.read_text() == "x" and not (tmp_path / "t.sqlite").exists()


def test_a_workspace_that_holds_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    """--workspace naming a non-empty directory is refused before reply.txt in it is overwritten."""
    ws = tmp_path / "mine"
    ws.mkdir()
    (ws / "reply.txt").write_text("my own words\n")
    line = one_error_line(run_demo("--db", str(tmp_path / "t.sqlite"), "--workspace", str(ws)))
    assert "already holds files" in line
    assert (ws / "reply.txt").read_text() == "my own words\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_an_empty_workspace_directory_is_used(tmp_path: Path) -> None:
    """An empty directory made for the demo is a fresh workspace, not a refusal."""
    (tmp_path / "ws").mkdir()
    report = desk(tmp_path)
    assert report["phase"] == "completed" and report["one_each"] is True


@pytest.mark.parametrize(("point", "hits"), [("before_proposal", 4), ("checkpoint_write", 8)])
def test_a_crash_hit_the_run_never_reaches_names_the_hits_there_are(
    tmp_path: Path, point: str, hits: int
) -> None:
    """A --crash-hit past the last fails naming the hits the run passed, and the last one kills."""
    result = run_demo(
        *("--db", str(tmp_path / "t.sqlite"), "--workspace", str(tmp_path / "ws")),
        *("--crash-at", point, "--crash-hit", "40"),
    )
    line = one_error_line(result)
    assert line.startswith("tether: error: DemoCrashPointError: ")
    assert f"it passed {point} {hits} time(s), so --crash-hit reaches hits 1-{hits}" in line
    report = desk(tmp_path / "last", "--crash-at", point, "--crash-hit", str(hits))
    assert report["crash"] == {"point": point, "hit": hits, "signal": "SIGKILL"}
    assert report["phase"] == "completed" and report["one_each"] is True


def test_a_demo_that_fails_before_it_starts_leaves_no_temp_directory(tmp_path: Path) -> None:
    """Refused for a missing extra with no --db or --workspace, the demo makes no temp directory."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    script = (
        "import sys; sys.modules['aiosmtpd'] = None\n"  # what an absent package looks like
        "from tether.cli import main\n"
        "sys.exit(main(['demo', '--scenario', 'support-desk']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert "needs aiosmtpd" in one_error_line(result)
    assert list(scratch.iterdir()) == []


# -- the demo stopped from outside: what it started must stop with it ----------------


def started(tmp_path: Path) -> subprocess.Popen[str]:
    """A demo whose ticket service and mail server are up (its services.json is written)."""
    # SIGINT as the terminal would deliver it, even under a runner that ignores it.
    proc = subprocess.Popen(
        [*DEMO, "--db", str(tmp_path / "t.sqlite"), "--workspace", str(tmp_path / "ws")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    services = tmp_path / "t.desk" / "services.json"
    deadline = time.monotonic() + 60
    while not services.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the services never started: {proc.communicate()[1][-400:]}")
        time.sleep(0.02)
    return proc


def left_behind(tmp_path: Path, within_s: float) -> list[int]:
    """Processes whose command line names ``tmp_path`` still alive after ``within_s`` (then killed)."""
    deadline = time.monotonic() + within_s
    while True:
        found = subprocess.run(
            ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, check=False
        ).stdout
        pids = [int(p) for p in found.split()]
        if not pids or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in pids:  # clean up what the demo left, so one failure does not leak into the next
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


@pytest.mark.parametrize(
    ("sent", "code", "said"),
    [
        (signal.SIGTERM, 128 + signal.SIGTERM, "tether: demo terminated (SIGTERM)"),
        (signal.SIGINT, 128 + signal.SIGINT, "tether: demo interrupted (Ctrl-C)"),
    ],
)
def test_a_terminated_or_interrupted_demo_stops_its_services_and_says_so(
    tmp_path: Path, sent: signal.Signals, code: int, said: str
) -> None:
    """SIGTERM (a CI timeout, `kill`) or Ctrl-C stops both services and the run, in one line."""
    proc = started(tmp_path)
    proc.send_signal(sent)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err and err.strip().splitlines() == [
        f"{said}; the processes it started are stopped"
    ]
    assert left_behind(tmp_path, within_s=0) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_demo_takes_its_services_with_it(tmp_path: Path) -> None:
    """SIGKILL leaves the demo no chance to clean up; the kernel stops its services for it."""
    proc = started(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert left_behind(tmp_path, within_s=10) == []
