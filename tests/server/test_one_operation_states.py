"""A record's first operation is stored as its state (``stores.base.ONE_OPERATION``): the state that one
operation makes of a record with none, written as the operation's own text instead of encoding the state.

Whoever reads it back (the sync core's cache on the record's next write, a restarted server, a store's row)
gets exactly the state the merge engine makes of that operation; everything else is stored as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from offline import HybridLogicalClock, create_operation, define_schema, t
from offline.core.operations import Operation
from offline.merge.engine import MergeEngine, RecordState
from server_runtime.stores import ServerStore
from server_runtime.stores.base import ONE_OPERATION
from server_runtime.sync import SyncService

from .test_stores import Backend, backend

__all__ = ["backend"]

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "items": {
                "fields": {
                    "title": t.string(),
                    "votes": t.number().merge("counter").default(0),
                    "tags": t.array(t.string()).default([]),
                    "owner": t.string().optional(),
                }
            }
        },
    }
)


class Writer:
    def __init__(self, node: str) -> None:
        self.node = node
        self.clock = HybridLogicalClock(node)
        self.seq = 0

    def op(self, type_: str, record: str, data: dict[str, Any] | None, **extra: Any) -> Operation:
        self.seq += 1
        return create_operation(
            {
                "node_id": self.node,
                "type": type_,
                "collection": "items",
                "record_id": record,
                "data": data,
                "timestamp": self.clock.now(),
                "sequence_number": self.seq,
                "schema_version": 1,
                **extra,
            }
        )


def folded(*ops: Operation) -> str:
    state, _ = MergeEngine(SCHEMA).fold("items", ops[0].record_id, ops)
    return state.to_json()


@contextlib.asynccontextmanager
async def sync_core(store: ServerStore) -> AsyncIterator[SyncService]:
    """A started sync core on ``store`` (with this module's schema), stopped at the end."""
    await store.set_schema(SCHEMA)
    service = SyncService(store)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def raw_state(store: ServerStore, record: str) -> str:
    row = (await store.load_rows([("items", record)]))[("items", record)]
    assert row.state_text is not None
    return row.state_text


def test_first_operations_are_stored_as_their_text_and_read_back_as_their_state(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        a, b = Writer("node-a"), Writer("node-b")
        insert = a.op("insert", "r1", {"title": "one", "votes": 2, "tags": [], "owner": "ann"})
        other = b.op("insert", "r2", {"title": "two", "votes": 0, "tags": ["x"]})
        async with sync_core(store) as service:
            await service.commit(None, [insert, other])
            for op in (insert, other):
                text = await raw_state(store, op.record_id)
                assert text.startswith(ONE_OPERATION)
                # A store's row reads it back as the state the engine makes of it.
                row = (await store.load_rows([("items", op.record_id)]))[("items", op.record_id)]
                assert row.state.to_json() == folded(op)
            # The next write folds on it (the cache reads it back), and is stored as a state again.
            update = b.op(
                "update", "r1", {"votes": 5, "title": "uno"}, previous_data={"votes": 2, "title": "one"}
            )
            await service.commit(None, [update])
            assert await raw_state(store, "r1") == folded(insert, update)
            assert service.cache.record("items", "r1") == {
                "id": "r1",
                "title": "uno",
                "votes": 5,
                "tags": [],
                "owner": "ann",
            }
        # A restarted sync core reads the stored forms into its cache and goes on from them.
        async with sync_core(store) as again:
            assert again.cache.record("items", "r2") == {
                "id": "r2",
                "title": "two",
                "votes": 0,
                "tags": ["x"],
                "owner": None,
            }
            late = a.op("update", "r2", {"owner": "bob"}, previous_data={"owner": None})
            await again.commit(None, [late])
            assert await raw_state(store, "r2") == folded(other, late)

    backend.run(test)


def test_only_a_first_operation_from_a_client_is_stored_so(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        async with sync_core(store) as service:
            a = Writer("node-a")
            mine = Writer(service.node_id)  # the server's own node: its engine holds it authoritative
            first, second = a.op("insert", "r1", {"title": "one"}), a.op("insert", "r1", {"title": "uno"})
            await service.commit(None, [first, second])  # two operations on a new record in one batch
            assert await raw_state(store, "r1") == folded(first, second)
            own = mine.op("insert", "r3", {"title": "server"})
            await service.commit(None, [own])
            assert not (await raw_state(store, "r3")).startswith(ONE_OPERATION)

    backend.run(test)


def test_a_row_read_without_a_schema_says_what_is_missing(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        async with sync_core(store) as service:
            await service.commit(None, [Writer("node-a").op("insert", "r1", {"title": "one"})])
        store._schema = None  # as a store opened on the database without set_schema
        store._engine = None  # type: ignore[attr-defined]
        row = (await store.load_rows([("items", "r1")]))[("items", "r1")]
        assert row.record is not None and row.record["title"] == "one"
        with pytest.raises(Exception, match="set_schema"):
            _ = row.state

    backend.run(test)


def _insert_values() -> Any:
    """A hypothesis strategy of the data of an insert into "items": every kind of field, some left out."""
    from hypothesis import strategies as st

    return st.fixed_dictionaries(
        {"title": st.text(max_size=8)},
        optional={
            "votes": st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False),
            "tags": st.lists(st.text(max_size=4), max_size=3),
            "owner": st.none() | st.text(max_size=5),
        },
    )


def test_refolding_gives_the_state_of_any_first_operation() -> None:
    """The text stands for exactly what the engine makes of the operation, whatever its fields."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from server_runtime.stores import MemoryServerStore

    values = _insert_values()

    @settings(max_examples=150, deadline=None)
    @given(values, st.sampled_from(["node-a", "node-b"]))
    def check(data: dict[str, Any], node: str) -> None:
        op = Writer(node).op("insert", "r1", data)
        store = MemoryServerStore()
        asyncio.run(store.set_schema(SCHEMA))
        assert store._refold_state(op).to_json() == folded(op)
        assert isinstance(store._refold_state(op), RecordState)

    check()


def test_a_new_records_insert_is_judged_to_the_record_the_engine_folds() -> None:
    """The sync core takes a new record's insert straight to its record (`MergeEngine.insert_fold`, no
    merge state built): the same record as applying it to an empty state, whatever its fields."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from server_runtime.stores import MemoryServerStore

    values = _insert_values()
    engine = MergeEngine(SCHEMA)

    @settings(max_examples=60, deadline=None)
    @given(st.lists(values, min_size=1, max_size=4))
    def check(records: list[dict[str, Any]]) -> None:
        writer = Writer("node-a")
        ops = [writer.op("insert", f"r{i}", data) for i, data in enumerate(records)]

        async def main() -> None:
            async with sync_core(MemoryServerStore()) as service:
                results = await service.commit(None, ops)
                assert all(isinstance(results[op.id], int) for op in ops)
                for op in ops:
                    state = RecordState()
                    engine.apply(state, op)
                    expected = engine.materialize("items", op.record_id, state)
                    assert service.cache.record("items", op.record_id) == expected
                    assert service.cache.state("items", op.record_id).to_json() == state.to_json()

        asyncio.run(main())

    check()


# Every kind of register a first operation can make: lww scalars of each type, a counter, an add-wins set,
# an optional field, a server-authoritative one, a max, an append-only set, a state machine.
WIDE = define_schema(
    {
        "version": 2,
        "collections": {
            "items": {
                "fields": {
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "at": t.timestamp().optional(),
                    "votes": t.number().merge("counter").default(0),
                    "tags": t.array(t.string()).default([]),
                    "owner": t.string().optional(),
                    "status": t.string().merge("server-authoritative").optional(),
                    "high": t.number().merge("max").optional(),
                    "seen": t.array(t.string()).merge("append-only").default([]),
                    "phase": t.enum(["a", "b", "c"]).transitions({"a": ["b"], "b": ["c"]}).optional(),
                }
            },
        },
    }
)


def _first_operations() -> Any:
    """A hypothesis strategy of any operation that can be a record's first at the server (so stored as its
    text): an insert, update or delete, with or without a causal context (the writer's first number or a
    later one, others seen), with or without dependencies, of this schema's version or an older one."""
    from hypothesis import strategies as st

    scalar = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=4)
    number = st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    data = st.fixed_dictionaries(
        {},
        optional={
            "title": st.text(max_size=8) | st.none() | st.integers(0, 3),
            "done": st.booleans() | st.text(max_size=2),
            "at": st.integers(0, 2**45) | st.none(),
            "votes": number | st.none(),
            "tags": st.lists(st.text(max_size=4), max_size=3),
            "owner": st.none() | st.text(max_size=5),
            "status": st.sampled_from(["todo", "done"]) | st.none(),
            "high": number | st.none(),
            "seen": st.lists(st.text(max_size=3), max_size=2),
            "phase": st.sampled_from(["a", "b", "c", "z"]) | st.none(),
            "unknown": scalar,
        },
    )
    context = st.none() | st.builds(
        lambda own, others: {"node-a": own, **others},
        st.integers(1, 3),
        st.dictionaries(st.sampled_from(["node-b", "node-c"]), st.integers(0, 4), max_size=2),
    )
    nodes = st.sampled_from(["node-a", "server"])
    anything = st.fixed_dictionaries(
        {
            "type": st.sampled_from(["insert", "insert", "update", "delete"]),
            "data": data,
            "previous": st.none() | data,
            "context": context,
            "deps": st.lists(st.sampled_from(["d1", "d2"]), max_size=2, unique=True),
            "version": st.sampled_from([1, 2, 2]),
            "node": nodes,
        }
    )
    # The usual first operation (an app's insert: its node's first write, of this version), scalars only.
    scalars = data.map(lambda d: {k: v for k, v in d.items() if k not in ("tags", "seen")})
    usual = st.fixed_dictionaries(
        {
            "type": st.just("insert"),
            "data": scalars,
            "previous": st.none(),
            "context": context.filter(lambda c: c is not None and c["node-a"] == 1),
            "deps": st.just([]),
            "version": st.just(2),
            "node": nodes,
        }
    )
    return anything | usual


def test_a_catch_ups_state_of_a_first_operation_is_its_refolded_states_text() -> None:
    """A state-based catch-up sends the state a `ONE_OPERATION` text stands for, built without the fold
    where it can be (`records.one_operation_json`): byte for byte the refolded state's `to_json`, whatever
    the operation."""
    from hypothesis import given, settings

    from server_runtime.records import one_operation_json, one_operation_state
    from server_runtime.stores.base import state_from_text

    @settings(max_examples=400, deadline=None)
    @given(_first_operations())
    def check(shape: dict[str, Any]) -> None:
        node = shape["node"] if shape["node"] != "server" else "server-node"
        engine = MergeEngine(WIDE, authoritative_nodes=("server-node",))
        context = shape["context"]
        if context is not None:
            context = {node: context.pop("node-a"), **context}
        extra: dict[str, Any] = {"causal_deps": shape["deps"], "schema_version": shape["version"]}
        if context is not None:
            extra["causal_context"] = context
        if shape["type"] == "update":
            extra["previous_data"] = shape["previous"] or {}
        data = None if shape["type"] == "delete" else shape["data"]
        op = Writer(node).op(shape["type"], "r1", data, **extra)
        text = one_operation_state(op)
        expected = state_from_text(text, lambda o: engine.state_of((o,)), "items", "r1", "").to_json()
        assert one_operation_json(engine, text) == expected
        taken["wire" if engine.wire_insert_text(json.loads(text[1:])) is not None else "decoded"] += 1

    taken = {"wire": 0, "decoded": 0}
    check()
    assert taken["wire"] and taken["decoded"]  # both ways were compared
