"""Crash-harness apps: a reply edited, then one ticket posted under a named ServiceProfile preset.

The ticket service is the reference effects service, started by the test and
switched into the behaviour the preset describes (``TETHER_PRESET_SERVICE``
names its URL); every run of a harness shares it, and each run's ticket
carries its run id, so runs are counted apart. Factories: ``ietf``,
``stripe``, ``conflict`` (each a preset) and ``nothing`` (``HttpEffect(url)``
with no profile).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from tether.adapters import (
    CONFLICT_409,
    IETF_DRAFT,
    STRIPE_REPLAY,
    Adapters,
    FileWorkspace,
    HttpEffect,
    ServiceProfile,
)
from tether.core import Observation, Policy, Proposal, TaskSpec
from tether.crypto import Keyring
from tether.runtime import AgentContext, CrashPlan, Decision, Runtime
from tether.testing import Sandbox

SERVICE_ENV = "TETHER_PRESET_SERVICE"
DRAFT = "draft\n"
REPLY = "A technician is on the way.\n"
VERIFIER = (
    "python",
    "-c",
    "import pathlib, sys; sys.exit('on the way' not in pathlib.Path('reply.txt').read_text())",
)


class TicketAgent:
    """Edits the reply, posts the run's ticket, finishes: deterministic from the plan cursor."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        cursor = context.plan_cursor
        version = observation.environment.version
        title = {"title": f"printer on fire [{self.run_id}]"}
        steps = {
            0: Proposal("edit-reply", "file.write", "reply.txt", {"content": REPLY}, version),
            1: Proposal("open-ticket", "http.post", "tickets", {"json": title}, version),
        }
        after = AgentContext((*context.messages, {"step": cursor}), context.memory, cursor + 1)
        if cursor in steps:
            return Decision(after, steps[cursor])
        return Decision(after, finished=True, summary="replied, ticket opened")


class PresetApp:
    """prepare / runtime / effects, as :class:`~tether.testing.crash_harness.CrashApp`."""

    def __init__(self, workdir: Path, profile: ServiceProfile | None) -> None:
        self.workdir = Path(workdir)
        self.profile = profile
        self.url = os.environ[SERVICE_ENV]
        keyring = self.workdir / "keyring.json"
        if not keyring.exists():  # the harness makes the app before any child does
            self.workdir.mkdir(parents=True, exist_ok=True)
            Keyring.generate("preset-app").write_file(keyring)
        self.keyring = Keyring.from_file(keyring)

    def prepare(self, run_id: str) -> None:
        tree = self._home(run_id) / "tree"
        tree.mkdir(parents=True)
        (tree / "reply.txt").write_text(DRAFT)

    def runtime(self, store: Any, run_id: str, crash: CrashPlan) -> Runtime:
        home = self._home(run_id)
        workspace = FileWorkspace(home / "tree", home / "journal", verifier_allowlist=[VERIFIER])
        http = HttpEffect(self.url, profile=self.profile, timeout_s=5)
        adapters = Adapters(workspace, http)
        return Runtime(
            store=store,
            keyring=self.keyring,
            adapter=adapters,
            task=_task(adapters.namespace),
            policy=_POLICY,
            agent=TicketAgent(run_id),
            crash=crash,
        )

    def effects(self, run_id: str) -> dict[str, int]:
        """Writes the workspace journaled, and the run's tickets in the service's own database."""
        home = self._home(run_id)
        with FileWorkspace(home / "tree", home / "journal") as workspace:
            writes = workspace.write_count()
        return {"file.write": writes, "http.post": len(tickets(self.url, run_id))}

    def _home(self, run_id: str) -> Path:
        return self.workdir / "runs" / run_id


def tickets(url: str, run_id: str) -> list[dict[str, Any]]:
    """The service's tickets whose title names ``run_id``."""
    listed = httpx.get(f"{url}/tickets", timeout=10).json()["tickets"]
    return [t for t in listed if run_id in json.loads(t["body"]).get("title", "")]


def ietf(workdir: Path) -> PresetApp:
    """The IETF draft preset, against a service that follows the draft (no look-up declared)."""
    return PresetApp(workdir, IETF_DRAFT)


def stripe(workdir: Path) -> PresetApp:
    """Stripe-style replay."""
    return PresetApp(workdir, STRIPE_REPLAY)


def conflict(workdir: Path) -> PresetApp:
    """409 for a key already held; asked again once, briefly, so a child never waits long."""
    return PresetApp(workdir, replace(CONFLICT_409, in_flight_retries=1, in_flight_wait_s=0.05))


def nothing(workdir: Path) -> PresetApp:
    """No profile at all: ``HttpEffect(url)``."""
    return PresetApp(workdir, None)


def _task(namespace: str) -> TaskSpec:
    initial = Sandbox({"reply.txt": DRAFT})  # fingerprints agree with the workspace's
    return TaskSpec.from_json(
        {
            "task_id": "preset-app",
            "task_version": "1",
            "allowed_kinds": ["file.write", "http.post"],
            "allowed_paths": ["reply.txt", "tickets"],
            "permissions": ["workspace.write", "service.write"],
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
        "policy_id": "preset-app",
        "policy_version": "1",
        "kinds": {
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False},
            "http.post": {"risk": "low", "permission": "service.write", "needs_approval": False},
        },
        "max_risk": "medium",
        "approval_ttl_s": 600,
    }
)
