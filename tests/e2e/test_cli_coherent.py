"""The CLI a new user met, each rough edge a test: a real SQLite store, `tether`'s own main().

Every bad input from the issue that asked for a coherent CLI is here: an
unknown run, an empty or malformed argument on every command, a store named
by path or URL under either spelling, a signer the run's own trust roots
refuse, a key id that would leave --out, the grouped help and the one output
option. The PostgreSQL cases are in test_cli_postgres.py.
"""

from __future__ import annotations

import argparse
import json
import socket
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tether.cli import build_parser, main
from tether.cli._options import GROUPS
from tether.core import Phase
from tether.crypto import Signer, TrustRoots

GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``tether ARGV`` in this process: exit code, stdout, stderr (an escaping error fails)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    """``err`` is exactly one line (no traceback, no driver chatter); that line."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@dataclass
class Setup:
    """A real SQLite store with run-a waiting for an approval of w1; the files people hold."""

    db: str
    keyring: Path
    keys: dict[str, Path]
    trust_file: Path

    def inbox(self) -> int:
        with sqlite3.connect(self.db) as conn:
            (count,) = conn.execute("SELECT COUNT(*) FROM tether_inbox").fetchone()
        return int(count)


def make_setup(world: World, tmp: Path, trusted: tuple[str, ...] | None) -> Setup:
    """run-a under a runtime trusting the signers named (``None``: no trust roots at all).

    The signers: alice and bob (approvers), ops (operator), rev (reviewer).
    ``trust_file`` trusts all four, for the commands that name roots with --trust.
    """
    signers = {
        "alice": Signer.generate("alice", "approver"),
        "bob": Signer.generate("bob", "approver"),
        "ops": Signer.generate("ops", "operator"),
        "rev": Signer.generate("rev", "reviewer"),
    }
    keys = {}
    for name, signer in signers.items():
        keys[name] = tmp / f"{name}.key"
        signer.write_file(keys[name])
    trust_file = tmp / "all.trust.json"
    trust_file.write_text(json.dumps({"signers": [s.trust_root() for s in signers.values()]}))
    trust = None if trusted is None else TrustRoots.of(*(signers[n].trust_root() for n in trusted))
    keyring = tmp / "keyring.json"
    world.keyring.write_file(keyring)
    world.policy = make_policy(kinds=GUARDED, approval_ttl_s=300)
    rt = world.runtime(
        ScriptedAgent([write("notes.txt", "v1\n", action_id="w1"), finish]), trust=trust
    )
    session = rt.start("run-a")
    session.step()
    if session.state.phase is not Phase.PENDING:
        raise RuntimeError(f"setup: run-a is {session.state.phase}, not pending")
    return Setup(str(world.db), keyring, keys, trust_file)


@pytest.fixture
def setup(world: World, tmp_path: Path) -> Iterator[Setup]:
    yield make_setup(world, tmp_path, trusted=("alice", "ops", "rev"))


# -- the help --------------------------------------------------------------------------


def commands() -> dict[str, argparse.Action]:
    """The top-level commands as `tether --help` lists them: name -> its help entry."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {action.dest: action for action in sub._choices_actions}


def test_help_lists_every_command_once_in_a_group_with_a_line_of_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tether --help` groups the commands (run, inspect, people, keys, operate, test); each once, each with help."""
    listed = commands()
    grouped = [name for _, _, names in GROUPS for name in names]
    assert sorted(grouped) == sorted(listed), "every command in exactly one group"
    assert [title for title, _, _ in GROUPS] == [
        "run",
        "inspect",
        "people",
        "keys",
        "operate",
        "test",
    ]
    for name, action in listed.items():
        assert action.help and "\n" not in action.help, f"tether {name} has no one-line help"
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for title, about, names in GROUPS:
        section = text.split(f"{title} ({about}):", 1)[1].split("\n\n", 1)[0]
        shown = [line.split()[0] for line in section.splitlines() if line[2:3].strip()]
        assert shown == list(names), (title, shown)


# -- an unknown run --------------------------------------------------------------------

UNKNOWN_RUN = [
    ("inspect", "nope", "{store}", "--keyring", "{keyring}"),
    ("verify", "nope", "{store}", "--keyring", "{keyring}"),
    ("ledger", "nope", "{store}", "--keyring", "{keyring}"),
    ("epochs", "nope", "{store}", "--keyring", "{keyring}"),
    ("resume", "nope", "{store}"),
    ("resume", "nope", "{store}", "--key", "{ops}", "--yes"),
    ("cancel", "nope", "--reason", "r", "{store}", "--key", "{ops}", "--yes"),
    ("cancel", "nope", "--reason", "r", "{store}", "--app", "tests.e2e.test_cli_coherent:app"),
    ("approve", "nope", "w1", "{store}", "--key", "{alice}", "--yes"),
    ("review", "nope", "case-1", "--decision", "abort", "{store}", "--key", "{rev}", "--yes"),
    ("fork", "nope", "sha256:" + "0" * 64, "{store}", "--key", "{ops}", "--yes"),
    ("rewind", "nope", "--to", "1", "--reason", "r", "{store}", "--key", "{ops}", "--yes"),
    ("admit", "nope", "{store}", "--key", "{ops}", "--yes"),
]


def app(store: object, run_id: str, worker: str) -> object:
    """A factory `cancel --app` may load; never reached for a run that does not exist."""
    raise AssertionError("the factory must not be called for an unknown run")


def fill(row: tuple[str, ...], s: Setup) -> list[str]:
    values = {"keyring": str(s.keyring), **{k: str(v) for k, v in s.keys.items()}}
    out: list[str] = []
    for word in row:
        if word == "{store}":
            out += ["--store", s.db]
        else:
            out.append(word.format(**values) if word.startswith("{") else word)
    return out


@pytest.mark.parametrize("row", UNKNOWN_RUN, ids=lambda r: " ".join(r[:2]))
def test_an_unknown_run_is_no_run_and_exit_1_from_every_command(
    setup: Setup, capsys: pytest.CaptureFixture[str], row: tuple[str, ...]
) -> None:
    """A run id the store never held is "no run 'nope'" (exit 1), never an integrity failure."""
    code, _, err = run(capsys, *fill(row, setup))
    line = one_line(err)
    assert code == 1, line
    assert "no run 'nope'" in line and "integrity" not in line
    assert setup.inbox() == 0


def test_a_mark_lost_beside_the_runs_content_is_still_an_integrity_failure(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting a run's mark leaves its checkpoints: inspect and verify say integrity (exit 3)."""
    with sqlite3.connect(setup.db) as conn:
        conn.execute("DELETE FROM tether_marks WHERE run_id = 'run-a'")
    for command in ("inspect", "verify"):
        code, _, err = run(
            capsys, command, "run-a", "--store", setup.db, "--keyring", str(setup.keyring)
        )
        assert code == 3 and "MissingHighWaterMarkError" in one_line(err)


# -- the store option ------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["--store", "--db"])
@pytest.mark.parametrize("form", ["path", "url"])
def test_the_store_is_a_path_or_a_url_under_either_spelling(
    setup: Setup, capsys: pytest.CaptureFixture[str], spelling: str, form: str
) -> None:
    """--store and --db each take a plain SQLite path and a sqlite:/// URL, on every reader and signer."""
    where = setup.db if form == "path" else f"sqlite:///{setup.db}"
    keyring = ["--keyring", str(setup.keyring)]
    for argv in (
        ["inspect", "run-a", spelling, where, *keyring],
        ["verify", "run-a", spelling, where, *keyring],
        ["ledger", "run-a", spelling, where, *keyring],
        ["epochs", "run-a", spelling, where, *keyring],
        ["runs", spelling, where],
    ):
        code, out, err = run(capsys, *argv)
        assert code == 0, (argv, err)
        assert "run-a" in out
    code, out, err = run(
        capsys, "approve", "run-a", "w1", spelling, where, "--key", str(setup.keys["alice"]),
        "--yes",
    )  # fmt: skip
    assert code == 0, err
    assert setup.inbox() == 1


def test_db_given_a_url_is_read_as_a_url_not_a_file_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--db sqlite:///x` names x (absent here: said so, naming x), never a file called "sqlite:/x"."""
    missing = tmp_path / "absent.sqlite"
    code, _, err = run(capsys, "runs", "--db", f"sqlite:///{missing}")
    line = one_line(err)
    assert code == 1 and f"no SQLite store at '{missing}'" in line
    assert not missing.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["inspect", "verify", "ledger", "epochs", "runs"])
def test_a_reader_creates_nothing_where_no_store_is(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A read-only command on an absent file or an empty one says so in one line and writes nothing."""
    keyring = tmp_path / "keyring.json"
    world.keyring.write_file(keyring)
    stores = tmp_path / "stores"
    stores.mkdir()
    absent, empty = stores / "absent.sqlite", stores / "empty.sqlite"
    empty.touch()
    words = [command] if command == "runs" else [command, "r", "--keyring", str(keyring)]
    for where, said in ((absent, "no SQLite store"), (empty, "not a tether store")):
        code, _, err = run(capsys, *words, "--store", str(where))
        assert code == 1 and said in one_line(err)
    assert [p.name for p in stores.iterdir()] == ["empty.sqlite"]
    assert empty.stat().st_size == 0


# -- empty and malformed arguments -----------------------------------------------------


def leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[tuple]:
    """Every runnable command of ``parser``: (the words that name it, its parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield words, parser
        return
    seen: set[int] = set()
    for name, child in subs[0].choices.items():
        if id(child) not in seen:  # an alias (`retry` for `resume`) is the same command
            seen.add(id(child))
            yield from leaves(child, (*words, name))


def empty_cases() -> list[tuple[str, list[str], str]]:
    """For every option and argument that takes a value, on every command: it given empty.

    Each case: its id, the argv, and the name argparse gives the argument in an error.
    """
    cases = []
    for words, parser in leaves(build_parser()):
        positionals = 0
        for action in parser._actions:
            if action.nargs in (0, argparse.REMAINDER) or isinstance(
                action, argparse._SubParsersAction
            ):
                continue
            named = "/".join(action.option_strings) or str(action.metavar or action.dest)
            if action.option_strings:
                for spelling in action.option_strings:
                    cases.append((f"{' '.join(words)} {spelling}", [*words, spelling, ""], named))
            else:
                before = ["x"] * positionals
                cases.append((f"{' '.join(words)} {named}", [*words, *before, ""], named))
                positionals += 1
    return cases


@pytest.mark.parametrize(
    ("name", "argv", "named"), empty_cases(), ids=[c[0] for c in empty_cases()]
)
def test_every_option_and_argument_refuses_an_empty_value_in_one_line(
    capsys: pytest.CaptureFixture[str], name: str, argv: list[str], named: str
) -> None:
    """An empty value anywhere is a usage error (exit 2) of one line naming it; never a traceback."""
    code, out, err = run(capsys, *argv)
    line = one_line(err)
    assert code == 2, line
    assert f"argument {named}: must not be empty" in line and out == ""


def test_the_walk_covers_every_command() -> None:
    """The empty-value walk reaches every runnable command and every option they have."""
    named = {case[0].rsplit(" ", 1)[0] for case in empty_cases()}
    assert {" ".join(words) for words, _ in leaves(build_parser())} == named
    assert len(empty_cases()) > 150


@pytest.fixture
def bad(setup: Setup, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Files a malformed argument can point at, and a port something already listens on."""
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    existing = tmp_path / "existing.json"
    existing.write_text("{}")
    ws = tmp_path / "ws"
    ws.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        yield {
            "S": setup.db,
            "K": str(setup.keyring),
            "ALICE": str(setup.keys["alice"]),
            "OPS": str(setup.keys["ops"]),
            "REV": str(setup.keys["rev"]),
            "GARBAGE": str(garbage),
            "MISSING": str(tmp_path / "missing"),
            "DIR": str(tmp_path),
            "FILE": str(a_file),
            "EXISTING": str(existing),
            "WS": str(ws),
            "NEW": str(tmp_path / "new.json"),
            "BUSY": str(busy.getsockname()[1]),
        }


RUN_A = ["run-a", "--store", "{S}"]
APPROVE = ["approve", "run-a", "w1", "--store", "{S}"]
#: (argv with {NAME} for the fixture's values, the exit code): each a bad value a person types.
BAD_VALUES: list[tuple[list[str], int]] = [
    (["inspect", "run-a", "--store", "mysql://h/db"], 1),
    (["inspect", "run-a", "--store", "sqlite:"], 1),
    (["inspect", "run-a", "--store", "sqlite:/one-slash.sqlite"], 1),
    (["inspect", "run-a", "--store", "host=localhost dbname=x"], 1),
    (["inspect", "run-a", "--store", "{DIR}"], 1),
    (["inspect", *RUN_A, "--keyring", "{MISSING}"], 1),
    (["inspect", *RUN_A, "--keyring", "{GARBAGE}"], 1),
    (["inspect", *RUN_A, "--keyring", "{DIR}"], 1),
    (["inspect", *RUN_A, "--keyring", "{K}", "--limit", "0"], 2),
    (["inspect", *RUN_A, "--keyring", "{K}", "--before", "x"], 2),
    (["inspect", *RUN_A, "--keyring", "{K}", "--marks", "{MISSING}"], 1),
    (["verify", *RUN_A, "--keyring", "{GARBAGE}"], 1),
    (["ledger", *RUN_A, "--keyring", "{K}", "--before", "-1"], 2),
    (["runs", "--store", "{S}", "--limit", "abc"], 2),
    (["runs", "--store", "{S}", "--phase", "nope"], 2),
    (["runs", "--store", "{S}", "--keyring", "{GARBAGE}"], 1),
    ([*APPROVE, "--key", "{MISSING}", "--yes"], 1),
    ([*APPROVE, "--key", "{GARBAGE}", "--yes"], 1),
    ([*APPROVE, "--key", "{ALICE}", "--ttl", "-5", "--yes"], 2),
    ([*APPROVE, "--key", "{ALICE}", "--ttl", "abc", "--yes"], 2),
    ([*APPROVE, "--key", "{ALICE}", "--generation", "x", "--yes"], 2),
    ([*APPROVE, "--key", "{ALICE}", "--generation", "999", "--yes"], 1),
    ([*APPROVE, "--key", "{ALICE}", "--policy", "{GARBAGE}", "--yes"], 1),
    ([*APPROVE, "--key", "{ALICE}", "--trust", "{GARBAGE}", "--yes"], 1),
    ([*APPROVE, "--key", "{ALICE}", "--json"], 1),  # --json asks nothing: needs --yes
    (["approve", "run-a", "not-pending", "--store", "{S}", "--key", "{ALICE}", "--yes"], 1),
    (["review", "run-a", "c", "--decision", "maybe", "--store", "{S}", "--key", "{REV}"], 2),
    (["review", "run-a", "c", "--decision", "abort", "--store", "{S}", "--key", "{REV}"], 1),
    (["fork", "run-a", "sha256:zz", "--store", "{S}", "--key", "{OPS}", "--yes"], 1),
    (["rewind", *RUN_A, "--to", "x", "--reason", "r", "--key", "{OPS}"], 2),
    (["rewind", *RUN_A, "--to", "-3", "--reason", "r", "--key", "{OPS}", "--yes"], 1),
    (["admit", *RUN_A, "--key", "{ALICE}", "--yes"], 1),
    (["resume", *RUN_A, "--ttl", "0"], 2),
    (["cancel", *RUN_A, "--reason", "r"], 1),
    (["cancel", *RUN_A, "--reason", "r", "--app", "..:x"], 1),
    (["cancel", *RUN_A, "--reason", "r", "--app", "no_such_module_zz:f"], 1),
    (["cancel", *RUN_A, "--reason", "r", "--app", "no-separator"], 1),
    (["start", "r1", "--store", "{S}", "--app", "x"], 1),
    (["worker", "--store", "{S}", "--app", "..:x"], 1),
    (["worker", "--store", "{S}", "--app", "m:f", "--lease-ttl", "0"], 2),
    (["worker", "--store", "{S}", "--app", "m:f", "--poll", "nan"], 2),
    (["worker", "--store", "{S}", "--app", "m:f", "--poll", "1e-9"], 2),
    (["worker", "--store", "{S}", "--app", "m:f", "--max-runs", "0"], 2),
    (["worker", "--store", "{S}", "--app", "m:f", "--concurrency", "0"], 2),
    (["worker", "--store", "{S}", "--app", "m:f", "--concurrency", "1025"], 2),
    (["keys", "new", "--role", "king", "--id", "a"], 2),
    (["keys", "new", "--role", "approver", "--id", "a", "--out", "{FILE}"], 1),
    (["keyring", "new", "--out", "{EXISTING}"], 1),
    (["keyring", "new"], 2),
    (["keyring", "new", "--out", "{NEW}", "{NEW}"], 2),
    (["trust", "add", "{MISSING}", "--out", "{NEW}"], 1),
    (["trust", "add", "{GARBAGE}", "--out", "{NEW}"], 1),
    (["trust", "add", "{ALICE}", "--out", "{NEW}"], 1),  # a private key, not a public half
    (["trust", "add", "{GARBAGE}", "--out", "{NEW}", "--to", "{NEW}"], 2),
    (["init", "--workspace", "{MISSING}"], 1),
    (["init", "--workspace", "{WS}", "--out", "{WS}"], 1),
    (["serve", "--store", "{S}", "--port", "99999"], 2),
    (["serve", "--store", "{S}", "--port", "{BUSY}"], 1),
    (["serve", "--store", "{S}", "--token", "short"], 1),
    (["serve", "--store", "{MISSING}", "--port", "{BUSY}"], 1),
    (["serve", "--store", "{S}", "--key", "{GARBAGE}", "--port", "{BUSY}"], 1),
    (["serve", "--store", "{S}", "--policy", "{MISSING}", "--port", "{BUSY}"], 1),
    (["mcp", "--store", "{S}", "--run", "a/b", "--upstream", "http://127.0.0.1:1/"], 2),
    (["mcp", "--store", "{S}", "--run", "r"], 1),
    (["mcp", "--store", "{S}", "--run", "r", "--upstream", "u", "--lease-ttl", "0"], 2),
    (["crashtest", "--app", "..:x"], 1),
    (["crashtest", "--app", "m:f", "--trials", "0"], 2),
    (["crashtest", "--app", "m:f", "--points", "nope"], 2),
    (["demo", "--crash-at", "nope"], 2),
    (["demo", "--crash-hit", "0"], 2),
    (["demo", "--store", "postgresql://h/db"], 2),
    (["demo", "--scenario", "nope"], 2),
    (["demo", "--mail-lookup"], 1),
]


@pytest.mark.parametrize(
    ("argv", "exit_code"), BAD_VALUES, ids=[" ".join(a[:4]) for a, _ in BAD_VALUES]
)
def test_a_malformed_argument_is_one_line_never_a_traceback(
    bad: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    exit_code: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each malformed value a person might type ends the command in one line with its exit code."""
    monkeypatch.delenv("TETHER_KEYRING_FILE", raising=False)
    monkeypatch.delenv("TETHER_KEYRING", raising=False)
    monkeypatch.chdir(bad["DIR"])  # nothing a refusal might leave lands in the repository
    code, _, err = run(capsys, *(word.format(**bad) for word in argv))
    assert code == exit_code, err
    one_line(err)


# -- the run's own trust roots ---------------------------------------------------------


def test_approve_refuses_a_signer_the_runs_own_trust_roots_refuse(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --trust, bob (an approver the run's runtime does not trust) is refused before signing."""
    argv = ["approve", "run-a", "w1", "--store", setup.db, "--yes"]
    code, _, err = run(capsys, *argv, "--key", str(setup.keys["bob"]))
    line = one_line(err)
    assert code == 1 and "'bob' is not a trusted approver" in line
    assert "run run-a's runtime would refuse it" in line and "tether trust add" in line
    assert setup.inbox() == 0
    # Named explicitly, the roots the runtime runs with now decide instead.
    code, _, err = run(
        capsys, *argv, "--key", str(setup.keys["bob"]), "--trust", str(setup.trust_file)
    )
    assert code == 0, err
    assert setup.inbox() == 1
    code, _, err = run(capsys, *argv, "--key", str(setup.keys["alice"]))
    assert code == 0, err
    assert setup.inbox() == 2


def test_approve_refuses_a_key_that_is_not_the_one_trusted_under_its_id(
    setup: Setup, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another key claiming alice's id is refused: the run keeps alice's public key."""
    impostor = tmp_path / "impostor.key"
    Signer.generate("alice", "approver").write_file(impostor)
    code, _, err = run(
        capsys, "approve", "run-a", "w1", "--store", setup.db, "--key", str(impostor), "--yes"
    )
    assert code == 1 and "'alice' is not a trusted approver" in one_line(err)
    assert setup.inbox() == 0


def test_approve_refuses_when_the_runs_runtime_has_no_trust_roots(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A runtime without trust roots accepts no signed document: approve says so and delivers nothing."""
    s = make_setup(world, tmp_path, trusted=None)
    code, _, err = run(
        capsys, "approve", "run-a", "w1", "--store", s.db, "--key", str(s.keys["alice"]), "--yes"
    )
    line = one_line(err)
    assert code == 1 and "was given no trust roots" in line and "--trust" in line
    assert s.inbox() == 0


# -- key ids and the output option -----------------------------------------------------


@pytest.mark.parametrize("bad_id", ["../x", "a/b", "/abs", ".hidden", "-x", "x y", "a\\b", "é"])
def test_keys_new_refuses_an_id_that_would_leave_out_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_id: str
) -> None:
    """`keys new --id ../x` is a usage error before any file or directory is made."""
    out = tmp_path / "keys"
    code, _, err = run(
        capsys, "keys", "new", "--role", "approver", f"--id={bad_id}", "--out", str(out)
    )
    assert code == 2 and "is not a signer id" in one_line(err)
    assert list(tmp_path.iterdir()) == []


def test_keys_new_writes_both_files_inside_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A good id lands as ID.key and ID.trust.json in --out, made if absent."""
    out = tmp_path / "keys"
    code, _, err = run(
        capsys, "keys", "new", "--role", "approver", "--id", "a.b@c", "--out", str(out)
    )
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["a.b@c.key", "a.b@c.trust.json"]


def test_files_are_written_where_out_says_and_the_old_spellings_still_work_unlisted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """keyring new and trust add take --out; `keyring new PATH` and `trust add --to` work but are not in --help."""
    assert run(capsys, "keyring", "new", "--out", str(tmp_path / "k1.json"))[0] == 0
    assert run(capsys, "keyring", "new", str(tmp_path / "k2.json"))[0] == 0
    assert (
        run(capsys, "keys", "new", "--role", "approver", "--id", "al", "--out", str(tmp_path))[0]
        == 0
    )
    public = str(tmp_path / "al.trust.json")
    assert run(capsys, "trust", "add", public, "--out", str(tmp_path / "t1.json"))[0] == 0
    assert run(capsys, "trust", "add", public, "--to", str(tmp_path / "t2.json"))[0] == 0
    for name in ("k1.json", "k2.json", "t1.json", "t2.json"):
        assert (tmp_path / name).is_file()
    hidden = {("keyring", "new"): "path]", ("trust", "add"): "--to", ("inspect",): "--db STORE"}
    for words, old in hidden.items():
        with pytest.raises(SystemExit):
            main([*words, "--help"])
        assert old not in capsys.readouterr().out
    having = {
        option: sorted(
            " ".join(words)
            for words, parser in leaves(build_parser())
            if any(option in a.option_strings for a in parser._actions)
        )
        for option in ("--out", "--to")
    }
    assert having["--out"] == ["init", "keyring new", "keys new", "trust add"]
    assert having["--to"] == ["rewind", "trust add"]  # rewind --to GEN is its target, not a file
