"""How fast this machine is right now, so figures from different days can be compared.

The same code on the same kind of machine has measured up to 1.8x apart within one session (CPU), and more
for wake-up latency (a process waiting on a socket or a thread). These figures depend on nothing in
this project: read the others against them.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import tempfile
import threading
import time
from typing import Any

from bench.timing import best_of


def _python_loop() -> None:
    for _ in range(10_000_000):
        pass


def _sqlite_commit_us(path: str, n: int = 2_000) -> float:
    """Microseconds per single-row INSERT committed alone (WAL, synchronous=NORMAL: the local store's
    settings): the floor under every durable local write."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
    body = "x" * 400
    start = time.perf_counter()
    for _ in range(n):
        conn.execute("INSERT INTO t (body) VALUES (?)", (body,))
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed / n * 1e6


def _loopback_round_trip_us(n: int = 2_000) -> float:
    """Median microseconds for one byte to go to another thread over loopback TCP and back: what every hop
    between the sync processes pays to wake its reader."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    for sock in (client, peer):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def echo() -> None:
        while data := peer.recv(1):
            peer.sendall(data)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        client.sendall(b"x")
        client.recv(1)
        samples.append(time.perf_counter() - start)
    client.close()
    thread.join(5)
    peer.close()
    server.close()
    samples.sort()
    return samples[len(samples) // 2] * 1e6


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        return {
            "cpus": os.cpu_count(),
            "python_loop_10m_s": round(best_of(_python_loop, 3), 3),
            "sqlite_commit_us": round(
                min(_sqlite_commit_us(os.path.join(folder, f"floor{i}.db")) for i in range(2)), 1
            ),
            "loopback_round_trip_us": round(_loopback_round_trip_us(), 1),
        }
