"""The optimistic store writer the sync core commits with (``store.writer(optimistic=True)``).

With SQLite, a group of new operations goes to the database thread once, BEGIN to COMMIT, checking that no
other process wrote since the store's last commit; when one did, nothing is written, `WriteConflict` is
raised and the sync core judges the group again. Every store answers `known_operations` like `known_ids`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from server_runtime.stores import ServerStore, WriteConflict, create_sqlite_server_store
from server_runtime.stores import sqlite as sqlite_store
from server_runtime.sync import SyncService

from .test_stores import Backend, append, backend, make_op, row_for, schema

__all__ = ["backend"]


class Trips:
    """Counts the SQLite store's trips to its connection thread (each `_run_steps` call) and their steps."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps: list[list[str]] = []
        original = sqlite_store._run_steps

        async def counted(conn: Any, steps: Sequence[Any]) -> Any:
            self.steps.append([f"{kind} {sql.split()[0]}" for kind, sql, _ in steps])
            return await original(conn, steps)

        monkeypatch.setattr(sqlite_store, "_run_steps", counted)

    def take(self) -> list[list[str]]:
        taken, self.steps = self.steps, []
        return taken


async def _sqlite(path: Path) -> ServerStore:
    store = create_sqlite_server_store(path)
    await store.set_schema(schema())
    return store


def test_new_operations_are_stored_in_one_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trips = Trips(monkeypatch)

    async def main() -> None:
        store = await _sqlite(tmp_path / "server.db")
        try:
            first = make_op(seq=1)
            async with store.writer(optimistic=True) as writer:  # learns the store's tails: one BEGIN trip
                assert await writer.known_operations([first]) == set()
                assert await writer.append([(first, None)]) == [1]
            trips.take()
            new = [make_op(seq=2, record="r2"), make_op("node-b", 1, "r3")]
            async with store.writer(optimistic=True) as writer:
                assert await writer.operations_since(1) == []  # nothing after what this store committed
                assert await writer.known_operations(new) == set()
                assert await writer.append([(op, None) for op in new]) == [2, 3]
                await writer.save_rows([row_for(new[:1], record="r2")])
            assert trips.take() == [
                [
                    "execute BEGIN",
                    "expect SELECT",
                    "rows INSERT",
                    "rows INSERT",
                    "execute COMMIT",
                ]
            ]
            assert [s.operation.id for s in await store.operations_since(0)] == [
                first.id,
                *(o.id for o in new),
            ]
            assert await store.version_vector() == {"node-a": 2, "node-b": 1}
            # An operation at or below its node's highest stored sequence number is looked up (it may be
            # stored), in the trip that opens the transaction.
            again = make_op(seq=2, record="r2")
            async with store.writer(optimistic=True) as writer:
                assert await writer.known_operations([again, make_op(seq=3)]) == {again.id}
                assert await writer.append([(again, None)]) == [None]
            assert trips.take() == [["execute BEGIN", "expect SELECT", "fetch WITH"], ["execute COMMIT"]]
            # Nothing read or written: no transaction at all.
            async with store.writer(optimistic=True):
                pass
            assert trips.take() == []
        finally:
            await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("trips", ["one trip", "a call a statement"])
def test_a_write_by_another_process_is_noticed_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trips: str
) -> None:
    if trips == "a call a statement":  # aiosqlite without the private runner: `_run_steps` falls back
        monkeypatch.setattr(sqlite_store, "_thread_runner", lambda conn: None)

    async def main() -> None:
        path = tmp_path / "server.db"
        mine, other = await _sqlite(path), await _sqlite(path)
        try:
            async with mine.writer(optimistic=True) as writer:  # mine now knows the store's tails
                assert await writer.append([(make_op(seq=1), None)]) == [1]
            assert await append(other, make_op("node-b", 1, "r2")) == [2]  # "another process"
            late = make_op(seq=2, record="r3")
            with pytest.raises(WriteConflict):
                async with mine.writer(optimistic=True) as writer:
                    assert await writer.operations_since(1) == []  # believed: nothing new
                    await writer.append([(late, None)])
            assert await mine.max_delivery() == 2  # nothing of it was written
            # The next writer holds the lock from BEGIN and reads what the other process wrote.
            async with mine.writer(optimistic=True) as writer:
                assert [s.delivery for s in await writer.operations_since(1)] == [2]
                assert await writer.append([(late, None)]) == [3]
            # A read opens the transaction with the same check.
            assert await append(other, make_op("node-b", 2, "r4")) == [4]
            with pytest.raises(WriteConflict):
                async with mine.writer(optimistic=True) as writer:
                    await writer.load_rows([("todos", "r1")])
            async with mine.writer(optimistic=True) as writer:
                assert [s.delivery for s in await writer.operations_since(3)] == [4]
        finally:
            await mine.close()
            await other.close()

    asyncio.run(main())


def test_a_failed_writer_leaves_the_next_one_holding_the_lock_from_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = Trips(monkeypatch)

    async def main() -> None:
        store = await _sqlite(tmp_path / "server.db")
        try:
            await append(store, make_op(seq=1))
            async with store.writer(optimistic=True):
                pass
            with pytest.raises(RuntimeError):
                async with store.writer(optimistic=True) as writer:
                    await writer.append([(make_op(seq=2), None)])
                    raise RuntimeError("the caller failed")
            trips.take()
            async with store.writer(optimistic=True) as writer:
                assert await writer.append([(make_op(seq=2), None)]) == [2]
            assert trips.take() == [
                ["execute BEGIN", "fetch SELECT", "fetch SELECT"],  # the highest delivery, each node's tail
                ["rows INSERT", "execute COMMIT"],
            ]
        finally:
            await store.close()

    asyncio.run(main())


def test_known_operations_answers_like_known_ids(backend: Backend) -> None:
    async def test(store: ServerStore) -> None:
        a, b = make_op(seq=1), make_op(seq=2, record="r2")
        await append(store, a, b)
        forged = make_op(seq=2, record="r9")  # b's place, other content: not stored
        for optimistic in (False, True, True):
            async with store.writer(optimistic=optimistic) as writer:
                found = await writer.known_operations([a, forged, make_op(seq=3), make_op("node-z", 1)])
                assert found == {a.id}
                assert await writer.known_operations([]) == set()

    backend.run(test)


def test_the_sync_core_judges_again_after_another_process_wrote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        path = tmp_path / "server.db"
        mine, other = await _sqlite(path), await _sqlite(path)
        service, elsewhere = SyncService(mine), SyncService(other)  # two processes, as it were
        await service.start()
        await elsewhere.start()
        try:
            first = make_op(seq=1)
            assert await service.commit(None, [first]) == {first.id: 1}
            theirs = make_op("node-b", 1, "r2")
            assert await elsewhere.commit(None, [theirs]) == {theirs.id: 2}
            # The same record, updated here: judged again on top of the other process's write.
            update = make_op("node-c", 1, "r2", type_="update", data={"title": "mine"})
            with caplog.at_level(logging.WARNING, logger="offline.server.sync"):
                assert await service.commit(None, [update]) == {update.id: 3}
            assert "judging the batch again" in caplog.text
            assert [s.operation.id for s in await mine.operations_since(0)] == [
                first.id,
                theirs.id,
                update.id,
            ]
            assert [r.delivery for r in await service.read_since(0, 10)] == [1, 2, 3]
            rows = await mine.load_rows([("todos", "r2")])
            assert rows[("todos", "r2")].record is not None
            assert rows[("todos", "r2")].record["title"] == "mine"
        finally:
            await service.stop()
            await elsewhere.stop()
            await mine.close()
            await other.close()

    asyncio.run(main())


def test_an_operation_resent_under_a_higher_sequence_number_is_still_a_duplicate(tmp_path: Path) -> None:
    """An id hashes the operation's content, not its sequence number: a peer resending a stored operation
    under a higher one is not new for all its number. The optimistic trip is refused by the id's unique index
    (nothing written, WriteConflict) and the next writer looks the id up; the sync core answers "duplicate"."""

    async def main() -> None:
        store = await _sqlite(tmp_path / "server.db")
        service = SyncService(store)
        await service.start()
        try:
            first = make_op(seq=1)
            again = dataclasses.replace(first, sequence_number=7)
            assert again.id == first.id
            assert await service.commit(None, [first]) == {first.id: 1}
            assert await service.commit(None, [again]) == {first.id: None}
            assert await service.commit(None, [make_op(seq=8, record="r2")]) != {}
            stored = await store.operations_since(0)
            assert [s.delivery for s in stored] == [1, 2]
            assert [s.operation.sequence_number for s in stored] == [1, 8]
            # The store alone: the optimistic writer's trip is refused, the next one finds the id.
            with pytest.raises(WriteConflict):
                async with store.writer(optimistic=True) as writer:
                    assert (
                        await writer.known_operations([dataclasses.replace(first, sequence_number=9)])
                        == set()
                    )
                    await writer.append([(dataclasses.replace(first, sequence_number=9), None)])
            async with store.writer(optimistic=True) as writer:
                assert await writer.known_operations([dataclasses.replace(first, sequence_number=9)]) == {
                    first.id
                }
            assert await store.max_delivery() == 2
        finally:
            await service.stop()
            await store.close()

    asyncio.run(main())
