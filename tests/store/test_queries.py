"""Queries: where / order_by / limit / first / count (DESIGN.md section 2, Client)."""

from __future__ import annotations

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
                    "scores": t.array(t.number()).default([]),
                    "notes": t.richtext(),
                },
                "indexes": ["status"],
            },
        },
    }
)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    application = create_app(SCHEMA, path=str(tmp_path / "app.db"))
    yield application
    application.close()


@pytest.fixture
def filled(app: App) -> App:
    app.items.insert({"title": "a", "count": 1, "flag": True, "status": "todo", "due": 100, "tags": ["x"]})
    app.items.insert({"title": "b", "count": 2.5, "flag": False, "status": "doing", "due": 200, "tags": []})
    app.items.insert({"title": "c", "count": None, "flag": None, "status": "done", "tags": ["x", "y"]})
    app.items.insert({"title": "d", "count": 1, "flag": True, "status": "done", "due": 100, "tags": ["y"]})
    return app


def titles(records: list[dict[str, Any]]) -> list[str]:
    return [r["title"] for r in records]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"title": "b"}, ["b"]),
        ({"title": "zzz"}, []),
        ({"count": 1}, ["a", "d"]),
        ({"count": 1.0}, ["a", "d"]),
        ({"count": 2.5}, ["b"]),
        ({"count": None}, ["c"]),
        ({"flag": True}, ["a", "d"]),
        ({"flag": False}, ["b"]),
        ({"flag": None}, ["c"]),
        ({"status": "done"}, ["c", "d"]),
        ({"status": "doing"}, ["b"]),
        ({"due": 100}, ["a", "d"]),
        ({"due": None}, ["c"]),
        ({"tags": ["x"]}, ["a"]),
        ({"tags": []}, ["b"]),
        ({"tags": ["x", "y"]}, ["c"]),
        ({"status": "done", "flag": True}, ["d"]),
        ({"count": 1, "due": 100, "flag": True}, ["a", "d"]),
        ({"status": "todo", "flag": False}, []),
        ({}, ["a", "b", "c", "d"]),
    ],
)
def test_where_equality(filled: App, filters: dict[str, Any], expected: list[str]) -> None:
    query = filled.items.where(filters)
    assert titles(query.fetch()) == expected
    assert query.count() == len(expected)
    first = query.first()
    assert (first["title"] if first else None) == (expected[0] if expected else None)


def test_number_values_match_whatever_their_spelling(app: App) -> None:
    app.items.insert({"title": "a", "count": 3.0, "scores": [1.0, 2.5], "due": 5})
    for filters in (
        {"count": 3},
        {"count": 3.0},
        {"scores": [1, 2.5]},
        {"scores": [1.0, 2.5]},
        {"scores": (1, 2.5)},
    ):
        assert titles(app.items.where(filters).fetch()) == ["a"], filters
    assert app.items.where({"scores": [2.5, 1]}).count() == 0  # order matters for equality


def test_where_by_id(filled: App) -> None:
    record = filled.items.where({"title": "c"}).first()
    assert record is not None
    assert filled.items.where({"id": record["id"]}).fetch() == [record]


def test_chained_where_combines_filters(filled: App) -> None:
    assert titles(filled.items.where({"status": "done"}).where({"flag": True}).fetch()) == ["d"]


def test_results_are_full_plain_records(filled: App) -> None:
    (record,) = filled.items.where({"title": "a"}).fetch()
    assert type(record) is dict
    assert set(record) == {"id", *SCHEMA.collections["items"].fields}
    assert record["tags"] == ["x"]
    assert record["flag"] is True
    assert record["notes"] == ""
    assert filled.items.find_by_id(record["id"]) == record


def test_order_by_ascending_and_descending(filled: App) -> None:
    assert titles(filled.items.where({}).order_by("title", desc=True).fetch()) == ["d", "c", "b", "a"]
    assert titles(filled.items.where({}).order_by("title").fetch()) == ["a", "b", "c", "d"]
    # Ties keep creation order; NULL sorts first ascending in SQLite.
    assert titles(filled.items.where({}).order_by("count").fetch()) == ["c", "a", "d", "b"]
    assert titles(filled.items.where({}).order_by("count", desc=True).fetch()) == ["b", "a", "d", "c"]


def test_order_by_several_fields(filled: App) -> None:
    query = filled.items.all().order_by("due", desc=True).order_by("title", desc=True)
    assert titles(query.fetch()) == ["b", "d", "a", "c"]


def test_limit_and_first(filled: App) -> None:
    query = filled.items.where({}).order_by("title", desc=True)
    assert titles(query.limit(2).fetch()) == ["d", "c"]
    assert titles(query.limit(0).fetch()) == []
    assert query.first()["title"] == "d"
    assert filled.items.where({"title": "none"}).first() is None
    # limit() returns a new query; the original is unchanged.
    assert len(query.fetch()) == 4


def test_fetch_pages_gives_fetchs_records_a_page_at_a_time(filled: App) -> None:
    query = filled.items.where({}).order_by("title", desc=True)
    pages = list(query.fetch_pages(3))
    assert [titles(page) for page in pages] == [["d", "c", "b"], ["a"]]
    assert [record for page in pages for record in page] == query.fetch()
    assert [titles(page) for page in query.limit(2).fetch_pages(1)] == [["d"], ["c"]]
    assert list(filled.items.where({"title": "none"}).fetch_pages(5)) == []
    with pytest.raises(OfflineError) as info:
        next(query.fetch_pages(0))
    assert info.value.code == INVALID_OPERATION


def test_count_with_and_without_limit(filled: App) -> None:
    assert filled.items.count() == 4
    assert filled.items.where({"flag": True}).count() == 2
    assert filled.items.where({}).limit(3).count() == 3
    assert filled.items.where({}).limit(10).count() == 4
    assert filled.items.where({"flag": True}).limit(1).count() == 1
    assert filled.items.where({}).limit(0).count() == 0


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_limit_must_be_a_non_negative_integer(filled: App, bad: Any) -> None:
    with pytest.raises(OfflineError) as info:
        filled.items.where({}).limit(bad)
    assert info.value.code == INVALID_OPERATION


def test_unknown_field_in_filter_or_order(filled: App) -> None:
    with pytest.raises(OfflineError) as info:
        filled.items.where({"colour": "red"})
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None and info.value.context["field"] == "colour"
    with pytest.raises(OfflineError) as info:
        filled.items.where({}).order_by("colour")
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None and info.value.context["field"] == "colour"
    with pytest.raises(OfflineError):
        filled.items.where({}).where({"colour": 1})


def test_richtext_filter_is_refused(filled: App) -> None:
    with pytest.raises(OfflineError) as info:
        filled.items.where({"notes": "hello"})
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None and info.value.context["field"] == "notes"


def test_queries_see_writes_immediately(app: App) -> None:
    query = app.items.where({"status": "done"})
    assert query.fetch() == []
    record = app.items.insert({"title": "x", "status": "done"})
    assert query.fetch() == [record]
    updated = app.items.update(record["id"], {"title": "y"})
    assert query.fetch() == [updated]
    app.items.update(record["id"], {"status": "todo"})
    assert query.fetch() == []
    assert app.items.where({"status": "todo"}).count() == 1


def test_query_can_be_run_again(filled: App) -> None:
    query = filled.items.where({"flag": True})
    first = query.fetch()
    filled.items.insert({"title": "e", "flag": True})
    assert titles(query.fetch()) == [*titles(first), "e"]


def test_query_values_with_quotes_are_parameters(app: App) -> None:
    tricky = 'it\'s "quoted"; DROP TABLE items; --'
    app.items.insert({"title": tricky})
    assert titles(app.items.where({"title": tricky}).fetch()) == [tricky]
    assert app.items.count() == 1


def test_thousand_rows_come_back_in_creation_order(app: App) -> None:
    with app.batch():
        ids = [app.items.insert({"title": f"{i:04d}", "count": i % 7})["id"] for i in range(1000)]
    for i in range(1000, 1010):  # and a few outside a batch
        ids.append(app.items.insert({"title": f"{i:04d}", "count": i % 7})["id"])
    records = app.items.where({}).fetch()
    assert [r["id"] for r in records] == ids
    assert [r["title"] for r in records] == [f"{i:04d}" for i in range(1010)]
    threes = app.items.where({"count": 3}).fetch()
    assert [r["id"] for r in threes] == [ids[i] for i in range(1010) if i % 7 == 3]
    assert app.items.count() == 1010


def test_collection_shortcuts(filled: App) -> None:
    assert titles(filled.items.fetch()) == ["a", "b", "c", "d"]
    assert filled.items.first()["title"] == "a"
    assert filled.items.count() == 4
    assert titles(filled.items.all().fetch()) == ["a", "b", "c", "d"]
