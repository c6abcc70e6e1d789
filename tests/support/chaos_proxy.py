"""A misbehaving WebSocket proxy for chaos tests: drops, duplicates and reorders protocol frames.

``ChaosProxy(upstream)`` listens on loopback; every client connection gets its own upstream connection (the
request path is kept) and two pumps forward text frames, each frame judged with one seeded ``random.Random``:

- dropped with probability ``drop``;
- sent twice with probability ``duplicate``;
- held back with probability ``reorder`` and sent right after the next frame in the same direction (or after
  ``hold`` seconds when no next frame comes, so a reorder never turns into a silent drop).

When the upstream goes away (the server was killed) or cannot be reached, the client side is closed so the
client reconnects; when the client goes away the upstream is closed. ``calm()`` stops the misbehaviour (frames
are then forwarded faithfully); ``counts`` says what the proxy did.

The proxy also keeps the books a chaos test needs to check durability: it remembers the operation ids of every
client->server ``operation-batch`` / ``operation`` it saw, by ``messageId``, and when the server's
``acknowledgment`` for that message passes (whether or not the proxy then drops it) those ids become
``acknowledged``: the server promised it had stored them. ``operation-rejected`` ids are kept in ``rejected``
(the server acknowledges a batch after refusing some of its operations).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidHandshake

C2S = "c2s"  # client -> server
S2C = "s2c"  # server -> client
_MAX_SIZE = 64 * 1024 * 1024


class ChaosProxy:
    def __init__(
        self,
        upstream: str,
        *,
        seed: int = 0,
        drop: float = 0.10,
        duplicate: float = 0.05,
        reorder: float = 0.05,
        hold: float = 0.05,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """``upstream``: ``ws://host:port`` of the real server (the client's request path is appended)."""
        self.upstream = upstream.rstrip("/")
        self.rng = random.Random(seed)
        self.drop = drop
        self.duplicate = duplicate
        self.reorder = reorder
        self.hold = hold
        self.host = host
        self.port = port
        self.chaotic = True
        self.counts: Counter[str] = Counter()
        # Bookkeeping of what the server acknowledged (see the module docstring).
        self.sent_batches: dict[str, list[str]] = {}
        self.acknowledged: set[str] = set()
        self.rejected: set[str] = set()
        self._targeted: Counter[tuple[str, str]] = Counter()  # (direction, message type) -> frames to drop
        self._server: Server | None = None
        self._links: set[tuple[ServerConnection, ClientConnection]] = set()

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> ChaosProxy:
        self._server = await serve(
            self._handle,
            self.host,
            self.port,
            compression=None,
            max_size=_MAX_SIZE,
            ping_interval=None,
        )
        sock = next(iter(self._server.sockets))
        self.port = int(sock.getsockname()[1])
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> ChaosProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """``ws://127.0.0.1:<port>`` (append the sync path)."""
        return f"ws://{self.host}:{self.port}"

    def calm(self) -> None:
        """Stop misbehaving: from now on every frame is forwarded once, in order (held frames still go out)."""
        self.chaotic = False

    def drop_next(self, direction: str, kind: str, count: int = 1) -> None:
        """Drop the next ``count`` frames of message type ``kind`` going ``direction`` (C2S or S2C), whatever
        ``calm()`` says: a targeted loss for a deterministic test."""
        self._targeted[(direction, kind)] += count

    async def reset(self) -> None:
        """Close every proxied connection at once (both sides), as a network outage would."""
        for client, upstream in list(self._links):
            await _close(client, 1012, "proxy reset")
            await _close(upstream, 1001, "proxy reset")

    @property
    def summary(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))

    # -- one proxied connection -------------------------------------------------------------------------------

    async def _handle(self, client: ServerConnection) -> None:
        self.counts["connections"] += 1
        path = client.request.path if client.request is not None else "/"
        try:
            upstream = await connect(
                self.upstream + path,
                open_timeout=2.0,
                compression=None,
                max_size=_MAX_SIZE,
                ping_interval=None,
            )
        except (OSError, TimeoutError, InvalidHandshake):
            # The server is down (killed, restarting): hang up so the client backs off and retries.
            self.counts["upstream_unreachable"] += 1
            await _close(client, 1013, "upstream unavailable")
            return
        link = (client, upstream)
        self._links.add(link)
        pumps = [
            asyncio.create_task(self._pump(client, upstream, C2S)),
            asyncio.create_task(self._pump(upstream, client, S2C)),
        ]
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            if pumps[1] in done:
                self.counts["upstream_closed"] += 1
        finally:
            for task in pumps:
                task.cancel()
            for task in pumps:
                with contextlib.suppress(BaseException):
                    await task
            self._links.discard(link)
            await _close(client, 1012, "upstream closed")
            await _close(upstream, 1001, "client closed")

    async def _pump(self, source: Any, target: Any, direction: str) -> None:
        held: list[str | bytes] = []  # a frame held back (with its duplicate, if any)
        try:
            while True:
                if held:
                    try:
                        frame = await asyncio.wait_for(source.recv(), self.hold)
                    except TimeoutError:
                        for item in held:  # nothing followed: let it go late rather than never
                            await target.send(item)
                        held = []
                        continue
                else:
                    frame = await source.recv()
                kind = self._observe(direction, frame)
                self.counts[f"frames_{direction}"] += 1
                if self._targeted[(direction, kind)] > 0:
                    self._targeted[(direction, kind)] -= 1
                    self.counts["dropped_on_request"] += 1
                    continue
                chaotic = self.chaotic
                if chaotic and self.rng.random() < self.drop:
                    self.counts["dropped"] += 1
                    self.counts[f"dropped_{direction}_{kind}"] += 1
                    continue
                copies = [frame]
                if chaotic and self.rng.random() < self.duplicate:
                    self.counts["duplicated"] += 1
                    copies.append(frame)
                if held:
                    for item in copies + held:
                        await target.send(item)
                    held = []
                    self.counts["reordered"] += 1
                    continue
                if chaotic and self.rng.random() < self.reorder:
                    held = copies
                    continue
                for item in copies:
                    await target.send(item)
        except ConnectionClosed:
            return

    # -- bookkeeping ------------------------------------------------------------------------------------------

    def _observe(self, direction: str, frame: str | bytes) -> str:
        """Keep the books on one frame; returns its message type."""
        try:
            message = json.loads(frame)
        except ValueError:
            return "other"
        if not isinstance(message, dict):
            return "other"
        kind = str(message.get("type"))
        if direction == C2S:
            if kind == "operation-batch":
                ops = message.get("operations") or []
                ids = [op["id"] for op in ops if isinstance(op, dict) and isinstance(op.get("id"), str)]
                self.sent_batches[str(message.get("messageId"))] = ids
                self.counts["operations_c2s"] += len(ids)
            elif kind == "operation":
                op = message.get("operation")
                if isinstance(op, dict) and isinstance(op.get("id"), str):
                    self.sent_batches[str(message.get("messageId"))] = [op["id"]]
        elif kind == "operation-batch":
            self.counts["operations_s2c"] += len(message.get("operations") or [])
        elif kind == "acknowledgment":
            ids = self.sent_batches.get(str(message.get("acknowledgedMessageId")))
            if ids is not None:
                self.counts["acknowledged_batches"] += 1
                self.acknowledged.update(ids)
        elif kind == "operation-rejected":
            self.rejected.add(str(message.get("operationId")))
        return kind


async def _close(ws: Any, code: int, reason: str) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ws.close(code, reason), 2.0)
