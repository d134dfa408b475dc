"""What a step reports, judged: a write ``executed`` or ``replayed`` is what the world holds.

Invariants 2 and 3 on a step's outcome (see ``_judge``): the write it names
is what its target holds, the ticket reached the service, a replay of a
gated kind stood on a live approval, and a replay's receipt is one the
adapter itself still holds, with the result the agent was handed.
"""

from __future__ import annotations

from typing import Any

from tether.core import OutcomeKind
from tether.testing.simulate._agent import planned
from tether.testing.simulate._people import People

#: The simulation judged (its runner; typed loosely, as the people's acts take it).
Simulation = Any
#: What a replay handed the agent, when the step's results hold nothing for it.
_UNSEEN = object()


def reported(sim: Simulation, slot: Any, outcome: Any) -> None:
    """Invariants 2 and 3 on what a step reports: a write executed or replayed."""
    if outcome.kind not in (OutcomeKind.EXECUTED, OutcomeKind.REPLAYED):
        return
    entry = outcome.committed
    action = outcome.action_id or (entry.action_id if entry is not None else None)
    if outcome.kind is OutcomeKind.REPLAYED and slot.session is not None:
        # A replay names the proposal it answered in its event; its committed entry
        # (when the adapter settled an earlier attempt) is the earlier attempt's.
        for event in reversed(slot.session.trace(3)):
            if event.kind in {"effect_replayed", "effect_reconciled", "effect_committed"}:
                action = str(event.data.get("action_id", action))
                break
    if action is None:
        trace = slot.session.trace(1) if slot.session is not None else []
        action = str(trace[-1].data.get("action_id", "")) if trace else ""
    item = planned(sim.scenario.plan, action)
    sim.judge.checks += 2
    if item is None:
        return
    if item.kind == "ticket" and not any(
        r.namespace == "tickets" and item.value in r.identity for r in sim.world.receptions
    ):
        sim.judge.fail(
            3,
            f"{action} ({item}) reported {outcome.kind.value}; no such ticket reached the world",
        )
    if item.kind == "write":
        held = sim.workspace.files.get(item.target)
        if held != item.value:
            sim.judge.fail(
                3,
                f"{action} ({item}) reported {outcome.kind.value}, "
                f"but {item.target} holds {held!r}",
            )
    if item.kind == "board":
        # A state nothing reads for the run: only the ledger can tell A, B, A apart.
        shows = sim.board.shows.get(item.target)
        if shows != item.value:
            sim.judge.fail(
                3,
                f"{action} ({item}) reported {outcome.kind.value}, but the board shows {shows!r}",
            )
    if outcome.kind is OutcomeKind.REPLAYED:
        kind = {"write": "file.write", "ticket": "ticket.create"}.get(item.kind, "board.set")
        rule = sim.in_force.kinds.get(kind)
        gated = rule is not None and rule.needs_approval
        replayed = _replay_event(slot, action)
        now = sim.clock.seconds
        if gated and not _replay_approved(sim, slot, action, replayed, now):
            sim.judge.fail(2, f"{action} ({item}) was replayed without an approval")
        caps = sim.scenario.workspace if item.kind == "write" else sim.scenario.tickets
        if replayed is not None and replayed[2] == "review":
            # A person's signed ``landed`` answers for a key the adapter no longer
            # holds (that is why a person was asked): the replay must stand on such a
            # signature, and the world's content (above) is what is judged
            # (exploration seeds 90843, 95697).
            if sim.judge.settled.get(replayed[0]) != "landed":
                sim.judge.fail(
                    3,
                    f"{action} ({item}) replayed from a review record under "
                    f"{replayed[0]}, which no person signed landed",
                )
        elif replayed is not None and caps.queryable:
            # Where the adapter cannot be asked, the signed ledger holds the only
            # copy of its receipt: the world's content (above) is what is judged.
            key, receipt_id, _ = replayed
            adapter = {"ticket": sim.tickets, "board": sim.board}.get(item.kind, sim.workspace)
            held_receipt = adapter.held(key)
            # (The receipt id, not the fingerprint: the composite adapter
            # translates a workspace receipt's post-state into its own identity.)
            answered = _replayed_result(slot, action)
            if (
                held_receipt is None
                or held_receipt.receipt_id != receipt_id
                or (answered is not _UNSEEN and answered != held_receipt.result)
            ):
                sim.judge.fail(
                    3,
                    f"{action} ({item}) replayed from the receipt under {key}, which "
                    "the adapter does not hold (deleted or drifted)",
                )


def _replay_approved(
    sim: Simulation,
    slot: Any,
    action: str,
    replayed: tuple[str, str, str] | None,
    now: float,
) -> bool:
    """Whether a replay of a gated effect stands on an approval alive now: one a person
    signed for this very replay, or the one the effect was sent under, or one a person
    signed for an earlier replay of it (each counts while it lives)."""
    people: People = sim.people
    key = None if replayed is None else replayed[0]
    if action in people.approved_actions:
        if key is not None:
            until = people.approved_until.get(action, -1.0)
            people.replays_approved[key] = max(people.replays_approved.get(key, -1.0), until)
        return True
    if key is None:
        return False
    version = sim.in_force.policy_version  # an approval under another version is none
    sent_under = max(
        (signed.get(version, -1.0) for (k, _), signed in people.approvals.items() if k == key),
        default=-1.0,
    )
    if now < max(sent_under, people.replays_approved.get(key, -1.0)):
        return True
    # An approved replay a worker's drive made is reported to nobody step by step
    # (exploration seed 1501306: a person approved replaying p0.i5.r1, a worker
    # replayed it, and the same board write proposed again later was judged to have
    # no approval): the run's trace names what each approved replay answered.
    return now < _approved_replays_of(people, slot, key, version)


def _approved_replays_of(people: People, slot: Any, key: str, version: str) -> float:
    """Until when an approval signed under policy ``version`` for a replay that answered
    under ``key`` lives (the latest; -1 when there is none), read from the run's whole
    trace: each replay names its answer's key, and the approval it waited for was asked
    under a key of its own (``approval_requested``)."""
    if slot.session is None:
        return -1.0
    events = slot.session.trace()
    asked = {
        str(e.data.get("action_id")): str(e.data.get("idempotency_key"))
        for e in events
        if e.kind == "approval_requested"
    }
    until = -1.0
    for event in events:
        if event.kind != "effect_replayed" or str(event.data.get("idempotency_key")) != key:
            continue
        approval_key = asked.get(str(event.data.get("action_id")))
        for (signed_key, _), signed in people.approvals.items():
            if signed_key == approval_key:
                until = max(until, signed.get(version, -1.0))
    return until


def _replayed_result(slot: Any, action: str) -> Any:
    """The result the replay handed the agent (``_UNSEEN`` if the step's results hold
    none for it: a replay that ended the run hands nothing on)."""
    if slot.session is None:
        return _UNSEEN
    for result in slot.session.results():
        if result.action_id == action:
            return result.data.get("result")
    return _UNSEEN


def _replay_event(slot: Any, action: str) -> tuple[str, str, str] | None:
    """The key, receipt id and settling authority the run's ``effect_replayed`` event names."""
    if slot.session is None:
        return None
    for event in reversed(slot.session.trace(4)):
        data = event.data
        if event.kind == "effect_replayed" and data.get("action_id") == action:
            key, receipt_id = str(data.get("idempotency_key")), str(data.get("receipt_id"))
            return key, receipt_id, str(data.get("settled_by", ""))
    return None
