"""A child process that opens run ``r`` WITHOUT a lease and charges once (see ``test_run_busy``).

``python -m tests.integration._livechild DIR [STORE_URL]``: ``DIR`` holds the
keyring and the world (``world.sqlite``, see ``_fnchild``); the run's store is
``DIR/runs.sqlite`` unless ``STORE_URL`` names another. The charge's body
records ``entered``, waits for the file ``DIR/go``, records ``charge``, then
waits for ``DIR/done`` (the test SIGKILLs it there, its receipt unrecorded);
with ``HOLD_S=<seconds>`` it sleeps that long instead and charges.
The charge is found by key (``lookup``, an absence final), so a second
process that recovered the run while the first is in the body would find
nothing yet and charge again: the race an outside attacker won 10 of 30 times.

Prints one JSON line: ``{"outcome": ...}``, or ``{"busy": message}`` and exit
code 3 when the run is open in another process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import tether
from tests.integration._fnchild import KIND, record, runtime, seen
from tether import effects
from tether.core import RunBusyError
from tether.store import open_store

#: Exit code of a child refused because another process has the run open.
BUSY = 3


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.01)


def main(argv: list[str]) -> int:
    root = Path(argv[1])
    url = argv[2] if len(argv) > 2 else None

    def find(key: str) -> dict[str, Any] | None:
        rows = [b for k, b in seen(root, "charge") if k == key]
        return {"charged": json.loads(rows[0])} if rows else None  # what the body returned

    hold_s = os.environ.get("HOLD_S")

    @tether.effect(KIND, target=None, lookup=find, absent_is_final=True)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(root, "entered", idempotency_key, cents)
        if hold_s is not None:  # a service that takes this long (the measurement's race)
            time.sleep(float(hold_s))
            record(root, "charge", idempotency_key, cents)
            return {"charged": cents}
        _wait_for(root / "go")
        record(root, "charge", idempotency_key, cents)
        _wait_for(root / "done")
        return {"charged": cents}

    store = None if url is None else open_store(url)
    rt = runtime(root, charge.adapter, store=store)  # no lease_ttl_s: the default
    try:
        with effects.run(rt, "r"):
            outcome = charge(500).outcome
    except RunBusyError as exc:
        print(json.dumps({"busy": str(exc), "run_id": exc.run_id}), flush=True)
        return BUSY
    print(json.dumps({"outcome": str(outcome)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
