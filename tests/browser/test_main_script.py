"""A newcomer's first command (the README's `bash scripts/main.sh`), run for real: it sets up what running needs,
builds the example's web client and serves it; the URL it prints opens a working to-do list in Chromium that
syncs between two browsers through that server, with the dashboard one click away.

Needs Playwright, Debian's chromium and Node.js/npm (the example's page is built from the pyodide npm
package). Without them the test skips and says why; under CI it fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.servers import free_port

from .support import CACHE, ROOT, guarded_browser, new_context
from .test_browser_client import add, open_app

#: The first run installs the pyodide npm package and builds the page; later runs reuse both.
SETUP_TIMEOUT = 900.0


@contextlib.contextmanager
def main_script(port: int, db: Path, log: Path) -> Iterator[str]:
    """`bash scripts/main.sh --port PORT` in its own process group; yields the app URL it prints."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("OFFLINE_") and key not in ("PORT", "DATABASE_URL", "BUILD_SYNC_URL")
    }
    env.update(
        {
            "npm_config_cache": str(CACHE / "npm"),
            "npm_config_prefer_offline": "true",
            "npm_config_update_notifier": "false",
        }
    )
    with open(log, "wb") as errors:
        proc = subprocess.Popen(
            ["bash", "scripts/main.sh", "--port", str(port), "--db", str(db), "--no-reload"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        try:
            deadline = time.monotonic() + SETUP_TIMEOUT
            seen: list[str] = []
            while True:
                assert proc.poll() is None or not lines.empty(), (
                    f"scripts/main.sh exited with {proc.returncode}; stdout {seen}; stderr:\n{log.read_text()}"
                )
                assert time.monotonic() < deadline, f"no app URL after {SETUP_TIMEOUT} s; stdout {seen}"
                try:
                    line = lines.get(timeout=1)
                except queue.Empty:
                    continue
                seen.append(line)
                match = re.match(r"app:\s+(http://\S+)", line)
                if match:
                    yield match.group(1)
                    break
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C in a terminal: offline dev stops its server
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


def test_the_first_command_serves_a_todo_list_that_syncs_between_browsers(
    chromium: str, tmp_path: Path
) -> None:
    port = free_port()
    with main_script(port, tmp_path / "server.db", tmp_path / "main.log") as url:
        assert url == f"http://127.0.0.1:{port}"
        assert (ROOT / "examples" / "todo" / "dist" / "index.html").is_file()

        async def scenario() -> None:
            from playwright.async_api import expect

            async with guarded_browser(chromium) as (browser, guard):
                one = await open_app(await new_context(browser, guard), url)
                two = await open_app(await new_context(browser, guard), url)
                await add(one, "buy milk")
                await expect(two.locator("#todos li .title")).to_have_text(["buy milk"])
                await add(two, "call the plumber")
                await expect(one.locator("#todos li .title")).to_have_text(["buy milk", "call the plumber"])
                # Marking one done in a browser reaches the other too.
                await one.locator("#todos li", has_text="buy milk").locator(".toggle").check()
                await expect(two.locator("#todos li.done .title")).to_have_text(["buy milk"])

                # The dashboard is one click away (no admin token in development: it opens directly).
                async with one.context.expect_page() as opened:
                    await one.click("#dashboard")
                dashboard = await opened.value
                await expect(dashboard.locator("h1")).to_contain_text("offline server")
                await expect(dashboard.locator("#clients")).to_have_text("2")

        asyncio.run(scenario())
