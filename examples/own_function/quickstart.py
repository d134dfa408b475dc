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


if not os.path.exists("keyring.json"):  # seals the runs' checkpoints: keep it, never print it
    tether.Keyring.generate("tickets-1").write_file("keyring.json")
identity = open_ticket.adapter.environment()  # a function's environment is its identity
runtime = tether.Runtime(
    store=tether.open_store("sqlite:///runs.sqlite"),
    keyring=tether.Keyring.from_file("keyring.json"),
    adapter=open_ticket.adapter,  # the function's own body performs tickets.open
    task=tether.TaskSpec.from_json(
        {
            "task_id": "tickets",
            "task_version": "1",
            "allowed_kinds": ["tickets.open"],
            "allowed_paths": [],
            "permissions": ["tickets.open"],
            "budgets": {"proposals": 10, "steps": 20, "wall_time_s": 3600, "cost": 10},
            "initial_environment": {
                "namespace": identity.namespace,
                "state_fingerprint": identity.state_fingerprint,
            },
        }
    ),
    policy=tether.Policy.from_json(
        {
            "policy_id": "tickets",
            "policy_version": "1",
            "max_risk": "low",
            "approval_ttl_s": 600,
            "kinds": {
                "tickets.open": {
                    "risk": "low",
                    "permission": "tickets.open",
                    "needs_approval": False,
                }
            },
        }
    ),
)

with tether.effects.run(runtime, "case-1") as run:  # starts case-1, or recovers it
    if run.phase.terminal:
        print("case-1 is", run.phase)
    else:
        done = open_ticket("The printer is on fire")  # killed anywhere: run the script again
        print(done.outcome, "ticket", done.result["ticket_id"])
        run.finish("ticket opened")
