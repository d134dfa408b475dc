"""tether.guard: a runtime from a store and its effects, the task and policy built from them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import tether
from tether.core import ANY_TARGET, Phase, Risk, SpecError, TaskSpec, format_time
from tether.core._canonical import digest
from tether.core._spec import describe_changes
from tether.crypto import Keyring, KeyringError, TrustError, default_keyring_path
from tether.store import SQLiteStore
from tether.testing import Sandbox

OUTBOX: list[dict[str, Any]] = []


@tether.effect("email.send", committed_at="sent_at")
def send_email(to: str, text: str) -> dict[str, Any]:
    """Record the email in OUTBOX (the test's world), saying when it was sent."""
    OUTBOX.append({"to": to, "text": text})
    return {"sent": len(OUTBOX), "sent_at": format_time(datetime.now(UTC))}


@tether.effect("tickets.open", target=None, idempotent=True)
def open_ticket(title: str, idempotency_key: str) -> dict[str, Any]:
    """Open a ticket; the test's world is OUTBOX too."""
    OUTBOX.append({"ticket": title, "key": idempotency_key})
    return {"ticket": len(OUTBOX)}


@pytest.fixture(autouse=True)
def empty_outbox() -> None:
    OUTBOX.clear()


def test_the_task_and_policy_are_built_from_the_declared_effects(tmp_path: Path) -> None:
    """Every declared kind allowed on any target, read at start; approvals only where asked."""
    rt = tether.guard(tmp_path / "runs.sqlite", send_email, open_ticket, approve=[send_email])
    task, policy = rt.task, rt.policy
    assert task.allowed_kinds == ("email.send", "tickets.open")
    assert task.permissions == ("email.send", "tickets.open")
    assert task.allowed_paths == (ANY_TARGET,)
    assert task.initial_environment is None  # read when a run starts
    assert task.verifier is None  # a finish completes the run as it is
    assert {k: (r.risk, r.permission, r.needs_approval) for k, r in policy.kinds.items()} == {
        "email.send": (Risk.MEDIUM, "email.send", True),
        "tickets.open": (Risk.MEDIUM, "tickets.open", False),
    }
    assert policy.max_risk is Risk.MEDIUM
    assert rt.trust is None  # optional until someone must sign


def test_a_guarded_loop_runs_end_to_end_from_a_store_url(tmp_path: Path) -> None:
    """guard("sqlite:///...", fn): a call runs the body once, a rerun replays, finish completes."""
    url = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    with tether.effects.run(tether.guard(url, send_email), "case-1"):
        assert send_email("ana@example.com", "hello").outcome == "executed"
    with tether.effects.run(tether.guard(url, send_email), "case-1") as run:
        assert send_email("ana@example.com", "hello").replayed
        run.finish()
        assert run.phase is Phase.COMPLETED
    assert OUTBOX == [{"to": "ana@example.com", "text": "hello"}]


def test_the_store_may_be_a_url_a_path_or_a_store(tmp_path: Path) -> None:
    """A URL, a plain SQLite path (str or Path) and a store object all name the same kind of store."""
    for store in (
        f"sqlite:///{tmp_path / 'a.sqlite'}",
        str(tmp_path / "b.sqlite"),
        tmp_path / "c.sqlite",
        SQLiteStore(tmp_path / "d.sqlite"),
    ):
        assert isinstance(tether.guard(store, send_email).store, SQLiteStore)
    assert {p.name for p in tmp_path.glob("*.sqlite")} >= {"a.sqlite", "b.sqlite", "c.sqlite"}


def test_overrides_are_merged_over_the_defaults_and_whole_documents_replace_them(
    tmp_path: Path,
) -> None:
    """task= and policy= mappings change only the fields they name; a TaskSpec is used as is."""
    rt = tether.guard(
        tmp_path / "runs.sqlite",
        send_email,
        task={"task_id": "welcome", "budgets": {"steps": 7}, "allowed_paths": ["ana@example.com"]},
        policy={"kinds": {"email.send": {"risk": "high"}}, "max_risk": "high"},
    )
    assert (rt.task.task_id, rt.task.budgets.steps, rt.task.budgets.proposals) == (
        "welcome",
        7,
        1000,
    )
    assert rt.task.allowed_paths == ("ana@example.com",)
    rule = rt.policy.kinds["email.send"]
    assert (rule.risk, rule.permission, rule.needs_approval) == (Risk.HIGH, "email.send", False)
    whole = TaskSpec.from_json({**rt.task.to_json(), "task_id": "mine"})
    assert tether.guard(tmp_path / "runs.sqlite", send_email, task=whole).task is whole


@pytest.mark.parametrize(
    ("effects", "options", "field"),
    [
        ((), {}, "effects"),
        ((print,), {}, "effects[0]"),
        ((send_email,), {"approve": ["sms.send"]}, "approve[0]"),
        ((send_email,), {"approve": [print]}, "approve[0]"),
        ((open_ticket,), {"approve": [open_ticket]}, "approve[0]"),
        ((send_email,), {"task": ["not", "a", "mapping"]}, "task"),
    ],
)
def test_guard_refuses_what_it_cannot_use_naming_the_argument(
    tmp_path: Path, effects: tuple[Any, ...], options: dict[str, Any], field: str
) -> None:
    """No effects, a non-effect, an approval of an undeclared kind or of a function that cannot
    say when it committed, a bad override: SpecError naming the argument."""
    with pytest.raises(SpecError) as caught:
        tether.guard(tmp_path / "runs.sqlite", *effects, **options)
    assert caught.value.field == field


def test_approvals_go_in_a_policy_given_whole(tmp_path: Path) -> None:
    """approve= beside a Policy object is refused: the Policy says which kinds need a person."""
    policy = tether.guard(tmp_path / "runs.sqlite", send_email).policy
    with pytest.raises(SpecError, match="needs_approval"):
        tether.guard(tmp_path / "runs.sqlite", send_email, policy=policy, approve=["email.send"])


def test_an_adapter_and_effect_functions_are_guarded_together(tmp_path: Path) -> None:
    """A workspace adapter beside a function effect: both kinds allowed, each performed by its owner."""
    sandbox = Sandbox({"notes.txt": "v0\n"})
    rt = tether.guard(tmp_path / "runs.sqlite", sandbox, send_email)
    assert set(rt.task.allowed_kinds) >= {"file.write", "file.read", "email.send"}
    assert rt.policy.kinds["file.read"].risk is Risk.LOW  # a read is low risk
    with tether.effects.run(rt, "case-1") as run:
        tether.effects.call("file.write", "notes.txt", {"content": "v1\n"})
        send_email("ana@example.com", "notes written")
        run.finish()
    assert sandbox.files["notes.txt"] == "v1\n"
    assert len(OUTBOX) == 1


def test_a_run_takes_the_environment_it_finds_and_recovers_against_that(tmp_path: Path) -> None:
    """With no initial_environment, a run starts wherever the workspace is; its checkpoint binds it."""
    sandbox = Sandbox({"notes.txt": "someone else's edit\n"})
    db = tmp_path / "runs.sqlite"
    with tether.effects.run(tether.guard(db, sandbox), "case-1"):
        tether.effects.call("file.write", "notes.txt", {"content": "v1\n"})
    # The environment moved (the run's own write): the task did not, so it recovers.
    with tether.effects.run(tether.guard(db, sandbox), "case-1") as run:
        assert tether.effects.call("file.write", "notes.txt", {"content": "v1\n"}).replayed
        run.finish()
        started = run.session.trace()[0]
    assert started.kind == "run_started"
    assert started.data["environment"]["state_fingerprint"] == (
        Sandbox({"notes.txt": "someone else's edit\n"}).environment().state_fingerprint
    )


def test_a_task_without_initial_environment_or_with_any_target_keeps_old_fingerprints() -> None:
    """Tasks that name an initial environment keep the scenario digest they always had."""
    doc: dict[str, Any] = {
        "task_id": "t",
        "task_version": "1",
        "allowed_kinds": ["file.write"],
        "allowed_paths": ["notes.txt"],
        "permissions": ["w"],
        "budgets": {"proposals": 1, "steps": 1, "wall_time_s": 1, "cost": 0},
        "initial_environment": {"namespace": "n", "state_fingerprint": "sha256:00"},
    }
    named = TaskSpec.from_json(doc)
    assert named.scenario_fingerprint == digest({"initial_environment": doc["initial_environment"]})
    assert named.to_json() == doc
    doc.pop("initial_environment")
    doc["allowed_paths"] = [ANY_TARGET]
    open_task = TaskSpec.from_json(doc)
    assert open_task.initial_environment is None and open_task.to_json() == doc
    assert open_task.allows_target("any/where.txt") and open_task.allows_target("a@b.c")
    assert not named.allows_target("any/where.txt")


@pytest.mark.parametrize(
    ("before", "after", "lines"),
    [
        ({"a": 1}, {"a": 1}, ()),
        ({"a": [1]}, {"a": [1, 2]}, ("a: [1] -> [1, 2]",)),
        (
            {"kinds": {"x": {"needs_approval": False}}},
            {"kinds": {"x": {"needs_approval": True}}},
            ("kinds.x.needs_approval: false -> true",),
        ),
        ({"a": 1}, {"b": 2}, ("a: removed (was 1)", "b: added (2)")),
        ({"a": "x" * 100}, {"a": "y"}, ('a: <102 characters> -> "y"',)),
        (
            {str(n): n for n in range(9)},
            {str(n): -n - 1 for n in range(9)},
            (
                "0: 0 -> -1",
                "1: 1 -> -2",
                "2: 2 -> -3",
                "3: 3 -> -4",
                "4: 4 -> -5",
                "... and 4 more",
            ),
        ),
    ],
)
def test_describe_changes_says_what_differs_field_by_field(
    before: Any, after: Any, lines: tuple[str, ...]
) -> None:
    """Nested fields by dotted path, additions and removals, long values by size, at most six lines."""
    assert describe_changes(before, after) == lines


def test_the_default_keyring_is_made_once_private_and_read_back(tmp_path: Path) -> None:
    """Keyring.default() makes a 0600 file in a 0700 directory, then reads the same key back."""
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path / "home")}
    made = Keyring.default(env)
    path = tmp_path / "data" / "tether" / "keyring.json"
    assert made.source == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert Keyring.default(env).key_ids == made.key_ids
    assert Keyring.from_environ(env).key_ids == made.key_ids  # what the CLI falls back to
    assert "secret" not in repr(made) and made.active.key_id in repr(made)
    assert default_keyring_path({"HOME": "/h"}) == Path("/h/.local/share/tether/keyring.json")
    assert default_keyring_path({"HOME": "/h", "XDG_DATA_HOME": "rel"}) == Path(
        "/h/.local/share/tether/keyring.json"
    )  # the XDG spec ignores a relative path
    assert default_keyring_path({}) is None


def test_writing_a_keyring_over_an_existing_file_is_refused_unless_asked(tmp_path: Path) -> None:
    """An existing keyring (its keys verify old checkpoints) is kept unless replace=True; a signer key always."""
    path = tmp_path / "keyring.json"
    first, second = Keyring.generate("first-1"), Keyring.generate("second-1")
    first.write_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(KeyringError, match="already exists"):
        second.write_file(path)
    assert Keyring.from_file(path).key_ids == first.key_ids  # nothing was lost
    assert not (tmp_path / "keyring.json.tmp").exists()
    second.write_file(path, replace=True)
    assert Keyring.from_file(path).key_ids == second.key_ids
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(KeyringError, match="cannot write keyring file"):
        first.write_file(tmp_path / "missing" / "keyring.json")
    signer = tether.Signer.generate("ops", "approver")
    signer.write_file(tmp_path / "ops.key")
    with pytest.raises(TrustError, match="already exists"):
        tether.Signer.generate("ops", "approver").write_file(tmp_path / "ops.key")


def test_a_named_keyring_comes_first(tmp_path: Path) -> None:
    """$TETHER_KEYRING_FILE beats the default file; a missing one says how to make it."""
    named = tmp_path / "named.json"
    Keyring.generate("named-1").write_file(named)
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "TETHER_KEYRING_FILE": str(named)}
    assert Keyring.default(env).key_ids == ("named-1",)
    assert not (tmp_path / "data").exists()
    with pytest.raises(KeyringError, match=r"tether keyring new .*missing\.json"):
        Keyring.default({"TETHER_KEYRING_FILE": str(tmp_path / "missing.json")})


def test_two_processes_making_the_default_keyring_at_once_end_with_one(tmp_path: Path) -> None:
    """Four interpreters race to make the keyring: all read the same key id."""
    path = tmp_path / "race" / "keyring.json"
    code = "import sys; from tether.crypto import Keyring; print(Keyring.load_or_create(sys.argv[1]).key_ids[0])"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(path)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    ids = {racer.communicate(timeout=60)[0].strip() for racer in racers}
    assert len(ids) == 1 and Keyring.from_file(path).key_ids == (ids.pop(),)
    assert [p.name for p in path.parent.iterdir()] == ["keyring.json"]  # nothing left aside


def test_a_keyring_file_others_can_read_is_refused_with_the_command_that_fixes_it(
    tmp_path: Path,
) -> None:
    """A keyring file left open to others (the default or a named one) is refused, naming chmod 600 and the file."""
    path = tmp_path / "data" / "tether" / "keyring.json"
    Keyring.default({"XDG_DATA_HOME": str(tmp_path / "data")})
    path.chmod(0o644)
    with pytest.raises(KeyringError) as caught:
        Keyring.default({"XDG_DATA_HOME": str(tmp_path / "data")})
    assert f"chmod 600 {path}" in str(caught.value) and "0644" in str(caught.value)
    with pytest.raises(KeyringError, match="chmod 600"):
        Keyring.from_environ({"XDG_DATA_HOME": str(tmp_path / "data")})
    named = tmp_path / "named.json"
    Keyring.generate("named-1").write_file(named)
    named.chmod(0o640)  # a named file is held to the same rule as the default one
    with pytest.raises(KeyringError, match=f"chmod 600 {named}"):
        Keyring.from_file(named)
    with pytest.raises(KeyringError, match="chmod 600"):
        Keyring.from_environ({"TETHER_KEYRING_FILE": str(named)})


def test_no_keyring_anywhere_names_every_way_to_give_one(tmp_path: Path) -> None:
    """With nothing named and no default file, from_environ names the variables and the path."""
    with pytest.raises(KeyringError) as caught:
        Keyring.from_environ({"HOME": str(tmp_path)})
    text = str(caught.value)
    assert "TETHER_KEYRING_FILE" in text and "TETHER_KEYRING" in text
    assert str(tmp_path / ".local/share/tether/keyring.json") in text
    with pytest.raises(KeyringError, match="set HOME or XDG_DATA_HOME"):
        Keyring.default({})


@pytest.mark.parametrize(
    ("run_id", "problem"),
    [
        ("", "empty or blank"),
        ("   ", "empty or blank"),
        (" order-1", "whitespace at an end"),
        ("order-1\n", "whitespace at an end"),
        ("a\x00b", "control character"),
        ("a\tb", "control character"),
        ("order\u200b-1", "invisible formatting character U\\+200B"),
        ("order-\u202e1", "invisible formatting character U\\+202E"),
        ("order-\ud800", "lone surrogate"),
        ("x" * 201, "at most 200 characters"),
        (None, "a run id is a string"),
    ],
)
def test_a_run_id_no_person_could_type_back_is_refused_before_anything_is_written(
    tmp_path: Path, run_id: Any, problem: str
) -> None:
    """Runtime.start and tether.effects.run refuse an empty, blank, padded, control-character or over-long run id (SpecError), writing nothing."""
    db = tmp_path / "runs.sqlite"
    runtime = tether.guard(f"sqlite:///{db}", send_email, keyring=Keyring.generate("k1"))
    with pytest.raises(SpecError, match=problem) as caught, tether.effects.run(runtime, run_id):
        pass
    assert caught.value.field == "run_id"
    if run_id is not None:  # Runtime.start() without an id mints one
        with pytest.raises(SpecError, match=problem):
            runtime.start(run_id)
    assert runtime.checkpointer.marks.runs() == []  # nothing was written


def test_a_run_id_of_any_printable_characters_is_kept_whole(tmp_path: Path) -> None:
    """A run id with slashes, spaces inside, accents and 200 characters starts and is read back as given."""
    db = tmp_path / "runs.sqlite"
    runtime = tether.guard(f"sqlite:///{db}", send_email, keyring=Keyring.generate("k1"))
    for run_id in ("orders/42 for é", "x" * 200):
        with tether.effects.run(runtime, run_id) as run:
            run.finish()
        assert runtime.recover(run_id).state.run_id == run_id
