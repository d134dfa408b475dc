"""What the crash harness found: one judged trial, the cells of the table, and the report.

:func:`judge` is the whole rule, a function of values: what a clean run
made the world receive, what the world received after the crash and the
recoveries, and what the recovered run's signed ledger says. Everything
else here only groups and prints its answers.

The rule compares counts per action kind, not effect by effect: the app's
``effects()`` says how many of each kind the world received, not which.
So two faults of one kind in one trial can hide each other. A message sent
twice and another never sent, with a receipt for each, leaves the world's
count, the ledger's count and the clean run's count equal, and the trial
``ok``. (Without the second receipt the trial still fails, as a lost
receipt.) Each fault alone is always caught; catching the pair needs the
world to name each effect by its idempotency key, which ``effects()`` does
not ask of an app.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from tether.core import Phase, ReviewReason
from tether.runtime import CrashPoint

#: The review reason of an effect the runtime could not confirm: the human gate
#: of DESIGN.md, an acceptable end for an adapter that cannot be asked.
UNCERTAIN = ReviewReason.OUTCOME_UNKNOWN.value


class Verdict(StrEnum):
    """One trial's result, in one word; the worst of a cell's trials names the cell."""

    OK = "ok"  # the run ended as the clean run did; every effect once, every receipt kept
    REVIEW = "review"  # frozen for a person over an effect it could not confirm: by design
    STUCK = "stuck"  # neither: another phase, or a review for another reason
    ERROR = "error"  # the trial could not be judged (see its detail)
    LOST = "lost_receipt"  # the world holds an effect the recovered run has no receipt for
    PHANTOM = "phantom_receipt"  # the run holds a receipt for an effect the world never got
    DUPLICATE = "duplicate"  # the world received an effect more often than in a clean run
    # the run ended as the clean run did, yet the world never got an effect the clean
    # run made, and the run holds no receipt for it either (it believes none was due)
    MISSING = "missing_effect"


# Worst last: a cell reports the worst verdict among its trials.
_SEVERITY = (
    Verdict.OK,
    Verdict.REVIEW,
    Verdict.STUCK,
    Verdict.ERROR,
    Verdict.MISSING,
    Verdict.PHANTOM,
    Verdict.LOST,
    Verdict.DUPLICATE,
)
#: Verdicts that fail the harness (the command exits non-zero).
FAILING = frozenset(
    {Verdict.ERROR, Verdict.MISSING, Verdict.PHANTOM, Verdict.LOST, Verdict.DUPLICATE}
)


@dataclass(frozen=True, slots=True)
class Settled:
    """The run as a recovery child left it: phase, review reasons, receipts by action kind.

    ``committed`` counts effects with a committed receipt on the run's signed
    ledger; ``held`` counts the one uncertain effect a run frozen for review
    keeps as evidence (it may or may not have landed: a person decides).
    """

    phase: str
    reviews: tuple[str, ...] = ()
    committed: Mapping[str, int] = field(default_factory=dict)
    held: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "reviews": list(self.reviews),
            "committed": dict(self.committed),
            "held": dict(self.held),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Settled:
        return cls(
            phase=str(data["phase"]),
            reviews=tuple(str(r) for r in data["reviews"]),
            committed={str(k): int(v) for k, v in data["committed"].items()},
            held={str(k): int(v) for k, v in data["held"].items()},
        )


@dataclass(frozen=True, slots=True)
class Judgement:
    """Per kind: effects beyond the clean run's, effects without a receipt, receipts
    without an effect, effects the clean run made that a finished run never did;
    and the verdict."""

    duplicates: dict[str, int]
    lost: dict[str, int]
    phantom: dict[str, int]
    missing: dict[str, int]
    verdict: Verdict


def judge(
    clean: Mapping[str, int], clean_phase: str, world: Mapping[str, int], settled: Settled
) -> Judgement:
    """Compare one crashed-and-recovered run with the clean run, kind by kind.

    More effects in the world than the clean run made are duplicates. Of the
    rest, any the recovered run neither holds a committed receipt for nor
    keeps as the uncertain effect of a review are lost receipts: the world
    changed and the run does not know it. More committed receipts than the
    world received are phantom receipts: the run believes in an effect that
    never happened (an adapter's look-up that vouched for a send that never
    landed). Fewer effects than the clean run made, in a run that ended in
    the clean run's phase, are missing where no receipt accounts for them:
    the run finished believing it owed nothing more (a look-up that called
    a send it never received "refused"). A run that ended elsewhere has not
    finished, so what it has not made yet is not missing: frozen for review,
    the effects after the frozen one wait for a person; stuck, it is
    reported as stuck.
    """
    kinds = sorted({*clean, *world, *settled.committed, *settled.held})
    finished = settled.phase == clean_phase
    duplicates: dict[str, int] = {}
    lost: dict[str, int] = {}
    phantom: dict[str, int] = {}
    missing: dict[str, int] = {}
    for kind in kinds:
        received = world.get(kind, 0)
        committed = settled.committed.get(kind, 0)
        extra = max(0, received - clean.get(kind, 0))
        unreceipted = max(0, received - extra - committed - settled.held.get(kind, 0))
        # A phantom receipt already counts the effect it vouches for: counted once.
        short = clean.get(kind, 0) - max(received, committed) if finished else 0
        for found, count in (
            (duplicates, extra),
            (lost, unreceipted),
            (phantom, committed - received),
            (missing, short),
        ):
            if count > 0:
                found[kind] = count
    if duplicates:
        verdict = Verdict.DUPLICATE
    elif lost:
        verdict = Verdict.LOST
    elif phantom:
        verdict = Verdict.PHANTOM
    elif missing:
        verdict = Verdict.MISSING
    elif finished and not settled.reviews:
        verdict = Verdict.OK
    elif settled.phase == Phase.NEEDS_REVIEW and set(settled.reviews) == {UNCERTAIN}:
        verdict = Verdict.REVIEW
    else:
        verdict = Verdict.STUCK
    return Judgement(duplicates, lost, phantom, missing, verdict)


@dataclass(frozen=True, slots=True)
class Trial:
    """One run killed at one pass of one point, then recovered in fresh processes."""

    point: CrashPoint
    hit: int
    run_id: str
    verdict: Verdict
    effects: Mapping[str, int] = field(default_factory=dict)  # what the world received
    duplicates: Mapping[str, int] = field(default_factory=dict)
    lost: Mapping[str, int] = field(default_factory=dict)
    phantom: Mapping[str, int] = field(default_factory=dict)
    missing: Mapping[str, int] = field(default_factory=dict)
    phase: str | None = None
    reviews: tuple[str, ...] = ()
    detail: str = ""  # why a trial could not be judged (an error's last lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "verdict": self.verdict.value,
            "phase": self.phase,
            "reviews": list(self.reviews),
            "effects": dict(self.effects),
            "duplicates": dict(self.duplicates),
            "lost_receipts": dict(self.lost),
            "phantom_receipts": dict(self.phantom),
            "missing_effects": dict(self.missing),
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Cell:
    """Every trial at one pass (``hit``) of one crash point: a row of the table."""

    point: CrashPoint
    hit: int
    trials: tuple[Trial, ...]

    @property
    def verdict(self) -> Verdict:
        """The worst verdict among the trials."""
        return max((t.verdict for t in self.trials), key=_SEVERITY.index, default=Verdict.OK)

    @property
    def duplicates(self) -> int:
        return sum(sum(t.duplicates.values()) for t in self.trials)

    @property
    def lost(self) -> int:
        return sum(sum(t.lost.values()) for t in self.trials)

    @property
    def phantom(self) -> int:
        return sum(sum(t.phantom.values()) for t in self.trials)

    @property
    def missing(self) -> int:
        return sum(sum(t.missing.values()) for t in self.trials)

    def count(self, verdict: Verdict) -> int:
        """How many trials ended with ``verdict``."""
        return sum(t.verdict is verdict for t in self.trials)

    def received(self) -> str:
        """What the world received per kind across the trials: ``kind=n`` or ``kind=lo-hi``."""
        kinds = sorted({kind for t in self.trials for kind in t.effects})
        parts = []
        for kind in kinds:
            values = [t.effects.get(kind, 0) for t in self.trials if t.effects]
            low, high = min(values), max(values)
            parts.append(f"{kind}={low}" if low == high else f"{kind}={low}-{high}")
        return " ".join(parts) or "-"

    def to_json(self) -> dict[str, Any]:
        return {
            "point": self.point.value,
            "hit": self.hit,
            "outcome": self.verdict.value,
            "duplicates": self.duplicates,
            "lost_receipts": self.lost,
            "phantom_receipts": self.phantom,
            "missing_effects": self.missing,
            "stuck": self.count(Verdict.STUCK),
            "review": self.count(Verdict.REVIEW),
            "errors": self.count(Verdict.ERROR),
            "trials": [t.to_json() for t in self.trials],
        }


@dataclass(frozen=True, slots=True)
class Baseline:
    """The clean run: how it ended, what the world received, how often it passed each point."""

    phase: str
    effects: Mapping[str, int]
    passes: Mapping[CrashPoint, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "effects": dict(self.effects),
            "passes": {point.value: count for point, count in self.passes.items()},
        }


@dataclass(frozen=True, slots=True)
class CrashReport:
    """Everything one harness run found; :attr:`passed` is what the exit code says."""

    app: str
    store_url: str
    workdir: Path
    trials: int
    recoveries: int
    baseline: Baseline
    cells: tuple[Cell, ...]
    unreached: tuple[CrashPoint, ...]  # asked for, but the clean run never passed them

    @property
    def passed(self) -> bool:
        """No duplicate or missing effect, no lost or phantom receipt, and every trial judged."""
        return not any(t.verdict in FAILING for c in self.cells for t in c.trials)

    def total(self, verdict: Verdict) -> int:
        """Trials with ``verdict`` across every cell."""
        return sum(c.count(verdict) for c in self.cells)

    def to_json(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "store": self.store_url,
            "workdir": str(self.workdir),
            "trials": self.trials,
            "recoveries": self.recoveries,
            "baseline": self.baseline.to_json(),
            "cells": [c.to_json() for c in self.cells],
            "unreached": [p.value for p in self.unreached],
            "totals": {
                "trials": sum(len(c.trials) for c in self.cells),
                "duplicates": sum(c.duplicates for c in self.cells),
                "lost_receipts": sum(c.lost for c in self.cells),
                "phantom_receipts": sum(c.phantom for c in self.cells),
                "missing_effects": sum(c.missing for c in self.cells),
                "stuck": self.total(Verdict.STUCK),
                "review": self.total(Verdict.REVIEW),
                "errors": self.total(Verdict.ERROR),
            },
            "passed": self.passed,
        }

    def render(self) -> str:
        """The report as a table, one row per pass of each crash point."""
        clean = " ".join(f"{k}={v}" for k, v in sorted(self.baseline.effects.items())) or "nothing"
        lines = [
            f"crash harness: {self.app}",
            f"  store {self.store_url}; {self.trials} trial(s) per pass, "
            f"each recovered {self.recoveries} time(s) in fresh processes",
            f"  clean run: {self.baseline.phase}; the world received {clean}",
            "",
        ]
        header = ("point", "hit", "trials", "world received", "dup", "missing", "lost", "phantom")
        rows = [(*header, "stuck", "review", "error", "outcome")]
        for c in self.cells:
            rows.append(
                (
                    c.point.value,
                    str(c.hit),
                    str(len(c.trials)),
                    c.received(),
                    str(c.duplicates),
                    str(c.missing),
                    str(c.lost),
                    str(c.phantom),
                    str(c.count(Verdict.STUCK)),
                    str(c.count(Verdict.REVIEW)),
                    str(c.count(Verdict.ERROR)),
                    _loud(c.verdict),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            cells = [
                text.ljust(width) if i in (0, 3, len(row) - 1) else text.rjust(width)
                for i, (text, width) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
        for point in self.unreached:
            lines.append(f"{point.value}: never passed by the clean run (no trial)")
        lines += ["", *self._problems()]
        totals = self.to_json()["totals"]
        lines.append(
            f"{totals['trials']} trial(s): {totals['duplicates']} duplicate effect(s), "
            f"{totals['missing_effects']} missing effect(s), "
            f"{totals['lost_receipts']} lost receipt(s), "
            f"{totals['phantom_receipts']} phantom receipt(s), {totals['stuck']} stuck, "
            f"{totals['review']} in review, {totals['errors']} error(s): "
            + ("PASS" if self.passed else "FAIL")
        )
        return "\n".join(lines)

    def _problems(self) -> list[str]:
        """One line per trial that did not end ok, so a person can open that run."""
        lines = []
        for c in self.cells:
            for t in c.trials:
                if t.verdict in (Verdict.OK, Verdict.REVIEW):
                    continue
                if t.verdict is Verdict.ERROR:
                    what = t.detail
                elif t.verdict is Verdict.STUCK:
                    what = f"ended {t.phase}" + (f" ({', '.join(t.reviews)})" if t.reviews else "")
                else:
                    # Every count, not only the verdict's: one trial may break two promises.
                    what = "; ".join(
                        f"{label} {_counts(counts)}"
                        for label, counts in (
                            ("extra effects", t.duplicates),
                            ("no receipt for", t.lost),
                            ("receipts the world never saw", t.phantom),
                            ("never made, though the clean run did", t.missing),
                        )
                        if counts
                    )
                lines.append(
                    f"{_loud(t.verdict)} {c.point.value} hit {c.hit} run {t.run_id}: {what}"
                )
        return [*lines, ""] if lines else []


def _loud(verdict: Verdict) -> str:
    """Verdicts a person must look at are in capitals."""
    return (
        verdict.value.upper() if verdict in FAILING or verdict is Verdict.STUCK else verdict.value
    )


def _counts(counts: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
