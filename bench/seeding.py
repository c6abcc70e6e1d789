"""Server logs built straight in a store, for the benchmarks that need one large before they measure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from offline.core.operations import Operation
    from offline.core.schema import SchemaDefinition
    from server_runtime.stores.base import RecordRow


def insert_chunks(
    schema: SchemaDefinition, n: int, data: Callable[[int], dict[str, Any]], chunk: int = 10_000
) -> Iterator[tuple[list[Operation], list[RecordRow]]]:
    """``n`` inserts into ``todos`` by one node (the i-th holding ``data(i)``) with their folded record rows,
    ``chunk`` at a time: what the sync core would store for them, built without it."""
    from offline import HybridLogicalClock, create_operation, generate_uuid_v7
    from offline.merge.engine import MergeEngine, RecordState
    from server_runtime.stores.base import RecordRow

    engine = MergeEngine(schema)
    node = generate_uuid_v7()
    clock = HybridLogicalClock(node)
    for first in range(0, n, chunk):
        ops = [
            create_operation(
                {
                    "node_id": node,
                    "type": "insert",
                    "collection": "todos",
                    "record_id": generate_uuid_v7(),
                    "data": data(i),
                    "timestamp": clock.now(),
                    "sequence_number": i + 1,
                    "schema_version": schema.version,
                }
            )
            for i in range(first, min(n, first + chunk))
        ]
        rows = []
        for op in ops:
            state = RecordState()
            engine.apply(state, op)
            rows.append(
                RecordRow(
                    op.collection, op.record_id, state, engine.materialize(op.collection, op.record_id, state)
                )
            )
        yield ops, rows
