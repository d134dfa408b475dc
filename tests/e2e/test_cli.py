"""The `tether` command, run as a real process the way a person types it."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tether import _demo
from tether.cli import EXIT_INTEGRITY, build_parser
from tether.runtime import CrashPoint

ROOT = Path(__file__).resolve().parents[2]


def tether(
    *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "tether.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        check=False,
        env=env,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"tether {args} exited {result.returncode}: {result.stderr}")
    return result


def read_back(command: str, report: dict[str, object]) -> subprocess.CompletedProcess[str]:
    """`tether inspect|verify demo-run` on a demo's store, exit code left to the caller."""
    db, keyring = str(report["db"]), str(report["keyring"])
    return tether(command, "demo-run", "--db", db, "--keyring", keyring, check=False)


def demo_child(paths: _demo.DemoPaths, stage: str, store_url: str | None = None) -> None:
    """One stage of the demo run in its own process (``tether _demo-child STAGE``)."""
    cmd = [
        sys.executable,
        "-m",
        "tether.cli",
        "_demo-child",
        stage,
        "--db",
        str(paths.db),
        "--workspace",
        str(paths.workspace),
    ]
    if store_url is not None:
        cmd += ["--store", store_url]
    subprocess.run(cmd, check=True, timeout=60, stdin=subprocess.DEVNULL)


def demo(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tether(
        "demo",
        "--json",
        "--db",
        str(tmp_path / "t.sqlite"),
        "--workspace",
        str(tmp_path / "ws"),
        *args,
    )
    return json.loads(out.stdout)


def test_list_crash_points_prints_one_name_a_line() -> None:
    """--list-crash-points prints exactly the crash point names."""
    assert tether("demo", "--list-crash-points").stdout.split() == [p.value for p in CrashPoint]


def test_demo_json_reports_a_completed_run_with_one_workspace_write(tmp_path: Path) -> None:
    """The demo repairs the file, completes and reports the workspace's own write count."""
    report = demo(tmp_path)
    assert report["phase"] == "completed"
    assert report["workspace_writes"] == 1
    assert report["repaired"] is True
    for key in ("run_id", "phase", "generation", "workspace_writes", "trace_events"):
        assert key in report
    assert (tmp_path / "ws" / "calc.py").read_text().endswith("a + b\n")


def test_demo_crash_in_the_uncertain_window_recovers_in_a_new_process(tmp_path: Path) -> None:
    """SIGKILL after the effect, before its receipt: recovery looks the write up, never resends it."""
    from tether.core import EffectStatus
    from tether.store import SQLiteStore

    report = demo(tmp_path, "--crash-at", "effect_sent")
    assert report["phase"] == "completed"
    assert report["workspace_writes"] == 1
    assert report["epoch"] == 2
    assert report["crash"] == {"point": "effect_sent", "hit": 1, "signal": "SIGKILL"}
    # The workspace absorbs a resend under the same key, so its count cannot tell; the
    # signed ledger can: every send is a `dispatched` row, and a resend would add a second.
    with SQLiteStore(Path(str(report["db"]))) as store:
        statuses = [e.status for e in store.ledger(str(report["run_id"]))]
    assert statuses == [EffectStatus.INTENDED, EffectStatus.DISPATCHED, EffectStatus.COMMITTED]


def test_demo_crash_hit_past_the_last_names_the_hits_the_run_passed(tmp_path: Path) -> None:
    """The repair run writes once, so --crash-hit 5 at effect_sent is refused naming hit 1."""
    result = tether(
        *("demo", "--db", str(tmp_path / "t.sqlite"), "--workspace", str(tmp_path / "ws")),
        *("--crash-at", "effect_sent", "--crash-hit", "5"),
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "tether: error: DemoCrashPointError: the run finished without reaching crash point "
        "effect_sent hit 5: it passed effect_sent 1 time(s), so --crash-hit reaches hit 1"
    ]


def test_demo_readable_summary_names_the_next_command(tmp_path: Path) -> None:
    """Without --json the demo prints a short summary that ends with how to inspect the run."""
    out = tether("demo", "--db", str(tmp_path / "t.sqlite"), "--workspace", str(tmp_path / "w"))
    assert "is completed" in out.stdout
    assert "1 received by the workspace" in out.stdout
    assert "tether inspect demo-run" in out.stdout


def test_demo_refuses_a_workspace_that_holds_files_and_leaves_them_alone(tmp_path: Path) -> None:
    """The repair demo refuses a non-empty --workspace in one line instead of overwriting calc.py."""
    ws = tmp_path / "mine"
    ws.mkdir()
    (ws / "calc.py").write_text("mine = True\n")
    result = tether("demo", "--db", str(tmp_path / "t.sqlite"), "--workspace", str(ws), check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("tether: error: DemoPathError: workspace ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert (ws / "calc.py").read_text() == "mine = True\n" and not (tmp_path / "t.sqlite").exists()


def test_demo_refuses_the_journal_of_an_earlier_demo_s_workspace(tmp_path: Path) -> None:
    """A second demo whose workspace shares the first's name and directory would count its writes."""
    demo(tmp_path)
    result = tether(
        *("demo", "--db", str(tmp_path / "u.sqlite"), "--workspace", str(tmp_path / "x" / "ws")),
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "ws.journal is the journal of an earlier demo's workspace named 'ws'" in result.stderr
    assert not (tmp_path / "x").exists()


def test_demo_refusing_a_used_db_leaves_no_temp_directory(tmp_path: Path) -> None:
    """Refused for an existing --db, a demo that would put its workspace in a temp dir makes none."""
    (tmp_path / "t.sqlite").write_text("")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = tether(
        *("demo", "--db", str(tmp_path / "t.sqlite")),
        check=False,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert result.returncode == 1 and "already exists" in result.stderr
    assert list(scratch.iterdir()) == []


def test_inspect_and_verify_a_sound_run(tmp_path: Path) -> None:
    """inspect shows the run and verify exits 0 for an untouched store."""
    report = demo(tmp_path)
    common = ["demo-run", "--db", str(report["db"]), "--keyring", str(report["keyring"])]
    shown = json.loads(tether("inspect", *common, "--json").stdout)
    assert shown["state"]["phase"] == "completed"
    # Newest first, like the trace.
    assert [row["status"] for row in shown["ledger"]] == ["committed", "dispatched", "intended"]
    assert "completed" in tether("inspect", *common).stdout
    verified = json.loads(tether("verify", *common, "--json").stdout)
    assert verified["sound"] is True and verified["trace_events"] == report["trace_events"]


def test_verify_exits_with_the_integrity_code_for_a_tampered_store(tmp_path: Path) -> None:
    """A flipped byte in the newest checkpoint makes verify exit 3 and name the failure."""
    report = demo(tmp_path)
    with sqlite3.connect(str(report["db"])) as conn:
        (envelope,) = conn.execute(
            "SELECT c.envelope FROM tether_checkpoints c JOIN tether_marks m "
            "ON c.checkpoint_digest = m.checkpoint_digest"
        ).fetchone()
        broken = bytearray(envelope)
        broken[len(broken) // 2] ^= 0x01
        conn.execute(
            "UPDATE tether_checkpoints SET envelope = ? WHERE envelope = ?",
            (bytes(broken), envelope),
        )
    result = read_back("verify", report)
    assert result.returncode == EXIT_INTEGRITY
    assert "CheckpointCorruptError" in result.stderr
    assert result.stdout == ""


def test_verify_with_a_missing_mark_exits_with_the_integrity_code(tmp_path: Path) -> None:
    """A deleted high-water mark is an integrity failure, exit 3."""
    report = demo(tmp_path)
    with sqlite3.connect(str(report["db"])) as conn:
        conn.execute("DELETE FROM tether_marks")
    result = read_back("verify", report)
    assert result.returncode == EXIT_INTEGRITY
    assert "MissingHighWaterMarkError" in result.stderr


def test_cli_output_never_contains_the_key(tmp_path: Path) -> None:
    """No command prints the keyring's secret."""
    report = demo(tmp_path)
    secret = json.loads(Path(str(report["keyring"])).read_text())["keys"][0]["secret"]
    common = ["demo-run", "--db", str(report["db"]), "--keyring", str(report["keyring"])]
    outputs = [
        tether("inspect", *common).stdout,
        tether("inspect", *common, "--json").stdout,
        tether("verify", *common).stdout,
        json.dumps(report),
    ]
    assert all(secret not in text for text in outputs)
    assert Path(str(report["keyring"])).stat().st_mode & 0o777 == 0o600


def test_every_command_has_help_and_appears_in_the_docs() -> None:
    """Each public subcommand has help text and is named on a page of the docs."""
    readme = "\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    # An alias (``retry`` for ``resume``) shares its command's parser and help.
    primary = {id(p): name for name, p in reversed(list(sub.choices.items()))}
    public = [c for c, p in sub.choices.items() if not c.startswith("_") and primary[id(p)] == c]
    assert public
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name in public:
        assert helps.get(name), f"{name} has no help"
        assert re.search(rf"tether {name}\b", readme), f"no docs page mentions tether {name}"


def test_the_workers_backoff_help_says_when_and_how_it_waits() -> None:
    """--backoff's help names what it waits out (a failed step and one that got nowhere) and how."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    worker = sub.choices["worker"]
    helps = {a.dest: a.help or "" for a in worker._actions}
    for words in ("failed", "got nowhere", "service was down", "doubles", "other runs"):
        assert words in helps["backoff"], words
    assert "longest" in helps["max_backoff"]


@pytest.mark.parametrize("args", [["inspect", "nope", "--db", "{db}", "--keyring", "{kr}"]])
def test_unknown_run_is_a_clear_error(tmp_path: Path, args: list[str]) -> None:
    """Inspecting a run the store does not know fails with a one-line error, not a traceback."""
    report = demo(tmp_path)
    filled = [a.format(db=report["db"], kr=report["keyring"]) for a in args]
    result = tether(*filled, check=False)
    assert result.returncode in {1, EXIT_INTEGRITY}
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("tether: error:")


def test_inspect_verify_and_approve_work_against_postgresql(tmp_path: Path) -> None:
    """With --store a PostgreSQL URL, the read and sign commands work as with --db."""
    from dataclasses import replace

    from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
    from tether import _demo

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        url = url_in_schema(dsn, schema)
        paths = replace(_demo.DemoPaths.under(tmp_path), store_url=url)
        _demo.prepare(paths, "approval")
        demo_child(paths, "start", url)
        common = ["demo-run", "--store", url, "--keyring", str(paths.keyring)]
        assert json.loads(tether("verify", *common, "--json").stdout)["sound"] is True
        assert "pending fix-calc" in tether("inspect", *common).stdout
        out = tether(
            "approve",
            "demo-run",
            "fix-calc",
            "--store",
            url,
            "--key",
            str(paths.signer_key("approver")),
            "--yes",
        )
        assert "approval delivered (inbox #1)" in out.stdout
        demo_child(paths, "recover", url)
        shown = json.loads(tether("inspect", *common, "--json").stdout)
        assert shown["state"]["phase"] == "completed"


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_read_only_commands_never_create_a_missing_store(tmp_path: Path, command: str) -> None:
    """inspect and verify on a path with no database refuse it and create no file."""
    report = demo(tmp_path)
    missing = tmp_path / "typo.sqlite"
    result = tether(
        command, "demo-run", "--db", str(missing), "--keyring", str(report["keyring"]), check=False
    )
    assert result.returncode == 1
    assert "no SQLite store" in result.stderr
    assert not missing.exists()


def test_cancel_settles_a_dispatched_write_and_ends_the_run(tmp_path: Path) -> None:
    """`tether cancel` finds the write that left before a crash, records it, then cancels; a second cancel is refused."""
    import os

    from tether.core import EffectStatus, Phase
    from tether.runtime import CrashPlan, SimulatedCrash
    from tether.store import SQLiteStore

    paths = _demo.DemoPaths.under(tmp_path)
    _demo.prepare(paths)
    with _demo.workspace(paths) as ws:
        rt = _demo.runtime(paths, ws, CrashPlan(CrashPoint.EFFECT_SENT))
        with pytest.raises(SimulatedCrash):
            rt.start(_demo.RUN_ID).run()
        rt.store.close()
    url = f"sqlite:///{paths.db}"
    args = ("cancel", _demo.RUN_ID, "--store", url, "--app", "tether._demo:worker_factory")
    env = {**os.environ, "TETHER_DEMO_HOME": str(paths.home)}
    done = tether(*args, "--reason", "the ticket was withdrawn", env=env)
    assert done.returncode == 0, done.stderr
    assert "is cancelled" in done.stdout
    with SQLiteStore(paths.db) as store:
        statuses = [e.status for e in store.ledger(_demo.RUN_ID)]
        mark = store.get_mark(_demo.RUN_ID)
    assert statuses == [EffectStatus.INTENDED, EffectStatus.DISPATCHED, EffectStatus.COMMITTED]
    assert mark is not None and mark.phase == Phase.CANCELLED
    assert (paths.workspace / "calc.py").read_text() == _demo.FIXED  # written once, recorded
    again = tether(*args, "--reason", "again", check=False, env=env)
    assert again.returncode == 1
    assert "RunTerminalError" in again.stderr


@pytest.mark.parametrize("damage", ["delete", "edit"])
def test_verify_refuses_a_run_whose_agent_context_blob_is_damaged(
    tmp_path: Path, damage: str
) -> None:
    """verify is no kinder than recover: a missing or edited agent-context blob exits 3."""
    report = demo(tmp_path)
    with sqlite3.connect(str(report["db"])) as conn:
        if damage == "delete":
            conn.execute("DELETE FROM tether_blobs")
        else:
            conn.execute("UPDATE tether_blobs SET body = CAST('{}' AS BLOB)")
    result = read_back("verify", report)
    assert result.returncode == EXIT_INTEGRITY, result.stderr
    assert "Error" in result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE tether_trace SET data = 'not json' WHERE seq = 1",
        "UPDATE tether_trace SET data = '[1]' WHERE seq = 1",
        "UPDATE tether_trace SET seq = 'one' WHERE seq = 1",
        "UPDATE tether_trace SET at = 'yesterday' WHERE seq = 1",
        "UPDATE tether_marks SET generation = 'five'",
        "UPDATE tether_marks SET phase = 'dancing'",
        "UPDATE tether_marks SET lease_expires_at = 99999999999999999999",
        "UPDATE tether_ledger SET status = 'maybe' WHERE seq = 1",
    ],
)
def test_damaged_rows_are_integrity_failures_not_tracebacks(tmp_path: Path, damage: str) -> None:
    """Every malformed stored value makes inspect and verify exit 3 with one line, no traceback."""
    report = demo(tmp_path)
    with sqlite3.connect(str(report["db"])) as conn:
        assert conn.execute(damage).rowcount >= 1
    for command in ("verify", "inspect"):
        result = read_back(command, report)
        assert result.returncode == EXIT_INTEGRITY, (command, result.stderr)
        assert "Traceback" not in result.stderr
