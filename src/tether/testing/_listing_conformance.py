"""Store conformance, part three: the runs list, a page at a time.

A commit records the run's listing with its mark; ``runs_page`` reads pages
by run id, each run exactly once however the pages are cut; ``--needs-me``
is filtered in the store by the same rules :mod:`tether.core.listing_rules`
applies to one row (checked here against each other on every case).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tether.core import StoreError
from tether.core import _listing as listing_rules
from tether.core._listing import Listing
from tether.store import LeaseRequest
from tether.testing._store_conformance import expect, expect_eq, make_commit

LONG = 30.0
#: Far from now in both directions, as approvals sign their expiry (RFC 3339 UTC).
FUTURE = "2999-01-01T00:00:00.000000Z"
PAST = "2000-01-01T00:00:00.000000Z"


def _all_pages(store: Any, limit: int, **filters: Any) -> list[list[str]]:
    """Every page's run ids, following ``after`` until it is None."""
    pages: list[list[str]] = []
    after = None
    for _ in range(1000):
        page = store.runs_page(after=after, limit=limit, **filters)
        pages.append([listed.mark.run_id for listed in page.runs])
        if page.after is None:
            return pages
        expect_eq(page.after, pages[-1][-1], "the next page starts after this page's last run")
        after = page.after
    raise AssertionError("paging did not end")


def test_pages_hold_every_run_exactly_once_in_run_id_order(tether_store: Any) -> None:
    """However the pages are cut, each run is on exactly one page, by run id; a phase filters."""
    ids = [f"run-{i:02d}" for i in range(23)]
    for i, run_id in enumerate(reversed(ids)):
        tether_store.commit(make_commit(run_id, 1, phase="completed" if i % 3 else "running"), 0)
    for limit in (1, 5, 7, 23, 50):
        pages = _all_pages(tether_store, limit)
        flat = [run_id for page in pages for run_id in page]
        expect_eq(flat, ids, f"every run once, in order, pages of {limit}")
        expect(all(len(page) <= limit for page in pages), f"no page over {limit}")
    running = [run_id for page in _all_pages(tether_store, 4, phase="running") for run_id in page]
    expect_eq(running, [m.run_id for m in tether_store.runs() if m.phase == "running"], "phase")
    with pytest.raises(StoreError):
        tether_store.runs_page(limit=0)


def test_a_commit_records_its_listing_and_the_next_commit_replaces_it(tether_store: Any) -> None:
    """The listing lands with the mark (commit and cas_mark alike); a commit without one clears it."""
    first = Listing(epoch=1, subject="file.write notes.txt", pending_action="w1", gate="intended")
    tether_store.commit(replace(make_commit("r", 1, phase="pending"), listing=first), 0)
    (listed,) = tether_store.runs_page().runs
    expect_eq(listed.listing, first, "the listing as committed")
    expect(listed.updated_at.tzinfo is not None, "the commit's time is read back aware")
    second = Listing(epoch=2, approved_until=FUTURE)
    tether_store.commit(replace(make_commit("r", 2), listing=second), 1)
    expect_eq(tether_store.runs_page().runs[0].listing, second, "the next commit's listing")
    tether_store.commit(make_commit("r", 3), 2)
    expect_eq(tether_store.runs_page().runs[0].listing, None, "a commit without one")
    marks_only = Listing(epoch=4, subject="c1 (conflict)")
    tether_store.cas_mark(
        "q", 0, 1, make_commit("q", 1).checkpoint_digest, phase="needs_review", listing=marks_only
    )
    expect_eq(tether_store.runs_page(after="p").runs[0].listing, marks_only, "cas_mark's")
    created = Listing(epoch=1)
    tether_store.commit(
        replace(make_commit("s", 1), listing=created), 0, lease_to=LeaseRequest("w", LONG)
    )
    expect_eq(tether_store.runs_page(after="r").runs[-1].listing, created, "created leased")


def _commit(store: Any, run_id: str, phase: str, listing: Listing | None) -> None:
    store.commit(replace(make_commit(run_id, 1, phase=phase), listing=listing), 0)


def test_needs_a_person_is_filtered_in_the_store_by_the_rules_of_one_row(
    tether_store: Any,
) -> None:
    """Review, an approval due, a failing run, an unknown listing: in; the rest out; as the rules say."""
    pending = Listing(epoch=1, subject="file.write a", pending_action="w1", gate="intended")
    cases: dict[str, tuple[str, Listing | None, bool]] = {
        "a-review": ("needs_review", Listing(epoch=1, subject="c1 (conflict)"), True),
        "b-approval-due": ("pending", pending, True),
        "c-approved": ("pending", replace(pending, approved_until=FUTURE), False),
        "d-approval-lapsed": ("pending", replace(pending, approved_until=PAST), True),
        "e-sent": ("pending", replace(pending, gate="dispatched"), False),
        "f-sent-parked": ("pending", replace(pending, gate="dispatched"), True),
        "g-no-approval-applies": ("pending", replace(pending, gate=None), False),
        "h-running": ("running", Listing(epoch=1), False),
        "i-held": ("running", Listing(epoch=1), False),
        "j-failing": ("running", Listing(epoch=1), True),
        "k-completed": ("completed", Listing(epoch=3), False),
        "l-unknown": ("running", None, True),
        "m-unknown-done": ("completed", None, False),
    }
    for run_id, (phase, listing, _) in cases.items():
        _commit(tether_store, run_id, phase, listing)
    claimed = {
        x.run_id: x
        for x in tether_store.claim_expired(
            "w", LONG, limit=20, phases=("running", "pending", "needs_review")
        )
    }
    for run_id, lease in claimed.items():
        if run_id == "f-sent-parked":
            tether_store.wait_for_evidence(run_id, "w", lease.lease_version, 0, 0)
        elif run_id == "j-failing":
            tether_store.defer(run_id, "w", lease.lease_version, LONG, "boom")
        elif run_id != "i-held":
            tether_store.release_lease(run_id, "w", lease.lease_version)
    now = datetime.now(UTC) + timedelta(seconds=1)
    found = {listed.mark.run_id for listed in tether_store.runs_page(needs_person_at=now).runs}
    expect_eq(found, {k for k, (_, _, yes) in cases.items() if yes}, "runs needing a person")
    for listed in tether_store.runs_page().runs:
        mark, listing = listed.mark, listed.listing
        if listing is None:
            continue
        approval = listing_rules.awaits_approval(mark.phase, listing, mark.waiting_after, now)
        failing = listing_rules.failing(
            mark.attempts, mark.last_error, mark.lease_owner, mark.lease_expires_at, now
        )
        expect_eq(
            listing_rules.needs_person(mark.phase, approval, failing),
            mark.run_id in found,
            f"the store and the rules agree on {mark.run_id}",
        )
    paged = [r for page in _all_pages(tether_store, 2, needs_person_at=now) for r in page]
    expect_eq(paged, sorted(found), "needs-a-person pages hold each once, in order")


__all__ = [
    "test_a_commit_records_its_listing_and_the_next_commit_replaces_it",
    "test_needs_a_person_is_filtered_in_the_store_by_the_rules_of_one_row",
    "test_pages_hold_every_run_exactly_once_in_run_id_order",
]
