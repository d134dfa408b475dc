"""What a session asks of its run's past, read by index and proven on the signed chains.

Two questions reach back past the session's own commits: has this action id
been used (the gate's ``duplicate_action``), and what does the ledger know of
this effect (replay or fork). Each is answered from the rows the store finds
by index for that one id or digest, and only from those of them that are
proven on the chain the signed checkpoint pins (:class:`ProvenChain`): a
forged row fails closed, an orphan of a commit that never landed (content
and mark apart) is set aside, exactly as a whole-chain read would.

So a recovery opens a history without reading any of it, and a step pays
one indexed look-up per new action id and per new effect; a row far down is
proven by walking to it once per session.

The look-up proves every row it finds; it cannot prove that a row it does
not find was never written. A row deleted from the middle of a chain is
found by ``tether verify`` (which walks from the head to genesis), and by
any walk that reaches it, not by a look-up that misses it. See the docs
page docs/explanation/restore-checks.md, "What recovery checks, and what only verify checks".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tether.core import EffectStatus, Intent, LedgerEntry, PendingWrite, RunState, TraceEvent
from tether.core import _replay as replay_rules
from tether.core import _steps as step_rules
from tether.core._terms import SentTerms
from tether.runtime._chains import ProvenChain
from tether.runtime._checkpointer import Checkpointer
from tether.store import KeyClock

#: Rows of one target read per probe of the store's index.
_TARGET_PAGE = 8


@dataclass
class _TargetRows:
    """One target's rows below a session's base, read so far: (key, effect, status), newest first."""

    below: int  # the next page holds rows with a smaller seq only
    done: bool  # no row left to read
    rows: list[tuple[str, str, EffectStatus]] = field(default_factory=list)


class History:
    """One session's view of its run's past: effects by digest, action ids by name.

    Opened on the state a session starts from (its *base*): rows up to the
    base's signed lengths are read from the store on demand and proven on
    the chains; what the session commits afterwards is folded in from
    memory (:meth:`committed`, :meth:`used`).
    """

    def __init__(
        self, checkpointer: Checkpointer, state: RunState, current: Callable[[], RunState]
    ) -> None:
        self._cp = checkpointer
        self._base = state
        self._current = current
        self._ledger: ProvenChain[LedgerEntry] | None = None
        self._trace: ProvenChain[TraceEvent] | None = None
        # Digest -> what the ledger knows of it (None: nothing), once resolved.
        self._effects: dict[str, replay_rules.EffectHistory | None] = {}
        # This session's entries of effects not resolved yet, oldest first.
        self._fresh: dict[str, list[LedgerEntry]] = {}
        # Target digest -> its rows below the base read so far (proven on the chain).
        self._targets: dict[str, _TargetRows] = {}
        # Target digest -> this session's own rows on it, oldest first (from a commit on
        # it onwards: a landed attempt decides before any older row).
        self._fresh_targets: dict[str, list[tuple[str, str, EffectStatus]]] = {}
        self._used: set[str] = set()
        self._asked: dict[str, bool] = {}
        # (seq of the rewound event, low, high] stretches it left behind, once read.
        self._rewinds: list[tuple[int, int, int]] | None = None
        #: What replay-or-fork matches: a mapping whose look-ups go through :meth:`effect`.
        self.effects = KnownEffects(self)

    @property
    def run_id(self) -> str:
        return self._base.run_id

    # -- effects ---------------------------------------------------------------

    def effect(self, digest: str) -> replay_rules.EffectHistory | None:
        """What the ledger records of effect ``digest`` (``None``: nothing that counts)."""
        if digest in self._effects:
            return self._effects[digest]
        entries = self._recorded(digest) if self._base.ledger_length else []
        entries += self._fresh.pop(digest, [])
        record = replay_rules.known_effects(entries).get(digest)
        self._effects[digest] = record
        return record

    def sent_under(
        self, pending: PendingWrite | None, digest_of: Callable[[Intent], str]
    ) -> SentTerms | None:
        """What the ledger records the pending write's sends were made under (``None``: unknown).

        Read from the ledger's entries of its effect (``digest_of`` its intent),
        under its key: ledger rows written before the ledger recorded terms (or
        effect digests) give ``None``, and the adapter's declaration now
        decides, as before.
        """
        if pending is None or pending.status is EffectStatus.INTENDED:
            return None
        record = self.effect(digest_of(pending.intent))
        sent = None if record is None else record.unsettled
        if sent is None or sent.idempotency_key != pending.idempotency_key:
            return None
        return sent.sent_under

    def pending_age(
        self, pending: PendingWrite | None, digest_of: Callable[[Intent], str]
    ) -> float | None:
        """The pending write's key's age by the store's clock (``None``: it cannot say)."""
        if pending is None or not pending.mutating or pending.status is EffectStatus.INTENDED:
            return None
        return self.key_age(digest_of(pending.intent), pending.idempotency_key)

    def key_age(self, digest: str, key: str) -> float | None:
        """Seconds since the store recorded ``key``'s first row of effect ``digest``, by its clock.

        ``None`` where the store keeps no such time (``tether.store.KeyClock``):
        the retention rule then charges a skew margin instead.
        """
        content = self._cp.content
        if not isinstance(content, KeyClock):
            return None
        return content.key_age_s(self._base.run_id, digest, key)

    def _recorded(self, digest: str) -> list[LedgerEntry]:
        """The effect's entries up to the base's signed length, each proven on the chain."""
        base = self._base
        chain = self._ledger_chain()
        found = [
            entry
            for entry in self._cp.content.ledger_for_effect(base.run_id, digest)
            if entry.terms is not None
            and entry.terms.effect == digest
            # Beyond the base: this session's own (folded from memory), or a
            # stray the recovery that opened the session already judged.
            and entry.seq <= base.ledger_length
        ]
        return sorted((e for e in found if chain.check(e)), key=lambda e: e.seq)

    def on_target(self, target: str, effect: str) -> replay_rules.Overwrite:
        """What came onto ``target`` (a target digest) from other effects since ``effect``'s attempt.

        The rule is :func:`tether.core.replay_rules.since_on_target`, read over
        this session's own rows on the target (from memory), then the store's
        below the base, newest first: pages of one indexed probe each, proven
        on the chain (a stray is passed over), kept for the session. Usually
        the newest row decides.
        """
        seen: set[str] = set()
        fresh = self._fresh_targets.get(target, [])
        decided = replay_rules.since_on_target(reversed(fresh), effect, seen)
        if decided is None:
            decided = replay_rules.since_on_target(self._stored_on(target), effect, seen)
        return replay_rules.Overwrite.NO if decided is None else decided

    def _stored_on(self, target: str) -> Iterator[tuple[str, str, EffectStatus]]:
        """The target's rows up to the base's signed length, newest first, read as needed."""
        read = self._targets.get(target)
        if read is None:
            length = self._base.ledger_length
            read = self._targets[target] = _TargetRows(below=length + 1, done=not length)
        index = 0
        while True:
            while index < len(read.rows):
                yield read.rows[index]
                index += 1
            if read.done:
                return
            page = self._cp.content.ledger_on_target(
                self._base.run_id, target, below=read.below, limit=_TARGET_PAGE
            )
            chain = self._ledger_chain()
            for entry in page:  # newest first
                terms = entry.terms
                if (
                    terms is not None
                    and terms.effect is not None
                    and terms.target_key == target
                    and chain.check(entry)
                ):
                    read.rows.append((entry.idempotency_key, terms.effect, entry.status))
            read.done = len(page) < _TARGET_PAGE
            if page:
                read.below = min(entry.seq for entry in page)

    def committed(self, entries: Sequence[LedgerEntry]) -> None:
        """Fold in entries this session committed (oldest first)."""
        for entry in entries:
            effect = None if entry.terms is None else entry.terms.effect
            if effect is None:
                continue
            if entry.terms is not None and entry.status is not EffectStatus.INTENDED:
                fresh = self._fresh_targets.setdefault(entry.terms.target_key, [])
                if entry.status is EffectStatus.COMMITTED:
                    # A landed attempt decides before every older row: those are not needed.
                    fresh.clear()
                fresh.append((entry.idempotency_key, effect, entry.status))
            if effect not in self._effects:
                self._fresh.setdefault(effect, []).append(entry)
                continue
            record = self._effects[effect]
            changed = replay_rules.known_effects(
                [entry], {} if record is None else {effect: record}
            )
            if effect in changed:
                self._effects[effect] = changed[effect]

    def all_effects(self) -> dict[str, replay_rules.EffectHistory]:
        """Every effect the ledger records: the whole chain read and verified (slow; for tools).

        (The pending write's entries were checked against the signed state when
        it was restored; the state in hand may say "dispatched" where they say
        intended, after a mark put back by one generation.)
        """
        whole = self._cp.verified_ledger(self._current().evolve(pending=None))
        return replay_rules.known_effects(whole)

    # -- action ids ------------------------------------------------------------

    def used(self, action_id: str) -> None:
        """Record an action id this session's commit took."""
        self._used.add(action_id)

    def action_used(self, action_id: str) -> bool:
        """Whether ``action_id`` was used before in the run (not freed by a rewind)."""
        if action_id in self._used:
            return True
        if action_id not in self._asked:
            self._asked[action_id] = bool(self._base.trace_length) and self._used_before(action_id)
        return self._asked[action_id]

    def _used_before(self, action_id: str) -> bool:
        base = self._base
        found = [
            event
            for event in self._cp.content.trace_for_action(base.run_id, action_id)
            if step_rules.action_id_of(event.kind, event.data) == action_id
            and event.seq <= base.trace_length
        ]
        if not found:
            return False
        chain = self._trace_chain()
        # Off the chain (an orphan of a commit that never landed) is not history.
        uses = [event.seq for event in found if chain.check(event)]
        if not uses:
            return False
        last = max(uses)
        # An id whose last use lies in a stretch a later rewind left behind is free again.
        return not any(seq > last and low < last <= high for seq, low, high in self._rewound())

    def _rewound(self) -> list[tuple[int, int, int]]:
        if self._rewinds is None:
            base = self._base
            chain = self._trace_chain()
            stretches: list[tuple[int, int, int]] = []
            for event in self._cp.content.trace_landmarks(base.run_id, ("rewound",)):
                if event.seq > base.trace_length or not chain.check(event):
                    continue
                stretch = step_rules.abandoned_stretch(event)
                if stretch is not None:
                    stretches.append((event.seq, *stretch))
            self._rewinds = stretches
        return self._rewinds

    # -- the chains ------------------------------------------------------------

    def _ledger_chain(self) -> ProvenChain[LedgerEntry]:
        if self._ledger is None:
            self._ledger = self._cp.ledger_chain(self._base)
        return self._ledger

    def _trace_chain(self) -> ProvenChain[TraceEvent]:
        if self._trace is None:
            self._trace = self._cp.trace_chain(self._base)
        return self._trace


class KnownEffects(Mapping[str, replay_rules.EffectHistory]):
    """``session.effects``: each effect digest the ledger records, and what it knows of it.

    A look-up (``effects.get(digest)``, ``digest in effects``) reads that one
    effect's entries by index; iterating reads and verifies the whole ledger.
    """

    def __init__(self, history: History) -> None:
        self._history = history

    def __getitem__(self, digest: str) -> replay_rules.EffectHistory:
        record = self._history.effect(digest) if isinstance(digest, str) else None
        if record is None:
            raise KeyError(digest)
        return record

    def __iter__(self) -> Iterator[str]:
        return iter(self._history.all_effects())

    def __len__(self) -> int:
        return len(self._history.all_effects())
