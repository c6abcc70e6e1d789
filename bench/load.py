"""Load (issue 8): many concurrent sync clients on one server process, memory per connection, throughput.

One server process (``python -m server_runtime``, SQLite store) and client *processes* (``--workers``, each
holding its share of the clients, all over real WebSockets). Every client is a protocol-level client: it
handshakes with a scope narrowed to its group of ten (so a write fans out to nine peers, not to everyone),
applies what the relay sends (acknowledging each batch) and writes operations of its own.

1. ``memory``: the server's RSS after start-up and a warm-up (the baseline), then with every client connected
   and caught up; ``per_connection_kb`` = (RSS - baseline) / clients. Target: at most 100 KB.
2. ``steady``: every client writes one operation every ``--interval`` seconds (jittered) for ``--duration``
   seconds: acknowledged operations per second, relayed deliveries per second, acknowledgement latency.
3. ``saturated``: every client writes batches of 10 back to back (the next once the last is acknowledged):
   the same figures at the server's ceiling with all clients connected.

Nothing is asserted; the figures are printed as JSON. A client whose connection closes stops writing and is
counted in its phase's ``clients_failed``, with the close reason in ``failures`` (the run goes on). Both sides raise their open-file limit first.
Run: ``python -m bench load`` or ``python -m bench.load [--clients N] [--workers W]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offline import define_schema, t
from tests.support.abuse import raise_open_file_limit, rss_bytes

ROOT = Path(__file__).resolve().parents[1]
GROUP_SIZE = 10
TARGET_KB_PER_CONNECTION = 100

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "notes": {"fields": {"group": t.string(), "body": t.string(), "n": t.number().default(0)}}
        },
        "sync": {"notes": {"where": {"group": "groupId"}}},
    }
)
ENTRY_SOURCE = "from bench.load import SCHEMA as schema  # noqa: F401\n"


def _log(message: str) -> None:
    print(f"[bench load] {message}", file=sys.stderr, flush=True)


def rss_kb(pid: int) -> int:
    return rss_bytes(pid) // 1024


# -- one client -----------------------------------------------------------------------------------------------------


@dataclass
class LoadClient:
    """A protocol-level sync client of one group: handshake, apply and acknowledge relay batches, write."""

    url: str
    group: str
    node: str = ""
    received: int = 0
    acked: int = 0
    latencies: list[float] = field(default_factory=list)
    ws: Any = None
    _pending: dict[str, tuple[float, asyncio.Future[None]]] = field(default_factory=dict)
    _reader: asyncio.Task[None] | None = None
    _sequence: int = 0
    _clock: Any = None
    closed: str = ""  # how the connection ended (close code and reason), when it did
    failure: str = ""  # why its writes stopped (the connection closed, or no acknowledgement came)

    async def open(self) -> None:
        import websockets

        from offline import HybridLogicalClock, generate_uuid_v7
        from offline.sync import protocol as p

        self.node = generate_uuid_v7()
        self._clock = HybridLogicalClock(self.node)
        self.ws = await websockets.connect(self.url, max_size=None, compression=None, open_timeout=60)
        hello = p.Handshake(
            message_id=p.new_message_id(),
            node_id=self.node,
            version_vector={},
            schema_version=SCHEMA.version,
            last_delivery_sequence=0,
            sync_scope={"notes": {"group": self.group}},
        )
        await self.ws.send(p.encode(hello))
        reply = p.decode(await asyncio.wait_for(self.ws.recv(), 60))
        if not isinstance(reply, p.HandshakeResponse) or not reply.accepted:
            raise RuntimeError(f"handshake refused: {reply}")
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        from offline.sync import protocol as p

        try:
            async for frame in self.ws:
                message = p.decode(frame)
                if isinstance(message, p.OperationBatch):
                    self.received += len(message.operations)
                    ack = p.Acknowledgment(
                        p.new_message_id(), message.message_id, 0, message.max_delivery_sequence
                    )
                    await self.ws.send(p.encode(ack))
                elif isinstance(message, p.ErrorMessage):
                    self.closed = f"error {message.code}: {message.message}"
                elif isinstance(message, p.Acknowledgment):
                    entry = self._pending.pop(message.acknowledged_message_id, None)
                    if entry is not None:
                        sent, future = entry
                        self.latencies.append(time.perf_counter() - sent)
                        if not future.done():
                            future.set_result(None)
        except ConnectionClosed as exc:
            received, sent_close = exc.rcvd, exc.sent
            self.closed += (
                ("; " if self.closed else "")
                + (
                    f"received close {received.code} {received.reason!r}"
                    if received is not None
                    else "no close received"
                )
                + (f", sent close {sent_close.code} {sent_close.reason!r}" if sent_close is not None else "")
            )
        finally:
            for _, future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"connection closed: {self.closed}"))

    def _operations(self, count: int) -> list[str]:
        from offline import create_operation, generate_uuid_v7
        from offline.merge.values import compact_json

        wires = []
        for _ in range(count):
            self._sequence += 1
            op = create_operation(
                {
                    "node_id": self.node,
                    "type": "insert",
                    "collection": "notes",
                    "record_id": generate_uuid_v7(),
                    "data": {"group": self.group, "body": "x" * 64, "n": self._sequence},
                    "timestamp": self._clock.now(),
                    "sequence_number": self._sequence,
                    "schema_version": SCHEMA.version,
                }
            )
            wires.append(compact_json(op.to_wire()))
        return wires

    async def write(self, count: int = 1) -> None:
        """Send ``count`` new operations in one batch and wait for the acknowledgement."""
        from websockets.exceptions import ConnectionClosed

        from offline.sync import protocol as p

        if self._reader is not None and self._reader.done():
            raise ConnectionError(f"connection closed: {self.closed or 'by the server'}")
        message_id = p.new_message_id()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[message_id] = (time.perf_counter(), future)
        try:
            await self.ws.send(
                p.encode_batch_frame(message_id, self._operations(count), is_final=True, batch_index=0)
            )
        except ConnectionClosed as exc:
            raise ConnectionError(f"connection closed: {self.closed or exc}") from exc
        await asyncio.wait_for(future, 120)
        self.acked += count

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._reader, 10)


async def open_clients(url: str, first: int, count: int, concurrency: int = 25) -> list[LoadClient]:
    """Clients ``first`` .. ``first + count - 1`` (client i belongs to group i // 10), opened ``concurrency`` at a
    time."""
    slots = asyncio.Semaphore(concurrency)
    clients = [LoadClient(url, f"g{(first + i) // GROUP_SIZE}") for i in range(count)]

    async def one(client: LoadClient) -> None:
        async with slots:
            await client.open()

    await asyncio.gather(*(one(c) for c in clients))
    return clients


async def drive(
    clients: list[LoadClient], duration: float, interval: float | None, batch: int
) -> dict[str, Any]:
    """Every client writes for ``duration`` s: one batch of ``batch`` every ``interval`` s (jittered), or back to
    back when ``interval`` is None. Returns counts and latencies for this window."""
    before = [(c.acked, c.received, len(c.latencies)) for c in clients]
    stop = time.monotonic() + duration

    async def loop(client: LoadClient) -> None:
        due = time.monotonic() + (random.uniform(0, interval) if interval else 0.0)
        while due < stop and not client.failure:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            try:
                await client.write(batch)
            except (ConnectionError, TimeoutError) as exc:
                # Reported with the figures (how many, and why), not a crash of the whole run.
                client.failure = str(exc) or type(exc).__name__
                return
            due = time.monotonic() if not interval else due + interval * random.uniform(0.5, 1.5)

    started = time.monotonic()
    await asyncio.gather(*(loop(c) for c in clients))
    elapsed = max(duration, time.monotonic() - started)
    latencies = [x for c, (_, _, n) in zip(clients, before, strict=True) for x in c.latencies[n:]]
    return {
        "seconds": elapsed,
        "acked": sum(c.acked - a for c, (a, _, _) in zip(clients, before, strict=True)),
        "received": sum(c.received - r for c, (_, r, _) in zip(clients, before, strict=True)),
        "latencies_ms": [round(x * 1000, 3) for x in latencies],
        "failed": dict(collections.Counter(c.failure for c in clients if c.failure)),
    }


# -- worker processes ----------------------------------------------------------------------------------------------------


async def _worker(args: dict[str, Any]) -> None:
    raise_open_file_limit()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def emit(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    clients = await open_clients(args["url"], args["first"], args["count"])
    emit({"connected": len(clients)})
    while True:
        line = await reader.readline()
        if not line:
            break
        command = json.loads(line)
        if command["cmd"] == "drive":
            report = await drive(clients, command["duration"], command.get("interval"), command["batch"])
            await asyncio.sleep(command.get("settle", 2.0))  # let the last relays arrive
            report["received"] = sum(c.received for c in clients) - command.get("received_before", 0)
            emit(report)
        elif command["cmd"] == "count":
            emit({"received": sum(c.received for c in clients), "acked": sum(c.acked for c in clients)})
        else:
            break
    await asyncio.gather(*(c.close() for c in clients))


class Worker:
    def __init__(self, args: dict[str, Any], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> Worker:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.load",
            "--worker",
            json.dumps(self.args),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            cwd=str(ROOT),
            env=env,
            limit=1 << 26,
        )
        return self

    async def read(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            await asyncio.sleep(0.2)
            raise RuntimeError(f"load worker exited:\n{self.log_path.read_text(errors='replace')[-2000:]}")
        return json.loads(line)  # type: ignore[no-any-return]

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):
                self.send({"cmd": "quit"})
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self._log.close()


# -- the measurement -----------------------------------------------------------------------------------------------------


def _status(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "/__offline/status", timeout=30) as response:
        body: dict[str, Any] = json.loads(response.read())
        return body


def _steady_rss_kb(pid: int, samples: int = 5) -> int:
    values = []
    for _ in range(samples):
        values.append(rss_kb(pid))
        time.sleep(0.2)
    return int(statistics.median(values))


def _figures(window: dict[str, Any], clients: int) -> dict[str, Any]:
    latencies = sorted(window["latencies_ms"])

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0.0

    seconds = window["seconds"]
    return {
        "clients": clients,
        "seconds": round(seconds, 1),
        "acked_ops_per_s": round(window["acked"] / seconds, 1),
        "relayed_ops_per_s": round(window["received"] / seconds, 1),
        "ack_latency_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "max": pct(1.0)},
        "expected_relays_per_write": GROUP_SIZE - 1,
        # Clients whose writes stopped, by reason (so far in the run): the server closed them, or no ack came.
        "clients_failed": sum(window["failed"].values()),
        "failures": dict(window["failed"].most_common(5)),
    }


async def _drive_all(workers: list[Worker], **command: Any) -> dict[str, Any]:
    for worker in workers:
        worker.send({"cmd": "count"})
    before = [await w.read(60) for w in workers]
    for worker, counts in zip(workers, before, strict=True):
        worker.send({"cmd": "drive", "received_before": counts["received"], **command})
    reports = [await w.read(command["duration"] + 180) for w in workers]
    merged: dict[str, Any] = {
        "seconds": max(r["seconds"] for r in reports),
        "acked": sum(r["acked"] for r in reports),
        "received": sum(r["received"] for r in reports),
        "latencies_ms": [x for r in reports for x in r["latencies_ms"]],
        "failed": sum((collections.Counter(r["failed"]) for r in reports), collections.Counter()),
    }
    return merged


async def measure(clients: int, workers: int, duration: float, interval: float) -> dict[str, Any]:
    from tests.support.servers import ServerProcess

    limit = raise_open_file_limit()
    figures: dict[str, Any] = {"clients": clients, "workers": workers, "open_file_limit": limit}
    with tempfile.TemporaryDirectory(prefix="bench-load-") as name:
        folder = Path(name)
        entry = folder / "server.py"
        entry.write_text(ENTRY_SOURCE)
        env = {
            "OFFLINE_MAX_CONNECTIONS": str(clients + 100),
            "OFFLINE_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
            # No snapshot built in the background once the log stays still: its replica would count in the
            # server's RSS and CPU, which these figures attribute to the connections.
            "OFFLINE_SNAPSHOT_PREPARE_EVERY": "0",
        }
        server = ServerProcess(entry, store="sqlite", db=str(folder / "server.db"), env=env).start(timeout=60)
        assert server.proc is not None
        pid = server.proc.pid
        pool: list[Worker] = []
        try:
            # Warm-up: the first connections import and build what every later one shares.
            url = server.sync_url
            warm = await open_clients(url, 0, 20)
            await asyncio.gather(*(c.write(1) for c in warm))
            await asyncio.gather(*(c.close() for c in warm))
            await asyncio.sleep(1.0)
            baseline = _steady_rss_kb(pid)
            _log(
                f"server baseline RSS {baseline / 1024:.1f} MB; connecting {clients} clients in {workers} processes"
            )

            started = time.monotonic()
            share = -(-clients // workers)
            for index in range(workers):
                count = min(share, clients - index * share)
                worker = Worker(
                    {"url": url, "first": index * share, "count": count}, folder / f"worker-{index}.log"
                )
                pool.append(await worker.start())
            connected = sum([(await w.read(300))["connected"] for w in pool])
            ramp = time.monotonic() - started
            status = await asyncio.to_thread(_status, server.http_url)
            await asyncio.sleep(1.0)
            loaded = await asyncio.to_thread(_steady_rss_kb, pid)
            per_connection = (loaded - baseline) / max(1, connected)
            figures["memory"] = {
                "baseline_rss_mb": round(baseline / 1024, 1),
                "connected_rss_mb": round(loaded / 1024, 1),
                "connected": connected,
                "server_reported_connections": status["connectedClients"],
                "per_connection_kb": round(per_connection, 1),
                "target_kb": TARGET_KB_PER_CONNECTION,
                "within_target": per_connection <= TARGET_KB_PER_CONNECTION,
                "connect_all_s": round(ramp, 1),
            }
            _log(f"{connected} connected in {ramp:.1f} s: {per_connection:.1f} KB per connection")

            steady = await _drive_all(pool, duration=duration, interval=interval, batch=1)
            figures["steady"] = {**_figures(steady, connected), "write_interval_s": interval, "batch": 1}
            figures["steady"]["peak_rss_mb"] = round(rss_kb(pid) / 1024, 1)
            _log(f"steady: {figures['steady']['acked_ops_per_s']} acked/s")

            saturated = await _drive_all(pool, duration=duration, interval=None, batch=10)
            figures["saturated"] = {**_figures(saturated, connected), "batch": 10}
            figures["saturated"]["rss_mb"] = round(rss_kb(pid) / 1024, 1)
            _log(f"saturated: {figures['saturated']['acked_ops_per_s']} acked/s")
            final = await asyncio.to_thread(_status, server.http_url)
            figures["server_connections_at_end"] = final["connectedClients"]
        finally:
            await asyncio.gather(*(w.stop() for w in pool), return_exceptions=True)
            server.terminate(60)
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return figures


def run(full: bool = True) -> dict[str, Any]:
    return asyncio.run(measure(1000 if full else 200, 4, 10.0 if full else 5.0, 5.0))


def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of each write phase")
    parser.add_argument(
        "--interval", type=float, default=5.0, help="seconds between one client's steady writes"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(_worker(json.loads(args.worker)))
        return
    figures = asyncio.run(measure(args.clients, args.workers, args.duration, args.interval))
    json.dump(figures, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    _main(sys.argv[1:])
