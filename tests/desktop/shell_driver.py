"""Drive the real desktop shell (pywebview on Qt WebEngine, offscreen) from a test.

The shell runs as its own process, exactly as a user starts it (``python -m offline_desktop PROJECT``).
Qt WebEngine's remote debugging (``QTWEBENGINE_REMOTE_DEBUGGING``, a Qt feature, not a hook of ours) gives
the test the Chrome DevTools Protocol of the window's page: it types with ``Input.insertText``, clicks real
elements, reads the DOM and takes screenshots. (Playwright's ``connect_over_cdp`` needs browser-context
commands that Qt WebEngine does not offer, so this speaks the protocol directly.)
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from tests.support.servers import ROOT, free_port

ARTIFACTS = ROOT / "test-artifacts"


def shell_available() -> str | None:
    """Why the real shell cannot run here (None when it can)."""
    try:
        import webview  # noqa: F401
        from PyQt6 import QtWebEngineWidgets  # noqa: F401
    except ImportError as exc:
        return f"the desktop shell needs pywebview with PyQt6-WebEngine ({exc}); scripts/setup.sh installs it"
    return None


def require_shell() -> None:
    reason = shell_available()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


class ShellProcess:
    """One desktop app process and the DevTools connection to its window's page."""

    def __init__(
        self,
        project: Path,
        config_dir: Path,
        *,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> None:
        self.project = project
        # What starts the window: the app itself by default, or a command that starts it (offline dev).
        self.command = command or [sys.executable, "-m", "offline_desktop", str(project)]
        self.config_dir = config_dir
        self.debug_port = free_port()
        self.log_path = config_dir.parent / f"shell-{config_dir.name}-{self.debug_port}.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("OFFLINE_", "BUILD_"))}
        environ.update(
            {
                "PYTHONPATH": str(ROOT),
                "QT_QPA_PLATFORM": "offscreen",
                # Qt WebEngine's Chromium refuses to run as root with its sandbox on (tests run as root).
                "QTWEBENGINE_CHROMIUM_FLAGS": "--no-sandbox --disable-gpu",
                "QTWEBENGINE_REMOTE_DEBUGGING": f"127.0.0.1:{self.debug_port}",
                "OFFLINE_DESKTOP_CONFIG_DIR": str(config_dir),
            }
        )
        environ.update(env or {})
        self.env = environ
        self.proc: subprocess.Popen[bytes] | None = None
        self._ws: ClientConnection | None = None
        self._page_id: str | None = None
        self._next = 0

    def start(self, timeout: float = 60.0) -> ShellProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the process's lifetime
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(self.project),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the shell exited with {self.proc.returncode}:\n{self.log()}")
            page = self._page_target()
            if page is not None:
                self._attach(page)
                return self
            time.sleep(0.2)
        raise AssertionError(f"the shell showed no page in {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _page_target(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.debug_port}/json", timeout=1) as response:
                targets = json.load(response)
        except OSError:
            return None
        pages = [t for t in targets if t.get("type") == "page" and t.get("url", "").startswith("http")]
        return pages[0] if pages else None

    def _attach(self, page: dict[str, Any]) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                self._ws.close()
        connection = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        self._ws = connection.__enter__()  # closed by close() or the next attach
        self._page_id = page["id"]

    def _send(self, method: str, **params: Any) -> dict[str, Any]:
        assert self._ws is not None
        self._next += 1
        ident = self._next
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=30))
            if message.get("id") == ident:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return dict(message.get("result") or {})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self._send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Poll until the expression is truthy; the page may navigate meanwhile (the target is refreshed)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.evaluate(expression)
                if last:
                    return last
            except Exception as exc:  # mid-navigation: the old document's context is gone
                last = exc
                page = self._page_target()
                if page is not None:
                    self._attach(page)
            time.sleep(0.2)
        self.screenshot("timeout")
        raise AssertionError(f"timed out waiting for {expression!r} (last: {last!r})\n{self.log()[-3000:]}")

    def type_into(self, selector: str, text: str) -> None:
        self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = ''; e.focus(); }})()"
        )
        self._send("Input.insertText", text=text)

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def text(self, selector: str) -> str:
        return str(self.evaluate(f"document.querySelector({json.dumps(selector)})?.textContent ?? ''"))

    def url(self) -> str:
        return str(self.evaluate("location.href"))

    def screenshot(self, name: str) -> Path | None:
        try:
            data = self._send("Page.captureScreenshot", format="png").get("data")
        except Exception:
            return None
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"desktop-{name}.png"
        path.write_bytes(base64.b64decode(data or ""))
        return path

    def close(self) -> int | None:
        """Stop the app as a window manager's close would: SIGTERM, then wait."""
        if self._ws is not None:
            with contextlib.suppress(Exception):
                self._ws.close()
            self._ws = None
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@contextlib.contextmanager
def running_shell(project: Path, config_dir: Path, **kwargs: Any) -> Iterator[ShellProcess]:
    shell = ShellProcess(project, config_dir, **kwargs)
    try:
        yield shell.start()
    finally:
        shell.close()


def template_project(folder: Path) -> Path:
    """A project made by `offline init` (without npm): the same page and todos.py the browser runs."""
    from offline_cli.commands.init import create_project

    project = folder / "todo-app"
    create_project(project)
    shutil.rmtree(project / "node_modules", ignore_errors=True)
    return project
