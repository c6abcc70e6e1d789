"""Collection writes: insert, update, delete, validation (SPEC 2.4-2.5, 7.1; DESIGN.md section 2)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import INVALID_OPERATION, OfflineError, create_app, define_schema, t
from offline.store import App

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "items": {
                "fields": {
                    "title": t.string(),
                    "count": t.number().optional(),
                    "flag": t.boolean().optional(),
                    "status": t.enum(["todo", "doing", "done"]).default("todo"),
                    "due": t.timestamp().optional(),
                    "tags": t.array(t.string()).default([]),
                    "scores": t.array(t.number()).optional(),
                    "notes": t.richtext(),
                    "created": t.timestamp().auto(),
                }
            },
            "other": {"fields": {"name": t.string()}},
        },
    }
)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    application = create_app(SCHEMA, path=str(tmp_path / "app.db"), now=lambda: 1_700_000_000_000)
    yield application
    application.close()


def _error(exc_info: pytest.ExceptionInfo[OfflineError]) -> dict[str, Any]:
    assert exc_info.value.code == INVALID_OPERATION
    assert exc_info.value.name == "OfflineError"
    assert exc_info.value.context is not None
    return exc_info.value.context


# -- insert -------------------------------------------------------------------------------------------------


def test_insert_returns_plain_dict_with_uuid_v7_id_and_every_field(app: App) -> None:
    record = app.items.insert({"title": "write tests"})
    assert type(record) is dict
    assert set(record) == {"id", *SCHEMA.collections["items"].fields}
    parsed = uuid.UUID(record["id"])
    assert parsed.version == 7
    assert str(parsed) == record["id"]
    assert record == {
        "id": record["id"],
        "title": "write tests",
        "count": None,
        "flag": None,
        "status": "todo",
        "due": None,
        "tags": [],
        "scores": None,
        "notes": "",
        "created": 1_700_000_000_000,
    }
    assert app.items.find_by_id(record["id"]) == record


def test_insert_ids_are_unique_and_increasing(app: App) -> None:
    ids = [app.items.insert({"title": str(i)})["id"] for i in range(50)]
    assert len(set(ids)) == 50
    assert ids == sorted(ids)


def test_defaults_are_applied_and_array_default_is_a_fresh_copy(app: App) -> None:
    a = app.items.insert({"title": "a"})
    b = app.items.insert({"title": "b"})
    assert a["status"] == "todo" and a["tags"] == []
    assert a["tags"] is not b["tags"]
    a["tags"].append("mutated")
    assert b["tags"] == []
    assert app.items.find_by_id(a["id"])["tags"] == []
    c = app.items.insert({"title": "c"})
    assert c["tags"] == []


def test_default_can_be_overridden(app: App) -> None:
    record = app.items.insert({"title": "x", "status": "done", "tags": ["a", "b"]})
    assert record["status"] == "done"
    assert record["tags"] == ["a", "b"]


def test_returned_record_is_not_linked_to_the_store(app: App) -> None:
    record = app.items.insert({"title": "x", "tags": ["a"]})
    record["title"] = "changed"
    record["tags"].append("b")
    stored = app.items.find_by_id(record["id"])
    assert stored["title"] == "x"
    assert stored["tags"] == ["a"]


def test_auto_timestamp_is_set_by_the_system(tmp_path: Path) -> None:
    ticks = iter(range(1_000, 10_000_000, 1_000))
    app = create_app(SCHEMA, path=str(tmp_path / "auto.db"), now=lambda: next(ticks))
    try:
        record = app.items.insert({"title": "x"})
        assert isinstance(record["created"], int)
        assert record["created"] > 0
        assert app.items.find_by_id(record["id"])["created"] == record["created"]
    finally:
        app.close()


def test_auto_timestamp_uses_wall_clock_by_default(tmp_path: Path) -> None:
    import time

    app = create_app(SCHEMA, path=str(tmp_path / "wall.db"))
    try:
        before = time.time_ns() // 1_000_000
        record = app.items.insert({"title": "x"})
        after = time.time_ns() // 1_000_000
        assert before <= record["created"] <= after
    finally:
        app.close()


@pytest.mark.parametrize("write", ["insert", "update"])
def test_auto_field_cannot_be_provided(app: App, write: str) -> None:
    existing = app.items.insert({"title": "x"})
    with pytest.raises(OfflineError) as info:
        if write == "insert":
            app.items.insert({"title": "y", "created": 5})
        else:
            app.items.update(existing["id"], {"created": 5})
    context = _error(info)
    assert context["field"] == "created"
    assert "created" in info.value.message
    assert len(app.operations()) == 1


def test_required_field_missing(app: App) -> None:
    with pytest.raises(OfflineError) as info:
        app.items.insert({"count": 1})
    context = _error(info)
    assert context["field"] == "title"
    assert context["expected"] == "string"
    assert context["received"] == "null"
    assert app.operations() == []
    assert app.items.count() == 0


def test_required_field_cannot_be_set_to_none(app: App) -> None:
    record = app.items.insert({"title": "x"})
    with pytest.raises(OfflineError) as info:
        app.items.update(record["id"], {"title": None})
    assert _error(info)["field"] == "title"


def test_optional_field_can_be_cleared(app: App) -> None:
    record = app.items.insert({"title": "x", "count": 4})
    updated = app.items.update(record["id"], {"count": None})
    assert updated["count"] is None
    assert app.items.find_by_id(record["id"])["count"] is None


# field, bad value, expected type name, received type name
WRONG_TYPES = [
    ("title", 5, "string", "number"),
    ("title", True, "string", "boolean"),
    ("title", ["a"], "string", "array"),
    ("count", "5", "number", "string"),
    ("count", True, "number", "boolean"),
    ("count", float("nan"), "number", "number"),
    ("count", 2**60, "number", "number"),
    ("flag", 1, "boolean", "number"),
    ("flag", "true", "boolean", "string"),
    ("status", "archived", "enum", "string"),
    ("status", 3, "enum", "number"),
    ("due", "2024-01-01", "timestamp", "string"),
    ("due", 1.5, "timestamp", "number"),
    ("due", False, "timestamp", "boolean"),
    ("tags", "a,b", "array", "string"),
    ("tags", [1, 2], "array", "array"),
    ("tags", ["a", None], "array", "array"),
    ("scores", ["1"], "array", "array"),
    ("notes", 42, "richtext", "number"),
    ("notes", ["x"], "richtext", "array"),
    ("notes", b"raw", "richtext", "bytes"),
]


@pytest.mark.parametrize(("field", "value", "expected", "received"), WRONG_TYPES)
def test_insert_wrong_type_is_invalid_operation(
    app: App, field: str, value: Any, expected: str, received: str
) -> None:
    data = {"title": "ok", field: value}
    with pytest.raises(OfflineError) as info:
        app.items.insert(data)
    context = _error(info)
    assert context["field"] == field
    assert context["expected"] == expected
    assert context["received"] == received
    assert context["collection"] == "items"
    assert field in info.value.message
    assert app.operations() == []


@pytest.mark.parametrize(("field", "value", "expected", "received"), WRONG_TYPES)
def test_update_wrong_type_is_invalid_operation(
    app: App, field: str, value: Any, expected: str, received: str
) -> None:
    record = app.items.insert({"title": "ok"})
    with pytest.raises(OfflineError) as info:
        app.items.update(record["id"], {field: value})
    context = _error(info)
    assert (context["field"], context["expected"], context["received"]) == (field, expected, received)
    assert len(app.operations()) == 1
    assert app.items.find_by_id(record["id"]) == record


def test_every_valid_type_round_trips(app: App) -> None:
    record = app.items.insert(
        {
            "title": "all",
            "count": -7,
            "flag": True,
            "status": "doing",
            "due": 1_700_000_123_456,
            "tags": ["x", "y"],
            "scores": [1, 2.5],
            "notes": "hello",
        }
    )
    expected = {
        "title": "all",
        "count": -7,
        "flag": True,
        "status": "doing",
        "due": 1_700_000_123_456,
        "tags": ["x", "y"],
        "scores": [1, 2.5],
        "notes": "hello",
    }
    for source in (record, app.items.find_by_id(record["id"]), app.items.where({}).first()):
        assert source is not None
        assert {k: source[k] for k in expected} == expected
    assert type(record["flag"]) is bool


def test_unknown_field_is_refused(app: App) -> None:
    with pytest.raises(OfflineError) as info:
        app.items.insert({"title": "x", "colour": "red"})
    assert _error(info)["field"] == "colour"
    record = app.items.insert({"title": "x"})
    with pytest.raises(OfflineError) as info:
        app.items.update(record["id"], {"colour": "red"})
    assert _error(info)["field"] == "colour"


def test_insert_takes_a_mapping(app: App) -> None:
    with pytest.raises(OfflineError) as info:
        app.items.insert([("title", "x")])  # type: ignore[arg-type]
    assert info.value.code == INVALID_OPERATION


def test_caller_given_id_is_kept(app: App) -> None:
    record = app.items.insert({"id": "custom-1", "title": "mine"})
    assert record["id"] == "custom-1"
    assert app.items.find_by_id("custom-1") == record
    assert app.operations()[0].record_id == "custom-1"


@pytest.mark.parametrize("bad_id", ["", 5])
def test_caller_given_id_must_be_a_non_empty_string(app: App, bad_id: Any) -> None:
    with pytest.raises(OfflineError) as info:
        app.items.insert({"id": bad_id, "title": "x"})
    assert _error(info)["field"] == "id"


def test_duplicate_id_is_refused(app: App) -> None:
    first = app.items.insert({"id": "dup", "title": "one"})
    with pytest.raises(OfflineError) as info:
        app.items.insert({"id": "dup", "title": "two"})
    assert _error(info)["field"] == "id"
    assert app.items.find_by_id("dup") == first
    assert len(app.operations()) == 1


def test_duplicate_id_is_refused_after_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "dup.db")
    with create_app(SCHEMA, path=path) as app:
        app.items.insert({"id": "dup", "title": "one"})
    with create_app(SCHEMA, path=path) as app:
        with pytest.raises(OfflineError):
            app.items.insert({"id": "dup", "title": "two"})
        assert app.items.find_by_id("dup")["title"] == "one"


def test_id_of_a_deleted_record_is_not_reused(app: App) -> None:
    app.items.insert({"id": "k", "title": "old", "count": 5, "tags": ["x"], "notes": "old text"})
    app.items.delete("k")
    with pytest.raises(OfflineError) as info:
        app.items.insert({"id": "k", "title": "new"})
    context = _error(info)
    assert context["field"] == "id"
    assert context["reason"] == "DUPLICATE_ID"
    assert app.items.find_by_id("k") is None
    assert [o.type for o in app.operations()] == ["insert", "delete"]


def test_same_id_in_another_collection_is_allowed(app: App) -> None:
    app.items.insert({"id": "shared", "title": "item"})
    other = app.other.insert({"id": "shared", "name": "other"})
    assert other["id"] == "shared"
    assert app.items.find_by_id("shared")["title"] == "item"


@pytest.mark.parametrize(
    ("given", "expected", "expected_type"),
    [(3.0, 3, int), (2.5, 2.5, float), (7, 7, int), (-0.0, 0, int), (0, 0, int), (1e20, 1e20, float)],
)
def test_number_normalisation(tmp_path: Path, given: float, expected: float, expected_type: type) -> None:
    path = str(tmp_path / "n.db")
    with create_app(SCHEMA, path=path) as app:
        record = app.items.insert({"title": "n", "count": given, "scores": [given]})
        for source in (record, app.items.find_by_id(record["id"]), app.items.where({}).first()):
            assert source["count"] == expected
            assert type(source["count"]) is expected_type
            assert source["scores"] == [expected]
            assert type(source["scores"][0]) is expected_type
        assert app.operations()[0].data["count"] == expected
    with create_app(SCHEMA, path=path) as app:
        again = app.items.find_by_id(record["id"])
        assert again["count"] == expected
        assert type(again["count"]) is expected_type


# -- update -------------------------------------------------------------------------------------------------


def test_update_returns_the_new_record(app: App) -> None:
    record = app.items.insert({"title": "a", "count": 1})
    updated = app.items.update(record["id"], {"title": "b", "flag": True})
    assert updated == {**record, "title": "b", "flag": True}
    assert app.items.find_by_id(record["id"]) == updated


def test_update_creates_an_operation_with_only_changed_fields_and_previous_values(app: App) -> None:
    record = app.items.insert({"title": "a", "count": 1, "status": "todo"})
    app.items.update(record["id"], {"title": "b", "count": 1, "status": "todo", "flag": False})
    ops = app.operations()
    assert [op.type for op in ops] == ["insert", "update"]
    update = ops[1]
    assert update.record_id == record["id"]
    assert update.collection == "items"
    assert dict(update.data) == {"title": "b", "flag": False}
    assert dict(update.previous_data) == {"title": "a", "flag": None}
    assert update.causal_deps == (ops[0].id,)
    assert update.sequence_number == ops[0].sequence_number + 1
    assert update.schema_version == 1


def test_insert_operation_carries_the_values(app: App) -> None:
    record = app.items.insert({"title": "a", "tags": ["t"]})
    (op,) = app.operations()
    assert op.type == "insert"
    assert op.previous_data is None
    assert op.data["title"] == "a"
    assert list(op.data["tags"]) == ["t"]
    assert op.record_id == record["id"]


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"title": "a"},
        {"count": 2},
        {"count": 2.0},
        {"tags": ["x"]},
        {"flag": None},
        {"notes": ""},
        {"title": "a", "status": "todo"},
    ],
)
def test_no_op_update_creates_no_operation(app: App, changes: dict[str, Any]) -> None:
    record = app.items.insert({"title": "a", "count": 2, "tags": ["x"]})
    events: list[Any] = []
    app.events.on("operation:created", events.append)
    result = app.items.update(record["id"], changes)
    assert result == record
    assert len(app.operations()) == 1
    assert events == []
    assert app.version_vector == {app.node_id: 1}


def test_update_of_missing_record_is_not_found(app: App) -> None:
    with pytest.raises(OfflineError) as info:
        app.items.update("nope", {"title": "x"})
    context = _error(info)
    assert context["reason"] == "NOT_FOUND"
    assert context["field"] == "id"
    assert app.operations() == []


def test_update_cannot_change_the_id(app: App) -> None:
    record = app.items.insert({"title": "x"})
    with pytest.raises(OfflineError) as info:
        app.items.update(record["id"], {"id": "other", "title": "y"})
    assert _error(info)["field"] == "id"
    assert app.items.find_by_id(record["id"])["title"] == "x"
    assert app.items.find_by_id("other") is None
    # Repeating the same id is harmless.
    assert app.items.update(record["id"], {"id": record["id"], "title": "y"})["title"] == "y"


def test_update_validates_enum_values(app: App) -> None:
    record = app.items.insert({"title": "x"})
    assert app.items.update(record["id"], {"status": "done"})["status"] == "done"
    with pytest.raises(OfflineError):
        app.items.update(record["id"], {"status": "nope"})
    assert app.items.find_by_id(record["id"])["status"] == "done"


def test_update_replaces_arrays(app: App) -> None:
    record = app.items.insert({"title": "x", "tags": ["a", "b"]})
    updated = app.items.update(record["id"], {"tags": ["c"]})
    assert updated["tags"] == ["c"]
    assert app.items.find_by_id(record["id"])["tags"] == ["c"]


def test_many_updates_then_read(app: App) -> None:
    record = app.items.insert({"title": "x", "count": 0})
    for i in range(1, 101):
        app.items.update(record["id"], {"count": i})
    assert app.items.find_by_id(record["id"])["count"] == 100
    assert app.items.where({"count": 100}).count() == 1
    assert len(app.operations()) == 101


# -- delete -------------------------------------------------------------------------------------------------


def test_delete_returns_true_then_false(app: App) -> None:
    record = app.items.insert({"title": "x"})
    assert app.items.delete(record["id"]) is True
    assert app.items.delete(record["id"]) is False
    assert app.items.delete("never-existed") is False
    ops = app.operations()
    assert [op.type for op in ops] == ["insert", "delete"]
    assert ops[1].data is None
    assert ops[1].previous_data is None


def test_deleted_records_disappear_from_reads(app: App) -> None:
    keep = app.items.insert({"title": "keep", "status": "done"})
    gone = app.items.insert({"title": "gone", "status": "done"})
    assert app.items.where({"status": "done"}).count() == 2
    app.items.delete(gone["id"])
    assert app.items.find_by_id(gone["id"]) is None
    assert app.items.where({"status": "done"}).fetch() == [keep]
    assert app.items.where({"id": gone["id"]}).fetch() == []
    assert app.items.count() == 1
    assert app.items.fetch() == [keep]


def test_deleted_record_cannot_be_updated(app: App) -> None:
    record = app.items.insert({"title": "x"})
    app.items.delete(record["id"])
    with pytest.raises(OfflineError) as info:
        app.items.update(record["id"], {"title": "y"})
    assert _error(info)["reason"] == "NOT_FOUND"


def test_delete_stays_deleted_after_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "d.db")
    with create_app(SCHEMA, path=path) as app:
        record = app.items.insert({"title": "x"})
        app.items.delete(record["id"])
    with create_app(SCHEMA, path=path) as app:
        assert app.items.find_by_id(record["id"]) is None
        assert app.items.count() == 0
