"""create_app, app.ready, collection access and the local-only sync object (DESIGN.md section 2, Client)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from offline import INVALID_OPERATION, SYNC_ERROR, OfflineError, create_app, define_schema, t
from offline.store import App, Collection

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {"fields": {"title": t.string(), "done": t.boolean().default(False)}},
            "notes": {"fields": {"body": t.string()}},
        },
    }
)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    application = create_app(SCHEMA, path=str(tmp_path / "app.db"))
    yield application
    application.close()


def test_create_app_needs_no_running_event_loop(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
    app = create_app(SCHEMA, path=str(tmp_path / "app.db"))
    try:
        # The local API works at once, before anything awaits app.ready.
        record = app.todos.insert({"title": "first"})
        assert app.todos.find_by_id(record["id"]) == record
    finally:
        app.close()


def test_ready_is_awaitable_and_gives_the_app(app: App) -> None:
    async def main() -> object:
        return await app.ready

    assert asyncio.run(main()) is app
    # Awaiting twice is fine: ready stays done.
    assert asyncio.run(main()) is app


def test_create_app_accepts_keyword_arguments(tmp_path: Path) -> None:
    path = tmp_path / "kw.db"
    app = create_app(schema=SCHEMA, sync=None, path=str(path))
    try:
        app.notes.insert({"body": "x"})
    finally:
        app.close()
    assert path.exists()


def test_create_app_refuses_something_that_is_not_a_schema(tmp_path: Path) -> None:
    with pytest.raises(OfflineError) as info:
        create_app({"version": 1, "collections": {}}, path=str(tmp_path / "x.db"))  # type: ignore[arg-type]
    assert info.value.code == "INVALID_SCHEMA"


def test_collection_by_attribute_and_by_name_is_the_same_object(app: App) -> None:
    assert isinstance(app.todos, Collection)
    assert app.todos is app.collection("todos")
    assert app.notes is app.collection("notes")
    assert app.todos.name == "todos"


def test_unknown_collection_by_name_is_invalid_operation(app: App) -> None:
    with pytest.raises(OfflineError) as info:
        app.collection("missing")
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["collection"] == "missing"
    assert "todos" in info.value.message


def test_unknown_collection_by_attribute_is_attribute_error(app: App) -> None:
    with pytest.raises(AttributeError):
        _ = app.missing
    assert not hasattr(app, "missing")


def test_collections_are_separate_tables(app: App) -> None:
    app.todos.insert({"title": "a"})
    app.notes.insert({"body": "b"})
    assert [r["title"] for r in app.todos.fetch()] == ["a"]
    assert [r["body"] for r in app.notes.fetch()] == ["b"]


def test_local_only_sync_status_and_connect_error(app: App) -> None:
    assert isinstance(app.sync.status, str)
    assert app.sync.status == "disabled"

    with pytest.raises(OfflineError) as info:
        asyncio.run(app.sync.connect())
    assert info.value.code == SYNC_ERROR
    assert "sync" in info.value.message
    # disconnect on a local-only app is harmless.
    assert asyncio.run(app.sync.disconnect()) is None


def test_node_id_is_a_uuid_v7_and_vector_starts_empty(app: App) -> None:
    node = app.node_id
    assert isinstance(node, str) and len(node) == 36 and node[14] == "7"
    assert app.version_vector == {}
    assert app.operations() == []


def test_version_vector_counts_local_writes(app: App) -> None:
    record = app.todos.insert({"title": "a"})
    app.todos.update(record["id"], {"title": "b"})
    assert app.version_vector == {app.node_id: 2}
    ops = app.operations()
    assert [op.sequence_number for op in ops] == [1, 2]
    assert all(op.node_id == app.node_id for op in ops)


def test_two_databases_have_different_node_ids(tmp_path: Path) -> None:
    a = create_app(SCHEMA, path=str(tmp_path / "a.db"))
    b = create_app(SCHEMA, path=str(tmp_path / "b.db"))
    try:
        assert a.node_id != b.node_id
    finally:
        a.close()
        b.close()


def test_writes_after_close_are_refused(tmp_path: Path) -> None:
    app = create_app(SCHEMA, path=str(tmp_path / "app.db"))
    app.close()
    app.close()  # idempotent
    with pytest.raises(OfflineError) as info:
        app.todos.insert({"title": "late"})
    assert info.value.code == "STORAGE_ERROR"


def test_app_is_a_context_manager(tmp_path: Path) -> None:
    path = str(tmp_path / "app.db")
    with create_app(SCHEMA, path=path) as app:
        record = app.todos.insert({"title": "kept"})
    with create_app(SCHEMA, path=path) as again:
        assert again.todos.find_by_id(record["id"]) == record


def test_a_database_file_is_open_in_one_app_at_a_time(tmp_path: Path) -> None:
    """A second app on the same file would share the node id and collide on sequence numbers: refused."""
    path = str(tmp_path / "app.db")
    first = create_app(SCHEMA, path=path)
    written = first.todos.insert({"title": "by the first app"})
    with pytest.raises(OfflineError) as info:
        create_app(SCHEMA, path=path)
    assert info.value.code == "STORAGE_ERROR" and info.value.context["reason"] == "locked"
    assert "already open in another app or process" in info.value.message
    first.todos.insert({"title": "the first app is unharmed"})
    first.close()
    with create_app(SCHEMA, path=path) as again:  # free once the first one closed
        assert again.todos.find_by_id(written["id"]) == written
        assert again.todos.where({}).count() == 2


def test_the_lock_holds_across_processes_and_goes_with_the_process(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = str(tmp_path / "app.db")
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time; sys.path.insert(0, sys.argv[2]);"
            "from tests.store.test_app import SCHEMA; from offline import create_app;"
            "app = create_app(SCHEMA, path=sys.argv[1]); print('open', flush=True); time.sleep(60)"
        ), path, str(Path(__file__).resolve().parents[2])],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(OfflineError) as info:
            create_app(SCHEMA, path=path)
        assert info.value.context["reason"] == "locked"
    finally:
        holder.kill()  # dies without closing anything: the lock goes with it
        holder.wait(10)
    with create_app(SCHEMA, path=path) as app:
        assert app.todos.where({}).count() == 0
