"""Run a seed, shrink a failure to the shortest event list that still fails, explore seeds."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tether.core import Capabilities
from tether.testing.simulate._runner import Result, simulate
from tether.testing.simulate._scenario import CI_KNOBS, Scenario, draw, with_events

#: Simulations one shrink may spend.
SHRINK_BUDGET = 150


def run(
    seed: int,
    *,
    knobs: Iterable[str] = CI_KNOBS,
    events: int = 60,
    capabilities: Capabilities | None = None,
    tickets: Capabilities | None = None,
) -> Result:
    """Simulate ``seed``; ``capabilities`` fixes the workspace's (your adapter's declared ones)."""
    scenario = draw(seed, frozenset(knobs), events=events, workspace=capabilities, tickets=tickets)
    return simulate(scenario)


def replay(scenario: Scenario) -> Result:
    """Simulate ``scenario`` exactly as given (a shrunk event list, say)."""
    return simulate(scenario)


def shrink(result: Result, budget: int = SHRINK_BUDGET) -> Result:
    """The shortest event list found that still breaks the same invariant."""
    if result.ok:
        return result
    wanted = result.violations[0].invariant
    best = result
    events = list(result.scenario.events)
    chunk = max(1, len(events) // 2)
    spent = 0
    while chunk >= 1 and spent < budget:
        start = 0
        while start < len(events) and spent < budget:
            trial = events[:start] + events[start + chunk :]
            spent += 1
            tried = simulate(with_events(result.scenario, tuple(trial)))
            if any(v.invariant == wanted for v in tried.violations):
                events, best = trial, tried
            else:
                start += chunk
        chunk //= 2
    return best


@dataclass
class Found:
    """What an exploration saw: its totals and the failures, shrunk."""

    seeds: int = 0
    events: int = 0
    checks: int = 0
    seconds: float = 0.0
    #: CPU seconds this process spent meanwhile (on a machine shared with other
    #: work, events per CPU second is the figure that stays comparable).
    cpu: float = 0.0
    failures: list[Result] | None = None


def explore(
    first_seed: int,
    *,
    minutes: float = 1.0,
    seeds: int | None = None,
    knobs: Iterable[str] = CI_KNOBS,
    events: int = 60,
    progress: Callable[[Found], None] | None = None,
    stop_at_first: bool = False,
) -> Found:
    """Simulate seeds from ``first_seed`` on, for ``minutes`` (or ``seeds`` of them)."""
    chosen = frozenset(knobs)
    failures: list[Result] = []
    found = Found(failures=failures)
    started, cpu = time.perf_counter(), time.process_time()
    seed = first_seed
    while True:
        found.seconds = time.perf_counter() - started
        if seeds is not None and found.seeds >= seeds:
            break
        if seeds is None and found.seconds >= minutes * 60:
            break
        result = simulate(draw(seed, chosen, events=events))
        found.seeds += 1
        found.events += result.events
        found.checks += result.checks
        if not result.ok:
            failures.append(result)
            if stop_at_first:
                break
        if progress is not None:
            found.seconds = time.perf_counter() - started  # the rate shown is this seed's too
            progress(found)
        seed += 1
    found.seconds = time.perf_counter() - started
    found.cpu = time.process_time() - cpu
    return found


def bar(found: Found, minutes: float | None, seeds: int | None) -> None:
    """A plain-text progress line on stderr."""
    if seeds is not None:
        share = found.seeds / max(1, seeds)
    else:
        share = found.seconds / max(1e-9, (minutes or 1) * 60)
    filled = int(min(1.0, share) * 30)
    rate = found.events / max(1e-9, found.seconds)
    failures = len(found.failures or [])
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (30 - filled)}] {found.seeds} seeds, {found.events} events "
        f"({rate:,.0f}/s), {found.checks} checks, {failures} failing"
    )
    sys.stderr.flush()
