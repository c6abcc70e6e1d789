"""The local store's lookups go through indexes (offline/store/rows.py, `sync_lookup_indexes`).

Constraint checks and relation planning look records up by field values on every write and delete; every
statement they run is checked with SQLite's own query plan: none reads a whole record table. The log's
highest clock is read at open without reading the log.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import App, OfflineError, create_app, define_schema, t
from offline.core.migrations import migrate
from tests.merge._support import make_op
from tests.support.sql_trace import traced


def _schema(version: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "version": version,
        "collections": {
            "teams": {"fields": {"name": t.string()}},
            "tags": {"fields": {"label": t.string()}},
            "users": {
                "fields": {
                    "email": t.string().optional(),
                    "teamId": t.string().optional(),
                    "tagIds": t.array(t.string()).optional(),
                    "nick": t.string().optional(),
                },
                "constraints": {
                    "uniqueEmail": {"type": "unique", "fields": ["email"], "onConflict": "first-write-wins"},
                    "teamSize": {
                        "type": "capacity",
                        "fields": ["teamId"],
                        "limit": 1000,
                        "onConflict": "first-write-wins",
                    },
                },
            },
        },
        "relations": {
            "userTeam": {"from": "users", "to": "teams", "type": "many-to-one", "field": "teamId"},
            "userTags": {
                "from": "users",
                "to": "tags",
                "type": "many-to-many",
                "field": "tagIds",
                "onDelete": "set-null",
            },
        },
        **extra,
    }


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    opened = create_app(define_schema(_schema()), path=str(tmp_path / "a.db"))
    yield opened
    opened.close()


def _plans_of(app: App, action: Any) -> list[tuple[str, str]]:
    """(statement, query plan) of every SELECT ``action`` runs on the database."""
    conn = app.db.conn
    with traced(conn) as statements:
        action()
    out = []
    for sql in statements:
        if sql.lstrip().upper().startswith(("SELECT", "WITH")):
            try:
                rows = conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()
            except sqlite3.Error:  # the traced text has its parameters expanded; some are not re-runnable
                continue
            out.append((sql, " | ".join(str(row[-1]) for row in rows)))
    return out


def _scans(plans: list[tuple[str, str]], *tables: str) -> list[tuple[str, str]]:
    return [(sql, plan) for sql, plan in plans if any(f"SCAN {table}" in plan for table in tables)]


def test_unique_and_capacity_checks_on_insert_use_an_index(app: App) -> None:
    team = app.teams.insert({"name": "t"})
    with app.batch():
        for i in range(300):
            app.users.insert({"email": f"u{i}@x.io", "teamId": team["id"]})

    plans = _plans_of(app, lambda: app.users.insert({"email": "new@x.io", "teamId": team["id"]}))

    assert any("users" in sql for sql, _ in plans)  # the checks did look the table up
    assert _scans(plans, "users") == []
    assert app.users.where({"email": "new@x.io"}).count() == 1


def test_a_unique_constrained_insert_into_100_000_rows_uses_an_index(app: App) -> None:
    """At a real table's size, with the planner's statistics gathered (ANALYZE), the checks still search
    an index. The rows are written straight into the record table: the checks read nothing else."""
    team = app.teams.insert({"name": "t"})
    codec = app.codecs["users"]
    rows = [
        codec.row(
            {"id": f"u{i:06d}", "email": f"u{i}@x.io", "teamId": f"t{i % 2000}", "tagIds": None, "nick": None}
        )
        for i in range(100_000)
    ]
    with app.db.transaction() as conn:
        conn.executemany(codec.upsert_sql, rows)
        conn.execute("ANALYZE")
    assert app.users.count() == 100_000

    plans = _plans_of(app, lambda: app.users.insert({"email": "new@x.io", "teamId": team["id"]}))

    assert any("users" in sql for sql, _ in plans)
    assert _scans(plans, "users") == []
    with pytest.raises(OfflineError) as refused:
        app.users.insert({"email": "u99999@x.io"})  # the constraint still holds at this size
    assert refused.value.code


def test_deleting_a_parent_finds_its_children_through_indexes(app: App) -> None:
    team = app.teams.insert({"name": "t"})
    tag = app.tags.insert({"label": "x"})
    other = app.tags.insert({"label": "y"})
    with app.batch():
        for i in range(200):
            app.users.insert({"email": f"u{i}@x.io", "tagIds": [other["id"]]})
    holder = app.users.insert({"email": "h@x.io", "teamId": team["id"], "tagIds": [tag["id"], other["id"]]})

    plans = _plans_of(app, lambda: app.tags.delete(tag["id"]))
    plans += _plans_of(app, lambda: app.teams.delete(team["id"]))

    assert _scans(plans, "users") == []
    kept = app.users.find_by_id(holder["id"])
    assert kept is not None and kept["tagIds"] == [other["id"]]  # set-null: the many-to-many loses the id


def test_the_element_index_follows_every_change_of_the_array(app: App) -> None:
    a, b = app.tags.insert({"label": "a"}), app.tags.insert({"label": "b"})
    user = app.users.insert({"email": "u@x.io", "tagIds": [a["id"]]})
    assert [r["id"] for r in app.find_containing("users", "tagIds", a["id"])] == [user["id"]]

    app.users.update(user["id"], {"tagIds": [b["id"]]})
    assert app.find_containing("users", "tagIds", a["id"]) == []
    assert [r["id"] for r in app.find_containing("users", "tagIds", b["id"])] == [user["id"]]

    app.users.delete(user["id"])
    assert app.find_containing("users", "tagIds", b["id"]) == []
    (left,) = app.db.conn.execute('SELECT count(*) FROM "_offline_lookup_users__tagIds"').fetchone()
    assert left == 0


def test_an_older_database_gets_the_indexes_at_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    first = create_app(define_schema(_schema()), path=str(path))
    tag = first.tags.insert({"label": "a"})
    user = first.users.insert({"email": "u@x.io", "tagIds": [tag["id"]]})
    conn = first.db.conn
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name LIKE '_offline_lookup_%'")]
    for name in names:  # as a database written before the store kept them
        kind = conn.execute("SELECT type FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
        if kind in ("index", "trigger"):
            conn.execute(f'DROP {kind} IF EXISTS "{name}"')
    conn.execute('DROP TABLE "_offline_lookup_users__tagIds"')
    conn.commit()
    first.close()

    again = create_app(define_schema(_schema()), path=str(path))
    try:
        assert [r["id"] for r in again.find_containing("users", "tagIds", tag["id"])] == [user["id"]]
        plans = _plans_of(again, lambda: again.users.insert({"email": "v@x.io"}))
        assert _scans(plans, "users") == []
    finally:
        again.close()


def test_a_migration_removing_and_renaming_indexed_fields_keeps_working(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    first = create_app(define_schema(_schema()), path=str(path))
    first.users.insert({"email": "u@x.io", "nick": "n"})
    first.close()

    second = _schema(2, migrations={2: migrate().remove_field("users", "email").build()})
    users = second["collections"]["users"]
    del users["fields"]["email"]
    del users["constraints"]["uniqueEmail"]
    users["constraints"]["uniqueNick"] = {
        "type": "unique",
        "fields": ["nick"],
        "onConflict": "first-write-wins",
    }
    app = create_app(define_schema(second), path=str(path))
    try:
        names = {r[0] for r in app.db.conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "_offline_lookup_users__nick" in names
        assert "_offline_lookup_users__email" not in names
        plans = _plans_of(app, lambda: app.users.insert({"nick": "m"}))
        assert _scans(plans, "users") == []
        assert app.users.where({"nick": "n"}).count() == 1
    finally:
        app.close()


def test_the_highest_clock_is_read_without_reading_the_log(app: App) -> None:
    for i in range(50):
        app.tags.insert({"label": str(i)})
    now = time.time_ns() // 1_000_000
    foreign = [
        make_op(
            node=node,
            seq=seq,
            type="insert",
            data={"label": "far"},
            wall=wall,
            collection="tags",
            record_id=f"r{i}",
        )
        for i, (node, seq, wall) in enumerate(
            [("n-a", 1, now - 5), ("n-a", 2, now + 60_000), ("n-b", 1, now - 9)]
        )
    ]
    app.apply(foreign)
    conn = app.db.conn
    (scanned,) = conn.execute("SELECT max(hlc) FROM _offline_ops").fetchone()

    assert app.db.max_hlc() == scanned
    with traced(conn) as statements:
        app.db.max_hlc()
    (sql,) = statements
    plan = " | ".join(str(r[-1]) for r in conn.execute("EXPLAIN QUERY PLAN " + sql))
    assert "SCAN _offline_ops" not in plan


class _RecordingConnection:
    """The app's connection, recording each statement with its parameters as the store bound them (the trace
    callback expands parameters into literals, which hides a parameter SQLite cannot match a partial index to)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.calls: list[tuple[str, Any]] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.calls.append((sql, params))
        return self._conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_the_waiting_operations_are_read_from_where_they_start_through_the_logs_key(app: App) -> None:
    from offline.store.replication import mark_acknowledged, pending_operations, pending_wires

    for i in range(300):
        app.tags.insert({"label": str(i)})
    mark_acknowledged(app, range(1, 301))
    app.tags.insert({"label": "waiting"})
    conn = app.db.conn
    recording = _RecordingConnection(conn)
    app.db.conn = recording  # type: ignore[assignment]
    try:
        waiting = pending_operations(app)
        wires = pending_wires(app)
        count = app.db.pending_count(app.node_id)
    finally:
        app.db.conn = conn

    assert [op.data["label"] for op in waiting] == ["waiting"]
    assert len(wires) == 1
    assert count == 1
    assert len(recording.calls) == 3
    for sql, params in recording.calls:
        plan = " | ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
        assert "SEARCH _offline_ops USING PRIMARY KEY (node_id=? AND sequence_number>?)" in plan, (sql, plan)
        assert "SCAN" not in plan, (sql, plan)
    # They start at the first waiting one: the 300 acknowledged before it are not read again.
    assert app.db.get_meta("pending_from") == "301"
