"""Every refusal a new user meets on the guard path says what was expected, what was found, what to do."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tether
from tether.core import format_time
from tether.testing import Sandbox

SENT: list[str] = []


@tether.effect("email.send", committed_at="sent_at")
def send_email(to: str, text: str) -> dict[str, Any]:
    """Record the email (the test's world), saying when it was sent."""
    SENT.append(to)
    return {"sent": len(SENT), "sent_at": format_time(datetime.now(UTC))}


@tether.effect("sms.send")
def send_sms(to: str, text: str) -> dict[str, Any]:
    """Record the text message."""
    SENT.append(to)
    return {"sent": len(SENT)}


class Lost(Exception):
    """The reply was lost: nobody knows whether it went."""


@tether.effect("fax.send")
def send_fax(to: str) -> None:
    """A send whose reply is lost, declaring nothing it could prove."""
    raise Lost("connection reset")


@pytest.fixture(autouse=True)
def nothing_sent() -> None:
    SENT.clear()


def approver() -> tuple[tether.Signer, tether.TrustRoots]:
    alice = tether.Signer.generate("alice", "approver")
    return alice, tether.TrustRoots.of(alice.trust_root())


def approval(signer: tether.Signer, run: Any) -> dict[str, Any]:
    now = datetime.now(UTC)
    body = tether.new_approval(
        run.session.state,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(minutes=5),
        nonce=secrets.token_hex(16),
    )
    return signer.sign(body)


def test_a_run_that_cannot_start_shows_both_environments_and_what_to_do(tmp_path: Path) -> None:
    """A workspace not in the task's initial state: both fingerprints, whole, and the ways out."""
    sandbox = Sandbox({"notes.txt": "edited\n"})
    expected = Sandbox({"notes.txt": "v0\n"}).environment()
    rt = tether.guard(
        tmp_path / "runs.sqlite",
        sandbox,
        task={
            "initial_environment": {
                "namespace": expected.namespace,
                "state_fingerprint": expected.state_fingerprint,
            }
        },
    )
    with pytest.raises(tether.EnvironmentDriftError) as caught, tether.effects.run(rt, "case-1"):
        pass
    text = str(caught.value)
    assert "run case-1 cannot start" in text
    assert f"expected: namespace=sandbox state_fingerprint={expected.state_fingerprint}" in text
    assert f"state_fingerprint={sandbox.environment().state_fingerprint}" in text
    assert "found:" in text
    assert "leave it out of the task" in text and "`tether init`" in text
    assert caught.value.run_id == "case-1"


def test_recovering_against_another_environment_shows_both_and_the_command(tmp_path: Path) -> None:
    """The adapter now serves another instance: both environments and `tether inspect RUN`."""
    db = tmp_path / "runs.sqlite"
    here = tether.function_effect("email.send", send_email.adapter.function, instance="mail-a")
    there = tether.function_effect("email.send", send_email.adapter.function, instance="mail-b")
    with tether.effects.run(tether.guard(db, here), "case-1"):
        tether.effects.call("email.send", "ana@example.com", {"text": "hi"})
    with (
        pytest.raises(tether.EnvironmentDriftError) as caught,
        tether.effects.run(tether.guard(db, there), "case-1"),
    ):
        pass
    text = str(caught.value)
    assert "instance_id=mail-a" in text and "instance_id=mail-b" in text
    assert text.count("state_fingerprint=sha256:") == 2
    assert "`tether inspect case-1`" in text and "start a new run id" in text
    assert SENT == ["ana@example.com"]


def test_a_changed_task_says_which_fields_changed_and_what_to_do(tmp_path: Path) -> None:
    """A new effect in the script changes the task: the kinds added are named, and the two ways on."""
    db = tmp_path / "runs.sqlite"
    with tether.effects.run(tether.guard(db, send_email), "case-1"):
        send_email("ana@example.com", "hi")
    with (
        pytest.raises(tether.TaskMismatchError) as caught,
        tether.effects.run(tether.guard(db, send_email, send_sms), "case-1"),
    ):
        pass
    text = str(caught.value)
    assert "task fingerprint mismatch" in text
    assert 'allowed_kinds: ["email.send"] -> ["email.send", "sms.send"]' in text
    assert "kinds.sms.send" not in text  # the task's lines only
    assert "give the runtime that task again, or start the changed one under a new run id" in text
    assert caught.value.changes[0].startswith("allowed_kinds")


def test_a_changed_policy_says_which_rule_changed_and_what_to_do(tmp_path: Path) -> None:
    """Asking for approvals after a run started: the rule that changed, and the ways on."""
    db = tmp_path / "runs.sqlite"
    with tether.effects.run(tether.guard(db, send_email), "case-1"):
        send_email("ana@example.com", "hi")
    with (
        pytest.raises(tether.AdmissionRefusedError) as caught,
        tether.effects.run(tether.guard(db, send_email, approve=[send_email]), "case-1"),
    ):
        pass
    text = str(caught.value)
    assert "kinds.email.send.needs_approval: false -> true" in text
    assert "new run id" in text and "tether admit case-1" in text
    assert caught.value.binding == "policy"


def test_a_checkpoint_sealed_with_another_keyring_names_the_keyring_and_its_ids(
    tmp_path: Path,
) -> None:
    """Recovering with the wrong keyring: the key id wanted, the file used and the ids it holds."""
    db = tmp_path / "runs.sqlite"
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    tether.Keyring.generate("first-1").write_file(first)
    tether.Keyring.generate("second-1").write_file(second)
    with tether.effects.run(
        tether.guard(db, send_email, keyring=tether.Keyring.from_file(first)), "case-1"
    ):
        send_email("ana@example.com", "hi")
    wrong = tether.guard(db, send_email, keyring=tether.Keyring.from_file(second))
    with pytest.raises(tether.IntegrityError) as caught, tether.effects.run(wrong, "case-1"):
        pass
    text = str(caught.value)
    assert "unknown key id 'first-1'" in text
    assert f"the keyring from {second} holds ['second-1']" in text
    assert "TETHER_KEYRING_FILE" in text


def test_an_approval_asked_for_without_trust_roots_names_the_commands(tmp_path: Path) -> None:
    """approve= with no trust roots: the error names tether approve, keys new and trust add."""
    rt = tether.guard(tmp_path / "runs.sqlite", send_email, approve=[send_email])
    with tether.effects.run(rt, "case-1"), pytest.raises(tether.ApprovalRequiredError) as caught:
        send_email("ana@example.com", "hi")
    text = str(caught.value)
    assert "email.send" in text and "`tether approve case-1 " in text
    assert "`tether keys new --role approver --id NAME --out people`" in text
    assert "`tether trust add people/NAME.trust.json --out trust.json`" in text
    assert 'trust=tether.TrustRoots.from_file("trust.json")' in text
    assert SENT == []
    _, trust = approver()
    rt = tether.guard(tmp_path / "more.sqlite", send_email, approve=[send_email], trust=trust)
    with tether.effects.run(rt, "case-1"), pytest.raises(tether.ApprovalRequiredError) as caught:
        send_email("ana@example.com", "hi")
    assert "tether keys new" not in str(caught.value)  # the runtime can check an approval


def test_an_approval_delivered_without_trust_roots_is_refused_naming_the_commands(
    tmp_path: Path,
) -> None:
    """run.approve(document) on a runtime with no trust roots: refused, saying how to give them."""
    alice, _ = approver()
    rt = tether.guard(tmp_path / "runs.sqlite", send_email, approve=[send_email])
    with tether.effects.run(rt, "case-1") as run:
        with pytest.raises(tether.ApprovalRequiredError):
            send_email("ana@example.com", "hi")
        with pytest.raises(tether.EvidenceError) as caught:
            run.approve(approval(alice, run))
    assert "this runtime was given no trust roots" in str(caught.value)
    assert "tether keys new --role approver" in str(caught.value)
    assert SENT == []


def test_a_person_approves_in_python_with_what_tether_exports(tmp_path: Path) -> None:
    """Signer, TrustRoots and new_approval from `import tether`: approved, the email goes once."""
    alice, trust = approver()
    rt = tether.guard(tmp_path / "runs.sqlite", send_email, approve=[send_email], trust=trust)
    with tether.effects.run(rt, "case-1") as run:
        with pytest.raises(tether.ApprovalRequiredError) as caught:
            send_email("ana@example.com", "hi")
        assert caught.value.for_this_call
        run.approve(approval(alice, run))
        assert send_email("ana@example.com", "hi").outcome == "executed"
    assert SENT == ["ana@example.com"]


def test_a_run_carrying_an_approval_restores_only_with_trust_roots_and_says_how(
    tmp_path: Path,
) -> None:
    """A pending write approved, then recovered by a runtime with no trust roots: the commands."""
    alice, trust = approver()
    db = tmp_path / "runs.sqlite"
    with tether.effects.run(
        tether.guard(db, send_email, approve=[send_email], trust=trust), "case-1"
    ) as run:
        with pytest.raises(tether.ApprovalRequiredError):
            send_email("ana@example.com", "hi")
        run.approve(approval(alice, run))
    untrusting = tether.guard(db, send_email, approve=[send_email])
    with (
        pytest.raises(tether.TrustRootsRequiredError) as caught,
        tether.effects.run(untrusting, "case-1"),
    ):
        pass
    text = str(caught.value)
    assert "run case-1 carries signed approver evidence" in text
    assert "`tether keys new --role approver" in text and "TrustRoots.from_file" in text
    assert SENT == []


def test_an_unknown_outcome_names_the_review_command(tmp_path: Path) -> None:
    """A send that declares nothing and loses its reply: review, and the command that decides it."""
    rt = tether.guard(tmp_path / "runs.sqlite", send_fax)
    with tether.effects.run(rt, "case-1"), pytest.raises(tether.NeedsReviewError) as caught:
        send_fax("+15551234")
    text = str(caught.value)
    case = caught.value.case_id
    assert case is not None and f"`tether review case-1 {case} --decision DECISION" in text
    assert "`tether inspect case-1`" in text


def test_approving_a_function_that_cannot_say_when_it_committed_is_refused_at_setup(
    tmp_path: Path,
) -> None:
    """approve= on a function effect without committed_at: refused before anything runs, saying why."""
    with pytest.raises(tether.SpecError) as caught:
        tether.guard(tmp_path / "runs.sqlite", send_sms, approve=["sms.send"])
    text = str(caught.value)
    assert "every send would go to review" in text and "committed_at='FIELD'" in text
    assert "format_time" in text


def test_a_store_in_a_missing_directory_and_a_finished_run_say_what_to_do(tmp_path: Path) -> None:
    """A store path under no directory names the directory; a call on a finished run, a new run id."""
    with pytest.raises(tether.StoreError, match=r"its directory '.*nowhere' does not exist"):
        tether.guard(f"sqlite:///{tmp_path / 'nowhere' / 'runs.sqlite'}", send_email)
    rt = tether.guard(tmp_path / "runs.sqlite", send_email)
    with tether.effects.run(rt, "case-1") as run:
        run.finish()
    with pytest.raises(tether.RunTerminalError) as caught, tether.effects.run(rt, "case-1"):
        send_email("ana@example.com", "hi")
    assert "new run id" in str(caught.value) and "`tether inspect case-1`" in str(caught.value)
    assert SENT == []
