"""The desktop shell: a native window (pywebview, Qt WebEngine on Linux) hosting the app's web UI.

The page is the same one the browser runs, opened with ``?runtime=desktop``: its `OfflineClient` then talks
to the app running natively in this process (`DesktopBridge`) instead of starting Pyodide in a worker. The
shell serves the page's files, and its own setup and settings page under ``/__desktop/``, from a small HTTP
server on the loopback interface; only static files travel over it, never data (data goes through the
window's JavaScript bridge, which no other process can reach).

First launch without a sync URL built in shows the setup page; the window's "Sync" menu and the page's own
settings link open the same page later (connect from local-only, or change the server).

pywebview is an optional dependency (``pip install 'offline[desktop]'``), imported only when a window opens.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any, Final
from urllib.parse import urlsplit

from offline import OfflineError
from offline.core.schema import SchemaDefinition

from .bridge import DesktopBridge
from .config import BuildConfig
from .runtime import DesktopRuntime

log = logging.getLogger("offline_desktop")

SHELL_ERROR: Final = "DESKTOP_SHELL"
PAGES_PREFIX: Final = "/__desktop/"
RUNTIME_QUERY: Final = "runtime=desktop"
INSTALL_HINT: Final = (
    "install the desktop extra: pip install 'offline[desktop]' (pywebview with Qt WebEngine)"
)


def _import_webview() -> ModuleType:
    try:
        return importlib.import_module("webview")
    except ImportError as exc:
        raise OfflineError(f"the desktop shell needs pywebview ({exc}); {INSTALL_HINT}", SHELL_ERROR) from exc


def _gui() -> str | None:
    # The Linux build ships Qt WebEngine (PyQt6 wheels); elsewhere pywebview picks the system's WebView.
    # PYWEBVIEW_GUI (pywebview's own variable) still chooses another.
    chosen = os.environ.get("PYWEBVIEW_GUI")
    return chosen or ("qt" if sys.platform.startswith("linux") else None)


def _pages_dir() -> Path:
    return Path(str(resources.files("offline_desktop").joinpath("pages")))


class _Files(http.server.SimpleHTTPRequestHandler):
    """The page's files from the web folder, the shell's own pages under /__desktop/; no listings."""

    web_dir: Path
    pages_dir: Path

    def translate_path(self, path: str) -> str:
        route = urlsplit(path).path
        if route.startswith(PAGES_PREFIX):
            self.directory = str(self.pages_dir)
            path = "/" + route[len(PAGES_PREFIX) :]
        else:
            self.directory = str(self.web_dir)
        return super().translate_path(path)

    def list_directory(self, path: str | os.PathLike[str]) -> None:
        self.send_error(404, "no listing")
        return None

    def end_headers(self) -> None:
        # The files change under `offline dev`: never serve a stale copy from the WebView's cache.
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("shell file server: " + format, *args)


@contextlib.contextmanager
def serve_files(web_dir: Path) -> Iterator[str]:
    """Serve ``web_dir`` (and the shell's pages) on a free loopback port; yields the base URL."""
    handler = type("Files", (_Files,), {"web_dir": web_dir, "pages_dir": _pages_dir()})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name="offline-shell-files", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def with_runtime(url: str) -> str:
    """``url`` with ``runtime=desktop`` added to its query (what tells the page it runs in the shell)."""
    base, _, fragment = url.partition("#")
    joined = base + ("&" if "?" in base else "?") + RUNTIME_QUERY
    return joined + (f"#{fragment}" if fragment else "")


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


class PageApi:
    """What the page's JavaScript may call (``window.pywebview.api``); every other attribute is private.

    pywebview offers these methods to whatever page the window shows, so each call first checks that the
    page comes from the app (the shell's own files, or the dev server it was told to load): a link that
    leads the window to another site must not reach the user's data.
    """

    def __init__(self, shell: DesktopShell) -> None:
        self._shell = shell

    def _guard(self) -> None:
        current = self._shell.current_url()
        if current is None or origin(current) not in self._shell.trusted_origins():
            raise OfflineError(
                f"a page from {origin(current or 'about:blank')} may not use this app's data",
                SHELL_ERROR,
                {"url": current},
            )

    def attach(self) -> bool:
        self._guard()
        self._shell.bridge.attach()
        return True

    def post(self, messages: list[str]) -> bool:
        self._guard()
        self._shell.bridge.post(list(messages))
        return True

    def state(self) -> dict[str, Any]:
        self._guard()
        return {**self._shell.bridge.state(), "appUrl": self._shell.app_url}

    def connect_server(self, url: str) -> dict[str, Any]:
        self._guard()
        return self._shell.bridge.connect_server(url)

    def stay_local(self) -> dict[str, Any]:
        self._guard()
        return self._shell.bridge.stay_local()

    def open_settings(self) -> bool:
        self._guard()
        self._shell.show_settings()
        return True


@dataclass
class DesktopShell:
    """One desktop app window. ``run()`` blocks until the window closes (the GUI owns the main thread)."""

    schema: SchemaDefinition
    build: BuildConfig
    web_dir: Path | None = None  # the page's files (the project's web/ or dist/)
    app_page_url: str | None = None  # or a dev server's URL (http://localhost:5173/) instead of web_dir
    actions: ModuleType | None = None
    directory: Path | None = None  # settings and database; default: the OS's per-user config folder
    sync_options: Mapping[str, Any] | None = None
    title: str | None = None
    width: int = 960
    height: int = 720

    def __post_init__(self) -> None:
        if self.web_dir is None and self.app_page_url is None:
            raise OfflineError("the desktop shell needs web_dir or app_page_url", SHELL_ERROR)
        if self.web_dir is not None and not (self.web_dir / "index.html").is_file():
            raise OfflineError(
                f"no index.html in {self.web_dir}: point the shell at the app's web folder (or build it)",
                SHELL_ERROR,
                {"path": str(self.web_dir)},
            )
        self.bridge = DesktopBridge(self._make_runtime, actions=self.actions, push=self._push)
        self.files_url = ""
        self.app_url = ""
        self._window: Any = None

    def _make_runtime(self) -> DesktopRuntime:
        return DesktopRuntime(
            self.schema, self.build, directory=self.directory, sync_options=self.sync_options
        )

    def page_url(self, view: str) -> str:
        """The shell's own page: ``setup`` (first launch) or ``settings`` (the settings control)."""
        return f"{self.files_url}{PAGES_PREFIX}setup.html?{RUNTIME_QUERY}&view={view}"

    def trusted_origins(self) -> set[str]:
        return {origin(url) for url in (self.files_url, self.app_url) if url}

    def current_url(self) -> str | None:
        window = self._window
        return None if window is None else window.get_current_url()

    def show_settings(self) -> None:
        if self._window is not None:
            self._window.load_url(self.page_url("settings"))

    def _push(self, messages: list[str]) -> None:
        window = self._window
        if window is None or not messages:
            return
        # JSON text is a JavaScript literal; the page may be between two documents, hence the guard.
        window.run_js(f"window.__offlineDesktop && window.__offlineDesktop.receive({json.dumps(messages)})")

    def run(self) -> None:
        webview = _import_webview()
        runtime = self.bridge.start()
        try:
            with serve_files(self.web_dir or _pages_dir()) as files_url:
                self.files_url = files_url
                self.app_url = with_runtime(self.app_page_url or f"{files_url}/index.html")
                first = self.page_url("setup") if runtime.launch.needs_setup else self.app_url
                log.info("desktop shell: %s (%s)", first, runtime.launch.mode)
                menus = importlib.import_module("webview.menu")
                menu = [menus.Menu("Sync", [menus.MenuAction("Sync settings…", self.show_settings)])]
                self._window = webview.create_window(
                    self.title or self.build.app_name,
                    url=first,
                    js_api=PageApi(self),
                    width=self.width,
                    height=self.height,
                    menu=menu,
                )
                with self._closed_by_signals():
                    webview.start(gui=_gui(), private_mode=True)
        finally:
            self._window = None
            self.bridge.stop()
            log.info("desktop app closed")

    @contextlib.contextmanager
    def _closed_by_signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT (a session logging out, `offline dev` stopping, Ctrl-C) close the window like
        its close button does, so sync says goodbye and the database is closed cleanly."""

        def close(signum: int, frame: object) -> None:
            window = self._window
            if window is not None:
                log.info("%s: closing the window", signal.Signals(signum).name)
                window.destroy()

        previous: dict[signal.Signals, Any] = {}
        try:
            for number in (signal.SIGTERM, signal.SIGINT):
                previous[number] = signal.signal(number, close)
        except ValueError:  # not the main thread: leave signals to whoever owns it
            pass
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


__all__ = ["INSTALL_HINT", "SHELL_ERROR", "DesktopShell", "PageApi", "serve_files", "with_runtime"]
