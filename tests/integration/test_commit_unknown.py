"""A commit that landed but whose reply was lost is "outcome unknown": the session reloads, repeats nothing.

A real TCP proxy on loopback stands between the store and PostgreSQL. Armed
with a pattern, it forwards the client's message that contains it, swallows
the server's answer, waits until the server has surely committed, and
closes both ends: COMMIT applied, reply lost.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tests.conftest import CountingIds, ManualClock, ScriptedAgent, finish, make_policy, make_task
from tests.conftest import write as write_step
from tether.core import CommitOutcomeUnknownError, Phase
from tether.crypto import Keyring
from tether.runtime import Runtime
from tether.store import PostgresStore
from tether.testing import Sandbox

pytestmark = pytest.mark.postgres


class DroppingProxy:
    """Forwards TCP to PostgreSQL; once armed, loses the answer to one message and hangs up."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed: bytes | None = None
        self.dropped = threading.Event()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, pattern: bytes) -> None:
        self.armed = pattern

    def close(self) -> None:
        self._closing = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            link = {"swallow": False}
            threading.Thread(target=self._up, args=(client, server, link), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, link), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, link: dict[str, bool]) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                pattern = self.armed
                if pattern is not None and pattern in data:
                    self.armed = None
                    link["swallow"] = True  # the server's answer never reaches the client
                    server.sendall(data)
                    # The rest of a statement bigger than one read still goes through;
                    # the statement commits (autocommit) meanwhile.
                    client.settimeout(0.5)
                    with contextlib.suppress(TimeoutError, OSError):
                        while more := client.recv(65536):
                            server.sendall(more)
                    self.dropped.set()
                    for end in (client, server):
                        with contextlib.suppress(OSError):
                            end.shutdown(socket.SHUT_RDWR)
                        end.close()
                    return
                server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket, link: dict[str, bool]) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if not link["swallow"]:
                    client.sendall(data)


@pytest.fixture
def through_proxy() -> Iterator[tuple[str, str, DroppingProxy]]:
    """(DSN through the proxy, direct DSN, the proxy), both in one fresh schema."""
    from psycopg.conninfo import conninfo_to_dict

    dsn = pg_dsn()
    info = conninfo_to_dict(dsn)
    proxy = DroppingProxy((str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)))
    try:
        with fresh_schema(dsn) as schema:
            direct = in_schema(dsn, schema, sslmode="disable")
            proxied = in_schema(
                dsn, schema, sslmode="disable", host="127.0.0.1", port=str(proxy.port)
            )
            yield proxied, direct, proxy
    finally:
        proxy.close()


def runtime(store: Any, sandbox: Sandbox, keyring: Keyring) -> Runtime:
    return Runtime(
        store=store,
        keyring=keyring,
        adapter=sandbox,
        task=make_task(sandbox.environment().state_fingerprint),
        policy=make_policy(),
        agent=ScriptedAgent([write_step("notes.txt", "done\n"), finish]),
        clock=ManualClock(),
        ids=CountingIds(),
        lease_ttl_s=30,
    )


@pytest.mark.parametrize("lost", ["intent_persisted", "effect_committed"])
def test_a_commit_applied_with_its_reply_lost_is_reloaded_and_nothing_repeats(
    through_proxy: tuple[str, str, DroppingProxy], lost: str
) -> None:
    """The reply to the commit that records ``lost`` is dropped: CommitOutcomeUnknownError, reload, one write."""
    proxied, direct, proxy = through_proxy
    sandbox = Sandbox({"notes.txt": "draft\n"})
    keyring = Keyring.generate("k1")
    with PostgresStore(proxied, max_connections=2, timeout_s=10) as store:
        session = runtime(store, sandbox, keyring).start("r1")
        proxy.arm(lost.encode())
        with pytest.raises(CommitOutcomeUnknownError) as caught:
            session.run()
        assert proxy.dropped.is_set()
        with PostgresStore(direct) as reader:
            mark = reader.get_mark("r1")
        assert mark is not None
        assert mark.checkpoint_digest == caught.value.checkpoint_digest  # it DID land
        assert session.state.generation == mark.generation - 1  # the session does not know yet
        outcome = session.run()  # reloads from the store first, then carries on
        assert outcome.state.phase is Phase.COMPLETED
        assert sandbox.write_count() == 1
    with PostgresStore(direct) as reader:
        committed = [e for e in reader.ledger("r1") if e.status.value == "committed"]
        assert len(committed) == 1


def test_a_session_refuses_to_commit_until_it_has_reloaded(
    through_proxy: tuple[str, str, DroppingProxy],
) -> None:
    """After an unknown outcome every commit raises until reload() has read the run back."""
    proxied, _, proxy = through_proxy
    sandbox = Sandbox({"notes.txt": "draft\n"})
    with PostgresStore(proxied, max_connections=2, timeout_s=10) as store:
        session = runtime(store, sandbox, Keyring.generate("k1")).start("r1")
        proxy.arm(b"intent_persisted")
        with pytest.raises(CommitOutcomeUnknownError):
            session.run()
        with pytest.raises(CommitOutcomeUnknownError, match="reload"):
            session.commit(session.state.evolve(), [("agent_waited", {})])
        landed = session.reload()
        assert landed.phase is Phase.PENDING and landed.pending is not None
        assert sandbox.write_count() == 0  # nothing left after the lost commit
