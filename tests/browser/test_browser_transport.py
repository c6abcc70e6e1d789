"""`BrowserWebSocketTransport` on CPython, through an object with the browser's WebSocket API.

`BrowserLikeWebSocket` behaves like the browser's ``WebSocket`` as the transport uses it (``readyState``,
``addEventListener`` for open/message/close, ``send``, ``close(code, reason)`` refusing the codes a page may
not send, a failed open reported as a close with code 1006) and carries frames over a real connection made
with the `websockets` package, so the sync engine runs on it against a live server. In a real browser the
transport is exercised by test_browser_client.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from offline import create_app, define_schema, t
from offline.sync.browser_transport import BrowserWebSocketTransport
from offline.sync.transport import ConnectionLost, default_transport

from .support import FAST_SYNC, live_server

SCHEMA = define_schema({"version": 1, "collections": {"notes": {"fields": {"body": t.string()}}}})
CONNECTING, OPEN, CLOSING, CLOSED = 0, 1, 2, 3


class BrowserLikeWebSocket:
    def __init__(self, url: str) -> None:
        self.url = url
        self.readyState = CONNECTING
        self.sent_close: tuple[int, str] | None = None
        self._listeners: dict[str, list[Callable[[Any], None]]] = {}
        self._ws: Any = None
        self._task = asyncio.get_running_loop().create_task(self._run())

    def addEventListener(self, name: str, handler: Callable[[Any], None]) -> None:
        self._listeners.setdefault(name, []).append(handler)

    def removeEventListener(self, name: str, handler: Callable[[Any], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.get(name, []).remove(handler)

    def _dispatch(self, name: str, **fields: Any) -> None:
        for handler in list(self._listeners.get(name, [])):
            handler(SimpleNamespace(type=name, **fields))

    async def _run(self) -> None:
        from websockets.asyncio.client import connect

        try:
            self._ws = await connect(self.url, compression=None)
        except Exception:
            self.readyState = CLOSED
            self._dispatch("error")
            self._dispatch("close", code=1006, reason="", wasClean=False)
            return
        self.readyState = OPEN
        self._dispatch("open")
        code, reason = 1006, ""
        try:
            async for frame in self._ws:
                self._dispatch("message", data=frame)
        except Exception:
            pass
        finally:
            if self._ws.close_code is not None:
                code, reason = self._ws.close_code, self._ws.close_reason or ""
            self.readyState = CLOSED
            self._dispatch("close", code=code, reason=reason, wasClean=code != 1006)

    def send(self, text: str) -> None:
        if self.readyState == CONNECTING:
            raise RuntimeError("InvalidStateError: still in CONNECTING state")
        if self.readyState == OPEN:
            asyncio.get_running_loop().create_task(self._ws.send(text))

    def close(self, code: int = 1000, reason: str = "") -> None:
        if code != 1000 and not 3000 <= code <= 4999:
            raise RuntimeError(f"InvalidAccessError: the close code {code} is neither 1000 nor in 3000-4999")
        if len(reason.encode()) > 123:
            raise RuntimeError("SyntaxError: the close reason is longer than 123 bytes")
        self.sent_close = (code, reason)
        if self.readyState == OPEN:
            self.readyState = CLOSING
            asyncio.get_running_loop().create_task(self._ws.close(code, reason))


def browser_transport(sockets: list[BrowserLikeWebSocket] | None = None) -> BrowserWebSocketTransport:
    def factory(url: str) -> BrowserLikeWebSocket:
        socket = BrowserLikeWebSocket(url)
        if sockets is not None:
            sockets.append(socket)
        return socket

    return BrowserWebSocketTransport(socket_factory=factory, proxy=lambda function: function, open_timeout=5)


def test_the_platform_picks_its_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    assert type(default_transport()).__name__ == "WebSocketTransport"
    monkeypatch.setattr("sys.platform", "emscripten")
    assert isinstance(default_transport(), BrowserWebSocketTransport)


def test_sync_runs_over_the_browser_api_and_converges_with_a_desktop_client(tmp_path: Path) -> None:
    sockets: list[BrowserLikeWebSocket] = []
    with live_server(SCHEMA, None, tmp_path / "server.db") as live:

        async def scenario() -> None:
            browser = create_app(
                SCHEMA,
                sync={"url": live.ws_url, "transport": browser_transport(sockets), **FAST_SYNC},
                path=str(tmp_path / "browser.db"),
            )
            desktop = create_app(
                SCHEMA, sync={"url": live.ws_url, **FAST_SYNC}, path=str(tmp_path / "desktop.db")
            )
            try:
                await browser.sync.connect()
                await desktop.sync.connect()
                browser.notes.insert({"body": "from the browser transport"})
                desktop.notes.insert({"body": "from the desktop"})
                await browser.sync.wait_until_synced(15)
                await desktop.sync.wait_until_synced(15)
                for _ in range(200):
                    if len(browser.notes.where({}).fetch()) == 2 == len(desktop.notes.where({}).fetch()):
                        break
                    await asyncio.sleep(0.02)
                assert browser.notes.where({}).fetch() == desktop.notes.where({}).fetch()
                assert len(browser.notes.where({}).fetch()) == 2

                # The server goes away under an open socket: the engine notices and reconnects.
                first = sockets[-1]
                await first._ws.close(1001, "going away")
                for _ in range(200):
                    if len(sockets) > 1 and browser.sync.status == "connected":
                        break
                    await asyncio.sleep(0.02)
                assert len(sockets) > 1 and browser.sync.status == "connected"
                browser.notes.insert({"body": "after the reconnect"})
                await browser.sync.wait_until_synced(15)
            finally:
                await browser.sync.disconnect()
                await desktop.sync.disconnect()
                browser.close()
                desktop.close()
            assert sockets[-1].sent_close == (1000, "client disconnect")

        asyncio.run(scenario())
        assert sorted(r["body"] for r in live.records("notes")) == [
            "after the reconnect",
            "from the browser transport",
            "from the desktop",
        ]


def test_a_failed_open_is_a_lost_connection_and_protocol_close_codes_are_mapped(tmp_path: Path) -> None:
    async def scenario() -> None:
        sockets: list[BrowserLikeWebSocket] = []
        transport = browser_transport(sockets)
        with pytest.raises(ConnectionLost, match="code 1006"):
            await transport.connect("ws://127.0.0.1:9/offline-sync")  # nothing listens there

        with live_server(SCHEMA, None, tmp_path / "server.db") as live:
            connection = await transport.connect(live.ws_url)
            # The engine closes with protocol codes (1008 policy, 1011 error) a page may not send.
            await connection.close(1008, "AUTH_FAILED " + "x" * 200)
            code, reason = sockets[-1].sent_close or (0, "")
            assert code == 4008 and reason.startswith("AUTH_FAILED") and len(reason.encode()) <= 123
            with pytest.raises(ConnectionLost):
                await connection.recv()
            with pytest.raises(ConnectionLost):
                await connection.send("{}")
            await asyncio.sleep(0.05)

    asyncio.run(scenario())
