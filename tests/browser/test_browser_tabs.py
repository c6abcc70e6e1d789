"""Several tabs of the browser client in one browser: one tab's worker owns the database (a Web Lock), the
others work through it (tabs.js, offline/worker_tabs.py), and when the owner closes another takes over.

Same setup as test_browser_client.py: the `offline init` template served by a live server, headless Chromium
(the pages of one browser context share their origin's storage, locks and BroadcastChannels), every request
checked to stay on loopback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from .support import copy_project, guarded_browser, live_server, new_context, project_modules
from .test_browser_client import START_TIMEOUT_MS, add, eventually, open_app
from .test_browser_storage import reload

OWNS = "() => 'database-owned' in window.offlineClient.timings"
STARTED = "() => 'python-loaded' in window.offlineClient.timings"


async def owns(page: Any) -> bool:
    """Whether this tab's worker holds the database (it says so with a progress step)."""
    return bool(await page.evaluate(OWNS))


async def stored_titles(page: Any) -> list[str]:
    """The to-dos' titles as the page's worker reads them (through the owner, for another tab), sorted."""
    rows = await page.evaluate("window.offlineClient.collection('todos').fetch()")
    return sorted(row["title"] for row in rows)


def test_two_tabs_write_and_see_each_others_writes_live(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    """The second tab works at once (no notice to close the first): each tab's writes appear in the other's
    list as they happen, a reload of either tab after a write keeps it, and when the owner reloads, the other
    tab takes the database over and both go on."""
    schema, _ = project_modules(web_project)

    async def scenario(live: Any) -> None:
        from playwright.async_api import expect

        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            first = await open_app(context, live.url)
            second = await open_app(context, live.url)
            assert await owns(first) and not await owns(second)
            for page in (first, second):
                await expect(page.locator("#notices")).not_to_contain_text("another tab")

            await add(first, "from the first tab")
            await expect(second.locator("#todos li .title")).to_have_text(["from the first tab"])
            await add(second, "from the second tab")
            expected = ["from the first tab", "from the second tab"]
            await expect(first.locator("#todos li .title")).to_have_text(expected)

            # The durability promise, in either tab: a reload after the write finds it.
            await reload(second)
            assert not await owns(second)
            await expect(second.locator("#todos li .title")).to_have_text(expected)

            # The owner reloads: the other tab takes the database over, the reloaded one works through it.
            # (Once the other tab's worker has started Python it waits for the database: first in line.)
            await second.wait_for_function(STARTED, timeout=START_TIMEOUT_MS)
            await reload(first)
            await eventually(lambda: _assert_owner(second, first))
            await expect(first.locator("#todos li .title")).to_have_text(expected)
            await expect(second.locator("#todos li .title")).to_have_text(expected)
            await add(first, "first tab, after the handover")
            await add(second, "second tab, after the handover")
            expected += ["first tab, after the handover", "second tab, after the handover"]
            for page in (first, second):
                await expect(page.locator("#todos li .title")).to_have_text(expected)
                await expect(page.locator("#notices")).not_to_contain_text("another tab")
            await reload(first)
            await expect(first.locator("#todos li .title")).to_have_text(expected)

            # Only the owner syncs: the server has every write.
            async def server_has_all() -> None:
                assert sorted(r["title"] for r in live.records("todos")) == sorted(expected)

            await eventually(server_has_all, timeout=START_TIMEOUT_MS / 1000)

    with live_server(schema, web_project / "dist", tmp_path / "server.db") as live:
        asyncio.run(scenario(live))


async def _assert_owner(owner: Any, other: Any) -> None:
    assert await owns(owner) and not await owns(other)


#: Writes the follower sends one after another, and at once, around the owner's closing.
IN_A_ROW = 30
AT_ONCE = 20

START_WRITES = """(count) => {
    const client = window.offlineClient;
    const settle = (promise) => promise.then(
        (result) => ({ ok: true, id: result && result.id }),
        (error) => ({ ok: false, code: error.code, message: error.message }));
    window.inARow = [];
    window.inARowDone = (async () => {
        for (let i = 0; i < count; i++) window.inARow.push(await settle(client.call("add_todo", `in a row ${i}`)));
    })();
}"""

START_BURST = """(count) => {
    const client = window.offlineClient;
    window.burst = null;
    Promise.all(Array.from({ length: count }, (_, i) => client.call("add_todo", `at once ${i}`).then(
        (result) => ({ ok: true, id: result.id }),
        (error) => ({ ok: false, code: error.code, message: error.message })))).then((all) => { window.burst = all; });
}"""


def test_the_owner_closing_mid_write_loses_nothing(chromium: str, web_project: Path, tmp_path: Path) -> None:
    """The owner tab is closed while the other tab's writes are on their way to it: the other tab takes the
    database over, every write resolves (none hangs, none fails), each is kept exactly once (the to-do
    action makes a new id per call: a write applied twice would show twice), and a reload keeps them."""
    schema, _ = project_modules(web_project)

    async def scenario(live: Any) -> None:
        from playwright.async_api import expect

        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            owner = await open_app(context, live.url)
            follower = await open_app(context, live.url)
            assert await owns(owner) and not await owns(follower)
            await add(owner, "before")

            await follower.evaluate(START_WRITES, IN_A_ROW)
            await follower.wait_for_function("window.inARow.length >= 3")
            await follower.evaluate(START_BURST, AT_ONCE)
            await owner.close()  # with writes sent and not answered, one of them perhaps half served

            await follower.wait_for_function(
                f"window.inARow.length === {IN_A_ROW} && window.burst !== null", timeout=START_TIMEOUT_MS
            )
            outcomes = await follower.evaluate("window.inARow.concat(window.burst)")
            assert all(outcome["ok"] for outcome in outcomes), [o for o in outcomes if not o["ok"]]
            assert await owns(follower)
            expected = sorted(
                ["before"]
                + [f"in a row {i}" for i in range(IN_A_ROW)]
                + [f"at once {i}" for i in range(AT_ONCE)]
            )
            assert await stored_titles(follower) == expected  # each once: nothing applied twice
            count = f"{len(expected)} left · {len(expected)} in total"
            await expect(follower.locator("#count")).to_have_text(count)  # its list followed, live

            await reload(follower)
            assert await stored_titles(follower) == expected
            await expect(follower.locator("#count")).to_have_text(count)

            # A new tab works through the new owner.
            third = await open_app(context, live.url)
            assert not await owns(third)
            assert await stored_titles(third) == expected

    with live_server(schema, web_project / "dist", tmp_path / "server.db") as live:
        asyncio.run(scenario(live))


BREAKING_FUNCTION = """

# -- added by tests/browser/test_browser_tabs.py: a failure outside the bridge's own error handling -----------


def break_tab_requests(app: App) -> bool:
    \"\"\"Makes the owner's table of other tabs' requests unreadable from the next request on: serving one
    then raises in Python, past the bridge, as a failing storage would. (Dropping the table in this call
    would be undone with it: another tab's write and its key share one transaction.)\"\"\"
    import sqlite3

    from offline import worker_tabs

    def unreadable(self: object, key: str) -> str | None:
        raise sqlite3.OperationalError("no such table: offline_tab_requests")

    worker_tabs.TabRequests.stored_reply = unreadable  # type: ignore[method-assign, assignment]
    return True


__all__ = [*__all__, "break_tab_requests"]
"""


@pytest.fixture(scope="module")
def breaking_project(web_project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template with `break_tab_requests`, built."""
    from offline_cli.web_build import build_web_client

    variant = copy_project(web_project, tmp_path_factory.mktemp("browser-tabs") / "breaking-app")
    with (variant / "todos.py").open("a", encoding="utf-8") as todos:
        todos.write(BREAKING_FUNCTION)
    build_web_client(variant, sync_url="/offline-sync")
    return variant


CALL_ERROR = """(name) => window.offlineClient.call(name).then(
    () => null, (e) => ({code: e.code, message: e.message, context: e.context}))"""


def test_a_request_the_owner_fails_to_serve_fails_at_once_in_the_other_tab(
    chromium: str, breaking_project: Path, tmp_path: Path
) -> None:
    """The owner's Python raises past its bridge while serving the other tab's request: that tab's call fails
    with STORAGE_ERROR saying so (reason owner-failed, not its time limit), and the owner's page shows the
    error as before."""
    schema, _ = project_modules(breaking_project)

    async def scenario(live: Any) -> None:
        from playwright.async_api import expect

        async with guarded_browser(chromium) as (browser, guard):
            context = await new_context(browser, guard)
            owner = await open_app(context, live.url)
            follower = await open_app(context, live.url)
            assert await owns(owner) and not await owns(follower)

            assert await follower.evaluate(CALL_ERROR, "break_tab_requests") is None
            error = await follower.evaluate(CALL_ERROR, "clear_completed")
            assert error is not None, "the call succeeded"
            assert error["code"] == "STORAGE_ERROR", error
            assert error["context"]["reason"] == "owner-failed", error
            assert "no such table" in error["context"]["cause"], error
            assert "failed to serve this request" in error["message"], error
            await expect(owner.locator("#notices")).to_contain_text("no such table")

    with live_server(schema, breaking_project / "dist", tmp_path / "server.db") as live:
        asyncio.run(scenario(live))
