"""`op` helpers resolved locally into plain operations (SPEC 4.5, DESIGN.md section 3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import INVALID_OPERATION, OfflineError, create_app, define_schema, op, t
from offline.core.frozen import thaw
from offline.store import App, AtomicOp

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "stats": {
                "fields": {
                    "name": t.string(),
                    "count": t.number().default(0),
                    "total": t.number().merge("counter").default(0),
                    "best": t.number().optional(),
                    "tags": t.array(t.string()).default([]),
                    "scores": t.array(t.number()).default([]),
                    "done": t.boolean().default(False),
                }
            }
        },
    }
)


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


def last_op(app: App) -> tuple[dict[str, Any], dict[str, Any]]:
    operation = app.operations()[-1]
    assert operation.type == "update"
    # Operations are immutable (tuples inside); thaw gives plain lists and dicts to compare with.
    return thaw(operation.data), thaw(operation.previous_data)


def test_helpers_build_atomic_ops() -> None:
    assert op.increment(3) == AtomicOp("increment", 3)
    assert op.increment() == AtomicOp("increment", 1)
    assert op.decrement(2) == AtomicOp("increment", -2)
    assert op.max(5) == AtomicOp("max", 5)
    assert op.min(5) == AtomicOp("min", 5)
    assert op.append("x") == AtomicOp("append", "x")
    assert op.remove("x") == AtomicOp("remove", "x")


@pytest.mark.parametrize(
    ("start", "helper", "expected"),
    [
        (10, op.increment(5), 15),
        (10, op.increment(), 11),
        (10, op.increment(-3), 7),
        (10, op.increment(0.5), 10.5),
        (10, op.decrement(4), 6),
        (10, op.decrement(), 9),
        (0.5, op.increment(0.5), 1),
    ],
)
def test_increment_and_decrement(app: App, start: float, helper: AtomicOp, expected: float) -> None:
    record = app.stats.insert({"name": "s", "count": start})
    updated = app.stats.update(record["id"], {"count": helper})
    assert updated["count"] == expected
    assert type(updated["count"]) is type(expected)
    assert app.stats.find_by_id(record["id"])["count"] == expected
    data, previous = last_op(app)
    assert data == {"count": expected}
    assert previous == {"count": start}


def test_increments_accumulate(app: App) -> None:
    record = app.stats.insert({"name": "s"})
    for _ in range(10):
        app.stats.update(record["id"], {"count": op.increment(2)})
    app.stats.update(record["id"], {"count": op.decrement(5)})
    assert app.stats.find_by_id(record["id"])["count"] == 15
    values = [(dict(o.previous_data)["count"], dict(o.data)["count"]) for o in app.operations()[1:]]
    assert values[0] == (0, 2)
    assert values[-1] == (20, 15)


def test_increment_of_an_unset_optional_number_starts_from_zero(app: App) -> None:
    record = app.stats.insert({"name": "s"})
    assert app.stats.update(record["id"], {"best": op.increment(4)})["best"] == 4
    data, previous = last_op(app)
    assert data == {"best": 4}
    assert previous == {"best": None}


@pytest.mark.parametrize(
    ("start", "helper", "expected", "changes"),
    [
        (5, op.max(9), 9, True),
        (5, op.max(2), 5, False),
        (5, op.max(5), 5, False),
        (5, op.min(2), 2, True),
        (5, op.min(9), 5, False),
        (None, op.max(3), 3, True),
        (None, op.min(3), 3, True),
    ],
)
def test_max_and_min(app: App, start: Any, helper: AtomicOp, expected: Any, changes: bool) -> None:
    record = app.stats.insert({"name": "s", "best": start})
    updated = app.stats.update(record["id"], {"best": helper})
    assert updated["best"] == expected
    if changes:
        data, previous = last_op(app)
        assert data == {"best": expected}
        assert previous == {"best": start}
    else:
        # Nothing changed, so no operation was created.
        assert len(app.operations()) == 1


def test_append_and_remove(app: App) -> None:
    record = app.stats.insert({"name": "s", "tags": ["a"]})
    updated = app.stats.update(record["id"], {"tags": op.append("b")})
    assert updated["tags"] == ["a", "b"]
    data, previous = last_op(app)
    assert data == {"tags": ["a", "b"]}
    assert previous == {"tags": ["a"]}

    updated = app.stats.update(record["id"], {"tags": op.remove("a")})
    assert updated["tags"] == ["b"]
    data, previous = last_op(app)
    assert data == {"tags": ["b"]}
    assert previous == {"tags": ["a", "b"]}
    assert app.stats.find_by_id(record["id"])["tags"] == ["b"]


def test_remove_of_a_missing_item_creates_no_operation(app: App) -> None:
    record = app.stats.insert({"name": "s", "tags": ["a"]})
    assert app.stats.update(record["id"], {"tags": op.remove("zzz")})["tags"] == ["a"]
    assert len(app.operations()) == 1


def test_remove_matches_numbers_by_value(app: App) -> None:
    record = app.stats.insert({"name": "s", "scores": [1, 2.5, 3]})
    assert app.stats.update(record["id"], {"scores": op.remove(1.0)})["scores"] == [2.5, 3]
    assert app.stats.update(record["id"], {"scores": op.append(4.0)})["scores"] == [2.5, 3, 4]


def test_helpers_combine_with_plain_values_in_one_update(app: App) -> None:
    record = app.stats.insert({"name": "s", "count": 1})
    updated = app.stats.update(
        record["id"], {"name": "t", "count": op.increment(1), "tags": op.append("x"), "done": True}
    )
    assert updated == {**record, "name": "t", "count": 2, "tags": ["x"], "done": True}
    data, previous = last_op(app)
    assert data == {"name": "t", "count": 2, "tags": ["x"], "done": True}
    assert previous == {"name": "s", "count": 1, "tags": [], "done": False}


@pytest.mark.parametrize(
    ("field", "helper", "expected", "received"),
    [
        ("name", op.increment(1), "number", "string"),
        ("done", op.decrement(1), "number", "boolean"),
        ("tags", op.max(1), "number", "array"),
        ("tags", op.min(1), "number", "array"),
        ("count", op.append(1), "array", "number"),
        ("name", op.remove("x"), "array", "string"),
        ("count", op.increment("1"), "number", "string"),  # type: ignore[arg-type]
        ("count", op.decrement(True), "number", "boolean"),  # type: ignore[arg-type]
        ("count", op.max(None), "number", "null"),  # type: ignore[arg-type]
        ("tags", op.append(5), "array", "array"),  # the resolved list is validated like any value
    ],
)
def test_type_errors(app: App, field: str, helper: AtomicOp, expected: str, received: str) -> None:
    record = app.stats.insert({"name": "s"})
    with pytest.raises(OfflineError) as info:
        app.stats.update(record["id"], {field: helper})
    assert info.value.code == INVALID_OPERATION
    context = info.value.context
    assert context is not None
    assert context["field"] == field
    assert context["expected"] == expected
    assert context["received"] == received
    assert len(app.operations()) == 1
    assert app.stats.find_by_id(record["id"]) == record


def test_helpers_are_not_accepted_on_insert(app: App) -> None:
    with pytest.raises(OfflineError) as info:
        app.stats.insert({"name": "s", "count": op.increment(1)})
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None and info.value.context["field"] == "count"
    assert app.operations() == []


def test_concurrent_increments_on_a_counter_both_apply(app: App, peer: App) -> None:
    record = app.stats.insert({"name": "s", "total": 10})
    peer.apply(app.operations())
    app.stats.update(record["id"], {"total": op.increment(5)})
    peer.stats.update(record["id"], {"total": op.increment(3)})
    app.apply(peer.operations(after=app.version_vector))
    peer.apply(app.operations(after=peer.version_vector))
    assert app.stats.find_by_id(record["id"])["total"] == 18
    assert peer.stats.find_by_id(record["id"])["total"] == 18


def test_concurrent_appends_on_a_union_array_both_kept(app: App, peer: App) -> None:
    record = app.stats.insert({"name": "s", "tags": ["a"]})
    peer.apply(app.operations())
    app.stats.update(record["id"], {"tags": op.append("mine")})
    peer.stats.update(record["id"], {"tags": op.append("theirs")})
    app.apply(peer.operations(after=app.version_vector))
    peer.apply(app.operations(after=peer.version_vector))
    mine = app.stats.find_by_id(record["id"])["tags"]
    assert sorted(mine) == ["a", "mine", "theirs"]
    assert peer.stats.find_by_id(record["id"])["tags"] == mine
