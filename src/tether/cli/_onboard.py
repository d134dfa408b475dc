"""Getting started: `tether keyring new`, `tether trust add`, `tether init`.

Each writes files a person then owns; none ever overwrites one, prints a
key or leaves a half-written file behind. ``init`` writes a task and a policy
that the strict loaders accept as they are, with the workspace's initial
fingerprint computed by the same :class:`FileWorkspace` the runtime uses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from tether.adapters import FileWorkspace
from tether.cli._guard import UsageError
from tether.core import (
    CanonicalJSONError,
    Policy,
    TaskSpec,
    TetherError,
    canonical_bytes,
    strict_loads,
)
from tether.crypto import Keyring, TrustError, TrustRoots


class FileExistsRefusedError(TetherError):
    """A file the command would write is already there; nothing was written."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path


def add_onboarding(sub: Any) -> None:
    """Register ``keyring``, ``trust`` and ``init`` on the ``tether`` parser."""
    keyring = sub.add_parser(
        "keyring",
        help="make the runtime's checkpoint keyring",
        description="The keyring holds the HMAC keys that seal every checkpoint. Give its path "
        "to the runtime (Keyring.from_file) and to inspect/verify (--keyring or "
        "$TETHER_KEYRING_FILE). It is secret: mode 0600, never printed.",
    )
    keyring_sub = keyring.add_subparsers(dest="keyring_command", metavar="ACTION", required=True)
    ring = keyring_sub.add_parser(
        "new",
        help="write a new keyring file (mode 0600) with one active key",
        description="Write a new keyring file with one fresh 32-byte active key, mode 0600. "
        "Refuses a path that exists: a keyring is replaced by rotating, never by overwriting.",
    )
    ring.add_argument("--out", type=Path, metavar="FILE", help="the keyring file to create")
    # The old spelling, `keyring new PATH`: kept, not shown.
    ring.add_argument("path", nargs="?", type=Path, help=argparse.SUPPRESS)
    ring.add_argument("--key-id", default="k1", help="the key's id (default: k1)")
    ring.add_argument("--json", action="store_true", help="print one JSON object")
    ring.set_defaults(func=cmd_keyring_new)

    trust = sub.add_parser(
        "trust",
        help="manage the runtime's trust roots (the signers' public keys)",
        description="The trust file lists the signers whose approvals, review decisions, "
        "forks, rewinds and admissions the runtime accepts (TrustRoots.from_file).",
    )
    trust_sub = trust.add_subparsers(dest="trust_command", metavar="ACTION", required=True)
    add = trust_sub.add_parser(
        "add",
        help="merge a signer's public half (NAME.trust.json) into a trust file",
        description="Merge the signers of NAME.trust.json into --out (created if absent). "
        "Refuses a file that carries a private key, and a signer id already trusted with a "
        "different key or role; adding the same signer again changes nothing.",
    )
    add.add_argument("source", metavar="NAME.trust.json", type=Path, help="the public half")
    into = add.add_mutually_exclusive_group(required=True)
    into.add_argument(
        "--out", type=Path, metavar="FILE", help="the trust file to merge into, e.g. trust.json"
    )
    into.add_argument("--to", dest="out", type=Path, help=argparse.SUPPRESS)  # the old spelling
    add.add_argument("--json", action="store_true", help="print one JSON object")
    add.set_defaults(func=cmd_trust_add)

    init = sub.add_parser(
        "init",
        help="write a task and a policy to start from, for a workspace directory",
        description="Write task.json and policy.json (strict JSON the runtime loads as they "
        "are) and print what each field means. The task's initial_environment carries the "
        "fingerprint of --workspace as FileWorkspace computes it, so a run starts only from "
        "exactly that tree.",
    )
    init.add_argument("--workspace", type=Path, required=True, help="the workspace directory")
    init.add_argument(
        "--out",
        type=Path,
        default=Path("."),
        help="directory for the two files, outside the workspace (default: .)",
    )
    init.add_argument("--task-id", default="my-task", help="the task's id (default: my-task)")
    init.add_argument(
        "--verifier",
        default="python -m unittest -q",
        help="the command that proves the work is done, run in the workspace "
        "(default: 'python -m unittest -q'); split on spaces; 'none' for a task with nothing "
        "to test (the run then completes on the agent's finish, said so in its trace)",
    )
    init.add_argument("--json", action="store_true", help="print one JSON object")
    init.set_defaults(func=cmd_init)


def cmd_keyring_new(args: argparse.Namespace) -> int:
    if (args.out is None) == (args.path is None):
        raise UsageError(
            "tether keyring new",
            "tether keyring new",
            "name the keyring file to create once: --out FILE",
        )
    path: Path = args.out if args.out is not None else args.path
    if path.exists() or path.is_symlink():
        raise FileExistsRefusedError(
            path, f"{path} already exists; a keyring is never overwritten (pick a new path)"
        )
    ring = Keyring.single(args.key_id, secrets.token_bytes(32))
    _write_new(path, ring.to_json(), mode=0o600)
    if args.json:
        _print_json({"path": str(path), "key_ids": list(ring.key_ids), "mode": "0600"})
        return 0
    print(f"keyring {path}: one active key, id {args.key_id} (mode 0600; never share or print it)")
    print(f"  use it: export TETHER_KEYRING_FILE={path}   (or --keyring {path})")
    return 0


def cmd_trust_add(args: argparse.Namespace) -> int:
    incoming = _signers(args.source, public_only=True)
    target: Path = args.out
    current = _signers(target, public_only=False) if target.exists() else []
    by_id = {entry["id"]: entry for entry in current}
    added: list[str] = []
    unchanged: list[str] = []
    for entry in incoming:
        known = by_id.get(entry["id"])
        if known is None:
            by_id[entry["id"]] = entry
            current.append(entry)
            added.append(entry["id"])
        elif canonical_bytes(known) == canonical_bytes(entry):
            unchanged.append(entry["id"])
        else:
            raise TrustError(
                f"signer {entry['id']!r} is already trusted in {target} with a different key "
                "or role; remove it there first if the key really changed"
            )
    document = {"signers": current}
    TrustRoots.from_json(canonical_bytes(document))  # what is written must load
    if added:
        _replace(target, _pretty(document))
    if args.json:
        _print_json({"trust": str(target), "added": added, "unchanged": unchanged})
        return 0
    for name in added:
        print(f"trusted {name} in {target}")
    for name in unchanged:
        print(f"{name} was already trusted in {target} with this key; nothing changed")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    ws: Path = args.workspace
    if not ws.is_dir():
        raise TetherError(f"workspace {ws} is not a directory")
    out: Path = args.out
    if out.resolve().is_relative_to(ws.resolve()):
        # Written into the tree, they would change the fingerprint they record.
        raise TetherError(
            f"--out {out} is inside the workspace {ws}: task.json and policy.json there would "
            "change the fingerprint they record; give --out a directory outside it"
        )
    task_path, policy_path = out / "task.json", out / "policy.json"
    for path in (task_path, policy_path):
        if path.exists():
            raise FileExistsRefusedError(path, f"{path} already exists; give --out another dir")
    argv = args.verifier.split()
    if not argv:
        raise TetherError("--verifier must name a command, or 'none'")
    unverified = argv == ["none"]
    # The journal lives beside a workspace, never in it; a throwaway one here
    # gives the same content fingerprint the runtime's workspace will compute.
    with (
        tempfile.TemporaryDirectory(prefix="tether-init-") as journal,
        FileWorkspace(
            ws, Path(journal) / "journal", verifier_allowlist=[] if unverified else [tuple(argv)]
        ) as fw,
    ):
        env = fw.environment()
    task = {
        "task_id": args.task_id,
        "task_version": "1",
        "allowed_kinds": ["file.read", "file.list", "file.write"],
        "allowed_paths": ["src/"],
        "permissions": ["workspace.read", "workspace.write"],
        "budgets": {"proposals": 50, "steps": 100, "wall_time_s": 3600, "cost": 100},
        "initial_environment": {
            "namespace": env.namespace,
            "state_fingerprint": env.state_fingerprint,
        },
    }
    if not unverified:
        task["verifier"] = {"argv": argv, "timeout_s": 600}
    policy = {
        "policy_id": f"{args.task_id}-policy",
        "policy_version": "1",
        "kinds": {
            "file.read": {"risk": "low", "permission": "workspace.read", "needs_approval": False},
            "file.list": {"risk": "low", "permission": "workspace.read", "needs_approval": False},
            "file.write": {
                "risk": "medium",
                "permission": "workspace.write",
                "needs_approval": True,
            },
        },
        "max_risk": "medium",
        "approval_ttl_s": 900,
    }
    # What is written must load: the same strict parsers the runtime uses.
    TaskSpec.from_json(canonical_bytes(task))
    Policy.from_json(canonical_bytes(policy))
    out.mkdir(parents=True, exist_ok=True)
    _write_new(task_path, _pretty(task), mode=0o644)
    _write_new(policy_path, _pretty(policy), mode=0o644)
    if args.json:
        _print_json(
            {
                "task": str(task_path),
                "policy": str(policy_path),
                "workspace": str(ws),
                "state_fingerprint": env.state_fingerprint,
            }
        )
        return 0
    print(f"wrote {task_path} and {policy_path} for workspace {ws}")
    for line in _EXPLAINED:
        print(f"  {line}")
    return 0


#: What ``init`` prints about the files it wrote (JSON has no comments).
_EXPLAINED = (
    "task.json: what the run may do",
    "  allowed_kinds       the actions the agent may propose (file.read, file.list, file.write)",
    "  allowed_paths       paths it may touch; a trailing / means everything below (src/)",
    "  permissions         the permissions the task grants (each policy rule names one)",
    "  budgets             proposals, steps, wall_time_s and cost the run may spend",
    "  initial_environment the workspace's fingerprint now: a run starts only from this tree",
    "  verifier            the command `finish` runs; completed needs it to pass (leave it",
    "                      out for a task with nothing to test: --verifier none)",
    "policy.json: the rules it runs under",
    "  kinds               per action kind: risk, permission, needs_approval (a person signs)",
    "  max_risk            the riskiest kind allowed at all",
    "  approval_ttl_s      the longest an approval (or review decision) may live",
    "edit both to fit (bump the version when you do); a new fingerprint after editing the "
    "workspace: run `tether init` again into another --out",
)


def _signers(path: Path, *, public_only: bool) -> list[dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TrustError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        document = strict_loads(raw)
    except CanonicalJSONError as exc:
        raise TrustError(f"{path} is not strict JSON: {exc}") from exc
    if isinstance(document, dict) and "private_key" in document:
        raise TrustError(
            f"{path} is a private key file; give `trust add` the public half "
            "(NAME.trust.json) and keep the key with its person"
        )
    if public_only and isinstance(document, dict):
        for entry in document.get("signers") or []:
            if isinstance(entry, dict) and ("secret" in entry or "private_key" in entry):
                raise TrustError(
                    f"{path} carries a secret key for signer {entry.get('id')!r}; "
                    "`trust add` merges public halves only"
                )
    TrustRoots.from_json(raw)  # every field checked before anything is merged
    signers: list[dict[str, Any]] = document["signers"]
    return signers


def _pretty(document: Any) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _write_new(path: Path, data: bytes, *, mode: int) -> None:
    """Write ``data`` to ``path``, which must not exist: all of it, or nothing there."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as exc:
        where = path.parent if path.parent != Path() else Path(".")
        hint = (
            f"make it first (mkdir -p {where}) or name a path in a directory that exists"
            if isinstance(exc, FileNotFoundError)
            else "name a path in a directory you can write"
        )
        raise TetherError(
            f"cannot write {path}: directory {where} {_why(exc)}; {hint}; nothing written"
        ) from exc
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if the path appeared meanwhile: never overwritten
        except FileExistsError:
            raise FileExistsRefusedError(path, f"{path} already exists; nothing written") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _why(exc: OSError) -> str:
    """How a directory failed, in words: missing, or not writable."""
    if isinstance(exc, FileNotFoundError):
        return "does not exist"
    return f"cannot be written ({exc.strerror})"


def _replace(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (a reader sees the old file or the new)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, sort_keys=True))
