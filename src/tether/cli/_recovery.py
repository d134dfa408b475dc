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
from datetime import UTC, datetime
from typing import Any

from tether.cli._inspect import add_paging, add_reader, open_view
from tether.cli._sign import add_signer_arguments, checks, confirm_and_deliver, read_view
from tether.crypto import Signer
from tether.runtime import prepare_admission, prepare_rewind


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
        "it in the store's inbox: the run's next recovery opens its new epoch under it. "
        "--policy names the policy the run continues under (default: the checkpoint's).",
    )
    admit.add_argument("run_id", metavar="RUN")
    for parser in (rewind, admit):
        add_signer_arguments(parser, seconds)
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
        parser = add_reader(sub, name, helptext, func)
        if name == "ledger":
            add_paging(parser, trace=False)


def cmd_rewind(args: argparse.Namespace) -> int:
    signer = Signer.from_file(args.key)
    prepared = prepare_rewind(
        read_view(args),
        signer,
        args.to,
        args.reason,
        scope=args.scope,
        now=datetime.now(UTC),
        **checks(args),
    )
    return confirm_and_deliver(
        args,
        prepared,
        f"Sign this rewind as {signer.signer_id}?",
        f"rewind to generation {args.to} signed (inbox #{{seq}}); run {{run}} restores "
        "context and workspace on its next step",
        "no rewind signed",
    )


def cmd_admit(args: argparse.Namespace) -> int:
    return sign_admission(args, "no recovery signed")


def sign_admission(args: argparse.Namespace, declined: str) -> int:
    """Check, show, ask, sign with ``--key`` and deliver an admission of the run's next recovery."""
    signer = Signer.from_file(args.key)
    prepared = prepare_admission(read_view(args), signer, now=datetime.now(UTC), **checks(args))
    return confirm_and_deliver(
        args,
        prepared,
        f"Sign this recovery as {signer.signer_id}?",
        "admission signed (inbox #{seq}); the next recovery of run {run} opens its new "
        "epoch under it",
        declined,
    )


def cmd_epochs(args: argparse.Namespace) -> int:
    view = open_view(args)
    state = view.state
    epochs = view.epochs()
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
    view = open_view(args)
    effects = list(reversed(view.effects()))  # the newest effect first
    total = view.state.ledger_length
    if args.json:
        print(
            json.dumps(
                {
                    "run_id": args.run_id,
                    "effects": effects,
                    "entries": total,
                    # The --before of the next older page (null: this page reaches the start).
                    "older": view.older_ledger,
                },
                sort_keys=True,
            )
        )
        return 0
    shown = len(view.ledger)
    print(
        f"run {args.run_id}: {len(effects)} effect(s) in the ledger"
        + ("" if shown == total else f" (its newest {shown} of {total} entries, newest first)")
    )
    for item in effects:
        path = " -> ".join(h["status"] for h in item["history"])
        receipts = [h["receipt_id"] for h in item["history"] if h["receipt_id"]]
        last = receipts[-1] if receipts else None
        print(
            f"  {item.get('kind', '?'):<14} {item.get('target', '?'):<24} {item['status']:<16} "
            f"({path})" + (f"  receipt {last}" if last else "")
        )
    if view.older_ledger is not None:
        print(f"  ... older entries: --before {view.older_ledger} (or --all)")
    return 0
