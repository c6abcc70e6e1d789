"""Catch-up figures (issue 24): what a new session costs the server when its scope sees a few operations of
a long log. Each store is seeded directly through its writer with 100,000 operations of 1,100 owners (and
the scope snapshots the sync core stores with them); each of 100 owners (``seen-N``) has 5 of them, spread
over the log.

1. ``sqlite_in_process`` (then ``memory_in_process``, ``postgresql_in_process``): a `SyncService` on the
   store; a session narrowed to one owner (``lastDeliverySequence`` 0) runs its relay until the final
   catch-up batch. ``catch_up_cpu_ms``: the process's CPU time for that (median of several sessions, each a
   different owner). Beside it, ``whole_log_cpu_ms``: reading the whole log from the store page by page and
   judging every operation, which is what a catch-up did before it read through the scope index.
   PostgreSQL is the tests' (``OFFLINE_TEST_DATABASE_URL`` / ``DATABASE_URL``), on a schema of its own;
   skipped, with the reason, when unreachable.
2. ``server``: a real server process (`python -m server_runtime`) on the SQLite file. ``session_cpu_ms``: its
   CPU time per session, one after another (WebSocket accept, handshake, node registration, catch-up,
   close); ``session_at_head_cpu_ms``: the same for sessions resuming at the end of the log (no catch-up).
   Then 100 such sessions at once: ``rss_growth_mib`` (peak RSS while they catch up, minus RSS before),
   the wall time until all had their final batch, and the server's CPU time for all of them.

Run: ``python -m bench catch_up`` (or ``python -m bench.catch_up``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.seeding import insert_chunks
from offline import define_schema, t

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from offline.core.operations import Operation
    from server_runtime.stores import ServerStore

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {"todos": {"fields": {"ownerId": t.string(), "title": t.string()}}},
        "sync": {"todos": {"where": {"ownerId": "userId"}}},
    }
)

# The server entry: the server process imports this module for the schema.
ENTRY_SOURCE = "from bench.catch_up import SCHEMA as schema  # noqa: F401\n"

OPERATIONS = 100_000
SEEN = 5  # operations of each measured owner
SESSIONS = 100  # measured owners, and sessions at once
OTHER_OWNERS = 1_000
IN_PROCESS_SESSIONS = 20
SEQUENTIAL_SESSIONS = 20
TIMEOUT_S = 60.0

TARGETS = {"catch_up_cpu_ms": 10, "rss_growth_mib_100_sessions": 50}


def _owner_of(op: Operation) -> Any:
    assert op.data is not None  # (every operation written here is an insert)
    return op.data["ownerId"]


def _log(message: str) -> None:
    print(f"[bench catch_up] {message}", file=sys.stderr, flush=True)


def _owner(index: int) -> str:
    """The owner of the ``index``-th operation: ``seen-N`` at SEEN evenly spread places per N."""
    stride = OPERATIONS // (SESSIONS * SEEN)
    if index % stride == stride // 2:
        return f"seen-{(index // stride) % SESSIONS}"
    return f"other-{index % OTHER_OWNERS}"


async def _seed(store: ServerStore) -> float:
    """Write the log and its records straight into a server store, as the sync core stores them."""
    await store.set_schema(SCHEMA)
    start = time.perf_counter()

    def data(i: int) -> dict[str, Any]:
        return {"ownerId": _owner(i), "title": f"todo {i}"}

    for ops, rows in insert_chunks(SCHEMA, OPERATIONS, data):
        async with store.writer() as writer:
            # The scope snapshot the sync core stores with each operation.
            await writer.append([(op, {"ownerId": _owner_of(op)}) for op in ops])
            await writer.save_rows(rows)
    return time.perf_counter() - start


class _Capture:
    """A session's ``send``: counts the operations relayed, and notes the final catch-up batch."""

    def __init__(self) -> None:
        self.operations = 0
        self.done = asyncio.Event()

    async def send(self, text: str) -> None:
        frame = json.loads(text)
        self.operations += len(frame["operations"])
        if frame.get("isFinal"):
            self.done.set()


async def _in_process(store: ServerStore) -> dict[str, Any]:
    """Catch-ups of sessions that each see 5 operations, and the whole log judged, on a seeded store."""
    from offline import generate_uuid_v7
    from server_runtime.sync import Session, SyncService

    await store.set_schema(SCHEMA)
    service = SyncService(store)
    await service.start()
    try:
        catch_up: list[float] = []
        received: list[int] = []
        for i in range(IN_PROCESS_SESSIONS + 1):  # the first warms up (statements, imports)
            capture = _Capture()
            owner = f"seen-{i % SESSIONS}"
            session = Session(generate_uuid_v7(), {"todos": {"ownerId": owner}}, None, capture.send)
            cpu = time.process_time()
            relay = asyncio.create_task(service.relay(session))
            await asyncio.wait_for(capture.done.wait(), TIMEOUT_S)
            spent = time.process_time() - cpu
            relay.cancel()
            await asyncio.gather(relay, return_exceptions=True)
            if i:
                catch_up.append(spent)
                received.append(capture.operations)
        # What a catch-up did before: every page of the log from the store, every operation judged.
        whole: list[float] = []
        for i in range(3):
            session = Session(generate_uuid_v7(), {"todos": {"ownerId": f"seen-{i}"}}, None, _Capture().send)
            cpu = time.process_time()
            cursor, seen = 0, 0
            while True:
                batch = await service.read_since(cursor, service.limits.batch_size)
                if not batch:
                    break
                seen += len(await service._visible(session, batch))
                cursor = batch[-1].delivery
            whole.append(time.process_time() - cpu)
            assert seen == SEEN
    finally:
        await service.stop()
    return {
        "sessions": IN_PROCESS_SESSIONS,
        "operations_each": sorted(set(received)),
        "catch_up_cpu_ms": round(statistics.median(catch_up) * 1000, 2),
        "catch_up_cpu_ms_max": round(max(catch_up) * 1000, 2),
        "whole_log_cpu_ms": round(statistics.median(whole) * 1000, 1),
    }


class _Crowd:
    """Sessions catching up at once: each reports its final batch, then stays open until all have theirs."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.caught_up = 0
        self.all_caught_up = asyncio.Event()

    async def arrived(self) -> None:
        self.caught_up += 1
        if self.caught_up >= self.size:
            self.all_caught_up.set()
        await self.all_caught_up.wait()


async def _session(url: str, owner: str, crowd: _Crowd | None = None, after: int = 0) -> int:
    """One session narrowed to ``owner`` from delivery ``after``: the operations it got until its final
    batch."""
    import websockets

    from offline import generate_uuid_v7
    from offline.sync import protocol as p

    async with websockets.connect(url, max_size=None) as ws:
        hello = p.Handshake(
            message_id=p.new_message_id(),
            node_id=generate_uuid_v7(),
            version_vector={},
            schema_version=SCHEMA.version,
            last_delivery_sequence=after,
            sync_scope={"todos": {"ownerId": owner}},
        )
        await ws.send(p.encode(hello))
        reply = p.decode(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
        assert isinstance(reply, p.HandshakeResponse) and reply.accepted, reply
        ops = 0
        while True:
            message = p.decode(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
            if not isinstance(message, p.OperationBatch):
                continue
            ops += len(message.operations)
            ack = p.Acknowledgment(p.new_message_id(), message.message_id, 0, message.max_delivery_sequence)
            await ws.send(p.encode(ack))
            if message.is_final:
                break
        if crowd is not None:
            await crowd.arrived()
        return ops


async def _sqlite_in_process(db: Path) -> dict[str, Any]:
    """Seed the SQLite file the server process serves next, then measure in process on it."""
    from server_runtime.stores import create_sqlite_server_store

    store = create_sqlite_server_store(str(db))
    try:
        figures = {"seed_s": round(await _seed(store), 1)}
    finally:
        await store.close()
    store = create_sqlite_server_store(str(db))
    try:
        return figures | await _in_process(store)
    finally:
        await store.close()


async def _memory_in_process() -> dict[str, Any]:
    from server_runtime.stores import MemoryServerStore

    store = MemoryServerStore()
    try:
        return {"seed_s": round(await _seed(store), 1)} | await _in_process(store)
    finally:
        await store.close()


async def _postgresql_in_process() -> dict[str, Any]:
    """On a fresh schema of the PostgreSQL the tests use (skipped with the reason when unreachable)."""
    import uuid

    import asyncpg  # type: ignore[import-untyped, unused-ignore]

    from server_runtime.stores import create_relational_server_store
    from tests.conftest import postgres_base_url, with_search_path

    base = postgres_base_url()
    name = f"offline_bench_{uuid.uuid4().hex[:12]}"
    try:
        conn = await asyncpg.connect(base, timeout=5)
    except Exception as exc:
        return {"skipped": f"PostgreSQL is not reachable ({type(exc).__name__}: {exc})"}
    try:
        await conn.execute(f'CREATE SCHEMA "{name}"')
        store = await create_relational_server_store(with_search_path(base, name))
        try:
            figures = {"seed_s": round(await _seed(store), 1)}
            await store.close()
            store = await create_relational_server_store(with_search_path(base, name))
            return figures | await _in_process(store)
        finally:
            await store.close()
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


async def _server(folder: Path, db: Path) -> dict[str, Any]:
    from bench.sync import _process_cpu_s
    from tests.support.abuse import MIB, PeakRss
    from tests.support.servers import ServerProcess

    entry = folder / "server.py"
    entry.write_text(ENTRY_SOURCE)
    server = ServerProcess(
        entry,
        store="sqlite",
        db=str(db),
        log_path=folder / "server.log",
        # 100 sessions from one address at once: more than the default allows to be mid-handshake.
        # No snapshot built in the background as it starts (its CPU and replica would count as the sessions').
        env={"OFFLINE_MAX_PENDING_PER_ADDRESS": str(2 * SESSIONS), "OFFLINE_SNAPSHOT_PREPARE_EVERY": "0"},
    )
    server.start(timeout=120)
    try:
        assert server.proc is not None
        pid = server.proc.pid
        await _session(server.sync_url, "seen-0")  # warm up
        cpu = _process_cpu_s(pid)
        for i in range(SEQUENTIAL_SESSIONS):
            await _session(server.sync_url, f"seen-{i % SESSIONS}")
        after = _process_cpu_s(pid)
        per_session = None if cpu is None or after is None else (after - cpu) / SEQUENTIAL_SESSIONS
        # The same sessions resuming at the end of the log: what a session costs with nothing to catch up.
        cpu = _process_cpu_s(pid)
        for i in range(SEQUENTIAL_SESSIONS):
            await _session(server.sync_url, f"seen-{i % SESSIONS}", after=OPERATIONS)
        after = _process_cpu_s(pid)
        at_head = None if cpu is None or after is None else (after - cpu) / SEQUENTIAL_SESSIONS
        await asyncio.sleep(1.0)  # let the server settle before its RSS baseline
        crowd = _Crowd(SESSIONS)
        cpu = _process_cpu_s(pid)
        with PeakRss(pid) as rss:
            started = time.perf_counter()
            tasks = [
                asyncio.create_task(_session(server.sync_url, f"seen-{i}", crowd)) for i in range(SESSIONS)
            ]
            timed_out = False
            try:
                await asyncio.wait_for(crowd.all_caught_up.wait(), 2 * TIMEOUT_S)
            except TimeoutError:
                timed_out = True
            all_caught_up = time.perf_counter() - started
            caught_up = crowd.caught_up
            crowd.all_caught_up.set()  # those holding close now
            await asyncio.wait(tasks, timeout=TIMEOUT_S)
        after = _process_cpu_s(pid)
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        counts = [r for r in results if isinstance(r, int)]
        failed = [repr(r) for r in results if not isinstance(r, int)]
        return {
            "session_cpu_ms": None if per_session is None else round(per_session * 1000, 2),
            "session_at_head_cpu_ms": None if at_head is None else round(at_head * 1000, 2),
            "sessions_at_once": SESSIONS,
            "at_once_operations_each": sorted(set(counts)),
            "at_once_caught_up": caught_up,
            "at_once_timed_out": timed_out,
            "at_once_failed": failed[:3],
            "at_once_all_caught_up_s": round(all_caught_up, 2),
            "at_once_server_cpu_s": None if cpu is None or after is None else round(after - cpu, 2),
            "baseline_rss_mib": round(rss.before / MIB, 1),
            "rss_growth_mib": round(rss.growth / MIB, 2),
        }
    finally:
        server.terminate()


async def _run_all() -> dict[str, Any]:
    figures: dict[str, Any] = {
        "operations": OPERATIONS,
        "operations_seen_by_each_session": SEEN,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory(prefix="bench-catch-up-") as name:
        folder = Path(name)
        db = folder / "server.db"
        steps: tuple[tuple[str, Callable[[], Awaitable[Any]]], ...] = (
            ("sqlite_in_process", lambda: _sqlite_in_process(db)),
            ("server", lambda: _server(folder, db)),
            ("memory_in_process", _memory_in_process),
            ("postgresql_in_process", _postgresql_in_process),
        )
        for key, step in steps:
            _log(f"catch-ups: {key}")
            try:
                figures[key] = await step()
            except Exception as exc:  # report the failure, keep measuring the rest
                _log(f"{key} failed: {type(exc).__name__}: {exc}")
                figures[key] = {"error": f"{type(exc).__name__}: {exc}"}
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    figures["targets"] = TARGETS
    return figures


def run() -> dict[str, Any]:
    return asyncio.run(_run_all())


if __name__ == "__main__":
    json.dump(run(), sys.stdout, indent=2)
    sys.stdout.write("\n")
