"""The signers' tools and the two human-in-the-loop demos, as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_cli import demo, demo_child, tether


def test_keys_new_writes_a_0600_private_key_and_a_public_trust_root(tmp_path: Path) -> None:
    """The private half is mode 0600; the trust file holds only the public key."""
    out = tether("keys", "new", "--role", "approver", "--id", "alice", "--out", str(tmp_path))
    private, public = tmp_path / "alice.key", tmp_path / "alice.trust.json"
    assert private.stat().st_mode & 0o777 == 0o600
    (root,) = json.loads(public.read_text())["signers"]
    assert set(root) == {"id", "role", "alg", "public_key"}
    assert json.loads(private.read_text())["private_key"] not in out.stdout


def test_approval_demo_refreshes_an_expired_approval_across_restarts(tmp_path: Path) -> None:
    """An approval that expired while the run was down is readable but frozen until refreshed."""
    report = demo(tmp_path, "--scenario", "approval")
    assert report["phase"] == "completed"
    assert report["workspace_writes"] == 1
    assert any("frozen" in line for line in report["story"])
    db, keyring = str(report["db"]), str(report["keyring"])
    kinds = [
        e["kind"]
        for e in json.loads(
            tether(
                "inspect", "demo-run", "--db", db, "--keyring", keyring, "--json", "--all"
            ).stdout
        )["trace"]
    ]
    assert kinds.count("approval_recorded") == 2
    assert "approval_superseded" in kinds


def test_conflict_demo_resolves_by_a_signed_replan_across_restarts(tmp_path: Path) -> None:
    """Same key, different intent freezes the run; a signed replan quarantines the key."""
    report = demo(tmp_path, "--scenario", "conflict")
    assert report["phase"] == "completed"
    assert report["workspace_writes"] == 1
    shown = json.loads(
        tether(
            "inspect",
            "demo-run",
            "--db",
            str(report["db"]),
            "--keyring",
            str(report["keyring"]),
            "--json",
        ).stdout
    )
    assert shown["state"]["quarantined_keys"]
    kinds = [e["kind"] for e in shown["trace"]]
    assert "needs_review" in kinds and "review_sealed" in kinds


def _frozen_pending(tmp_path: Path) -> dict[str, object]:
    """A demo run left pending for approval: the approval scenario's first stage by hand."""
    from tether import _demo

    paths = _demo.DemoPaths.under(tmp_path)
    _demo.prepare(paths, "approval")
    demo_child(paths, "start")
    return {
        "db": str(paths.db),
        "keyring": str(paths.keyring),
        "key": str(paths.signer_key("approver")),
        "paths": paths,
    }


def test_approve_asks_and_a_no_records_nothing(tmp_path: Path) -> None:
    """Without --yes, approve shows the bound fields and records nothing unless told yes."""
    run = _frozen_pending(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tether.cli",
            "approve",
            "demo-run",
            "fix-calc",
            "--db",
            run["db"],
            "--key",
            run["key"],
            "--keyring",
            run["keyring"],
        ],
        input="n\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    for field in ("idempotency_key", "intent_digest", "state_fingerprint", "expires_at"):
        assert field in result.stdout
    assert "not approved" in result.stdout


def test_approve_with_yes_lets_the_next_recovery_write_once(tmp_path: Path) -> None:
    """A scripted approval lands in the inbox and the recovered run completes with one write."""
    run = _frozen_pending(tmp_path)
    tether(
        "approve", "demo-run", "fix-calc", "--db", str(run["db"]), "--key", str(run["key"]), "--yes"
    )
    paths = run["paths"]
    demo_child(paths, "recover")
    shown = json.loads(
        tether(
            "inspect",
            "demo-run",
            "--db",
            str(run["db"]),
            "--keyring",
            str(run["keyring"]),
            "--json",
        ).stdout
    )
    assert shown["state"]["phase"] == "completed"
    text = tether("inspect", "demo-run", "--db", str(run["db"]), "--keyring", str(run["keyring"]))
    assert "run demo-run: completed" in text.stdout


def test_approve_refuses_a_wrong_action_id(tmp_path: Path) -> None:
    """Approving an action that is not the pending one is a clear error."""
    run = _frozen_pending(tmp_path)
    result = tether(
        "approve",
        "demo-run",
        "not-this",
        "--db",
        str(run["db"]),
        "--key",
        str(run["key"]),
        "--yes",
        check=False,
    )
    assert result.returncode == 1 and "pending action is 'fix-calc'" in result.stderr


def test_inspect_shows_pending_approval_evidence_with_its_expiry(tmp_path: Path) -> None:
    """inspect lists the pending write and its approval with expiry and validity."""
    run = _frozen_pending(tmp_path)
    tether(
        "approve", "demo-run", "fix-calc", "--db", str(run["db"]), "--key", str(run["key"]), "--yes"
    )
    paths = run["paths"]
    demo_child(paths, "take-evidence")
    text = tether("inspect", "demo-run", "--db", str(run["db"]), "--keyring", str(run["keyring"]))
    assert "pending fix-calc" in text.stdout
    assert "approval by demo-approver" in text.stdout and "[valid]" in text.stdout


@pytest.mark.parametrize("command", ["approve", "review"])
def test_signing_commands_refuse_a_missing_store(tmp_path: Path, command: str) -> None:
    """approve and review on a path with no database refuse it and create no file."""
    run = _frozen_pending(tmp_path)
    missing = tmp_path / "typo.sqlite"
    argv = [command, "demo-run"]
    argv += ["fix-calc"] if command == "approve" else ["case-1", "--decision", "replan"]
    result = tether(*argv, "--db", str(missing), "--key", str(run["key"]), "--yes", check=False)
    assert result.returncode == 1, result.stderr
    assert "no SQLite store" in result.stderr and "Traceback" not in result.stderr
    assert not missing.exists()


def test_approve_checks_the_ttl_against_the_runs_policy(tmp_path: Path) -> None:
    """With --policy, a ttl over its approval_ttl_s or another policy file is refused up front."""
    import json as jsonlib

    run = _frozen_pending(tmp_path)
    paths = run["paths"]
    common = ["approve", "demo-run", "fix-calc", "--db", str(run["db"]), "--key", str(run["key"])]
    policy = str(paths.policy)  # type: ignore[attr-defined]
    allowed = jsonlib.loads(Path(policy).read_text())["approval_ttl_s"]
    too_long = tether(*common, "--policy", policy, "--ttl", str(allowed + 1), "--yes", check=False)
    assert too_long.returncode == 1 and "longer than the policy's" in too_long.stderr
    other = tmp_path / "other-policy.json"
    other.write_text(
        jsonlib.dumps({**jsonlib.loads(Path(policy).read_text()), "policy_version": "9"})
    )
    wrong = tether(*common, "--policy", str(other), "--yes", check=False)
    assert wrong.returncode == 1 and "runs under policy" in wrong.stderr
    missing = tether(*common, "--policy", str(tmp_path / "nope.json"), "--yes", check=False)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    fine = tether(*common, "--policy", policy, "--yes")
    assert "approval delivered" in fine.stdout


def test_signing_commands_refuse_a_missing_store_named_by_url(tmp_path: Path) -> None:
    """--store sqlite:///typo is refused like --db typo, and no file appears."""
    run = _frozen_pending(tmp_path)
    missing = tmp_path / "typo.sqlite"
    url = f"sqlite:///{missing}"
    result = tether(
        "approve",
        "demo-run",
        "fix-calc",
        "--store",
        url,
        "--key",
        str(run["key"]),
        "--yes",
        check=False,
    )
    assert result.returncode == 1 and "no SQLite store" in result.stderr
    assert not missing.exists()
