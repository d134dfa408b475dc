"""A run keeps its runtime's trust roots in the store: public halves only, per epoch.

The people's tools (``tether approve`` and the page) refuse a signer those
roots would refuse before anything is signed; these tests read the record
back from a real SQLite store as the runtime leaves it.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tether.core import EvidenceError, UnknownSignerError
from tether.crypto import PublishedTrust, Role, Signer, TrustError, TrustRoots
from tether.runtime import open_run, prepare_approval, prepare_cancel

GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}
ALICE = Signer.generate("alice", "approver")
BOB = Signer.generate("bob", "approver")
SHARED = Signer.hmac("hm", "reviewer", b"k" * 32)


def started(world: World, trust: TrustRoots | None) -> None:
    world.policy = make_policy(kinds=GUARDED, approval_ttl_s=300)
    agent = ScriptedAgent([write("notes.txt", "v1\n", action_id="w1"), finish])
    world.runtime(agent, trust=trust).start("run-a").step()


def test_the_record_keeps_public_halves_and_never_an_hmac_secret(world: World) -> None:
    """The stored roots name alice's public key and hm's id and role; hm's secret is nowhere."""
    started(world, TrustRoots.of(ALICE.trust_root(), SHARED.trust_root()))
    view = open_run(world.store(), "run-a", keyring=world.keyring)
    assert view.trust is not None and view.trust.roots is not None
    assert view.trust.roots.role_of("alice") is Role.APPROVER
    assert view.trust.roots.role_of("hm") is Role.REVIEWER
    body = world.store().get_blob(view.trust.fingerprint or "")
    assert body is not None
    document = json.loads(body)
    assert {e["id"] for e in document["signers"]} == {"alice", "hm"}
    assert all("secret" not in e and "private_key" not in e for e in document["signers"])
    assert SHARED.trust_root()["secret"] not in body.decode()
    assert view.trust.fingerprint in json.dumps(view.landmarks[0].data)


def test_a_recovery_under_new_roots_records_them_when_its_epoch_lands(world: World) -> None:
    """Ops2 is refused under the roots the run started with, and accepted once it recovers with them."""
    ops1, ops2 = Signer.generate("ops1", "operator"), Signer.generate("ops2", "operator")
    steps = [write("notes.txt", "v1\n", action_id="w1"), write("notes.txt", "v2\n"), finish]
    world.runtime(ScriptedAgent(steps), trust=TrustRoots.of(ops1.trust_root())).start(
        "run-a"
    ).step()
    now = world.clock.now()
    view = open_run(world.store(), "run-a", keyring=world.keyring)
    with pytest.raises(UnknownSignerError, match="'ops2' is not a trusted operator"):
        prepare_cancel(view, ops2, "stop", now=now)
    session = world.runtime(ScriptedAgent(steps), trust=TrustRoots.of(ops2.trust_root())).recover(
        "run-a"
    )
    unchanged = open_run(world.store(), "run-a", keyring=world.keyring)
    assert unchanged.trust is not None and view.trust is not None
    assert unchanged.trust.seq == view.trust.seq  # nothing committed yet: no new epoch landed
    session.step()  # its first commit opens the epoch, naming the roots it runs under
    later = open_run(world.store(), "run-a", keyring=world.keyring)
    assert later.trust is not None and view.trust is not None and later.trust.seq > view.trust.seq
    assert prepare_cancel(later, ops2, "stop", now=now).document["signer"] == "ops2"
    with pytest.raises(UnknownSignerError, match="'ops1' is not a trusted operator"):
        prepare_cancel(later, ops1, "stop", now=now)


def test_a_run_without_trust_roots_refuses_every_signer_and_says_why(world: World) -> None:
    """A runtime given no trust roots accepts no signed document: the tools say so first."""
    started(world, None)
    view = open_run(world.store(), "run-a", keyring=world.keyring)
    assert view.trust is not None and view.trust.fingerprint is None
    with pytest.raises(EvidenceError, match="was given no trust roots"):
        prepare_approval(view, ALICE, "w1", now=world.clock.now())
    # Roots named explicitly (those it will run with) decide instead.
    named = TrustRoots.of(ALICE.trust_root())
    assert prepare_approval(view, ALICE, "w1", now=world.clock.now(), trust=named)


def test_published_roots_refuse_another_key_under_a_trusted_id_and_a_secret() -> None:
    """The record compares Ed25519 keys, HMAC ids and roles; a secret in a record is refused."""
    roots = TrustRoots.of(ALICE.trust_root(), SHARED.trust_root())
    record = PublishedTrust.from_json(json.dumps(roots.published()))
    record.check_signer(ALICE, Role.APPROVER)
    record.check_signer(SHARED, Role.REVIEWER)
    for signer, role in (
        (Signer.generate("alice", "approver"), Role.APPROVER),  # same id, another key
        (ALICE, Role.REVIEWER),
        (Signer.hmac("hm", "approver", b"z" * 32), Role.APPROVER),
        (BOB, Role.APPROVER),
    ):
        with pytest.raises(UnknownSignerError):
            record.check_signer(signer, role)
    leaked = {"signers": [SHARED.trust_root()]}
    with pytest.raises(TrustError):
        PublishedTrust.from_json(json.dumps(leaked))
