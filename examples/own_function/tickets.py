"""Your own function, guarded: ``httpx`` opens a ticket, tether makes it happen once.

The ticket service is the reference one that ships with tether
(``python -m tether.testing.effects_service``): it honours the
``Idempotency-Key`` draft (a second request with a key gets the first
response), answers ``422`` for a key reused with another payload, and can be
asked what it recorded under a key (``GET /idempotency/{key}``). So
:func:`open_ticket` declares both proofs: ``idempotent`` (after a crash it
may be called again with the same key) and ``lookup`` (:func:`find_ticket`
is asked first). :func:`cancel_ticket` undoes a ticket under its own key.

:func:`open_ticket_unproven` is the same request declaring nothing: after
a crash between the send and its receipt, tether cannot know whether the
ticket exists, so the run goes to review and the body is never run again.

Where the service is: ``TICKETS_URL`` (read at each call).
"""

from __future__ import annotations

import os
from typing import Any

import httpx

import tether
from tether.adapters import KeyInFlightError
from tether.effects import EffectToUndo

KIND = "tickets.open"


class TicketRefused(Exception):
    """The service refused the request (a 4xx it stores as the key's answer): nothing was made."""


class KeyReused(Exception):
    """The service holds the key for another request (422)."""


def service_url() -> str:
    """The ticket service's base URL (``TICKETS_URL``)."""
    return os.environ.get("TICKETS_URL", "http://127.0.0.1:8000").rstrip("/")


def _keyed(key: str) -> dict[str, str]:
    # The draft's Idempotency-Key is a Structured Field string: quoted.
    return {"Idempotency-Key": f'"{key}"'}


def _answer(reply: httpx.Response) -> dict[str, Any]:
    """A reply's JSON body; a refusal or a reused key as the exceptions declared below."""
    if reply.status_code == 422:
        raise KeyReused(reply.text)
    if 400 <= reply.status_code < 500 and reply.status_code != 409:
        raise TicketRefused(f"{reply.status_code}: {reply.text}")
    reply.raise_for_status()  # a 409 (still in flight) or a 5xx: the outcome is unknown
    body: dict[str, Any] = reply.json()
    return body


def find_ticket(key: str) -> dict[str, Any] | None:
    """What the service answered under ``key`` (the ticket), or ``None`` if it has nothing."""
    reply = httpx.get(f"{service_url()}/idempotency/{key}", timeout=5)
    if reply.status_code == 404:
        return None
    reply.raise_for_status()
    record = reply.json()
    if record["state"] == "in_flight":
        raise KeyInFlightError(key, "the service is still carrying out the request")
    response = record["response"]
    if response["status"] >= 400:
        raise TicketRefused(f"{response['status']}: {response['body']}")
    body: dict[str, Any] = response["body"]
    return body


def cancel_ticket(effect: EffectToUndo, idempotency_key: str) -> dict[str, Any]:
    """Undo an opened ticket: cancel it, under the compensation's own key."""
    reply = httpx.post(
        f"{service_url()}/tickets/{effect.business_object_id}/cancel",
        json={"compensates": effect.idempotency_key},
        headers=_keyed(idempotency_key),
        timeout=5,
    )
    return _answer(reply)


@tether.effect(
    KIND,
    target=None,
    idempotent=True,
    lookup=find_ticket,
    refusals=(TicketRefused,),
    conflicts=(KeyReused,),
    compensate=cancel_ticket,
    compensate_idempotent=True,  # the service deduplicates cancellations by key too
    object_id="ticket_id",
    committed_at="created_at",
)
def open_ticket(title: str, idempotency_key: str) -> dict[str, Any]:
    """Open a ticket titled ``title``; the key goes where the service deduplicates."""
    reply = httpx.post(
        f"{service_url()}/tickets",
        json={"title": title},
        headers=_keyed(idempotency_key),
        timeout=5,
    )
    return _answer(reply)


@tether.effect(KIND, target=None, refusals=(TicketRefused,))
def open_ticket_unproven(title: str) -> dict[str, Any]:
    """The same request, proving nothing: an unknown outcome goes to a person."""
    reply = httpx.post(
        f"{service_url()}/tickets",
        json={"title": title},
        headers=_keyed(tether.current_key()),
        timeout=5,
    )
    return _answer(reply)


@tether.effect(KIND, target=None, idempotent=True, lookup=find_ticket, refusals=(TicketRefused,))
async def open_ticket_async(title: str, idempotency_key: str) -> dict[str, Any]:
    """:func:`open_ticket` with ``httpx.AsyncClient``, awaited on the caller's event loop."""
    async with httpx.AsyncClient(timeout=5) as client:
        reply = await client.post(
            f"{service_url()}/tickets", json={"title": title}, headers=_keyed(idempotency_key)
        )
    return _answer(reply)


def tickets(marker: str) -> list[dict[str, Any]]:
    """The tickets the service holds whose request names ``marker``: what the world received."""
    reply = httpx.get(f"{service_url()}/tickets", timeout=5)
    reply.raise_for_status()
    return [t for t in reply.json()["tickets"] if marker in t["body"]]
