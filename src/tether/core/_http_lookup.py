"""Reading an HTTP look-up's answer: a receipt, proven absence, or an unknown outcome.

A service's profile declares a look-up route (``GET idempotency/{key}``) and
the shape of its "no record under this key" answer. Absence decides between
sending a write again and asking a person, so it is taken only from that
route, in that shape: a ``404`` from a server that has no such route ("Not
Found" in HTML), a redirect, a record for another key, an error page are
never "nothing landed". The rule is :func:`read_lookup`, one function of the
answer's values:

========================================  ==================================
the look-up answers                       reading
========================================  ==================================
401, 403, 407, 408, 425, 429, 5xx         unavailable: asked again later
                                          (nothing about the key was said)
3xx (any redirect)                        inconclusive
the declared absent status, a JSON        absent
object holding every declared field
with its declared value
the declared absent status otherwise      inconclusive
200, a JSON object naming another key     inconclusive
(or none), or not JSON
200, ``state: in_flight``                 in progress
200, ``completed``, no well-formed        inconclusive
``response``
200, ``completed``, the service's         committed, foreign (another
fingerprint differs from the request      request's record: a key conflict)
sent under the key
200, ``completed``, response 2xx          committed
200, ``completed``, response 4xx, this    refused (nothing landed)
very request
200, ``completed``, response 4xx, the     absent (the service refused
request not judged                        whatever it got under the key)
200, ``completed``, response 1xx/3xx/5xx  inconclusive (a stored error says
                                          nothing about what happened)
200, another ``state``                    inconclusive
any other status                          inconclusive
========================================  ==================================

A look-up record is the reference service's format
(:mod:`tether.testing.effects_service`): ``{"idempotency_key", "state",
"fingerprint", "response": {"status", "body"}}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.core._canonical import JSONValue
from tether.core._transition import LookupStatus

#: Answers that say "not now" about the look-up itself, never anything about the key.
_NOT_NOW = frozenset({401, 403, 407, 408, 425, 429})


@dataclass(frozen=True, slots=True)
class LookupShape:
    """How a look-up route says "no record under this key", as a profile declares it.

    ``absent_status``: the status of that answer. ``absent_fields``: the
    fields its JSON object body must hold, each with exactly this value
    (``{key}`` in a value stands for the key asked). A body that echoes the
    key is what tells the route's own answer from a server's "no such route".
    """

    absent_status: int = 404
    absent_fields: tuple[tuple[str, str], ...] = (("idempotency_key", "{key}"),)


@dataclass(frozen=True, slots=True)
class LookupReply:
    """What came back from the look-up route: its status and, if it was JSON, its body.

    ``json``: the body parsed as JSON (a JSON media type and a strict parse);
    ``body`` is then the parsed value, else ``None``.
    """

    status: int
    json: bool
    body: JSONValue = None


@dataclass(frozen=True, slots=True)
class LookupReading:
    """What a look-up's answer proves (see the module's table).

    ``response_status`` and ``response_body``: the stored response, for a
    committed or refused reading. ``foreign``: the record's fingerprint is
    not the request's sent under the key (a committed reading of another
    request). ``fingerprint``: the record's fingerprint as the service keeps it.
    """

    status: LookupStatus
    detail: str = ""
    response_status: int | None = None
    response_body: Any = None
    foreign: bool = False
    fingerprint: str | None = None


def read_lookup(
    reply: LookupReply, *, key: str, shape: LookupShape, sent: str | None
) -> LookupReading:
    """What ``reply`` to a look-up for ``key`` proves, judged by the declared ``shape``.

    ``sent``: the fingerprint of the request sent under the key, as the
    service computes it (``None``: the answer is not judged against a request).
    """
    status = reply.status
    if status in _NOT_NOW or 500 <= status < 600:
        return LookupReading(LookupStatus.UNAVAILABLE, f"the look-up answered {status}")
    if 300 <= status < 400:
        return _inconclusive(f"the look-up was redirected ({status}), not answered by its route")
    if status == shape.absent_status and _declared_absent(reply, key, shape):
        return LookupReading(LookupStatus.ABSENT)
    if status == shape.absent_status and status != 200:
        return _inconclusive(
            f"the look-up answered {status}, but not in the declared shape of 'no record under "
            "this key' (a server without that route answers so too)"
        )
    if status != 200:
        return _inconclusive(f"the look-up answered {status}")
    record = reply.body if reply.json else None
    if not isinstance(record, dict) or record.get("idempotency_key") != key:
        return _inconclusive("the look-up answered 200 without a record for this key")
    state = record.get("state")
    if state == "in_flight":
        return LookupReading(
            LookupStatus.IN_PROGRESS, "the service reports the request as still in flight"
        )
    if state != "completed":
        return _inconclusive(f"the look-up's record is in state {state!r}")
    return _completed(record, sent)


def _completed(record: Mapping[str, Any], sent: str | None) -> LookupReading:
    response = record.get("response")
    code = response.get("status") if isinstance(response, dict) else None
    if not isinstance(response, dict) or isinstance(code, bool) or not isinstance(code, int):
        return _inconclusive("the look-up's completed record holds no response")
    recorded = record.get("fingerprint")
    fingerprint = recorded if isinstance(recorded, str) else None
    body = response.get("body")
    # A record without a fingerprint is taken as the request's: tether mints
    # one key per intent, so nothing else was sent under it.
    foreign = sent is not None and fingerprint is not None and fingerprint != sent
    if foreign or 200 <= code < 300:
        return LookupReading(
            LookupStatus.COMMITTED,
            response_status=code,
            response_body=body,
            foreign=foreign,
            fingerprint=fingerprint,
        )
    if 400 <= code < 500:
        if sent is None:
            return LookupReading(LookupStatus.ABSENT, fingerprint=fingerprint)
        return LookupReading(
            LookupStatus.REFUSED,
            f"the service refused this request under the key with {code}",
            response_status=code,
            response_body=body,
            fingerprint=fingerprint,
        )
    return _inconclusive(
        f"the service stored a {code} under the key, which does not say whether anything landed"
    )


def _declared_absent(reply: LookupReply, key: str, shape: LookupShape) -> bool:
    body = reply.body
    if not reply.json or not isinstance(body, dict):
        return False
    return all(
        isinstance(body.get(name), str) and body.get(name) == value.replace("{key}", key)
        for name, value in shape.absent_fields
    )


def _inconclusive(detail: str) -> LookupReading:
    return LookupReading(LookupStatus.INCONCLUSIVE, detail)
