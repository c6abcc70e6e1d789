"""A transport over the browser's own ``WebSocket``, for the sync engine running under Pyodide.

Pyodide has no sockets, so the `websockets` package cannot connect; the worker's global ``WebSocket`` can.
Its events are turned into an asyncio queue the engine reads from. What the browser API does not tell:
the HTTP status of a refused upgrade (a 401 and a server that is down look the same, close code 1006), so
every failure to open is a `ConnectionLost` and the engine keeps retrying with backoff; refusals the server
sends inside the protocol (an error message after the upgrade) still end sync as on the desktop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from .transport import Connection, ConnectionLost

# WebSocket.readyState values (the browser's constants).
_CONNECTING, _OPEN = 0, 1
# A close code a page may send: 1000, or 3000-4999 (the browser throws on the protocol's own 1008, 1011).
_NORMAL = 1000
_MAX_REASON_BYTES = 123


def _browser_socket(url: str) -> Any:  # pragma: no cover - runs only under Pyodide
    import js  # type: ignore[import-not-found, unused-ignore]

    return js.WebSocket.new(url)


def _browser_proxy(function: Callable[..., Any]) -> Any:  # pragma: no cover - runs only under Pyodide
    from pyodide.ffi import create_proxy  # type: ignore[import-not-found, unused-ignore]

    return create_proxy(function)


class _Closed:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _close_reason(event: Any) -> str:
    code = getattr(event, "code", None)
    reason = getattr(event, "reason", "") or ""
    return f"the connection closed (code {code}{': ' + reason if reason else ''})"


class BrowserConnection:
    """One open browser WebSocket, as a `Connection` (text frames in, text frames out)."""

    def __init__(self, socket: Any, proxy: Callable[[Callable[..., Any]], Any]) -> None:
        self._socket = socket
        self._queue: asyncio.Queue[str | _Closed] = asyncio.Queue()
        self._closed: str | None = None
        # The JS side holds these callbacks; they are released (destroyed) when the socket closes.
        self._handlers = {
            "message": proxy(self._on_message),
            "close": proxy(self._on_close),
        }
        for name, handler in self._handlers.items():
            socket.addEventListener(name, handler)

    def _on_message(self, event: Any) -> None:
        data = event.data
        if isinstance(data, str):
            self._queue.put_nowait(data)
        else:  # the protocol is JSON text; a binary frame is a broken peer
            self._queue.put_nowait(_Closed("the server sent a binary frame; the sync protocol is text"))

    def _on_close(self, event: Any) -> None:
        if self._closed is None:
            self._closed = _close_reason(event)
            self._queue.put_nowait(_Closed(self._closed))
        self._release()

    def _release(self) -> None:
        handlers, self._handlers = self._handlers, {}
        for name, handler in handlers.items():
            with contextlib.suppress(Exception):
                self._socket.removeEventListener(name, handler)
            destroy = getattr(handler, "destroy", None)
            if destroy is not None:
                with contextlib.suppress(Exception):
                    destroy()

    async def send(self, text: str) -> None:
        if self._closed is not None or self._socket.readyState != _OPEN:
            raise ConnectionLost(self._closed or "the connection is not open")
        try:
            self._socket.send(text)
        except Exception as exc:  # a JS exception (the socket closed under us)
            raise ConnectionLost(f"sending failed: {exc}") from exc

    async def recv(self) -> str:
        item = await self._queue.get()
        if isinstance(item, _Closed):
            self._queue.put_nowait(item)  # every later recv() fails the same way
            raise ConnectionLost(item.reason)
        return item

    async def close(self, code: int = _NORMAL, reason: str = "") -> None:
        if code != _NORMAL and not 3000 <= code <= 4999:
            # Keep the protocol's reason: 4000 + the code ("4008 AUTH_FAILED") is in the range pages may use.
            code = 4000 + code % 1000
        data = reason.encode("utf-8")[:_MAX_REASON_BYTES]
        with contextlib.suppress(Exception):  # closing must never hide why we are closing
            self._socket.close(code, data.decode("utf-8", "ignore"))
        if self._closed is None:
            self._closed = "closed by this client"
            self._queue.put_nowait(_Closed(self._closed))
        self._release()


class BrowserWebSocketTransport:
    """`Transport` over the browser's ``WebSocket`` (selected automatically under Pyodide).

    ``socket_factory(url)`` and ``proxy(function)`` default to the browser's ``WebSocket`` and Pyodide's
    ``create_proxy``; tests on CPython pass objects with the same event API.
    """

    def __init__(
        self,
        *,
        open_timeout: float = 10.0,
        socket_factory: Callable[[str], Any] | None = None,
        proxy: Callable[[Callable[..., Any]], Any] | None = None,
    ) -> None:
        self.open_timeout = open_timeout
        self._factory = socket_factory or _browser_socket
        self._proxy = proxy or _browser_proxy

    async def connect(self, url: str) -> Connection:
        try:
            socket = self._factory(url)
        except Exception as exc:  # a SyntaxError DOMException: not a ws:// or wss:// URL
            raise ConnectionLost(f"cannot open a WebSocket to {url}: {exc}") from exc
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()

        def on_open(_: Any) -> None:
            if not opened.done():
                opened.set_result(None)

        def on_close(event: Any) -> None:
            if not opened.done():
                opened.set_exception(ConnectionLost(f"cannot connect to {url}: {_close_reason(event)}"))

        handlers = {"open": self._proxy(on_open), "close": self._proxy(on_close)}
        for name, handler in handlers.items():
            socket.addEventListener(name, handler)
        # Listening for messages from the start: a server may write right after the upgrade.
        connection = BrowserConnection(socket, self._proxy)
        try:
            await asyncio.wait_for(opened, self.open_timeout)
        except TimeoutError:
            await connection.close()
            raise ConnectionLost(f"cannot connect to {url}: no answer within {self.open_timeout} s") from None
        except ConnectionLost:
            await connection.close()
            raise
        finally:
            for name, handler in handlers.items():
                with contextlib.suppress(Exception):
                    socket.removeEventListener(name, handler)
                destroy = getattr(handler, "destroy", None)
                if destroy is not None:
                    with contextlib.suppress(Exception):
                        destroy()
        return connection


__all__ = ["BrowserConnection", "BrowserWebSocketTransport"]
