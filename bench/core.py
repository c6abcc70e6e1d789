"""Core data model figures: operation creation/hashing, verification, HLC, schema definition."""

from __future__ import annotations

from typing import Any

from bench.timing import best_of
from offline import HybridLogicalClock, create_operation, define_schema, generate_uuid_v7, t, verify_operation


def run() -> dict[str, Any]:
    node = generate_uuid_v7()
    clock = HybridLogicalClock(node)
    n = 5_000
    stamps = [clock.now() for _ in range(n)]
    ops: list[Any] = []

    def create() -> None:
        ops.clear()
        for i, ts in enumerate(stamps):
            ops.append(
                create_operation(
                    {
                        "node_id": node,
                        "type": "insert",
                        "collection": "todos",
                        "record_id": f"r{i}",
                        "data": {"title": f"todo {i}", "done": False, "votes": i, "tags": ["a", "b"]},
                        "timestamp": ts,
                        "sequence_number": i + 1,
                        "schema_version": 1,
                    }
                )
            )

    create_s = best_of(create, 3)
    verify_s = best_of(lambda: [verify_operation(op) for op in ops], 3)
    hlc_s = best_of(lambda: [clock.now() for _ in range(50_000)], 3)

    def schema() -> None:
        define_schema(
            {
                "version": 1,
                "collections": {
                    f"c{i}": {"fields": {f"f{j}": t.string().optional() for j in range(20)}}
                    for i in range(50)
                },
            }
        )

    schema_s = best_of(schema, 3)
    return {
        "create_operation_per_s": round(n / create_s),
        "verify_operation_per_s": round(n / verify_s),
        "hlc_now_per_s": round(50_000 / hlc_s),
        "define_schema_50x20_ms": round(schema_s * 1000, 2),
    }
