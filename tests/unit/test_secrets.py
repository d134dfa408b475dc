"""Secret boxes and secret-bearing agent context: sealing, opening, withholding."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from tether.core import (
    CheckpointCorruptError,
    IntegrityError,
    SpecError,
    canonical_bytes,
    digest_bytes,
)
from tether.crypto import (
    Keyring,
    SecretAccessError,
    SecretBox,
    SecretIntegrityError,
    SecretKeyError,
)
from tether.runtime import REDACTED, AgentContext, Checkpointer
from tether.store import SQLiteStore

TOKEN = "tok-3f9a-very-secret"
RUN = "run-1"


def sealed_context(box: SecretBox, run_id: str = RUN) -> AgentContext:
    context = AgentContext(memory={"note": "public"}, secrets={"api_token": TOKEN, "n": 7})
    return context.seal(run_id=run_id, box=box)


def test_box_round_trips_any_json_value() -> None:
    """A sealed value opens to the same JSON value for the same run and name."""
    box = SecretBox.generate()
    for value in (TOKEN, 7, {"user": "u", "pw": ["p", 1.5]}, None, True):
        sealed = box.seal(value, run_id=RUN, name="x")
        assert box.open(sealed, run_id=RUN, name="x") == value


def test_each_seal_draws_a_fresh_nonce() -> None:
    """Sealing the same value twice gives different nonces and ciphertexts."""
    box = SecretBox.generate()
    a = box.seal(TOKEN, run_id=RUN, name="x")
    b = box.seal(TOKEN, run_id=RUN, name="x")
    assert a.nonce != b.nonce and a.ciphertext != b.ciphertext
    assert TOKEN.encode() not in a.ciphertext


@pytest.mark.parametrize(("run_id", "name"), [("run-2", "x"), (RUN, "y")])
def test_an_item_moved_to_another_run_or_name_does_not_open(run_id: str, name: str) -> None:
    """The associated data binds run id and item name: a moved item fails closed."""
    box = SecretBox.generate()
    sealed = box.seal(TOKEN, run_id=RUN, name="x")
    with pytest.raises(SecretIntegrityError) as caught:
        box.open(sealed, run_id=run_id, name=name)
    assert isinstance(caught.value, IntegrityError) and TOKEN not in str(caught.value)


def test_a_flipped_ciphertext_byte_fails_closed() -> None:
    """A tampered ciphertext raises SecretIntegrityError, never a wrong value."""
    box = SecretBox.generate()
    sealed = box.seal(TOKEN, run_id=RUN, name="x")
    flipped = bytes([sealed.ciphertext[0] ^ 1]) + sealed.ciphertext[1:]
    with pytest.raises(SecretIntegrityError):
        box.open(replace(sealed, ciphertext=flipped), run_id=RUN, name="x")


def test_wrong_missing_and_retired_keys_are_typed_errors() -> None:
    """Another key under the same id, an unknown id and a retired id each raise SecretKeyError."""
    box = SecretBox.generate("s1")
    sealed = box.seal(TOKEN, run_id=RUN, name="x")
    for other, problem in (
        (SecretBox.generate("s1"), "not the key that sealed"),
        (SecretBox.generate("s9"), "does not hold"),
        (box.rotate("s2").retire("s1"), "retired"),
    ):
        with pytest.raises(SecretKeyError, match=problem) as caught:
            other.open(sealed, run_id=RUN, name="x")
        assert caught.value.key_id == "s1"


def test_rotation_seals_with_the_new_key_and_opens_with_the_old() -> None:
    """After a rotation the new key seals; items under the previous key still open."""
    old = SecretBox.generate("s1")
    before = old.seal(TOKEN, run_id=RUN, name="x")
    new = old.rotate("s2")
    after = new.seal(TOKEN, run_id=RUN, name="x")
    assert after.key_id == "s2"
    assert new.open(before, run_id=RUN, name="x") == TOKEN
    with pytest.raises(SecretKeyError):
        old.open(after, run_id=RUN, name="x")


def test_key_file_is_written_0600_and_an_open_file_is_refused(tmp_path: Path) -> None:
    """A key file round-trips at mode 0600; one readable by group or others is refused."""
    box = SecretBox.generate("s1").rotate("s2")
    path = tmp_path / "secret-keys.json"
    box.write_file(path)
    assert path.stat().st_mode & 0o777 == 0o600
    loaded = SecretBox.from_file(path)
    assert loaded.key_ids == ("s1", "s2")
    assert loaded.open(box.seal(TOKEN, run_id=RUN, name="x"), run_id=RUN, name="x") == TOKEN
    os.chmod(path, 0o644)
    with pytest.raises(SecretKeyError, match="chmod 600"):
        SecretBox.from_file(path)
    env = {"TETHER_SECRET_KEYS": box.to_json().decode()}
    assert SecretBox.from_environ(env).key_ids == ("s1", "s2")


def test_malformed_key_documents_are_refused_without_echoing_bytes() -> None:
    """A short key, a duplicate id or an empty document raise SecretKeyError."""
    short = json.dumps({"keys": [{"id": "s1", "status": "active", "secret": "c2hvcnQ="}]})
    with pytest.raises(SecretKeyError, match="exactly 32"):
        SecretBox.from_json(short)
    with pytest.raises(SecretKeyError):
        SecretBox.from_json('{"keys": []}')
    with pytest.raises(SecretKeyError):
        SecretBox.from_environ({})


def test_repr_names_key_ids_only() -> None:
    """Neither the box nor its keys show key bytes."""
    box = SecretBox.single("s1", b"\x01" * 32)
    text = repr(box) + repr(box.active)
    assert "s1" in text and "AQEB" not in text and "\\x01" not in text


def test_a_box_sharing_a_checkpoint_key_is_refused(tmp_path: Path) -> None:
    """Secret keys must be separate from the checkpoint keyring."""
    raw = b"\x07" * 32
    store = SQLiteStore(tmp_path / "t.sqlite")
    try:
        with pytest.raises(SecretKeyError, match="separate"):
            Checkpointer(store, Keyring.single("k1", raw), secrets=SecretBox.single("s1", raw))
        Checkpointer(store, Keyring.single("k1", raw), secrets=SecretBox.generate())
    finally:
        store.close()


def test_encoded_context_holds_ciphertext_only() -> None:
    """The stored bytes carry no plaintext secret; the digest covers the ciphertext."""
    box = SecretBox.generate()
    digest, body = sealed_context(box).encode()
    assert TOKEN.encode() not in body and b"public" in body
    assert digest == digest_bytes(body)
    restored = AgentContext.decode(digest, body, run_id=RUN, box=box, release=True)
    assert restored.secrets == {"api_token": TOKEN, "n": 7} and restored.redacted == ()
    assert restored.memory == {"note": "public"}


def test_a_context_without_secrets_encodes_as_before() -> None:
    """No secrets, no secrets field: existing context digests are unchanged."""
    context = AgentContext(messages=("hi",), memory={"a": 1}, plan_cursor=2)
    sealed = context.seal(run_id=RUN, box=None)
    doc = {"messages": ["hi"], "memory": {"a": 1}, "plan_cursor": 2}
    assert (
        sealed.encode()
        == context.encode()
        == (digest_bytes(canonical_bytes(doc)), canonical_bytes(doc))
    )


def test_an_unsealed_secret_is_never_encoded() -> None:
    """encode() refuses a secret item seal() has not sealed, or whose value changed since."""
    box = SecretBox.generate()
    with pytest.raises(SecretKeyError, match="not sealed") as caught:
        AgentContext(secrets={"api_token": TOKEN}).encode()
    assert TOKEN not in str(caught.value)
    changed = replace(sealed_context(box), secrets={"api_token": "other", "n": 7})
    with pytest.raises(SecretKeyError, match="not sealed"):
        changed.encode()


def test_withheld_secrets_are_redacted_or_refused() -> None:
    """Without release (or without a box) items read as REDACTED, or the decode is refused."""
    box = SecretBox.generate()
    digest, body = sealed_context(box).encode()
    for withheld_box, release in ((box, False), (None, True)):
        redacted = AgentContext.decode(digest, body, run_id=RUN, box=withheld_box, release=release)
        assert redacted.secrets == {"api_token": REDACTED, "n": REDACTED}
        assert redacted.redacted == ("api_token", "n")
    with pytest.raises(SecretAccessError) as caught:
        AgentContext.decode(digest, body, run_id=RUN, box=None, release=True, on_withheld="refuse")
    assert caught.value.names == ("api_token", "n") and caught.value.run_id == RUN
    with pytest.raises(SecretAccessError, match="may not read"):
        AgentContext.decode(digest, body, run_id=RUN, box=box, on_withheld="refuse")
    with pytest.raises(SpecError):
        AgentContext.decode(digest, body, run_id=RUN, on_withheld="ignore")


def test_a_redacted_context_reseals_to_the_same_ciphertext() -> None:
    """Unchanged withheld items keep their stored ciphertext, even without a box."""
    box = SecretBox.generate()
    digest, body = sealed_context(box).encode()
    redacted = AgentContext.decode(digest, body, run_id=RUN)
    moved_on = replace(redacted, messages=("next",), plan_cursor=1)
    # Also when the agent builds a fresh context: the previous one vouches for the items.
    fresh = AgentContext(("next",), redacted.memory, 1, dict(redacted.secrets))
    for context, previous in ((moved_on, None), (fresh, redacted)):
        again = context.seal(run_id=RUN, box=None, previous=previous)
        assert again.redacted == ("api_token", "n")
        d2, b2 = again.encode()
        assert json.loads(b2)["secrets"] == json.loads(body)["secrets"]
        assert AgentContext.decode(d2, b2, run_id=RUN, box=box, release=True).secrets == {
            "api_token": TOKEN,
            "n": 7,
        }


def test_a_new_secret_without_a_box_is_refused_and_unchanged_keeps_its_ciphertext() -> None:
    """A new value needs the box; an unchanged released value is not sealed again."""
    box = SecretBox.generate()
    context = sealed_context(box)
    _, body = context.encode()
    same = replace(context, plan_cursor=3).seal(run_id=RUN, box=box)
    assert json.loads(same.encode()[1])["secrets"] == json.loads(body)["secrets"]
    with pytest.raises(SecretKeyError, match="no secret box") as caught:
        replace(context, secrets={"api_token": "rotated-token"}).seal(run_id=RUN, box=None)
    assert "rotated-token" not in str(caught.value)
    # A held item sealed for another run is sealed again for this one.
    other = replace(context, plan_cursor=1).seal(run_id="run-2", box=box)
    assert json.loads(other.encode()[1])["secrets"] != json.loads(body)["secrets"]


def test_a_swapped_item_with_a_matching_digest_still_fails_closed() -> None:
    """Items swapped between names inside a blob whose digest matches do not open."""
    box = SecretBox.generate()
    _, body = sealed_context(box).encode()
    doc = json.loads(body)
    doc["secrets"]["api_token"], doc["secrets"]["n"] = (
        doc["secrets"]["n"],
        doc["secrets"]["api_token"],
    )
    forged = canonical_bytes(doc)
    with pytest.raises(SecretIntegrityError):
        AgentContext.decode(digest_bytes(forged), forged, run_id=RUN, box=box, release=True)
    with pytest.raises(CheckpointCorruptError):
        AgentContext.decode(digest_bytes(body), forged, run_id=RUN, box=box, release=True)


def test_repr_shows_secret_names_never_values() -> None:
    """repr of a context (and so of a Decision) names secret items, never their values."""
    context = sealed_context(SecretBox.generate())
    assert "api_token" in repr(context) and TOKEN not in repr(context)
    assert TOKEN not in str(context)
