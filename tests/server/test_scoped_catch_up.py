"""A session's catch-up reads only what its scope may see (``ServerStore.operations_in_scope``, through the
stores' indexes) and sends exactly what judging the whole log sent: the same operations in the same order,
records moved into the scope with their history, those moved out, resumption from a delivery sequence, and
sessions that see collections whole. On every server store; the SQL stores' catch-up queries use indexes.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offline import HybridLogicalClock, create_operation, define_schema, t
from offline.core.operations import Operation
from offline.core.uuid7 import generate_uuid_v7
from server_runtime.stores import (
    MemoryServerStore,
    ServerStore,
    create_relational_server_store,
    create_sqlite_server_store,
)
from server_runtime.stores import postgres as postgres_store
from server_runtime.stores import sqlite as sqlite_store
from server_runtime.stores.base import ScopeSelector
from server_runtime.sync import Relayed, Session, SyncLimits, SyncService

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {"ownerId": t.string(), "teamId": t.number().optional(), "title": t.string()}
            },
            "tags": {"fields": {"name": t.string()}},
        },
        "sync": {"todos": {"where": {"ownerId": "userId", "teamId": True}}, "tags": {"where": {}}},
    }
)
OWNERS = ["a", "b", "c"]
TEAMS: list[Any] = [1, 2, None]
NODES = [generate_uuid_v7() for _ in range(2)]
TIMEOUT = 30.0


@asynccontextmanager
async def opened(kind: str, tmp_path: Path, postgres_url: str | None = None) -> AsyncIterator[ServerStore]:
    store: ServerStore
    if kind == "memory":
        store = MemoryServerStore()
    elif kind == "sqlite":
        store = create_sqlite_server_store(tmp_path / "server.db")
    else:
        assert postgres_url is not None
        store = await create_relational_server_store(postgres_url, max_size=4)
    try:
        await store.set_schema(SCHEMA)
        yield store
    finally:
        await store.close()


class Writers:
    """Operations of a few nodes, and the records they made (to update, move and delete them)."""

    def __init__(self) -> None:
        self.clocks = {node: HybridLogicalClock(node) for node in NODES}
        self.sequences = dict.fromkeys(NODES, 0)
        self.records: dict[str, list[str]] = {"todos": [], "tags": []}

    def op(
        self, node: str, kind: str, collection: str, record_id: str, data: dict[str, Any] | None
    ) -> Operation:
        self.sequences[node] += 1
        return create_operation(
            {
                "node_id": node,
                "type": kind,
                "collection": collection,
                "record_id": record_id,
                "data": data,
                "previous_data": {} if kind == "update" else None,
                "timestamp": self.clocks[node].now(),
                "sequence_number": self.sequences[node],
                "schema_version": SCHEMA.version,
            }
        )

    def write(self, draw: Any) -> Operation:
        node = draw(st.sampled_from(NODES))
        collection = draw(st.sampled_from(["todos", "todos", "tags"]))
        known = self.records[collection]
        kind = draw(st.sampled_from(["insert", "update", "update", "delete"])) if known else "insert"
        if kind == "insert":
            record_id = generate_uuid_v7()
            known.append(record_id)
            if collection == "tags":
                return self.op(node, kind, collection, record_id, {"name": draw(st.sampled_from("xyz"))})
            data = {"ownerId": draw(st.sampled_from(OWNERS)), "title": "t"}
            team = draw(st.sampled_from(TEAMS))
            if team is not None:
                data["teamId"] = team
            return self.op(node, kind, collection, record_id, data)
        record_id = draw(st.sampled_from(known))
        if kind == "delete":
            return self.op(node, kind, collection, record_id, None)
        if collection == "tags":
            return self.op(node, kind, collection, record_id, {"name": draw(st.sampled_from("xyz"))})
        # An update that moves the record to another owner or team, or only retitles it.
        changes = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "ownerId": st.sampled_from(OWNERS),
                    "teamId": st.sampled_from([1, 2]),
                    "title": st.sampled_from(["u", "v"]),
                },
            )
        )
        return self.op(node, kind, collection, record_id, changes or {"title": "w"})


# Filters a session may have: by owner, team or both, values of other types that compare equal in Python
# (1.0 and True for 1), None (records without the field), a field that is not a scope field, whole.
TODO_FILTERS = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"ownerId": st.sampled_from(OWNERS)}),
    st.fixed_dictionaries({"teamId": st.sampled_from([1, 2, 1.0, True, 2.5])}),
    st.fixed_dictionaries({"ownerId": st.sampled_from(OWNERS), "teamId": st.sampled_from([1, 2, None])}),
    st.fixed_dictionaries({"teamId": st.none()}),
    st.fixed_dictionaries({"title": st.sampled_from(["t", None])}),
)
FILTERS = st.fixed_dictionaries(
    {}, optional={"todos": TODO_FILTERS, "tags": st.sampled_from([{}, {"name": "x"}])}
)


async def relayed_ids(service: SyncService, session: Session) -> tuple[list[str], int, set[tuple[str, str]]]:
    """The ids of the operations the relay sends ``session`` until its final catch-up batch (but those of
    records it sends states of), that batch's delivery watermark, and the records it sends states of (those
    that left the session's scope)."""
    frames: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def send(text: str) -> None:
        frame = json.loads(text)
        frames.append(frame)
        if frame.get("isFinal"):
            done.set()

    session.send = send
    task = asyncio.create_task(service.relay(session))
    try:
        await asyncio.wait_for(done.wait(), TIMEOUT)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    states = {(s["collection"], s["recordId"]) for frame in frames for s in frame.get("states", ())}
    ids = [op["id"] for frame in frames for op in frame.get("operations", ()) if _key(op) not in states]
    return ids, frames[-1]["maxDeliverySequence"], states


def _key(operation: dict[str, Any]) -> tuple[str, str]:
    return (operation["collection"], operation["recordId"])


async def judged_whole_log(service: SyncService, session: Session) -> tuple[list[str], set[tuple[str, str]]]:
    """What the relay sent before catch-ups read the scope index: the whole log from the cursor, judged (the
    operations' ids, and the records sent as states)."""
    batch = [Relayed.of(s) for s in await service.store.operations_since(session.cursor)]
    moved: list[tuple[str, str]] = []
    if session.open:
        texts = [
            r.wire_json() for r in batch if r.node_id != session.node_id and r.collection in session.filters
        ]
    else:
        texts = await service._visible(session, batch, moved)
    # A record a session is sent as having left its scope (a state) comes without its operations before the
    # move within the same page: which of them are sent depends on where pages end, so only the records'
    # states are compared.
    operations = [json.loads(text) for text in texts]
    return [op["id"] for op in operations if _key(op) not in set(moved)], set(moved)


async def _nothing(text: str) -> None:
    return None


async def _emptied(postgres_url: str) -> None:
    import asyncpg  # type: ignore[import-untyped, unused-ignore]

    conn = await asyncpg.connect(postgres_url)
    try:
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'offline_%'"
        )
        if tables:
            names = ", ".join(f'"{row[0]}"' for row in tables)
            await conn.execute(f"TRUNCATE {names} RESTART IDENTITY")
    finally:
        await conn.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgresql"])
def test_a_scoped_catch_up_sends_what_judging_the_whole_log_sent(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Requested only here, so the memory and SQLite runs need no PostgreSQL.
    postgres_url = request.getfixturevalue("postgres_url") if kind == "postgresql" else None
    examples = iter(range(1_000_000))

    @settings(
        max_examples=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        async def example() -> None:
            if postgres_url is not None:
                await _emptied(postgres_url)
            async with opened(kind, tmp_path / str(next(examples)), postgres_url) as store:
                # Small pages and a short memory of recent operations: catch-ups take several pages, from
                # the store's indexes and then from memory; sessions that see everything read the store too.
                service = SyncService(store, limits=SyncLimits(batch_size=4, recent_operations=3))
                await service.start()
                try:
                    writers = Writers()
                    for _ in range(data.draw(st.integers(1, 5), label="batches")):
                        ops = [writers.write(data.draw) for _ in range(data.draw(st.integers(1, 4)))]
                        await service.commit(None, ops)
                    top = await store.max_delivery()
                    for _ in range(data.draw(st.integers(1, 3), label="sessions")):
                        filters = data.draw(FILTERS, label="filters")
                        node = data.draw(st.sampled_from([*NODES, "another-node"]), label="node")
                        cursor = data.draw(st.one_of(st.just(0), st.integers(0, top)), label="cursor")
                        service.limits.batch_size = data.draw(st.integers(1, 6), label="page")
                        session = Session(node, filters, None, _nothing, cursor=cursor)
                        expected, moved = await judged_whole_log(service, session)
                        ids, watermark, states = await relayed_ids(service, session)
                        assert ids == expected
                        assert states == moved
                        assert watermark == top
                finally:
                    await service.stop()

        asyncio.run(example())

    check()


def _scoped_log(count: int) -> list[tuple[Operation, dict[str, Any] | None]]:
    writers = Writers()
    out: list[tuple[Operation, dict[str, Any] | None]] = []
    for i in range(count):
        if i % 50 == 0:
            out.append((writers.op(NODES[0], "insert", "tags", generate_uuid_v7(), {"name": "x"}), None))
            continue
        owner = f"user-{i % 200}"
        data = {"ownerId": owner, "title": "t"}
        op = writers.op(NODES[0], "insert", "todos", generate_uuid_v7(), data)
        out.append((op, {"ownerId": owner, "teamId": None}))
    return out


SELECTORS = [ScopeSelector("todos", "ownerId", "user-7"), ScopeSelector("tags")]


def test_sqlite_catch_up_queries_search_indexes(tmp_path: Path) -> None:
    async def main() -> None:
        async with opened("sqlite", tmp_path) as store, store.writer() as writer:
            await writer.append(_scoped_log(2_000))

    asyncio.run(main())
    conn = sqlite3.connect(tmp_path / "server.db")
    try:
        conn.execute("ANALYZE")
        for sql, params in sqlite_store.scoped_statements(100, 500, SELECTORS):
            plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
            assert "SCAN" not in plan, plan
            assert (
                "SEARCH s USING PRIMARY KEY (collection=? AND field=? AND value=? AND delivery>?)" in plan
                or "SEARCH offline_operations USING INDEX offline_operations_collection (collection=? AND rowid>?)"
                in plan
            ), plan
    finally:
        conn.close()


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", ()) for node in _plan_nodes(child))]


def test_postgresql_catch_up_queries_search_indexes(postgres_url: str) -> None:
    import asyncpg  # type: ignore[import-untyped, unused-ignore]

    async def main() -> None:
        store = await create_relational_server_store(postgres_url, max_size=2)
        try:
            await store.set_schema(SCHEMA)
            async with store.writer() as writer:
                await writer.append(_scoped_log(5_000))
        finally:
            await store.close()
        conn = await asyncpg.connect(postgres_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            await conn.execute("ANALYZE")
            for sql, params in postgres_store.scoped_statements(100, 500, SELECTORS):
                plan = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql, *params))[0]["Plan"]
                nodes = _plan_nodes(plan)
                assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], plan
                driving = [n for n in nodes if "collection =" in n.get("Index Cond", "")]
                assert driving, plan
                assert driving[0]["Index Name"] in (
                    "offline_operation_scopes_pkey",
                    "offline_operations_collection",
                ), plan
        finally:
            await conn.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_log_stored_before_the_scope_index_is_indexed_when_opened(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import asyncpg  # type: ignore[import-untyped, unused-ignore]

    postgres_url = request.getfixturevalue("postgres_url") if kind == "postgresql" else None
    log = _scoped_log(300)
    wanted = [
        op.id
        for op, scope in log
        if op.collection == "tags" or (scope is not None and scope["ownerId"] == "user-7")
    ]

    async def main() -> None:
        async with opened(kind, tmp_path, postgres_url) as store, store.writer() as writer:
            await writer.append(log)
        # As an older version left it: no scope index.
        if postgres_url is None:
            conn = sqlite3.connect(tmp_path / "server.db")
            conn.execute("DROP TABLE offline_operation_scopes")
            conn.commit()
            conn.close()
        else:
            pg = await asyncpg.connect(postgres_url)
            await pg.execute("DROP TABLE offline_operation_scopes")
            await pg.close()
        async with opened(kind, tmp_path, postgres_url) as store:
            page = await store.operations_in_scope(0, 1_000, SELECTORS)
            assert page.complete and page.through == len(log)
            assert [json.loads(row[5])["id"] for row in page.operations] == wanted

    asyncio.run(main())


class _CountingStore(MemoryServerStore):
    """Counts the catch-up pages being read at once (each read takes a while, as a database's does)."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = 0
        self.most = 0

    async def operations_in_scope(self, after: int, limit: int, selectors: Any) -> Any:
        self.reading += 1
        self.most = max(self.most, self.reading)
        try:
            await asyncio.sleep(0.01)
            return await super().operations_in_scope(after, limit, selectors)
        finally:
            self.reading -= 1


def test_sessions_catching_up_together_read_a_bounded_number_of_pages_at_once() -> None:
    async def main() -> None:
        store = _CountingStore()
        await store.set_schema(SCHEMA)
        service = SyncService(store, limits=SyncLimits(batch_size=2, catch_up_reads=3))
        await service.start()
        try:
            writers = Writers()
            ops = [
                writers.op(
                    NODES[0], "insert", "todos", generate_uuid_v7(), {"ownerId": OWNERS[i % 3], "title": "t"}
                )
                for i in range(30)
            ]
            await service.commit(None, ops)
            sessions = [
                Session(f"node-{i}", {"todos": {"ownerId": OWNERS[i % 3]}}, None, _nothing) for i in range(20)
            ]
            expected = [await judged_whole_log(service, session) for session in sessions]
            results = await asyncio.gather(*(relayed_ids(service, session) for session in sessions))
            for (wanted, _), (ids, watermark, _) in zip(expected, results, strict=True):
                assert ids == wanted
                assert len(ids) == 10 and watermark == 30
            assert store.most == 3
        finally:
            await service.stop()

    asyncio.run(main())
