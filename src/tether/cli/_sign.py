"""`tether keys new`, `tether approve`, `tether review`, `tether fork`: the tools of the people who sign.

The signer's tool never holds the runtime's checkpoint key and never changes
run state: it reads the bound fields, shows them, asks, signs with the
person's own key and leaves the signed document in the store's inbox. The
runtime verifies it against its trust roots at its next step.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tether.core import (
    CanonicalJSONError,
    CheckpointCorruptError,
    Phase,
    Policy,
    PolicyError,
    RunState,
    TetherError,
    approval_request,
    new_approval,
    new_decision,
    new_fork,
    replay_rules,
    strict_loads,
    validate_state,
)
from tether.crypto import Keyring, Signer
from tether.runtime import Checkpointer
from tether.store import SQLBase, SQLiteStore, open_store

DEFAULT_TTL_S = 900


def cmd_keys_new(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    signer = Signer.generate(args.id, args.role)
    private = out / f"{args.id}.key"
    public = out / f"{args.id}.trust.json"
    if private.exists() or public.exists():
        raise TetherError(f"{private} or {public} already exists; choose another --id or --out")
    signer.write_file(private)
    public.write_text(json.dumps({"signers": [signer.trust_root()]}, indent=2) + "\n")
    print(f"{args.role} {args.id}: private key {private} (mode 0600; keep it with the person)")
    print(f"  trust root {public} (public half only: give this to the runtime)")
    return 0


def open_existing(where: Path | str) -> SQLBase:
    """The store named by ``--db`` or ``--store``; a SQLite file must already exist."""
    return _store(where)


def _store(where: Path | str) -> SQLBase:
    # Never a new database: evidence delivered where no worker looks is lost in plain sight.
    if isinstance(where, str):
        return open_store(where, existing=True)
    return SQLiteStore(where, create=False)


def load_state(
    db: Path | str, run_id: str, keyring_path: Path | None, marks_path: Path | None = None
) -> tuple[RunState, bool]:
    """The run's newest checkpoint; verified when a keyring is given, else read as shown.

    ``marks_path``: the SQLite file holding the high-water mark, where it is kept apart.
    """
    store = _store(db)
    marks = None if marks_path is None else SQLiteStore(marks_path, create=False)
    try:
        if keyring_path is not None:
            keyring = Keyring.from_file(keyring_path)
            return Checkpointer(store, keyring, marks=marks).load(run_id).state, True
        mark = (marks or store).get_mark(run_id)
        envelope = None if mark is None else store.get_checkpoint(run_id, mark.checkpoint_digest)
        if envelope is None:
            raise TetherError(f"no checkpoint for run {run_id!r} in {db}")
        # Unverified display only: the runtime re-checks every bound field against
        # its own verified state, so a doctored checkpoint yields a refused approval.
        state = RunState.from_json(_unverified_payload(run_id, envelope))
        # What is shown must at least be what is signed: the invariants tie the
        # displayed intent to its digest, which the approval binds.
        validate_state(state)
        return state, False
    finally:
        store.close()
        if marks is not None:
            marks.close()


def _unverified_payload(run_id: str, envelope: bytes) -> Any:
    """The payload of an envelope read without its key: malformed bytes are corruption."""
    try:
        document = strict_loads(envelope)
    except CanonicalJSONError as exc:
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint is not a well-formed envelope: {exc}", run_id=run_id
        ) from exc
    if not isinstance(document, dict) or not isinstance(document.get("payload"), dict):
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint envelope carries no payload object", run_id=run_id
        )
    return document["payload"]


DEFAULT_TTL_S = 900


def lifetime(args: argparse.Namespace, state: RunState) -> int | float:
    """The ttl to sign: ``--ttl``, else the policy's (or 900 s), never above the policy's.

    The runtime refuses evidence that outlives its policy's ``approval_ttl_s``;
    with ``--policy`` the refusal happens here, before anything is signed.
    """
    if args.policy is None:
        if args.ttl is None:
            print(
                "tether: note: without --policy the ttl is not checked against the run's "
                f"policy; the runtime refuses one longer than its approval_ttl_s "
                f"(signing {DEFAULT_TTL_S} s)",
                file=sys.stderr,
            )
        return DEFAULT_TTL_S if args.ttl is None else args.ttl
    try:
        text = Path(args.policy).read_bytes()
    except OSError as exc:
        raise PolicyError(f"cannot read the policy file {args.policy}: {exc}") from exc
    policy = Policy.from_json(text)
    binding = state.binding
    if policy.fingerprint != binding.policy_fingerprint:
        raise PolicyError(
            f"run {state.run_id} runs under policy {binding.policy_id} version "
            f"{binding.policy_version} ({binding.policy_fingerprint}); {args.policy} is "
            f"{policy.policy_id} version {policy.policy_version} ({policy.fingerprint})"
        )
    allowed = policy.approval_ttl_s
    if args.ttl is None:
        return min(DEFAULT_TTL_S, allowed)
    if args.ttl > allowed:
        raise PolicyError(
            f"--ttl {args.ttl:g} is longer than the policy's approval_ttl_s ({allowed:g} s): "
            "the runtime would refuse it"
        )
    return args.ttl  # type: ignore[no-any-return]


def cmd_approve(args: argparse.Namespace) -> int:
    signer = Signer.from_file(args.key)
    state, verified = load_state(args.store or args.db, args.run_id, args.keyring)
    pending = state.pending
    if state.phase is not Phase.PENDING or pending is None:
        raise PolicyError(f"run {args.run_id} is {state.phase}; it has no pending write to approve")
    if pending.action_id != args.action:
        raise PolicyError(
            f"run {args.run_id}'s pending action is {pending.action_id!r}, not {args.action!r}"
        )
    now = datetime.now(UTC)
    body = new_approval(
        state,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=lifetime(args, state)),
        nonce=secrets.token_hex(16),
    )
    args_text = json.dumps(pending.intent.args, sort_keys=True)
    shown = {
        **approval_request(state),
        "kind_of_write": pending.intent.kind,
        "target": pending.intent.target,
        "arguments": args_text if len(args_text) <= 400 else args_text[:400] + " ...",
        "expires_at": body["expires_at"],
    }
    if not _confirm(f"Approve this write as {signer.signer_id}?", shown, verified, args.yes):
        print("not approved")
        return 1
    seq = deliver(args.store or args.db, args.run_id, "approval", signer.sign(body))
    print(f"approval recorded (inbox #{seq}); run {args.run_id} picks it up on its next step")
    return 0


def cmd_review(args: argparse.Namespace) -> int:
    signer = Signer.from_file(args.key)
    state, verified = load_state(args.store or args.db, args.run_id, args.keyring)
    case = next((c for c in state.review_cases if c.case_id == args.case), None)
    if state.phase is not Phase.NEEDS_REVIEW or case is None:
        raise PolicyError(f"run {args.run_id} has no open review case {args.case!r}")
    now = datetime.now(UTC)
    body = new_decision(
        state,
        case,
        signer.signer_id,
        args.decision,
        issued_at=now,
        expires_at=now + timedelta(seconds=lifetime(args, state)),
        nonce=secrets.token_hex(16),
    )
    shown = {**body, "reason": case.reason, "detail": case.detail}
    shown.pop("nonce")
    if not _confirm(
        f"Sign decision {args.decision!r} as {signer.signer_id}?", shown, verified, args.yes
    ):
        print("no decision recorded")
        return 1
    seq = deliver(args.store or args.db, args.run_id, "review_decision", signer.sign(body))
    print(f"decision recorded (inbox #{seq}); run {args.run_id} applies it on its next step")
    return 0


def cmd_fork(args: argparse.Namespace) -> int:
    signer = Signer.from_file(args.key)
    where = args.store or args.db
    state, verified = load_state(where, args.run_id, args.keyring)
    if state.phase.terminal:
        raise PolicyError(f"run {args.run_id} is {state.phase}; nothing to fork")
    store = _store(where)
    try:
        if verified and args.keyring is not None:
            entries = Checkpointer(store, Keyring.from_file(args.keyring)).verified_ledger(state)
        else:  # shown unverified; the runtime binds the fork to its own verified ledger
            entries = store.ledger(args.run_id)
    finally:
        store.close()
    record = replay_rules.known_effects(entries).get(args.effect)
    known = None if record is None else record.current
    if known is None:
        raise PolicyError(f"run {args.run_id}'s ledger records no effect {args.effect}")
    now = datetime.now(UTC)
    body = new_fork(
        state,
        known,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=lifetime(args, state)),
        nonce=secrets.token_hex(16),
    )
    shown = {**body, "earlier_action": known.action_id}
    shown.pop("nonce")
    question = f"Sign a fork as {signer.signer_id}: do this effect once more, on purpose?"
    if not _confirm(question, shown, verified, args.yes):
        print("no fork recorded")
        return 1
    seq = deliver(where, args.run_id, "fork", signer.sign(body))
    print(f"fork recorded (inbox #{seq}); run {args.run_id} reads it on its next step")
    return 0


def _confirm(question: str, fields: dict[str, Any], verified: bool, yes: bool) -> bool:
    width = max(len(k) for k in fields)
    for key, value in fields.items():
        print(f"  {key:<{width}}  {value}")
    if not verified:
        print("  (checkpoint signature not checked: no --keyring given; the runtime checks it)")
    if yes:
        return True
    print(f"{question} [y/N] ", end="", flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in {"y", "yes"}


def deliver(db: Path | str, run_id: str, kind: str, document: dict[str, Any]) -> int:
    store = _store(db)
    try:
        return store.put_evidence(run_id, kind, document)
    finally:
        store.close()
