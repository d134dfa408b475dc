"""`tether demo`: the scripted repair, optionally killed and recovered in a new process."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from tether import _demo, _desk, _notify
from tether.cli import _desk_cmd, _sign
from tether.cli._demo_child import child, report_unfired, unfired
from tether.core import Phase, RunState, TetherError, new_approval, new_decision
from tether.crypto import Signer
from tether.runtime import Checkpointer, CrashPlan, CrashPoint
from tether.store import SQLiteStore


class _Terminated(SystemExit):
    """Raised in the demo by SIGTERM, SIGHUP or SIGINT, so ``finally`` stops what it started."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


#: The signals the demo has received, in order (the first one decides the exit).
_received: list[int] = []


def _terminate(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    # Raised once: a second signal must not interrupt the clean-up the first began.
    if len(_received) == 1:
        raise _Terminated(signum)


#: Signals that would end the demo without running its ``finally`` blocks, or
#: (SIGINT) raise KeyboardInterrupt wherever it lands.
_TERMINATING = tuple(
    s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None), signal.SIGINT) if s is not None
)


def _stopped_by(signum: int) -> int:
    what = (
        "interrupted (Ctrl-C)"
        if signum == signal.SIGINT
        else f"terminated ({signal.Signals(signum).name})"
    )
    print(f"tether: demo {what}; the processes it started are stopped", file=sys.stderr)
    return 128 + signum


def cmd_demo(args: argparse.Namespace) -> int:
    if args.list_crash_points:
        for point in CrashPoint:
            print(point.value)
        return 0
    if args.mail_lookup and args.scenario != "support-desk":
        raise TetherError("--mail-lookup belongs to --scenario support-desk; drop it or add that")
    if args.scenario in {"support-desk", "notify"}:
        _desk.require_extras()
    # The default SIGTERM ends the process on the spot, leaving the services
    # and the run's process behind; raised as an exception it unwinds instead.
    _received.clear()
    previous = {signum: signal.signal(signum, _terminate) for signum in _TERMINATING}
    try:
        code = _demo_run(args)
    except _Terminated as exc:
        return _stopped_by(exc.signum)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if _received:
        # The exception landed where Python ignores it (a finalizer, say) and
        # the demo ran on: the signal still decides how it ends.
        return _stopped_by(_received[0])
    return code


def _notify_story(args: argparse.Namespace, paths: _demo.DemoPaths) -> int:
    """The second seed's example: notify, fail, rewind to before the send, one email."""
    if args.crash_at is not None:
        raise TetherError("--scenario notify tells its own story; drop --crash-at")
    summary = _notify.run(paths)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    print(f"tether demo (notify): run {summary['run_id']} is {summary['phase']}")
    for line in summary["story"]:
        print(f"  {line}")
    crossed = ", ".join(f"{c['kind']} to {c['target']} ({c['status']})" for c in summary["crossed"])
    print(f"  crossed the rewind boundary and kept in the ledger: {crossed or 'nothing'}")
    for epoch in summary["epochs"]:
        who = epoch["principal"] or "the run's start"
        how = "" if epoch["signed"] is None else (" (signed)" if epoch["signed"] else " (unsigned)")
        print(f"  epoch opened by {epoch['event']}: {who}{how}")
    print(
        f"next: tether epochs {summary['run_id']} --db {summary['db']} --keyring {summary['keyring']}"
    )
    return 0


def _demo_run(args: argparse.Namespace) -> int:
    # The demo keeps its files for `tether inspect`; a temp dir only when asked for none.
    made = args.db is None or args.workspace is None
    base = Path(tempfile.mkdtemp(prefix="tether-demo-")) if made else args.db.parent
    marks = args.marks
    if args.crash_at == CrashPoint.CONTENT_BEFORE_MARK and marks is None:
        # That window exists only when the mark lives in its own database.
        db = args.db if args.db is not None else base / "tether.sqlite"
        marks = db.with_name(db.stem + ".marks.sqlite")
    paths = _demo.DemoPaths.under(base, args.db, args.workspace, marks)
    try:
        _demo.require_fresh(paths)
        if args.scenario in {"support-desk", "notify"}:
            _desk.require_fresh(paths)
    except TetherError:
        if made:
            base.rmdir()  # still empty: nothing is written before these checks pass
        raise
    if args.scenario == "support-desk":
        return _desk_cmd.cmd_desk(args, paths)
    if args.scenario == "notify":
        return _notify_story(args, paths)
    _demo.prepare(paths, args.scenario)
    crashed: dict[str, Any] | None = None
    story: list[str] = []
    if args.scenario == "approval":
        _approval_story(paths, story)
    elif args.scenario == "conflict":
        _conflict_story(paths, story)
        crashed = {"point": "effect_sent", "hit": 1, "signal": "SIGKILL"}
    elif args.crash_at is None:
        with _demo.workspace(paths) as ws:
            _demo.runtime(paths, ws).start(_demo.RUN_ID).run()
    else:
        first = child(paths, "start", args.crash_at, args.crash_hit)
        if first.returncode != -signal.SIGKILL:
            raise unfired(first, args.crash_at, args.crash_hit)
        second = child(paths, "recover", None, 1)
        if second.returncode != 0:
            raise TetherError(
                f"recovery failed (exit {second.returncode}): {second.stderr.strip()}"
            )
        crashed = {"point": args.crash_at, "hit": args.crash_hit, "signal": "SIGKILL"}
    summary = _summary(paths, crashed)
    summary["scenario"] = args.scenario
    summary["story"] = story
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _print_demo(summary)
    return 0


def _stage(paths: _demo.DemoPaths, stage: str, crash_at: str | None = None) -> None:
    result = child(paths, stage, crash_at, 1)
    expected = -signal.SIGKILL if crash_at is not None else 0
    if result.returncode != expected:
        raise TetherError(
            f"demo stage {stage} exited {result.returncode}: {result.stderr.strip()[-400:]}"
        )


def _state(paths: _demo.DemoPaths) -> RunState:
    store = SQLiteStore(paths.db)
    try:
        return Checkpointer(store, _demo.keyring(paths)).load(_demo.RUN_ID).state
    finally:
        store.close()


def _approve(paths: _demo.DemoPaths, ttl_s: float) -> dict[str, Any]:
    signer = Signer.from_file(paths.signer_key("approver"))
    now = datetime.now(UTC)
    body = new_approval(
        _state(paths),
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
        nonce=secrets.token_hex(16),
    )
    _sign.deliver_document(paths.db, _demo.RUN_ID, "approval", signer.sign(body))
    return body


def _approval_story(paths: _demo.DemoPaths, story: list[str]) -> None:
    """An approval expires while the run is down; a person refreshes it; the write runs once."""
    _stage(paths, "start")
    story.append(f"process 1: proposed the fix; phase {_state(paths).phase}, waiting for approval")
    first = _approve(paths, ttl_s=1.0)
    _stage(paths, "take-evidence")
    story.append(
        f"approver signed (expires {first['expires_at']}); process 2 recorded it and exited"
    )
    time.sleep(1.2)
    _stage(paths, "recover")
    state = _state(paths)
    waiting = state.phase is Phase.PENDING
    story.append(
        f"process 3: restored the checkpoint with its expired approval readable; phase "
        f"{state.phase}: the write stays frozen"
        if waiting
        else f"unexpected phase {state.phase}"
    )
    second = _approve(paths, ttl_s=900)
    _stage(paths, "recover")
    story.append(
        f"approver signed a fresh approval (expires {second['expires_at']}); "
        f"process 4 sealed the old one into the trace, wrote once, verified, completed"
    )


def _conflict_story(paths: _demo.DemoPaths, story: list[str]) -> None:
    """Same key, different intent: the run freezes; a signed replan quarantines the key."""
    _stage(paths, "start", crash_at="effect_sent")
    pending = _state(paths).pending
    if pending is None:
        raise TetherError("the conflict demo expected a pending write after the crash")
    story.append("process 1: the workspace committed the fix, then SIGKILL before the receipt")
    with _demo.workspace(paths) as ws:
        ws.tamper_receipt(pending.idempotency_key, intent_digest="sha256:" + "c0ffee" * 10 + "c0ff")
    story.append("another caller reused the idempotency key for a different payload")
    _stage(paths, "recover")
    state = _state(paths)
    case = state.review_cases[0] if state.review_cases else None
    if state.phase is not Phase.NEEDS_REVIEW or case is None:
        raise TetherError(f"the conflict demo expected needs_review, got {state.phase}")
    story.append(f"process 2: same key, different intent: {state.phase}, case {case.case_id}")
    signer = Signer.from_file(paths.signer_key("reviewer"))
    now = datetime.now(UTC)
    body = new_decision(
        state,
        case,
        signer.signer_id,
        "replan",
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    _sign.deliver_document(paths.db, _demo.RUN_ID, "review_decision", signer.sign(body))
    _stage(paths, "recover")
    final = _state(paths)
    story.append(
        f"reviewer signed replan; process 3 reread the receipt, quarantined "
        f"{final.quarantined_keys[0] if final.quarantined_keys else '?'}, observed anew and "
        f"finished: {final.phase}"
    )


def cmd_demo_child(args: argparse.Namespace) -> int:
    paths = _demo.DemoPaths.under(args.db.parent, args.db, args.workspace, args.marks)
    paths = replace(paths, store_url=args.store)
    crash = CrashPlan()
    if args.crash_at is not None:
        crash = CrashPlan(CrashPoint(args.crash_at), nth=args.crash_hit, mode="kill")
    if args.scenario == "support-desk":
        code = _desk_cmd.run_stage(paths, args.stage, crash, lease_ttl_s=args.lease_ttl)
    else:
        code = _repair_stage(paths, args.stage, crash, lease_ttl_s=args.lease_ttl)
    # Still alive: the armed hit never came. The demo names the hits there were.
    report_unfired(crash)
    return code


def _repair_stage(
    paths: _demo.DemoPaths, stage: str, crash: CrashPlan, *, lease_ttl_s: float | None
) -> int:
    with _demo.workspace(paths) as ws:
        rt = _demo.runtime(paths, ws, crash, lease_ttl_s=lease_ttl_s)
        if stage == "start":
            session = rt.start(_demo.RUN_ID)
        elif stage == "take-evidence":
            rt.recover(_demo.RUN_ID).consume_inbox()
            return 0
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
