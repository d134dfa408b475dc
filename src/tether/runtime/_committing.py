"""A session's half that commits: seal a step, write it in one fenced transaction, or defer it.

:class:`Committing` is a base class of :class:`~tether.runtime.RunSession`
(as :class:`~tether.runtime._lease.LeaseHolder` is): every checkpoint a
session writes goes through :meth:`Committing.commit`, which seals the new
generation on top of the current state (``core.seal_commit``), stores its
snapshot where it is a rewind point, and writes it with its trace events,
ledger entries and blobs in ONE compare-and-set on (generation, lease
version). A transition core marks ``deferred`` (a receipt that may ride on
the run's next commit) is sealed by :meth:`Committing.defer` and written by
that next commit, in its transaction (see ``_deferred``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from tether.adapters import offers_snapshots
from tether.core import (
    ActionResult,
    CommitOutcomeUnknownError,
    GenerationConflictError,
    LeaseError,
    LedgerEntry,
    PendingWrite,
    Phase,
    RunState,
)
from tether.core import _steps as step_rules
from tether.core._commit import (
    Sealed,
    deferred,
    rest_point,
    seal_commit,
    with_subject_terms,
)
from tether.core._listing import listing_of
from tether.core._rewind import RestPoint
from tether.core._transition import LedgerNote, Transition
from tether.runtime import _rewind
from tether.runtime._agent import AgentContext
from tether.runtime._deferred import Deferred
from tether.runtime._history import History
from tether.runtime._lease import LeaseHolder
from tether.runtime._view import Event, Runtime
from tether.store import LeaseRequest


class Committing(LeaseHolder):
    """The state a session holds and how it moves: commit, defer, reload (a base of ``RunSession``)."""

    rt: Runtime
    state: RunState
    context: AgentContext
    digest: str | None
    history: History
    release_secrets: bool
    resumed_at: Any
    _opening: dict[str, Any] | None
    _admitted: tuple[dict[str, Any], dict[str, bytes]]
    _unsettled: CommitOutcomeUnknownError | None
    _deferred: Deferred | None
    _results: tuple[str, tuple[ActionResult, ...]] | None
    _snapshotted: str | None
    _blobs_known: set[str]

    def reopen(self, state: RunState) -> None:
        """Ask the run's past afresh from ``state`` (after a recovery, a reload, a rewind)."""
        self.history = History(self.rt.checkpointer, state, self._landed_state)

    def _landed_state(self) -> RunState:
        """The current state, a deferred receipt landed first (a reader of the whole past)."""
        self.land_deferred()
        return self.state

    def take_opening(self) -> tuple[dict[str, Any] | None, dict[str, bytes]]:
        """The recovery's epoch opening not yet committed and its admission record, handed over.

        A rewind applied right after a recovery is itself the admitted opening
        of the new epoch; the recovery's facts travel inside its event, and its
        record is stored with it.
        """
        opening, (_, blobs) = self._opening, self._admitted
        self._opening, self._admitted = None, ({}, {})
        return opening, blobs

    # -- committing ----------------------------------------------------------

    def open_epoch(
        self,
        recovered: dict[str, Any],
        changes: dict[str, Any] | None = None,
        blobs: dict[str, bytes] | None = None,
    ) -> None:
        """Begin a new epoch: its ``recovered`` event lands with the first commit.

        ``changes`` (the new epoch id, the admission, the work occurrence) and
        ``blobs`` (the admission record) land with it, in the same commit.
        """
        self._opening = dict(recovered)
        self._admitted = (dict(changes or {}), dict(blobs or {}))

    def commit(
        self,
        state: RunState,
        events: list[Event],
        *,
        context: AgentContext | None = None,
        blobs: dict[str, bytes] | None = None,
        ledger: tuple[LedgerNote, ...] = (),
        effect: PendingWrite | None = None,
        lease_to: LeaseRequest | None = None,
    ) -> tuple[LedgerEntry, ...]:
        """Checkpoint ``state`` as the next generation, with its trace events and ledger entries.

        ``ledger`` notes belong to ``effect`` (the write they record); they are
        sealed into the run's ledger chain, whose new head the checkpoint pins,
        and land in the same fenced transaction or not at all. The sealed
        entries are returned.
        """
        if self._unsettled is not None:
            raise CommitOutcomeUnknownError(
                f"run {self.run_id}: an earlier commit's outcome is unknown; reload() first",
                run_id=self.run_id,
                generation=self._unsettled.generation,
                checkpoint_digest=self._unsettled.checkpoint_digest,
            )
        if any(n.subject is not None and n.subject.terms is None for n in ledger):
            # A landed compensation's note names the effect it undid, not its terms
            # (core settles it from the pending write alone): read them once, here,
            # by the state's heads, so a deferred commit lands first.
            self.land_deferred()
            ledger = with_subject_terms(ledger, self.rt.checkpointer.verified_ledger(self.state))
        blobs = dict(blobs or {})
        opening = self._opening
        if opening is not None:
            changes, admitted = self._admitted
            state = state.evolve(epoch=self.state.epoch + 1, worker=self.rt.worker, **changes)
            events = [("recovered", opening), *events]
            blobs.update(admitted)
        if context is not None:
            # Unchanged secret items (withheld ones included) keep their ciphertext.
            context = context.seal(
                run_id=self.run_id, box=self.rt.checkpointer.secrets, previous=self.context
            )
            context_digest, body = context.encode()
            if context_digest != self.state.agent_context_digest:
                blobs[context_digest] = body
            state = state.evolve(agent_context_digest=context_digest)
        riding = self._deferred
        # Carrying a deferred commit whose state was at rest, this checkpoint (not at
        # rest itself) records that state: the rewind point the write step left.
        rest = None if riding is None else rest_point(self.state, state)
        point = rest.environment if rest is not None else state.environment
        root = point.state_fingerprint
        snapshotted = self._snapshotted
        resting = state.phase is Phase.RUNNING and state.pending is None and state.rewinding is None
        if (
            (resting or rest is not None)
            and root != snapshotted
            and offers_snapshots(self.rt.adapter)
        ):
            # The workspace this checkpoint's rewind point records, stored by content
            # with it: a later rewind to this generation restores exactly this.
            # Only a rewind point pays (a checkpoint at rest, or its rest point).
            found = _rewind.snapshot_blobs(
                self.rt, root, self._blobs_known, since_known=snapshotted is not None
            )
            if found is not None:
                blobs.update(found)
                snapshotted = root
        sealed = self._seal(state, events, ledger, effect, rest=rest)
        new = sealed.state
        # A deferred commit lands with this one: its rows first, in one transaction.
        events_out = list(sealed.events) if riding is None else [*riding.events, *sealed.events]
        entries_out = list(sealed.entries) if riding is None else [*riding.entries, *sealed.entries]
        blobs_out = blobs if riding is None else {**riding.blobs, **blobs}
        try:
            digest, granted = self.rt.checkpointer.advance(
                new,
                self.state.generation,
                events_out,
                blobs_out or None,
                expected_lease_version=0 if self.lease is None else self.lease.lease_version,
                ledger=entries_out,
                lease_to=lease_to,
                listing=listing_of(new, self.rt.policy),
            )
        except CommitOutcomeUnknownError as exc:
            self._unsettled = exc  # landed or not, only the store can say
            raise
        self.state = new
        self.digest = digest
        self._deferred = None
        self._snapshotted = snapshotted
        if len(self._blobs_known) > _BLOBS_REMEMBERED:
            self.forget_snapshot()  # a hint only: the store answers what it forgets
        self._blobs_known.update(blobs_out)
        if sealed.entries:
            self.history.committed(sealed.entries)
        if granted is not None:
            self.hold(granted)
        self._opening = None
        self._admitted = ({}, {})
        if context is not None:
            self.context = context
        return sealed.entries

    def defer(
        self,
        state: RunState,
        events: list[Event],
        *,
        blobs: dict[str, bytes],
        ledger: tuple[LedgerNote, ...],
        effect: PendingWrite | None,
    ) -> tuple[LedgerEntry, ...]:
        """Seal ``state`` as :meth:`commit` would, and hold it for the run's next commit.

        Nothing is written: ``state`` becomes the session's state (at the
        generation it had), and the next commit writes its rows first, in its
        own transaction. Until then the store says what it said before (a write
        still ``dispatched``), which recovery settles by asking the adapter.
        """
        sealed = deferred(self._seal(state, events, ledger, effect), self.state)
        self._deferred = Deferred.after(self._deferred, self.state, sealed, blobs)
        self.state = sealed.state
        if sealed.entries:
            self.history.committed(sealed.entries)
        return sealed.entries

    def forget_snapshot(self) -> None:
        """Forget which blobs this session saw stored: its next snapshot asks the store.

        Called when the workspace becomes a tree this session did not
        snapshot (a rewind's restore), and when the remembered digests grow
        too many.
        """
        self._snapshotted = None
        self._blobs_known.clear()

    @property
    def riding(self) -> int:
        """How many trace events wait for the run's next commit (sealed, not written)."""
        return 0 if self._deferred is None else len(self._deferred.events)

    def _seal(
        self,
        state: RunState,
        events: Sequence[Event],
        ledger: tuple[LedgerNote, ...],
        effect: PendingWrite | None,
        rest: RestPoint | None = None,
    ) -> Sealed:
        """``state`` sealed on top of the session's, with its events, ledger rows and the
        effect's terms (one place for the commit written now and the one that waits)."""
        return seal_commit(
            self.state,
            state,
            events,
            now=self.rt.clock.now(),
            ledger=ledger,
            effect=effect,
            terms=None if effect is None or not ledger else self.rt.effect_terms(effect.intent),
            resumed_at=self.resumed_at,
            rest=rest,
        )

    def land_deferred(self) -> None:
        """Write a deferred commit now, as the checkpoint it would have been (if there is one).

        Called before the session reads the run's past from the store by its
        heads, and before it lets the run go; a step's own commit carries it
        otherwise.
        """
        if self._deferred is not None:
            self.commit(self.state, [])

    def release(self) -> None:
        """Give the lease up, a deferred receipt landed first (a clean shutdown).

        If another writer has moved the run meanwhile (the lease was taken
        over), the receipt is not landed: the new owner settles that write by
        its key, and the lease is given up as before.
        """
        try:
            if self.lease is not None or self.rt.lease_ttl_s is None:
                with contextlib.suppress(LeaseError, GenerationConflictError):
                    self.land_deferred()
        finally:
            super().release()

    def reload(self) -> RunState:
        """Read the run back from the store after a commit whose outcome was unknown.

        The mark says which way it went: at the checkpoint that was being
        committed (it landed: the session carries on from it), or still at
        the one before (it did not: the step is simply taken again). Anything
        else means another writer moved the run, and this session must stop.
        Nothing left the process after the lost commit, so either way no
        effect is repeated: a write made pending is settled by its key.
        """
        unknown = self._unsettled
        if unknown is None:
            return self.state
        cp = self.rt.checkpointer
        restored = cp.load(self.run_id)  # verified: signature, schema
        cp.check_generation(restored)
        digest = restored.mark.checkpoint_digest
        if digest == unknown.checkpoint_digest:
            state = restored.state
            self.context = cp.context(state, release=self.release_secrets)
            self.reopen(state)
            self.state, self.digest, self._opening, self._results = state, digest, None, None
            self._admitted = ({}, {})
            self._deferred = None  # it landed with the commit
        elif digest != self.digest or restored.state.generation != self.state.generation:
            raise GenerationConflictError(
                self.run_id, self.state.generation, restored.state.generation
            )
        self._unsettled = None
        return self.state

    def _remember(self, transition: Transition) -> None:
        """Keep what a committed transition recorded: its action id, its results."""
        for kind, data in transition.events:
            action_id = step_rules.action_id_of(kind, data)
            if action_id is not None:
                self.history.used(action_id)
        state = transition.state
        if state is not None and state.results_digest is not None:
            body = dict(transition.blobs).get(state.results_digest)
            if body is not None:
                self._results = (
                    state.results_digest,
                    step_rules.decode_results(state.results_digest, body),
                )


#: At most this many committed blob digests are remembered per session (a
#: 250,000-file workspace's snapshot, with room): the store answers beyond it.
_BLOBS_REMEMBERED = 1_000_000
