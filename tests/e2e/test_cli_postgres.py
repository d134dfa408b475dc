"""The CLI on PostgreSQL as a new user met it: an empty database, a missing one, a closed port.

A reader never creates or migrates anything there (its sessions are read-only
at the server), and a database that does not exist or a server that is not
listening is one line, at once, not the pool's retries and the driver's text.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
from tests.conftest import ScriptedAgent, World, finish, make_policy, write
from tether.cli import main
from tether.core import StoreError
from tether.crypto import Signer, TrustRoots
from tether.store import open_store

pytestmark = pytest.mark.postgres

#: A factory that imports (worker and start load it before they open the store).
APP = "tests.e2e.test_cli_coherent:app"
GUARDED = {"file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": True}}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def tables(dsn: str, schema: str) -> list[str]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
    return sorted(row[0] for row in rows)


def rows(dsn: str, schema: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return {
            name: conn.execute(f'SELECT COUNT(*) FROM "{schema}"."{name}"').fetchone()[0]
            for name in tables(dsn, schema)
        }


@pytest.fixture
def empty() -> Iterator[tuple[str, str, str]]:
    """(DSN, schema, store URL) of an empty schema: a database with no tether store in it."""
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield dsn, schema, url_in_schema(dsn, schema)


KEYRING = ["--keyring", "{keyring}"]


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "r", *KEYRING],
        ["verify", "r", *KEYRING],
        ["ledger", "r", *KEYRING],
        ["epochs", "r", *KEYRING],
        ["runs"],
        ["approve", "r", "w1", "--key", "{key}", "--yes"],
        ["resume", "r"],
        ["serve", "--port", "0"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_command_on_an_empty_database_creates_nothing_and_says_so(
    empty: tuple[str, str, str],
    world: World,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    """inspect, runs and the rest on a database without tether's tables: one line, no table made."""
    dsn, schema, url = empty
    keyring, key = tmp_path / "keyring.json", tmp_path / "alice.key"
    world.keyring.write_file(keyring)
    Signer.generate("alice", "approver").write_file(key)
    words = [w.format(key=key, keyring=keyring) for w in argv]
    code, _, err = run(capsys, *words, "--store", url)
    line = one_line(err)
    assert code == 1 and "holds no tether store" in line, line
    assert tables(dsn, schema) == []


@pytest.fixture
def stored(empty: tuple[str, str, str], world: World, tmp_path: Path) -> Iterator[dict[str, str]]:
    """run-a waiting for alice's approval in a PostgreSQL store; the files a person holds."""
    dsn, schema, url = empty
    alice = Signer.generate("alice", "approver")
    key, keyring = tmp_path / "alice.key", tmp_path / "keyring.json"
    alice.write_file(key)
    world.keyring.write_file(keyring)
    world.policy = make_policy(kinds=GUARDED, approval_ttl_s=300)
    with open_store(url) as store:
        rt = world.runtime(
            ScriptedAgent([write("notes.txt", "v1\n", action_id="w1"), finish]),
            store=store,
            trust=TrustRoots.of(alice.trust_root()),
        )
        rt.start("run-a").step()
    yield {"dsn": dsn, "schema": schema, "url": url, "key": str(key), "keyring": str(keyring)}


def test_readers_read_a_postgres_store_and_write_nothing(
    stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """inspect, verify, ledger, epochs and runs read run-a back; not one row changes."""
    before = rows(stored["dsn"], stored["schema"])
    for argv in (
        ["inspect", "run-a"],
        ["verify", "run-a"],
        ["ledger", "run-a"],
        ["epochs", "run-a"],
    ):
        code, out, err = run(
            capsys, *argv, "--store", stored["url"], "--keyring", stored["keyring"]
        )
        assert code == 0 and "run-a" in out, err
    code, out, err = run(capsys, "runs", "--store", stored["url"])
    assert code == 0 and "run-a" in out, err
    code, _, err = run(
        capsys, "inspect", "nope", "--store", stored["url"], "--keyring", stored["keyring"]
    )
    assert code == 1 and "no run 'nope'" in one_line(err)
    assert rows(stored["dsn"], stored["schema"]) == before


def test_approve_on_postgres_delivers_and_refuses_an_untrusted_signer(
    stored: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's trust roots live in the PostgreSQL store too: bob is refused, alice delivered."""
    bob = tmp_path / "bob.key"
    Signer.generate("bob", "approver").write_file(bob)
    argv = ["approve", "run-a", "w1", "--store", stored["url"], "--yes"]
    code, _, err = run(capsys, *argv, "--key", str(bob))
    assert code == 1 and "'bob' is not a trusted approver" in one_line(err)
    assert rows(stored["dsn"], stored["schema"])["tether_inbox"] == 0
    code, _, err = run(capsys, *argv, "--key", stored["key"])
    assert code == 0, err
    assert rows(stored["dsn"], stored["schema"])["tether_inbox"] == 1


def test_a_read_only_store_cannot_write_even_by_mistake(stored: dict[str, str]) -> None:
    """A reader's sessions are READ ONLY at the server: a write through one is refused there."""
    with open_store(stored["url"], read_only=True) as reader:
        assert reader.get_mark("run-a") is not None
        with pytest.raises(StoreError, match="read-only transaction"):
            reader.put_evidence("run-a", "approval", {"not": "signed"})
    assert rows(stored["dsn"], stored["schema"])["tether_inbox"] == 0


def test_a_reader_refuses_an_older_schema_instead_of_migrating_it(
    stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A store one migration behind is named as such by a reader, which leaves it as it is."""
    import psycopg

    with psycopg.connect(stored["dsn"], autocommit=True) as conn:
        conn.execute(
            f'DELETE FROM "{stored["schema"]}".tether_migrations '
            f'WHERE version = (SELECT MAX(version) FROM "{stored["schema"]}".tether_migrations)'
        )
    before = rows(stored["dsn"], stored["schema"])
    code, _, err = run(capsys, "runs", "--store", stored["url"])
    line = one_line(err)
    assert code == 1 and "open it once read-write" in line
    assert rows(stored["dsn"], stored["schema"]) == before


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_missing_database_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    """A database name the server does not have: exit 1, one line that names it (no pool retries)."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(pg_dsn())
    name = f"tether_absent_{uuid.uuid4().hex[:8]}"
    user = parts.get("user") or "postgres"
    url = (
        f"postgresql://{user}@{parts.get('host') or '127.0.0.1'}:{parts.get('port') or 5432}/{name}"
    )
    for argv in (["runs"], ["worker", "--app", APP], ["resume", "r"]):
        code, _, err = run(capsys, *argv, "--store", url)
        line = one_line(err)
        assert code == 1, line
        assert f'database "{name}" does not exist' in line and "cannot reach PostgreSQL" in line


def test_a_port_nothing_listens_on_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A server that is not there: exit 1 and one line saying the connection was refused."""
    url = f"postgresql://postgres@127.0.0.1:{_free_port()}/tether"
    for argv in (["runs"], ["serve", "--port", "0"], ["start", "r", "--app", APP]):
        code, _, err = run(capsys, *argv, "--store", url)
        line = one_line(err)
        assert code == 1 and "cannot reach PostgreSQL at postgresql://127.0.0.1:" in line, line
        assert "refused" in line.lower()
