"""A child process for the function-effect attack tests: it acts, and may die (SIGKILL) or stop.

``python -m tests.integration._fnchild DIR SCENARIO STAGE``: ``DIR`` holds the run's
SQLite store (``runs.sqlite``), the keyring and the world (``world.sqlite``, one row
per effect the world saw, whoever made it). ``DIE=<tag>`` kills the process with
SIGKILL right after the world recorded an effect tagged ``<tag>``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import tether
from tether import effects
from tether.core import new_effect_decision
from tether.core._compensation import EffectRecord
from tether.crypto import Keyring, Signer, TrustRoots
from tether.runtime import Runtime
from tether.store import SQLiteStore

KIND = "pay.charge"


def world(root: Path) -> sqlite3.Connection:
    """The world's own record of what happened (a real SQLite file, shared by processes)."""
    conn = sqlite3.connect(root / "world.sqlite", timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS fx (tag TEXT, key TEXT, body TEXT)")
    return conn


def record(root: Path, tag: str, key: str, body: Any) -> None:
    """The world performs one effect; ``DIE=tag`` kills this process right after it."""
    with world(root) as conn:
        conn.execute("INSERT INTO fx VALUES (?, ?, ?)", (tag, key, json.dumps(body)))
    if os.environ.get("DIE") == tag:
        os.kill(os.getpid(), signal.SIGKILL)


def seen(root: Path, tag: str) -> list[tuple[str, str]]:
    """The effects tagged ``tag`` the world saw: (key, body) each."""
    with world(root) as conn:
        return [(k, b) for k, b in conn.execute("SELECT key, body FROM fx WHERE tag = ?", (tag,))]


def runtime(
    root: Path, adapter: Any, *, gated: bool = False, store: Any = None, **extra: Any
) -> Runtime:
    """A runtime over ``root``'s SQLite store whose one adapter is ``adapter``.

    ``gated``: the policy needs a person's approval of every kind; ``store``:
    another store object than a fresh one over ``runs.sqlite``.
    """
    keyfile = root / "keys.json"
    if not keyfile.exists():
        Keyring.generate("fnchild-1").write_file(keyfile)
    env = adapter.environment()
    kinds = [k.name for k in adapter.kinds]
    task = tether.TaskSpec.from_json(
        {
            "task_id": "fnchild",
            "task_version": "1",
            "allowed_kinds": kinds,
            "allowed_paths": [],
            "permissions": ["p"],
            "budgets": {"proposals": 50, "steps": 100, "wall_time_s": 3600, "cost": 10},
            "initial_environment": {
                "namespace": env.namespace,
                "state_fingerprint": env.state_fingerprint,
            },
        }
    )
    policy = tether.Policy.from_json(
        {
            "policy_id": "fnchild",
            "policy_version": "1",
            "kinds": {
                k: {"risk": "low", "permission": "p", "needs_approval": gated} for k in kinds
            },
            "max_risk": "low",
            "approval_ttl_s": 600,
        }
    )
    return Runtime(
        store=SQLiteStore(root / "runs.sqlite") if store is None else store,
        keyring=Keyring.from_file(keyfile),
        adapter=adapter,
        task=task,
        policy=policy,
        **extra,
    )


def compensation(root: Path, declared: str, stage: str) -> None:
    """Charge, then a reviewer orders the refund (the world does not deduplicate refunds)."""
    reviewer = Signer.from_json((root / "reviewer.json").read_text())

    def find(key: str) -> dict[str, Any] | None:
        rows = [b for k, b in seen(root, "charge") if k == key]
        return {"charge": rows[0]} if rows else None

    def refund(effect: Any, idempotency_key: str) -> dict[str, Any]:
        record(root, "refund", idempotency_key, effect.idempotency_key)
        return {"refunded": effect.idempotency_key}

    proofs: dict[str, Any] = {
        "idempotent": {"idempotent": True},
        "final": {"lookup": find, "absent_is_final": True},
    }[declared]

    @tether.effect(KIND, target=None, compensate=refund, **proofs)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(root, "charge", idempotency_key, cents)
        return {"charged": cents}

    rt = runtime(root, charge.adapter, trust=TrustRoots.of(reviewer.trust_root()))
    with effects.run(rt, "r") as run:
        if stage == "charge":
            print(charge(500).outcome)
            return
        state = run.session.state
        (entry,) = [e for e in rt.store.ledger("r") if e.status.value == "committed"]
        found = EffectRecord.find(rt.checkpointer.verified_ledger(state), entry.idempotency_key)
        if found is None:
            raise SystemExit("no committed effect to undo")
        now = datetime.now(UTC)
        body = new_effect_decision(
            state,
            found,
            reviewer.signer_id,
            "compensate",
            issued_at=now,
            expires_at=now + timedelta(minutes=5),
            nonce=secrets.token_hex(16),
        )
        print(run.session.decide_effect(reviewer.sign(body)).kind.value)


def takeover(root: Path, declared: str, stage: str) -> None:
    """A charge whose body waits (``SLOW``) before it sends; leases on, ttl 1 s.

    ``fenced``: the world refuses a fencing token lower than the highest it saw.
    """

    def find(key: str) -> dict[str, Any] | None:
        rows = [b for k, b in seen(root, "charge") if k == key]
        return {"charge": rows[0]} if rows else None

    fenced = declared == "fenced"

    @tether.effect(KIND, target=None, lookup=find, absent_is_final=True, fencing=fenced)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(root, "entered", idempotency_key, cents)
        if os.environ.get("SLOW"):
            import time

            time.sleep(3)
        fence = tether.current_fence()
        if fence is None:
            raise SystemExit("leases are on: the body must see its fence")
        highest = max((int(b) for _, b in seen(root, "fence")), default=0)
        if fenced and fence.lease_version < highest:
            raise RuntimeError("stale fence refused")  # the world refuses the older worker
        record(root, "fence", idempotency_key, fence.lease_version)
        record(root, "charge", idempotency_key, cents)
        return {"charged": cents}

    with effects.run(runtime(root, charge.adapter, lease_ttl_s=1), "r"):
        print(charge(500).outcome)


def loop(root: Path, declared: str, stage: str) -> None:
    """On one event loop: an async charge's body in flight, then a sync call of the same run.

    Prints one JSON line: what the sync call made while the body was held open
    raised (or returned), and what the other calls returned.
    """
    import asyncio

    from tether.adapters import Adapters

    entered: list[asyncio.Event] = []
    release: list[asyncio.Event] = []

    @tether.effect(KIND, target=None, idempotent=True)
    async def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        entered[0].set()
        await release[0].wait()  # held open, on this loop, while the sync call comes
        record(root, "charge", idempotency_key, cents)
        return {"charged": cents}

    @tether.effect("pay.note", target=None, idempotent=True)
    def note(text: str, idempotency_key: str) -> dict[str, Any]:
        record(root, "note", idempotency_key, text)
        return {"noted": text}

    rt = runtime(root, Adapters(charge.adapter, note.adapter))

    async def main() -> dict[str, Any]:
        entered.append(asyncio.Event())
        release.append(asyncio.Event())
        async with effects.run_async(rt, "r"):
            task = asyncio.create_task(charge(500))
            await entered[0].wait()  # the charge's worker holds the run, its body waits here
            try:
                during = str(note("during").outcome)
            except tether.TetherError as exc:
                during = type(exc).__name__
            release[0].set()
            charged = str((await task).outcome)
            after = str(note("after").outcome)  # nothing in flight: a sync call goes through
        # A sync block on the loop's thread ends while its call's body waits on the loop.
        entered[0], release[0] = asyncio.Event(), asyncio.Event()
        with effects.run(rt, "r2"):
            task = asyncio.create_task(charge(700))  # made inside the block: it acts on r2
            await entered[0].wait()
        release[0].set()  # the block ended above without waiting: the loop still runs
        closed = str((await task).outcome)
        async with effects.run_async(rt, "r2"):  # the ended block let the run go
            again = str((await charge(700)).outcome)
        return {"during": during, "charge": charged, "after": after, "closed": closed,
                "again": again}  # fmt: skip

    print(json.dumps(asyncio.run(main())))


def two(root: Path, declared: str, stage: str) -> None:
    """Two processes open run r at once; ``leased`` gives every runtime a lease.

    The charge is ``idempotent`` (the world is told the key). With ``HOLD`` set
    the body waits, after it entered, until the file ``hold`` is gone. Prints
    the call's outcome, or the name of the error it raised.
    """
    import time

    hold = root / "hold"

    @tether.effect(KIND, target=None, idempotent=True)
    def charge(cents: int, idempotency_key: str) -> dict[str, Any]:
        record(root, "entered", idempotency_key, os.getpid())
        deadline = time.monotonic() + 120
        while os.environ.get("HOLD") and hold.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        record(root, "charge", idempotency_key, cents)
        return {"charged": cents}

    ttl = 30.0 if declared == "leased" else None
    try:
        with effects.run(runtime(root, charge.adapter, lease_ttl_s=ttl), "r"):
            print(charge(500).outcome)
    except tether.TetherError as exc:
        print(type(exc).__name__)


def main() -> None:
    """Run one scenario's stage in this process."""
    root, scenario, stage = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    name, _, declared = scenario.partition(":")
    {"compensation": compensation, "takeover": takeover, "loop": loop, "two": two}[name](
        root, declared, stage
    )


if __name__ == "__main__":
    main()
