"""Shared machinery of the browser tests (and bench/browser.py): tools, the built template, a live server,
and a guard that records every request trying to leave loopback.

The guard works at two levels, because neither sees everything alone:

- Chromium is started with ``--proxy-server`` pointing at `LeakRecorder`, a loopback TCP server that records
  the request line of whatever reaches it and answers 403. Chromium never proxies loopback, so only traffic
  bound elsewhere arrives there: from the page, its workers, its service worker, WebSockets included.
- Every browser context routes all requests through `NetworkGuard.route`, which aborts and records any URL
  whose host is not loopback (with ``PW_EXPERIMENTAL_SERVICE_WORKER_NETWORK_EVENTS`` set, the service worker's
  own fetches pass through it too), and records every WebSocket the pages open.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: `offline init`'s project template (its todos.py: the actions the worker tests call).
TEMPLATE = ROOT / "offline_cli" / "templates" / "project"
CACHE = Path(os.environ.get("OFFLINE_TEST_CACHE", Path.home() / ".cache" / "offline-tests"))
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--metrics-recording-only",
    "--disable-features=AutofillServerCommunication,OptimizationHintsFetching,Translate,MediaRouter",
]
#: Chromium's own service traffic (component and extension updates, account and autofill lookups), which the
#: flags above do not silence completely. It reaches the recorder but comes from the browser, not the app:
#: reported, not failed. A page or worker request to these hosts is still caught by the route handler.
CHROMIUM_SERVICE_HOSTS = frozenset(
    {
        "accounts.google.com",
        "clients2.google.com",
        "clientservices.googleapis.com",
        "content-autofill.googleapis.com",
        "optimizationguide-pa.googleapis.com",
        "redirector.gvt1.com",
        "safebrowsing.googleapis.com",
        "update.googleapis.com",
    }
)
EXPECT_TIMEOUT_MS = 30_000
#: Sync engine settings that make reconnects quick in tests (the bench uses the defaults).
FAST_SYNC = {"backoff_initial": 0.05, "backoff_max": 0.5, "ack_timeout": 2.0, "handshake_timeout": 10.0}
T = TypeVar("T")


# -- tools ----------------------------------------------------------------------------------------------------------


def chromium_path() -> str | None:
    for candidate in (os.environ.get("OFFLINE_TEST_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def missing_tools() -> list[str]:
    """What the browser tests need and this machine lacks (empty: everything is there)."""
    problems = []
    if importlib.util.find_spec("playwright") is None:
        problems.append("the Python package 'playwright' is not installed (pip install -e '.[test]')")
    if chromium_path() is None:
        problems.append("Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium)")
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not on PATH (install Node.js 20 or newer)")
    return problems


def require_tools() -> str:
    """The Chromium executable; missing tools skip the test with the reason, or fail it under CI."""
    problems = missing_tools()
    if problems:
        reason = "cannot run the browser client tests: " + "; ".join(problems)
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI must run these tests)", pytrace=False)
        print(f"SKIPPED: {reason}", file=sys.stderr)
        pytest.skip(reason)
    path = chromium_path()
    assert path is not None
    return path


# -- the template project -------------------------------------------------------------------------------------------


def init_project(parent: Path, name: str = "todo-app", *, sync_url: str = "/offline-sync") -> Path:
    """`offline init` (npm install + build) into ``parent/name``, with npm's cache kept between runs."""
    env = dict(os.environ)
    env.update(
        {
            "BUILD_SYNC_URL": sync_url,
            "npm_config_cache": str(CACHE / "npm"),
            "npm_config_prefer_offline": "true",
            "npm_config_update_notifier": "false",
            "OFFLINE_PYTHON": sys.executable,
            "PYTHONPATH": str(ROOT),
        }
    )
    project = parent / name
    done = subprocess.run(
        [sys.executable, "-m", "offline_cli", "init", str(project)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"offline init failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    assert (project / "dist" / "index.html").is_file(), done.stdout
    return project


def copy_project(project: Path, target: Path) -> Path:
    """A copy of a built project to change and build again: without its build (dist/) and databases, with its
    node_modules (whose packages keep their own dist/ folders: yjs's modules are there)."""

    def leave_out(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n.endswith(".db") or (n == "dist" and Path(folder) == project)}

    shutil.copytree(project, target, ignore=leave_out, symlinks=True)
    return target


def load_module(path: Path, name: str) -> Any:
    """Import a project's module (schema.py, todos.py) the way the browser does: by file, by name."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def project_modules(project: Path) -> tuple[Any, Any]:
    """The project's schema and todos modules, as a desktop client imports them."""
    schema = load_module(project / "schema.py", "todo_app_schema")
    todos = load_module(project / "todos.py", "todo_app_todos")
    return schema.schema, todos


# A page script's expression for opening the page's IndexedDB database ``offline:<name>`` (a variable
# `name` in scope) as web/storage.js makes it: its stores created if it is new.
OPEN_PAGE_DATABASE = """new Promise((resolve, reject) => {
    const request = indexedDB.open(`offline:${name}`, 1);
    request.onupgradeneeded = () => {
      request.result.createObjectStore("chunks");
      request.result.createObjectStore("meta");
    };
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  })"""


def database_name(project: Path) -> str:
    """The name the project's page keeps its database under (``offline:NAME`` in IndexedDB, OPFS folder)."""
    return str(json.loads((project / "package.json").read_text())["offline"]["database"])


def run_node_script(name: str, *args: str, timeout: float = 60) -> Any:
    """Run tests/js/``name`` with Node.js and return what it printed, as JSON (skips without node)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    script = ROOT / "tests" / "js" / name
    done = subprocess.run([node, str(script), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{name} failed ({done.returncode}): {done.stderr[-4000:]}"
    return json.loads(done.stdout)


# -- a live server --------------------------------------------------------------------------------------------------


@dataclass
class LiveServer:
    server: Any
    store: Any
    loop: asyncio.AbstractEventLoop
    url: str

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + "/offline-sync"

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def records(self, collection: str) -> list[dict[str, Any]]:
        """The server's materialised records of ``collection`` (alive ones), by id."""

        async def read() -> list[dict[str, Any]]:
            rows = [row async for row in self.store.load_all_rows()]
            return sorted(
                (dict(r.record) for r in rows if r.collection == collection and r.record is not None),
                key=lambda record: record["id"],
            )

        return self.call(read())  # type: ignore[no-any-return]


async def seed_todos(store: Any, schema: Any, count: int) -> None:
    """Write ``count`` to-dos of the template's schema straight into a server store (before it serves)."""
    from bench.seeding import insert_chunks

    def data(i: int) -> dict[str, Any]:
        return {"title": f"seeded {i:06d}", "done": i % 3 == 0, "createdAt": 1_700_000_000_000 + i}

    for ops, rows in insert_chunks(schema, count, data):
        async with store.writer() as writer:
            await writer.append([(op, None) for op in ops])
            await writer.save_rows(rows)


@contextlib.contextmanager
def live_server(
    schema: Any,
    static_dir: Path | None,
    db_path: Path,
    *,
    seed_count: int = 0,
    limits: Mapping[str, Any] | None = None,
) -> Iterator[LiveServer]:
    """`create_production_server` on a free loopback port serving ``static_dir``, in its own thread; its
    store starts with ``seed_count`` to-dos (see `seed_todos`); ``limits``: the server's (by field name)."""
    from server_runtime import create_production_server
    from server_runtime.stores import create_sqlite_server_store

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="browser-test-server", daemon=True)
    thread.start()

    async def start() -> tuple[Any, Any, str]:
        store = create_sqlite_server_store(str(db_path))
        await store.set_schema(schema)
        if seed_count:
            await seed_todos(store, schema, seed_count)
        server = create_production_server(
            store=store,
            port=0,
            host="127.0.0.1",
            static_dir=str(static_dir) if static_dir else None,
            sync_options={"limits": dict(limits)} if limits else None,
        )
        return server, store, await server.start()

    # (seeding a large log takes a while on a busy machine)
    server, store, url = asyncio.run_coroutine_threadsafe(start(), loop).result(30 + seed_count / 100)
    live = LiveServer(server, store, loop, url.rstrip("/"))
    try:
        yield live
    finally:

        async def stop() -> None:
            try:
                await server.stop()
            finally:
                await store.close()

        try:
            live.call(stop())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


# -- the network guard ----------------------------------------------------------------------------------------------


class LeakRecorder:
    """A loopback 'proxy' that records each request it gets (all of them tried to leave loopback) and refuses it."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.browser_own: list[str] = []  # Chromium's own service traffic (see CHROMIUM_SERVICE_HOSTS)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="leak-recorder", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                head = b""
                with contextlib.suppress(OSError):
                    while b"\r\n" not in head and len(head) < 8192:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        head += chunk
                if head:
                    line = head.split(b"\r\n", 1)[0].decode("latin-1")
                    (
                        self.browser_own if _request_host(line) in CHROMIUM_SERVICE_HOSTS else self.requests
                    ).append(line)
                with contextlib.suppress(OSError):
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self._closed = True
        # Closing the listening socket does not wake a thread blocked in accept() on Linux (the join waited its
        # whole 5 s after every browser); shutting it down makes accept() fail at once, while a request being
        # read is still read to its end and recorded before the thread ends.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        self._sock.close()


def _request_host(line: str) -> str:
    """The host of a proxy request line: ``CONNECT host:443 HTTP/1.1`` or ``GET http://host/path HTTP/1.1``."""
    parts = line.split()
    target = parts[1] if len(parts) > 1 else ""
    if parts and parts[0] == "CONNECT":
        return target.rsplit(":", 1)[0].strip("[]")
    return urllib.parse.urlsplit(target).hostname or ""


def _loopback(url: str) -> bool:
    if url.startswith(("data:", "blob:", "about:", "chrome:", "chrome-extension:")):
        return True
    return (urllib.parse.urlsplit(url).hostname or "") in LOOPBACK


@dataclass
class NetworkGuard:
    recorder: LeakRecorder
    left_loopback: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    websockets: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    async def route(self, route: Any) -> None:
        url = route.request.url
        self.requests.append(url)
        if _loopback(url):
            await route.continue_()
        else:
            self.left_loopback.append(url)
            await route.abort("blockedbyclient")

    def watch(self, page: Any) -> None:
        page.on("websocket", lambda ws: self.websockets.append(ws.url))
        page.on("pageerror", lambda error: self.page_errors.append(str(error)))

    def check(self) -> None:
        """Fail when anything tried to leave loopback (or no request was seen at all: a broken guard)."""
        leaks = self.left_loopback + [u for u in self.websockets if not _loopback(u)] + self.recorder.requests
        assert leaks == [], f"requests that tried to leave loopback: {leaks}"
        assert self.requests, "the route handler saw no requests at all"
        assert self.page_errors == [], f"JavaScript errors on the page: {self.page_errors}"


@contextlib.asynccontextmanager
async def guarded_browser(executable: str) -> AsyncIterator[tuple[Any, NetworkGuard]]:
    """Headless Chromium whose traffic off loopback is recorded; yields (browser, guard).

    The caller creates contexts with `new_context(browser, guard)`; `guard.check()` runs on the way out.
    """
    from playwright.async_api import async_playwright, expect

    # Every DOM assertion may wait this long (Playwright's default, 5 s, is short on a loaded machine).
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    # Read by the Playwright driver when it starts: route the service worker's requests too.
    os.environ["PW_EXPERIMENTAL_SERVICE_WORKER_NETWORK_EVENTS"] = "1"
    recorder = LeakRecorder()
    guard = NetworkGuard(recorder)
    try:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=executable,
                headless=True,
                args=[*CHROMIUM_ARGS, f"--proxy-server=http://127.0.0.1:{recorder.port}"],
            )
            try:
                yield browser, guard
            finally:
                await browser.close()
    finally:
        recorder.close()
    if recorder.browser_own:
        hosts = sorted({_request_host(line) for line in recorder.browser_own})
        print(f"note: Chromium's own service requests were refused: {', '.join(hosts)}", file=sys.stderr)
    guard.check()


async def new_context(browser: Any, guard: NetworkGuard, **options: Any) -> Any:
    """A browser context every request of which goes through ``guard``; ``options`` (Playwright's) replace
    the defaults (a 900x800 viewport, service workers allowed)."""
    context = await browser.new_context(
        **{"viewport": {"width": 900, "height": 800}, "service_workers": "allow", **options}
    )
    await context.route("**/*", guard.route)
    context.on("page", guard.watch)
    return context


def run_in_browser(
    chromium: str,
    project: Path,
    tmp_path: Path,
    scenario: Callable[[Any, str], Awaitable[T]],
    *,
    seed_count: int = 0,
    limits: Mapping[str, Any] | None = None,
    **context_options: Any,
) -> T:
    """Serve ``project``'s build from a live server (its store in ``tmp_path``, seeded with ``seed_count``
    to-dos; ``limits``: the server's, as `live_server` takes them) and run ``scenario(context, base URL)`` in
    a new context (`new_context`, with ``context_options``) of a guarded headless Chromium."""
    schema = load_module(project / "schema.py", "todo_app_schema").schema

    async def guarded(base: str) -> T:
        async with guarded_browser(chromium) as (browser, guard):
            return await scenario(await new_context(browser, guard, **context_options), base)

    with live_server(
        schema, project / "dist", tmp_path / "server.db", seed_count=seed_count, limits=limits
    ) as live:
        return asyncio.run(guarded(live.url))


def wrapped_worker(prelude: str) -> str:
    """An init script making the page's workers run ``prelude`` (JavaScript; ``workerScript`` is the URL of
    the worker's own script) before their own script. An init script runs in pages only, not in workers:
    it wraps the page's Worker, which starts a module worker of the prelude and an import of the script."""
    return _WRAPPED_WORKER.replace("PRELUDE", json.dumps(prelude))


_WRAPPED_WORKER = """
(() => {
  const Real = window.Worker;
  const prelude = PRELUDE;
  window.Worker = class extends Real {
    constructor(url, options) {
      const script = new URL(url, location.href).href;
      const source =
        `const workerScript = ${JSON.stringify(script)};\\n` + prelude + "\\nawait import(workerScript);";
      super(URL.createObjectURL(new Blob([source], { type: "text/javascript" })), options);
    }
  };
})();
"""
