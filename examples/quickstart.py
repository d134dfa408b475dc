import json
import pathlib
import time

import tether

OUTBOX = pathlib.Path("outbox.jsonl")  # stands in for a mail service


def sent_under(key: str) -> dict[str, str] | None:
    """What the outbox holds under this key, or None: how tether asks after a crash."""
    emails = [json.loads(line) for line in OUTBOX.open()] if OUTBOX.exists() else []
    return next((email for email in emails if email["key"] == key), None)


@tether.effect("email.send", lookup=sent_under, absent_is_final=True)
def send_email(to: str, text: str, idempotency_key: str) -> dict[str, str]:
    """Send one email: its body runs once, under a key tether persisted before it started."""
    email = {"key": idempotency_key, "to": to, "text": text}
    with OUTBOX.open("a") as outbox:
        outbox.write(json.dumps(email) + "\n")
    return email


runtime = tether.guard("sqlite:///runs.sqlite", send_email)
with tether.effects.run(runtime, "welcome") as run:  # starts the run, or recovers it
    if run.phase.terminal:
        print("run welcome is", run.phase)
    else:
        for n in range(1, 6):
            sent = send_email(f"user{n}@example.com", "Welcome aboard!")
            print(sent.outcome, sent.result["to"], flush=True)  # executed, or replayed
            time.sleep(1)  # kill it now (kill -9, Ctrl-C), run it again: no email twice
        run.finish()
