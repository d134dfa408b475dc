"""Whole runs under random agents, random crashes and random lease takeovers (hypothesis).

The seeded simulator of the protocol: real SQLite file, real signed
checkpoints, an in-memory adapter that outlives every "process" (as a real
service would), crashes raised at named points, and a second worker taking
the lease. The adapter has one of the capability profiles below, and every
send and look-up that reaches it is counted (a deduplicating Sandbox would
absorb a resend). After every step it checks what the whole project promises:
no effect twice (no key sent twice to an adapter that cannot deduplicate; no
key sent again to a queryable one without asking it first), no committed
receipt lost, a freeze only where the adapter cannot settle the write, the
generation only moves forward, the trace and the ledger each one unbroken
chain.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.conftest import CountingIds, ManualClock, make_policy, make_task
from tests.integration._crashkit import chain_breaks
from tether.core import (
    EffectStatus,
    LeaseError,
    LeaseHeldError,
    Observation,
    Phase,
    Proposal,
    RunFrozenError,
    RunTerminalError,
)
from tether.crypto import Keyring
from tether.runtime import (
    AgentContext,
    CrashPlan,
    CrashPoint,
    Decision,
    RunSession,
    Runtime,
    SimulatedCrash,
)
from tether.store import SQLiteStore
from tether.testing import Sandbox
from tether.testing.counting import Calls, count_calls

OPS = ("read", "write", "test", "wait", "bad", "finish")
POINTS = [p for p in CrashPoint if p is not CrashPoint.CONTENT_BEFORE_MARK]  # one database
# A write's windows drawn as often as all the rest: where a resend or a lost receipt can hide.
WINDOWS = [CrashPoint.INTENT_PERSISTED, CrashPoint.EFFECT_SENT, CrashPoint.RECEIPT_PERSISTED]
CRASH_AT = st.sampled_from(POINTS) | st.sampled_from(WINDOWS)
EXAMPLES = int(os.environ.get("TETHER_STATEFUL_EXAMPLES", "40"))
#: (idempotent, queryable, absent_is_final): the combinations the settle rules tell apart.
PROFILES = [
    (True, True, True),
    (True, True, False),
    (False, True, True),
    (False, True, False),
    (True, False, True),
    (False, False, True),
]


class Profiled(Sandbox):
    """A real Sandbox whose look-up that finds nothing may or may not be final."""

    def __init__(self, *args: Any, absent_is_final: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._absent_is_final = absent_is_final

    @property
    def capabilities(self) -> Any:
        """The Sandbox's own, with ``absent_is_final`` as configured."""
        return replace(super().capabilities, absent_is_final=self._absent_is_final)


class Program:
    """Plays ``ops[plan_cursor]``, then finishes: deterministic from the restored context."""

    def __init__(self, ops: list[str]) -> None:
        self.ops = ops

    def decide(self, context: AgentContext, observation: Observation) -> Decision:
        cursor = context.plan_cursor
        nxt = AgentContext(context.messages, context.memory, cursor + 1)
        op = self.ops[cursor] if cursor < len(self.ops) else "finish"
        version = observation.environment.version
        if op == "read":
            return Decision(nxt, Proposal(f"r{cursor}", "file.read", "notes.txt"))
        if op == "write":
            args = {"content": f"v{cursor}\n"}
            return Decision(nxt, Proposal(f"w{cursor}", "file.write", "notes.txt", args, version))
        if op == "test":
            return Decision(nxt, Proposal(f"t{cursor}", "tests.run", "unit"))
        if op == "bad":
            return Decision(nxt, Proposal(f"b{cursor}", "file.write", "../x", {"content": "x"}))
        if op == "wait":
            return Decision(nxt)
        return Decision(nxt, finished=True)


class Runs(RuleBasedStateMachine):
    """One run, driven step by step by whichever worker holds it now."""

    def __init__(self) -> None:
        super().__init__()
        self.home = Path(tempfile.mkdtemp(prefix="tether-stateful-"))
        self.clock = ManualClock()
        self.sandbox: Sandbox = Sandbox(
            {"notes.txt": "draft\n"}, instance_id="sbx-1", clock=self.clock.now
        )
        self.calls = Calls()
        self.may_freeze = False
        self.keyring = Keyring.generate("k1")
        self.ids = CountingIds()
        fingerprint = self.sandbox.environment().state_fingerprint
        self.task = make_task(
            fingerprint,
            budgets={"proposals": 40, "steps": 60},
            tests={"unit": {"argv": ["python", "-m", "unittest"], "timeout_s": 30}},
        )
        self.policy = make_policy()
        self.stores: list[SQLiteStore] = []
        self.program = Program([])
        self.session: RunSession | None = None
        self.generation = 0

    def runtime(self, crash: CrashPlan | None = None, worker: str = "worker") -> Runtime:
        # One worker id restarting: every acquire is a new fencing token, so
        # each recovery fences out the process it replaces (dead or hung).
        store = SQLiteStore(self.home / "tether.sqlite")
        self.stores.append(store)
        return Runtime(
            store=store,
            keyring=self.keyring,
            adapter=self.sandbox,
            task=self.task,
            policy=self.policy,
            agent=self.program,
            clock=self.clock,
            ids=self.ids,
            crash=crash or CrashPlan(),
            worker=worker,
            lease_ttl_s=3600,
        )

    @initialize(
        ops=st.lists(st.sampled_from(OPS) | st.just("write"), max_size=8),
        profile=st.sampled_from(PROFILES),
    )
    def begin(self, ops: list[str], profile: tuple[bool, bool, bool]) -> None:
        idempotent, queryable, absent_is_final = profile
        self.sandbox = Profiled(
            {"notes.txt": "draft\n"},
            instance_id="sbx-1",
            clock=self.clock.now,
            idempotent=idempotent,
            queryable=queryable,
            absent_is_final=absent_is_final,
        )
        self.calls = count_calls(self.sandbox)
        # Only an adapter that can neither deduplicate nor prove absence leaves a
        # dispatched write unsettled (outcome unknown): the one honest freeze.
        self.may_freeze = not idempotent and not (queryable and absent_is_final)
        self.program.ops = ops
        try:
            self.session = self.runtime().start("r1")
        except SimulatedCrash:
            self.session = None

    @rule(point=CRASH_AT, nth=st.integers(1, 2), armed=st.booleans())
    def step(self, point: CrashPoint, nth: int, armed: bool) -> None:
        session = self.session
        if session is None or session.state.phase.terminal:
            return
        if session.state.phase is Phase.NEEDS_REVIEW:
            if not self.may_freeze:
                raise AssertionError(
                    f"an honest adapter froze the run: {session.state.review_cases}"
                )
            return  # frozen for a person; the invariants judge the freeze
        plan = CrashPlan(point, nth) if armed else CrashPlan()
        session.rt.crash = session.rt.checkpointer.crash = plan
        try:
            session.step()
        except SimulatedCrash:
            self.session = None  # the process died; its lease is left behind

    @rule(point=st.sampled_from(WINDOWS))
    def die_in_a_write(self, point: CrashPoint) -> None:
        """The worker dies in a write's window (if this step writes) and a new one recovers at once."""
        session = self.session
        if session is None or session.state.phase is not Phase.RUNNING:
            return
        session.rt.crash = session.rt.checkpointer.crash = CrashPlan(point)
        try:
            session.step()
        except SimulatedCrash:
            self.session = self.runtime().start_or_recover("r1")

    @rule(point=CRASH_AT, nth=st.integers(1, 3), armed=st.booleans())
    def recover(self, point: CrashPoint, nth: int, armed: bool) -> None:
        """A new worker recovers (after a crash, or taking the lease from a live one)."""
        old = self.session
        rt = self.runtime(CrashPlan(point, nth) if armed else None)
        try:
            self.session = rt.start_or_recover("r1")
        except SimulatedCrash:
            self.session = None
            return
        if old is not None and not old.state.phase.terminal:
            # The worker it replaced is fenced out: it can change nothing any more.
            # It learns so at its commit (a CAS on the lease version) or at the
            # lease check before any adapter call, not necessarily at step start,
            # so its armed crash point may fire first: a death that changed nothing.
            writes, sends = self.sandbox.write_count(), self.calls.sends()
            store = SQLiteStore(self.home / "tether.sqlite")
            try:
                mark = store.get_mark("r1")
                try:
                    old.step()
                except (LeaseError, RunFrozenError, RunTerminalError, SimulatedCrash):
                    pass
                else:
                    raise AssertionError("a worker whose lease was taken over still stepped")
                assert store.get_mark("r1") == mark
            finally:
                store.close()
            assert self.sandbox.write_count() == writes
            assert self.calls.sends() == sends, "a fenced-out worker reached the adapter"

    @rule()
    def contend(self) -> None:
        """Another worker may not take a run whose lease is held (or left by a crash)."""
        store = SQLiteStore(self.home / "tether.sqlite")
        try:
            if store.get_mark("r1") is None:
                return
            mark_before = store.get_mark("r1")
            try:
                self.runtime(worker="intruder").recover("r1")
            except LeaseHeldError:
                pass
            else:
                raise AssertionError("a second worker took a held lease")
            assert store.get_mark("r1") == mark_before
        finally:
            store.close()

    @invariant()
    def sound(self) -> None:
        store = SQLiteStore(self.home / "tether.sqlite")
        try:
            mark = store.get_mark("r1")
            if mark is None:
                return
            assert mark.generation >= self.generation, "the high-water mark moved back"
            self.generation = mark.generation
            checker = self.runtime()
            state = checker.checkpointer.load("r1").state
            assert chain_breaks(store.trace("r1", state.trace_head), state) == []
            ledger = checker.checkpointer.verified_ledger(state)  # chain, head, pending status
            self._effects_once(state, ledger)
        finally:
            store.close()

    def _effects_once(self, state: Any, ledger: list[Any]) -> None:
        keys_of: dict[str, set[str]] = defaultdict(set)
        last: dict[str, EffectStatus] = {}
        for entry in ledger:
            keys_of[entry.action_id].add(entry.idempotency_key)
            last[entry.idempotency_key] = entry.status
        # Read the adapter's receipts directly: a look-up here would count as the runtime's.
        held = {r.idempotency_key: r for r in self.sandbox.receipts_after(-1, limit=1 << 30)}
        landed = {key for key in last if key in held}
        assert self.sandbox.write_count() == len(landed), "a write landed under no ledger key"
        for action_id, keys in keys_of.items():
            assert len(keys) == 1, f"action {action_id} was given two keys"
        caps = self.sandbox.capabilities
        if not caps.idempotent:  # here a resend would be a second effect
            twice = {key: n for key, n in self.calls.sent().items() if n > 1}
            assert not twice, f"sent again to an adapter that cannot deduplicate: {twice}"
        if caps.queryable:  # a write that may have landed is looked up before any resend
            assert self.calls.resent_unasked() == [], "resent without asking the adapter"
        if state.phase is Phase.NEEDS_REVIEW:
            assert self.may_freeze, f"an adapter that can settle froze: {state.review_cases}"
            assert [c.reason for c in state.review_cases] == ["outcome_unknown"]
            if caps.queryable and state.pending is not None:
                # Had it landed, the look-up would have found it and reconciled.
                assert state.pending.idempotency_key not in held
        settled = state.phase in {Phase.RUNNING, Phase.COMPLETED, Phase.FAILED}
        if settled:
            for key in landed:  # a receipt the adapter holds is never lost by the run
                assert last[key] is EffectStatus.COMMITTED, (key, last[key])
            assert state.writes_committed == len(landed)

    def teardown(self) -> None:
        for store in self.stores:
            store.close()
        shutil.rmtree(self.home, ignore_errors=True)


Runs.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRuns = Runs.TestCase
