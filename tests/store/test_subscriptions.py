"""Live queries: `query.subscribe(callback)` (DESIGN.md section 2, Client)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import create_app, define_schema, t
from offline.store import App

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "priority": t.number().default(0),
                }
            },
            "projects": {"fields": {"name": t.string()}},
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


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[dict[str, Any]]] = []

    def __call__(self, records: list[dict[str, Any]]) -> None:
        self.calls.append(records)

    @property
    def titles(self) -> list[list[str]]:
        return [[r["title"] for r in call] for call in self.calls]


def test_callback_gets_initial_results_at_once(app: App) -> None:
    app.todos.insert({"title": "a", "done": True})
    app.todos.insert({"title": "b"})
    seen = Recorder()
    app.todos.where({"done": True}).subscribe(seen)
    assert seen.titles == [["a"]]
    assert type(seen.calls[0][0]) is dict


def test_initial_results_of_an_empty_query(app: App) -> None:
    seen = Recorder()
    app.todos.where({}).subscribe(seen)
    assert seen.calls == [[]]


def test_called_after_every_relevant_local_change(app: App) -> None:
    seen = Recorder()
    app.todos.where({"done": False}).subscribe(seen)
    record = app.todos.insert({"title": "a"})
    assert seen.titles == [[], ["a"]]
    app.todos.update(record["id"], {"title": "b"})
    assert seen.titles == [[], ["a"], ["b"]]
    app.todos.update(record["id"], {"done": True})
    assert seen.titles == [[], ["a"], ["b"], []]
    app.todos.update(record["id"], {"done": False})
    app.todos.delete(record["id"])
    assert seen.titles == [[], ["a"], ["b"], [], ["b"], []]
    # The records passed are the full, current records.
    assert seen.calls[2][0]["id"] == record["id"]
    assert seen.calls[2][0]["done"] is False


def test_callbacks_run_before_the_write_returns(app: App) -> None:
    seen = Recorder()
    app.todos.where({}).subscribe(seen)
    for i in range(5):
        app.todos.insert({"title": str(i)})
        # No waiting, no event loop: the callback already ran.
        assert len(seen.calls) == i + 2
        assert seen.titles[-1][-1] == str(i)


def test_not_called_for_writes_to_another_collection(app: App) -> None:
    seen = Recorder()
    app.todos.where({}).subscribe(seen)
    app.projects.insert({"name": "p"})
    project = app.projects.where({}).first()
    assert project is not None
    app.projects.update(project["id"], {"name": "q"})
    app.projects.delete(project["id"])
    assert len(seen.calls) == 1


def test_not_called_when_results_do_not_change(app: App) -> None:
    hidden = app.todos.insert({"title": "hidden", "done": True})
    shown = app.todos.insert({"title": "shown"})
    seen = Recorder()
    app.todos.where({"done": False}).subscribe(seen)
    assert len(seen.calls) == 1
    # A change to a record outside the results does not alter them.
    app.todos.update(hidden["id"], {"title": "still hidden"})
    app.todos.update(hidden["id"], {"priority": 5})
    app.todos.insert({"title": "another hidden", "done": True})
    app.todos.delete(hidden["id"])
    # A no-op update of a shown record creates no operation and no call.
    app.todos.update(shown["id"], {"title": "shown"})
    assert len(seen.calls) == 1
    # An irrelevant-looking change to a shown record does change the records passed.
    app.todos.update(shown["id"], {"priority": 1})
    assert len(seen.calls) == 2
    assert seen.calls[-1][0]["priority"] == 1


def test_limited_query_ignores_changes_outside_its_window(app: App) -> None:
    # A query limited to the first record by title is not affected by another record's change.
    app.todos.insert({"title": "a"})
    later = app.todos.insert({"title": "z"})
    seen = Recorder()
    app.todos.where({}).order_by("title").limit(1).subscribe(seen)
    app.todos.update(later["id"], {"priority": 3})
    app.todos.update(later["id"], {"done": True})
    assert seen.titles == [["a"]]
    app.todos.update(later["id"], {"title": "0"})
    assert seen.titles == [["a"], ["0"]]


def test_unsubscribe_stops_calls(app: App) -> None:
    seen = Recorder()
    unsubscribe = app.todos.where({}).subscribe(seen)
    app.todos.insert({"title": "a"})
    unsubscribe()
    app.todos.insert({"title": "b"})
    assert seen.titles == [[], ["a"]]
    unsubscribe()  # a second call is harmless
    app.todos.insert({"title": "c"})
    assert len(seen.calls) == 2


def test_unsubscribing_one_keeps_the_others(app: App) -> None:
    first, second = Recorder(), Recorder()
    stop_first = app.todos.where({}).subscribe(first)
    app.todos.where({}).subscribe(second)
    stop_first()
    app.todos.insert({"title": "a"})
    assert len(first.calls) == 1
    assert second.titles == [[], ["a"]]


def test_raising_callback_does_not_break_writes(app: App, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def broken(records: list[dict[str, Any]]) -> None:
        calls.append(len(records))
        raise RuntimeError("subscriber bug")

    healthy = Recorder()
    app.todos.where({}).subscribe(broken)  # the initial call raises too, and is contained
    app.todos.where({}).subscribe(healthy)
    record = app.todos.insert({"title": "a"})
    assert app.todos.find_by_id(record["id"]) == record
    updated = app.todos.update(record["id"], {"title": "b"})
    assert updated["title"] == "b"
    assert calls == [0, 1, 1]
    assert healthy.titles == [[], ["a"], ["b"]]
    assert "subscriber bug" in caplog.text


def test_called_after_remote_apply(app: App, peer: App) -> None:
    seen = Recorder()
    app.todos.where({"done": False}).subscribe(seen)
    record = peer.todos.insert({"title": "remote"})
    applied = app.apply(peer.operations())
    assert len(applied) == 1
    assert seen.titles == [[], ["remote"]]
    peer.todos.update(record["id"], {"done": True})
    app.apply(peer.operations(after=app.version_vector))
    assert seen.titles == [[], ["remote"], []]
    # Applying the same operations again changes nothing and calls nothing.
    assert app.apply(peer.operations()) == []
    assert len(seen.calls) == 3


def test_remote_apply_to_another_collection_does_not_call(app: App, peer: App) -> None:
    seen = Recorder()
    app.todos.where({}).subscribe(seen)
    peer.projects.insert({"name": "p"})
    app.apply(peer.operations())
    assert app.projects.count() == 1
    assert len(seen.calls) == 1


def test_batch_calls_subscribers_once_after_commit(app: App) -> None:
    seen = Recorder()
    app.todos.where({}).subscribe(seen)
    with app.batch():
        for i in range(5):
            app.todos.insert({"title": str(i)})
        assert len(seen.calls) == 1  # nothing announced inside the batch
    assert seen.titles == [[], ["0", "1", "2", "3", "4"]]


def test_failed_write_does_not_call(app: App) -> None:
    seen = Recorder()
    app.todos.where({}).subscribe(seen)
    with pytest.raises(Exception):  # noqa: B017 - any validation error
        app.todos.insert({"title": 5})
    assert len(seen.calls) == 1


def test_subscription_sees_write_made_by_another_callback(app: App) -> None:
    # A callback that writes to another collection: both subscriptions end up current.
    projects = Recorder()
    app.projects.where({}).subscribe(projects)

    def mirror(records: list[dict[str, Any]]) -> None:
        if records and app.projects.count() < len(records):
            app.projects.insert({"name": records[-1]["title"]})

    app.todos.where({}).subscribe(mirror)
    app.todos.insert({"title": "t1"})
    assert [[p["name"] for p in call] for call in projects.calls] == [[], ["t1"]]
