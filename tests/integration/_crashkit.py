"""Crash the demo run at a named point, recover it, and read back what is on disk.

Used by ``test_crash_matrix.py``. These helpers only gather facts (a
:class:`Window` before recovery, an :class:`Outcome` after it); the tests do
the asserting, so that pytest's assertion rewriting reports them and
``python -O`` cannot strip them.

Two ways to die: ``kill`` runs the demo's real work in a child process
(``python -m tether.cli _demo-child``) armed with ``CrashPlan(mode="kill")``,
which SIGKILLs itself at the point; ``raise`` runs it in this process with
``CrashPlan(mode="raise")`` and drops every object of the crashed runtime.
Recovery always builds everything afresh from the same files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from tether import _demo
from tether.core import EffectStatus, Phase, RunState, TraceEvent
from tether.core._ledger import verify_ledger
from tether.core._state import GENESIS_HASH
from tether.core._trace import chain_hash
from tether.runtime import Checkpointer, CrashPlan, CrashPoint, Runtime, SimulatedCrash
from tether.store import LedgerEntry, SQLBase, SQLiteStore

RUN_ID = _demo.RUN_ID
CHILD_TIMEOUT_S = 60

Placement = Literal["colocated", "separate", "postgres"]
Mode = Literal["kill", "raise"]

# PostgreSQL trials each get a schema of their own; the test module drops them.
PG_SCHEMAS: list[str] = []


def seed(base: Path, placement: Placement) -> _demo.DemoPaths:
    """A fresh demo under ``base``: buggy workspace, keyring, task and policy files.

    ``postgres`` keeps content and mark in one fresh PostgreSQL schema.
    """
    marks = base / "marks.sqlite" if placement == "separate" else None
    paths = _demo.DemoPaths.under(base, marks=marks)
    if placement == "postgres":
        paths = replace(paths, store_url=_fresh_pg_schema())
    _demo.prepare(paths)
    return paths


def _fresh_pg_schema() -> str:
    import uuid

    import psycopg

    from tests.conformance._pg import pg_dsn, url_in_schema

    dsn = pg_dsn()
    schema = f"tether_crash_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    PG_SCHEMAS.append(schema)
    return url_in_schema(dsn, schema)


def drop_pg_schemas() -> None:
    """Drop every schema the PostgreSQL trials created."""
    if not PG_SCHEMAS:
        return
    import psycopg

    from tests.conformance._pg import pg_dsn

    with psycopg.connect(pg_dsn(), autocommit=True) as admin:
        while PG_SCHEMAS:
            admin.execute(f'DROP SCHEMA IF EXISTS "{PG_SCHEMAS.pop()}" CASCADE')


# -- dying and coming back ---------------------------------------------------------


def run_child(
    paths: _demo.DemoPaths, stage: str, point: CrashPoint | None = None, hit: int = 1
) -> subprocess.CompletedProcess[str]:
    """Run ``tether _demo-child STAGE`` in a new interpreter (with this one's ``-O`` level)."""
    cmd = [sys.executable, *["-O"] * sys.flags.optimize, "-m", "tether.cli", "_demo-child", stage]
    cmd += ["--db", str(paths.db), "--workspace", str(paths.workspace)]
    if paths.marks is not None:
        cmd += ["--marks", str(paths.marks)]
    if paths.store_url is not None:
        cmd += ["--store", paths.store_url]
    if point is not None:
        cmd += ["--crash-at", point.value, "--crash-hit", str(hit)]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ),
        timeout=CHILD_TIMEOUT_S,
    )


@dataclass(frozen=True, slots=True)
class Death:
    """How a crashing attempt ended."""

    returncode: int | None  # the child's exit status (kill mode)
    stderr: str
    point: CrashPoint | None  # the point a SimulatedCrash named (raise mode)
    hits: int | None  # how often the plan saw its point (raise mode)


def crash(paths: _demo.DemoPaths, point: CrashPoint, hit: int, mode: Mode) -> Death:
    """Start the demo run armed to die at the ``hit``-th pass through ``point``."""
    if mode == "kill":
        done = run_child(paths, "start", point, hit)
        return Death(done.returncode, done.stderr, None, None)
    plan = CrashPlan(point, nth=hit, mode="raise")
    with _demo.workspace(paths) as ws:
        rt = _demo.runtime(paths, ws, plan)
        session = None
        try:
            session = rt.start(RUN_ID)
            session.run()
        except SimulatedCrash as exc:
            return Death(None, "", exc.point, plan.hits)
        finally:
            # A process that died holds nothing: its hold on the run goes with it
            # now, not when the collector finds the dropped session.
            hold = None if session is None else session.liveness
            if hold is not None:
                hold.release()
            close_stores(rt)
    return Death(None, "", None, plan.hits)


@dataclass(frozen=True, slots=True)
class Revival:
    """How a recovery attempt ended."""

    returncode: int
    stderr: str


def recover(paths: _demo.DemoPaths, mode: Mode) -> Revival:
    """``start_or_recover`` and run to the end, in a fresh child or with fresh objects here."""
    if mode == "kill":
        done = run_child(paths, "recover")
        return Revival(done.returncode, done.stderr)
    with _demo.workspace(paths) as ws:
        rt = _demo.runtime(paths, ws)
        try:
            rt.start_or_recover(RUN_ID).run()
        finally:
            close_stores(rt)
    return Revival(0, "")


def close_stores(rt: Runtime) -> None:
    """Close the runtime's store connections (content and, when separate, the mark)."""
    for store in {id(s): s for s in (rt.store, rt.checkpointer.marks)}.values():
        if isinstance(store, SQLBase):
            store.close()


# -- reading what is on disk ---------------------------------------------------------


@contextmanager
def stores(paths: _demo.DemoPaths) -> Iterator[tuple[SQLBase, SQLBase]]:
    """The content store and the store holding the mark (the same one when co-located)."""
    content = _demo.open_demo_store(paths)
    marks = SQLiteStore(paths.marks) if paths.marks is not None else content
    try:
        yield content, marks
    finally:
        if marks is not content:
            marks.close()
        content.close()


def load_state(paths: _demo.DemoPaths) -> RunState | None:
    """The checkpoint the mark names, verified under the demo's key; ``None`` without a mark."""
    with stores(paths) as (content, marks):
        if marks.get_mark(RUN_ID) is None:
            return None
        separate = marks if marks is not content else None
        return Checkpointer(content, _demo.keyring(paths), marks=separate).load(RUN_ID).state


@dataclass(frozen=True, slots=True)
class Window:
    """What is durable after a crash and before recovery."""

    mark_generation: int | None
    newest_content: int | None
    phase: Phase | None
    writes_committed: int | None
    ledger: tuple[EffectStatus, ...]
    workspace_writes: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A :class:`Window` plus the loaded state and the adapter's receipt for its pending key."""

    window: Window
    state: RunState | None
    ledger: list[LedgerEntry]
    adapter_receipt: dict[str, Any] | None


def snapshot(paths: _demo.DemoPaths) -> Snapshot:
    """Read the stores and the workspace as a recovering process would find them."""
    state = load_state(paths)
    with stores(paths) as (content, marks):
        mark = marks.get_mark(RUN_ID)
        newest = content.newest_generation(RUN_ID)
        ledger = content.ledger(RUN_ID)
    # No crash point lies inside the workspace's own write, so opening it here
    # settles nothing a recovering process would otherwise have found.
    with _demo.workspace(paths) as ws:
        writes = ws.write_count()
        pending = None if state is None else state.pending
        receipt = None if pending is None else ws.lookup(pending.idempotency_key)
    window = Window(
        mark_generation=None if mark is None else mark.generation,
        newest_content=newest,
        phase=None if state is None else state.phase,
        writes_committed=None if state is None else state.writes_committed,
        ledger=tuple(e.status for e in ledger),
        workspace_writes=writes,
    )
    return Snapshot(window, state, ledger, None if receipt is None else receipt.to_json())


@dataclass(frozen=True, slots=True)
class Outcome:
    """Everything the checks need after recovery."""

    state: RunState
    mark_generation: int
    calc: str
    workspace_writes: int
    committed: list[LedgerEntry]
    adapter_receipts: list[dict[str, Any] | None]  # the workspace's receipt per committed key
    trace: list[TraceEvent]


def outcome(paths: _demo.DemoPaths) -> Outcome:
    """The recovered run: newest checkpoint, ledger, trace from its head, and the workspace."""
    state = load_state(paths)
    if state is None:
        raise AssertionError("no high-water mark after recovery")
    with stores(paths) as (content, marks):
        mark = marks.get_mark(RUN_ID)
        # Only rows on the signed chain count: an orphaned commit's rows do not.
        chain, _ = verify_ledger(
            RUN_ID,
            content.ledger(RUN_ID),
            state.ledger_head,
            state.ledger_length,
            GENESIS_HASH,
            orphans_possible=True,
        )
        committed = [e for e in chain if e.status is EffectStatus.COMMITTED]
        trace = content.trace(RUN_ID, state.trace_head)
    with _demo.workspace(paths) as ws:
        writes = ws.write_count()
        calc = (ws.root / "calc.py").read_text()
        receipts = [ws.lookup(e.idempotency_key) for e in committed]
    return Outcome(
        state=state,
        mark_generation=0 if mark is None else mark.generation,
        calc=calc,
        workspace_writes=writes,
        committed=committed,
        adapter_receipts=[None if r is None else r.to_json() for r in receipts],
        trace=trace,
    )


def chain_breaks(events: list[TraceEvent], state: RunState) -> list[str]:
    """Every way the trace from the head fails to be one unbroken chain; empty if sound."""
    problems: list[str] = []
    head = GENESIS_HASH
    for index, event in enumerate(events, start=1):
        if event.seq != index:
            problems.append(f"event {index} has seq {event.seq}")
        if event.prev_hash != head:
            problems.append(f"event {index} prev_hash does not name event {index - 1}")
        if chain_hash(event.prev_hash, event.body()) != event.hash:
            problems.append(f"event {index} hash does not match its body")
        head = event.hash
    if len(events) != state.trace_length:
        problems.append(f"{len(events)} events on the chain, state says {state.trace_length}")
    if head != state.trace_head:
        problems.append("the chain does not end at the checkpoint's trace head")
    return problems
