"""The action ids a run has used, read from its trace: the gate's "used before"."""

from __future__ import annotations

from collections.abc import Iterable

from tether.core._canonical import JSONValue
from tether.core._trace import TraceEvent

#: Trace events that record an accepted action's id: recovery rebuilds the
#: gate's "used before" from these (writes are also in the ledger).
ACTION_EVENTS = frozenset(
    {
        "intent_persisted",
        "approval_requested",
        "action_observed",
        "verifier_ran",
        "run_cancelled",
        "effect_replayed",
    }
)


def action_id_of(kind: str, data: dict[str, JSONValue]) -> str | None:
    """The action id a trace event records as taken (see ``ACTION_EVENTS``), else ``None``."""
    action_id = data.get("action_id")
    return action_id if kind in ACTION_EVENTS and isinstance(action_id, str) else None


def abandoned_stretch(event: TraceEvent) -> tuple[int, int] | None:
    """The trace lengths ``(low, high]`` a ``rewound`` event left behind, else ``None``.

    Events past ``low`` and up to ``high`` are the failed suffix the rewind
    abandoned; they stay in the chain as evidence.
    """
    if event.kind != "rewound":
        return None
    low = event.data.get("prefix_length")
    suffix = event.data.get("failed_suffix")
    high = suffix.get("trace_length") if isinstance(suffix, dict) else None
    if isinstance(low, int) and isinstance(high, int):
        return low, high
    return None


def actions_taken(events: Iterable[TraceEvent]) -> set[str]:
    """The action ids the run has used, as the gate's "used before" must see them.

    Ids used only in a suffix that a rewind left behind are free again: the
    rewound agent regenerates them from the restored context, and whatever
    effect they carried is either undone by the restore or guarded by the
    replay rule (a re-proposed committed effect returns its receipt).
    """
    last_use: dict[str, int] = {}
    for event in events:
        if event.kind == "rewound":
            stretch = abandoned_stretch(event)
            if stretch is not None:
                low, high = stretch
                for freed in [a for a, seq in last_use.items() if low < seq <= high]:
                    del last_use[freed]
            continue
        taken = action_id_of(event.kind, event.data)
        if taken is not None:
            last_use[taken] = event.seq
    return set(last_use)
