"""What holds offline (offline/store/breaches.py): replicas exchanging operations without a server agree on
the same records, and `App.apply` reports each cross-record rule those records break (its return value's
``violations`` and a ``constraint:violated`` event); nothing resolves them until a server judges the writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offline import App, OfflineError, OfflineEvent, create_app, define_schema, t
from offline.core.schema import SchemaDefinition


def schema() -> SchemaDefinition:
    return define_schema(
        {
            "version": 1,
            "collections": {
                "projects": {"fields": {"name": t.string()}},
                "tasks": {"fields": {"title": t.string(), "projectId": t.string().optional()}},
                "users": {
                    "fields": {"handle": t.string()},
                    "constraints": {
                        "uniqueHandle": {
                            "type": "unique",
                            "fields": ["handle"],
                            "onConflict": "first-write-wins",
                        }
                    },
                },
                "seats": {
                    "fields": {"room": t.string()},
                    "constraints": {
                        "roomSize": {
                            "type": "capacity",
                            "fields": ["room"],
                            "limit": 1,
                            "onConflict": "last-write-wins",
                        }
                    },
                },
            },
            "relations": {
                "taskProject": {
                    "from": "tasks",
                    "to": "projects",
                    "type": "many-to-one",
                    "field": "projectId",
                    "onDelete": "cascade",
                }
            },
        }
    )


@pytest.fixture
def pair() -> Iterator[tuple[App, App]]:
    a, b = create_app(schema(), path=":memory:"), create_app(schema(), path=":memory:")
    yield a, b
    a.close()
    b.close()


def snapshot(app: App) -> dict[str, list[dict[str, Any]]]:
    return {
        name: sorted(app.collection(name).fetch(), key=lambda r: r["id"]) for name in app.schema.collections
    }


def events(app: App) -> list[OfflineEvent]:
    seen: list[OfflineEvent] = []
    app.events.on("constraint:violated", seen.append)
    return seen


def test_concurrent_duplicates_are_reported_on_both_replicas(pair: tuple[App, App]) -> None:
    a, b = pair
    seen_a, seen_b = events(a), events(b)
    first = a.users.insert({"handle": "ada"})
    second = b.users.insert({"handle": "ada"})
    to_b = b.apply(a.operations())
    to_a = a.apply(b.operations())
    assert snapshot(a) == snapshot(b)  # the same records: both duplicates
    for result in (to_a, to_b):
        assert len(result) == 1
        [breach] = result.violations
        assert (breach.kind, breach.name, breach.collection) == ("unique", "uniqueHandle", "users")
        assert breach.record_ids == tuple(sorted([first["id"], second["id"]]))
        assert "ada" in breach.message
    for seen in (seen_a, seen_b):
        [event] = seen
        assert event.constraint == "uniqueHandle"
        assert event.trace.constraint_violated == "uniqueHandle" and event.trace.tier == 2


def test_an_overfull_group_is_reported(pair: tuple[App, App]) -> None:
    a, b = pair
    a.seats.insert({"room": "r1"})
    b.seats.insert({"room": "r1"})
    [breach] = b.apply(a.operations()).violations
    assert (breach.kind, breach.name, len(breach.record_ids)) == ("capacity", "roomSize", 2)
    assert "limit 1" in breach.message


def test_a_child_inserted_into_a_concurrently_deleted_parent_is_reported(pair: tuple[App, App]) -> None:
    a, b = pair
    project = a.projects.insert({"name": "p"})
    b.apply(a.operations())
    a.projects.delete(project["id"])
    task = b.tasks.insert({"title": "late", "projectId": project["id"]})
    to_a = a.apply(b.operations())
    to_b = b.apply(a.operations())
    assert snapshot(a) == snapshot(b)
    assert snapshot(a)["tasks"] == [task]  # the orphan is held on both: nothing resolves it offline
    for result in (to_a, to_b):
        [breach] = result.violations
        assert (breach.kind, breach.name, breach.record_ids) == ("relation", "taskProject", (task["id"],))
        assert project["id"] in breach.message and "cascade" in breach.message


def test_nothing_is_reported_when_every_rule_holds(pair: tuple[App, App]) -> None:
    a, b = pair
    seen = events(b)
    project = a.projects.insert({"name": "p"})
    a.tasks.insert({"title": "t", "projectId": project["id"]})
    a.users.insert({"handle": "ada"})
    result = b.apply(a.operations())
    assert len(result) == 3 and result.violations == [] and seen == []
    assert b.apply(a.operations()).violations == []  # nothing new applied


def relation_schema(on_delete: str) -> SchemaDefinition:
    return define_schema(
        {
            "version": 1,
            "collections": {
                "projects": {"fields": {"name": t.string()}},
                "tasks": {"fields": {"title": t.string(), "projectId": t.string().optional()}},
            },
            "relations": {
                "taskProject": {
                    "from": "tasks",
                    "to": "projects",
                    "type": "many-to-one",
                    "field": "projectId",
                    "onDelete": on_delete,
                }
            },
        }
    )


@pytest.mark.parametrize("on_delete", ["cascade", "restrict"])
def test_a_local_write_into_a_parent_this_replica_holds_deleted_is_refused(on_delete: str) -> None:
    a, b = (create_app(relation_schema(on_delete), path=":memory:") for _ in range(2))
    doomed, other = (a.projects.insert({"name": n}) for n in ("doomed", "other"))
    task = a.tasks.insert({"title": "t", "projectId": other["id"]})
    b.apply(a.operations())
    if on_delete == "restrict":
        a.tasks.update(task["id"], {"title": "t"})  # nothing points at the doomed project
    a.projects.delete(doomed["id"])
    b.apply(a.operations())
    for write in (
        lambda: b.tasks.insert({"title": "late", "projectId": doomed["id"]}),
        lambda: b.tasks.update(task["id"], {"projectId": doomed["id"]}),
    ):
        with pytest.raises(OfflineError) as caught:
            write()
        assert caught.value.code == "CONSTRAINT_VIOLATION"
        assert caught.value.context["relation"] == "taskProject"
        assert caught.value.context["parent"] == {"collection": "projects", "id": doomed["id"]}
    assert b.tasks.find_by_id(task["id"]) == task and len(b.tasks.fetch()) == 1
    b.tasks.update(task["id"], {"title": "still editable"})  # a write leaving the reference alone
    b.tasks.insert({"title": "elsewhere", "projectId": other["id"]})


def test_a_local_write_into_a_deleted_parent_under_set_null_drops_the_reference() -> None:
    a, b = (create_app(relation_schema("set-null"), path=":memory:") for _ in range(2))
    project = a.projects.insert({"name": "p"})
    b.apply(a.operations())
    a.projects.delete(project["id"])
    b.apply(a.operations())
    task = b.tasks.insert({"title": "late", "projectId": project["id"]})
    assert task["projectId"] is None
    assert b.tasks.find_by_id(task["id"])["projectId"] is None
    a.apply(b.operations())
    assert a.tasks.fetch() == b.tasks.fetch()


@settings(max_examples=40, deadline=None, database=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from(["user", "seat", "project", "task", "delete-project", "exchange"]),
            st.integers(0, 2),
        ),
        min_size=2,
        max_size=20,
    )
)
def test_replicas_agree_and_every_breach_they_hold_was_reported(steps: list[tuple[int, str, int]]) -> None:
    apps = [create_app(schema(), path=":memory:") for _ in range(3)]
    reported: list[set[tuple[str, str]]] = [set() for _ in apps]
    try:
        for who, action, pick in steps:
            app = apps[who]
            try:
                if action == "user":
                    app.users.insert({"handle": f"h{pick}"})
                elif action == "seat":
                    app.seats.insert({"room": f"r{pick}"})
                elif action == "project":
                    app.projects.insert({"name": f"p{pick}"})
                elif action == "task" and (projects := app.projects.fetch()):
                    app.tasks.insert({"title": "t", "projectId": projects[pick % len(projects)]["id"]})
                elif action == "delete-project" and (projects := app.projects.fetch()):
                    app.projects.delete(projects[pick % len(projects)]["id"])
                elif action == "exchange":
                    other = apps[pick]
                    result = other.apply(app.operations())
                    reported[pick] |= {(b.kind, b.name) for b in result.violations}
            except OfflineError as exc:
                assert exc.code == "CONSTRAINT_VIOLATION"  # the local store judges its own writes
        everything = [op for app in apps for op in app.operations()]
        for i, app in enumerate(apps):
            reported[i] |= {(b.kind, b.name) for b in app.apply(everything).violations}
        first = snapshot(apps[0])
        for i, app in enumerate(apps):
            assert snapshot(app) == first
            held = holding(first)
            assert held <= reported[i], (held, reported[i])
    finally:
        for app in apps:
            app.close()


def holding(records: dict[str, list[dict[str, Any]]]) -> set[tuple[str, str]]:
    """The rules ``records`` break, by kind and name (the schema of this module)."""
    out: set[tuple[str, str]] = set()
    handles = [u["handle"] for u in records["users"]]
    if len(handles) != len(set(handles)):
        out.add(("unique", "uniqueHandle"))
    rooms = [s["room"] for s in records["seats"]]
    if any(rooms.count(r) > 1 for r in rooms):
        out.add(("capacity", "roomSize"))
    projects = {p["id"] for p in records["projects"]}
    if any(t["projectId"] not in projects for t in records["tasks"]):
        out.add(("relation", "taskProject"))
    return out
