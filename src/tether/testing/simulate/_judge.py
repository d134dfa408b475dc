"""The promise, as invariants judged against what the simulated world received.

Numbered as in issue 25:

1. no effect reaches the world twice unless a signed fork asked for it
   (a key applied twice; a remote effect applied twice under any keys; a file
   write that changed nothing because that very effect was already there);
   and no call from a worker whose lease moved on reaches the world (fencing);
2. no effect reaches the world without the approval its policy required at
   the moment it was sent; no gated effect is reported ``replayed`` unapproved;
3. every write reported ``executed`` or ``replayed`` is what the world holds
   for that target afterwards (a file, and the remote status board, a state
   nothing reads back for the run: A, B, A must leave A), and a replay's
   receipt is one the adapter holds;
4. an effect whose outcome is unknown and cannot be settled by an
   authoritative look-up (blind adapter, key forgotten) is never followed by
   another send, nor by the end of the run, before the run reached review;
   once a reviewer who looked in the world signed ``landed``, nothing is sent
   under its key again (a send would be judged under 1), and one signed
   ``not_landed`` reaches the world once under its own key before the run
   completes with it committed;
5. every ledger entry survives every rewind, restore and recovery;
6. while an adapter is down, sends per effect within one worker's claim are
   bounded, ``dispatched`` rows grow at most one per back-off period, and so
   do the workers' claims of the run that reached it (a run let go with no
   back-off is claimed again at once, and hammers the service claim by claim);
7. with a healthy world and people who answer, the run ends within a bound;
   one failing run never stops a healthy one: a worker yields its turn, and a
   healthy run handed to the same workers is not passed over while it could be
   claimed, and ends (judged in ``_neighbour``).

8 is the first seed's action contract (see ``_contract``): an action built on
a version the environment left is refused; a failed run traces ``failed``; the
last proposal spent on a refusal or a replay ends the run at once; a decision
reusing a consumed nonce is refused. 0 is the simulator's own: the runtime
raised an error that is not a ``TetherError`` (a bug, not a refusal).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tether.core import EffectStatus, LedgerEntry
from tether.testing.simulate._world import Reception

#: The smallest back-off a retry rule may use, in simulated seconds.
MIN_BACKOFF_S = 1.0
#: Sends of one effect a worker may make within one event while its adapter is down.
SENDS_PER_CLAIM = 3


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: its number, the event it broke at (1-based), and what happened."""

    invariant: int
    event: int
    text: str

    def __str__(self) -> str:
        return f"invariant {self.invariant} broken at event {self.event}: {self.text}"


@dataclass
class Judge:
    """Keeps what the world received and what the run said, and records every violation."""

    violations: list[Violation] = field(default_factory=list)
    checks: int = 0
    event: int = 0
    keys: set[tuple[str, str]] = field(default_factory=set)
    remote: dict[str, int] = field(default_factory=dict)
    forks: dict[str, int] = field(default_factory=dict)
    #: Per file target: the identity of the reception that last changed it.
    last_change: dict[str, str] = field(default_factory=dict)
    #: Landed effects whose outcome no authoritative look-up can settle (key -> event).
    unknowable: dict[str, int] = field(default_factory=dict)
    #: The ledger rows seen so far (key, seq, status).
    rows: set[tuple[str, int, str]] = field(default_factory=set)
    #: key -> dispatched rows seen while its adapter was down, and since when it was down.
    down_rows: dict[str, int] = field(default_factory=dict)
    #: key -> what a reviewer who looked in the world signed for its unknown outcome:
    #: ``landed`` (nothing may be sent under it again) or ``not_landed`` (sent once more).
    settled: dict[str, str] = field(default_factory=dict)
    #: Workers' claims of the run that reached a service down, and when the first did.
    down_claims: int = 0
    first_down_claim: float = 0.0

    def fail(self, invariant: int, text: str) -> None:
        self.violations.append(Violation(invariant, self.event, text))

    # -- at each reception ---------------------------------------------------

    def received(
        self,
        r: Reception,
        *,
        gated: bool,
        approved_until: float | None,
        committed: set[str],
    ) -> None:
        """Invariants 1, 2 and 4 for one effect that has just reached the world."""
        self.checks += 3
        if (r.namespace, r.key) in self.keys:
            self.fail(1, f"{r.kind} {r.target} under key {r.key} reached the world twice")
        if self.settled.get(r.key) == "landed":
            self.fail(1, f"{r.kind} {r.identity} ({r.key}) was sent after a reviewer signed landed")
        self.keys.add((r.namespace, r.key))
        forks = self.forks.get(r.identity, 0)  # a signed fork asked for it once more
        if r.namespace == "tickets":
            seen = self.remote.get(r.identity, 0)
            if seen > forks:
                self.fail(1, f"the remote effect {r.identity} reached the world {seen + 1} times")
            self.remote[r.identity] = seen + 1
        else:
            again = not r.changed and self.last_change.get(r.target) == r.identity
            if again and not forks:
                self.fail(
                    1, f"the write {r.identity} was sent again ({r.key}); it was already there"
                )
            if r.changed:
                self.last_change[r.target] = r.identity
        if gated and (approved_until is None or approved_until <= r.sent_at):
            self.fail(2, f"{r.kind} {r.identity} ({r.key}) was sent without a live approval")
        for key, since in list(self.unknowable.items()):
            if key in committed:
                del self.unknowable[key]
            elif key != r.key:
                self.fail(
                    4,
                    f"{r.kind} {r.identity} was sent while {key} (event {since}) was unknowable "
                    "and the run had not reached review",
                )
                del self.unknowable[key]

    def attempted(self, key: str, presented: int | None, current: int | None) -> None:
        """Invariant 1 (fencing): a call from a worker whose lease moved on never leaves it."""
        self.checks += 1
        if presented is not None and current is not None and presented < current:
            self.fail(
                1,
                f"a stale worker's call for {key} reached the adapter "
                f"(lease {presented}, current {current})",
            )

    def restored(self, target: str) -> None:
        """A rewind put ``target`` back: what last changed it is no longer there."""
        self.last_change.pop(target, None)

    # -- after each event ----------------------------------------------------

    def ledger(self, entries: list[LedgerEntry], down: dict[str, float], now: float) -> set[str]:
        """Invariants 5 and 6 from the ledger as it is now; the keys it records committed.

        ``down``: namespace -> when its current outage began (simulated seconds).
        """
        self.checks += 2
        seen = {(e.idempotency_key, e.seq, e.status.value): e for e in entries}
        lost = self.rows - seen.keys()
        if lost:
            self.fail(5, f"{len(lost)} ledger entries vanished, e.g. {sorted(lost)[0]}")
        for row in seen.keys() - self.rows:
            entry = seen[row]
            namespace = entry.terms.adapter if entry.terms is not None else ""
            if entry.status is EffectStatus.DISPATCHED and namespace in down:
                key = entry.idempotency_key
                rows = self.down_rows[key] = self.down_rows.get(key, 0) + 1
                elapsed = now - down[namespace]
                allowed = 2 + int(elapsed / MIN_BACKOFF_S)
                if rows > allowed:
                    self.fail(
                        6,
                        f"{rows} dispatched rows for {key} while {namespace} was down "
                        f"{elapsed:g}s (at most {allowed})",
                    )
        self.rows |= seen.keys()
        return {e.idempotency_key for e in entries if e.status is EffectStatus.COMMITTED}

    def claimed_while_down(self, now: float) -> None:
        """Invariant 6 across claims: a worker's claim of the run reached a service that is
        down; the shortest back-off (half of :data:`MIN_BACKOFF_S`, the least first wait)
        must pass between two such claims."""
        self.checks += 1
        if not self.down_claims:
            self.first_down_claim = now
        self.down_claims += 1
        elapsed = now - self.first_down_claim
        allowed = 1 + int(elapsed / (MIN_BACKOFF_S / 2))
        if self.down_claims > allowed:
            self.fail(
                6,
                f"{self.down_claims} workers' claims of the run reached a service that was "
                f"down within {elapsed:g}s (at most {allowed}): claimed again with no back-off",
            )

    def outage_over(self) -> None:
        """An outage ended: the next one counts its rows and claims afresh."""
        self.down_rows.clear()
        self.down_claims = 0

    def phase(self, phase: str, committed: set[str]) -> None:
        """Invariant 4: reaching review settles the unknowable; ending without it breaks it."""
        self.checks += 1
        if phase == "needs_review":
            self.unknowable.clear()
            return
        if phase == "completed":
            received = {key for _, key in self.keys}
            for key, decided in self.settled.items():
                if decided == "not_landed" and key in committed and key not in received:
                    self.fail(
                        4,
                        f"{key}, signed not_landed, is recorded committed and never reached "
                        "the world",
                    )
        if phase in {"completed", "failed", "cancelled"}:
            for key, since in list(self.unknowable.items()):
                if key not in committed:
                    self.fail(4, f"the run ended {phase} with {key} (event {since}) unknowable")
                del self.unknowable[key]
