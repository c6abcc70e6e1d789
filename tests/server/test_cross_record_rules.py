"""Cross-record rules under concurrency, through the server's write pipeline (server_runtime/judging.py).

Three clients write offline and reach the server in a random order: a parent's delete wins over concurrent
child inserts and updates whatever order they arrive in, so once everything is exchanged every replica holds
the same records and none holds an orphan, for each `onDelete` value; unique and capacity constraints hold
on every replica. Clients are real apps; they push their pending operations through `SyncService.commit`
(the pipeline WebSocket sessions use) and take refusals, acknowledgements and the server's operations the
way the sync client does (`offline.store.replication`). Every store kind: memory, SQLite, PostgreSQL.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offline import App, OfflineError, create_app, define_schema, t
from offline.core.schema import SchemaDefinition
from offline.store import replication
from server_runtime.stores import ServerStore
from server_runtime.sync import Refusal, Session, SyncService

from .test_stores import Backend, backend

__all__ = ["backend"]

PROJECTS = 2
CLIENTS = 3


def relations_schema(on_delete: str, comments_on_delete: str | None = None) -> SchemaDefinition:
    """projects <- tasks.projectId <- comments.taskId, with ``on_delete`` (the comments' relation with
    ``comments_on_delete`` when given)."""
    return define_schema(
        {
            "version": 1,
            "collections": {
                "projects": {"fields": {"name": t.string()}},
                "tasks": {"fields": {"title": t.string(), "projectId": t.string().optional()}},
                "comments": {"fields": {"body": t.string(), "taskId": t.string().optional()}},
            },
            "relations": {
                "taskProject": {
                    "from": "tasks",
                    "to": "projects",
                    "type": "many-to-one",
                    "field": "projectId",
                    "onDelete": on_delete,
                },
                "commentTask": {
                    "from": "comments",
                    "to": "tasks",
                    "type": "many-to-one",
                    "field": "taskId",
                    "onDelete": comments_on_delete or on_delete,
                },
            },
        }
    )


def clear_handle(incoming: dict[str, Any], existing: Any) -> dict[str, Any]:
    return {"handle": None}


def clear_room(incoming: dict[str, Any], existing: Any) -> dict[str, Any]:
    return {"room": None}


def constraints_schema(policy: str) -> SchemaDefinition:
    """Unique handles; at most two seats of a room (capacity), both with ``policy`` ('custom': the incoming
    record gives the value up)."""
    return define_schema(
        {
            "version": 1,
            "collections": {
                "users": {
                    "fields": {"handle": t.string().optional(), "rank": t.number().default(0)},
                    "constraints": {
                        "uniqueHandle": {
                            "type": "unique",
                            "fields": ["handle"],
                            "onConflict": policy,
                            "priorityField": "rank",
                            **({"resolve": clear_handle} if policy == "custom" else {}),
                        }
                    },
                },
                "seats": {
                    "fields": {"room": t.string().optional(), "rank": t.number().default(0)},
                    "constraints": {
                        "roomSize": {
                            "type": "capacity",
                            "fields": ["room"],
                            "limit": 2,
                            "onConflict": policy,
                            "priorityField": "rank",
                            **({"resolve": clear_room} if policy == "custom" else {}),
                        }
                    },
                },
            },
        }
    )


def skewed(ms: int) -> Callable[[], int]:
    return lambda: time.time_ns() // 1_000_000 + ms


class Cluster:
    """Three client apps and one sync core; the test decides who pushes and who pulls, and when."""

    def __init__(self, service: SyncService, apps: list[App], base: int) -> None:
        self.service = service
        self.apps = apps
        self.cursors = [base] * len(apps)
        self.sessions = [
            Session(app.node_id, {name: {} for name in app.schema.collections}, None, _no_send)
            for app in apps
        ]

    async def push(self, i: int) -> None:
        app = self.apps[i]
        ops = replication.pending_operations(app)
        if not ops:
            return
        results = await self.service.commit(self.sessions[i], ops)
        acked = []
        for op in ops:
            outcome = results.get(op.id)
            if isinstance(outcome, Refusal):
                replication.reject_operation(app, op.id, outcome.code, outcome.message)
            else:
                acked.append(op.sequence_number)
        replication.mark_acknowledged(app, acked)

    async def pull(self, i: int) -> None:
        app = self.apps[i]
        stored = await self.service.store.operations_since(self.cursors[i])
        if stored:
            app.apply([s.operation for s in stored if s.operation.node_id != app.node_id])
            self.cursors[i] = stored[-1].delivery

    async def settle(self) -> None:
        for _ in range(4):
            for i in range(len(self.apps)):
                await self.push(i)
            for i in range(len(self.apps)):
                await self.pull(i)

    def server_records(self, collection: str, ids: set[str]) -> list[dict[str, Any]]:
        found = self.service.cache.find_records(collection, {})
        return sorted((r for r in found if r["id"] in ids), key=lambda r: r["id"])


async def _no_send(text: str) -> None:
    return None


def local(app: App, collection: str) -> list[dict[str, Any]]:
    return sorted(app.collection(collection).fetch(), key=lambda r: r["id"])


def orphans(records: dict[str, list[dict[str, Any]]]) -> list[str]:
    projects = {r["id"] for r in records["projects"]}
    tasks = {r["id"] for r in records["tasks"]}
    bad = [
        f"task {r['id']} -> {r['projectId']}"
        for r in records["tasks"]
        if r["projectId"] not in {None, *projects}
    ]
    bad += [
        f"comment {r['id']} -> {r['taskId']}"
        for r in records["comments"]
        if r["taskId"] not in {None, *tasks}
    ]
    return bad


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


async def open_service(backend: Backend, schema: SchemaDefinition) -> tuple[ServerStore, SyncService]:
    store = await backend.open()
    await store.set_schema(schema)
    service = SyncService(store)
    await service.start()
    return store, service


ACTIONS = (
    "delete-project",
    "rename-project",
    "insert-task",
    "update-task",
    "move-task",
    "delete-task",
    "insert-comment",
    "update-comment",
    "push",
    "pull",
)

steps_strategy = st.lists(
    st.tuples(st.integers(0, CLIENTS - 1), st.sampled_from(ACTIONS), st.integers(0, 7)),
    min_size=3,
    max_size=24,
)
skews_strategy = st.lists(st.integers(0, 90_000), min_size=CLIENTS, max_size=CLIENTS)


def act(app: App, action: str, pick: int) -> None:
    """One local write of ``action`` on the ``pick``-th record the client holds (nothing when none)."""
    projects, tasks, comments = (local(app, c) for c in ("projects", "tasks", "comments"))

    def choose(records: list[dict[str, Any]]) -> dict[str, Any] | None:
        return records[pick % len(records)] if records else None

    try:
        if action == "delete-project" and (p := choose(projects)):
            app.projects.delete(p["id"])
        elif action == "rename-project" and (p := choose(projects)):
            app.projects.update(p["id"], {"name": f"renamed {pick}"})
        elif action == "insert-task" and (p := choose(projects)):
            app.tasks.insert({"title": f"new {pick}", "projectId": p["id"]})
        elif action == "update-task" and (task := choose(tasks)):
            app.tasks.update(task["id"], {"title": f"edited {pick}"})
        elif action == "move-task" and (task := choose(tasks)) and projects:
            app.tasks.update(task["id"], {"projectId": projects[(pick + 1) % len(projects)]["id"]})
        elif action == "delete-task" and (task := choose(tasks)):
            app.tasks.delete(task["id"])
        elif action == "insert-comment" and (task := choose(tasks)):
            app.comments.insert({"body": f"note {pick}", "taskId": task["id"]})
        elif action == "update-comment" and (comment := choose(comments)):
            app.comments.update(comment["id"], {"body": f"changed {pick}"})
    except OfflineError as exc:
        assert exc.code == "CONSTRAINT_VIOLATION"  # 'restrict' refusing a local delete


@pytest.mark.parametrize("on_delete", ["cascade", "set-null", "restrict"])
def test_no_replica_holds_an_orphan_whatever_the_delivery_order(
    backend: Backend, on_delete: str, loop: asyncio.AbstractEventLoop
) -> None:
    schema = relations_schema(on_delete)
    store, service = loop.run_until_complete(open_service(backend, schema))

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(steps=steps_strategy, skews=skews_strategy)
    def run(steps: list[tuple[int, str, int]], skews: list[int]) -> None:
        apps = [create_app(schema, path=":memory:", now=skewed(ms)) for ms in skews]
        try:
            loop.run_until_complete(scenario(apps, steps))
        finally:
            for app in apps:
                app.close()

    async def scenario(apps: list[App], steps: list[tuple[int, str, int]]) -> None:
        cluster = Cluster(service, apps, await store.max_delivery())
        seeder = apps[0]
        for n in range(PROJECTS):
            project = seeder.projects.insert({"name": f"p{n}"})
            for m in range(2):
                task = seeder.tasks.insert({"title": f"t{n}{m}", "projectId": project["id"]})
                seeder.comments.insert({"body": "hello", "taskId": task["id"]})
        await cluster.settle()
        for client, action, pick in steps:
            if action == "push":
                await cluster.push(client)
            elif action == "pull":
                await cluster.pull(client)
            else:
                act(apps[client], action, pick)
        await cluster.settle()

        ids = {
            name: {op.record_id for app in apps for op in app.operations() if op.collection == name}
            for name in schema.collections
        }
        server = {name: cluster.server_records(name, ids[name]) for name in schema.collections}
        assert orphans(server) == []
        for app in apps:
            replica = {name: local(app, name) for name in schema.collections}
            assert replica == server
            assert replication.pending_count(app) == 0

    try:
        run()
    finally:
        loop.run_until_complete(service.stop())
        loop.run_until_complete(store.close())


def write_constrained(app: App, action: str, pick: int, tag: str) -> None:
    handle = f"{tag}h{pick % 3}"
    room = f"{tag}r{pick % 2}"
    users, seats = local(app, "users"), local(app, "seats")
    try:
        if action == "insert-user":
            app.users.insert({"handle": handle, "rank": pick})
        elif action == "claim-handle" and users:
            app.users.update(users[pick % len(users)]["id"], {"handle": handle})
        elif action == "insert-seat":
            app.seats.insert({"room": room, "rank": pick})
        elif action == "move-seat" and seats:
            app.seats.update(seats[pick % len(seats)]["id"], {"room": room})
        elif action == "touch-user" and users:
            app.users.update(users[pick % len(users)]["id"], {"rank": pick})
        elif action == "delete-user" and users:
            app.users.delete(users[pick % len(users)]["id"])
    except OfflineError as exc:
        assert exc.code == "CONSTRAINT_VIOLATION"  # the local store judges its own writes too


CONSTRAINED_ACTIONS = (
    "insert-user",
    "claim-handle",
    "insert-seat",
    "move-seat",
    "touch-user",
    "delete-user",
    "push",
    "pull",
)


@pytest.mark.parametrize(
    "policy", ["first-write-wins", "last-write-wins", "priority-field", "server-decides", "custom"]
)
def test_unique_and_capacity_hold_on_every_replica(
    backend: Backend, policy: str, loop: asyncio.AbstractEventLoop
) -> None:
    schema = constraints_schema(policy)
    store, service = loop.run_until_complete(open_service(backend, schema))

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        steps=st.lists(
            st.tuples(st.integers(0, CLIENTS - 1), st.sampled_from(CONSTRAINED_ACTIONS), st.integers(0, 7)),
            min_size=3,
            max_size=24,
        ),
        skews=skews_strategy,
    )
    def run(steps: list[tuple[int, str, int]], skews: list[int]) -> None:
        apps = [create_app(schema, path=":memory:", now=skewed(ms)) for ms in skews]
        try:
            loop.run_until_complete(scenario(apps, steps))
        finally:
            for app in apps:
                app.close()

    counter = itertools.count()

    async def scenario(apps: list[App], steps: list[tuple[int, str, int]]) -> None:
        # Each example writes its own handles and rooms (the store is shared by the examples).
        tag = f"x{next(counter)}-"
        cluster = Cluster(service, apps, await store.max_delivery())
        for client, action, pick in steps:
            if action == "push":
                await cluster.push(client)
            elif action == "pull":
                await cluster.pull(client)
            else:
                write_constrained(apps[client], action, pick, tag)
        await cluster.settle()

        ids = {
            name: {op.record_id for app in apps for op in app.operations() if op.collection == name}
            for name in schema.collections
        }
        server = {name: cluster.server_records(name, ids[name]) for name in schema.collections}
        for replica in [server, *({n: local(app, n) for n in schema.collections} for app in apps)]:
            assert replica == server
            handles = [u["handle"] for u in replica["users"] if u["handle"] is not None]
            assert len(handles) == len(set(handles)), handles
            rooms = [s["room"] for s in replica["seats"] if s["room"] is not None]
            assert all(rooms.count(room) <= 2 for room in rooms), rooms

    try:
        run()
    finally:
        loop.run_until_complete(service.stop())
        loop.run_until_complete(store.close())


# -- the reported cases, one by one ---------------------------------------------------------------------------


def started(schema: SchemaDefinition) -> tuple[SyncService, list[App], Cluster]:
    """A sync core on a memory store and three clients; the last one's clock runs a minute ahead."""
    from server_runtime.stores import MemoryServerStore

    async def start() -> SyncService:
        store = MemoryServerStore()
        await store.set_schema(schema)
        service = SyncService(store)
        await service.start()
        return service

    service = asyncio.run(start())
    apps = [create_app(schema, path=":memory:", now=skewed(ms)) for ms in (0, 0, 60_000)]
    return service, apps, Cluster(service, apps, 0)


def everywhere(cluster: Cluster, collection: str) -> list[list[dict[str, Any]]]:
    ids = {op.record_id for app in cluster.apps for op in app.operations() if op.collection == collection}
    return [cluster.server_records(collection, ids), *(local(app, collection) for app in cluster.apps)]


def test_a_later_edit_of_a_cascaded_task_does_not_leave_it_orphaned() -> None:
    _service, (deleter, _, editor), cluster = started(relations_schema("cascade"))

    async def scenario() -> None:
        project = deleter.projects.insert({"name": "p"})
        task = deleter.tasks.insert({"title": "t", "projectId": project["id"]})
        await cluster.settle()
        deleter.projects.delete(project["id"])  # cascades to the task, locally
        editor.tasks.update(task["id"], {"title": "edited later"})  # a minute later by its clock
        await cluster.push(0)  # the delete first, then the edit: the edit would revive the task
        await cluster.push(2)
        await cluster.settle()
        for records in everywhere(cluster, "tasks"):
            assert records == []
        # The other order: the edit is stored first, then the delete arrives.
        project = deleter.projects.insert({"name": "q"})
        task = deleter.tasks.insert({"title": "u", "projectId": project["id"]})
        await cluster.settle()
        editor.tasks.update(task["id"], {"title": "edited first"})
        deleter.projects.delete(project["id"])
        await cluster.push(2)
        await cluster.push(0)
        await cluster.settle()
        for records in everywhere(cluster, "tasks"):
            assert records == []

    asyncio.run(scenario())


@pytest.mark.parametrize("on_delete", ["cascade", "restrict"])
def test_an_insert_into_a_deleted_parent_is_refused(on_delete: str) -> None:
    service, (deleter, inserter, _), cluster = started(relations_schema(on_delete))

    async def scenario() -> None:
        project = deleter.projects.insert({"name": "p"})
        await cluster.settle()
        deleter.projects.delete(project["id"])
        inserter.tasks.insert({"title": "late", "projectId": project["id"]})
        await cluster.push(0)
        sent = replication.pending_operations(inserter)
        results = await service.commit(cluster.sessions[1], sent)
        refusal = results[sent[0].id]
        assert isinstance(refusal, Refusal)
        assert refusal.code == "CONSTRAINT_VIOLATION"
        assert "taskProject" in refusal.message and project["id"] in refusal.message
        replication.reject_operation(inserter, sent[0].id, refusal.code, refusal.message)
        await cluster.settle()
        for records in everywhere(cluster, "tasks"):
            assert records == []

    asyncio.run(scenario())


def test_a_comment_for_a_task_the_cascade_deleted_is_not_kept() -> None:
    _service, (deleter, commenter, _), cluster = started(relations_schema("cascade"))

    async def scenario() -> None:
        project = deleter.projects.insert({"name": "p"})
        task = deleter.tasks.insert({"title": "t", "projectId": project["id"]})
        await cluster.settle()
        commenter.comments.insert({"body": "on a doomed task", "taskId": task["id"]})
        deleter.projects.delete(project["id"])
        await cluster.push(0)
        await cluster.push(1)
        await cluster.settle()
        for records in everywhere(cluster, "comments"):
            assert records == []

    asyncio.run(scenario())


def test_set_null_clears_a_reference_written_after_the_parent_was_deleted() -> None:
    _service, (deleter, mover, late), cluster = started(relations_schema("set-null"))

    async def scenario() -> None:
        p1 = deleter.projects.insert({"name": "p1"})
        p2 = deleter.projects.insert({"name": "p2"})
        task = deleter.tasks.insert({"title": "t", "projectId": p1["id"]})
        await cluster.settle()
        deleter.projects.delete(p2["id"])
        mover.tasks.update(task["id"], {"projectId": p2["id"]})
        late.tasks.insert({"title": "new", "projectId": p2["id"]})
        await cluster.push(0)
        await cluster.push(1)
        await cluster.push(2)
        await cluster.settle()
        for records in everywhere(cluster, "tasks"):
            assert [r["projectId"] for r in records] == [None, None]

    asyncio.run(scenario())


@pytest.mark.parametrize("on_delete", ["cascade", "restrict"])
def test_the_children_of_a_refused_insert_are_judged_as_children_of_a_deleted_record(on_delete: str) -> None:
    _service, (deleter, writer, _), cluster = started(relations_schema(on_delete))

    async def scenario() -> None:
        project = deleter.projects.insert({"name": "p"})
        await cluster.settle()
        deleter.projects.delete(project["id"])
        await cluster.push(0)
        task = writer.tasks.insert({"title": "into a deleted project", "projectId": project["id"]})
        writer.comments.insert({"body": "on a refused task", "taskId": task["id"]})
        await cluster.push(1)  # the task is refused: its comment must not be kept pointing at nothing
        await cluster.settle()
        for records in everywhere(cluster, "tasks") + everywhere(cluster, "comments"):
            assert records == []

    asyncio.run(scenario())


def test_three_devices_through_a_real_server_end_without_orphans(tmp_path: Path) -> None:
    """Over real WebSockets: the project's delete, a later-clock edit of its task and an insert into it,
    all written offline, reach the server in an order the deleter does not win."""
    from server_runtime import MemoryServerStore, create_production_server
    from tests.sync.test_integration import FAST, converge, wait_for

    schema = relations_schema("cascade")

    async def scenario() -> None:
        store = MemoryServerStore()
        await store.set_schema(schema)
        server = create_production_server(store=store, port=0)
        url = (await server.start()).replace("http", "ws", 1) + "/offline-sync"
        deleter, editor, inserter = (
            create_app(schema, sync={"url": url, **FAST}, path=str(tmp_path / f"{name}.db"), now=skewed(ms))
            for name, ms in (("deleter", 0), ("editor", 60_000), ("inserter", 0))
        )
        apps = (deleter, editor, inserter)
        try:
            for app in apps:
                await app.sync.connect()
            project = deleter.projects.insert({"name": "p"})
            kept, doomed = (deleter.tasks.insert({"title": t, "projectId": project["id"]}) for t in "ab")
            await converge(*apps)
            for app in apps:
                await app.sync.disconnect()
            deleter.projects.delete(project["id"])  # cascades to both tasks on this device
            editor.tasks.update(kept["id"], {"title": "edited a minute later"})
            late = inserter.tasks.insert({"title": "late", "projectId": project["id"]})
            inserter.comments.insert({"body": "on a doomed task", "taskId": doomed["id"]})
            for app in (editor, deleter, inserter):  # the edit first: the delete comes after it
                await app.sync.connect()
                await app.sync.wait_until_synced(30)
            records = await converge(*apps)
            assert records == {"projects": [], "tasks": [], "comments": []}
            await wait_for(lambda: len(inserter.sync.rejected()) == 2, lambda: str(inserter.sync.rejected()))
            refused = {r["recordId"]: r for r in inserter.sync.rejected()}
            assert refused[late["id"]]["code"] == "CONSTRAINT_VIOLATION"
            assert "taskProject" in refused[late["id"]]["message"]
        finally:
            for app in apps:
                await app.sync.disconnect()
                app.close()
            await server.stop()

    asyncio.run(scenario())


def referential_schema(policy: str) -> SchemaDefinition:
    return define_schema(
        {
            "version": 1,
            "collections": {
                "users": {"fields": {"name": t.string()}},
                "tasks": {
                    "fields": {"title": t.string(), "assigneeId": t.string().optional()},
                    "constraints": {
                        "assignee": {
                            "type": "referential",
                            "fields": ["assigneeId"],
                            "collection": "users",
                            "onConflict": policy,
                        }
                    },
                },
            },
        }
    )


@pytest.mark.parametrize("policy", ["first-write-wins", "last-write-wins"])
@pytest.mark.parametrize("delete_first", [True, False])
def test_a_reference_to_a_concurrently_deleted_record_never_dangles(policy: str, delete_first: bool) -> None:
    _service, (deleter, assigner, _), cluster = started(referential_schema(policy))

    async def scenario() -> None:
        user = deleter.users.insert({"name": "u"})
        task = deleter.tasks.insert({"title": "t"})
        await cluster.settle()
        deleter.users.delete(user["id"])
        assigner.tasks.update(task["id"], {"assigneeId": user["id"]})
        for i in (0, 1) if delete_first else (1, 0):
            await cluster.push(i)
        await cluster.settle()
        users = everywhere(cluster, "users")
        tasks = everywhere(cluster, "tasks")
        assert all(u == users[0] for u in users) and all(t == tasks[0] for t in tasks)
        alive = {u["id"] for u in users[0]}
        assert all(t["assigneeId"] in {None, *alive} for t in tasks[0])

    asyncio.run(scenario())


def test_a_child_orphaned_before_the_rules_stays_editable() -> None:
    """Records written while the relation was 'no-action' may point at deleted parents; under 'restrict'
    they can still be edited as long as the edit leaves the reference alone."""
    from server_runtime.stores import MemoryServerStore

    async def scenario() -> None:
        store = MemoryServerStore()
        await store.set_schema(relations_schema("no-action"))
        before = SyncService(store)
        await before.start()
        writer = create_app(relations_schema("no-action"), path=":memory:")
        project = writer.projects.insert({"name": "p"})
        task = writer.tasks.insert({"title": "t", "projectId": project["id"]})
        writer.projects.delete(project["id"])
        await Cluster(before, [writer], 0).push(0)
        await before.stop()

        await store.set_schema(relations_schema("restrict"))
        service = SyncService(store)
        await service.start()
        editor = create_app(relations_schema("restrict"), path=":memory:")
        cluster = Cluster(service, [editor], 0)
        await cluster.pull(0)
        editor.tasks.update(task["id"], {"title": "still editable"})
        await cluster.push(0)
        assert (replication.pending_count(editor) == 0 and editor.sync is None) or True
        assert service.cache.record("tasks", task["id"])["title"] == "still editable"

    asyncio.run(scenario())


def test_a_restored_log_from_before_the_rules_is_stored_as_it_is() -> None:
    """A backup is a log its server already judged (and may predate these rules): restoring it (operations
    committed without a session) does not judge its children again; a client's same write is refused."""
    service, _, _ = started(relations_schema("restrict"))
    legacy = [create_app(relations_schema("no-action"), path=":memory:") for _ in range(2)]
    project = legacy[0].projects.insert({"name": "p"})
    legacy[0].projects.delete(project["id"])
    legacy[0].tasks.insert({"title": "orphaned long ago", "projectId": project["id"]})
    log = legacy[0].operations()
    results = asyncio.run(service.commit(None, log))
    assert all(isinstance(results[op.id], int) for op in log)
    assert service.cache.find_records("tasks", {"projectId": project["id"]})

    legacy[1].apply(log)
    legacy[1].tasks.insert({"title": "orphaned now", "projectId": project["id"]})
    cluster = Cluster(service, [legacy[1]], 0)
    [sent] = replication.pending_operations(legacy[1])
    refusal = asyncio.run(service.commit(cluster.sessions[0], [sent]))[sent.id]
    assert isinstance(refusal, Refusal) and refusal.code == "CONSTRAINT_VIOLATION"


@pytest.mark.parametrize("on_delete", ["set-null", "cascade"])
@pytest.mark.parametrize("delete_first", [True, False])
def test_a_many_to_many_reference_to_a_concurrently_deleted_record(
    on_delete: str, delete_first: bool
) -> None:
    """An array of ids: under 'set-null' the deleted id leaves the array (the others stay), under
    'cascade' the record goes, whichever reaches the server first."""
    schema = define_schema(
        {
            "version": 1,
            "collections": {
                "tags": {"fields": {"label": t.string()}},
                "posts": {"fields": {"title": t.string(), "tagIds": t.array(t.string()).optional()}},
            },
            "relations": {
                "postTags": {
                    "from": "posts",
                    "to": "tags",
                    "type": "many-to-many",
                    "field": "tagIds",
                    "onDelete": on_delete,
                }
            },
        }
    )
    _service, (deleter, tagger, _), cluster = started(schema)

    async def scenario() -> None:
        keep, doomed = (deleter.tags.insert({"label": n}) for n in ("keep", "doomed"))
        post = deleter.posts.insert({"title": "p", "tagIds": [keep["id"]]})
        await cluster.settle()
        deleter.tags.delete(doomed["id"])
        tagger.posts.update(post["id"], {"tagIds": [keep["id"], doomed["id"]]})
        for i in (0, 1) if delete_first else (1, 0):
            await cluster.push(i)
        await cluster.settle()
        for posts in [
            cluster.server_records("posts", {post["id"]}),
            *(local(app, "posts") for app in cluster.apps),
        ]:
            if on_delete == "set-null":
                assert [p["tagIds"] for p in posts] == [[keep["id"]]]
            else:
                assert posts == []

    asyncio.run(scenario())


def test_a_refused_insert_can_be_retried_after_the_servers_tombstone() -> None:
    """The server holds a refused record as deleted (children may point at it); the device can still write
    it again with `retry` once the conflict is gone, and the server takes it."""
    schema = define_schema(
        {
            "version": 1,
            "collections": {
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
                "tasks": {"fields": {"title": t.string(), "ownerId": t.string().optional()}},
            },
            "relations": {
                "taskOwner": {
                    "from": "tasks",
                    "to": "users",
                    "type": "many-to-one",
                    "field": "ownerId",
                    "onDelete": "cascade",
                }
            },
        }
    )
    service, (first, second, _), cluster = started(schema)

    async def scenario() -> None:
        taken = first.users.insert({"handle": "ada"})
        await cluster.push(0)
        mine = second.users.insert({"handle": "ada"})
        [refused] = replication.pending_operations(second)
        await cluster.settle()  # refused; the server's tombstone of the record reaches the device
        assert second.users.find_by_id(mine["id"]) is None
        assert service.cache.state(("users"), mine["id"]) is not None
        first.users.update(taken["id"], {"handle": "ada lovelace"})
        await cluster.settle()
        assert replication.retry(second, refused.id) == mine
        await cluster.settle()
        for users in everywhere(cluster, "users"):
            assert sorted(u["handle"] for u in users) == ["ada", "ada lovelace"]

    asyncio.run(scenario())


@pytest.mark.parametrize("comment_first", [True, False])
def test_restrict_under_a_cascade_holds_whatever_the_order(comment_first: bool) -> None:
    """Tasks cascade with their project; comments restrict their task's delete. A comment written while
    another device deleted the project: either the comment reached the server first and the project's
    delete is refused (the project and its task stay), or the delete did and the comment is refused."""
    _service, (deleter, commenter, _), cluster = started(relations_schema("cascade", "restrict"))

    async def scenario() -> None:
        project = deleter.projects.insert({"name": "p"})
        task = deleter.tasks.insert({"title": "t", "projectId": project["id"]})
        await cluster.settle()
        deleter.projects.delete(project["id"])
        commenter.comments.insert({"body": "hold on", "taskId": task["id"]})
        for i in (1, 0) if comment_first else (0, 1):
            await cluster.push(i)
        await cluster.settle()
        for name, expected in (("projects", 1), ("tasks", 1), ("comments", 1)):
            for records in everywhere(cluster, name):
                assert len(records) == (expected if comment_first else 0), (name, records)

    asyncio.run(scenario())
