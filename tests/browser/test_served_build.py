"""The built client as the server sends it to Chromium: Pyodide's WebAssembly gzip-encoded (the build's copy,
see server_runtime/static.py) with the type `WebAssembly.compileStreaming` requires, and the caching headers
that let a browser keep the build's content-named files and revalidate the others. A first visit downloads
the build once more for the service worker's cache: only once its first sync is over (web/app.js)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from .support import guarded_browser, live_server, load_module, new_context

CHECK = """async () => {
    const wasm = await fetch("pyodide/pyodide.asm.wasm");
    const headers = Object.fromEntries(wasm.headers.entries());
    // Compiled while it streams in (the type must be application/wasm, the encoding is the browser's).
    const module = await WebAssembly.compileStreaming(wasm);
    const config = (await import("./config.js")).default;
    const code = await fetch(config.python);
    const page = await fetch("./");
    return {
        wasm: headers,
        exports: WebAssembly.Module.exports(module).length,
        code: code.headers.get("cache-control"),
        page: [page.headers.get("cache-control"), Boolean(page.headers.get("etag"))],
    };
}"""


def test_pyodide_is_sent_gzipped_and_compiles_as_it_streams(chromium: str, web_project: Path) -> None:
    schema = load_module(web_project / "schema.py", "served_build_schema").schema

    async def scenario(base: str) -> Any:
        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            page = await context.new_page()
            await page.goto(base + "/index.html")
            seen = await page.evaluate(CHECK)
            await context.close()
            return seen

    with live_server(schema, web_project / "dist", web_project / "served-build.db") as live:
        seen = asyncio.run(scenario(live.url))
    assert seen["wasm"]["content-type"] == "application/wasm", seen
    assert seen["wasm"]["content-encoding"] == "gzip", seen
    assert (
        int(seen["wasm"]["content-length"])
        < 0.5 * (web_project / "dist/pyodide/pyodide.asm.wasm").stat().st_size
    )
    assert seen["exports"] > 100  # (Pyodide's module, whole)
    assert "immutable" in seen["code"], seen  # py/app.<hash>.zip
    assert seen["page"] == ["no-cache", True], seen


#: Notes the page's sync status each time the page registers its service worker (whose install downloads the
#: whole build again, and stores it).
REGISTRATIONS = """(() => {
    const seen = (window.__registrations = []);
    if (!navigator.serviceWorker) return;
    const register = navigator.serviceWorker.register.bind(navigator.serviceWorker);
    navigator.serviceWorker.register = (...args) => {
        seen.push({ ...(window.offlineClient && window.offlineClient.status) });
        return register(...args);
    };
})()"""


def test_the_service_worker_is_registered_once_the_first_sync_is_over(
    chromium: str, web_project: Path
) -> None:
    # (Registered at ready, its install downloaded and stored the 16 MB build while the first sync of a
    # large log ran: the status then is "disconnected", sync not started yet, which is no settled sync.)
    from playwright.async_api import expect

    schema = load_module(web_project / "schema.py", "served_build_schema").schema

    async def scenario(base: str) -> Any:
        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            await context.add_init_script(REGISTRATIONS)
            page = await context.new_page()
            await page.goto(base + "/")
            await expect(page.locator("#cache-status")).to_have_attribute(
                "data-cached", "true", timeout=120_000
            )
            seen = await page.evaluate("window.__registrations")
            await context.close()
            return seen

    db = web_project / "served-build-first-sync.db"
    with live_server(schema, web_project / "dist", db, seed_count=300) as live:
        seen = asyncio.run(scenario(live.url))
    assert len(seen) == 1, seen
    assert seen[0]["status"] == "connected", seen
    assert seen[0]["received"] == seen[0]["serverTotal"] > 0, seen  # every record of the server's log came
