"""LangGraph on tether (the ``[langgraph]`` extra): :class:`TetherSaver` and :func:`guard`.

    from tether.crypto import Keyring
    from tether.integrations.langgraph import TetherSaver

    saver = TetherSaver.from_url("sqlite:///graph.sqlite", Keyring.from_environ())
    graph = builder.compile(checkpointer=saver)

Every checkpoint is sealed with the keyring's HMAC and verified on read; a
high-water mark per thread refuses a rolled-back or tampered latest, and a
latest checkpoint whose pending writes were deleted (LangGraph would run
those tasks again); puts are compare-and-set from the parent the config names.

    tools = ToolNode([guard(send_email, kind="email.send", target="to")])
    with tether.effects.run(runtime, "ticket-42"):
        graph.invoke(inputs, {"configurable": {"thread_id": "ticket-42"}})

A guarded tool's effect is one call of the run: sent once under a key
persisted first, and the recorded receipt when LangGraph re-executes the
node after a crash or a resume. Approvals and reviews surface as
``interrupt()`` calls; :func:`sign_answer` signs one, ``Command(resume=...)``
delivers it (see :mod:`tether.integrations.langgraph._tools`).
"""

from tether.integrations.langgraph._errors import (
    CheckpointRollbackError,
    PendingWriteConflictError,
    PendingWriteMissingError,
    ThreadConflictError,
)
from tether.integrations.langgraph._saver import TetherSaver
from tether.integrations.langgraph._tools import GuardedTool, guard, sign_answer

__all__ = [
    "CheckpointRollbackError",
    "GuardedTool",
    "PendingWriteConflictError",
    "PendingWriteMissingError",
    "TetherSaver",
    "ThreadConflictError",
    "guard",
    "sign_answer",
]
