"""`tether inspect` and `tether verify`: read a run back and check it is sound."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tether.cli import _progress, _render
from tether.cli._options import add_store, open_read
from tether.core import MissingHighWaterMarkError, RunNotFoundError, format_time
from tether.core._payload import validate_state
from tether.crypto import Keyring
from tether.runtime import Checkpointer, Page, RunView, open_run
from tether.store import SQLBase, SQLiteStore


def add_reader(sub: Any, name: str, helptext: str, func: Any) -> argparse.ArgumentParser:
    """A command that reads one run back, verified under the keyring (inspect, epochs, ...)."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=helptext, description=helptext)
    p.add_argument("run_id", metavar="RUN")
    add_store(p)
    p.add_argument("--marks", type=Path, help="separate SQLite file holding the mark")
    p.add_argument(
        "--keyring",
        type=Path,
        help="keyring file (default: $TETHER_KEYRING_FILE or $TETHER_KEYRING)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=func)
    return p


def add_paging(parser: argparse.ArgumentParser, *, trace: bool) -> None:
    """``--limit``, ``--before`` and ``--all``: which page of the history to show, newest first."""
    parser.add_argument(
        "--limit",
        type=_whole,
        default=Page().limit,
        metavar="N",
        help=f"show the newest N entries (default {Page().limit}); the output names the "
        "--before that shows the next older page",
    )
    if trace:
        parser.add_argument(
            "--before", type=_whole, metavar="SEQ", help="trace events below SEQ only"
        )
        parser.add_argument(
            "--ledger-before", type=_whole, metavar="SEQ", help="ledger entries below SEQ only"
        )
    else:
        parser.add_argument(
            "--before", type=_whole, metavar="SEQ", help="ledger entries below SEQ only"
        )
    parser.add_argument(
        "--all", action="store_true", help="the whole history, every hash checked from the head"
    )


def page_of(args: argparse.Namespace) -> Page:
    """The page the paging flags ask for (no flags: the newest page)."""
    if getattr(args, "all", False):
        return Page(limit=None)
    limit = getattr(args, "limit", Page().limit)
    if hasattr(args, "ledger_before"):  # inspect: --before is the trace's
        return Page(limit, trace_before=args.before, ledger_before=args.ledger_before)
    return Page(limit, ledger_before=getattr(args, "before", None))


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _open(args: argparse.Namespace) -> Checkpointer:
    keyring = Keyring.from_file(args.keyring) if args.keyring else Keyring.from_environ()
    marks = SQLiteStore(args.marks, read_only=True) if args.marks else None
    return Checkpointer(_store(args), keyring, marks=marks)


def open_view(args: argparse.Namespace) -> RunView:
    """The run verified under the keyring: the checkpoint, the trace chain and the ledger chain."""
    keyring = Keyring.from_file(args.keyring) if args.keyring else Keyring.from_environ()
    marks = SQLiteStore(args.marks, read_only=True) if args.marks else None
    store = _store(args)
    try:
        return open_run(store, args.run_id, keyring=keyring, marks=marks, page=page_of(args))
    finally:
        store.close()
        if marks is not None:
            marks.close()


def cmd_inspect(args: argparse.Namespace) -> int:
    view = open_view(args)
    state = view.state
    entries = list(reversed(view.ledger))  # newest first
    ledger = [
        {
            "key": e.idempotency_key,
            "seq": e.seq,
            "status": e.status.value,
            "action_id": e.action_id,
            "intent_digest": e.intent_digest,
            "receipt_id": None if e.receipt is None else e.receipt.get("receipt_id"),
            "epoch": e.epoch,
            "terms": None if e.terms is None else e.terms.to_json(),
            "payload": e.payload,
        }
        for e in entries
    ]
    trace = [
        {"seq": e.seq, "kind": e.kind, "at": e.body()["at"], "data": e.data}
        for e in reversed(view.trace)
    ]
    inbox = [
        {
            "seq": item.seq,
            "kind": item.kind,
            "signer": item.signer,
            "received_at": format_time(item.received_at),
            "status": item.status,
            "why": item.why,
        }
        for item in view.inbox
    ]
    report = {
        "mark": {
            "generation": view.mark.generation,
            "checkpoint_digest": view.mark.checkpoint_digest,
            "attempts": view.mark.attempts,
            "retry_at": None if view.mark.retry_at is None else format_time(view.mark.retry_at),
            "last_error": view.mark.last_error,
        },
        "state": state.to_json(),
        "ledger": ledger,
        "trace": trace,
        # Newest first; the next older page is --before / --ledger-before these (null: none).
        "page": {
            "trace_older": view.older_trace,
            "ledger_older": view.older_ledger,
            "trace_events": state.trace_length,
            "ledger_entries": state.ledger_length,
        },
        "inbox": inbox,
        "waiting_for": view.waiting_for,
        "needs_person": view.needs_person,
    }
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    print(
        f"run {state.run_id}: {state.phase}"
        + (f" ({state.stop_reason})" if state.stop_reason else "")
    )
    if view.mark.attempts:
        print(f"  failing  {view.mark.attempts} failed attempt(s), last: {view.mark.last_error}")
    print(
        f"  task {state.binding.task_id} v{state.binding.task_version}, "
        f"policy {state.binding.policy_id} v{state.binding.policy_version}"
    )
    print(
        f"  generation {state.generation} (mark {view.mark.generation}), epoch {state.epoch}, "
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
        if not p.approvals:
            print("    approval evidence: none")
        now = format_time(datetime.now(UTC))
        for document in p.approvals:
            body = document.get("body", {})
            status = "EXPIRED" if now >= str(body.get("expires_at")) else "valid"
            print(
                f"    approval by {document.get('signer')} ({document.get('alg')}), "
                f"expires {body.get('expires_at')} [{status}], nonce {body.get('nonce')}"
            )
    for case in state.review_cases:
        print(f"  review case {case.case_id}: {case.reason}: {case.detail}")
        print(f"    action {case.action_id} key {case.idempotency_key} intent {case.intent_digest}")
        if case.receipt is not None:
            print(
                f"    conflicting receipt {case.receipt.get('receipt_id')} for intent "
                f"{case.receipt.get('intent_digest')} fingerprint {case.receipt_fingerprint}"
            )
        print(f"    environment v{case.environment.version} {case.environment.state_fingerprint}")
    if view.waiting_for:
        print(f"  waiting  for {view.waiting_for}")
    waiting = sum(1 for item in inbox if item["status"] == "waiting")
    refused = sum(1 for item in inbox if item["status"] == "refused")
    print(f"  inbox ({len(inbox)} documents: {waiting} not read yet, {refused} refused)")
    for item in inbox:
        why = f": {item['why']}" if item["why"] else ""
        print(
            f"    #{item['seq']} {item['kind']} from {item['signer'] or '?'} "
            f"received {item['received_at']} [{item['status']}]{why}"
        )
    print(f"  ledger ({_shown(len(ledger), state.ledger_length, 'entries')}, newest first)")
    for entry in entries:
        t = entry.terms
        what = (
            ""
            if t is None
            else f" {t.kind} {t.target} via {t.adapter} (retry: {t.retry}, "
            f"compensation: {t.compensation}" + (", sensitive" if t.sensitive else "") + ")"
        )
        print(
            f"    {entry.idempotency_key} #{entry.seq} {entry.status} {entry.action_id} "
            f"epoch {entry.epoch}{what}"
        )
    if view.older_ledger is not None:
        print(f"    ... older entries: --ledger-before {view.older_ledger} (or --all)")
    print(f"  trace ({_shown(len(trace), state.trace_length, 'events')}, newest first)")
    for row in trace:
        data = _render.full(row["data"]) if args.full else _render.short(row["data"])
        print(f"    {row['seq']:>4} {row['at']} {row['kind']}" + (f"  {data}" if data else ""))
    if view.older_trace is not None:
        print(f"    ... older events: --before {view.older_trace} (or --all)")
    return 0


def _shown(count: int, total: int, what: str) -> str:
    return f"{total} {what}" if count == total else f"{count} of {total} {what} shown"


def cmd_verify(args: argparse.Namespace) -> int:
    with _progress.bar("verify", enabled=_progress.wanted(args.json)) as update:
        # Stage by stage: on a long run the trace and the ledger are most of the work.
        step = update or (lambda done, total, what: None)
        step(0, 5, "the checkpoint at the mark")
        checkpointer = _open(args)
        try:
            restored = checkpointer.load(args.run_id)
        except MissingHighWaterMarkError:
            # No mark and nothing else of the run: no such run, not a damaged one.
            if checkpointer.content.newest_generation(args.run_id) is None:
                raise RunNotFoundError(args.run_id) from None
            raise
        checkpointer.check_generation(restored)
        state = restored.state
        validate_state(state)
        step(1, 5, f"the trace ({state.trace_length} events)")
        events = checkpointer.verified_trace(state)
        step(2, 5, f"the ledger ({state.ledger_length} entries)")
        ledger = checkpointer.verified_ledger(state)
        # Recovery refuses a run whose agent context or results are missing or damaged.
        step(3, 5, "the agent's context")
        checkpointer.context(state)
        step(4, 5, "the results")
        checkpointer.results(state)
        step(5, 5, "done")
    result = {
        "run_id": state.run_id,
        "sound": True,
        "generation": state.generation,
        "key_id": json.loads(restored.envelope)["key_id"],
        "trace_events": len(events),
        "ledger_entries": len(ledger),
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(
            f"run {state.run_id}: sound at generation {state.generation} "
            f"(signed by key id {result['key_id']}, {len(events)} trace events and {len(ledger)} ledger entries chained)"
        )
    return 0


def _store(args: argparse.Namespace) -> SQLBase:
    return open_read(args.store)  # a reader never creates or migrates anything
