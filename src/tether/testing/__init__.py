"""What users run against their own stores (and, later, adapters).

- :mod:`tether.testing.store_conformance`: the store conformance suite
  (plain pytest; ``from tether.testing.store_conformance import *`` and
  define a ``tether_store_factory`` fixture). It is the suite tether runs
  against its own SQLite and PostgreSQL stores.

This package imports nothing heavy; the suites import pytest when imported.
"""

__all__: list[str] = []
