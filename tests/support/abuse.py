"""What an attacker does to a server before signing in, done for real over sockets: huge request bodies,
floods of WebSockets that never say hello, connections cut with a TCP reset. Shared by the hardening tests
and ``bench/trust_boundary.py``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import resource
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024


def raise_open_file_limit() -> int:
    """The soft limit on open files raised to the hard limit (a flood needs one per socket); the new soft
    limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class PeakRss:
    """Samples a process's RSS every few milliseconds while the block runs; ``peak`` is the largest seen."""

    def __init__(self, pid: int, period: float = 0.005) -> None:
        self.pid = pid
        self.period = period
        self.before = rss_bytes(pid)
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, AssertionError):
                self.peak = max(self.peak, rss_bytes(self.pid))
            self._stop.wait(self.period)

    @property
    def growth(self) -> int:
        return self.peak - self.before

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))


# -- request bodies ---------------------------------------------------------------------------------------------------


@dataclass
class UploadResult:
    status: int | None  # None: the connection ended without an HTTP answer
    body: bytes
    sent: int  # body bytes the server took before it answered or closed

    def json(self) -> dict[str, object]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


def _body_chunks(total: int, chunk: int) -> Iterator[bytes]:
    """``total`` bytes of a JSON-looking body, made as they are sent (never held whole)."""
    block = b'{"email": "' + b"a" * (chunk - 11)
    sent = 0
    while sent < total:
        piece = block[: min(chunk, total - sent)]
        sent += len(piece)
        yield piece


def upload(
    host: str,
    port: int,
    path: str,
    total: int,
    *,
    chunked: bool = True,
    headers: dict[str, str] | None = None,
    chunk: int = 64 * 1024,
    timeout: float = 60.0,
) -> UploadResult:
    """POST a ``total``-byte body streamed from a generator (chunked, or with its Content-Length), reading
    the answer as soon as the server sends one: an HTTP client that writes the whole body before reading (most
    do) would only see the reset that follows a refusal."""
    sock = socket.create_connection((host, port), timeout=timeout)
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n{framing}\r\n"
        f"{extra}\r\n"
    ).encode()
    answer = b""
    sent = 0
    deadline = time.monotonic() + timeout
    try:
        sock.sendall(head)
        chunks = _body_chunks(total, chunk)
        finished = False
        while time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [] if finished else [sock], [], 1.0)
            if readable:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
                if _complete(answer):
                    break
                continue
            if writable:
                piece = next(chunks, None)
                if piece is None:
                    if chunked:
                        sock.sendall(b"0\r\n\r\n")
                    finished = True
                    continue
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
    except OSError:
        pass  # reset or broken pipe: the server stopped reading; what it answered first is in `answer`
    finally:
        sock.close()
    status, body = _parse(answer)
    return UploadResult(status, body, sent)


def _complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


def _parse(answer: bytes) -> tuple[int | None, bytes]:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.1 "):
        return None, b""
    return int(head.split(b" ")[1]), body


def parallel_uploads(count: int, *args: object, **kwargs: object) -> list[UploadResult]:
    """``count`` uploads at once, one thread each (see `upload`)."""
    results: list[UploadResult | None] = [None] * count

    def run(index: int) -> None:
        results[index] = upload(*args, **kwargs)  # type: ignore[arg-type]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result is not None for result in results)
    return [result for result in results if result is not None]


# -- silent WebSockets ----------------------------------------------------------------------------------------------


def upgrade_request(host: str, port: int, path: str = "/offline-sync") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


@dataclass
class SilentFlood:
    """``count`` WebSockets from ``source`` that complete the upgrade and then say nothing, held open (never
    closed by this side) until `close`. ``upgraded``: how many got their 101; ``failed``: how many did not
    (refused, reset, or not a 101)."""

    host: str
    port: int
    count: int
    source: str = "127.0.0.2"
    concurrency: int = 200
    # None: a complete WebSocket upgrade; bytes: send only these (a request head never finished) and wait
    # for nothing.
    partial: bytes | None = None
    upgraded: int = 0
    failed: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    readers: list[asyncio.StreamReader] = field(default_factory=list)

    async def open(self) -> None:
        gate = asyncio.Semaphore(self.concurrency)

        async def one() -> None:
            async with gate:
                try:
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, local_addr=(self.source, 0), limit=1 << 16
                    )
                except OSError:
                    self.failed += 1
                    return
                self.writers.append(writer)
                self.readers.append(reader)
                if self.partial is not None:
                    writer.write(self.partial)
                    return
                try:
                    writer.write(upgrade_request(self.host, self.port))
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
                except (OSError, asyncio.IncompleteReadError, TimeoutError, asyncio.LimitOverrunError):
                    self.failed += 1
                    return
                if head.startswith(b"HTTP/1.1 101"):
                    self.upgraded += 1
                else:
                    self.failed += 1

        await asyncio.gather(*(one() for _ in range(self.count)))

    async def still_open(self) -> int:
        """Sockets of the flood the server has not closed (what arrived meanwhile is read and dropped)."""

        async def open_(reader: asyncio.StreamReader) -> bool:
            try:
                while True:
                    if not await asyncio.wait_for(reader.read(65536), 0.5):
                        return False  # EOF: the server closed its side
            except TimeoutError:
                return True  # silent, and still connected
            except OSError:
                return False  # reset

        return sum(await asyncio.gather(*(open_(reader) for reader in self.readers)))

    async def close(self) -> None:
        for writer in self.writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self.writers.clear()
        self.readers.clear()
        await asyncio.sleep(0)


async def oversized_first_frame(host: str, port: int, size: int, source: str = "127.0.0.2") -> bytes:
    """Upgrade, then send one ``size``-byte text frame before any handshake; what the server sent back (up to
    its close) is returned."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    answer = b""
    try:
        writer.write(upgrade_request(host, port))
        await reader.readuntil(b"\r\n\r\n")
        header = struct.pack("!BBQ", 0x81, 0x80 | 127, size) + b"\0\0\0\0"  # a zero mask
        writer.write(header)
        block = b"x" * MIB
        for start in range(0, size, MIB):
            writer.write(block[: min(MIB, size - start)])
            await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 60)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        pass  # reset: the server stopped reading
    finally:
        writer.transport.abort()
    return answer


async def unfinished_first_frame(
    host: str, port: int, size: int, source: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """Upgrade, then send all but the last byte of a ``size``-byte text frame before any handshake, and hold the
    connection: the server buffers what arrived until the frame ends or the connection does. None when the
    server refused the connection before the frame was out."""
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    except OSError:
        return None
    try:
        writer.write(upgrade_request(host, port))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(head[:40])
        writer.write(struct.pack("!BBQ", 0x81, 0x80 | 127, size) + b"\0\0\0\0")  # a zero mask
        writer.write(b"x" * (size - 1))
        await writer.drain()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        writer.transport.abort()
        return None
    return reader, writer


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed client or a dropped NAT mapping does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
