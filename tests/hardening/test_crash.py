"""Crashes and restarts during write bursts, with real client apps and real server processes.

- SIGKILL (no shutdown code runs) on SQLite and on PostgreSQL: every operation a client saw acknowledged before
  the kill is in the store when the process is gone; after a restart on the same port every client converges
  and the server holds every operation anyone wrote.
- SIGTERM (a rolling deploy): sessions are closed with a retriable SERVER_SHUTDOWN (close 1012) after their
  batch in hand is stored and acknowledged; no client sees a non-retriable error or a rejection, the process
  exits 0, and after the restart nothing is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import create_app
from offline.store import App
from offline.store.database import ACKED, REJECTED
from offline.sync import protocol as p
from server_runtime.stores import create_relational_server_store
from tests.support.servers import ServerProcess

from .support import SCHEMA, TIMEOUT, RawClient, start_server, wait_for

FAST = {"backoff_initial": 0.05, "backoff_max": 0.4, "ack_timeout": 2.0, "handshake_timeout": 5.0}
CLIENTS = 3
WRITES = 500  # per client, in chunks
CHUNK = 10


@pytest.fixture(params=["sqlite", "postgres"])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "postgres":
        yield "postgres", str(request.getfixturevalue("postgres_url"))
    else:
        yield "sqlite", str(tmp_path / "server.db")


async def stored_ids(kind: str, db: str) -> set[str]:
    """Operation ids in the server's database, read directly (its process is not running)."""
    if kind == "sqlite":
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return {row[0] for row in conn.execute("SELECT id FROM offline_operations")}
        finally:
            conn.close()
    store = await create_relational_server_store(db)
    try:
        return {stored.operation.id for stored in await store.operations_since(0)}
    finally:
        await store.close()


def own_ids(app: App, status: int | None = None) -> set[str]:
    with app.db.lock:
        rows = app.db.conn.execute(
            "SELECT id, status FROM _offline_ops WHERE node_id = ?", (app.node_id,)
        ).fetchall()
    return {str(r[0]) for r in rows if status is None or int(r[1]) == status}


def rejected_count(app: App) -> int:
    with app.db.lock:
        return int(
            app.db.conn.execute("SELECT count(*) FROM _offline_ops WHERE status = ?", (REJECTED,)).fetchone()[
                0
            ]
        )


def snapshot(app: App) -> str:
    return json.dumps(sorted(app.collection("boards").all().fetch(), key=lambda r: r["id"]), sort_keys=True)


async def burst(app: App, index: int) -> None:
    """Inserts and updates, a chunk at a time, yielding to the sync task between chunks."""
    for chunk in range(WRITES // CHUNK):
        with app.batch():
            for n in range(CHUNK):
                record = app.boards.insert({"name": f"c{index}-{chunk}-{n}", "rank": n})
                if n % 3 == 0:
                    app.boards.update(record["id"], {"rank": n + 100})
        await asyncio.sleep(0.01)


def acknowledged(apps: list[App]) -> set[str]:
    return set().union(*(own_ids(app, ACKED) for app in apps))


async def converge(apps: list[App]) -> None:
    for app in apps:
        await app.sync.wait_until_synced(TIMEOUT * 2)
    await wait_for(lambda: len({snapshot(a) for a in apps}) == 1, "every client to hold the same records")


@contextlib.asynccontextmanager
async def running(apps: list[App]) -> Any:
    """Connected apps and a list for their writer tasks (cancelled, if still running, before the apps close)."""
    tasks: list[asyncio.Task[None]] = []
    try:
        for app in apps:
            await app.sync.connect()
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for app in apps:
            with contextlib.suppress(Exception):
                await app.sync.disconnect()
            app.close()


def make_apps(tmp_path: Path, url: str) -> list[App]:
    return [
        create_app(SCHEMA, sync={"url": url, **FAST}, path=str(tmp_path / f"client-{i}.db"))
        for i in range(CLIENTS)
    ]


def restart(server: ServerProcess) -> ServerProcess:
    """The same entry, store and port: clients reconnect to the URL they know."""
    return ServerProcess(
        server.entry, store=server.store, db=server.db, port=server.port, env=server.extra_env
    ).start()


def test_sigkill_during_a_write_burst_loses_no_acknowledged_operation(
    durable: tuple[str, str], tmp_path: Path
) -> None:
    kind, db = durable
    server = start_server(tmp_path / "server", store=kind, db=db)
    processes = [server]

    async def scenario() -> None:
        apps = make_apps(tmp_path, server.sync_url)
        async with running(apps) as writers:
            writers += [asyncio.create_task(burst(app, i)) for i, app in enumerate(apps)]
            await wait_for(lambda: len(acknowledged(apps)) >= 300, "a few hundred acknowledged operations")
            server.kill()
            promised = acknowledged(apps)  # every acknowledgement a client holds came before the kill
            written = set().union(*(own_ids(app) for app in apps))
            assert len(promised) < len(written) or not all(w.done() for w in writers)  # killed mid-burst
            missing = promised - await stored_ids(kind, db)
            assert not missing, f"{len(missing)} acknowledged operations lost by the crash"

            processes.append(restart(server))
            await asyncio.gather(*writers)
            await converge(apps)
            everything = set().union(*(own_ids(app) for app in apps))
            assert len(everything) >= CLIENTS * WRITES
            assert all(rejected_count(app) == 0 for app in apps)
            assert acknowledged(apps) == everything
            print(
                f"\n[SIGKILL {kind}] {len(promised)} acknowledged before the kill, {len(everything)} in all"
            )
        assert processes[-1].terminate() == 0
        assert everything <= await stored_ids(kind, db)

    try:
        asyncio.run(scenario())
    finally:
        for process in processes:
            process.kill()


def test_sigterm_during_a_write_burst_is_retriable_for_every_client_and_loses_nothing(tmp_path: Path) -> None:
    db = str(tmp_path / "server.db")
    # Sessions get the whole grace period to finish the batch in hand: on a loaded machine the default
    # 5 s can run out, and a session cut off at the end of it (rightly) gets no farewell.
    server = start_server(tmp_path / "server", db=db, env={"OFFLINE_SHUTDOWN_GRACE": "25"})
    processes = [server]

    async def scenario() -> None:
        apps = make_apps(tmp_path, server.sync_url)
        reasons: list[list[str]] = [[] for _ in apps]
        for app, seen in zip(apps, reasons, strict=True):
            app.events.on("sync:disconnected", lambda event, seen=seen: seen.append(str(event.reason)))
        observer = RawClient(server.sync_url)
        await observer.open()
        async with running(apps) as writers:
            writers += [asyncio.create_task(burst(app, i)) for i, app in enumerate(apps)]
            await wait_for(lambda: len(acknowledged(apps)) >= 300, "a few hundred acknowledged operations")
            code = await asyncio.to_thread(server.terminate, 30.0)
            assert code == 0, server.log_path.read_text()
            promised = acknowledged(apps)

            # What a session hears on the way out: a retriable SERVER_SHUTDOWN, then close 1012.
            assert await observer.wait_closed() == 1012
            assert [(e.code, e.retriable) for e in observer.errors] == [(p.SERVER_SHUTDOWN, True)]
            for app, seen in zip(apps, reasons, strict=True):
                assert app.sync.status != "error" and app.sync.last_error is None, (app.sync.last_error, seen)
                assert any(p.SERVER_SHUTDOWN in reason for reason in seen), (
                    seen,
                    server.log_path.read_text(),
                )
            assert promised <= await stored_ids("sqlite", db)

            processes.append(restart(server))
            await asyncio.gather(*writers)
            await converge(apps)
            everything = set().union(*(own_ids(app) for app in apps))
            assert all(rejected_count(app) == 0 for app in apps)
            assert all(app.sync.last_error is None for app in apps)
            print(f"\n[SIGTERM] {len(promised)} acknowledged before the shutdown, {len(everything)} in all")
        assert processes[-1].terminate() == 0
        assert everything <= await stored_ids("sqlite", db)

    try:
        asyncio.run(scenario())
    finally:
        for process in processes:
            process.kill()
