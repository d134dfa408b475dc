"""A dispatched effect is settled under the terms it was sent under, not only today's.

Real parts: a shop on loopback (``http.server``) that counts the orders it
received and deduplicates by Idempotency-Key where one is sent, real child
processes (``_termschild``), one killed with SIGKILL, a real SQLite store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tether.core import EffectStatus, Phase
from tether.store import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]


class Shop(ThreadingHTTPServer):
    """Takes orders: one per POST, except a repeated Idempotency-Key, which is answered again."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Orders)
        self.orders: list[dict[str, object]] = []
        self.by_key: dict[str, dict[str, object]] = {}
        self.lock = threading.Lock()


class _Orders(BaseHTTPRequestHandler):
    server: Shop

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers.get("Idempotency-Key")
        with self.server.lock:
            answer = self.server.by_key.get(key) if key else None
            if answer is None:
                answer = {"order_id": len(self.server.orders) + 1, "item": body["item"]}
                self.server.orders.append(answer)
                if key:
                    self.server.by_key[key] = answer
        data = json.dumps(answer).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def shop() -> Iterator[Shop]:
    """A shop listening on loopback for the test's length."""
    server = Shop()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _child(root: Path, shop: Shop, version: str) -> subprocess.CompletedProcess[str]:
    url = f"http://127.0.0.1:{shop.server_address[1]}/orders"
    return subprocess.run(
        [sys.executable, "-m", "tests.integration._termschild", str(root), url, version],
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_order_sent_without_a_key_is_not_resent_by_code_that_now_declares_one(
    tmp_path: Path, shop: Shop
) -> None:
    """Killed after a keyless order reached the shop; the upgraded, idempotent code recovers: 1 order, review."""
    first = _child(tmp_path, shop, "v1")
    assert first.returncode == -9, first.stderr  # SIGKILL, after the shop took the order
    assert len(shop.orders) == 1
    with SQLiteStore(tmp_path / "runs.sqlite", read_only=True) as store:
        sent = [e for e in store.ledger("r") if e.status is EffectStatus.DISPATCHED]
    assert [e.terms.retry.value for e in sent if e.terms is not None] == ["neither"]

    second = _child(tmp_path, shop, "v2")
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["review:outcome_unknown", Phase.NEEDS_REVIEW.value]
    assert len(shop.orders) == 1  # never sent again under a key the shop never saw
    with SQLiteStore(tmp_path / "runs.sqlite", read_only=True) as store:
        statuses = [e.status for e in store.ledger("r")]
    assert statuses[-1] is EffectStatus.OUTCOME_UNKNOWN
    assert statuses.count(EffectStatus.DISPATCHED) == 1
