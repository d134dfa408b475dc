"""The CLI as a person meets it: help, version, --json everywhere, errors, pipes, onboarding."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import ROOT, demo
from tether import __version__
from tether.adapters import FileWorkspace
from tether.cli import build_parser, main
from tether.core import Policy, TaskSpec
from tether.crypto import Keyring, TrustRoots


def leaves(parser: argparse.ArgumentParser, prefix: str = "") -> list[tuple[str, Any, str]]:
    """Every runnable (sub)command of ``parser``: (name, its parser, its help)."""
    found: list[tuple[str, Any, str]] = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        seen: set[int] = set()
        for name, child in action.choices.items():
            if id(child) in seen:
                continue  # an alias (`retry` for `resume`): the same command again
            seen.add(id(child))
            full = f"{prefix} {name}".strip()
            nested = leaves(child, full)
            found.extend(nested or [(full, child, helps.get(name, ""))])
    return found


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_command_has_json_help_and_a_docs_mention() -> None:
    """Each runnable subcommand takes --json, has help text and is named on a page of the docs."""
    readme = "\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
    commands = leaves(build_parser())
    assert len(commands) > 15
    for name, parser, helptext in commands:
        assert helptext, f"tether {name} has no help"
        options = {o for a in parser._actions for o in a.option_strings}
        assert "--json" in options, f"tether {name} has no --json"
        assert re.search(rf"tether {re.escape(name)}\b", readme), (
            f"no docs page names tether {name}"
        )


def test_help_lists_no_internal_command() -> None:
    """`tether --help` names no command that starts with an underscore or is suppressed."""
    text = build_parser().format_help()
    assert "_demo-child" not in text
    assert "SUPPRESS" not in text


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`tether --version` prints the installed version and exits 0."""
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"tether {__version__}"


def test_a_json_error_is_one_object_on_stdout_and_one_line_on_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Under --json a refused command prints {"error": {type, message, exit}} and one stderr line."""
    missing = tmp_path / "missing.json"
    code, out, err = run(
        capsys, "inspect", "r", "--db", "x.sqlite", "--keyring", str(missing), "--json"
    )
    assert code == 1
    document = json.loads(out)
    assert document["error"]["type"] == "KeyringError"
    assert document["error"]["exit"] == 1
    assert str(missing) in document["error"]["message"]
    assert err.count("\n") == 1 and err.startswith("tether: error: KeyringError")


def test_a_usage_error_under_json_is_a_json_object_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A missing argument under --json exits 2 with a UsageError document on stdout."""
    code, out, err = run(capsys, "inspect", "--json")
    assert code == 2
    assert json.loads(out)["error"]["type"] == "UsageError"
    assert "required" in err


def test_the_demo_child_still_runs_though_hidden(capsys: pytest.CaptureFixture[str]) -> None:
    """`tether _demo-child` keeps its own parser (the demo's processes use it)."""
    code, _, err = run(capsys, "_demo-child", "start")
    assert code == 2
    assert "--db" in err


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """Writing into a pipe whose reader has gone exits 1 with nothing on stderr."""
    report = demo(tmp_path)
    # `true` never reads and exits at once: every write tether makes meets a closed pipe.
    shell = (
        f"{sys.executable} -m tether.cli inspect demo-run --db {report['db']} "
        f"--keyring {report['keyring']} --full | true; echo ${{PIPESTATUS[0]}}"
    )
    result = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.stdout.strip() == "1"
    assert result.stderr == ""


def test_inspect_shows_each_event_with_its_data(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Text inspect prints every event's data, bounded; JSON carries each event's data whole."""
    report = demo(tmp_path)
    capsys.readouterr()
    args = ["inspect", "demo-run", "--db", str(report["db"]), "--keyring", str(report["keyring"])]
    _, text, _ = run(capsys, *args)
    line = next(row for row in text.splitlines() if row.rstrip().endswith('"calc.add repaired"'))
    assert " completed  summary=" in line
    assert all(len(row) < 260 for row in text.splitlines())
    _, raw, _ = run(capsys, *args, "--json")
    events = json.loads(raw)["trace"]
    assert events[0]["data"] == {"summary": "calc.add repaired"}  # newest first
    verifier = next(e for e in events if e["kind"] == "verifier_ran")
    _, full, _ = run(capsys, *args, "--full")
    assert json.dumps(verifier["data"], sort_keys=True, ensure_ascii=False) in full


def test_the_approval_demo_tells_its_story_in_steps(tmp_path: Path) -> None:
    """The approval demo's text names the expiry, the fresh approval and the one write."""
    out = subprocess.run(
        [
            *(sys.executable, "-m", "tether.cli", "demo", "--scenario", "approval"),
            *("--db", str(tmp_path / "t.sqlite"), "--workspace", str(tmp_path / "ws")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "  1. " in out and "  4. " in out
    assert "expired" in out and "fresh approval" in out and "wrote calc.py once" in out


def test_the_conflict_demo_explains_one_received_none_committed(tmp_path: Path) -> None:
    """The conflict demo says why the workspace got 1 write and the run committed 0."""
    report = demo(tmp_path, "--scenario", "conflict")
    assert (report["workspace_writes"], report["writes_committed"]) == (1, 0)
    assert "quarantined the key" in str(report["writes_explained"])
    assert any("same key, different intent" in step for step in report["story"])


def test_the_next_command_printed_by_the_demo_runs_as_pasted(tmp_path: Path) -> None:
    """The demo's `next` command works when pasted into a shell with an empty PATH."""
    report = demo(tmp_path)
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        ["bash", "-c", str(report["next"])], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "run demo-run: completed" in result.stdout


def test_keyring_new_writes_a_0600_keyring_and_never_overwrites(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`tether keyring new` makes a loadable 0600 keyring, refuses an existing path, and names the mkdir a missing directory needs."""
    path = tmp_path / "keyring.json"
    code, out, _ = run(capsys, "keyring", "new", str(path), "--json")
    assert code == 0 and json.loads(out)["key_ids"] == ["k1"]
    assert path.stat().st_mode & 0o777 == 0o600
    assert Keyring.from_file(path).active.key_id == "k1"
    before = path.read_bytes()
    code, out, _ = run(capsys, "keyring", "new", str(path), "--json")
    assert code == 1 and json.loads(out)["error"]["type"] == "FileExistsRefusedError"
    assert path.read_bytes() == before
    missing = tmp_path / "nowhere" / "keyring.json"
    code, _, err = run(capsys, "keyring", "new", str(missing))
    assert code == 1 and f"mkdir -p {missing.parent}" in err and "Traceback" not in err
    assert not missing.parent.exists()


def test_trust_add_merges_public_halves_and_refuses_private_or_changed_keys(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`tether trust add` creates and merges, is idempotent, and refuses keys and changed ids."""
    for who, role in (("alice", "approver"), ("bob", "reviewer")):
        run(capsys, "keys", "new", "--role", role, "--id", who, "--out", str(tmp_path / who))
    trust = tmp_path / "trust.json"
    assert (
        run(capsys, "trust", "add", str(tmp_path / "alice/alice.trust.json"), "--to", str(trust))[0]
        == 0
    )
    assert (
        run(capsys, "trust", "add", str(tmp_path / "bob/bob.trust.json"), "--to", str(trust))[0]
        == 0
    )
    roots = TrustRoots.from_file(trust)
    assert roots.role_of("alice") is not None and roots.role_of("bob") is not None
    code, out, _ = run(
        capsys, "trust", "add", str(tmp_path / "bob/bob.trust.json"), "--to", str(trust), "--json"
    )
    assert code == 0 and json.loads(out) == {"added": [], "trust": str(trust), "unchanged": ["bob"]}
    before = trust.read_bytes()
    code, _, err = run(
        capsys, "trust", "add", str(tmp_path / "alice/alice.key"), "--to", str(trust)
    )
    assert code == 1 and "private key" in err
    run(
        capsys,
        "keys",
        "new",
        "--role",
        "approver",
        "--id",
        "alice",
        "--out",
        str(tmp_path / "again"),
    )
    code, _, err = run(
        capsys, "trust", "add", str(tmp_path / "again/alice.trust.json"), "--to", str(trust)
    )
    assert code == 1 and "different key" in err
    assert trust.read_bytes() == before


def test_init_writes_a_task_and_policy_the_strict_loaders_accept(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`tether init` writes task.json and policy.json that load, with the workspace's fingerprint."""
    ws = tmp_path / "proj"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("print('hi')\n")
    out_dir = tmp_path / "spec"
    code, out, _ = run(capsys, "init", "--workspace", str(ws), "--out", str(out_dir), "--json")
    assert code == 0
    task = TaskSpec.from_json((out_dir / "task.json").read_bytes())
    Policy.from_json((out_dir / "policy.json").read_bytes())
    assert task.initial_environment.state_fingerprint == json.loads(out)["state_fingerprint"]
    # The same tree seen by the runtime's own workspace, its journal elsewhere.
    with FileWorkspace(ws, tmp_path / "journal") as fw:
        assert fw.environment().state_fingerprint == task.initial_environment.state_fingerprint
    assert sorted(p.name for p in ws.rglob("*")) == ["app.py", "src"]  # nothing left in it
    assert task.verifier is not None and task.verifier.argv == ("python", "-m", "unittest", "-q")
    code, _, err = run(capsys, "init", "--workspace", str(ws), "--out", str(out_dir))
    assert code == 1 and "already exists" in err


def test_inspect_shows_the_inbox_and_why_a_document_was_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An approval by an untrusted signer shows as refused with its reason, text and JSON."""
    from datetime import UTC, datetime, timedelta

    from tests.e2e.test_cli import demo_child
    from tether import _demo
    from tether.core import new_approval
    from tether.crypto import Signer
    from tether.runtime import Checkpointer
    from tether.store import SQLiteStore

    paths = _demo.DemoPaths.under(tmp_path)
    _demo.prepare(paths, "approval")
    demo_child(paths, "start")
    mallory = Signer.generate("mallory", "approver")  # in no trust file
    with SQLiteStore(paths.db) as store:
        state = Checkpointer(store, _demo.keyring(paths)).load(_demo.RUN_ID).state
        now = datetime.now(UTC)
        body = new_approval(
            state, "mallory", issued_at=now, expires_at=now + timedelta(seconds=300), nonce="n" * 32
        )
        store.put_evidence(_demo.RUN_ID, "approval", mallory.sign(body))
    demo_child(paths, "take-evidence")
    args = ["inspect", "demo-run", "--db", str(paths.db), "--keyring", str(paths.keyring)]
    code, text, _ = run(capsys, *args)
    assert code == 0
    line = next(row for row in text.splitlines() if row.strip().startswith("#1 approval"))
    assert "mallory" in line and "[refused]" in line and "trusted" in line
    assert "waiting  for an approval of fix-calc" in text
    refused = next(row for row in text.splitlines() if " evidence_refused " in row)
    assert "mallory" in refused
    _, raw, _ = run(capsys, *args, "--json")
    report = json.loads(raw)
    assert report["inbox"][0]["status"] == "refused" and "mallory" in report["inbox"][0]["why"]
    assert report["needs_person"] is True


@pytest.mark.postgres
def test_start_creates_runs_a_worker_then_completes_on_postgresql(tmp_path: Path) -> None:
    """`tether start` makes runs in PostgreSQL that one `tether worker --idle-exit` completes."""
    from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
    from tether import _demo

    dsn = pg_dsn()
    home = tmp_path / "home"
    demo(home)  # leaves the keyring, task, policy and trust roots the factory reads
    env = {**os.environ, "TETHER_DEMO_HOME": str(home)}
    app = ["--app", "tether._demo:worker_factory"]
    with fresh_schema(dsn) as schema:
        url = url_in_schema(dsn, schema)

        def tether_cmd(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "tether.cli", *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                check=False,
            )

        started = tether_cmd("start", "run-a", "run-b", "--store", url, *app, "--json")
        assert started.returncode == 0, started.stderr
        assert [r["run_id"] for r in json.loads(started.stdout)["started"]] == ["run-a", "run-b"]
        again = tether_cmd("start", "run-a", "--store", url, *app, "--json")
        assert (
            again.returncode == 1
            and "already exists" in json.loads(again.stdout)["error"]["message"]
        )
        worked = tether_cmd("worker", "--store", url, *app, "--idle-exit")
        assert worked.returncode == 0, worked.stderr
        summary = json.loads(worked.stdout.strip().splitlines()[-1])
        assert sorted(summary["runs"]) == ["run-a", "run-b"] and summary["completed"] == 2
    for run_id in ("run-a", "run-b"):
        ws = home / "runs" / run_id
        assert (ws / "calc.py").read_text() == _demo.FIXED
