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
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.servers import free_port

from .support import CACHE, ROOT, guarded_browser, new_context
from .test_browser_client import add, open_app

#: The first run installs the pyodide npm package and builds the page; later runs reuse both.
SETUP_TIMEOUT = 900.0


@contextlib.contextmanager
def main_script(
    port: int, db: Path, log: Path, *, root: Path = ROOT, path: str | None = None
) -> Iterator[str]:
    """`bash scripts/main.sh --port PORT` of ``root`` in its own process group; yields the app URL it prints."""
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
    if path is not None:
        env["PATH"] = path
    with open(log, "wb") as errors:
        proc = subprocess.Popen(
            ["bash", "scripts/main.sh", "--port", str(port), "--db", str(db), "--no-reload"],
            cwd=root,
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


def test_without_node_the_first_command_still_serves_a_page_that_says_what_is_missing(tmp_path: Path) -> None:
    """A machine with Python and bash only, where apt is not available: no Node.js, so no web client. The
    server still runs and its page says why, instead of answering Not Found."""
    clone = tmp_path / "clone"
    tracked = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, tracked):
        source = ROOT / name
        target = clone / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, target)  # keeps mtimes: setup sees the installed .venv as current
    (clone / ".venv").symlink_to(ROOT / ".venv")
    # Python, bash and the few tools the scripts use: no node, npm or apt-get.
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "dirname", "id", "find", "touch"):
        found = shutil.which(tool)
        assert found is not None, tool
        (tools / tool).symlink_to(found)
    (tools / "python3").symlink_to(os.path.realpath(sys.executable))  # the interpreter itself, not a shim

    port = free_port()
    log = tmp_path / "main.log"
    with main_script(port, tmp_path / "server.db", log, root=clone, path=str(tools)) as url:
        with urllib.request.urlopen(url + "/", timeout=30) as response:
            page = response.read().decode()
        assert response.status == 200
        assert "web page was not built" in page and "Node.js" in page and 'href="/__offline"' in page
        with urllib.request.urlopen(url + "/__offline", timeout=30) as response:
            assert response.status == 200  # the dashboard (no admin token in development)
        assert "Node.js (npm) is missing" in log.read_text()
        assert not (clone / "examples" / "todo" / "dist").exists()
