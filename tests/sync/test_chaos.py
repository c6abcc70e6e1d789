"""Chaos: many clients, random writes, a lossy network and a server that crashes (DESIGN.md sections 3-4).

A real server process on the SQLite store sits behind `ChaosProxy`, which drops 10 % of the protocol frames,
duplicates 5 % and reorders some, in both directions. Ten client apps (one event loop, one database file each)
make random inserts, lww updates, counter increments, add-wins array edits and deletes on a shared pool of
record ids (so they conflict), while the server is SIGKILLed and restarted a few times. Then the proxy calms
down and the test waits until every client reports synced and the records stop changing. It checks:

- every client holds the same records, and so does a fresh client that syncs everything straight from the
  server (that is how "what the server holds" is observed: through the protocol, folded by the same code);
- every operation the server ever acknowledged (as seen on the wire by the proxy) is in the server's SQLite
  file after the crashes, and so is every operation any client wrote.

``OFFLINE_CHAOS_SCALE`` (default 1.0) scales the number of operations per client (1,000 at 1.0) for local
iteration; ``OFFLINE_CHAOS_SEED`` changes the seed. The run prints its figures (``pytest -s`` shows them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from offline import OfflineError, create_app, op
from offline.store import App
from server_runtime.stores._codec import decode_optional
from tests.support.chaos_proxy import S2C, ChaosProxy
from tests.support.servers import ServerProcess, schema_from_source, write_entry

pytestmark = pytest.mark.slow

SCALE = float(os.environ.get("OFFLINE_CHAOS_SCALE", "1") or 1)
SEED = int(os.environ.get("OFFLINE_CHAOS_SEED", "20250101") or 20250101)
CLIENTS = 10
OPS_PER_CLIENT = max(20, round(1000 * SCALE))
POOL = 150  # shared record ids every client may insert, so concurrent inserts of one id happen
KILLS = 3  # SIGKILL + restart of the server during the writes
MIN_UPTIME = 2.0  # seconds a (re)started server runs before the next crash
PAUSE = 0.004  # mean pause between one client's writes, so writes interleave with sync and crashes
SETTLE_TIMEOUT = 120.0
TRACE = bool(os.environ.get("OFFLINE_CHAOS_TRACE"))  # print every client's connects and disconnects
TAGS = [f"t{i}" for i in range(12)]

SCHEMA_SOURCE = """
from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {
            "items": {
                "fields": {
                    "title": t.string().default(""),
                    "done": t.boolean().default(False),
                    "count": t.number().merge("counter").default(0),
                    "tags": t.array(t.string()).merge("union").default([]),
                }
            }
        },
    }
)
"""


def client_config(url: str) -> dict[str, Any]:
    return {
        "url": url,
        "backoff_initial": 0.05,
        "backoff_max": 1.0,
        "ack_timeout": 1.0,
        # A lost handshake or handshake-response costs one handshake_timeout (15 s by default) before the
        # client retries; keep it short, as about one connection attempt in five loses one of the two.
        "handshake_timeout": 1.0,
    }


def random_record_id(app: App, rng: random.Random) -> str | None:
    """A random live record of this replica (read straight from its table: cheap at any size)."""
    items = app.collection("items")
    count = items.count()  # flushes pending rows first, like every read
    if not count:
        return None
    with app.db.lock:
        row = app.db.conn.execute(
            f'SELECT "id" FROM {items.codec.table} ORDER BY "id" LIMIT 1 OFFSET ?', (rng.randrange(count),)
        ).fetchone()
    return str(row[0])


def snapshot(app: App) -> str:
    """The records of one replica, canonically (one JSON text, so replicas compare byte for byte)."""
    records = sorted(app.collection("items").all().fetch(), key=lambda r: r["id"])
    return json.dumps(records, sort_keys=True)


def random_write(app: App, rng: random.Random, counts: dict[str, int]) -> None:
    """One random local write on this replica's records or the shared pool of ids.

    A write that changes nothing (the value was already there) makes no operation; the caller counts.
    """
    items = app.collection("items")
    roll = rng.random()
    record_id = None if roll < 0.15 else random_record_id(app, rng)
    if record_id is None:
        record_id = f"pool-{rng.randrange(POOL)}"
        values: dict[str, Any] = {
            "title": f"title-{rng.randrange(10_000)}",
            "count": rng.randrange(10),
            "tags": rng.sample(TAGS, rng.randrange(3)),
        }
        if app.cached_state("items", record_id) is None:  # ids are never reused, even after a delete
            items.insert({"id": record_id, **values})
            counts["insert_shared"] += 1
        else:
            items.insert(values)
            counts["insert_fresh"] += 1
        return
    if roll < 0.40:
        if rng.random() < 0.7:
            items.update(record_id, {"title": f"title-{rng.randrange(10_000)}"})
        else:
            items.update(record_id, {"done": rng.random() < 0.5})
        counts["update_lww"] += 1
    elif roll < 0.65:
        items.update(record_id, {"count": op.increment(rng.choice([1, 1, 2, 5, -1, -3]))})
        counts["update_counter"] += 1
    elif roll < 0.90:
        current = items.find_by_id(record_id) or {}
        tag = rng.choice(TAGS)
        if rng.random() < 0.1:
            items.update(record_id, {"tags": rng.sample(TAGS, rng.randrange(4))})
        elif tag in (current.get("tags") or []):
            items.update(record_id, {"tags": op.remove(tag)})
        else:
            items.update(record_id, {"tags": op.append(tag)})
        counts["update_array"] += 1
    elif roll < 0.92:
        items.update(
            record_id,
            {
                "title": f"title-{rng.randrange(10_000)}",
                "count": op.increment(rng.randrange(1, 4)),
                "tags": op.append(rng.choice(TAGS)),
            },
        )
        counts["update_multi"] += 1
    else:
        items.delete(record_id)
        counts["delete"] += 1


def server_operation_ids(db: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM offline_operations")}
    finally:
        conn.close()


def server_records(db: Path) -> str:
    """The records the server itself materialised (its `offline_records` table), like `snapshot`."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT record_id, record FROM offline_records WHERE collection = 'items' AND record IS NOT NULL"
        ).fetchall()
    finally:
        conn.close()
    records = [{**(decode_optional(text) or {}), "id": record_id} for record_id, text in rows]
    return json.dumps(sorted(records, key=lambda r: r["id"]), sort_keys=True)


def own_operation_ids(app: App, after: int = 0) -> set[str]:
    """Ids of this node's operations numbered above ``after`` that its log still holds.

    Read right after each write (no await between): the log drops a node's own operations once the server
    acknowledged them (automatic compaction), so reading it at the end would miss most of them.
    """
    with app.db.lock:
        rows = app.db.conn.execute(
            "SELECT id FROM _offline_ops WHERE node_id = ? AND sequence_number > ?", (app.node_id, after)
        )
        return {row[0] for row in rows}


def describe(apps: list[App]) -> str:
    lines = []
    for i, app in enumerate(apps):
        engine = app.sync
        lines.append(
            f"client {i}: status={engine.status} pending={engine.pending} "
            f"connections={engine.connections} records={app.collection('items').count()} "
            f"watermark={app.db.get_meta('delivery_watermark')}"
        )
    return "\n".join(lines)


async def settle(apps: list[App], timeout: float) -> float:
    """Wait until every client is synced and no record changes for a while; returns the seconds it took."""
    started = time.monotonic()
    deadline = started + timeout
    previous: list[str] | None = None
    stable = 0
    while True:
        remaining = deadline - time.monotonic()
        try:
            for i, app in enumerate(apps):
                t0 = time.monotonic()
                await app.sync.wait_until_synced(timeout=max(remaining, 0.1))
                if TRACE and time.monotonic() - t0 > 0.5:
                    print(f"settle: client {i} took {time.monotonic() - t0:.2f}s to report synced")
        except OfflineError as exc:
            raise AssertionError(f"clients did not sync: {exc}\n{describe(apps)}") from exc
        current = [snapshot(app) for app in apps]
        if TRACE:
            print(f"settle {time.monotonic() - started:6.2f}s: {len(set(current))} distinct states")
        stable = stable + 1 if current == previous else 0
        previous = current
        if stable >= 3 and len(set(current)) == 1:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            distinct = len(set(current))
            raise AssertionError(
                f"records did not converge within {timeout} s ({distinct} distinct replica states)\n"
                f"{describe(apps)}"
            )
        await asyncio.sleep(0.5)


async def run_chaos(tmp_path: Path, figures: dict[str, Any]) -> None:
    """The chaos run; ``figures`` collects what happened (filled in as it goes, so a failure shows it too)."""
    schema = schema_from_source(SCHEMA_SOURCE)
    rng = random.Random(SEED)
    figures.update({"clients": CLIENTS, "ops_per_client": OPS_PER_CLIENT, "seed": SEED})
    started = time.monotonic()

    server_dir = tmp_path / "server"
    server_dir.mkdir()
    server_db = server_dir / "server.db"
    server = ServerProcess(write_entry(server_dir, SCHEMA_SOURCE), store="sqlite", db=str(server_db))
    await asyncio.to_thread(server.start)
    proxy = await ChaosProxy(f"ws://127.0.0.1:{server.port}", seed=SEED).start()
    sync_path = "/offline-sync"

    apps = [
        create_app(schema, sync=client_config(proxy.url + sync_path), path=str(tmp_path / f"client{i}.db"))
        for i in range(CLIENTS)
    ]
    fresh: App | None = None
    counts: dict[str, int] = dict.fromkeys(
        [
            "insert_shared",
            "insert_fresh",
            "update_lww",
            "update_counter",
            "update_array",
            "update_multi",
            "delete",
        ],
        0,
    )
    done = 0
    expected = ""  # the records as the fresh client folds them from the server
    written: set[str] = set()  # every operation a client wrote
    written_ids: list[set[str]] = [set() for _ in range(CLIENTS)]  # per client, collected as it writes
    reasons: Counter[str] = Counter()

    def watch(index: int, app: App) -> None:
        def on_event(event: Any) -> None:
            reason = event.get("reason")
            if reason is not None:
                # Group by the kind of reason ("delivery gap", "TimeoutError", close codes...), not its numbers.
                reasons[re.sub(r"\d+", "N", str(reason))[:60]] += 1
            if TRACE:
                print(f"{time.monotonic() - started:8.3f} client {index} {event.type} {reason or ''}")

        app.events.on("sync:connected", on_event)
        app.events.on("sync:disconnected", on_event)

    try:
        for index, app in enumerate(apps):
            watch(index, app)
            await app.sync.connect(wait=False)

        async def writer(index: int) -> None:
            nonlocal done
            local = random.Random(SEED * 1000 + index)
            app = apps[index]
            written = 0
            own_writes = written_ids[index]
            while written < OPS_PER_CLIENT:
                before = app.version_vector.get(app.node_id, 0)
                random_write(app, local, counts)
                # A write that changes nothing (the value was already there) makes no operation.
                if app.version_vector.get(app.node_id, 0) > before:
                    own_writes.update(own_operation_ids(app, before))
                    written += 1
                    done += 1
                await asyncio.sleep(local.uniform(0, 2 * PAUSE))

        async def crasher() -> None:
            total = CLIENTS * OPS_PER_CLIENT
            # One crash at a random point of each of KILLS equal stretches of the writes.
            marks = [(k + rng.uniform(0.15, 0.85)) / KILLS * total for k in range(KILLS)]
            figures["kills_at_ops"] = []
            figures["acknowledged_at_kills"] = []
            downtime = []
            up_since = time.monotonic()
            for mark in marks:
                # Also let each restarted server serve for a moment, so its clients come back in between.
                while done < mark or time.monotonic() - up_since < MIN_UPTIME:
                    await asyncio.sleep(0.01)
                figures["kills_at_ops"].append(done)
                await asyncio.to_thread(server.kill)
                figures["acknowledged_at_kills"].append(len(proxy.acknowledged))
                if TRACE:
                    print(f"{time.monotonic() - started:8.3f} server killed after {done} operations")
                pause = rng.uniform(0.2, 1.5)
                await asyncio.sleep(pause)
                t0 = time.monotonic()
                await asyncio.to_thread(server.start)
                if TRACE:
                    print(f"{time.monotonic() - started:8.3f} server restarted")
                up_since = time.monotonic()
                downtime.append(round(pause + up_since - t0, 2))
            figures["server_downtime_s"] = downtime

        await asyncio.gather(crasher(), *(writer(i) for i in range(CLIENTS)))
        figures["write_phase_s"] = round(time.monotonic() - started, 1)
        figures["operations"] = dict(counts)

        proxy.calm()
        figures["settle_s"] = round(await settle(apps, SETTLE_TIMEOUT), 1)

        # What the server holds, observed through the protocol: a new replica synced straight from it.
        fresh = create_app(schema, sync=client_config(server.sync_url), path=str(tmp_path / "fresh.db"))
        await fresh.sync.connect(timeout=30)
        await fresh.sync.wait_until_synced(timeout=60)
        expected = snapshot(fresh)
        for i, app in enumerate(apps):
            assert snapshot(app) == expected, f"client {i} differs from what the server holds"
        figures["records"] = len(json.loads(expected))
        figures["client_connections"] = [app.sync.connections for app in apps]
        for ids in written_ids:
            written |= ids
    finally:
        for app in [*apps, *([fresh] if fresh is not None else [])]:
            with contextlib.suppress(Exception):
                await app.sync.disconnect()
            app.close()
        await proxy.stop()
        await asyncio.to_thread(server.terminate)
        figures["proxy"] = proxy.summary
        figures["disconnect_reasons"] = dict(reasons.most_common())
        figures["total_s"] = round(time.monotonic() - started, 1)

    stored = server_operation_ids(server_db)
    assert server_records(server_db) == expected, "the server's own records differ from the replicas'"
    figures["acknowledged_ops"] = len(proxy.acknowledged)
    figures["server_ops"] = len(stored)
    assert not proxy.rejected, f"the server refused {len(proxy.rejected)} operations"
    lost = proxy.acknowledged - stored
    assert not lost, f"{len(lost)} acknowledged operations are missing from the server store"
    assert written == stored, (
        f"{len(written - stored)} client operations never reached the server; "
        f"{len(stored - written)} server operations no client wrote"
    )
    assert len(written) == CLIENTS * OPS_PER_CLIENT


def test_chaos_convergence_and_durability(tmp_path: Path) -> None:
    figures: dict[str, Any] = {}
    try:
        asyncio.run(run_chaos(tmp_path, figures))
    finally:
        print("\nchaos figures:", json.dumps(figures))
    proxy = figures["proxy"]
    # The run must actually have been chaotic: frames lost, doubled and reordered, the server crashed.
    assert proxy.get("dropped", 0) > 0
    assert proxy.get("duplicated", 0) > 0
    assert proxy.get("reordered", 0) > 0
    assert len(figures["server_downtime_s"]) == KILLS


async def run_lost_batches(tmp_path: Path) -> dict[str, float]:
    """Server batches lost with nothing after them: the client cannot see a gap, the server must resend."""
    schema = schema_from_source(SCHEMA_SOURCE)
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    server = ServerProcess(
        write_entry(server_dir, SCHEMA_SOURCE), store="sqlite", db=str(server_dir / "s.db")
    )
    await asyncio.to_thread(server.start)
    proxy = await ChaosProxy(f"ws://127.0.0.1:{server.port}", drop=0, duplicate=0, reorder=0).start()
    url = proxy.url + "/offline-sync"
    writer = create_app(schema, sync=client_config(url), path=str(tmp_path / "writer.db"))
    reader = create_app(schema, sync=client_config(url), path=str(tmp_path / "reader.db"))
    took: dict[str, float] = {}
    try:
        await writer.sync.connect()
        await writer.sync.wait_until_synced()
        # The reader's first (empty, final) catch-up batch is lost: without a resend it never gets synced.
        proxy.drop_next(S2C, "operation-batch")
        t0 = time.monotonic()
        await reader.sync.connect()
        await reader.sync.wait_until_synced(timeout=30)
        took["initial_batch"] = time.monotonic() - t0
        # A live batch is lost and nothing follows it: the reader stays "synced" but misses the record.
        proxy.drop_next(S2C, "operation-batch")
        t0 = time.monotonic()
        writer.collection("items").insert({"id": "lost", "title": "found again"})
        await writer.sync.wait_until_synced()
        while reader.collection("items").find_by_id("lost") is None:
            assert time.monotonic() - t0 < 30, "the lost batch was never resent"
            await asyncio.sleep(0.05)
        took["live_batch"] = time.monotonic() - t0
        assert proxy.counts["dropped_on_request"] == 2
    finally:
        for app in (writer, reader):
            await app.sync.disconnect()
            app.close()
        await proxy.stop()
        await asyncio.to_thread(server.terminate)
    return took


def test_lost_server_batches_are_resent(tmp_path: Path) -> None:
    took = asyncio.run(run_lost_batches(tmp_path))
    print("\nlost batches recovered after (s):", {k: round(v, 2) for k, v in took.items()})
