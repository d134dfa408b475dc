"""A simulated process: the real runtime, on simulated time, and the rules it runs under.

:class:`SimRuntime` is the real :class:`~tether.runtime.Runtime` whose sessions
have no heartbeat thread (a source of wall-clock nondeterminism); :func:`rules`
builds the task and the policies (the first, a looser and a stricter one) a
simulated run is started and judged under.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from tether.core import Policy, TaskSpec
from tether.crypto import Keyring
from tether.runtime import RunSession, Runtime, Worker
from tether.testing.simulate._scenario import Scenario

#: Every simulated process's lease ttl, in simulated seconds.
LEASE_TTL_S = 30.0
#: The deployment's checkpoint key (one per Python process: simulations share it).
KEYRING = Keyring.generate("sim")


class _Still:
    """A heartbeat that never runs: simulated steps take no simulated time.

    The real heartbeat renews a lease from a thread polling the wall clock,
    a source of nondeterminism the simulator must own; in a simulation no
    time passes inside a step, so the step's own ``keep()`` renews exactly
    when the real one would (a third of the ttl, by the simulated clock).
    """

    failure = None

    def busy(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def stop(self) -> None:
        return None


class SimRuntime(Runtime):
    """The real runtime, its sessions without a heartbeat thread (see :class:`_Still`)."""

    def start(self, run_id: str | None = None, context: Any = None) -> RunSession:
        return _still(super().start(run_id, context))

    def recover(self, run_id: str, lease: Any = None, *, admission: Any = None) -> RunSession:
        return _still(super().recover(run_id, lease, admission=admission))


class SimWorker(Worker):
    """The real worker; each failure it backs off or parks is shown to the judge first.

    A drive swallows any exception (it defers the run, or parks it): tether's
    own integrity errors would pass unseen without ``failed``.
    """

    def __init__(self, *args: Any, failed: Callable[[BaseException], None], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.failed = failed

    def _failed(self, lease: Any, session: Any, exc: Exception, progressed: bool) -> None:
        self.failed(exc)
        super()._failed(lease, session, exc, progressed)


def _still(session: RunSession) -> RunSession:
    vars(session)["_heartbeat"] = _Still()  # before its first step: no thread has started
    return session


def rules(
    scenario: Scenario,
    workspace_fp: str,
    namespace: str,
    variant: str = "first",
    *,
    remote: bool = True,
) -> tuple[TaskSpec, Policy]:
    """The task and a policy: the first (its gated kinds need approval), looser or stricter.

    The looser one gates nothing and lets any later policy in; the stricter
    one gates every write and puts ``ticket.create`` above its ``max_risk``.
    ``remote=False``: a workspace alone (no ticket service to file to).
    """
    perms = {
        "file.read": "workspace.read",
        "file.list": "workspace.read",
        "tests.run": "workspace.read",
        "file.write": "workspace.write",
        "ticket.create": "service.write",
        "board.set": "service.write",
    }
    if not remote:
        del perms["ticket.create"], perms["board.set"]
    task = TaskSpec.from_json(
        {
            "task_id": "sim",
            "task_version": "1",
            "allowed_kinds": sorted(perms),
            "allowed_paths": ["src/", "tickets", "board"],
            "permissions": sorted(set(perms.values())),
            "budgets": {
                "proposals": scenario.proposals,
                "steps": 120,
                "wall_time_s": 10**6,
                "cost": 100,
            },
            "initial_environment": {"namespace": namespace, "state_fingerprint": workspace_fp},
            "verifier": {"argv": ["true"], "timeout_s": 30},
            "tests": {"unit": {"argv": ["true"], "timeout_s": 30}},
        }
    )
    gated = {
        "first": set(scenario.gated),
        "looser": set(),
        "stricter": {"file.write", "ticket.create", "board.set"},
    }[variant]
    clause = {"first": scenario.policy_change, "looser": "new_occurrence"}.get(
        variant, scenario.policy_change
    )
    policy = Policy.from_json(
        {
            "policy_id": "sim",
            "policy_version": {"first": "1", "looser": "2", "stricter": "3"}[variant],
            "kinds": {
                kind: {
                    "risk": "high" if variant == "stricter" and kind == "ticket.create" else "low",
                    "permission": perm,
                    "needs_approval": kind in gated,
                }
                for kind, perm in perms.items()
            },
            "max_risk": "medium",
            "approval_ttl_s": 600,
            "authority": {"policy_change": clause},
        }
    )
    return task, policy
