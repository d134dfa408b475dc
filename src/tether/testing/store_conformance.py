"""The store conformance suite, for any store that claims tether's store protocols.

In a test module::

    import pytest
    from tether.testing.store_conformance import *  # noqa: F403

    @pytest.fixture
    def tether_store_factory(tmp_path):
        path = tmp_path / "store.db"
        return lambda: MyStore(path)

``tether_store_factory`` returns a callable; its first call in a test opens a
fresh, empty store, and every later call in the same test opens another
connection to the SAME database (the race checks use two). The store must
implement ``ContentStore``, ``GenerationStore`` (marks and leases) and
``CommitStore`` from :mod:`tether.store` (the runs list's ``runs_page``
included), plus ``schema_version()``, ``retry_now(run_id)`` (what ``tether
resume`` calls) and an idempotent ``close()``. The suite closes every store it opened.

Optionally define ``tether_schema_bump``: a fixture returning a callable that
records a NEWER schema version in the test's database, so the suite can
check that opening it is refused with ``MigrationError``; without it that
check is skipped.

The suite needs pytest; importing :mod:`tether.testing` alone does not.
"""

# No __all__ here: each part's __all__ decides what ``import *`` brings.
from tether.testing._history_conformance import *  # noqa: F403
from tether.testing._lease_conformance import *  # noqa: F403
from tether.testing._listing_conformance import *  # noqa: F403
from tether.testing._store_conformance import *  # noqa: F403
