"""Devices whose clocks are wrong lose nothing (issue: a slow device dropped every relayed operation, a fast
one lost its offline writes). Real server processes, real WebSockets (see test_integration's helpers).

A device learns the server's time at each handshake (``app.sync.clock_offset_ms``) and stamps new
operations by it; what it receives is applied whatever its own clock says; what it wrote before it knew,
refused by the server as ``CLOCK_DRIFT``, is written again under the corrected clock, in order.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from offline import create_app, op
from offline.core.hlc import MAX_DRIFT_MS
from offline.core.operations import Operation
from offline.store import App
from offline.store.database import PENDING, REJECTED
from offline.store.replication import delivery_watermark
from tests.sync.test_integration import (
    FAST,
    GENERAL,
    TIMEOUT,
    Backend,
    clients,
    collect,
    converge,
    log_rows,
    wait_for,
)

SLOW_MS = -600_000  # ten minutes behind
FAST_MS = 360_000  # six minutes ahead: past the server's five-minute limit


def last_write(app: App) -> Operation:
    """This replica's latest local operation (by sequence number; `operations()` is in causal order)."""
    return max((o for o in app.operations() if o.node_id == app.node_id), key=lambda o: o.sequence_number)


def time_ms() -> int:
    return time.time_ns() // 1_000_000


def device(tmp_path: Path, name: str, url: str, skew_ms: int = 0, **options: Any) -> App:
    """A client app whose clock reads ``skew_ms`` away from the real time."""
    return create_app(
        GENERAL,
        sync={"url": url, **FAST, **options},
        path=str(tmp_path / f"{name}.db"),
        now=lambda: time_ms() + skew_ms,
    )


def titles(app: App) -> list[str]:
    return sorted(r["title"] for r in app.items.all().fetch())


def test_a_slow_device_applies_what_it_receives_and_acknowledges_only_that(
    server_backend: Backend, tmp_path: Path
) -> None:
    server = server_backend.server()

    async def scenario() -> None:
        other = device(tmp_path, "other", server.sync_url)
        slow = device(tmp_path, "slow", server.sync_url, SLOW_MS)
        async with clients(other, slow):
            await slow.sync.connect()
            await other.sync.connect()
            assert abs(slow.sync.clock_offset_ms + SLOW_MS) < 30_000  # learnt at the handshake
            assert slow.sync.describe()["clockOffsetMs"] == slow.sync.clock_offset_ms
            for i in range(14):
                other.items.insert({"title": f"o{i}"})
            await converge(other, slow)
            assert titles(slow) == sorted(f"o{i}" for i in range(14))
            assert slow.sync.apply_error is None

            # Its own writes are stamped by the server's clock: they order among the others' writes.
            mine = slow.items.insert({"title": "slow"})
            stamp = last_write(slow).timestamp.wall_time
            assert abs(stamp - time_ms()) < 30_000, (stamp, time_ms())
            # Offline, then back: it still receives everything written meanwhile, and sends its writes.
            await slow.sync.disconnect()
            slow.items.update(mine["id"], {"title": "slow, offline"})
            for i in range(14, 20):
                other.items.insert({"title": f"o{i}"})
            await slow.sync.connect()
            state = await converge(other, slow)
            assert len(state["items"]) == 21
            assert "slow, offline" in titles(other)
            assert slow.sync.rejected() == []

    asyncio.run(scenario())


def test_a_fast_devices_offline_writes_are_restamped_and_accepted(
    server_backend: Backend, tmp_path: Path
) -> None:
    server = server_backend.server()

    async def scenario() -> None:
        other = device(tmp_path, "other", server.sync_url)
        fast = device(tmp_path, "fast", server.sync_url, FAST_MS)
        async with clients(other, fast):
            await other.sync.connect()
            # Written before the device ever talked to the server: stamped six minutes ahead.
            first = fast.items.insert({"title": "fast 1", "count": 1})
            fast.items.update(first["id"], {"title": "fast 1, edited", "count": op.increment(2)})
            second = fast.items.insert({"title": "fast 2", "tags": ["x"]})
            assert all(o.timestamp.wall_time > time_ms() + MAX_DRIFT_MS for o in fast.operations())
            received = collect(other, "sync:received")
            await fast.sync.connect()
            assert abs(fast.sync.clock_offset_ms + FAST_MS) < 30_000
            other.items.insert({"title": "other"})
            state = await converge(other, fast)
            assert {r["title"]: r["count"] for r in state["items"]} == {
                "fast 1, edited": 3,
                "fast 2": 0,
                "other": 0,
            }
            assert fast.items.find_by_id(second["id"])["tags"] == ["x"]
            assert fast.sync.rejected() == []  # nothing for the user to recover: it all went through
            # The refused originals are out of the operation set; their writes went again, in order.
            statuses = sorted(st for _, node, st in log_rows(fast) if node == fast.node_id)
            assert statuses.count(REJECTED) == 3 and PENDING not in statuses
            arrived = [o for event in received for o in event["operations"] if o.node_id == fast.node_id]
            assert [o.type for o in arrived] == ["insert", "update", "insert"]
            assert all(o.timestamp.wall_time < time_ms() + MAX_DRIFT_MS for o in arrived)

            # A restart keeps the offset: writes made offline afterwards are stamped right at once.
            await fast.sync.disconnect()
            fast.close()
            fast = device(tmp_path, "fast", server.sync_url, FAST_MS)
            async with clients(fast):
                assert abs(fast.clock_offset_ms + FAST_MS) < 30_000
                fast.items.insert({"title": "after restart"})
                assert last_write(fast).timestamp.wall_time < time_ms() + 30_000
                await fast.sync.connect()
                state = await converge(other, fast)
                assert len(state["items"]) == 4
                statuses = sorted(st for _, node, st in log_rows(fast) if node == fast.node_id)
                assert statuses.count(REJECTED) == 3  # nothing more was refused

    asyncio.run(scenario())


def test_slow_and_fast_devices_writing_offline_lose_nothing(server_backend: Backend, tmp_path: Path) -> None:
    """The issue's two devices together with a third on time: every write everywhere, every replica equal."""
    server = server_backend.server()

    async def scenario() -> None:
        exact = device(tmp_path, "exact", server.sync_url)
        slow = device(tmp_path, "slow", server.sync_url, SLOW_MS)
        fast = device(tmp_path, "fast", server.sync_url, FAST_MS)
        async with clients(exact, slow, fast):
            shared = exact.items.insert({"title": "shared"})
            await exact.sync.connect()
            await slow.sync.connect()
            await fast.sync.connect()
            await converge(exact, slow, fast)
            for app in (exact, slow, fast):
                await app.sync.disconnect()
            expected: set[str] = {"shared"}
            for name, app in (("exact", exact), ("slow", slow), ("fast", fast)):
                for i in range(5):
                    app.items.insert({"title": f"{name} {i}"})
                    expected.add(f"{name} {i}")
                app.items.update(shared["id"], {"count": op.increment(1)})
            for app in (slow, fast, exact):
                await app.sync.connect()
            state = await converge(exact, slow, fast)
            assert {r["title"] for r in state["items"]} == expected
            assert next(r for r in state["items"] if r["id"] == shared["id"])["count"] == 3
            for app in (exact, slow, fast):
                assert app.sync.rejected() == []
                assert app.sync.apply_error is None

    asyncio.run(scenario())


def test_wait_until_synced_reports_a_watermark_only_for_applied_operations(
    server_backend: Backend, tmp_path: Path
) -> None:
    """The issue's reproduction: 14 relayed operations to a device 10 minutes slow are all stored before the
    watermark says 14, and the status says connected only then."""
    server = server_backend.server()

    async def scenario() -> None:
        other = device(tmp_path, "other", server.sync_url)
        slow = device(tmp_path, "slow", server.sync_url, SLOW_MS)
        async with clients(other, slow):
            await other.sync.connect()
            for i in range(14):
                other.items.insert({"title": f"o{i}"})
            await other.sync.wait_until_synced(TIMEOUT)
            await slow.sync.connect()
            await slow.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: slow.items.count() == 14, lambda: f"{slow.items.count()} items")
            assert delivery_watermark(slow) >= 14
            assert len(slow.operations()) == 14

    asyncio.run(scenario())
