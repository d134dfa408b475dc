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
from tether.cli._demo_child import CHILD_COMMAND, child, report_unfired, unfired
from tether.cli._render import tether_command
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
    keyring = f" --keyring {summary['keyring']}" if summary["keyring"] else ""
    print(f"next: {tether_command()} epochs {summary['run_id']} --store {summary['db']}{keyring}")
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
    if args.scenario == "repair" and crashed is not None:
        story = _repair_story(paths, crashed)
    summary["story"] = story
    if args.scenario == "conflict":
        summary["writes_explained"] = (
            "the one write the workspace received is process 1's fix; its key was then "
            "claimed by a different intent, so the run could not count that receipt as its "
            "own; the reviewer's replan quarantined the key, the run read calc.py again, "
            "found it fixed and finished without writing a second time"
        )
    keyring = f" --keyring {summary['keyring']}" if summary["keyring"] else ""
    marks = f" --marks {summary['marks']}" if summary["marks"] else ""
    summary["next"] = (
        f"{tether_command()} inspect {summary['run_id']} --store {summary['db']}{marks}{keyring}"
    )
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


#: The approval demo's first approval: taken by one process, expired before the next.
APPROVAL_DEMO_TTL_S = 4.0


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
    state = _state(paths)
    story.append(
        "process 1 read calc.py and proposed the fix; the policy says a person must approve "
        f"every file write, so the write waits ({state.phase}) and process 1 exits"
    )
    # Long enough for process 2 to take it on a busy machine (a child that starts slowly
    # must not find it expired already), then waited out.
    first = _approve(paths, ttl_s=APPROVAL_DEMO_TTL_S)
    _stage(paths, "take-evidence")
    story.append(
        f"the approver signed an approval that lives {APPROVAL_DEMO_TTL_S:g} seconds "
        f"(until {first['expires_at']}); process 2 took it from the inbox into the "
        "checkpoint and exited before writing"
    )
    expires = datetime.fromisoformat(str(first["expires_at"]).replace("Z", "+00:00"))
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
    _stage(paths, "recover")
    state = _state(paths)
    if state.phase is not Phase.PENDING:
        raise TetherError(f"the approval demo expected the write still pending, got {state.phase}")
    story.append(
        "process 3 restored the checkpoint: the approval is there and readable but expired, "
        "so the write stays frozen (an expired approval is not corruption; nothing is written)"
    )
    second = _approve(paths, ttl_s=900)
    _stage(paths, "recover")
    final = _state(paths)
    story.append(
        f"the approver signed a fresh approval (until {second['expires_at']}); process 4 "
        "sealed the expired one into the trace, wrote calc.py once, ran the verifier and "
        f"{'completed' if final.phase is Phase.COMPLETED else f'ended {final.phase}'}"
    )


def _conflict_story(paths: _demo.DemoPaths, story: list[str]) -> None:
    """Same key, different intent: the run freezes; a signed replan quarantines the key."""
    _stage(paths, "start", crash_at="effect_sent")
    pending = _state(paths).pending
    if pending is None:
        raise TetherError("the conflict demo expected a pending write after the crash")
    story.append(
        "process 1 proposed the fix; the workspace received it and committed it (1 write "
        "received), then the process was killed (SIGKILL) before it saved the receipt"
    )
    with _demo.workspace(paths) as ws:
        ws.tamper_receipt(pending.idempotency_key, intent_digest="sha256:" + "c0ffee" * 10 + "c0ff")
    story.append(
        f"meanwhile the workspace's receipt for key {pending.idempotency_key} was made to "
        "name a different payload, as if another caller had reused the key"
    )
    _stage(paths, "recover")
    state = _state(paths)
    case = state.review_cases[0] if state.review_cases else None
    if state.phase is not Phase.NEEDS_REVIEW or case is None:
        raise TetherError(f"the conflict demo expected needs_review, got {state.phase}")
    story.append(
        "process 2 recovered and asked the workspace by key: same key, different intent. "
        "It cannot tell who is right, so it writes nothing, keeps the pending write and the "
        f"receipt as evidence, and freezes the run for a person ({state.phase}, case "
        f"{case.case_id})"
    )
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
    story.append(
        f"the reviewer {signer.signer_id} signed a replan bound to the case, both intent "
        f"digests and the receipt (what `{tether_command()} review {_demo.RUN_ID} "
        f"{case.case_id} --decision replan --key ...` does)"
    )
    _stage(paths, "recover")
    final = _state(paths)
    story.append(
        "process 3 reread the receipt (unchanged since the decision), quarantined key "
        f"{final.quarantined_keys[0] if final.quarantined_keys else '?'} for good, read "
        "calc.py again, found it already fixed, wrote nothing and "
        f"{'completed' if final.phase is Phase.COMPLETED else f'ended {final.phase}'}"
    )


def _repair_story(paths: _demo.DemoPaths, crashed: dict[str, Any]) -> list[str]:
    """The kill and the recovery of the repair run, from its verified trace."""
    store = SQLiteStore(paths.db)
    marks = SQLiteStore(paths.marks) if paths.marks is not None else None
    try:
        checkpointer = Checkpointer(store, _demo.keyring(paths), marks=marks)
        events = checkpointer.verified_trace(checkpointer.load(_demo.RUN_ID).state)
    finally:
        store.close()
        if marks is not None:
            marks.close()
    cut = next((i for i, e in enumerate(events) if e.kind == "recovered"), len(events))
    point = crashed["point"]
    story = [
        f"process 1 {_did(events[:cut]) or 'started the run'}; then it was killed (SIGKILL) at "
        f"{point}: {_desk_cmd.WINDOWS[point].format(effect='the write of calc.py')}",
        f"process 2 restored the newest checkpoint (the one the high-water mark names) and "
        f"{_did(events[cut:]) or 'carried on'}",
    ]
    return story


#: What a trace event means in the repair story (events not named here are left out).
_SAID = {
    "run_started": "started the run",
    "action_observed": "read calc.py",
    "intent_persisted": "saved the write's intent and idempotency key",
    "effect_dispatched": "sent the write",
    "effect_committed": "wrote calc.py (the workspace's receipt saved)",
    "effect_reconciled": "asked the workspace by key: the write had landed, so it reused the "
    "receipt and wrote nothing again",
    "verifier_ran": "ran the verifier",
    "completed": "completed",
}


def _did(events: list[Any]) -> str:
    said = [_SAID[e.kind] for e in events if e.kind in _SAID]
    return ", ".join(said)


#: The first argument that makes ``tether`` (``python -m tether.cli``) a demo child.


def child_parser() -> argparse.ArgumentParser:
    """The parser of ``tether _demo-child STAGE``: the process a demo may SIGKILL.

    Kept apart from :func:`tether.cli.build_parser` so it never shows in ``--help``.
    """
    from tether.cli._guard import Parser

    child = Parser(prog=f"tether {CHILD_COMMAND}", description="one stage of a demo run")
    child.add_argument("stage", choices=["start", "recover", "take-evidence"])
    child.add_argument("--db", type=Path, required=True)
    child.add_argument("--marks", type=Path)
    child.add_argument("--store", help="store URL instead of the SQLite file (e.g. PostgreSQL)")
    child.add_argument("--lease-ttl", type=float, help="take the run's lease for this long")
    child.add_argument("--workspace", type=Path, required=True)
    child.add_argument("--crash-at", choices=[p.value for p in CrashPoint])
    child.add_argument("--crash-hit", type=int, default=1)
    child.add_argument("--scenario", choices=list(_demo.SCENARIOS), default="repair")
    child.set_defaults(func=cmd_demo_child)
    return child


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
            "writes_explained": None,
        }
    finally:
        store.close()
        if marks is not None:
            marks.close()


def _print_demo(s: dict[str, Any]) -> None:
    print(f"tether demo: run {s['run_id']} is {s['phase']} ({s['stop_reason']})")
    for number, line in enumerate(s["story"], start=1):
        print(f"  {number}. {line}")
    if s["crash"] and not s["story"]:
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
    if s["writes_explained"]:
        print(f"             {s['writes_explained']}")
    print(f"  checkpoint generation {s['generation']}, {s['trace_events']} trace events")
    print(f"  next       {s['next']}")
