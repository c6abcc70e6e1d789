"""Rich text in the browser: the page's worker merges rich text with the npm package yjs (pycrdt has no
WebAssembly build), and converges with Python clients merging with pycrdt, through a real server process.

A variant of the `offline init` project adds a collection with a t.richtext() field; its build bundles yjs
from the project's node_modules (the template pins it) into dist/vendor/.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from offline import create_app
from tests.support.servers import ServerProcess

from .support import FAST_SYNC, copy_project, guarded_browser, load_module, new_context
from .test_browser_client import START_TIMEOUT_MS, eventually, open_app, sync_status

RICHTEXT_SCHEMA = """
from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {"fields": {"title": t.string(), "done": t.boolean().default(False), "createdAt": t.timestamp().auto()}},
            "notes": {"fields": {"body": t.richtext()}},
        },
    }
)
"""


def richtext_project(web_project: Path, target: Path, *, with_yjs: bool = True) -> tuple[Path, Any]:
    """A copy of the template project whose schema has ``notes.body`` (rich text), built; and its schema."""
    from offline_cli.web_build import build_web_client

    copy_project(web_project, target)
    (target / "schema.py").write_text(RICHTEXT_SCHEMA, encoding="utf-8")
    if not with_yjs:
        shutil.rmtree(target / "node_modules" / "yjs")
    build_web_client(target, sync_url="/offline-sync")
    return target, load_module(
        target / "schema.py", f"richtext_schema_{target.name.replace('-', '_')}"
    ).schema


async def note_body(page: Any, record_id: str) -> str | None:
    record = await page.evaluate("(id) => window.offlineClient.collection('notes').findById(id)", record_id)
    return None if record is None else str(record["body"])


def test_richtext_edited_in_the_browser_and_in_python_at_once_converges(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    """The browser (yjs) and a Python client (pycrdt) edit one field while apart; both end with one text
    holding both edits, and the browser's edit survives a reload made offline (it is in its own storage)."""
    project, schema = richtext_project(web_project, tmp_path / "richtext-app")

    async def scenario(server: ServerProcess) -> None:
        from playwright.async_api import expect

        desktop = create_app(schema, sync={"url": server.sync_url, **FAST_SYNC}, path=str(tmp_path / "py.db"))
        try:
            await desktop.sync.connect()
            note = desktop.notes.insert({"body": "shared note"})
            await desktop.sync.wait_until_synced(15)
            async with guarded_browser(chromium) as (browser, guard):
                context = await new_context(browser, guard)
                page = await open_app(context, server.http_url)
                await expect(page.locator("#notices .notice[data-key^='unavailable']")).to_have_count(0)

                async def arrived() -> None:
                    assert await note_body(page, note["id"]) == "shared note"

                await eventually(arrived)

                # Concurrent edits: neither side sees the other's until the Python client reconnects.
                await desktop.sync.disconnect()
                edited = await page.evaluate(
                    """async (id) => {
                        const body = window.offlineClient.collection("notes").richtext(id, "body");
                        await body.insert(0, "été: ");
                        return (await body.insert(5, "browser, ")).body;
                    }""",
                    note["id"],
                )
                assert edited == "été: browser, shared note"
                await sync_status(page, "connected", pending=0)  # the server has the browser's edits
                handle = desktop.notes.richtext(note["id"], "body")
                handle.insert(len(handle), " + python 🙂")
                assert str(handle) == "shared note + python 🙂"
                await desktop.sync.connect()
                expected = "été: browser, shared note + python 🙂"

                async def converged() -> None:
                    assert desktop.notes.find_by_id(note["id"])["body"] == expected
                    assert await note_body(page, note["id"]) == expected

                await eventually(converged)

                # Offline, the browser edits again and reloads: its edit comes from its own storage.
                await expect(page.locator("#cache-status")).to_have_attribute(
                    "data-cached", "true", timeout=START_TIMEOUT_MS
                )  # (registered once the first sync is over, then it downloads the build)
                await context.set_offline(True)
                offline_edit = await page.evaluate(
                    """(id) => window.offlineClient.collection("notes").richtext(id, "body").delete(0, 5)
                        .then((record) => record.body)""",
                    note["id"],
                )
                assert offline_edit == "browser, shared note + python 🙂"
                await page.reload()
                await expect(page.locator("body")).to_have_attribute(
                    "data-ready", "true", timeout=START_TIMEOUT_MS
                )
                assert await note_body(page, note["id"]) == offline_edit
                await context.set_offline(False)

                async def synced() -> None:
                    assert desktop.notes.find_by_id(note["id"])["body"] == offline_edit

                await eventually(synced)
        finally:
            with contextlib.suppress(Exception):
                await desktop.sync.disconnect()
            desktop.close()

    server = ServerProcess(
        project / "server.py",
        store="sqlite",
        db=str(tmp_path / "server.db"),
        env={"OFFLINE_STATIC_DIR": str(project / "dist")},
    )
    with server:
        asyncio.run(scenario(server))


def test_a_build_without_yjs_reports_richtext_unavailable(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    """A project without the npm package yjs still builds; its page names what rich text lacks, and a write to
    such a field fails loudly while the rest of the app works."""
    project, _ = richtext_project(web_project, tmp_path / "no-yjs-app", with_yjs=False)
    assert not (project / "dist" / "vendor").exists()

    async def scenario(server: ServerProcess) -> None:
        from playwright.async_api import expect

        from .test_browser_client import add

        async with guarded_browser(chromium) as (browser, guard):
            page = await open_app(await new_context(browser, guard), server.http_url)
            notice = page.locator("#notices .notice[data-key='unavailable-notes-body']")
            await expect(notice).to_contain_text("rich text fields are unavailable in the browser")
            await expect(notice).to_contain_text("npm package yjs")
            error = await page.evaluate(
                """() => window.offlineClient.collection('notes').insert({body: 'hello'})
                    .then(() => null, (e) => ({name: e.name, code: e.code, message: e.message}))"""
            )
            assert error is not None and error["name"] == "OfflineError", error
            assert "yjs" in error["message"]
            await add(page, "plain fields still work")

    with ServerProcess(
        project / "server.py", store="memory", env={"OFFLINE_STATIC_DIR": str(project / "dist")}
    ) as server:
        asyncio.run(scenario(server))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
