"""The dashboard at `/__offline` in a real browser (headless Chromium driven by Playwright).

A real server (SQLite store, admin token set) runs in a background thread with its own event loop. The browser
is redirected to the sign-in page, a wrong token shows the error, the admin token signs in with an HttpOnly
SameSite=Strict cookie that page scripts cannot read, and the page goes live over EventSource. A real client
then connects and writes: the clients table and the recent-operations list update without a reload. Every
request that would leave loopback is aborted and recorded; there must be none. A screenshot of the page is
saved to ``test-artifacts/dashboard.png``.

Needs Playwright (the ``test`` extra) and Debian's ``chromium`` (``scripts/setup.sh --test`` installs both as
root). Without them the test skips and says why; in CI (env ``CI`` set) it fails instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from offline import create_app, define_schema, t
from server_runtime import create_production_server
from server_runtime.operational import COOKIE
from server_runtime.server import ProductionServer
from server_runtime.stores import create_sqlite_server_store
from server_runtime.stores.base import ServerStore

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
ADMIN_TOKEN = "dashboard-browser-admin-token-7f3c9a"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
TIMEOUT_MS = 15_000  # every wait for the DOM: generous, but a hang fails instead of blocking the suite
FAST = {"backoff_initial": 0.05, "backoff_max": 0.4, "ack_timeout": 2.0, "handshake_timeout": 10.0}

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {"items": {"fields": {"title": t.string(), "done": t.boolean().default(False)}}},
    }
)


def chromium_path() -> str | None:
    for candidate in (os.environ.get("OFFLINE_TEST_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def require_chromium() -> str:
    """The Chromium executable; a missing browser or Playwright skips the test, or fails it in CI."""
    problems = []
    if importlib.util.find_spec("playwright") is None:
        problems.append("the Python package 'playwright' is not installed (pip install -e '.[test]')")
    executable = chromium_path()
    if executable is None:
        problems.append("Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium)")
    if problems:
        reason = (
            "cannot run the dashboard browser test: "
            + "; ".join(problems)
            + " - run scripts/setup.sh --test as root to install both"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run this test)", pytrace=False)
        print(f"SKIPPED: {reason}", file=sys.stderr)
        pytest.skip(reason)
    assert executable is not None
    return executable


# -- the server, in its own thread and event loop ------------------------------------------------------------------


@dataclass
class ServerThread:
    server: ProductionServer
    store: ServerStore
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    url: str

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + self.server.sync_path

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextlib.contextmanager
def running_server(tmp_path: Path) -> Iterator[ServerThread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="dashboard-test-server", daemon=True)
    thread.start()

    async def start() -> tuple[ProductionServer, ServerStore, str]:
        store = create_sqlite_server_store(str(tmp_path / "server.db"))
        await store.set_schema(SCHEMA)
        server = create_production_server(
            store=store, port=0, host="127.0.0.1", operational_auth={"adminToken": ADMIN_TOKEN}
        )
        return server, store, await server.start()

    server, store, url = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    running = ServerThread(server, store, loop, thread, url)
    try:
        yield running
    finally:

        async def stop() -> None:
            try:
                await server.stop()
            finally:
                await store.close()

        try:
            running.call(stop())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


# -- the test ------------------------------------------------------------------------------------------------------


def test_dashboard_signs_in_and_follows_a_client_live(tmp_path: Path) -> None:
    executable = require_chromium()  # first: a missing browser skips (fails in CI) before any server starts
    started = time.monotonic()
    with running_server(tmp_path) as live:
        asyncio.run(_scenario(live, executable, tmp_path))
    print(f"dashboard browser test took {time.monotonic() - started:.1f} s", file=sys.stderr)


async def _scenario(live: ServerThread, executable: str, tmp_path: Path) -> None:
    from playwright.async_api import Route, async_playwright, expect

    expect.set_options(timeout=TIMEOUT_MS)
    base = live.url
    left_loopback: list[str] = []
    requests: list[str] = []
    page_errors: list[str] = []
    console_errors: list[str] = []

    async def only_loopback(route: Route) -> None:
        url = route.request.url
        host = urllib.parse.urlsplit(url).hostname or ""
        if url.startswith(("data:", "blob:", "about:")) or host in LOOPBACK:
            await route.continue_()
        else:
            left_loopback.append(url)
            await route.abort("blockedbyclient")

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            await context.route("**/*", only_loopback)
            context.on("request", lambda request: requests.append(request.url))
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            page.on("pageerror", lambda error: page_errors.append(str(error)))
            page.on(
                "console",
                lambda message: console_errors.append(message.text) if message.type == "error" else None,
            )

            # 1. Without a session the dashboard sends the browser to its sign-in page.
            response = await page.goto(base + "/__offline")
            assert response is not None
            assert page.url == base + "/__offline/login", page.url
            assert response.status == 200
            redirect = response.request.redirected_from
            assert redirect is not None and redirect.url == base + "/__offline"
            first = await redirect.response()
            assert first is not None and first.status == 303
            await expect(page.locator("#token")).to_be_visible()
            await expect(page.locator("#error")).to_have_count(0)

            # 2. A wrong token: the error shows, no session cookie is set.
            await page.fill("#token", "not-the-admin-token")
            async with page.expect_navigation():
                await page.click("#signin")
            await expect(page.locator("#error")).to_have_text("That token is not the admin token.")
            assert page.url == base + "/__offline/login"
            assert not [c for c in await context.cookies() if c["name"] == COOKIE]

            # 3. The admin token: back on the dashboard, which goes live over EventSource.
            await page.fill("#token", ADMIN_TOKEN)
            async with page.expect_navigation(url=base + "/__offline"):
                await page.click("#signin")
            await expect(page.locator("#conn")).to_have_text("● live")
            await expect(page.locator("#conn")).to_have_class("live")
            await expect(page.locator("#store")).to_have_text("sqlite")
            await expect(page.locator("#clients")).to_have_text("0")
            await expect(page.locator("#clientRows tr")).to_have_count(0)
            await expect(page.locator("#opRows tr")).to_have_count(0)

            # The session cookie: HttpOnly, SameSite=Strict, scoped to /__offline, not the token itself,
            # and invisible to page scripts.
            cookies = [c for c in await context.cookies() if c["name"] == COOKIE]
            assert len(cookies) == 1, cookies
            cookie = cookies[0]
            assert cookie["httpOnly"] is True
            assert cookie["sameSite"] == "Strict"
            assert cookie["path"] == "/__offline"
            assert ADMIN_TOKEN not in cookie["value"]
            document_cookie = await page.evaluate("document.cookie")
            assert COOKIE not in document_cookie, document_cookie
            assert ADMIN_TOKEN not in await page.content()

            # A marker in the page's JavaScript world: it survives only if the page never reloads.
            await page.evaluate("window.__dashboardTestMarker = 'still the same page'")
            navigations: list[str] = []
            page.on(
                "framenavigated",
                lambda frame: navigations.append(frame.url) if frame == page.main_frame else None,
            )

            # 4. A real client connects: it appears in the clients table without a reload.
            app = create_app(SCHEMA, sync={"url": live.ws_url, **FAST}, path=str(tmp_path / "client.db"))
            try:
                await app.sync.connect()
                node = app.node_id
                client_row = page.locator("#clientRows tr", has_text=node)
                await expect(client_row).to_have_count(1)
                await expect(page.locator("#clients")).to_have_text("1")

                # 5. It writes: the operation shows in the recent-operations list, again without a reload.
                record = app.items.insert({"title": "written by the browser test"})
                await app.sync.wait_until_synced(15)
                op_row = page.locator("#opRows tr", has_text=str(record["id"]))
                await expect(op_row).to_have_count(1)
                await expect(op_row.locator("td")).to_have_text(
                    [re.compile(r"^\d+$"), "insert", "items", str(record["id"]), node]
                )
                await expect(page.locator("#ops")).to_have_text("1")
                await expect(client_row.locator("td").nth(2)).to_have_text("1", timeout=TIMEOUT_MS)

                ARTIFACTS.mkdir(exist_ok=True)
                await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            finally:
                with contextlib.suppress(Exception):
                    await app.sync.disconnect()
                app.close()

            # 6. The client leaves: its row goes away, still live.
            await expect(page.locator("#clientRows tr")).to_have_count(0)
            await expect(page.locator("#clients")).to_have_text("0")
            await expect(page.locator("#conn")).to_have_text("● live")
            assert await page.evaluate("window.__dashboardTestMarker") == "still the same page"
            assert navigations == [], navigations

            # 7. Signing out ends the session on the server: back to the sign-in page, and the dashboard
            # sends the browser there again.
            async with page.expect_navigation(url=base + "/__offline/login"):
                await page.click("#signout")
            assert not [c for c in await context.cookies() if c["name"] == COOKIE]
            await page.goto(base + "/__offline")
            assert page.url == base + "/__offline/login", page.url
            await context.close()
        finally:
            await browser.close()

    assert left_loopback == [], f"requests that tried to leave loopback: {left_loopback}"
    assert requests, "the route handler saw no requests at all"
    assert all(urllib.parse.urlsplit(u).hostname in LOOPBACK for u in requests), requests
    assert page_errors == [], f"JavaScript errors on the page: {page_errors}"
    csp = [m for m in console_errors if "Content Security Policy" in m or "Refused to" in m]
    assert csp == [], f"the page broke its own Content-Security-Policy: {csp}"
