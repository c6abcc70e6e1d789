"""Writes the server refuses stay recoverable on the device (real server process).

The device's schema has a field the server's lacks, so the server refuses its notes that set it
(`INVALID_OPERATION`): the record then shows the server's state (none), `app.sync.rejected()` lists the write
with the record as the device wrote it, across restarts, until `retry` or `discard`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from offline import create_app
from offline.store import App
from tests.support.servers import schema_from_source
from tests.sync.test_integration import (
    FAST,
    GENERAL_SOURCE,
    TIMEOUT,
    Backend,
    client,
    clients,
    collect,
    wait_for,
)

WITH_COLOR = schema_from_source(
    GENERAL_SOURCE.replace(
        '"rank": t.number().optional()}', '"rank": t.number().optional(), "color": t.string().optional()}'
    )
)
assert "color" in WITH_COLOR.collections["notes"].fields


async def synced(*apps: App) -> None:
    """(Not `converge`: the device's records have a field the others lack.)"""
    for app in apps:
        await app.sync.wait_until_synced(TIMEOUT)


def test_refused_writes_are_listed_kept_across_restarts_and_can_be_retried_or_discarded(
    memory_backend: Backend, tmp_path: Path
) -> None:
    server = memory_backend.server()
    path = str(tmp_path / "device.db")

    async def scenario() -> None:
        other = client(tmp_path, "other", server.sync_url)
        device = create_app(WITH_COLOR, sync={"url": server.sync_url, **FAST}, path=path)
        events = collect(device, "sync:rejected")
        async with clients(other):
            kept = device.notes.insert({"body": "plain"})
            refused = device.notes.insert({"body": "colored", "color": "red"})
            await other.sync.connect()
            await device.sync.connect()
            await wait_for(lambda: len(events) == 1, lambda: f"{len(events)} sync:rejected events")
            await synced(other, device)
            assert [r["body"] for r in other.notes.all().fetch()] == ["plain"]
            assert [r["body"] for r in device.notes.all().fetch()] == ["plain"]
            assert device.notes.find_by_id(refused["id"]) is None
            assert device.notes.find_by_id(kept["id"]) is not None
            [entry] = device.sync.rejected()
            assert entry["recordId"] == refused["id"] and entry["collection"] == "notes"
            assert entry["code"] == "INVALID_OPERATION" and "color" in entry["message"]
            assert entry["data"] == refused
            assert {k: events[0][k] for k in entry} == entry
            assert device.sync.describe()["rejected"] == 1
            await device.sync.disconnect()
            device.close()

            again = create_app(WITH_COLOR, sync={"url": server.sync_url, **FAST}, path=path)
            async with clients(again):
                assert again.sync.rejected() == [entry]
                events = collect(again, "sync:rejected")
                await again.sync.connect()
                # Retried as written: a new operation, refused again for the same reason.
                retried = again.sync.retry(entry["operationId"])
                assert retried is not None and retried["color"] == "red"
                await wait_for(lambda: len(events) == 1, "the retry refused")
                [second] = again.sync.rejected()
                assert second["operationId"] != entry["operationId"]
                assert second["data"]["color"] == "red" and second["recordId"] == refused["id"]
                assert again.sync.discard(second["operationId"]) is True
                assert again.sync.rejected() == []
                await synced(other, again)
                assert again.notes.find_by_id(refused["id"]) is None

    asyncio.run(scenario())
