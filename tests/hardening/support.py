"""Shared pieces of the hardening tests: the schema, protocol-level clients, a bare-socket WebSocket peer (one
that can stop reading or answering), and views into a running server process (status, RSS)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from offline import HybridLogicalClock, create_operation
from offline.core.uuid7 import generate_uuid_v7
from offline.sync import protocol as p
from tests.support.servers import ServerProcess, schema_from_source, write_entry

SCHEMA_SOURCE = """
from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "ownerId": t.string(),
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "n": t.number().default(0),
                }
            },
            "boards": {"fields": {"name": t.string(), "rank": t.number().optional()}},
        },
        # boards: shared by everyone; todos: each user's own (the access token's subject).
        "sync": {"todos": {"where": {"ownerId": "userId"}}, "boards": {"where": {}}},
    }
)
"""


SCHEMA = schema_from_source(SCHEMA_SOURCE)
TIMEOUT = 30.0


def start_server(
    folder: Path, *, store: str = "sqlite", db: str | None = None, env: dict[str, str] | None = None
) -> ServerProcess:
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / "server.py"
    if not entry.exists():
        write_entry(folder, SCHEMA_SOURCE)
    return ServerProcess(entry, store=store, db=db, env=env).start()


async def sign_up(http: httpx.AsyncClient, email: str) -> tuple[str, str, str]:
    """A new user of a server with ``AUTH_SECRET`` set: (user id, access token, refresh token)."""
    response = await http.post("/auth/sign-up", json={"email": email, "password": "fuzzing password 1"})
    assert response.status_code == 201, response.text
    body = response.json()
    return body["user"]["id"], body["accessToken"], body["refreshToken"]


# -- operations ------------------------------------------------------------------------------------------------


class Writer:
    """Builds this node's operations (valid ids, increasing sequence numbers) as wire dicts."""

    def __init__(self, node: str | None = None) -> None:
        self.node = node or generate_uuid_v7()
        self.clock = HybridLogicalClock(self.node)
        self.sequence = 0

    def op(
        self,
        collection: str,
        data: dict[str, Any] | None,
        *,
        record_id: str | None = None,
        kind: str = "insert",
        **overrides: Any,
    ) -> dict[str, Any]:
        self.sequence += 1
        spec: dict[str, Any] = {
            "node_id": self.node,
            "type": kind,
            "collection": collection,
            "record_id": record_id or generate_uuid_v7(),
            "data": data,
            "timestamp": self.clock.now(),
            "sequence_number": self.sequence,
            "schema_version": SCHEMA.version,
            **({"previous_data": {}} if kind == "update" else {}),
            **overrides,
        }
        wire: dict[str, Any] = create_operation(spec).to_wire()
        return wire


# -- protocol clients --------------------------------------------------------------------------------------------


@dataclass
class RawClient:
    """A protocol-level client over a real WebSocket: handshake, push batches, read what the server sends.

    A background reader files every message: relay batches (acknowledged when ``auto_ack``), acknowledgements
    (resolving `push`), rejections and errors; ``closed`` holds the close code once the server closes."""

    url: str
    token: str | None = None
    scope: dict[str, Any] | None = None
    auto_ack: bool = True
    writer: Writer = field(default_factory=Writer)
    received: list[dict[str, Any]] = field(default_factory=list)  # relayed operations
    batches: int = 0
    last_delivery: int = 0  # the highest delivery sequence of the relay batches received
    rejections: list[p.OperationRejected] = field(default_factory=list)
    errors: list[p.ErrorMessage] = field(default_factory=list)
    closed: int | None = None
    close_reason: str = ""
    reply: p.HandshakeResponse | None = None
    ws: ClientConnection | None = None
    _acks: dict[str, asyncio.Future[p.Acknowledgment]] = field(default_factory=dict)
    _reader: asyncio.Task[None] | None = None
    _ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def open(self, after: int = 0, **connect: Any) -> p.HandshakeResponse:
        self.ws = await ws_connect(self.url, max_size=None, **connect)
        hello = p.Handshake(
            message_id=p.new_message_id(),
            node_id=self.writer.node,
            version_vector={},
            schema_version=SCHEMA.version,
            last_delivery_sequence=after,
            auth_token=self.token,
            sync_scope=self.scope,
        )
        await self.ws.send(p.encode(hello))
        reply = p.decode(await asyncio.wait_for(self.ws.recv(), TIMEOUT))
        if not isinstance(reply, p.HandshakeResponse) or not reply.accepted:
            raise AssertionError(f"handshake refused: {reply}")
        self.reply = reply
        self._reader = asyncio.create_task(self._read())
        return reply

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for frame in self.ws:
                message = p.decode(frame)
                if isinstance(message, p.OperationBatch):
                    self.batches += 1
                    self.last_delivery = max(self.last_delivery, message.max_delivery_sequence or 0)
                    self.received.extend(message.operations)  # type: ignore[arg-type]
                    if self.auto_ack:
                        ack = p.Acknowledgment(
                            p.new_message_id(), message.message_id, 0, message.max_delivery_sequence
                        )
                        # Closed meanwhile: keep reading what arrived before the close (an error, say).
                        with contextlib.suppress(ConnectionClosed):
                            await self.ws.send(p.encode(ack))
                elif isinstance(message, p.Acknowledgment):
                    future = self._acks.pop(message.acknowledged_message_id, None)
                    if future is not None and not future.done():
                        future.set_result(message)
                elif isinstance(message, p.OperationRejected):
                    self.rejections.append(message)
                elif isinstance(message, p.ErrorMessage):
                    self.errors.append(message)
        except ConnectionClosed:
            pass
        finally:
            self.closed = self.ws.close_code if self.ws.close_code is not None else 1006
            self.close_reason = self.ws.close_reason or ""
            for future in self._acks.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"closed with {self.closed}"))
            self._ended.set()

    async def send_batch(self, ops: list[dict[str, Any]]) -> asyncio.Future[p.Acknowledgment]:
        assert self.ws is not None
        message_id = p.new_message_id()
        future: asyncio.Future[p.Acknowledgment] = asyncio.get_running_loop().create_future()
        self._acks[message_id] = future
        frame = p.encode_batch_frame(message_id, [json.dumps(op) for op in ops], is_final=True, batch_index=0)
        await self.ws.send(frame)
        return future

    async def push(
        self, ops: list[dict[str, Any]], batch: int = 100, window: int = 4
    ) -> list[p.Acknowledgment]:
        """Send ``ops`` in batches, at most ``window`` unacknowledged; every acknowledgement, in order."""
        pending: list[asyncio.Future[p.Acknowledgment]] = []
        acks: list[p.Acknowledgment] = []
        for start in range(0, len(ops), batch):
            while len(pending) >= window:
                acks.append(await asyncio.wait_for(pending.pop(0), TIMEOUT))
            pending.append(await self.send_batch(ops[start : start + batch]))
        for future in pending:
            acks.append(await asyncio.wait_for(future, TIMEOUT))
        return acks

    async def refused(self, op: dict[str, Any]) -> p.OperationRejected:
        """Send ``op`` alone; the ``operation-rejected`` the server answers it with (before its acknowledgement)."""
        await asyncio.wait_for(await self.send_batch([op]), TIMEOUT)
        found = [r for r in self.rejections if r.operation_id == op["id"]]
        assert found, f"operation {op['id']} was accepted"
        return found[-1]

    async def wait_closed(self, timeout: float = TIMEOUT) -> int:
        await asyncio.wait_for(self._ended.wait(), timeout)
        assert self.closed is not None
        return self.closed

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._reader, 5)


async def handshake_reply(url: str, node: str, token: str | None = None) -> p.Message:
    """What the server answers a handshake as ``node`` with ``token`` (an ``error`` when it refuses it)."""
    async with ws_connect(url, max_size=None) as ws:
        hello = p.Handshake(p.new_message_id(), node, {}, SCHEMA.version, 0, auth_token=token)
        await ws.send(p.encode(hello))
        return p.decode(await asyncio.wait_for(ws.recv(), TIMEOUT))


# -- a WebSocket peer on a bare socket -----------------------------------------------------------------------------


class BareSocketPeer:
    """A WebSocket client written by hand on a blocking socket, so it can misbehave the way real peers do:
    stop reading (its receive buffer fills, and the server's send buffer behind it), or stop answering pings.
    ``rcvbuf`` shrinks the kernel receive buffer (set before connecting, so the window stays small).
    ``upgrade=False`` only connects: the caller may first `get` over the plain HTTP connection, then send the
    upgrade ``request`` in parts and finish with `upgrade`."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str = "/offline-sync",
        *,
        rcvbuf: int | None = None,
        upgrade: bool = True,
        source: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if source is not None:  # another loopback address (all of 127/8 is local on Linux): another client
            self.sock.bind((source, 0))
        self.sock.settimeout(TIMEOUT)
        self.sock.connect((host, port))
        self.host = f"{host}:{port}"
        key = base64.b64encode(os.urandom(16)).decode()
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        self.request = (
            f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
        ).encode()
        self.buffer = b""
        if upgrade:
            self.upgrade()

    def upgrade(self, sent: int = 0) -> None:
        """Send the upgrade request (from byte ``sent`` on: a first part may have gone ahead); expect 101."""
        self.sock.sendall(self.request[sent:])
        head = self.read_head()
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(head.decode(errors="replace"))

    def read_head(self) -> bytes:
        """The head of the next HTTP response (up to the blank line); what follows stays in the buffer."""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed before an HTTP response")
            self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        return head

    def get(self, path: str) -> tuple[bytes, bytes]:
        """A plain HTTP GET on this connection (kept alive: the upgrade may follow): (head, body)."""
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        head = self.read_head()
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return head, self._read_exact(length)

    def send_text(self, text: str) -> None:
        payload = text.encode()
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            header = struct.pack("!BB", 0x81, 0x80 | size)
        elif size < 1 << 16:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, size)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _read_exact(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def read_frame(self) -> tuple[int, bytes]:
        """(opcode, payload) of the next frame (server frames are unmasked)."""
        first, second = self._read_exact(2)
        size = second & 0x7F
        if size == 126:
            (size,) = struct.unpack("!H", self._read_exact(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", self._read_exact(8))
        return first & 0x0F, self._read_exact(size)

    def handshake(
        self, node: str | None = None, scope: dict[str, Any] | None = None, token: str | None = None
    ) -> p.HandshakeResponse:
        hello = p.Handshake(
            message_id=p.new_message_id(),
            node_id=node or generate_uuid_v7(),
            version_vector={},
            schema_version=SCHEMA.version,
            last_delivery_sequence=0,
            sync_scope=scope,
            auth_token=token,
        )
        self.send_text(p.encode(hello))
        reply = self.next_message()
        assert isinstance(reply, p.HandshakeResponse) and reply.accepted, reply
        return reply

    def next_message(self) -> p.Message:
        """The next text frame, decoded (pings and other control frames skipped)."""
        while True:
            opcode, payload = self.read_frame()
            if opcode == 0x1:
                return p.decode(payload.decode())
            if opcode == 0x8:
                raise ConnectionError(f"closed by the server: {payload[2:].decode(errors='replace')}")

    def is_closed_by_peer(self, timeout: float = 0.5) -> bool:
        """Drain what arrived; True once the server closed or reset the connection."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(1 << 20):
                    return True
        except (TimeoutError, BlockingIOError):
            return False
        except OSError:
            return True  # reset

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


# -- the server process, seen from outside -----------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def status(server: ServerProcess, token: str | None = None) -> dict[str, Any]:
    request = urllib.request.Request(server.http_url + "/__offline/status")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read())
        return body


def session_nodes(server: ServerProcess, token: str | None = None) -> set[str]:
    return {str(c["nodeId"]) for c in status(server, token)["clients"]}


async def wait_for(
    condition: Callable[[], bool], what: Callable[[], str] | str, timeout: float = TIMEOUT
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what if isinstance(what, str) else what()}"
            )
        await asyncio.sleep(0.05)


# -- what the server must answer ------------------------------------------------------------------------------------


class Oracle:
    """What the server must answer to a frame sent on a session, judged by the protocol's own decoder with the
    server's limits, plus what the test knows: which operation ids are stored.

    ``expect`` returns ``("close", 1009)`` for a frame past the WebSocket layer's size limit, ``("error", None)``
    for anything that is not a valid client message, ``("silent", None)`` for a valid acknowledgement (no
    answer by protocol), and ``("batch", (message id, keys))`` for operations, ``keys`` being the ids (``?``
    without one) that must each get an ``operation-rejected``: every operation that does not verify, and every
    valid one not already stored (the generators only make valid operations the server must refuse)."""

    def __init__(self, stored: set[str], max_message: int, max_batch: int, max_operation: int) -> None:
        self.stored = stored
        self.max_message = max_message
        self.max_batch = max_batch
        self.max_operation = max_operation

    def expect(self, frame: str | bytes) -> tuple[str, Any]:
        size = len(frame) if isinstance(frame, bytes) else len(frame.encode("utf-8", "surrogatepass"))
        if size > self.max_message + 1024:
            return "close", 1009
        # The server reads a binary frame as UTF-8 text, replacing what does not decode.
        text = frame.decode("utf-8", "replace") if isinstance(frame, bytes) else frame
        try:
            message = p.decode(text, max_bytes=self.max_message, max_batch=self.max_batch)
        except p.ProtocolError:
            return "error", None
        if isinstance(message, p.Acknowledgment):
            return "silent", None
        if isinstance(message, (p.OperationBatch, p.OperationMessage)):
            items = message.operations if isinstance(message, p.OperationBatch) else (message.operation,)
            return "batch", (message.message_id, self.refused_keys(items))
        return "error", None  # another handshake, or a message only the server sends

    def refused_keys(self, items: Any) -> set[str]:
        keys: set[str] = set()
        for item in items:
            try:
                op = p.decode_operation(item, max_bytes=self.max_operation)
            except p.ProtocolError:
                # Named by its id when that is a non-empty string (made valid UTF-8, at most 128 characters),
                # else "?": an operationId a peer's decoder accepts.
                op_id = item.get("id") if isinstance(item, dict) else None
                if isinstance(op_id, str) and op_id:
                    op_id = op_id.encode("utf-8", "replace").decode("utf-8")
                    keys.add(op_id if len(op_id) <= 128 else op_id[:127] + "…")
                else:
                    keys.add("?")
                continue
            if op.id not in self.stored:
                keys.add(op.id)
        return keys
