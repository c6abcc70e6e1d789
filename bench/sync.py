"""Sync figures (issue 4) with real server processes (`python -m server_runtime`) on loopback, SQLite store.

1. ``initial_sync``: a fresh client's ``connect()`` until ``wait_until_synced()`` returns and every record
   is visible, against a server holding 100,000 operations: by record states (the default for a long log;
   ``client_cpu_s`` is the client's own CPU time), then ``by_operations`` (``initial_sync="operations"``). The server's SQLite file is seeded directly
   through its store (``SQLiteServerStore`` writer: ``append`` + ``save_rows``, rows folded with the same
   ``MergeEngine``), not through the sync pipeline, which is far slower (see ``seed_*`` figures).
2. ``fanout``: one writer, 10 subscriber *processes*, one server process. Each subscriber records when it
   applied how many operations (``sync:received``, fired after the local commit, so the records are
   visible); the figure is the operations each applied per second during the writer's window, and until it
   had them all. Two writers in turn: ``app_writer`` (a real client inserting in ``app.batch()`` chunks as
   fast as it can) and ``raw_writer`` (pre-built operations pushed over the protocol, at most a few batches
   unacknowledged, so the client's own write cost is out of the picture). Then ``raw_writer_counting_sessions``:
   the raw writer again, with 10 sessions (in one process) that only count what they receive: the server's
   own fan-out capacity, not bounded by 10 subscriber processes sharing the machine's cores to store
   everything. Its writer stock lasts longer than the window at the rates reached here. Beside it,
   ``server_cpu_us_per_op``: the server process's CPU time (all its threads) per operation, which moves
   less with the machine's speed swings than the rate does.
3. ``latency``: client A (a process) inserts one record every 2 ms (500 operations/s), stamping
   ``time.time()`` into it; client B (another process) computes ``time.time() - stamp`` when it has applied
   the record.
4. ``websocket_echo``: a bare `websockets` echo server process and a client here, with frames the size of one
   operation message and of one 500-operation batch: the loopback/CPU ceiling the figures above compare to.

Each figure also has ``cpu``: the CPU seconds (user + system, every thread, from /proc) that each process
spent over the measurement (``server_cpu_s``; ``client_process_cpu_s``, ``writer_cpu_s``, ``subscribers_cpu_s``
(all ten), ``a_cpu_s`` / ``b_cpu_s``, ``counting_sessions_cpu_s``) and per operation (``*_cpu_us_per_op``; the
subscribers' per subscriber). On a machine shared with other work the wall figures move by several times
with its load; these move far less, so compare commits by them (``server_pipeline_cpu_us_per_op`` likewise).

Every wait is bounded; a measurement that runs out of time reports what it got (``timed_out``).
Run: ``python -m bench sync`` (or ``python -m bench.sync`` for this suite alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from offline import create_app, define_schema, t

ROOT = Path(__file__).resolve().parents[1]

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "n": t.number().default(0),
                    "sent": t.number().optional(),  # time.time() at the write, for the latency test
                },
            }
        },
    }
)

# The server entry: the server process imports this module for the schema.
ENTRY_SOURCE = "from bench.sync import SCHEMA as schema  # noqa: F401\n"

INITIAL_OPERATIONS = 100_000
INITIAL_SYNC_TIMEOUT_S = 20.0
SUBSCRIBERS = 10
WRITE_BATCH = 500
FANOUT_WINDOW_S = 4.0
FANOUT_DRAIN_S = 8.0
# Operations the raw writer has ready for each round: more than a 4 s window takes at 25,000/s (at 60,000 the
# stock ran out before the window ended once the server passed 15,000/s).
RAW_STOCK = 100_000
LATENCY_RATE = 500
LATENCY_WINDOW_S = 4.0

TARGETS = {
    "initial_sync_100k_s": 4.0,
    "fanout_ops_per_s_each": 10_000,
    "latency_p50_ms": 5,
    "latency_p99_ms": 30,
}


def _log(message: str) -> None:
    print(f"[bench sync] {message}", file=sys.stderr, flush=True)


def _stats_ms(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {
        "count": len(ordered),
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": round(ordered[-1] * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"min": round(min(values)), "median": round(statistics.median(values)), "max": round(max(values))}


# =============================================================================================== workers
# `python -m bench.sync worker <role> <json args>`: one JSON object per stdout line; commands on stdin.


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _stdin_commands(loop: asyncio.AbstractEventLoop) -> asyncio.Queue[dict[str, Any]]:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(queue.put_nowait, json.loads(line))
        loop.call_soon_threadsafe(queue.put_nowait, {"cmd": "quit"})  # parent gone: stop

    threading.Thread(target=read, daemon=True).start()
    return queue


async def _next_command(queue: asyncio.Queue[dict[str, Any]], timeout: float = 150.0) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(queue.get(), timeout)
    except TimeoutError:
        return {"cmd": "quit"}


async def _worker_subscriber(args: dict[str, Any]) -> None:
    """Connect, catch up, then record (wall time, operations applied) for every batch applied."""
    app = create_app(SCHEMA, path=args["db"], sync={"url": args["url"]})
    events: list[tuple[float, int]] = []
    latencies: list[float] = []
    applied = 0

    def on_received(event: Any) -> None:
        nonlocal applied
        now = time.time()
        ops = event.get("operations") or []
        applied += len(ops)
        events.append((now, len(ops)))
        for op in ops:
            sent = (op.data or {}).get("sent")
            if sent is not None:
                latencies.append(now - float(sent))

    app.events.on("sync:received", on_received)
    queue = _stdin_commands(asyncio.get_running_loop())
    await app.sync.connect(timeout=60)
    await app.sync.wait_until_synced(timeout=60)
    events.clear()
    applied = 0
    _emit({"ready": True})
    while True:
        command = await _next_command(queue)
        if command["cmd"] == "expect":  # wait until `total` operations were applied since ready, bounded
            deadline = time.monotonic() + float(command["timeout"])
            while applied < int(command["total"]) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            _emit({"applied": applied, "events": events, "latencies": latencies})
            events = []
            latencies.clear()
        else:
            break
    await app.sync.disconnect()
    app.close()


async def _worker_app_writer(args: dict[str, Any]) -> None:
    """A real client. ``go`` with mode 'flood' (batches of ``batch`` as fast as it can) or 'paced'."""
    app = create_app(SCHEMA, path=args["db"], sync={"url": args["url"]})
    queue = _stdin_commands(asyncio.get_running_loop())
    # The engine's own count: a sync:sent listener would make it decode every operation it sends again.
    sent_base = 0
    await app.sync.connect(timeout=60)
    await app.sync.wait_until_synced(timeout=60)
    _emit({"ready": True})
    while True:
        command = await _next_command(queue)
        if command["cmd"] != "go":
            break
        duration = float(command["duration"])
        written = 0
        sent_base = app.sync.sent_operations
        start = time.time()
        if command["mode"] == "flood":
            batch = int(command["batch"])
            while time.time() - start < duration:
                with app.batch():
                    for _ in range(batch):
                        app.todos.insert({"title": f"todo {written}", "n": written})
                        written += 1
                await asyncio.sleep(0)  # let the sync engine stream what is pending
        else:  # paced: one durable insert every 1/rate s, stamped with time.time()
            interval = 1.0 / float(command["rate"])
            count = int(duration / interval)
            base = time.monotonic()
            for i in range(count):
                if time.monotonic() - base > 2 * duration:
                    break  # the writer cannot keep the pace: stop anyway (the achieved rate is reported)
                delay = base + i * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)
                app.todos.insert({"title": f"paced {i}", "n": i, "sent": time.time()})
                written += 1
        end = time.time()
        timed_out = False
        try:
            await app.sync.wait_until_synced(timeout=float(command.get("ack_timeout", 20)))
        except Exception:
            timed_out = True
        _emit(
            {
                "start": start,
                "end": end,
                "written": written,
                "acked_at": time.time(),
                "ack_timed_out": timed_out,
                "pending": app.sync.pending,
                # More than written: batches were sent again (no ack in ack_timeout).
                "sent": app.sync.sent_operations - sent_base,
            }
        )
    await app.sync.disconnect()
    app.close()


def _build_wires(node: str, clock: Any, first: int, count: int) -> list[dict[str, Any]]:
    from offline import create_operation, generate_uuid_v7

    return [
        create_operation(
            {
                "node_id": node,
                "type": "insert",
                "collection": "todos",
                "record_id": generate_uuid_v7(),
                "data": {"title": f"raw {i}", "n": i},
                "timestamp": clock.now(),
                "sequence_number": i + 1,
                "schema_version": SCHEMA.version,
                "causal_context": {node: 1},  # as an app's insert carries (bench.seeding)
            }
        ).to_wire()
        for i in range(first, first + count)
    ]


async def _handshake(ws: Any, node: str, after: int) -> None:
    from offline.sync import protocol as p

    hello = p.Handshake(
        message_id=p.new_message_id(),
        node_id=node,
        version_vector={},
        schema_version=SCHEMA.version,
        last_delivery_sequence=after,  # skip what the log already holds
    )
    await ws.send(p.encode(hello))
    reply = p.decode(await asyncio.wait_for(ws.recv(), 15))
    assert isinstance(reply, p.HandshakeResponse) and reply.accepted, reply


async def _worker_raw_writer(args: dict[str, Any]) -> None:
    """Pre-builds operations (between rounds, never while pushing); each ``go`` opens a session and pushes
    them in protocol batches, at most ``window`` unacknowledged, for ``duration`` s or until the stock ends."""
    import websockets

    from offline import HybridLogicalClock, generate_uuid_v7

    node = generate_uuid_v7()
    clock = HybridLogicalClock(node)
    stock = int(args["count"])
    wires = _build_wires(node, clock, 0, stock)
    offset = 0  # wires before this were pushed in earlier rounds
    queue = _stdin_commands(asyncio.get_running_loop())
    _emit({"ready": True})
    while True:
        command = await _next_command(queue)
        if command["cmd"] != "go":
            return
        if len(wires) - offset < stock:
            wires.extend(_build_wires(node, clock, len(wires), stock - (len(wires) - offset)))
        duration, batch, window = float(command["duration"]), int(command["batch"]), int(command["window"])
        async with websockets.connect(args["url"], max_size=None) as ws:
            await _handshake(ws, node, int(command.get("after", 0)))
            report = await _push(ws, wires[offset:], duration, batch, window)
        offset += report["written"]
        report["stock_ran_out"] = offset >= len(wires)
        _emit(report)


async def _push(
    ws: Any, wires: list[dict[str, Any]], duration: float, batch: int, window: int
) -> dict[str, Any]:
    from offline.sync import protocol as p

    in_flight: dict[str, int] = {}
    slots = asyncio.Semaphore(window)
    acked = 0
    rejected = 0

    async def reader() -> None:
        nonlocal acked, rejected
        async for frame in ws:
            message = p.decode(frame, max_batch=100_000, max_bytes=1 << 30)
            if isinstance(message, p.Acknowledgment):
                acked += in_flight.pop(message.acknowledged_message_id, 0)
                slots.release()
            elif isinstance(message, p.OperationRejected):
                rejected += 1

    reading = asyncio.create_task(reader())
    start = time.time()
    sent = 0
    index = 0
    while sent < len(wires) and time.time() - start < duration:
        await slots.acquire()
        chunk = wires[sent : sent + batch]
        message = p.OperationBatch(
            message_id=p.new_message_id(), operations=tuple(chunk), is_final=True, batch_index=index
        )
        in_flight[message.message_id] = len(chunk)
        await ws.send(p.encode(message))
        sent += len(chunk)
        index += 1
    end = time.time()
    deadline = time.monotonic() + 20
    while in_flight and not reading.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    acked_at = time.time()
    reading.cancel()
    return {
        "start": start,
        "end": end,
        "written": sent,
        "acked": acked,
        "acked_at": acked_at,
        "rejected": rejected,
    }


async def _worker_raw_subscribers(args: dict[str, Any]) -> None:
    """``count`` sessions in this one process that only count what they get (no decoding, no store):
    what the server itself can fan out. Counts come from each batch's delivery range (every operation is
    visible to them, so max - base = operations in the batch), past the highest delivery already counted.

    Each batch is acknowledged, as a client does: a session that never acknowledges is sent its newest batch
    again once the server's ack timeout passes (`SyncService.relay`), which counted 20,500 operations for
    20,000 written; a batch that comes again anyway (this process too busy to acknowledge in time) is not
    counted twice, as a client skips it, and ``batches_received_again`` says how many did."""
    import re

    import websockets

    from offline import generate_uuid_v7
    from offline.sync import protocol as p

    pattern = re.compile(r'"(messageId|baseDeliverySequence|maxDeliverySequence)":("[^"]*"|\d+)')
    queue = _stdin_commands(asyncio.get_running_loop())
    _emit({"ready": True})
    command = await _next_command(queue)
    if command["cmd"] != "connect":
        return
    n = int(args["count"])
    events: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    counts = [0] * n
    tops = [0] * n  # the highest delivery counted, per session
    again = [0] * n
    sockets = [await websockets.connect(args["url"], max_size=None) for _ in range(n)]
    for ws in sockets:
        await _handshake(ws, generate_uuid_v7(), int(command["after"]))

    async def reader(i: int, ws: Any) -> None:
        async for frame in ws:
            if isinstance(frame, bytes):
                frame = frame.decode()
            if not frame.startswith('{"type":"operation-batch"'):
                continue
            found = dict(pattern.findall(frame[:400]))  # the envelope fields precede the operations
            ack = p.Acknowledgment(
                message_id=p.new_message_id(),
                acknowledged_message_id=found["messageId"][1:-1],  # (without the value's quotes)
                last_sequence_number=0,
                delivery_sequence=int(found["maxDeliverySequence"])
                if "maxDeliverySequence" in found
                else None,
            )
            await ws.send(p.encode(ack))
            if "maxDeliverySequence" in found and "baseDeliverySequence" in found:
                top = int(found["maxDeliverySequence"])
                if top <= tops[i]:
                    if top > int(found["baseDeliverySequence"]):
                        again[i] += 1
                    continue
                got = top - max(int(found["baseDeliverySequence"]), tops[i])
                tops[i] = top
                if got:
                    counts[i] += got
                    events[i].append((time.time(), got))

    tasks = [asyncio.create_task(reader(i, ws)) for i, ws in enumerate(sockets)]
    _emit({"ready": True})
    command = await _next_command(queue)
    if command["cmd"] == "expect":
        deadline = time.monotonic() + float(command["timeout"])
        while min(counts) < int(command["total"]) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        _emit({"reports": [{"events": e, "again": a} for e, a in zip(events, again, strict=True)]})
    for task in tasks:
        task.cancel()
    for ws in sockets:
        with contextlib.suppress(Exception):
            await ws.close()


async def _worker_echo_server(args: dict[str, Any]) -> None:
    from websockets.asyncio.server import serve

    async def echo(ws: Any) -> None:
        async for message in ws:
            await ws.send(message)

    compression = "deflate" if args.get("compression", True) else None
    queue = _stdin_commands(asyncio.get_running_loop())
    async with serve(echo, "127.0.0.1", 0, max_size=None, compression=compression) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        _emit({"ready": True, "port": port})
        await _next_command(queue, 120)


WORKERS = {
    "subscriber": _worker_subscriber,
    "app-writer": _worker_app_writer,
    "raw-writer": _worker_raw_writer,
    "raw-subscribers": _worker_raw_subscribers,
    "echo-server": _worker_echo_server,
}


# =============================================================================================== parent side


class Worker:
    """One worker process, driven over stdin/stdout JSON lines."""

    def __init__(self, role: str, args: dict[str, Any], log_path: Path) -> None:
        self.role = role
        self.args = args
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> Worker:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.sync",
            "worker",
            self.role,
            json.dumps(self.args),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            cwd=str(ROOT),
            limit=1 << 26,
        )
        return self

    async def read(self, timeout: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            await asyncio.sleep(0.2)
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"worker {self.role} exited ({self.proc.returncode}):\n{tail}")
        return json.loads(line)  # type: ignore[no-any-return]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())

    async def stop(self, timeout: float = 10.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                self.send({"cmd": "quit"})
                assert proc.stdin is not None
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self._log.close()


async def _stop_all(workers: list[Worker]) -> None:
    await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)


def _server(folder: Path, db: Path) -> Any:
    from tests.support.servers import ServerProcess

    entry = folder / "server.py"
    if not entry.exists():
        entry.write_text(ENTRY_SOURCE)
    # No snapshot built in the background (a server without sign-in prepares one as it starts and when its
    # log stays still): these figures are the socket's, measured on an otherwise idle server.
    return ServerProcess(
        entry,
        store="sqlite",
        db=str(db),
        log_path=folder / f"server-{db.stem}.log",
        env={"OFFLINE_SNAPSHOT_PREPARE_EVERY": "0"},
    )


# ------------------------------------------------------------------------------------------ 1. initial sync


async def _seed_store(db: Path, n: int) -> dict[str, Any]:
    """Write ``n`` insert operations (and their folded rows) straight into a server SQLite store."""
    from bench.seeding import insert_chunks
    from server_runtime.stores import create_sqlite_server_store

    store = create_sqlite_server_store(str(db))
    await store.set_schema(SCHEMA)
    start = time.perf_counter()
    build_s = 0.0
    built = time.perf_counter()  # the chunks are built as the loop asks for them
    for ops, rows in insert_chunks(SCHEMA, n, lambda i: {"title": f"todo {i}", "n": i}):
        build_s += time.perf_counter() - built
        async with store.writer() as writer:
            await writer.append([(op, None) for op in ops])
            await writer.save_rows(rows)
        built = time.perf_counter()
    total = time.perf_counter() - start
    await store.close()
    return {"seed_direct_s": round(total, 2), "seed_build_ops_s": round(build_s, 2)}


async def _seed_pipeline_rate(folder: Path, n: int) -> tuple[float, float]:
    """Operations/s the server's write pipeline (`SyncService.commit`, 500 per batch) accepts, in process,
    and its CPU microseconds (every thread of this process) per operation."""
    from bench.seeding import insert_operations
    from server_runtime.stores import create_sqlite_server_store
    from server_runtime.sync import SyncService

    store = create_sqlite_server_store(str(folder / "pipeline.db"))
    await store.set_schema(SCHEMA)
    service = SyncService(store)
    await service.start()
    ops = list(insert_operations("todos", n, lambda i: {"title": f"todo {i}", "n": i}, SCHEMA.version))
    start = time.perf_counter()
    cpu = time.process_time()
    for first in range(0, n, WRITE_BATCH):
        await service.commit(None, ops[first : first + WRITE_BATCH])
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    await service.stop()
    await store.close()
    return n / elapsed, cpu / n * 1e6


async def _initial_sync(folder: Path, n: int, timeout: float) -> dict[str, Any]:
    db = folder / "initial.db"
    _log(f"initial sync: seeding the server store with {n} operations")
    figures: dict[str, Any] = {"operations": n}
    figures.update(await _seed_store(db, n))
    rate, cpu_us = await _seed_pipeline_rate(folder, 3_000)
    figures["server_pipeline_ops_per_s"] = round(rate)
    figures["server_pipeline_cpu_us_per_op"] = round(cpu_us, 1)
    server = _server(folder, db)
    t0 = time.perf_counter()
    server.start(timeout=120)
    figures["server_start_s"] = round(time.perf_counter() - t0, 2)
    try:
        # The default, a state-based first sync (each record's state, see README "first sync"), then the
        # same with every operation (``initial_sync="operations"``, what every fresh client did before).
        figures.update(await _fresh_client(folder, server, n, "states", timeout))
        figures["by_operations"] = await _fresh_client(folder, server, n, "operations", timeout)
    finally:
        server.terminate()
    return figures


async def _fresh_client(folder: Path, server: Any, n: int, mode: str, timeout: float) -> dict[str, Any]:
    """One fresh client's first sync from ``server`` (``mode``: its ``initial_sync`` setting)."""
    app = create_app(
        SCHEMA,
        path=str(folder / f"fresh-client-{mode}.db"),
        sync={"url": server.sync_url, "initial_sync": mode},
    )
    marks: list[tuple[float, int]] = []
    app.events.on(
        "sync:received", lambda e: marks.append((time.perf_counter(), len(e.get("operations") or [])))
    )
    app.events.on("sync:states", lambda e: marks.append((time.perf_counter(), len(e.get("records") or []))))
    stalls: list[float] = []

    async def ticker() -> None:  # how long the client's event loop goes without running other tasks
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            stalls.append(now - last - 0.01)
            last = now

    ticking = asyncio.create_task(ticker())
    _log(f"initial sync: fresh client connecting ({mode})")
    start = time.perf_counter()
    cpu = time.thread_time()  # the client's work: the server is another process
    assert server.proc is not None
    groups: dict[str, list[int | None]] = {"server": [server.proc.pid], "client_process": [None]}
    cpu_before = _cpu_snapshot(groups)
    await app.sync.connect(timeout=30)
    connected = time.perf_counter()
    timed_out = False
    try:
        await app.sync.wait_until_synced(timeout=timeout)
    except Exception as exc:
        timed_out = True
        _log(f"initial sync: not synced within {timeout} s ({exc})")
    visible = app.todos.count()
    elapsed = time.perf_counter() - start
    cpu = time.thread_time() - cpu
    cpu_after = _cpu_snapshot(groups)
    ticking.cancel()
    await app.sync.disconnect()
    app.close()
    figures: dict[str, Any] = {
        "initial_sync_s": round(elapsed, 3),
        "client_cpu_s": round(cpu, 3),
        "handshake_s": round(connected - start, 3),
        "first_batch_applied_s": round(marks[0][0] - start, 3) if marks else None,
        "records_visible": visible,
        "ops_per_s": round(visible / elapsed),
        "timed_out": timed_out or visible < n,
        "client_event_loop_max_stall_ms": round(max(stalls, default=0.0) * 1000),
        # client_cpu_s above is the event loop's thread; client_process_cpu_s every thread of this process.
        "cpu": _cpu_figures(cpu_before, cpu_after, visible, {}),
    }
    if figures["timed_out"] and visible:
        figures["projected_s"] = round(n * elapsed / visible, 1)
    figures.update(_rate_profile(marks, start))
    return figures


def _rate_profile(marks: list[tuple[float, int]], start: float) -> dict[str, Any]:
    """Operations/s applied over the first and the last fifth of the operations (does it slow down?)."""
    total = sum(n for _, n in marks)
    if total < 10:
        return {}
    fifth = total / 5
    seen = 0
    first_end = last_start = None
    previous = start
    for ts, n in marks:
        if first_end is None and seen + n >= fifth:
            first_end = (ts, seen + n)
        if last_start is None and seen + n >= total - fifth:
            last_start = (previous, seen)
        seen += n
        previous = ts
    out: dict[str, Any] = {}
    if first_end is not None:
        out["ops_per_s_first_fifth"] = round(first_end[1] / max(first_end[0] - start, 1e-9))
    if last_start is not None:
        out["ops_per_s_last_fifth"] = round((total - last_start[1]) / max(marks[-1][0] - last_start[0], 1e-9))
    return out


# ------------------------------------------------------------------------------------------------ 2. fan-out


def _fanout_figures(writer: dict[str, Any], reports: list[dict[str, Any]], expected: int) -> dict[str, Any]:
    start, end = writer["start"], writer["end"]
    window = max(end - start, 1e-9)
    in_window: list[float] = []
    until_all: list[float] = []
    lags: list[float] = []
    short = 0
    for report in reports:
        events = report["events"]
        got = sum(n for _, n in events)
        in_window.append(sum(n for ts, n in events if start <= ts <= end) / window)
        last = max((ts for ts, n in events if n), default=end)
        until_all.append(got / max(last - start, 1e-9))
        lags.append(max(0.0, last - end))
        if got < expected:
            short += 1
    return {
        "writer_ops": writer["written"],
        "writer_window_s": round(window, 2),
        "writer_ops_per_s": round(writer["written"] / window),
        "server_acked_all_after_s": round(writer["acked_at"] - start, 2),
        "each_in_window_ops_per_s": _spread(in_window),
        "each_until_complete_ops_per_s": _spread(until_all),
        "each_last_op_after_window_end_s": {k: round(v, 2) for k, v in _spread_f(lags).items()},
        "subscribers_incomplete": short,
    }


def _process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc), None where that is not readable."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _cpu_snapshot(groups: dict[str, list[int | None]]) -> dict[str, float | None]:
    """CPU seconds so far of each group of processes (summed; ``None`` in a group is this process, every
    thread: ``time.process_time``), None for a group with a process that cannot be read."""
    out: dict[str, float | None] = {}
    for label, pids in groups.items():
        total: float | None = 0.0
        for pid in pids:
            seconds = time.process_time() if pid is None else _process_cpu_s(pid)
            total = None if seconds is None or total is None else total + seconds
        out[label] = total
    return out


def _cpu_figures(
    before: dict[str, float | None], after: dict[str, float | None], operations: int, per: dict[str, int]
) -> dict[str, float]:
    """``<group>_cpu_s`` (CPU spent between the snapshots) and ``<group>_cpu_us_per_op`` (per operation, and
    per process of the group where ``per`` names how many it holds): the machine's other load stretches
    wall time, not these, so they are what to compare between commits on a busy machine."""
    out: dict[str, float] = {}
    for label, start in before.items():
        end = after.get(label)
        if start is None or end is None:
            continue
        spent = end - start
        out[f"{label}_cpu_s"] = round(spent, 3)
        if operations:
            out[f"{label}_cpu_us_per_op"] = round(spent / per.get(label, 1) / operations * 1e6, 1)
    return out


def _spread_f(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


async def _fanout(folder: Path) -> dict[str, Any]:
    server = _server(folder, folder / "fanout.db")
    server.start(timeout=60)
    workers: list[Worker] = []
    try:
        subs = [
            Worker(
                "subscriber",
                {"url": server.sync_url, "db": str(folder / f"sub{i}.db")},
                folder / f"sub{i}.log",
            )
            for i in range(SUBSCRIBERS)
        ]
        writer = Worker(
            "app-writer", {"url": server.sync_url, "db": str(folder / "writer.db")}, folder / "writer.log"
        )
        raw = Worker("raw-writer", {"url": server.sync_url, "count": RAW_STOCK}, folder / "raw.log")
        workers = [*subs, writer, raw]
        _log(f"fan-out: starting {SUBSCRIBERS} subscriber processes and 2 writer processes")
        await asyncio.gather(*(w.start() for w in workers))
        await asyncio.gather(*(w.read(90) for w in workers))  # every one ready
        figures: dict[str, Any] = {
            "subscribers": SUBSCRIBERS,
            "method": "subscribers, writers and server are separate processes",
        }

        total = 0
        assert server.proc is not None
        groups: dict[str, list[int | None]] = {
            "server": [server.proc.pid],
            "writer": [writer.pid],
            "subscribers": [s.pid for s in subs],
        }
        per = {"subscribers": SUBSCRIBERS}
        _log(f"fan-out: app writer floods for {FANOUT_WINDOW_S} s")
        cpu_at_start = _cpu_snapshot(groups)
        writer.send(
            {
                "cmd": "go",
                "mode": "flood",
                "duration": FANOUT_WINDOW_S,
                "batch": WRITE_BATCH,
                "ack_timeout": FANOUT_DRAIN_S,
            }
        )
        result = await writer.read(FANOUT_WINDOW_S + FANOUT_DRAIN_S + 30)
        total += result["written"]
        for sub in subs:
            sub.send({"cmd": "expect", "total": total, "timeout": FANOUT_DRAIN_S})
        reports = await asyncio.gather(*(s.read(FANOUT_DRAIN_S + 30) for s in subs))
        cpu_at_end = _cpu_snapshot(groups)
        figures["app_writer"] = _fanout_figures(result, reports, result["written"])
        figures["app_writer"]["writer_pending_at_end"] = result["pending"]
        figures["app_writer"]["writer_ops_sent_incl_resends"] = result["sent"]
        figures["app_writer"]["cpu"] = _cpu_figures(cpu_at_start, cpu_at_end, result["written"], per)
        await writer.stop()

        _log(f"fan-out: raw protocol writer pushes for up to {FANOUT_WINDOW_S} s")
        groups["writer"] = [raw.pid]
        cpu_at_start = _cpu_snapshot(groups)
        raw.send(
            {"cmd": "go", "duration": FANOUT_WINDOW_S, "batch": WRITE_BATCH, "window": 4, "after": total}
        )
        result = await raw.read(2 * FANOUT_WINDOW_S + 60)
        total += result["written"]
        for sub in subs:
            sub.send({"cmd": "expect", "total": total, "timeout": FANOUT_DRAIN_S})
        reports = await asyncio.gather(*(s.read(FANOUT_DRAIN_S + 30) for s in subs))
        cpu_at_end = _cpu_snapshot(groups)
        figures["raw_writer"] = _fanout_figures(result, reports, result["written"])
        figures["raw_writer"]["server_acked"] = result["acked"]
        figures["raw_writer"]["cpu"] = _cpu_figures(cpu_at_start, cpu_at_end, result["written"], per)

        # The server alone: the same raw writer, 10 sessions that only count (one process, no store).
        await _stop_all(subs)
        _log(f"fan-out: raw writer to {SUBSCRIBERS} counting-only sessions (server capacity)")
        counting = Worker(
            "raw-subscribers", {"url": server.sync_url, "count": SUBSCRIBERS}, folder / "cnt.log"
        )
        workers.append(counting)
        await counting.start()
        await counting.read(60)
        counting.send({"cmd": "connect", "after": total})
        await counting.read(60)
        cpu_before = _process_cpu_s(server.proc.pid)
        groups = {"server": [server.proc.pid], "writer": [raw.pid], "counting_sessions": [counting.pid]}
        cpu_all_before = _cpu_snapshot(groups)
        raw.send(
            {"cmd": "go", "duration": FANOUT_WINDOW_S, "batch": WRITE_BATCH, "window": 4, "after": total}
        )
        result = await raw.read(2 * FANOUT_WINDOW_S + 60)
        counting.send({"cmd": "expect", "total": result["written"], "timeout": FANOUT_DRAIN_S})
        reports = (await counting.read(FANOUT_DRAIN_S + 30))["reports"]
        cpu_after = _process_cpu_s(server.proc.pid)
        cpu_all_after = _cpu_snapshot(groups)
        counted = figures["raw_writer_counting_sessions"] = _fanout_figures(
            result, reports, result["written"]
        )
        counted["cpu"] = _cpu_figures(cpu_all_before, cpu_all_after, result["written"], {})
        counted["server_acked"] = result["acked"]
        # Since the sessions acknowledge (as clients do; before, they did not): ~7 % more server CPU an operation.
        counted["sessions_acknowledge"] = True
        counted["batches_received_again"] = sum(report["again"] for report in reports)
        counted["writer_stock_ran_out"] = result["stock_ran_out"]
        if cpu_before is not None and cpu_after is not None and result["written"]:
            # The server's CPU (every thread) per operation taken in and sent to the 10 sessions: read against
            # the machine suite, less exposed to the machine's swings than the rate.
            counted["server_cpu_us_per_op"] = round((cpu_after - cpu_before) / result["written"] * 1e6, 1)
        return figures
    finally:
        await _stop_all(workers)
        server.terminate()


# ------------------------------------------------------------------------------------------------ 3. latency


async def _latency(folder: Path) -> dict[str, Any]:
    server = _server(folder, folder / "latency.db")
    server.start(timeout=60)
    workers: list[Worker] = []
    try:
        b = Worker(
            "subscriber", {"url": server.sync_url, "db": str(folder / "lat-b.db")}, folder / "lat-b.log"
        )
        a = Worker(
            "app-writer", {"url": server.sync_url, "db": str(folder / "lat-a.db")}, folder / "lat-a.log"
        )
        workers = [a, b]
        await asyncio.gather(a.start(), b.start())
        await asyncio.gather(a.read(60), b.read(60))
        figures: dict[str, Any] = {"method": "A and B are client processes; B: time.time() - stamp on apply"}
        assert server.proc is not None
        groups: dict[str, list[int | None]] = {"server": [server.proc.pid], "a": [a.pid], "b": [b.pid]}
        total = 0
        # The target's rate, then a light load for reference (latency without queueing in A).
        for key, rate, duration in (
            ("at_500_ops_per_s", LATENCY_RATE, LATENCY_WINDOW_S),
            ("at_50_ops_per_s", 50, 3.0),
        ):
            _log(f"latency: A writes {rate} op/s for {duration} s; B measures")
            cpu_before = _cpu_snapshot(groups)
            a.send({"cmd": "go", "mode": "paced", "rate": rate, "duration": duration, "ack_timeout": 10})
            result = await a.read(2 * duration + 40)
            total += result["written"]
            b.send({"cmd": "expect", "total": total, "timeout": 10})
            report = await b.read(40)
            cpu_after = _cpu_snapshot(groups)
            window = result["end"] - result["start"]
            figures[key] = {
                "written": result["written"],
                "achieved_ops_per_s": round(result["written"] / window),
                "visible_on_b": sum(n for _, n in report["events"]),
                "batches_b_applied": len(report["events"]),
                **_stats_ms(report["latencies"]),
                # Paced writes: the CPU per operation includes each process's idle wake-ups over the window.
                "cpu": _cpu_figures(cpu_before, cpu_after, result["written"], {}),
            }
        return figures
    finally:
        await _stop_all(workers)
        server.terminate()


# ------------------------------------------------------------------------------------------- 4. echo ceiling


def _sample_frames() -> tuple[str, str]:
    from offline import HybridLogicalClock, create_operation, generate_uuid_v7
    from offline.sync import protocol as p

    node = generate_uuid_v7()
    clock = HybridLogicalClock(node)
    wires = [
        create_operation(
            {
                "node_id": node,
                "type": "insert",
                "collection": "todos",
                "record_id": generate_uuid_v7(),
                "data": {"title": f"todo {i}", "n": i},
                "timestamp": clock.now(),
                "sequence_number": i + 1,
                "schema_version": 1,
                "causal_context": {node: 1},
            }
        ).to_wire()
        for i in range(WRITE_BATCH)
    ]
    one = p.encode(p.OperationMessage(p.new_message_id(), wires[0], 1))
    batch = p.encode(p.OperationBatch(p.new_message_id(), tuple(wires), True, 0, 0, WRITE_BATCH))
    return one, batch


async def _echo_rates(
    url: str, frame: str, seconds: float, max_messages: int, compression: bool
) -> dict[str, Any]:
    import websockets

    out: dict[str, Any] = {}
    async with websockets.connect(url, max_size=None, compression="deflate" if compression else None) as ws:
        # Round trips, one message in flight.
        count = 0
        start = time.perf_counter()
        while count < max_messages and time.perf_counter() - start < seconds:
            await ws.send(frame)
            await ws.recv()
            count += 1
        out["round_trips_per_s"] = round(count / (time.perf_counter() - start))
        # Pipelined: send as fast as the socket takes them while a reader counts the echoes.
        received = 0
        sent = 0

        async def reader() -> None:
            nonlocal received
            while True:
                await ws.recv()
                received += 1

        reading = asyncio.create_task(reader())
        start = time.perf_counter()
        while sent < max_messages and time.perf_counter() - start < seconds:
            await ws.send(frame)
            sent += 1
        deadline = time.monotonic() + 20
        while received < sent and not reading.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        elapsed = time.perf_counter() - start
        reading.cancel()
        with contextlib.suppress(BaseException):
            await reading
        out["pipelined_messages_per_s"] = round(received / elapsed)
    return out


async def _echo(folder: Path) -> dict[str, Any]:
    one, batch = _sample_frames()
    figures: dict[str, Any] = {"operation_frame_bytes": len(one), "batch_frame_bytes": len(batch)}
    for compression in (True, False):
        server = Worker("echo-server", {"compression": compression}, folder / f"echo-{compression}.log")
        await server.start()
        try:
            port = (await server.read(30))["port"]
            url = f"ws://127.0.0.1:{port}"
            label = "deflate" if compression else "uncompressed"
            _log(f"echo: {label}")
            single = await _echo_rates(url, one, 1.0, 50_000, compression)
            many = await _echo_rates(url, batch, 1.0, 2_000, compression)
            many["pipelined_ops_per_s_equivalent"] = many["pipelined_messages_per_s"] * WRITE_BATCH
            figures[label] = {"operation_frame": single, "batch_frame": many}
        finally:
            await server.stop()
    return figures


# ---------------------------------------------------------------------------------------------------- run


async def _run_all(full: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as name:
        folder = Path(name)
        steps: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
            (
                "initial_sync",
                lambda: _initial_sync(folder, INITIAL_OPERATIONS if full else 10_000, INITIAL_SYNC_TIMEOUT_S),
            ),
            ("fanout", lambda: _fanout(folder)),
            ("latency", lambda: _latency(folder)),
            ("websocket_echo", lambda: _echo(folder)),
        ]
        for key, step in steps:
            t0 = time.perf_counter()
            try:
                figures[key] = await step()
            except Exception as exc:  # report the failure, keep measuring the rest
                _log(f"{key} failed: {type(exc).__name__}: {exc}")
                figures[key] = {"error": f"{type(exc).__name__}: {exc}"}
            figures[key]["step_s"] = round(time.perf_counter() - t0, 1)
    figures["suite_s"] = round(time.perf_counter() - started, 1)
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    figures["targets"] = TARGETS
    return figures


def run(full: bool = True) -> dict[str, Any]:
    return asyncio.run(_run_all(full))


def _main(argv: list[str]) -> None:
    if len(argv) >= 3 and argv[0] == "worker":
        asyncio.run(WORKERS[argv[1]](json.loads(argv[2])))
        return
    json.dump(run(), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    _main(sys.argv[1:])
