"""Count what reached an adapter, as a world that deduplicates nothing would see it.

A deduplicating adapter (the Sandbox, the file workspace, a service that
honours ``Idempotency-Key``) absorbs a resend under the same key, so "one
write landed" holds whether or not the runtime sent twice. A test that
means "sent once" counts the calls instead: :func:`count_calls` wraps a real
adapter's ``execute``, ``compensate``, ``lookup`` and ``lookup_intent`` on the
instance (the adapter still does all the work) and logs each call that
reached it, by idempotency key, whatever it answered. A resend then shows
as a second send, and a look-up the protocol requires shows as a look-up.

Wrap each member before building an :class:`~tether.adapters.Adapters`: the
composite calls its members' methods, so their calls are the ones counted.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Call = Literal["send", "lookup"]


@dataclass
class Calls:
    """Every send and look-up that reached one adapter, in order, by idempotency key."""

    log: list[tuple[Call, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, call: Call, key: str) -> None:
        """Append one call (thread-safe: racing workers share an adapter)."""
        with self._lock:
            self.log.append((call, key))

    def sends(self, key: str | None = None) -> int:
        """Sends under ``key`` (all sends if ``None``): each would be an effect in a plain world."""
        return sum(1 for call, k in self.log if call == "send" and key in (None, k))

    def lookups(self, key: str | None = None) -> int:
        """Look-ups of ``key`` (all look-ups if ``None``)."""
        return sum(1 for call, k in self.log if call == "lookup" and key in (None, k))

    def sent(self) -> Counter[str]:
        """How many times each key was sent."""
        return Counter(k for call, k in self.log if call == "send")

    def resent_unasked(self) -> list[str]:
        """Keys sent again with no look-up of that key since their previous send.

        For a queryable adapter the protocol never does this: a write that may
        have landed is looked up first.
        """
        asked: dict[str, bool] = {}
        found: list[str] = []
        for call, key in self.log:
            if call == "lookup":
                asked[key] = True
                continue
            if key in asked and not asked[key]:
                found.append(key)
            asked[key] = False
        return found


def count_calls(adapter: Any, into: Calls | None = None) -> Calls:
    """Log every send and look-up that reaches ``adapter`` from now on; the log.

    ``into``: an existing log to add to (one log for several adapters, or for
    the adapters each new "process" of a test builds).
    """
    calls = Calls() if into is None else into

    def counted(name: str, call: Call) -> None:
        real: Callable[..., Any] | None = getattr(adapter, name, None)
        if not callable(real):
            return
        original = real

        def wrapper(key: str, *args: Any, **kwargs: Any) -> Any:
            calls.record(call, key)
            return original(key, *args, **kwargs)

        setattr(adapter, name, wrapper)

    counted("execute", "send")
    counted("compensate", "send")
    counted("lookup", "lookup")
    counted("lookup_intent", "lookup")
    return calls
