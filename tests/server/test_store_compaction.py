"""``ServerStore.compact`` on the memory, SQLite and PostgreSQL stores: superseded history goes; each
record's latest operation, each node's highest, the numbering guard and per-record versions stay."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server_runtime.stores import ServerStore
from server_runtime.stores.base import ScopeSelector
from server_runtime.stores.compaction import COMPACTED, LogRow, plan

from .test_stores import KINDS, Backend, _backend, append, make_op, row_for


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return _backend(request, tmp_path)


async def seed(store: ServerStore) -> None:
    """r1: node-a 1..5; r2 (scope owner u1): node-b 1..3 then node-a 6; r3 (owner u2): node-b 4."""
    r1 = [make_op("node-a", 1, "r1")] + [make_op("node-a", s, "r1", type_="update") for s in range(2, 6)]
    r2 = [make_op("node-b", 1, "r2")] + [make_op("node-b", s, "r2", type_="update") for s in (2, 3)]
    r2.append(make_op("node-a", 6, "r2", type_="update"))
    r3 = [make_op("node-b", 4, "r3")]
    async with store.writer() as writer:
        await writer.append([(op, None) for op in r1])
        await writer.append([(op, {"owner": "u1"}) for op in r2])
        await writer.append([(op, {"owner": "u2"}) for op in r3])
        await writer.save_rows([row_for(r1, record="r1"), row_for(r2, record="r2"), row_for(r3, record="r3")])


def test_compact_deletes_history_but_keeps_latest_operations_numbers_and_rows(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        await seed(store)
        vector = await store.version_vector()
        rows = await store.load_rows([("todos", "r1"), ("todos", "r2"), ("todos", "r3")])
        assert await store.compaction_horizon() == 0

        result = await store.compact()

        # Kept: r1's latest (a5), r2's latest (a6, also node-a's highest), r3's latest (b4, node-b's highest).
        assert result == {"horizon": 10, "dropped": 7, "kept": 3}
        kept = [(s.operation.node_id, s.operation.sequence_number) for s in await store.operations_since(0)]
        assert kept == [("node-a", 5), ("node-a", 6), ("node-b", 4)]
        assert await store.compaction_horizon() == 10
        assert await store.max_delivery() == 10
        assert await store.version_vector() == vector
        assert await store.load_rows([("todos", "r1"), ("todos", "r2"), ("todos", "r3")]) == rows
        assert (await store.stats())["operations"] == 3
        # Each record's versions: its kept and deleted operations' highest numbers per node.
        assert await store.record_versions([("todos", "r1"), ("todos", "r2"), ("todos", "nope")]) == {
            ("todos", "r1"): {"node-a": 5},
            ("todos", "r2"): {"node-a": 6, "node-b": 3},
        }
        # The scope index lists what is kept, so a catch-up finds each record of a scope once.
        page = await store.operations_in_scope(0, 100, [ScopeSelector("todos", "owner", "u1")])
        assert [(row[0], row[3]) for row in page.operations] == [(9, "r2")]
        # The numbering guard: a compacted place answers COMPACTED, a free one nothing, a kept one its id.
        async with store.writer() as writer:
            held = await writer.held_places([("node-a", 2), ("node-b", 2), ("node-a", 5), ("node-a", 7)])
        [a5] = [s.operation for s in await store.operations_since(0) if s.operation.sequence_number == 5]
        assert held == {("node-a", 2): COMPACTED, ("node-b", 2): COMPACTED, ("node-a", 5): a5.id}
        # New operations go on from the old top; compacting again deletes only what is superseded since.
        assert await append(store, make_op("node-a", 7, "r1", type_="update")) == [11]
        assert await store.compact() == {"horizon": 11, "dropped": 1, "kept": 3}
        assert await store.record_versions([("todos", "r1")]) == {("todos", "r1"): {"node-a": 7}}
        assert await store.compact() == {"horizon": 11, "dropped": 0, "kept": 3}

    backend.run(test)


def test_what_compaction_keeps_survives_a_restart(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    for kind in ("sqlite", "postgresql"):
        if kind == "postgresql":
            backend = Backend(kind, postgres_url=request.getfixturevalue("postgres_url"))
        else:
            backend = Backend(kind, sqlite_path=tmp_path / "server.db")

        async def first(store: ServerStore) -> None:
            await seed(store)
            await store.compact()

        async def second(store: ServerStore) -> None:
            assert await store.compaction_horizon() == 10
            async with store.writer() as writer:
                assert await writer.held_places([("node-b", 1)]) == {("node-b", 1): COMPACTED}
            versions = await store.record_versions([("todos", "r2")])
            assert versions == {("todos", "r2"): {"node-a": 6, "node-b": 3}}

        backend.run(first)
        backend.run(second)


def test_a_sqlite_store_answers_its_horizon_without_reading_it_each_time(tmp_path: Path) -> None:
    """A relay asks for the horizon after every catch-up page it reads. One process owns a SQLite store (its
    highest delivery is kept the same way), so the store answers from what it knows: read once, then raised
    by its own compactions and restores, before they delete anything. (Each answer was a query through the
    reader's thread: a tenth of the server's CPU under a fast writer and ten sessions behind it.)"""
    from server_runtime.stores.sqlite import SQLiteServerStore

    backend = Backend("sqlite", sqlite_path=tmp_path / "server.db")

    async def first(store: ServerStore) -> None:
        assert isinstance(store, SQLiteServerStore)
        await seed(store)
        assert await store.compaction_horizon() == 0
        reads = _count_meta_reads(store)
        for _ in range(3):
            assert await store.compaction_horizon() == 0
        await store.compact(5)
        assert await store.compaction_horizon() == 5
        await store.restore_compaction([], {}, {}, 8)
        assert await store.compaction_horizon() == 8
        assert reads == []
        # A compaction that fails leaves the horizon to be read again, as committed.
        failing = store.writer

        def broken() -> object:
            raise RuntimeError("the disk went away")

        store.writer = broken  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            await store.compact()
        store.writer = failing  # type: ignore[method-assign]
        assert await store.compaction_horizon() == 8
        assert reads == ["compaction_horizon"]

    async def second(store: ServerStore) -> None:
        assert await store.compaction_horizon() == 8

    backend.run(first)
    backend.run(second)


def _count_meta_reads(store: ServerStore) -> list[str]:
    reads: list[str] = []
    read = store.get_meta

    async def counted(key: str) -> str | None:
        reads.append(key)
        return await read(key)

    store.get_meta = counted  # type: ignore[method-assign]
    return reads


def test_compact_up_to_a_given_horizon_keeps_what_follows(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        await seed(store)
        # Up to delivery 5 (r1's history): r1 keeps its latest, nothing after 5 is touched.
        assert await store.compact(5) == {"horizon": 5, "dropped": 4, "kept": 1}
        assert await store.compaction_horizon() == 5
        assert [s.delivery for s in await store.operations_since(0)] == [5, 6, 7, 8, 9, 10]
        assert await store.compact(99) == {"horizon": 10, "dropped": 3, "kept": 3}

    backend.run(test)


# (record index, new owner or None for an edit that leaves the owner as it is)
_WRITES = st.lists(
    st.tuples(st.integers(0, 3), st.one_of(st.none(), st.sampled_from(["u1", "u2", "u3"]))),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(writes=_WRITES, nodes=st.integers(1, 3))
def test_a_compaction_keeps_how_a_record_left_each_scope_it_was_in(
    writes: list[tuple[int, str | None]], nodes: int
) -> None:
    """For every cursor a session may resume from and every owner's scope: a record in that scope at the
    cursor and outside it now still has, among the operations a compaction keeps, one after the cursor that
    moved it out of that scope (what tells a state-based catch-up to send the record, so the client drops it).
    """
    owners: dict[int, str] = {}
    rows: list[LogRow] = []
    history: list[dict[int, str]] = [{}]  # owners after each delivery
    for delivery, (record, owner) in enumerate(writes, start=1):
        before = owners.get(record)
        after = owner if owner is not None else before or "u1"
        snapshot: dict[str, object] = {"ownerId": after}
        if before is not None and before != after:
            snapshot["$from"] = {"ownerId": before}
        owners[record] = after
        node = f"node-{delivery % nodes}"
        rows.append((delivery, node, delivery, "todos", f"r{record}", json.dumps(snapshot)))
        history.append(dict(owners))
    done = plan(rows, len(rows))
    kept = [row for row in rows if row[0] not in set(done.deliveries)]
    assert {row[4] for row in kept} == {f"r{r}" for r in owners}  # each record's latest stays
    for cursor, then in enumerate(history):
        for record, owner in then.items():
            if owners[record] == owner:
                continue
            assert any(
                row[0] > cursor
                and row[4] == f"r{record}"
                and json.loads(row[5] or "{}").get("$from") == {"ownerId": owner}
                for row in kept
            ), f"r{record} left {owner} after delivery {cursor}, and nothing kept says so"


def test_a_record_that_left_the_scope_is_sent_with_its_scope_fields_only() -> None:
    """A state-based catch-up sends a record that left the session's scope so the client drops it; what it
    was given since (here a title written in its new owner's scope) is not the old scope's to see."""
    from offline.core.uuid7 import generate_uuid_v7
    from offline.sync import protocol as p
    from server_runtime.sync import Session
    from tests.server.test_scoped_catch_up import NODES, Writers

    async def scenario() -> None:
        service, sent, send = await _service_on_memory()
        store = service.store

        try:
            writers, node = Writers(), NODES[0]
            gone, kept = generate_uuid_v7(), generate_uuid_v7()
            for record in (gone, kept):
                await service.commit(
                    None, [writers.op(node, "insert", "todos", record, {"ownerId": "a", "title": "t"})]
                )
            cursor = await store.max_delivery()
            for op in (
                writers.op(node, "update", "todos", gone, {"ownerId": "b"}),
                writers.op(node, "update", "todos", gone, {"title": "b's secret"}),
                writers.op(node, "update", "todos", kept, {"title": "a's own"}),
            ):
                await service.commit(None, [op])
            await service.compact()
            session = Session("reader", {"todos": {"ownerId": "a"}}, None, send, cursor=cursor)
            await _relay_until_states_end(service, session, sent)
            states = {
                s["recordId"]: s["state"] for m in sent if isinstance(m, p.RecordStates) for s in m.states
            }
            assert set(states) == {gone, kept}
            assert '"b"' in states[gone] and "secret" not in states[gone]
            assert "a's own" in states[kept]
        finally:
            await service.stop()

    asyncio.run(scenario())


def test_record_states_list_each_number_held_beyond_a_hole() -> None:
    """The server keeps the numbers a node wrote after one it refused as a run; a state-based catch-up sends
    them one by one ([node, number] each), as clients from before runs read them: a client a year old does
    not trip over a state it cannot read. A client that knows runs reads the same state."""
    from offline.core.hlc import HybridLogicalClock
    from offline.core.uuid7 import generate_uuid_v7
    from offline.merge.engine import RecordState
    from offline.sync import protocol as p
    from server_runtime.sync import Session
    from tests.server.test_scoped_catch_up import NODES

    async def scenario() -> None:
        service, sent, send = await _service_on_memory()
        node, record, clock = NODES[0], generate_uuid_v7(), HybridLogicalClock(NODES[0])
        try:
            for number in (1, 2, 4, 5, 6, 7):  # its third write was refused: it never reached the log
                await service.commit(None, [_numbered_write(node, record, clock, number)])
            await service.compact()
            session = Session("reader", {"todos": {"ownerId": "a"}}, None, send, cursor=0)
            await _relay_until_states_end(service, session, sent)
            (text,) = [s["state"] for m in sent if isinstance(m, p.RecordStates) for s in m.states]
            assert json.loads(text)["x"] == [[node, 4], [node, 5], [node, 6], [node, 7]]
            state = RecordState.from_json(text)
            assert state.clock == {node: 2} and state.extra == [[node, 4, 7]]
            assert state.fields["title"]["v"] == "t7"
        finally:
            await service.stop()

    asyncio.run(scenario())


async def _relay_until_states_end(service: object, session: object, sent: list[object]) -> None:
    """Relay to ``session`` (its messages go to ``sent``) until its state-based catch-up's last message."""
    from offline.sync import protocol as p
    from server_runtime.sync import Session, SyncService

    assert isinstance(service, SyncService) and isinstance(session, Session)
    service.sessions.add(session)
    relay = asyncio.create_task(service.relay(session))
    try:
        for _ in range(500):
            if any(isinstance(m, p.RecordStates) and m.is_final for m in sent):
                break
            await asyncio.sleep(0.01)
    finally:
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await relay


async def _service_on_memory() -> tuple[Any, list[Any], Callable[[str], Awaitable[None]]]:
    """A started sync service on a memory store of the scoped catch-up schema, the messages a session of it
    is sent (decoded), and that session's send."""
    from offline.sync import protocol as p
    from server_runtime.stores import MemoryServerStore
    from server_runtime.sync import SyncService
    from tests.server.test_scoped_catch_up import SCHEMA

    store = MemoryServerStore()
    await store.set_schema(SCHEMA)
    service = SyncService(store)
    await service.start()
    sent: list[p.Message] = []

    async def send(text: str) -> None:
        sent.append(p.decode(text))

    return service, sent, send


def test_a_writer_cannot_open_gaps_in_its_numbers_without_bound() -> None:
    """Numbers held beyond a gap are kept as runs, a run per gap: a client that skips a number on every
    write (nothing refused it; it lies about its causal context) would be back at 45 bytes a write. The
    server takes a gap while the record holds fewer than `MAX_GAPS` of that node's, and refuses a write that
    would open one more; writes that continue a run are taken as before."""
    from offline.core.hlc import HybridLogicalClock
    from offline.core.uuid7 import generate_uuid_v7
    from offline.merge.engine import MAX_GAPS
    from server_runtime.sync import Refusal
    from tests.server.test_scoped_catch_up import NODES

    async def scenario() -> None:
        service, _, _ = await _service_on_memory()
        node, record, clock = NODES[0], generate_uuid_v7(), HybridLogicalClock(NODES[0])

        async def write(number: int) -> object:
            op = _numbered_write(node, record, clock, number)
            return (await service.commit(None, [op]))[op.id]

        try:
            assert isinstance(await write(1), int)
            for gap in range(MAX_GAPS):
                assert isinstance(await write(3 + 2 * gap), int), gap  # skips one number each time
            skipping = 3 + 2 * MAX_GAPS
            refused = await write(skipping)
            assert isinstance(refused, Refusal) and "gap" in refused.message, refused
            assert isinstance(await write(skipping - 1), int)  # continues the last run: taken
            rows = await service.store.load_rows([("todos", record)])
            state = rows[("todos", record)].state
            assert len(state.extra) == MAX_GAPS and state.fields["title"]["v"] == f"t{skipping - 1}"
        finally:
            await service.stop()

    asyncio.run(scenario())


def _numbered_write(node: str, record: str, clock: Any, number: int) -> Any:
    """``node``'s write numbered ``number`` (its causal context says so) to a todo of owner "a": the insert
    when 1, else an update of the title."""
    from offline.core.operations import create_operation
    from tests.server.test_scoped_catch_up import SCHEMA

    return create_operation(
        {
            "node_id": node,
            "type": "insert" if number == 1 else "update",
            "collection": "todos",
            "record_id": record,
            "data": {"ownerId": "a", "title": f"t{number}"},
            "previous_data": None if number == 1 else {},
            "timestamp": clock.now(),
            "sequence_number": number,
            "schema_version": SCHEMA.version,
            "causal_context": {node: number},
        }
    )
