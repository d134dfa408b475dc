"""One side of ``bench/compare.py``, run as a child process that the parent drives by lines.

    python bench/_compare_side.py SIDE --dir DIR [--pg DSN] [--state-bytes N]

Each side lives in a process of its own (DBOS allows one instance per
process, and a side's imports and threads must not tax another's timing).
It reads one command per line on stdin and answers one JSON line on stdout:

``steps K``  K more durable steps of the side's one long run; answers
             ``{"wall": s, "cpu": s, "at": step}`` timed inside this process
``size``     bytes the side's store holds now (see :func:`sqlite_bytes`, :func:`pg_bytes`)
``info``     ``{"durability": text}``: the settings the side really runs with
``quit``     close and exit

Every side carries the same user state, a ``--state-bytes`` string rewritten
at every step (its first characters name the step, so no two are equal), and
does one durable step per command unit:

- ``tether-*``: one ``RunSession.step()`` of the real ``Runtime`` over the
  ``Sandbox`` adapter: a write gated, its key minted and intent persisted
  (one checkpoint commit, which carries the previous step's receipt),
  executed, its receipt sealed and the state advanced (written with the next
  step's commit). The agent keeps the state in ``AgentContext.memory``.
- ``tethercommit-*``: one ``RunSession.commit`` of that run (after one real
  write): the next signed generation with the state rewritten in its
  context and one trace event, and no effect: tether's unit of durability,
  the one ``bench/checkpoint.py`` measures.
- ``langgraph-*``, ``tethersaver-*``: one super-step of a compiled
  ``StateGraph`` whose single node loops on itself, invoked with
  ``durability="sync"`` (each checkpoint written before the next step runs).
- ``dbos-*``: one ``@DBOS.step`` inside a ``@DBOS.workflow`` that runs K steps
  (the step's output, the state, is recorded before the next step runs).
- ``bare-sqlite-wal`` / ``bare-sqlite-delete`` / ``bare-pg``: one committed
  single-row INSERT of a ``--state-bytes`` body (the store's own bar).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import operator
import os
import sqlite3
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

SIDES = (
    "tether-sqlite",
    "tether-pg",
    "tethercommit-sqlite",
    "tethercommit-pg",
    "tethersaver-sqlite",
    "tethersaver-pg",
    "langgraph-sqlite",
    "langgraph-pg",
    "dbos-sqlite",
    "dbos-pg",
    "bare-sqlite-wal",
    "bare-sqlite-delete",
    "bare-pg",
)


def state_text(step: int, size: int) -> str:
    """The user state after ``step``: ``size`` characters, different at every step.

    Random base64 after the step's name, so neither PostgreSQL's TOAST nor any
    other compression can make one side's bytes look smaller than they are.
    """
    head = f"step {step:09d} "
    body = base64.b64encode(os.urandom(size)).decode()
    return (head + body)[:size]


def with_schema(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` set to ``schema`` (libpq URL options)."""
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}options=-csearch_path%3D{schema}"


def sqlite_bytes(path: Path) -> int:
    """Bytes in use in a SQLite file after folding its WAL in: (pages - free pages) x page size."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * size)
    finally:
        conn.close()


def sqlite_pragmas(path: Path) -> str:
    """The journal mode stored in the file (a fresh connection's synchronous is the default)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        return f"journal_mode={conn.execute('PRAGMA journal_mode').fetchone()[0]}"
    finally:
        conn.close()


def pg_bytes(dsn: str, schema: str) -> int:
    """Bytes of every table in ``schema`` with its indexes and TOAST."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        ).fetchone()
    return int(row[0]) if row else 0


class Side:
    """A side: ``steps(k)`` does k durable steps; ``size()`` says what its store holds."""

    durability = ""

    def steps(self, k: int) -> None:
        raise NotImplementedError

    def size(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Release connections."""


# -- tether ------------------------------------------------------------------------------


class TetherSide(Side):
    """One run of the real ``Runtime``; each step one gated, executed, recorded write."""

    def __init__(
        self,
        store_kind: str,
        base: Path,
        dsn: str,
        schema: str,
        size: int,
        growing: bool,
        commit_only: bool = False,
    ) -> None:
        from tether.core import Observation, Policy, Proposal, TaskSpec
        from tether.crypto import Keyring
        from tether.runtime import AgentContext, Decision, Runtime
        from tether.store import PostgresStore, SQLiteStore
        from tether.testing import Sandbox

        class Keeper:
            """Rewrites the state in memory and writes one small file at every step."""

            def decide(self, context: AgentContext, observation: Observation) -> Decision:
                cursor = context.plan_cursor + 1
                if growing:
                    new = AgentContext((*context.messages, state_text(cursor, size)), {}, cursor)
                else:
                    new = AgentContext((), {"state": state_text(cursor, size)}, cursor)
                return Decision(
                    context=new,
                    proposal=Proposal(
                        action_id=f"w{cursor}",
                        kind="file.write",
                        target="notes.txt",
                        args={"content": f"step {cursor}\n"},
                        based_on_version=observation.environment.version,
                    ),
                )

        sandbox = Sandbox({"notes.txt": "step 0\n"}, instance_id="compare")
        big = 10**9
        task = TaskSpec.from_json(
            {
                "task_id": "compare",
                "task_version": "1",
                "allowed_kinds": ["file.write"],
                "allowed_paths": ["notes.txt"],
                "permissions": ["workspace.write"],
                "budgets": {"proposals": big, "steps": big, "wall_time_s": 10**6, "cost": 0},
                "initial_environment": {
                    "namespace": sandbox.namespace,
                    "state_fingerprint": sandbox.environment().state_fingerprint,
                },
                "verifier": {"argv": ["true"], "timeout_s": 60},
            }
        )
        policy = Policy.from_json(
            {
                "policy_id": "compare",
                "policy_version": "1",
                "kinds": {
                    "file.write": {
                        "risk": "low",
                        "permission": "workspace.write",
                        "needs_approval": False,
                    }
                },
                "max_risk": "medium",
                "approval_ttl_s": 900,
            }
        )
        self.path = base / "tether.sqlite"
        self.dsn, self.schema = dsn, schema
        if store_kind == "sqlite":
            self.store: Any = SQLiteStore(self.path, synchronous="FULL")
            self.durability = "tether SQLiteStore: journal_mode=WAL, synchronous=FULL"
        else:
            self.store = PostgresStore(with_schema(dsn, schema))
            self.durability = "tether PostgresStore (server defaults)"
        runtime = Runtime(
            store=self.store,
            keyring=Keyring.generate("compare-1"),
            adapter=sandbox,
            task=task,
            policy=policy,
            agent=Keeper(),
        )
        self.session = runtime.start("compare-run")
        self.kind = store_kind
        self.commit_only = commit_only
        self.growing, self.state_size = growing, size
        if commit_only:
            self.steps(1)  # one real write first, as a mid-run state has

    def commit(self) -> None:
        """One checkpoint commit of the next generation, the state rewritten, no effect."""
        from tether.runtime import AgentContext

        session = self.session
        state, context = session.state, session.context
        cursor = context.plan_cursor + 1
        text = state_text(cursor, self.state_size)
        if self.growing:
            new = AgentContext((*context.messages, text), {}, cursor)
        else:
            new = AgentContext((), {"state": text}, cursor)
        version = state.environment.version
        session.commit(
            state.evolve(observed_version=version),
            [("agent_waited", {"observed_version": version})],
            context=new,
        )

    def steps(self, k: int) -> None:
        from tether.core import OutcomeKind

        if self.commit_only and self.session.state.spent.steps > 0:
            for _ in range(k):
                self.commit()
            return
        for _ in range(k):
            outcome = self.session.step()
            if outcome.kind is not OutcomeKind.EXECUTED:
                raise SystemExit(f"a tether step did not execute: {outcome.kind}")

    def size(self) -> int:
        if self.kind == "sqlite":
            return sqlite_bytes(self.path)
        return pg_bytes(self.dsn, self.schema)

    def close(self) -> None:
        self.store.close()


# -- LangGraph (its own savers and TetherSaver) -------------------------------------------


class GraphState(TypedDict):
    """The graph's state: a step counter, where to stop, and the user state."""

    count: int
    target: int
    state: str


class GrowingState(TypedDict):
    """The graph's state in the growing workload: one message appended per step."""

    count: int
    target: int
    messages: Annotated[list[str], operator.add]


class GraphSide(Side):
    """A one-node ``StateGraph`` looping on itself; one super-step (one checkpoint) per step."""

    def __init__(
        self, saver: str, base: Path, dsn: str, schema: str, size: int, growing: bool
    ) -> None:
        from langgraph.graph import END, START, StateGraph

        field = "messages" if growing else "state"

        def node(s: dict[str, Any]) -> dict[str, Any]:
            new = state_text(s["count"] + 1, size)
            return {"count": s["count"] + 1, field: [new] if growing else new}

        def route(s: dict[str, Any]) -> str:
            return "node" if s["count"] < s["target"] else END

        self.empty: dict[str, Any] = {"count": 0, field: [] if growing else ""}
        builder: Any = StateGraph(GrowingState if growing else GraphState)
        builder.add_node("node", node)
        builder.add_edge(START, "node")
        builder.add_conditional_edges("node", route)
        self.path = base / f"{saver}.sqlite"
        self.dsn, self.schema, self.saver_name = dsn, schema, saver
        self._closers: list[Any] = []
        checkpointer = self._saver(saver)
        self.graph = builder.compile(checkpointer=checkpointer)
        self.config: Any = {"configurable": {"thread_id": "compare"}}
        self.count = 0

    def _saver(self, saver: str) -> Any:
        if saver == "langgraph-sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = sqlite3.connect(self.path, check_same_thread=False)
            self._closers.append(conn.close)
            made: Any = SqliteSaver(conn)
            made.setup()
            sync = conn.execute("PRAGMA synchronous").fetchone()[0]
            journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
            self.durability = (
                f"SqliteSaver: journal_mode={journal}, synchronous={sync} "
                "(2 = FULL; set by SqliteSaver.setup / SQLite's default)"
            )
            return made
        if saver == "langgraph-pg":
            import psycopg
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg.rows import dict_row

            pg = psycopg.connect(
                with_schema(self.dsn, self.schema),
                autocommit=True,
                prepare_threshold=0,
                row_factory=dict_row,
            )
            self._closers.append(pg.close)
            made = PostgresSaver(pg)  # type: ignore[arg-type]
            made.setup()
            self.durability = "PostgresSaver (autocommit connection, server defaults)"
            return made
        from tether.crypto import Keyring
        from tether.integrations.langgraph import TetherSaver

        if saver == "tethersaver-sqlite":
            url = f"sqlite:///{self.path}"
            self.durability = "TetherSaver on tether's SQLite store: WAL, synchronous=FULL"
        else:
            url = with_schema(self.dsn, self.schema)
            self.durability = "TetherSaver on tether's PostgreSQL store (server defaults)"
        made = TetherSaver.from_url(url, Keyring.generate("compare-1"))
        self._closers.append(made.close)
        return made

    def steps(self, k: int) -> None:
        start = self.empty if self.count == 0 else {}
        self.count += k
        out = self.graph.invoke(
            {**start, "target": self.count},
            {**self.config, "recursion_limit": k + 10},
            durability="sync",
        )
        if out["count"] != self.count:
            raise SystemExit(f"the graph stopped at {out['count']}, not {self.count}")

    def size(self) -> int:
        if self.saver_name.endswith("sqlite"):
            return sqlite_bytes(self.path)
        return pg_bytes(self.dsn, self.schema)

    def close(self) -> None:
        for close in reversed(self._closers):
            close()


# -- DBOS ---------------------------------------------------------------------------------


class DbosSide(Side):
    """DBOS Transact: a workflow of K ``@DBOS.step`` calls, each returning the new state."""

    def __init__(
        self, store_kind: str, base: Path, dsn: str, schema: str, size: int, growing: bool
    ) -> None:
        from dbos import DBOS

        self.path = base / "dbos.sqlite"
        self.dsn, self.schema, self.kind = dsn, schema, store_kind
        if store_kind == "sqlite":
            config: Any = {"name": "compare", "system_database_url": f"sqlite:///{self.path}"}
        else:
            config = {
                "name": "compare",
                "system_database_url": dsn,
                "dbos_system_schema": schema,
            }
        config["log_level"] = "WARNING"

        @DBOS.step()
        def one_step(step: int) -> str:
            return state_text(step, size)

        @DBOS.workflow()
        def run_steps(first: int, k: int) -> int:
            # Growing: the messages live in the workflow's variables, rebuilt from the
            # recorded step outputs on recovery, so each step records its own message only.
            messages: list[str] = []
            for step in range(first, first + k):
                messages.append(one_step(step))
            return len(messages)

        self.dbos = DBOS(config=config)
        DBOS.launch()
        self.run_steps = run_steps
        self.count = 0
        if store_kind == "sqlite":
            self.durability = f"DBOS system database on SQLite: {sqlite_pragmas(self.path)}, "
            self.durability += "synchronous=SQLite's default (DBOS sets neither)"
        else:
            self.durability = "DBOS system database on PostgreSQL (server defaults)"

    def steps(self, k: int) -> None:
        self.run_steps(self.count + 1, k)
        self.count += k

    def size(self) -> int:
        if self.kind == "sqlite":
            return sqlite_bytes(self.path)
        return pg_bytes(self.dsn, self.schema)

    def close(self) -> None:
        from dbos import DBOS

        DBOS.destroy(destroy_registry=True)


# -- the bars -----------------------------------------------------------------------------


class BareSide(Side):
    """One committed single-row INSERT per step: what the store itself can do."""

    def __init__(self, kind: str, base: Path, dsn: str, schema: str, size: int) -> None:
        self.kind, self.dsn, self.schema = kind, dsn, schema
        self.body = state_text(0, size).encode()
        self.gen = itertools.count(1)
        self.path = base / f"{kind}.sqlite"
        if kind == "bare-pg":
            import psycopg

            self.pg = psycopg.connect(with_schema(dsn, schema), autocommit=True)
            self.pg.execute("CREATE TABLE t (gen bigint PRIMARY KEY, body bytea NOT NULL)")
            self.durability = "bare PostgreSQL: autocommit INSERT of one row (server defaults)"
            return
        journal = "WAL" if kind == "bare-sqlite-wal" else "DELETE"
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.conn.execute(f"PRAGMA journal_mode={journal}")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE t (gen INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        self.durability = f"bare sqlite3: journal_mode={journal}, synchronous=FULL"

    def steps(self, k: int) -> None:
        if self.kind == "bare-pg":
            for _ in range(k):
                self.pg.execute(
                    "INSERT INTO t (gen, body) VALUES (%s, %s)", (next(self.gen), self.body)
                )
            return
        for _ in range(k):
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.execute(
                "INSERT INTO t (gen, body) VALUES (?, ?)", (next(self.gen), self.body)
            )
            self.conn.execute("COMMIT")

    def size(self) -> int:
        if self.kind == "bare-pg":
            return pg_bytes(self.dsn, self.schema)
        return sqlite_bytes(self.path)

    def close(self) -> None:
        if self.kind == "bare-pg":
            self.pg.close()
        else:
            self.conn.close()


def make(name: str, base: Path, dsn: str, schema: str, size: int, growing: bool) -> Side:
    """The side called ``name``, its store fresh in ``base`` or in ``schema``."""
    store = "sqlite" if name.endswith("sqlite") else "pg"
    if name.startswith("tether-"):
        return TetherSide(store, base, dsn, schema, size, growing)
    if name.startswith("tethercommit-"):
        return TetherSide(store, base, dsn, schema, size, growing, commit_only=True)
    if name.startswith(("langgraph-", "tethersaver-")):
        return GraphSide(name, base, dsn, schema, size, growing)
    if name.startswith("dbos-"):
        return DbosSide(store, base, dsn, schema, size, growing)
    return BareSide(name, base, dsn, schema, size)


def serve(side: Side) -> None:
    """Answer the parent's commands until ``quit`` or end of input."""
    done = 0
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "steps":
            k = int(arg)
            wall, cpu = time.perf_counter(), time.process_time()
            side.steps(k)
            answer: dict[str, Any] = {
                "wall": time.perf_counter() - wall,
                "cpu": time.process_time() - cpu,
            }
            done += k
            answer["at"] = done
        elif command == "size":
            answer = {"bytes": side.size()}
        elif command == "info":
            answer = {"durability": side.durability}
        else:
            break
        print(json.dumps(answer), flush=True)
    side.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one side of bench/compare.py")
    parser.add_argument("side", choices=SIDES)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--pg", default="")
    parser.add_argument("--schema", default=f"compare_{uuid.uuid4().hex[:8]}")
    parser.add_argument("--state-bytes", type=int, default=2048)
    parser.add_argument(
        "--workload",
        choices=["fixed", "messages"],
        default="fixed",
        help="fixed: the state is rewritten each step; messages: one message of "
        "--state-bytes is appended to a growing list each step",
    )
    args = parser.parse_args(argv)
    growing = args.workload == "messages"
    serve(make(args.side, args.dir, args.pg, args.schema, args.state_bytes, growing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
