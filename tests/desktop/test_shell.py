"""The real desktop shell, offscreen: a pywebview window on Qt WebEngine showing the `offline init` page.

Each test starts the app as a user does (``python -m offline_desktop PROJECT``, or ``offline dev --desktop``)
against a live sync server process, types and clicks in the window's page (see shell_driver), and checks
what reached the server with an independent native client.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from offline import create_app
from tests.support.servers import ServerProcess, free_port

from .shell_driver import ShellProcess, require_shell, running_shell, template_project
from .support import static_server

FAST = {"backoff_initial": 0.05, "backoff_max": 0.5, "ack_timeout": 2.0, "handshake_timeout": 10.0}

pytestmark = pytest.mark.slow

READY = "document.body.dataset.ready === 'true'"
SYNCED = "(() => { const s = document.querySelector('#sync-status'); return s.dataset.status === 'connected' && s.dataset.pending === '0'; })()"
SETUP_IDLE = "document.body.dataset.view === 'setup' && document.body.dataset.state === 'idle'"


def rows(shell: ShellProcess) -> list[str]:
    return list(shell.evaluate("[...document.querySelectorAll('#todos li .title')].map(e => e.textContent)"))


def rows_once_drawn(shell: ShellProcess, count: int) -> list[str]:
    """The list once it shows ``count`` rows: the page draws its first results on an animation frame after
    `ready`, and a loaded machine may not have drawn them yet when the sync status says synced."""
    shell.wait_for(f"document.querySelectorAll('#todos li').length === {count}")
    return rows(shell)


def add_todo(shell: ShellProcess, title: str) -> None:
    shell.type_into("#title", title)
    shell.click("#add")
    shell.wait_for(
        f"[...document.querySelectorAll('#todos li .title')].some(e => e.textContent === {json.dumps(title)})"
    )


def server_titles(project: Path, sync_url: str, folder: Path) -> list[str]:
    """What a fresh native client receives from the server: the records the server holds."""
    spec = importlib.util.spec_from_file_location("desktop_template_schema", project / "schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    schema = module.schema

    async def fetch() -> list[str]:
        folder.mkdir(parents=True, exist_ok=True)
        app = create_app(schema, sync={"url": sync_url, **FAST}, path=str(folder / f"probe-{free_port()}.db"))
        try:
            await app.sync.connect()
            await app.sync.wait_until_synced(20)
            return sorted(r["title"] for r in app.todos.where({}).fetch())
        finally:
            await app.sync.disconnect()
            app.close()

    return asyncio.run(fetch())


@pytest.fixture
def project(tmp_path: Path) -> Path:
    require_shell()
    return template_project(tmp_path)


@pytest.fixture
def server(project: Path) -> Iterator[ServerProcess]:
    with ServerProcess(project / "server.py", store="memory") as process:
        yield process


def test_first_launch_shows_setup_refuses_a_bad_url_and_a_good_one_is_kept(
    project: Path, server: ServerProcess, tmp_path: Path
) -> None:
    config = tmp_path / "device-a"
    with running_shell(project, config) as shell:
        shell.wait_for(SETUP_IDLE)
        assert "Connect to your sync server" in shell.text("h1")
        assert shell.evaluate("document.querySelector('#skip').hidden") is False

        shell.type_into("#server-url", f"ws://127.0.0.1:{free_port()}/offline-sync")
        shell.click("#connect")
        reason = shell.wait_for(
            "!document.querySelector('#error').hidden && document.querySelector('#error').textContent"
        )
        assert "cannot reach" in reason
        assert shell.evaluate("document.querySelector('#error').dataset.code") == "UNREACHABLE"
        shell.screenshot("setup-refused")
        assert not (config / "settings.json").exists()  # nothing saved for a server that did not answer

        shell.type_into("#server-url", "ftp://example.invalid/")
        shell.click("#connect")
        shell.wait_for("document.querySelector('#error').dataset.code === 'BAD_URL'")

        shell.type_into("#server-url", server.http_url)  # the address a user knows; the sync URL is derived
        shell.click("#connect")
        shell.wait_for(READY)
        assert "runtime=desktop" in shell.url() and "/index.html" in shell.url()
        shell.wait_for(SYNCED)
        add_todo(shell, "written in the window")
        shell.wait_for(SYNCED)
        shell.screenshot("app-synced")
    assert json.loads((config / "settings.json").read_text())["syncUrl"] == server.sync_url
    assert server_titles(project, server.sync_url, tmp_path / "probe") == ["written in the window"]

    # Closed by SIGTERM (as `offline dev` or a logout does): the window closes and the app shuts down cleanly.
    assert shell.proc is not None and shell.proc.returncode == 0, shell.log()[-2000:]
    assert "SIGTERM: closing the window" in shell.log() and "desktop app closed" in shell.log()

    # The next launch skips setup, connects by itself and still has the device's data.
    with running_shell(project, config) as again:
        again.wait_for(READY)
        assert "/__desktop/" not in again.url()
        again.wait_for(SYNCED)
        assert rows_once_drawn(again, 1) == ["written in the window"]
        assert again.evaluate("window.offlineClient.info.runtime.platform") == sys.platform


def test_local_only_works_and_connects_later_from_the_settings_control(
    project: Path, server: ServerProcess, tmp_path: Path
) -> None:
    config = tmp_path / "device-b"
    with running_shell(project, config) as shell:
        shell.wait_for(SETUP_IDLE)
        shell.click("#skip")
        shell.wait_for(READY)
        shell.wait_for("document.querySelector('#sync-status').dataset.status === 'disabled'")
        assert "This computer only" in shell.text("#sync-status")
        add_todo(shell, "kept on this computer")
        assert json.loads((config / "settings.json").read_text())["localOnly"] is True

        shell.click("#sync-settings")  # the settings control: the same page in its settings view
        shell.wait_for("document.body.dataset.view === 'settings' && document.body.dataset.state === 'idle'")
        assert "stays on this computer" in shell.text("#current")
        assert shell.evaluate("document.querySelector('#skip').hidden") is True
        shell.type_into("#server-url", server.sync_url)
        shell.click("#connect")
        shell.wait_for(f"document.body.dataset.connected === {json.dumps(server.sync_url)}")
        assert shell.text("#current") == f"Syncing with {server.sync_url}."
        shell.screenshot("settings-connected")
        shell.click("#back")
        shell.wait_for(READY)
        shell.wait_for(SYNCED)
        assert rows_once_drawn(shell, 1) == ["kept on this computer"]
    assert server_titles(project, server.sync_url, tmp_path / "probe") == ["kept on this computer"]


def test_two_desktop_apps_built_with_a_sync_url_converge_through_a_live_server(
    project: Path, server: ServerProcess, tmp_path: Path
) -> None:
    built = {"BUILD_SYNC_URL": server.sync_url}  # baked in at build time: no setup screen
    with (
        running_shell(project, tmp_path / "one", env=built) as one,
        running_shell(project, tmp_path / "two", env=built) as two,
    ):
        for shell in (one, two):
            shell.wait_for(READY)
            assert "/__desktop/" not in shell.url()
            shell.wait_for(SYNCED)
        add_todo(one, "from one")
        add_todo(two, "from two")
        for shell in (one, two):
            shell.wait_for("document.querySelectorAll('#todos li').length === 2")
            assert sorted(rows(shell)) == ["from one", "from two"]
        # A change made in one window shows in the other.
        one.evaluate(
            "[...document.querySelectorAll('#todos li')].find(li => li.textContent.includes('from two'))"
            ".querySelector('.toggle').click()"
        )
        two.wait_for(
            "[...document.querySelectorAll('#todos li.done .title')].map(e => e.textContent).join() === 'from two'"
        )
        # The settings page knows the URL is fixed by the build and offers no way to change it.
        two.click("#sync-settings")
        two.wait_for("document.body.dataset.view === 'settings' && document.body.dataset.state === 'idle'")
        assert "set when it was built" in two.text("#current")
        assert two.evaluate("document.querySelector('#connect').disabled") is True
    assert server_titles(project, server.sync_url, tmp_path / "probe") == ["from one", "from two"]


def test_offline_dev_desktop_starts_the_server_and_the_app_synced_with_it(
    project: Path, tmp_path: Path
) -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "offline_cli",
        "dev",
        str(project),
        "--port",
        str(port),
        "--desktop",
        "--no-reload",
    ]
    with running_shell(project, tmp_path / "dev-device", command=command) as shell:
        shell.wait_for(READY)
        assert "/__desktop/" not in shell.url()  # dev passes the server's URL: no setup screen
        shell.wait_for(SYNCED)
        add_todo(shell, "from offline dev --desktop")
        shell.wait_for(SYNCED)
        assert server_titles(project, f"ws://127.0.0.1:{port}/offline-sync", tmp_path / "probe") == [
            "from offline dev --desktop"
        ]
        assert "desktop app started" in shell.log()


def test_offline_dev_desktop_loads_the_page_from_the_frontend_dev_server(
    project: Path, tmp_path: Path
) -> None:
    """A project with a `dev` script: dev starts it, waits for port 5173 and the window loads the page there."""
    if shutil.which("npm") is None:
        if os.environ.get("CI"):
            pytest.fail("npm is needed for the frontend dev server test; scripts/setup.sh installs it")
        pytest.skip("npm is not installed (scripts/setup.sh --test installs it)")
    package = json.loads((project / "package.json").read_text())
    # A stand-in for vite: any server of the page on 5173 will do; this one also marks what it served.
    package["scripts"]["dev"] = f"{sys.executable} -m http.server 5173 --bind 127.0.0.1 --directory web"
    (project / "package.json").write_text(json.dumps(package))
    port = free_port()
    command = [sys.executable, "-m", "offline_cli", "dev", str(project), "--port", str(port), "--desktop", "--no-reload"]  # fmt: skip
    with running_shell(project, tmp_path / "dev-device", command=command) as shell:
        shell.wait_for(READY)
        assert shell.url().startswith("http://localhost:5173/")
        shell.wait_for(SYNCED)
        add_todo(shell, "page from the dev server")
        shell.wait_for(SYNCED)
        assert "starting the frontend dev server" in shell.log()
        assert server_titles(project, f"ws://127.0.0.1:{port}/offline-sync", tmp_path / "probe") == [
            "page from the dev server"
        ]
    with pytest.raises(OSError):  # dev stopped the frontend server with itself
        urllib.request.urlopen("http://127.0.0.1:5173/", timeout=2)


def test_a_page_from_another_site_cannot_reach_the_apps_data(project: Path, tmp_path: Path) -> None:
    """pywebview offers its bridge to any page the window shows; the shell answers only the app's pages."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "index.html").write_text("<!doctype html><title>another site</title><p>hello</p>")
    built = {"BUILD_SYNC_URL": f"ws://127.0.0.1:{free_port()}/offline-sync"}
    with static_server(elsewhere) as other, running_shell(project, tmp_path / "device", env=built) as shell:
        shell.wait_for(READY)
        add_todo(shell, "private")
        shell.evaluate(f"location.href = {json.dumps(other + '/index.html')}")
        shell.wait_for(
            "document.title === 'another site' && typeof window.pywebview?.api?.post === 'function'"
        )
        for call in ("state()", "attach()", 'post([\'{"id":1,"method":"fetch","collection":"todos"}\'])'):
            answer = shell.evaluate(
                f"window.pywebview.api.{call}.then(r => 'answered: ' + JSON.stringify(r), e => 'refused: ' + (e.message || e))"
            )
            assert answer.startswith("refused") and "may not use this app's data" in answer, (call, answer)
        assert "private" not in json.dumps(shell.evaluate("document.documentElement.outerHTML"))
