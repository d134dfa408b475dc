"""What users run against their own stores and apps: suites and crash hooks.

- :mod:`tether.testing.store_conformance`: the store conformance suite
  (plain pytest; ``from tether.testing.store_conformance import *`` and
  define a ``tether_store_factory`` fixture). It is the suite tether runs
  against its own SQLite and PostgreSQL stores.
- :mod:`tether.testing.adapter_conformance`: the adapter conformance suite
  (``from tether.testing.adapter_conformance import *`` and define a
  ``tether_adapter`` fixture returning an ``AdapterSubject``): checks the
  promises an adapter declares against what its world really received.
- :mod:`tether.testing.crash_harness`: kill your app at every crash point
  in child processes, recover it, and count what your real systems received
  (``run_crash_harness("module:factory")``, or ``tether crashtest``);
  :mod:`tether.testing.crash_example` is an app to run it on and to copy.
- :mod:`tether.testing.counting`: ``count_calls(adapter)`` logs every send
  and look-up that reaches a real adapter, by key, so a test counts what a
  world that deduplicates nothing would have received.
- :mod:`tether.testing.effects_service`: the reference HTTP effects service
  (``python -m tether.testing.effects_service --db FILE``).
- :mod:`tether.testing.mail_server`: a reference SMTP server delivering into
  a Maildir (``python -m tether.testing.mail_server --maildir DIR``; needs
  ``tether[demo]``).
- :class:`Sandbox`: an in-memory workspace adapter (files in a dict) whose
  writes, receipts and crash windows are all in the test's hands: the test
  double tether's own tests run the protocol against.
- :class:`CrashPlan`, :class:`CrashPoint`, :class:`SimulatedCrash`: arm a
  named crash window (raise, or SIGKILL the process) in a ``Runtime``.

This package imports nothing heavy; the suites import pytest when imported.
"""

from tether.runtime._crash import CrashPlan, CrashPoint, SimulatedCrash
from tether.testing._sandbox import Sandbox

__all__ = ["CrashPlan", "CrashPoint", "Sandbox", "SimulatedCrash"]
