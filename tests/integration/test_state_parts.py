"""A checkpoint names its state's big parts by digest; a step stores only the parts it changed."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pytest

from tests._plain import plain
from tests.conftest import ScriptedAgent, World, finish, write
from tether.core import CheckpointCorruptError, Phase, RunState, canonical_bytes
from tether.core._payload import expand_payload
from tether.core._state import SCHEMA_VERSION
from tether.crypto import seal


def agent() -> ScriptedAgent:
    return ScriptedAgent(
        [write("notes.txt", "one"), write("notes.txt", "two", "b"), write("a.txt", "3"), finish]
    )


def newest(world: World) -> tuple[str, dict]:
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        found, envelope = conn.execute(
            "SELECT m.checkpoint_digest, c.envelope FROM tether_marks m JOIN tether_checkpoints c "
            "ON c.run_id = m.run_id AND c.checkpoint_digest = m.checkpoint_digest "
            "WHERE m.run_id = 'r1'"
        ).fetchone()
    conn.close()
    return found, json.loads(envelope)["payload"]


def blob_bodies(world: World) -> list[bytes]:
    plain(world.db)
    with sqlite3.connect(world.db) as conn:
        rows = [bytes(row[0]) for row in conn.execute("SELECT body FROM tether_blobs")]
    conn.close()
    return rows


def test_a_run_stores_its_binding_once_and_names_its_parts_by_digest(world: World) -> None:
    """Every checkpoint names the same binding part; its bytes are stored once for the whole run."""
    session = world.runtime(agent()).start("r1")
    session.run(max_steps=3)
    _, payload = newest(world)
    assert payload["schema_version"] == SCHEMA_VERSION == 4
    assert "binding" not in payload and "binding" in payload["parts"]
    binding = canonical_bytes(session.state.binding.to_json())
    assert "sha256:" + hashlib.sha256(binding).hexdigest() == payload["parts"]["binding"]
    assert blob_bodies(world).count(binding) == 1
    with sqlite3.connect(world.db) as conn:
        (checkpoints,) = conn.execute("SELECT COUNT(*) FROM tether_checkpoints").fetchone()
    conn.close()
    assert checkpoints == session.state.generation > 3


def test_a_run_recovers_from_its_parts_and_finishes(world: World) -> None:
    """Recovery reads the parts back, verified, and the run goes on to completion."""
    first = world.runtime(agent()).start("r1")
    first.run(max_steps=2)
    before = first.state
    again = world.runtime(agent()).recover("r1")
    assert again.state.binding == before.binding
    assert again.state.last_write == before.last_write
    outcome = again.run()
    assert again.state.phase is Phase.COMPLETED, outcome


def test_a_checkpoint_written_before_parts_still_recovers(world: World) -> None:
    """A schema-3 checkpoint (every part inline) is read as it always was, and the next is schema 4."""
    session = world.runtime(agent()).start("r1")
    session.run(max_steps=2)
    found, payload = newest(world)
    store = world.store()
    whole = expand_payload(payload, store.get_blob)
    old = canonical_bytes({**whole, "schema_version": 3})
    envelope = seal(old, world.keyring)
    new = "sha256:" + hashlib.sha256(envelope).hexdigest()
    with sqlite3.connect(world.db) as conn:
        conn.execute(
            "UPDATE tether_checkpoints SET envelope = ?, checkpoint_digest = ? "
            "WHERE run_id = 'r1' AND checkpoint_digest = ?",
            (envelope, new, found),
        )
        conn.execute("UPDATE tether_marks SET checkpoint_digest = ? WHERE run_id = 'r1'", (new,))
    conn.close()
    again = world.runtime(agent()).recover("r1")
    assert again.state.binding == session.state.binding
    again.run()
    assert again.state.phase is Phase.COMPLETED
    assert newest(world)[1]["schema_version"] == 4


@pytest.mark.parametrize("damage", ["delete", "edit"])
def test_a_missing_or_edited_part_fails_recovery_closed(world: World, damage: str) -> None:
    """A part row deleted, or edited under its digest, is corruption: the run is not restored."""
    session = world.runtime(agent()).start("r1")
    session.run(max_steps=2)
    _, payload = newest(world)
    part = payload["parts"]["binding"]
    with sqlite3.connect(world.db) as conn:
        if damage == "delete":
            conn.execute("DELETE FROM tether_blobs WHERE digest = ?", (part,))
        else:
            conn.execute(
                "UPDATE tether_blobs SET body = CAST(REPLACE(CAST(body AS TEXT), 'policy', 'POLICY') "
                "AS BLOB) WHERE digest = ?",
                (part,),
            )
    conn.close()
    with pytest.raises(
        CheckpointCorruptError, match="missing" if damage == "delete" else "altered"
    ):
        world.runtime(agent()).recover("r1")


def test_a_step_stores_the_parts_it_changed_and_no_other(world: World) -> None:
    """A write step's commit writes what it changed inline and stores no unchanged part again."""
    session = world.runtime(agent()).start("r1")
    session.run(max_steps=1)
    before = set(blob_bodies(world))
    session.step()
    session.land_deferred()  # the receipt's commit (the next step's, or this one)
    added = set(blob_bodies(world)) - before
    state: RunState = session.state
    binding = canonical_bytes(state.binding.to_json())
    last_write = canonical_bytes(state.last_write.to_json()) if state.last_write else b""
    assert binding not in added
    # Changed at this step, the last write travels inside the signed payload.
    _, payload = newest(world)
    assert last_write not in added and "last_write" not in payload["parts"]
    assert canonical_bytes(payload["last_write"]) == last_write
