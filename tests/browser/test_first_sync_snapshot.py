"""A fresh browser's first sync from the server's snapshot (issue 28): while Pyodide loads, the worker asks the
server for its replica of the database (``POST /offline-sync/snapshot``), writes the file as its database
(OPFS, or IndexedDB where OPFS is missing) and Python opens it; the sync connection then carries only what
came after it. Against a live server whose log holds more operations than ``state_sync_after``, in
headless Chromium, every request checked to stay on loopback (see support.py).

The browser then syncs as any device does: another client's write appears live, the page's own write reaches
the server, a reload keeps everything (and asks for no snapshot). A server that answers anything but a
snapshot (here 204: snapshots off) leaves the first sync to the socket, which still completes.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from offline import create_app

from .support import (
    FAST_SYNC,
    OPEN_PAGE_DATABASE,
    database_name,
    guarded_browser,
    live_server,
    new_context,
    project_modules,
)
from .test_browser_client import START_TIMEOUT_MS, eventually, open_app, records
from .test_browser_storage import WITHOUT_OPFS, reload

#: Operations in the server's log before the browser's first visit: past the server's state_sync_after
#: (1000), so a fresh device is due a state-based first sync, which the server builds as a snapshot.
SEEDED = 3000


def shown(more: int = 0) -> str:
    """The page's list line once it shows the seeded records (every third is done) and ``more`` open ones."""
    return f"{SEEDED - len(range(0, SEEDED, 3)) + more} left · {SEEDED + more} in total"


async def first_visit(context: Any, base: str) -> Any:
    from playwright.async_api import expect

    page = await open_app(context, base)
    await expect(page.locator("#count")).to_have_text(shown(), timeout=START_TIMEOUT_MS)
    return page


@pytest.mark.parametrize("storage", ["opfs", "indexeddb"])
def test_a_fresh_browser_starts_from_the_servers_snapshot_and_syncs_on(
    chromium: str, web_project: Path, tmp_path: Path, storage: str
) -> None:
    schema, todos = project_modules(web_project)

    async def scenario(live: Any) -> None:
        from playwright.async_api import expect

        counters = live.server.sync.counters
        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            if storage == "indexeddb":
                await context.add_init_script(WITHOUT_OPFS)
            page = await first_visit(context, live.url)
            timings = await page.evaluate("window.offlineClient.timings")
            for stage in ("snapshot-requested", "snapshot-answered", "snapshot-written"):
                assert stage in timings, timings
            assert timings["snapshot-written"] <= timings["storage-opened"] <= timings["app-opened"]
            # (The page's list's first results came after the worker was ready: the bench's cold path.)
            assert timings["ready"] <= timings["results-first-part"]
            assert "snapshot-declined" not in timings and "snapshot-discarded" not in timings
            # The records came in the file (built once, sent once), and the socket carried no record state:
            # the engine never stored any (its first "sync:states" reports first-states), and the server
            # sent none (a snapshot's states are not counted as sent).
            assert (counters["snapshots_built"], counters["snapshots_served"]) == (1, 1)
            badge = page.locator("#sync-status")
            await expect(badge).to_have_attribute("data-status", "connected", timeout=START_TIMEOUT_MS)
            assert await page.evaluate("window.offlineClient.collection('todos').count()") == SEEDED
            assert "first-states" not in await page.evaluate("window.offlineClient.timings")
            assert counters["states_sent"] == 0

            # Another device's write reaches the page live; the page's own write reaches the server. (The
            # desktop client's own first sync is by states, over its socket.)
            desktop = create_app(schema, sync={"url": live.ws_url, **FAST_SYNC}, path=str(tmp_path / "d.db"))
            try:
                await desktop.sync.connect()
                written = todos.add_todo(desktop, "from the desktop")
                await desktop.sync.wait_until_synced(30)
                await expect(page.locator("#count")).to_have_text(shown(1))
                # (The list shows a window of its rows: the count says the new one is there.)
                await page.fill("#title", "from the browser")
                await page.click("#add")
                await expect(page.locator("#count")).to_have_text(shown(2))
                await expect(badge).to_have_attribute("data-pending", "0")

                async def on_the_server() -> None:
                    assert "from the browser" in {r["title"] for r in live.records("todos")}

                await eventually(on_the_server)
            finally:
                with contextlib.suppress(Exception):
                    await desktop.sync.disconnect()
                desktop.close()

            # The page's database is the server's, and a reload keeps it (without asking for a snapshot).
            mine = await records(page)
            assert mine == live.records("todos") and len(mine) == SEEDED + 2
            assert {"from the desktop", "from the browser"} <= {r["title"] for r in mine}
            assert written["id"] in {r["id"] for r in mine}
            await reload(page)
            await expect(page.locator("#count")).to_have_text(shown(2))
            timings = await page.evaluate("window.offlineClient.timings")
            assert "snapshot-requested" not in timings and "first-states" not in timings
            assert await records(page) == mine
            assert counters["snapshots_served"] == 1

    with live_server(schema, web_project / "dist", tmp_path / "server.db", seed_count=SEEDED) as live:
        asyncio.run(scenario(live))


# The page's IndexedDB database as the storage's first open leaves it: its stores made, nothing in them.
CREATE_EMPTY = f"""
async (name) => {{
  const db = await {OPEN_PAGE_DATABASE};
  db.close();
}}
"""


def test_an_empty_indexeddb_database_still_asks_for_the_snapshot(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    """The worker opens its storage while it first looks whether anything is stored: in IndexedDB, that
    open creates the (empty) database, and the look must not take it for a stored one. Here the empty
    database is there before the page starts, as when the open wins that race."""
    schema, _ = project_modules(web_project)

    async def scenario(live: Any) -> None:
        from playwright.async_api import expect

        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            await context.add_init_script(WITHOUT_OPFS)
            setup = await context.new_page()
            await setup.goto(live.url + "/config.js")  # (same site; does not start the app)
            await setup.evaluate(CREATE_EMPTY, database_name(web_project))
            await setup.close()
            page = await first_visit(context, live.url)
            timings = await page.evaluate("window.offlineClient.timings")
            for stage in ("snapshot-requested", "snapshot-answered", "snapshot-written"):
                assert stage in timings, sorted(timings)
            assert live.server.sync.counters["snapshots_served"] == 1
            await expect(page.locator("#count")).to_have_text(shown())

    with live_server(schema, web_project / "dist", tmp_path / "server.db", seed_count=SEEDED) as live:
        asyncio.run(scenario(live))


def test_without_a_snapshot_the_first_sync_runs_over_the_socket(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    """The server answers 204 (snapshots off): the page says nothing of it and syncs by record states."""
    schema, _ = project_modules(web_project)

    async def scenario(live: Any) -> None:
        from playwright.async_api import expect

        counters = live.server.sync.counters
        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            messages: list[str] = []
            context.on("console", lambda message: messages.append(message.text))
            page = await first_visit(context, live.url)
            timings = await page.evaluate("window.offlineClient.timings")
            assert "snapshot-requested" in timings and "snapshot-declined" in timings
            assert "snapshot-written" not in timings and "first-states" in timings
            assert counters["snapshots_served"] == 0 and counters["states_sent"] >= SEEDED
            assert any("HTTP 204" in text for text in messages), messages  # (a console.info line)
            await expect(page.locator("#sync-status")).to_have_attribute("data-status", "connected")
            await expect(page.locator("#error")).to_be_hidden()
            await expect(page.locator("#notices")).to_be_empty()
            assert await records(page) == live.records("todos")

    with live_server(
        schema,
        web_project / "dist",
        tmp_path / "server.db",
        seed_count=SEEDED,
        limits={"snapshot_builds": 0},
    ) as live:
        asyncio.run(scenario(live))
