"""Advance and restore checkpoints: the one atomic protocol, and the ordered checks.

Advance: validate (schema, invariants, serializability) -> seal -> commit.
Co-located stores commit content and mark in one transaction; separate
stores write content write-once, then compare-and-set the mark. Either way a
failed validation moves nothing, and a crash leaves the previous generation
as the recovery point.

Restore checks, failing closed at the first failure: the mark exists; strict
parse and checksum; key id trusted and not retired; HMAC; schema version;
task, policy and scenario; generation and digest equal to the mark; the live
environment; cross-object invariants; the heads of the trace and the ledger
and the entries of the pending write, proven on the chains the checkpoint
pins; no ledger row past the signed length that a signed checkpoint does not
account for.

What a restore reads does not grow with the run's history; what it proves,
and what only ``tether verify`` does, is docs/explanation/restore-checks.md.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tether.adapters import Adapter
from tether.core import (
    ActionResult,
    CheckpointCorruptError,
    CommitOutcomeUnknownError,
    EffectStatus,
    EnvironmentDriftError,
    EnvironmentState,
    LedgerEntry,
    LedgerIntegrityError,
    MissingHighWaterMarkError,
    Phase,
    PolicyMismatchError,
    RewindRefusedError,
    RunState,
    ScenarioMismatchError,
    SchemaVersionError,
    StaleCheckpointError,
    StaleMarkError,
    StoreError,
    TaskMismatchError,
    TetherError,
    TraceEvent,
    TraceIntegrityError,
    UnknownFieldError,
)
from tether.core import Binding as CoreBinding
from tether.core import _steps as step_rules
from tether.core._commit import rewind_point
from tether.core._ledger import orphans_of, stray_error, verify_ledger
from tether.core._listing import Listing
from tether.core._payload import (
    READABLE_SCHEMA_VERSIONS,
    encode_valid_state,
    expand_payload,
    member_digests,
    validate_state,
)
from tether.core._state import GENESIS_HASH
from tether.core._trace import verify_trace
from tether.crypto import (
    Keyring,
    SecretBox,
    SecretKeyError,
    envelope_digest,
    open_envelope,
    seal,
)
from tether.runtime._agent import AgentContext, Withheld
from tether.runtime._chains import ProvenChain
from tether.runtime._crash import NO_CRASH, CrashPlan, CrashPoint
from tether.store import (
    Commit,
    CommitStore,
    ContentStore,
    GenerationStore,
    Lease,
    LeaseRequest,
    Mark,
)


@dataclass(frozen=True, slots=True)
class Restored:
    """A verified checkpoint and the mark that vouched for it."""

    state: RunState
    mark: Mark
    envelope: bytes
    #: What a restore read of the effect ledger, oldest first, proven on the chain
    #: the state signed: from the pending write's first entry (or the head
    #: row, with nothing pending) up to the head. Not the whole ledger.
    ledger: tuple[LedgerEntry, ...] = ()
    #: The signed state said ``intended`` but unlanded content beyond the mark
    #: says the write was dispatched: ``state`` now says ``dispatched``, and the
    #: first commit must record it in the ledger.
    maybe_sent: bool = False
    #: The live environment, when it is further along than the checkpoint and
    #: its pending write explain (writes the restored history never saw: the
    #: store was put back, or another runtime wrote here). The run must go to
    #: review, not act.
    ahead: EnvironmentState | None = None
    #: The live environment, when it is the checkpoint's own instance but not
    #: a state the checkpoint explains (someone changed it outside the run).
    #: The run must go to review with both states, not act.
    drifted: EnvironmentState | None = None


class Checkpointer:
    """Seals and commits run state; verifies and restores it."""

    def __init__(
        self,
        content: ContentStore,
        keyring: Keyring,
        marks: GenerationStore | None = None,
        crash: CrashPlan = NO_CRASH,
        secrets: SecretBox | None = None,
    ) -> None:
        self.content = content
        # One transaction is possible only when both roles are the same database.
        self._colocated: CommitStore | None = None
        if (marks is None or marks is content) and isinstance(content, CommitStore):  # type: ignore[comparison-overlap]
            self._colocated = content
        self.marks: GenerationStore = (
            marks if marks is not None else _as_marks(content, self._colocated)
        )
        self.keyring = keyring
        if secrets is not None:
            shared = secrets.shares_key_with(keyring)
            if shared is not None:
                # Who may verify a checkpoint is not who may read its secrets.
                raise SecretKeyError(
                    f"the secret box holds the same key as checkpoint key id {shared!r}; "
                    "secret keys must be separate from the checkpoint keyring",
                    key_id=shared,
                )
        #: Seals the agent context's secret items (and opens them, when released).
        self.secrets = secrets
        self.crash = crash
        # run id -> (generation, digests of the state parts its checkpoint names,
        # {member: digest} of every sub-document its state has, inline or not).
        self._parts: dict[str, tuple[int, frozenset[str], Mapping[str, str]]] = {}

    @property
    def colocated(self) -> bool:
        return self._colocated is not None

    def advance(
        self,
        state: RunState,
        expected_generation: int,
        events: Sequence[TraceEvent] = (),
        blobs: Mapping[str, bytes] | None = None,
        expected_lease_version: int = 0,
        ledger: Sequence[LedgerEntry] = (),
        lease_to: LeaseRequest | None = None,
        listing: Listing | None = None,
    ) -> tuple[str, Lease | None]:
        """Commit ``state`` as generation ``expected_generation + 1``: its digest, and a lease.

        ``lease_to`` (the first generation only) creates the run leased to
        that worker in the same statement; the lease granted is returned.
        ``listing`` (what a list of runs shows of ``state``) lands with the mark.
        """
        if state.generation != expected_generation + 1:
            raise CheckpointCorruptError(
                f"state generation {state.generation} does not follow {expected_generation}",
                run_id=state.run_id,
            )
        # Sub-documents changed since the checkpoint this one follows go inline (core._payload).
        landed = self._parts.get(state.run_id)
        landed = landed if landed is not None and landed[0] == expected_generation else None
        encoded = encode_valid_state(state, None if landed is None else landed[2])
        envelope = seal(encoded.payload, self.keyring)
        checkpoint_digest = envelope_digest(envelope)
        # The state's parts go with it, content-addressed; those the checkpoint
        # this one follows already named are stored (they landed with it).
        known = landed[1] if landed is not None else ()
        parts = {d: data for d, data in encoded.parts.items() if d not in known}
        if parts:
            blobs = {**parts, **(blobs or {})}
        commit = Commit(
            run_id=state.run_id,
            generation=state.generation,
            checkpoint_digest=checkpoint_digest,
            envelope=envelope,
            events=tuple(events),
            blobs=blobs,
            phase=state.phase.value,
            ledger=tuple(ledger),
            listing=listing,
        )
        # "Receipt persisted, state not advanced": the receipt and the advance
        # are one commit now, so that window is inside it (co-located: the
        # transaction; apart: content written, mark not yet moved).
        receipt = any(e.status is EffectStatus.COMMITTED for e in ledger)

        def inside() -> None:
            self.crash.hit(CrashPoint.CHECKPOINT_WRITE)
            if receipt and self._colocated is not None:
                self.crash.hit(CrashPoint.RECEIPT_PERSISTED)

        try:
            if self._colocated is not None:
                lease = self._colocated.commit(
                    commit, expected_generation, expected_lease_version, inside, lease_to=lease_to
                )
            else:
                self.content.put_content(commit, inside)
                if receipt:
                    self.crash.hit(CrashPoint.RECEIPT_PERSISTED)
                self.crash.hit(CrashPoint.CONTENT_BEFORE_MARK)
                lease = self.marks.cas_mark(
                    state.run_id,
                    expected_generation,
                    state.generation,
                    checkpoint_digest,
                    expected_lease_version,
                    phase=state.phase.value,
                    lease_to=lease_to,
                    listing=listing,
                )
        except CommitOutcomeUnknownError as exc:
            raise CommitOutcomeUnknownError(
                f"run {state.run_id}: the commit of generation {state.generation} may or may "
                f"not have landed: {exc}",
                run_id=state.run_id,
                generation=state.generation,
                checkpoint_digest=checkpoint_digest,
            ) from exc
        self._landed(state.run_id, state.generation, encoded.parts, encoded.digests)
        return checkpoint_digest, lease

    def _landed(
        self, run_id: str, generation: int, parts: Collection[str], digests: Mapping[str, str]
    ) -> None:
        """Remember the parts the run's checkpoint at ``generation`` names, and its sub-documents'."""
        if len(self._parts) >= _PARTS_REMEMBERED:
            self._parts.clear()  # a hint only: a part sent again is simply there already
        self._parts[run_id] = (generation, frozenset(parts), digests)

    def state_of(self, payload: Any, run_id: str) -> RunState:
        """The state a verified payload signs, its parts read back from the content store."""
        document = expand_payload(payload, self.content.get_blob, run_id=run_id)
        return RunState.from_json(document)

    def load(self, run_id: str) -> Restored:
        """Verify the checkpoint the mark names, without task or environment checks."""
        mark = self.marks.get_mark(run_id)
        if mark is None:
            raise MissingHighWaterMarkError(run_id)
        envelope = self.content.get_checkpoint(run_id, mark.checkpoint_digest)
        if envelope is None:
            raise CheckpointCorruptError(
                f"run {run_id}: the content store lacks checkpoint {mark.checkpoint_digest} "
                "that the high-water mark names",
                run_id=run_id,
            )
        payload = open_envelope(envelope, self.keyring, run_id=run_id)
        version = payload.get("schema_version") if isinstance(payload, dict) else None
        if isinstance(version, bool) or not isinstance(version, int):
            raise UnknownFieldError("schema_version", "missing or not an integer", run_id=run_id)
        if version not in READABLE_SCHEMA_VERSIONS:
            raise SchemaVersionError(
                f"checkpoint schema version {version}; this tether reads "
                f"{' and '.join(map(str, sorted(READABLE_SCHEMA_VERSIONS)))}",
                run_id=run_id,
            )
        state = self.state_of(payload, run_id)
        if isinstance(payload, dict) and "parts" in payload:
            named, digests = set(payload["parts"].values()), member_digests(state)
            self._landed(run_id, state.generation, named, digests)
        return Restored(state=state, mark=mark, envelope=envelope)

    def prove_orphans(
        self,
        state: RunState,
        strays: Sequence[LedgerEntry],
        generations: Sequence[int] | None = None,
    ) -> None:
        """Every stray row must belong to a checkpoint signed by us whose mark never moved.

        Only such a commit (content written, then a crash before the mark) leaves
        rows off the signed chain; a row no signed checkpoint reaches is forged.
        ``generations`` narrows the checkpoints read (rows past the signed
        length can only be the next generation's); ``None`` reads them all.
        """
        if self.colocated and strays:
            raise stray_error(state.run_id, strays[0])  # one transaction leaves no orphans
        heads: list[str] = []
        envelopes = (
            self.content.envelopes(state.run_id)
            if generations is None
            else [e for g in generations for e in self.content.envelopes(state.run_id, g)]
        )
        for envelope in envelopes:
            try:
                payload = open_envelope(envelope, self.keyring, run_id=state.run_id)
                head = payload.get("ledger_head") if isinstance(payload, dict) else None
            except TetherError:
                continue  # an unsigned or damaged envelope vouches for nothing
            if isinstance(head, str):
                heads.append(head)
        reached = orphans_of(strays, heads, GENESIS_HASH)
        for stray in strays:
            if stray.hash not in reached:
                raise stray_error(state.run_id, stray)

    def ledger_chain(self, state: RunState) -> ProvenChain[LedgerEntry]:
        """The run's ledger as pinned by ``state``, proven from its head down on demand.

        Rows are fetched by seq range, so a row beside the chain in a stretch
        walked is seen: forged (refused) or, with the mark apart, proven an
        orphan of a signed checkpoint that never landed.
        """
        run_id = state.run_id

        def fetch(link: str, low: int, high: int) -> list[LedgerEntry]:
            return self.content.ledger_between(run_id, low, high)

        def broken(problem: str) -> LedgerIntegrityError:
            return LedgerIntegrityError(f"run {run_id}: effect ledger {problem}", run_id=run_id)

        def strays(rows: Sequence[LedgerEntry]) -> None:
            self.prove_orphans(state, rows)

        return ProvenChain(state.ledger_head, state.ledger_length, fetch, broken, strays)

    def trace_chain(self, state: RunState) -> ProvenChain[TraceEvent]:
        """The run's trace as pinned by ``state``, proven from its head down on demand.

        Events are fetched by their links from the head; an event off the
        chain (an orphan, or a forgery) is simply not on it, as for
        :meth:`verified_trace`.
        """
        run_id = state.run_id

        def fetch(link: str, low: int, high: int) -> list[TraceEvent]:
            return self.content.trace(run_id, link, high - low + 1)

        def broken(problem: str) -> TraceIntegrityError:
            return TraceIntegrityError(f"run {run_id}: the trace {problem}", run_id=run_id)

        def off_chain(rows: Sequence[TraceEvent]) -> None:
            return None  # not history: the walk from the head never reaches it

        return ProvenChain(state.trace_head, state.trace_length, fetch, broken, off_chain)

    def read_recent(self, state: RunState) -> tuple[list[LedgerEntry], list[LedgerEntry]]:
        """What a restore reads of its chains: ``(proven, beyond)``, each oldest first.

        The trace's head event and the ledger's head row must be the rows the
        state signed (hash, content, seq); with a write pending, every entry of
        it, walked down from the head to its ``intended`` entry, must be on the
        chain and its newest status the one the state records; no row may
        claim a seq in that stretch without being on the chain. ``beyond``:
        rows past the signed length (with the mark apart, a commit whose mark
        never moved; anything else is forged and refused).
        """
        run_id = state.run_id
        self.trace_chain(state).down_to(state.trace_length)
        chain = self.ledger_chain(state)
        chain.down_to(state.ledger_length)
        pending = state.pending
        if pending is not None and pending.mutating:
            key = pending.idempotency_key
            while chain.floor > 1 and not any(
                e.idempotency_key == key and e.status is EffectStatus.INTENDED for e in chain.rows
            ):
                chain.step_down()
            last = next((e for e in chain.rows if e.idempotency_key == key), None)
            if last is None or last.status is not pending.status:
                raise LedgerIntegrityError(
                    f"run {run_id}: the ledger's last status for the pending write is "
                    f"{None if last is None else last.status.value}, the checkpoint says "
                    f"{pending.status.value}",
                    run_id=run_id,
                )
        elif pending is not None and any(
            e.idempotency_key == pending.idempotency_key for e in chain.rows
        ):
            raise LedgerIntegrityError(
                f"run {run_id}: the ledger records the non-mutating pending action "
                f"{pending.action_id!r}",
                run_id=run_id,
            )
        newest = None if self.colocated else self.content.newest_generation(run_id)
        if newest is not None and newest > state.generation + 1:
            # Honest content runs at most one generation ahead of the mark
            # (a crash between content and mark); more is a mark put back.
            raise StaleMarkError(run_id, state.generation, newest)
        beyond = self.content.ledger_between(run_id, state.ledger_length + 1)
        if beyond:
            later = range(state.generation + 1, (newest or state.generation) + 1)
            try:
                self.prove_orphans(state, beyond, later)
            except LedgerIntegrityError:
                if self.colocated:
                    raise
                # An older orphan can lie past a later, shorter commit: ask every checkpoint.
                self.prove_orphans(state, beyond)
        return list(reversed(chain.rows)), beyond

    def check_generation(self, restored: Restored) -> None:
        state, mark = restored.state, restored.mark
        if state.run_id != mark.run_id or state.generation != mark.generation:
            raise StaleCheckpointError(mark.run_id, mark.generation, state.generation)
        if envelope_digest(restored.envelope) != mark.checkpoint_digest:
            # A validly signed checkpoint of the right generation that the mark
            # did not accept (an orphaned or swapped write) is not the newest.
            raise StaleCheckpointError(mark.run_id, mark.generation, state.generation)

    def restore(
        self,
        run_id: str,
        binding: CoreBinding,
        adapter: Adapter,
        *,
        policy_may_change: bool = False,
    ) -> Restored:
        """Every restore check, in order; returns the verified state.

        ``policy_may_change``: the current policy lets a run made under another
        policy be admitted as a new work occurrence; admission decides.
        """
        restored = self.load(run_id)
        state = restored.state
        check_binding(state, binding, policy_may_change=policy_may_change)
        self.check_generation(restored)
        live = adapter.environment()
        ahead = live if environment_ahead(state, live) else None
        drifted = None
        if ahead is None:
            if state.phase in {Phase.RUNNING, Phase.PENDING}:
                # A live run whose world moved under it goes to a person; another
                # instance (or a finished run's world) still fails closed.
                drifted = live if drift_problem(state, live) is not None else None
            else:
                check_environment(state, live)
        validate_state(state)
        chain, beyond = self.read_recent(state)
        pending = state.pending
        if pending is not None and pending.status is EffectStatus.INTENDED and not self.colocated:
            # A mark put back by exactly one generation looks like a crash
            # between content and mark, and the commit beyond it may have been
            # followed by the send: then "intended" no longer proves nothing
            # left. Settle it as possibly sent (ask, dedup, or review).
            sent = [
                e
                for e in beyond
                if e.idempotency_key == pending.idempotency_key
                and e.status is not EffectStatus.INTENDED
            ]
            if sent:
                state = state.evolve(pending=replace(pending, status=EffectStatus.DISPATCHED))
                return replace(
                    restored,
                    state=state,
                    ledger=tuple(chain),
                    maybe_sent=True,
                    ahead=ahead,
                    drifted=drifted,
                )
        return replace(restored, ledger=tuple(chain), ahead=ahead, drifted=drifted)

    def at_generation(self, state: RunState, generation: int) -> tuple[RunState, str]:
        """The signed checkpoint of an earlier ``generation`` of this run, and its digest.

        Only one on the run's own history: its trace head must be the event
        at its trace length in ``state``'s verified trace (an orphaned write
        of that generation, or one from another history, is not a rewind
        point). Refuses with :class:`~tether.core.RewindRefusedError`.
        """
        run_id = state.run_id
        if not 1 <= generation < state.generation:
            raise RewindRefusedError(
                f"run {run_id}: generation {generation} is not an earlier point "
                f"(the run is at {state.generation})",
                run_id=run_id,
            )
        trace = self.verified_trace(state)
        ledger = self.verified_ledger(state)
        found: dict[str, RunState] = {}
        for envelope in self.content.envelopes(run_id, generation):
            try:
                payload = open_envelope(envelope, self.keyring, run_id=run_id)
            except TetherError:
                continue  # unsigned or damaged: vouches for nothing
            if not isinstance(payload, dict) or payload.get("generation") != generation:
                continue
            if payload.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
                continue
            candidate = self.state_of(payload, run_id)
            if candidate.run_id == run_id and _on_chain(candidate, trace, ledger):
                found[envelope_digest(envelope)] = candidate
        if len(found) != 1:
            raise RewindRefusedError(
                f"run {run_id}: "
                + (
                    f"no signed checkpoint of generation {generation} on this run's history"
                    if not found
                    else f"{len(found)} checkpoints of generation {generation} fit this run's "
                    "history; refusing to guess"
                ),
                run_id=run_id,
            )
        ((digest, target),) = found.items()
        # A checkpoint that carried a write's receipt, not at rest itself: its rest point.
        target = rewind_point(target)
        _refuse_unsettled(target, trace)
        return target, digest

    def verified_trace(self, state: RunState) -> list[TraceEvent]:
        """The run's whole trace, every hash recomputed, ending at the head ``state`` signed.

        Reads every event (``tether verify``, a rewind); a recovery reads only
        the head (:meth:`read_recent`).

        The walk is bounded by the signed length (+1, so a cycle planted in the
        rows fails the check instead of hanging).
        """
        events = self.content.trace(state.run_id, state.trace_head, state.trace_length + 1)
        verify_trace(state.run_id, events, state.trace_head, state.trace_length, GENESIS_HASH)
        return events

    def context(
        self,
        state: RunState,
        *,
        release: bool = False,
        on_withheld: Withheld | str = Withheld.REDACT,
    ) -> AgentContext:
        """The agent context ``state`` names, or fail closed if it is missing or damaged.

        Its secret items are opened only when ``release`` (the reader may read
        secrets, under the current policy) and this checkpointer has a secret
        box; otherwise they are withheld: redacted (named in
        ``AgentContext.redacted``) or refused with
        :class:`~tether.crypto.SecretAccessError`, as ``on_withheld`` says.
        """
        body = self.content.get_blob(state.agent_context_digest)
        if body is None:
            raise CheckpointCorruptError(
                f"run {state.run_id}: agent context {state.agent_context_digest} is missing",
                run_id=state.run_id,
            )
        return AgentContext.decode(
            state.agent_context_digest,
            body,
            run_id=state.run_id,
            box=self.secrets,
            release=release,
            on_withheld=on_withheld,
        )

    def results(self, state: RunState) -> tuple[ActionResult, ...]:
        """The action results ``state`` names (none, or fail closed if missing or damaged)."""
        wanted = state.results_digest
        if wanted is None:
            return ()
        body = self.content.get_blob(wanted)
        if body is None:
            raise CheckpointCorruptError(
                f"run {state.run_id}: action results {wanted} are missing", run_id=state.run_id
            )
        return step_rules.decode_results(wanted, body)

    def verified_ledger(self, state: RunState) -> list[LedgerEntry]:
        """The run's whole effect ledger, chained to the head ``state`` signed, or fail closed.

        Reads every row (``tether verify``, a rewind, a compensation); a
        recovery reads only what :meth:`read_recent` says.

        With content and mark apart, a crash between the two leaves the rows
        of a commit that never landed: those may lie beyond the signed length.
        """
        chain, strays = verify_ledger(
            state.run_id,
            self.content.ledger(state.run_id),
            state.ledger_head,
            state.ledger_length,
            GENESIS_HASH,
            orphans_possible=not self.colocated,
        )
        if not self.colocated:
            newest = self.content.newest_generation(state.run_id)
            if newest is not None and newest > state.generation + 1:
                # Honest content runs at most one generation ahead of the mark
                # (a crash between content and mark); more is a mark put back.
                raise StaleMarkError(state.run_id, state.generation, newest)
        if strays:
            self.prove_orphans(state, strays)
        pending = state.pending
        if pending is not None:
            last = next(
                (e for e in reversed(chain) if e.idempotency_key == pending.idempotency_key), None
            )
            if not pending.mutating:
                if last is not None:  # a read or a test run has no ledger entries at all
                    raise LedgerIntegrityError(
                        f"run {state.run_id}: the ledger records the non-mutating pending "
                        f"action {pending.action_id!r}",
                        run_id=state.run_id,
                    )
            elif last is None or last.status is not pending.status:
                raise LedgerIntegrityError(
                    f"run {state.run_id}: the ledger's last status for the pending write is "
                    f"{None if last is None else last.status.value}, the checkpoint says "
                    f"{pending.status.value}",
                    run_id=state.run_id,
                )
        return chain


def _on_chain(candidate: RunState, trace: list[TraceEvent], ledger: list[LedgerEntry]) -> bool:
    """Whether ``candidate``'s trace and ledger heads are on the verified chains at its lengths."""
    t, n = candidate.trace_length, candidate.ledger_length
    trace_ok = (
        candidate.trace_head == GENESIS_HASH
        if t == 0
        else 0 < t <= len(trace) and trace[t - 1].hash == candidate.trace_head
    )
    ledger_ok = (
        candidate.ledger_head == GENESIS_HASH
        if n == 0
        else 0 < n <= len(ledger) and ledger[n - 1].hash == candidate.ledger_head
    )
    return trace_ok and ledger_ok


def _refuse_unsettled(target: RunState, trace: list[TraceEvent]) -> None:
    """A rewind point must be at rest, and not inside a stretch an earlier rewind left.

    A point with a write pending (or frozen, or mid-rewind) has a context
    already past an effect whose workspace it does not yet hold: restoring
    both would lose that effect. A point inside an abandoned suffix would
    bring back workspace writes the ledger says a rewind undid.
    """
    run_id = target.run_id
    if (
        target.phase is not Phase.RUNNING
        or target.pending is not None
        or target.rewinding is not None
        or target.review_cases
    ):
        raise RewindRefusedError(
            f"run {run_id}: generation {target.generation} was not at rest "
            f"({target.phase}{', a write pending' if target.pending is not None else ''}); "
            "rewind to a generation between steps",
            run_id=run_id,
        )
    for event in trace:
        stretch = step_rules.abandoned_stretch(event)
        if stretch is not None and stretch[0] < target.trace_length <= stretch[1]:
            raise RewindRefusedError(
                f"run {run_id}: generation {target.generation} lies in the stretch the rewind "
                f"at trace event {event.seq} left behind; rewind to a point on the history "
                "that stands",
                run_id=run_id,
            )


def check_binding(
    state: RunState, expected: CoreBinding, *, policy_may_change: bool = False
) -> None:
    """Refuse a checkpoint made for another task, policy or scenario."""
    got = state.binding
    for what, want, have in (
        ("task id", expected.task_id, got.task_id),
        ("task version", expected.task_version, got.task_version),
        ("task fingerprint", expected.task_fingerprint, got.task_fingerprint),
    ):
        if want != have:
            raise TaskMismatchError(what, want, have, run_id=state.run_id)
    for what, want, have in (
        ()
        if policy_may_change
        else (
            ("policy id", expected.policy_id, got.policy_id),
            ("policy version", expected.policy_version, got.policy_version),
            ("policy fingerprint", expected.policy_fingerprint, got.policy_fingerprint),
        )
    ):
        if want != have:
            raise PolicyMismatchError(what, want, have, run_id=state.run_id)
    if expected.scenario_fingerprint != got.scenario_fingerprint:
        raise ScenarioMismatchError(
            "scenario", expected.scenario_fingerprint, got.scenario_fingerprint, run_id=state.run_id
        )


def environment_ahead(state: RunState, live: EnvironmentState) -> bool:
    """Whether ``live`` is further along than the checkpoint of a running run can explain.

    Same instance, and a version beyond both the checkpoint's and its pending
    write's: writes went through the adapter that this history never saw. A
    run that is frozen or finished is judged by :func:`check_environment` alone.
    """
    recorded = state.environment
    if state.phase not in {Phase.RUNNING, Phase.PENDING} or state.rewinding is not None:
        return False
    if live.namespace != recorded.namespace or live.instance_id != recorded.instance_id:
        return False
    explained = recorded.version
    pending = state.pending
    if pending is not None and pending.mutating:
        explained = max(explained, pending.expected_post.version)
    return live.version > explained


def check_environment(state: RunState, live: EnvironmentState) -> None:
    """The live environment must be the checkpointed state or its one pending successor.

    Equal version is not equal state: same version with another fingerprint,
    the same fingerprint in another instance, and drift of more than the one
    pending write all fail closed. ``live`` is the adapter's answer.
    """
    problem = drift_problem(state, live)
    if problem is not None:
        raise EnvironmentDriftError(
            f"run {state.run_id}: environment drifted: {problem}",
            expected=state.environment.to_json(),
            actual=live.to_json(),
            hint=f"the run is {state.phase}, so nothing acts on it; `tether inspect "
            f"{state.run_id}` shows its last environment and what it did",
            run_id=state.run_id,
        )


def another_instance_hint(run_id: str) -> str:
    """What to do when the adapters serve another environment than the run's."""
    return (
        "the run was made against another environment (another workspace directory, service "
        "or mail system, or adapters named otherwise): give the runtime the adapters the run "
        f"started with, or start a new run id; `tether inspect {run_id}` shows the run's"
    )


def drift_problem(state: RunState, live: EnvironmentState) -> str | None:
    """What is wrong with ``live`` for the checkpoint, or ``None`` when it explains it.

    Another environment instance is never drift: it raises
    :class:`~tether.core.EnvironmentDriftError` here. The same instance in a
    state the checkpoint and its pending write do not explain is drift (it
    changed outside the run): the words say how.
    """
    recorded = state.environment
    if live.namespace != recorded.namespace or live.instance_id != recorded.instance_id:
        raise EnvironmentDriftError(
            f"run {state.run_id}: checkpoint is for environment instance "
            f"{recorded.namespace}/{recorded.instance_id}, adapter is "
            f"{live.namespace}/{live.instance_id}",
            expected=recorded.to_json(),
            actual=live.to_json(),
            hint=another_instance_hint(state.run_id),
            run_id=state.run_id,
        )
    if live == recorded:
        return None
    if state.rewinding is not None:
        # A rewind was admitted and checkpointed; its restore may have run, in
        # part or whole. The next step finishes it (restoring is idempotent).
        return None
    pending = state.pending
    if pending is not None and live == pending.expected_post:
        return None
    if state.phase is Phase.NEEDS_REVIEW:
        # Frozen, nothing acts: the same instance in any state may be restored,
        # so a person can still decide. A decision re-reads the world itself,
        # and one the world moved under is refused and its case refreshed.
        return None
    if live.version == recorded.version:
        return "same version, different state (changed outside the runtime)"
    if pending is not None and live.version == pending.expected_post.version:
        return "the pending write's version, but not the state it produces"
    return (
        f"version moved {recorded.version} -> {live.version}, not provable from the pending write"
    )


#: At most this many runs' landed parts are remembered per checkpointer.
_PARTS_REMEMBERED = 10_000


def _as_marks(content: ContentStore, colocated: CommitStore | None) -> GenerationStore:
    if colocated is not None:
        return colocated  # a CommitStore is a GenerationStore: no second protocol check
    if isinstance(content, GenerationStore):
        return content
    raise StoreError(
        f"{content!r} keeps no high-water marks; pass marks= a GenerationStore to checkpoint"
    )
