"""Shared fixtures: a real SQLite file per test, an injected clock and id source, tasks."""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tether.core import (
    Observation,
    Policy,
    Proposal,
    RunState,
    TaskSpec,
    new_approval,
    new_decision,
)
from tether.crypto import Keyring, Signer
from tether.runtime import AgentContext, CrashPlan, Decision, Runtime
from tether.store import SQLiteStore
from tether.testing import Sandbox


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    """Under ``TETHER_REQUIRE_EXTRAS=1`` (CI) a test module skipped at import fails instead.

    The integration tests skip without their optional extra (``importorskip``);
    in CI every extra is installed, so such a skip can only hide a broken install.
    """
    report: pytest.CollectReport = yield
    if report.skipped and os.environ.get("TETHER_REQUIRE_EXTRAS") == "1":
        report.outcome = "failed"
        report.longrepr = f"skipped at collection, but TETHER_REQUIRE_EXTRAS=1: {report.longrepr}"
    return report


@pytest.fixture(autouse=True)
def _own_data_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test reads or makes the user's default keyring: each has a data directory of its own."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data-home")))


class ManualClock:
    """A clock the test moves by hand (the runtime's injected clock, not a mock)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.moment = start or datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.moment

    def advance(self, seconds: float) -> None:
        self.moment += timedelta(seconds=seconds)


class CountingIds:
    """Deterministic ids: prefix-1, prefix-2, ..."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._counter)}"


def make_task(fingerprint: str, **changes: Any) -> TaskSpec:
    doc: dict[str, Any] = {
        "task_id": "t1",
        "task_version": "1",
        "allowed_kinds": ["file.read", "file.list", "file.write", "tests.run"],
        "allowed_paths": ["notes.txt", "src/"],
        "permissions": ["workspace.read", "workspace.write"],
        "budgets": {"proposals": 10, "steps": 20, "wall_time_s": 3600, "cost": 100},
        "initial_environment": {"namespace": "sandbox", "state_fingerprint": fingerprint},
        "verifier": {"argv": ["python", "-c", "pass"], "timeout_s": 30},
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    return TaskSpec.from_json(doc)


def make_policy(**changes: Any) -> Policy:
    doc: dict[str, Any] = {
        "policy_id": "p1",
        "policy_version": "1",
        "kinds": {
            "file.read": {"risk": "low", "permission": "workspace.read", "needs_approval": False},
            "file.list": {"risk": "low", "permission": "workspace.read", "needs_approval": False},
            "file.write": {"risk": "low", "permission": "workspace.write", "needs_approval": False},
            "tests.run": {"risk": "low", "permission": "workspace.read", "needs_approval": False},
        },
        "max_risk": "medium",
        "approval_ttl_s": 600,
    }
    kinds = changes.pop("kinds", None)
    if kinds is not None:
        doc["kinds"] = {**doc["kinds"], **kinds}  # a test's rules replace those of the same kind
    doc.update(changes)
    return Policy.from_json(doc)


def signed_approval(signer: Signer, state: RunState, now: datetime) -> dict[str, Any]:
    """``signer``'s signed approval of the run's pending write, alive for five minutes."""
    body = new_approval(
        state,
        signer.signer_id,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=secrets.token_hex(16),
    )
    return signer.sign(body)


def signed_decision(
    signer: Signer, state: RunState, now: datetime, decision: str = "replan", nonce: str = ""
) -> dict[str, Any]:
    """``signer``'s signed ``decision`` on the run's newest review case, alive five minutes."""
    body = new_decision(
        state,
        state.review_cases[-1],
        signer.signer_id,
        decision,
        issued_at=now,
        expires_at=now + timedelta(seconds=300),
        nonce=nonce or secrets.token_hex(16),
    )
    return signer.sign(body)


Step = Callable[[AgentContext, Observation], Decision]


def write(target: str, content: str, action_id: str | None = None, **extra: Any) -> Step:
    """A step that proposes writing ``content`` to ``target``."""

    kind = extra.pop("kind", "file.write")
    args = extra.pop("args", {"content": content})
    based_on = extra.pop("based_on_version", None)

    def step(context: AgentContext, obs: Observation) -> Decision:
        cursor = context.plan_cursor
        proposal = Proposal(
            action_id=action_id or f"a{cursor}",
            kind=kind,
            target=target,
            args=args,
            based_on_version=obs.environment.version if based_on is None else based_on,
            **extra,
        )
        note = {"step": cursor, "saw_version": obs.environment.version}
        return Decision(
            AgentContext((*context.messages, note), context.memory, cursor + 1), proposal
        )

    return step


def finish(context: AgentContext, obs: Observation) -> Decision:
    """A step that declares the task done."""
    return Decision(
        AgentContext(context.messages, context.memory, context.plan_cursor + 1), finished=True
    )


@dataclass
class ScriptedAgent:
    """Plays ``steps[context.plan_cursor]``: deterministic from the restored context."""

    steps: Sequence[Step]
    calls: int = 0
    seen: list[AgentContext] = field(default_factory=list)

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        self.calls += 1
        self.seen.append(context)
        index = min(context.plan_cursor, len(self.steps) - 1)
        return self.steps[index](context, observation)


@dataclass
class World:
    """One test's real SQLite file, keyring, sandbox, clock and ids; builds runtimes."""

    db: Path
    keyring: Keyring
    sandbox: Sandbox
    clock: ManualClock
    ids: CountingIds
    task: TaskSpec
    policy: Policy
    stores: list[SQLiteStore] = field(default_factory=list)

    def store(self) -> SQLiteStore:
        store = SQLiteStore(self.db)
        self.stores.append(store)
        return store

    def runtime(self, agent: Any, *, crash: CrashPlan | None = None, **overrides: Any) -> Runtime:
        kwargs: dict[str, Any] = {
            "store": self.store(),
            "keyring": self.keyring,
            "adapter": self.sandbox,
            "task": self.task,
            "policy": self.policy,
            "agent": agent,
            "clock": self.clock,
            "ids": self.ids,
            "crash": crash or CrashPlan(),
        }
        kwargs.update(overrides)
        return Runtime(**kwargs)

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    clock = ManualClock()
    sandbox = Sandbox({"notes.txt": "draft\n"}, instance_id="sbx-1", clock=clock.now)
    w = World(
        db=tmp_path / "tether.sqlite",
        keyring=Keyring.generate("k1"),
        sandbox=sandbox,
        clock=clock,
        ids=CountingIds(),
        task=make_task(sandbox.environment().state_fingerprint),
        policy=make_policy(),
    )
    yield w
    w.close()
