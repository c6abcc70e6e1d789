"""The worker's bytecode cache in Chromium: a first start compiles the app's imported modules and keeps them
for that build; a reload unpacks them (so CPython skips compiling), and a rebuilt app with changed code never
runs the old build's bytecode.

Service workers are blocked here so that a reload after the rebuild fetches the new build at once (with the
service worker, the new build takes over on a later reload, which test_browser_client covers); the Cache
Storage the bytecode lives in is the browser context's either way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from offline_cli.web_build import build_web_client

from .support import copy_project, guarded_browser, live_server
from .test_browser_client import START_TIMEOUT_MS, TIMEOUT_MS, project_modules


def _with_marker(project: Path, value: str) -> None:
    """Give the project's todos module a function that says which build of the code is running."""
    todos = project / "todos.py"
    text = todos.read_text(encoding="utf-8").split("\n\n# build marker\n")[0]
    todos.write_text(
        f"{text}\n\n# build marker\ndef build_marker(app):\n    return {value!r}\n\n\n"
        '__all__ = [*globals().get("__all__", ()), "build_marker"]\n',
        encoding="utf-8",
    )


async def _start(page: Any, url: str | None = None) -> dict[str, float]:
    from playwright.async_api import expect

    if url is None:
        await page.reload()
    else:
        await page.goto(url)
    await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=START_TIMEOUT_MS)
    timings: dict[str, float] = await page.evaluate("window.offlineClient.timings")
    return timings


async def _bytecode_saved(page: Any) -> None:
    await page.wait_for_function(
        "() => 'bytecode-saved' in window.offlineClient.timings", timeout=START_TIMEOUT_MS
    )


async def _marker(page: Any) -> str:
    value: str = await page.evaluate("window.offlineClient.call('build_marker')")
    return value


def test_a_reload_uses_the_builds_bytecode_and_a_new_build_never_runs_stale_bytecode(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    project = copy_project(web_project, tmp_path / "app")
    _with_marker(project, "first")
    env = {"BUILD_SYNC_URL": "/offline-sync"}
    build_web_client(project, env=env)
    schema, _ = project_modules(project)

    async def scenario(base: str) -> None:
        async with guarded_browser(chromium) as (browser, guard):
            context = await browser.new_context(service_workers="block")
            await context.route("**/*", guard.route)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)

            # A first start compiles from source, then keeps the bytecode.
            first = await _start(page, base + "/")
            assert "bytecode-loaded" not in first, first
            await _bytecode_saved(page)
            assert await _marker(page) == "first"

            # A reload of the same build unpacks it before importing, and keeps nothing new.
            warm = await _start(page)
            assert "bytecode-loaded" in warm, warm
            assert warm["bytecode-loaded"] <= warm["code-loaded"] <= warm["python-imported"], warm
            assert await _marker(page) == "first"
            assert "bytecode-saved" not in await page.evaluate("window.offlineClient.timings")

            # A new build with changed code: the old bytecode is not used, the new code runs, and the new
            # build's bytecode replaces it.
            _with_marker(project, "second")
            build_web_client(project, env=env)
            rebuilt = await _start(page)
            assert "bytecode-loaded" not in rebuilt, rebuilt
            assert await _marker(page) == "second"
            await _bytecode_saved(page)
            again = await _start(page)
            assert "bytecode-loaded" in again, again
            assert await _marker(page) == "second"
            cached = await page.evaluate(
                "async () => (await (await caches.open('offline-bytecode')).keys()).map((r) => r.url)"
            )
            assert len(cached) == 1 and "pyc.zip" in cached[0], cached
            await context.close()

    with live_server(schema, project / "dist", tmp_path / "server.db") as live:
        asyncio.run(scenario(live.url))
