"""A store's hold on a run for one process, on SQLite (a temp file) and PostgreSQL (a fresh schema).

The other process is a real child (``python -c``) that opens the store by
URL and takes or tries the hold; it is killed with SIGKILL where the test
says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance._pg import fresh_schema, pg_dsn, url_in_schema
from tether.core import RunBusyError
from tether.store import RunHold, RunHolder, open_store

#: The other process: hold run argv[2] of the store at argv[1] (or say it is busy),
#: then give the hold up and exit on the lines the test writes.
_OTHER = """
import sys
from tether.core import RunBusyError
from tether.store import open_store
store = open_store(sys.argv[1])
try:
    hold = store.hold_run(sys.argv[2])
except RunBusyError:
    print("busy", flush=True)
    sys.exit(0)
helper = 0
if sys.argv[3:] == ["fork"]:
    import os, time
    helper = os.fork()
    if helper == 0:  # a helper forked without exec that outlives this process
        time.sleep(60)
        os._exit(0)
print("held", helper, flush=True)
sys.stdin.readline()
hold.release()
print("released", flush=True)
sys.stdin.readline()
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL of each kind tether ships, on a database of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite'}"
        return
    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        yield url_in_schema(dsn, schema)


class Other:
    """The other process, holding (or trying to hold) one run."""

    def __init__(self, url: str, run_id: str, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _OTHER, url, run_id, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )

    def said(self) -> str:
        out = self.proc.stdout
        if out is None:
            raise RuntimeError("no stdout")
        return out.readline().strip()

    def tell(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def end(self) -> None:
        if self.proc.poll() is None:
            self.kill()


def held_within(store: RunHolder, run_id: str, seconds: float) -> RunHold:
    """The run's hold, taken as soon as a killed holder's lock is gone (within ``seconds``).

    SQLite's flock is gone with the process; PostgreSQL ends the backend when
    it reads the closed socket, moments after. Nothing has a ttl.
    """
    started = time.monotonic()
    while True:
        try:
            return store.hold_run(run_id)
        except RunBusyError:
            if time.monotonic() - started > seconds:
                raise
            time.sleep(0.01)


def _open(url: str) -> RunHolder:
    store = open_store(url)
    if not isinstance(store, RunHolder):
        raise TypeError(f"{store!r} holds no runs")
    return store


def test_a_run_held_by_a_live_process_is_refused_and_free_as_soon_as_it_is_killed(
    url: str,
) -> None:
    """Another live process's hold refuses this one (RunBusyError naming the run); SIGKILL frees it."""
    store = _open(url)
    other = Other(url, "r1")
    try:
        assert other.said() == "held 0"
        with pytest.raises(RunBusyError) as refused:
            store.hold_run("r1")
        assert refused.value.run_id == "r1" and "lease_ttl_s" in str(refused.value)
        store.hold_run("r2").release()  # another run is not held
        other.kill()
        held_within(store, "r1", 5.0).release()
    finally:
        other.end()


def test_one_process_shares_its_hold_and_the_last_release_frees_the_run(url: str) -> None:
    """Two openers in one process (two store objects) share the hold; only the last release frees it."""
    first, second = _open(url), _open(url)
    a = first.hold_run("r")
    b = second.hold_run("r")  # this process already holds r: shared, as today
    a.release()
    a.release()  # a second release of one share changes nothing
    other = Other(url, "r")
    try:
        assert other.said() == "busy"
    finally:
        other.end()
    b.release()
    other = Other(url, "r")
    try:
        assert other.said() == "held 0"
        other.tell()
        assert other.said() == "released"
        first.hold_run("r").release()  # free again after a clean release, at once
    finally:
        other.end()


def test_a_hold_check_fails_once_the_process_no_longer_holds_the_run(url: str) -> None:
    """After its last share is released, a hold's check refuses (RunBusyError): nothing may be sent."""
    store = _open(url)
    hold = store.hold_run("r")
    hold.check()
    hold.release()
    with pytest.raises(RunBusyError):
        hold.check()


def test_a_forked_child_holds_nothing_and_leaves_its_parent_holding(url: str) -> None:
    """After fork the child's inherited hold fails its check and the run stays the parent's."""
    store = _open(url)
    hold = store.hold_run("r")
    pid = os.fork()
    if pid == 0:  # the child: leave without running the parent's cleanups
        code = 1
        try:
            hold.check()
        except RunBusyError:
            try:
                _open(url).hold_run("r")
            except RunBusyError:
                code = 0  # refused: the parent still holds it
        finally:
            hold.release()  # lets go of nothing of the parent's
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    hold.check()  # the parent's hold survived the child's exit and its release
    other = Other(url, "r")
    try:
        assert other.said() == "busy"
    finally:
        other.end()
    hold.release()


@pytest.mark.postgres
def test_a_dropped_postgres_connection_loses_the_hold_and_the_next_opener_takes_it_afresh() -> None:
    """The server ends the holding session: its hold fails its check; opening again holds anew."""
    import hashlib

    import psycopg

    dsn = pg_dsn()
    with fresh_schema(dsn) as schema:
        url = url_in_schema(dsn, schema)
        store = _open(url)
        hold = store.hold_run("r")
        key = hashlib.sha256(f"tether-run\0{schema}\0r".encode()).digest()[:8]
        unsigned = int.from_bytes(key, "big")
        with psycopg.connect(dsn, autocommit=True) as admin:
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid = %s AND objid = %s AND objsubid = 1 "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                (unsigned >> 32, unsigned & 0xFFFFFFFF),
            ).fetchall()
        assert rows == [(True,)]  # exactly this test's holding session
        deadline = time.monotonic() + 5
        while True:
            try:
                hold.check()
            except RunBusyError:
                break
            assert time.monotonic() < deadline, "the lost hold still passed its check"
            time.sleep(0.01)
        again = store.hold_run("r")
        again.check()
        with pytest.raises(RunBusyError):
            hold.check()  # the lost one stays refused
        hold.release()
        again.release()


def test_a_helper_forked_by_a_killed_holder_does_not_keep_its_run_held(url: str) -> None:
    """A process holding a run forks a helper (no exec) and is killed: the run opens at once while the helper lives."""
    store = _open(url)
    other = Other(url, "r1", "fork")
    said = other.said().split()
    assert said[0] == "held" and int(said[1]) > 0
    helper = int(said[1])
    try:
        with pytest.raises(RunBusyError):
            store.hold_run("r1")
        other.kill()
        hold = held_within(store, "r1", 5.0)
        os.kill(helper, 0)  # the helper still lives: it held nothing
        hold.release()
    finally:
        other.end()
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)


def test_a_share_dropped_by_the_collector_inside_hold_run_never_waits(url: str) -> None:
    """A finalizer's release_soon while the registry's lock is taken (a collection inside hold_run) returns at once; the next holder gives the share up."""
    from tether.store import _runlock

    store = _open(url)
    hold = store.hold_run("r1")
    with _runlock._registry.lock:  # as during hold_run, when a collection runs a finalizer
        hold.release_soon()  # a plain release() here deadlocked the suite
    other = Other(url, "r1")
    try:
        assert other.said() == "busy"  # not given up yet: nobody took the lock since
    finally:
        other.end()
    store.hold_run("r2").release()  # the next holder settles the dropped share
    other = Other(url, "r1")
    try:
        assert other.said() == "held 0"
    finally:
        other.end()
