"""The deterministic simulator: the CI corpus holds the promise, and each known defect is found.

The corpus runs with every knob on except those named in ``KNOWN_DEFECTS``
(features whose defect is being fixed elsewhere). ``FINDS`` pins, for each
known defect, a seed that finds it today: when a fix lands, its seed stops
failing, this test says so, and the knob leaves ``KNOWN_DEFECTS``.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from tether.core import Capabilities
from tether.testing.simulate import CI_KNOBS, KNOWN_DEFECTS, Item, draw, run, shrink, simulate
from tether.testing.simulate.__main__ import main
from tether.testing.simulate._directed import case_of, directed
from tether.testing.simulate._scenario import MOTIFS

#: The corpus: seeds per pass (fewer in the second, ``python -O`` pass; the same knobs).
CORPUS = range(8) if os.environ.get("TETHER_CRASH_TRIALS") else range(24)

#: knob -> (seed that finds its defect today, invariant it breaks).
FINDS = {
    "reverted_writes": (3, 3),
    "retention_past": (42, 1),
    "hostile_answers": (60, 3),
    "receipt_drift": (26, 3),
    "gated_repeats": (9, 2),
    "service_down": (102, 6),
    "policy_change": (19, 2),
}


@pytest.mark.parametrize("seed", CORPUS)
def test_the_ci_corpus_keeps_the_promise(seed: int) -> None:
    """Every CI seed runs the real runtime through its events with no invariant broken."""
    result = run(seed)
    assert result.ok, "\n".join(map(str, result.violations)) + "\n" + result.scenario.describe()
    assert result.events >= 60 and result.checks > 0


def test_the_directed_cases_keep_the_promise() -> None:
    """Every hard case set up on purpose, on every capability mix, breaks no invariant."""
    scenarios = directed()
    assert len(scenarios) >= 50
    broken = [
        (s.seed, case_of(s), r.violations[0]) for s in scenarios for r in [simulate(s)] if not r.ok
    ]
    assert not broken, broken


@pytest.mark.parametrize(
    ("knob", "case", "invariant"),
    [
        ("retention_past", "unknown_past_retention", 1),
        ("receipt_drift", "drift_then_replay", 3),
        ("policy_change", "policy_on_held_write", 2),
    ],
)
def test_a_known_defect_is_found_by_its_directed_case(knob: str, case: str, invariant: int) -> None:
    """With its knob on, the directed case of a known defect breaks the invariant it names."""
    found = {
        v.invariant
        for s in directed(CI_KNOBS | {knob})
        if case_of(s) == case
        for v in simulate(s).violations
    }
    assert invariant in found, f"{knob}: {KNOWN_DEFECTS[knob]} no longer found; fixed?"


def test_a_seed_replays_exactly() -> None:
    """The same seed gives the same events, the same world and the same end, twice."""
    first, second = run(5, events=40), run(5, events=40)
    assert first.scenario == second.scenario
    assert (first.world, first.phase, first.violations) == (
        second.world,
        second.phase,
        second.violations,
    )


@pytest.mark.parametrize("knob", sorted(FINDS))
def test_each_known_defect_is_found_by_its_seed(knob: str) -> None:
    """With its knob on, a known defect's seed breaks the invariant the issue says it breaks."""
    seed, invariant = FINDS[knob]
    result = run(seed, knobs=CI_KNOBS | {knob})
    assert [v.invariant for v in result.violations][:1] == [invariant], (
        f"{knob}: {KNOWN_DEFECTS[knob]} is no longer found by seed {seed}; if it was fixed, "
        "remove the knob from KNOWN_DEFECTS"
    )


def test_a_failure_shrinks_to_fewer_events_that_still_fail() -> None:
    """Shrinking keeps the broken invariant and drops events that do not matter."""
    failing = run(3, knobs=CI_KNOBS | {"reverted_writes"})
    small = shrink(failing, budget=40)
    assert not small.ok and small.violations[0].invariant == 3
    assert len(small.scenario.events) < len(failing.scenario.events)
    assert not simulate(small.scenario).ok  # the shrunk events are data: they replay


def test_a_users_declared_capabilities_are_simulated() -> None:
    """run() takes an adapter's declared capabilities and simulates exactly those."""
    blind = Capabilities(idempotent=False, queryable=False, conditional_writes=False)
    result = run(3, capabilities=blind, events=30)
    assert result.scenario.workspace == blind and result.ok


def test_draw_never_uses_a_knob_that_is_off() -> None:
    """A scenario drawn without a knob holds none of that knob's events."""
    scenario = draw(7, CI_KNOBS - {"crashes", "people"}, events=200)
    kinds = {e.kind for e in scenario.events}
    assert not kinds & {"crash_commit", "crash_point", "approve", "review", "cancel"}
    assert scenario.gated == ()


def test_the_command_replays_a_seed_and_prints_its_event_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--seed N`` replays the seed, prints every event, and exits 0 when nothing broke."""
    assert main(["--seed", "2", "--events", "20"]) == 0
    out = capsys.readouterr().out
    assert "seed 2" in out and "events (20):" in out and "phase at the end" in out


def test_the_issues_ticket_past_retention_is_found_as_a_scenario() -> None:
    """A lost ticket past retention, frozen, replanned and proposed again reaches the world twice.

    The issue's first defect, written as data: the scenario replays exactly
    (delete this test's expectation when the replay rule is fixed).
    """
    tickets = Capabilities(
        idempotent=True, queryable=True, conditional_writes=False, retention_s=60.0, stateful=False
    )
    base = draw(1, CI_KNOBS | {"retention_past"}, tickets=tickets)
    scenario = replace(
        base,
        gated=(),
        plan=(Item("ticket", "tickets", "printer"), Item("finish")),
        events=MOTIFS["unknown_past_retention"],
    )
    result = simulate(scenario)
    assert [v.invariant for v in result.violations][:1] == [1]
    assert sum("printer" in line for line in result.world) == 2
