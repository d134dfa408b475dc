"""`tether runs`, `resume`, and the signing commands' refusals, as real processes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import ScriptedAgent, World, finish
from tests.e2e.test_cli import tether
from tests.e2e.test_cli_humans import _frozen_pending
from tether.crypto import Signer


def _inbox(db: str) -> int:
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute("SELECT count(*) FROM tether_inbox").fetchone()
    return int(count)


def test_runs_lists_a_run_waiting_for_an_approval_as_needing_a_person(tmp_path: Path) -> None:
    """The waiting run is listed with its phase and the write it waits on, in text and JSON."""
    run = _frozen_pending(tmp_path)
    rows = json.loads(tether("runs", "--db", str(run["db"]), "--json").stdout)["runs"]
    (row,) = rows
    assert row["run_id"] == "demo-run" and row["phase"] == "pending"
    assert row["needs_person"] and "approval of fix-calc" in row["waiting_for"]
    text = tether("runs", "--db", str(run["db"]), "--needs-me").stdout
    assert "demo-run" in text and "pending" in text and "!" in text
    none = tether("runs", "--db", str(run["db"]), "--phase", "completed").stdout
    assert none.strip() == "no runs"


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--key", "{reviewer}"], "takes an approver key"),
        (["--trust", "{other_trust}"], "UnknownSignerError"),
        (["--generation", "1"], "StaleViewError"),
        (["--ttl", "901"], "longer than the policy's approval_ttl_s"),
    ],
)
def test_approve_refuses_before_signing_what_the_runtime_would_refuse(
    tmp_path: Path, extra: list[str], said: str
) -> None:
    """A reviewer's key, an untrusted key, a stale view or a too-long ttl: exit 1, inbox empty."""
    run = _frozen_pending(tmp_path)
    other = Signer.generate("someone", "approver")
    other_trust = tmp_path / "other.trust.json"
    other_trust.write_text(json.dumps({"signers": [other.trust_root()]}))
    values = {
        "reviewer": str(run["paths"].signer_key("reviewer")),  # type: ignore[attr-defined]
        "other_trust": str(other_trust),
    }
    args = [a.format(**values) for a in extra]
    key = [] if "--key" in args else ["--key", str(run["key"])]
    result = tether(
        "approve",
        "demo-run",
        "fix-calc",
        "--db",
        str(run["db"]),
        *key,
        *args,
        "--yes",
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr
    assert _inbox(str(run["db"])) == 0


def test_approve_with_the_runtimes_trust_file_delivers_one_document(tmp_path: Path) -> None:
    """The approver named in the trust file signs; the JSON says what was signed."""
    run = _frozen_pending(tmp_path)
    trust = str(run["paths"].trust)  # type: ignore[attr-defined]
    out = tether(
        "approve",
        "demo-run",
        "fix-calc",
        "--db",
        str(run["db"]),
        "--key",
        str(run["key"]),
        "--trust",
        trust,
        "--keyring",
        str(run["keyring"]),
        "--yes",
        "--json",
    )
    report = json.loads(out.stdout)
    assert report["inbox"] == 1 and report["kind"] == "approval"
    assert report["signed"]["action_id"] == "fix-calc" and report["checkpoint_verified"]
    assert _inbox(str(run["db"])) == 1


def test_resume_of_an_unknown_run_is_one_line(tmp_path: Path) -> None:
    """resume names the missing run without a traceback."""
    run = _frozen_pending(tmp_path)
    result = tether("resume", "nope", "--db", str(run["db"]), check=False)
    assert result.returncode == 1 and "nope" in result.stderr
    assert "Traceback" not in result.stderr


def test_cancel_signs_a_cancel_for_an_operator_and_refuses_other_keys(tmp_path: Path) -> None:
    """Neither --key nor --app is a one-line error, an approver's key is refused, an operator's delivers."""
    run = _frozen_pending(tmp_path)
    db = str(run["db"])
    neither = tether("cancel", "demo-run", "--reason", "r", "--db", db, check=False)
    assert neither.returncode == 1 and "--key" in neither.stderr
    approver = tether(
        "cancel",
        "demo-run",
        "--reason",
        "r",
        "--db",
        db,
        "--key",
        str(run["key"]),
        "--yes",
        check=False,
    )
    assert approver.returncode == 1 and "operator" in approver.stderr
    assert _inbox(db) == 0
    tether("keys", "new", "--role", "operator", "--id", "ops", "--out", str(tmp_path))
    ops = ["cancel", "demo-run", "--reason", "duplicate ticket", "--db", db]
    ops += ["--key", str(tmp_path / "ops.key"), "--yes", "--json"]
    untrusted = tether(*ops, check=False)  # the run's own trust roots name no ops
    assert untrusted.returncode == 1 and "'ops' is not a trusted operator" in untrusted.stderr
    assert _inbox(db) == 0
    trust = tmp_path / "now.trust.json"
    tether("trust", "add", str(tmp_path / "ops.trust.json"), "--out", str(trust))
    out = tether(*ops, "--trust", str(trust))  # the roots its runtime runs with now
    report = json.loads(out.stdout)
    assert report["kind"] == "cancel" and report["signed"]["reason"] == "duplicate ticket"
    assert _inbox(db) == 1


def test_runs_pages_by_run_id_and_each_page_names_the_next(world: World) -> None:
    """--limit cuts pages, --after follows them: every run once; the text says how to go on."""
    rt = world.runtime(ScriptedAgent([finish]))
    ids = [f"run-{i}" for i in range(5)]
    for run_id in reversed(ids):
        rt.start(run_id)
    db = str(world.db)
    seen: list[str] = []
    after: list[str] = []
    for _ in range(5):
        report = json.loads(tether("runs", "--db", db, "--json", "--limit", "2", *after).stdout)
        seen += [row["run_id"] for row in report["runs"]]
        if report["next"] is None:
            break
        after = ["--after", report["next"]]
    assert seen == ids
    text = tether("runs", "--db", db, "--limit", "3").stdout
    assert "run-2" in text and "run-3" not in text
    assert text.strip().endswith("more: run again with --after run-2")
    last = tether("runs", "--db", db, "--limit", "3", "--after", "run-2").stdout
    assert "run-3" in last and "run-4" in last and "more:" not in last
    refused = tether("runs", "--db", db, "--limit", "0", check=False)
    assert refused.returncode == 2 and "1 to 1000" in refused.stderr
