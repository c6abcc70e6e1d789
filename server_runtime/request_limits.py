"""ASGI middleware bounding what a request may cost before any route (or authentication) sees it.

Every HTTP request body is capped while it is read: ``max_body_bytes`` for every route except the backup
import, which has its own ``max_backup_body_bytes`` (see ``server_runtime.limits``). A ``Content-Length`` over
the cap is answered at once, without reading the body; a chunked body is counted as it streams and the request
is cut off where it passes the cap, so nothing past it is ever buffered. Either way the answer is 413 with
``{"error": {"code": "BODY_TOO_LARGE", ...}}``. A route that answers without reading the whole body is treated
the same way: the rest of the upload is never read.

A small rest (``_DRAIN_BYTES`` declared, arriving within ``_DRAIN_SECONDS``) is read and dropped before the
answer instead, and the connection serves the next request: ending a connection its client is about to reuse
(nothing in the answer says it ends) makes that client's next request fail, and a POST is not retried.

Otherwise such a connection ends: the server stops reading, sends its answer and a FIN, and drops the connection
a moment later (``_LINGER``), so a client still uploading reads the answer before the reset that closing on
unread data causes. Under uvicorn the transport comes from `TransportInScope`; embedded elsewhere, the answer
carries ``Connection: close`` and the ASGI server closes as it sees fit.

It also gives every request and WebSocket the server's `ProxyPolicy`, so `client_address` answers the same
for every per-address limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .client_address import POLICY_KEY, ProxyPolicy
from .connection_gate import ConnectionGate

__all__ = ["BACKUP_IMPORT_PATH", "BODY_TOO_LARGE", "TRANSPORT_KEY", "RequestLimits", "TransportInScope"]

BODY_TOO_LARGE = "BODY_TOO_LARGE"
BACKUP_IMPORT_PATH = "/__offline/backup/import"
#: ASGI scope key of the connection's asyncio transport (set by `TransportInScope`).
TRANSPORT_KEY = "offline.transport"
# How long a connection whose upload is not read stays open after its answer, for the client to read it.
_LINGER = 2.0
# The most of an unread body read (and dropped) to keep its connection serving, and how long that may take.
_DRAIN_BYTES = 64 * 1024
_DRAIN_SECONDS = 1.0


class TransportInScope:
    """Outermost ASGI wrapper (under uvicorn, whose ``send`` is bound to the connection's cycle): puts the
    connection's transport in the scope, where middleware behind Starlette's own wrappers can reach it."""

    def __init__(self, app: ASGIApp, gate: ConnectionGate | None = None) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        if transport is not None:
            scope[TRANSPORT_KEY] = transport
            if self.gate is not None:
                self.gate.headed(transport)  # its request head arrived in time
        await self.app(scope, receive, send)


class RequestLimits:
    def __init__(self, app: ASGIApp, *, policy: ProxyPolicy, max_body: int, max_backup_body: int) -> None:
        self.app = app
        self.policy = policy
        self.max_body = max_body
        self.max_backup_body = max_backup_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        scope[POLICY_KEY] = self.policy
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.max_backup_body if scope.get("path") == BACKUP_IMPORT_PATH else self.max_body
        headers = scope.get("headers") or ()
        declared = _content_length(headers)
        request = _CappedRequest(self.app, scope, receive, send, cap)
        request.unread = bool(declared) or any(name == b"transfer-encoding" for name, _ in headers)
        if declared is not None and declared > cap:
            await request.refuse()
            return
        await request.run()


def _content_length(headers: Any) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses it before an app runs; counting covers the rest
    return None


def _linger(transport: Any) -> None:
    """Stop reading, finish sending (then FIN), and drop the connection shortly after."""
    with contextlib.suppress(Exception):
        transport.pause_reading()
    with contextlib.suppress(Exception):
        if transport.can_write_eof():
            transport.write_eof()
    asyncio.get_running_loop().call_later(_LINGER, transport.close)


class _CappedRequest:
    """One request whose body is counted as the app reads it; past the cap the app sees a disconnect and the
    client a 413 (unless the app already started its answer, when the connection is just ended)."""

    __slots__ = ("app", "cap", "read", "receive", "refused", "scope", "send", "started", "unread")

    def __init__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, cap: int) -> None:
        self.app = app
        self.scope = scope
        self.receive = receive
        self.send = send
        self.cap = cap
        self.read = 0
        self.started = False
        self.refused = False
        self.unread = False  # a body the app has not read to its end

    async def run(self) -> None:
        try:
            await self.app(self.scope, self._receive, self._send)
        except Exception:
            # What the app made of the disconnect it was handed (Starlette raises ClientDisconnect): the
            # request was answered already.
            if not self.refused:
                raise

    async def refuse(self) -> None:
        self.refused = True
        if self.started:
            transport = self.scope.get(TRANSPORT_KEY)
            if transport is not None:
                transport.close()  # mid-answer: nothing sensible can follow
            return
        self.started = True
        body = json.dumps(
            {
                "error": {
                    "code": BODY_TOO_LARGE,
                    "message": f"the request body is larger than this route accepts ({self.cap} bytes); "
                    "send less",
                    "field": "body",
                }
            }
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await self._answer({"type": "http.response.start", "status": 413, "headers": headers})
        await self._answer({"type": "http.response.body", "body": body, "more_body": False})

    async def _answer(self, message: Message) -> None:
        """Send, ending the connection after a last message that leaves part of the body unread."""
        transport = self.scope.get(TRANSPORT_KEY)
        if message["type"] == "http.response.start" and self.unread and transport is None:
            message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
        await self.send(message)
        if (
            message["type"] == "http.response.body"
            and not message.get("more_body", False)
            and self.unread
            and transport is not None
        ):
            _linger(transport)

    async def _receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self.receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            self.unread = bool(message.get("more_body", False))
            if self.read > self.cap:
                await self.refuse()
                return {"type": "http.disconnect"}
        return message

    async def _send(self, message: Message) -> None:
        if self.refused:
            return  # the 413 went out instead
        if message["type"] == "http.response.start":
            self.started = True
            if self.unread:
                await self._drain()
        await self._answer(message)

    async def _drain(self) -> None:
        """Read the rest of a small declared body the app left unread (see the module's docstring)."""
        declared = _content_length(self.scope.get("headers") or ())
        if declared is None or declared - self.read > _DRAIN_BYTES:
            return

        async def rest() -> None:
            while self.unread:
                message = await self.receive()
                if message["type"] != "http.request":
                    return  # (the client went away: the connection ends anyway)
                self.read += len(message.get("body", b""))
                self.unread = bool(message.get("more_body", False))

        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(rest(), _DRAIN_SECONDS)
