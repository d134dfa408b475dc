"""Named crash points: every place a process can die, so tests can kill it there.

A :class:`CrashPlan` arms one point. At its ``nth`` hit it either raises
:class:`SimulatedCrash` (a ``BaseException``, so ordinary ``except Exception``
handlers in user code cannot swallow it) or sends the process SIGKILL.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from enum import StrEnum


class CrashPoint(StrEnum):
    """The crash windows of DESIGN.md, by name."""

    BEFORE_PROPOSAL = "before_proposal"
    INTENT_PERSISTED = "intent_persisted"
    EFFECT_SENT = "effect_sent"
    #: The receipt is sealed and held for the run's next commit (not durable yet).
    RECEIPT_DEFERRED = "receipt_deferred"
    RECEIPT_PERSISTED = "receipt_persisted"
    CHECKPOINT_WRITE = "checkpoint_write"
    CONTENT_BEFORE_MARK = "content_before_mark"


class SimulatedCrash(BaseException):
    """Raised at an armed crash point in ``raise`` mode."""

    def __init__(self, point: CrashPoint) -> None:
        self.point = point
        super().__init__(f"simulated crash at {point}")


@dataclass
class CrashPlan:
    """Arms ``point`` to fire at its ``nth`` hit, by raising or by SIGKILL."""

    point: CrashPoint | None = None
    nth: int = 1
    mode: str = "raise"
    hits: int = 0

    def __post_init__(self) -> None:
        if self.point is not None and not isinstance(self.point, CrashPoint):
            raise ValueError(f"crash point must be a CrashPoint, not {self.point!r}")
        if self.mode not in {"raise", "kill"}:
            raise ValueError(f"crash mode must be 'raise' or 'kill', not {self.mode!r}")

    def hit(self, point: CrashPoint) -> None:
        """Called by the runtime at ``point``; fires if armed for this hit."""
        if point != self.point:
            return
        self.hits += 1
        if self.hits != self.nth:
            return
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimulatedCrash(point)


NO_CRASH = CrashPlan()
