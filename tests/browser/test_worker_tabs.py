"""`offline.worker_tabs` on CPython: the owner tab's side of several tabs (see test_browser_tabs.py for them in
Chromium). A write another tab sent under a key is applied once, however often it is sent again, including to a
new owner that opened the database afresh; each other tab gets its own replies and live changes."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from offline import create_app, worker_tabs
from offline.worker import WorkerBridge
from offline.worker_tabs import DurableSync, TabRequests, attach

from .support import FAST_SYNC, live_server, load_module, run_node_script
from .test_worker_bridge import SCHEMA, Page


def request(request_id: int, method: str, **params: Any) -> str:
    return json.dumps({"id": request_id, "method": method, **params})


def titles(bridge: WorkerBridge) -> list[str]:
    return sorted(record["title"] for record in bridge.app.todos.where({}).fetch())


def owner_on(path: Path | str, actions: Any) -> tuple[Page, WorkerBridge]:
    """A page and the bridge of its tab's worker, owning the database at ``path`` and serving ``actions``."""
    page = Page()
    return page, page.bridge(create_app(SCHEMA, path=str(path)), actions=actions)


def test_a_write_sent_again_is_applied_once_even_by_a_new_owner(tmp_path: Path, todos: Any) -> None:
    path = tmp_path / "tabs.db"
    _, owner = owner_on(path, todos)
    requests = TabRequests(owner.app)
    add = request(4, "call", name="add_todo", args=["milk"])

    served = requests.handle_now(owner, "tab-b:4", add)
    assert served is not None
    save_first, reply = served
    assert save_first is True  # the key is in the database: the reply waits for the save
    assert json.loads(reply)["ok"] is True and json.loads(reply)["id"] == 4
    # Sent again (the answer was lost): answered the same, not applied again.
    assert requests.handle_now(owner, "tab-b:4", add) == (False, reply)
    assert titles(owner) == ["milk"]
    # Another request id, or another tab's, is another write.
    assert requests.handle_now(owner, "tab-c:4", add) is not None
    assert titles(owner) == ["milk", "milk"]
    owner.app.close()

    # The owner closed; the next one opens the stored database and gets the same request once more.
    _, successor = owner_on(path, todos)
    assert TabRequests(successor.app).handle_now(successor, "tab-b:4", add) == (False, reply)
    assert titles(successor) == ["milk", "milk"]
    successor.app.close()


def test_a_write_whose_key_could_not_be_stored_is_not_applied_and_a_retry_applies_it_once(
    tmp_path: Path, todos: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key goes in the write's own transaction: when storing it fails (a full disk, a locked file), the
    write is undone with it and the other tab is told; sent again, it is applied once. (Stored apart, the
    write stayed without its key and the retry applied it a second time.)"""
    _, owner = owner_on(tmp_path / "tabs.db", todos)
    requests = TabRequests(owner.app)
    record = TabRequests._record
    failures = [sqlite3.OperationalError("database or disk is full")]

    def failing_record(self: TabRequests, key: str, reply: str) -> None:
        record(self, key, reply)
        if failures:
            raise failures.pop()

    monkeypatch.setattr(TabRequests, "_record", failing_record)
    changes: list[Any] = []
    owner.app.todos.where({}).subscribe(changes.append)
    add = request(5, "call", name="add_todo", args=["bread"])
    served = requests.handle_now(owner, "tab-b:5", add)
    assert served is not None
    failed = json.loads(served[1])
    assert failed["ok"] is False and failed["id"] == 5
    assert failed["error"]["code"] == "STORAGE_ERROR" and "disk is full" in failed["error"]["message"]
    assert titles(owner) == [] and requests.stored_reply("tab-b:5") is None
    assert owner.app.todos.count() == 0
    assert "bread" not in json.dumps(changes, default=str)  # no live query saw the undone write

    served = requests.handle_now(owner, "tab-b:5", add)  # the other tab sends it again
    assert served is not None and json.loads(served[1])["ok"] is True
    assert requests.handle_now(owner, "tab-b:5", add) == (False, served[1])
    assert titles(owner) == ["bread"]
    (own,) = [row for row in owner.app.operations() if row.node_id == owner.app.node_id]
    assert own.sequence_number == 1  # the undone write's number was not used up
    owner.app.close()


ASYNC_ACTIONS = """
import asyncio

gate = asyncio.Event()


async def add_two(app, title):
    app.todos.insert({"title": title + " 1"})
    await gate.wait()  # (a fetch, a timer: the worker's JavaScript may save the database meanwhile)
    app.todos.insert({"title": title + " 2"})
    return "added"
"""


def saved_copy(app: Any, path: Path) -> str:
    """The database as the worker's JavaScript stores it between two turns (a consistent copy)."""
    target = sqlite3.connect(path)
    with app.db.lock:
        app.db.conn.backup(target)
    target.close()
    return str(path)


def test_an_async_action_cut_by_a_takeover_is_not_run_again_and_a_finished_one_is_answered(
    tmp_path: Path,
) -> None:
    """An `async def` action writes across turns, and a save between two of them may store part of its
    writes: the next owner, given the request again, must not run it a second time. Its key is stored
    before it starts (so every copy holding any of its writes holds the key) and its reply when it ends:
    replayed after it ended, it is answered with that reply; after a takeover cut it, with STORAGE_ERROR
    (reason ``interrupted``) saying it may have been applied in part, never run again."""
    (tmp_path / "async_actions.py").write_text(ASYNC_ACTIONS)
    actions = load_module(tmp_path / "async_actions.py", "tabs_async_actions")
    text = request(9, "call", name="add_two", args=["x"])

    async def scenario() -> None:
        page, owner = owner_on(tmp_path / "a.db", actions)
        requests = TabRequests(owner.app)
        assert requests.handle_now(owner, "tab-b:9", text) is None  # it waits on the loop
        running = asyncio.create_task(requests.handle(owner, "tab-b:9", text))
        while owner.app.todos.count() == 0:
            await asyncio.sleep(0)
        cut = saved_copy(owner.app, tmp_path / "cut.db")
        # Sent again to the same owner while it runs (the tab's retry): not a second run either.
        # (Answered at once: the first run answers when it ends. The limit only keeps a failure from hanging.)
        await asyncio.wait_for(requests.handle(owner, "tab-b:9", text), 30)
        actions.gate.set()
        await running
        assert titles(owner) == ["x 1", "x 2"]
        assert [m["result"] for m in page.of_type("reply")] == ["added"]
        finished = saved_copy(owner.app, tmp_path / "finished.db")
        owner.app.close()

        # The next owner opened the copy saved mid-action: the request is refused, not run again.
        for path, expected in ((cut, ["x 1"]), (finished, ["x 1", "x 2"])):
            page, successor = owner_on(path, actions)
            again = TabRequests(successor.app)
            served = again.handle_now(successor, "tab-b:9", text)
            if served is None:
                await again.handle(successor, "tab-b:9", text)
                (reply,) = page.of_type("reply")
            else:
                reply = json.loads(served[1])
            assert titles(successor) == expected
            assert reply["id"] == 9
            if path == finished:
                assert reply["ok"] is True and reply["result"] == "added"
            else:
                assert reply["ok"] is False and reply["error"]["code"] == "STORAGE_ERROR"
                assert reply["error"]["context"]["reason"] == "interrupted"
                assert "add_two" in reply["error"]["message"]
                assert "may have been applied in part" in reply["error"]["message"]
            successor.app.close()

    asyncio.run(scenario())


def test_reads_and_failures_are_answered_as_usual(tmp_path: Path, todos: Any) -> None:
    _, owner = owner_on(tmp_path / "tabs.db", todos)
    requests = TabRequests(owner.app)
    count = request(1, "count", collection="todos")
    assert requests.handle_now(owner, "tab-b:1", count) == (False, owner._reply(1, 0))
    assert requests.stored_reply("tab-b:1") is None  # a read is not recorded: sent again, it reads again
    owner.app.todos.insert({"title": "tea"})
    assert requests.handle_now(owner, "tab-b:1", count) == (False, owner._reply(1, 1))

    refused = requests.handle_now(owner, "tab-b:2", request(2, "call", name="add_todo", args=[" "]))
    assert refused is not None
    assert json.loads(refused[1])["error"]["code"] == "INVALID_OPERATION"
    # Without a key (this tab's own page) nothing is recorded.
    assert requests.handle_now(owner, None, request(3, "call", name="add_todo", args=["x"])) is not None
    assert titles(owner) == ["tea", "x"]
    owner.app.close()


def test_old_keys_are_pruned(tmp_path: Path, todos: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_tabs, "PRUNE_EVERY", 2)
    _, owner = owner_on(tmp_path / "tabs.db", todos)
    requests = TabRequests(owner.app)
    requests.handle_now(owner, "old", request(1, "call", name="add_todo", args=["a"]))
    owner.app.db.conn.execute("UPDATE offline_tab_requests SET at = at - ?", (worker_tabs.KEEP_SECONDS + 1,))
    requests.handle_now(owner, "new", request(2, "call", name="add_todo", args=["b"]))
    assert requests.stored_reply("old") is None and requests.stored_reply("new") is not None
    owner.app.close()


def test_each_attached_tab_gets_its_own_replies_and_live_changes(tmp_path: Path, todos: Any) -> None:
    own, owner = owner_on(tmp_path / "tabs.db", todos)
    other = Page()

    async def scenario() -> None:
        follower = await attach(owner, other.post)
        assert other.of_type("ready") and not own.of_type("ready")  # the other tab's page is told it is ready
        assert (await other.request(follower, "subscribe", collection="todos", query={}, sub=1))["ok"]
        assert (await own.request(owner, "subscribe", collection="todos", query={}, sub=1))["ok"]

        mine = await own.request(owner, "call", name="add_todo", args=["from the owner"])
        theirs = await other.request(follower, "call", name="add_todo", args=["from the other tab"])
        await asyncio.sleep(0)
        for page in (own, other):
            inserted = [r["title"] for m in page.of_type("changes") for r in m["inserted"]]
            assert inserted == ["from the owner", "from the other tab"], page.messages
        assert mine["ok"] and theirs["ok"]
        assert [m["id"] for m in own.of_type("reply")] == [own._next - 1, own._next]  # its own replies only

        follower.detach()  # the other tab closed
        before = len(other.messages)
        await own.request(owner, "call", name="add_todo", args=["after"])
        await asyncio.sleep(0)
        assert len(other.messages) == before

    asyncio.run(scenario())
    owner.app.close()


def test_sync_sends_only_what_the_browser_stored(tmp_path: Path) -> None:
    """With the browser's gate (`DurableSync`), an operation reaches the server only once a save that
    started after it is stored: a tab closing before that never leaves the server an operation whose
    sequence number the next owner would give to another write."""
    page = Page()
    with live_server(SCHEMA, None, tmp_path / "server.db") as live:
        app = create_app(SCHEMA, sync={"url": live.ws_url, **FAST_SYNC}, path=str(tmp_path / "client.db"))
        app.sync.durable_sequence = app._seq  # as offline.worker.open_app does in the browser
        durable = DurableSync(app)
        bridge = page.bridge(app)

        async def server_titles(expected: list[str]) -> list[str]:
            for _ in range(300):
                titles = [r["title"] for r in live.records("todos")]
                if titles == expected:
                    break
                await asyncio.sleep(0.02)
            return titles

        async def scenario() -> None:
            await bridge.start()
            for _ in range(500):
                if app.sync.status == "connected":
                    break
                await asyncio.sleep(0.02)
            app.todos.insert({"title": "stored"})
            sequence = durable.saving()  # a save starts: it holds the write
            app.todos.insert({"title": "not stored yet"})
            await asyncio.sleep(0.5)  # (given time, it must still not be sent)
            assert live.records("todos") == []
            durable.saved(sequence)
            assert await server_titles(["stored"]) == ["stored"]
            durable.saved(durable.saving())
            assert sorted(await server_titles(["not stored yet", "stored"])) == ["not stored yet", "stored"]
            await bridge.stop()

        asyncio.run(scenario())


def test_a_request_no_tab_answers_fails_with_a_message() -> None:
    """web/tabs.js in Node.js with short time limits (tests/js/tabs_timeouts.mjs): a request the owner never
    answers, and one made while no tab owns the database, each fail with STORAGE_ERROR saying why; one made
    before an owner appears is served by it."""
    seen = run_node_script("tabs_timeouts.mjs")
    assert seen["waiting"] == [{"type": "reply", "id": 7, "ok": True, "result": "served"}]
    (stuck,) = seen["stuckFollower"]
    assert stuck["ok"] is False and stuck["error"]["code"] == "STORAGE_ERROR"
    assert stuck["error"]["context"] == {"reason": "owner-timeout"}
    assert "did not answer within 0.15 s" in stuck["error"]["message"]
    assert "may or may not have been applied" in stuck["error"]["message"]
    (alone,) = seen["alone"]
    assert alone["error"]["code"] == "STORAGE_ERROR" and alone["error"]["context"] == {"reason": "no-owner"}
    assert "no tab of this app opened its database within 0.3 s" in alone["error"]["message"]
    assert "stuckOwner" not in seen  # the owner's page heard nothing of the other tab's request


def test_a_request_the_owner_fails_to_serve_is_answered_at_once() -> None:
    """web/tabs.js in Node.js (tests/js/tabs_failures.mjs), time limits long enough that only the owner can
    answer: when serving another tab's request fails in the owner's worker (an exception, a rejected
    promise, attaching that tab failed), that tab's page gets an error reply for the request at once, and
    the owner still logs the failure; a failure on the owner's own page is answered there the same way."""
    seen = run_node_script("tabs_failures.mjs")

    def refused(reply: dict[str, Any], request_id: int, cause: str) -> None:
        assert reply["id"] == request_id and reply["ok"] is False, reply
        error = reply["error"]
        assert error["code"] == "STORAGE_ERROR"
        assert error["context"] == {"reason": "owner-failed", "cause": cause}
        assert cause in error["message"] and "may or may not have been applied" in error["message"]

    first, second, third = seen["follower"]
    refused(first, 1, "PythonError: sqlite3.OperationalError: disk I/O error")
    refused(second, 2, "PythonError: the app is closed")
    assert third == {"type": "reply", "id": 3, "ok": True, "result": "served"}  # it goes on serving
    (own,) = seen["owner"]
    refused(own, 5, "the owner's Python raised")
    refused_early, served_early = seen["early"]
    refused(refused_early, 9, "PythonError: attach failed")
    assert served_early == {"type": "reply", "id": 10, "ok": True, "result": "served"}
    # The owner's page logs every failure, as before.
    assert sorted(seen["logged"]) == sorted(
        [
            "Error: PythonError: sqlite3.OperationalError: disk I/O error",
            "Error: PythonError: the app is closed",
            "Error: the owner's Python raised",
            "Error: PythonError: attach failed",
        ]
    )


def test_a_tab_whose_worker_failed_hands_the_database_on() -> None:
    """web/tabs.js in Node.js (tests/js/tabs_resign.mjs): a tab whose worker fails after taking the database's
    lock (Python did not load, the database did not open) resigns: the next tab owns the database, serving
    both pages, instead of every tab waiting until the failed one is closed; a worker that fails while it
    still waits for the lock passes it on once granted."""
    seen = run_node_script("tabs_resign.mjs")
    assert seen["owners"] == ["next", "late"]  # not "early": it failed while waiting
    assert seen["ownedWhileFailingHeldIt"] is False
    assert seen["next"] == [{"type": "reply", "id": 1, "ok": True, "result": "next"}]
    assert seen["failing"] == [{"type": "reply", "id": 2, "ok": True, "result": "next"}]
