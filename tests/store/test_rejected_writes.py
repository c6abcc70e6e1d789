"""The rejected list: what the server refused stays recoverable on the device that wrote it.

`replication.reject_operation` is what the sync engine calls for an `operation-rejected` message; here it is
called directly (the server side of a refusal is tested in tests/sync/test_rejected_writes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from offline import OfflineError, create_app, define_schema, t
from offline.store import App
from offline.store.database import PENDING, REJECTED
from offline.store.replication import discard, mark_acknowledged, reject_operation, rejected, restamp, retry

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "notes": {
                "fields": {
                    "body": t.string(),
                    "rank": t.number().default(0),
                    "tags": t.array(t.string()).default([]),
                }
            }
        },
    }
)


def open_app(tmp_path: Path, now: Callable[[], int] | None = None) -> App:
    return create_app(SCHEMA, path=str(tmp_path / "app.db"), now=now)


def refuse_last(app: App, code: str = "SCOPE_VIOLATION", message: str = "not yours") -> str:
    op_id = app.operations()[-1].id
    assert reject_operation(app, op_id, code, message) is not None
    return op_id


def statuses(app: App) -> list[int]:
    with app.db.lock:
        return [
            int(r[0]) for r in app.db.conn.execute("SELECT status FROM _offline_ops ORDER BY sequence_number")
        ]


def test_a_refused_insert_is_listed_with_the_record_and_survives_a_restart(tmp_path: Path) -> None:
    app = open_app(tmp_path)
    events: list[Any] = []
    app.events.on("sync:rejected", events.append)
    note = app.notes.insert({"body": "mine", "rank": 3, "tags": ["a", "b"]})
    op_id = refuse_last(app)
    assert app.notes.find_by_id(note["id"]) is None  # the record shows what the server holds: nothing
    [entry] = rejected(app)
    assert entry["operationId"] == op_id
    assert (entry["collection"], entry["recordId"], entry["code"], entry["message"]) == (
        "notes",
        note["id"],
        "SCOPE_VIOLATION",
        "not yours",
    )
    assert entry["data"] == note  # the record as the device wrote it
    assert isinstance(entry["rejectedAt"], int)
    assert len(events) == 1
    assert {k: events[0][k] for k in entry} == entry
    assert events[0]["operation"].id == op_id
    app.close()

    again = open_app(tmp_path)
    try:
        assert rejected(again) == [entry]
        assert again.sync.status == "disabled"  # (a local-only app: the list lives in the store)
    finally:
        again.close()


def test_retry_writes_the_record_again_as_a_new_operation(tmp_path: Path) -> None:
    app = open_app(tmp_path)
    try:
        note = app.notes.insert({"body": "mine", "rank": 3})
        op_id = refuse_last(app)
        written = retry(app, op_id)
        assert written is not None and written["id"] == note["id"]
        assert app.notes.find_by_id(note["id"]) == note
        assert statuses(app) == [REJECTED, PENDING]  # a new operation, waiting to be sent
        assert app.operations()[-1].id != op_id
        assert rejected(app) == []
        with pytest.raises(OfflineError) as info:
            retry(app, op_id)
        assert info.value.code == "INVALID_OPERATION"
        assert info.value.context is not None and info.value.context["operationId"] == op_id
    finally:
        app.close()


def test_a_refused_update_reverts_to_the_servers_state_and_retry_reapplies_it(tmp_path: Path) -> None:
    app = open_app(tmp_path)
    try:
        note = app.notes.insert({"body": "first", "rank": 1})
        mark_acknowledged(app, [1])  # the server stored the insert
        app.notes.update(note["id"], {"body": "second"})
        op_id = refuse_last(app, "INVALID_TRANSITION", "no")
        assert app.notes.find_by_id(note["id"])["body"] == "first"
        [entry] = rejected(app)
        assert entry["data"]["body"] == "second" and entry["data"]["rank"] == 1
        retry(app, op_id)
        assert app.notes.find_by_id(note["id"])["body"] == "second"
        assert rejected(app) == []
    finally:
        app.close()


def test_a_refused_delete_is_listed_and_retry_deletes_again(tmp_path: Path) -> None:
    app = open_app(tmp_path)
    try:
        note = app.notes.insert({"body": "keep?"})
        mark_acknowledged(app, [1])
        app.notes.delete(note["id"])
        op_id = refuse_last(app)
        assert app.notes.find_by_id(note["id"]) == note  # the server kept it: so does the device
        [entry] = rejected(app)
        assert entry["data"] is None and entry["recordId"] == note["id"]
        assert retry(app, op_id) is None
        assert app.notes.find_by_id(note["id"]) is None
    finally:
        app.close()


def test_discard_forgets_a_refusal(tmp_path: Path) -> None:
    app = open_app(tmp_path)
    try:
        app.notes.insert({"body": "gone"})
        op_id = refuse_last(app)
        assert discard(app, op_id) is True
        assert rejected(app) == []
        assert discard(app, op_id) is False
        assert app.notes.count() == 0
    finally:
        app.close()


def test_a_refusal_delivered_twice_is_listed_and_announced_once(tmp_path: Path) -> None:
    app = open_app(tmp_path)
    events: list[Any] = []
    app.events.on("sync:rejected", events.append)
    try:
        app.notes.insert({"body": "once"})
        op_id = refuse_last(app)
        assert reject_operation(app, op_id, "SCOPE_VIOLATION", "not yours") is None
        assert len(rejected(app)) == 1 and len(events) == 1
    finally:
        app.close()


def test_a_clock_refusal_writes_the_operation_again_once(tmp_path: Path) -> None:
    """What `restamp` does for a `CLOCK_DRIFT` refusal: the write again under a new id, in its place in the
    record; the same refusal delivered again changes nothing and lists nothing. The clock stands still, so the
    write made again falls in the refused one's millisecond (its id must differ all the same)."""
    app = open_app(tmp_path, now=lambda: 1_700_000_000_000)
    try:
        note = app.notes.insert({"body": "early", "rank": 1})
        old = app.operations()[-1]
        again = restamp(app, old.id, ceiling=old.timestamp.wall_time + 1)
        assert again is not None and again.id != old.id
        assert (again.type, again.data, again.sequence_number) == ("insert", old.data, 2)
        assert app.notes.find_by_id(note["id"]) == note
        assert restamp(app, old.id, ceiling=old.timestamp.wall_time + 1) == old  # delivered twice
        assert reject_operation(app, old.id, "CLOCK_DRIFT", "ahead") is None  # nor is it listed
        assert rejected(app) == [] and statuses(app) == [REJECTED, PENDING]
    finally:
        app.close()
