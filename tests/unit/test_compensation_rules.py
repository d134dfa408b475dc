"""The pure rules of compensation: what an agent cannot forge, and what the ledger may record."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.conftest import ScriptedAgent, World, write
from tether.core import EffectStatus, IllegalTransitionError, OutcomeKind
from tether.core._commit import seal_commit
from tether.core._compensation import COMPENSATES, EffectRecord
from tether.core._transition import EffectRef, LedgerNote


def test_an_agent_cannot_propose_a_compensation_intent(world: World) -> None:
    """The compensation argument is no kind's argument: the gate refuses it in any proposal."""
    named = {"idempotency_key": "x"}
    forged = write("notes.txt", "", args={"content": "x", COMPENSATES: named})
    session = world.runtime(ScriptedAgent([forged])).start("r1")
    outcome = session.step()
    assert outcome.kind is OutcomeKind.REJECTED and outcome.reason == "unknown_argument"
    assert world.sandbox.write_count() == 0


def test_compensated_is_sealed_only_over_a_committed_effect(world: World) -> None:
    """A note about another effect is judged by that effect's own status: unknown -> compensated is illegal."""
    session = world.runtime(ScriptedAgent([write("notes.txt", "v1\\n")])).start("r1")
    session.step()
    session.land_deferred()  # the receipt rides on the next commit: write it now, to read it
    state = session.state
    entries = world.runtime(ScriptedAgent([])).checkpointer.verified_ledger(state)
    record = EffectRecord.find(entries, entries[0].idempotency_key)
    assert record is not None and record.status is EffectStatus.COMMITTED
    assert record.receipt is not None and record.receipt_fingerprint is not None

    def note(before: EffectStatus) -> LedgerNote:
        ref = EffectRef(record.idempotency_key, record.action_id, record.intent_digest, before)
        return LedgerNote(EffectStatus.COMPENSATED, record.receipt, subject=ref)

    now = datetime(2026, 12, 2, 12, 1, tzinfo=UTC)
    sealed = seal_commit(
        state, state, [], now=now, ledger=(note(EffectStatus.COMMITTED),), effect=None
    )
    assert [e.status for e in sealed.entries] == [EffectStatus.COMPENSATED]
    assert sealed.entries[0].idempotency_key == record.idempotency_key
    with pytest.raises(IllegalTransitionError):
        seal_commit(state, state, [], now=now, ledger=(note(EffectStatus.OUTCOME_UNKNOWN),))
