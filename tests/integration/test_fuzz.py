"""Thousands of damaged stores, envelopes and documents: every reader and command fails typed.

The inputs come from ``_fuzzkit`` (a real home with four real runs, damaged
as a seed says); ``bench/fuzz.py`` runs the same for 100,000 seeds. A failure
names its seeds and the command that replays one.
"""

from __future__ import annotations

import collections
import os
import shutil

from tests.integration import _fuzzkit, _fuzzpool

#: Seeds 0.. are the bench's first seeds too, so a bench failure below this replays here.
#: The -O pass (``make optimized`` sets TETHER_CRASH_TRIALS) runs the first quarter of
#: each corpus: the first pass already ran all of it, and CI's two passes must stay
#: under 45 minutes.
_LEAN = bool(os.environ.get("TETHER_CRASH_TRIALS"))
LEAN_INPUTS = 500 if _LEAN else 2_000
FULL_INPUTS = 50 if _LEAN else 200


def _failures(results: list[_fuzzkit.Result], full: bool) -> str:
    bad = [r for r in results if r.untyped]
    lines = [f"{len(bad)} of {len(results)} damaged inputs had untyped failures:"]
    for r in bad[:5]:
        lines.append(f"  seed {r.seed} ({r.damage}): {r.untyped[0][-600:]}")
        lines.append(f"    replay: {_fuzzkit.replay_command(r.seed, full)}")
    return "\n".join(lines)


def test_damaged_inputs_reach_readers_and_commands_only_as_typed_errors() -> None:
    """2,000 seeded damages (500 in the -O pass): only TetherErrors escape, exits are documented, no traceback, no hang."""
    results = list(_fuzzpool.run_many(range(LEAN_INPUTS), processes=2, full=False))
    assert len(results) == LEAN_INPUTS
    assert all(r.ok for r in results), _failures(results, full=False)
    families = collections.Counter(r.family for r in results)
    assert set(families) == {"sql", "cycle", "reseal", "blob", "envelope", "file", "dbfile"}
    # The damage must reach the readers, not only be shrugged off: most inputs are refused.
    refused = sum(1 for r in results if r.typed)
    assert refused > LEAN_INPUTS // 2, f"only {refused} inputs were refused by any reader"


def test_every_run_and_every_command_sees_each_damaged_input() -> None:
    """200 seeds (50 in the -O pass) read through every run's readers and all nine CLI invocations stay typed."""
    seeds = range(1_000_000, 1_000_000 + FULL_INPUTS)
    results = list(_fuzzpool.run_many(seeds, processes=2, full=True))
    assert len(results) == FULL_INPUTS
    assert all(r.ok for r in results), _failures(results, full=True)


def test_the_undamaged_home_is_read_back_whole() -> None:
    """The control: with nothing damaged every reader accepts and every command succeeds."""
    result = _fuzzkit.Result(-1, "none", "")
    home = _fuzzkit.base_for_process()
    copy = home.parent / "control"
    shutil.copytree(home, copy)
    try:
        _fuzzkit.check_undamaged(result, copy)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    assert result.ok, result.untyped
    assert result.typed == {}, result.typed
