"""The server's write pipeline commits batches that arrive together in one store transaction (group commit),
answering each caller for its own batch, and its relay finds what it sends in the committed log."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from offline import HybridLogicalClock, create_operation, define_schema, t
from offline.core.operations import Operation
from offline.core.uuid7 import generate_uuid_v7
from offline.merge.values import compact_json
from server_runtime.stores import create_sqlite_server_store
from server_runtime.sync import SyncService

SCHEMA = define_schema({"version": 1, "collections": {"items": {"fields": {"title": t.string()}}}})


def _writer_ops(count: int) -> list[Operation]:
    node = generate_uuid_v7()
    clock = HybridLogicalClock(node)
    return [
        create_operation(
            {
                "node_id": node,
                "type": "insert",
                "collection": "items",
                "record_id": generate_uuid_v7(),
                "data": {"title": f"{node[-4:]} {i}"},
                "timestamp": clock.now(),
                "sequence_number": i + 1,
                "schema_version": 1,
            }
        )
        for i in range(count)
    ]


def test_concurrent_batches_share_store_commits_and_get_their_own_results(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = create_sqlite_server_store(str(tmp_path / "server.db"))
        await store.set_schema(SCHEMA)
        service = SyncService(store)
        await service.start()
        commits: list[dict[str, Any]] = []
        service.listeners.append(lambda kind, payload: commits.append(payload) if kind == "commit" else None)
        try:
            writers = [_writer_ops(20) for _ in range(8)]
            shared = writers[0][0]  # also sent by a second writer, in the same round

            async def write(ops: list[Operation], extra: list[Operation]) -> list[dict[str, Any]]:
                out = []
                for op in ops:
                    out.append(await service.commit(None, [op, *extra]))
                    extra = []
                return out

            answers = await asyncio.gather(
                write(writers[0], []), write(writers[1], [shared]), *(write(w, []) for w in writers[2:])
            )
            assert len(commits) < 8 * 20  # batches were grouped
            assert sum(c["operations"] for c in commits) == 8 * 20 + 1
            deliveries: list[int] = []
            for ops, results in zip(writers, answers, strict=True):
                assert [list(r) for r in results][1:] == [[op.id] for op in ops[1:]]
                for op, result in zip(ops, results, strict=True):
                    assert isinstance(result[op.id], int) and result[op.id] > 0
                    deliveries.append(result[op.id])
            # The operation two writers sent is stored once: one of them was told it was a duplicate.
            assert sorted([answers[0][0][shared.id], answers[1][0][shared.id]], key=str)[1] is None
            assert isinstance(answers[0][0][shared.id] or answers[1][0][shared.id], int)
            assert sorted(deliveries) == list(range(1, 8 * 20 + 1))
            stored = await store.operations_since(0)
            assert [s.delivery for s in stored] == list(range(1, 8 * 20 + 1))
            wires = [compact_json(s.operation.to_wire()) for s in stored]
            # The relay sends each operation's wire form: encoded from the operation just committed, or
            # read as stored text by a process that did not commit it.
            assert [r.wire_json() for r in await service.read_since(0, 1000)] == wires
            restarted = SyncService(store)
            await restarted.start()
            relayed = await restarted.read_since(10, 1000)
            assert [r.delivery for r in relayed] == list(range(11, 8 * 20 + 1))
            assert [r.wire_json() for r in relayed] == wires[10:]
            await restarted.stop()
        finally:
            await service.stop()
            await store.close()

    asyncio.run(scenario())
