"""The desktop bridge without a window: the page's messages served by the app running natively.

The page speaks the same messages as to the browser's Pyodide worker; here the test plays the page (it
calls the bridge's methods as pywebview would, from other threads, and collects what is pushed back).
"""

from __future__ import annotations

import asyncio
import json
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import App, OfflineError, create_app
from offline.worker import PROTOCOL_VERSION
from offline_desktop import BuildConfig, DesktopRuntime
from offline_desktop.bridge import DesktopBridge
from tests.support.servers import ServerProcess, free_port, write_entry

from .support import FAST, SCHEMA

SCHEMA_SOURCE = """\
from offline import define_schema, t
schema = define_schema({"version": 1, "collections": {"todos": {"fields": {
    "title": t.string(), "done": t.boolean().default(False)}}}})
"""


def actions_module() -> types.ModuleType:
    module = types.ModuleType("desktop_test_actions")

    def add_todo(app: App, title: str) -> dict[str, Any]:
        return app.todos.insert({"title": title})

    async def slow_count(app: App) -> int:
        await asyncio.sleep(0.05)
        return int(app.todos.where({}).count())

    add_todo.__module__ = slow_count.__module__ = module.__name__
    module.add_todo = add_todo  # type: ignore[attr-defined]
    module.slow_count = slow_count  # type: ignore[attr-defined]
    return module


class Page:
    """What the page receives: every pushed message, with a way to wait for one."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.calls = 0
        self._changed = threading.Condition()

    def push(self, texts: list[str]) -> None:
        with self._changed:
            self.calls += 1
            self.messages.extend(json.loads(text) for text in texts)
            self._changed.notify_all()

    def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
        with self._changed:
            found: list[dict[str, Any]] = []

            def match() -> bool:
                found[:] = [m for m in self.messages if predicate(m)]
                return bool(found)

            assert self._changed.wait_for(match, timeout), f"no such message; got {self.messages[-5:]}"
            return found[-1]

    def reply(self, request_id: int) -> dict[str, Any]:
        return self.wait(lambda m: m.get("type") == "reply" and m.get("id") == request_id)

    def results(self, sub: int) -> list[dict[str, Any]]:
        """A live query's results as the page holds them: its snapshot with the changes sent since."""
        held: dict[str, dict[str, Any]] = {}
        continued = False  # the last message was a part of a snapshot with more to come
        with self._changed:
            for m in self.messages:
                if m.get("sub") != sub:
                    continue
                if m.get("type") == "snapshot":
                    if not continued:
                        held = {}
                    held.update((r["id"], r) for r in m["records"])
                    continued = bool(m.get("more"))
                elif m.get("type") == "changes":
                    held.update((r["id"], r) for r in m["inserted"] + m["updated"])
                    for record_id in m["removed"]:
                        held.pop(record_id, None)
        return list(held.values())

    def wait_results(self, sub: int, check: Callable[[list[dict[str, Any]]], bool]) -> None:
        self.wait(lambda m: m.get("sub") == sub and check(self.results(sub)))


def request(ident: int, method: str, **params: Any) -> str:
    return json.dumps({"id": ident, "method": method, **params})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(write_entry(tmp_path, SCHEMA_SOURCE), store="memory") as process:
        yield process


def bridge_for(tmp_path: Path, build: BuildConfig, page: Page) -> DesktopBridge:
    def make() -> DesktopRuntime:
        return DesktopRuntime(SCHEMA, build, directory=tmp_path / "device", sync_options=FAST)

    bridge = DesktopBridge(make, actions=actions_module(), push=page.push)
    bridge.start()
    return bridge


def titles(records: list[dict[str, Any]]) -> list[str]:
    return sorted(r["title"] for r in records)


async def native_client(url: str, folder: Path, write: str | None = None) -> list[str]:
    app = create_app(SCHEMA, sync={"url": url, **FAST}, path=str(folder / "other.db"))
    try:
        if write is not None:
            app.todos.insert({"title": write})
        await app.sync.connect()
        await app.sync.wait_until_synced(20)
        await asyncio.sleep(0.3)  # relayed writes of others, after our own are acknowledged
        return titles(app.todos.where({}).fetch())
    finally:
        await app.sync.disconnect()
        app.close()


def test_a_page_is_served_in_order_and_sees_its_own_and_remote_changes(
    tmp_path: Path, server: ServerProcess
) -> None:
    page = Page()
    bridge = bridge_for(tmp_path, BuildConfig("notes", "1.0.0", sync_url=server.sync_url), page)
    try:
        bridge.attach()
        ready = page.wait(lambda m: m["type"] == "ready")
        assert ready["protocol"] == PROTOCOL_VERSION and ready["sync"] == server.sync_url
        assert ready["actions"] == ["add_todo", "slow_count"] and ready["unavailable"] == []
        assert ready["runtime"]["platform"] != "emscripten"  # native Python, not Pyodide

        bridge.post(
            [
                request(1, "subscribe", collection="todos", query={"where": {}}, sub=100),
                request(2, "insert", collection="todos", data={"title": "one"}),
                request(3, "call", name="add_todo", args=["two"]),
                request(4, "fetch", collection="todos", query={"where": {}}),
                request(5, "call", name="slow_count", args=[]),  # async: replies when it is done
                request(6, "insert", collection="todos", data={"title": 7}),  # wrong type
                request(7, "nonsense"),
            ]
        )
        assert page.reply(1)["result"] == 100
        assert page.reply(2)["result"]["title"] == "one"
        assert titles(page.reply(4)["result"]) == ["one", "two"]  # both writes were done before the fetch
        assert page.reply(5)["result"] == 2
        refused = page.reply(6)
        assert not refused["ok"] and refused["error"]["code"] == "INVALID_OPERATION"
        assert refused["error"]["context"]["field"] == "title"
        assert page.reply(7)["error"]["code"] == "INVALID_OPERATION"
        page.wait_results(100, lambda records: titles(records) == ["one", "two"])

        # Another device writes through the server: the page's live query hears of it.
        seen = asyncio.run(native_client(server.sync_url, tmp_path, write="from elsewhere"))
        page.wait_results(100, lambda records: len(records) == 3)
        assert seen == ["from elsewhere", "one", "two"]  # and the page's writes reached the server
        page.wait(lambda m: m["type"] == "status" and m["status"] == "connected" and m["pending"] == 0)
    finally:
        bridge.stop()


def test_a_reloaded_page_gets_a_fresh_bridge_and_the_old_one_goes_quiet(tmp_path: Path) -> None:
    page = Page()
    bridge = bridge_for(tmp_path, BuildConfig("notes", "1.0.0"), page)  # no URL: setup, local data only
    try:
        bridge.attach()
        bridge.post([request(1, "subscribe", collection="todos", query={"where": {}}, sub=1)])
        page.reply(1)
        bridge.attach()  # the page reloaded (or came back from the settings page)
        page.wait(lambda m: sum(x["type"] == "ready" for x in page.messages) == 2)
        bridge.post([request(11, "insert", collection="todos", data={"title": "after reload"})])
        page.reply(11)
        bridge.post([request(12, "count", collection="todos", query={"where": {}})])
        assert page.reply(12)["result"] == 1  # a full round trip later: any refresh has been sent
        # The first page's subscription died with it: it never heard of the new record.
        assert page.results(1) == []
        bridge.post([request(13, "subscribe", collection="todos", query={"where": {}}, sub=1)])
        page.wait_results(1, lambda records: titles(records) == ["after reload"])
    finally:
        bridge.stop()


def test_setup_calls_test_save_and_switch_the_running_app(tmp_path: Path, server: ServerProcess) -> None:
    page = Page()
    bridge = bridge_for(tmp_path, BuildConfig("notes", "1.0.0"), page)
    try:
        assert bridge.state()["mode"] == "setup" and bridge.state()["syncUrl"] is None
        empty = bridge.connect_server("   ")
        assert not empty["ok"] and empty["code"] == "BAD_URL"
        dead = bridge.connect_server(f"ws://127.0.0.1:{free_port()}/offline-sync")
        assert not dead["ok"] and dead["code"] == "UNREACHABLE" and "cannot reach" in dead["reason"]
        assert bridge.state()["mode"] == "setup"

        local = bridge.stay_local()
        assert local["mode"] == "local-only" and local["status"] == "disabled"
        bridge.attach()
        bridge.post([request(1, "insert", collection="todos", data={"title": "written local-only"})])
        page.reply(1)

        good = bridge.connect_server(server.http_url)  # the page's address: the sync URL is derived
        assert good == {"ok": True, "code": None, "reason": None, "url": server.sync_url}
        state = bridge.state()
        assert state["mode"] == "saved" and state["syncUrl"] == server.sync_url
        assert json.loads((tmp_path / "device" / "settings.json").read_text())["syncUrl"] == server.sync_url
        assert asyncio.run(native_client(server.sync_url, tmp_path)) == ["written local-only"]
    finally:
        bridge.stop()


def test_a_build_with_a_sync_url_cannot_be_pointed_elsewhere(tmp_path: Path, server: ServerProcess) -> None:
    page = Page()
    bridge = bridge_for(tmp_path, BuildConfig("notes", "1.0.0", sync_url=server.sync_url), page)
    try:
        state = bridge.state()
        assert state["mode"] == "build" and state["fixedUrl"] is True
        refused = bridge.connect_server("ws://127.0.0.1:1/offline-sync")
        assert (
            not refused["ok"]
            and refused["code"] == "DESKTOP_CONFIG"
            and "BUILD_SYNC_URL" in refused["reason"]
        )
        assert bridge.state()["syncUrl"] == server.sync_url
    finally:
        bridge.stop()


def test_bad_calls_from_a_page_are_refused_with_a_code(tmp_path: Path) -> None:
    page = Page()
    bridge = bridge_for(tmp_path, BuildConfig("notes", "1.0.0"), page)
    try:
        with pytest.raises(OfflineError) as before:
            bridge.post([request(1, "fetch", collection="todos")])
        assert before.value.code == "INVALID_OPERATION" and "attach" in before.value.message
        bridge.attach()
        with pytest.raises(OfflineError) as not_a_list:
            bridge.post("{}")  # type: ignore[arg-type]
        assert not_a_list.value.code == "INVALID_OPERATION"
        bridge.post(["not json"])
        page.wait(lambda m: m["type"] == "reply" and m["ok"] is False)
    finally:
        bridge.stop()
    with pytest.raises(OfflineError):
        bridge.attach()  # stopped: nothing is served any more
