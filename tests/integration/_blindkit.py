"""A blind adapter on disk (not idempotent, not queryable) and a child process that runs it.

The adapter stands for a service that can neither deduplicate a request nor
be asked whether one landed (plain SMTP, a webhook without keys). Its files,
version and effect count live in one JSON file written atomically inside
:meth:`BlindOutbox.execute`, so a SIGKILL after the call still leaves the
effect counted, as the world would.

Run as ``python -m tests.integration._blindkit STAGE BASE [POINT HIT]``:
``start`` begins the run (armed to SIGKILL itself at the ``HIT``-th pass of
``POINT``), ``recover`` recovers it and runs it as far as it may go.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ScriptedAgent, finish, make_policy, make_task, write
from tether.adapters import Fence
from tether.core import EnvironmentState, Intent, Receipt
from tether.crypto import Keyring
from tether.runtime import CrashPlan, CrashPoint, Runtime
from tether.store import SQLiteStore
from tether.testing import Sandbox

RUN_ID = "blind"
INITIAL = Sandbox({"notes.txt": "draft\n"})  # the outbox before its first effect


class BlindOutbox(Sandbox):
    """A sandbox kept in one JSON file that never dedupes and cannot be asked by key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        saved: dict[str, Any] = (
            json.loads(path.read_text())
            if path.exists()
            else {"files": {"notes.txt": "draft\n"}, "version": 0, "writes": 0}
        )
        super().__init__(
            saved["files"],
            instance_id="outbox-1",
            idempotent=False,
            queryable=False,
            conditional_writes=False,
        )
        self._version = saved["version"]
        self._writes = saved["writes"]

    def execute(
        self, key: str, intent: Intent, prestate: EnvironmentState, fence: Fence | None = None
    ) -> Receipt:
        receipt = super().execute(key, intent, prestate, fence)
        self._save()  # the effect is in the world before the caller hears of it
        return receipt

    def _save(self) -> None:
        data = {"files": self.files, "version": self._version, "writes": self.write_count()}
        temp = self.path.with_suffix(".tmp")
        with open(temp, "w") as handle:
            json.dump(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, self.path)


def paths(base: Path) -> tuple[Path, Path, Path]:
    """The store, the adapter's file and the keyring under ``base``."""
    return base / "tether.sqlite", base / "outbox.json", base / "keyring.json"


def prepare(base: Path) -> None:
    """A fresh keyring; the adapter's file appears with its first effect."""
    Keyring.generate("k1").write_file(paths(base)[2])


def runtime(base: Path, store: SQLiteStore, crash: CrashPlan | None = None) -> Runtime:
    """The run: send one notification (a write), then finish."""
    _, outbox_path, keyring_path = paths(base)
    outbox = BlindOutbox(outbox_path)
    return Runtime(
        store=store,
        keyring=Keyring.from_file(keyring_path),
        adapter=outbox,
        task=make_task(INITIAL.environment().state_fingerprint),
        policy=make_policy(),
        agent=ScriptedAgent([write("notes.txt", "notified\n"), finish]),
        crash=crash or CrashPlan(),
        worker=f"pid-{os.getpid()}",
    )


def effects(base: Path) -> int:
    """How many times the notification reached the world."""
    outbox_path = paths(base)[1]
    return json.loads(outbox_path.read_text())["writes"] if outbox_path.exists() else 0


def main(argv: list[str]) -> int:
    stage, base = argv[0], Path(argv[1])
    with SQLiteStore(paths(base)[0]) as store:
        if stage == "start":
            plan = CrashPlan(CrashPoint(argv[2]), nth=int(argv[3]), mode="kill")
            runtime(base, store, plan).start(RUN_ID).run()
        else:
            rt = runtime(base, store)
            rt.lease_ttl_s = 30
            session = rt.start_or_recover(RUN_ID)
            try:
                session.run()
            finally:
                session.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
