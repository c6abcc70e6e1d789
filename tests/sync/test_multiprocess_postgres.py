"""Two server processes on one PostgreSQL database: each relays what the other committed (LISTEN/NOTIFY), so a
client on one process and a client on the other converge (DESIGN.md section 4, last bullet)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from offline import op
from offline.store import App
from offline.store.replication import delivery_watermark
from tests.support.servers import ServerProcess, write_entry
from tests.sync.test_integration import (
    GENERAL_SOURCE,
    TIMEOUT,
    all_ids,
    client,
    clients,
    collect,
    converge,
    own_ids,
    shutdown,
    wait_for,
)


def test_clients_on_two_processes_converge(postgres_url: str, tmp_path: Path) -> None:
    entry = write_entry(tmp_path, GENERAL_SOURCE)
    first = ServerProcess(entry, store="postgres", db=postgres_url)
    second = ServerProcess(entry, store="postgres", db=postgres_url)
    try:
        # Started together on an empty database: they race to create the tables and the server identity.
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(ServerProcess.start, (first, second)))
        asyncio.run(_scenario(tmp_path, first.sync_url, second.sync_url))
        # Both shut down cleanly on SIGTERM (their LISTEN connections and pools closed).
        assert [second.terminate(timeout=10), first.terminate(timeout=10)] == [0, 0]
    finally:
        second.terminate(timeout=10)
        first.terminate(timeout=10)


async def burst(app: App, label: str, shared_id: str, count: int = 20) -> None:
    """Interleaved writes: an insert and an increment of the shared counter, yielding between them."""
    for i in range(count):
        app.items.insert({"title": f"{label}.{i}"})
        app.items.update(shared_id, {"count": op.increment(1)})
        await asyncio.sleep(0)


async def _scenario(tmp_path: Path, url1: str, url2: str) -> None:
    a = client(tmp_path, "a", url1)
    b = client(tmp_path, "b", url2)
    async with clients(a, b):
        await a.sync.connect()
        await b.sync.connect()
        # One database, one server identity (server-authoritative fields and delivery watermarks depend on it).
        assert a.sync.server_node_id is not None
        assert a.sync.server_node_id == b.sync.server_node_id
        shared = a.items.insert({"title": "shared"})
        await wait_for(lambda: b.items.find_by_id(shared["id"]) is not None, "B sees A's first write")

        increments = 0
        for round_ in range(3):
            # One direction at a time: each side sees the other's write through the other process.
            mine = a.items.insert({"title": f"a{round_}"})
            await wait_for(lambda m=mine: b.items.find_by_id(m["id"]) == m, f"round {round_}: A -> B")
            theirs = b.notes.insert({"body": f"b{round_}", "rank": round_})
            await wait_for(lambda t=theirs: a.notes.find_by_id(t["id"]) == t, f"round {round_}: B -> A")

            # Then both at once, on the same records: the two processes commit concurrently.
            await asyncio.gather(burst(a, f"a{round_}", shared["id"]), burst(b, f"b{round_}", shared["id"]))
            increments += 40
            b.items.update(mine["id"], {"title": f"a{round_} renamed by b"})
            a.notes.update(theirs["id"], {"body": f"b{round_} edited by a"})
            final = await converge(a, b)
            items = {r["id"]: r for r in final["items"]}
            assert items[shared["id"]]["count"] == increments
            assert items[mine["id"]]["title"] == f"a{round_} renamed by b"
            assert {r["body"] for r in final["notes"]} >= {f"b{round_} edited by a"}

        assert len(final["items"]) == 1 + 3 * (1 + 40)
        assert len(final["notes"]) == 3
        assert own_ids(a) <= all_ids(b) and own_ids(b) <= all_ids(a)

        # A replica moving to the other process resumes from its watermark: both serve one delivery sequence.
        watermark = delivery_watermark(a)
        await shutdown(a)
        moved = client(tmp_path, "a", url2)
        received = collect(moved, "sync:received")
        # Newcomers on either process rebuild the same state from the shared database.
        c = client(tmp_path, "c", url2)
        d = client(tmp_path, "d", url1)
        async with clients(moved, c, d):
            await moved.sync.connect()
            await moved.sync.wait_until_synced(TIMEOUT)
            assert delivery_watermark(moved) >= watermark > 0
            assert sum(e.batchSize for e in received) == 0  # nothing sent again
            late = b.notes.insert({"body": "after the move"})
            await wait_for(lambda: moved.notes.find_by_id(late["id"]) == late, "B -> A on one process")
            final = await converge(moved, b)

            await c.sync.connect()
            await d.sync.connect()
            assert await converge(moved, b, c, d) == final
            assert all_ids(c) == all_ids(d) == all_ids(moved) == all_ids(b)
