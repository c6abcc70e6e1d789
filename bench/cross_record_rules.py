"""The cost of cross-record rules: the server judging children against their parents, and `App.apply`
reporting the rules merged records break (``server_runtime.judging``, ``offline.store.breaches``).

Server: ``--operations`` task inserts, each pointing at one of 50 projects, committed through a sync core on
a memory store in batches of 100, with the tasks -> projects relation ('cascade') and without it (the same
fields), and with a unique constraint on the titles instead. Device: the same operations merged by `App.apply`
into an in-memory app under each schema. Figures: operations per second each way, and each rule's overhead in
percent over the schema without rules.

Run: ``python -m bench cross_record_rules`` (or ``python -m bench.cross_record_rules --operations 20000``).
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any


def _schema(rules: str) -> Any:
    """``rules``: 'none', 'relation' (tasks -> projects, cascade) or 'unique' (titles, first-write-wins)."""
    from offline import define_schema, t

    tasks: dict[str, Any] = {"fields": {"title": t.string(), "projectId": t.string().optional()}}
    if rules == "unique":
        tasks["constraints"] = {
            "uniqueTitle": {"type": "unique", "fields": ["title"], "onConflict": "first-write-wins"}
        }
    return define_schema(
        {
            "version": 1,
            "collections": {"projects": {"fields": {"name": t.string()}}, "tasks": tasks},
            "relations": {
                "taskProject": {
                    "from": "tasks",
                    "to": "projects",
                    "type": "many-to-one",
                    "field": "projectId",
                    "onDelete": "cascade",
                }
            }
            if rules == "relation"
            else {},
        }
    )


def _operations(count: int) -> list[Any]:
    from offline import create_app

    writer = create_app(_schema("none"), path=":memory:")
    projects = [writer.projects.insert({"name": f"p{i}"})["id"] for i in range(50)]
    for i in range(count):
        writer.tasks.insert({"title": f"task {i}", "projectId": projects[i % len(projects)]})
    ops = writer.operations()
    writer.close()
    return ops


async def _commit(ops: list[Any], rules: str) -> float:
    from server_runtime.stores import MemoryServerStore
    from server_runtime.sync import SyncService

    store = MemoryServerStore()
    await store.set_schema(_schema(rules))
    service = SyncService(store)
    await service.start()
    started = time.perf_counter()
    for start in range(0, len(ops), 100):
        await service.commit(None, ops[start : start + 100])
    elapsed = time.perf_counter() - started
    await service.stop()
    await store.close()
    return len(ops) / elapsed


def _apply(ops: list[Any], rules: str) -> float:
    from offline import create_app

    app = create_app(_schema(rules), path=":memory:")
    started = time.perf_counter()
    for start in range(0, len(ops), 500):
        app.apply(ops[start : start + 500])
    elapsed = time.perf_counter() - started
    app.close()
    return len(ops) / elapsed


def run(operations: int = 5_000) -> dict[str, Any]:
    ops = _operations(operations)
    out: dict[str, Any] = {"operations": len(ops)}
    asyncio.run(_commit(ops, "none"))  # warm-up (imports, first allocations), not measured
    _apply(ops, "none")
    for rules in ("none", "relation", "unique"):
        # Best of three: the least disturbed by other load on the machine.
        out[f"server_ops_per_s_{rules}"] = round(max(asyncio.run(_commit(ops, rules)) for _ in range(3)))
        out[f"apply_ops_per_s_{rules}"] = round(max(_apply(ops, rules) for _ in range(3)))
    for where in ("server", "apply"):
        base = out[f"{where}_ops_per_s_none"]
        for rules in ("relation", "unique"):
            out[f"{where}_overhead_percent_{rules}"] = round(
                100 * (base / out[f"{where}_ops_per_s_{rules}"] - 1), 1
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cross_record_rules", description=__doc__)
    parser.add_argument("--operations", type=int, default=5_000)
    args = parser.parse_args()
    print(f"[bench cross_record_rules] {args.operations} operations", file=sys.stderr, flush=True)
    json.dump(run(args.operations), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
