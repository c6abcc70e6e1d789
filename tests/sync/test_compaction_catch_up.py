"""State-based catch-up after a server compaction, end to end: real server processes (memory, SQLite,
PostgreSQL stores), real WebSocket clients.

A client offline across a compaction, with offline writes of its own to the records compacted (every
strategy: last-writer-wins, counter, add-wins array, resolver, rich text, state machine), is sent the
records' states instead of the deleted operations, folds its own writes on top once, and converges with the
client that stayed online; a fresh client gets the states too. Rows, live queries and events show them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from offline import op
from offline.store.replication import delivery_watermark
from tests.merge._support import SCHEMA
from tests.sync.test_integration import (
    SCOPED,
    SCOPED_SOURCE,
    TIMEOUT,
    Backend,
    client,
    clients,
    collect,
    converge,
    wait_for,
)

ADMIN = "admin-token-for-state-catch-up"
ENTRY = "from tests.merge._support import SCHEMA as schema\n"


async def compact(url: str) -> dict[str, Any]:
    def post() -> dict[str, Any]:
        response = httpx.post(
            f"{url}/__offline/compact", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=TIMEOUT
        )
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    return await asyncio.to_thread(post)


def test_a_client_offline_across_a_compaction_converges(server_backend: Backend, tmp_path: Path) -> None:
    server = server_backend.server(ENTRY, name="strategies", env={"OFFLINE_ADMIN_TOKEN": ADMIN})

    async def scenario() -> None:
        online = client(tmp_path, "online", server.sync_url, SCHEMA)
        offline = client(tmp_path, "offline", server.sync_url, SCHEMA)
        async with clients(online, offline):
            await online.sync.connect()
            await offline.sync.connect()
            shared = online.items.insert(
                {"title": "start", "count": 10, "tags": ["x", "y"], "notes": "n1", "body": "hello"}
            )
            online.items.update(shared["id"], {"status": "doing", "count": op.increment(1)})
            await converge(online, offline)
            await offline.sync.disconnect()

            # Offline: writes of its own to the record the server is about to compact.
            offline.items.update(
                shared["id"],
                {"count": op.increment(5), "tags": op.append("offline"), "notes": "n2", "title": "offline"},
            )
            offline.items.richtext(shared["id"], "body").insert(0, "B:")
            offline.items.update(shared["id"], {"tags": op.remove("y")})
            mine = offline.items.insert({"title": "made offline", "count": 1})

            # Online, meanwhile: a long history, then a compaction, then more.
            for _ in range(30):
                online.items.update(shared["id"], {"count": op.increment(1)})
            online.items.update(shared["id"], {"tags": op.append("online"), "status": "done", "notes": "n3"})
            online.items.richtext(shared["id"], "body").insert(5, " world")
            other = online.items.insert({"title": "other", "count": 2})
            online.items.delete(other["id"])
            await online.sync.wait_until_synced(TIMEOUT)
            result = await compact(server.http_url)
            assert result["dropped"] > 30, result
            online.items.update(shared["id"], {"count": op.increment(100)})
            await online.sync.wait_until_synced(TIMEOUT)
            assert delivery_watermark(offline) < result["horizon"]

            received = collect(offline, "sync:states")
            seen: list[list[dict[str, Any]]] = []
            offline.items.all().subscribe(seen.append)
            await offline.sync.connect()
            records = await converge(online, offline)

            [record] = [r for r in records["items"] if r["id"] == shared["id"]]
            assert record["count"] == 10 + 1 + 5 + 30 + 100  # each write folded exactly once
            assert sorted(record["tags"]) == ["offline", "online", "x"]
            assert record["status"] == "done"
            assert record["body"].startswith("B:") and "world" in record["body"]
            assert record["notes"] == "n2|n3"  # the resolver's sorted union of the concurrent writes
            assert {r["id"] for r in records["items"]} == {shared["id"], mine["id"]}
            assert received, "no sync:states event"
            assert delivery_watermark(offline) >= result["horizon"]
            assert sorted(seen[-1], key=lambda r: r["id"]) == records["items"]

            # A client that never synced, after the compaction: the states, then the rest.
            fresh = client(tmp_path, "fresh", server.sync_url, SCHEMA)
            async with clients(fresh):
                await fresh.sync.connect()
                assert await converge(online, offline, fresh) == records

    asyncio.run(scenario())


def test_scoped_sessions_get_the_states_of_their_scope_and_of_records_moving_in(
    server_backend: Backend, tmp_path: Path
) -> None:
    """After a compaction, a fresh device of user A is sent the states of A's records only (found through the
    scope index); a record of B whose history was compacted, given to A afterwards, reaches A whole."""
    server = server_backend.server(SCOPED_SOURCE, "scoped", env={"OFFLINE_ADMIN_TOKEN": ADMIN})

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
        a = client(tmp_path, "a", server.sync_url, schema=SCOPED, scope={"userId": "a"})
        later = client(tmp_path, "a-later", server.sync_url, schema=SCOPED, scope={"userId": "a"})
        async with clients(admin, a, later):
            await admin.sync.connect()
            await a.sync.connect()
            mine = [admin.todos.insert({"ownerId": "a", "title": f"a{i}"}) for i in range(3)]
            theirs = admin.todos.insert({"ownerId": "b", "title": "b0"})
            for version in range(5):
                admin.todos.update(mine[0]["id"], {"title": f"a0 v{version}"})
                admin.todos.update(theirs["id"], {"title": f"b0 v{version}"})
            await admin.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: len(a.todos.fetch()) == 3, "A has its records")
            await a.sync.disconnect()
            admin.todos.update(mine[2]["id"], {"ownerId": "b"})  # moved away while A is offline
            await admin.sync.wait_until_synced(TIMEOUT)
            result = await compact(server.http_url)
            assert result["dropped"] >= 8, result
            await a.sync.connect()
            await wait_for(lambda: a.todos.find_by_id(mine[2]["id"]) is None, "A drops what left its scope")
            assert len(a.todos.fetch()) == 2

            states = collect(later, "sync:states")
            await later.sync.connect()
            await later.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: later.todos.fetch() == a.todos.fetch(), "the later device has A's records")
            assert {r["recordId"] for e in states for r in e["records"]} <= {m["id"] for m in mine}
            assert {r["id"] for r in later.todos.fetch()} == {m["id"] for m in mine[:2]}

            admin.todos.update(theirs["id"], {"ownerId": "a"})  # B's compacted record moves to A
            whole = {**theirs, "ownerId": "a", "title": "b0 v4"}
            for app in (a, later):
                await wait_for(
                    lambda app=app: app.todos.find_by_id(theirs["id"]) == whole,  # type: ignore[misc]
                    lambda app=app: f"it arrives whole: {app.todos.find_by_id(theirs['id'])}",  # type: ignore[misc]
                )
            admin.todos.update(theirs["id"], {"title": "after the move"})
            await wait_for(
                lambda: (later.todos.find_by_id(theirs["id"]) or {}).get("title") == "after the move",
                "later writes follow",
            )

    asyncio.run(scenario())


def test_a_record_that_left_the_scope_before_later_edits_and_a_compaction_leaves_the_offline_device(
    server_backend: Backend, tmp_path: Path
) -> None:
    """The operation that moved a record out of A's scope is not the record's latest (it was edited after,
    and moved on again): a compaction deletes it. A, offline across all of it, must still drop the record."""
    server = server_backend.server(SCOPED_SOURCE, "scoped", env={"OFFLINE_ADMIN_TOKEN": ADMIN})

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
        a = client(tmp_path, "a", server.sync_url, schema=SCOPED, scope={"userId": "a"})
        async with clients(admin, a):
            await admin.sync.connect()
            await a.sync.connect()
            mine = [admin.todos.insert({"ownerId": "a", "title": f"a{i}"}) for i in range(3)]
            await admin.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: len(a.todos.fetch()) == 3, "A has its records")
            await a.sync.disconnect()
            admin.todos.update(mine[1]["id"], {"ownerId": "b"})  # out of A's scope, then edited in B's
            admin.todos.update(mine[1]["id"], {"title": "b's now"})
            admin.todos.update(mine[2]["id"], {"ownerId": "b"})  # out, on to C, then edited there
            admin.todos.update(mine[2]["id"], {"ownerId": "c"})
            admin.todos.update(mine[2]["id"], {"title": "c's now"})
            await admin.sync.wait_until_synced(TIMEOUT)
            result = await compact(server.http_url)
            assert result["dropped"] >= 2, result  # the inserts of the records moved away, at least
            await a.sync.connect()
            await a.sync.wait_until_synced(TIMEOUT)
            await wait_for(
                lambda: {r["id"] for r in a.todos.fetch()} == {mine[0]["id"]},
                lambda: f"A drops what left its scope: {a.todos.fetch()}",
            )

    asyncio.run(scenario())
