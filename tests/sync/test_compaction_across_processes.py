"""A compaction done through one server process reaches the catch-ups another process serves (issue 24).

Two real server processes share one PostgreSQL database. Process B learns of new operations over LISTEN/NOTIFY,
but of a compaction through process A only from the store: a catch-up page B reads from the store after A
deleted operations lacks them, so B must notice the horizon moved and send record states instead of a page
with holes. The session here reads its catch-up from the store (B started after the writes, so they are not
in its memory) and never acknowledges: B streams the page again after its acknowledgement timeout, once
before A compacts and again after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from offline.core.uuid7 import generate_uuid_v7
from offline.sync import protocol as p
from tests.support.servers import ServerProcess, write_entry
from tests.sync.test_integration import GENERAL_SOURCE, TIMEOUT, client, clients

ADMIN = "admin-token-for-compaction-across-processes"


def test_a_catch_up_on_another_process_gets_states_for_what_a_compaction_deleted(
    postgres_url: str, tmp_path: Path
) -> None:
    entry = write_entry(tmp_path, GENERAL_SOURCE)
    env = {"OFFLINE_ADMIN_TOKEN": ADMIN, "OFFLINE_ACK_TIMEOUT": "2"}
    first = ServerProcess(entry, store="postgres", db=postgres_url, env=env, log_path=tmp_path / "a.log")
    second = ServerProcess(entry, store="postgres", db=postgres_url, env=env, log_path=tmp_path / "b.log")
    try:
        first.start()
        asyncio.run(_write(tmp_path, first.sync_url))
        second.start()  # after the writes: its catch-ups read them from the store
        asyncio.run(_catch_up_across_a_compaction(first.http_url, second.sync_url))
    finally:
        second.terminate(timeout=10)
        first.terminate(timeout=10)


async def _write(tmp_path: Path, url: str) -> None:
    """Records edited several times (so a compaction deletes all but each one's latest operation)."""
    writer = client(tmp_path, "writer", url)
    async with clients(writer):
        await writer.sync.connect()
        for i in range(5):
            record = writer.items.insert({"title": f"item {i}"})
            writer.items.update(record["id"], {"done": True})
            writer.items.update(record["id"], {"count": 3})
        await writer.sync.wait_until_synced(TIMEOUT)


async def _catch_up_across_a_compaction(admin_url: str, sync_url: str) -> None:
    hello = p.Handshake(p.new_message_id(), generate_uuid_v7(), {}, 1, 0)
    async with connect(sync_url, max_size=8 * 1024 * 1024) as ws:
        await ws.send(p.encode(hello))
        answer = p.decode(await asyncio.wait_for(ws.recv(), TIMEOUT))
        assert isinstance(answer, p.HandshakeResponse) and answer.accepted
        first = await _next_batch(ws)
        everything = _ids(first)
        assert len(everything) == 15
        records = {(op["collection"], op["recordId"]) for op in first.operations}

        compacted = await asyncio.to_thread(
            lambda: httpx.post(
                f"{admin_url}/__offline/compact",
                headers={"Authorization": f"Bearer {ADMIN}"},
                timeout=TIMEOUT,
            ).json()
        )
        assert compacted["dropped"] == 10

        # Unacknowledged, the page comes again (the wait doubling each time). Until B reads it after the
        # compaction it is whole; from then on what it lacks must come as record states.
        covered: set[tuple[str, str]] = set()
        deadline = time.monotonic() + 4 * TIMEOUT
        while True:
            message = p.decode(await asyncio.wait_for(ws.recv(), max(1.0, deadline - time.monotonic())))
            if isinstance(message, p.RecordStates):
                covered |= {(s["collection"], s["recordId"]) for s in message.states}
                if message.is_final:
                    assert message.horizon == answer.server_max_delivery_sequence
                    assert covered == records
                    return
                continue
            assert isinstance(message, p.OperationBatch), message
            assert _ids(message) == everything, (
                f"a catch-up page B read after the compaction lacks {len(everything - _ids(message))} "
                "operations and no record states stand for them"
            )


async def _next_batch(ws: Any) -> p.OperationBatch:
    while True:
        message = p.decode(await asyncio.wait_for(ws.recv(), TIMEOUT))
        if isinstance(message, p.OperationBatch):
            return message


def _ids(batch: p.OperationBatch) -> set[str]:
    return {op["id"] for op in batch.operations}


@pytest.mark.parametrize("learned", ["notified", "committing"])
def test_operations_learned_of_after_another_process_compacted_them_reach_live_sessions_as_states(
    postgres_url: str, learned: str
) -> None:
    """Process B hears of A's commits over LISTEN/NOTIFY and reads them from the store. When A compacts before
    B reads them (the notification is held back here until then), the operations B reads lack the deleted
    ones; B's live session must get the record's state, not only what was kept. B reads them when notified,
    or first when it commits a write of its own (in its write transaction). (Two stores on one database
    stand for the two processes: the notification's timing is what is tested, and it is held by hand.)"""
    from server_runtime import create_relational_server_store
    from server_runtime.sync import Session, SyncService
    from tests.server.test_scoped_catch_up import NODES, SCHEMA, Writers

    async def scenario() -> None:
        store_a = await create_relational_server_store(postgres_url, max_size=4)
        store_b = await create_relational_server_store(postgres_url, max_size=4)
        held: list[Any] = []

        async def hold(callback: Any) -> None:
            held.append(callback)

        store_b.listen = hold  # type: ignore[method-assign]
        a, b = SyncService(store_a), SyncService(store_b)
        sent: list[p.Message] = []

        async def send(text: str) -> None:
            sent.append(p.decode(text))

        try:
            for store in (store_a, store_b):
                await store.set_schema(SCHEMA)
            await a.start()
            writers = Writers()
            node = NODES[0]
            record = generate_uuid_v7()
            await a.commit(
                None, [writers.op(node, "insert", "todos", record, {"ownerId": "a", "title": "t"})]
            )
            await b.start()
            session = Session("reader", {"todos": {}}, None, send, cursor=b.watermark)
            b.sessions.add(session)
            relay = asyncio.create_task(b.relay(session))
            try:
                # Kept (another record's only operation): B then serves the session from memory.
                other = writers.op(
                    NODES[1], "insert", "todos", generate_uuid_v7(), {"ownerId": "a", "title": "o"}
                )
                await a.commit(None, [other])
                # The retitle is neither the record's latest operation nor its node's highest: compacted.
                await a.commit(None, [writers.op(node, "update", "todos", record, {"title": "retitled"})])
                await a.commit(None, [writers.op(node, "update", "todos", record, {"ownerId": "b"})])
                await a.commit(None, [writers.op(node, "insert", "tags", generate_uuid_v7(), {"name": "x"})])
                assert (await a.compact())["dropped"] >= 1
                (callback,) = held
                if learned == "notified":
                    await callback(await store_a.max_delivery())
                else:
                    tag = writers.op(NODES[1], "insert", "tags", generate_uuid_v7(), {"name": "y"})
                    await b.commit(None, [tag])

                def title_seen() -> bool:
                    for message in sent:
                        if isinstance(message, p.OperationBatch) and any(
                            (o.get("data") or {}).get("title") == "retitled" for o in message.operations
                        ):
                            return True
                        if isinstance(message, p.RecordStates) and any(
                            s["recordId"] == record and "retitled" in s["state"] for s in message.states
                        ):
                            return True
                    return False

                deadline = time.monotonic() + TIMEOUT
                while not title_seen():
                    assert time.monotonic() < deadline, f"the retitle never reached B's session: {sent}"
                    await asyncio.sleep(0.05)
            finally:
                relay.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await relay
        finally:
            await b.stop()
            await a.stop()
            await store_b.close()
            await store_a.close()

    asyncio.run(scenario())
