"""The SIGKILL-after-effect trial of ``bench/compare.py``: how often a service sees one effect.

One trial, for one framework: a child process runs a step whose effect is a
real ``POST /tickets`` to a service on loopback, and SIGKILLs itself right
after the service answered, before the framework records the step as done.
A second, fresh process then recovers or resumes the work the framework's own
way. The service counts every ``POST /tickets`` it receives, by the ticket's
title (one title per trial), so the count is what the world saw, whatever
the framework believes. One request is right; more are duplicates.

The service is tether's reference effects service
(:mod:`tether.testing.effects_service`) behind a thin ASGI layer that counts
requests and answers ``GET /_seen``. The peers' steps send a fresh
``Idempotency-Key`` with each request (the service requires one; a step that
the framework re-runs has no way to know the key it used before), tether's
``HttpEffect`` sends the key it minted and persisted before the request.

    python bench/_compare_kill.py serve --db FILE          # the counting service
    python bench/_compare_kill.py child FRAMEWORK PHASE ... # one process of a trial
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

FRAMEWORKS = (
    "tether-sqlite",
    "tether-pg",
    "langgraph-sqlite",
    "langgraph-pg",
    "tethersaver-sqlite",
    "dbos-sqlite",
    "dbos-pg",
)
HERE = Path(__file__).resolve()


class TicketState(TypedDict):
    """The graph's state in a trial: which ticket to open, and whether it was."""

    title: str
    done: bool


# -- the counting service -----------------------------------------------------------------


def counting(app: Any) -> Any:
    """``app`` with every ``POST /tickets`` counted by its JSON body's title."""
    seen: Counter[str] = Counter()

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["method"] == "GET" and scope["path"] == "/_seen":
            body = json.dumps(dict(seen)).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["method"] != "POST" or scope["path"] != "/tickets":
            await app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            title = str(json.loads(raw).get("title", "?"))
        except (ValueError, AttributeError):
            title = "?"
        seen[title] += 1
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return {"type": "http.disconnect"}
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await app(scope, replay, send)

    return wrapped


def serve(db: Path) -> None:
    """Serve the counting service on loopback; print its URL once listening."""
    import uvicorn

    from tether.testing.effects_service import build_app, listen

    sock = listen(0)
    config = uvicorn.Config(
        counting(build_app(db)), log_level="warning", access_log=False, lifespan="off"
    )
    print(json.dumps({"url": f"http://127.0.0.1:{sock.getsockname()[1]}"}), flush=True)
    uvicorn.Server(config).run(sockets=[sock])


@contextmanager
def service(base: Path) -> Iterator[str]:
    """The counting service as a child process; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, str(HERE), "serve", "--db", str(base / "service.sqlite")],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = process.stdout.readline() if process.stdout is not None else ""
        if not line:
            raise SystemExit("the counting service did not start")
        yield str(json.loads(line)["url"])
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def seen(url: str) -> dict[str, int]:
    """Requests the service saw, by title."""
    import httpx

    return dict(httpx.get(f"{url}/_seen", timeout=10).json())


# -- the effect, as a peer's step makes it -------------------------------------------------


def post_ticket(url: str, title: str) -> None:
    """One plain POST, under a fresh key; then SIGKILL this process if the trial armed it."""
    import httpx

    from tether.adapters._httpfields import IDEMPOTENCY_KEY, sf_string

    headers = {IDEMPOTENCY_KEY: sf_string(f"peer-{uuid.uuid4().hex}")}
    response = httpx.post(f"{url}/tickets", json={"title": title}, headers=headers, timeout=10)
    if response.status_code not in (200, 201):
        raise SystemExit(f"the service answered {response.status_code}: {response.text}")
    if os.environ.get("COMPARE_ARMED") == "1":
        os.kill(os.getpid(), signal.SIGKILL)


# -- one process of a trial, per framework -------------------------------------------------


def ticket_runtime(
    http: Any, store: Any, keyring: Any, task_id: str, *, armed: bool, agent: Any = None
) -> Any:
    """A runtime that may POST tickets unapproved; ``armed``: SIGKILLed right after the send."""
    from tether.core import Policy, TaskSpec
    from tether.runtime import CrashPlan, CrashPoint, Runtime

    fingerprint = http.environment().state_fingerprint

    task = TaskSpec.from_json(
        {
            "task_id": task_id,
            "task_version": "1",
            "allowed_kinds": ["http.post"],
            "allowed_paths": ["tickets"],
            "permissions": ["service.write"],
            "budgets": {"proposals": 10, "steps": 10, "wall_time_s": 3600, "cost": 0},
            "initial_environment": {"namespace": "http", "state_fingerprint": fingerprint},
            "verifier": {"argv": ["true"], "timeout_s": 5},
        }
    )
    rule = {"risk": "low", "permission": "service.write", "needs_approval": False}
    policy = Policy.from_json(
        {
            "policy_id": task_id,
            "policy_version": "1",
            "kinds": {"http.post": rule},
            "max_risk": "medium",
            "approval_ttl_s": 900,
        }
    )
    return Runtime(
        store=store,
        keyring=keyring,
        adapter=http,
        task=task,
        policy=policy,
        agent=agent,
        crash=CrashPlan(CrashPoint.EFFECT_SENT, mode="kill") if armed else CrashPlan(),
    )


def tether_child(args: argparse.Namespace) -> None:
    """tether's Runtime over HttpEffect; killed at EFFECT_SENT, then recovered."""
    from tether.adapters import REFERENCE_PROFILE, HttpEffect
    from tether.core import Observation, Proposal
    from tether.crypto import Keyring
    from tether.runtime import AgentContext, Decision
    from tether.store import open_store

    title = args.title

    class OneTicket:
        """Opens one ticket, then finishes."""

        def decide(self, context: AgentContext, observation: Observation) -> Decision:
            if context.plan_cursor >= 1:
                return Decision(context=context, finished=True)
            return Decision(
                context=AgentContext(plan_cursor=1),
                proposal=Proposal(
                    action_id="open-ticket",
                    kind="http.post",
                    target="tickets",
                    args={"json": {"title": title}},
                    based_on_version=observation.environment.version,
                ),
            )

    keyfile = Path(args.keyfile)
    if args.phase == "first":
        keyfile.write_bytes(Keyring.generate("compare-kill").to_json())
        keyfile.chmod(0o600)
    keyring = Keyring.from_file(keyfile)
    store = open_store(args.store)
    with HttpEffect(args.url, profile=REFERENCE_PROFILE) as http:
        armed = args.phase == "first"
        runtime = ticket_runtime(
            http, store, keyring, "compare-kill", armed=armed, agent=OneTicket()
        )
        if armed:
            runtime.start(args.run_id).step()
            raise SystemExit("the armed tether child was not killed")
        session = runtime.recover(args.run_id)
        session.step()  # settles the pending effect (look-up by key), as a recovery does
    store.close()


def graph_child(args: argparse.Namespace) -> None:
    """A one-node StateGraph whose node opens the ticket; resumed from its saver."""
    import sqlite3

    from langgraph.graph import END, START, StateGraph

    url = args.url
    guarded = args.framework.startswith("tethersaver")

    def send(state: TicketState) -> dict[str, Any]:
        if guarded:
            # tether's way: the effect goes through the run (key and intent first).
            from tether import effects

            effects.call("http.post", "tickets", {"json": {"title": state["title"]}})
        else:
            post_ticket(url, state["title"])
        return {"done": True}

    builder = StateGraph(TicketState)
    builder.add_node("send", send)
    builder.add_edge(START, "send")
    builder.add_edge("send", END)
    config: Any = {"configurable": {"thread_id": args.run_id}}
    closers: list[Any] = []
    block: Any = contextlib.nullcontext()
    if args.framework == "langgraph-sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(args.store, check_same_thread=False)
        saver: Any = SqliteSaver(conn)
        closers.append(conn.close)
    elif args.framework == "langgraph-pg":
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        pg = psycopg.connect(args.store, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        saver = PostgresSaver(pg)  # type: ignore[arg-type]
        closers.append(pg.close)
    else:
        from tether.crypto import Keyring
        from tether.integrations.langgraph import TetherSaver

        keyfile = Path(args.keyfile)
        if args.phase == "first":
            keyfile.write_bytes(Keyring.generate("compare-kill").to_json())
            keyfile.chmod(0o600)
        keyring = Keyring.from_file(keyfile)
        saver = TetherSaver.from_url(args.store, keyring)
        closers.append(saver.close)
        block = guarded_run(args, keyring, closers)
    if args.phase == "first" and hasattr(saver, "setup"):
        saver.setup()
    graph = builder.compile(checkpointer=saver)
    with block:
        graph.invoke(
            {"title": args.title, "done": False} if args.phase == "first" else None,
            config,
            durability="sync",
        )
    for close in closers:
        close()


def guarded_run(args: argparse.Namespace, keyring: Any, closers: list[Any]) -> Any:
    """The tether run the TetherSaver graph's effect goes through (killed at EFFECT_SENT when armed)."""
    from tether import effects
    from tether.adapters import REFERENCE_PROFILE, HttpEffect
    from tether.store import open_store

    http = HttpEffect(args.url, profile=REFERENCE_PROFILE)
    store = open_store(args.store)
    closers += [http.close, store.close]
    armed = os.environ.get("COMPARE_ARMED") == "1"
    return effects.run(
        ticket_runtime(http, store, keyring, "compare-kill", armed=armed), args.run_id
    )


def dbos_child(args: argparse.Namespace) -> None:
    """A DBOS workflow whose first step opens the ticket; recovered by ``DBOS.launch``."""
    from dbos import DBOS, SetWorkflowID

    url = args.url
    config: Any = {"name": "compare-kill", "system_database_url": args.store, "log_level": "ERROR"}
    if args.schema:
        config["dbos_system_schema"] = args.schema

    @DBOS.step()
    def send(title: str) -> bool:
        post_ticket(url, title)
        return True

    @DBOS.step()
    def after(title: str) -> str:
        return title

    @DBOS.workflow()
    def open_ticket(title: str) -> str:
        send(title)
        return after(title)

    DBOS(config=config)
    DBOS.launch()
    if args.phase == "first":
        with SetWorkflowID(args.run_id):
            open_ticket(args.title)
    else:
        DBOS.retrieve_workflow(args.run_id).get_result()  # launch recovered it; wait for it
    DBOS.destroy()


def child(args: argparse.Namespace) -> None:
    if args.framework.startswith("tether-"):
        tether_child(args)
    elif args.framework.startswith("dbos-"):
        dbos_child(args)
    else:
        graph_child(args)


# -- the parent's side of a trial ----------------------------------------------------------


def store_for(framework: str, base: Path, dsn: str, schema: str) -> str:
    """Where the trial's framework keeps its state: a fresh file or a fresh schema."""
    sep = "&" if "?" in dsn else "?"
    pg = f"{dsn}{sep}options=-csearch_path%3D{schema}"
    if framework == "langgraph-sqlite":
        return str(base / "lg.sqlite")
    if framework == "langgraph-pg":
        return pg
    if framework == "dbos-sqlite":
        return f"sqlite:///{base / 'dbos.sqlite'}"
    if framework == "dbos-pg":
        return dsn
    if framework.endswith("-sqlite"):
        return f"sqlite:///{base / 'tether.sqlite'}"
    return pg


def trial(framework: str, index: int, base: Path, dsn: str, url: str) -> dict[str, Any]:
    """One trial: armed child killed after the effect, then one recovering child."""
    import psycopg

    where = base / f"{framework}-{index}"
    where.mkdir()
    schema = f"kill_{uuid.uuid4().hex[:10]}"
    uses_pg = framework.endswith("-pg")
    if uses_pg and not framework.startswith("dbos-"):
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
    title = f"{framework}-{index}-{uuid.uuid4().hex[:6]}"
    common = [
        sys.executable,
        str(HERE),
        "child",
        framework,
        "--url",
        url,
        "--title",
        title,
        "--run-id",
        f"run-{index}-{uuid.uuid4().hex[:6]}",
        "--store",
        store_for(framework, where, dsn, schema),
        "--keyfile",
        str(where / "keyring.json"),
        "--schema",
        schema if framework == "dbos-pg" else "",
    ]
    env = {**os.environ, "COMPARE_ARMED": "1"}
    try:
        first = subprocess.run(
            [*common, "--phase", "first"],
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        rest = {k: v for k, v in os.environ.items() if k != "COMPARE_ARMED"}
        second = subprocess.run(
            [*common, "--phase", "resume"],
            env=rest,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        if uses_pg:
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    count = seen(url).get(title, 0)
    killed = first.returncode == -signal.SIGKILL
    error = ""
    if not killed:
        error = f"first child not killed (exit {first.returncode}): {first.stderr[-300:]}"
    elif second.returncode != 0:
        error = f"resume failed (exit {second.returncode}): {second.stderr[-300:]}"
    elif count == 0:
        error = "the service never saw the effect: the trial measured nothing"
    return {"framework": framework, "seen": count, "error": error}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--db", type=Path, required=True)
    c = sub.add_parser("child")
    c.add_argument("framework", choices=FRAMEWORKS)
    c.add_argument("--phase", choices=["first", "resume"], required=True)
    for name in ("--url", "--title", "--run-id", "--store", "--keyfile", "--schema"):
        c.add_argument(name, default="")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.db)
    else:
        child(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
