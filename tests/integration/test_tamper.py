"""Every way a checkpoint can be wrong fails closed, each with its own typed error.

The attacker here has write access to the SQLite file (not to the key): they
flip bytes, rewrite the payload and recompute a plain SHA-256, put an older
validly signed checkpoint back, or delete the high-water mark.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3

import pytest

from tests._plain import plain
from tests.conftest import ScriptedAgent, World, finish, make_policy, make_task, write
from tether.core import (
    AdmissionRefusedError,
    CheckpointCorruptError,
    IntegrityError,
    InvariantError,
    MissingHighWaterMarkError,
    PolicyMismatchError,
    RetiredKeyError,
    ScenarioMismatchError,
    SchemaVersionError,
    SignatureError,
    StaleCheckpointError,
    TaskMismatchError,
    UnknownFieldError,
    UnknownKeyError,
    WrongKeyError,
    canonical_bytes,
)
from tether.core._state import SCHEMA_VERSION
from tether.crypto import Keyring, KeyringError, seal


def agent() -> ScriptedAgent:
    return ScriptedAgent([write("notes.txt", "one"), write("notes.txt", "two", "b"), finish])


@pytest.fixture
def ran(world: World) -> World:
    """A run two writes in (generation 4: one commit per write step, the last receipt
    landed as run() returns), stopped before it finishes."""
    session = world.runtime(agent()).start("r1")
    session.run(max_steps=2)
    assert session.state.generation == 4
    return world


def newest_row(world: World) -> tuple[str, bytes]:
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        digest, envelope = conn.execute(
            "SELECT m.checkpoint_digest, c.envelope FROM tether_marks m JOIN tether_checkpoints c "
            "ON c.run_id = m.run_id AND c.checkpoint_digest = m.checkpoint_digest "
            "WHERE m.run_id = 'r1'"
        ).fetchone()
    return digest, bytes(envelope)


def put_back(world: World, envelope: bytes) -> None:
    """Overwrite the checkpoint the mark names, as someone with file access could."""
    digest, _ = newest_row(world)
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        conn.execute(
            "UPDATE tether_checkpoints SET envelope = ? WHERE run_id = 'r1' AND checkpoint_digest = ?",
            (envelope, digest),
        )


def recover(world: World, **overrides):
    return world.runtime(agent(), **overrides).recover("r1")


def test_the_untampered_checkpoint_restores(ran: World) -> None:
    """The control case: nothing altered, recovery succeeds."""
    assert recover(ran).state.generation == 4  # a recovery writes nothing until it acts


def test_random_byte_corruption_is_detected_as_corruption(ran: World) -> None:
    """Flipping any byte of the envelope raises CheckpointCorruptError, never anything weaker."""
    _, original = newest_row(ran)
    rng = random.Random(20261202)
    for position in rng.sample(range(len(original)), 60):
        corrupted = bytearray(original)
        corrupted[position] ^= 1 << rng.randrange(8)
        put_back(ran, bytes(corrupted))
        with pytest.raises(CheckpointCorruptError):
            recover(ran)
    put_back(ran, original)
    assert recover(ran).state.phase.value == "running"


def test_payload_tampering_with_a_recomputed_checksum_fails_the_signature(ran: World) -> None:
    """Changing the payload and recomputing the plain SHA-256 checksum is caught by the HMAC."""
    _, original = newest_row(ran)
    doc = json.loads(original)
    doc["payload"]["spent"]["cost"] = 77
    payload = canonical_bytes(doc["payload"])
    h = hashlib.sha256()
    for part in (doc["key_id"].encode(), doc["kcv"].encode(), doc["mac"].encode(), payload):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    doc["checksum"] = "sha256:" + h.hexdigest()
    put_back(ran, canonical_bytes(doc))
    with pytest.raises(SignatureError):
        recover(ran)


def test_a_wrong_key_under_the_same_id_is_refused(ran: World) -> None:
    """A keyring whose key k1 is another key raises WrongKeyError."""
    with pytest.raises(WrongKeyError):
        recover(ran, keyring=Keyring.generate("k1"))


def test_an_unknown_key_id_is_refused(ran: World) -> None:
    """A keyring that does not hold the signing key id raises UnknownKeyError."""
    with pytest.raises(UnknownKeyError):
        recover(ran, keyring=Keyring.generate("k9"))


def test_a_retired_key_is_refused_and_rotation_keeps_old_checkpoints_readable(ran: World) -> None:
    """After rotation k1 still verifies and k2 signs; once k1 is retired, its checkpoints fail."""
    with pytest.raises(RetiredKeyError):
        recover(ran, keyring=ran.keyring.rotate("k2").retire("k1"))
    rotated = ran.keyring.rotate("k2")
    session = recover(ran, keyring=rotated)  # signed by k1, verified by k1 (verify-only)
    session.run(max_steps=1)  # its first commit (the new epoch) is signed by k2
    assert json.loads(session.rt.checkpointer.load("r1").envelope)["key_id"] == "k2"
    assert recover(ran, keyring=rotated.retire("k1")).state.generation == session.state.generation


def test_an_older_validly_signed_checkpoint_put_back_is_a_rollback(ran: World) -> None:
    """Replacing the newest checkpoint with an older one raises StaleCheckpointError."""
    plain(ran.db)
    with sqlite3.connect(ran.db) as conn:
        (older,) = conn.execute(
            "SELECT envelope FROM tether_checkpoints WHERE run_id = 'r1' AND generation = 3"
        ).fetchone()
    put_back(ran, bytes(older))
    with pytest.raises(StaleCheckpointError) as caught:
        recover(ran)
    assert (caught.value.expected, caught.value.actual) == (4, 3)


def test_a_missing_high_water_mark_is_refused(ran: World) -> None:
    """Deleting the mark makes recovery refuse, even with the content intact."""
    plain(ran.db)
    with sqlite3.connect(ran.db) as conn:
        conn.execute("DELETE FROM tether_marks WHERE run_id = 'r1'")
    with pytest.raises(MissingHighWaterMarkError):
        recover(ran)
    with pytest.raises(MissingHighWaterMarkError):
        ran.runtime(agent()).start_or_recover("r1")


def test_unknown_fields_in_a_validly_signed_payload_are_refused(ran: World) -> None:
    """A payload with a field this schema lacks is refused even under a valid signature."""
    _, original = newest_row(ran)
    payload = json.loads(original)["payload"]
    payload["surprise"] = True
    put_back(ran, seal(canonical_bytes(payload), ran.keyring))
    with pytest.raises(UnknownFieldError) as caught:
        recover(ran)
    assert caught.value.field == "surprise"


def test_another_schema_version_is_refused(ran: World) -> None:
    """A validly signed payload of a newer schema version raises SchemaVersionError."""
    _, original = newest_row(ran)
    payload = json.loads(original)["payload"]
    payload["schema_version"] = SCHEMA_VERSION + 1
    put_back(ran, seal(canonical_bytes(payload), ran.keyring))
    with pytest.raises(SchemaVersionError):
        recover(ran)


def test_a_changed_task_or_policy_version_is_refused(ran: World) -> None:
    """Recovery under another task version, policy version or scenario fails closed."""
    fingerprint = ran.task.initial_environment.state_fingerprint
    with pytest.raises(TaskMismatchError):
        recover(ran, task=make_task(fingerprint, task_version="2"))
    with pytest.raises(TaskMismatchError):  # same version, edited content
        recover(ran, task=make_task(fingerprint, budgets={"steps": 99}))
    # The policy in force refuses a change: admission refuses it (only an
    # operator's signed admission could adopt it).
    for policy in (make_policy(policy_version="2"), make_policy(approval_ttl_s=1)):
        with pytest.raises(AdmissionRefusedError) as caught:
            recover(ran, policy=policy)
        assert caught.value.binding == "policy"
    from tether.core import Binding

    binding = Binding.of(ran.task, ran.policy)
    other = Binding(
        **{
            **{f: getattr(binding, f) for f in binding.__slots__},
            "scenario_fingerprint": "sha256:" + "5" * 64,
        }
    )
    rt = ran.runtime(agent())
    rt.binding = other
    with pytest.raises(ScenarioMismatchError):
        rt.recover("r1")


def test_the_failures_are_distinct_types(ran: World) -> None:
    """Each failure above has its own class, so callers and operators can tell them apart."""
    kinds = {
        CheckpointCorruptError,
        SignatureError,
        WrongKeyError,
        UnknownKeyError,
        RetiredKeyError,
        StaleCheckpointError,
        MissingHighWaterMarkError,
        UnknownFieldError,
        SchemaVersionError,
        TaskMismatchError,
        PolicyMismatchError,
    }
    assert len(kinds) == 11
    for kind in kinds:
        assert issubclass(kind, IntegrityError)
        others = kinds - {kind}
        assert not any(issubclass(kind, other) for other in others)


def test_invalid_state_never_moves_the_mark(world: World) -> None:
    """A state that breaks an invariant is refused before the transaction; the mark stays."""
    session = world.runtime(agent()).start("r1")
    before = session.rt.checkpointer.marks.get_mark("r1")
    broken = session.state.evolve(generation=2, phase=session.state.phase.PENDING)
    with pytest.raises(InvariantError):
        session.rt.checkpointer.advance(broken, 1)
    assert session.rt.checkpointer.marks.get_mark("r1") == before


def test_keys_shorter_than_32_bytes_are_refused() -> None:
    """A keyring will not hold a key shorter than 32 bytes."""
    with pytest.raises(KeyringError, match="shorter than 32"):
        Keyring.single("k1", b"x" * 31)


def test_no_key_material_appears_in_errors_reprs_or_checkpoints(ran: World) -> None:
    """Neither the secret nor its base64 shows up in a checkpoint, a repr or an error."""
    secret_b64 = json.loads(ran.keyring.to_json())["keys"][0]["secret"]
    secret_hex = __import__("base64").urlsafe_b64decode(secret_b64).hex()
    texts = [repr(ran.keyring), repr(ran.keyring.active)]
    plain(ran.db)
    with sqlite3.connect(ran.db) as conn:
        for table in ("tether_checkpoints", "tether_trace", "tether_ledger", "tether_blobs"):
            texts += [repr(row) for row in conn.execute(f"SELECT * FROM {table}")]
    for attempt in (
        lambda: recover(ran, keyring=Keyring.generate("k1")),
        lambda: recover(ran, keyring=Keyring.generate("k9")),
    ):
        with pytest.raises(IntegrityError) as caught:
            attempt()
        texts.append(str(caught.value))
    for text in texts:
        assert secret_b64 not in text
        assert secret_hex not in text


def test_an_equivalent_respelling_of_the_stored_bytes_is_corruption(ran: World) -> None:
    """The MAC covers the bytes as stored: `4` respelled `4.0`, or a space added, fails closed."""
    _, envelope = newest_row(ran)
    respelled = envelope.replace(b'"generation":4', b'"generation":4.0', 1)
    assert respelled != envelope
    spaced = envelope.replace(b'"generation":4', b'"generation": 4', 1)
    for damaged in (respelled, spaced):
        put_back(ran, damaged)
        with pytest.raises(CheckpointCorruptError, match="canonical envelope"):
            recover(ran)


def test_a_respelled_trace_head_fails_recovery(ran: World) -> None:
    """The head event's hash covers its data as stored: equivalent JSON with a space is a break."""
    from tether.core import TraceIntegrityError

    head = ran.runtime(agent()).checkpointer.load("r1").state.trace_head
    plain(ran.db)
    with sqlite3.connect(ran.db) as conn:
        changed = conn.execute(
            "UPDATE tether_trace SET data = replace(data, ':', ': ') WHERE hash = ?", (head,)
        ).rowcount
    assert changed == 1
    with pytest.raises(TraceIntegrityError):
        recover(ran)


def test_a_respelled_middle_trace_row_is_found_by_verify(ran: World) -> None:
    """A row below what recovery reads (moved to verify: no decision reads it) fails the full walk."""
    from tether.core import TraceIntegrityError

    plain(ran.db)

    with sqlite3.connect(ran.db) as conn:
        changed = conn.execute(
            "UPDATE tether_trace SET data = replace(data, ':', ': ') WHERE seq = 1"
        ).rowcount
    assert changed == 1
    # Recovery reads the head and the pending write's rows, not the run_started event.
    session = recover(ran)
    with pytest.raises(TraceIntegrityError):
        session.rt.checkpointer.verified_trace(session.state)  # what `tether verify` runs


def test_a_trace_row_pointing_at_itself_fails_closed_without_hanging(ran: World) -> None:
    """A cycle planted at the signed head is a TraceIntegrityError, not an endless walk."""
    from tether.core import TraceIntegrityError

    head = ran.runtime(agent()).checkpointer.load("r1").state.trace_head
    plain(ran.db)
    with sqlite3.connect(ran.db) as conn:
        conn.execute("UPDATE tether_trace SET prev_hash = hash WHERE hash = ?", (head,))
    with pytest.raises(TraceIntegrityError):
        recover(ran)
