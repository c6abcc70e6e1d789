"""The Python's bytecode in Chromium. A build with Node.js compiles the standard library and the app's code
with Pyodide (offline_cli/web_precompile.mjs): a first start runs that bytecode and the worker keeps none of
its own. A build without it ships sources, and the worker's bytecode cache takes over: a first start
compiles the app's imported modules and keeps them for that build; a reload unpacks them (so CPython skips
compiling). Either way, a rebuilt app with changed code never runs the old build's bytecode.

Service workers are blocked here so that a reload after the rebuild fetches the new build at once (with the
service worker, the new build takes over on a later reload, which test_browser_client covers); the Cache
Storage the bytecode lives in is the browser context's either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from offline_cli.web_build import build_web_client

from .support import copy_project, run_in_browser
from .test_browser_client import START_TIMEOUT_MS, TIMEOUT_MS


def _with_marker(project: Path, value: str) -> None:
    """Give the project's todos module a function that says which build of the code is running, and one that
    says where the running code came from (`_bytecode`)."""
    todos = project / "todos.py"
    text = todos.read_text(encoding="utf-8").split("\n\n# build marker\n")[0]
    todos.write_text(
        f"{text}\n\n# build marker\ndef build_marker(app):\n    return {value!r}\n\n\n"
        f"{BYTECODE_OF}\n\n"
        '__all__ = [*globals().get("__all__", ()), "build_marker", "bytecode_of"]\n',
        encoding="utf-8",
    )


#: What the running Python was loaded from: the standard library's json module's file (``.pyc``: the build's
#: bytecode), and the kind of todos' bytecode file, if any (its flags: 0 timestamp-based, as CPython writes
#: one after compiling a source; 3 checked hash, as the build and the worker's cache write them).
BYTECODE_OF = """def bytecode_of(app):
    import importlib.util
    import json
    import os

    cached = importlib.util.cache_from_source(__file__)
    if not os.path.exists(cached):
        return {"stdlib": json.__file__, "flags": None}
    with open(cached, "rb") as file:
        return {"stdlib": json.__file__, "flags": int.from_bytes(file.read(8)[4:], "little")}
"""


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


async def _cached_bytecode(page: Any) -> list[str]:
    urls: list[str] = await page.evaluate(
        "async () => (await (await caches.open('offline-bytecode')).keys()).map((r) => r.url)"
    )
    return urls


def test_a_first_start_runs_the_builds_bytecode_and_a_new_build_its_own(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    project = copy_project(web_project, tmp_path / "app")
    _with_marker(project, "first")
    env = {"BUILD_SYNC_URL": "/offline-sync"}
    assert build_web_client(project, env=env).bytecode

    async def scenario(context: Any, base: str) -> None:
        page = await context.new_page()
        page.set_default_timeout(TIMEOUT_MS)

        # A first start: the standard library and the app's code come as the build compiled them (the
        # app's beside its source, checked against it), and the worker keeps no bytecode of its own.
        first = await _start(page, base + "/")
        assert "bytecode-loaded" not in first, first
        assert await _marker(page) == "first"
        loaded = await page.evaluate("window.offlineClient.call('bytecode_of')")
        assert loaded["stdlib"].endswith("json/__init__.pyc") and loaded["flags"] == 3, loaded
        await _start(page)
        assert await _cached_bytecode(page) == []
        assert "bytecode-saved" not in await page.evaluate("window.offlineClient.timings")

        # A new build with changed code runs the new code from its first start.
        _with_marker(project, "second")
        assert build_web_client(project, env=env).bytecode
        await _start(page)
        assert await _marker(page) == "second"
        loaded = await page.evaluate("window.offlineClient.call('bytecode_of')")
        assert loaded["flags"] == 3, loaded
        await context.close()

    run_in_browser(chromium, project, tmp_path, scenario, service_workers="block")


def test_without_the_builds_bytecode_a_reload_uses_the_workers_and_never_stale_bytecode(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    project = copy_project(web_project, tmp_path / "app")
    _with_marker(project, "first")
    env = {"BUILD_SYNC_URL": "/offline-sync"}
    assert not build_web_client(project, env=env, bytecode=False).bytecode

    async def scenario(context: Any, base: str) -> None:
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
        build_web_client(project, env=env, bytecode=False)
        rebuilt = await _start(page)
        assert "bytecode-loaded" not in rebuilt, rebuilt
        assert await _marker(page) == "second"
        await _bytecode_saved(page)
        again = await _start(page)
        assert "bytecode-loaded" in again, again
        assert await _marker(page) == "second"
        cached = await _cached_bytecode(page)
        assert len(cached) == 1 and "pyc.zip" in cached[0], cached
        await context.close()

    run_in_browser(chromium, project, tmp_path, scenario, service_workers="block")
