"""The demo: a scripted agent repairs a file in a real workspace and proves it with a test.

Used by ``tether demo`` and by the crash tests, so both exercise the same
real path: a SQLite store on disk, a :class:`FileWorkspace` directory with its
journal outside the tree, and a verifier that runs ``python -m unittest``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from tether.adapters import Adapter, FileWorkspace
from tether.core import Observation, Policy, Proposal, TaskSpec, TetherError
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import Agent, AgentContext, CrashPlan, Decision, Runtime
from tether.store import SQLBase, SQLiteStore, open_store

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

SCENARIOS = ("repair", "approval", "conflict", "support-desk", "notify")
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class DemoPathError(TetherError):
    """A path given to the demo already holds something the demo would overwrite or count.

    ``path`` is the one refused; the demo has written nothing when this is raised.
    """

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path


class DemoCrashPointError(TetherError):
    """The armed crash never fired: the run finished having passed ``point`` only ``passed`` times.

    ``passed`` is ``None`` when the run did not say (it failed instead of finishing).
    """

    def __init__(self, point: str, hit: int, passed: int | None, message: str) -> None:
        super().__init__(message)
        self.point = point
        self.hit = hit
        self.passed = passed


def policy_doc(scenario: str) -> dict[str, object]:
    """The demo policy; the approval scenario makes every file write need a person's approval."""
    return {
        "policy_id": "demo",
        "policy_version": "1",
        "kinds": {
            "file.read": {"risk": "low", "permission": "workspace.read", "needs_approval": False},
            "file.write": {
                "risk": "low",
                "permission": "workspace.write",
                "needs_approval": scenario == "approval",
            },
        },
        "max_risk": "medium",
        "approval_ttl_s": 900,
    }


class RepairAgent:
    """Reads calc.py, writes the fix if it is not there, then finishes.

    Deterministic from its context and what it read: a recovered run picks up
    at the same plan cursor and sees the same read result.
    """

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        if context.plan_cursor == 0:
            note = {"role": "agent", "text": "reading calc.py"}
            return Decision(
                context=AgentContext((*context.messages, note), context.memory, 1),
                proposal=Proposal(action_id="read-calc", kind="file.read", target="calc.py"),
            )
        read = observation.result("read-calc")
        if context.plan_cursor == 1 and (read is None or read.data.get("text") != FIXED):
            note = {"role": "agent", "text": "add() subtracts; rewriting calc.py"}
            return Decision(
                context=AgentContext((*context.messages, note), context.memory, 2),
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
            context=AgentContext((*context.messages, note), context.memory, 3),
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
    store_url: str | None = None

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


def require_fresh(paths: DemoPaths) -> None:
    """Refuse, before anything is written, paths that already hold a demo's or anyone's files.

    The demo seeds its workspace by overwriting files in it, and reports the
    workspace's own write count from the journal beside it: files already
    there would be clobbered, and an earlier demo's journal would add its
    writes to this run's.
    """
    if paths.db.exists():
        raise DemoPathError(paths.db, f"{paths.db} already exists; give the demo a fresh --store")
    ws = paths.workspace
    try:
        if (ws.exists() or ws.is_symlink()) and not ws.is_dir():
            raise DemoPathError(
                ws, f"workspace {ws} is not a directory; give --workspace a new or empty directory"
            )
        if ws.exists() and any(ws.iterdir()):
            raise DemoPathError(
                ws,
                f"workspace {ws} already holds files, which the demo would overwrite; "
                "give --workspace a new or empty directory",
            )
    except OSError as exc:
        raise DemoPathError(ws, f"workspace {ws} cannot be read: {exc}") from exc
    if paths.journal.exists():
        raise DemoPathError(
            paths.journal,
            f"{paths.journal} is the journal of an earlier demo's workspace named {ws.name!r}, "
            "whose writes would count as this run's; give --workspace another name",
        )


#: What the demo handles itself (raising to unwind); a child must not inherit that.
_HELD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL a demo child when the demo dies (Linux).

    The demo stops its children in ``finally`` blocks, which run on an error,
    Ctrl-C or SIGTERM; a SIGKILLed demo runs nothing, and only the kernel can
    stop what it started. ``None`` where ``prctl`` is not available. Start the
    child inside :func:`signals_held`: the child then gives the demo's signals
    their default meaning before it lets any arrive.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def preexec() -> None:
        # Runs in the child between fork and exec; the setting survives exec.
        for signum in _HELD:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() != parent:
            os._exit(1)  # the demo died before the kernel was told: follow it now

    return preexec


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold the demo's signals while it forks a child (Linux), delivering them after.

    Between fork and exec the child runs Python code with the demo's handlers,
    which raise to unwind the demo: a signal landing there printed a stray
    traceback from the child. Held, it reaches the demo right after the fork,
    and the child (see :func:`die_with_parent`) resets and releases them.
    """
    if not sys.platform.startswith("linux"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


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
        "allowed_kinds": ["file.read", "file.write"],
        "allowed_paths": ["calc.py"],
        "permissions": ["workspace.read", "workspace.write"],
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


def open_demo_store(paths: DemoPaths) -> SQLBase:
    """The demo's store: ``paths.store_url`` (e.g. PostgreSQL) or the SQLite file."""
    return open_store(paths.store_url) if paths.store_url else SQLiteStore(paths.db)


def runtime(
    paths: DemoPaths,
    adapter: Adapter,
    crash: CrashPlan | None = None,
    *,
    store: SQLBase | None = None,
    lease_ttl_s: float | None = None,
    agent: Agent | None = None,
) -> Runtime:
    """A runtime over the demo's files; ``paths.marks`` puts the mark in its own database.

    ``adapter`` and ``agent`` default to nothing: the repair scenario passes its
    workspace, the support desk its three adapters and its own agent.
    """
    store = store if store is not None else open_demo_store(paths)
    marks = SQLiteStore(paths.marks) if paths.marks is not None else None
    return Runtime(
        store=store,
        marks=marks,
        keyring=keyring(paths),
        adapter=adapter,
        task=TaskSpec.from_json(paths.task.read_bytes()),
        policy=Policy.from_json(paths.policy.read_bytes()),
        agent=agent if agent is not None else RepairAgent(),
        crash=crash or CrashPlan(),
        worker=f"pid-{os.getpid()}",
        trust=TrustRoots.from_file(paths.trust) if paths.trust.exists() else None,
        lease_ttl_s=lease_ttl_s,
    )


def run_workspace(paths: DemoPaths, run_id: str) -> DemoPaths:
    """Paths whose workspace is ``home/runs/RUN`` (one per run, for many workers)."""
    runs = paths.home / "runs"
    return replace(paths, workspace=runs / run_id, journal=runs / f"{run_id}.journal")


def seed_run(paths: DemoPaths, run_id: str) -> DemoPaths:
    """A fresh workspace for ``run_id`` with the buggy file, under ``home/runs``."""
    mine = run_workspace(paths, run_id)
    mine.workspace.mkdir(parents=True, exist_ok=True)
    (mine.workspace / "calc.py").write_text(BUGGY)
    (mine.workspace / "test_calc.py").write_text(TEST)
    return mine


def worker_factory(store: SQLBase, run_id: str, worker: str) -> Runtime:
    """``tether worker --app tether._demo:worker_factory`` with ``TETHER_DEMO_HOME`` set.

    Runs seeded with :func:`seed_run` get their own workspace; the demo run uses
    the demo's workspace. Any other run id with no workspace yet (``tether start``
    creating it) gets one seeded with the buggy file: a run that exists in the
    store but lost its workspace then fails closed on the new journal's identity.
    """
    home = os.environ.get("TETHER_DEMO_HOME")
    if not home:
        raise TetherError("set TETHER_DEMO_HOME to the demo's directory")
    paths = DemoPaths.under(Path(home))
    mine = run_workspace(paths, run_id)
    if mine.workspace.exists():
        paths = mine
    elif run_id != RUN_ID:
        paths = seed_run(paths, run_id)
    rt = runtime(paths, workspace(paths), store=store)
    rt.worker = worker
    return rt


def _json(value: object) -> str:
    from tether.core import canonical_bytes

    return canonical_bytes(value).decode("utf-8")
