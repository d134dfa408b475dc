import os
from typing import Any

import httpx

import tether
from tether.adapters import KeyInFlightError

URL = os.environ["TICKETS_URL"]  # python -m tether.testing.effects_service --db tickets.sqlite


class Refused(Exception):
    """The service refused the ticket (a 4xx): nothing was created."""


def find_ticket(key: str) -> Any:
    """What the service recorded under the key: the ticket, or None if nothing."""
    reply = httpx.get(f"{URL}/idempotency/{key}")
    if reply.status_code == 404:
        return None
    record = reply.raise_for_status().json()
    if record["state"] == "in_flight":
        raise KeyInFlightError(key, "the service is still carrying it out")
    if record["response"]["status"] >= 400:
        raise Refused(record["response"]["body"])  # it stored its refusal: nothing happened
    return record["response"]["body"]


@tether.effect(
    "tickets.open", target=None, idempotent=True, lookup=find_ticket, refusals=(Refused,)
)
def open_ticket(title: str, idempotency_key: str) -> Any:
    """Open a ticket; tether's key goes in the Idempotency-Key header (a quoted SF string)."""
    reply = httpx.post(
        f"{URL}/tickets", json={"title": title}, headers={"Idempotency-Key": f'"{idempotency_key}"'}
    )
    if 400 <= reply.status_code < 500 and reply.status_code not in (409, 422):
        raise Refused(reply.text)
    return reply.raise_for_status().json()  # a 5xx or a lost reply: unknown, asked by key


# The task and policy are built from the declared effect; the keyring that seals the
# runs' checkpoints is made on first use in ~/.local/share/tether/keyring.json (0600).
runtime = tether.guard("sqlite:///runs.sqlite", open_ticket)

with tether.effects.run(runtime, "case-1") as run:  # starts case-1, or recovers it
    if run.phase.terminal:
        print("case-1 is", run.phase)
    else:
        done = open_ticket("The printer is on fire")  # killed anywhere: run the script again
        print(done.outcome, "ticket", done.result["ticket_id"])
        run.finish("ticket opened")
