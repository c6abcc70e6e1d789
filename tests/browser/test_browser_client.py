"""The browser client end to end: the `offline init` template, built with its pinned Pyodide, served by a live
server, driven in headless Chromium by Playwright.

Each page runs the project's Python (schema.py, todos.py and the offline library) in a Web Worker on Pyodide,
with SQLite compiled to WebAssembly and the database kept in IndexedDB. Every test fails if any request tried
to leave loopback (see support.py): the page, its worker and service worker load everything from the server.

Needs Playwright, Debian's chromium and Node.js/npm (`offline init` installs the pyodide npm package; npm's
cache is kept in ~/.cache/offline-tests/npm). Without them the tests skip and say why; under CI they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from offline import create_app

from .support import (
    FAST_SYNC,
    guarded_browser,
    live_server,
    new_context,
    project_modules,
)

TIMEOUT_MS = 20_000
START_TIMEOUT_MS = 90_000  # Pyodide's first start on a loaded machine
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


async def open_app(context: Any, base: str) -> Any:
    from playwright.async_api import expect

    page = await context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    await page.goto(base + "/")
    await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=START_TIMEOUT_MS)
    return page


async def sync_status(page: Any, status: str, *, pending: int | None = None) -> None:
    from playwright.async_api import expect

    badge = page.locator("#sync-status")
    await expect(badge).to_have_attribute("data-status", status)
    if pending is not None:
        await expect(badge).to_have_attribute("data-pending", str(pending))


async def records(page: Any) -> list[dict[str, Any]]:
    """The page's todos, read through the worker (Python, SQLite), sorted by id."""
    rows = await page.evaluate("window.offlineClient.collection('todos').fetch()")
    return sorted(rows, key=lambda record: record["id"])


async def titles(page: Any) -> list[str]:
    return [t.strip() for t in await page.locator("#todos li .title").all_inner_texts()]


async def add(page: Any, title: str) -> None:
    from playwright.async_api import expect

    await page.fill("#title", title)
    await page.click("#add")
    await expect(page.locator("#todos li .title", has_text=title)).to_have_count(1)
    await expect(page.locator("#title")).to_have_value("")


async def eventually(check: Any, timeout: float = TIMEOUT_MS / 1000) -> None:
    """Retry an async assertion until it passes or ``timeout`` seconds pass (then its error propagates)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def test_the_guard_records_requests_that_leave_loopback(chromium: str, web_project: Path) -> None:
    """The guard itself: a page fetch and a worker WebSocket to another host are both caught."""
    schema, _ = project_modules(web_project)

    async def scenario(base: str) -> dict[str, list[str]]:
        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            page = await context.new_page()
            await page.goto(base + "/")
            await page.evaluate(
                """async () => {
                    try { await fetch("http://example.com/leak"); } catch (e) {}
                    const code = "fetch('http://example.net/worker-leak').catch(() => {}).then(() => {"
                        + "const ws = new WebSocket('ws://example.org/leak');"
                        + "ws.onerror = ws.onclose = () => postMessage('done'); });";
                    const worker = new Worker(URL.createObjectURL(new Blob([code])));
                    await new Promise((resolve) => { worker.onmessage = resolve; });
                }"""
            )
            await context.close()
            seen = {
                "route": list(guard.left_loopback),
                "websocket": [u for u in guard.websockets if "example" in u],
                "proxy": list(guard.recorder.requests),
            }
            # The leaks were on purpose: clear them so the guard's own check on the way out passes.
            guard.left_loopback.clear()
            guard.websockets.clear()
            guard.recorder.requests.clear()
            return seen

    with live_server(schema, web_project / "dist", web_project / "guard-server.db") as live:
        seen = asyncio.run(scenario(live.url))
    assert seen["route"] == ["http://example.com/leak", "http://example.net/worker-leak"], seen
    assert seen["websocket"] == ["ws://example.org/leak"], seen
    # The proxy sees the worker's WebSocket too, whichever Playwright event covers it.
    assert any("example.org" in line for line in seen["proxy"]), seen


def test_two_browsers_edit_the_same_list_and_converge(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    schema, _ = project_modules(web_project)

    async def scenario(live: Any) -> None:
        from playwright.async_api import expect

        async with guarded_browser(chromium) as (browser, guard):
            one = await open_app(await new_context(browser, guard), live.url)
            two = await open_app(await new_context(browser, guard), live.url)
            for page in (one, two):
                await sync_status(page, "connected", pending=0)
                assert (await page.evaluate("window.offlineClient.info.runtime.platform")) == "emscripten"

            await add(one, "milk")
            await add(two, "eggs")
            for page in (one, two):
                await expect(page.locator("#todos li")).to_have_count(2)
            by_title = {r["title"]: r["id"] for r in await records(one)}

            # Concurrent edits of one record: different fields both survive, the same field agrees.
            await asyncio.gather(
                one.evaluate(
                    "id => window.offlineClient.call('rename_todo', id, 'oat milk')", by_title["milk"]
                ),
                two.evaluate("id => window.offlineClient.call('toggle_todo', id)", by_title["milk"]),
                one.evaluate(
                    "id => window.offlineClient.call('rename_todo', id, 'brown eggs')", by_title["eggs"]
                ),
                two.evaluate(
                    "id => window.offlineClient.call('rename_todo', id, 'white eggs')", by_title["eggs"]
                ),
            )
            for page in (one, two):
                await sync_status(page, "connected", pending=0)

            async def converged() -> None:
                mine, theirs = await records(one), await records(two)
                assert mine == theirs
                milk = next(r for r in mine if r["id"] == by_title["milk"])
                assert (milk["title"], milk["done"]) == ("oat milk", True)
                eggs = next(r for r in mine if r["id"] == by_title["eggs"])
                assert eggs["title"] in ("brown eggs", "white eggs")
                assert live.records("todos") == mine  # and the server holds the same records

            await eventually(converged)
            # What the pages show is what their databases hold.
            expected = [r["title"] for r in sorted(await records(one), key=lambda r: r["createdAt"])]
            for page in (one, two):
                await expect(page.locator("#todos li .title")).to_have_text(expected)
                await expect(page.locator("#todos li.done .title")).to_have_text(["oat milk"])

            # A delete in one list disappears from the other.
            await two.click(f"#todos li[data-id='{by_title['milk']}'] .delete")
            for page in (one, two):
                await expect(page.locator(f"#todos li[data-id='{by_title['milk']}']")).to_have_count(0)
                await expect(page.locator("#todos li")).to_have_count(1)
            await eventually(lambda: _same(one, two, live))
            ARTIFACTS.mkdir(exist_ok=True)
            await one.screenshot(path=str(ARTIFACTS / "browser-client.png"), full_page=True)

    with live_server(schema, web_project / "dist", tmp_path / "server.db") as live:
        asyncio.run(scenario(live))


async def _same(one: Any, two: Any, live: Any) -> None:
    mine = await records(one)
    assert mine == await records(two)
    assert live.records("todos") == mine


def test_offline_writes_survive_an_offline_reload_and_sync_later(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    schema, _ = project_modules(web_project)

    async def scenario(live: Any) -> None:
        from playwright.async_api import expect

        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            page = await open_app(context, live.url)
            await sync_status(page, "connected", pending=0)
            await add(page, "written online")
            await sync_status(page, "connected", pending=0)
            # The service worker has cached the page, the worker, Pyodide and the Python code.
            await expect(page.locator("#cache-status")).to_have_attribute(
                "data-cached", "true", timeout=START_TIMEOUT_MS
            )  # (registered once the first sync is over, then it downloads the build)

            await context.set_offline(True)
            await sync_status(page, "offline")
            await add(page, "written offline")
            await sync_status(page, "offline", pending=1)
            await expect(page.locator("#sync-status")).to_contain_text("saved on this device")

            # Reload with no network: everything comes from the cache, the data from IndexedDB.
            await page.reload()
            await expect(page.locator("body")).to_have_attribute(
                "data-ready", "true", timeout=START_TIMEOUT_MS
            )
            await expect(page.locator("#todos li .title")).to_have_text(["written online", "written offline"])
            await sync_status(page, "offline", pending=1)
            assert [r["title"] for r in live.records("todos")] == ["written online"]  # not sent yet

            await context.set_offline(False)
            await sync_status(page, "connected", pending=0)

            async def synced() -> None:
                assert sorted(r["title"] for r in live.records("todos")) == [
                    "written offline",
                    "written online",
                ]
                assert live.records("todos") == await records(page)

            await eventually(synced)
            # Another browser gets the write made offline.
            other = await open_app(await new_context(browser, guard), live.url)
            await expect(other.locator("#todos li .title")).to_have_text(
                ["written online", "written offline"]
            )

    with live_server(schema, web_project / "dist", tmp_path / "server.db") as live:
        asyncio.run(scenario(live))


def test_a_desktop_client_and_a_browser_converge(chromium: str, web_project: Path, tmp_path: Path) -> None:
    """The same todos.py: on native SQLite in this process, on SQLite/WebAssembly in the browser."""
    schema, todos = project_modules(web_project)

    async def scenario(live: Any) -> None:
        from playwright.async_api import expect

        desktop = create_app(
            schema, sync={"url": live.ws_url, **FAST_SYNC}, path=str(tmp_path / "desktop.db")
        )
        try:
            await desktop.sync.connect()
            written = todos.add_todo(desktop, "from the desktop")
            await desktop.sync.wait_until_synced(15)
            async with guarded_browser(chromium) as (browser, guard):
                page = await open_app(await new_context(browser, guard), live.url)
                row = page.locator(f"#todos li[data-id='{written['id']}']")
                await expect(row.locator(".title")).to_have_text("from the desktop")

                await add(page, "from the browser")
                await row.locator(".toggle").check()
                await expect(row).to_have_class("done")
                await sync_status(page, "connected", pending=0)
                todos.rename_todo(desktop, written["id"], "from the desktop, renamed")
                await expect(row.locator(".title")).to_have_text("from the desktop, renamed")

                async def converged() -> None:
                    browser_records = await records(page)
                    desktop_records = sorted(desktop.todos.where({}).fetch(), key=lambda r: r["id"])
                    assert desktop_records == browser_records
                    assert live.records("todos") == browser_records
                    assert {(r["title"], r["done"]) for r in browser_records} == {
                        ("from the desktop, renamed", True),
                        ("from the browser", False),
                    }

                await eventually(converged)

                # The page's collection API (not only the project's functions) reaches the same store.
                via_api = await page.evaluate(
                    """async (id) => {
                        const todos = window.offlineClient.collection("todos");
                        const updated = await todos.update(id, { title: "renamed by the page" });
                        const found = await todos.findById(id);
                        return [updated.title, found.title, await todos.where({ done: true }).count()];
                    }""",
                    written["id"],
                )
                assert via_api == ["renamed by the page", "renamed by the page", 1]

                async def renamed() -> None:
                    assert desktop.todos.find_by_id(written["id"])["title"] == "renamed by the page"

                await eventually(renamed)
        finally:
            with contextlib.suppress(Exception):
                await desktop.sync.disconnect()
            desktop.close()

    with live_server(schema, web_project / "dist", tmp_path / "server.db") as live:
        asyncio.run(scenario(live))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
