"""Seeded damage to a copy of the fuzz home: SQL edits, cycles, re-signed payloads, files.

Everything here is deterministic from the ``random.Random`` it is handed, so
a seed replays the same damage (see ``_fuzzkit.replay``).
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

from tests._plain import plain
from tether.core import TetherError, canonical_bytes
from tether.crypto import Keyring, seal

RUNS = ("done", "wait", "frozen", "live")
FILES = ("keyring.json", "trust.json", "task.json", "policy.json", "guarded.json")
SIGNERS = ("approver.key", "reviewer.key")
DOCUMENTS = ("approval.json", "decision.json")


def _bad_scalars(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            0,
            -1,
            1,
            2**63 - 1,
            -(2**63),
            1.5,
            -0.0,
            1e308,
            "",
            "abc",
            "-1",
            "9" * 40,
            "x" * rng.choice([1, 300, 70_000]),
            "\x00",
            "sha256:" + "0" * 64,
            "2026-13-45T99:99:99Z",
            "1970-01-01T00:00:00+00:00",
            "9999-12-31T23:59:59.999999+00:00",
            b"",
            b"\xff\xfe\x00",
            True,
            [],
            {},
            [[[[]]]],
            "\ud800",
            "\udcff",
        ]
    )


def damage_json(value: Any, rng: random.Random) -> Any:
    """A copy of a JSON value with one node replaced, removed, added or retyped."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(sorted(value))
        out = dict(value)
        roll = rng.random()
        if roll < 0.15:
            del out[key]
        elif roll < 0.25:
            out["zz_unknown"] = _bad_scalars(rng)
        elif roll < 0.6:
            out[key] = damage_json(value[key], rng)
        else:
            out[key] = _bad_scalars(rng)
        return out
    if isinstance(value, list) and value and rng.random() < 0.8:
        out_list = list(value)
        i = rng.randrange(len(out_list))
        roll = rng.random()
        if roll < 0.15:
            del out_list[i]
        elif roll < 0.3:
            out_list.append(out_list[i])
        else:
            out_list[i] = damage_json(out_list[i], rng)
        return out_list
    if rng.random() < 0.05:
        deep: Any = 0
        for _ in range(rng.choice([50, 600])):
            deep = [deep]
        return deep
    return _bad_scalars(rng)


def _json_text(value: Any) -> str:
    return json.dumps(value, default=lambda b: b.decode("latin-1"))


def damage_bytes(data: bytes, rng: random.Random) -> bytes:
    """Bit flips, truncation, splices and encodings that are not UTF-8."""
    roll = rng.random()
    if not data or roll < 0.1:
        return rng.choice(
            [b"", b"{", b"null", b"[]", b"\xff", b"{}", b'{"a":1,"a":2}', b"NaN", b"[" * 100_000]
        )
    out = bytearray(data)
    if roll < 0.4:
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
    elif roll < 0.55:
        out = out[: rng.randrange(len(out))]
    elif roll < 0.65:
        i = rng.randrange(len(out))
        out[i:i] = rng.choice([b"\xff", b"\xed\xa0\x80", b"\x00", b'"', b",", b"NaN", b"1e999"])
    elif roll < 0.75:
        try:
            text = data.decode("utf-8")
            i = text.find('":', rng.randrange(len(text)))
            if i > 0:
                j = text.rfind('"', 0, i)
                key = text[j : i + 2]
                out = bytearray((text[: i + 2] + "0," + key + text[i + 2 :]).encode())
        except UnicodeDecodeError:
            pass
    else:
        try:
            out = bytearray(
                _json_text(damage_json(json.loads(data), rng)).encode("utf-8", "surrogatepass")
            )
        except (ValueError, RecursionError):
            out = out[::-1]
    if roll > 0.98:
        out = bytearray(b'{"a":' * 50_000)  # deeper than any recursive parser goes
    return bytes(out)


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def _loosen(conn: sqlite3.Connection, table: str) -> None:
    """Rebuild ``table`` without its keys and constraints, as someone with the file could."""
    conn.execute(f"CREATE TABLE fz_tmp AS SELECT * FROM {table}")
    conn.execute(f"DROP TABLE {table}")
    conn.execute(f"ALTER TABLE fz_tmp RENAME TO {table}")


def _sql_value(
    conn: sqlite3.Connection, table: str, col: str, rowid: int, rng: random.Random
) -> tuple[str, tuple[Any, ...]]:
    (current,) = conn.execute(f"SELECT {col} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
    roll = rng.random()
    if roll < 0.1:
        return "CAST(X'FF' AS TEXT)", ()
    if roll < 0.15:
        return "CAST(X'EDA080' AS TEXT)", ()  # a lone surrogate, UTF-8 encoded
    if roll < 0.2:
        return f"CAST({col} AS BLOB)", ()
    if roll < 0.25:
        return f"CAST({col} AS TEXT)", ()
    if roll < 0.35:
        other = conn.execute(f"SELECT {col} FROM {table} ORDER BY random() LIMIT 1").fetchone()
        return "?", (other[0],)
    if roll < 0.6 and isinstance(current, str | bytes):
        raw = current.encode("utf-8", "surrogatepass") if isinstance(current, str) else current
        damaged = damage_bytes(raw, rng)
        if isinstance(current, str) and rng.random() < 0.7:
            return "CAST(? AS TEXT)", (damaged,)
        return "?", (damaged,)
    if roll < 0.7 and isinstance(current, int):
        return "?", (rng.choice([current + 1, current - 1, -current, current * 2**40, 0]),)
    value = _bad_scalars(rng)
    if isinstance(value, list | dict):
        value = _json_text(value)
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
        return "CAST(? AS TEXT)", (value,)
    return "?", (value,)


def _cycle(conn: sqlite3.Connection, rng: random.Random) -> str:
    """Point a trace or ledger row back at the head its run's mark pins (or at itself)."""
    table = rng.choice(["tether_trace", "tether_ledger"])
    run = rng.choice(RUNS)
    rows = conn.execute(
        f"SELECT hash FROM {table} WHERE run_id = ? ORDER BY seq", (run,)
    ).fetchall()
    if not rows:
        return "cycle: no rows"
    target = rows[-1][0] if rng.random() < 0.7 else rng.choice(rows)[0]
    victim = rng.choice(rows)[0]
    conn.execute(
        f"UPDATE {table} SET prev_hash = ? WHERE run_id = ? AND hash = ?", (target, run, victim)
    )
    return f"cycle {table} {run}: {victim[:16]} -> {target[:16]}"


def _reseal(home: Path, conn: sqlite3.Connection, rng: random.Random) -> str:
    """A validly signed checkpoint with a damaged payload, made the mark's newest."""
    run = rng.choice(RUNS)
    plain(home / "store.sqlite")  # the envelope and blobs as sealed, to parse and re-sign
    (digest, envelope) = conn.execute(
        "SELECT c.checkpoint_digest, c.envelope FROM tether_checkpoints c JOIN tether_marks m "
        "ON m.run_id = c.run_id AND m.checkpoint_digest = c.checkpoint_digest WHERE m.run_id = ?",
        (run,),
    ).fetchone()
    payload = json.loads(envelope)["payload"]
    blobs = [k for k in ("agent_context_digest", "results_digest") if payload.get(k)]
    if blobs and rng.random() < 0.3:
        # Damaged content, re-addressed: the checkpoint names the new digest, so
        # only the content's own parser stands between the bytes and the run.
        name = rng.choice(blobs)
        (body,) = conn.execute(
            "SELECT body FROM tether_blobs WHERE digest = ?", (payload[name],)
        ).fetchone()
        body = damage_bytes(body, rng)
        digest_new = "sha256:" + hashlib.sha256(body).hexdigest()
        conn.execute(
            "INSERT OR REPLACE INTO tether_blobs (digest, body) VALUES (?, ?)", (digest_new, body)
        )
        damaged = {**payload, name: digest_new}
        what = f"reseal {run} with {name} damaged"
    else:
        damaged = damage_json(payload, rng)
        what = f"reseal {run}"
    try:
        raw = canonical_bytes(damaged)
    except (TetherError, TypeError, ValueError, RecursionError):
        raw = _json_text(damaged).encode("utf-8", "surrogatepass")  # signed, not canonical
    sealed = seal(raw, Keyring.from_file(home / "keyring.json"))
    new = "sha256:" + hashlib.sha256(sealed).hexdigest()
    conn.execute(
        "UPDATE tether_checkpoints SET envelope = ?, checkpoint_digest = ? "
        "WHERE run_id = ? AND checkpoint_digest = ?",
        (sealed, new, run, digest),
    )
    conn.execute("UPDATE tether_marks SET checkpoint_digest = ? WHERE run_id = ?", (new, run))
    return what


def _sql_damage(conn: sqlite3.Connection, rng: random.Random) -> str:
    tables = [
        r[0]
        for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    ]
    table = rng.choice(tables)
    rowids = [r[0] for r in conn.execute(f"SELECT rowid FROM {table}")]
    if not rowids:
        return f"sql {table}: empty"
    rowid = rng.choice(rowids)
    run = ""
    if "run_id" in _columns(conn, table):
        (owner,) = conn.execute(f"SELECT run_id FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        run = f" of {owner}" if owner in RUNS else ""
    roll = rng.random()
    if roll < 0.05:
        conn.execute(f"DELETE FROM {table} WHERE rowid = ?", (rowid,))
        return f"sql {table}: delete row {rowid}{run}"
    if roll < 0.1:
        _loosen(conn, table)
        cols = ", ".join(_columns(conn, table))
        conn.execute(f"INSERT INTO {table} SELECT {cols} FROM {table} WHERE rowid = ?", (rowid,))
        return f"sql {table}: duplicate row {rowid}{run}"
    col = rng.choice(_columns(conn, table))
    expr, params = _sql_value(conn, table, col, rowid, rng)
    statement = f"UPDATE {table} SET {col} = {expr} WHERE rowid = ?"
    try:
        conn.execute(statement, (*params, rowid))
    except sqlite3.IntegrityError:
        _loosen(conn, table)
        conn.execute(statement, (*params, rowid))
    return f"sql {table}.{col} row {rowid}{run} := {expr} {repr(params)[:60]}"


def _file_damage(home: Path, rng: random.Random) -> str:
    name = rng.choice(FILES + SIGNERS + DOCUMENTS)
    path = home / name
    path.write_bytes(damage_bytes(path.read_bytes(), rng))
    return f"file {name}"


def _blob_damage(conn: sqlite3.Connection, rng: random.Random) -> str:
    rows = conn.execute("SELECT digest, body FROM tether_blobs ORDER BY digest").fetchall()
    digest, body = rng.choice(rows)
    conn.execute(
        "UPDATE tether_blobs SET body = ? WHERE digest = ?", (damage_bytes(body, rng), digest)
    )
    return f"blob {digest[:20]}"


def _db_file_damage(home: Path, rng: random.Random) -> str:
    path = home / "store.sqlite"
    data = bytearray(path.read_bytes())
    if rng.random() < 0.3:
        cut = rng.randrange(len(data))
        path.write_bytes(bytes(data[:cut]))
        return f"dbfile truncated at {cut}"
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return "dbfile bit flips"


def damage(home: Path, rng: random.Random) -> tuple[str, str]:
    """Damage the copy at ``home`` as ``rng`` says: (family, description)."""
    roll = rng.random()
    if roll < 0.15:
        return "file", _file_damage(home, rng)
    if roll < 0.2:
        return "dbfile", _db_file_damage(home, rng)
    with sqlite3.connect(home / "store.sqlite", isolation_level=None) as conn:
        if roll < 0.3:
            family, text = "cycle", _cycle(conn, rng)
        elif roll < 0.45:
            family, text = "reseal", _reseal(home, conn, rng)
        elif roll < 0.5:
            family, text = "blob", _blob_damage(conn, rng)
        elif roll < 0.55:
            row = conn.execute(
                "SELECT rowid, envelope FROM tether_checkpoints ORDER BY random()"
            ).fetchone()
            conn.execute(
                "UPDATE tether_checkpoints SET envelope = ? WHERE rowid = ?",
                (damage_bytes(row[1], rng), row[0]),
            )
            family, text = "envelope", f"envelope row {row[0]}"
        else:
            family, text = "sql", _sql_damage(conn, rng)
    conn.close()
    return family, text
