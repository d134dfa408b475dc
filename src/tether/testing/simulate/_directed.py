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
    # (Added last, so the cases above keep their seeds: the mutants' pins name them.)
    # An unknown outcome settled by a person who looked in the world: the reply lost
    # after the effect landed (landed), or the service down under a blind send that
    # never landed (not_landed, then sent once more); killed right after the resend.
    "settle_lost_reply": motif("lost_reply:tickets step step review:settle step step step step"),
    "settle_lost_write": motif("lost_reply:workspace step step review:settle step step step step"),
    "settle_never_landed": motif(
        "down:tickets:5 down:workspace:5 step step advance::6 review:settle step step "
        "review:settle step step step"
    ),
    "settle_then_crash": motif(
        "down:tickets:5 down:workspace:5 step step advance::6 review:settle "
        "crash_point:effect_sent step step review:settle advance::31 step step review:settle "
        "step step review:settle step step step"
    ),
    # Replanned, then the same effect proposed again: a person finds the earlier one landed.
    "settle_earlier": motif(
        "lost_reply:tickets lost_reply:workspace step step review:replan step step "
        "review:settle step step step"
    ),
    # The look-up route is gone and the adapter says its answer proves nothing (as
    # HttpEffect reads a "no such route" 404): resent only where a resend is safe.
    "lost_reply_no_route_ticket": motif(
        "route_gone:tickets lost_reply:tickets step step step step"
    ),
    "lost_reply_no_route_write": motif(
        "route_gone:workspace lost_reply:workspace step step step step"
    ),
    # (Cases are numbered in this order: a new one goes last.)
    # A healthy run whose launcher died holding its lease becomes claimable when that
    # lease runs out; the simulated run, bound to a policy that refuses the one every
    # process now runs, is taken up and let go at once by each recovery (a step) between
    # the workers' claims. Let go, it waits behind the healthy run (claimable since
    # before), not ahead of it as if claimable "since ever".
    "beside_a_released_run": motif(
        "policy:stricter advance::31 neighbour:died advance::31 step drive step drive "
        "step drive step drive"
    ),
    # Services down and workers claiming again and again at one instant: only the first
    # claim reaches the run (it is backed off); a run let go with no back-off would be
    # claimed by each, and each claim would knock on the service again.
    "claims_while_down": motif(
        "down:tickets:600 down:workspace:600 step advance::31 drive drive:w1 drive drive:w1 "
        "drive drive:w1 advance::1 drive drive:w1"
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
#: A, B, A on the status board (a state nothing reads), then A once more: written
#: again where the board is declared a state, replayed only the last time.
BOARD_PLAN = (
    *(Item("board", "board", v) for v in ("green", "red", "green", "green")),
    Item("finish"),
)
#: Cases played against every mix, numbered from :data:`LATER_FROM` on (so a case added
#: to CASES, which shifts the second round's numbers, never moves their seeds).
LATER_CASES: dict[str, tuple[Event, ...]] = {
    "board_reverted": motif("step step step step step step"),
    "board_reverted_crash": motif(
        "step step crash_point:effect_sent step step step step step step"
    ),
}
#: Where LATER_CASES' numbers start (directed seed ``1_000_000 + LATER_FROM + n``).
LATER_FROM = 5_000
#: Cases played with plans of their own (instead of PLANS).
CASE_PLANS: dict[str, tuple[tuple[Item, ...], ...]] = {
    "stale_actions": (READS,),
    "board_reverted": (BOARD_PLAN,),
    "board_reverted_crash": (BOARD_PLAN,),
}
#: Cases whose scenario differs in more than its events (the gated kinds, the clause).
CASE_FIELDS: dict[str, dict[str, Any]] = {
    "approval_under_old_policy": {"gated": ("file.write",), "policy_change": "new_occurrence"},
    # The first policy refuses the stricter one: no worker may take the run on under it.
    "beside_a_released_run": {"policy_change": "refuse"},
}
#: Cases on a proposals budget that runs out at a given proposal: a number, or
#: "repeat" (the plan's first repeated action: that proposal is a replay).
BUDGETS: dict[str, int | str] = {
    "replay_spends_the_budget": "repeat",
    "refusal_spends_the_budget": 2,
}


def capability_mixes(remote: bool) -> tuple[Capabilities, ...]:
    """The capability mixes, as the profiles of shipped adapters declare them.

    For an ``HttpEffect``: ``REFERENCE_PROFILE`` (a look-up, absence final, a
    safe resend, a retention); a look-up whose absence is not final; the
    no-assumption default, ``ServiceProfile()`` (blind); a safe same-key
    resend without a look-up (``IETF_DRAFT``, ``STRIPE_REPLAY``: idempotent,
    not queryable, a retention); a look-up whose absence is final on a
    service that cannot replay (``CONFLICT_409`` with a look-up). The last
    two are appended, so the seeds of the first three keep their meaning.
    """
    base = Capabilities(idempotent=True, queryable=True, conditional_writes=False)
    limit = 120.0 if remote else None  # a remote service may declare an in-flight limit
    # The file workspace keeps its keys for ever (as FileWorkspace declares): its writes'
    # receipts ride on the next commit; a remote service's keys are kept 60 s.
    kept = 60.0 if remote else None
    return tuple(
        replace(c, stateful=not remote)
        for c in (
            replace(base, retention_s=kept),
            replace(base, idempotent=False, absent_is_final=False, in_flight_limit_s=limit),
            replace(base, idempotent=False, queryable=False),
            replace(base, queryable=False, retention_s=60.0, in_flight_limit_s=limit),
            replace(base, idempotent=False, retention_s=60.0, in_flight_limit_s=limit),
        )
    )


#: The mixes directed cases were first played on; later mixes are numbered after them.
FIRST_MIXES = 3


def directed(knobs: frozenset[str] = CI_KNOBS) -> list[Scenario]:
    """Every case whose knobs are on, against every capability mix and plan order."""
    out: list[Scenario] = []
    index = 0
    mixes = len(capability_mixes(False))
    rounds = (range(FIRST_MIXES), range(FIRST_MIXES, mixes))
    played = [
        (name, events, chosen, False)
        for chosen, (name, events) in itertools.product(rounds, CASES.items())
    ]
    played += [(name, events, range(mixes), True) for name, events in LATER_CASES.items()]
    for name, events, chosen, later in played:
        if later and index < LATER_FROM:
            index = LATER_FROM
        for mix, plan in itertools.product(chosen, CASE_PLANS.get(name, PLANS)):
            index += 1
            if not allowed(events, knobs) or not _route_allowed(events, knobs):
                continue
            base = draw(1_000_000 + index, knobs, events=0)
            fields: dict[str, Any] = {
                "seed": 1_000_000 + index,
                "workspace": capability_mixes(False)[mix],
                "tickets": capability_mixes(True)[mix],
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
    for name, events in {**CASES, **LATER_CASES}.items():
        if events == scenario.events:
            return name
    return "?"
