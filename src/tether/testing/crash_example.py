"""An app for the crash harness: a reply edited in a workspace, then a message sent.

``tether crashtest --app tether.testing.crash_example:app`` runs it; it is
also the template for your own app (see :mod:`tether.testing.crash_harness`
for the contract). Each run gets a directory of its own under the harness's
working directory: a :class:`~tether.adapters.FileWorkspace` holding
``reply.txt``, and an :class:`Outbox`, a small adapter written the way a user
writes one for their own service. Every message the outbox delivers is one
file, so the number of files is what the world received, whatever tether
believes.

``blind_app`` is the same run with a blind outbox (it can neither deduplicate
a send nor be asked about one): a message whose send cannot be confirmed
must send the run to review, and the harness reports it so.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tether.adapters import (
    Adapter,
    Adapters,
    Fence,
    FileWorkspace,
    NotQueryableError,
    VerifierResult,
)
from tether.core import (
    ActionClass,
    ActionKind,
    AdapterUnavailableError,
    Capabilities,
    ContractViolationError,
    EnvironmentDriftError,
    EnvironmentState,
    IdempotencyConflictError,
    Intent,
    JSONValue,
    Observation,
    Policy,
    Proposal,
    Receipt,
    TargetKind,
    TaskSpec,
    VerifierRefusedError,
    digest,
    format_time,
)
from tether.crypto import Keyring
from tether.runtime import AgentContext, CrashPlan, Decision, Runtime
from tether.testing._sandbox import Sandbox

MESSAGE_SEND = ActionKind("message.send", ActionClass.WRITE, TargetKind.PATH, frozenset({"body"}))
DRAFT = "draft\n"
REPLY = "A technician is on the way.\n"
RECIPIENT = "customer"
# Runs in the workspace's tree (``python`` is the running interpreter there).
VERIFIER = (
    "python",
    "-c",
    "import pathlib, sys; sys.exit('on the way' not in pathlib.Path('reply.txt').read_text())",
)


class Outbox:
    """A directory that delivers each ``message.send`` as one file: a user's own adapter.

    With ``dedupe`` (the default) a message's file is named by its key and
    holds its receipt, so a second send under the key returns the first
    receipt and :meth:`lookup` answers by key: idempotent and queryable, and
    both promises kept. Without it, every send is a new file and nothing can
    be asked: a blind adapter, honest about being one.
    """

    version = "1"
    kinds = (MESSAGE_SEND,)

    def __init__(self, directory: Path, *, dedupe: bool = True) -> None:
        self.directory = Path(directory)
        self.dedupe = dedupe
        self.directory.mkdir(parents=True, exist_ok=True)
        self._instance = _instance_id(self.directory / "INSTANCE")

    @property
    def namespace(self) -> str:
        """``"outbox"``."""
        return "outbox"

    @property
    def instance_id(self) -> str:
        """Drawn once per outbox directory and kept in it: a copy elsewhere has another."""
        return self._instance

    @property
    def capabilities(self) -> Capabilities:
        """Idempotent and queryable with ``dedupe``, blind without; never stateful."""
        return Capabilities(
            idempotent=self.dedupe, queryable=self.dedupe, conditional_writes=False, stateful=False
        )

    def environment(self) -> EnvironmentState:
        """The outbox's identity; its messages are effects, not state tether fingerprints."""
        return EnvironmentState(
            self.namespace, self._instance, 0, digest({"outbox": self._instance})
        )

    def read(
        self, kind: str, target: str, args: dict[str, Any], scope: Any
    ) -> dict[str, JSONValue]:
        """The outbox answers no reads."""
        raise ContractViolationError("unknown_kind", f"the outbox has no read kind {kind!r}")

    def verify(self, argv: tuple[str, ...], timeout_s: int) -> VerifierResult:
        """The outbox runs no commands: the verifier runs on the workspace."""
        raise VerifierRefusedError("the outbox runs no verifier commands")

    def normalize(self, kind: str, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """``{"body": text}`` for one recipient."""
        if kind != MESSAGE_SEND.name:
            raise ContractViolationError("unknown_kind", f"the outbox cannot {kind!r}")
        if set(args) != {"body"} or not isinstance(args["body"], str):
            raise ContractViolationError("bad_args", "message.send takes a text body only")
        return {"body": args["body"]}

    def derive_post_state(self, prestate: EnvironmentState, intent: Intent) -> EnvironmentState:
        """The same identity: a delivered message leaves nothing here to fingerprint."""
        self._check_instance(prestate)
        return prestate

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        """Deliver the message once under ``key`` (every time, without ``dedupe``)."""
        if not key:
            raise ContractViolationError("bad_key", "the idempotency key must not be empty")
        self._check_instance(prestate)
        if intent.kind != MESSAGE_SEND.name:
            raise ContractViolationError("unknown_kind", f"the outbox cannot {intent.kind!r}")
        name = _key_name(key) if self.dedupe else f"{_key_name(key)}-{secrets.token_hex(8)}"
        receipt = Receipt(
            namespace=self.namespace,
            adapter_version=self.version,
            receipt_id=f"msg-{name}",
            idempotency_key=key,
            intent_digest=intent.digest,
            result={"to": intent.target},
            business_object_id=name,
            committed_at=format_time(datetime.now(UTC)),
            post_state=prestate,
        )
        document = {"to": intent.target, "body": intent.args["body"], "receipt": receipt.to_json()}
        if not _deliver(self.directory / f"{name}.msg", document):
            first = self.lookup(key)
            if first is None:  # the file vanished between the two looks: someone else's hand
                raise AdapterUnavailableError(f"message {name} is half there; look again")
            if first.intent_digest != intent.digest:
                raise IdempotencyConflictError(key, intent.digest, first)
            return first
        return receipt

    def lookup(self, key: str) -> Receipt | None:
        """The receipt of the message sent under ``key``, read from its file; ``None`` if none."""
        if not self.dedupe:
            raise NotQueryableError("a blind outbox cannot look a message up by key")
        path = self.directory / f"{_key_name(key)}.msg"
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise AdapterUnavailableError(f"message file {path} cannot be read: {exc}") from exc
        return Receipt.from_json(document["receipt"])

    def _check_instance(self, prestate: EnvironmentState) -> None:
        if (prestate.namespace, prestate.instance_id) != (self.namespace, self._instance):
            raise EnvironmentDriftError(
                f"the intent was prepared for {prestate.namespace}/{prestate.instance_id}, "
                f"this is outbox/{self._instance}; observe again before sending",
                expected=(prestate.namespace, prestate.instance_id),
                actual=(self.namespace, self._instance),
            )


def _key_name(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def _deliver(path: Path, document: dict[str, Any]) -> bool:
    """Write ``path`` whole, or not at all if it exists; ``False`` when it already did.

    The message is written and synced under a temporary name, then linked to
    its own: a link never replaces a file, so two sends under one key cannot
    both deliver, and a crash never leaves half a message under the real name.
    """
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(temp, "w") as handle:
        json.dump(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(temp, path)
    except FileExistsError:
        return False
    finally:
        temp.unlink()
    _sync_dir(path.parent)
    return True


def _instance_id(path: Path) -> str:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(f"outbox-{secrets.token_hex(6)}\n")
        handle.flush()
        os.fsync(handle.fileno())
    _sync_dir(path.parent)
    return path.read_text().strip()


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ReplyAgent:
    """Edits the reply, sends the message, finishes: deterministic from the plan cursor."""

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        cursor = context.plan_cursor
        version = observation.environment.version
        steps = {
            0: Proposal("edit-reply", "file.write", "reply.txt", {"content": REPLY}, version),
            1: Proposal("notify", MESSAGE_SEND.name, RECIPIENT, {"body": REPLY}, version),
        }
        note = {"step": cursor}
        after = AgentContext((*context.messages, note), context.memory, cursor + 1)
        if cursor in steps:
            return Decision(after, steps[cursor])
        return Decision(after, finished=True, summary="replied and notified")


class ExampleApp:
    """The example's :class:`~tether.testing.crash_harness.CrashApp`: one directory per run."""

    def __init__(self, workdir: Path, outbox: Callable[[Path], Adapter] = Outbox) -> None:
        self.workdir = Path(workdir)
        self.outbox = outbox  # builds the outbox adapter over a run's outbox directory
        keyring = self.workdir / "keyring.json"
        if not keyring.exists():  # the harness builds the app before any child starts
            self.workdir.mkdir(parents=True, exist_ok=True)
            Keyring.generate("crash-example").write_file(keyring)
        self.keyring = Keyring.from_file(keyring)

    def prepare(self, run_id: str) -> None:
        """A fresh tree holding the draft reply, and an empty outbox."""
        tree = self._home(run_id) / "tree"
        tree.mkdir(parents=True)
        (tree / "reply.txt").write_text(DRAFT)
        self.outbox(self._home(run_id) / "outbox")

    def runtime(self, store: Any, run_id: str, crash: CrashPlan) -> Runtime:
        """The run's runtime over ``store``, armed with ``crash``."""
        home = self._home(run_id)
        workspace = FileWorkspace(home / "tree", home / "journal", verifier_allowlist=[VERIFIER])
        adapters = Adapters(workspace, self.outbox(home / "outbox"))
        return Runtime(
            store=store,
            keyring=self.keyring,
            adapter=adapters,
            task=_task(adapters.namespace),
            policy=_POLICY,
            agent=ReplyAgent(),
            crash=crash,
        )

    def effects(self, run_id: str) -> dict[str, int]:
        """Writes the tree's journal recorded, and message files in the outbox."""
        home = self._home(run_id)
        # The journal is the workspace's own record of each write it applied,
        # kept beside the tree and outside tether's store.
        with FileWorkspace(home / "tree", home / "journal") as workspace:
            files = workspace.write_count()
        # One file per delivered message, whatever the adapter says of itself.
        messages = sum(1 for _ in (home / "outbox").glob("*.msg"))
        return {"file.write": files, MESSAGE_SEND.name: messages}

    def _home(self, run_id: str) -> Path:
        return self.workdir / "runs" / run_id


def app(workdir: Path) -> ExampleApp:
    """``--app tether.testing.crash_example:app``: the outbox dedupes and can be asked."""
    return ExampleApp(workdir)


def blind_app(workdir: Path) -> ExampleApp:
    """``--app tether.testing.crash_example:blind_app``: an outbox that can do neither."""
    return ExampleApp(workdir, functools.partial(Outbox, dedupe=False))


def _task(namespace: str) -> TaskSpec:
    initial = Sandbox({"reply.txt": DRAFT})  # fingerprints agree with the workspace's
    return TaskSpec.from_json(
        {
            "task_id": "crash-example",
            "task_version": "1",
            "allowed_kinds": ["file.write", MESSAGE_SEND.name],
            "allowed_paths": ["reply.txt", RECIPIENT],
            "permissions": ["workspace.write", "outbox.send"],
            "budgets": {"proposals": 10, "steps": 20, "wall_time_s": 3600, "cost": 10},
            "initial_environment": {
                "namespace": namespace,
                "state_fingerprint": initial.environment().state_fingerprint,
            },
            "verifier": {"argv": list(VERIFIER), "timeout_s": 60},
        }
    )


_POLICY = Policy.from_json(
    {
        "policy_id": "crash-example",
        "policy_version": "1",
        "kinds": {
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False},
            MESSAGE_SEND.name: {
                "risk": "low",
                "permission": "outbox.send",
                "needs_approval": False,
            },
        },
        "max_risk": "medium",
        "approval_ttl_s": 600,
    }
)
