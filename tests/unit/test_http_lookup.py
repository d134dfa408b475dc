"""The look-up reading rule, cell by cell: only the declared route's declared answer is absence."""

from __future__ import annotations

from typing import Any

import pytest

from tether.core._http_lookup import LookupReply, LookupShape, read_lookup
from tether.core._transition import LookupStatus

KEY = "k-1"
OURS = "sha256:ours"
SHAPE = LookupShape()
STRICT = LookupShape(
    absent_status=404, absent_fields=(("error", "unknown_key"), ("idempotency_key", "{key}"))
)


def record(state: str = "completed", status: Any = 201, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"idempotency_key": KEY, "state": state, "fingerprint": OURS}
    if state == "completed":
        body["response"] = {"status": status, "body": {"ticket_id": 7}}
    return {**body, **extra}


S = LookupStatus
#: (name, reply, shape, sent fingerprint, expected status, expected foreign)
CASES: list[tuple[str, LookupReply, LookupShape, str | None, LookupStatus, bool]] = [
    ("503", LookupReply(503, False), SHAPE, OURS, S.UNAVAILABLE, False),
    ("500 json", LookupReply(500, True, {"error": "x"}), SHAPE, OURS, S.UNAVAILABLE, False),
    ("429", LookupReply(429, True, {}), SHAPE, OURS, S.UNAVAILABLE, False),
    ("401", LookupReply(401, False), SHAPE, OURS, S.UNAVAILABLE, False),
    ("403", LookupReply(403, False), SHAPE, OURS, S.UNAVAILABLE, False),
    ("302", LookupReply(302, False), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("307 json", LookupReply(307, True, {"idempotency_key": KEY}), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("404 declared", LookupReply(404, True, {"idempotency_key": KEY}), SHAPE, OURS, S.ABSENT, False),
    (
        "404 declared, more fields",
        LookupReply(404, True, {"error": "unknown_key", "idempotency_key": KEY}),
        STRICT,
        OURS,
        S.ABSENT,
        False,
    ),
    ("404 html", LookupReply(404, False), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("404 plain json", LookupReply(404, True, {"detail": "Not Found"}), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("404 other key", LookupReply(404, True, {"idempotency_key": "k-2"}), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("404 key not text", LookupReply(404, True, {"idempotency_key": 1}), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("404 list", LookupReply(404, True, [KEY]), SHAPE, OURS, S.INCONCLUSIVE, False),
    (
        "404 missing a declared field",
        LookupReply(404, True, {"idempotency_key": KEY}),
        STRICT,
        OURS,
        S.INCONCLUSIVE,
        False,
    ),
    ("410", LookupReply(410, True, {"idempotency_key": KEY}), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("400", LookupReply(400, True, {}), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("405", LookupReply(405, False), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("204", LookupReply(204, False), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("200 html", LookupReply(200, False), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("200 other key", LookupReply(200, True, record(idempotency_key="k-2")), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("200 list", LookupReply(200, True, [record()]), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("in flight", LookupReply(200, True, record("in_flight")), SHAPE, OURS, S.IN_PROGRESS, False),
    ("odd state", LookupReply(200, True, record("queued")), SHAPE, OURS, S.INCONCLUSIVE, False),
    (
        "completed, no response",
        LookupReply(200, True, {"idempotency_key": KEY, "state": "completed"}),
        SHAPE,
        OURS,
        S.INCONCLUSIVE,
        False,
    ),
    ("status not a number", LookupReply(200, True, record(status="201")), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("status a bool", LookupReply(200, True, record(status=True)), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("2xx ours", LookupReply(200, True, record()), SHAPE, OURS, S.COMMITTED, False),
    ("2xx not judged", LookupReply(200, True, record()), SHAPE, None, S.COMMITTED, False),
    ("2xx no fingerprint", LookupReply(200, True, record(fingerprint=None)), SHAPE, OURS, S.COMMITTED, False),
    ("2xx foreign", LookupReply(200, True, record(fingerprint="sha256:x")), SHAPE, OURS, S.COMMITTED, True),
    ("4xx ours", LookupReply(200, True, record(status=400)), SHAPE, OURS, S.REFUSED, False),
    ("4xx foreign", LookupReply(200, True, record(status=400, fingerprint="sha256:x")), SHAPE, OURS, S.COMMITTED, True),
    ("4xx not judged", LookupReply(200, True, record(status=400)), SHAPE, None, S.ABSENT, False),
    ("stored 500", LookupReply(200, True, record(status=500)), SHAPE, OURS, S.INCONCLUSIVE, False),
    ("stored 302", LookupReply(200, True, record(status=302)), SHAPE, OURS, S.INCONCLUSIVE, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "reply", "shape", "sent", "status", "foreign"), CASES, ids=[c[0] for c in CASES]
)
def test_a_look_up_answer_reads_as_the_table_says(
    name: str,
    reply: LookupReply,
    shape: LookupShape,
    sent: str | None,
    status: LookupStatus,
    foreign: bool,
) -> None:
    """Each cell of the table in tether.core._http_lookup gives its reading, and nothing else."""
    reading = read_lookup(reply, key=KEY, shape=shape, sent=sent)
    assert (reading.status, reading.foreign) == (status, foreign)
    if status is S.INCONCLUSIVE:
        assert reading.detail  # a person reads why
    if status in {S.COMMITTED, S.REFUSED}:
        assert isinstance(reading.response_status, int)


def test_absence_is_read_only_from_the_declared_status() -> None:
    """A route that declares 200 with an empty record as its absence: 404 is then no absence."""
    shape = LookupShape(absent_status=200, absent_fields=(("missing", "{key}"),))
    found = read_lookup(LookupReply(200, True, {"missing": KEY}), key=KEY, shape=shape, sent=None)
    assert found.status is S.ABSENT
    declared_elsewhere = read_lookup(
        LookupReply(404, True, {"idempotency_key": KEY}), key=KEY, shape=shape, sent=None
    )
    assert declared_elsewhere.status is S.INCONCLUSIVE


def test_every_reading_is_one_of_the_lookup_statuses() -> None:
    """The rule answers with the settle rules' own statuses, never a new vocabulary."""
    assert {c[4] for c in CASES} == set(LookupStatus)
