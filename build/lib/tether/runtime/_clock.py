"""The clock and id source the core never touches directly; both are injected."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """A source of timezone-aware UTC time."""

    def now(self) -> datetime:
        """The current time."""
        ...


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class IdSource(Protocol):
    """Mints unique identifiers (run ids, idempotency keys, case ids)."""

    def new_id(self, prefix: str) -> str:
        """A fresh id beginning with ``prefix``."""
        ...


class RandomIds:
    """128-bit random ids from the operating system's CSPRNG."""

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{secrets.token_hex(16)}"
