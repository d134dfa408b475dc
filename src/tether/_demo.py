"""The demo: a scripted agent repairs a file in a real workspace and proves it with a test.

Used by ``tether demo`` and by the crash tests, so both exercise the same
real path: a SQLite store on disk, a :class:`FileWorkspace` directory with its
journal outside the tree, and a verifier that runs ``python -m unittest``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tether.adapters import FileWorkspace, Observation
from tether.core import Policy, Proposal, TaskSpec
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import AgentContext, CrashPlan, Decision, Runtime
from tether.store import SQLiteStore

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class AddTest(unittest.TestCase):\n"
    "    def test_add(self):\n"
    "        self.assertEqual(add(2, 3), 5)\n\n\n"
    'if __name__ == "__main__":\n'
    "    unittest.main()\n"
)
VERIFIER = ("python", "-m", "unittest", "-q", "test_calc")
RUN_ID = "demo-run"

SCENARIOS = ("repair", "approval", "conflict")


def policy_doc(scenario: str) -> dict[str, object]:
    """The demo policy; the approval scenario makes every file write need a person's approval."""
    return {
        "policy_id": "demo",
        "policy_version": "1",
        "kinds": {
            "file.write": {
                "risk": "low",
                "permission": "workspace.write",
                "needs_approval": scenario == "approval",
            }
        },
        "max_risk": "medium",
        "approval_ttl_s": 900,
    }


class RepairAgent:
    """Reads calc.py, proposes the fix, then finishes. Deterministic from its context."""

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        files = observation.data.get("files", {})
        if context.plan_cursor == 0 and files.get("calc.py") != FIXED:
            note = {"role": "agent", "text": "add() subtracts; rewriting calc.py"}
            return Decision(
                context=AgentContext((*context.messages, note), context.memory, 1),
                proposal=Proposal(
                    action_id="fix-calc",
                    kind="file.write",
                    target="calc.py",
                    args={"content": FIXED},
                    based_on_version=observation.environment.version,
                    cost=1,
                ),
            )
        note = {"role": "agent", "text": "calc.py is fixed; asking the verifier"}
        return Decision(
            context=AgentContext((*context.messages, note), context.memory, 2),
            finished=True,
            summary="calc.add repaired",
        )


@dataclass(frozen=True, slots=True)
class DemoPaths:
    """Where the demo keeps its files."""

    db: Path
    workspace: Path
    journal: Path
    keyring: Path
    task: Path
    policy: Path
    marks: Path | None = None

    @property
    def home(self) -> Path:
        return self.db.parent

    @property
    def trust(self) -> Path:
        """Trust roots (public halves only) of the demo's approver and reviewer."""
        return self.home / "demo-trust.json"

    def signer_key(self, role: str) -> Path:
        """The private key file of the demo's approver or reviewer (mode 0600)."""
        return self.home / f"demo-{role}.key"

    @classmethod
    def under(
        cls,
        base: Path,
        db: Path | None = None,
        workspace: Path | None = None,
        marks: Path | None = None,
    ) -> DemoPaths:
        db = db if db is not None else base / "tether.sqlite"
        workspace = workspace if workspace is not None else base / "workspace"
        home = db.parent
        return cls(
            db=db,
            workspace=workspace,
            journal=home / (workspace.name + ".journal"),
            keyring=home / "demo-keyring.json",
            task=home / "demo-task.json",
            policy=home / "demo-policy.json",
            marks=marks,
        )


def prepare(paths: DemoPaths, scenario: str = "repair") -> None:
    """Seed the workspace, keys (mode 0600), trust roots, and the task and policy files."""
    paths.workspace.mkdir(parents=True, exist_ok=True)
    paths.db.parent.mkdir(parents=True, exist_ok=True)
    (paths.workspace / "calc.py").write_text(BUGGY)
    (paths.workspace / "test_calc.py").write_text(TEST)
    if not paths.keyring.exists() and not os.environ.get("TETHER_KEYRING_FILE"):
        Keyring.generate("demo-1").write_file(paths.keyring)
    with workspace(paths) as ws:
        fingerprint = ws.environment().state_fingerprint
    task = {
        "task_id": "repair-calc",
        "task_version": "1",
        "allowed_kinds": ["file.write"],
        "allowed_paths": ["calc.py"],
        "permissions": ["workspace.write"],
        "budgets": {"proposals": 5, "steps": 10, "wall_time_s": 600, "cost": 10},
        "initial_environment": {"namespace": "file-workspace", "state_fingerprint": fingerprint},
        "verifier": {"argv": list(VERIFIER), "timeout_s": 60},
    }
    TaskSpec.from_json(_json(task))  # the demo's own task must pass the strict loader
    paths.task.write_text(_json(task))
    paths.policy.write_text(_json(policy_doc(scenario)))
    if not paths.trust.exists():
        approver = Signer.generate("demo-approver", "approver")
        reviewer = Signer.generate("demo-reviewer", "reviewer")
        approver.write_file(paths.signer_key("approver"))
        reviewer.write_file(paths.signer_key("reviewer"))
        paths.trust.write_text(_json({"signers": [approver.trust_root(), reviewer.trust_root()]}))


def keyring(paths: DemoPaths) -> Keyring:
    if os.environ.get("TETHER_KEYRING_FILE") or os.environ.get("TETHER_KEYRING"):
        return Keyring.from_environ()
    return Keyring.from_file(paths.keyring)


def workspace(paths: DemoPaths) -> FileWorkspace:
    return FileWorkspace(paths.workspace, paths.journal, verifier_allowlist=[VERIFIER])


def runtime(paths: DemoPaths, ws: FileWorkspace, crash: CrashPlan | None = None) -> Runtime:
    """A runtime over the demo's files; ``paths.marks`` puts the mark in its own database."""
    store = SQLiteStore(paths.db)
    marks = SQLiteStore(paths.marks) if paths.marks is not None else None
    return Runtime(
        store=store,
        marks=marks,
        keyring=keyring(paths),
        adapter=ws,
        task=TaskSpec.from_json(paths.task.read_bytes()),
        policy=Policy.from_json(paths.policy.read_bytes()),
        agent=RepairAgent(),
        crash=crash or CrashPlan(),
        worker=f"pid-{os.getpid()}",
        trust=TrustRoots.from_file(paths.trust) if paths.trust.exists() else None,
    )


def _json(value: object) -> str:
    from tether.core import canonical_bytes

    return canonical_bytes(value).decode("utf-8")
