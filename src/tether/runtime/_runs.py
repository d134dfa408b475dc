"""Which runs wait for whom, a page at a time: the list behind `tether runs` and the page.

A page is one indexed read of the store (:meth:`~tether.store.SQLBase.runs_page`):
the marks and the :class:`~tether.core.Listing` the runtime recorded with
each at its last commit, filtered (a phase, "needs a person") and ordered by
run id in the store. Who a run waits for is decided by
``core.listing_rules``, the same rules one run's full view uses. Nothing is
parsed per row, except:

- with a keyring, each listed run's checkpoint is verified and the row is
  built from what is signed (the page reads the envelopes in the same
  query when marks and content share a database);
- a run last committed without a listing (before this tether) is read
  from its checkpoint, as a run's own page would.

Each page carries a ``version``, a digest of everything the page shows
(what is time-dependent included): a caller that already shows that version
can skip the rest (:func:`runs_page` ``unless=``), so a refresh that finds
nothing changed reads one page of marks and no checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tether.core import (
    CheckpointCorruptError,
    Policy,
    RunState,
    SchemaVersionError,
    TetherError,
    UnknownFieldError,
)
from tether.core import _listing as listing_rules
from tether.core._listing import Listing, listing_of
from tether.core._payload import READABLE_SCHEMA_VERSIONS, expand_payload, parts_named
from tether.crypto import Keyring, envelope_digest, open_envelope
from tether.runtime._clock import SystemClock
from tether.runtime._runview import marks_of, open_run, stored_policy
from tether.store import ContentStore, GenerationStore, ListedRun, Mark, MarksPage

#: Runs on one page unless the caller asks for another number (at most 1,000).
PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One line of ``tether runs``: where a run is and what it waits for, since when.

    ``since`` is the run's last checkpoint commit, as the store recorded it.
    """

    run_id: str
    phase: str
    generation: int | None
    epoch: int | None
    waiting_for: str | None
    since: datetime | None
    needs_person: bool
    attempts: int
    last_error: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "phase": self.phase,
            "generation": self.generation,
            "epoch": self.epoch,
            "waiting_for": self.waiting_for,
            "since": None if self.since is None else self.since.isoformat(),
            "needs_person": self.needs_person,
            "attempts": self.attempts,
            "last_error": self.last_error,
        }


@dataclass(frozen=True, slots=True)
class RunsPage:
    """One page of runs by run id, and where the next page starts.

    ``after``: the run id to pass for the next page (``None``: this is the
    last). ``version``: a digest of what the page shows; the same version
    means the same page.
    """

    rows: tuple[RunSummary, ...]
    after: str | None
    version: str


def runs_page(
    store: ContentStore,
    *,
    keyring: Keyring | None = None,
    marks: GenerationStore | None = None,
    phase: str | None = None,
    needs_person: bool = False,
    after: str | None = None,
    limit: int = PAGE_SIZE,
    now: datetime | None = None,
    unless: str | None = None,
) -> RunsPage | None:
    """The page of runs after run id ``after``, by run id; ``None`` if it is still ``unless``.

    ``phase`` and ``needs_person`` filter in the store. ``now`` (default: the
    system clock) is what approval expiry and lease liveness are judged by.
    With ``keyring``, every listed run's checkpoint is verified and its row
    built from the signed state; a run that cannot be read back (a damaged
    checkpoint or row, a key the keyring lacks, a listing that does not
    match what is signed) is listed as needing a person, with the reason.
    """
    moment = now if now is not None else SystemClock().now()
    source = marks if marks is not None else marks_of(store)
    colocated = marks is None or marks is store  # type: ignore[comparison-overlap]
    page: MarksPage = source.runs_page(
        after=after,
        limit=limit,
        phase=phase,
        needs_person_at=moment if needs_person else None,
        envelopes=keyring is not None and colocated,
    )
    version = _version(page, moment, (phase, needs_person, after, limit, keyring is not None))
    if unless is not None and unless == version:
        return None
    rows = [_unreadable(str(exc.run_id), "unknown", None, exc) for exc in page.damaged]
    policies: dict[str, Policy | None] = {}
    parts = _parts_of(store, page, keyring) if keyring is not None else {}

    def fetch(found: str) -> bytes | None:
        return parts[found] if found in parts else store.get_blob(found)

    for listed in page.runs:
        mark = listed.mark
        try:
            if keyring is not None:
                row = _verified(store, listed, keyring, moment, policies, fetch)
            elif listed.listing is None:
                row = _from_view(store, listed, marks, moment)
            else:
                row = _summary(listed, listed.listing, mark.phase, moment)
        except TetherError as exc:
            row = _unreadable(mark.run_id, mark.phase, mark, exc)
        if needs_person and not row.needs_person:
            continue  # the store could not tell (no listing); the checkpoint said no
        rows.append(row)
    rows.sort(key=lambda r: r.run_id)
    return RunsPage(tuple(rows), page.after, version)


def list_runs(
    store: ContentStore,
    *,
    keyring: Keyring | None = None,
    marks: GenerationStore | None = None,
    phase: str | None = None,
    needs_person: bool = False,
    now: datetime | None = None,
) -> list[RunSummary]:
    """Every run the store holds, by run id, read page by page (see :func:`runs_page`).

    For a library caller that wants them all; a person's tool shows a page.
    """
    moment = now if now is not None else SystemClock().now()
    rows: list[RunSummary] = []
    after: str | None = None
    while True:
        page = runs_page(
            store,
            keyring=keyring,
            marks=marks,
            phase=phase,
            needs_person=needs_person,
            after=after,
            limit=1000,
            now=moment,
        )
        if page is None:  # unreachable: no version was passed
            break
        rows += page.rows
        if page.after is None:
            return rows
        after = page.after
    return rows


def _summary(listed: ListedRun, listing: Listing, phase: str, now: datetime) -> RunSummary:
    """A row from the listing and the mark, by the rules one run's view uses."""
    mark = listed.mark
    approval = listing_rules.awaits_approval(phase, listing, mark.waiting_after, now)
    failing = listing_rules.failing(
        mark.attempts, mark.last_error, mark.lease_owner, mark.lease_expires_at, now
    )
    return RunSummary(
        mark.run_id,
        phase,
        mark.generation,
        listing.epoch,
        listing_rules.waiting_for(
            phase,
            listing,
            approval=approval,
            failing=failing,
            attempts=mark.attempts,
            last_error=mark.last_error,
        ),
        listed.updated_at,
        listing_rules.needs_person(phase, approval, failing),
        mark.attempts,
        mark.last_error,
    )


def _from_view(
    store: ContentStore, listed: ListedRun, marks: GenerationStore | None, now: datetime
) -> RunSummary:
    """A run committed without a listing: read from its checkpoint, as its own page does."""
    view = open_run(store, listed.mark.run_id, marks=marks, now=now, history=False)
    return _summary(listed, view.listing, view.state.phase.value, now)


def _parts_of(store: ContentStore, page: MarksPage, keyring: Keyring) -> dict[str, bytes]:
    """The state parts every checkpoint on the page names, read in one query where the store can.

    Unverified here: each is checked against its signed digest when its state
    is read back. An envelope that does not open names none (its row says why).
    """
    wanted: set[str] = set()
    for listed in page.runs:
        if listed.envelope is None:
            continue
        try:
            payload = open_envelope(listed.envelope, keyring, run_id=listed.mark.run_id)
            wanted.update(parts_named(payload).values())
        except TetherError:
            continue
    many = getattr(store, "get_blobs", None)
    if many is None or not wanted:
        return {}
    return dict(many(wanted))


def _verified(
    store: ContentStore,
    listed: ListedRun,
    keyring: Keyring,
    now: datetime,
    policies: dict[str, Policy | None],
    fetch: Callable[[str], bytes | None],
) -> RunSummary:
    """A row built from the signed checkpoint the mark names, checked against the stored listing."""
    mark = listed.mark
    envelope = listed.envelope
    if envelope is None:
        envelope = store.get_checkpoint(mark.run_id, mark.checkpoint_digest)
    if envelope is None:
        raise CheckpointCorruptError(
            f"run {mark.run_id}: the content store lacks checkpoint {mark.checkpoint_digest} "
            "that the high-water mark names",
            run_id=mark.run_id,
        )
    state = verified_state(envelope, mark, keyring, fetch)
    fingerprint = state.binding.policy_fingerprint
    if fingerprint not in policies:
        policies[fingerprint] = stored_policy(store, state)
    signed = listing_of(state, policies[fingerprint])
    if listed.listing is not None and listed.listing != signed:
        raise CheckpointCorruptError(
            f"run {mark.run_id}: the listing stored with its mark does not match its signed "
            "checkpoint; the marks table was edited",
            run_id=mark.run_id,
        )
    return _summary(listed, signed, state.phase.value, now)


def verified_state(
    envelope: bytes, mark: Mark, keyring: Keyring, fetch: Callable[[str], bytes | None]
) -> RunState:
    """The state in ``envelope``, verified under ``keyring`` and checked to be the one ``mark`` names.

    The checks recovery makes before it reads anything (see
    :meth:`~tether.runtime.Checkpointer.load`), in its order; ``fetch`` reads
    the parts a schema-4 payload names (each checked against its signed digest).
    """
    run_id = mark.run_id
    payload = open_envelope(envelope, keyring, run_id=run_id)
    version = payload.get("schema_version") if isinstance(payload, dict) else None
    if isinstance(version, bool) or not isinstance(version, int):
        raise UnknownFieldError("schema_version", "missing or not an integer", run_id=run_id)
    if version not in READABLE_SCHEMA_VERSIONS:
        raise SchemaVersionError(
            f"checkpoint schema version {version}; this tether reads "
            f"{' and '.join(map(str, sorted(READABLE_SCHEMA_VERSIONS)))}",
            run_id=run_id,
        )
    state = RunState.from_json(expand_payload(payload, fetch, run_id=run_id))
    if (
        state.run_id != run_id
        or state.generation != mark.generation
        or envelope_digest(envelope) != mark.checkpoint_digest
    ):
        raise CheckpointCorruptError(
            f"run {run_id}: the checkpoint is not the one its high-water mark names",
            run_id=run_id,
        )
    return state


def _unreadable(run_id: str, phase: str, mark: Mark | None, exc: TetherError) -> RunSummary:
    """A run that cannot be read back, listed as needing a person, with the reason."""
    return RunSummary(
        run_id,
        phase,
        None if mark is None else mark.generation,
        None,
        f"a person: cannot read it ({type(exc).__name__}: {exc})",
        None,
        True,
        0 if mark is None else mark.attempts,
        None if mark is None else mark.last_error,
    )


def _version(page: MarksPage, now: datetime, asked: tuple[Any, ...]) -> str:
    """A digest of everything the page shows, read from its marks alone (no checkpoint)."""
    shown: list[Any] = [list(asked), page.after, [str(exc) for exc in page.damaged]]
    if any(listed.listing is None for listed in page.runs):
        # A row read from its checkpoint may turn with the clock (an approval
        # expiring) in ways the marks do not show: such a page is always new.
        shown.append(now.isoformat())
    for listed in page.runs:
        mark, listing = listed.mark, listed.listing
        flags = None
        if listing is not None:
            flags = [
                listing_rules.awaits_approval(mark.phase, listing, mark.waiting_after, now),
                listing_rules.failing(
                    mark.attempts, mark.last_error, mark.lease_owner, mark.lease_expires_at, now
                ),
            ]
        shown.append(
            [
                mark.run_id,
                mark.generation,
                mark.checkpoint_digest,
                mark.phase,
                mark.attempts,
                mark.last_error,
                mark.waiting_after,
                listed.updated_at.isoformat(),
                None
                if listing is None
                else [
                    listing.epoch,
                    listing.subject,
                    listing.pending_action,
                    listing.gate,
                    listing.approved_until,
                ],
                flags,
            ]
        )
    text = json.dumps(shown, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
