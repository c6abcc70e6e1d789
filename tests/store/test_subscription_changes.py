"""Live queries that hand over what changed: `query.subscribe_changes(callback)` (tracker issue 28).

Python applications get the deltas the browser's LiveResults gets: the records that entered, changed and left
the results, computed from the records a commit touched rather than by running the whole query again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offline import create_app, define_schema, t
from offline.core.errors import OfflineError
from offline.store import App, Query, QueryChanges, replication

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "projects": {"fields": {"name": t.string()}},
            "todos": {
                "fields": {
                    "title": t.string().optional(),
                    "done": t.boolean().default(False),
                    "priority": t.number().optional(),
                    "projectId": t.string().optional(),
                }
            },
        },
        "relations": {
            "todoProject": {
                "from": "todos",
                "to": "projects",
                "type": "many-to-one",
                "field": "projectId",
                "onDelete": "cascade",
            }
        },
    }
)


@pytest.fixture
def app() -> Iterator[App]:
    application = create_app(SCHEMA, path=":memory:")
    yield application
    application.close()


class Changes:
    """Records every change set and keeps the results the way an application would: by applying them."""

    def __init__(self) -> None:
        self.calls: list[QueryChanges] = []
        self.rows: list[dict[str, Any]] = []

    def __call__(self, changes: QueryChanges) -> None:
        self.calls.append(changes)
        self.rows = changes.apply(self.rows)

    @property
    def last(self) -> QueryChanges:
        return self.calls[-1]


def test_the_first_call_holds_the_whole_results(app: App) -> None:
    a = app.todos.insert({"title": "a"})
    app.todos.insert({"title": "b", "done": True})
    seen = Changes()
    app.todos.where({"done": False}).subscribe_changes(seen)
    (first,) = seen.calls
    assert first.reset is True
    assert first.inserted == [a]
    assert first.updated == first.previous == first.removed == []
    assert seen.rows == [a]


def test_inserts_updates_and_removals_arrive_as_such(app: App) -> None:
    seen = Changes()
    app.todos.where({"done": False}).subscribe_changes(seen)
    record = app.todos.insert({"title": "a"})
    assert seen.last.reset is False
    assert (seen.last.inserted, seen.last.updated, seen.last.removed) == ([record], [], [])
    renamed = app.todos.update(record["id"], {"title": "b"})
    assert (seen.last.inserted, seen.last.updated, seen.last.previous) == ([], [renamed], [record])
    assert seen.last.removed == []
    done = app.todos.update(record["id"], {"done": True})  # leaves the results: the record as last seen
    assert (seen.last.inserted, seen.last.updated, seen.last.removed) == ([], [], [renamed])
    back = app.todos.update(done["id"], {"done": False})
    assert seen.last.inserted == [back]
    app.todos.delete(record["id"])
    assert seen.last.removed == [back]
    assert seen.rows == []
    assert len(seen.calls) == 6


def test_no_call_when_the_results_do_not_change(app: App) -> None:
    hidden = app.todos.insert({"title": "hidden", "done": True})
    shown = app.todos.insert({"title": "shown"})
    seen = Changes()
    app.todos.where({"done": False}).subscribe_changes(seen)
    app.todos.update(hidden["id"], {"title": "still hidden"})
    app.todos.delete(hidden["id"])
    app.projects.insert({"name": "another collection"})
    app.todos.update(shown["id"], {"title": "shown"})  # no-op update: no operation
    assert len(seen.calls) == 1


def test_applying_keeps_the_query_order(app: App) -> None:
    for title, priority in [("c", 1), ("a", 3), ("b", 2)]:
        app.todos.insert({"title": title, "priority": priority})
    seen = Changes()
    query = app.todos.where({}).order_by("priority", desc=True)
    query.subscribe_changes(seen)
    assert [r["title"] for r in seen.rows] == ["a", "b", "c"]
    c = next(r for r in seen.rows if r["title"] == "c")
    app.todos.update(c["id"], {"priority": 5})
    assert [r["title"] for r in seen.rows] == ["c", "a", "b"]
    assert seen.rows == query.fetch()


def test_a_limited_window_reports_what_was_pushed_out(app: App) -> None:
    a = app.todos.insert({"title": "a"})
    b = app.todos.insert({"title": "b"})
    seen = Changes()
    app.todos.where({}).order_by("title").limit(2).subscribe_changes(seen)
    first = app.todos.insert({"title": "0"})
    assert (seen.last.inserted, seen.last.removed) == ([first], [b])
    app.todos.delete(a["id"])  # b comes back in
    assert (seen.last.inserted, seen.last.removed) == ([b], [a])
    assert [r["title"] for r in seen.rows] == ["0", "b"]


def test_a_descending_limited_window(app: App) -> None:
    for title in ["a", "c", None]:
        app.todos.insert({"title": title})
    seen = Changes()
    query = app.todos.where({}).order_by("title", desc=True).limit(2)
    query.subscribe_changes(seen)
    assert [r["title"] for r in seen.rows] == ["c", "a"]  # NULL sorts first, so last when descending
    app.todos.insert({"title": "b"})
    assert [r["title"] for r in seen.rows] == ["c", "b"]
    app.todos.insert({"title": None})
    assert seen.rows == query.fetch()


def test_a_write_made_inside_a_callback_leaves_every_subscription_current(app: App) -> None:
    """A callback that writes starts the next refresh before the other subscriptions heard of the first
    change: each of them must still hand out the results as they are (not a mix of before and after)."""
    a = app.todos.insert({"title": "a"})
    app.todos.insert({"title": "b"})
    app.todos.insert({"title": "c"})

    def writer(changes: QueryChanges) -> None:
        if any(record["title"] == "z" for record in changes.updated):
            app.todos.insert({"title": "0"})

    app.todos.where({}).subscribe_changes(writer)
    query = app.todos.where({}).order_by("title").limit(2)
    seen: list[tuple[list[str], list[str]]] = []

    def window(changes: QueryChanges) -> None:
        rows = changes.apply(held)
        held[:] = rows
        seen.append(([r["title"] for r in rows], [r["title"] for r in query.fetch()]))

    held: list[dict[str, Any]] = []
    query.subscribe_changes(window)
    app.todos.update(a["id"], {"title": "z"})  # leaves the window; the writer's insert enters it
    assert seen[-1][0] == ["0", "b"]
    for shown, current in seen:
        assert shown == current


def test_an_ordering_on_rich_text_runs_the_query_again_and_still_hands_out_only_the_difference() -> None:
    # Python cannot order by a rich text column (SQLite holds the CRDT document there, not the text).
    schema = define_schema(
        {"version": 1, "collections": {"notes": {"fields": {"title": t.string(), "body": t.richtext()}}}}
    )
    app = create_app(schema, path=":memory:")
    try:
        first = app.notes.insert({"title": "one"})
        app.notes.richtext(first["id"], "body").insert(0, "zebra")
        seen = Changes()
        query = app.notes.where({}).order_by("body")
        query.subscribe_changes(seen)
        second = app.notes.insert({"title": "two"})
        assert (seen.last.inserted, seen.last.updated, seen.last.removed) == ([second], [], [])
        app.notes.richtext(second["id"], "body").insert(0, "apple")
        assert [r["id"] for r in seen.last.updated] == [second["id"]]
        assert seen.rows == query.fetch()
        app.notes.update(first["id"], {"title": "one, renamed"})
        assert seen.rows == query.fetch() and len(seen.calls) == 4
    finally:
        app.close()


def test_full_list_subscribers_keep_working_next_to_change_subscribers(app: App) -> None:
    lists: list[list[dict[str, Any]]] = []
    seen = Changes()
    query = app.todos.where({}).order_by("title")
    query.subscribe(lists.append)
    query.subscribe_changes(seen)
    app.todos.insert({"title": "b"})
    app.todos.insert({"title": "a"})
    assert [[r["title"] for r in call] for call in lists] == [[], ["b"], ["a", "b"]]
    assert seen.rows == lists[-1]


def test_unsubscribe_stops_change_calls(app: App) -> None:
    seen = Changes()
    stop = app.todos.where({}).subscribe_changes(seen)
    app.todos.insert({"title": "a"})
    stop()
    app.todos.insert({"title": "b"})
    assert len(seen.calls) == 2


def test_a_raising_change_callback_does_not_break_writes(app: App, caplog: pytest.LogCaptureFixture) -> None:
    def broken(changes: QueryChanges) -> None:
        raise RuntimeError("subscriber bug")

    app.todos.where({}).subscribe_changes(broken)
    record = app.todos.insert({"title": "a"})
    assert app.todos.find_by_id(record["id"]) == record
    assert "subscriber bug" in caplog.text


def test_remote_and_cascaded_changes_arrive_as_deltas(app: App) -> None:
    peer = create_app(SCHEMA, path=":memory:")
    try:
        project = peer.projects.insert({"name": "p"})
        task = peer.todos.insert({"title": "t", "projectId": project["id"]})
        seen = Changes()
        app.todos.where({}).subscribe_changes(seen)
        app.apply(peer.operations())
        assert seen.last.inserted == [task]
        app.projects.delete(project["id"])  # the relation deletes the task too
        assert seen.last.removed == [task]
        assert seen.rows == []
    finally:
        peer.close()


# -- what a refresh costs: counted in statements that read the collection, not timed ------------------------


class Statements:
    """The SELECT statements the app's connection runs against the todos table."""

    def __init__(self, app: App) -> None:
        self.seen: list[str] = []
        app.db.conn.set_trace_callback(self._trace)

    def _trace(self, sql: str) -> None:
        if sql.lstrip().upper().startswith("SELECT") and 'FROM "todos"' in sql:
            self.seen.append(sql)

    def whole_runs(self) -> list[str]:
        """Statements that run the query over the whole table (the ones a refresh must avoid)."""
        return [sql for sql in self.seen if '"id" IN (' not in sql and '"id" = ' not in sql]

    def clear(self) -> None:
        self.seen.clear()


def _many(app: App, count: int) -> None:
    with app.batch():
        for i in range(count):
            app.todos.insert({"title": f"t{i:05d}", "priority": i % 7, "done": i % 3 == 0})


@pytest.mark.parametrize("how", ["changes", "records"])
def test_a_write_reads_only_the_records_it_touched(app: App, how: str) -> None:
    _many(app, 2000)
    statements = Statements(app)
    query = app.todos.where({"done": False}).order_by("priority")
    seen = Changes()
    if how == "changes":
        query.subscribe_changes(seen)
    else:
        query.subscribe(lambda records: None)
    assert len(statements.whole_runs()) == 1  # the initial results
    target = app.todos.where({"done": False}).first()
    assert target is not None
    statements.clear()
    app.todos.update(target["id"], {"priority": 99})
    app.todos.insert({"title": "new"})
    with app.batch():
        for record in app.todos.where({"done": True}).limit(10).fetch():
            app.todos.update(record["id"], {"done": False})
    statements.clear()
    app.todos.update(target["id"], {"title": "renamed"})
    app.todos.delete(target["id"])
    assert statements.whole_runs() == []
    # One statement per refresh, reading the touched record by id (the writes read it by id too).
    assert len([sql for sql in statements.seen if '"id" IN (' in sql]) == 2


def test_a_limited_query_runs_again_only_when_its_window_must_be_refilled(app: App) -> None:
    _many(app, 500)
    statements = Statements(app)
    seen = Changes()
    query = app.todos.where({}).order_by("title").limit(5)
    query.subscribe_changes(seen)
    far = app.todos.where({"title": "t00400"}).first()
    assert far is not None
    statements.clear()
    head = seen.rows[0]
    app.todos.update(head["id"], {"priority": 100})  # stays in the window
    app.todos.insert({"title": "a first"})  # enters it, pushing the last out
    app.todos.update(seen.rows[-1]["id"], {"title": "t00000 moved"})  # moves within it
    app.todos.update(far["id"], {"done": True})  # outside it
    assert statements.whole_runs() == []
    app.todos.delete(seen.rows[1]["id"])  # a hole only the rest of the table can fill
    assert len(statements.whole_runs()) == 1
    assert seen.rows == query.fetch()


# -- property: the deltas applied to the first results always give what running the query gives -------------

_titles = st.one_of(st.none(), st.text(alphabet="aAb é\u00ff\U0001f600", max_size=3))
_numbers = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([0.5, -1.25, 2.0, 1e15]))
_query_specs = st.tuples(
    st.fixed_dictionaries(
        {},
        optional={"done": st.booleans(), "priority": st.integers(-1, 1), "projectId": st.none()},
    ),
    st.lists(st.tuples(st.sampled_from(["title", "priority", "done", "id"]), st.booleans()), max_size=2),
    st.one_of(st.none(), st.integers(0, 4)),
)
_steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["insert", "update", "delete", "batch", "bulk", "peer", "project", "delete-project", "forget"]
        ),
        st.integers(0, 50),
        _titles,
        _numbers,
        st.booleans(),
    ),
    min_size=1,
    max_size=25,
)


def _query(app: App, spec: tuple[dict[str, Any], list[tuple[str, bool]], int | None]) -> Query:
    filters, order, limit = spec
    query = app.todos.where(filters)
    for field, desc in order:
        query = query.order_by(field, desc=desc)
    return query if limit is None else query.limit(limit)


def _pick(records: list[dict[str, Any]], index: int) -> dict[str, Any] | None:
    return records[index % len(records)] if records else None


def _step(app: App, peer: App, step: tuple[str, int, Any, Any, bool]) -> None:
    action, index, title, number, flag = step
    todos = app.todos.fetch()
    projects = app.projects.fetch()
    project = _pick(projects, index)
    project_id = project["id"] if project is not None and flag else None
    if action == "insert":
        app.todos.insert({"title": title, "priority": number, "done": flag, "projectId": project_id})
    elif action == "update" and (todo := _pick(todos, index)):
        changes = {"title": title} if index % 3 == 0 else {"priority": number} if index % 3 == 1 else {}
        app.todos.update(todo["id"], {**changes, "done": flag})
    elif action == "delete" and (todo := _pick(todos, index)):
        app.todos.delete(todo["id"])
    elif action == "batch":
        with app.batch():
            app.todos.insert({"title": title, "priority": number})
            for todo in todos[index % 4 :: 3]:
                app.todos.update(todo["id"], {"priority": number, "done": not todo["done"]})
    elif action == "bulk":  # more changes at once than are put in place one by one
        with app.batch():
            for i in range(20):
                app.todos.insert({"title": f"{title}{i}", "priority": (number or 0) + i % 3, "done": flag})
            for todo in todos:
                app.todos.update(todo["id"], {"priority": index % 5, "title": title})
    elif action == "peer":
        peer.apply(app.operations(after=peer.version_vector))
        theirs = peer.todos.fetch()
        if (todo := _pick(theirs, index)) and flag:
            peer.todos.update(todo["id"], {"title": title, "priority": number})
        else:
            peer.todos.insert({"title": title, "priority": number, "done": flag})
        app.apply(peer.operations(after=app.version_vector))
    elif action == "project":
        app.projects.insert({"name": str(index)})
    elif action == "delete-project" and project is not None:
        app.projects.delete(project["id"])
    elif action == "forget" and (todo := _pick(todos, index)):
        # Records leaving the sync scope change with no operation saying so (only received ones go).
        replication.forget_records(app, "todos", [todo["id"]])


@settings(max_examples=100, deadline=None, database=None)
@given(specs=st.lists(_query_specs, min_size=1, max_size=3), steps=_steps)
def test_applying_every_change_set_gives_the_query_results(
    specs: list[tuple[dict[str, Any], list[tuple[str, bool]], int | None]],
    steps: list[tuple[str, int, Any, Any, bool]],
) -> None:
    app = create_app(SCHEMA, path=":memory:")
    peer = create_app(SCHEMA, path=":memory:")
    try:
        app.todos.insert({"title": "seed", "priority": 1})
        queries = [_query(app, spec) for spec in specs]
        watchers = [Changes() for _ in queries]
        lists: list[list[list[dict[str, Any]]]] = [[] for _ in queries]
        for query, watcher, calls in zip(queries, watchers, lists, strict=True):
            query.subscribe_changes(watcher)
            query.subscribe(calls.append)
        for step in steps:
            before = [list(watcher.rows) for watcher in watchers]
            counts = [len(watcher.calls) for watcher in watchers]
            try:
                _step(app, peer, step)
            except OfflineError as exc:
                assert exc.code in {"CONSTRAINT_VIOLATION", "RELATION_VIOLATION"}, exc
            for query, watcher, calls, old, count in zip(
                queries, watchers, lists, before, counts, strict=True
            ):
                expected = query.fetch()
                assert watcher.rows == expected
                assert calls[-1] == expected
                for changes in watcher.calls[count:]:
                    _assert_minimal(changes, old)
                    old = changes.apply(old)
    finally:
        app.close()
        peer.close()


def _assert_minimal(changes: QueryChanges, before: list[dict[str, Any]]) -> None:
    """A change set names only real changes, each once, relative to the results it follows."""
    held = {record["id"]: record for record in before}
    assert not changes.reset
    assert changes.inserted or changes.updated or changes.removed
    assert all(record["id"] not in held for record in changes.inserted)
    assert [held[record["id"]] for record in changes.updated] == changes.previous
    assert all(new != old for new, old in zip(changes.updated, changes.previous, strict=True))
    assert all(held[record["id"]] == record for record in changes.removed)
    named = [r["id"] for r in changes.inserted + changes.updated + changes.removed]
    assert len(named) == len(set(named))
