"""The adapter calls a transition names, and their answers as values.

Each refusal an adapter can raise becomes the typed answer the settle rules
read (``tether.core._settle``), so the same refusal looks the same whichever
adapter raised it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tether.adapters import Adapter, Fence, UnresolvedWriteError, compensate_with, look_up
from tether.core import (
    AdapterUnavailableError,
    EffectStatus,
    IdempotencyConflictError,
    LookupInconclusiveError,
    PendingWrite,
    PreconditionFailedError,
)
from tether.core._compensation import compensated_effect
from tether.core._transition import (
    Execute,
    ExecuteAnswer,
    ExecuteStatus,
    Lookup,
    LookupAnswer,
    LookupStatus,
)


def ask(adapter: Adapter, call: Lookup) -> LookupAnswer:
    """What the adapter recorded under the call's key (judged against its intent)."""
    try:
        receipt = look_up(adapter, call.key, call.intent)
    except UnresolvedWriteError as exc:
        return LookupAnswer(LookupStatus.IN_PROGRESS, detail=str(exc))
    except AdapterUnavailableError as exc:
        return LookupAnswer(LookupStatus.UNAVAILABLE, detail=str(exc))
    except LookupInconclusiveError as exc:
        # Answered, proving nothing: never absence (see tether.core.read_lookup).
        return LookupAnswer(LookupStatus.INCONCLUSIVE, detail=str(exc))
    except PreconditionFailedError as exc:
        # A look-up that finds the request refused (a stored 4xx) says so this way.
        return LookupAnswer(LookupStatus.REFUSED, detail=str(exc))
    if receipt is None:
        return LookupAnswer(LookupStatus.ABSENT)
    return LookupAnswer(LookupStatus.COMMITTED, receipt)


def send(adapter: Adapter, call: Execute, fence: Fence | None) -> ExecuteAnswer:
    """Carry out the call's intent under its key; the adapter's answer as a value."""
    try:
        if compensated_effect(call.intent) is not None:
            # A compensation is carried out by the adapter that owns the kind it undoes.
            receipt = compensate_with(adapter, call.key, call.intent, fence)
        else:
            receipt = adapter.execute(call.key, call.intent, call.prestate, fence)
    except IdempotencyConflictError as exc:
        return ExecuteAnswer(ExecuteStatus.CONFLICT, exc.receipt, str(exc))
    except PreconditionFailedError as exc:
        return ExecuteAnswer(ExecuteStatus.PRECONDITION_FAILED, detail=str(exc))
    except UnresolvedWriteError as exc:
        return ExecuteAnswer(ExecuteStatus.IN_PROGRESS, detail=str(exc))
    except AdapterUnavailableError as exc:
        return ExecuteAnswer(ExecuteStatus.UNAVAILABLE, detail=str(exc))
    return ExecuteAnswer(ExecuteStatus.COMMITTED, receipt)


@dataclass(frozen=True, slots=True)
class Unrecorded:
    """A send that returned its receipt whose recording commit then failed (this process knows)."""

    call: Execute
    answer: ExecuteAnswer

    def answers(self, pending: PendingWrite | None) -> bool:
        """Whether this is the answer to ``pending``, still dispatched under the same key."""
        receipt = self.answer.receipt
        return (
            pending is not None
            and receipt is not None
            and pending.status is EffectStatus.DISPATCHED
            and pending.idempotency_key == self.call.key == receipt.idempotency_key
            and pending.intent_digest == self.call.intent.digest == receipt.intent_digest
        )
