"""LangGraph on tether's stores (the ``[langgraph]`` extra): :class:`TetherSaver`.

    from tether.crypto import Keyring
    from tether.integrations.langgraph import TetherSaver

    saver = TetherSaver.from_url("sqlite:///graph.sqlite", Keyring.from_environ())
    graph = builder.compile(checkpointer=saver)

Every checkpoint is sealed with the keyring's HMAC and verified on read; a
high-water mark per thread refuses a rolled-back or tampered latest; puts
are compare-and-set from the parent the config names.
"""

from tether.integrations.langgraph._errors import (
    CheckpointRollbackError,
    PendingWriteConflictError,
    ThreadConflictError,
)
from tether.integrations.langgraph._saver import TetherSaver
from tether.integrations.langgraph._tools import FIRST_FIELD, GuardedTool, guard, sign_answer

__all__ = [
    "FIRST_FIELD",
    "CheckpointRollbackError",
    "GuardedTool",
    "PendingWriteConflictError",
    "TetherSaver",
    "ThreadConflictError",
    "guard",
    "sign_answer",
]
