"""Directed scenarios: each hard case of the issue, set up on purpose, as data.

A random seed reaches a case like "a ticket's reply lost, then its key
forgotten past retention, then the run recovers" only now and then: the
motif must land when the plan's next item is a ticket, on an adapter that
declares a retention. Here every motif (and a few that only make sense set
up whole) runs against each capability mix it concerns and each plan order,
so the CI corpus holds them every time. They are ordinary scenarios: the
same simulator, the same invariants, shrunk and replayed the same way
(``python -m tether.testing.simulate --directed N``).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from tether.core import Capabilities
from tether.testing.simulate._scenario import (
    CI_KNOBS,
    MOTIFS,
    NEEDS,
    Event,
    Item,
    Scenario,
    allowed,
    draw,
    motif,
)

#: Cases set up whole (never drawn at random, so random seeds keep their meaning).
CASES: dict[str, tuple[Event, ...]] = {
    **MOTIFS,
    "lost_reply_404_ticket": motif("route_404:tickets lost_reply:tickets step step step step"),
    "lost_reply_404_write": motif("route_404:workspace lost_reply:workspace step step step step"),
    # Frozen past retention and aborted: the known replay defect cannot fire,
    # so only the retention rule itself is judged here.
    "lost_past_retention_abort": motif(
        "lost_reply:tickets step advance::400 forget step step review:abort step step"
    ),
    "lost_write_past_retention_abort": motif(
        "lost_reply:workspace step advance::400 forget step step review:abort step step"
    ),
    # A request that hangs: past an in-flight limit a person decides; without one, wait.
    "stuck_in_flight": motif("in_flight:tickets:1 step step advance::200 step step step"),
    "crash_past_retention": motif(
        "crash_point:effect_sent step advance::400 forget step step step review:replan step step"
    ),
    # A healthy run handed to the workers beside one that cannot go on: its services
    # down for ten minutes, its agent failing, or frozen for a person who is away.
    # (The simulated run's lease runs out first, so the workers take it up.)
    "beside_an_outage": motif(
        "down:tickets:600 down:workspace:600 step advance::31 drive neighbour drive drive "
        "advance::2 drive drive advance::5 drive drive"
    ),
    "beside_a_failing_agent": motif(
        "agent_error::50 step advance::31 drive neighbour drive drive advance::2 drive drive "
        "advance::5 drive drive"
    ),
    "beside_a_frozen_run": motif(
        "crash_point:effect_sent hostile:workspace hostile:tickets step step step advance::31 "
        "drive neighbour drive drive drive"
    ),
    # The action contract (invariant 8). Reads, test runs and writes built on a version
    # the environment has left, each refused (the plan: READS, below).
    "stale_actions": motif("step step stale step stale step step stale step step step step"),
    # The last proposal spent on a replay (the plan's first repeat) or on a refusal.
    "replay_spends_the_budget": motif("step step step step step step"),
    "refusal_spends_the_budget": motif("step stale step step step"),
    # Case 1 replanned; case 2 decided with case 1's nonce (refused), then afresh.
    "reused_nonce": motif(
        "crash_point:effect_sent hostile:workspace hostile:tickets step step step review:replan "
        "step step crash_point:effect_sent hostile:workspace hostile:tickets step step step "
        "reuse:replan step step review:replan step step"
    ),
    # A gated write approved under the first policy (read, its send met an outage), then
    # a stricter policy adopted (the first lets any in: CASE_FIELDS): the approval the run
    # holds is no approval under the new one.
    "approval_under_old_policy": motif(
        "step step approve:yes down:workspace:5 step policy:stricter advance::6 step step step "
        "approve:yes step step step"
    ),
    # A write's receipt rides on the run's next commit: dying while it waits in
    # memory (sealed, or while the agent decides), or inside the commit that
    # carries it (before it lands, or after it landed unheard), and a key
    # forgotten past retention while it waits (the session still holds it).
    "crash_with_the_receipt_deferred": motif(
        "crash_point:receipt_deferred step step step step step"
    ),
    "crash_before_the_receipt_lands": motif("step crash_point:before_proposal step step step step"),
    "crash_inside_the_carrying_commit": motif(
        "step crash_commit:before step step step crash_commit:after step step step"
    ),
    "receipt_waits_past_retention": motif(
        "step advance::400 forget step step crash_point:receipt_deferred step advance::400 "
        "forget step step review:replan step step"
    ),
}

_TICKET = Item("ticket", "tickets", "printer")
_WRITE = Item("write", "src/a.txt", "A")
PLANS: tuple[tuple[Item, ...], ...] = (
    (_TICKET, _WRITE, Item("write", "src/a.txt", "B"), _TICKET, Item("finish")),
    (_WRITE, _TICKET, _WRITE, Item("write", "src/b.txt", "C"), Item("finish")),
)
_READ, _TEST = Item("read", "src/a.txt"), Item("test", "unit")
#: A plan whose reads and test runs go stale after a write moved the environment.
READS = (
    _WRITE,
    _READ,
    _TEST,
    Item("write", "src/b.txt", "C"),
    _READ,
    _TEST,
    _TICKET,
    Item("finish"),
)
#: Cases played with plans of their own (instead of PLANS).
CASE_PLANS: dict[str, tuple[tuple[Item, ...], ...]] = {"stale_actions": (READS,)}
#: Cases whose scenario differs in more than its events (the gated kinds, the clause).
CASE_FIELDS: dict[str, dict[str, Any]] = {
    "approval_under_old_policy": {"gated": ("file.write",), "policy_change": "new_occurrence"},
}
#: Cases on a proposals budget that runs out at a given proposal: a number, or
#: "repeat" (the plan's first repeated action: that proposal is a replay).
BUDGETS: dict[str, int | str] = {
    "replay_spends_the_budget": "repeat",
    "refusal_spends_the_budget": 2,
}


def _caps(remote: bool) -> tuple[Capabilities, ...]:
    base = Capabilities(idempotent=True, queryable=True, conditional_writes=False)
    limit = 120.0 if remote else None  # a remote service may declare an in-flight limit
    return tuple(
        replace(c, stateful=not remote)
        for c in (
            replace(base, retention_s=60.0),
            replace(base, idempotent=False, absent_is_final=False, in_flight_limit_s=limit),
            replace(base, idempotent=False, queryable=False),
        )
    )


def directed(knobs: frozenset[str] = CI_KNOBS) -> list[Scenario]:
    """Every case whose knobs are on, against every capability mix and plan order."""
    out: list[Scenario] = []
    index = 0
    for name, events in CASES.items():
        for mix, plan in itertools.product(range(3), CASE_PLANS.get(name, PLANS)):
            index += 1
            if not allowed(events, knobs) or not _route_allowed(events, knobs):
                continue
            base = draw(1_000_000 + index, knobs, events=0)
            fields: dict[str, Any] = {
                "seed": 1_000_000 + index,
                "workspace": _caps(False)[mix],
                "tickets": _caps(True)[mix],
                "gated": (),
                "plan": plan,
                "events": events,
                "proposals": _budget(BUDGETS.get(name), plan, base.proposals),
            }
            out.append(replace(base, **{**fields, **CASE_FIELDS.get(name, {})}))
    return out


def _budget(rule: int | str | None, plan: tuple[Item, ...], default: int) -> int:
    if isinstance(rule, int):
        return rule
    if rule == "repeat":
        return next(n for n, item in enumerate(plan, 1) if item in plan[: n - 1])
    return default


def _route_allowed(events: tuple[Event, ...], knobs: frozenset[str]) -> bool:
    return all(e.kind != "route_404" or "faults" in knobs for e in events) and all(
        e.kind not in NEEDS or NEEDS[e.kind] in knobs for e in events
    )


def case_of(scenario: Scenario) -> str:
    """The name of the directed case a scenario plays (for reports)."""
    for name, events in CASES.items():
        if events == scenario.events:
            return name
    return "?"
