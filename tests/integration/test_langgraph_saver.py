"""TetherSaver's own guarantees: seals, the high-water mark, compare-and-set, keyed writes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

pytest.importorskip("langgraph.checkpoint.base", reason="needs the [langgraph] extra")

from langgraph.checkpoint.base import ERROR
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from tests.conformance._pg import fresh_schema, in_schema, pg_dsn
from tether.core import (
    BindingMismatchError,
    CheckpointCorruptError,
    IntegrityError,
    StoreError,
    UnknownKeyError,
    WrongKeyError,
)
from tether.crypto import Keyring
from tether.integrations.langgraph import (
    CheckpointRollbackError,
    PendingWriteConflictError,
    PendingWriteMissingError,
    TetherSaver,
    ThreadConflictError,
)
from tether.store import PostgresStore, SQLBase, SQLiteStore

KEYRING = Keyring.generate("k1")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], SQLBase]]:
    """Opens connections (store objects) to one fresh database of each kind."""
    opened: list[SQLBase] = []
    if request.param == "sqlite":

        def connect() -> SQLBase:
            opened.append(SQLiteStore(tmp_path / "lg.sqlite"))
            return opened[-1]

        yield connect
    else:
        dsn = pg_dsn()
        with fresh_schema(dsn) as schema:

            def connect() -> SQLBase:
                opened.append(PostgresStore(in_schema(dsn, schema), max_connections=2))
                return opened[-1]

            yield connect
    for store in opened:
        store.close()


def _chain(saver: TetherSaver, tid: str, n: int, **values: Any) -> list[dict[str, Any]]:
    """Put ``n`` checkpoints on one thread, each the child of the one before."""
    configs = []
    parent: dict[str, Any] | None = None
    for step in range(n):
        config = generate_config(tid)
        if parent is not None:
            config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        state = {k: f"{v}-{step}" for k, v in values.items()}
        cp = generate_checkpoint(
            channel_values=state, channel_versions=dict.fromkeys(state, step + 1)
        )
        parent = saver.put(config, cp, generate_metadata(step=step), dict.fromkeys(state, step + 1))
        configs.append(parent)
    return configs


def _sql(store: SQLBase, sql: str, params: tuple[Any, ...] = ()) -> None:
    """What an attacker with write access to the database does (outside the saver)."""
    store._write(lambda: store._run(sql, params))


def test_latest_is_what_the_mark_names_and_older_ids_are_time_travel(
    open_store: Callable[[], SQLBase],
) -> None:
    """get_tuple without an id returns the newest put; an older id on the chain is served too."""
    saver = TetherSaver(open_store(), KEYRING)
    configs = _chain(saver, "t", 3, msg="hi")
    latest = saver.get_tuple(generate_config("t"))
    assert latest is not None and latest.config == configs[-1]
    assert latest.checkpoint["channel_values"] == {"msg": "hi-2"}
    older = saver.get_tuple(configs[0])
    assert older is not None and older.checkpoint["channel_values"] == {"msg": "hi-0"}
    assert [t.config for t in saver.list(generate_config("t"))] == configs[::-1]


def test_a_tampered_checkpoint_row_fails_closed(open_store: Callable[[], SQLBase]) -> None:
    """One flipped byte in a stored envelope raises an integrity error, not a driver error."""
    store = open_store()
    saver = TetherSaver(store, KEYRING)
    _chain(saver, "t", 2, msg="hi")
    envelope = store._read(
        lambda: store._one("SELECT envelope FROM tether_lg_checkpoints ORDER BY seq DESC LIMIT 1")
    )
    assert envelope is not None
    forged = bytes(envelope[0]).replace(b'"thread_id":"t"', b'"thread_id":"u"')
    _sql(store, "UPDATE tether_lg_checkpoints SET envelope = ? WHERE seq = 2", (forged,))
    with pytest.raises(CheckpointCorruptError):
        saver.get_tuple(generate_config("t"))


def test_a_tampered_channel_or_write_value_fails_closed(open_store: Callable[[], SQLBase]) -> None:
    """Channel bytes and pending-write bytes are covered by the seal through their digests."""
    store = open_store()
    saver = TetherSaver(store, KEYRING)
    [config] = _chain(saver, "t", 1, msg="hi")
    saver.put_writes(config, [("msg", "pending")], "task-1")
    assert saver.get_tuple(config) is not None
    _sql(
        store,
        "UPDATE tether_lg_writes SET body = ?",
        (JsonPlusSerializer().dumps_typed("evil")[1],),
    )
    with pytest.raises(CheckpointCorruptError, match="sealed digest"):
        saver.get_tuple(config)
    _sql(store, "DELETE FROM tether_lg_writes")
    _sql(
        store, "UPDATE tether_lg_blobs SET body = ?", (JsonPlusSerializer().dumps_typed("evil")[1],)
    )
    with pytest.raises(CheckpointCorruptError, match="sealed digest"):
        saver.get_tuple(config)


def test_a_wrong_or_missing_key_fails_closed(open_store: Callable[[], SQLBase]) -> None:
    """Another secret under the same key id, or no such key id, refuses the checkpoint."""
    store = open_store()
    _chain(TetherSaver(store, KEYRING), "t", 1, msg="hi")
    with pytest.raises(WrongKeyError):
        TetherSaver(store, Keyring.generate("k1")).get_tuple(generate_config("t"))
    with pytest.raises(UnknownKeyError):
        TetherSaver(store, Keyring.generate("k2")).get_tuple(generate_config("t"))


def test_a_deleted_newest_checkpoint_is_refused_not_served_older(
    open_store: Callable[[], SQLBase],
) -> None:
    """Deleting the newest row makes latest and list refuse instead of serving the one before."""
    store = open_store()
    saver = TetherSaver(store, KEYRING)
    configs = _chain(saver, "t", 3, msg="hi")
    newest = configs[-1]["configurable"]["checkpoint_id"]
    _sql(store, "DELETE FROM tether_lg_checkpoints WHERE checkpoint_id = ?", (newest,))
    with pytest.raises(CheckpointRollbackError) as caught:
        saver.get_tuple(generate_config("t"))
    assert caught.value.expected == newest and caught.value.actual is None
    with pytest.raises(CheckpointRollbackError):
        list(saver.list(generate_config("t")))


def test_an_older_row_restored_over_the_newest_is_refused(
    open_store: Callable[[], SQLBase],
) -> None:
    """A validly sealed older envelope copied into the newest row does not verify there."""
    store = open_store()
    saver = TetherSaver(store, KEYRING)
    configs = _chain(saver, "t", 3, msg="hi")
    old, new = (c["configurable"]["checkpoint_id"] for c in (configs[0], configs[-1]))
    _sql(
        store,
        "UPDATE tether_lg_checkpoints SET envelope = (SELECT envelope FROM tether_lg_checkpoints "
        "WHERE checkpoint_id = ?), seq = 1 WHERE checkpoint_id = ?",
        (old, new),
    )
    with pytest.raises(BindingMismatchError):
        saver.get_tuple(generate_config("t"))


def test_a_mark_put_back_with_newer_rows_present_is_refused(
    open_store: Callable[[], SQLBase],
) -> None:
    """Rolling the mark back to an older checkpoint is seen: rows are stored past it."""
    store = open_store()
    saver = TetherSaver(store, KEYRING)
    configs = _chain(saver, "t", 3, msg="hi")
    first = configs[0]["configurable"]["checkpoint_id"]
    row = store._read(
        lambda: store._one(
            "SELECT envelope FROM tether_lg_checkpoints WHERE checkpoint_id = ?", (first,)
        )
    )
    assert row is not None
    from tether.crypto import envelope_digest

    _sql(
        store,
        "UPDATE tether_lg_marks SET checkpoint_id = ?, envelope_digest = ?, seq = 1",
        (first, envelope_digest(bytes(row[0]))),
    )
    with pytest.raises(CheckpointRollbackError, match="past its mark"):
        saver.get_tuple(generate_config("t"))


def test_rows_of_a_deleted_thread_put_back_never_verify_again(
    open_store: Callable[[], SQLBase],
) -> None:
    """A thread deleted and started again draws a new lineage; restored old rows are refused."""
    store = open_store()
    saver = TetherSaver(store, KEYRING)
    configs = _chain(saver, "t", 2, msg="old")
    first = configs[0]["configurable"]["checkpoint_id"]
    saved = store._read(
        lambda: store._one(
            "SELECT seq, envelope FROM tether_lg_checkpoints WHERE checkpoint_id = ?", (first,)
        )
    )
    assert saved is not None
    saver.delete_thread("t")
    assert saver.get_tuple(generate_config("t")) is None
    _chain(saver, "t", 3, msg="new")
    _sql(
        store,
        "INSERT INTO tether_lg_checkpoints VALUES (?, ?, ?, ?, ?)",
        ("t", "", first, saved[0], bytes(saved[1])),
    )
    with pytest.raises(CheckpointRollbackError, match="not on the chain"):
        saver.get_tuple(configs[0])


def test_a_stale_parent_loses_and_writes_nothing(open_store: Callable[[], SQLBase]) -> None:
    """A put from a parent that is no longer the latest raises a conflict and stores nothing."""
    store = open_store()
    saver = TetherSaver(store, KEYRING)
    configs = _chain(saver, "t", 2, msg="hi")
    stale = generate_config("t")
    stale["configurable"]["checkpoint_id"] = configs[0]["configurable"]["checkpoint_id"]
    with pytest.raises(ThreadConflictError) as caught:
        saver.put(stale, generate_checkpoint(), generate_metadata(), {})
    assert caught.value.actual == configs[-1]["configurable"]["checkpoint_id"]
    rows = store._read(lambda: store._one("SELECT COUNT(*) FROM tether_lg_checkpoints"))
    assert rows is not None and rows[0] == 2


def test_concurrent_writers_from_one_parent_exactly_one_wins(
    open_store: Callable[[], SQLBase],
) -> None:
    """Eight writers on separate connections put from the same parent: one wins, seven conflict."""
    first = _chain(TetherSaver(open_store(), KEYRING), "t", 1, msg="hi")[0]
    savers = [TetherSaver(open_store(), KEYRING) for _ in range(8)]
    barrier = threading.Barrier(len(savers))
    won: list[str] = []
    lost: list[BaseException] = []

    def write(saver: TetherSaver) -> None:
        cp = generate_checkpoint(channel_values={"msg": str(uuid4())}, channel_versions={"msg": 2})
        barrier.wait()
        try:
            saver.put(first, cp, generate_metadata(step=1), {"msg": 2})
            won.append(cp["id"])
        except ThreadConflictError as exc:
            lost.append(exc)

    threads = [threading.Thread(target=write, args=(s,)) for s in savers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7
    latest = savers[0].get_tuple(generate_config("t"))
    assert latest is not None and latest.checkpoint["id"] == won[0]


def test_pending_writes_are_keyed_idempotent_and_conflict_on_another_value(
    open_store: Callable[[], SQLBase],
) -> None:
    """The same (task_id, idx) with the same value is a no-op; another value is a conflict."""
    saver = TetherSaver(open_store(), KEYRING)
    [config] = _chain(saver, "t", 1, msg="hi")
    saver.put_writes(config, [("a", 1), ("b", 2)], "task")
    saver.put_writes(config, [("a", 1), ("b", 2)], "task")
    with pytest.raises(PendingWriteConflictError) as caught:
        saver.put_writes(config, [("a", 1), ("b", 3)], "task")
    assert caught.value.idx == 1
    saver.put_writes(config, [(ERROR, "first failure")], "task")
    saver.put_writes(
        config, [(ERROR, "second failure")], "task"
    )  # a retried task, as LangGraph does
    found = saver.get_tuple(config)
    assert found is not None
    assert found.pending_writes == [
        ("task", ERROR, "second failure"),
        ("task", "a", 1),
        ("task", "b", 2),
    ]


@pytest.mark.parametrize("damage", ["deleted", "swapped", "all_deleted"])
def test_a_latest_pending_write_deleted_or_swapped_is_refused(
    open_store: Callable[[], SQLBase], damage: str
) -> None:
    """The latest checkpoint's writes are what a resume reads: one gone or swapped is refused."""
    saver = TetherSaver(open_store(), KEYRING)
    older, config = _chain(saver, "t", 2, msg="hi")
    saver.put_writes(older, [("a", 0)], "stale")  # an older checkpoint's: not the latest
    saver.put_writes(config, [("a", 1), ("b", 2)], "task")
    saver.put_writes(config, [("c", 3)], "other")
    assert saver.get_tuple(config) is not None  # as stored: served
    where = "thread_id = 't' AND checkpoint_id = ?"
    head = config["configurable"]["checkpoint_id"]
    if damage == "deleted":
        _sql(
            saver.store,
            f"DELETE FROM tether_lg_writes WHERE {where} AND task_id = 'other'",
            (head,),
        )
    elif damage == "all_deleted":
        _sql(saver.store, f"DELETE FROM tether_lg_writes WHERE {where}", (head,))
    else:  # task's write 1 replaced by its write 0's row (both validly sealed, keys rewritten)
        _sql(saver.store, f"DELETE FROM tether_lg_writes WHERE {where} AND idx = 1", (head,))
        _sql(saver.store, f"UPDATE tether_lg_writes SET idx = 1 WHERE {where} AND idx = 0", (head,))
    with pytest.raises(PendingWriteMissingError) as caught:
        saver.get_tuple({"configurable": {"thread_id": "t"}})
    assert isinstance(caught.value, CheckpointRollbackError)
    assert caught.value.found in {"gone", "altered"} and caught.value.task_id in {"task", "other"}
    assert saver.get_tuple(older) is not None  # an older checkpoint's writes are not checked


def test_concurrent_tasks_writes_all_land_in_the_manifest(
    open_store: Callable[[], SQLBase],
) -> None:
    """Eight tasks writing to the latest checkpoint at once each stay guarded: any one deleted is refused."""
    [config] = _chain(TetherSaver(open_store(), KEYRING), "t", 1, msg="hi")
    savers = [TetherSaver(open_store(), KEYRING) for _ in range(8)]
    barrier = threading.Barrier(len(savers))

    def write(n: int) -> None:
        barrier.wait()
        savers[n].put_writes(config, [("a", n), ("b", -n)], f"task{n}")

    threads = [threading.Thread(target=write, args=(n,)) for n in range(len(savers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    saver = savers[0]
    found = saver.get_tuple(config)
    assert found is not None and len(found.pending_writes) == 16
    head = config["configurable"]["checkpoint_id"]
    _sql(
        saver.store,
        "DELETE FROM tether_lg_writes WHERE thread_id = 't' AND checkpoint_id = ? "
        "AND task_id = 'task5' AND idx = 1",
        (head,),
    )
    with pytest.raises(PendingWriteMissingError) as caught:
        saver.get_tuple(config)
    assert caught.value.task_id == "task5" and caught.value.idx == 1


def test_writes_stored_before_their_checkpoint_are_adopted_by_its_put(
    open_store: Callable[[], SQLBase],
) -> None:
    """A task's writes stored before the put of their checkpoint are guarded once it is put."""
    saver = TetherSaver(open_store(), KEYRING)
    [parent] = _chain(saver, "t", 1, msg="hi")
    cp = generate_checkpoint(channel_values={"msg": "next"}, channel_versions={"msg": 2})
    early = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cp["id"]}}
    saver.put_writes(early, [("a", 1)], "task")  # LangGraph's background puts can do this
    config = saver.put(parent, cp, generate_metadata(step=1), {"msg": 2})
    found = saver.get_tuple(config)
    assert found is not None and found.pending_writes == [("task", "a", 1)]
    _sql(saver.store, "DELETE FROM tether_lg_writes WHERE thread_id = 't' AND task_id = 'task'")
    with pytest.raises(PendingWriteMissingError):
        saver.get_tuple(config)


def test_writes_racing_a_new_threads_first_put_are_guarded_whichever_lands_first(
    open_store: Callable[[], SQLBase],
) -> None:
    """A first put and its checkpoint's writes at once, on threads with no mark: every write listed."""
    putter, writer = TetherSaver(open_store(), KEYRING), TetherSaver(open_store(), KEYRING)
    for n in range(20):  # the race went the wrong way 4 times in 5 on PostgreSQL
        base = {"configurable": {"thread_id": f"t{n}", "checkpoint_ns": ""}}
        cp = generate_checkpoint(channel_values={"m": 1}, channel_versions={"m": 1})
        target = {"configurable": {**base["configurable"], "checkpoint_id": cp["id"]}}
        barrier = threading.Barrier(2)

        def put(cp: Any = cp, base: Any = base, barrier: Any = barrier) -> None:
            barrier.wait()
            putter.put(base, cp, generate_metadata(step=0), {"m": 1})

        def write(target: Any = target, barrier: Any = barrier) -> None:
            barrier.wait()
            writer.put_writes(target, [("x", 1)], "task")

        threads = [threading.Thread(target=put), threading.Thread(target=write)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _sql(putter.store, "DELETE FROM tether_lg_writes WHERE thread_id = ?", (f"t{n}",))
        with pytest.raises(PendingWriteMissingError):
            putter.get_tuple(target)


def test_strict_parent_refuses_a_parentless_put_on_a_started_thread(
    open_store: Callable[[], SQLBase],
) -> None:
    """With strict_parent, a put naming no parent on a thread with checkpoints is a conflict."""
    saver = TetherSaver(open_store(), KEYRING, strict_parent=True)
    _chain(saver, "t", 1, msg="hi")
    with pytest.raises(ThreadConflictError):
        saver.put(generate_config("t"), generate_checkpoint(), generate_metadata(), {})


def test_a_pickling_serializer_is_refused(tmp_path: Path) -> None:
    """TetherSaver will not run with a serializer that may fall back to pickle."""
    with SQLiteStore(tmp_path / "s.sqlite") as store, pytest.raises(StoreError, match="pickle"):
        TetherSaver(store, KEYRING, serde=JsonPlusSerializer(pickle_fallback=True))


def test_bytes_per_checkpoint_stay_flat_with_history(tmp_path: Path) -> None:
    """With a fixed-size state, the 400th checkpoint costs the store what the 10th did."""
    store = SQLiteStore(tmp_path / "flat.sqlite")
    saver = TetherSaver(store, KEYRING)
    notes = "x" * 2000  # ~2 KB that never changes, beside a counter that always does

    def stored() -> int:
        row = store._read(
            lambda: store._one(
                "SELECT (SELECT SUM(LENGTH(envelope)) FROM tether_lg_checkpoints) + "
                "(SELECT SUM(LENGTH(body)) FROM tether_lg_blobs)"
            )
        )
        assert row is not None
        return int(row[0])

    parent: dict[str, Any] | None = None
    sizes = []
    for step in range(400):
        config = generate_config("t")
        if parent is not None:
            config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        values = {"notes": notes, "count": step}
        cp = generate_checkpoint(
            channel_values=values, channel_versions={"notes": 1, "count": step + 1}
        )
        parent = saver.put(config, cp, generate_metadata(step=step), {"count": step + 1})
        sizes.append(stored())
    early = (sizes[19] - sizes[9]) / 10
    late = (sizes[399] - sizes[389]) / 10
    assert late <= early * 1.05
    assert late < len(notes)  # the unchanged 2 KB is not stored again
    store.close()


def test_async_methods_round_trip(open_store: Callable[[], SQLBase]) -> None:
    """aput, aput_writes, aget_tuple and alist behave as their sync twins."""
    import asyncio

    saver = TetherSaver(open_store(), KEYRING)

    async def go() -> None:
        cp = generate_checkpoint(channel_values={"m": "v"}, channel_versions={"m": 1})
        config = await saver.aput(generate_config("a"), cp, generate_metadata(), {"m": 1})
        await saver.aput_writes(config, [("m", "w")], "task")
        found = await saver.aget_tuple(generate_config("a"))
        assert found is not None and found.pending_writes == [("task", "m", "w")]
        assert [t.config async for t in saver.alist(None)] == [config]
        await saver.adelete_thread("a")
        assert await saver.aget_tuple(generate_config("a")) is None

    asyncio.run(go())


def test_the_saver_errors_sit_in_tether_families() -> None:
    """A rollback is an integrity error; a lost CAS and a write conflict are store errors."""
    assert issubclass(CheckpointRollbackError, IntegrityError)
    assert issubclass(ThreadConflictError, StoreError)
    assert issubclass(PendingWriteConflictError, StoreError)


def test_the_integration_exports_exactly_these_names() -> None:
    """tether.integrations.langgraph exports the saver, its four errors and the tool guard, each documented."""
    import tether.integrations.langgraph as lg

    assert sorted(lg.__all__) == [
        "CheckpointRollbackError",
        "GuardedTool",
        "PendingWriteConflictError",
        "PendingWriteMissingError",
        "TetherSaver",
        "ThreadConflictError",
        "guard",
        "sign_answer",
    ]
    assert all(getattr(lg, name).__doc__ for name in lg.__all__)
