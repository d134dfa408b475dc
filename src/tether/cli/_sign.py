"""`tether keys new`, `approve`, `review`, `fork`: the tools of the people who sign.

The signer's tool never holds the runtime's checkpoint key and never changes
run state: it reads the run (:func:`tether.runtime.open_run`), builds and
signs the document with the person's own key and checks it as the runtime
will (:mod:`tether.runtime._operator`): a document the runtime would refuse
is refused here, before anyone is asked. What is shown is what is signed.
Only then does it ask and leave the document in the store's inbox; the
runtime verifies it again against its own trust roots at its next step.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tether.cli._options import add_store, open_existing, open_read, signer_id
from tether.core import Policy, PolicyError, ReviewDecision, TetherError
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import (
    Page,
    Prepared,
    RunView,
    open_run,
    prepare_approval,
    prepare_fork,
    prepare_review,
)
from tether.runtime import (
    deliver as deliver_prepared,
)
from tether.store import SQLiteStore


def add_signing(sub: Any, seconds: Any) -> None:
    """Register ``keys``, ``approve``, ``review`` and ``fork`` on the ``tether`` parser."""
    keys = sub.add_parser(
        "keys",
        help="make signing keys for approvers, reviewers, operators and workers",
        description="Make signing keys for the people who approve writes, decide reviews, "
        "rewind or admit runs, and for workers that sign their own recoveries.",
    )
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    new = keys_sub.add_parser(
        "new",
        help="write an Ed25519 key pair: NAME.key (0600) and NAME.trust.json (public)",
        description="Write an Ed25519 key pair. The private key file is mode 0600 and stays "
        "with the person; only NAME.trust.json (the public half) is given to the runtime.",
    )
    new.add_argument(
        "--role",
        choices=["approver", "reviewer", "operator", "worker"],
        required=True,
        help="what the key may sign: approver (approvals), reviewer (review decisions, "
        "forks, rewinds), operator (forks, rewinds, admissions, cancels), worker (its own "
        "recoveries)",
    )
    new.add_argument(
        "--id",
        required=True,
        type=signer_id,
        help="the signer's id, e.g. alice (letters, digits and . _ @ + -; it names the files)",
    )
    new.add_argument(
        "--out",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="directory for the two files (default: .)",
    )
    new.add_argument("--json", action="store_true", help="print one JSON object")
    new.set_defaults(func=cmd_keys_new)

    approve = sub.add_parser(
        "approve",
        help="sign an approval for a run's pending write",
        description="Show the fields an approval binds, check it as the runtime will (role, "
        "trust, ttl against the run's policy, the generation you saw), ask, sign with --key "
        "and leave the signed approval in the store's inbox for the run's next step.",
    )
    approve.add_argument("run_id", metavar="RUN")
    approve.add_argument("action", metavar="ACTION", help="the pending action id")
    review = sub.add_parser(
        "review",
        help="sign a decision (landed, not_landed, compensate, replan, abort or accept) for an "
        "open review case",
        description="Show the case (the write in question whole: kind, target, arguments, key, "
        "when it was sent, and where to look for it), check the decision as the runtime will, "
        "ask, sign it with --key and leave it in the store's inbox; the runtime rereads the "
        "adapter's receipt before applying it. Each case takes only some decisions; the "
        "prompt lists them.",
    )
    review.add_argument("run_id", metavar="RUN")
    review.add_argument("case", metavar="CASE", help="the review case id")
    review.add_argument(
        "--decision",
        choices=[d.value for d in ReviewDecision],
        required=True,
        help="landed: you found the write in the world (give --evidence); the ledger records "
        "it committed by you and nothing is sent; not_landed: it never arrived; it is sent "
        "once more under the same key (refused while the adapter, asked by key, holds it or "
        "still has it in flight); compensate: undo it the way its kind declares (give "
        "--evidence naming what to undo); replan: quarantine the key and plan anew; abort: "
        "fail the run; accept: take the environment as observed (a case about drift) and go on",
    )
    review.add_argument(
        "--evidence",
        metavar="TEXT",
        help="what you found: a message id, a receipt id, a URL (landed and compensate need "
        "it; not_landed needs what you searched where the card warns that a look-up by key "
        "proves nothing; any decision may carry it as a note). It is signed with the decision.",
    )
    fork = sub.add_parser(
        "fork",
        help="sign a fork: do an effect the run already committed once more, on purpose",
        description="Without a fork, a proposal equal to an effect the run committed is "
        "replayed (its receipt returned, nothing sent). Show the effect's earlier receipt, "
        "ask, sign with --key (a reviewer's or operator's) and leave it in the store's inbox.",
    )
    fork.add_argument("run_id", metavar="RUN")
    fork.add_argument("effect", metavar="EFFECT", help="the effect digest (see effect_replayed)")
    for parser, func in ((approve, cmd_approve), (review, cmd_review), (fork, cmd_fork)):
        add_signer_arguments(parser, seconds)
        parser.set_defaults(func=func)


def add_signer_arguments(
    parser: argparse.ArgumentParser,
    seconds: Any,
    *,
    key_help: str = "the signer's private key file",
    key_required: bool = True,
) -> None:
    """The arguments every signing command takes: key, store, checks, confirmation."""
    parser.add_argument("--key", type=Path, required=key_required, help=key_help)
    add_store(parser)
    parser.add_argument("--marks", type=Path, help="separate SQLite file holding the mark")
    parser.add_argument(
        "--ttl",
        type=seconds,
        help="seconds the document stays valid (default: the policy's approval_ttl_s, at "
        "most 900); more than the policy allows is refused",
    )
    parser.add_argument(
        "--policy",
        type=Path,
        help="the policy file to check against (default: the run's own, kept in the store)",
    )
    parser.add_argument(
        "--trust",
        type=Path,
        help="the runtime's trust file: refuse a key it does not trust for this role "
        "(default: the trust roots the run's epoch opened under, kept in the store)",
    )
    parser.add_argument(
        "--generation",
        type=int,
        metavar="GEN",
        help="the generation you looked at: refuse if the run has moved on since",
    )
    parser.add_argument(
        "--keyring", type=Path, help="verify the checkpoint before showing it (optional)"
    )
    parser.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (needs --yes: asks nothing)"
    )


def cmd_keys_new(args: argparse.Namespace) -> int:
    # The id was checked by the parser (signer_id): the files land in --out, nowhere else.
    out: Path = args.out
    private = out / f"{args.id}.key"
    public = out / f"{args.id}.trust.json"
    if private.exists() or public.exists():
        raise TetherError(f"{private} or {public} already exists; choose another --id or --out")
    if out.exists() and not out.is_dir():
        raise TetherError(f"--out {out} is a file; give a directory for the two key files")
    signer = Signer.generate(args.id, args.role)
    out.mkdir(parents=True, exist_ok=True)
    signer.write_file(private)
    public.write_text(json.dumps({"signers": [signer.trust_root()]}, indent=2) + "\n")
    if args.json:
        print(
            json.dumps(
                {"id": args.id, "role": args.role, "key": str(private), "trust": str(public)}
            )
        )
        return 0
    print(f"{args.role} {args.id}: private key {private} (mode 0600; keep it with the person)")
    print(f"  trust root {public} (public half only: give this to the runtime)")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    signer = Signer.from_file(args.key)
    prepared = prepare_approval(
        read_view(args), signer, args.action, now=datetime.now(UTC), **checks(args)
    )
    return confirm_and_deliver(
        args,
        prepared,
        f"Approve this write as {signer.signer_id}?",
        "approval delivered (inbox #{seq}); run {run} checks it and carries the write out "
        "on its next step",
        "not approved",
    )


def cmd_review(args: argparse.Namespace) -> int:
    signer = Signer.from_file(args.key)
    prepared = prepare_review(
        read_view(args),
        signer,
        args.case,
        args.decision,
        now=datetime.now(UTC),
        evidence=args.evidence,
        **checks(args),
    )
    return confirm_and_deliver(
        args,
        prepared,
        f"Sign decision {args.decision!r} as {signer.signer_id}?",
        "decision delivered (inbox #{seq}); run {run} rereads the adapter and applies it on "
        "its next step",
        "no decision recorded",
    )


def cmd_fork(args: argparse.Namespace) -> int:
    signer = Signer.from_file(args.key)
    prepared = prepare_fork(
        read_view(args), signer, args.effect, now=datetime.now(UTC), **checks(args)
    )
    return confirm_and_deliver(
        args,
        prepared,
        f"Sign a fork as {signer.signer_id}: do this effect once more, on purpose?",
        "fork delivered (inbox #{seq}); run {run} reads it on its next step",
        "no fork recorded",
    )


def read_view(args: argparse.Namespace) -> RunView:
    """The run as it is now, verified under ``--keyring`` when one is given."""
    store = open_read(args.store)
    marks = None if args.marks is None else SQLiteStore(args.marks, read_only=True)
    try:
        keyring = None if args.keyring is None else Keyring.from_file(args.keyring)
        # What the signing commands need of the history: the inbox's statuses, and a
        # fork's effect (read by index); never the whole of a long run.
        effect = getattr(args, "effect", None)
        return open_run(
            store,
            args.run_id,
            keyring=keyring,
            marks=marks,
            page=Page(1),
            effects=() if effect is None else (effect,),
        )
    finally:
        store.close()
        if marks is not None:
            marks.close()


def checks(args: argparse.Namespace) -> dict[str, Any]:
    """The checks a signing command's flags ask for, as keyword arguments of ``prepare_*``."""
    trust = None if args.trust is None else TrustRoots.from_file(args.trust)
    return {
        "ttl_s": args.ttl,
        "trust": trust,
        "policy": load_policy(args.policy),
        "seen_generation": args.generation,
    }


def load_policy(path: Path | None) -> Policy | None:
    """The policy file a command names, strictly parsed (``None``: none named)."""
    if path is None:
        return None
    try:
        return Policy.from_json(Path(path).read_bytes())
    except OSError as exc:
        raise PolicyError(f"cannot read the policy file {path}: {exc}") from exc


def confirm_and_deliver(
    args: argparse.Namespace,
    prepared: Prepared,
    question: str,
    done: str,
    declined: str = "nothing signed",
) -> int:
    """Show what will be signed, ask (unless ``--yes``), deliver; ``done`` names the outcome."""
    if args.json and not args.yes:
        raise TetherError("--json prints one object and asks nothing: add --yes")
    if not args.json:
        _show(prepared)
        if not args.yes and not _ask(question):
            print(declined)
            return 1
    # After the question: if the run moved or the document expired meanwhile, nothing goes.
    seq = deliver(args.store, prepared, args.marks)
    if args.json:
        print(
            json.dumps(
                {
                    "inbox": seq,
                    "kind": prepared.kind,
                    "run_id": prepared.run_id,
                    "signed": prepared.shown,
                    "checkpoint_verified": prepared.verified,
                },
                sort_keys=True,
            )
        )
    else:
        print(done.format(seq=seq, run=prepared.run_id))
    return 0


def _show(prepared: Prepared) -> None:
    """Every field shown whole: a long or many-line value continues, indented, never cut."""
    width = max(len(k) for k in prepared.shown)
    for key, value in prepared.shown.items():
        first, *rest = str(value).splitlines() or [""]
        print(f"  {key:<{width}}  {first}")
        for line in rest:
            print(f"  {'':<{width}}  {line}")
    if not prepared.verified:
        print("  (checkpoint signature not checked: no --keyring given; the runtime checks it)")


def _ask(question: str) -> bool:
    print(f"{question} [y/N] ", end="", flush=True)
    return sys.stdin.readline().strip().lower() in {"y", "yes"}


def deliver(where: str, prepared: Prepared, marks_path: Path | None = None) -> int:
    """Leave a prepared document in the inbox of the store at ``where`` (re-checked first)."""
    store = open_existing(where)
    marks = None if marks_path is None else SQLiteStore(marks_path, read_only=True)
    try:
        return deliver_prepared(store, prepared, marks=marks)
    finally:
        store.close()
        if marks is not None:
            marks.close()


def deliver_document(where: str | Path, run_id: str, kind: str, document: dict[str, Any]) -> int:
    """Leave an already signed document in the inbox (the demos, which sign their own)."""
    store = SQLiteStore(where, create=False) if isinstance(where, Path) else open_existing(where)
    try:
        return store.put_evidence(run_id, kind, document)
    finally:
        store.close()
