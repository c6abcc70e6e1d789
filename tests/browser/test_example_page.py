"""The repository's example to-do page (examples/todo/web, what `scripts/main.sh` serves) at size: its list is
windowed like the `offline init` template's (a screenful of rows in the page, not one per record), and a
change redraws only its own row.

The example is built the way scripts/setup.sh builds it (offline_cli.web_build), from a copy, with the
session's template project's npm packages (the same pinned pyodide), and served by a live server.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .support import ROOT, guarded_browser, live_server, load_module, new_context
from .test_browser_client import open_app

MANY = 600


@pytest.fixture(scope="module")
def example(web_project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("example") / "todo"
    shutil.copytree(
        ROOT / "examples" / "todo",
        copy,
        ignore=lambda folder, names: {n for n in names if n in ("dist", "node_modules") or n.endswith(".db")},
    )
    (copy / "node_modules").symlink_to(web_project / "node_modules")
    env = {**os.environ, "BUILD_SYNC_URL": "/offline-sync", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "offline_cli.web_build", str(copy)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return copy


async def call(page: Any, script: str, *args: Any) -> Any:
    return await page.evaluate(
        f"async (args) => {{ const todos = window.offlineClient.collection('todos'); {script} }}", list(args)
    )


def test_the_example_list_is_windowed_and_redraws_only_changed_rows(
    chromium: str, example: Path, tmp_path: Path
) -> None:
    schema = load_module(example / "schema.py", "example_todo_schema").schema

    async def scenario(base: str) -> None:
        from playwright.async_api import expect

        async with guarded_browser(chromium) as (browser, guard):
            page = await open_app(await new_context(browser, guard), base)
            ids = await call(
                page,
                "const rows = await todos.insertMany(Array.from({ length: args[0] }, (_, i) => ({"
                " title: `row ${String(i).padStart(4, '0')}`, ownerId: 'guest',"
                " status: i % 2 ? 'done' : 'open' })));"
                "return rows.map((row) => row.id);",
                MANY,
            )
            count = page.locator("#count")
            await expect(count).to_have_text(f"{MANY // 2} left · {MANY} in total")
            rows = page.locator("#todos li")
            await expect(rows.first.locator(".title")).to_have_text("row 0000")
            assert 0 < await rows.count() < 100  # windowed: only the rows in view exist

            # The first row is marked: toggling another row redraws that row, never the list.
            await rows.first.evaluate("(row) => { row.dataset.marker = 'kept'; }")
            await page.locator(f"#todos li[data-id='{ids[2]}'] .toggle").check()
            await expect(page.locator(f"#todos li[data-id='{ids[2]}']")).to_have_class("done")
            await expect(count).to_have_text(f"{MANY // 2 - 1} left · {MANY} in total")
            await expect(rows.first).to_have_attribute("data-marker", "kept")

            await call(page, "await todos.delete(args[0]);", ids[0])
            await expect(rows.first.locator(".title")).to_have_text("row 0001")
            await expect(count).to_have_text(f"{MANY // 2 - 2} left · {MANY - 1} in total")

            # Scrolling to the end draws the rows there (and still only a screenful).
            await page.locator("#list").evaluate("(list) => { list.scrollTop = list.scrollHeight; }")
            await expect(rows.last.locator(".title")).to_have_text(f"row {MANY - 1:04d}")
            assert await rows.count() < 100

    with live_server(schema, example / "dist", tmp_path / "server.db") as live:
        asyncio.run(scenario(live.url))
