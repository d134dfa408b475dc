"""A scenario as data: the world's capabilities, the agent's plan, and the events.

Everything the simulator does comes from one :class:`Scenario`, itself drawn
from one ``random.Random(seed)``; events are plain values, so a failing
sequence can be shrunk (events deleted) and replayed exactly.

Knobs switch features off. Each knob that hides a defect known on today's
code is named after that defect in :data:`KNOWN_DEFECTS`; the CI corpus runs
with those knobs off, and the lead turns each on as its fix lands.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from tether.core import Capabilities

#: Knobs whose feature found a defect in the rules as they were, with that defect: each
#: was fixed (issue 25), and the CI corpus now runs with every one of them on. A knob
#: added here hides its feature from the corpus until its defect is fixed.
FOUND_DEFECTS: dict[str, str] = {
    "reverted_writes": "the replay rule swallowed a reverted write A, B, A",
    "retention_past": "a key forgotten past retention: absence taken as proof, the effect sent twice",
    "hostile_answers": "a receipt under a key answered another intent (after a replan)",
    "receipt_drift": "the replay rule never asked the adapter (a deleted or drifted receipt)",
    "gated_repeats": "a replay of an approval-gated effect needed no approval",
    "service_down": "a worker hammered a service that was down (a checkpoint per resend)",
    "policy_change": "a policy change released a write the old policy held",
    "drawn_neighbours": (
        "a run let go without a deferral (a refused recovery releases the lease it took) "
        "was claimed before every run waiting its turn: a caller that kept taking up a "
        "failing run starved a healthy one; and once it waited its turn, it still won "
        "every tie with a run claimable at the same instant, by its smaller run id"
    ),
}

#: Knobs whose defect is known and not yet fixed: the CI corpus switches these off.
KNOWN_DEFECTS: dict[str, str] = {}

#: Every knob; all on is the full exploration.
ALL_KNOBS: frozenset[str] = frozenset(
    {
        *FOUND_DEFECTS,
        "crashes",
        "two_workers",
        "drive",
        "people",
        "faults",
        "in_flight",
        "neighbours",
        "stale_actions",
        "reused_nonces",
        *KNOWN_DEFECTS,
    }
)

#: The knobs the CI corpus runs with: everything but the known, unfixed defects.
CI_KNOBS: frozenset[str] = ALL_KNOBS - frozenset(KNOWN_DEFECTS)

#: The one run every simulation drives.
RUN_ID = "run-sim"

FILES = ("src/a.txt", "src/b.txt")
CONTENTS = ("A", "B", "C")
TITLES = ("printer", "laptop")
#: What the status board can show (its one target: ``board``).
SHOWS = ("green", "red")
#: What a plan sets on the board, in order: A, B, A above all (a state written back).
BOARD_RUNS = (("green", "red", "green"), ("green", "green"), ("red", "green", "red", "red"))


@dataclass(frozen=True, slots=True)
class Item:
    """One step of the agent's plan: a kind, a target, and the content or title."""

    kind: str  # read, test, write, ticket, board, finish
    target: str = ""
    value: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.target}={self.value}".strip(" =")


@dataclass(frozen=True, slots=True)
class Event:
    """One scheduler decision, as data."""

    kind: str
    worker: int = 0
    arg: str = ""
    num: float = 0.0

    def __str__(self) -> str:
        parts = [self.kind]
        if self.kind in _PER_WORKER:
            parts.append(f"w{self.worker}")
        if self.arg:
            parts.append(self.arg)
        if self.num:
            parts.append(f"{self.num:g}")
        return " ".join(parts)


_PER_WORKER = {"step", "drive", "crash_commit", "crash_point"}


@dataclass(frozen=True, slots=True)
class Scenario:
    """One seed's whole simulation, as values."""

    seed: int
    workspace: Capabilities
    tickets: Capabilities
    gated: tuple[str, ...]
    plan: tuple[Item, ...]
    events: tuple[Event, ...]
    knobs: frozenset[str] = field(default_factory=lambda: CI_KNOBS)
    #: The first policy's own clause on adopting another one ("refuse" or "new_occurrence").
    policy_change: str = "refuse"
    #: The task's proposals budget.
    proposals: int = 40

    def describe(self) -> str:
        """The scenario, as a person reads it (the event log included)."""
        lines = [
            f"seed {self.seed}",
            f"workspace {_caps(self.workspace)}",
            f"tickets   {_caps(self.tickets)}",
            f"gated     {', '.join(self.gated) or '-'} (policy_change: {self.policy_change})",
            f"plan      {'; '.join(str(i) for i in self.plan)} (budget: {self.proposals} proposals)",
            f"events ({len(self.events)}):",
        ]
        lines += [f"  {n:4d} {e}" for n, e in enumerate(self.events, 1)]
        return "\n".join(lines)


def _caps(c: Capabilities) -> str:
    words = [
        "idempotent" if c.idempotent else "",
        "queryable" if c.queryable else "",
        "blind" if c.blind else "",
        "" if c.absent_is_final else "absence-not-final",
        f"retention={c.retention_s:g}s" if c.retention_s is not None else "",
        f"in-flight-limit={c.in_flight_limit_s:g}s" if c.in_flight_limit_s is not None else "",
        "fencing" if c.fencing else "",
    ]
    return " ".join(w for w in words if w)


def capabilities(rng: random.Random, knobs: frozenset[str], *, remote: bool) -> Capabilities:
    """One of the capability combinations tether knows, drawn from ``rng``."""
    idempotent = rng.random() < 0.6
    queryable = rng.random() < 0.6
    retention = None
    if "retention_past" in knobs and (idempotent or queryable) and rng.random() < 0.4:
        retention = rng.choice((60.0, 600.0))
    return Capabilities(
        idempotent=idempotent,
        queryable=queryable,
        conditional_writes=False,
        fencing=rng.random() < 0.3,
        absent_is_final=rng.random() < 0.7,
        retention_s=retention,
        in_flight_limit_s=rng.choice((None, 120.0)) if remote else None,
        stateful=not remote,
    )


def draw(
    seed: int,
    knobs: frozenset[str] = CI_KNOBS,
    *,
    events: int = 60,
    workspace: Capabilities | None = None,
    tickets: Capabilities | None = None,
) -> Scenario:
    """The scenario of ``seed`` under ``knobs`` (``workspace``/``tickets``: fixed capabilities)."""
    rng = random.Random(seed)
    ws = capabilities(rng, knobs, remote=False)
    tk = capabilities(rng, knobs, remote=True)
    # A caller's own capabilities replace the drawn ones (drawn anyway, so the
    # rest of the seed is the same); which member they describe sets ``stateful``.
    ws = ws if workspace is None else replace(workspace, stateful=True)
    tk = tk if tickets is None else replace(tickets, stateful=False)
    gated: tuple[str, ...] = ()
    if "people" in knobs:
        gated = tuple(k for k in ("file.write", "ticket.create") if rng.random() < 0.3)
    plan = _plan(rng, knobs, gated)
    # From a stream of its own too (seeds drawn before it keep their plans where it adds none).
    plan = _board(random.Random(seed * 7919 + 5), plan, knobs)
    # From a stream of its own, so that adding it moved no other seed's draw.
    clause = random.Random(seed * 7919 + 1).choice(("refuse", "new_occurrence"))
    drawn = _events(rng, knobs, events)
    for stream, (needed, event, chance, most) in enumerate(_SIDE_EVENTS, 2):
        if needed <= knobs:
            # Each from a stream of its own too: turning one on moves no other event.
            drawn = _insert(random.Random(seed * 7919 + stream), drawn, event, chance, most)
    return Scenario(seed, ws, tk, gated, plan, drawn[:events], knobs, clause)


#: Events set among the drawn ones from streams of their own: the knobs they need,
#: the event, the chance a seed has any, and at most how many.
_SIDE_EVENTS: tuple[tuple[frozenset[str], Event, float, int], ...] = (
    # A healthy run handed to the same workers (see _neighbour).
    (frozenset({"neighbours", "drawn_neighbours", "drive"}), Event("neighbour"), 0.5, 1),
    # The agent builds its next proposal on a version it saw before (the environment moved).
    (frozenset({"stale_actions"}), Event("stale"), 0.4, 3),
    # A reviewer decides the open case with a nonce the run consumed before.
    (frozenset({"reused_nonces", "people"}), Event("reuse", arg="replan"), 0.4, 2),
)


def _insert(
    rng: random.Random, events: tuple[Event, ...], event: Event, chance: float, most: int
) -> tuple[Event, ...]:
    if rng.random() >= chance:
        return events
    out = list(events)
    for _ in range(rng.randint(1, most)):
        out.insert(rng.randrange(len(out) + 1), event)
    return tuple(out)


def _plan(rng: random.Random, knobs: frozenset[str], gated: tuple[str, ...]) -> tuple[Item, ...]:
    items: list[Item] = []
    held: dict[str, list[str]] = {f: [] for f in FILES}  # contents written to each file, in order
    tickets: list[str] = []
    for _ in range(rng.randint(2, 7)):
        roll = rng.random()
        if roll < 0.15:
            items.append(Item("read", rng.choice(FILES)))
        elif roll < 0.25:
            items.append(Item("test", "unit"))
        elif roll < 0.7:
            target = rng.choice(FILES)
            value = rng.choice(CONTENTS)
            seen = held[target]
            reverted = value in seen and seen[-1] != value
            repeat = bool(seen) and seen[-1] == value
            if reverted and "reverted_writes" not in knobs:
                continue
            if repeat and "file.write" in gated and "gated_repeats" not in knobs:
                continue
            seen.append(value)
            items.append(Item("write", target, value))
            if rng.random() < 0.25 and not ("file.write" in gated and "gated_repeats" not in knobs):
                items.append(Item("write", target, value))  # the same write again: a replay
        else:
            title = rng.choice(TITLES)
            if title in tickets and "ticket.create" in gated and "gated_repeats" not in knobs:
                continue
            tickets.append(title)
            items.append(Item("ticket", "tickets", title))
            if rng.random() < 0.25 and "ticket.create" not in gated:
                items.append(Item("ticket", "tickets", title))  # the same ticket again
    items.append(Item("finish"))
    return tuple(items)


def _board(rng: random.Random, plan: tuple[Item, ...], knobs: frozenset[str]) -> tuple[Item, ...]:
    """Now and then, writes to the status board set among the plan's items (before finish)."""
    if rng.random() >= 0.3:
        return plan
    runs = [r for r in BOARD_RUNS if "reverted_writes" in knobs or len(set(r)) == 1]
    values = rng.choice(runs)
    items = list(plan[:-1])
    spots = sorted(rng.randrange(len(items) + 1) for _ in values)
    for offset, (spot, value) in enumerate(zip(spots, values, strict=True)):
        items.insert(spot + offset, Item("board", "board", value))
    return (*items, plan[-1])


def _events(rng: random.Random, knobs: frozenset[str], count: int) -> tuple[Event, ...]:
    workers = 2 if "two_workers" in knobs else 1
    choices: list[tuple[float, str]] = [(10.0, "step"), (2.0, "advance")]
    if "drive" in knobs:
        choices.append((2.0, "drive"))
    if "crashes" in knobs:
        choices += [(1.5, "crash_commit"), (1.5, "crash_point")]
    if "people" in knobs:
        choices += [(2.5, "approve"), (2.0, "review"), (0.3, "cancel")]
        choices += [(0.4, "rewind"), (0.3, "admit"), (0.3, "fork")]
    if "faults" in knobs:
        choices += [(1.0, "lost_reply"), (0.3, "route_404")]
    if "hostile_answers" in knobs:
        choices.append((0.6, "hostile"))
    if "service_down" in knobs:
        choices.append((0.6, "down"))
    if "in_flight" in knobs:
        choices.append((0.5, "in_flight"))
    if "retention_past" in knobs:
        choices.append((0.5, "forget"))
    if "receipt_drift" in knobs:
        choices.append((0.4, "drift"))
    if "policy_change" in knobs:
        choices.append((0.4, "policy"))
    weights = [w for w, _ in choices]
    names = [n for _, n in choices]
    motifs = [m for m in MOTIFS.values() if allowed(m, knobs)]
    out: list[Event] = []
    while len(out) < count:
        worker = rng.randrange(workers)
        if motifs and rng.random() < 0.08:
            # A short sequence that sets up a known hard case (see MOTIFS); its
            # events are ordinary events, shrunk and replayed like any other.
            out += [_bind(e, worker, workers) for e in rng.choice(motifs)]
            continue
        kind = rng.choices(names, weights)[0]
        out.append(_event(rng, kind, worker))
    return tuple(out[:count])


def motif(text: str) -> tuple[Event, ...]:
    """A motif from text: ``kind[:arg[:num]]`` words; ``w1`` means the other worker."""
    events = []
    for word in text.split():
        kind, _, rest = word.partition(":")
        arg, _, num = rest.partition(":")
        worker = 1 if arg == "w1" else 0
        if arg in {"w0", "w1"}:
            arg = ""
        events.append(Event(kind, worker, arg, float(num) if num else 0.0))
    return tuple(events)


#: Short event sequences that set up the cases the issue names, drawn now and then.
MOTIFS: dict[str, tuple[Event, ...]] = {
    "unknown_past_retention": motif(
        "lost_reply:tickets step advance::400 forget step step review:replan step step step"
    ),
    "crash_after_send": motif("crash_point:effect_sent step step step"),
    "crash_around_commit": motif("crash_commit:after step step crash_commit:before step step"),
    # w1 takes the lease and commits nothing yet: only the lease fences w0 now.
    "stale_worker": motif("step advance::45 step:w1 step step step:w1 step"),
    "conflict_replan": motif(
        "crash_point:intent_persisted hostile:workspace hostile:tickets step step step "
        "review:replan step step step step"
    ),
    "drift_then_replay": motif("step step drift:workspace drift:tickets step step step"),
    "tamper_then_replay": motif("step step drift:workspace:1 drift:tickets:1 step step step"),
    # Another intent's receipt under our key, before and after a replan set it aside.
    "key_reused": motif(
        "crash_point:intent_persisted step hostile:workspace hostile:tickets step step "
        "review:replan hostile:workspace hostile:tickets step step step"
    ),
    "down_hammer": motif("down:tickets:60 drive step step advance::5 drive step"),
    # Sent, its reply lost with the process, then the service goes down: a worker waits.
    "down_after_send": motif(
        "crash_point:effect_sent step down:tickets:60 down:workspace:60 drive advance::5 drive"
    ),
    "in_flight_wait": motif("in_flight:tickets step step advance::45 step step"),
    # The approval lands with a commit whose process dies; it has expired by the send.
    "approval_expiry": motif(
        "step approve:short crash_commit:after step advance::20 step step approve:yes step"
    ),
    "unknown_write_past_retention": motif(
        "lost_reply:workspace step advance::400 forget step step review:replan step step step"
    ),
    "rewind_after_writes": motif("step step step rewind::0.5 step step step"),
    "fork_then_repeat": motif("step step fork step step"),
    "policy_on_held_write": motif("step crash_point:effect_sent policy:looser step step step"),
    "stricter_on_held_write": motif(
        "crash_point:intent_persisted step policy:stricter step step step"
    ),
}

#: The knobs a motif's events need.
NEEDS = {
    "lost_reply": "faults",
    "forget": "retention_past",
    "hostile": "hostile_answers",
    "drift": "receipt_drift",
    "down": "service_down",
    "in_flight": "in_flight",
    "crash_point": "crashes",
    "crash_commit": "crashes",
    "review": "people",
    "approve": "people",
    "rewind": "people",
    "fork": "people",
    "drive": "drive",
    "policy": "policy_change",
    "neighbour": "neighbours",
    "agent_error": "faults",
    "stale": "stale_actions",
    "reuse": "reused_nonces",
    "route_404": "faults",
    "route_gone": "faults",
}


def allowed(motif: tuple[Event, ...], knobs: frozenset[str]) -> bool:
    needed = {NEEDS[e.kind] for e in motif if e.kind in NEEDS}
    if any(e.worker for e in motif):
        needed.add("two_workers")
    return needed <= knobs


def _bind(event: Event, worker: int, workers: int) -> Event:
    """A motif's event for the drawn worker (``w1`` in a motif: the other one)."""
    chosen = (worker + event.worker) % workers
    return replace(event, worker=chosen)


def _event(rng: random.Random, kind: str, worker: int) -> Event:
    if kind == "advance":
        return Event(kind, num=rng.choice((1.0, 5.0, 20.0, 45.0, 400.0)))
    if kind == "crash_commit":
        return Event(kind, worker, rng.choice(("before", "after")))
    if kind == "crash_point":
        point = rng.choice(
            (
                "before_proposal",
                "intent_persisted",
                "effect_sent",
                "receipt_deferred",
                "receipt_persisted",
            )
        )
        return Event(kind, worker, point)
    if kind == "approve":
        return Event(kind, arg=rng.choice(("yes", "yes", "yes", "short", "refuse")))
    if kind == "rewind":
        return Event(kind, num=rng.choice((0.3, 0.6, 0.9)))
    if kind == "policy":
        return Event(kind, arg=rng.choice(("looser", "stricter")))
    if kind == "review":
        return Event(kind, arg=rng.choice(("replan", "replan", "abort", "accept")))
    if kind in {"lost_reply", "hostile", "down", "in_flight", "drift", "route_404"}:
        return Event(kind, arg=rng.choice(("workspace", "tickets")), num=_down(rng, kind))
    return Event(kind, worker)


def _down(rng: random.Random, kind: str) -> float:
    if kind == "drift":
        return rng.choice((0.0, 1.0))  # 0: the receipt deleted; 1: its result rewritten
    return rng.choice((5.0, 60.0)) if kind == "down" else 0.0


def with_events(scenario: Scenario, events: tuple[Event, ...]) -> Scenario:
    """The same scenario with another event list (what shrinking tries)."""
    return replace(scenario, events=events)
