"""Browser client figures, in headless Chromium against a live server (``python -m bench browser``).

The `offline init` template is built (npm's cache in ~/.cache/offline-tests) and served; nothing the page
loads leaves loopback (the same guard as tests/browser). Figures:

- ``page_to_ready_cold_ms``: a first visit, nothing cached: from navigation start until the worker reports
  the app ready (Pyodide fetched and compiled, IndexedDB opened, the Python code unpacked and imported);
  ``cold_stages_ms`` splits it (worker-side times since the page started the worker).
- ``page_to_ready_warm_ms``: a reload of the same page (the service worker answers from its cache).
- ``inserts_1000_sequential_s``: 1,000 ``insert`` calls from the page, each awaited before the next; each
  reply comes after the database was copied to IndexedDB. The page's list is subscribed, as in the app.
- ``inserts_1000_concurrent_s``: 1,000 calls sent at once (the copies to IndexedDB are shared).
- ``inserts_1000_one_batch_s``: one ``insertMany`` of 1,000 records (one transaction).
- ``synced_3000_s``: after the last insert returned, until the server had acknowledged all 3,000 operations
  (sync runs while the page writes, so this is only what is left).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SEQUENTIAL = """async (n) => {
    const todos = window.offlineClient.collection("todos");
    const start = performance.now();
    for (let i = 0; i < n; i++) await todos.insert({ title: `sequential ${i}` });
    return performance.now() - start;
}"""
CONCURRENT = """async (n) => {
    const todos = window.offlineClient.collection("todos");
    const start = performance.now();
    await Promise.all(Array.from({ length: n }, (_, i) => todos.insert({ title: `concurrent ${i}` })));
    return performance.now() - start;
}"""
BATCH = """async (n) => {
    const todos = window.offlineClient.collection("todos");
    const start = performance.now();
    await todos.insertMany(Array.from({ length: n }, (_, i) => ({ title: `batch ${i}` })));
    return performance.now() - start;
}"""


def _stages(timings: dict[str, float]) -> dict[str, int]:
    created = timings.get("created", 0.0)
    return {name: round(value - created) for name, value in timings.items() if name != "created"}


async def _measure(executable: str, base: str, count: int) -> dict[str, Any]:
    from playwright.async_api import expect

    from tests.browser.support import guarded_browser, new_context

    figures: dict[str, Any] = {}
    async with guarded_browser(executable) as (browser, guard):
        context = await new_context(browser, guard)
        page = await context.new_page()
        page.set_default_timeout(120_000)
        await page.goto(base + "/")
        await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=120_000)
        timings = await page.evaluate("window.offlineClient.timings")
        figures["page_to_ready_cold_ms"] = round(timings["ready"])
        figures["cold_stages_ms"] = _stages(timings)
        await expect(page.locator("#cache-status")).to_have_attribute("data-cached", "true", timeout=120_000)
        await expect(page.locator("#sync-status")).to_have_attribute("data-status", "connected")

        warm = []
        for _ in range(2):
            await page.reload()
            await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=120_000)
            warm.append((await page.evaluate("window.offlineClient.timings"))["ready"])
        figures["page_to_ready_warm_ms"] = round(min(warm))
        await expect(page.locator("#sync-status")).to_have_attribute("data-status", "connected")

        figures["inserts_1000_sequential_s"] = round(await page.evaluate(SEQUENTIAL, count) / 1000, 3)
        figures["inserts_1000_concurrent_s"] = round(await page.evaluate(CONCURRENT, count) / 1000, 3)
        figures["inserts_1000_one_batch_s"] = round(await page.evaluate(BATCH, count) / 1000, 3)
        start = time.perf_counter()
        badge = page.locator("#sync-status")
        await expect(badge).to_have_attribute("data-pending", "0", timeout=300_000)
        await expect(badge).to_have_attribute("data-status", "connected")
        figures["synced_3000_s"] = round(time.perf_counter() - start, 3)
        assert await page.evaluate("window.offlineClient.collection('todos').count()") == 3 * count
        await context.close()
    return figures


def run(count: int = 1000) -> dict[str, Any]:
    from tests.browser.support import init_project, live_server, load_module, missing_tools

    problems = missing_tools()
    if problems:
        return {"skipped": "; ".join(problems)}
    from tests.browser.support import chromium_path

    executable = chromium_path()
    assert executable is not None
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        project = init_project(Path(folder))
        build_s = time.perf_counter() - started
        schema = load_module(project / "schema.py", "bench_browser_schema").schema
        dist = project / "dist"
        size = sum(p.stat().st_size for p in dist.rglob("*") if p.is_file())
        with live_server(schema, dist, Path(folder) / "server.db") as live:
            figures = asyncio.run(_measure(executable, live.url, count))
    figures["init_and_build_s"] = round(build_s, 2)
    figures["dist_mb"] = round(size / 1e6, 1)
    return figures


if __name__ == "__main__":
    import json

    json.dump(run(), sys.stdout, indent=2)
    sys.stdout.write("\n")
