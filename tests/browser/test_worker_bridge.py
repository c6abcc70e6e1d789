"""`offline.worker.WorkerBridge` on CPython: the message protocol between the page and the Python app.

In the browser the same class runs under Pyodide (see test_browser_client.py); here its `post` collects the
messages and `persist` counts copies to storage, so each request's reply, pushes and durability are checked.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offline import create_app, define_schema, t, worker
from offline.store import App
from offline.worker import PROTOCOL_VERSION, WorkerBridge, open_app

from .support import FAST_SYNC, live_server

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "votes": t.number().default(0),
                    "createdAt": t.timestamp().auto(),
                }
            },
            "notes": {"fields": {"body": t.richtext()}},
        },
    }
)


class Page:
    """The page side: what the bridge posted, decoded, and how often it persisted."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.persisted = 0
        self.fail_persist = False
        self._next = 0

    def post(self, text: str) -> None:
        self.messages.append(json.loads(text))

    async def persist(self) -> None:
        await asyncio.sleep(0)
        if self.fail_persist:
            raise RuntimeError("QuotaExceededError")
        self.persisted += 1

    async def request(self, bridge: WorkerBridge, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        await bridge.handle(json.dumps({"id": self._next, "method": method, **params}))
        replies = [m for m in self.messages if m["type"] == "reply" and m["id"] == self._next]
        assert len(replies) == 1, self.messages
        return replies[0]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind]

    def bridge(self, app: App, **options: Any) -> WorkerBridge:
        """A bridge serving ``app`` that posts to this page and persists through it."""
        return WorkerBridge(app, post=self.post, persist=self.persist, **options)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    app = create_app(SCHEMA, path=str(tmp_path / "bridge.db"))
    yield app
    app.close()


def test_writes_reply_with_records_after_persisting(app: App, todos: Any) -> None:
    page = Page()
    bridge = page.bridge(app, actions=todos)

    async def scenario() -> None:
        reply = await page.request(bridge, "insert", collection="todos", data={"title": "milk"})
        assert reply["ok"] is True
        record = reply["result"]
        assert record["title"] == "milk" and record["done"] is False and isinstance(record["createdAt"], int)
        assert page.persisted == 1  # the reply came after the database was copied to storage
        assert app.todos.find_by_id(record["id"]) == record

        reply = await page.request(
            bridge,
            "update",
            collection="todos",
            recordId=record["id"],
            changes={"votes": {"$op": "increment", "value": 2}},
        )
        assert reply["result"]["votes"] == 2
        reply = await page.request(
            bridge,
            "update",
            collection="todos",
            recordId=record["id"],
            changes={"votes": {"$op": "increment"}},
        )
        assert reply["result"]["votes"] == 3
        assert page.persisted == 3

        reads = [
            await page.request(bridge, "findById", collection="todos", recordId=record["id"]),
            await page.request(bridge, "fetch", collection="todos", query={"where": {"done": False}}),
            await page.request(bridge, "count", collection="todos"),
        ]
        assert [r["result"] for r in reads] == [
            app.todos.find_by_id(record["id"]),
            [app.todos.find_by_id(record["id"])],
            1,
        ]
        assert page.persisted == 3  # reads copy nothing

        reply = await page.request(bridge, "delete", collection="todos", recordId=record["id"])
        assert reply["result"] is True and app.todos.find_by_id(record["id"]) is None

    asyncio.run(scenario())


def test_subscriptions_push_every_change_and_stop(app: App) -> None:
    page = Page()
    bridge = page.bridge(app)

    async def scenario() -> None:
        query = {"where": {"done": False}, "orderBy": [["title", True]]}
        assert (await page.request(bridge, "subscribe", collection="todos", query=query, sub=7))["ok"]
        assert page.of_type("snapshot") == [{"type": "snapshot", "sub": 7, "records": []}]
        reply = await page.request(
            bridge, "insertMany", collection="todos", items=[{"title": "a"}, {"title": "b"}]
        )
        a, b = reply["result"]
        assert page.persisted == 1  # one transaction, one copy
        changes = page.of_type("changes")
        assert len(changes) == 1  # the batch announced itself once, with its records only
        assert sorted(r["title"] for r in changes[0]["inserted"]) == ["a", "b"]
        assert (changes[0]["updated"], changes[0]["removed"]) == ([], [])
        # Writes made by other code (the project's functions, sync) are seen too, once per loop turn.
        c = app.todos.insert({"title": "c"})
        app.todos.insert({"title": "x", "done": True})  # outside the query: no change to send
        await asyncio.sleep(0)
        assert page.of_type("changes")[-1] == {
            "type": "changes",
            "sub": 7,
            "inserted": [c],
            "updated": [],
            "removed": [],
        }
        app.todos.insert({"title": "y", "done": True})
        await asyncio.sleep(0)
        assert len(page.of_type("changes")) == 2  # the results did not change: nothing sent
        app.todos.update(a["id"], {"title": "A"})
        app.todos.update(b["id"], {"done": True})  # leaves the query's results
        await asyncio.sleep(0)
        last = page.of_type("changes")[-1]
        assert [r["title"] for r in last["updated"]] == ["A"]
        assert (last["inserted"], last["removed"]) == ([], [b["id"]])
        app.todos.delete(c["id"])
        await asyncio.sleep(0)
        assert page.of_type("changes")[-1]["removed"] == [c["id"]]
        assert len(page.of_type("snapshot")) == 1  # never the whole results again
        assert (await page.request(bridge, "unsubscribe", sub=7))["result"] is True
        count = len(page.messages)
        app.todos.insert({"title": "d"})
        await asyncio.sleep(0)
        assert len(page.messages) == count

    asyncio.run(scenario())


def test_a_snapshot_larger_than_a_read_page_is_whole_and_in_order(app: App) -> None:
    """The snapshot is read and sent a page at a time (bounded memory in the worker): put together, the
    parts are the whole results in the query's order, and later changes are told apart from them."""
    import offline.worker as worker_module

    page = Page()
    bridge = page.bridge(app)
    count = 2 * worker_module.SNAPSHOT_PAGE + 7
    with app.batch():
        records = [app.todos.insert({"title": f"t{i:05d}", "votes": i % 3}) for i in range(count)]

    async def scenario() -> None:
        query = {"orderBy": [["votes", True], ["title", False]]}
        await page.request(bridge, "subscribe", collection="todos", query=query, sub=1)
        limited = {"orderBy": [["title", True]], "limit": worker_module.SNAPSHOT_PAGE + 1}
        await page.request(bridge, "subscribe", collection="todos", query=limited, sub=2)
        # Parts of at most a page each, every one but the last saying more is coming; never mixed.
        parts = page.of_type("snapshot")
        assert [(m["sub"], len(m["records"]), m.get("more")) for m in parts] == [
            (1, worker_module.SNAPSHOT_PAGE, True),
            (1, worker_module.SNAPSHOT_PAGE, True),
            (1, 7, None),
            (2, worker_module.SNAPSHOT_PAGE, True),
            (2, 1, None),
        ]
        whole = [record for m in parts if m["sub"] == 1 for record in m["records"]]
        bounded = [record for m in parts if m["sub"] == 2 for record in m["records"]]
        assert whole == app.todos.where({}).order_by("votes", desc=True).order_by("title").fetch()
        assert bounded == app.todos.where({}).order_by("title", desc=True).limit(limited["limit"]).fetch()
        app.todos.update(records[0]["id"], {"title": "renamed"})
        app.todos.delete(records[-1]["id"])
        await asyncio.sleep(0)
        changes = {m["sub"]: m for m in page.of_type("changes")}
        assert [r["title"] for r in changes[1]["updated"]] == ["renamed"]
        assert (changes[1]["inserted"], changes[1]["removed"]) == ([], [records[-1]["id"]])
        # The deleted record was the first of the bounded results: the next one comes in.
        assert changes[2]["removed"] == [records[-1]["id"]]
        assert [r["id"] for r in changes[2]["inserted"]] == [
            app.todos.where({}).order_by("title", desc=True).limit(limited["limit"]).fetch()[-1]["id"]
        ]

    asyncio.run(scenario())


def test_a_live_query_with_a_limit_sends_what_enters_and_leaves(app: App) -> None:
    """With a limit, a write can push another record out of the results: the page is told both."""
    page = Page()
    bridge = page.bridge(app)

    async def scenario() -> None:
        first = [app.todos.insert({"title": title}) for title in ("b", "c")]
        query = {"orderBy": [["title", False]], "limit": 2}
        await page.request(bridge, "subscribe", collection="todos", query=query, sub=1)
        assert [r["title"] for r in page.of_type("snapshot")[0]["records"]] == ["b", "c"]
        a = app.todos.insert({"title": "a"})
        await asyncio.sleep(0)
        assert page.of_type("changes")[-1] == {
            "type": "changes",
            "sub": 1,
            "inserted": [a],
            "updated": [],
            "removed": [first[1]["id"]],
        }
        app.todos.update(first[0]["id"], {"votes": 5})
        await asyncio.sleep(0)
        assert [r["votes"] for r in page.of_type("changes")[-1]["updated"]] == [5]

    asyncio.run(scenario())


def test_the_page_calls_the_projects_python_functions(app: App, todos: Any) -> None:
    page = Page()
    bridge = page.bridge(app, actions=todos)
    assert bridge.action_names() == [
        "add_todo",
        "clear_completed",
        "remove_todo",
        "rename_todo",
        "toggle_todo",
    ]

    async def scenario() -> None:
        added = (await page.request(bridge, "call", name="add_todo", args=["  bread "]))["result"]
        assert added["title"] == "bread"
        assert (await page.request(bridge, "call", name="toggle_todo", args=[added["id"]]))["result"][
            "done"
        ] is True
        assert (await page.request(bridge, "call", name="clear_completed"))["result"] == 1
        refused = await page.request(bridge, "call", name="add_todo", args=["   "])
        assert refused["ok"] is False
        assert refused["error"] == {
            "code": "INVALID_OPERATION",
            "message": "a to-do needs a title",
            "context": {"field": "title"},
        }
        private = await page.request(bridge, "call", name="OfflineError", args=[])
        assert private["ok"] is False and "is not a function of" in private["error"]["message"]

    asyncio.run(scenario())


def test_bad_requests_get_error_replies_with_codes(app: App) -> None:
    page = Page()
    bridge = page.bridge(app)

    async def scenario() -> None:
        await bridge.handle("not json")
        assert page.messages[-1]["ok"] is False and page.messages[-1]["error"]["code"] == "INVALID_OPERATION"
        unknown = await page.request(bridge, "drop_database")
        assert (
            unknown["error"]["code"] == "INVALID_OPERATION"
            and "unknown method" in unknown["error"]["message"]
        )
        wrong = await page.request(bridge, "insert", collection="todos", data={"title": 5})
        assert wrong["ok"] is False and wrong["error"]["code"] == "INVALID_OPERATION"
        assert wrong["error"]["context"]["field"] == "title"
        missing = await page.request(bridge, "insert", collection="nope", data={})
        assert "unknown collection" in missing["error"]["message"]
        bad_op = await page.request(
            bridge, "update", collection="todos", recordId="x", changes={"votes": {"$op": "explode"}}
        )
        assert "unknown atomic operation" in bad_op["error"]["message"]
        assert page.persisted == 0

        page.fail_persist = True
        failed = await page.request(
            bridge, "insert", collection="todos", data={"title": "kept in memory only"}
        )
        assert failed["ok"] is False
        assert failed["error"]["code"] == "STORAGE_ERROR"
        assert "refused to store the local database" in failed["error"]["message"]
        assert "QuotaExceededError" in failed["error"]["message"]

    asyncio.run(scenario())


def test_ready_message_reports_richtext_unavailable_without_pycrdt(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    import offline.merge.yjs

    page = Page()
    bridge = page.bridge(app)
    ready = bridge.ready_message()
    assert ready["protocol"] == PROTOCOL_VERSION and ready["nodeId"] == app.node_id
    assert ready["collections"]["todos"]["fields"]["title"] == "string"
    assert ready["unavailable"] == []  # pycrdt is installed here

    monkeypatch.setattr(offline.merge.yjs, "missing_package", lambda: "pycrdt")
    (field,) = bridge.ready_message()["unavailable"]
    assert (field["collection"], field["field"], field["type"]) == ("notes", "body", "richtext")
    assert (
        "unavailable" in field["reason"] and "pycrdt" in field["reason"] and "do not sync" in field["reason"]
    )


def test_open_app_imports_the_projects_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bridge_case_schema.py").write_text(
        "from offline import define_schema, t\n"
        "schema = define_schema({'version': 1, 'collections': {'items': {'fields': {'name': t.string()}}}})\n"
    )
    (tmp_path / "bridge_case_empty.py").write_text("nothing = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    app, actions = open_app({"schemaModule": "bridge_case_schema", "dbPath": str(tmp_path / "a.db")})
    try:
        assert actions is None and list(app.schema.collections) == ["items"]
        assert app.sync.status == "disabled"  # no sync URL: a local-only app
    finally:
        app.close()
    for config, text in (
        ({"schemaModule": "bridge_case_missing"}, "cannot import the project's schema module"),
        ({"schemaModule": "bridge_case_empty"}, "must define `schema = define_schema"),
    ):
        with pytest.raises(Exception) as caught:
            open_app({**config, "dbPath": str(tmp_path / "b.db")})
        assert text in str(caught.value)


def test_status_follows_sync_and_network_changes(tmp_path: Path) -> None:
    """Against a live server (desktop transport here): status pushes, pause, and restarts on network events."""
    page = Page()
    with live_server(SCHEMA, None, tmp_path / "server.db") as live:
        app = create_app(SCHEMA, sync={"url": live.ws_url, **FAST_SYNC}, path=str(tmp_path / "client.db"))
        bridge = page.bridge(app, status_interval=0.02)

        async def until(status: str) -> None:
            for _ in range(500):
                if page.of_type("status") and page.of_type("status")[-1]["status"] == status:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"no status {status!r}: {page.of_type('status')}")

        async def scenario() -> None:
            await bridge.start()
            assert page.messages[0]["type"] == "ready" and page.persisted == 1
            await until("connected")
            await page.request(bridge, "insert", collection="todos", data={"title": "synced"})
            for _ in range(200):
                if page.of_type("status")[-1]["pending"] == 0 and live.records("todos"):
                    break
                await asyncio.sleep(0.02)
            assert [r["title"] for r in live.records("todos")] == ["synced"]
            connections = app.sync.connections
            await page.request(bridge, "network", online=False)  # a hint: the session restarts
            await until("connected")
            assert app.sync.connections == connections + 1
            assert (await page.request(bridge, "disconnect"))["ok"]
            await until("disconnected")
            await page.request(bridge, "network", online=True)  # paused by the page: stays paused
            await asyncio.sleep(0.1)
            assert app.sync.status == "disconnected"
            logging.getLogger("offline.sync").warning("could not apply operation x: test")
            assert page.of_type("log")[-1] == {
                "type": "log",
                "level": "warning",
                "message": "could not apply operation x: test",
            }
            await bridge.stop()

        asyncio.run(scenario())


def test_webauthn_ceremonies_are_relayed_to_the_page(app: App) -> None:
    """Passkeys from the worker's Python: the page reports WebAuthn, each ceremony is posted to it and its
    answer (credential or DOMException) routed back; natively, and once the page is gone, there is none."""
    from offline.auth import (
        PASSKEY_CANCELLED,
        PASSKEY_EXISTS,
        PASSKEY_FAILED,
        AuthError,
        browser_create,
        browser_get,
        is_passkey_supported,
    )
    from offline.platform import page_webauthn, set_page_webauthn

    page = Page()
    options = {"challenge": "Y2hhbGxlbmdlLWJ5dGVz", "rpId": "localhost", "timeout": 60_000}
    credential = {
        "id": "Y3JlZA",
        "rawId": "Y3JlZA",
        "type": "public-key",
        "response": {"clientDataJSON": "e30", "authenticatorData": "AA", "signature": "AA"},
    }

    answered: set[int] = set()

    async def asked(ceremony: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
        """The ceremony's request to the page (not answered yet)."""
        for _ in range(100):
            await asyncio.sleep(0)
            waiting = [m for m in page.of_type("webauthn") if m["id"] not in answered]
            if waiting:
                return waiting[-1]
            assert not ceremony.done(), ceremony.result()  # ended without asking: show why
        raise AssertionError(f"no webauthn request: {page.messages}")

    async def answer(bridge: WorkerBridge, request: dict[str, Any], **fields: Any) -> Any:
        answered.add(request["id"])
        return (await page.request(bridge, "webauthnResult", ceremony=request["id"], **fields))["result"]

    async def scenario() -> None:
        # Natively (the default outside Pyodide) a page's report changes nothing: Python has no WebAuthn.
        native = WorkerBridge(app, post=page.post)
        assert (await page.request(native, "pageInfo", webauthn=True))["result"] == {"webauthn": False}
        assert is_passkey_supported() is False
        native.detach()

        bridge = WorkerBridge(app, post=page.post, relay_webauthn=True)
        assert (await page.request(bridge, "pageInfo", webauthn=False))["result"] == {"webauthn": False}
        assert is_passkey_supported() is False  # a page without WebAuthn
        with pytest.raises(AuthError) as caught:
            await browser_get(options)
        assert caught.value.code == "PASSKEYS_UNSUPPORTED"
        assert (await page.request(bridge, "pageInfo", webauthn=True))["result"] == {"webauthn": True}
        assert is_passkey_supported() is True

        # A sign-in ceremony: the page gets the options as they came and its credential comes back.
        ceremony = asyncio.ensure_future(browser_get(options))
        request = await asked(ceremony)
        assert request == {"type": "webauthn", "id": request["id"], "op": "get", "options": options}
        assert await answer(bridge, request, ok=True, credential=credential) is True
        assert await ceremony == credential
        assert await answer(bridge, request, ok=True, credential=credential) is False  # nobody waits now

        # The page's DOMExceptions become auth error codes.
        for name, code in (
            ("NotAllowedError", PASSKEY_CANCELLED),
            ("InvalidStateError", PASSKEY_EXISTS),
            ("SecurityError", PASSKEY_FAILED),
        ):
            ceremony = asyncio.ensure_future(browser_create({**options, "rp": {"id": "localhost"}}))
            request = await asked(ceremony)
            assert request["op"] == "create"
            await answer(bridge, request, ok=False, error={"name": name, "message": "from the browser"})
            with pytest.raises(AuthError) as caught:
                await ceremony
            assert caught.value.code == code, caught.value
            assert caught.value.context == {"ceremony": "create", "reason": name}
            assert name in caught.value.message

        # The page goes away during a ceremony: it ends (aborted), and passkeys are unsupported again.
        ceremony = asyncio.ensure_future(browser_get(options))
        await asked(ceremony)
        bridge.detach()
        with pytest.raises(AuthError) as caught:
            await ceremony
        assert caught.value.code == PASSKEY_CANCELLED
        assert caught.value.context == {"ceremony": "get", "reason": "AbortError"}
        assert page_webauthn() is None and is_passkey_supported() is False

    try:
        asyncio.run(scenario())
    finally:
        set_page_webauthn(None)


def test_the_page_sees_and_recovers_refused_writes(tmp_path: Path) -> None:
    """The worker exposes the rejected list (rejected / retry / discard) and puts its size, the clock offset
    and any operation that could not be applied in the status it pushes."""
    from offline.store.replication import reject_operation

    page = Page()
    app = create_app(SCHEMA, sync={"url": "ws://127.0.0.1:9/offline-sync"}, path=str(tmp_path / "c.db"))
    bridge = page.bridge(app)

    async def scenario() -> None:
        todo = (await page.request(bridge, "insert", collection="todos", data={"title": "refused"}))["result"]
        op_id = app.operations()[-1].id
        reject_operation(app, op_id, "SCOPE_VIOLATION", "not yours")
        status = (await page.request(bridge, "status"))["result"]
        assert (status["rejected"], status["clockOffsetMs"], status["applyError"]) == (1, 0, None)
        [entry] = (await page.request(bridge, "rejected"))["result"]
        assert entry["operationId"] == op_id and entry["data"]["title"] == "refused"
        retried = await page.request(bridge, "retry", operationId=op_id)
        assert retried["ok"] and retried["result"]["id"] == todo["id"]
        assert app.todos.find_by_id(todo["id"])["title"] == "refused"
        second = app.sync.rejected()
        assert second == []
        reject_operation(app, app.operations()[-1].id, "SCOPE_VIOLATION", "still not")
        [entry] = app.sync.rejected()
        assert (await page.request(bridge, "discard", operationId=entry["operationId"]))["result"] is True
        assert (await page.request(bridge, "rejected"))["result"] == []

    try:
        asyncio.run(scenario())
    finally:
        app.close()


def test_records_forgotten_without_an_operation_leave_the_live_query(app: App) -> None:
    """Records dropped as they leave the sync scope carry no operation of their own: still, the page's
    live query is told they are gone."""
    from offline.store import replication

    page = Page()
    bridge = page.bridge(app)

    async def scenario() -> None:
        kept, gone = app.todos.insert({"title": "kept"}), app.todos.insert({"title": "gone"})
        replication.mark_acknowledged(app, [1, 2])  # (a record's unacknowledged operations would keep it)
        await page.request(bridge, "subscribe", collection="todos", query={}, sub=3)
        replication.forget_records(app, "todos", [gone["id"]])
        await asyncio.sleep(0)
        assert page.of_type("changes") == [
            {"type": "changes", "sub": 3, "inserted": [], "updated": [], "removed": [gone["id"]]}
        ]
        assert [r["id"] for r in app.todos.where({}).fetch()] == [kept["id"]]

    asyncio.run(scenario())


def test_live_queries_send_only_real_changes_and_keep_a_full_window_without_running_it(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record touched without changing (a received operation that lost to a newer write, or one held
    already) is not sent as updated, with or without a limit; and a limited query whose window stays full is
    brought up to date from the touched records alone (`LiveResults`), not run again."""
    from offline.store.collection import Query

    page = Page()
    bridge = page.bridge(app)
    with app.batch():
        records = [app.todos.insert({"title": f"t{i}"}) for i in range(10)]

    async def scenario() -> None:
        ordered = {"orderBy": [["title", False]]}
        await page.request(bridge, "subscribe", collection="todos", query=ordered, sub=1)
        await page.request(bridge, "subscribe", collection="todos", query={**ordered, "limit": 3}, sub=2)
        runs: list[Query] = []
        fetch = Query.fetch

        def counted(self: Query, *args: Any, **kwargs: Any) -> Any:
            runs.append(self)
            return fetch(self, *args, **kwargs)

        monkeypatch.setattr(Query, "fetch", counted)
        # Touched, unchanged: in both results, in neither window, in the whole results only.
        bridge._mark_records([("todos", records[0]["id"]), ("todos", records[5]["id"])])
        await asyncio.sleep(0)
        assert page.of_type("changes") == []
        app.todos.update(records[1]["id"], {"votes": 4})
        app.todos.update(records[7]["id"], {"votes": 2})  # outside the window
        await asyncio.sleep(0)
        changes = {m["sub"]: m for m in page.of_type("changes")}
        assert sorted(r["title"] for r in changes[1]["updated"]) == ["t1", "t7"]
        assert [r["title"] for r in changes[2]["updated"]] == ["t1"]
        assert (changes[2]["inserted"], changes[2]["removed"]) == ([], [])
        app.todos.update(records[8]["id"], {"title": "a"})  # enters the window, pushes t2 out
        await asyncio.sleep(0)
        last = page.of_type("changes")[-1]
        assert last["sub"] == 2 and [r["title"] for r in last["inserted"]] == ["a"]
        assert last["removed"] == [records[2]["id"]]
        assert runs == []  # the window stayed full: never run again

    asyncio.run(scenario())


record_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10,
)


@given(record=st.dictionaries(st.text(max_size=6), record_values, max_size=5))
def test_a_record_is_sent_as_the_text_json_dumps_writes(record: dict[str, Any]) -> None:
    """Live queries write records with an encoder built once: the same text as for any other message
    (``_dumps``), non-ASCII escaped, what the page and the change hashes have always seen."""
    assert worker._record_text(record) == worker._dumps(record)
    odd = {"at": Path("x"), "n": record}  # (what JSON has no form for is written as its str, as before)
    assert worker._record_text(odd) == worker._dumps(odd)
