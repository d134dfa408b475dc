"""The guarded loop as an app for tether's crash harness: every crash window of every effect.

    tether crashtest --app examples.plain_loop.crash_app:app

(from the repository root, with the ticket service and the mail server
running and ``PLAIN_LOOP_TICKETS_URL``, ``PLAIN_LOOP_SMTP_PORT`` and
``PLAIN_LOOP_MAILDIR`` naming them; ``tests/integration/test_plain_loop_example.py``
does exactly that). Each harness run is one case with its own workspace; the
case id (the run id) is in its ticket's title and its email's subject, so
runs sharing one service and one mailbox are counted apart.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import tether
from examples.plain_loop import guarded
from examples.plain_loop.desk import DRAFT, Config, request
from examples.plain_loop.run_demo import world
from examples.plain_loop.tether_config import runtime
from tether.adapters import FileWorkspace
from tether.runtime import CrashPlan
from tether.store import ContentStore


class PlainLoopApp:
    """prepare / runtime / drive / effects, as :class:`~tether.testing.crash_harness.LoopCrashApp`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.services = Config.from_env()
        # One key for every run under workdir; the harness makes this app
        # before any child does, so the children find it written.
        self.keys_file = self.workdir / "keyring.json"
        if not self.keys_file.exists():
            tether.Keyring.generate("plain-loop-crash").write_file(self.keys_file)

    def config(self, run_id: str) -> Config:
        """The services shared by all runs; a workspace and tether state of the run's own."""
        home = self.workdir / "runs" / run_id
        return replace(self.services, workspace=home / "workspace", state=home / "tether")

    def prepare(self, run_id: str) -> None:
        workspace = self.config(run_id).workspace
        workspace.mkdir(parents=True)
        (workspace / "reply.txt").write_text(DRAFT)

    def runtime(self, store: ContentStore, run_id: str, crash: CrashPlan) -> tether.Runtime:
        keys = tether.Keyring.from_file(self.keys_file)
        return runtime(self.config(run_id), store=store, keys=keys, crash=crash)

    def drive(self, runtime: tether.Runtime, run_id: str) -> None:
        """``guarded.main``'s body for the case ``run_id``; a case already ended is left alone."""
        with tether.effects.run(runtime, run_id) as run:
            if not run.phase.terminal:
                guarded.agent_loop(request(run_id))
                run.finish("customer answered")

    def world(self, run_id: str) -> dict[str, Any]:
        """The reply file, the case's ticket titles and email subjects, from the systems."""
        return world(self.config(run_id), run_id)

    def effects(self, run_id: str) -> dict[str, int]:
        """Writes the workspace journaled, tickets and emails the systems hold for the case."""
        config = self.config(run_id)
        with FileWorkspace(config.workspace, config.state / "journal") as workspace:
            writes = workspace.write_count()
        seen = self.world(run_id)
        return {
            "file.write": writes,
            "http.post": len(seen["tickets"]),
            "email.send": len(seen["emails"]),
        }


def app(workdir: Path) -> PlainLoopApp:
    """The harness's factory: ``examples.plain_loop.crash_app:app``."""
    return PlainLoopApp(workdir)
