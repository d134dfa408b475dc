"""A deterministic simulator of the whole protocol (issue 25): ``python -m tether.testing.simulate``.

It drives the real runtime through seeded events (crashes before and after
every commit and at every named crash point, adapters of every capability
with their faults, people, two workers whose leases expire) and checks the
promise after every event, judged against what the simulated world itself
received. See ``_judge`` for the invariants, ``_scenario`` for the knobs
(``KNOWN_DEFECTS``: features switched off in CI until their fix lands) and
the motifs, ``_directed`` for the hard cases set up on purpose, and
``_mutants`` for the planted defects the corpus must catch.

Against your own adapter's declared capabilities::

    from tether.core import Capabilities
    from tether.testing import simulate

    mine = Capabilities(idempotent=False, queryable=True, conditional_writes=False,
                        absent_is_final=False, retention_s=86400)
    result = simulate.run(7, capabilities=mine)   # the workspace-like adapter
    result = simulate.run(7, tickets=mine)        # a remote (not stateful) one
    print(result.ok, result.violations)
"""

from tether.testing.simulate._judge import Violation
from tether.testing.simulate._run import Found, explore, replay, run, shrink
from tether.testing.simulate._runner import Result, simulate
from tether.testing.simulate._scenario import (
    ALL_KNOBS,
    CI_KNOBS,
    KNOWN_DEFECTS,
    Event,
    Item,
    Scenario,
    draw,
)

__all__ = [
    "ALL_KNOBS",
    "CI_KNOBS",
    "KNOWN_DEFECTS",
    "Event",
    "Found",
    "Item",
    "Result",
    "Scenario",
    "Violation",
    "draw",
    "explore",
    "replay",
    "run",
    "shrink",
    "simulate",
]
