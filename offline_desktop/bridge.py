"""The desktop shell's bridge between its pages and the app running natively in Python.

A browser runs the app in a Pyodide worker and talks to it with messages (`offline.worker`). The desktop shell
keeps the same page and the same messages, but the app runs in this process on the standard ``sqlite3``:

- the app lives on one asyncio event loop in a thread of its own (``DesktopRuntime`` and its sync engine);
- each page that attaches gets a `WorkerBridge` over that app (a reload or a visit to the settings page
  attaches a new one and retires the old one, whose late messages are dropped);
- what the bridge posts goes into an outbox that one sender thread hands to ``push`` in batches, so a slow
  GUI call never blocks the event loop, and a burst of messages costs one call.

The GUI toolkit stays outside: the shell passes ``push`` (deliver message texts to the page) and exposes the
public methods below to the page's JavaScript. Tests drive the same methods without any window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Coroutine
from types import ModuleType
from typing import Any, Final, TypeVar

from offline import OfflineError
from offline.worker import WorkerBridge

from .runtime import DesktopRuntime

log = logging.getLogger("offline_desktop")

T = TypeVar("T")
Push = Callable[[list[str]], None]

#: How long a page's call may wait for the app's event loop before it is told the app is not answering.
CALL_TIMEOUT: Final = 60.0
_STOP: Final = object()


class DesktopBridge:
    """Serves the shell's pages from one natively running app (see the module docstring)."""

    def __init__(
        self,
        make_runtime: Callable[[], DesktopRuntime],
        *,
        actions: ModuleType | None = None,
        push: Push | None = None,
    ) -> None:
        self._make_runtime = make_runtime
        self.actions = actions
        self.push: Push = push or (lambda _messages: None)
        self.runtime: DesktopRuntime | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._outbox: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._page: WorkerBridge | None = None
        self._page_post: Callable[[str], None] = lambda _text: None
        self._generation = 0  # bumped by every attach; messages of an older page are dropped

    # -- lifecycle (the shell's thread) ----------------------------------------------------------------------

    def start(self) -> DesktopRuntime:
        """Start the event loop thread, open the app there and start syncing when a URL is known."""
        if self._loop is not None:
            raise RuntimeError("the desktop bridge is already started")
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="offline-app", daemon=True)
        self._thread.start()
        self._sender = threading.Thread(target=self._send_forever, name="offline-push", daemon=True)
        self._sender.start()
        self.runtime = self._call(self._open())
        return self.runtime

    async def _open(self) -> DesktopRuntime:
        # Created on the loop's thread: the app, its connection and its sync engine belong to that loop.
        runtime = self._make_runtime()
        await runtime.start()
        return runtime

    def stop(self) -> None:
        """Retire the page, stop syncing, close the app and end both threads."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._close(), timeout=30.0)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._outbox.put(_STOP)
        if self._sender is not None:
            self._sender.join(10)
        loop.close()
        self._loop = None

    async def _close(self) -> None:
        if self._page is not None:
            self._page.detach()
            self._page = None
        if self.runtime is not None:
            await self.runtime.close()

    # -- what the page calls (any thread; each call waits for the app's loop) --------------------------------

    def attach(self) -> None:
        """A page loaded: give it a fresh bridge over the app; it receives ``ready`` and live updates."""
        self._call(self._attach())

    async def _attach(self) -> None:
        runtime = self._runtime()
        if self._page is not None:
            self._page.detach()
        self._generation += 1
        generation = self._generation

        def post(text: str) -> None:
            if generation == self._generation:
                self._outbox.put(text)

        self._page_post = post
        self._page = WorkerBridge(runtime.app, post=post, actions=self.actions)
        # Native SQLite is durable on commit: there is no browser storage to copy to (persist=None).
        await self._page.start(connect=True)

    def post(self, messages: list[str]) -> None:
        """Requests from the page (JSON texts, in the order it sent them); replies come through ``push``."""
        if not isinstance(messages, list) or not all(isinstance(m, str) for m in messages):
            raise OfflineError("the page must post a list of JSON texts", "INVALID_OPERATION")
        self._call(self._serve(messages))

    async def _serve(self, messages: list[str]) -> None:
        page = self._page
        if page is None:
            raise OfflineError("no page is attached; call attach() first", "INVALID_OPERATION")
        for text in messages:
            # Served in order: a write is done before the next request is read. Requests that wait on the
            # network (connect, an async action) run as tasks and reply when they finish.
            served = page.handle_now(text)
            if served is None:
                asyncio.get_running_loop().create_task(page.handle(text))
            else:
                self._page_post(served[1])

    def state(self) -> dict[str, Any]:
        """What the setup and settings page shows: the app, how it was launched, where it syncs."""
        return self._call(self._state())

    async def _state(self) -> dict[str, Any]:
        runtime = self._runtime()
        sync = runtime.app.sync
        error = getattr(sync, "last_error", None)
        return {
            "appName": runtime.build.app_name,
            "version": runtime.build.version,
            "mode": runtime.launch.mode,
            "syncUrl": runtime.sync_url,
            "fixedUrl": bool(runtime.build.sync_url),
            "status": sync.status,
            "error": error.message if isinstance(error, OfflineError) else None,
        }

    def connect_server(self, url: str) -> dict[str, Any]:
        """The setup screen's and the settings control's Connect: test ``url``, then save and sync."""
        return self._call(self._connect_server(url))

    async def _connect_server(self, url: str) -> dict[str, Any]:
        runtime = self._runtime()
        if not isinstance(url, str) or not url.strip():
            return {"ok": False, "code": "BAD_URL", "reason": "enter the server's address", "url": None}
        try:
            result = await runtime.use_server(url.strip())
        except OfflineError as exc:
            return {"ok": False, "code": exc.code, "reason": exc.message, "url": None}
        return {"ok": result.ok, "code": result.code, "reason": result.reason, "url": result.url}

    def stay_local(self) -> dict[str, Any]:
        """The setup screen's Skip: local-only from now on, until the user connects from the settings."""
        return self._call(self._stay_local())

    async def _stay_local(self) -> dict[str, Any]:
        self._runtime().stay_local()
        return await self._state()

    # -- plumbing ---------------------------------------------------------------------------------------------

    def _runtime(self) -> DesktopRuntime:
        if self.runtime is None:
            raise OfflineError("the app is not open yet", "INVALID_OPERATION")
        return self.runtime

    def _call(self, coroutine: Coroutine[Any, Any, T], *, timeout: float = CALL_TIMEOUT) -> T:
        if self._loop is None:
            coroutine.close()
            raise OfflineError("the desktop bridge is not started", "INVALID_OPERATION")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _send_forever(self) -> None:
        while True:
            first = self._outbox.get()
            if first is _STOP:
                return
            batch = [first]
            while True:
                try:
                    batch.append(self._outbox.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in batch
            texts = [text for text in batch if isinstance(text, str)]
            try:
                self.push(texts)
            except Exception:  # a page that went away mid-push: the next page asks afresh
                log.debug("could not deliver %d message(s) to the page", len(texts), exc_info=True)
            if stop:
                return
