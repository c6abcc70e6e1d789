"""Transports carry protocol frames; the sync engine does not care which one it has.

`WebSocketTransport` uses the `websockets` package (desktop, server-side tests); the browser build supplies
its own transport over the page's WebSocket.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Protocol


class ConnectionLost(Exception):
    """The connection closed or failed; the engine reconnects."""


class TransportRefused(Exception):
    """The server refused the connection before the protocol started (e.g. HTTP 401/403/404)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Connection(Protocol):
    async def send(self, text: str) -> None: ...

    async def recv(self) -> str: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class Transport(Protocol):
    async def connect(self, url: str) -> Connection: ...


class _WebSocketConnection:
    def __init__(self, ws: Any) -> None:
        self._ws = ws

    async def send(self, text: str) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self._ws.send(text)
        except ConnectionClosed as exc:
            raise ConnectionLost(str(exc)) from exc

    async def recv(self) -> str:
        from websockets.exceptions import ConnectionClosed

        try:
            frame = await self._ws.recv()
        except ConnectionClosed as exc:
            raise ConnectionLost(str(exc)) from exc
        return frame if isinstance(frame, str) else frame.decode("utf-8", "replace")

    async def close(self, code: int = 1000, reason: str = "") -> None:
        # Closing a broken socket must never mask the reason we are closing it.
        with contextlib.suppress(Exception):
            await self._ws.close(code, reason)


class WebSocketTransport:
    def __init__(
        self, *, open_timeout: float = 10.0, max_size: int = 8 * 1024 * 1024, **options: Any
    ) -> None:
        self.open_timeout = open_timeout
        self.max_size = max_size
        self.options = options

    async def connect(self, url: str) -> Connection:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

        try:
            ws = await connect(url, open_timeout=self.open_timeout, max_size=self.max_size, **self.options)
        except InvalidStatus as exc:
            status = exc.response.status_code
            raise TransportRefused(f"{url} answered HTTP {status}", status) from exc
        except InvalidURI as exc:
            raise TransportRefused(f"{url} is not a ws:// or wss:// URL") from exc
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise ConnectionLost(f"cannot connect to {url}: {exc}") from exc
        return _WebSocketConnection(ws)


def default_transport() -> Transport:
    """The platform's WebSocket: the browser's own under Pyodide (no sockets there), else `websockets`."""
    if sys.platform == "emscripten":
        from .browser_transport import BrowserWebSocketTransport

        return BrowserWebSocketTransport()
    return WebSocketTransport(compression=None)
