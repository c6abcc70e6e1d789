"""A fresh device's state-based first sync, end to end: a real server process (memory, SQLite, PostgreSQL
stores), real WebSocket clients.

A device that has received nothing asks for its first sync by record states (``initialSync: "states"`` in
its handshake, the default); once the server's log is longer than ``state_sync_after`` operations it is
sent every record's merge state, then the log after them, instead of every operation. It ends with exactly
the server's records, holds no received operation in its log (what a compaction would have left), shows its
progress, and converges with a device that synced by operations, writes of its own made before its first
sync included.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from offline import op
from offline.store import App
from offline.store.replication import delivery_watermark
from tests.merge._support import SCHEMA
from tests.sync.test_integration import (
    SCOPED,
    SCOPED_SOURCE,
    TIMEOUT,
    Backend,
    StallingTransport,
    client,
    clients,
    collect,
    converge,
    shutdown,
    wait_for,
)

ENTRY = "from tests.merge._support import SCHEMA as schema\n"


def received_in_log(app: App) -> int:
    """How many operations of other nodes this replica's log holds."""
    with app.db.lock:
        row = app.db.conn.execute(
            "SELECT count(*) FROM _offline_ops WHERE node_id != ?", (app.node_id,)
        ).fetchone()
    return int(row[0])


async def write_history(writer: App) -> list[str]:
    """120 items written by ``writer`` (the first 40 updated: counter and add-wins array; the first's rich
    text edited; the last 20 deleted), synced: 181 operations. Returns the items' ids in order."""
    ids = []
    with writer.batch():
        for i in range(120):
            ids.append(
                writer.items.insert({"title": f"item {i}", "count": i, "tags": ["a"], "body": "text"})["id"]
            )
    for record_id in ids[:40]:
        writer.items.update(record_id, {"count": op.increment(5), "tags": op.append("b")})
    writer.items.richtext(ids[0], "body").insert(0, "rich ")
    for record_id in ids[100:]:
        writer.items.delete(record_id)
    await writer.sync.wait_until_synced(TIMEOUT)
    return ids


def test_a_fresh_device_synced_by_states_holds_the_servers_records_and_converges(
    server_backend: Backend, tmp_path: Path
) -> None:
    # Any log longer than one operation is sent as states to a fresh device that asks.
    server = server_backend.server(ENTRY, name="state-first-sync", env={"OFFLINE_STATE_SYNC_AFTER": "1"})

    async def scenario() -> None:
        writer = client(tmp_path, "writer", server.sync_url, SCHEMA)
        async with clients(writer):
            await writer.sync.connect()
            ids = await write_history(writer)

            by_states = client(tmp_path, "by-states", server.sync_url, SCHEMA)
            by_ops = client(tmp_path, "by-ops", server.sync_url, SCHEMA, initial_sync="operations")
            # Written before this device ever synced: folded on the server's states, then sent.
            mine = by_states.items.insert({"title": "made before the first sync", "count": 1})
            states = collect(by_states, "sync:states")
            states_by_ops = collect(by_ops, "sync:states")
            async with clients(by_states, by_ops):
                await by_states.sync.connect()
                await by_ops.sync.connect()
                records = await converge(writer, by_states, by_ops)
                assert {r["id"] for r in records["items"]} == set(ids[:100]) | {mine["id"]}
                [first] = [r for r in records["items"] if r["id"] == ids[0]]
                assert first["count"] == 5 and sorted(first["tags"]) == ["a", "b"]
                assert first["body"] == "rich text"

                # The states path was taken by the one device only: its log holds none of the server's
                # operations (the other's holds every one it received).
                assert states and not states_by_ops
                assert received_in_log(by_states) == 0
                assert received_in_log(by_ops) >= 120 + 40 + 1 + 20
                described = by_states.sync.describe()
                assert described["received"] == described["serverTotal"] > 0
                assert delivery_watermark(by_states) >= 181  # the writer's operations: all accounted for

                # Both go on writing to the same records: they converge.
                by_states.items.update(ids[1], {"count": op.increment(7), "title": "states"})
                by_ops.items.update(ids[1], {"count": op.increment(11), "tags": op.append("ops")})
                by_states.items.delete(ids[2])
                by_ops.items.update(mine["id"], {"title": "seen by the other"})
                records = await converge(writer, by_states, by_ops)
                [second] = [r for r in records["items"] if r["id"] == ids[1]]
                assert second["count"] == 1 + 5 + 7 + 11
                assert ids[2] not in {r["id"] for r in records["items"]}

            # A restart resumes from its watermark (no second state sync), and a fresh device with the
            # default converges with all of them too.
            again = client(tmp_path, "by-states", server.sync_url, SCHEMA)
            late = client(tmp_path, "late", server.sync_url, SCHEMA)
            resumed = collect(again, "sync:states")
            async with clients(again, late):
                await again.sync.connect()
                await late.sync.connect()
                assert await converge(writer, again, late) == records
                assert not resumed

    asyncio.run(scenario())


def test_a_short_log_and_a_device_that_asks_for_operations_get_operations(
    server_backend: Backend, tmp_path: Path
) -> None:
    """Under the threshold (the default, 1,000 operations) a fresh device receives the operations, as a
    device configured with ``initial_sync="operations"`` always does; a bad setting is refused by name."""
    server = server_backend.server(ENTRY, name="short-log")

    async def scenario() -> None:
        writer = client(tmp_path, "writer", server.sync_url, SCHEMA)
        fresh = client(tmp_path, "fresh", server.sync_url, SCHEMA)
        async with clients(writer, fresh):
            await writer.sync.connect()
            for i in range(5):
                writer.items.insert({"title": f"item {i}"})
            await writer.sync.wait_until_synced(TIMEOUT)
            seen = collect(fresh, "sync:states")
            await fresh.sync.connect()
            await converge(writer, fresh)
            await wait_for(lambda: received_in_log(fresh) == 5, "the operations in the fresh device's log")
            assert not seen

    asyncio.run(scenario())
    try:
        client(tmp_path, "bad", server.sync_url, SCHEMA, initial_sync="everything")
    except Exception as exc:
        error: Any = exc
    else:
        raise AssertionError("initial_sync='everything' was accepted")
    assert error.code == "SYNC_ERROR" and error.context["field"] == "sync.initial_sync"


async def write_scoped_history(admin: App) -> list[dict[str, Any]]:
    """30 to-dos of user a and 30 of b written by ``admin``, the first of a's moved to b and the second
    renamed, synced. Returns a's 30 as inserted."""
    with admin.batch():
        mine = [admin.todos.insert({"ownerId": "a", "title": f"a{i}"}) for i in range(30)]
        for i in range(30):
            admin.todos.insert({"ownerId": "b", "title": f"b{i}"})
    admin.todos.update(mine[0]["id"], {"ownerId": "b"})  # moved away from A
    admin.todos.update(mine[1]["id"], {"title": "renamed"})
    await admin.sync.wait_until_synced(TIMEOUT)
    return mine


def test_a_scoped_fresh_device_synced_by_states_holds_its_scope_and_drops_what_left_it(
    server_backend: Backend, tmp_path: Path
) -> None:
    """A fresh device of user A, by states: exactly A's records (a record moved from A to B, whose state the
    server sends so that A's devices drop it, is not kept), the same as a device of A synced by operations."""
    server = server_backend.server(SCOPED_SOURCE, "scoped-first-sync", env={"OFFLINE_STATE_SYNC_AFTER": "1"})

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
        async with clients(admin):
            await admin.sync.connect()
            mine = await write_scoped_history(admin)

            by_states = client(tmp_path, "a-states", server.sync_url, schema=SCOPED, scope={"userId": "a"})
            by_ops = client(
                tmp_path,
                "a-ops",
                server.sync_url,
                schema=SCOPED,
                scope={"userId": "a"},
                initial_sync="operations",
            )
            states = collect(by_states, "sync:states")
            async with clients(by_states, by_ops):
                await by_states.sync.connect()
                await by_ops.sync.connect()
                await by_states.sync.wait_until_synced(TIMEOUT)
                await by_ops.sync.wait_until_synced(TIMEOUT)
                expected = {m["id"] for m in mine[1:]}
                await wait_for(
                    lambda: {r["id"] for r in by_states.todos.fetch()} == expected,
                    lambda: f"A's records by states: {len(by_states.todos.fetch())}",
                )
                await wait_for(
                    lambda: by_states.todos.fetch() == by_ops.todos.fetch(),
                    "the same records as the device synced by operations",
                )
                assert states and received_in_log(by_states) == 0
                assert by_states.todos.find_by_id(mine[1]["id"])["title"] == "renamed"  # type: ignore[index]

    asyncio.run(scenario())


def test_the_threshold_counts_what_a_scoped_device_may_see_not_the_whole_log(
    server_backend: Backend, tmp_path: Path
) -> None:
    """The threshold is about what the fresh device would receive: a device of A, whose scope holds a few
    operations of a log longer than the threshold, gets them as operations (and keeps them); a device of B,
    whose scope holds more than the threshold, gets states."""
    server = server_backend.server(SCOPED_SOURCE, "scoped-threshold", env={"OFFLINE_STATE_SYNC_AFTER": "20"})

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
        async with clients(admin):
            await admin.sync.connect()
            with admin.batch():
                mine = [admin.todos.insert({"ownerId": "a", "title": f"a{i}"}) for i in range(5)]
                theirs = [admin.todos.insert({"ownerId": "b", "title": f"b{i}"}) for i in range(40)]
            await admin.sync.wait_until_synced(TIMEOUT)

            of_a = client(tmp_path, "a-fresh", server.sync_url, schema=SCOPED, scope={"userId": "a"})
            of_b = client(tmp_path, "b-fresh", server.sync_url, schema=SCOPED, scope={"userId": "b"})
            states_a, states_b = collect(of_a, "sync:states"), collect(of_b, "sync:states")
            async with clients(of_a, of_b):
                await of_a.sync.connect()
                await of_b.sync.connect()
                for device, records in ((of_a, mine), (of_b, theirs)):
                    expected = {r["id"] for r in records}
                    await wait_for(
                        lambda device=device, expected=expected: (
                            {r["id"] for r in device.todos.fetch()} == expected
                        ),
                        lambda device=device: f"the scope's records: {len(device.todos.fetch())}",
                    )
                await wait_for(lambda: received_in_log(of_a) == 5, "A's operations in its device's log")
                assert not states_a  # 5 operations in scope: under the threshold, whatever the log's length
                assert states_b and received_in_log(of_b) == 0

    asyncio.run(scenario())


def cut_after(keep: int) -> StallingTransport:
    """A transport that delivers the server's first ``keep`` ``record-states`` messages of a session, then no frame ever again
    (the device is cut off mid first sync). ``delivered`` holds the messages delivered (their ``through``)."""
    return StallingTransport(keep, lambda message: message.get("type") == "record-states")


def test_a_first_sync_by_states_cut_anywhere_resumes_where_it_was_and_converges(
    server_backend: Backend, tmp_path: Path
) -> None:
    """A device cut off after any number of its first sync's ``record-states`` messages (the server's log
    possibly growing meanwhile) resumes from the last message it applied, not from delivery 0, and ends with
    exactly the records of a device whose first sync ran uncut: no record and no operation skipped."""
    server = server_backend.server(
        ENTRY, name="cut-first-sync", env={"OFFLINE_STATE_SYNC_AFTER": "1", "OFFLINE_BATCH_SIZE": "5"}
    )
    ids: list[str] = []

    async def seed() -> int:
        writer = client(tmp_path, "writer", server.sync_url, SCHEMA)
        async with clients(writer):
            await writer.sync.connect()
            with writer.batch():
                for i in range(40):
                    ids.append(writer.items.insert({"title": f"item {i}", "count": i, "tags": ["a"]})["id"])
            # Records that show up again later in the log (every third of the first ones), a deletion, text.
            for record_id in ids[:30:3]:
                writer.items.update(record_id, {"count": op.increment(5), "tags": op.append("b")})
            writer.items.delete(ids[7])
            writer.items.update(ids[1], {"title": "late"})
            await writer.sync.wait_until_synced(TIMEOUT)
            whole = client(tmp_path, "uncut-0", server.sync_url, SCHEMA)
            cutter = cut_after(10**6)
            whole.sync.transport = cutter
            async with clients(whole):
                await whole.sync.connect()
                await converge(writer, whole)
            return len(cutter.delivered)

    messages = asyncio.run(seed())
    assert messages >= 4, f"{messages} record-states messages: too few to cut between"
    runs = iter(range(1, 1000))

    async def scenario(keep: int, writes: int) -> None:
        run = next(runs)
        writer = client(tmp_path, "writer", server.sync_url, SCHEMA)
        cutter = cut_after(keep)
        device = client(tmp_path, f"cut-{run}", server.sync_url, SCHEMA, transport=cutter)
        async with clients(writer, device):
            await writer.sync.connect()
            await device.sync.connect()
            await wait_for(lambda: cutter.stalled, "the cut")
            watermark = delivery_watermark(device)  # (the reader applied each message before the next)
            await shutdown(device)
            # How far the applied messages went: the device resumes from there.
            throughs = [m["through"] for m in cutter.delivered if m.get("through") is not None]
            assert watermark == max(throughs, default=0)
            assert keep < 2 or watermark > 0
            # The log grows while the device is away: records it has and records it has not.
            for i in range(writes):
                writer.items.update(ids[(i * 7 + 2) % len(ids)], {"count": op.increment(1), "title": f"w{i}"})
            if writes:
                writer.items.insert({"title": "new while cut"})
            await writer.sync.wait_until_synced(TIMEOUT)

            again = client(tmp_path, f"cut-{run}", server.sync_url, SCHEMA)
            resumed = collect(again, "sync:states")
            uncut = client(tmp_path, f"uncut-{run}", server.sync_url, SCHEMA)
            async with clients(again, uncut):
                await again.sync.connect()
                await uncut.sync.connect()
                records = await converge(writer, again, uncut)
                # (The examples before this one wrote too: the server's log grows from one to the next.)
                assert set(ids) - {ids[7]} <= {r["id"] for r in records["items"]}
                if keep >= 2 and not writes:
                    # Resumed: the records the applied messages covered and no later operation touched
                    # are not sent again.
                    sent_again = sum(len(e.records) for e in resumed)
                    assert sent_again < len(records["items"])

    @settings(
        max_examples=6,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(keep=st.integers(min_value=0, max_value=messages - 1), writes=st.sampled_from([0, 0, 3]))
    @example(keep=messages - 1, writes=0)
    @example(keep=1, writes=3)
    def cut_anywhere(keep: int, writes: int) -> None:
        asyncio.run(scenario(keep, writes))

    cut_anywhere()
