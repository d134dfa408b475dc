"""Secret-bearing agent context through Runtime.start and recover, on a real SQLite file."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from tests._plain import plain
from tests.conftest import World
from tether.cli import main as cli_main
from tether.core import CheckpointCorruptError, Observation, Proposal
from tether.crypto import SecretAccessError, SecretBox, SecretKeyError
from tether.runtime import REDACTED, AgentContext, Decision, RunSession

TOKEN = "tok-7c1e-never-at-rest"
ROTATED = "tok-9d2f-after-rotation"


@dataclass
class SecretReader:
    """Reads notes.txt each step and records the secrets it was handed."""

    new_token: str | None = None
    seen: list[AgentContext] = field(default_factory=list)

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        self.seen.append(context)
        cursor = context.plan_cursor
        secrets = dict(context.secrets)
        if self.new_token is not None:
            secrets["api_token"] = self.new_token
        after = replace(
            context,
            messages=(*context.messages, {"step": cursor}),
            plan_cursor=cursor + 1,
            secrets=secrets,
        )
        return Decision(after, Proposal(f"read-{cursor}", "file.read", "notes.txt"))


def start(world: World, box: SecretBox) -> RunSession:
    session = world.runtime(SecretReader(), secrets=box).start(
        "run-s", AgentContext(memory={"note": "public"}, secrets={"api_token": TOKEN})
    )
    session.step()
    return session


def mark_and_trace(world: World) -> tuple[int, int]:
    with sqlite3.connect(world.db) as conn:
        (generation,) = conn.execute(
            "SELECT generation FROM tether_marks WHERE run_id = 'run-s'"
        ).fetchone()
        (events,) = conn.execute(
            "SELECT COUNT(*) FROM tether_trace WHERE run_id = 'run-s'"
        ).fetchone()
    return generation, events


def raw_bytes(world: World) -> bytes:
    for store in world.stores:
        store.close()
    world.stores.clear()
    # Every file of the store (its WAL too); the run holds' lock directory holds no bytes.
    found = world.db.parent.glob(world.db.name + "*")
    return b"".join(p.read_bytes() for p in found if p.is_file())


def test_secrets_round_trip_and_only_ciphertext_reaches_the_file(world: World) -> None:
    """An authorized recovery hands the agent the real secret; the SQLite file never holds it."""
    box = SecretBox.generate()
    start(world, box)
    agent = SecretReader()
    session = world.runtime(agent, secrets=box).recover("run-s")
    session.step()
    assert agent.seen[-1].secrets == {"api_token": TOKEN} and agent.seen[-1].redacted == ()
    assert agent.seen[-1].memory == {"note": "public"}
    plain(world.db)  # the text as sealed, not as deflated
    with sqlite3.connect(world.db) as conn:
        bodies = [bytes(b) for (b,) in conn.execute("SELECT body FROM tether_blobs")]
    assert any(b"api_token" in body and b"A256GCM" in body for body in bodies)
    # The unchanged secret kept its ciphertext: every stored context seals it the same way.
    sealed = {
        json.dumps(json.loads(body)["secrets"], sort_keys=True)
        for body in bodies
        if b'"secrets"' in body
    }
    assert len(sealed) == 1
    at_rest = raw_bytes(world)
    assert b'"note":"public"' in at_rest  # the file's blob pages are what was read
    assert TOKEN.encode() not in at_rest


def test_a_tampered_context_blob_fails_closed_and_moves_nothing(world: World) -> None:
    """A flipped byte in the stored ciphertext is refused on recovery; the mark does not move."""
    box = SecretBox.generate()
    start(world, box)
    before = mark_and_trace(world)
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        rows = conn.execute("SELECT digest, body FROM tether_blobs").fetchall()
        for digest, body in rows:
            if b'"ciphertext":"' in bytes(body):
                at = bytes(body).index(b'"ciphertext":"') + 20
                flipped = (
                    bytes(body)[:at]
                    + (b"B" if bytes(body)[at : at + 1] != b"B" else b"C")
                    + bytes(body)[at + 1 :]
                )
                conn.execute("UPDATE tether_blobs SET body = ? WHERE digest = ?", (flipped, digest))
    with pytest.raises(CheckpointCorruptError):
        world.runtime(SecretReader(), secrets=box).recover("run-s")
    assert mark_and_trace(world) == before


def test_a_wrong_key_fails_closed_and_moves_nothing(world: World) -> None:
    """Recovery with another secret box raises SecretKeyError before any commit."""
    start(world, SecretBox.generate("s1"))
    before = mark_and_trace(world)
    for other in (SecretBox.generate("s1"), SecretBox.generate("s2")):
        with pytest.raises(SecretKeyError) as caught:
            world.runtime(SecretReader(), secrets=other).recover("run-s")
        assert TOKEN not in str(caught.value)
    assert mark_and_trace(world) == before


def test_rotation_opens_old_items_and_seals_new_ones_under_the_new_key(world: World) -> None:
    """After rotating, old items open; a changed item is sealed under the new key and opens later."""
    old = SecretBox.generate("s1")
    start(world, old)
    rotated = old.rotate("s2")
    writer = SecretReader(new_token=ROTATED)
    session = world.runtime(writer, secrets=rotated).recover("run-s")
    session.step()
    assert writer.seen[-1].secrets == {"api_token": TOKEN}
    reader = SecretReader()
    # s1 retired: the item now lives under s2 only.
    world.runtime(reader, secrets=rotated.retire("s1")).recover("run-s").step()
    assert reader.seen[-1].secrets == {"api_token": ROTATED}
    assert ROTATED.encode() not in raw_bytes(world)


def test_redacted_resume_tells_the_agent_and_a_later_authorized_resume_restores(
    world: World,
) -> None:
    """Without the key the agent sees the marker and names; it commits; the key brings it back."""
    box = SecretBox.generate()
    start(world, box)
    blind = SecretReader()
    session = world.runtime(blind).recover("run-s")
    session.step()
    session.step()
    assert blind.seen[-1].secrets == {"api_token": REDACTED}
    assert blind.seen[-1].redacted == ("api_token",)
    recovered = [e for e in session.trace() if e.kind == "recovered"]
    assert recovered[-1].data["secrets_withheld"] == ["api_token"]
    authorized = SecretReader()
    world.runtime(authorized, secrets=box).recover("run-s").step()
    assert authorized.seen[-1].secrets == {"api_token": TOKEN}
    assert authorized.seen[-1].redacted == ()


def test_a_redacted_epoch_cannot_set_a_secret_without_the_key(world: World) -> None:
    """A new secret value with no box to seal it is refused at the commit; nothing moves."""
    start(world, SecretBox.generate())
    session = world.runtime(SecretReader(new_token=ROTATED)).recover("run-s")
    before = mark_and_trace(world)
    with pytest.raises(SecretKeyError) as caught:
        session.step()
    assert ROTATED not in str(caught.value)
    assert mark_and_trace(world) == before


def test_refused_resume_raises_and_moves_nothing(world: World) -> None:
    """on_secrets_withheld='refuse' without the key raises SecretAccessError; nothing moves."""
    box = SecretBox.generate()
    start(world, box)
    before = mark_and_trace(world)
    runtime = world.runtime(SecretReader(), on_secrets_withheld="refuse", lease_ttl_s=30.0)
    with pytest.raises(SecretAccessError) as caught:
        runtime.recover("run-s")
    assert caught.value.names == ("api_token",) and caught.value.run_id == "run-s"
    assert mark_and_trace(world) == before
    # The refused recovery released the lease it took: one that may read the secret gets in.
    reader = SecretReader()
    authorized = world.runtime(reader, secrets=box, on_secrets_withheld="refuse", lease_ttl_s=30.0)
    authorized.recover("run-s").step()
    assert reader.seen[-1].secrets == {"api_token": TOKEN}


def test_no_secret_in_repr_trace_or_cli_output(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """repr, the trace and tether inspect / verify never show a secret's value."""
    box = SecretBox.generate()
    session = start(world, box)
    recovered = world.runtime(SecretReader(), secrets=box).recover("run-s")
    recovered.step()
    shown: list[Any] = [
        repr(session.context),
        repr(recovered.context),
        repr(Decision(recovered.context)),
        str(recovered.context),
    ]
    shown += [json.dumps(e.data) for e in recovered.trace()]
    keyring = tmp_path / "keyring.json"
    world.keyring.write_file(keyring)
    common = ["run-s", "--db", str(world.db), "--keyring", str(keyring)]
    for argv in (["inspect", *common], ["inspect", *common, "--json"], ["verify", *common]):
        assert cli_main(argv) == 0
        captured = capsys.readouterr()
        shown += [captured.out, captured.err]
    assert recovered.context.secrets == {"api_token": TOKEN}
    assert all(TOKEN not in text for text in shown)
