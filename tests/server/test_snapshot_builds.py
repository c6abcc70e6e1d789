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


def _open_body() -> dict[str, Any]:
    return {"format": snapshot.FORMAT, "offline": offline.__version__, "schemaVersion": SCHEMA.version}


async def _until(condition: Any, timeout: float = 60.0) -> None:
    """Wait until ``condition()`` holds (polling; generous for a busy machine)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


class _Server:
    """A started sync service on a memory store (no sign-in) whose log moves by `write`."""

    def __init__(self, limits: SyncLimits) -> None:
        self.limits = limits
        self.writers = Writers()

    async def __aenter__(self) -> SyncService:
        store = MemoryServerStore()
        await store.set_schema(SCHEMA)
        self.service = SyncService(store, limits=self.limits)
        await self.service.start()
        return self.service

    async def __aexit__(self, *exc: object) -> None:
        await self.service.stop()

    async def write(self, n: int) -> None:
        """``n`` new to-dos in one commit: the log moves once (a still moment between two would let the
        background prepare the first)."""
        ops = [
            self.writers.op(NODES[0], "insert", "todos", generate_uuid_v7(), {"ownerId": "a", "title": "t"})
            for _ in range(n)
        ]
        await self.service.commit(None, ops)


def test_the_open_scope_is_prepared_in_the_background_and_again_once_the_log_is_still() -> None:
    """A server without sign-in builds its open scope's snapshot as it starts, so the first fresh device is
    served without waiting for a build; once the log has moved and then stayed still, it builds it again."""

    async def scenario() -> None:
        server = _Server(SyncLimits(state_sync_after=1, snapshot_prepare_every=0.01))
        async with server as service:
            await server.write(3)
            snapshots = Snapshots(service, OriginPolicy(None), quiet=0.05)
            app = Starlette(routes=[Route("/sync/snapshot", snapshots.endpoint, methods=["POST"])])
            snapshots.start()
            try:
                assert snapshots.preparing
                await _until(lambda: service.counters["snapshots_prepared"] == 1)
                async with httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://test"
                ) as http:
                    answer = await http.post("/sync/snapshot", json=_open_body())
                    assert answer.status_code == 200
                    assert answer.headers["x-offline-snapshot-horizon"] == str(service.watermark)
                    assert service.counters["snapshots_built"] == 1  # the prepared one, not its own
                    await server.write(2)
                    await _until(lambda: service.counters["snapshots_prepared"] == 2)
                    answer = await http.post("/sync/snapshot", json=_open_body())
                    assert answer.status_code == 200 and answer.headers["x-offline-snapshot-records"] == "5"
                    assert answer.headers["x-offline-snapshot-horizon"] == str(service.watermark)
                    assert service.counters["snapshots_built"] == 2
                    assert service.counters["snapshots_served"] == 2
            finally:
                await snapshots.stop()

    asyncio.run(scenario())


def test_nothing_is_prepared_where_devices_sign_in_or_preparing_is_off() -> None:
    """Sign-in decides each device's scope, so there is no open scope to prepare; snapshot_prepare_every=0
    turns preparing off (requests are still built on demand)."""

    async def scenario() -> None:
        store = MemoryServerStore()
        await store.set_schema(SCHEMA)
        signed = SyncService(store, auth=lambda token: {"sub": "u"} if token else None)
        off = SyncService(store, limits=SyncLimits(snapshot_prepare_every=0))
        for service in (signed, off):
            await service.start()
            snapshots = Snapshots(service, OriginPolicy(None))
            snapshots.start()
            try:
                assert not snapshots.preparing
            finally:
                await snapshots.stop()
                await service.stop()

    asyncio.run(scenario())


def test_a_request_during_the_preparations_first_look_is_built_once() -> None:
    """The background build first asks whether the open scope needs a file at all (a store read); a device
    asking meanwhile starts the build itself, and the background does not build the same file again."""

    async def scenario() -> None:
        server = _Server(SyncLimits(state_sync_after=1))
        async with server as service:
            await server.write(3)
            real = service._sees_more_than
            entered, release = asyncio.Event(), asyncio.Event()
            calls = 0

            async def first_held(*args: Any) -> bool:
                nonlocal calls
                calls += 1
                if calls == 1:  # the background's look
                    entered.set()
                    await release.wait()
                return await real(*args)

            service._sees_more_than = first_held  # type: ignore[method-assign]
            snapshots = Snapshots(service, OriginPolicy(None))
            app = Starlette(routes=[Route("/sync/snapshot", snapshots.endpoint, methods=["POST"])])
            snapshots.start()
            try:
                await asyncio.wait_for(entered.wait(), 30)
                async with httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://test"
                ) as http:
                    answer = await http.post("/sync/snapshot", json=_open_body())
                assert answer.status_code == 200 and service.counters["snapshots_built"] == 1
                release.set()
                for _ in range(20):  # (the background's decision runs without awaiting anything)
                    await asyncio.sleep(0)
                assert service.counters["snapshots_built"] == 1 and not snapshots._same
                assert service.counters["snapshots_prepared"] == 0
            finally:
                await snapshots.stop()

    asyncio.run(scenario())


def test_a_failed_read_does_not_end_the_preparation() -> None:
    """A store read failing as the background looks at the log (a lost database connection) is logged and
    tried again later; the open scope is still prepared."""

    async def scenario() -> None:
        server = _Server(SyncLimits(state_sync_after=1, snapshot_prepare_every=0.01))
        async with server as service:
            await server.write(3)
            real = service._sees_more_than
            failed = 0

            async def fails_once(*args: Any) -> bool:
                nonlocal failed
                if not failed:
                    failed += 1
                    raise ConnectionError("the database went away")
                return await real(*args)

            service._sees_more_than = fails_once  # type: ignore[method-assign]
            snapshots = Snapshots(service, OriginPolicy(None), quiet=0.05)
            snapshots.start()
            try:
                await _until(lambda: service.counters["snapshots_prepared"] == 1)
                assert failed == 1
            finally:
                await snapshots.stop()

    asyncio.run(scenario())
