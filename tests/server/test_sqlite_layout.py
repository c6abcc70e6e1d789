"""The SQLite server store's operation log: ids unique under their record, no index of hashes.

An index on the id alone (a SHA-256) put each insert on a random page of an ever larger index; the log is
now indexed by (collection, record id, id), unique, which is as unique as the id (the id hashes the
collection and the record id) and is appended to in creation order. Older files are rebuilt when opened.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from pathlib import Path

import pytest

from offline.store import checkpoint
from server_runtime.stores import WriteConflict, create_sqlite_server_store
from server_runtime.stores import sqlite as sqlite_store

from .test_stores import append, make_op, schema

# The operation log as stores before this layout wrote it.
_OLD_LAYOUT = (
    """CREATE TABLE offline_operations (
        delivery INTEGER PRIMARY KEY,
        id TEXT UNIQUE NOT NULL,
        node_id TEXT NOT NULL,
        sequence_number INTEGER NOT NULL,
        collection TEXT NOT NULL,
        record_id TEXT NOT NULL,
        wire TEXT NOT NULL,
        scope TEXT
    )""",
    "CREATE INDEX offline_operations_node_sequence ON offline_operations (node_id, sequence_number)",
    "CREATE INDEX offline_operations_record ON offline_operations (collection, record_id, delivery)",
)


def _indexes(path: Path) -> dict[str, tuple[bool, list[str]]]:
    conn = sqlite3.connect(path)
    try:
        out = {}
        for _, name, unique, _origin, _ in conn.execute("PRAGMA index_list('offline_operations')"):
            columns = [row[2] for row in conn.execute(f"PRAGMA index_info('{name}')")]
            out[name] = (bool(unique), columns)
        return out
    finally:
        conn.close()


def test_the_log_has_no_index_of_ids_alone(tmp_path: Path) -> None:
    async def main() -> None:
        store = create_sqlite_server_store(tmp_path / "server.db")
        await store.set_schema(schema())
        await store.close()

    asyncio.run(main())
    indexes = _indexes(tmp_path / "server.db")
    assert indexes == {
        "offline_operations_record": (True, ["collection", "record_id", "id"]),
        "offline_operations_node_sequence": (False, ["node_id", "sequence_number"]),
        "offline_operations_collection": (False, ["collection"]),  # catch-ups of whole collections
    }


def test_operations_are_looked_up_through_the_record_index(tmp_path: Path) -> None:
    conn = sqlite3.connect(":memory:")
    for statement in sqlite_store._DDL:
        conn.execute(statement)
    ((sql, params),) = [
        (sql, params) for _, sql, params in sqlite_store._known_keys_steps([("todos", "r1", "x")])
    ]
    plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
    assert "SEARCH o USING COVERING INDEX offline_operations_record" in plan
    # A record's history (sent when it enters a client's scope) too.
    history = sqlite_store.RECORD_HISTORY_SQL
    plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + history, ("todos", "r1", 9)))
    assert "SEARCH offline_operations USING INDEX offline_operations_record" in plan
    # Chunks stay within SQLite's smallest parameter limit, in the sizes prepared once (many_rows).
    keys = [("todos", f"r{i}", f"id{i}") for i in range(1_000)]
    steps = sqlite_store._known_keys_steps(keys)
    assert [len(params) for _, _, params in steps] == [768] * 3 + [192] * 3 + [48] * 2 + [12] * 2
    assert max(len(params) for _, _, params in steps) <= 999
    conn.executemany(
        "INSERT INTO offline_operations (delivery, id, node_id, sequence_number, collection, record_id, wire)"
        " VALUES (?, ?, 'n', ?, ?, ?, '{}')",
        [(d, key[2], d, key[0], key[1]) for d, key in enumerate(keys[::97], 1)],
    )
    found = {row[0] for _, sql, params in steps for row in conn.execute(sql, params)}
    assert found == {key[2] for key in keys[::97]}


def test_an_id_is_stored_once_whatever_its_sequence_number(tmp_path: Path) -> None:
    """The same operation content under another sequence number (a misbehaving peer) is the same id:
    answered as stored, never stored twice, by plain and optimistic writers."""

    async def main() -> None:
        store = create_sqlite_server_store(tmp_path / "server.db")
        await store.set_schema(schema())
        try:
            first = make_op(seq=1, record="r1")
            assert await append(store, first) == [1]
            resent = first.__class__(**{**first.__dict__, "sequence_number": 7})
            assert resent.id == first.id
            assert await append(store, resent) == [None]
            # An optimistic writer takes it for new (above its node's tail) and the unique index refuses the
            # commit; the next writer looks it up.
            with pytest.raises(WriteConflict):
                async with store.writer(optimistic=True) as writer:
                    await writer.append([(resent, None)])
            async with store.writer(optimistic=True) as writer:
                assert await writer.known_operations([resent]) == {first.id}
            async with store.writer() as writer:
                assert await writer.known_ids([first.id, "f" * 64]) == {first.id}
            assert [s.operation.id for s in await store.operations_since(0)] == [first.id]
        finally:
            await store.close()

    asyncio.run(main())


def test_a_file_with_the_older_layout_is_rebuilt_once_with_everything_in_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "old.db"
    ops = [make_op(seq=i, record=f"r{i % 3}") for i in range(1, 8)]
    conn = sqlite3.connect(path)
    for statement in _OLD_LAYOUT:
        conn.execute(statement)
    conn.executemany(
        "INSERT INTO offline_operations VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                delivery,
                op.id,
                op.node_id,
                op.sequence_number,
                op.collection,
                op.record_id,
                json.dumps(op.to_wire()),
                json.dumps({"ownerId": "u1"}) if delivery == 2 else None,
            )
            for delivery, op in enumerate(ops, 1)
        ],
    )
    conn.commit()
    conn.close()

    async def main() -> None:
        store = create_sqlite_server_store(path)
        await store.set_schema(schema())
        try:
            stored = await store.operations_since(0)
            assert [(s.delivery, s.operation.id) for s in stored] == [
                (d, op.id) for d, op in enumerate(ops, 1)
            ]
            assert stored[1].scope == {"ownerId": "u1"}
            assert await store.version_vector() == {"node-a": 7}
            assert await append(store, ops[3]) == [None]  # still unique
            assert await append(store, make_op(seq=8, record="r9")) == [8]
            history = await store.record_operations("todos", "r1", 99)
            assert [s.delivery for s in history] == [1, 4, 7]
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="offline.server.store"):
        asyncio.run(main())
    assert [r.message for r in caplog.records if "rebuilding" in r.message] != []
    caplog.clear()

    async def reopen() -> None:
        store = create_sqlite_server_store(path)
        await store.set_schema(schema())
        await store.close()

    with caplog.at_level(logging.WARNING, logger="offline.server.store"):
        asyncio.run(reopen())  # nothing to rebuild the second time
    assert [r.message for r in caplog.records if "rebuilding" in r.message] == []
    assert _indexes(path)["offline_operations_record"] == (True, ["collection", "record_id", "id"])
    assert not any(columns == ["id"] for _, columns in _indexes(path).values())
    conn = sqlite3.connect(path)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()
    assert "offline_operations_before_upgrade" not in tables


def test_the_log_is_checkpointed_on_a_thread_not_in_commits(tmp_path: Path) -> None:
    path = tmp_path / "server.db"

    async def main() -> None:
        store = create_sqlite_server_store(path)
        await store.set_schema(schema())
        checkpointer = store._checkpointer
        assert checkpointer is not None and checkpointer.running
        try:
            body = "x" * 20_000
            for start in range(1, 1_201, 100):  # ~24 MB of operations, in commits of 100
                ops = [
                    make_op(seq=seq, record=f"r{seq}", data={"title": body})
                    for seq in range(start, start + 100)
                ]
                await append(store, *ops)
                await asyncio.sleep(0.03)  # the thread looks at most every 20 ms
            assert checkpointer.checkpoints >= 1
            # Checkpointed as it went: the log is reused from its start instead of holding all 24 MB.
            assert os.path.getsize(f"{path}-wal") < 8 * checkpoint.CHECKPOINT_BYTES
        finally:
            await store.close()
        assert not checkpointer.running

    asyncio.run(main())
    assert not os.path.exists(f"{path}-wal")  # the last connection checkpointed the rest and removed the log

    async def reopened() -> None:
        store = create_sqlite_server_store(path)
        await store.set_schema(schema())
        try:
            assert await store.max_delivery() == 1_200
        finally:
            await store.close()

    asyncio.run(reopened())


def test_an_in_memory_store_has_no_checkpoint_thread() -> None:
    async def main() -> None:
        store = create_sqlite_server_store(":memory:")
        await store.set_schema(schema())
        try:
            assert store._checkpointer is None
            assert await append(store, make_op(seq=1)) == [1]
        finally:
            await store.close()

    asyncio.run(main())
