"""`tether demo --scenario support-desk`: three real systems, a kill, a recovery, a reviewer.

The story is told from two sides that never borrow from each other: the
run's signed trace and ledger (what the run knows and did), and the counts
each real system keeps (what the world received). The demo plays the
reviewer when the run freezes: it looks in the mail server's Maildir, as a
person would look at the mail server, and signs what it found (``landed``
with the Message-ID, or ``not_landed``) with the demo's reviewer key.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shlex
import signal
from datetime import UTC, datetime, timedelta
from typing import Any

from tether import _demo, _desk
from tether.cli import _sign
from tether.cli._demo_child import child, unfired
from tether.cli._render import tether_command
from tether.core import (
    LedgerEntry,
    Phase,
    ReviewCase,
    RunState,
    TetherError,
    TraceEvent,
    new_decision,
)
from tether.crypto import Signer
from tether.runtime import Checkpointer, CrashPlan
from tether.store import SQLiteStore

SCENARIO = "support-desk"
#: What each crash window means, in the words the story uses ({effect}: the one in flight).
WINDOWS = {
    "before_proposal": "before the agent's next proposal",
    "intent_persisted": "{effect}'s intent and key were saved; it was not sent",
    "effect_sent": "{effect} was sent; its receipt was not saved",
    "receipt_deferred": "{effect} was sent; its receipt waits for the run's next commit",
    "receipt_persisted": "inside the commit that carries {effect}'s receipt, which never landed",
    "checkpoint_write": "inside a checkpoint write, which never landed",
    "content_before_mark": "a checkpoint's content landed; the high-water mark did not move",
}
SHORT = {"write-reply": "reply.txt", "open-ticket": "the ticket", "email-customer": "the email"}
SYSTEM = {
    "write-reply": "the workspace",
    "open-ticket": "the ticket service",
    "email-customer": "the mail server",
}
DONE = {
    "write-reply": "wrote reply.txt",
    "open-ticket": "opened the ticket (POST /tickets)",
    "email-customer": "emailed the customer (SMTP)",
}


def cmd_desk(args: argparse.Namespace, paths: _demo.DemoPaths) -> int:
    """Run the support desk, kill it where asked, recover it, resolve a review, report.

    The caller has checked the extras and that ``paths`` are fresh.
    """
    _desk.prepare(paths)
    story: list[str] = []
    with _desk.running_services(paths, mail_lookup=args.mail_lookup) as services:
        lookup = "searchable by the run" if services.mail_lookup else "not searchable by the run"
        story.append(
            f"services: ticket service {services.ticket_url} (database {services.ticket_db}); "
            f"mail server {services.smtp_host}:{services.smtp_port} delivering into "
            f"{services.maildir} ({lookup})"
        )
        crashed = _run(paths, args.crash_at, args.crash_hit)
        review = _resolve_review(paths, services)
        received = _desk.received(paths, services)
        summary = _summary(paths, services, crashed, review, received)
    summary["story"] = [*story, *_narrate(summary)]
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _print(summary)
    return 0


def run_stage(
    paths: _demo.DemoPaths, stage: str, crash: CrashPlan, *, lease_ttl_s: float | None
) -> int:
    """The body of ``tether _demo-child STAGE --scenario support-desk``."""
    services = _desk.DeskServices.load(paths)
    rt = _desk.runtime(paths, _desk.adapters(paths, services), crash, lease_ttl_s=lease_ttl_s)
    session = rt.start(_demo.RUN_ID) if stage == "start" else rt.start_or_recover(_demo.RUN_ID)
    session.run()
    return 0


def _run(paths: _demo.DemoPaths, crash_at: str | None, hit: int) -> dict[str, Any] | None:
    """Process 1 runs (and dies where armed); process 2 recovers. The crash, if any."""
    first = child(paths, "start", crash_at, hit, SCENARIO)
    if crash_at is None:
        if first.returncode != 0:
            raise TetherError(f"the run failed (exit {first.returncode}): {_tail(first.stderr)}")
        return None
    if first.returncode != -signal.SIGKILL:
        raise unfired(first, crash_at, hit)
    second = child(paths, "recover", None, 1, SCENARIO)
    if second.returncode != 0:
        raise TetherError(f"recovery failed (exit {second.returncode}): {_tail(second.stderr)}")
    return {"point": crash_at, "hit": hit, "signal": "SIGKILL"}


def _resolve_review(paths: _demo.DemoPaths, services: _desk.DeskServices) -> dict[str, Any] | None:
    """If the run froze, look where a person would look, sign a decision, and go on."""
    state, _, _ = _read(paths)
    if state.phase is not Phase.NEEDS_REVIEW or not state.review_cases:
        return None
    case = state.review_cases[0]
    if case.action_id != "email-customer":
        # Only the email's fate can be read off a system the demo owns; any other
        # case is a person's call, and the demo does not guess it.
        raise TetherError(
            f"the run froze on case {case.case_id} ({case.reason}, {case.action_id}), which the "
            f"demo cannot judge; read it with `tether inspect {_demo.RUN_ID} --store {paths.db}` "
            f"and decide it with `tether review`"
        )
    wanted = _desk.message_for(case.idempotency_key)
    found = wanted in _desk.delivered(services.maildir)
    # The email left before the kill; if the mailbox holds it the customer has it:
    # signed landed, with the Message-ID found, it is recorded as delivered and never
    # sent again. If the mailbox has nothing, it never arrived: signed not_landed, it
    # is sent once more under the same key (so with the same Message-ID).
    decision = "landed" if found else "not_landed"
    evidence = wanted if found else f"searched the Maildir for {wanted}: not there"
    signer = Signer.from_file(paths.signer_key("reviewer"))
    now = datetime.now(UTC)
    body = new_decision(
        state,
        case,
        signer.signer_id,
        decision,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
        evidence=evidence,
    )
    _sign.deliver_document(paths.db, _demo.RUN_ID, "review_decision", signer.sign(body))
    third = child(paths, "recover", None, 1, SCENARIO)
    if third.returncode != 0:
        raise TetherError(
            f"the run did not take the signed {decision} (exit {third.returncode}): "
            f"{_tail(third.stderr)}"
        )
    return {
        "case": _case(case),
        "searched_for": wanted,
        "found_in_mailbox": found,
        "decision": decision,
        "reviewer": signer.signer_id,
        "same_command": f"{tether_command()} review {_demo.RUN_ID} {case.case_id} --decision {decision} "
        f"--evidence {shlex.quote(evidence)} --key {paths.signer_key('reviewer')} --store {paths.db}",
    }


def _case(case: ReviewCase) -> dict[str, Any]:
    return {
        "case_id": case.case_id,
        "reason": case.reason,
        "action_id": case.action_id,
        "idempotency_key": case.idempotency_key,
        "intent_digest": case.intent_digest,
        "detail": case.detail,
    }


def _read(paths: _demo.DemoPaths) -> tuple[RunState, list[LedgerEntry], list[TraceEvent]]:
    """The run as its newest verified checkpoint, ledger and trace tell it."""
    store = SQLiteStore(paths.db)
    marks = SQLiteStore(paths.marks) if paths.marks is not None else None
    try:
        checkpointer = Checkpointer(store, _demo.keyring(paths), marks=marks)
        state = checkpointer.load(_demo.RUN_ID).state
        ledger = checkpointer.verified_ledger(state)
        return state, ledger, store.trace(_demo.RUN_ID, state.trace_head)
    finally:
        store.close()
        if marks is not None:
            marks.close()


def _summary(
    paths: _demo.DemoPaths,
    services: _desk.DeskServices,
    crashed: dict[str, Any] | None,
    review: dict[str, Any] | None,
    received: _desk.Received,
) -> dict[str, Any]:
    state, ledger, trace = _read(paths)
    effects = _desk.effect_outcomes(ledger)
    for action_id, outcome in effects.items():
        outcome["system"] = SYSTEM.get(action_id, "?")
        outcome["quarantined"] = outcome["key"] in state.quarantined_keys
    return {
        "scenario": SCENARIO,
        "run_id": state.run_id,
        "phase": state.phase.value,
        "stop_reason": state.stop_reason,
        "generation": state.generation,
        "epoch": state.epoch,
        "trace_events": state.trace_length,
        "crash": crashed,
        "processes": _processes(trace),
        "review": review,
        "effects": effects,
        "received": received.to_json(),
        "one_each": received == _desk.Received(1, 1, 1),
        # The repair scenario's field, so scripts that read it read the same thing.
        "workspace_writes": received.file_writes,
        "services": services.to_json(),
        "db": str(paths.db),
        "marks": None if paths.marks is None else str(paths.marks),
        "workspace": str(paths.workspace),
        "keyring": str(paths.keyring),
    }


def _processes(trace: list[TraceEvent]) -> list[dict[str, Any]]:
    """The trace cut at each recovery: what every process that ran the run left on record."""
    processes: list[dict[str, Any]] = []
    for event in trace:
        if event.kind in {"run_started", "recovered"} or not processes:
            processes.append(
                {"process": len(processes) + 1, "did": [], "events": [], "in_flight": None}
            )
        proc = processes[-1]
        proc["events"].append(event.kind)
        action = event.data.get("action_id")
        if event.kind == "intent_persisted":
            proc["in_flight"] = action
        elif (
            event.kind in {"effect_committed", "effect_reconciled"} and action == proc["in_flight"]
        ):
            proc["in_flight"] = None
        phrase = _phrase(event)
        if phrase:
            proc["did"].append(phrase)
    return processes


def _phrase(event: TraceEvent) -> str:
    """One trace event in plain words; empty for the bookkeeping a reader need not see."""
    data = event.data
    action = str(data.get("action_id", ""))
    if event.kind == "run_started":
        return "started the run"
    if event.kind == "recovered":
        return (
            f"restored generation {data.get('from_generation')} from the high-water mark "
            f"(epoch {data.get('previous_epoch', 0) + 1})"
        )
    if event.kind == "effect_committed":
        return DONE.get(action, f"committed {action}")
    if event.kind == "effect_reconciled":
        return (
            f"asked {SYSTEM.get(action, action)} by key: {SHORT.get(action, action)} had "
            "landed, reused its receipt (nothing sent again)"
        )
    if event.kind == "needs_review":
        return (
            f"{SHORT.get(action, 'an effect')} may have landed; {SYSTEM.get(action, 'its owner')} "
            f"can neither be asked nor deduplicate a resend: froze in needs_review "
            f"({data.get('reason')})"
        )
    if event.kind == "review_sealed":
        signed = data.get("decision", {}).get("body", {})
        return (
            f"verified and applied the signed {signed.get('decision', '?')} of "
            f"{signed.get('reviewer_id', '?')}"
        )
    if event.kind == "key_quarantined":
        return f"quarantined key {data.get('idempotency_key')} for good"
    if event.kind == "verifier_ran":
        return f"verifier exit {data.get('exit_code')}"
    if event.kind in {"completed", "failed"}:
        return event.kind if event.kind == "completed" else f"failed ({data.get('reason')})"
    return ""


def _narrate(s: dict[str, Any]) -> list[str]:
    """The processes, the kill and the review, one line each, in the order they happened."""
    lines: list[str] = []
    for proc in s["processes"]:
        did = "; ".join(proc["did"]) or "left nothing on record"
        line = f"process {proc['process']}: {did}"
        if proc["process"] == 1 and s["crash"]:
            crash = s["crash"]
            effect = SHORT.get(proc["in_flight"], "an effect")
            window = WINDOWS[crash["point"]].format(effect=effect)
            line += f"; killed (SIGKILL) at {crash['point']} hit {crash['hit']}: {window}"
        lines.append(line)
        review = s["review"]
        if review is not None and "needs_review" in proc["events"]:
            lines.append(_review_line(review))
    return lines


def _review_line(review: dict[str, Any]) -> str:
    seen = "found it" if review["found_in_mailbox"] else "did not find it"
    why = (
        "the customer has it: recorded as delivered, never sent again"
        if review["found_in_mailbox"]
        else "it never arrived: sent once more under the same key"
    )
    return (
        f"reviewer: case {review['case']['case_id']} ({review['case']['reason']}, "
        f"{review['case']['action_id']}); searched the mail server's Maildir for "
        f"{review['searched_for']} and {seen}; signed {review['decision']} as "
        f"{review['reviewer']} ({why})"
    )


def _print(s: dict[str, Any]) -> None:
    print(
        f"tether demo --scenario support-desk: run {s['run_id']} is {s['phase']} ({s['stop_reason']})"
    )
    for line in s["story"]:
        print(f"  {line}")
    for action_id, outcome in s["effects"].items():
        quarantined = ", key quarantined" if outcome["quarantined"] else ""
        print(
            f"  effect     {SHORT.get(action_id, action_id)}: {outcome['status']}{quarantined} "
            f"(ledger {' -> '.join(outcome['statuses'])})"
        )
    r = s["received"]
    verdict = "one each: nothing repeated, nothing lost" if s["one_each"] else "NOT one each"
    print(
        f"  received   counted by each system: workspace {r['file_writes']} file write(s), "
        f"ticket service {r['tickets']} ticket(s), mail server {r['messages']} message(s) "
        f"({verdict})"
    )
    if s["review"] is not None:
        print(
            f"  by hand    the reviewer's step as a person types it: {s['review']['same_command']}"
        )
    marks = f" --marks {s['marks']}" if s["marks"] else ""
    print(
        f"  next       {tether_command()} inspect {s['run_id']} --store {s['db']}{marks} "
        f"--keyring {s['keyring']}"
    )


def _tail(text: str) -> str:
    return text.strip()[-400:]
