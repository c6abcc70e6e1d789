"""Opening a database written by an older schema version (DESIGN.md section 2 `migrations`;
offline/store/local_migrations.py).

Rows and unsynced operations are kept (renamed fields carry the old values, operation ids do not change),
backfills become ordinary pending operations written once, the new version is stored, a newer database is
refused, and a replica on the new schema reads operations written under the old one.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from offline import App, OfflineError, create_app, define_schema, migrate, t
from offline.core.schema import SchemaDefinition

V1 = define_schema(
    {
        "version": 1,
        "collections": {"todos": {"fields": {"title": t.string(), "done": t.boolean().default(False)}}},
    }
)


def backfill_priority(record: dict[str, Any]) -> dict[str, Any]:
    return {"priority": 5 if record["done"] else 2}


def v2(backfill: Any = backfill_priority) -> SchemaDefinition:
    step = (
        migrate()
        .rename_field("todos", "title", "name")
        .add_field("todos", "priority", t.number().default(1))
        .add_field("todos", "notes", t.string().optional())
        .backfill("todos", backfill)
        .build()
    )
    return define_schema(
        {
            "version": 2,
            "collections": {
                "todos": {
                    "fields": {
                        "name": t.string(),
                        "done": t.boolean().default(False),
                        "priority": t.number().default(1),
                        "notes": t.string().optional(),
                    }
                }
            },
            "migrations": {2: step},
        }
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "app.db"


def write_v1(path: Path) -> tuple[list[Any], list[dict[str, Any]]]:
    """Records plus unsynced operations written under version 1; returns (operations, records)."""
    app = create_app(V1, path=str(path))
    one = app.todos.insert({"title": "one"})
    app.todos.insert({"title": "two", "done": True})
    app.todos.update(one["id"], {"title": "uno"})
    gone = app.todos.insert({"title": "gone"})
    app.todos.delete(gone["id"])
    ops, records = app.operations(), app.todos.fetch()
    app.close()
    return ops, records


def stored_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        (value,) = conn.execute("SELECT value FROM _offline_meta WHERE key = 'schema_version'").fetchone()
    return int(value)


def open_app(schema: SchemaDefinition, path: Path) -> App:
    return create_app(schema, path=str(path))


def test_v1_rows_survive_with_renamed_field_added_defaults_and_backfill(db: Path) -> None:
    _, old = write_v1(db)
    app = open_app(v2(), db)
    try:
        records = app.todos.fetch()
        assert [r["id"] for r in records] == [r["id"] for r in old]
        assert records == [
            {
                "id": r["id"],
                "name": r["title"],
                "done": r["done"],
                "priority": 5 if r["done"] else 2,
                "notes": None,
            }
            for r in old
        ]
        assert app.todos.where({"name": "uno"}).count() == 1
        assert stored_version(db) == 2
    finally:
        app.close()


def test_unsynced_v1_operations_are_kept_unchanged_and_the_backfill_is_pending(db: Path) -> None:
    v1_ops, old = write_v1(db)
    app = open_app(v2(), db)
    try:
        ops = app.operations()
        assert ops[: len(v1_ops)] == v1_ops  # same ids, same content, still waiting to sync
        assert all(op.schema_version == 1 for op in v1_ops)
        backfill = ops[len(v1_ops) :]
        assert [(o.type, o.record_id, dict(o.data or {})) for o in backfill] == [
            ("update", r["id"], {"priority": 5 if r["done"] else 2}) for r in old
        ]
        assert all(o.node_id == app.node_id and o.schema_version == 2 for o in backfill)
        assert all(dict(o.previous_data or {}) == {"priority": 1} for o in backfill)
        # Ordinary operations: they continue this node's sequence and sync like any write.
        assert [o.sequence_number for o in backfill] == list(
            range(v1_ops[-1].sequence_number + 1, v1_ops[-1].sequence_number + 1 + len(backfill))
        )
        assert app.version_vector == {app.node_id: backfill[-1].sequence_number}
    finally:
        app.close()


def test_reopening_does_not_run_the_backfill_again(db: Path) -> None:
    calls: list[str] = []

    def counting(record: dict[str, Any]) -> dict[str, Any]:
        calls.append(record["id"])
        return backfill_priority(record)

    write_v1(db)
    first = open_app(v2(counting), db)
    ops = first.operations()
    records = first.todos.fetch()
    first.close()
    assert len(calls) == 2

    again = open_app(v2(counting), db)
    try:
        assert len(calls) == 2
        assert again.operations() == ops
        assert again.todos.fetch() == records
    finally:
        again.close()


def test_writes_after_the_migration_use_the_new_schema(db: Path) -> None:
    write_v1(db)
    app = open_app(v2(), db)
    try:
        todo = app.todos.where({"name": "uno"}).first()
        assert todo is not None
        updated = app.todos.update(todo["id"], {"name": "one again", "notes": "n"})
        assert updated == {**todo, "name": "one again", "notes": "n"}
        new = app.todos.insert({"name": "three"})
        assert new["priority"] == 1 and new["done"] is False
        assert app.operations()[-1].schema_version == 2
    finally:
        app.close()


def test_a_database_newer_than_the_schema_is_refused(db: Path) -> None:
    write_v1(db)
    open_app(v2(), db).close()

    with pytest.raises(OfflineError) as exc:
        open_app(V1, db)

    assert exc.value.code == "STORAGE_ERROR"
    assert "version 2" in exc.value.message and "version 1" in exc.value.message
    assert exc.value.context is not None
    assert exc.value.context["databaseVersion"] == 2
    assert exc.value.context["schemaVersion"] == 1
    assert stored_version(db) == 2  # untouched
    reopened = open_app(v2(), db)
    try:
        assert reopened.todos.count() == 2
    finally:
        reopened.close()


def test_a_v2_replica_reads_v1_operations_with_the_new_field_names(db: Path, tmp_path: Path) -> None:
    v1_ops, old = write_v1(db)
    replica = open_app(v2(), tmp_path / "replica.db")
    try:
        assert all("title" in dict(o.data or {}) for o in v1_ops if o.type != "delete")
        replica.apply(v1_ops)

        assert replica.todos.fetch() == [
            {"id": r["id"], "name": r["title"], "done": r["done"], "priority": 1, "notes": None} for r in old
        ]
        # And with the migrated database's backfill operations it converges on the same records.
        migrated = open_app(v2(), db)
        try:
            replica.apply(migrated.operations())
            assert replica.todos.fetch() == migrated.todos.fetch()
        finally:
            migrated.close()
    finally:
        replica.close()


def test_a_failing_backfill_leaves_the_database_at_the_old_version(db: Path) -> None:
    v1_ops, old = write_v1(db)

    def broken(record: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("bug in the backfill")

    with pytest.raises(OfflineError) as exc:
        open_app(v2(broken), db)

    assert exc.value.code == "STORAGE_ERROR"
    assert stored_version(db) == 1
    still_v1 = open_app(V1, db)
    try:
        assert still_v1.todos.fetch() == old
        assert still_v1.operations() == v1_ops
    finally:
        still_v1.close()
    # The fixed release migrates (and backfills) as if nothing had happened.
    fixed = open_app(v2(), db)
    try:
        assert [r["priority"] for r in fixed.todos.fetch()] == [5 if r["done"] else 2 for r in old]
        assert len(fixed.operations()) == len(v1_ops) + len(old)
    finally:
        fixed.close()


@pytest.mark.parametrize(
    "result",
    [{"priority": "high"}, {"nope": 1}, {"name": None}],
    ids=["wrong-type", "unknown-field", "required-null"],
)
def test_a_backfill_returning_invalid_values_fails_the_migration(db: Path, result: dict[str, Any]) -> None:
    write_v1(db)
    with pytest.raises(OfflineError) as exc:
        open_app(v2(lambda record: result), db)
    assert exc.value.code == "STORAGE_ERROR"
    assert "backfill" in exc.value.message
    assert stored_version(db) == 1


def test_constant_backfill_mapping(db: Path) -> None:
    write_v1(db)
    app = open_app(v2({"notes": "migrated"}), db)
    try:
        assert [r["notes"] for r in app.todos.fetch()] == ["migrated", "migrated"]
    finally:
        app.close()


def test_a_backfill_sees_and_writes_the_field_names_of_its_own_version(db: Path) -> None:
    """v1 -> v3 at once: the v2 backfill is written against v2 names although v3 renames `done`."""
    write_v1(db)
    seen: list[set[str]] = []

    def v2_backfill(record: dict[str, Any]) -> dict[str, Any]:
        seen.append(set(record))
        return {"priority": 5 if record["done"] else 2, "done": True}

    step2 = (
        migrate()
        .rename_field("todos", "title", "name")
        .add_field("todos", "priority", t.number().default(1))
        .backfill("todos", v2_backfill)
        .build()
    )
    step3 = migrate().rename_field("todos", "done", "completed").build()
    v3 = define_schema(
        {
            "version": 3,
            "collections": {
                "todos": {
                    "fields": {
                        "name": t.string(),
                        "completed": t.boolean().default(False),
                        "priority": t.number().default(1),
                    }
                }
            },
            "migrations": {2: step2, 3: step3},
        }
    )
    app = open_app(v3, db)
    try:
        assert seen == [{"id", "name", "done", "priority"}] * 2
        assert sorted((r["name"], r["completed"], r["priority"]) for r in app.todos.fetch()) == [
            ("two", True, 5),
            ("uno", True, 2),
        ]
        assert stored_version(db) == 3
    finally:
        app.close()


def test_a_fresh_database_on_a_later_version_runs_no_migration(tmp_path: Path) -> None:
    calls: list[Any] = []

    def counting(record: dict[str, Any]) -> dict[str, Any]:
        calls.append(record)
        return {}

    app = open_app(v2(counting), tmp_path / "fresh.db")
    try:
        assert app.todos.count() == 0
        assert app.operations() == []
        assert calls == []
        assert stored_version(tmp_path / "fresh.db") == 2
    finally:
        app.close()
