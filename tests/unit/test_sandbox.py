"""The in-memory Sandbox adapter: the same write contract as the workspace, in a dict."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from tether.adapters import Adapter, NotQueryableError, UnsupportedEntryError
from tether.core import (
    AdapterError,
    AdapterUnavailableError,
    ContractViolationError,
    EnvironmentDriftError,
    EnvironmentState,
    IdempotencyConflictError,
    Intent,
    PreconditionFailedError,
    digest,
    digest_bytes,
)
from tether.testing import Sandbox


def counter_ids() -> itertools.count[int]:
    return itertools.count(1)


def make_sandbox(**kwargs: object) -> Sandbox:
    ids = counter_ids()
    defaults: dict[str, object] = {
        "instance_id": "inst-1",
        "id_source": lambda: f"id{next(ids)}",
        "clock": lambda: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    }
    defaults.update(kwargs)
    files = defaults.pop("files", {"a.txt": "alpha"})
    return Sandbox(files, **defaults)  # type: ignore[arg-type]


def propose(adapter: Sandbox, target: str, content: str) -> tuple[Intent, EnvironmentState]:
    args = adapter.normalize("file.write", target, {"content": content})
    return Intent("file.write", target, args, "low"), adapter.environment()


def test_sandbox_satisfies_the_adapter_protocol() -> None:
    """The sandbox is structurally an Adapter."""
    assert isinstance(make_sandbox(), Adapter)


def test_environment_fingerprints_the_files() -> None:
    """The fingerprint is the digest of the root tree object (a Merkle tree), at version 0."""
    env = make_sandbox(files={"a.txt": "alpha", "d/b.txt": "beta"}).environment()
    beta = {"b.txt": {"type": "file", "hash": digest_bytes(b"beta"), "exec": False}}
    alpha = {"type": "file", "hash": digest_bytes(b"alpha"), "exec": False}
    expected = digest({"a.txt": alpha, "d": {"type": "dir", "hash": digest(beta)}})
    assert env == EnvironmentState("sandbox", "inst-1", 0, expected)


def test_instance_id_comes_from_the_id_source_when_not_given() -> None:
    """Without an explicit instance id the injected id function names the instance."""
    sandbox = Sandbox(id_source=lambda: "from-source")
    assert sandbox.instance_id == "from-source"


def test_normalize_adds_expected_hash_of_current_content() -> None:
    """normalize records the target's current hash, or None when it does not exist."""
    sandbox = make_sandbox()
    assert sandbox.normalize("file.write", "a.txt", {"content": "x"}) == {
        "content": "x",
        "expected_sha256": digest_bytes(b"alpha"),
    }
    assert sandbox.normalize("file.write", "new.txt", {"content": "x"})["expected_sha256"] is None


@pytest.mark.parametrize(
    ("kind", "target", "args", "reason"),
    [
        ("file.delete", "a.txt", {"content": "x"}, "bad_kind"),
        ("file.write", "a.txt", {"content": "x", "mode": 1}, "bad_args"),
        ("file.write", "a.txt", {"content": 3}, "bad_args"),
        ("file.write", "a.txt", {}, "bad_args"),
        ("file.write", "../a.txt", {"content": "x"}, "bad_target"),
        ("file.write", "/etc/passwd", {"content": "x"}, "bad_target"),
        ("file.write", "d//a.txt", {"content": "x"}, "bad_target"),
    ],
)
def test_normalize_refuses_what_it_cannot_write(
    kind: str, target: str, args: dict[str, object], reason: str
) -> None:
    """Unsupported kinds, malformed args and non-canonical targets are contract violations."""
    with pytest.raises(ContractViolationError) as caught:
        make_sandbox().normalize(kind, target, args)
    assert caught.value.reason == reason


def test_execute_writes_and_returns_a_full_receipt() -> None:
    """execute changes the file, bumps the version and returns a receipt with every field."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "a.txt", "omega")
    receipt = sandbox.execute("key-1", intent, prestate)
    assert sandbox.files["a.txt"] == "omega"
    assert receipt.idempotency_key == "key-1"
    assert receipt.intent_digest == intent.digest
    assert receipt.receipt_id == "rcpt-id1"
    assert receipt.committed_at == "2026-01-02T03:04:05.000000Z"
    assert receipt.result == {"path": "a.txt", "sha256": digest_bytes(b"omega"), "bytes": 5}
    assert receipt.business_object_id == "a.txt"
    assert receipt.post_state == sandbox.environment()
    assert sandbox.write_count() == 1


def test_replay_with_same_key_and_intent_returns_the_first_receipt() -> None:
    """A retry with the same key and intent gets the same receipt and causes no second write."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "a.txt", "omega")
    first = sandbox.execute("key-1", intent, prestate)
    second = sandbox.execute("key-1", intent, prestate)
    assert second == first
    assert sandbox.write_count() == 1
    assert sandbox.lookup("key-1") == first


def test_same_key_with_another_intent_conflicts_and_carries_the_receipt() -> None:
    """Reusing a key for a different intent raises IdempotencyConflictError with the receipt."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "a.txt", "omega")
    first = sandbox.execute("key-1", intent, prestate)
    other = Intent("file.write", "a.txt", {"content": "zeta", "expected_sha256": None}, "low")
    with pytest.raises(IdempotencyConflictError) as caught:
        sandbox.execute("key-1", other, prestate)
    assert caught.value.receipt == first
    assert caught.value.expected_digest == other.digest
    assert sandbox.write_count() == 1


def test_precondition_failure_when_the_target_changed() -> None:
    """A conditional write is refused when the target no longer holds the expected content."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "a.txt", "omega")
    sandbox.bypass_write("a.txt", "someone else")
    with pytest.raises(PreconditionFailedError) as caught:
        sandbox.execute("key-1", intent, prestate)
    assert caught.value.actual == digest_bytes(b"someone else")
    assert sandbox.write_count() == 0


def test_derive_post_state_predicts_the_environment_after_execute() -> None:
    """derive_post_state equals both environment() and the receipt's post_state afterwards."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "new/dir/file.txt", "hello")
    predicted = sandbox.derive_post_state(prestate, intent)
    receipt = sandbox.execute("key-1", intent, prestate)
    assert predicted == sandbox.environment() == receipt.post_state
    assert predicted.version == prestate.version + 1


def test_derive_post_state_refuses_a_stale_prestate() -> None:
    """derive_post_state raises EnvironmentDriftError when the files moved since the prestate."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "b.txt", "hello")
    sandbox.bypass_write("c.txt", "drift")
    with pytest.raises(EnvironmentDriftError):
        sandbox.derive_post_state(prestate, intent)


def test_execute_refuses_a_prestate_of_another_instance() -> None:
    """An intent prepared against another instance is refused before anything is written."""
    sandbox = make_sandbox()
    intent, _ = propose(sandbox, "b.txt", "hello")
    foreign = make_sandbox(instance_id="inst-2").environment()
    with pytest.raises(EnvironmentDriftError):
        sandbox.execute("key-1", intent, foreign)
    assert sandbox.write_count() == 0


def test_bypass_write_moves_fingerprint_but_not_version() -> None:
    """A write by another actor changes the fingerprint, not the version or write count."""
    sandbox = make_sandbox()
    before = sandbox.environment()
    sandbox.bypass_write("a.txt", "changed")
    after = sandbox.environment()
    assert after.state_fingerprint != before.state_fingerprint
    assert after.version == before.version
    assert sandbox.write_count() == 0


def test_non_idempotent_sandbox_writes_again_on_replay() -> None:
    """With idempotent=False a retried key performs the write a second time."""
    sandbox = make_sandbox(idempotent=False, conditional_writes=False)
    assert sandbox.capabilities.idempotent is False
    intent, prestate = propose(sandbox, "a.txt", "omega")
    assert intent.args == {"content": "omega"}
    first = sandbox.execute("key-1", intent, prestate)
    second = sandbox.execute("key-1", intent, prestate)
    assert sandbox.write_count() == 2
    assert second.receipt_id != first.receipt_id
    assert sandbox.environment().version == 2


def test_non_queryable_sandbox_refuses_lookup() -> None:
    """With queryable=False lookup raises NotQueryableError instead of answering."""
    sandbox = make_sandbox(queryable=False)
    with pytest.raises(NotQueryableError):
        sandbox.lookup("key-1")
    assert isinstance(NotQueryableError("x"), AdapterError)


def test_capabilities_say_when_a_sandbox_is_blind() -> None:
    """Capabilities live in core; only a sandbox that can neither dedup nor be queried is blind."""
    import tether.adapters
    import tether.core

    assert tether.adapters.Capabilities is tether.core.Capabilities
    assert make_sandbox().capabilities.absent_is_final is True  # the default
    assert make_sandbox().capabilities.blind is False
    assert make_sandbox(idempotent=False).capabilities.blind is False
    assert make_sandbox(queryable=False).capabilities.blind is False
    blind = make_sandbox(idempotent=False, queryable=False).capabilities
    assert (blind.idempotent, blind.queryable, blind.blind) == (False, False, True)


def test_fault_before_commit_writes_nothing() -> None:
    """fail_next(after_commit=False) raises without writing, and a retry then succeeds once."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "a.txt", "omega")
    sandbox.fail_next(after_commit=False)
    with pytest.raises(AdapterUnavailableError):
        sandbox.execute("key-1", intent, prestate)
    assert sandbox.lookup("key-1") is None
    assert sandbox.write_count() == 0
    sandbox.execute("key-1", intent, prestate)
    assert sandbox.write_count() == 1


def test_fault_after_commit_keeps_the_effect_and_its_receipt() -> None:
    """fail_next(after_commit=True) loses the reply but the write and receipt exist."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "a.txt", "omega")
    sandbox.fail_next(after_commit=True)
    with pytest.raises(AdapterUnavailableError):
        sandbox.execute("key-1", intent, prestate)
    found = sandbox.lookup("key-1")
    assert found is not None
    assert sandbox.files["a.txt"] == "omega"
    assert sandbox.execute("key-1", intent, prestate) == found
    assert sandbox.write_count() == 1


def test_verify_uses_the_callable_and_reports_the_state() -> None:
    """verify passes or fails by the verifier callable and reports the judged environment."""
    sandbox = make_sandbox(verifier=lambda files: files.get("a.txt") == "done")
    failed = sandbox.verify(("anything",), 5)
    assert (failed.passed, failed.exit_code) == (False, 1)
    sandbox.bypass_write("a.txt", "done")
    passed = sandbox.verify(("anything",), 5)
    assert (passed.passed, passed.exit_code) == (True, 0)
    assert passed.environment == sandbox.environment()
    assert passed.output_digest != failed.output_digest


def test_default_verifier_always_passes() -> None:
    """Without a verifier callable every verify passes."""
    assert Sandbox().verify((), 1).passed is True


def test_delete_receipt_loses_it() -> None:
    """delete_receipt makes lookup return None, as a lost receipt would."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "a.txt", "omega")
    sandbox.execute("key-1", intent, prestate)
    assert sandbox.delete_receipt("key-1") is True
    assert sandbox.lookup("key-1") is None
    assert sandbox.delete_receipt("key-1") is False


def test_tamper_receipt_changes_what_lookup_returns() -> None:
    """tamper_receipt rewrites a stored field so drift is visible to lookup."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "a.txt", "omega")
    original = sandbox.execute("key-1", intent, prestate)
    changed = sandbox.tamper_receipt("key-1", business_object_id="elsewhere.txt")
    assert sandbox.lookup("key-1") == changed
    assert changed.business_object_id == "elsewhere.txt"
    assert changed.fingerprint != original.fingerprint


def test_tamper_receipt_refuses_unknown_fields_and_keys() -> None:
    """tamper_receipt raises an AdapterError for a field receipts lack or a missing receipt."""
    sandbox = make_sandbox()
    intent, prestate = propose(sandbox, "a.txt", "omega")
    sandbox.execute("key-1", intent, prestate)
    with pytest.raises(AdapterError):
        sandbox.tamper_receipt("key-1", colour="red")
    with pytest.raises(AdapterError):
        sandbox.tamper_receipt("no-such-key", receipt_id="x")


def test_file_and_directory_of_the_same_name_are_refused() -> None:
    """Like a real tree, the sandbox cannot hold "a" as both a file and a directory."""
    with pytest.raises(UnsupportedEntryError):
        Sandbox({"a": "x", "a/b": "y"})
    sandbox = make_sandbox(files={"a": "x"})
    with pytest.raises(UnsupportedEntryError):
        sandbox.normalize("file.write", "a/b", {"content": "y"})


def test_read_shows_one_file() -> None:
    """file.read returns one file's text and hash; file.list every path with its hash."""
    sandbox = make_sandbox()
    seen = sandbox.read("file.read", "a.txt", {}, lambda path: True)
    assert seen["text"] == "alpha" and seen["exists"] is True
    listed = sandbox.read("file.list", "", {}, lambda path: True)
    assert list(listed["files"]) == ["a.txt"]  # type: ignore[call-overload]
    assert sandbox.read("file.list", "", {}, lambda path: False) == {"files": {}}
