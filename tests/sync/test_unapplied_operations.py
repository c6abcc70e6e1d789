"""A received operation this replica cannot store is never acknowledged (real server process).

Here the device's schema lacks a collection the server has: the operation for it cannot be held. Everything
before it is stored, the watermark stays before it, the status and a `sync:apply-failed` event name it,
`wait_until_synced()` does not report synced, and once the app can hold it (a schema with the collection)
the next session delivers it and everything after it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from offline import OfflineError, create_app
from offline.store.replication import delivery_watermark
from tests.support.servers import schema_from_source
from tests.sync.test_integration import (
    FAST,
    GENERAL,
    GENERAL_SOURCE,
    TIMEOUT,
    Backend,
    client,
    clients,
    collect,
    converge,
    wait_for,
)

# The same version without the notes collection: a device built from an older source.
ITEMS_ONLY = schema_from_source(
    GENERAL_SOURCE.replace('"notes": {"fields": {"body": t.string(), "rank": t.number().optional()}},', "")
)
assert "notes" not in ITEMS_ONLY.collections and ITEMS_ONLY.version == GENERAL.version


def test_an_operation_that_cannot_be_stored_is_not_acknowledged_until_it_can(
    memory_backend: Backend, tmp_path: Path
) -> None:
    server = memory_backend.server()
    path = str(tmp_path / "device.db")

    async def scenario() -> None:
        writer = client(tmp_path, "writer", server.sync_url)
        device = create_app(ITEMS_ONLY, sync={"url": server.sync_url, **FAST}, path=path)
        failures = collect(device, "sync:apply-failed")
        async with clients(writer, device):
            await writer.sync.connect()
            writer.items.insert({"title": "before"})
            await writer.sync.wait_until_synced(TIMEOUT)
            await device.sync.connect()
            await device.sync.wait_until_synced(TIMEOUT)
            before = delivery_watermark(device)

            note = writer.notes.insert({"body": "a note"})
            writer.items.insert({"title": "after"})
            await writer.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: bool(failures), "a sync:apply-failed event")
            failure = failures[0]
            assert (failure["collection"], failure["recordId"]) == ("notes", note["id"])
            assert failure["code"] == "INVALID_OPERATION" and "notes" in failure["message"]
            assert device.sync.apply_error is not None
            assert device.sync.apply_error["recordId"] == note["id"]
            assert device.sync.describe()["applyError"]["operationId"] == failure["operationId"]
            # Nothing past the note is acknowledged: the watermark stays, what came after is not claimed.
            assert delivery_watermark(device) == before
            assert [r["title"] for r in device.items.all().fetch()] == ["before"]
            with pytest.raises(OfflineError) as info:
                await device.sync.wait_until_synced(1.0)
            assert note["id"] in str(info.value) or failure["operationId"] in str(info.value)
            # Retried by the next sessions, refused the same way each time (the backoff grows).
            await wait_for(lambda: len(failures) >= 2, "a second attempt")
            assert delivery_watermark(device) == before
            await device.sync.disconnect()
            device.close()

            # The fix: the app is rebuilt with the collection. The next session stores the note and what
            # followed it.
            fixed = create_app(GENERAL, sync={"url": server.sync_url, **FAST}, path=path)
            async with clients(fixed):
                await fixed.sync.connect()
                state = await converge(writer, fixed)
                assert [r["body"] for r in state["notes"]] == ["a note"]
                assert sorted(r["title"] for r in state["items"]) == ["after", "before"]
                assert fixed.sync.apply_error is None
                assert delivery_watermark(fixed) > before

    asyncio.run(scenario())
