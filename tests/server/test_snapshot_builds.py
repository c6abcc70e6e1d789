"""The snapshot endpoint's bound on concurrent builds, in one process: while ``snapshot_builds`` builds run,
a request for another scope is answered 503 OVERLOADED at once (the device syncs by socket), a request for
a scope being built waits for that build instead of starting another, and once the builds end the next
request is served."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.routing import Route

import offline
from offline.core.uuid7 import generate_uuid_v7
from offline.sync import snapshot
from server_runtime.limits import OriginPolicy
from server_runtime.snapshot import Snapshots
from server_runtime.stores import MemoryServerStore
from server_runtime.sync import SyncLimits, SyncService
from tests.server.test_scoped_catch_up import NODES, SCHEMA, Writers


def test_builds_beyond_the_limit_are_refused_and_the_same_scope_shares_one(tmp_path: Any) -> None:
    async def scenario() -> None:
        store = MemoryServerStore()
        await store.set_schema(SCHEMA)
        service = SyncService(store, limits=SyncLimits(state_sync_after=1, snapshot_builds=1))
        await service.start()
        writers, node = Writers(), NODES[0]
        for owner in ("a", "a", "b", "b"):
            op = writers.op(node, "insert", "todos", generate_uuid_v7(), {"ownerId": owner, "title": "t"})
            await service.commit(None, [op])
        # The first build waits inside its state catch-up until released.
        release, entered = asyncio.Event(), asyncio.Event()
        real = service._catch_up_states

        async def held(*args: Any) -> None:
            entered.set()
            await release.wait()
            await real(*args)

        service._catch_up_states = held  # type: ignore[method-assign]
        app = Starlette(
            routes=[
                Route("/sync/snapshot", Snapshots(service, OriginPolicy(None)).endpoint, methods=["POST"])
            ]
        )

        def body(owner: str) -> dict[str, Any]:
            return {
                "format": snapshot.FORMAT,
                "offline": offline.__version__,
                "schemaVersion": SCHEMA.version,
                "syncScope": {"todos": {"ownerId": owner}},
            }

        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://test"
            ) as http:
                first = asyncio.create_task(http.post("/sync/snapshot", json=body("a")))
                await asyncio.wait_for(entered.wait(), 30)
                same = asyncio.create_task(http.post("/sync/snapshot", json=body("a")))
                other = await http.post("/sync/snapshot", json=body("b"))
                assert other.status_code == 503 and other.json()["error"] == "OVERLOADED"
                assert other.headers["retry-after"]
                assert not same.done()  # waiting for the build of its scope, not refused
                release.set()
                answers = [await first, await same]
                assert [a.status_code for a in answers] == [200, 200]
                assert answers[0].content == answers[1].content
                assert service.counters["snapshots_built"] == 1
                later = await http.post("/sync/snapshot", json=body("b"))
                assert later.status_code == 200 and later.content.startswith(snapshot.SQLITE_HEADER)
                assert service.counters["snapshots_built"] == 2
        finally:
            await service.stop()

    asyncio.run(scenario())
