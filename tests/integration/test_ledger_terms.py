"""Ledger rows against a real store, and adapters judged through a user's wrapper."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

from tests._plain import plain
from tests.unit.test_ledger import effect, entry
from tether.adapters import Adapters, look_up
from tether.core import EffectStatus, Intent
from tether.core._ledger import verify_ledger
from tether.core._state import GENESIS_HASH
from tether.store import SQLiteStore
from tether.testing import Sandbox
from tether.testing._store_conformance import make_commit


def test_a_sealed_entry_is_not_changed_by_the_callers_dicts(tmp_path: Path) -> None:
    """The caller edits its payload after sealing: the store writes, and reads back, what was sealed."""
    payload = {"path": "notes.txt", "content": "hello"}
    sealed = entry(
        1, GENESIS_HASH, EffectStatus.INTENDED, terms=effect(sensitive=False), payload=payload
    )
    payload["content"] = "changed after the seal"
    with SQLiteStore(tmp_path / "t.sqlite") as store:
        store.put_content(make_commit("run", 1, ledger=[sealed]))
        (row,) = store.ledger("run")
    assert row.payload == {"path": "notes.txt", "content": "hello"}
    verify_ledger("run", [row], sealed.hash, 1, GENESIS_HASH, orphans_possible=False)


class Traced:
    """A user's delegating wrapper (metrics, logging): every attribute is the inner adapter's."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_migration_16_names_the_target_of_sent_rows_written_before_it(tmp_path: Path) -> None:
    """Sent rows written without a target (before migration 16) are filled on open and found."""
    terms = replace(effect(sensitive=False), effect="sha256:" + "e" * 64)
    intent = entry(1, GENESIS_HASH, EffectStatus.INTENDED, terms=terms)
    sent = entry(2, intent.hash, EffectStatus.DISPATCHED, terms=terms)
    unknown = entry(3, sent.hash, EffectStatus.OUTCOME_UNKNOWN, terms=terms)
    db = tmp_path / "t.sqlite"
    with SQLiteStore(db) as store:
        store.put_content(make_commit("run", 1, ledger=[intent, sent, unknown]))
    plain(db)  # rows as a tether before migration 16 (and 17's deflated rows) wrote them
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE tether_ledger SET target = NULL")
        conn.execute("DELETE FROM tether_migrations WHERE version = 16")
    with SQLiteStore(db) as store:
        assert store.ledger_on_target("run", terms.target_key) == [unknown, sent]
        assert store.ledger("run") == [intent, sent, unknown]  # the index agrees with each row
    with sqlite3.connect(db) as conn:
        targets = conn.execute("SELECT target FROM tether_ledger ORDER BY seq").fetchall()
    assert targets == [(None,), (terms.target_key,), (terms.target_key,)]


def test_each_wrapped_adapter_is_judged_by_what_it_wraps() -> None:
    """One wrapper class around a composite, then around a sandbox: each asked as itself."""
    composite = Adapters(Sandbox())
    intent = Intent("file.write", "a.txt", {"content": "x"}, "low")
    assert look_up(Traced(composite), "k1", intent) is None  # asked with the intent
    assert look_up(Traced(Sandbox()), "k1", intent) is None  # a plain look-up, no AttributeError
