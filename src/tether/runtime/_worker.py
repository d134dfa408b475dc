"""A recovery worker: claims runs whose lease expired, admits and resumes them.

Many workers, on many machines, point at one store (PostgreSQL for more than
one machine). Each claim is a compare-and-set that bumps the run's lease
version, so no two workers drive a run at once, and the version fences every
commit and every adapter call of the one that does.

The application is loaded by ``module:factory``: a callable
``factory(store, run_id, worker) -> Runtime`` that builds the runtime for one
run (its adapter, task, policy, agent, keys and trust roots).

A step that only resends or waits (the adapter said "later" or "still in
flight", the agent asked for nothing) is not progress (``core.step_progressed``):
the run is deferred at once, uncounted, for ``core.retry_delay`` of the
no-progress attempts in a row this worker has seen (exponential from
``backoff_s``, capped at ``max_backoff_s``, jittered by the worker's random
draw), and the next run gets its turn. An adapter or store outage raised as
an error is waited out the same way. A run that waits for a person is parked
until evidence lands, and not before that back-off if the claim met an
adapter that was down (``core.after_step``).

A run whose drive fails (any exception: tether's, the adapter's, the agent's
own code) never captures a worker: it is deferred by the same rule, from its
count of consecutive failures (``core.retry_delay``), other runs
are claimed meanwhile, and after ``max_attempts`` consecutive failures it is
parked in ``needs_review`` (reason ``worker_error``, the error as evidence)
where a person decides. A run that cannot even be restored is parked at the
mark: claims no longer take it, ``inspect`` shows its last error.
"""

from __future__ import annotations

import importlib
import logging
import random
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, ClassVar

from tether.core import (
    AdapterUnavailableError,
    LeaseError,
    OutcomeKind,
    Phase,
    ReviewReason,
    StoreError,
    StoreUnavailableError,
    TetherError,
    TrustRootsRequiredError,
)
from tether.core._retry import AfterStep, after_step, claim_progressed, retry_delay
from tether.crypto import Role
from tether.runtime import _hints
from tether.runtime._many import MAX_CONCURRENCY, serve_many
from tether.runtime._runtime import Runtime
from tether.store import Lease

log = logging.getLogger("tether.worker")

RuntimeFactory = Callable[[Any, str, str], Runtime]
#: With ``idle_exit``, this many failed claims in a row end :meth:`Worker.serve`.
IDLE_EXIT_CLAIM_FAILURES = 3
#: At most this many runs' no-progress streaks are remembered; past it the
#: oldest are forgotten (such a run backs off from the base again).
STREAKS_REMEMBERED = 10_000
#: The phases a claim takes a run in.
PHASES_CLAIMED = ("running", "pending", "needs_review")


class AppLoadError(TetherError):
    """``module:factory`` does not name a callable that can be imported."""


def load_factory(spec: str) -> RuntimeFactory:
    """Import ``module:factory`` and return the callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app must look like module:factory, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, TypeError, ValueError) as exc:
        # TypeError, ValueError: a name no import can take ("..x", "a..b", a NUL byte).
        raise AppLoadError(f"cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise AppLoadError(f"{module_name}.{attr} is not a callable")
    return factory  # type: ignore[no-any-return]


@dataclass
class WorkerStats:
    """What a worker did, for its log line and for tests."""

    claimed: int = 0
    completed: int = 0
    waiting: int = 0
    lost: int = 0
    errors: int = 0
    parked: int = 0
    runs: list[str] = field(default_factory=list)


class Worker:
    """Claims and drives runs until stopped; one run at a time, or ``concurrency`` at once.

    With ``concurrency`` above 1, each claimed run is driven on a thread of
    its own (``_many``), and the store writes the commits that meet there
    together (one transaction, one fsync, each fenced by its own lease).
    """

    #: The shortest pause between two claims of an idle worker (seconds): each claim
    #: is a write transaction (on SQLite it takes the write lock), so a poll much
    #: shorter is a busy loop against the store while there is no work.
    MIN_POLL_S: ClassVar[float] = 0.01

    def __init__(
        self,
        store: Any,
        factory: RuntimeFactory,
        worker_id: str,
        *,
        lease_ttl_s: float = 15.0,
        poll_s: float = 0.5,
        max_attempts: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 300.0,
        draw: Callable[[], float] = random.random,
        concurrency: int = 1,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise StoreError(f"concurrency must be a whole number, not {concurrency!r}")
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise StoreError(f"concurrency must be from 1 to {MAX_CONCURRENCY}, not {concurrency}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise StoreError(f"max_attempts must be a whole number, not {max_attempts!r}")
        if not 1 <= max_attempts <= 1000:
            raise StoreError(f"max_attempts must be from 1 to 1000, not {max_attempts}")
        # NaN fails every comparison, so each bound is written to refuse it.
        for name, value, low, high in (
            ("lease_ttl_s", lease_ttl_s, 0.0, 24 * 3600.0),
            ("poll_s", poll_s, self.MIN_POLL_S, 3600.0),
            ("backoff_s", backoff_s, 0.0, 366 * 24 * 3600.0),
            ("max_backoff_s", max_backoff_s, 0.0, 366 * 24 * 3600.0),
        ):
            number = isinstance(value, int | float) and not isinstance(value, bool)
            # A lease of 0 is gone when granted (the CLI refuses it too).
            if not (number and low <= value <= high) or (name == "lease_ttl_s" and value == 0):
                raise StoreError(
                    f"{name} must be a number of seconds in [{low:g}, {high:g}]"
                    f" (lease_ttl_s above 0), not {value!r}"
                )
        self.store = store
        self.factory = factory
        self.worker_id = worker_id
        self.lease_ttl_s = lease_ttl_s
        self.poll_s = poll_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        #: The jitter's random draw in [0, 1) (a seeded one makes delays repeatable).
        self.draw = draw
        #: How many runs this worker drives at once (one thread each).
        self.concurrency = concurrency
        self.stats = WorkerStats()
        self._stop = threading.Event()
        # Claims in a row, per run, that ended without progress (the back-off's
        # exponent), with the generation the run was left at. Kept by this
        # worker (the store has no column for it): another worker starts such a
        # run from the base again (still bounded), and a run found at another
        # generation when claimed again moved on elsewhere, so it starts afresh.
        self._streaks: dict[str, tuple[int, int]] = {}
        # The claims (run, lease version) being driven that have made a step of
        # progress, and the sessions of those being driven: a suspect that made a
        # step or moved its run on no longer needs the worker to itself.
        self._moved: set[tuple[str, int]] = set()
        self._sessions: dict[tuple[str, int], Any] = {}

    def stop(self) -> None:
        """Finish the current step, release the lease, and return from :meth:`serve`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def serve(self, *, max_runs: int | None = None, idle_exit: bool = False) -> WorkerStats:
        """Claim and drive runs until stopped (or ``max_runs`` claimed, or idle with ``idle_exit``)."""
        if self.concurrency > 1:
            serve_many(
                concurrency=self.concurrency,
                poll_s=self.poll_s,
                stopping=lambda: self.stopping,
                claim=self._claim,
                drive=self.drive,
                unmoved=self._unmoved,
                suspect_waiting=self._suspect_waiting,
                pause=self._stop.wait,
                give_up_after=IDLE_EXIT_CLAIM_FAILURES,
                max_runs=max_runs,
                idle_exit=idle_exit,
            )
            return self.stats
        failures = 0
        while not self.stopping:
            if max_runs is not None and self.stats.claimed >= max_runs:
                break
            try:
                claimed = self._claim(1)
            except TetherError as exc:  # the store is down, or a row is damaged: wait, ask again
                failures += 1
                log.error("claiming failed: %s: %s", type(exc).__name__, exc)
                if idle_exit and failures >= IDLE_EXIT_CLAIM_FAILURES:
                    # A worker told to stop when idle must not loop on a store it can
                    # never claim from (a malformed file): it ends with the error.
                    raise
                self._stop.wait(self.poll_s)
                continue
            failures = 0
            if not claimed:
                if idle_exit:
                    break
                self._stop.wait(self.poll_s)
                continue
            for lease in claimed:
                self.drive(lease)
        return self.stats

    def _claim(self, limit: int, suspects: bool | None = None) -> list[Lease]:
        """Claim at most ``limit`` runs whose lease expired (or that were never leased).

        ``suspects``: only runs whose last claim ended uncleanly, only the
        others, or either (``None``); see ``claim_expired``.
        """
        claimed: list[Lease] = self.store.claim_expired(
            self.worker_id,
            self.lease_ttl_s,
            limit=limit,
            phases=PHASES_CLAIMED,
            max_attempts=self.max_attempts,
            suspects=suspects,
        )
        return claimed

    def _suspect_waiting(self) -> bool:
        """Whether a suspect this worker would claim is due (a store without the read:
        assume one may be)."""
        probe = getattr(self.store, "suspect_waiting", None)
        if probe is None:
            return True
        return bool(probe(PHASES_CLAIMED, self.max_attempts))

    def _unmoved(self, lease: Lease) -> bool:
        """Whether the claim ``lease`` has not moved its run on yet (see ``serve_many``).

        Read from the claiming thread while the run's own thread steps it: a
        step that commits its way past a recovery's own commits (settled a
        write, proposed the next) clears it before the step ends, so a slow
        step (a long model call) does not hold the whole worker.
        """
        key = (lease.run_id, lease.lease_version)
        if key in self._moved:
            return False
        session = self._sessions.get(key)
        return session is None or not claim_progressed(session.state.generation, lease.generation)

    def drive(self, lease: Lease) -> Phase | None:
        """Recover one claimed run and step it until it ends, freezes, waits, or we stop."""
        try:
            return self._drive(lease)
        finally:
            self._moved.discard((lease.run_id, lease.lease_version))
            self._sessions.pop((lease.run_id, lease.lease_version), None)

    def _drive(self, lease: Lease) -> Phase | None:
        self.stats.claimed += 1
        self.stats.runs.append(lease.run_id)
        session = None
        progressed = False
        streak = self._streaks.get(lease.run_id)
        if streak is not None and streak[1] != lease.generation:
            del self._streaks[lease.run_id]  # another worker or a person moved it on
        try:
            runtime = self.factory(self.store, lease.run_id, self.worker_id)
            runtime.lease_ttl_s = self.lease_ttl_s
            runtime.worker = self.worker_id
            session = runtime.recover(lease.run_id, lease=lease)
            self._sessions[(lease.run_id, lease.lease_version)] = session
            while not self.stopping:
                phase = session.state.phase
                if phase.terminal:
                    break
                # A frozen run reads its inbox here. A write's receipt rides on the next
                # step's commit (the loop steps again at once), or lands at release().
                outcome = session.run(max_steps=1, land=False)
                held = session.lease.lease_version if session.lease is not None else 0
                waits = outcome.kind is OutcomeKind.WAITING_FOR_APPROVAL
                then = after_step(
                    outcome.kind,
                    frozen=session.state.phase is Phase.NEEDS_REVIEW,
                    met_outage=session.unreachable is not None,
                )
                if then in {AfterStep.PARK, AfterStep.PARK_BACKED_OFF}:
                    # A person must act: park it (no lease, no checkpoints) until
                    # evidence it has not read arrives in its inbox.
                    cursor = session.state.inbox_cursor
                    if runtime.trust is None and self.store.evidence(lease.run_id, after=cursor):
                        # Evidence is waiting that this worker cannot read: a
                        # configuration error, backed off and counted like one.
                        raise TrustRootsRequiredError(
                            f"run {lease.run_id} has signed evidence in its inbox and this "
                            "worker's runtime has no trust roots to verify it ("
                            + _hints.trust_roots(
                                Role.APPROVER if waits else Role.REVIEWER, given=False
                            )
                            + ")",
                            run_id=lease.run_id,
                        )
                    floor = (
                        self._next_delay(lease.run_id, session.state.generation)
                        if then is AfterStep.PARK_BACKED_OFF
                        else 0.0
                    )
                    self.store.wait_for_evidence(lease.run_id, self.worker_id, held, cursor, floor)
                    self.stats.waiting += 1
                    return session.state.phase
                if then is AfterStep.GO_ON:
                    if not progressed:
                        # A worker killed from here on is not one more failure of a
                        # run that was stuck: its count restarts at this claim.
                        self.store.note_progress(lease.run_id, self.worker_id, held)
                        self._moved.add((lease.run_id, lease.lease_version))
                    progressed = True
                    self._streaks.pop(lease.run_id, None)
                    continue
                # In flight, "later", or an agent that asked for nothing: a
                # checkpoint the step wrote (a recorded resend) is not progress.
                # Back off, uncounted (an adapter down for long is waited out),
                # and let the next run have its turn.
                self.store.defer(
                    lease.run_id,
                    self.worker_id,
                    held,
                    self._next_delay(lease.run_id, session.state.generation),
                    f"{outcome.kind}: {outcome.message}",
                    count=False,
                )
                self.stats.waiting += 1
                return session.state.phase
            phase = session.state.phase
            if phase is Phase.COMPLETED:
                self.stats.completed += 1
            self._streaks.pop(lease.run_id, None)
            session.release()
            return phase
        except LeaseError as exc:
            self.stats.lost += 1
            log.warning("run %s: lease lost (%s); leaving it to its new owner", lease.run_id, exc)
            return None
        except (AdapterUnavailableError, StoreUnavailableError) as exc:
            # An outage (the service, the adapter or the store is down), not the run's
            # fault: waited out like a step's "retry later", never counted toward parking.
            self._outage(lease, session, exc)
            return None
        except Exception as exc:  # any per-run failure: the worker lives on
            self._failed(lease, session, exc, progressed)
            return None

    def _outage(self, lease: Lease, session: Any, exc: Exception) -> None:
        """Come back after the back-off, uncounted: an outage parks nothing."""
        self.stats.waiting += 1
        text = f"{type(exc).__name__}: {exc}"
        log.warning("run %s: %s; trying again later", lease.run_id, text)
        version = _held_version(lease, session)
        delay = self._next_delay(
            lease.run_id, lease.generation if session is None else session.state.generation
        )
        try:
            self.store.defer(lease.run_id, self.worker_id, version, delay, text, count=False)
        except TetherError as again:  # lease gone or store down: the ttl backs it off
            log.warning("run %s: could not defer it: %s", lease.run_id, again)

    def _next_delay(self, run_id: str, generation: int) -> float:
        """The back-off before ``run_id``'s next attempt; counts this one in its streak.

        ``generation``: where the run is left, so a claim can tell whether it moved since.
        """
        attempt, _ = self._streaks.pop(run_id, (0, generation))
        if len(self._streaks) >= STREAKS_REMEMBERED:
            self._streaks.pop(next(iter(self._streaks)))  # the one unheard of longest
        self._streaks[run_id] = (attempt + 1, generation)
        return retry_delay(
            attempt, base_s=self.backoff_s, cap_s=self.max_backoff_s, jitter=self.draw()
        )

    def _failed(self, lease: Lease, session: Any, exc: Exception, progressed: bool) -> None:
        """Back the run off (counted), or park it for a person after too many failures."""
        self.stats.errors += 1
        text = f"{type(exc).__name__}: {exc}"
        log.error("run %s: %s", lease.run_id, text)
        version = _held_version(lease, session)
        try:
            # The claim counted this attempt (a worker that died mid-run too).
            mark = self.store.get_mark(lease.run_id)
            attempts = 1 if progressed or mark is None else max(1, mark.attempts)
            last_chance = attempts >= self.max_attempts
            # A person can decide a run that keeps failing, unless it is already
            # frozen or the failure is this worker's own configuration: then it
            # is deferred, and at max_attempts no claim takes it (parked at the mark).
            parkable = (
                session is not None
                and not (session.state.phase.terminal or session.state.phase is Phase.NEEDS_REVIEW)
                and not isinstance(exc, TrustRootsRequiredError)
            )
            if last_chance and parkable and self._park(session, text):
                return
            # The same rule as a step that made no progress, from the failure count.
            delay = retry_delay(
                attempts - 1, base_s=self.backoff_s, cap_s=self.max_backoff_s, jitter=self.draw()
            )
            self.store.defer(
                lease.run_id, self.worker_id, version, delay, text, progressed=progressed
            )
        except TetherError as again:  # lease gone or store down: the ttl backs it off
            log.warning("run %s: could not defer it: %s", lease.run_id, again)

    def _park(self, session: Any, text: str) -> bool:
        """Freeze the run in needs_review (worker_error) until a decision; False if that failed.

        The lease is not released cleanly (that would forget the failures): the
        run waits for evidence, like any run waiting for a person.
        """
        try:
            session.park(ReviewReason.WORKER_ERROR, text)
            held = session.lease.lease_version if session.lease is not None else 0
            self.store.wait_for_evidence(
                session.run_id, self.worker_id, held, session.state.inbox_cursor, 0
            )
        except Exception as exc:  # the same fault may stop the park too: defer instead
            log.warning("run %s: could not park it: %s", session.run_id, exc)
            return False
        self.stats.parked += 1
        log.error(
            "run %s: parked in needs_review after %d failures", session.run_id, self.max_attempts
        )
        return True


def install_signal_handlers(worker: Worker) -> None:
    """SIGTERM and SIGINT stop the worker cleanly: finish the step, release the lease."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: finishing the current step, then releasing the lease", signum)
        # Not worker.stop() here: the handler runs on the main thread between two
        # bytecodes, possibly inside Event.wait() while it holds the event's
        # (non-reentrant) lock, and Event.set() would wait on that lock for ever.
        # A thread sets it as soon as the main thread lets the lock go.
        threading.Thread(target=worker.stop, name="tether-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _held_version(lease: Lease, session: Any) -> int:
    """The lease version the run is held under now (a session may have renewed it)."""
    if session is not None and session.lease is not None:
        return int(session.lease.lease_version)
    return lease.lease_version
