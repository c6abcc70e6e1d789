"""A ``record-states`` message applied by the sync client (`SyncEngine._adopt_states`), without a server: what
it stores and how many transactions that takes (issue 28: a first sync of 20,000 records is 40 of them, and a
commit is several flushes of the browser's storage)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from offline import create_app
from offline.merge.engine import RecordState
from offline.store import App
from offline.store.replication import delivery_watermark
from offline.sync import protocol as p
from tests.merge._support import SCHEMA


class _Connection:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, text: str) -> None:
        self.sent.append({"text": text})


def _states(writer: App, count: int) -> list[dict[str, Any]]:
    ids = [writer.items.insert({"title": f"item {i}", "count": i})["id"] for i in range(count)]
    writer.flush()
    out = []
    for record_id in ids:
        state = writer.db.load_state("items", record_id)
        assert isinstance(state, RecordState)
        out.append(
            {
                "collection": "items",
                "recordId": record_id,
                "state": state.to_json(),
                "versions": {writer.node_id: 1},
            }
        )
    return out


def test_a_record_states_message_stores_its_states_and_its_progress_in_one_commit(tmp_path: Path) -> None:
    writer = create_app(SCHEMA, path=str(tmp_path / "writer.db"))
    fresh = create_app(SCHEMA, sync={"url": "ws://127.0.0.1:9/sync"}, path=str(tmp_path / "fresh.db"))
    try:
        states = _states(writer, 3)
        statements: list[str] = []
        fresh.db.conn.set_trace_callback(statements.append)
        connection = _Connection()
        for index, through in enumerate((40, 90)):
            message = p.RecordStates(
                message_id=p.new_message_id(), states=tuple(states[index::2]), is_final=False, through=through
            )
            asyncio.run(fresh.sync._adopt_states(connection, message))
            # The states and how far the catch-up got, together: a cut after the commit resumes from there
            # with the states held, a cut before it loses both.
            assert statements.count("COMMIT") == index + 1
            assert delivery_watermark(fresh) == through
        fresh.db.conn.set_trace_callback(None)
        assert sorted(r["title"] for r in fresh.items.all().fetch()) == ["item 0", "item 1", "item 2"]
        assert len(connection.sent) == 2  # each acknowledged
        # A message without states still moves the progress.
        empty = p.RecordStates(message_id=p.new_message_id(), states=(), is_final=False, through=120)
        asyncio.run(fresh.sync._adopt_states(connection, empty))
        assert delivery_watermark(fresh) == 120
    finally:
        writer.close()
        fresh.close()
