"""What tether needs besides the function: the run's scope and rules, its keys, its store.

The function effect is the runtime's one adapter: ``open_ticket.adapter``
(or any other :class:`~tether.adapters.FunctionEffect`). Its environment is
its identity, so the task's initial environment is read from it.
"""

from __future__ import annotations

from pathlib import Path

import tether
from examples.own_function.tickets import KIND
from tether.adapters import FunctionEffect
from tether.runtime import CrashPlan
from tether.store import ContentStore


def task(adapter: FunctionEffect) -> tether.TaskSpec:
    """A run may open tickets, within small budgets; nothing to verify at the end."""
    env = adapter.environment()
    return tether.TaskSpec.from_json(
        {
            "task_id": "own-function-tickets",
            "task_version": "1",
            "allowed_kinds": [KIND],
            "allowed_paths": [],
            "permissions": ["tickets.open"],
            "budgets": {"proposals": 20, "steps": 40, "wall_time_s": 3600, "cost": 10},
            "initial_environment": {
                "namespace": env.namespace,
                "state_fingerprint": env.state_fingerprint,
            },
        }
    )


def policy() -> tether.Policy:
    """Opening a ticket is low risk and needs no person."""
    return tether.Policy.from_json(
        {
            "policy_id": "own-function",
            "policy_version": "1",
            "kinds": {KIND: {"risk": "low", "permission": "tickets.open", "needs_approval": False}},
            "max_risk": "low",
            "approval_ttl_s": 600,
        }
    )


def keyring(path: Path) -> tether.Keyring:
    """The key that seals the runs' checkpoints: made on first use, kept, never printed."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tether.Keyring.generate("own-function-1").write_file(path)
    return tether.Keyring.from_file(path)


def runtime(
    adapter: FunctionEffect,
    store: ContentStore,
    keys: tether.Keyring,
    crash: CrashPlan | None = None,
) -> tether.Runtime:
    """The runtime whose runs open tickets through ``adapter``'s body."""
    return tether.Runtime(
        store=store,
        keyring=keys,
        adapter=adapter,
        task=task(adapter),
        policy=policy(),
        crash=crash if crash is not None else CrashPlan(),
    )
