"""Server logs built straight in a store, for the benchmarks that need one large before they measure."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from offline.core.operations import Operation
    from offline.core.schema import SchemaDefinition
    from server_runtime.stores.base import RecordRow


def insert_operations(
    collection: str, count: int, data: Callable[[int], dict[str, Any]], schema_version: int
) -> Iterator[Operation]:
    """``count`` inserts into ``collection`` by one new node, numbered from 1 (the i-th holding ``data(i)``),
    made as they are asked for. Each carries the causal context an app's insert carries (its node's first
    write to the record): the engine puts one on every write, and the fold and compaction paths differ for
    operations without one."""
    from offline import HybridLogicalClock, create_operation, generate_uuid_v7

    node = generate_uuid_v7()
    clock = HybridLogicalClock(node)
    for i in range(count):
        yield create_operation(
            {
                "node_id": node,
                "type": "insert",
                "collection": collection,
                "record_id": generate_uuid_v7(),
                "data": data(i),
                "timestamp": clock.now(),
                "sequence_number": i + 1,
                "schema_version": schema_version,
                "causal_context": {node: 1},
            }
        )


def insert_chunks(
    schema: SchemaDefinition, n: int, data: Callable[[int], dict[str, Any]], chunk: int = 10_000
) -> Iterator[tuple[list[Operation], list[RecordRow]]]:
    """``n`` inserts into ``todos`` by one node (the i-th holding ``data(i)``) with their folded record rows,
    ``chunk`` at a time: what the sync core would store for them, built without it (each record's state
    kept as its one operation, as the core keeps a record's first write: `records.one_operation_state`)."""
    from offline.merge.engine import MergeEngine, RecordState
    from server_runtime.records import one_operation_state
    from server_runtime.stores.base import RecordRow

    engine = MergeEngine(schema)
    operations = insert_operations("todos", n, data, schema.version)
    while ops := list(itertools.islice(operations, chunk)):
        rows = []
        for op in ops:
            state = RecordState()
            engine.apply(state, op)
            rows.append(
                RecordRow(
                    op.collection,
                    op.record_id,
                    state,
                    engine.materialize(op.collection, op.record_id, state),
                    one_operation_state(op),
                )
            )
        yield ops, rows
