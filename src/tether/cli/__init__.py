"""The ``tether`` command: a thin layer over the public API.

Library errors become CLI errors in one place (:func:`main`). Exit codes:
0 success; 1 a tether error; 2 bad usage; 3 (``verify``) an integrity
failure: the checkpoint is not sound.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tether import _demo
from tether.core import GENESIS_HASH, IntegrityError, TetherError, chain_hash, validate_state
from tether.crypto import Keyring
from tether.runtime import Checkpointer, CrashPlan, CrashPoint
from tether.store import SQLiteStore

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTEGRITY = 3


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tether`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code: int = args.func(args)
        return code
    except IntegrityError as exc:
        _error(f"integrity: {type(exc).__name__}: {exc}")
        return EXIT_INTEGRITY if args.command == "verify" else EXIT_ERROR
    except TetherError as exc:
        _error(f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tether",
        description="Recoverable agent runs that never repeat a real-world side effect.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="repair a file in a real workspace, optionally crashing and recovering",
        description="Run a scripted agent that repairs calc.py in a temporary workspace, "
        "verifies it with a test command and finishes. With --crash-at it kills itself "
        "(SIGKILL) at that point and recovers the run in a new process.",
    )
    demo.add_argument(
        "--crash-at",
        metavar="POINT",
        choices=[p.value for p in CrashPoint],
        help="SIGKILL the run at this crash point, then recover it",
    )
    demo.add_argument(
        "--crash-hit",
        metavar="N",
        type=int,
        default=1,
        help="fire at the N-th time the point is reached (default 1)",
    )
    demo.add_argument(
        "--list-crash-points",
        action="store_true",
        help="print the crash point names, one a line, and exit",
    )
    demo.add_argument("--db", type=Path, help="SQLite store file (default: in a new temp dir)")
    demo.add_argument(
        "--marks", type=Path, help="keep the high-water mark in this separate SQLite file"
    )
    demo.add_argument("--workspace", type=Path, help="workspace directory (default: temp dir)")
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.set_defaults(func=cmd_demo)

    child = sub.add_parser("_demo-child", help=argparse.SUPPRESS)
    child.add_argument("stage", choices=["start", "recover"])
    child.add_argument("--db", type=Path, required=True)
    child.add_argument("--marks", type=Path)
    child.add_argument("--workspace", type=Path, required=True)
    child.add_argument("--crash-at", choices=[p.value for p in CrashPoint])
    child.add_argument("--crash-hit", type=int, default=1)
    child.set_defaults(func=cmd_demo_child)

    for name, helptext, func in (
        ("inspect", "show a run's state, pending write, ledger and trace", cmd_inspect),
        (
            "verify",
            "check a run's newest checkpoint against the key and the mark (exit 3 if unsound)",
            cmd_verify,
        ),
    ):
        p = sub.add_parser(name, help=helptext, description=helptext)
        p.add_argument("run_id", metavar="RUN")
        p.add_argument("--db", type=Path, required=True, help="SQLite store file")
        p.add_argument("--marks", type=Path, help="separate SQLite file holding the mark")
        p.add_argument(
            "--keyring",
            type=Path,
            help="keyring file (default: $TETHER_KEYRING_FILE or $TETHER_KEYRING)",
        )
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.set_defaults(func=func)
    return parser


# -- demo ----------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    if args.list_crash_points:
        for point in CrashPoint:
            print(point.value)
        return 0
    base = Path(tempfile.mkdtemp(prefix="tether-demo-"))
    marks = args.marks
    if args.crash_at == CrashPoint.CONTENT_BEFORE_MARK and marks is None:
        # That window exists only when the mark lives in its own database.
        db = args.db if args.db is not None else base / "tether.sqlite"
        marks = db.with_name(db.stem + ".marks.sqlite")
    paths = _demo.DemoPaths.under(base, args.db, args.workspace, marks)
    if paths.db.exists():
        raise TetherError(f"{paths.db} already exists; give the demo a fresh --db")
    _demo.prepare(paths)
    crashed: dict[str, Any] | None = None
    if args.crash_at is None:
        with _demo.workspace(paths) as ws:
            _demo.runtime(paths, ws).start(_demo.RUN_ID).run()
    else:
        first = _child(paths, "start", args.crash_at, args.crash_hit)
        if first.returncode != -signal.SIGKILL:
            raise TetherError(
                f"the run did not reach crash point {args.crash_at} (hit {args.crash_hit}); "
                f"exit {first.returncode}: {first.stderr.strip()[-400:]}"
            )
        second = _child(paths, "recover", None, 1)
        if second.returncode != 0:
            raise TetherError(
                f"recovery failed (exit {second.returncode}): {second.stderr.strip()}"
            )
        crashed = {"point": args.crash_at, "hit": args.crash_hit, "signal": "SIGKILL"}
    summary = _summary(paths, crashed)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _print_demo(summary)
    return 0


def _child(
    paths: _demo.DemoPaths, stage: str, crash_at: str | None, hit: int
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "tether.cli",
        "_demo-child",
        stage,
        "--db",
        str(paths.db),
        "--workspace",
        str(paths.workspace),
    ]
    if paths.marks is not None:
        cmd += ["--marks", str(paths.marks)]
    if crash_at is not None:
        cmd += ["--crash-at", crash_at, "--crash-hit", str(hit)]
    return subprocess.run(
        cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )


def cmd_demo_child(args: argparse.Namespace) -> int:
    paths = _demo.DemoPaths.under(args.db.parent, args.db, args.workspace, args.marks)
    crash = CrashPlan()
    if args.crash_at is not None:
        crash = CrashPlan(CrashPoint(args.crash_at), nth=args.crash_hit, mode="kill")
    with _demo.workspace(paths) as ws:
        rt = _demo.runtime(paths, ws, crash)
        if args.stage == "start":
            session = rt.start(_demo.RUN_ID)
        else:
            session = rt.start_or_recover(_demo.RUN_ID)
        session.run()
    return 0


def _summary(paths: _demo.DemoPaths, crashed: dict[str, Any] | None) -> dict[str, Any]:
    with _demo.workspace(paths) as ws:
        writes = ws.write_count()
        content = (ws.root / "calc.py").read_text()
    store = SQLiteStore(paths.db)
    marks = SQLiteStore(paths.marks) if paths.marks is not None else None
    try:
        restored = Checkpointer(store, _demo.keyring(paths), marks=marks).load(_demo.RUN_ID)
        state = restored.state
        return {
            "run_id": state.run_id,
            "phase": state.phase.value,
            "stop_reason": state.stop_reason,
            "generation": state.generation,
            "epoch": state.epoch,
            "workspace_writes": writes,
            "writes_committed": state.writes_committed,
            "trace_events": state.trace_length,
            "repaired": content == _demo.FIXED,
            "crash": crashed,
            "db": str(paths.db),
            "marks": None if paths.marks is None else str(paths.marks),
            "workspace": str(paths.workspace),
            "keyring": None if os.environ.get("TETHER_KEYRING_FILE") else str(paths.keyring),
        }
    finally:
        store.close()
        if marks is not None:
            marks.close()


def _print_demo(s: dict[str, Any]) -> None:
    print(f"tether demo: run {s['run_id']} is {s['phase']} ({s['stop_reason']})")
    if s["crash"]:
        print(
            f"  crash      SIGKILL at {s['crash']['point']}, recovered in a new process "
            f"(epoch {s['epoch']})"
        )
    print(
        f"  workspace  {s['workspace']}: calc.py {'repaired' if s['repaired'] else 'NOT repaired'}"
    )
    print(
        f"  writes     {s['workspace_writes']} received by the workspace (counted by it), "
        f"{s['writes_committed']} committed by the run"
    )
    print(f"  checkpoint generation {s['generation']}, {s['trace_events']} trace events")
    keyring = f" --keyring {s['keyring']}" if s["keyring"] else ""
    marks = f" --marks {s['marks']}" if s["marks"] else ""
    print(f"  next       tether inspect {s['run_id']} --db {s['db']}{marks}{keyring}")


# -- inspect and verify -----------------------------------------------------------


def _open(args: argparse.Namespace) -> tuple[SQLiteStore, SQLiteStore | None, Checkpointer]:
    keyring = Keyring.from_file(args.keyring) if args.keyring else Keyring.from_environ()
    store = SQLiteStore(args.db)
    marks = SQLiteStore(args.marks) if args.marks else None
    return store, marks, Checkpointer(store, keyring, marks=marks)


def cmd_inspect(args: argparse.Namespace) -> int:
    store, _, checkpointer = _open(args)
    restored = checkpointer.load(args.run_id)
    state = restored.state
    ledger = [
        {
            "key": e.idempotency_key,
            "seq": e.seq,
            "status": e.status.value,
            "action_id": e.action_id,
            "intent_digest": e.intent_digest,
            "receipt_id": None if e.receipt is None else e.receipt.get("receipt_id"),
        }
        for e in store.ledger(state.run_id)
    ]
    trace = [
        {"seq": e.seq, "kind": e.kind, "at": e.body()["at"]}
        for e in store.trace(state.run_id, state.trace_head)
    ]
    report = {
        "mark": {
            "generation": restored.mark.generation,
            "checkpoint_digest": restored.mark.checkpoint_digest,
        },
        "state": state.to_json(),
        "ledger": ledger,
        "trace": trace,
    }
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    print(
        f"run {state.run_id}: {state.phase}"
        + (f" ({state.stop_reason})" if state.stop_reason else "")
    )
    print(
        f"  task {state.binding.task_id} v{state.binding.task_version}, "
        f"policy {state.binding.policy_id} v{state.binding.policy_version}"
    )
    print(
        f"  generation {state.generation} (mark {restored.mark.generation}), epoch {state.epoch}, "
        f"worker {state.worker}"
    )
    env = state.environment
    print(f"  environment {env.namespace}/{env.instance_id} v{env.version} {env.state_fingerprint}")
    print(
        f"  spent proposals={state.spent.proposals} steps={state.spent.steps} "
        f"cost={state.spent.cost}; writes committed {state.writes_committed}"
    )
    if state.pending is not None:
        p = state.pending
        print(
            f"  pending {p.action_id}: {p.intent.kind} {p.intent.target} key={p.idempotency_key} "
            f"intent={p.intent_digest}"
        )
    for case in state.review_cases:
        print(f"  review case {case.case_id}: {case.reason}: {case.detail}")
    print(f"  ledger ({len(ledger)} entries)")
    for row in ledger:
        print(f"    {row['key']} #{row['seq']} {row['status']} {row['action_id']}")
    print(f"  trace ({len(trace)} events)")
    for row in trace:
        print(f"    {row['seq']:>4} {row['at']} {row['kind']}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    store, _, checkpointer = _open(args)
    restored = checkpointer.load(args.run_id)
    checkpointer.check_generation(restored)
    state = restored.state
    validate_state(state)
    events = store.trace(state.run_id, state.trace_head)
    head = GENESIS_HASH
    for index, event in enumerate(events, start=1):
        if (
            event.seq != index
            or event.prev_hash != head
            or chain_hash(head, event.body()) != event.hash
        ):
            raise IntegrityError(f"trace breaks at event {index}", run_id=state.run_id)
        head = event.hash
    if head != state.trace_head or len(events) != state.trace_length:
        raise IntegrityError("the trace does not end at the checkpoint's head", run_id=state.run_id)
    result = {
        "run_id": state.run_id,
        "sound": True,
        "generation": state.generation,
        "key_id": json.loads(restored.envelope)["key_id"],
        "trace_events": len(events),
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(
            f"run {state.run_id}: sound at generation {state.generation} "
            f"(signed by key id {result['key_id']}, {len(events)} trace events chained)"
        )
    return 0


def _error(message: str) -> None:
    print(f"tether: error: {message}", file=sys.stderr)
