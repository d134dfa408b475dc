"""`tether rewind`, `tether admit`, `tether epochs`, `tether ledger`: the recovery contract.

``rewind`` and ``admit`` are the signer's tools: they read the bound fields
of the run as it is now, show them, ask, sign with the person's own key and
leave the document in the store's inbox (a rewind is applied by the run's
next step, an admission by its next recovery). They never hold the
checkpoint key and never change run state. ``epochs`` and ``ledger`` read
the run back, verified under the keyring, like ``inspect``.
"""

from __future__ import annotations

import argparse
import json
import secrets
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tether.cli._inspect import _open, add_reader
from tether.cli._sign import _confirm, deliver, lifetime, load_state, open_existing
from tether.core import (
    Phase,
    Policy,
    PolicyError,
    Purpose,
    RewindRefusedError,
    RunState,
    TetherError,
    admission_request,
    new_admission,
)
from tether.crypto import Signer


def add_recovery(sub: Any, seconds: Any) -> None:
    """Register the four commands on the ``tether`` parser."""
    rewind = sub.add_parser(
        "rewind",
        help="sign a rewind of a run's context and workspace to an earlier generation",
        description="Show what a rewind to GEN binds (the run as it is now, the target, why), "
        "ask, sign it with --key (an operator or reviewer, as the policy's authority.rewind "
        "says) and leave it in the store's inbox: the run's next step restores context and "
        "workspace together, as new generations, and hands the agent the rewind memory. "
        "Effects committed after GEN stay in the ledger and are never repeated.",
    )
    rewind.add_argument("run_id", metavar="RUN")
    rewind.add_argument("--to", type=int, required=True, metavar="GEN", help="the rewind point")
    rewind.add_argument("--reason", required=True, help="why, for the trace and the agent")
    rewind.add_argument(
        "--scope",
        choices=["aligned", "files", "context"],
        default="aligned",
        help="aligned (default): both; files or context alone is a split made on purpose",
    )
    admit = sub.add_parser(
        "admit",
        help="sign an admission so a run may be recovered (a person-admitted recovery)",
        description="Show what an admission binds (the checkpoint the mark names, the "
        "interrupted epoch, the policy, the ledger's head), ask, sign it with --key and leave "
        "it in the store's inbox: the run's next recovery opens its new epoch under it.",
    )
    admit.add_argument("run_id", metavar="RUN")
    for parser in (rewind, admit):
        parser.add_argument("--key", type=Path, required=True, help="the signer's private key")
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("--db", type=Path, help="SQLite store file")
        where.add_argument("--store", help="store URL: sqlite:///path or postgresql://...")
        parser.add_argument("--marks", type=Path, help="separate SQLite file holding the mark")
        parser.add_argument(
            "--ttl", type=seconds, help="seconds the document stays valid (default: policy's)"
        )
        parser.add_argument(
            "--policy",
            type=Path,
            help="the policy the run continues under (default: the checkpoint's); the ttl is "
            "checked against it",
        )
        parser.add_argument(
            "--keyring", type=Path, help="verify the checkpoint before showing it (optional)"
        )
        parser.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
    rewind.set_defaults(func=cmd_rewind)
    admit.set_defaults(func=cmd_admit)
    for name, helptext, func in (
        (
            "epochs",
            "list a run's epochs: who admitted each, from which checkpoint, why",
            cmd_epochs,
        ),
        ("ledger", "list a run's effect ledger: every effect, its status and receipt", cmd_ledger),
    ):
        add_reader(sub, name, helptext, func)


def cmd_rewind(args: argparse.Namespace) -> int:
    state, verified = load_state(args.store or args.db, args.run_id, args.keyring, args.marks)
    if state.phase is not Phase.RUNNING:
        raise RewindRefusedError(
            f"run {args.run_id} is {state.phase}: only a running run is rewound (settle a "
            "pending write, or decide a review, first)",
            run_id=args.run_id,
        )
    if not 1 <= args.to < state.generation:
        raise RewindRefusedError(
            f"--to {args.to}: name an earlier generation (the run is at {state.generation})",
            run_id=args.run_id,
        )
    return _sign_and_deliver(
        args, state, verified, Purpose.REWIND, "rewind", target=args.to, reason=args.reason
    )


def cmd_admit(args: argparse.Namespace) -> int:
    state, verified = load_state(args.store or args.db, args.run_id, args.keyring, args.marks)
    if state.phase.terminal:
        raise PolicyError(f"run {args.run_id} is {state.phase}; nothing may resume it")
    return _sign_and_deliver(args, state, verified, Purpose.RECOVERY, "admission")


def _sign_and_deliver(
    args: argparse.Namespace,
    state: RunState,
    verified: bool,
    purpose: Purpose,
    kind: str,
    *,
    target: int | None = None,
    reason: str = "",
) -> int:
    signer = Signer.from_file(args.key)
    binding = state.binding
    if args.policy is not None:
        try:
            policy = Policy.from_json(Path(args.policy).read_bytes())
        except OSError as exc:
            raise PolicyError(f"cannot read the policy file {args.policy}: {exc}") from exc
        binding = replace(
            binding,
            policy_id=policy.policy_id,
            policy_version=policy.policy_version,
            policy_fingerprint=policy.fingerprint,
        )
        # The ttl is checked against the policy the document will be judged by.
        ttl = min(args.ttl or policy.approval_ttl_s, policy.approval_ttl_s)
        if args.ttl is not None and args.ttl > policy.approval_ttl_s:
            raise PolicyError(
                f"--ttl {args.ttl:g} is longer than the policy's approval_ttl_s "
                f"({policy.approval_ttl_s} s): the runtime would refuse it"
            )
    else:
        ttl = lifetime(args, state)
    mark_digest = _mark_digest(args.marks or args.store or args.db, args.run_id)
    request = admission_request(
        state,
        checkpoint_digest=mark_digest,
        policy=binding,
        purpose=purpose,
        target_generation=target,
        reason=reason,
        scope=getattr(args, "scope", "aligned"),
    )
    now = datetime.now(UTC)
    body = new_admission(
        request,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl),
        nonce=secrets.token_hex(16),
    )
    shown = {key: value for key, value in body.items() if key != "nonce"}
    question = f"Sign this {purpose.value} as {signer.signer_id}?"
    if args.json and not args.yes:
        raise TetherError("--json prints one object and asks nothing: add --yes")
    if not args.json and not _confirm(question, shown, verified, args.yes):
        print(f"no {purpose.value} signed")
        return 1
    seq = deliver(args.store or args.db, args.run_id, kind, signer.sign(body))
    if args.json:
        print(json.dumps({"inbox": seq, "kind": kind, "signed": shown}, sort_keys=True))
    elif purpose is Purpose.REWIND:
        print(
            f"rewind to generation {target} signed (inbox #{seq}); run {args.run_id} restores "
            "context and workspace on its next step"
        )
    else:
        print(
            f"admission signed (inbox #{seq}); the next recovery of run {args.run_id} "
            "opens its new epoch under it"
        )
    return 0


def _mark_digest(where: Path | str, run_id: str) -> str:
    store = open_existing(where)
    try:
        mark = store.get_mark(run_id)
    finally:
        store.close()
    if mark is None:
        raise TetherError(f"no high-water mark for run {run_id!r}")
    return mark.checkpoint_digest


def cmd_epochs(args: argparse.Namespace) -> int:
    checkpointer = _open(args)
    state = checkpointer.load(args.run_id).state
    epochs: list[dict[str, Any]] = []
    for event in checkpointer.verified_trace(state):
        data = event.data
        if event.kind == "run_started":
            epochs.append(
                {"epoch": 1, "opened_by": "start", "at": event.body()["at"], "generation": None}
            )
        elif event.kind in {"recovered", "rewind_started"}:
            epochs.append(
                {
                    "epoch": len(epochs) + 1,
                    "opened_by": "recovery" if event.kind == "recovered" else "rewind",
                    "at": event.body()["at"],
                    "epoch_id": data.get("epoch_id"),
                    "previous_epoch_id": data.get("previous_epoch_id"),
                    "principal": data.get("principal"),
                    "role": data.get("role"),
                    "signed": data.get("signed"),
                    "admission": data.get("admission"),
                    "generation": data.get("from_generation"),
                    "to_generation": data.get("to_generation"),
                    "reason": data.get("reason") or None,
                }
            )
    if args.json:
        print(json.dumps({"run_id": args.run_id, "epochs": epochs}, sort_keys=True))
        return 0
    print(f"run {args.run_id}: {len(epochs)} epoch(s), now {state.epoch} ({state.epoch_id})")
    for item in epochs:
        if item["opened_by"] == "start":
            print(f"  epoch 1  started  {item['at']}")
            continue
        how = "signed" if item["signed"] else "unsigned"
        where = f"from generation {item['generation']}"
        if item["opened_by"] == "rewind":
            where += f", rewound to {item['to_generation']}: {item['reason']}"
        print(
            f"  epoch {item['epoch']}  {item['opened_by']}  {item['at']}  by {item['principal']} "
            f"({item['role']}, {how})  {where}"
        )
    return 0


def cmd_ledger(args: argparse.Namespace) -> int:
    checkpointer = _open(args)
    state = checkpointer.load(args.run_id).state
    effects: dict[str, dict[str, Any]] = {}
    for entry in checkpointer.verified_ledger(state):
        item = effects.setdefault(
            entry.idempotency_key,
            {"key": entry.idempotency_key, "action_id": entry.action_id, "history": []},
        )
        if entry.terms is not None and "kind" not in item:
            item.update(
                kind=entry.terms.kind,
                target=entry.terms.target,
                adapter=entry.terms.adapter,
                retry=entry.terms.retry.value,
                compensation=entry.terms.compensation.value,
            )
        receipt = entry.receipt or {}
        item["status"] = entry.status.value
        item["history"].append(
            {
                "seq": entry.seq,
                "status": entry.status.value,
                "epoch": entry.epoch,
                "receipt_id": receipt.get("receipt_id"),
            }
        )
    if args.json:
        print(
            json.dumps({"run_id": args.run_id, "effects": list(effects.values())}, sort_keys=True)
        )
        return 0
    print(f"run {args.run_id}: {len(effects)} effect(s) in the ledger")
    for item in effects.values():
        path = " -> ".join(h["status"] for h in item["history"])
        receipts = [h["receipt_id"] for h in item["history"] if h["receipt_id"]]
        last = receipts[-1] if receipts else None
        print(
            f"  {item.get('kind', '?'):<14} {item.get('target', '?'):<24} {item['status']:<16} "
            f"({path})" + (f"  receipt {last}" if last else "")
        )
    return 0
