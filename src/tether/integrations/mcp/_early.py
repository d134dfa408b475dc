"""Effects answered as the upstream answers, while the protocol commits their receipts.

A call of a tool no person gates (and with no earlier write to settle
first) goes through tether's protocol as any call; the upstream's answer to
this call's own send is what the protocol records as the receipt, and it is
handed to the agent as soon as it arrives (the forwarding body tells
:meth:`EarlyAnswers.answered`, on the loop, the protocol waiting for the
body's return). For such a write that answer always advances the run as
``executed`` (``settle_rules.reconcile``: the receipt is the tool's own,
under this key and intent; only an approval's boundary could freeze it).
The commit that records it starts when it always did, so the window
"effect sent, receipt not persisted" is the one it always was; only the
agent's answer leaves before it closes. A crash inside it leaves the write
``dispatched``: settled by the tool's key, else by a person; never sent
again. The gateway's next call, and its exit, wait for that commit
(:meth:`EarlyAnswers.recorded`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import mcp_types as types

from tether import effects
from tether.core import StoreError, TetherError
from tether.integrations.mcp._answers import CALL_META, carried
from tether.integrations.mcp._policy import kind_of
from tether.integrations.mcp._tools import ARGUMENTS, RECEIVED_AT
from tether.integrations.mcp._upstream import UpstreamError, log


def arguments_key(arguments: dict[str, Any]) -> str:
    """A call's arguments as one string, to know the call a forwarded send belongs to."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def with_meta(doc: dict[str, Any], meta: dict[str, Any]) -> types.CallToolResult:
    """The upstream's answer ``doc`` as the agent gets it, ``meta`` in its tether meta."""
    answer = {k: v for k, v in doc.items() if k != RECEIVED_AT}
    answer["_meta"] = dict(answer.get("_meta") or {}) | {CALL_META: meta}
    return types.CallToolResult.model_validate(answer)


class EarlyAnswers:
    """The calls of one gateway's run that may be answered early (module docstring).

    ``live``: the gateway's answers by key, as the forwarding bodies keep
    them (one given early is taken out).
    """

    def __init__(self, run_id: str, live: dict[str, dict[str, Any]]) -> None:
        self._run_id = run_id
        self._live = live
        # Each call that may be answered early, by (tool, arguments): where its answer goes.
        self._awaiting: dict[tuple[str, str], asyncio.Future[types.CallToolResult]] = {}
        # Calls answered before their receipt was committed, still recording it.
        self._recording: set[asyncio.Future[Any]] = set()
        # Calls answered whose receipt's commit the store refused: asked again at exit.
        self._unrecorded: list[tuple[effects.GuardedRun, str, dict[str, Any]]] = []

    async def recorded(self) -> None:
        """Wait until every call answered early has committed its receipt (or failed to).

        What its protocol raised besides a refusal (a crash the harness fired) is raised here.
        """
        while self._recording:
            await asyncio.gather(*self._recording)

    async def record_again(self) -> None:
        """At exit: ask the protocol again for each call answered whose receipt's commit failed.

        The receipt is still held in this process; asked again, the protocol
        records it and sends nothing (the write is dispatched under its key).
        Left unrecorded, the next gateway would find the write's outcome
        unknown and freeze the run for a person, over an answer this one had.
        """
        await self.recorded()
        unrecorded, self._unrecorded = self._unrecorded, []
        for run, name, arguments in unrecorded:
            try:
                done = await run.call_async(kind_of(name), "", {ARGUMENTS: carried(arguments)})
            except (TetherError, UpstreamError) as exc:
                log(f"{name}: its receipt still not recorded ({type(exc).__name__}: {exc})")
                continue
            log(f"{name}: its receipt recorded at exit, as {done.outcome} ({done.action_id})")

    def answered(
        self,
        run: effects.GuardedRun | None,
        name: str,
        arguments: dict[str, Any],
        key: str,
        doc: dict[str, Any],
    ) -> None:
        """The upstream answered a forwarded call: hand the answer to the call waiting for it."""
        waiting = self._awaiting.get((name, arguments_key(arguments)))
        pending = None if run is None else run.session.state.pending
        if waiting is None or waiting.done() or run is None or pending is None:
            return
        if pending.idempotency_key != key:  # another call's send (a write settled first)
            return
        meta = {
            "run_id": self._run_id,
            "tool": name,
            "action_id": pending.action_id,
            "outcome": "executed",
            "effect": run.session.rt.effect_digest(pending.intent),
        }
        self._live.pop(key, None)
        waiting.set_result(with_meta(doc, meta))

    async def call(
        self, run: effects.GuardedRun, name: str, arguments: dict[str, Any]
    ) -> effects.CallResult | types.CallToolResult:
        """The call through the protocol: the upstream's answer as soon as it came, or (nothing
        sent for it, or refused) the protocol's result as for any call."""
        slot = (name, arguments_key(arguments))
        protocol = asyncio.ensure_future(
            run.call_async(kind_of(name), "", {ARGUMENTS: carried(arguments)})
        )
        if slot in self._awaiting:
            # The same call already waits for its answer: this one is answered by its
            # own protocol (a replay of that one), never handed the other's send.
            return await protocol
        answer: asyncio.Future[types.CallToolResult] = asyncio.get_running_loop().create_future()
        self._awaiting[slot] = answer
        try:
            either: list[asyncio.Future[Any]] = [protocol, answer]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: the protocol still goes to its end, and is waited for
            self._track(protocol, run, name, arguments)
            raise
        finally:
            if self._awaiting.get(slot) is answer:
                del self._awaiting[slot]
        if protocol.done() or not answer.done():
            return await protocol  # answered by the protocol, as any call
        self._track(protocol, run, name, arguments)
        return answer.result()

    def _track(
        self,
        protocol: asyncio.Future[effects.CallResult],
        run: effects.GuardedRun,
        name: str,
        arguments: dict[str, Any],
    ) -> None:
        recording = asyncio.ensure_future(self._record(protocol, run, name, arguments))
        self._recording.add(recording)
        recording.add_done_callback(self._recording.discard)

    async def _record(
        self,
        protocol: asyncio.Future[effects.CallResult],
        run: effects.GuardedRun,
        name: str,
        arguments: dict[str, Any],
    ) -> None:
        """The protocol of a call answered early, to its end (a refusal said in the log)."""
        try:
            done = await protocol
        except (TetherError, UpstreamError) as exc:
            log(f"{name}: answered, its receipt not recorded ({type(exc).__name__}: {exc})")
            if isinstance(exc, StoreError):
                self._unrecorded.append((run, name, arguments))
            return
        if done.outcome != "executed":
            log(f"{name}: answered, then recorded as {done.outcome} ({done.action_id})")
