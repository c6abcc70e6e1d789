"""Server authority travels with the operations (offline/core/server_nodes.py).

A server writes under a marked node id (``server~...``), part of every operation's content hash, so every
replica folds 'server-authoritative' fields the same way however it got the operations: through a session
or only through `app.apply` from a peer. Clients cannot write under such an id: the server refuses them.
A database from before the marker moves to a marked id and keeps its old id's writes authoritative.
"""

from __future__ import annotations

import asyncio
from typing import Any

from offline import App, create_app, create_operation, define_schema, t
from offline.core.hlc import HybridLogicalClock
from offline.core.operations import Operation
from offline.core.schema import SchemaDefinition
from offline.core.server_nodes import SERVER_NODE_PREFIX, is_server_node_id, new_server_node_id
from server_runtime.judging import NODE_ID_MISMATCH
from server_runtime.stores import MemoryServerStore
from server_runtime.sync import Refusal, SyncService

from .test_cross_record_rules import Cluster, local, skewed


def schema() -> SchemaDefinition:
    return define_schema(
        {
            "version": 1,
            "collections": {
                "projects": {"fields": {"name": t.string()}},
                "tasks": {
                    "fields": {
                        "title": t.string(),
                        "projectId": t.string().merge("server-authoritative").optional(),
                    }
                },
            },
            "relations": {
                "taskProject": {
                    "from": "tasks",
                    "to": "projects",
                    "type": "many-to-one",
                    "field": "projectId",
                    "onDelete": "set-null",
                }
            },
        }
    )


# One clock per node, as a device has: a node's successive writes get increasing stamps. (A fresh clock per
# operation stamped writes made within one millisecond alike, and last-writer-wins then fell to the ids.)
_CLOCKS: dict[str, HybridLogicalClock] = {}


def op_of(
    node: str, seq: int, type_: str, record: str, data: dict[str, Any] | None, **extra: Any
) -> Operation:
    return create_operation(
        {
            "node_id": node,
            "type": type_,
            "collection": "tasks",
            "record_id": record,
            "data": data,
            "timestamp": _CLOCKS.setdefault(node, HybridLogicalClock(node)).now(),
            "sequence_number": seq,
            "schema_version": 1,
            **extra,
        }
    )


async def started(store: MemoryServerStore) -> SyncService:
    await store.set_schema(schema())
    service = SyncService(store)
    await service.start()
    return service


def test_server_node_ids_are_marked_and_client_ids_are_not() -> None:
    server_id = new_server_node_id()
    assert server_id.startswith(SERVER_NODE_PREFIX) and is_server_node_id(server_id)
    app = create_app(schema(), path=":memory:")
    assert not is_server_node_id(app.node_id)
    assert not is_server_node_id(None)


def test_a_replica_fed_only_through_apply_folds_server_authority_like_a_connected_one() -> None:
    service = asyncio.run(started(MemoryServerStore()))
    apps = [create_app(schema(), path=":memory:", now=skewed(ms)) for ms in (0, 0, 60_000)]
    deleter, inserter, mover = apps
    for app in apps:
        app.set_authoritative_nodes([service.node_id])  # what a sync client does on its handshake
    cluster = Cluster(service, apps, 0)
    offline_peer: App = create_app(schema(), path=":memory:")  # never connects to any server

    async def scenario() -> None:
        p1 = deleter.projects.insert({"name": "p1"})
        p2 = deleter.projects.insert({"name": "p2"})
        await cluster.settle()
        deleter.projects.delete(p1["id"])
        task = inserter.tasks.insert({"title": "t", "projectId": p1["id"]})
        await cluster.push(0)
        await cluster.push(1)  # the server clears the reference to the deleted project (its own write)
        await cluster.settle()
        mover.tasks.update(task["id"], {"projectId": p2["id"]})  # a later client write: loses to the server
        await cluster.settle()

    asyncio.run(scenario())
    server_writes = [op for op in mover.operations() if op.node_id == service.node_id]
    assert server_writes and all(is_server_node_id(op.node_id) for op in server_writes)
    offline_peer.apply(mover.operations())
    connected = [local(app, "tasks") for app in apps]
    assert connected[0][0]["projectId"] is None
    assert local(offline_peer, "tasks") == connected[0] == connected[1] == connected[2]


def test_client_operations_under_a_server_node_id_are_refused() -> None:
    store = MemoryServerStore()
    service = asyncio.run(started(store))
    client = create_app(schema(), path=":memory:")
    cluster = Cluster(service, [client], 0)
    forged = [
        op_of(service.node_id, 1, "insert", "r1", {"title": "as the server"}),
        op_of(SERVER_NODE_PREFIX + "made-up", 1, "insert", "r2", {"title": "as a server"}),
    ]
    honest = op_of(client.node_id, 1, "insert", "r3", {"title": "mine"})
    results = asyncio.run(service.commit(cluster.sessions[0], [*forged, honest]))
    for op in forged:
        refusal = results[op.id]
        assert isinstance(refusal, Refusal) and refusal.code == NODE_ID_MISMATCH
        assert op.node_id in refusal.message
    assert isinstance(results[honest.id], int)
    assert service.cache.record("tasks", "r1") is None and service.cache.record("tasks", "r2") is None


def test_a_database_from_before_the_marker_takes_a_marked_id_and_keeps_its_old_writes_authoritative() -> None:
    store = MemoryServerStore()
    old_id = "0190aaaa-0000-7000-8000-000000000001"

    async def scenario() -> None:
        await store.set_meta("server_node_id", old_id)
        service = await started(store)
        assert is_server_node_id(service.node_id)
        assert service.legacy_node_ids == (old_id,)
        old = op_of(old_id, 1, "insert", "r1", {"title": "t", "projectId": "by the old server"})
        assert isinstance((await service.commit(None, [old]))[old.id], int)  # a restored old write
        client = create_app(schema(), path=":memory:", now=skewed(1_000))
        later = op_of(
            client.node_id,
            1,
            "update",
            "r1",
            {"projectId": "by a client"},
            previous_data={"projectId": "by the old server"},
            causal_deps=[old.id],
        )
        cluster = Cluster(service, [client], 0)
        assert isinstance((await service.commit(cluster.sessions[0], [later]))[later.id], int)
        assert service.cache.record("tasks", "r1")["projectId"] == "by the old server"
        refused = op_of(old_id, 2, "update", "r1", {"title": "again"}, previous_data={"title": "t"})
        outcome = (await service.commit(cluster.sessions[0], [refused]))[refused.id]
        assert isinstance(outcome, Refusal) and outcome.code == NODE_ID_MISMATCH
        await service.stop()
        again = SyncService(store)
        await again.start()
        assert again.node_id == service.node_id  # moved once
        assert again.legacy_node_ids == (old_id,)
        assert again.engine.fold("tasks", "r1", [later, old])[1]["projectId"] == "by the old server"

    asyncio.run(scenario())


def test_restoring_a_backup_of_a_pre_marker_server_keeps_its_writes_authoritative() -> None:
    async def scenario() -> None:
        service = await started(MemoryServerStore())
        own = service.node_id
        await service.adopt_node_id("0190aaaa-0000-7000-8000-000000000002")
        assert service.node_id == own  # it goes on writing under its marked id
        assert service.legacy_node_ids == ("0190aaaa-0000-7000-8000-000000000002",)
        assert service.engine.authoritative_nodes() >= {own, "0190aaaa-0000-7000-8000-000000000002"}
        marked = new_server_node_id()
        await service.adopt_node_id(marked)  # a marked server's identity is taken over as before
        assert service.node_id == marked

    asyncio.run(scenario())


def test_an_operation_reusing_its_nodes_number_for_a_record_is_refused() -> None:
    """Two different operations numbered alike among one node's writes to a record (causalContext): folded,
    replicas would disagree on which counts, so the server keeps the first and refuses the other."""
    store = MemoryServerStore()
    service = asyncio.run(started(store))
    client = create_app(schema(), path=":memory:")
    cluster = Cluster(service, [client], 0)
    node = client.node_id
    first = op_of(node, 1, "insert", "r1", {"title": "a"}, causal_context={node: 1})
    second = op_of(
        node, 2, "update", "r1", {"title": "b"}, previous_data={"title": "a"}, causal_context={node: 2}
    )
    reused = op_of(
        node, 3, "update", "r1", {"title": "c"}, previous_data={"title": "a"}, causal_context={node: 2}
    )
    results = asyncio.run(service.commit(cluster.sessions[0], [first, second, reused]))
    assert isinstance(results[first.id], int)
    # One of the two numbered 2 is kept (the first judged), the other refused.
    kept, refused = (second, reused) if isinstance(results[second.id], int) else (reused, second)
    assert isinstance(results[kept.id], int)
    refusal = results[refused.id]
    assert isinstance(refusal, Refusal) and refusal.code == "INVALID_OPERATION"
    assert "causalContext" in refusal.message
    record = service.cache.record("tasks", "r1")
    assert record is not None and record["title"] == dict(kept.data or {})["title"]
