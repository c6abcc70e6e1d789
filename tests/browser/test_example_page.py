"""The repository's example to-do page (examples/todo/web, what `scripts/main.sh` serves) at size: its list is
windowed like the `offline init` template's (a screenful of rows in the page, not one per record), and a
change redraws only its own row.

The example is built the way scripts/setup.sh builds it (offline_cli.web_build), from a copy, with the
session's template project's npm packages (the same pinned pyodide), and served by a live server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .support import ROOT, run_in_browser
from .test_browser_client import open_app
from .test_browser_storage import call, fill_list

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


def test_the_example_list_is_windowed_and_redraws_only_changed_rows(
    chromium: str, example: Path, tmp_path: Path
) -> None:
    async def scenario(context: Any, base: str) -> None:
        from playwright.async_api import expect

        page = await open_app(context, base)
        ids, count, rows = await fill_list(page, MANY, "ownerId: 'guest', status: i % 2 ? 'done' : 'open'")

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

    run_in_browser(chromium, example, tmp_path, scenario)
