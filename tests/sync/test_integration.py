"""Sync end to end: real server processes (`python -m server_runtime`) on loopback, real WebSocket clients.

Every test runs against the three server stores (memory, SQLite, PostgreSQL via the ``postgres_url`` fixture,
skipped when PostgreSQL is unreachable). Nothing sleeps and hopes: every wait polls a condition with a
deadline and fails with what it saw.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect

from offline import HLCTimestamp, HybridLogicalClock, OfflineError, create_app, create_operation, op
from offline.core.schema import SchemaDefinition
from offline.core.uuid7 import generate_uuid_v7
from offline.store import App
from offline.store.database import ACKED, PENDING, REJECTED
from offline.store.replication import delivery_watermark
from offline.sync import protocol as p
from offline.sync.transport import ConnectionLost, WebSocketTransport
from server_runtime.stores import create_relational_server_store, create_sqlite_server_store
from tests.support.servers import ServerProcess, schema_from_source, write_entry

# -- schemas: the server process and the clients build theirs from the same source ------------------------------

GENERAL_SOURCE = """
from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {
            "items": {
                "fields": {
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "count": t.number().merge("counter").default(0),
                    "tags": t.array(t.string()).default([]),
                }
            },
            "notes": {"fields": {"body": t.string(), "rank": t.number().optional()}},
        },
    }
)
"""

SCOPED_SOURCE = """
from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {"todos": {"fields": {"ownerId": t.string(), "title": t.string()}}},
        "sync": {"todos": {"where": {"ownerId": "userId"}}},
    }
)
"""


GENERAL = schema_from_source(GENERAL_SOURCE)
GENERAL_V2 = schema_from_source(GENERAL_SOURCE.replace('"version": 1', '"version": 2'))
SCOPED = schema_from_source(SCOPED_SOURCE)
assert GENERAL_V2.version == 2

# Reconnect fast: a test must not wait out a production backoff.
FAST = {"backoff_initial": 0.05, "backoff_max": 0.4, "ack_timeout": 2.0, "handshake_timeout": 10.0}
TIMEOUT = 30.0

# -- server processes --------------------------------------------------------------------------------------------


@dataclass
class Backend:
    """One server store (kind + where its data lives) and the server processes started on it."""

    kind: str  # memory | sqlite | postgres
    db: str | None
    folder: Path
    processes: list[ServerProcess] = field(default_factory=list)

    @property
    def durable(self) -> bool:
        return self.kind != "memory"

    def server(
        self, source: str = GENERAL_SOURCE, name: str = "general", env: dict[str, str] | None = None
    ) -> ServerProcess:
        folder = self.folder / f"server-{name}"
        folder.mkdir(exist_ok=True)
        entry = folder / "server.py"
        if not entry.exists():
            write_entry(folder, source)
        process = ServerProcess(entry, store=self.kind, db=self.db, env=env)
        self.processes.append(process)
        return process.start()

    def stop_all(self) -> None:
        """SIGTERM every process still running; each must shut down cleanly (exit status 0) in time."""
        running = [p for p in self.processes if p.proc is not None and p.proc.poll() is None]
        codes = [p.terminate(timeout=10) for p in running]
        assert codes == [0] * len(running), f"server exit statuses after SIGTERM: {codes}"

    async def stored_operation_ids(self) -> set[str]:
        """The operation ids in the server's database, read directly (the server process must be down)."""
        assert self.db is not None
        if self.kind == "sqlite":
            store: Any = create_sqlite_server_store(self.db)
        else:
            store = await create_relational_server_store(self.db)
        try:
            return {stored.operation.id for stored in await store.operations_since(0)}
        finally:
            await store.close()


@pytest.fixture
def backend(server_backend: Backend) -> Backend:
    """A server store of each kind (tests/sync/conftest.py's ``server_backend``, under this module's name)."""
    return server_backend


# -- clients -----------------------------------------------------------------------------------------------------


def client(tmp_path: Path, name: str, url: str, schema: SchemaDefinition = GENERAL, **options: Any) -> App:
    return create_app(schema, sync={"url": url, **FAST, **options}, path=str(tmp_path / f"{name}.db"))


async def shutdown(*apps: App) -> None:
    for app in apps:
        with contextlib.suppress(Exception):
            await app.sync.disconnect()
        app.close()


@contextlib.asynccontextmanager
async def clients(*apps: App) -> Any:
    try:
        yield apps
    finally:
        await shutdown(*apps)


def snapshot(app: App) -> dict[str, list[dict[str, Any]]]:
    """Every record of every collection, sorted by id."""
    return {
        name: sorted(app.collection(name).all().fetch(), key=lambda r: str(r["id"]))
        for name in app.schema.collections
    }


def log_rows(app: App) -> list[tuple[str, str, int]]:
    """(operation id, node id, status) of every operation in the app's log."""
    with app.db.lock:
        rows = app.db.conn.execute("SELECT id, node_id, status FROM _offline_ops").fetchall()
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]


def own_ids(app: App, status: int | None = None) -> set[str]:
    return {i for i, node, st in log_rows(app) if node == app.node_id and (status is None or st == status)}


def all_ids(app: App) -> set[str]:
    return {i for i, _, st in log_rows(app) if st != REJECTED}


async def wait_for(
    condition: Callable[[], bool], what: Callable[[], str] | str, timeout: float = TIMEOUT
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for: {what if isinstance(what, str) else what()}"
            )
        await asyncio.sleep(0.02)


async def converge(*apps: App, timeout: float = TIMEOUT) -> dict[str, list[dict[str, Any]]]:
    """Wait until every app holds the same records (and nothing is left to send); return them."""
    for app in apps:
        await app.sync.wait_until_synced(timeout)

    def same() -> bool:
        first = snapshot(apps[0])
        return all(snapshot(other) == first for other in apps[1:]) and all(a.sync.pending == 0 for a in apps)

    await wait_for(
        same, lambda: "convergence: " + json.dumps([snapshot(a) for a in apps], default=str)[:2000], timeout
    )
    return snapshot(apps[0])


def collect(app: App, event: str) -> list[Any]:
    seen: list[Any] = []
    app.events.on(event, seen.append)
    return seen


# -- 1. convergence ---------------------------------------------------------------------------------------------


def test_two_clients_converge(backend: Backend, tmp_path: Path) -> None:
    server = backend.server()

    async def scenario() -> None:
        a = client(tmp_path, "a", server.sync_url)
        b = client(tmp_path, "b", server.sync_url)
        async with clients(a, b):
            await a.sync.connect()
            await b.sync.connect()
            x = a.items.insert({"title": "x", "tags": ["a", "b", "c", "d"]})
            y = a.items.insert({"title": "y"})
            z = b.items.insert({"title": "z", "count": 10})
            w = b.items.insert({"title": "w"})
            n = a.notes.insert({"body": "hello", "rank": 1})
            base = await converge(a, b)
            assert {r["title"] for r in base["items"]} == {"x", "y", "z", "w"}

            # Concurrent edits: both sides offline, then back.
            await a.sync.disconnect()
            await b.sync.disconnect()
            a.items.update(x["id"], {"title": "x by a", "count": op.increment(2)})
            b.items.update(x["id"], {"title": "x by b", "count": op.increment(5)})
            a.items.update(x["id"], {"tags": ["a", "c", "e"]})  # removes b, d; adds e
            b.items.update(x["id"], {"tags": ["a", "b", "f"]})  # removes c, d; adds f
            a.items.update(z["id"], {"count": op.increment(1)})
            b.items.update(z["id"], {"count": op.decrement(4), "done": True})
            a.items.delete(y["id"])
            b.items.delete(w["id"])
            b.notes.update(n["id"], {"body": "edited by b"})
            v = b.notes.insert({"body": "second"})
            await a.sync.connect()
            await b.sync.connect()
            final = await converge(a, b)

            items = {r["id"]: r for r in final["items"]}
            assert set(items) == {x["id"], z["id"]}  # y and w deleted on one side only: gone everywhere
            assert items[x["id"]]["count"] == 7  # both increments count
            assert items[x["id"]]["title"] in {"x by a", "x by b"}
            assert sorted(items[x["id"]]["tags"]) == ["a", "e", "f"]  # add-wins, each removal honoured
            assert items[z["id"]]["count"] == 7
            assert items[z["id"]]["done"] is True
            notes = {r["id"]: r for r in final["notes"]}
            assert notes == {
                n["id"]: {"id": n["id"], "body": "edited by b", "rank": 1},
                v["id"]: {"id": v["id"], "body": "second", "rank": None},
            }

            # A newcomer rebuilds the same state from the server alone.
            c = client(tmp_path, "c", server.sync_url)
            async with clients(c):
                await c.sync.connect()
                assert await converge(a, b, c) == final

    asyncio.run(scenario())


# -- 2. offline for 1,000 writes ----------------------------------------------------------------------------------


def test_offline_client_catches_up_after_1000_writes(backend: Backend, tmp_path: Path) -> None:
    server = backend.server()

    async def scenario() -> None:
        a = client(tmp_path, "a", server.sync_url)
        b = client(tmp_path, "b", server.sync_url)
        async with clients(a, b):
            await a.sync.connect()
            await b.sync.connect()
            shared = [b.items.insert({"title": f"shared {i}"}) for i in range(10)]
            await converge(a, b)

            await a.sync.disconnect()
            before = own_ids(a)
            created = []
            for i in range(700):  # 700 inserts + 200 updates + 100 deletes = 1,000 writes
                created.append(a.items.insert({"title": f"offline {i}", "tags": [f"t{i % 7}"]}))
            for i in range(190):
                a.items.update(created[i]["id"], {"done": True, "count": op.increment(i)})
            for record in shared:
                a.items.update(record["id"], {"title": record["title"] + " (edited offline)"})
            for i in range(100):
                a.items.delete(created[600 + i]["id"])
            offline_ids = own_ids(a) - before
            assert len(offline_ids) == 1000
            assert a.sync.pending == 1000
            assert b.items.count() == 10  # nothing leaked while offline

            await a.sync.connect()
            final = await converge(a, b, timeout=60)
            assert offline_ids <= all_ids(b)  # the other client holds every one of the 1,000 operations
            assert a.sync.pending == 0
            items = {r["id"]: r for r in final["items"]}
            assert len(items) == 10 + 600
            assert items[created[5]["id"]] == {**created[5], "done": True, "count": 5}
            assert items[shared[3]["id"]]["title"] == "shared 3 (edited offline)"
            assert created[650]["id"] not in items

    asyncio.run(scenario())


# -- 3. restart in the middle of the initial catch-up ---------------------------------------------------------------


def _non_empty_batch(message: dict[str, Any]) -> bool:
    return message.get("type") == "operation-batch" and bool(message.get("operations"))


class StallingTransport:
    """Delivers the server's first ``batches`` messages that ``counts`` (by default: operation batches with
    operations), and every other message until then, then no frame ever again (the device is cut off: a
    closed tab, a lost network). ``delivered``: the counted messages delivered; ``stalled``: it stopped."""

    def __init__(self, batches: int, counts: Callable[[dict[str, Any]], bool] = _non_empty_batch) -> None:
        self.limit = batches
        self.counts = counts
        self.delivered: list[dict[str, Any]] = []
        self.stalled = False
        self.inner = WebSocketTransport()

    async def connect(self, url: str) -> Any:
        return _StallingConnection(await self.inner.connect(url), self)


class _StallingConnection:
    def __init__(self, inner: Any, owner: StallingTransport) -> None:
        self.inner = inner
        self.owner = owner

    async def send(self, text: str) -> None:
        await self.inner.send(text)

    async def recv(self) -> str:
        frame: str = await self.inner.recv()
        message = json.loads(frame)
        if self.owner.counts(message):
            if len(self.owner.delivered) >= self.owner.limit:
                self.owner.stalled = True
                await asyncio.Event().wait()  # until cancelled
            self.owner.delivered.append(message)
        return frame

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.inner.close(code, reason)


def test_restart_mid_catch_up_resumes_from_watermark(backend: Backend, tmp_path: Path) -> None:
    server = backend.server()
    total = 2000

    async def scenario() -> None:
        seeder = client(tmp_path, "seeder", server.sync_url, batch_size=1000)
        async with clients(seeder):
            for start in range(0, total, 500):
                with seeder.batch():
                    for i in range(start, start + 500):
                        seeder.items.insert({"title": f"item {i}"})
            await seeder.sync.connect()
            await seeder.sync.wait_until_synced(60)
            expected = snapshot(seeder)
        assert len(expected["items"]) == total

        # First run: the server streams 500-operation batches; this client applies two, then hangs and is closed
        # (the app goes away mid-catch-up, the way a killed process or a closed tab does).
        path = tmp_path / "late.db"
        stall = StallingTransport(batches=2)
        # (By operations: a log this long would otherwise come as record states, see test_state_first_sync.)
        by_operations = {"initial_sync": "operations"}
        late = create_app(
            GENERAL,
            sync={"url": server.sync_url, **FAST, "transport": stall, **by_operations},
            path=str(path),
        )
        try:
            await late.sync.connect()
            await wait_for(lambda: stall.stalled, "the third batch")
            watermark = delivery_watermark(late)
            held = len(log_rows(late))
        finally:
            await shutdown(late)
        assert 0 < held < total
        assert held == 1000  # exactly the two delivered batches
        assert watermark > 0

        # Reopened with the same path: resumes after its watermark and receives only what it lacks.
        again = client(tmp_path, "late", server.sync_url, **by_operations)
        received = collect(again, "sync:received")
        async with clients(again):
            assert delivery_watermark(again) == watermark
            assert len(log_rows(again)) == held
            await again.sync.connect()
            await again.sync.wait_until_synced(60)
            await wait_for(lambda: again.items.count() == total, lambda: f"{again.items.count()} items")
            assert sum(e.batchSize for e in received) == total - held  # nothing delivered twice
            rows = log_rows(again)
            assert len(rows) == total == len({r[0] for r in rows})
            assert snapshot(again) == expected
            assert delivery_watermark(again) > watermark

    asyncio.run(scenario())


# -- 4. a connection dropped while a client streams ------------------------------------------------------------------


def test_dropped_connection_mid_stream_loses_nothing(backend: Backend, tmp_path: Path) -> None:
    server = backend.server()

    async def scenario() -> None:
        a = client(tmp_path, "a", server.sync_url, batch_size=10)
        b = client(tmp_path, "b", server.sync_url)
        async with clients(a, b):
            await a.sync.connect()
            await b.sync.connect()
            written: list[dict[str, Any]] = []

            async def write(count: int) -> None:
                for _ in range(count):
                    written.append(a.items.insert({"title": f"w{len(written)}"}))
                    await asyncio.sleep(0.001)  # let the engine stream while we write

            await write(100)
            await wait_for(lambda: len(own_ids(a, ACKED)) >= 50, "some acknowledgements")
            await write(50)  # no wait: batches are in flight when the connection goes

            if backend.durable:
                server.kill()  # SIGKILL: no shutdown code runs
                await wait_for(lambda: a.sync.status == "offline", lambda: f"a noticed ({a.sync.status})")
                await write(50)  # still writing while the server is down
                acked = own_ids(a, ACKED)
                pending = own_ids(a, PENDING)
                assert acked and pending
                stored = await backend.stored_operation_ids()
                assert acked <= stored, f"{len(acked - stored)} acknowledged operations lost"
                server.start()  # same port, same data; both clients reconnect on their own
            else:
                for _ in range(10):  # no await in between: still unsent when the connection goes
                    written.append(a.items.insert({"title": f"w{len(written)}"}))
                await a.sync.disconnect()
                pending = own_ids(a, PENDING)
                assert pending
                await write(50)
                await a.sync.connect()
                await write(25)

            final = await converge(a, b)
            assert {r["id"] for r in final["items"]} == {r["id"] for r in written}
            assert pending <= all_ids(b)  # what was unacknowledged was resent
            assert own_ids(a) == own_ids(a, ACKED)
            c = client(tmp_path, "c", server.sync_url)
            async with clients(c):
                await c.sync.connect()
                assert await converge(a, b, c) == final
                assert own_ids(a) <= all_ids(c)

    asyncio.run(scenario())


class DroppingTransport:
    """The real WebSocket transport, counting every operation id the server's batches deliver (``counts``).

    ``lose_next()``: the next batch with operations is dropped with its socket before the client sees it, and
    connecting fails until ``reconnect()`` (the device stays offline meanwhile). ``drop_after(n)``: once
    ``n`` operations were delivered, the socket drops under the client just after it receives the batch
    that crossed ``n`` (it applies it; its acknowledgement is lost with the socket)."""

    def __init__(self) -> None:
        self.inner = WebSocketTransport()
        self.counts: collections.Counter[str] = collections.Counter()
        self.losing = False
        self.offline = False
        self.drop_at: int | None = None
        self.connections = 0

    def lose_next(self) -> None:
        self.losing = self.offline = True

    def reconnect(self) -> None:
        self.offline = False

    def drop_after(self, delivered: int) -> None:
        self.drop_at = delivered

    async def connect(self, url: str) -> Any:
        if self.offline:
            raise ConnectionLost("offline (test)")
        self.connections += 1
        return _DroppingConnection(await self.inner.connect(url), self)


class _DroppingConnection:
    def __init__(self, inner: Any, owner: DroppingTransport) -> None:
        self.inner = inner
        self.owner = owner

    async def send(self, text: str) -> None:
        await self.inner.send(text)

    async def recv(self) -> str:
        frame: str = await self.inner.recv()
        message = json.loads(frame)
        ids = (
            [op["id"] for op in message.get("operations", [])] if message["type"] == "operation-batch" else []
        )
        owner = self.owner
        if ids and owner.losing:
            owner.losing = False
            self.drop()
            raise ConnectionLost("socket dropped (test): this batch never arrived")
        owner.counts.update(ids)
        if ids and owner.drop_at is not None and owner.counts.total() >= owner.drop_at:
            owner.drop_at = None
            self.drop()  # the client applies this batch, then cannot acknowledge it
        return frame

    def drop(self) -> None:
        """The TCP connection goes without a closing handshake (a lost network, not a goodbye)."""
        self.inner._ws.transport.abort()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.inner.close(code, reason)


def test_a_client_whose_socket_drops_mid_stream_receives_each_operation_once(
    backend: Backend, tmp_path: Path
) -> None:
    """A subscriber cut off twice while another client writes (a batch lost with its socket, then a batch
    applied whose acknowledgement is lost) is delivered every operation, and none twice: it resumes after
    its watermark, from the server's stored log while it is far behind (the relay keeps only the latest
    200 operations in memory here), then from memory once it is live again.

    The server's resend of unacknowledged batches (after ``ack_timeout``, for frames lost on a live link)
    is put out of reach: it repeats a batch to a client that is merely slow, by design, which is not what
    this counts."""
    server = backend.server(env={"OFFLINE_RECENT_OPERATIONS": "200", "OFFLINE_ACK_TIMEOUT": "600"})

    async def scenario() -> None:
        a = client(tmp_path, "a", server.sync_url, batch_size=250)
        transport = DroppingTransport()
        b = client(tmp_path, "b", server.sync_url, transport=transport, initial_sync="operations")
        written: list[str] = []

        async def write(count: int, pause: bool = False) -> None:
            for start in range(0, count, 50):
                with a.batch():
                    for i in range(start, min(count, start + 50)):
                        a.items.insert({"title": f"w{len(written) + i}"})
                written.extend(sorted(own_ids(a) - set(written)))
                if pause:
                    await asyncio.sleep(0.01)  # b catches up while this goes on

        async with clients(a, b):
            await a.sync.connect()
            await b.sync.connect()
            await b.sync.wait_until_synced(TIMEOUT)
            await write(250)
            await wait_for(
                lambda: transport.counts.total() == 250, lambda: f"{transport.counts.total()} at b"
            )

            transport.lose_next()
            await write(250)
            await a.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: b.sync.status != "connected", lambda: f"b noticed ({b.sync.status})")
            await write(1500)  # b is offline: the relay's memory moves past its watermark
            await a.sync.wait_until_synced(TIMEOUT)

            transport.drop_after(1250)
            transport.reconnect()
            await write(1000, pause=True)
            await a.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: b.items.count() == 3000, lambda: f"{b.items.count()} items at b")
            await b.sync.wait_until_synced(TIMEOUT)

        assert len(written) == 3000
        assert transport.connections >= 3  # both drops happened
        assert transport.drop_at is None
        twice = {op_id: n for op_id, n in transport.counts.items() if n > 1}
        assert not twice, f"{len(twice)} operations delivered more than once"
        assert set(transport.counts) == set(written)

    asyncio.run(scenario())


# -- 5. schema-version mismatch ---------------------------------------------------------------------------------------


def test_schema_mismatch_is_refused_and_local_data_kept(backend: Backend, tmp_path: Path) -> None:
    server = backend.server()

    async def scenario() -> None:
        newer = client(tmp_path, "newer", server.sync_url, schema=GENERAL_V2)
        async with clients(newer):
            newer.items.insert({"title": "one"})
            newer.notes.insert({"body": "two"})
            before = snapshot(newer)
            log_before = sorted(log_rows(newer))
            with pytest.raises(OfflineError) as refused:
                await newer.sync.connect()
            assert refused.value.code == "SCHEMA_MISMATCH"
            assert newer.sync.status == "error"
            assert newer.sync.last_error is not None
            assert newer.sync.last_error.code == "SCHEMA_MISMATCH"
            with pytest.raises(OfflineError) as waited:
                await newer.sync.wait_until_synced(5)
            assert waited.value.code == "SCHEMA_MISMATCH"
            assert snapshot(newer) == before
            assert sorted(log_rows(newer)) == log_before  # still pending, nothing marked or dropped
            assert newer.sync.pending == 2
            assert delivery_watermark(newer) == 0
            # The local store keeps working.
            newer.items.insert({"title": "three"})
            assert newer.items.count() == 2

            # The server took nothing from it.
            current = client(tmp_path, "current", server.sync_url)
            async with clients(current):
                await current.sync.connect()
                await current.sync.wait_until_synced(TIMEOUT)
                assert snapshot(current) == {"items": [], "notes": []}

    asyncio.run(scenario())


# -- 6. scoped clients -------------------------------------------------------------------------------------------------


def test_scoped_clients_see_only_their_records(backend: Backend, tmp_path: Path) -> None:
    server = backend.server(SCOPED_SOURCE, "scoped")

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)  # no scope: sees everything
        a = client(tmp_path, "a", server.sync_url, schema=SCOPED, scope={"userId": "a"})
        b = client(tmp_path, "b", server.sync_url, schema=SCOPED, scope={"userId": "b"})
        async with clients(admin, a, b):
            await admin.sync.connect()
            for owner in ("a", "b", "c"):
                for i in range(3):
                    admin.todos.insert({"ownerId": owner, "title": f"{owner}{i} by admin"})
            await admin.sync.wait_until_synced(TIMEOUT)

            # A writes offline: two own records and one for b, sent together in its first batch.
            a1 = a.todos.insert({"ownerId": "a", "title": "a1"})
            forged = a.todos.insert({"ownerId": "b", "title": "not mine"})
            a2 = a.todos.insert({"ownerId": "a", "title": "a2"})
            rejected = collect(a, "sync:rejected")
            await a.sync.connect()
            await b.sync.connect()
            await a.sync.wait_until_synced(TIMEOUT)
            await b.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: len(rejected) == 1, lambda: f"{len(rejected)} rejections")
            assert rejected[0].code == "SCOPE_VIOLATION"
            assert rejected[0].operation.record_id == forged["id"]
            assert a.todos.find_by_id(forged["id"]) is None  # dropped locally
            assert a.todos.find_by_id(a1["id"]) is not None

            # An update that would move an own record out of scope is refused too, and undone locally.
            a.todos.update(a1["id"], {"ownerId": "b"})
            await wait_for(lambda: len(rejected) == 2, lambda: f"{len(rejected)} rejections")
            assert rejected[1].code == "SCOPE_VIOLATION"
            assert a.todos.find_by_id(a1["id"]) == a1

            # The rest of A's batch was stored: the unscoped client gets it, without the refused write.
            await wait_for(
                lambda: admin.todos.find_by_id(a2["id"]) is not None, "the admin receives A's records"
            )
            # Markers written last: once a client has its own, it has seen every earlier delivery.
            markers = {o: admin.todos.insert({"ownerId": o, "title": "marker"})["id"] for o in ("a", "b")}
            await wait_for(lambda: a.todos.find_by_id(markers["a"]) is not None, "A's marker")
            await wait_for(lambda: b.todos.find_by_id(markers["b"]) is not None, "B's marker")
            await admin.sync.wait_until_synced(TIMEOUT)

            everything = {r["id"]: r for r in admin.todos.all().fetch()}
            assert forged["id"] not in everything
            assert everything[a1["id"]]["ownerId"] == "a"
            for app, owner in ((a, "a"), (b, "b")):
                records = app.todos.all().fetch()
                assert records, owner
                assert all(r["ownerId"] == owner for r in records), records
                assert {r["id"] for r in records} == {
                    i for i, r in everything.items() if r["ownerId"] == owner
                }
                # Not even an operation of someone else's record reached it.
                with app.db.lock:
                    touched = {
                        str(row[0])
                        for row in app.db.conn.execute(
                            "SELECT record_id FROM _offline_ops WHERE status != ?", (REJECTED,)
                        )
                    }
                assert touched <= {i for i, r in everything.items() if r["ownerId"] == owner}

    asyncio.run(scenario())


def test_a_replica_whose_scope_changed_holds_exactly_its_new_scope(backend: Backend, tmp_path: Path) -> None:
    """A device synced as user a comes back as user b (its claims changed, or the app asks for another
    scope): it drops a's records, and gets b's, including those delivered long before its watermark."""
    server = backend.server(SCOPED_SOURCE, "rescoped")

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
        async with clients(admin):
            await admin.sync.connect()
            for owner in ("a", "b"):
                for i in range(3):
                    admin.todos.insert({"ownerId": owner, "title": f"{owner}{i}"})
            await admin.sync.wait_until_synced(TIMEOUT)
            everything = {r["id"]: r for r in admin.todos.all().fetch()}

            device = client(tmp_path, "device", server.sync_url, schema=SCOPED, scope={"userId": "a"})
            async with clients(device):
                await device.sync.connect()
                await device.sync.wait_until_synced(TIMEOUT)
                assert {r["ownerId"] for r in device.todos.all().fetch()} == {"a"}
                assert device.todos.count() == 3

            later = admin.todos.insert({"ownerId": "b", "title": "b after"})
            await admin.sync.wait_until_synced(TIMEOUT)
            everything[later["id"]] = later

            again = client(tmp_path, "device", server.sync_url, schema=SCOPED, scope={"userId": "b"})
            async with clients(again):
                await again.sync.connect()
                await again.sync.wait_until_synced(TIMEOUT)
                await wait_for(lambda: again.todos.count() == 4, lambda: f"{again.todos.count()} records")
                assert {r["id"] for r in again.todos.all().fetch()} == {
                    i for i, r in everything.items() if r["ownerId"] == "b"
                }
                assert again.sync.connections >= 2  # it reconnected to resync from the start

            # The same scope next time: nothing to drop, no resync.
            same = client(tmp_path, "device", server.sync_url, schema=SCOPED, scope={"userId": "b"})
            async with clients(same):
                await same.sync.connect()
                await same.sync.wait_until_synced(TIMEOUT)
                assert same.todos.count() == 4
                assert same.sync.connections == 1

    asyncio.run(scenario())


def test_a_record_moved_to_another_scope_reaches_its_new_owner_whole(
    backend: Backend, tmp_path: Path
) -> None:
    """An unscoped writer gives A's record to B: B (and a device of B that joins later) gets the whole record,
    not just the fields written since the move; A hears of the move and drops the record (the server sends
    it nothing more about it, so a copy would go stale); given back, A gets it whole again."""
    # Relay batches of 3: the moved record's history (7 operations) must be split over several frames.
    server = backend.server(SCOPED_SOURCE, "moves", env={"OFFLINE_BATCH_SIZE": "3"})

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
        a = client(tmp_path, "a", server.sync_url, schema=SCOPED, scope={"userId": "a"})
        b = client(tmp_path, "b", server.sync_url, schema=SCOPED, scope={"userId": "b"})
        late = client(tmp_path, "b-later", server.sync_url, schema=SCOPED, scope={"userId": "b"})
        async with clients(admin, a, b, late):
            for app in (admin, a, b):
                await app.sync.connect()
            moving = a.todos.insert({"ownerId": "a", "title": "draft"})
            for version in range(5):
                a.todos.update(moving["id"], {"title": f"draft {version}"})
            a.todos.update(moving["id"], {"title": "written by a"})
            staying = a.todos.insert({"ownerId": "a", "title": "stays with a"})
            await a.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: admin.todos.find_by_id(moving["id"]) is not None, "the admin has it")

            seen_by_b: list[dict[str, Any]] = []
            b.todos.all().subscribe(lambda rows: seen_by_b.extend(r for r in rows if r["id"] == moving["id"]))
            admin.todos.update(moving["id"], {"ownerId": "b"})  # only the owner field: a partial update
            await admin.sync.wait_until_synced(TIMEOUT)
            whole = {**moving, "ownerId": "b", "title": "written by a"}
            await wait_for(
                lambda: b.todos.find_by_id(moving["id"]) == whole,
                lambda: f"B receives the whole record: {b.todos.find_by_id(moving['id'])}",
            )
            # Its history came in several frames, applied together with the move: B never held it as it was
            # before (A's record, in A's scope), not even for a moment.
            assert seen_by_b and all(r == whole for r in seen_by_b), seen_by_b
            changes = []
            a.todos.all().subscribe(changes.append)
            await wait_for(lambda: a.todos.find_by_id(moving["id"]) is None, "A drops the record")
            assert moving["id"] not in {r["id"] for r in changes[-1]}  # A's live queries saw it go
            assert a.todos.find_by_id(staying["id"]) is not None
            with a.db.lock:
                left = a.db.conn.execute(
                    "SELECT COUNT(*) FROM _offline_ops WHERE record_id = ?", (moving["id"],)
                ).fetchone()[0]
            assert left == 0

            admin.todos.update(moving["id"], {"title": "b's now"})
            marker = admin.todos.insert({"ownerId": "a", "title": "marker for a"})
            await wait_for(lambda: a.todos.find_by_id(marker["id"]) is not None, "A's marker")
            await wait_for(
                lambda: (b.todos.find_by_id(moving["id"]) or {}).get("title") == "b's now", "B's update"
            )
            assert a.todos.find_by_id(moving["id"]) is None  # nothing after the move reached A

            # A device of B that connects now catches up from nothing: the whole record again.
            await late.sync.connect()
            await late.sync.wait_until_synced(TIMEOUT)
            await wait_for(
                lambda: late.todos.find_by_id(moving["id"]) == b.todos.find_by_id(moving["id"]),
                lambda: f"the late device has it: {late.todos.find_by_id(moving['id'])}",
            )
            assert late.todos.find_by_id(staying["id"]) is None and b.todos.find_by_id(staying["id"]) is None

            # And back: B's record given to A again reaches A with everything written meanwhile.
            admin.todos.update(moving["id"], {"ownerId": "a"})
            back = {**moving, "ownerId": "a", "title": "b's now"}
            assert admin.todos.find_by_id(moving["id"]) == back
            await wait_for(
                lambda: a.todos.find_by_id(moving["id"]) == back,
                lambda: f"A has it back: {a.todos.find_by_id(moving['id'])}",
            )

    asyncio.run(scenario())


async def _watch(ws: Any, texts: list[str], done: Callable[[p.Message], bool]) -> None:
    """Receive into ``texts`` (every frame as sent) until a message satisfies ``done``."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out; received {texts}")
        text = await asyncio.wait_for(ws.recv(), remaining)
        texts.append(text)
        if done(p.decode(text)):
            return


def _carries(record_id: str) -> Callable[[p.Message], bool]:
    """A message carrying an operation or a state of ``record_id``."""

    def check(message: p.Message) -> bool:
        if isinstance(message, p.OperationBatch):
            return any(o["recordId"] == record_id for o in message.operations)
        return isinstance(message, p.RecordStates) and any(s["recordId"] == record_id for s in message.states)

    return check


async def _as_a(ws: Any, texts: list[str]) -> None:
    """Open a raw session of user A's scope (a new node, from delivery 0) through its first final batch."""
    from offline.core.scopes import build_scope_map

    scope = build_scope_map(SCOPED, {"userId": "a"})
    await ws.send(p.encode(p.Handshake(p.new_message_id(), generate_uuid_v7(), {}, 1, 0, sync_scope=scope)))
    await _watch(ws, texts, lambda m: isinstance(m, p.OperationBatch) and m.is_final)


@dataclass
class _MovingScene:
    """An admin client, a client of user A's scope, and a raw live session of A's scope (``live``, every
    frame it received in ``texts``), all connected."""

    admin: App
    a: App
    live: Any
    texts: list[str]


@contextlib.asynccontextmanager
async def _moving_scene(server: Any, tmp_path: Path) -> Any:
    admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
    a = client(tmp_path, "a", server.sync_url, schema=SCOPED, scope={"userId": "a"})
    async with clients(admin, a), ws_connect(server.sync_url) as live:
        for app in (admin, a):
            await app.sync.connect()
        texts: list[str] = []
        await _as_a(live, texts)
        yield _MovingScene(admin, a, live, texts)


async def _caught_up_as_a(url: str) -> list[str]:
    """What a new raw session of A's scope, catching up by operations from delivery 0, receives."""
    async with ws_connect(url) as later:
        texts: list[str] = []
        await _as_a(later, texts)
    return texts


def test_a_session_a_record_leaves_learns_where_it_went_and_nothing_else_written_with_the_move(
    backend: Backend, tmp_path: Path
) -> None:
    """One write gives A's record to B and sets a field B alone may read. Sessions of A, live or catching up
    by operations, learn the record left (its scope fields) and drop it, and receive nothing of that field."""
    server = backend.server(SCOPED_SOURCE, "moved-with-a-secret")

    async def scenario() -> None:
        async with _moving_scene(server, tmp_path) as scene:
            admin, a = scene.admin, scene.a
            moving = admin.todos.insert({"ownerId": "a", "title": "a's draft"})
            await _watch(scene.live, scene.texts, _carries(moving["id"]))
            await wait_for(lambda: a.todos.find_by_id(moving["id"]) is not None, "A has it")

            admin.todos.update(moving["id"], {"ownerId": "b", "title": "b's secret"})  # one operation
            marker = admin.todos.insert({"ownerId": "a", "title": "marker for a"})
            await admin.sync.wait_until_synced(TIMEOUT)
            await _watch(scene.live, scene.texts, _carries(marker["id"]))
            await wait_for(lambda: a.todos.find_by_id(moving["id"]) is None, "A drops the record")
            assert a.todos.find_by_id(marker["id"]) is not None

            # A session catching up by operations (from delivery 0) is judged the same way.
            for texts in (scene.texts, await _caught_up_as_a(server.sync_url)):
                assert not any("secret" in text for text in texts), texts
                # It was told where the record went.
                told = [
                    s["state"]
                    for m in map(p.decode, texts)
                    if isinstance(m, p.RecordStates)
                    for s in m.states
                    if s["recordId"] == moving["id"]
                ]
                assert told and all('"b"' in state for state in told), texts

    asyncio.run(scenario())


def test_a_record_moving_into_a_scope_brings_its_state_not_what_it_held_elsewhere(
    backend: Backend, tmp_path: Path
) -> None:
    """B's record once held a value B overwrote; given to A, A's sessions (live, or catching up by operations)
    get the record as it is, not the writes of its time in B's scope (the overwritten value among them)."""
    server = backend.server(SCOPED_SOURCE, "moved-in-with-a-past")

    async def scenario() -> None:
        async with _moving_scene(server, tmp_path) as scene:
            admin, a = scene.admin, scene.a
            moving = admin.todos.insert({"ownerId": "b", "title": "b's secret"})
            admin.todos.update(moving["id"], {"title": "for a"})
            admin.todos.update(moving["id"], {"ownerId": "a"})
            await admin.sync.wait_until_synced(TIMEOUT)
            await _watch(scene.live, scene.texts, _carries(moving["id"]))
            whole = {**moving, "title": "for a", "ownerId": "a"}
            await wait_for(lambda: a.todos.find_by_id(moving["id"]) == whole, "A has it as it is")
            for texts in (scene.texts, await _caught_up_as_a(server.sync_url)):
                assert not any("secret" in text for text in texts), texts
                assert any("for a" in text for text in texts), texts

    asyncio.run(scenario())


def test_large_operations_reach_a_client_catching_up(memory_backend: Backend, tmp_path: Path) -> None:
    """Operations near the size limit (256 KiB each; two thirds of them non-ASCII, two bytes a character) add up
    to more than a client's 4 MiB frame limit within one relay batch: the server splits the batch into frames
    by bytes, and a client that connects afterwards receives all of them, in one transaction."""
    server = memory_backend.server()

    async def scenario() -> None:
        writer = client(tmp_path, "writer", server.sync_url)
        reader = client(tmp_path, "reader", server.sync_url)
        async with clients(writer, reader):
            await writer.sync.connect()
            bodies = [(("é" if i % 3 else "a") * (120_000 if i % 3 else 240_000)) + str(i) for i in range(24)]
            with writer.batch():
                for body in bodies:
                    writer.notes.insert({"body": body})
            await writer.sync.wait_until_synced(TIMEOUT)
            frames: list[int] = []
            reader.events.on("sync:received", lambda e: frames.append(e["batchSize"]))
            await reader.sync.connect()
            await reader.sync.wait_until_synced(TIMEOUT)
            assert sorted(r["body"] for r in reader.notes.all().fetch()) == sorted(bodies)
            # ~5.6 MB sent in frames of at most ~1 MiB, applied together when the frame ending the batch came.
            assert frames == [24], frames

    asyncio.run(scenario())


@pytest.mark.parametrize("held", [20_000, 1])
def test_frames_split_by_size_still_drop_records_that_left_the_scope(
    memory_backend: Backend, tmp_path: Path, held: int
) -> None:
    """One batch that moves A's record away and writes more of A's records, relayed in frames of ~600 bytes: A
    is told of the move before the frames (the record's state, scope fields only) and drops the record; A
    holds the early frames and applies the batch at once; or, past ``max_held_operations``, applies each as it
    comes and judges them all at the end."""
    server = memory_backend.server(SCOPED_SOURCE, "small-frames", env={"OFFLINE_RELAY_FRAME_BYTES": "600"})

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
        a = client(
            tmp_path, "a", server.sync_url, schema=SCOPED, scope={"userId": "a"}, max_held_operations=held
        )
        async with clients(admin, a):
            for app in (admin, a):
                await app.sync.connect()
            moving = a.todos.insert({"ownerId": "a", "title": "moves"})
            await a.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: admin.todos.find_by_id(moving["id"]) is not None, "the admin has it")
            frames: list[int] = []
            a.events.on("sync:received", lambda e: frames.append(e["batchSize"]))
            with admin.batch():
                admin.todos.update(moving["id"], {"ownerId": "b"})
                added = [admin.todos.insert({"ownerId": "a", "title": f"for a {i}"}) for i in range(8)]
            await admin.sync.wait_until_synced(TIMEOUT)
            await wait_for(
                lambda: all(a.todos.find_by_id(r["id"]) is not None for r in added), "A gets its new records"
            )
            await wait_for(lambda: a.todos.find_by_id(moving["id"]) is None, "A drops the moved record")
            # (The move itself comes as the record's state: the operation may carry what B alone may read.)
            if held > 1:
                assert frames == [8], frames  # applied together
            else:
                assert len(frames) >= 3 and sum(frames) == 8, frames

    asyncio.run(scenario())


# -- 7. hostile input over a raw WebSocket --------------------------------------------------------------------------------


async def receive_until(ws: Any, done: Callable[[p.Message], bool], timeout: float = 10.0) -> list[p.Message]:
    seen: list[p.Message] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out; received {seen}")
        message = p.decode(await asyncio.wait_for(ws.recv(), remaining))
        seen.append(message)
        if done(message):
            return seen


def test_hostile_operations_are_refused_one_by_one(backend: Backend, tmp_path: Path) -> None:
    server = backend.server()

    async def scenario() -> None:
        node = generate_uuid_v7()
        clock = HybridLogicalClock(node)
        sequence = iter(range(1, 100))

        def operation(title: Any, *, timestamp: HLCTimestamp | None = None) -> Any:
            return create_operation(
                {
                    "node_id": node,
                    "type": "insert",
                    "collection": "items",
                    "record_id": generate_uuid_v7(),
                    "data": {"title": title, "done": False, "count": 0, "tags": []},
                    "timestamp": timestamp or clock.now(),
                    "sequence_number": next(sequence),
                    "schema_version": 1,
                }
            )

        good1 = operation("good 1")
        forged = operation("forged").to_wire()
        forged["id"] = "f" * 64
        wrong_type = operation(12345)
        future = operation(
            "from the future", timestamp=HLCTimestamp(int(time.time() * 1000) + 3_600_000, 0, node)
        )
        good2 = operation("good 2")
        good3 = operation("good 3")

        async with ws_connect(server.sync_url) as ws:
            hello = p.Handshake(p.new_message_id(), node, {}, 1, 0)
            await ws.send(p.encode(hello))
            reply = p.decode(await ws.recv())
            assert isinstance(reply, p.HandshakeResponse) and reply.accepted
            await receive_until(ws, lambda m: isinstance(m, p.OperationBatch) and m.is_final)

            batch = p.OperationBatch(
                p.new_message_id(),
                (good1.to_wire(), forged, wrong_type.to_wire(), future.to_wire(), good2.to_wire()),
                True,
                0,
            )
            await ws.send(p.encode(batch))
            answers = await receive_until(
                ws,
                lambda m: isinstance(m, p.Acknowledgment) and m.acknowledged_message_id == batch.message_id,
            )
            refusals = {m.operation_id: m.code for m in answers if isinstance(m, p.OperationRejected)}
            assert refusals == {
                forged["id"]: p.HASH_MISMATCH,
                wrong_type.id: p.INVALID_OPERATION,
                future.id: p.CLOCK_DRIFT,
            }
            assert not any(isinstance(m, p.ErrorMessage) for m in answers)
            ack = answers[-1]
            assert isinstance(ack, p.Acknowledgment) and ack.delivery_sequence is not None

            # Malformed JSON: an error message, and the connection keeps working.
            await ws.send('{"type": "operation-batch", "operations": [')
            error = await receive_until(ws, lambda m: isinstance(m, p.ErrorMessage))
            assert isinstance(error[-1], p.ErrorMessage) and error[-1].code == p.MALFORMED_MESSAGE
            single = p.OperationMessage(p.new_message_id(), good3.to_wire())
            await ws.send(p.encode(single))
            answers = await receive_until(
                ws,
                lambda m: isinstance(m, p.Acknowledgment) and m.acknowledged_message_id == single.message_id,
            )
            assert not any(isinstance(m, p.OperationRejected | p.ErrorMessage) for m in answers)

        observer = client(tmp_path, "observer", server.sync_url)
        async with clients(observer):
            await observer.sync.connect()
            await observer.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: observer.items.count() == 3, lambda: f"{observer.items.count()} items")
            assert sorted(r["title"] for r in observer.items.all().fetch()) == ["good 1", "good 2", "good 3"]
            assert all_ids(observer) == {good1.id, good2.id, good3.id}

    asyncio.run(scenario())


# -- reconnecting: backoff, and a server that lost its data ------------------------------------------------------------


class RecordingTransport(WebSocketTransport):
    """The real transport, keeping the last connection so a test can break it."""

    last: Any = None

    async def connect(self, url: str) -> Any:
        self.last = await super().connect(url)
        return self.last


def test_backoff_starts_over_after_each_established_session(memory_backend: Backend, tmp_path: Path) -> None:
    server = memory_backend.server()

    async def scenario() -> None:
        transport = RecordingTransport()
        options = {"transport": transport, "backoff_initial": 0.05, "backoff_max": 10.0}
        a = create_app(GENERAL, sync={"url": server.sync_url, **options}, path=str(tmp_path / "a.db"))
        async with clients(a):
            await a.sync.connect()
            await a.sync.wait_until_synced(TIMEOUT)
            for drop in range(8):  # with a backoff that never resets, the 8th reconnect waits 3 s or more
                before = a.sync.connections
                started = time.monotonic()
                await transport.last.close(1011, "dropped by the test")
                await wait_for(
                    lambda n=before: a.sync.connections > n and a.sync.status == "connected",  # type: ignore[misc]
                    f"reconnect {drop}",
                )
                assert time.monotonic() - started < 1.5, f"reconnect {drop} backed off too long"
            a.items.insert({"title": "after the drops"})
            await a.sync.wait_until_synced(TIMEOUT)
            assert own_ids(a) == own_ids(a, ACKED) != set()

    asyncio.run(scenario())


def test_client_resyncs_from_a_server_that_lost_its_data(memory_backend: Backend, tmp_path: Path) -> None:
    """A restarted in-memory server numbers deliveries from 1 again: an old watermark must not skip any."""
    server = memory_backend.server()

    async def scenario() -> None:
        w = client(tmp_path, "w", server.sync_url)
        b = client(tmp_path, "b", server.sync_url)
        c = client(tmp_path, "c", server.sync_url)
        async with clients(w, b, c):
            for i in range(60):
                w.items.insert({"title": f"w{i}"})
            await w.sync.connect()
            await b.sync.connect()
            await converge(w, b)
            old_watermark = delivery_watermark(b)
            assert old_watermark > 0
            await b.sync.disconnect()

            server.kill()
            server.start()  # empty: same port, new server node, deliveries from 1 again
            for i in range(30):
                c.items.insert({"title": f"c{i}"})
            await c.sync.connect()  # C's 30 operations take deliveries 1..30 of the new server
            await c.sync.wait_until_synced(TIMEOUT)
            await converge(w, c)  # W re-sends its 60; the new server's watermark passes B's old one

            await b.sync.connect()
            final = await converge(w, b, c)
            assert len(final["items"]) == 90
            assert b.sync.server_node_id == w.sync.server_node_id == c.sync.server_node_id

    asyncio.run(scenario())


def test_closing_an_app_stops_its_sync(
    memory_backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`app.close()` without `disconnect()` ends the session instead of reconnecting to a closed database."""
    server = memory_backend.server()

    async def scenario() -> None:
        a = client(tmp_path, "a", server.sync_url)
        w = client(tmp_path, "w", server.sync_url)
        async with clients(w):
            await a.sync.connect()
            await w.sync.connect()
            a.close()
            for i in range(5):  # the server now streams to a closed app
                w.items.insert({"title": f"w{i}"})
            await w.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: a.sync.status == "disconnected", lambda: f"status {a.sync.status}", 10)
            assert a.sync.connections == 1
            await a.sync.disconnect()

    with caplog.at_level("ERROR", logger="offline.sync"):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
