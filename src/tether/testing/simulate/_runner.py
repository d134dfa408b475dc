"""One simulation: the real runtime, two workers, people, and the world, driven by events.

Every event is applied to the real :class:`~tether.runtime.Runtime` and
:class:`~tether.runtime.RunSession` (and the real :class:`~tether.runtime.Worker`
for ``drive``) on the real SQLite store; the invariants of ``_judge`` are
checked as each effect lands and after every event. The run ends with a
drain: the world healed, people answering, the run must end within a bound.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.adapters import Adapters
from tether.core import (
    CheckpointCorruptError,
    IllegalTransitionError,
    InvariantError,
    LedgerEntry,
    Policy,
    PolicyChange,
    RunState,
    TetherError,
)
from tether.runtime import (
    CrashPlan,
    CrashPoint,
    Restored,
    RunSession,
    Runtime,
    SimulatedCrash,
    Worker,
)
from tether.testing.simulate import _people
from tether.testing.simulate._agent import AgentFaults, SimAgent, SimAgentError
from tether.testing.simulate._contract import Contract
from tether.testing.simulate._judge import SENDS_PER_CLAIM, Judge, Violation
from tether.testing.simulate._neighbour import (
    DRAIN_DRIVES,
    NEIGHBOUR_ID,
    Neighbour,
    Runaway,
    ended,
)
from tether.testing.simulate._people import TRUST, People
from tether.testing.simulate._process import KEYRING, LEASE_TTL_S, SimRuntime, SimWorker, rules
from tether.testing.simulate._reports import reported
from tether.testing.simulate._scenario import FILES, RUN_ID, Event, Scenario
from tether.testing.simulate._store import SimDatabase, SimStore, borrow, give_back
from tether.testing.simulate._world import (
    SimBoard,
    SimClock,
    SimIds,
    SimTickets,
    SimWorkspace,
    World,
)

_ITEM_KIND = {"file.write": "write", "ticket.create": "ticket", "board.set": "board"}
#: Drain iterations (one scheduler decision each) a healthy run may take to end.
DRAIN_BOUND = 120
#: Errors that say tether's own invariants broke (nothing in the simulated world tampers
#: with the store): invariant 0, never a refusal to step over.
BROKEN = (IllegalTransitionError, InvariantError, CheckpointCorruptError)
#: Look-ups of one key a worker may make within one event while its service is down.
LOOKUPS_PER_CLAIM = 4
#: Commits one event may make before the simulator calls it a runaway loop.
COMMITS_PER_EVENT = 200


@dataclass
class Result:
    """What one simulation did and found."""

    scenario: Scenario
    violations: list[Violation]
    events: int
    checks: int
    receptions: int
    phase: str
    #: Every effect that reached the world, in order (what an exact replay must repeat).
    world: tuple[str, ...] = ()
    #: The healthy run beside it, if one was handed over: how and when it ended, and
    #: where the simulated run stood then ("" when there was none).
    neighbour: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class Slot:
    """One worker: its store connection, its runtime (a process), and its session."""

    index: int
    store: SimStore
    runtime: Runtime
    crash: CrashPlan
    agent: SimAgent
    #: The worker loop of this process (its back-off memory dies with it).
    worker: Worker
    session: RunSession | None = None


class Simulation:
    """Applies a scenario's events to the real runtime and judges after each one."""

    def __init__(self, scenario: Scenario, database: SimDatabase) -> None:
        self.scenario = scenario
        self.clock = SimClock()
        self.ids = SimIds()
        self.world = World(self.clock, self.ids)
        self.workspace = SimWorkspace(self.world, scenario.workspace, {f: "0" for f in FILES})
        self.tickets = SimTickets(self.world, scenario.tickets)
        # A second remote service, of the tickets' capabilities: a state no adapter reads.
        self.board = SimBoard(self.world, scenario.tickets)
        self.adapter = Adapters(self.workspace, self.tickets, self.board)
        env = self.adapter.environment()
        self.task, self.policy = rules(scenario, env.state_fingerprint, env.namespace)
        self._fingerprint, self._namespace = env.state_fingerprint, env.namespace
        #: The policy the promise is judged under, and since when: a new one is in
        #: force only if the clause of the one in force lets it in (never the newcomer's).
        self._in_force: list[tuple[float, Policy]] = [(self.clock.seconds, self.policy)]
        self.deployed: dict[str, Policy] = {self.policy.policy_version: self.policy}
        self.adopted_wrongly = False
        #: A database holding only a freshly migrated store's rows, and its connections.
        self.database = database
        #: Write units on the database, counted by every store of this simulation.
        self.writes = [0]
        self.observer = database.store(self.clock.micros, self.writes)
        #: The observer's last read of the ledger, and the shape of the rows it was read from.
        self._ledger: tuple[Any, list[LedgerEntry]] | None = None
        #: The shape of the ledger the judge last judged (``ledger()`` may read it for others).
        self._judged: Any = ()
        #: The last checkpoint a person read, by the (generation, digest) the mark named.
        self._read: tuple[tuple[int, str], Restored] | None = None
        self.judge = Judge()
        self.contract = Contract()
        self.people = People()
        self.incarnations = 0
        self.event_no = 0
        self.outages: dict[str, float] = {}
        self.committed: set[str] = set()
        self.commits_at_event = 0
        self.attempts: dict[str, int] = {}
        self.lookups: dict[str, int] = {}
        #: The worker whose session is stepping now (its lease is the one a send presents).
        self.acting: Slot | None = None
        self.world.judge = self._received
        self.world.attempt = self._attempted
        self.world.asked = self._asked
        self.world.restored = self.restored
        #: The run's agent faults, whichever process its agent lives in.
        self.agent = AgentFaults()
        #: The workers' jitter, drawn from the seed (a retry delay decides what a claim takes).
        self.jitter = random.Random(scenario.seed * 7919 + 3)
        #: The healthy run beside this one, once a ``neighbour`` event handed it over.
        self.neighbour: Neighbour | None = None
        self.neighbour_store: SimStore | None = None
        self.builds = 0
        workers = 2 if "two_workers" in scenario.knobs else 1
        self.slots = [
            self._slot(i, database.store(self.clock.micros, self.writes)) for i in range(workers)
        ]
        first = self.slots[0]
        first.session = first.runtime.start(RUN_ID)

    # -- building ------------------------------------------------------------

    def _slot(self, index: int, store: SimStore) -> Slot:
        crash = CrashPlan()
        self.incarnations += 1
        redo = {"write", "ticket", "board"}
        if "gated_repeats" not in self.scenario.knobs:
            # Trying a gated action again after a replan is a gated repeat.
            redo -= {_ITEM_KIND[k] for k in self.scenario.gated}
        agent = SimAgent(self.scenario.plan, self.incarnations, frozenset(redo), faults=self.agent)
        runtime = SimRuntime(
            store=store,
            keyring=KEYRING,
            adapter=self.adapter,
            task=self.task,
            policy=self.policy,
            agent=agent,
            clock=self.clock,
            ids=self.ids,
            crash=crash,
            worker=f"w{index}",
            trust=TRUST,
            lease_ttl_s=LEASE_TTL_S,
        )

        def build(claimed_from: Any, run_id: str, worker_id: str) -> Runtime:
            self.builds += 1
            Neighbour.built(self.judge, self.builds, run_id, worker_id)
            if self.neighbour is not None and run_id == NEIGHBOUR_ID:
                return self.neighbour.runtime(self.neighbour_store, worker_id)
            return runtime

        worker = SimWorker(
            store,
            build,
            f"w{index}",
            lease_ttl_s=LEASE_TTL_S,
            draw=self.jitter.random,
            failed=self._drive_failed,
        )
        return Slot(index, store, runtime, crash, agent, worker)

    def _drive_failed(self, exc: BaseException) -> None:
        """A drive failed and the worker backs the run off: tether's own errors are bugs."""
        self.judge.checks += 1
        if isinstance(exc, BROKEN) or not isinstance(exc, TetherError | SimAgentError):
            self.judge.fail(0, f"in a drive: {type(exc).__name__}: {exc} | {_where(exc)}")

    def _die(self, slot: Slot) -> None:
        """The worker's process died: its session is gone, a new process starts empty."""
        slot.store.crash_at = None
        self.slots[slot.index] = self._slot(slot.index, slot.store)

    # -- the world's hooks ---------------------------------------------------

    def _received(self, r: Any) -> None:
        # A request that lands late from in flight is judged as it was when it was sent.
        # (Several at one instant: a request sent the moment a policy changed may have
        # left under either, so it is judged under the more permissive.)
        policies = self.in_force_at(r.sent_at)
        rules_then = [p.kinds.get(r.kind) for p in policies]
        gated = all(rule is not None and rule.needs_approval for rule in rules_then)
        if all(
            rule is not None and rule.risk.rank > policy.max_risk.rank
            for rule, policy in zip(rules_then, policies, strict=True)
        ):
            self.judge.fail(
                2, f"{r.kind} {r.identity} ({r.key}) reached the world; the policy forbids its kind"
            )
        keys = {x.key: x.identity for x in self.world.receptions}
        forked: dict[str, int] = {}
        for key in self.people.forked:
            if key in keys:
                forked[keys[key]] = forked.get(keys[key], 0) + 1
        self.judge.forks = forked
        self.judge.received(
            r,
            gated=gated,
            # (An approval signed under another policy version is no approval under this one.)
            approved_until=self.people.approval_until(
                r.key, r.intent_digest, (p.policy_version for p in policies)
            ),
            committed=self._committed_now() if self.judge.unknowable else self.committed,
        )
        remote = r.namespace in {"tickets", "board"}
        caps = self.scenario.tickets if remote else self.scenario.workspace
        if caps.blind and not r.late:
            # (A request that lands late from in flight was unknown when it was
            # sent, and judged then: the run had to reach review before going on.)
            self.judge.unknowable.setdefault(r.key, self.event_no)

    def _attempted(self, namespace: str, key: str, presented: int | None) -> None:
        if presented is None and self.acting is not None and self.acting.session is not None:
            lease = self.acting.session.lease
            # A session holding no lease acts at version 0 (one process, no workers):
            # once any worker has taken the run's lease, it may send nothing.
            presented = 0 if lease is None else lease.lease_version
        if presented is not None:
            mark = self.observer.read_mark(RUN_ID)
            self.judge.attempted(key, presented, None if mark is None else mark.lease_version)
        if namespace in self.outages:
            count = self.attempts[key] = self.attempts.get(key, 0) + 1
            if count > SENDS_PER_CLAIM:
                self.judge.fail(
                    6, f"{count} sends of {key} within one event while {namespace} was down"
                )
                raise Runaway(f"hammering {key}")
        if self._commits() - self.commits_at_event > COMMITS_PER_EVENT:
            self.judge.fail(6, f"more than {COMMITS_PER_EVENT} commits in one event")
            raise Runaway("too many commits in one event")

    def _asked(self, namespace: str, key: str) -> None:
        """Invariant 6 for look-ups: asking a service that is down again and again is
        hammering it too (a worker that counts a wait as progress)."""
        if namespace in self.outages:
            count = self.lookups[key] = self.lookups.get(key, 0) + 1
            if count > LOOKUPS_PER_CLAIM:
                self.judge.fail(
                    6, f"{count} look-ups of {key} within one event while {namespace} was down"
                )
                raise Runaway(f"hammering {key} with look-ups")

    def _commits(self) -> int:
        return sum(s.store.commits for s in self.slots)

    def _committed_now(self) -> set[str]:
        self.committed = {e.idempotency_key for e in self.ledger() if e.status.value == "committed"}
        return self.committed

    def ledger(self) -> list[LedgerEntry]:
        """The run's ledger as the store reads it back (read again only when its rows changed)."""
        shape = self.observer.ledger_shape(RUN_ID)
        if self._ledger is None or self._ledger[0] != shape:
            self._ledger = (shape, self._read_ledger(shape))
        return self._ledger[1]

    def _read_ledger(self, shape: Any) -> list[LedgerEntry]:
        """Every row, as ``observer.ledger`` reads them; only the rows inserted since the last
        read are read and parsed when every row read before is still there.

        The shape lists every row's (key, seq, status): the rows read before plus the new
        ones must be exactly those, as many as it counts; else (a row vanished or changed,
        invariant 5's business) the whole ledger is read again.
        """
        if self._ledger is None or self._ledger[0] is None or shape is None:
            return self.observer.ledger(RUN_ID)
        (_, last_rowid, _), before = self._ledger
        rows = [*before, *self.observer.ledger_after(RUN_ID, last_rowid or 0)]
        rows.sort(key=lambda e: (e.seq, e.hash))  # observer.ledger's order
        count, _, listed = shape
        said = sorted((listed or "").split(",")) if count else []
        read = ",".join(f"{e.idempotency_key} {e.seq} {e.status.value}" for e in rows)
        if count != len(rows) or said != sorted(read.split(",") if rows else []):
            return self.observer.ledger(RUN_ID)
        return rows

    # -- events --------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Apply one event, then judge."""
        self.event_no += 1
        self.judge.event = self.event_no
        self.commits_at_event = self._commits()
        self.attempts.clear()
        self.lookups.clear()
        handler = getattr(self, f"_on_{event.kind}", None)
        try:
            if handler is not None:
                handler(event)
            else:
                _people.ACTS[event.kind](self, event)
        except Runaway:
            self._die(self.slots[min(event.worker, len(self.slots) - 1)])
        finally:
            self.acting = None
        self.after_event()

    def after_event(self) -> None:
        now = self.clock.seconds
        for name, adapter in (("sandbox", self.workspace), ("tickets", self.tickets)):
            if adapter.faults.down_until > now:
                self.outages.setdefault(name, now)
            elif self.outages.pop(name, None) is not None:
                self.judge.outage_over()
        if self._commits() == self.commits_at_event:
            return  # only a commit changes the ledger or the phase (the inbox is in neither)
        entries = self.ledger()
        shape = None if self._ledger is None else self._ledger[0]
        if shape != self._judged:
            self.committed = self.judge.ledger(entries, self.outages, now)
            self._judged = shape
        else:
            # The store holds the very rows judged last time (invariants 5 and 6 judge
            # what changed): the probe that says so was this event's check.
            self.judge.checks += 2
        mark = self.observer.read_mark(RUN_ID)
        if mark is not None:
            self.judge.phase(mark.phase, self.committed)
            self.contract.after_commit(self, mark.phase)
        if self.policy is not self.in_force and not self.adopted_wrongly:
            # A policy the one in force does not let in was deployed: the run
            # must not go on under it (only a signed admission adopts it).
            state = self.state()
            version = None if state is None else state.binding.policy_version
            if version == self.policy.policy_version:
                self.adopted_wrongly = True
                self.judge.fail(
                    2,
                    f"the run went on under policy v{version}, which v"
                    f"{self.in_force.policy_version} in force refuses to adopt",
                )

    def _slot_of(self, event: Event) -> Slot:
        return self.slots[min(event.worker, len(self.slots) - 1)]

    def _on_step(self, event: Event) -> None:
        slot = self._slot_of(event)
        try:
            if slot.session is None:
                slot.session = slot.runtime.recover(RUN_ID)
                return
            self.acting = slot
            outcome = slot.session.step()
        except SimulatedCrash:
            self._die(slot)
            return
        except BROKEN as exc:  # tether's own integrity failed: a bug, never a refusal
            self.judge.fail(0, f"{type(exc).__name__}: {exc} | {_where(exc)}")
            self._die(slot)
            return
        except TetherError:
            slot.session = None  # refused (a lost lease, a frozen run...): recover next time
            return
        except SimAgentError:
            slot.session = None  # the caller's own agent failed: its loop recovers next time
            return
        except Exception as exc:  # a bug in the runtime, not a refusal
            self.judge.fail(0, f"{type(exc).__name__}: {exc} | {_where(exc)}")
            self._die(slot)
            return
        reported(self, slot, outcome)
        Contract.after_step(self, slot.session, outcome)

    def _on_drive(self, event: Event) -> None:
        """One turn of a worker: it claims a run whose lease is free and drives it."""
        slot = self._slot_of(event)
        neighbour = self.neighbour
        waited = neighbour is not None and neighbour.claimable(
            self.observer.read_mark(NEIGHBOUR_ID)
        )
        self.builds = 0  # runtimes this worker builds in this turn
        try:
            claimed = slot.store.claim_expired(
                slot.worker.worker_id,
                LEASE_TTL_S,
                limit=1,
                phases=("running", "pending", "needs_review"),
                max_attempts=slot.worker.max_attempts,
            )
            for lease in claimed:
                if lease.run_id == RUN_ID:
                    slot.session = None
                slot.worker.drive(lease)
                if lease.run_id == RUN_ID and (self.attempts or self.lookups):
                    # (Only sends and look-ups to a service that is down are counted.)
                    self.judge.claimed_while_down(self.clock.seconds)
        except SimulatedCrash:
            self._die(slot)
        except BROKEN as exc:
            self.judge.fail(0, f"{type(exc).__name__}: {exc} | {_where(exc)}")
            self._die(slot)
        except TetherError:
            pass
        finally:
            if neighbour is not None:
                mark = self.observer.read_mark(NEIGHBOUR_ID)
                neighbour.turn_ended(self.judge, waited, mark)
                if ended(mark) and not neighbour.ending:
                    main = self.observer.read_mark(RUN_ID)
                    neighbour.ending = (
                        f"{None if mark is None else mark.phase} at event {self.event_no}, "
                        f"{RUN_ID} {None if main is None else main.phase} then"
                    )

    def _on_neighbour(self, event: Event) -> None:
        if self.neighbour is None:
            self.neighbour_store = self.database.store(self.clock.micros, self.writes)
            self.neighbour = Neighbour(self.scenario, self.clock)
            self.neighbour.arrive(self.neighbour_store, died=event.arg == "died")

    def _on_agent_error(self, event: Event) -> None:
        self.agent.errors += max(1, int(event.num))

    def _on_stale(self, event: Event) -> None:
        self.agent.stale += max(1, int(event.num))

    def _on_advance(self, event: Event) -> None:
        self.clock.advance(event.num)

    def _on_crash_commit(self, event: Event) -> None:
        self._slot_of(event).store.crash_at = event.arg

    def _on_crash_point(self, event: Event) -> None:
        plan = self._slot_of(event).crash
        plan.point, plan.nth, plan.hits = CrashPoint(event.arg), 1, 0

    def _adapter(self, event: Event) -> SimWorkspace | SimTickets:
        return self.tickets if event.arg == "tickets" else self.workspace

    def _on_lost_reply(self, event: Event) -> None:
        self._adapter(event).faults.lost_reply += 1

    def _on_hostile(self, event: Event) -> None:
        self._adapter(event).faults.hostile += 1

    def _on_in_flight(self, event: Event) -> None:
        if event.num:
            self.tickets.faults.stuck += 1  # hung until the world heals
        else:
            self.tickets.faults.in_flight += 1

    def _on_down(self, event: Event) -> None:
        faults = self._adapter(event).faults
        faults.down_until = max(faults.down_until, self.clock.seconds + event.num)

    def _on_forget(self, event: Event) -> None:
        for adapter, caps in (
            (self.workspace, self.scenario.workspace),
            (self.tickets, self.scenario.tickets),
        ):
            if caps.retention_s is None:
                continue
            forgotten = adapter.forget(caps.retention_s)
            if not forgotten:
                continue
            latest = {e.idempotency_key: e.status.value for e in self.ledger()}
            # A key a person already holds (the run is frozen for review now) or set
            # aside (a replan quarantined it) has reached review: invariant 4 asks no
            # more of it. A replan writes no ledger row, so its key still reads
            # "dispatched" there (seeds 140033, 145094).
            state = self.state()
            if state is not None and state.phase.value == "needs_review":
                continue
            decided = () if state is None else state.quarantined_keys
            for key in forgotten:
                # Only a write the run still waits on (dispatched, unsettled) is
                # unknowable now; one settled or decided by a person is not.
                if latest.get(key) == "dispatched" and key not in decided:
                    self.judge.unknowable.setdefault(key, self.event_no)

    def _on_route_404(self, event: Event) -> None:
        # Only where absence is declared not final: an adapter that declares a
        # look-up's "nothing" final and then answers 404 for everything lies.
        caps = self.scenario.tickets if event.arg == "tickets" else self.scenario.workspace
        if not caps.absent_is_final:
            self._adapter(event).faults.route_404 = True

    def _on_route_gone(self, event: Event) -> None:
        # Any queryable adapter: it says its look-up proves nothing, whatever it declares.
        self._adapter(event).faults.route_gone = True

    def _on_policy(self, event: Event) -> None:
        """A new policy file is deployed: every worker restarts on it."""
        _, new = rules(self.scenario, self._fingerprint, self._namespace, event.arg)
        self._deploy(new)

    def _deploy(self, policy: Policy) -> None:
        if self.in_force.authority.policy_change is PolicyChange.NEW_OCCURRENCE:
            self.in_force = policy
        self.policy = policy
        self.deployed[policy.policy_version] = policy
        for slot in list(self.slots):
            self._die(slot)

    def restored(self) -> None:
        """The workspace was put back to a snapshot: what last changed a file is gone
        (the board is remote: a rewind leaves what it shows)."""
        shown = {t: i for t, i in self.judge.last_change.items() if t in self.board.shows}
        self.judge.last_change.clear()
        self.judge.last_change.update(shown)

    def _on_drift(self, event: Event) -> None:
        self._adapter(event).drop_newest(self._committed_now(), tamper=event.num > 0)

    # -- people --------------------------------------------------------------

    def state(self, *phases: str) -> RunState | None:
        """The run as a person reads it: the verified checkpoint the mark names.

        ``phases``: read it only if the mark says the run is in one of them
        (``None`` otherwise): a person who has nothing to do reads no checkpoint.
        """
        restored = self.load(*phases)
        return None if restored is None else restored.state

    def load(self, *phases: str) -> Restored | None:
        """The verified checkpoint the mark names (see :meth:`state`), with the mark.

        Checkpoint content is write-once per generation: while the mark names
        the same one, the checkpoint read (and verified) last time is still it.
        """
        mark = self.observer.read_mark(RUN_ID)
        if mark is None or (phases and mark.phase not in phases):
            return None
        named = (mark.generation, mark.checkpoint_digest)
        if self._read is not None and self._read[0] == named:
            return self._read[1]
        try:
            restored = self.slots[0].runtime.checkpointer.load(RUN_ID)
        except TetherError:
            return None
        self._read = ((restored.mark.generation, restored.mark.checkpoint_digest), restored)
        return restored

    def _gated(self, kind: str) -> bool:
        """Whether a person is asked to approve ``kind`` (by the policy run or in force)."""
        return any(
            p.kinds[kind].needs_approval for p in (self.policy, self.in_force) if kind in p.kinds
        )

    @property
    def in_force(self) -> Policy:
        """The policy in force now."""
        return self._in_force[-1][1]

    @in_force.setter
    def in_force(self, policy: Policy) -> None:
        if policy is not self.in_force:
            self._in_force.append((self.clock.seconds, policy))

    def in_force_at(self, moment: float) -> list[Policy]:
        """The policies in force at ``moment`` (a request is judged as it was when sent):
        one, or several where the policy changed at that very instant."""
        found = [self._in_force[0][1]]
        for since, policy in self._in_force[1:]:
            if since < moment:
                found = [policy]
            elif since == moment:
                found.append(policy)
        return found

    # -- the end ---------------------------------------------------------------

    def drain(self) -> None:
        """Heal the world, let people answer, and step until the run ends (and its neighbour)."""
        self.workspace.faults = type(self.workspace.faults)()
        self.tickets.heal()
        self.board.heal()
        self.agent.errors = self.agent.stale = 0
        if self.policy is not self.in_force:
            self._deploy(self.in_force)  # the operator puts back the policy in force
        state = self.state()
        bound = None if state is None else self.deployed.get(state.binding.policy_version)
        if bound is not None and bound is not self.policy:
            # The run is bound to another policy (went on under it, judged then,
            # or the one in force refused to recover it): the operator keeps
            # the run's own, so it can still end.
            self.policy = self.in_force = bound  # the operator's choice, not the runtime's
            self.adopted_wrongly = True
            for slot in list(self.slots):
                self._die(slot)
        for slot in self.slots:
            slot.store.crash_at = None
            slot.crash.point = None
        self._drain_run()
        if self.neighbour is not None:
            for _ in range(DRAIN_DRIVES):
                if ended(self.observer.read_mark(NEIGHBOUR_ID)):
                    break
                self.apply(Event("drive", 0))
                self.clock.advance(LEASE_TTL_S + 1)
            self.neighbour.judge_end(self.judge, self.observer.read_mark(NEIGHBOUR_ID))

    def _drain_run(self) -> None:
        replans = 0
        for _ in range(DRAIN_BOUND):
            mark = self.observer.read_mark(RUN_ID)
            if ended(mark):
                return
            phase = None if mark is None else mark.phase
            if phase == "needs_review":
                replans += 1
                decision = "replan" if replans <= 2 else "abort"
                self.apply(Event("review", arg=decision))
            elif phase == "pending":
                state = self.state()
                pending = None if state is None else state.pending
                until = None
                if state is not None and pending is not None:
                    bound = state.binding.policy_version
                    key, digest = pending.idempotency_key, pending.intent.digest
                    until = self.people.approval_until(key, digest, (bound,))
                if (
                    pending is not None
                    and self._gated(pending.intent.kind)
                    and (until is None or until <= self.clock.seconds)
                ):
                    self.apply(Event("approve", arg="yes"))
            self.apply(Event("step", 0))
            self.clock.advance(LEASE_TTL_S + 1)  # any stalled lease runs out
        state = self.state()
        self.judge.fail(
            7,
            f"the run did not end within {DRAIN_BOUND} drain steps "
            f"(phase {None if state is None else state.phase.value})",
        )


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return "; ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[-3:])


def simulate(scenario: Scenario) -> Result:
    """Run ``scenario`` from scratch; every violation it finds."""
    database = borrow()
    clean = False
    try:
        sim = Simulation(scenario, database)
        for event in scenario.events:
            sim.apply(event)
        sim.drain()
        state = sim.state()
        result = Result(
            scenario,
            list(sim.judge.violations),
            sim.event_no,  # every scheduler decision applied, the drain's included
            sim.judge.checks,
            len(sim.world.receptions),
            "?" if state is None else state.phase.value,
            tuple(f"{r.namespace} {r.key} {r.identity} @{r.at:g}" for r in sim.world.receptions),
            "" if sim.neighbour is None else sim.neighbour.ending,
        )
        clean = True
        return result
    finally:
        give_back(database, clean=clean)
