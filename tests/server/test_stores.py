"""The server stores (memory, SQLite, PostgreSQL) behind one interface: the same tests run against each.

PostgreSQL tests get a fresh schema each (``postgres_url`` in tests/conftest.py) and skip when PostgreSQL is
unreachable (they fail instead when env CI is set).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from offline.core.errors import STORAGE_ERROR, OfflineError
from offline.core.fields import t
from offline.core.hlc import HLCTimestamp
from offline.core.operations import Operation, create_operation
from offline.core.schema import SchemaDefinition, define_schema
from offline.merge.engine import MergeEngine, RecordState
from server_runtime.stores import (
    MemoryServerStore,
    PostgresServerStore,
    RecordRow,
    ServerStore,
    SQLiteServerStore,
    StoredOperation,
    _codec,
    create_relational_server_store,
    create_sqlite_server_store,
    normalize_postgres_url,
)

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["memory", "sqlite", "postgresql"]
PERSISTENT = ["sqlite", "postgresql"]
LOCAL = ["memory", "sqlite"]


def schema(version: int = 1) -> SchemaDefinition:
    return define_schema(
        {
            "version": version,
            "collections": {
                "todos": {"fields": {"title": t.string(), "done": t.boolean().default(False)}},
                "notes": {"fields": {"body": t.string().optional()}},
            },
        }
    )


def make_op(
    node: str = "node-a",
    seq: int = 0,
    record: str = "r1",
    *,
    collection: str = "todos",
    type_: str = "insert",
    data: dict[str, Any] | None = None,
) -> Operation:
    if type_ == "delete":
        payload = None
    elif data is not None:
        payload = data
    elif collection == "todos":
        payload = {"title": f"{node} {seq} {record}", "done": False}
    else:
        payload = {"body": f"{node} {seq} {record}"}
    return create_operation(
        {
            "node_id": node,
            "type": type_,
            "collection": collection,
            "record_id": record,
            "data": payload,
            "previous_data": {} if type_ == "update" else None,
            "timestamp": HLCTimestamp(1_700_000_000_000 + seq, 0, node),
            "sequence_number": seq,
            "schema_version": 1,
        }
    )


def row_for(ops: list[Operation], collection: str = "todos", record: str = "r1") -> RecordRow:
    """A realistic row: the merge engine's state and record of ``ops``."""
    state, value = MergeEngine(schema()).fold(collection, record, ops)
    return RecordRow(collection, record, state, value)


class Backend:
    """Opens store objects of one kind on one backing database (several objects: several processes)."""

    def __init__(
        self, kind: str, *, sqlite_path: Path | None = None, postgres_url: str | None = None
    ) -> None:
        self.kind = kind
        self.sqlite_path = sqlite_path
        self.postgres_url = postgres_url

    async def open(self) -> ServerStore:
        store: ServerStore
        if self.kind == "memory":
            store = MemoryServerStore()
        elif self.kind == "sqlite":
            assert self.sqlite_path is not None
            store = create_sqlite_server_store(self.sqlite_path)
        else:
            assert self.postgres_url is not None
            store = await create_relational_server_store(self.postgres_url, min_size=1, max_size=4)
        await store.set_schema(schema())
        return store

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[ServerStore]:
        store = await self.open()
        try:
            yield store
        finally:
            await store.close()

    def run(self, test: Callable[[ServerStore], Coroutine[Any, Any, None]]) -> None:
        async def main() -> None:
            async with self.opened() as store:
                await test(store)

        asyncio.run(main())


def _backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    kind: str = request.param
    if kind == "postgresql":
        # Requested only here, so the memory and SQLite tests run without PostgreSQL.
        return Backend(kind, postgres_url=request.getfixturevalue("postgres_url"))
    return Backend(kind, sqlite_path=tmp_path / "data" / "server.db")


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return _backend(request, tmp_path)


@pytest.fixture(params=PERSISTENT)
def persistent_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return _backend(request, tmp_path)


@pytest.fixture(params=LOCAL)
def local_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return _backend(request, tmp_path)


@pytest.fixture
def postgres_backend(postgres_url: str) -> Backend:
    return Backend("postgresql", postgres_url=postgres_url)


async def append(
    store: ServerStore, *ops: Operation, scope: dict[str, Any] | None = None
) -> list[int | None]:
    async with store.writer() as writer:
        return await writer.append([(op, scope) for op in ops])


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------------------------------- operations


def test_kind_and_schema(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        assert store.kind == backend.kind
        assert store.schema is not None and store.schema.version == 1
        assert await store.get_meta("schema_version") == "1"
        await store.set_schema(schema(2))  # again, newer: idempotent
        assert store.schema.version == 2
        assert await store.get_meta("schema_version") == "2"

    backend.run(test)


def test_append_and_operations_since_in_order(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        assert await store.max_delivery() == 0
        assert await store.operations_since(0) == []
        ops = [make_op("node-a", i, f"r{i}") for i in range(5)]
        assert await append(store, *ops[:2], scope={"ownerId": "u1"}) == [1, 2]
        assert await append(store, *ops[2:]) == [3, 4, 5]
        assert await store.max_delivery() == 5

        stored = await store.operations_since(0)
        assert [s.delivery for s in stored] == [1, 2, 3, 4, 5]
        assert [s.operation for s in stored] == ops
        assert [s.operation.id for s in stored] == [op.id for op in ops]
        assert [s.scope for s in stored] == [{"ownerId": "u1"}] * 2 + [None] * 3
        assert all(isinstance(s, StoredOperation) for s in stored)
        assert stored[0].operation.to_wire() == ops[0].to_wire()

        assert [s.delivery for s in await store.operations_since(2)] == [3, 4, 5]
        assert [s.delivery for s in await store.operations_since(1, limit=2)] == [2, 3]
        assert [s.delivery for s in await store.operations_since(-5, limit=1)] == [1]
        assert await store.operations_since(5) == []
        assert await store.operations_since(2, limit=0) == []
        exported = [s async for s in store.export_operations()]
        assert exported == stored

    backend.run(test)


def test_operation_values_round_trip(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        odd = create_operation(
            {
                "node_id": "node-ü",
                "type": "update",
                "collection": "todos",
                "record_id": "r/ü 1",
                "data": {
                    "title": 'naïve \u2603 \x00 "quoted"',
                    "blob": b"\x00\xffbytes",
                    "n": 0.1,
                    "big": 2**53 - 1,
                },
                "previous_data": {"title": "old", "nested": {"list": [1, 2.5, None, True]}},
                "timestamp": HLCTimestamp(1_700_000_000_123, 7, "node-ü"),
                "sequence_number": 42,
                "causal_deps": ["a" * 64, "b" * 64],
                "schema_version": 3,
            }
        )
        scope = {"ownerId": "u-ü", "teamIds": ["t1", "t2"], "n": 1.5}
        await append(store, odd, scope=scope)
        (stored,) = await store.operations_since(0)
        assert stored.operation == odd
        assert stored.operation.data is not None and stored.operation.data["blob"] == b"\x00\xffbytes"
        assert stored.operation.causal_deps == odd.causal_deps
        assert stored.scope == scope

    backend.run(test)


def test_duplicate_ids_are_skipped(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        a, b, c = make_op(seq=1), make_op(seq=2), make_op(seq=3)
        assert await append(store, a, b) == [1, 2]
        # Already stored (b, a) and repeated within the batch (the second c): no sequence.
        assert await append(store, b, c, c, a) == [None, 3, None, None]
        assert await append(store, a) == [None]
        assert await append(store) == []
        assert [s.operation.id for s in await store.operations_since(0)] == [a.id, b.id, c.id]
        async with store.writer() as writer:
            assert await writer.known_ids([a.id, "f" * 64, c.id, a.id]) == {a.id, c.id}
            assert await writer.known_ids([]) == set()

    backend.run(test)


def test_append_refuses_bad_input(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        async with store.writer() as writer:
            with pytest.raises(TypeError):
                await writer.append([make_op()])  # type: ignore[list-item]
            with pytest.raises(TypeError):
                await writer.append([(make_op(), "scope")])  # type: ignore[list-item]
        assert await store.max_delivery() == 0

    backend.run(test)


def test_writer_reads_its_own_writes_and_readers_do_not(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        first = make_op(seq=1)
        await append(store, first)
        second = make_op(seq=2, record="r2")
        row = row_for([second], record="r2")
        async with store.writer() as writer:
            assert await writer.append([(second, {"k": "v"})]) == [2]
            await writer.save_rows([row])
            await writer.set_meta("cursor", "x")
            assert [s.delivery for s in await writer.operations_since(0)] == [1, 2]
            assert (await writer.operations_since(1))[0].scope == {"k": "v"}
            assert await writer.known_ids([second.id]) == {second.id}
            loaded = await writer.load_rows([("todos", "r2")])
            assert loaded[("todos", "r2")].record == row.record
            # Store-level reads see committed data only.
            assert await store.max_delivery() == 1
            assert [s.delivery for s in await store.operations_since(0)] == [1]
            assert await store.load_rows([("todos", "r2")]) == {}
            assert await store.get_meta("cursor") is None
        assert await store.max_delivery() == 2
        assert await store.get_meta("cursor") == "x"
        assert (await store.load_rows([("todos", "r2")]))[("todos", "r2")].record == row.record
        with pytest.raises(RuntimeError):
            await writer.append([(make_op(seq=9), None)])  # the writer is over

    backend.run(test)


# ------------------------------------------------------------------------------------------------- rows


def test_rows_saved_loaded_updated_and_deleted(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        insert = make_op(seq=1, data={"title": "one", "done": False})
        created = row_for([insert])
        assert created.record == {"id": "r1", "title": "one", "done": False}
        note = row_for([make_op(seq=2, record="n1", collection="notes")], collection="notes", record="n1")
        async with store.writer() as writer:
            await writer.save_rows([created, note])
        loaded = await store.load_rows(
            [("todos", "r1"), ("notes", "n1"), ("todos", "missing"), ("todos", "r1")]
        )
        assert set(loaded) == {("todos", "r1"), ("notes", "n1")}
        got = loaded[("todos", "r1")]
        assert (got.collection, got.record_id, got.record) == ("todos", "r1", created.record)
        assert isinstance(got.state, RecordState)
        assert got.state.to_json() == created.state.to_json()
        assert got.state.alive

        update = create_operation(
            {
                "node_id": "node-b",
                "type": "update",
                "collection": "todos",
                "record_id": "r1",
                "data": {"done": True},
                "previous_data": {"done": False},
                "timestamp": HLCTimestamp(1_700_000_001_000, 0, "node-b"),
                "sequence_number": 0,
                "causal_deps": [insert.id],
                "schema_version": 1,
            }
        )
        updated = row_for([insert, update])
        async with store.writer() as writer:
            await writer.save_rows([updated])
        got = (await store.load_rows([("todos", "r1")]))[("todos", "r1")]
        assert got.record == {"id": "r1", "title": "one", "done": True}
        assert got.state.to_json() == updated.state.to_json()

        delete = make_op("node-c", 5000, type_="delete")
        deleted = row_for([insert, update, delete])
        assert deleted.record is None
        async with store.writer() as writer:
            # The same key twice in one call: the later row wins.
            await writer.save_rows([updated, deleted])
        got = (await store.load_rows([("todos", "r1")]))[("todos", "r1")]
        assert got.record is None
        assert not got.state.alive
        assert got.state.to_json() == deleted.state.to_json()

        rows = {row.key: row async for row in store.load_all_rows()}
        assert set(rows) == {("todos", "r1"), ("notes", "n1")}
        assert rows[("notes", "n1")].record == note.record
        # Saved rows are copies: mutating the caller's state afterwards changes nothing stored.
        note.state.fields.clear()
        again = (await store.load_rows([("notes", "n1")]))[("notes", "n1")]
        assert again.state.fields

    backend.run(test)


def test_loaded_rows_parse_their_state_only_when_used(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's cache keeps states as text: loading rows (all of them at startup) parses none; a row's
    state is parsed on first use, once. Records holding bytes still read back as bytes."""
    parsed: list[str | bytes] = []
    real = RecordState.from_json.__func__  # type: ignore[attr-defined]

    def counting(cls: type[RecordState], text: str | bytes) -> RecordState:
        parsed.append(text)
        return real(cls, text)  # type: ignore[no-any-return]

    async def test(store: ServerStore) -> None:
        saved = row_for([make_op(seq=1, data={"title": "one", "done": False})])
        blob = RecordRow(
            "notes", "n1", RecordState(), {"id": "n1", "body": {"raw": b"\x00\xff"}, "n": [1.5, None]}
        )
        async with store.writer() as writer:
            await writer.save_rows([saved, blob])
        monkeypatch.setattr(RecordState, "from_json", classmethod(counting))
        rows = {row.key: row async for row in store.load_all_rows()}
        loaded = await store.load_rows([("todos", "r1"), ("notes", "n1")])
        assert parsed == []
        assert loaded[("notes", "n1")].record == blob.record
        assert rows[("notes", "n1")].record == blob.record
        got = loaded[("todos", "r1")]
        assert got.state_json() == saved.state.to_json() and parsed == []
        assert got.state.to_json() == saved.state.to_json() and got.state is got.state
        assert len(parsed) == 1
        assert got == saved  # compares the parsed state

    backend.run(test)


def test_load_all_rows_pages_through_everything(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_codec, "PAGE_SIZE", 3)

    async def test(store: ServerStore) -> None:
        state = RecordState()
        keys = [(collection, f"id-{i:02d}") for collection in ("notes", "todos") for i in range(8)]
        async with store.writer() as writer:
            await writer.save_rows([RecordRow(c, r, state, {"id": r}) for c, r in keys])
        assert sorted([row.key async for row in store.load_all_rows()]) == sorted(keys)
        assert await store.load_rows([]) == {}
        ops = [make_op(seq=i, record=f"x{i}") for i in range(7)]
        await append(store, *ops)
        assert [s.operation.id async for s in store.export_operations()] == [op.id for op in ops]

    backend.run(test)


# --------------------------------------------------------------------------------- vector, stats, meta


def test_version_vector_and_stats(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        assert await store.version_vector() == {}
        stats = await store.stats()
        assert stats == {
            "kind": backend.kind,
            "operations": 0,
            "max_delivery": 0,
            "records": {},
            "deleted": {},
        }
        await append(store, make_op("node-a", 0), make_op("node-a", 7, "r2"), make_op("node-b", 3, "r3"))
        await append(store, make_op("node-a", 4, "r4"), make_op("node-a", 7, "r2"))  # a duplicate
        assert await store.version_vector() == {"node-a": 7, "node-b": 3}

        alive = row_for([make_op("node-a", 0)])
        dead = row_for([make_op("node-a", 0, "r9"), make_op("node-a", 1, "r9", type_="delete")], record="r9")
        note = row_for([make_op(seq=2, record="n1", collection="notes")], collection="notes", record="n1")
        async with store.writer() as writer:
            await writer.save_rows([alive, dead, note])
        stats = await store.stats()
        assert stats == {
            "kind": backend.kind,
            "operations": 4,
            "max_delivery": 4,
            "records": {"todos": 1, "notes": 1},
            "deleted": {"todos": 1},
        }

    backend.run(test)


def test_meta(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        assert await store.get_meta("server_node_id") is None
        await store.set_meta("server_node_id", "server-1")
        assert await store.get_meta("server_node_id") == "server-1"
        await store.set_meta("server_node_id", "server-2")
        async with store.writer() as writer:
            await writer.set_meta("other", "ü \u2603")
        assert await store.get_meta("server_node_id") == "server-2"
        assert await store.get_meta("other") == "ü \u2603"
        with pytest.raises(TypeError):
            await store.set_meta("key", 3)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await store.get_meta("")

    backend.run(test)


def test_node_registry(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        assert await store.node_principals(["phone", "laptop"]) == {}
        assert await store.claim_node("phone", "user:ada") == "user:ada"
        # The first principal keeps it: a later claim only learns whose it is.
        assert await store.claim_node("phone", "user:bob") == "user:ada"
        assert await store.claim_node("laptop", "user:bob") == "user:bob"
        assert await store.node_principals(["phone", "laptop", "desk"]) == {
            "phone": "user:ada",
            "laptop": "user:bob",
        }
        # A registration of ``replacing``'s is taken over; any other stays.
        assert await store.claim_node("tablet", "anonymous") == "anonymous"
        assert await store.claim_node("tablet", "user:bob", replacing="anonymous") == "user:bob"
        assert await store.claim_node("tablet", "user:ada", replacing="anonymous") == "user:bob"
        assert await store.claim_node("watch", "user:ada", replacing="anonymous") == "user:ada"
        assert await store.node_registrations() == {
            "phone": "user:ada",
            "laptop": "user:bob",
            "tablet": "user:bob",
            "watch": "user:ada",
        }
        with pytest.raises(TypeError):
            await store.claim_node("", "user:ada")
        with pytest.raises(TypeError):
            await store.claim_node("desk", "")

    backend.run(test)


def test_node_scopes(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        assert await store.node_scopes("node-a") == []
        await append(store, make_op("node-a", 1, "r1"), make_op("node-a", 2, "r2"), scope={"ownerId": "u1"})
        await append(store, make_op("node-a", 3, "n1", collection="notes"), make_op("node-b", 1, "r3"))
        assert sorted(await store.node_scopes("node-a"), key=str) == [
            ("notes", None),
            ("todos", {"ownerId": "u1"}),
        ]
        assert await store.node_scopes("node-b") == [("todos", None)]

    backend.run(test)


def test_held_places(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        first, second = make_op("node-a", 1, "r1"), make_op("node-a", 2, "r2")
        await append(store, first)
        async with store.writer() as writer:
            await writer.append([(second, None)])
            # The writer's own appends count too.
            assert await writer.held_places([("node-a", 1), ("node-a", 2), ("node-a", 3), ("node-b", 1)]) == {
                ("node-a", 1): first.id,
                ("node-a", 2): second.id,
            }
            assert await writer.held_places([]) == {}

    backend.run(test)


def test_postgres_node_claims_race_between_processes(postgres_backend: Backend) -> None:
    async def main() -> None:
        async with postgres_backend.opened() as a, postgres_backend.opened() as b:
            for i in range(20):
                node = f"node-{i}"
                owners = await asyncio.gather(a.claim_node(node, "user:ada"), b.claim_node(node, "user:bob"))
                assert owners[0] == owners[1] in ("user:ada", "user:bob")
                assert await a.node_principals([node]) == {node: owners[0]}

    asyncio.run(main())


# ------------------------------------------------------------------------------------ transactions


def test_writer_rolls_back_everything_on_exception(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        kept = make_op(seq=1)
        await append(store, kept)
        await store.set_meta("m", "before")

        class Boom(Exception):
            pass

        lost = make_op(seq=2, record="r2")
        with pytest.raises(Boom):
            async with store.writer() as writer:
                assert await writer.append([(lost, None)]) == [2]
                await writer.save_rows([row_for([lost], record="r2")])
                await writer.set_meta("m", "during")
                raise Boom
        assert [s.operation.id for s in await store.operations_since(0)] == [kept.id]
        assert await store.max_delivery() == 1
        assert await store.load_rows([("todos", "r2")]) == {}
        assert await store.get_meta("m") == "before"
        assert await store.version_vector() == {"node-a": 1}
        async with store.writer() as writer:
            assert await writer.known_ids([lost.id]) == set()

        # The store still works, and the lost operation can be stored later.
        (delivery,) = await append(store, lost)
        assert delivery is not None and delivery > 1
        assert [s.operation.id for s in await store.operations_since(0)] == [kept.id, lost.id]

        # A cancelled writer rolls back as well.
        entered = asyncio.Event()

        async def cancelled_writer() -> None:
            async with store.writer() as writer:
                await writer.append([(make_op(seq=3, record="r3"), None)])
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(cancelled_writer())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(await store.operations_since(0)) == 2
        assert await append(store, make_op(seq=4, record="r4")) != [None]

    backend.run(test)


def test_parallel_writers_are_serialised_and_readers_see_no_gaps(backend: Backend) -> None:
    writers, rounds = 4, 5

    async def test(store: ServerStore) -> None:
        rng = random.Random(7)
        active = 0
        commit_log: list[list[int]] = []
        seen: list[int] = []
        done = asyncio.Event()

        async def write(node: str) -> None:
            nonlocal active
            for i in range(rounds):
                async with store.writer() as writer:
                    active += 1
                    assert active == 1, "two writers held the write lock at once"
                    first = await writer.append([(make_op(node, 2 * i, f"{node}-{i}"), None)])
                    await asyncio.sleep(rng.random() * 0.01)
                    second = await writer.append([(make_op(node, 2 * i + 1, f"{node}-{i}"), None)])
                    await asyncio.sleep(rng.random() * 0.01)
                    active -= 1
                    mine = [d for d in first + second if d is not None]
                # Nothing awaits between the commit and this line, so the log is in commit order.
                commit_log.append(mine)

        async def read() -> None:
            while True:
                finished = done.is_set()
                for stored in await store.operations_since(seen[-1] if seen else 0):
                    seen.append(stored.delivery)
                if finished:
                    return
                await asyncio.sleep(0)

        reader = asyncio.create_task(read())
        await asyncio.gather(*(write(f"node-{n}") for n in range(writers)))
        done.set()
        await reader
        total = writers * rounds * 2
        flat = [d for batch in commit_log for d in batch]
        assert flat == sorted(flat), "delivery order differs from commit order"
        assert flat == list(range(1, total + 1))
        # The polling reader, which only ever asked for deliveries above the highest it had seen, got
        # every operation: none appeared below a sequence it had already seen.
        assert seen == flat
        assert [s.delivery for s in await store.operations_since(0)] == flat

    backend.run(test)


# ------------------------------------------------------------------------------ lifecycle, durability


def test_closed_store_refuses_everything(backend: Backend) -> None:
    async def main() -> None:
        store = await backend.open()
        await store.close()
        await store.close()  # idempotent
        assert store.closed
        calls: list[Callable[[], Awaitable[Any]]] = [
            lambda: store.get_meta("k"),
            lambda: store.set_meta("k", "v"),
            lambda: store.operations_since(0),
            lambda: store.max_delivery(),
            lambda: store.load_rows([("todos", "r1")]),
            lambda: store.version_vector(),
            lambda: store.stats(),
            lambda: store.set_schema(schema()),
            lambda: store.listen(lambda n: None),
            lambda: anext(store.load_all_rows()),
            lambda: anext(store.export_operations()),
        ]
        for call in calls:
            with pytest.raises(OfflineError) as info:
                await call()
            assert info.value.code == STORAGE_ERROR
        with pytest.raises(OfflineError) as info:
            async with store.writer():
                pass
        assert info.value.code == STORAGE_ERROR

    asyncio.run(main())


def test_data_survives_close_and_reopen(persistent_backend: Backend) -> None:
    ops = [make_op("node-a", i, f"r{i}") for i in range(3)]

    async def main() -> None:
        async with persistent_backend.opened() as store:
            await append(store, *ops, scope={"ownerId": "u1"})
            async with store.writer() as writer:
                await writer.save_rows([row_for([ops[0]], record="r0")])
                await writer.set_meta("server_node_id", "srv")
        async with persistent_backend.opened() as store:
            assert [s.operation for s in await store.operations_since(0)] == ops
            assert [s.scope for s in await store.operations_since(0)] == [{"ownerId": "u1"}] * 3
            assert (await store.load_rows([("todos", "r0")]))[("todos", "r0")].record is not None
            assert await store.get_meta("server_node_id") == "srv"
            assert await store.version_vector() == {"node-a": 2}
            assert await append(store, ops[1], make_op("node-a", 3, "r3")) == [None, 4]

    asyncio.run(main())


def test_listen_is_a_no_op_without_postgresql(local_backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        calls: list[int] = []
        await store.listen(calls.append)
        await append(store, make_op())
        await asyncio.sleep(0.05)
        assert calls == []

    local_backend.run(test)


# ------------------------------------------------------------------------------------------------ SQLite


def test_sqlite_factory_is_synchronous_and_uses_wal_with_full_sync(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "server.db"
    store = create_sqlite_server_store(filename=str(path))  # no event loop needed
    assert isinstance(store, SQLiteServerStore)
    assert not path.exists()

    async def main() -> None:
        try:
            await store.set_schema(schema())
            conn = store._writer_conn
            assert conn is not None
            assert list(await conn.execute_fetchall("PRAGMA journal_mode")) == [("wal",)]
            assert list(await conn.execute_fetchall("PRAGMA synchronous")) == [(2,)]  # FULL
            tables = {
                row[0]
                for row in await conn.execute_fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            assert {"offline_operations", "offline_records", "offline_meta"} <= tables
        finally:
            await store.close()

    asyncio.run(main())
    assert path.exists()
    assert create_sqlite_server_store().filename == "./offline-server.db"


def test_sqlite_in_memory_database(tmp_path: Path) -> None:
    async def main() -> None:
        store = create_sqlite_server_store(":memory:")
        try:
            await store.set_schema(schema())
            await append(store, make_op(seq=1))
            async with store.writer() as writer:
                await writer.append([(make_op(seq=2), None)])
                reading = asyncio.create_task(store.max_delivery())
                await asyncio.sleep(0.05)
                assert not reading.done()  # one connection: readers wait for the writer
            assert await reading == 2
        finally:
            await store.close()

    asyncio.run(main())


_KILL_SCRIPT = """
import asyncio, sys
sys.path.insert(0, {root!r})
from tests.server.test_stores import make_op, schema
from server_runtime.stores import create_sqlite_server_store

async def main():
    store = create_sqlite_server_store({path!r})
    await store.set_schema(schema())
    i = 0
    while True:
        async with store.writer() as writer:
            await writer.append([(make_op("node-k", i, f"r{{i}}"), None)])
        print(i, flush=True)  # acknowledged: committed
        i += 1

asyncio.run(main())
"""


def test_sqlite_acknowledged_operations_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "killed.db"
    script = _KILL_SCRIPT.format(root=str(ROOT), path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    acked = -1
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acked = int(line)
            if acked >= 30:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert acked >= 30, "the writer process did not get going"

    async def main() -> None:
        store = create_sqlite_server_store(path)
        try:
            await store.set_schema(schema())
            stored = await store.operations_since(0)
            ids = {s.operation.id for s in stored}
            assert all(make_op("node-k", i, f"r{i}").id in ids for i in range(acked + 1))
            assert [s.delivery for s in stored] == list(range(1, len(stored) + 1))
        finally:
            await store.close()

    asyncio.run(main())


# -------------------------------------------------------------------------------------------- PostgreSQL


def test_postgres_urls() -> None:
    assert normalize_postgres_url("postgres://u@h:5432/db") == "postgresql://u@h:5432/db"
    assert normalize_postgres_url("postgresql://u@h/db?x=1") == "postgresql://u@h/db?x=1"
    assert normalize_postgres_url("postgresql+asyncpg://u@h/db") == "postgresql://u@h/db"
    assert normalize_postgres_url("  postgres://h/db ") == "postgresql://h/db"
    for bad in ("", "mysql://h/db", "h:5432/db"):
        with pytest.raises(ValueError):
            normalize_postgres_url(bad)


def test_postgres_unreachable_is_a_storage_error() -> None:
    async def main() -> None:
        with pytest.raises(OfflineError) as info:
            await create_relational_server_store("postgres://nobody:secret@127.0.0.1:1/none")
        assert info.value.code == STORAGE_ERROR
        assert "secret" not in info.value.message

    asyncio.run(main())


def test_postgres_accepts_postgres_scheme(postgres_url: str) -> None:
    async def main() -> None:
        url = "postgres://" + postgres_url.split("://", 1)[1]
        store = await create_relational_server_store(url)
        try:
            assert isinstance(store, PostgresServerStore)
            assert store.schema_name.startswith("offline_test_")
            assert store.channel == f"offline_operations.{store.schema_name}"
            await store.set_schema(schema())
            assert await append(store, make_op()) == [1]
        finally:
            await store.close()

    asyncio.run(main())


def test_postgres_listen_fires_for_other_processes_commits(postgres_backend: Backend) -> None:
    async def main() -> None:
        async with postgres_backend.opened() as a, postgres_backend.opened() as b:
            heard_by_a: list[int] = []
            heard_by_b: list[int] = []

            async def on_b(delivery: int) -> None:  # a coroutine callback
                await asyncio.sleep(0)
                heard_by_b.append(delivery)

            await a.listen(heard_by_a.append)
            await b.listen(on_b)

            await append(a, make_op(seq=1), make_op(seq=2))
            await wait_for(lambda: heard_by_b == [2])
            await append(a, make_op(seq=3))
            await wait_for(lambda: heard_by_b == [2, 3])
            # B relays: what A committed is there to read.
            assert [s.delivery for s in await b.operations_since(0)] == [1, 2, 3]

            await append(b, make_op("node-b", 1))
            await wait_for(lambda: heard_by_a == [4])
            await append(a, make_op(seq=1))  # a duplicate: nothing committed, nothing notified
            await asyncio.sleep(0.3)
            # Neither heard its own commits.
            assert heard_by_a == [4]
            assert heard_by_b == [2, 3]

    asyncio.run(main())


def test_postgres_listen_recovers_from_a_lost_connection(postgres_backend: Backend) -> None:
    async def main() -> None:
        async with postgres_backend.opened() as a, postgres_backend.opened() as b:
            assert isinstance(b, PostgresServerStore)
            heard: list[int] = []
            await b.listen(heard.append)
            await append(a, make_op(seq=1))
            await wait_for(lambda: heard == [1])
            pid = b._listen_conn.get_server_pid()
            assert isinstance(a, PostgresServerStore)
            async with a._pool.acquire() as conn:
                assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
            # The backend ends shortly after the call returns: until B notices, a NOTIFY may still reach it on
            # the old connection, and the assertions below would race with its reconnect.
            await wait_for(lambda: b._listen_conn is None or b._listen_conn.get_server_pid() != pid)
            await append(a, make_op(seq=2))
            # Re-established, then called back with the current max delivery (the NOTIFY may be lost). The
            # callback's value is how far the log got (its consumer ignores one at or below what it holds): the
            # reconnect's catch-up read may come back after the NOTIFY of 2 with an older max, so the calls'
            # order is not promised, only that the highest heard is the log's end.
            await wait_for(lambda: max(heard) == 2)
            assert b._listen_conn is not None and b._listen_conn.get_server_pid() != pid
            await append(a, make_op(seq=3))
            await wait_for(lambda: max(heard) == 3)

    asyncio.run(main())


def test_postgres_writers_of_two_processes_are_serialised(postgres_backend: Backend) -> None:
    async def main() -> None:
        async with postgres_backend.opened() as a, postgres_backend.opened() as b:
            a_holds = asyncio.Event()
            events: list[str] = []

            async def writer_a() -> list[int | None]:
                async with a.writer() as writer:
                    result = await writer.append([(make_op("node-a", i, f"a{i}"), None) for i in range(3)])
                    a_holds.set()
                    await asyncio.sleep(0.4)  # B must wait on the advisory lock meanwhile
                    events.append("a-commit")
                return result

            async def writer_b() -> list[int | None]:
                await a_holds.wait()
                async with b.writer() as writer:
                    events.append("b-enter")
                    # Runs after A's commit, so it sees A's operations and numbers after them.
                    assert [s.delivery for s in await writer.operations_since(0)] == [1, 2, 3]
                    return await writer.append([(make_op("node-b", 0, "b0"), None)])

            async def reader() -> list[int]:
                await a_holds.wait()
                return [s.delivery for s in await b.operations_since(0)]

            first, second, during = await asyncio.gather(writer_a(), writer_b(), reader())
            assert events == ["a-commit", "b-enter"]
            assert first == [1, 2, 3]
            assert second == [4]
            assert during == []  # A's uncommitted operations were invisible to other connections

            # Many interleaved writers on both store objects: gapless and in commit order.
            commit_log: list[int] = []

            async def burst(store: ServerStore, node: str) -> None:
                for i in range(10):
                    async with store.writer() as writer:
                        (delivery,) = await writer.append([(make_op(node, 100 + i, f"{node}{i}"), None)])
                        await asyncio.sleep(0.001)
                    assert delivery is not None
                    commit_log.append(delivery)

            await asyncio.gather(burst(a, "node-a"), burst(b, "node-b"), burst(a, "node-c"))
            assert sorted(commit_log) == list(range(5, 35))
            assert [s.delivery for s in await a.operations_since(0)] == list(range(1, 35))

    asyncio.run(main())


def test_an_operation_received_as_text_is_stored_as_that_text(backend: Backend) -> None:
    """The sync endpoint keeps the text an operation arrived as (its keys in the writer's order) and the
    store keeps that text: it reads back as the same operation; an operation without one is encoded."""
    import json

    from offline.merge.values import wire_json
    from offline.sync import protocol as p

    async def test(store: ServerStore) -> None:
        op = make_op("node-a", 1, "r1", data={"title": "zz", "done": True, "count": 1.5})
        wire = dict(reversed(list(op.to_wire().items())))  # another writer's key order
        text = json.dumps(wire, ensure_ascii=False, separators=(",", ":"))
        assert text != wire_json(op)
        received, kept = p.decode_operation_text(json.loads(text))
        assert received == op and kept == text
        plain = make_op("node-a", 2, "r2")
        await append(store, received, plain)
        assert [s.operation for s in await store.operations_since(0)] == [op, plain]
        texts = getattr(store, "operation_texts_since", None)
        if texts is not None:  # the persistent stores: the stored text itself
            assert [row[-1] for row in await texts(0, 10)] == [text, wire_json(plain)]

    backend.run(test)
