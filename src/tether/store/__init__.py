"""Stores: write-once checkpoint content, the compare-and-set generation mark, and leases.

Open one from a URL with :func:`open_store` (or ``Store.from_url``):
``sqlite:///relative.sqlite``, ``sqlite:////absolute.sqlite`` or
``postgresql://...`` (the ``[postgres]`` extra). Both hold the runs a process
has open without a lease (:class:`RunHolder`), so a second process is refused.
"""

from tether.core import LedgerEntry
from tether.store._engine import SQLStatements
from tether.store._postgres import PostgresStore
from tether.store._protocols import (
    BeforeCommit,
    Commit,
    CommitStore,
    ContentStore,
    Evidence,
    GenerationStore,
    KeyClock,
    Lease,
    LeaseRequest,
    ListedRun,
    Mark,
    MarksPage,
)
from tether.store._runlock import RunHold, RunHolder
from tether.store._schema import LANDMARK_KINDS
from tether.store._sql import SQLBase
from tether.store._sqlite import SQLiteStore
from tether.store._url import Store, open_store

__all__ = [
    "LANDMARK_KINDS",
    "BeforeCommit",
    "Commit",
    "CommitStore",
    "ContentStore",
    "Evidence",
    "GenerationStore",
    "KeyClock",
    "Lease",
    "LeaseRequest",
    "LedgerEntry",
    "ListedRun",
    "Mark",
    "MarksPage",
    "PostgresStore",
    "RunHold",
    "RunHolder",
    "SQLBase",
    "SQLStatements",
    "SQLiteStore",
    "Store",
    "open_store",
]
