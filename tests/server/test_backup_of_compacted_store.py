"""A backup of a compacted store restores it whole (server_runtime.backup, server_runtime.stores.compaction).

Compaction deletes operations already folded into the record rows, so the operations kept no longer rebuild
the records: the backup carries the compacted records' states, and a server restored from it (another store
kind: SQLite into PostgreSQL and back, memory into memory) holds the same rows, the same numbers of deleted
operations (a resent compacted operation is a repeat) and sends fresh clients the same records. An export of
a compacted store made before the states existed is refused unless ``?legacy=1`` accepts its loss.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from offline.core.errors import OfflineError
from server_runtime import create_relational_server_store
from server_runtime.stores import MemoryServerStore, ServerStore
from server_runtime.stores.base import RecordRow, StoredOperation
from tests.server.test_backup import backup_mac, fill, fresh_client_records, import_backup, lines_of, snapshot
from tests.server.test_operational import (
    ADMIN,
    ALL_TOKENS,
    BACKUP,
    TIMEOUT,
    bearer,
    client,
    serve,
    shutdown,
    sync_url,
    wait_for,
)

# (store the backup is taken from, store it is restored into)
PAIRS = [("sqlite", "postgresql"), ("postgresql", "sqlite"), ("memory", "memory")]


def store_maker(kind: str, request: pytest.FixtureRequest) -> Callable[[], Any]:
    """An async factory of a fresh store of ``kind`` (None: ``serve``'s SQLite file)."""
    # Outside the event loop: the fixture creates its schema with asyncio.run.
    url = request.getfixturevalue("postgres_url") if kind == "postgresql" else None

    async def make() -> ServerStore | None:
        if kind == "memory":
            return MemoryServerStore()
        if url is not None:
            return await create_relational_server_store(url)
        return None

    return make


async def export(http: httpx.AsyncClient, url: str | None) -> bytes:
    response = await http.post(f"{url}/__offline/backup/export", headers=bearer(BACKUP))
    assert response.status_code == 200, response.text
    return response.content


async def compact(http: httpx.AsyncClient, url: str | None) -> dict[str, Any]:
    response = await http.post(f"{url}/__offline/compact", headers=bearer(ADMIN))
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def rows_of(store: ServerStore) -> dict[tuple[str, str], RecordRow]:
    return {row.key: row async for row in store.load_all_rows()}


async def compacted_then_written(
    folder: Path, url: str, http: httpx.AsyncClient, server_url: str | None
) -> None:
    """Compact what ``fill`` wrote, then write after the horizon (to a compacted record and a new one)."""
    done = await compact(http, server_url)
    assert done["dropped"] > 0
    late = client(folder, "late", url)
    try:
        await late.sync.connect()
        await late.sync.wait_until_synced(TIMEOUT)
        edited = next(r for r in late.items.all().fetch() if r["title"] in ("a's edit", "b's edit"))
        late.items.update(edited["id"], {"title": "after compaction"})
        late.items.insert({"title": "new after compaction", "count": 1})
        await late.sync.wait_until_synced(TIMEOUT)
    finally:
        await shutdown(late)


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_a_compacted_store_restores_whole(
    tmp_path: Path, request: pytest.FixtureRequest, source: str, target: str
) -> None:
    make_source, make_target = store_maker(source, request), store_maker(target, request)

    async def scenario() -> None:
        async with (
            serve(tmp_path, auth=ALL_TOKENS, store=await make_source(), name="old") as old,
            httpx.AsyncClient(timeout=30) as http,
        ):
            await fill(tmp_path, sync_url(old))
            before = await export(http, old.url)  # every operation, before compaction
            await compacted_then_written(tmp_path, sync_url(old), http, old.url)
            body = await export(http, old.url)
            parsed = lines_of(body)
            manifest, tail = parsed[0], parsed[-1]
            states = [line for line in parsed if line["type"] == "state"]
            (compaction,) = [line for line in parsed if line["type"] == "compaction"]
            assert manifest["compactionHorizon"] == compaction["horizon"] > 0
            assert states and tail["states"] == len(states)
            assert tail["hmac"] == backup_mac(BACKUP, body[: body.rindex(b"\n", 0, -1) + 1])
            expected = await fresh_client_records(tmp_path, old, "reader-old")
            assert any(r["title"] == "after compaction" for r in expected["items"])

            async with serve(tmp_path, auth=ALL_TOKENS, store=await make_target(), name="new") as new:
                answer = await import_backup(http, new, body)
                assert answer.status_code == 200, answer.text
                assert answer.json()["states"] == len(states) and answer.json()["refused"] == {}

                # The same rows, the same numbers of deleted operations, a horizon clients catch up to.
                old_rows, new_rows = await rows_of(old.store), await rows_of(new.store)
                assert new_rows == old_rows
                keys = list(old_rows)
                assert await new.store.record_versions(keys) == await old.store.record_versions(keys)
                assert (await new.store.compacted_history())[1] == (await old.store.compacted_history())[1]
                assert await new.store.compaction_horizon() > 0

                # A fresh client catches up from the restored server (record states, then the log).
                assert await fresh_client_records(tmp_path, new, "reader-new") == expected

                # Every operation ever stored, deleted ones included, is a repeat on the restored server.
                again = await import_backup(http, new, before)
                assert again.status_code == 200, again.text
                assert again.json()["imported"] == 0 and again.json()["refused"] == {}
                assert await rows_of(new.store) == old_rows

                # A compacted store's file restores only into an empty server.
                twice = await import_backup(http, new, body)
                assert twice.status_code == 409
                assert twice.json()["error"] == "BACKUP_NOT_EMPTY"

    asyncio.run(scenario())


def test_state_lines_are_signed_and_an_older_backup_of_a_compacted_store_is_refused_unless_legacy(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path, auth=ALL_TOKENS, name="old") as old,
            httpx.AsyncClient(timeout=30) as http,
        ):
            await fill(tmp_path, sync_url(old))
            await compact(http, old.url)
            body = await export(http, old.url)
            lines = body.splitlines(keepends=True)
            # A state line is covered by the HMAC like any other; one signed but unreadable is refused too.
            at = next(i for i, line in enumerate(lines) if line.startswith(b'{"type":"state"'))
            state = json.loads(lines[at])
            altered = [*lines[:at], (json.dumps({**state, "record": {"title": "forged"}}) + "\n").encode()]
            altered += lines[at + 1 :]
            unreadable = [*lines[:at], (json.dumps({**state, "state": "not a state"}) + "\n").encode()]
            unreadable += lines[at + 1 : -1]
            resigned = json.dumps({**json.loads(lines[-1]), "hmac": backup_mac(BACKUP, b"".join(unreadable))})
            unreadable.append((resigned + "\n").encode())
            # As an older server exported it: no state or compaction lines, signed with the same secret.
            kept = [line for line in lines[:-1] if json.loads(line)["type"] not in ("state", "compaction")]
            tail = {k: v for k, v in json.loads(lines[-1]).items() if k != "states"}
            tail["hmac"] = backup_mac(BACKUP, b"".join(kept))
            older = b"".join(kept) + (json.dumps(tail) + "\n").encode()

            async with serve(tmp_path, auth=ALL_TOKENS, name="new") as new:
                forged = await import_backup(http, new, b"".join(altered))
                assert forged.json()["error"] == "BACKUP_HMAC_MISMATCH"
                bad = await import_backup(http, new, b"".join(unreadable))
                assert (bad.status_code, bad.json()["error"]) == (400, "BACKUP_INVALID")
                assert (
                    "state of items/" in bad.json()["message"] or "state of todos/" in bad.json()["message"]
                )

                refused = await import_backup(http, new, older)
                assert refused.status_code == 400
                answer = refused.json()
                assert answer["error"] == "BACKUP_INCOMPLETE"
                assert "legacy=1" in answer["message"] and "compacted" in answer["message"]
                assert (await new.store.stats())["operations"] == 0

                accepted = await http.post(
                    f"{new.url}/__offline/backup/import?legacy=1",
                    content=older,
                    headers={**bearer(BACKUP), "Content-Type": "application/x-ndjson"},
                )
                assert accepted.status_code == 200, accepted.text
                assert accepted.json()["imported"] == tail["operations"]

    asyncio.run(scenario())


class _CompactsWhileExporting(MemoryServerStore):
    """Compacts after the backup read its first operation, then reads the log on from there, as the SQL
    stores' pages do: the operations compaction deleted meanwhile are not in the file."""

    async def export_operations(self) -> AsyncIterator[StoredOperation]:
        (first,) = await self.operations_since(0, 1)
        yield first
        await self.compact()
        for stored in await self.operations_since(first.delivery):
            yield stored


def test_a_compaction_during_an_export_still_gives_a_complete_backup(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path, auth=ALL_TOKENS, store=_CompactsWhileExporting(), name="old") as old,
            httpx.AsyncClient(timeout=30) as http,
        ):
            await fill(tmp_path, sync_url(old))
            body = await export(http, old.url)
            manifest, tail = json.loads(body.splitlines()[0]), json.loads(body.splitlines()[-1])
            assert manifest["compactionHorizon"] == 0 and tail["states"] > 0  # compacted after it began
            async with serve(tmp_path, auth=ALL_TOKENS, store=MemoryServerStore(), name="new") as new:
                answer = await import_backup(http, new, body)
                assert answer.status_code == 200, answer.text
                assert await rows_of(new.store) == await rows_of(old.store)

    asyncio.run(scenario())


@pytest.mark.parametrize("target", ["sqlite", "postgresql"])
def test_a_device_synced_before_the_backup_resumes_against_the_restored_server_and_misses_nothing(
    tmp_path: Path, request: pytest.FixtureRequest, target: str
) -> None:
    """The restored server numbers its deliveries anew (the kept operations from 1, then new writes): a
    device whose watermark counts the original server's numbers must not resume from it there, or it skips
    every new write numbered at or below it. It is sent everything in its scope again (record states)."""
    make_target = store_maker(target, request)

    async def scenario() -> None:
        async with (
            serve(tmp_path, auth=ALL_TOKENS, name="old") as old,
            httpx.AsyncClient(timeout=30) as http,
        ):
            await fill(tmp_path, sync_url(old))
            await compacted_then_written(tmp_path, sync_url(old), http, old.url)
            device = client(tmp_path, "device", sync_url(old))
            try:
                await device.sync.connect()
                await device.sync.wait_until_synced(TIMEOUT)
            finally:
                await shutdown(device)
            body = await export(http, old.url)
            original = await old.store.max_delivery()

            async with serve(tmp_path, auth=ALL_TOKENS, store=await make_target(), name="new") as new:
                answer = await import_backup(http, new, body)
                assert answer.status_code == 200, answer.text
                other = client(tmp_path, "other", sync_url(new))
                try:
                    await other.sync.connect()
                    written = [
                        other.items.insert({"title": f"after restore {i}", "count": i}) for i in range(3)
                    ]
                    await other.sync.wait_until_synced(TIMEOUT)
                finally:
                    await shutdown(other)
                # The case at stake: the restored server numbered those writes within the old watermark.
                assert await new.store.max_delivery() <= original

                resumed = client(tmp_path, "device", sync_url(new))  # the same replica file, the new server
                try:
                    await resumed.sync.connect()
                    await resumed.sync.wait_until_synced(TIMEOUT)
                    titles = {r["title"] for r in resumed.items.all().fetch()}
                    assert {r["title"] for r in written} <= titles
                    assert snapshot(resumed) == await fresh_client_records(tmp_path, new, "reader")
                finally:
                    await shutdown(resumed)

    asyncio.run(scenario())


def test_a_device_that_compacted_what_a_restored_server_lost_stops_with_a_clear_error(tmp_path: Path) -> None:
    """The server is restored from a backup older than writes it acknowledged; the device that wrote them
    compacted them away, so it cannot send them again. It says so (``COMPACTED_OPERATIONS_LOST``), stops
    syncing and keeps its records as they are. A device that kept them in its log sends them again (its own
    and the ones it received), after which the first device syncs again."""

    async def scenario() -> None:
        async with (
            serve(tmp_path, auth=ALL_TOKENS, name="old") as old,
            httpx.AsyncClient(timeout=30) as http,
        ):
            device = client(tmp_path, "device", sync_url(old))
            keeper = client(tmp_path, "keeper", sync_url(old))
            try:
                await device.sync.connect()
                await keeper.sync.connect()
                device.items.insert({"title": "in the backup", "count": 1})
                await device.sync.wait_until_synced(TIMEOUT)
                older = await export(http, old.url)
                device.items.insert({"title": "after the backup", "count": 2})
                keeper.items.insert({"title": "kept in the log", "count": 3})
                await device.sync.wait_until_synced(TIMEOUT)
                await keeper.sync.wait_until_synced(TIMEOUT)
                await wait_for(lambda: len(keeper.items.all().fetch()) == 3, "the keeper holds every write")
                assert device.compact() > 0
                held = snapshot(device)
            finally:
                await shutdown(device, keeper)

            async with serve(tmp_path, auth=ALL_TOKENS, name="restored") as restored:
                answer = await import_backup(http, restored, older)
                assert answer.status_code == 200, answer.text
                resumed = client(tmp_path, "device", sync_url(restored))
                try:
                    with pytest.raises(OfflineError) as info:
                        await resumed.sync.connect()
                    assert info.value.code == "COMPACTED_OPERATIONS_LOST"
                    assert "older backup" in info.value.message and "compacted" in info.value.message
                    assert resumed.sync.status == "error"
                    assert snapshot(resumed) == held  # nothing on the device was touched
                    titles = {
                        r["title"] for r in (await fresh_client_records(tmp_path, restored, "r1"))["items"]
                    }
                    assert titles == {"in the backup"}

                    keeper = client(tmp_path, "keeper", sync_url(restored))
                    try:
                        await keeper.sync.connect()
                        await keeper.sync.wait_until_synced(TIMEOUT)
                    finally:
                        await shutdown(keeper)
                    await resumed.sync.connect()
                    await resumed.sync.wait_until_synced(TIMEOUT)
                    assert snapshot(resumed) == held == await fresh_client_records(tmp_path, restored, "r2")
                finally:
                    await shutdown(resumed)

    asyncio.run(scenario())
