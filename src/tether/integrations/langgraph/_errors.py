"""The typed errors TetherSaver raises beyond tether's own integrity and store errors."""

from __future__ import annotations

from tether.core import IntegrityError, StoreError


class CheckpointRollbackError(IntegrityError):
    """A thread's checkpoints disagree with its high-water mark: a rollback, deletion or tamper.

    ``expected`` is what the mark names, ``actual`` what the store offered
    (``None`` when the row is gone). Nothing was loaded; restore the store
    from a backup that includes the mark's checkpoint, or delete the thread.
    """

    def __init__(
        self,
        message: str,
        *,
        thread_id: str,
        checkpoint_ns: str,
        expected: str | None,
        actual: str | None,
    ) -> None:
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.expected = expected
        self.actual = actual
        super().__init__(message, run_id=thread_id)


class PendingWriteMissingError(CheckpointRollbackError):
    """A pending write of the thread's latest checkpoint is gone, or not the one stored.

    LangGraph would run that task again (its effect with it) on resume, so
    nothing was loaded. ``found`` says what the store holds for
    ``(task_id, idx)``: ``gone``, or ``altered`` (another envelope than the
    one the saver stored). Restore the writes from a backup taken with the
    mark, or delete the thread.
    """

    def __init__(
        self,
        *,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        idx: int,
        found: str,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.task_id = task_id
        self.idx = idx
        self.found = found
        super().__init__(
            f"thread {thread_id!r} checkpoint {checkpoint_id!r}: pending write {idx} of task "
            f"{task_id!r} is {found} (the saver's sealed record of the latest writes says "
            "otherwise); resuming would run that task again, so nothing was loaded",
            thread_id=thread_id,
            checkpoint_ns=checkpoint_ns,
            expected=f"{task_id}/{idx}",
            actual=None if found == "gone" else f"{task_id}/{idx} ({found})",
        )


class ThreadConflictError(StoreError):
    """A put lost its compare-and-set: the thread's latest is not the parent the config named.

    Another writer advanced the thread from the same parent first (or the
    config is stale). Nothing was written; load the thread's latest and
    decide again.
    """

    def __init__(
        self,
        *,
        thread_id: str,
        checkpoint_ns: str,
        expected: str | None,
        actual: str | None,
        older: bool = False,
    ) -> None:
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.expected = expected
        self.actual = actual
        #: ``expected`` is an older checkpoint of this thread: a fork in place (time travel).
        self.older = older
        where = f"thread {thread_id!r}" + (f" ns {checkpoint_ns!r}" if checkpoint_ns else "")
        why = (
            "it is an older checkpoint of this thread, and writing from it would roll the "
            "thread back; TetherSaver does not fork a thread in place"
            if older
            else "another writer advanced it first (or this replays the checkpoint before the "
            "latest). Reload the thread's latest checkpoint and decide again"
        )
        super().__init__(
            f"{where}: put expected latest checkpoint {expected!r}, the store has {actual!r}; "
            + why
        )


class PendingWriteConflictError(StoreError):
    """A pending write with this (task_id, idx) is stored already, with another value."""

    def __init__(self, *, thread_id: str, checkpoint_id: str, task_id: str, idx: int) -> None:
        self.thread_id = thread_id
        self.checkpoint_id = checkpoint_id
        self.task_id = task_id
        self.idx = idx
        super().__init__(
            f"thread {thread_id!r} checkpoint {checkpoint_id!r}: task {task_id!r} write {idx} "
            "is already stored with a different value; two workers ran the same task"
        )
