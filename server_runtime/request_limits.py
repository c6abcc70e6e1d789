"""ASGI middleware bounding what a request may cost before any route (or authentication) sees it.

Every HTTP request body is capped while it is read: ``max_body_bytes`` for every route except the backup
import, which has its own ``max_backup_body_bytes`` (see ``server_runtime.limits``). A ``Content-Length`` over
the cap is answered at once, without reading the body; a chunked body is counted as it streams and the request
is cut off where it passes the cap, so nothing past it is ever buffered. Either way the answer is 413 with
``{"error": {"code": "BODY_TOO_LARGE", ...}}`` and ``Connection: close`` (the rest of the upload is not read).

It also gives every request and WebSocket the server's `ProxyPolicy`, so `client_address` answers the same
for every per-address limit.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .client_address import POLICY_KEY, ProxyPolicy

__all__ = ["BACKUP_IMPORT_PATH", "BODY_TOO_LARGE", "RequestLimits"]

BODY_TOO_LARGE = "BODY_TOO_LARGE"
BACKUP_IMPORT_PATH = "/__offline/backup/import"


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
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            await _too_large(send, cap)
            return
        await _CappedRequest(self.app, scope, receive, send, cap).run()


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses it before an app runs; counting covers the rest
    return None


async def _too_large(send: Send, cap: int) -> None:
    body = json.dumps(
        {
            "error": {
                "code": BODY_TOO_LARGE,
                "message": f"the request body is larger than this route accepts ({cap} bytes); send less",
                "field": "body",
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                # The rest of the upload is not read: closing is cheaper than draining it.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _CappedRequest:
    """One request whose body is counted as the app reads it; past the cap the app sees a disconnect and the
    client a 413 (unless the app already started its answer, when the connection is just ended)."""

    __slots__ = ("app", "cap", "read", "receive", "refused", "scope", "send", "started")

    def __init__(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, cap: int) -> None:
        self.app = app
        self.scope = scope
        self.receive = receive
        self.send = send
        self.cap = cap
        self.read = 0
        self.started = False
        self.refused = False

    async def run(self) -> None:
        try:
            await self.app(self.scope, self._receive, self._send)
        except Exception:
            # What the app made of the disconnect it was handed (Starlette raises ClientDisconnect): the
            # request was answered already.
            if not self.refused:
                raise

    async def _receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self.receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.cap:
                self.refused = True
                if not self.started:
                    self.started = True
                    await _too_large(self.send, self.cap)
                return {"type": "http.disconnect"}
        return message

    async def _send(self, message: Message) -> None:
        if self.refused:
            return  # the 413 went out instead
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)
