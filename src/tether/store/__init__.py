"""Stores: write-once checkpoint content and the compare-and-set generation mark."""

from tether.store._protocols import (
    BeforeCommit,
    Commit,
    CommitStore,
    ContentStore,
    GenerationStore,
    LedgerEntry,
    Mark,
)
from tether.store._sql import SQLBase
from tether.store._sqlite import SQLiteStore

__all__ = [
    "BeforeCommit",
    "Commit",
    "CommitStore",
    "ContentStore",
    "GenerationStore",
    "LedgerEntry",
    "Mark",
    "SQLBase",
    "SQLiteStore",
]
