"""`app.events`: SPEC 6.1 event types emitted by the local store, with their payload fields."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import INVALID_OPERATION, MergeTrace, OfflineError, Operation, create_app, define_schema, t
from offline.store import EVENT_TYPES, App, OfflineEvent

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {"fields": {"title": t.string(), "done": t.boolean().default(False)}},
            "projects": {"fields": {"name": t.string()}},
        },
    }
)

SPEC_6_1 = {
    "operation:created": {"operation"},
    "operation:applied": {"operation", "duration"},
    "merge:started": {"operationA", "operationB"},
    "merge:completed": {"trace"},
    "merge:conflict": {"trace"},
    "constraint:violated": {"constraint", "trace"},
    "sync:connected": {"nodeId"},
    "sync:disconnected": {"reason"},
    "sync:sent": {"operations", "batchSize"},
    "sync:received": {"operations", "batchSize"},
    "sync:acknowledged": {"sequenceNumber"},
    "query:subscribed": {"queryId", "collection"},
    "query:invalidated": {"queryId", "trigger"},
    "query:executed": {"queryId", "duration", "resultCount"},
    "connection:quality": {"quality"},
}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    application = create_app(SCHEMA, path=str(tmp_path / "app.db"))
    yield application
    application.close()


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[App]:
    application = create_app(SCHEMA, path=str(tmp_path / "peer.db"))
    yield application
    application.close()


class Log:
    def __init__(self, app: App, *types: str) -> None:
        self.events: list[OfflineEvent] = []
        for event_type in types:
            app.events.on(event_type, self.events.append)

    def of(self, event_type: str) -> list[OfflineEvent]:
        return [e for e in self.events if e.type == event_type]

    @property
    def types(self) -> list[str]:
        return [e.type for e in self.events]


def test_every_spec_event_type_can_be_listened_to(app: App) -> None:
    for event_type, fields in SPEC_6_1.items():
        assert event_type in EVENT_TYPES
        assert set(EVENT_TYPES[event_type]) == fields
        off = app.events.on(event_type, lambda event: None)
        off()


def test_unknown_event_type_is_refused(app: App) -> None:
    with pytest.raises(OfflineError) as info:
        app.events.on("operation:exploded", lambda event: None)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["received"] == "operation:exploded"


def test_operation_created_and_applied_on_local_writes(app: App) -> None:
    log = Log(app, "operation:created", "operation:applied")
    record = app.todos.insert({"title": "a"})
    app.todos.update(record["id"], {"done": True})
    app.todos.delete(record["id"])
    ops = app.operations()
    created = log.of("operation:created")
    assert [e.operation for e in created] == ops
    assert [e["operation"].type for e in created] == ["insert", "update", "delete"]
    applied = log.of("operation:applied")
    assert [e.operation for e in applied] == ops
    for event in applied:
        assert isinstance(event.duration, float | int)
        assert event.duration >= 0
    # created comes before applied for each write.
    assert log.types == ["operation:created", "operation:applied"] * 3


def test_event_payload_readable_as_attribute_item_and_get(app: App) -> None:
    log = Log(app, "operation:created")
    app.todos.insert({"title": "a"})
    (event,) = log.events
    assert event.type == "operation:created"
    assert event["type"] == "operation:created"
    assert isinstance(event.operation, Operation)
    assert event["operation"] is event.operation
    assert event.get("operation") is event.operation
    assert event.get("missing", 7) == 7
    assert set(event.payload) == SPEC_6_1["operation:created"]


def test_events_run_before_the_write_returns(app: App) -> None:
    seen: list[str] = []
    app.events.on("operation:created", lambda e: seen.append(e.operation.record_id))
    record = app.todos.insert({"title": "a"})
    assert seen == [record["id"]]


def test_remote_apply_emits_applied_not_created(app: App, peer: App) -> None:
    log = Log(app, "operation:created", "operation:applied")
    peer.todos.insert({"title": "remote"})
    peer.todos.insert({"title": "remote 2"})
    remote = peer.operations()
    app.apply(remote)
    assert log.of("operation:created") == []
    applied = log.of("operation:applied")
    assert [e.operation.id for e in applied] == [op.id for op in remote]
    assert all(e.duration >= 0 for e in applied)
    # Re-applying known operations emits nothing.
    app.apply(remote)
    assert len(log.events) == 2


def _conflict(app: App, peer: App) -> tuple[str, Operation, Operation]:
    record = app.todos.insert({"title": "base"})
    peer.apply(app.operations())
    app.todos.update(record["id"], {"title": "mine"})
    peer.todos.update(record["id"], {"title": "theirs"})
    mine = app.operations()[-1]
    theirs = peer.operations()[-1]
    return record["id"], mine, theirs


def test_conflicting_apply_emits_merge_events_with_trace(app: App, peer: App) -> None:
    record_id, mine, theirs = _conflict(app, peer)
    log = Log(app, "merge:started", "merge:conflict", "merge:completed", "operation:applied")
    app.apply([theirs])
    assert log.types == ["merge:started", "merge:conflict", "merge:completed", "operation:applied"]

    earlier, later = sorted(
        [mine, theirs], key=lambda op: (op.timestamp.wall_time, op.timestamp.logical, op.timestamp.node_id)
    )
    started = log.of("merge:started")[0]
    assert set(started.payload) == {"operationA", "operationB"}
    assert {started.operationA.id, started.operationB.id} == {mine.id, theirs.id}
    assert started.operationA.id == earlier.id
    assert started.operationB.id == later.id

    (conflict,) = log.of("merge:conflict")
    (completed,) = log.of("merge:completed")
    for event in (conflict, completed):
        trace = event.trace
        assert isinstance(trace, MergeTrace)
        assert trace.field == "title"
        assert trace.strategy == "lww"
        assert trace.tier == 1
        assert trace.base == "base"
        assert trace.operation_a.id == earlier.id
        assert trace.operation_b.id == later.id
        assert trace.input_a == dict(earlier.data)["title"]
        assert trace.input_b == dict(later.data)["title"]
        assert trace.output == dict(later.data)["title"]
    # The record holds the merge output, and both replicas agree once both have everything.
    merged = app.todos.find_by_id(record_id)
    assert merged["title"] == conflict.trace.output
    peer.apply(app.operations())
    assert peer.todos.find_by_id(record_id) == merged


def test_non_conflicting_apply_emits_no_merge_conflict(app: App, peer: App) -> None:
    record = app.todos.insert({"title": "base"})
    peer.apply(app.operations())
    app.todos.update(record["id"], {"title": "mine"})
    peer.todos.update(record["id"], {"done": True})  # another field: no conflict
    log = Log(app, "merge:conflict", "merge:started", "merge:completed")
    app.apply(peer.operations(after=app.version_vector))
    assert log.events == []
    assert app.todos.find_by_id(record["id"]) == {**record, "title": "mine", "done": True}


def test_query_events(app: App) -> None:
    log = Log(app, "query:subscribed", "query:invalidated", "query:executed")
    app.todos.where({}).subscribe(lambda records: None)
    subscribed = log.of("query:subscribed")
    assert len(subscribed) == 1
    query_id = subscribed[0].queryId
    assert isinstance(query_id, str) and query_id
    assert subscribed[0].collection == "todos"
    executed = log.of("query:executed")
    assert len(executed) == 1
    assert executed[0].queryId == query_id
    assert executed[0].resultCount == 0
    assert executed[0].duration >= 0

    record = app.todos.insert({"title": "a"})
    (invalidated,) = log.of("query:invalidated")
    assert invalidated.queryId == query_id
    assert isinstance(invalidated.trigger, Operation)
    assert invalidated.trigger.record_id == record["id"]
    executed = log.of("query:executed")
    assert len(executed) == 2
    assert executed[1].resultCount == 1
    for event in log.events:
        assert set(event.payload) == SPEC_6_1[event.type]


def test_query_ids_are_distinct_and_unrelated_writes_do_not_invalidate(app: App) -> None:
    log = Log(app, "query:subscribed", "query:invalidated")
    app.todos.where({}).subscribe(lambda records: None)
    app.todos.where({"done": True}).subscribe(lambda records: None)
    ids = [e.queryId for e in log.of("query:subscribed")]
    assert len(set(ids)) == 2
    app.projects.insert({"name": "p"})
    assert log.of("query:invalidated") == []
    app.todos.insert({"title": "a"})
    assert sorted(e.queryId for e in log.of("query:invalidated")) == sorted(ids)


def test_wildcard_receives_every_event(app: App) -> None:
    everything: list[OfflineEvent] = []
    app.events.on("*", everything.append)
    app.todos.where({}).subscribe(lambda records: None)
    app.todos.insert({"title": "a"})
    types = [e.type for e in everything]
    for expected in (
        "query:subscribed",
        "query:executed",
        "operation:created",
        "operation:applied",
        "query:invalidated",
    ):
        assert expected in types
    for event in everything:
        assert set(event.payload) == SPEC_6_1[event.type]


def test_off_and_unsubscribe_stop_delivery(app: App) -> None:
    first: list[Any] = []
    second: list[Any] = []
    off = app.events.on("operation:created", first.append)
    app.events.on("operation:created", second.append)
    app.todos.insert({"title": "a"})
    off()
    app.events.off("operation:created", second.append)
    app.todos.insert({"title": "b"})
    assert len(first) == 1
    assert len(second) == 1


def test_handler_errors_are_isolated(app: App, caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: OfflineEvent) -> None:
        raise ValueError("handler bug")

    healthy: list[OfflineEvent] = []
    app.events.on("operation:created", broken)
    app.events.on("*", broken)
    app.events.on("operation:created", healthy.append)
    record = app.todos.insert({"title": "a"})
    assert app.todos.find_by_id(record["id"]) == record
    assert len(healthy) == 1
    assert len(app.operations()) == 1
    assert "handler bug" in caplog.text


def test_batch_emits_events_once_after_commit(app: App) -> None:
    log = Log(app, "operation:created")
    with app.batch():
        app.todos.insert({"title": "a"})
        app.todos.insert({"title": "b"})
        assert log.events == []
    assert [e.operation for e in log.events] == app.operations()


def test_rolled_back_batch_emits_nothing(app: App) -> None:
    log = Log(app, "*")
    with pytest.raises(RuntimeError), app.batch():
        app.todos.insert({"title": "a"})
        raise RuntimeError("abort")
    assert log.events == []


def test_remote_apply_inside_a_batch_is_announced_when_the_batch_commits(app: App, peer: App) -> None:
    log = Log(app, "operation:applied", "operation:created")
    seen: list[list[str]] = []
    app.todos.where({}).subscribe(lambda records: seen.append(sorted(r["title"] for r in records)))
    peer.todos.insert({"title": "remote"})
    with app.batch():
        app.apply(peer.operations())
        app.todos.insert({"title": "local"})
        assert log.events == [] and seen == [[]]  # nothing announced before the commit
    created = [e.operation.id for e in log.of("operation:created")]
    assert len(created) == 1
    remote = [op.id for op in peer.operations()]
    assert sorted(e.operation.id for e in log.of("operation:applied")) == sorted(created + remote)
    assert seen[-1] == ["local", "remote"]


def test_remote_apply_inside_a_rolled_back_batch_announces_nothing(app: App, peer: App) -> None:
    log = Log(app, "*")
    peer.todos.insert({"title": "remote"})
    with pytest.raises(RuntimeError), app.batch():
        app.apply(peer.operations())
        raise RuntimeError("abort")
    assert log.events == []
    assert app.todos.where({}).count() == 0
    assert app.apply(peer.operations())  # not held: it applies now
    assert len(log.of("operation:applied")) == 1
