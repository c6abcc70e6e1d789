"""The benchmarks' seeded server logs look like real data: each seeded insert carries the causal context an
app's own insert carries (its node's count of writes to the record, 1), so a benchmark measures the folds
and compactions real operations take (the engine's context paths), not the path of operations written before
contexts existed."""

from __future__ import annotations

from pathlib import Path

from bench.seeding import insert_chunks, insert_operations
from offline import create_app, define_schema, t
from offline.store.replication import pending_operations

SCHEMA = define_schema({"version": 1, "collections": {"todos": {"fields": {"title": t.string()}}}})


def test_seeded_inserts_carry_the_causal_context_of_an_apps_insert(tmp_path: Path) -> None:
    app = create_app(SCHEMA, path=str(tmp_path / "app.db"))
    try:
        app.todos.insert({"title": "real"})
        [real] = pending_operations(app)
    finally:
        app.close()
    assert real.causal_context == {real.node_id: 1}

    seeded = list(insert_operations("todos", 3, lambda i: {"title": f"t{i}"}, SCHEMA.version))
    for op in seeded:
        assert op.causal_context == {op.node_id: 1}, op
    [(ops, rows)] = list(insert_chunks(SCHEMA, 3, lambda i: {"title": f"t{i}"}))
    assert all(op.causal_context == {op.node_id: 1} for op in ops)
    # Their states are those of operations with a context (per-node numbers, no causal graph).
    assert all(row.state.clock and not row.state.graph for row in rows)


def test_seeded_rows_keep_each_state_as_the_sync_core_keeps_a_records_first_write() -> None:
    """The sync core stores a record's first write as that operation (`stores.base.ONE_OPERATION`), which
    catch-ups and snapshot builds read differently from a folded state: seeded rows are stored the same way."""
    import asyncio

    from server_runtime.records import one_operation_state
    from server_runtime.stores import MemoryServerStore
    from server_runtime.stores.base import ONE_OPERATION
    from server_runtime.sync import SyncService

    [real] = list(insert_operations("todos", 1, lambda i: {"title": "real"}, SCHEMA.version))

    async def stored_by_the_core() -> str:
        store = MemoryServerStore()
        await store.set_schema(SCHEMA)
        service = SyncService(store)
        await service.start()
        try:
            await service.commit(None, [real])
            rows = await store.load_rows([("todos", real.record_id)])
            return str(rows[("todos", real.record_id)].state_text)
        finally:
            await service.stop()

    assert asyncio.run(stored_by_the_core()) == one_operation_state(real)
    assert one_operation_state(real).startswith(ONE_OPERATION)
    [(ops, rows)] = list(insert_chunks(SCHEMA, 3, lambda i: {"title": f"t{i}"}))
    assert [row.state_text for row in rows] == [one_operation_state(op) for op in ops]
