"""The numbered schema migrations every SQL store applies, in one place.

Each dialect supplies its byte-string column type and how it fills a new
column from the JSON of rows already written. A migration is a list of
statements applied in one transaction and recorded in ``tether_migrations``;
a database that records a version newer than the last one here is refused
rather than written to.
"""

from __future__ import annotations

from tether.core._retry import ALONE_AFTER, RECOVERY_COMMITS

#: Trace events that record an accepted action's id (``tether.core.step_rules.ACTION_EVENTS``,
#: spelled out here because an index's predicate is fixed SQL).
ACTION_KINDS = (
    "intent_persisted",
    "approval_requested",
    "action_observed",
    "verifier_ran",
    "run_cancelled",
    "effect_replayed",
)

#: The migration after whose (empty) statement list tether fills the ``target``
#: column of every row written before it (see migration 16).
TARGETS_FILLED = 16

#: When a run becomes claimable, by its lease columns (store clock, microseconds):
#: at ``retry_at`` when free (the instant it was created free or let go, or a
#: deferred run's back-off), when its lease (and any back-off) runs out when
#: held; NULL when it never will (a lease with no expiry). A free run with no
#: ``retry_at`` (an operator's ``retry_now``, a row written before tether set
#: one at creation) is claimable "since ever" (0), ahead of every other.
#: Migration 12 indexes exactly this text (in :data:`CLAIM_ORDER`) and the claim
#: orders by exactly it: an index on an expression serves only a query that
#: spells it the same, so a change here is a new migration, never an edit.
CLAIMABLE_AT = (
    "(CASE WHEN lease_owner IS NULL THEN COALESCE(retry_at, 0) "
    "WHEN retry_at IS NULL OR retry_at < lease_expires_at THEN lease_expires_at "
    "ELSE retry_at END)"
)
#: The order a claim takes runs in, and the key of the ``tether_marks_due`` index:
#: the run claimable longest first; among runs claimable at the same instant
#: (a store clock that did not move between two creations or releases, or both
#: free since ever), the one whose lease was taken least recently (``turn``: drawn from
#: one counter at every grant of a lease); then run id. Without ``turn``, a run
#: let go at the instant another became claimable went first whenever its id
#: sorted first, claim after claim.
CLAIM_ORDER = f"{CLAIMABLE_AT}, turn, run_id"
#: The runs a claim may take at all: not ended, not parked for a person. The
#: claim index covers only these rows (a partial index), so finished runs and
#: runs waiting for a person cost a claim nothing however many there are.
CLAIM_SCOPE = "phase IN ('needs_review', 'pending', 'running') AND waiting_after IS NULL"
#: The phases :data:`CLAIM_SCOPE` names.
CLAIM_PHASES = frozenset({"needs_review", "pending", "running"})
#: :func:`tether.core._retry.failed_claims` in SQL, of a row a claim may take (its
#: lease free or expired): the failed claims in a row before the one taking it.
FAILED_CLAIMS = (
    "(CASE WHEN lease_owner IS NOT NULL AND claimed_gen IS NOT NULL "
    f"AND generation > claimed_gen + {RECOVERY_COMMITS} THEN 0 ELSE attempts END)"
)
#: A run whose last claims ended uncleanly, :data:`~tether.core._retry.ALONE_AFTER`
#: in a row without moving it: its lease ran out held each time (its worker died,
#: hung, or was killed with the process it shared) (``core.claimed_alone``).
#: A worker driving many runs takes such a run alone (``Worker``), so a run that
#: kills its process kills no neighbour. Judged on a row whose lease is free or expired.
SUSPECT = f"(lease_owner IS NOT NULL AND {FAILED_CLAIMS} >= {ALONE_AFTER})"
#: A run parked at the mark: its count of failed claims reached the ``max_attempts``
#: of the worker that claimed it last, so if no other worker allows more, only a
#: person's ``tether resume`` (``retry_now``) brings it back. Such runs stay
#: unfinished, long claimable by the clock: in one index with the due runs they
#: would sit at its front and every claim would read past all of them. They have
#: an index of their own instead (``tether_marks_parked``), keyed by
#: :data:`FAILED_CLAIMS`, where a worker that allows more finds the ones it may
#: take in one range, and a worker at the ceiling that parked them finds none
#: without reading any. The flag is a column (``parked``), not this comparison
#: written out, so a planner can count the rows it selects: PostgreSQL guesses a
#: third of the table for a comparison of two columns, and then prefers reading
#: every unfinished run to a probe of an empty index.
PARKED = "parked = 1"
#: The rest of :data:`CLAIM_SCOPE`: the rows of ``tether_marks_due`` and
#: ``tether_marks_suspect``. ``parked`` is 0 or 1 and never NULL, so the two split
#: the scope whole: whichever index a run waits in, a claim that may take it finds it.
UNPARKED = "parked = 0"


def parked_after(attempts: str, ceiling: str = "parks_at") -> str:
    """``parked`` for a row a statement leaves with ``attempts`` (SQL) failed claims.

    Every statement that sets ``attempts`` sets ``parked`` with it, from the
    ceiling of the worker that claimed the run last (``parks_at``, which each
    claim records; 1 on a run no claim took since migration 20). A claim sets it
    for the run as it will be if that claim fails too, so a run held by a worker
    at its last allowed attempt (every run a worker of ``max_attempts`` 1 holds)
    is flagged while held; the commit that moves it on clears it
    (:data:`MOVED_ON_UNPARKS`).
    """
    return f"CASE WHEN {attempts} >= {ceiling} THEN 1 ELSE 0 END"


#: What a checkpoint commit sets ``parked`` to (its mark's compare-and-set, in
#: both stores): 0 once the commit moves the held run past the claim's own
#: recovery (:data:`FAILED_CLAIMS` then counts no failure, so the run is parked
#: at no ceiling), else as it was. Without it, a run a worker holds at its last
#: allowed attempt stayed in the parked index while it moved on, where every
#: claim that may take parked runs read past it (outside attack: with
#: ``max_attempts`` 1, every run in flight, 16 ms a claim at 20,000 on
#: PostgreSQL). ``generation`` is the row's before the update: the commit's is one more.
MOVED_ON_UNPARKS = (
    "parked = CASE WHEN claimed_gen IS NOT NULL "
    f"AND generation + 1 > claimed_gen + {RECOVERY_COMMITS} THEN 0 ELSE parked END"
)


#: The runs that may be waiting for a person, whatever the time: frozen for
#: review, a pending write an approval applies to, a run whose claims are
#: counted, or one recorded without a listing (only its checkpoint can say).
#: ``--needs-me`` pages through an index over exactly these rows; the time
#: (an approval expiring, a lease running out) decides among them. Like
#: :data:`CLAIM_SCOPE`, indexed by migration 9 as spelled here.
ATTENTION = (
    "(phase = 'needs_review' OR (phase = 'pending' AND gate IS NOT NULL) "
    "OR (phase IN ('pending', 'running') AND (attempts > 0 OR epoch IS NULL)))"
)


#: Trace events people look up by kind (epochs, rewinds, refused evidence): a
#: handful per run, whatever its length, found through a partial index.
LANDMARK_KINDS = ("run_started", "recovered", "rewind_started", "rewound", "evidence_refused")


def kinds_sql(kinds: tuple[str, ...], column: str = "kind") -> str:
    """``kind IN (...)`` over fixed names (never user input), as the partial indexes spell it."""
    return f"{column} IN (" + ", ".join(f"'{k}'" for k in kinds) + ")"


def migrations(
    blob: str, backfill: tuple[str, ...] = (), turns: tuple[str, ...] = ()
) -> list[tuple[int, list[str]]]:
    """Numbered schema migrations; ``blob`` is the dialect's byte-string type.

    ``backfill``: the dialect's statements that fill migration 10's index
    columns for rows written before it (from the JSON those rows hold).
    ``turns``: the dialect's statements that create migration 12's turn
    counter (a sequence, or a one-row table where there are no sequences).
    """
    return [
        (
            1,
            [
                # lease_expires_at is microseconds since the epoch by the STORE's
                # clock: expiry is judged where the lease lives, so workers whose
                # clocks disagree still agree on who holds a run.
                """CREATE TABLE tether_marks (
                    run_id TEXT PRIMARY KEY,
                    generation BIGINT NOT NULL CHECK (generation >= 1),
                    checkpoint_digest TEXT NOT NULL,
                    state_version BIGINT NOT NULL,
                    lease_version BIGINT NOT NULL DEFAULT 0,
                    lease_owner TEXT,
                    lease_expires_at BIGINT,
                    phase TEXT NOT NULL DEFAULT 'running',
                    updated_at TEXT NOT NULL
                )""",
                # What claim_expired scans: runs in a phase, oldest expiry first.
                """CREATE INDEX tether_marks_claim ON tether_marks (phase, lease_expires_at)""",
                f"""CREATE TABLE tether_checkpoints (
                    run_id TEXT NOT NULL,
                    checkpoint_digest TEXT NOT NULL,
                    generation BIGINT NOT NULL,
                    envelope {blob} NOT NULL,
                    PRIMARY KEY (run_id, checkpoint_digest)
                )""",
                """CREATE TABLE tether_trace (
                    run_id TEXT NOT NULL,
                    hash TEXT NOT NULL,
                    prev_hash TEXT NOT NULL,
                    seq BIGINT NOT NULL,
                    kind TEXT NOT NULL,
                    at TEXT NOT NULL,
                    data TEXT NOT NULL,
                    PRIMARY KEY (run_id, hash)
                )""",
                """CREATE TABLE tether_ledger (
                    run_id TEXT NOT NULL,
                    idempotency_key TEXT NOT NULL,
                    seq BIGINT NOT NULL,
                    status TEXT NOT NULL,
                    action_id TEXT NOT NULL,
                    intent_digest TEXT NOT NULL,
                    receipt TEXT,
                    epoch BIGINT NOT NULL,
                    at TEXT NOT NULL,
                    PRIMARY KEY (run_id, idempotency_key, seq)
                )""",
                # One intended entry per action id: a reused action id is refused
                # by the database itself, not only by the gate.
                """CREATE UNIQUE INDEX tether_ledger_action
                    ON tether_ledger (run_id, action_id) WHERE status = 'intended'""",
                f"""CREATE TABLE tether_blobs (
                    digest TEXT PRIMARY KEY,
                    body {blob} NOT NULL
                )""",
            ],
        ),
        (
            2,
            [
                # Signed evidence (approvals, reviewer decisions) that people leave
                # for a run. Appended, never changed; the run's checkpoint records
                # how far it has read, so each entry is applied or refused once.
                """CREATE TABLE tether_inbox (
                    run_id TEXT NOT NULL,
                    seq BIGINT NOT NULL,
                    kind TEXT NOT NULL,
                    document TEXT NOT NULL,
                    received_at TEXT NOT NULL,
                    PRIMARY KEY (run_id, seq)
                )""",
            ],
        ),
        (
            3,
            [
                # The effect ledger becomes one hash chain per run, written only in
                # the fenced commit of the checkpoint that pins its head. Rows are
                # addressed by hash like trace events, so a commit that never landed
                # (content and mark apart) leaves rows that no signed head reaches.
                # Schema-1 checkpoints cannot be restored by this tether anyway.
                "DROP TABLE tether_ledger",
                """CREATE TABLE tether_ledger (
                    run_id TEXT NOT NULL,
                    hash TEXT NOT NULL,
                    prev_hash TEXT NOT NULL,
                    seq BIGINT NOT NULL,
                    idempotency_key TEXT NOT NULL,
                    status TEXT NOT NULL,
                    action_id TEXT NOT NULL,
                    intent_digest TEXT NOT NULL,
                    receipt TEXT,
                    epoch BIGINT NOT NULL,
                    at TEXT NOT NULL,
                    PRIMARY KEY (run_id, hash)
                )""",
                """CREATE INDEX tether_ledger_seq ON tether_ledger (run_id, seq)""",
                """CREATE INDEX tether_ledger_action
                    ON tether_ledger (run_id, action_id) WHERE status = 'intended'""",
            ],
        ),
        (
            4,
            [
                # A run whose step failed is deferred, not released for an
                # immediate re-claim: claims skip it until retry_at (store clock,
                # microseconds), and a worker parks it after too many attempts.
                "ALTER TABLE tether_marks ADD COLUMN retry_at BIGINT",
                "ALTER TABLE tether_marks ADD COLUMN attempts BIGINT NOT NULL DEFAULT 0",
                "ALTER TABLE tether_marks ADD COLUMN last_error TEXT",
            ],
        ),
        (
            5,
            [
                # A run waiting for a person is not claimed: a worker parks it
                # with the last inbox entry the run had read, and only evidence
                # past that (an approval, a decision) makes it claimable again.
                "ALTER TABLE tether_marks ADD COLUMN waiting_after BIGINT",
            ],
        ),
        (
            6,
            [
                # What each effect is (adapter, kind, target, retry semantics,
                # compensation path, sensitivity) and, on its first entry, its
                # arguments unless sensitive. Both are JSON and covered by the
                # row's hash; rows written before this migration hold NULL and
                # hash as they always did.
                "ALTER TABLE tether_ledger ADD COLUMN terms TEXT",
                "ALTER TABLE tether_ledger ADD COLUMN payload TEXT",
            ],
        ),
        (
            7,
            [
                # TetherSaver (the [langgraph] extra): LangGraph checkpoints in
                # tether's stores. New tables only. The mark per (thread, ns) is
                # the one checkpoint "latest" may name; ``lineage`` is drawn when
                # a thread starts, so rows of a deleted thread never verify again.
                """CREATE TABLE tether_lg_marks (
                    thread_id TEXT NOT NULL,
                    checkpoint_ns TEXT NOT NULL,
                    checkpoint_id TEXT NOT NULL,
                    envelope_digest TEXT NOT NULL,
                    seq BIGINT NOT NULL,
                    lineage TEXT NOT NULL,
                    PRIMARY KEY (thread_id, checkpoint_ns)
                )""",
                # One sealed envelope per checkpoint; its payload names the
                # channel blobs by digest, so unchanged channels are stored once.
                f"""CREATE TABLE tether_lg_checkpoints (
                    thread_id TEXT NOT NULL,
                    checkpoint_ns TEXT NOT NULL,
                    checkpoint_id TEXT NOT NULL,
                    seq BIGINT NOT NULL,
                    envelope {blob} NOT NULL,
                    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
                )""",
                # "Is anything stored past the mark?" on every latest read.
                """CREATE INDEX tether_lg_checkpoints_seq
                    ON tether_lg_checkpoints (thread_id, checkpoint_ns, seq)""",
                f"""CREATE TABLE tether_lg_blobs (
                    thread_id TEXT NOT NULL,
                    checkpoint_ns TEXT NOT NULL,
                    digest TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    body {blob} NOT NULL,
                    PRIMARY KEY (thread_id, checkpoint_ns, digest)
                )""",
                # Pending writes, keyed by (task_id, idx); each row carries its own
                # sealed envelope binding the key to the value's digest.
                f"""CREATE TABLE tether_lg_writes (
                    thread_id TEXT NOT NULL,
                    checkpoint_ns TEXT NOT NULL,
                    checkpoint_id TEXT NOT NULL,
                    task_id TEXT NOT NULL,
                    idx BIGINT NOT NULL,
                    kind TEXT NOT NULL,
                    body {blob} NOT NULL,
                    envelope {blob} NOT NULL,
                    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
                )""",
            ],
        ),
        (
            8,
            [
                # Claims are served by an index in their own order: "when did this
                # run become claimable, then run id", over the rows a claim may take
                # at all. Before it, every claim sorted every claimable row.
                f"CREATE INDEX tether_marks_due ON tether_marks ({CLAIMABLE_AT}, run_id) "
                f"WHERE {CLAIM_SCOPE}",
                # Only the claim read the old index.
                "DROP INDEX tether_marks_claim",
                # A run parked for a person now leaves the index, and the evidence
                # that wakes it clears its wait as it lands (put_evidence). A run
                # whose evidence arrived before this upgrade is woken here.
                """UPDATE tether_marks SET waiting_after = NULL
                    WHERE waiting_after IS NOT NULL AND EXISTS (
                        SELECT 1 FROM tether_inbox i
                         WHERE i.run_id = tether_marks.run_id AND i.seq > tether_marks.waiting_after)""",
            ],
        ),
        (
            9,
            [
                # What a list of runs shows of each (core.Listing), recorded by the
                # runtime with the mark at every commit, so `tether runs` and the
                # page read a page of runs in one query instead of every checkpoint.
                # NULL epoch: a run committed before this (its checkpoint says).
                "ALTER TABLE tether_marks ADD COLUMN epoch BIGINT",
                "ALTER TABLE tether_marks ADD COLUMN subject TEXT",
                "ALTER TABLE tether_marks ADD COLUMN pending_action TEXT",
                "ALTER TABLE tether_marks ADD COLUMN gate TEXT",
                "ALTER TABLE tether_marks ADD COLUMN approved_until TEXT",
                # Pages are by run id: the primary key serves the whole list, these
                # serve a phase and "needs a person". None of them names a column
                # a commit changes on every step, so the commit path keeps its
                # cost (and PostgreSQL its heap-only updates).
                "CREATE INDEX tether_marks_phase ON tether_marks (phase, run_id)",
                f"CREATE INDEX tether_marks_attention ON tether_marks (run_id) WHERE {ATTENTION}",
            ],
        ),
        (
            10,
            [
                # A recovery and a step read the run's past by index, not by
                # walking it: the entries of one effect (what replay-or-fork
                # matches), the events that used one action id (the gate's "used
                # before"), the few landmark events (rewinds, epochs, refused
                # evidence), a checkpoint by generation, and the trace by seq. The
                # two keys are columns tether fills from the row's own content as
                # it writes it (no JSON parsed by the database on the hot path);
                # every reader checks a row's key against its content, and every
                # row a decision uses is proven on the signed chain.
                "ALTER TABLE tether_ledger ADD COLUMN effect TEXT",
                "ALTER TABLE tether_trace ADD COLUMN action_id TEXT",
                *backfill,
                "CREATE INDEX tether_ledger_effect ON tether_ledger (run_id, effect) "
                "WHERE effect IS NOT NULL",
                "CREATE INDEX tether_trace_action ON tether_trace (run_id, action_id) "
                "WHERE action_id IS NOT NULL",
                "CREATE INDEX tether_trace_landmark ON tether_trace (run_id, kind, seq) "
                f"WHERE {kinds_sql(LANDMARK_KINDS)}",
                "CREATE INDEX tether_checkpoints_generation ON tether_checkpoints "
                "(run_id, generation)",
                # A page of the trace deep in a long run, read by seq (the ledger
                # has had this index since migration 3).
                "CREATE INDEX tether_trace_seq ON tether_trace (run_id, seq)",
            ],
        ),
        (
            11,
            [
                # TetherSaver: the sealed manifest of the latest checkpoint's pending
                # writes, on the mark that names it (a deleted write is refused, not
                # run again). NULL on marks written before: read as they always were.
                f"ALTER TABLE tether_lg_marks ADD COLUMN writes {blob}",
            ],
        ),
        (
            12,
            [
                # Fair ties. Two runs claimable at the same instant went by run id,
                # so a run let go at the instant another became claimable was taken
                # first every time its id sorted first (the simulator's seeds 50767
                # and 51427: a failing run released again and again by a worker
                # whose clock had not moved, a healthy one never taken). Every
                # grant of a lease now draws the next turn from one counter, and a
                # tie goes to the run taken least recently. Runs written before
                # this hold turn 0: never taken since, they go first on a tie.
                "ALTER TABLE tether_marks ADD COLUMN turn BIGINT NOT NULL DEFAULT 0",
                *turns,
                # The claim index, keyed by the new order (same name, same rows).
                "DROP INDEX tether_marks_due",
                f"CREATE INDEX tether_marks_due ON tether_marks ({CLAIM_ORDER}) "
                f"WHERE {CLAIM_SCOPE}",
            ],
        ),
        (
            13,
            [
                # (Numbered 13: 11 and 12 were taken by changes written alongside.)
                # Checkpoints of schema 4: the signed payload names the state's
                # big parts (binding, pending write, last write, review cases...)
                # by digest, and their bytes are stored once as content-addressed
                # rows of tether_blobs, in the checkpoint's own transaction. No
                # table changes; the version is recorded so that a tether which
                # cannot read such checkpoints refuses this database when it
                # opens it ("newer than this tether"), instead of failing run by
                # run at recovery after it took their leases.
            ],
        ),
        (
            14,
            [
                # When the store recorded each ledger row, by the STORE's clock
                # (microseconds, as leases are judged): a key's age against an
                # adapter's retention is measured on it, so a worker whose clock
                # runs behind cannot take a stale absence as final. NULL on rows
                # written before: their age is judged with a skew margin instead.
                "ALTER TABLE tether_ledger ADD COLUMN stored_us BIGINT",
            ],
        ),
        (
            15,
            [
                # A, B, A on a target no adapter can read: the replay rule asks
                # whether another effect was committed on the target since the
                # one re-proposed. Each committed entry names its target (the
                # digest of namespace, kind and target, filled by tether from the
                # row's own terms); the newest on a target is one probe of this
                # index, whatever the run's length. Rows written before hold NULL
                # (a digest cannot be computed in SQL) until migration 16 fills them.
                "ALTER TABLE tether_ledger ADD COLUMN target TEXT",
                "CREATE INDEX tether_ledger_target ON tether_ledger (run_id, target, seq) "
                "WHERE target IS NOT NULL",
            ],
        ),
        (
            TARGETS_FILLED,
            [
                # An attempt on the target whose outcome nobody knows may have
                # landed in between too (A, B?, A): every row after the intent
                # now names its target, not only commits, so the rule finds the
                # newest attempt that may have landed in the same probe. The
                # rows written before that lack it (and commits written before
                # migration 15) are filled by tether itself, from each row's own
                # terms (``SQLBase._fill_targets``: SQL cannot compute the
                # digest), in this migration's transaction. No statement here.
            ],
        ),
        (
            17,
            [
                # How an envelope or a blob is stored (tether.store._codec): NULL as
                # it is, "d1" deflated with a fixed dictionary. Only the stored form:
                # digests, signatures and hashes are over the bytes as sealed, and a
                # reader gets those back. Rows written before hold NULL and read as
                # they always did.
                "ALTER TABLE tether_checkpoints ADD COLUMN codec TEXT",
                "ALTER TABLE tether_blobs ADD COLUMN codec TEXT",
                # A trace row's data, and a ledger row's receipt, terms and payload
                # (as one JSON array), deflated in codec d1 when that is shorter;
                # the text columns then hold '' (data) or NULL. Every hash is over
                # the text as sealed, which a reader inflates back before checking.
                f"ALTER TABLE tether_trace ADD COLUMN packed {blob}",
                f"ALTER TABLE tether_ledger ADD COLUMN packed {blob}",
            ],
        ),
        (
            18,
            [
                # The run's generation when a worker last claimed it. A worker that
                # dies never says how its claim went; the next claim compares this
                # with the generation now (core.failed_claims) and does not count a
                # claim that moved the run on as a failure. NULL on marks written
                # before, and until a claim: the count stands as it was.
                "ALTER TABLE tether_marks ADD COLUMN claimed_gen BIGINT",
                # A worker of many threads asks for a suspect alone (SUSPECT): a
                # handful of rows, found here without reading the due runs before them.
                f"CREATE INDEX tether_marks_suspect ON tether_marks ({CLAIM_ORDER}) "
                f"WHERE {CLAIM_SCOPE} AND {SUSPECT}",
            ],
        ),
        (
            19,
            [
                # First come, first served: a run created free now records its
                # creation (store clock) in retry_at, and queues behind a dead
                # worker's run whose lease ran out before it. No table changes; the
                # version is recorded so that an older tether, which creates runs
                # claimable "since ever" and so lets new runs starve a dead worker's,
                # refuses this database ("newer than this tether") instead of
                # writing beside a newer one during a rolling upgrade.
            ],
        ),
        (
            20,
            [
                # Runs parked at the mark leave the claim's indexes (outside attack:
                # 40,000 of them, claimable since long ago, sat at the front of
                # tether_marks_due and made every claim read past them: 26 ms a claim
                # instead of 4). Each claim records its worker's ceiling
                # (max_attempts) in parks_at; a run whose count reaches it is
                # flagged PARKED and waits in an index of its own. Runs written
                # before hold ceiling 1: those with a failed claim or more start
                # there, where every worker still takes the ones under its own
                # ceiling (and records that ceiling as it does).
                "ALTER TABLE tether_marks ADD COLUMN parks_at BIGINT NOT NULL DEFAULT 1",
                "ALTER TABLE tether_marks ADD COLUMN parked SMALLINT NOT NULL DEFAULT 0",
                f"UPDATE tether_marks SET parked = {parked_after('attempts')} WHERE attempts > 0",
                "DROP INDEX tether_marks_due",
                f"CREATE INDEX tether_marks_due ON tether_marks ({CLAIM_ORDER}) "
                f"WHERE {CLAIM_SCOPE} AND {UNPARKED}",
                "DROP INDEX tether_marks_suspect",
                f"CREATE INDEX tether_marks_suspect ON tether_marks ({CLAIM_ORDER}) "
                f"WHERE {CLAIM_SCOPE} AND {UNPARKED} AND {SUSPECT}",
                # Keyed by the count, so "fewer than my ceiling" is one range: empty,
                # and read in one probe, for a worker at the ceiling that parked them.
                f"CREATE INDEX tether_marks_parked ON tether_marks ({FAILED_CLAIMS}) "
                f"WHERE {CLAIM_SCOPE} AND {PARKED}",
            ],
        ),
    ]
