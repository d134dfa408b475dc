"""Effects from any loop: the whole protocol for code that tether does not drive.

An agent written as :class:`~tether.runtime.Agent` hands tether one decision
per step. Most agents are not written that way: a LangGraph graph, a
PydanticAI agent or a hand-written loop calls its tools itself, and a host
framework that resumes after a crash calls them again. Here the caller keeps
its loop and routes each effect through the run:

    with tether.effects.run(runtime, "ticket-42") as run:
        receipt = tether.effects.call("http.post", "tickets", {"json": {"title": "..."}})

or, on a tool function, ``@tether.effect("email.send")``.

Every call is one step of the same protocol the :class:`~tether.runtime.Agent`
style uses (``RunSession.act``): the gate; the key minted and the intent
persisted before anything leaves the process; the owning adapter's call; the
receipt recorded. A framework that re-executes a tool after a crash proposes
the same effect again, and the replay-or-fork rule recognises it by its
normalized intent within the run (never by the framework's call ids): the
recorded receipt comes back and nothing is sent. What the protocol cannot
settle alone is raised, typed: :class:`~tether.core.ApprovalRequiredError`
(carrying the fields a person signs), :class:`~tether.core.NeedsReviewError`
(an unknown outcome is never sent again), :class:`~tether.core.EffectRejectedError`,
:class:`~tether.core.EffectNotSettledError`.

The adapter that owns the kind performs the effect. A decorated function is
an adapter of its own (``fn.adapter``, a
:class:`~tether.adapters.FunctionEffect`): give it to the runtime and its
body performs the effect, once per intent, under a key persisted before it
starts (see :mod:`tether.runtime._decorator`); where another adapter owns
the kind, the body is never run and the function's signature only says
what the call's target and arguments are (a tool's schema, for the model
that calls it). Outside a run the call is refused
(:class:`~tether.core.NotInRunError`), so an effect is never performed
unguarded.

From a coroutine, :func:`run_async` and :func:`call_async` (and ``await`` on
a decorated ``async def``) keep the store's commits off the event loop, in
worker threads, and await an ``async def`` body on the loop itself.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, NoReturn

from tether.adapters._fncall import loop_running_here, refuse_inside_a_body
from tether.core import (
    ActionClass,
    ActionResult,
    ApprovalRequiredError,
    CanonicalJSONError,
    EffectNotSettledError,
    EffectRejectedError,
    EffectUnrecordedError,
    JSONValue,
    NeedsReviewError,
    NotInRunError,
    Outcome,
    OutcomeKind,
    OutcomeReason,
    Phase,
    Proposal,
    RunBusyError,
    RunFrozenError,
    RunTerminalError,
    SpecError,
    TetherError,
    approval_request,
    canonical_bytes,
)
from tether.core._ledger import redact_receipt
from tether.crypto import Role
from tether.runtime import _hints
from tether.runtime._agent import AgentContext
from tether.runtime._offloop import off_loop
from tether.runtime._runtime import Runtime
from tether.runtime._session import RunSession


@dataclass(frozen=True, slots=True)
class CallResult:
    """What an effect's call came back with.

    ``outcome`` is ``executed`` (sent now), ``replayed`` (it had happened
    already: the recorded receipt, nothing sent) or ``observed`` (a read).
    ``receipt`` is the adapter's receipt as the ledger records it (a
    sensitive kind's result as a digest); ``data`` a read's answer, or what
    a replay stood on (the earlier action, key, receipt id and result).
    """

    action_id: str
    kind: str
    target: str
    outcome: str
    effect_digest: str | None = None
    receipt: dict[str, Any] | None = None
    data: dict[str, JSONValue] = field(default_factory=dict)

    @property
    def replayed(self) -> bool:
        """Whether the effect had happened before this call (nothing was sent)."""
        return self.outcome == OutcomeKind.REPLAYED.value

    @property
    def result(self) -> Any:
        """The write's result from its receipt, or a read's answer."""
        if self.receipt is not None:
            return self.receipt.get("result")
        if self.outcome == OutcomeKind.REPLAYED.value:
            return self.data.get("result")  # the adapter's receipt, as the replay read it
        return self.data


class GuardedRun:
    """One run driven by the caller's own loop: each effect one step of tether's protocol.

    Calls are serialized (a framework may run tools in parallel threads; a
    run takes one step at a time). Entering it makes it the run
    :func:`call` and ``@effect`` use in this context (a thread pool that does
    not copy the context, unlike ``asyncio.to_thread``, must be handed the
    run and call :meth:`call` on it); leaving it gives the lease up, and the
    run stays resumable: a crash or an exception inside is recovered by
    entering it again, in a new block.
    """

    def __init__(self, session: RunSession, claim: tuple[int, str] | None = None) -> None:
        self.session = session
        #: This block's hold on the run in this process (see :func:`_claim`).
        self._claim = claim
        self._lock = threading.Lock()
        # The block ended on a loop's thread while a call was in flight: that call lets go.
        self._release_after = False
        self._tokens: list[Token[GuardedRun | None]] = []
        self._closed = False
        #: The block this one was opened inside, in this context.
        self._outer: GuardedRun | None = None

    @property
    def run_id(self) -> str:
        """The run this block acts on (one work occurrence)."""
        return self.session.run_id

    @property
    def phase(self) -> Phase:
        """The run's phase now (``running``, ``pending``, ``needs_review``, or an end)."""
        return self.session.state.phase

    @contextmanager
    def _turn(self, what: str) -> Iterator[None]:
        """This call's turn on the run (calls are serialized).

        On a thread that runs an event loop, a call still in flight may be
        waiting for that very loop (its ``async def`` body is awaited there):
        waiting for it would stop the loop for good. That call is refused at
        once instead (:class:`~tether.core.RunBusyError`, nothing persisted).
        """
        if loop_running_here():
            if not self._lock.acquire(blocking=False):
                raise RunBusyError(
                    f"run {self.run_id}: {what} was called synchronously on an event loop's "
                    "thread while another call of this run is in flight, and that call may need "
                    "this loop; await it (`await fn(...)`, tether.effects.call_async) instead",
                    run_id=self.run_id,
                )
        else:
            self._lock.acquire()
        try:
            yield
        finally:
            self._lock.release()
            self._let_go_if_ended()

    def _let_go_if_ended(self) -> None:
        """Give the run up if its block ended on a loop's thread while a call was in flight.

        Checked after every turn and by :meth:`close` itself, each taking the
        turn first: whichever comes last after the block ended lets go, once.
        """
        if self._release_after and self._lock.acquire(blocking=False):
            try:
                if self._release_after:
                    with suppress(TetherError):  # the lease lapses by itself if not
                        self._let_go()
            finally:
                self._lock.release()

    def call(self, kind: str, target: str = "", args: dict[str, Any] | None = None) -> CallResult:
        """Carry out one effect (or read) through the protocol; its result or a typed refusal."""
        if not isinstance(kind, str) or not isinstance(target, str):
            raise SpecError("call", "kind and target must be strings")
        if args is not None and not isinstance(args, dict):
            raise SpecError("args", f"must be a JSON object, not {type(args).__name__}")
        refuse_inside_a_body(kind)
        try:
            canonical_bytes(args or {})  # a programming error costs no budget
        except CanonicalJSONError as exc:
            raise SpecError("args", f"must be JSON: {exc}") from None
        declared = self.session.rt.kinds.get(kind)
        if declared is not None and declared.action_class in _RUN_LEVEL:
            raise SpecError(
                "kind", f"{kind!r} ends the run: use run.finish() or `tether cancel`, not a call"
            )
        with self._turn(kind):
            session = self._open()
            proposal = Proposal(session.rt.ids.new_id("call"), kind, target, args=dict(args or {}))
            return self._answer(proposal, self._act(proposal))

    def waits_for(self, kind: str, target: str = "", args: dict[str, Any] | None = None) -> bool:
        """Whether the action the run holds for a person is this call's (the same effect)."""
        pending = self.session.state.pending
        proposal = Proposal("waits-for", kind, target, args=dict(args or {}))
        return pending is not None and self.session.rt.same_action(pending, proposal)

    def finish(self, summary: str = "") -> Outcome:
        """End the run: the task's verifier runs at the final state.

        Returns the outcome, ``finished`` or ``verifier_failed`` (the run goes
        on: fix what the verifier reports, then finish again); a refusal is
        raised as :meth:`call` raises it.
        """
        refuse_inside_a_body("finish")
        with self._turn("finish"):
            session = self._open()
            proposal = session.finish_proposal(summary)
            outcome = self._act(proposal, finish=True)
            if outcome.kind not in {OutcomeKind.FINISHED, OutcomeKind.VERIFIER_FAILED}:
                self._refuse(outcome, proposal)
            return outcome

    def approve(self, document: Any) -> None:
        """Record a person's signed approval of the pending write; call the effect again after."""
        with self._turn("approve"):
            self._open().approve(document)

    def review(self, document: Any) -> None:
        """Apply a reviewer's signed decision to the open review case."""
        with self._turn("review"):
            self._open().review(document)

    def close(self) -> None:
        """Give the run's lease up, so another worker may take it at once (after any call in flight).

        On an event loop's thread, with a call still in flight (it may need
        this loop), the block is closed at once and that call gives the lease
        up when it ends: waiting for it here would stop the loop for good.
        """
        if loop_running_here():
            self._closed = self._release_after = True
            self._let_go_if_ended()  # at once where no call is in flight; else that call does
            return
        with self._lock:
            self._let_go()

    def _let_go(self) -> None:
        """Close the block and give the run up (its turn held)."""
        self._closed, self._release_after = True, False
        try:
            self.session.release()
        finally:
            _unclaim(self._claim)
            self._claim = None

    async def call_async(
        self, kind: str, target: str = "", args: dict[str, Any] | None = None
    ) -> CallResult:
        """:meth:`call` from a coroutine: the protocol's commits in a worker thread, never on
        this loop; an ``async def`` effect's body is awaited on this loop."""
        return await off_loop(self.call, kind, target, args)

    async def finish_async(self, summary: str = "") -> Outcome:
        """:meth:`finish` from a coroutine, off this loop."""
        return await off_loop(self.finish, summary)

    def __enter__(self) -> GuardedRun:
        if not self._tokens:
            _refuse_if_open(self.run_id)
            self._outer = _current.get()
        self._tokens.append(_current.set(self))
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        _current.reset(self._tokens.pop())
        if self._tokens:
            return  # entered again inside: the outermost block gives the lease up
        try:
            self.close()
        except TetherError:
            if kind is None:
                raise
            # The block's own exception is what the caller must see.

    async def __aenter__(self) -> GuardedRun:
        return self.__enter__()  # no I/O: the session is open already

    async def __aexit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        _current.reset(self._tokens.pop())
        if self._tokens:
            return
        try:
            await off_loop(self.close)  # the lease's release is a store write
        except TetherError:
            if kind is None:
                raise

    def _open(self) -> RunSession:
        if self._closed:
            raise NotInRunError(
                f"run {self.run_id}: its block has ended; open it again", run_id=self.run_id
            )
        return self.session

    def _act(self, proposal: Proposal, *, finish: bool = False) -> Outcome:
        session = self.session
        before = session.unrecorded
        try:
            return session.act(proposal, finish=finish)
        except RunFrozenError as exc:
            raise self._frozen(str(exc)) from exc
        except TetherError as exc:
            lost = session.unrecorded
            if lost is None or lost is before or lost.answer.receipt is None:
                raise
            # The effect was carried out and its receipt is in hand: never a silent loss.
            body: dict[str, Any] | None = lost.answer.receipt.to_json()
            rule = session.rt.policy.kinds.get(lost.call.intent.kind)
            if rule is not None and rule.sensitive:
                body = redact_receipt(body)  # as the ledger would have kept it
            raise EffectUnrecordedError(
                run_id=self.run_id,
                kind=lost.call.intent.kind,
                target=lost.call.intent.target,
                idempotency_key=lost.call.key,
                result=None if body is None else copy.deepcopy(body.get("result")),
                cause=exc,
            ) from exc

    def _answer(self, proposal: Proposal, outcome: Outcome) -> CallResult:
        session = self.session
        kind = outcome.kind
        # Set when the step carried out the held action this call asks for.
        answers = outcome.action_id or proposal.action_id
        if kind in {OutcomeKind.EXECUTED, OutcomeKind.REPLAYED} and outcome.committed is not None:
            # Sent by this step, or an attempt a crash left settled by its receipt.
            entry = outcome.committed
            return CallResult(
                answers,
                proposal.kind,
                proposal.target,
                kind.value,
                effect_digest=None if entry.terms is None else entry.terms.effect,
                receipt=copy.deepcopy(entry.receipt),
            )
        mine = _result_of(session.results(), answers)
        data = {} if mine is None else copy.deepcopy(mine.data)
        if kind is OutcomeKind.OBSERVED and mine is not None:
            return CallResult(answers, proposal.kind, proposal.target, kind.value, data=data)
        if kind is OutcomeKind.REPLAYED and mine is not None:
            effect = data.get("effect_digest")
            record = session.effects.get(effect) if isinstance(effect, str) else None
            known = None if record is None else record.committed
            return CallResult(
                proposal.action_id,
                proposal.kind,
                proposal.target,
                kind.value,
                effect_digest=effect if isinstance(effect, str) else None,
                # A replay settled by asking the adapter has no committed entry to read.
                receipt=None if known is None else copy.deepcopy(known.receipt),
                data=data,
            )
        self._refuse(outcome, proposal)

    def _refuse(self, outcome: Outcome, proposal: Proposal) -> NoReturn:
        """Raise what ``outcome`` means for a caller whose ``proposal`` did not complete."""
        kind, state = outcome.kind, outcome.state
        pending = state.pending
        if kind is OutcomeKind.WAITING_FOR_APPROVAL and pending is not None:
            mine = self.session.rt.same_action(pending, proposal)
            trust = self.session.rt.trust
            raise ApprovalRequiredError(
                f"run {self.run_id}: {pending.intent.kind} {pending.action_id!r} waits for a "
                f"person's signed approval (`tether approve {self.run_id} {pending.action_id} "
                "--store STORE --key APPROVER.key`, or run.approve(document)); call again "
                "once it is delivered"
                + ("" if mine else f" ({proposal.action_id!r}, another call, waits behind it)")
                + (
                    ""
                    if _hints.trusts(trust, Role.APPROVER)
                    else f". First: {_hints.trust_roots(Role.APPROVER, given=trust is not None)}"
                ),
                run_id=self.run_id,
                action_id=pending.action_id,
                request=approval_request(state),
                for_this_call=mine,
            )
        if kind is OutcomeKind.FROZEN or state.phase is Phase.NEEDS_REVIEW:
            raise self._frozen(outcome.message)
        if kind is OutcomeKind.REJECTED:
            raise EffectRejectedError(
                outcome.reason or OutcomeKind.REJECTED.value, outcome.message, run_id=self.run_id
            )
        if state.phase.terminal:
            raise RunTerminalError(
                f"run {self.run_id} ended ({state.phase}: {state.stop_reason}); start new work "
                f"under a new run id (`tether inspect {self.run_id}` shows what it did)",
                run_id=self.run_id,
            )
        if kind in {OutcomeKind.IN_FLIGHT, OutcomeKind.RETRY_LATER}:
            raise EffectNotSettledError(
                outcome.reason or kind.value, outcome.message, run_id=self.run_id
            )
        # Earlier work settled (a write a crash left pending, a person's
        # decision) and the caller's own action never ran: nothing was sent for it.
        raise EffectNotSettledError(
            OutcomeReason.SETTLED_EARLIER_WORK,
            f"the run settled earlier work first ({outcome.message or kind.value}); "
            f"{proposal.action_id!r} was not carried out: call again",
            run_id=self.run_id,
        )

    def _frozen(self, message: str) -> NeedsReviewError:
        state = self.session.state
        case = state.review_cases[-1] if state.review_cases else None
        return NeedsReviewError(
            (message or f"run {self.run_id} is frozen for review")
            + f"; {_hints.review(self.run_id, None if case is None else case.case_id)}",
            run_id=self.run_id,
            case_id=None if case is None else case.case_id,
            reason=None if case is None else case.reason,
            detail="" if case is None else case.detail,
        )


#: Kinds that end the run: not effects a call makes.
_RUN_LEVEL = frozenset({ActionClass.FINISH, ActionClass.CANCEL})


def _result_of(results: tuple[ActionResult, ...], action_id: str) -> ActionResult | None:
    for result in results:
        if result.action_id == action_id:
            return result
    return None


_current: ContextVar[GuardedRun | None] = ContextVar("tether_guarded_run", default=None)
#: The runs open in a block in this process: (id of the runtime, run id).
_open_runs: set[tuple[int, str]] = set()
_open_runs_lock = threading.Lock()


def _claim(runtime: Runtime, run_id: str) -> tuple[int, str]:
    """Hold ``run_id`` for one block of ``runtime`` in this process, or refuse (RunBusyError).

    Another task or thread of the same process opening the same run would
    recover it under this process's own worker name while the first block's
    step is in flight: both would send (or the first's receipt would hit a
    newer generation). The second is refused before it reads anything.
    """
    held = (id(runtime), run_id)
    with _open_runs_lock:
        if held in _open_runs:
            raise RunBusyError(
                f"run {run_id} is open in another block of this process (another task or "
                "thread acts on it); wait for that block to end, or call through it",
                run_id=run_id,
            )
        _open_runs.add(held)
    return held


def _unclaim(held: tuple[int, str] | None) -> None:
    if held is not None:
        with _open_runs_lock:
            _open_runs.discard(held)


def _refuse_if_open(run_id: str) -> None:
    """Refuse a second block for a run already open in this context (it would take the lease)."""
    outer = _current.get()
    while outer is not None:
        if outer.run_id == run_id:
            raise SpecError(
                "run", f"run {run_id} is already open in this context; use that block's run"
            )
        outer = outer._outer


@contextmanager
def run(
    runtime: Runtime, run_id: str, *, context: AgentContext | None = None
) -> Iterator[GuardedRun]:
    """Start ``run_id``, or recover it (every restore check, an admitted new epoch), for this block.

    Inside the block :func:`call` and ``@effect`` act on this run. The lease
    (with leases on) is given up on the way out; the run is not ended: call
    :meth:`GuardedRun.finish` when the work is done.
    """
    _refuse_if_open(run_id)  # before recovering: that would take the open block's lease
    held = _claim(runtime, run_id)
    try:
        session = runtime.start_or_recover(run_id, context)
    except BaseException:
        _unclaim(held)
        raise
    with GuardedRun(session, held) as guarded:
        yield guarded


@asynccontextmanager
async def run_async(
    runtime: Runtime, run_id: str, *, context: AgentContext | None = None
) -> AsyncIterator[GuardedRun]:
    """:func:`run` for a coroutine: the run is started or recovered, and let go, off this loop.

    Inside the block, ``await`` decorated coroutine functions or
    :func:`call_async`: their commits run in worker threads, their ``async
    def`` bodies on this loop, so many runs in one loop progress together.
    """
    _refuse_if_open(run_id)
    held = _claim(runtime, run_id)
    try:
        session = await off_loop(runtime.start_or_recover, run_id, context)
    except BaseException:
        _unclaim(held)
        raise
    async with GuardedRun(session, held) as guarded:
        yield guarded


def current() -> GuardedRun:
    """The run this context's effects go through; :class:`~tether.core.NotInRunError` if none."""
    guarded = _current.get()
    if guarded is None:
        raise NotInRunError(
            "no tether run is active here: open one with `with tether.effects.run(runtime, "
            "run_id):` (an effect is never performed unguarded)"
        )
    return guarded


def call(kind: str, target: str = "", args: dict[str, Any] | None = None) -> CallResult:
    """Carry out one effect through the current run (see :meth:`GuardedRun.call`)."""
    return current().call(kind, target, args)


async def call_async(kind: str, target: str = "", args: dict[str, Any] | None = None) -> CallResult:
    """Carry out one effect through the current run from a coroutine (see
    :meth:`GuardedRun.call_async`)."""
    return await current().call_async(kind, target, args)
