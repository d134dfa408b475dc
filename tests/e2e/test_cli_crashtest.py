"""`tether crashtest`, run as a real process the way a person types it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tether.cli._crashtest import EXIT_CRASHTEST_FAILED

ROOT = Path(__file__).resolve().parents[2]


def crashtest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # From the repository root, as `tests.integration._brokenapp` is found there.
    return subprocess.run(
        [sys.executable, "-m", "tether.cli", "crashtest", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_the_example_app_passes_and_prints_its_table(tmp_path: Path) -> None:
    """The shipped example app, killed at each send: exit 0 and a table ending in PASS."""
    done = crashtest(
        "--app",
        "tether.testing.crash_example:app",
        "--points",
        "effect_sent",
        "--trials",
        "1",
        "--workdir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].endswith("PASS")
    rows = [line.split() for line in lines if line.startswith("effect_sent")]
    assert [(row[1], row[-1]) for row in rows] == [("1", "ok"), ("2", "ok")]


def test_json_reports_every_trial_and_the_clean_run(tmp_path: Path) -> None:
    """--json prints one object: the clean run's passes and effects, and each cell's trials."""
    done = crashtest(
        "--app",
        "tether.testing.crash_example:app",
        "--points",
        "intent_persisted",
        "--trials",
        "1",
        "--workdir",
        str(tmp_path),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] is True
    assert report["baseline"]["effects"] == {"file.write": 1, "message.send": 1}
    assert report["baseline"]["passes"]["intent_persisted"] == 2
    assert [c["outcome"] for c in report["cells"]] == ["ok", "ok"]
    assert report["totals"]["duplicates"] == 0


def test_a_duplicate_exits_non_zero_and_names_the_run(tmp_path: Path) -> None:
    """An adapter that sends twice after a crash: exit 4, the run named, the files kept."""
    done = crashtest(
        "--app",
        "tests.integration._brokenapp:twice",
        "--points",
        "effect_sent",
        "--trials",
        "1",
        "--workdir",
        str(tmp_path),
    )
    assert done.returncode == EXIT_CRASHTEST_FAILED, done.stderr
    assert "DUPLICATE effect_sent hit 2 run " in done.stdout
    assert done.stdout.splitlines()[-2].endswith("FAIL")
    assert f"kept in {tmp_path}" in done.stdout


def test_an_app_that_cannot_be_loaded_is_a_one_line_error() -> None:
    """A factory that returns no app fails with exit 1 and one line, not a traceback."""
    done = crashtest("--app", "tether.testing.crash_example:ReplyAgent")
    assert done.returncode == 1
    assert done.stderr.startswith("tether: error: CrashHarnessError:")
    assert "Traceback" not in done.stderr


def test_a_workdir_that_is_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    """--workdir naming a file fails with exit 1 and one line saying so, not a traceback."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    done = crashtest("--app", "tether.testing.crash_example:app", "--workdir", str(afile))
    assert done.returncode == 1
    assert done.stderr.startswith("tether: error: CrashHarnessError: workdir ")
    assert "not a directory" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_an_app_module_that_raises_on_import_is_a_one_line_error(tmp_path: Path) -> None:
    """An --app module that raises while imported fails with exit 1 and one line naming it."""
    (tmp_path / "explodes_on_import.py").write_text("raise RuntimeError('no config file')\n")
    done = crashtest("--app", "explodes_on_import:app", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith(
        "tether: error: CrashHarnessError: importing 'explodes_on_import'"
    )
    assert "RuntimeError: no config file" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
