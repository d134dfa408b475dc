"""Deliberately broken apps built on the crash example's, for the harness to catch or survive.

The broken outboxes pass a clean run: the lies only matter once a crash
makes recovery ask.

- ``twice``: claims to deduplicate and to answer look-ups, but delivers every
  send as a new message and never finds one: recovery after the send asks,
  hears "nothing", and the world gets the message again.
- ``phantom``: its look-up vouches for any key, sent or not: recovery after
  the intent (before the send) asks, takes the invented receipt, and the
  message never goes out.
- ``refusing``: its look-up reports a key it never received as a send the
  service refused: recovery after the intent (before the send) records a
  refusal, the run completes, and the message never goes out.

``uncountable`` and ``unpreparable`` are sound runs whose ``effects()`` or
``prepare()`` raises for one trial only: that trial is an error, the others
keep their verdicts.
"""

from __future__ import annotations

import functools
from pathlib import Path

from tether.core import Capabilities, Intent, PreconditionFailedError, Receipt
from tether.runtime import CrashPlan, Runtime
from tether.testing.crash_example import ExampleApp, Outbox

HONEST_LOOKING = Capabilities(
    idempotent=True, queryable=True, conditional_writes=False, stateful=False
)


class TwiceOutbox(Outbox):
    """Declares idempotent and queryable; sends every time and finds nothing."""

    @property
    def capabilities(self) -> Capabilities:
        return HONEST_LOOKING

    def lookup(self, key: str) -> Receipt | None:
        return None


class PhantomOutbox(Outbox):
    """An honest sender whose look-up answers every key with a receipt it made up."""

    def lookup_intent(self, key: str, intent: Intent) -> Receipt | None:
        return Receipt(
            namespace=self.namespace,
            adapter_version=self.version,
            receipt_id="msg-invented",
            idempotency_key=key,
            intent_digest=intent.digest,
            result={"to": intent.target},
            business_object_id="invented",
            committed_at="2026-12-02T12:00:00Z",
            post_state=self.environment(),
        )


def twice(workdir: Path) -> ExampleApp:
    """The example app with :class:`TwiceOutbox`."""
    return ExampleApp(workdir, functools.partial(TwiceOutbox, dedupe=False))


def phantom(workdir: Path) -> ExampleApp:
    """The example app with :class:`PhantomOutbox`."""
    return ExampleApp(workdir, PhantomOutbox)


class DeafApp(ExampleApp):
    """Builds its runtime without the harness's crash plan, so nothing can ever fire."""

    def runtime(self, store: object, run_id: str, crash: CrashPlan) -> Runtime:
        return super().runtime(store, run_id, CrashPlan())


def deaf(workdir: Path) -> ExampleApp:
    """The example app, deaf to the crash plan."""
    return DeafApp(workdir)


class RefusingOutbox(Outbox):
    """An honest sender whose look-up reports "never received" as "received and refused"."""

    def lookup_intent(self, key: str, intent: Intent) -> Receipt | None:
        found = self.lookup(key)
        if found is None:  # the lie: nothing under the key is reported as a stored refusal
            raise PreconditionFailedError(intent.target, "accepted", "refused (made up)")
        return found


def refusing(workdir: Path) -> ExampleApp:
    """The example app with :class:`RefusingOutbox`: recovery drops the message."""
    return ExampleApp(workdir, RefusingOutbox)


#: The one trial the apps below fail for: the first trial at the second send.
ONE_TRIAL = "-effect_sent-2-1"


class UncountableApp(ExampleApp):
    """Counts its world for every run but one trial's, whose outbox disk went away."""

    def effects(self, run_id: str) -> dict[str, int]:
        if run_id.endswith(ONE_TRIAL):
            raise OSError("the outbox's disk went away")
        return super().effects(run_id)


def uncountable(workdir: Path) -> ExampleApp:
    """The example app, unable to count one trial's world."""
    return UncountableApp(workdir)


class UnpreparableApp(ExampleApp):
    """Prepares a world for every run but one trial's."""

    def prepare(self, run_id: str) -> None:
        if run_id.endswith(ONE_TRIAL):
            raise OSError("no space left for this world")
        super().prepare(run_id)


def unpreparable(workdir: Path) -> ExampleApp:
    """The example app, unable to prepare one trial's world."""
    return UnpreparableApp(workdir)
