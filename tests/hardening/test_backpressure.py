"""Slow and stalled readers, fast writers: server memory stays bounded, everyone else keeps being served.

- A peer that stops reading (a bare socket with a tiny receive buffer) while a writer pushes tens of megabytes
  past it to two healthy readers: the server's RSS grows by far less than what flowed past the stalled peer,
  the healthy readers get everything, and the stalled peer is eventually cut off and its session freed.
- A peer that reads but never acknowledges is told RESYNC_REQUIRED (retriable, close 1013), and resumes from
  the last delivery it applied when it reconnects.
- A writer over its operations-per-second rate is slowed (acknowledgements wait), never refused or dropped.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from offline.core.uuid7 import generate_uuid_v7
from offline.sync import protocol as p

from .support import BareSocketPeer, RawClient, rss_bytes, session_nodes, start_server, status, wait_for

MB = 1024 * 1024


class RssSampler(threading.Thread):
    """Samples a process's resident memory every 50 ms until stopped; ``peak`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.05):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def stop(self) -> int:
        self._halt.set()
        self.join(5)
        return self.peak


def test_a_stalled_reader_does_not_grow_server_memory_and_others_keep_syncing(tmp_path: Path) -> None:
    records, warmup, updates, payload = 20, 1000, 10000, 4096
    env = {
        "OFFLINE_RECENT_OPERATIONS": "200",  # keep the relay's in-memory window small: what remains is buffers
        "OFFLINE_SEND_STALL_TIMEOUT": "10",
        # Pages of 100 operations (400 KB here), not 500: each session's page in hand is transient memory that
        # has nothing to do with the stalled peer, and three sessions building 2 MB pages at once under a busy
        # machine made the peak swing by 20 MB (CI: +21.9 MB of a 19.5 MB bound).
        "OFFLINE_BATCH_SIZE": "100",
    }
    server = start_server(tmp_path / "server", env=env, db=str(tmp_path / "server.db"))
    assert server.proc is not None
    pid = server.proc.pid

    async def scenario() -> None:
        writer, readers = RawClient(server.sync_url), [RawClient(server.sync_url) for _ in range(2)]
        for client in (writer, *readers):
            await client.open()
        ids = [generate_uuid_v7() for _ in range(records)]
        await writer.push([writer.writer.op("boards", {"name": "start"}, record_id=i) for i in ids])

        def big_updates(count: int) -> list[dict[str, Any]]:
            return [
                writer.writer.op(
                    "boards",
                    {"name": secrets.token_hex(payload // 2)},
                    record_id=ids[n % records],
                    kind="update",
                )
                for n in range(count)
            ]

        # Warm up with the same traffic first: the baseline then holds the pipeline's steady-state buffers.
        await writer.push(big_updates(warmup), batch=100, window=4)
        await wait_for(
            lambda: all(len(r.received) == records + warmup for r in readers), "the warm-up relayed"
        )

        slow_node = generate_uuid_v7()
        slow = await asyncio.to_thread(BareSocketPeer, "127.0.0.1", server.port, rcvbuf=4096)
        await asyncio.to_thread(slow.handshake, slow_node)
        await wait_for(lambda: slow_node in session_nodes(server), "the slow peer's session")
        # From here on it never reads: every byte the server sends it piles up in front of it.
        baseline = rss_bytes(pid)
        sampler = RssSampler(pid)
        sampler.start()
        try:
            acks = await writer.push(big_updates(updates), batch=100, window=4)
            assert all(ack.delivery_sequence is not None for ack in acks)
            expected = records + warmup + updates
            await wait_for(
                lambda: all(len(r.received) == expected for r in readers),
                lambda: f"healthy readers to get all {expected}: {[len(r.received) for r in readers]}",
                timeout=120,
            )
            snapshot = status(server)
            behind = [c for c in snapshot["clients"] if c["nodeId"] == slow_node]
        finally:
            peak = sampler.stop()
        flowed = updates * payload
        growth = peak - baseline
        print(
            f"\n[slow consumer] {flowed / MB:.0f} MB relayed past the stalled peer; server RSS "
            f"{baseline / MB:.0f} MB -> peak {peak / MB:.0f} MB (+{growth / MB:.1f} MB); stalled session "
            f"{'cursor ' + str(behind[0]['cursor']) + ' of ' + str(snapshot['deliverySequence']) if behind else 'already cut'}"
        )
        # Queueing the stream for the stalled peer would cost at least what flowed past it.
        assert growth < flowed / 2, (
            f"server memory grew by {growth / MB:.1f} MB while {flowed / MB:.0f} MB flowed"
        )
        if behind:  # still connected: the relay waited for it instead of reading ahead into memory
            assert behind[0]["cursor"] < snapshot["deliverySequence"] // 2

        await wait_for(
            lambda: slow_node not in session_nodes(server), "the stalled session to be cut off", timeout=60
        )
        assert await asyncio.to_thread(slow.is_closed_by_peer, 5.0)
        slow.close()
        # Everybody else is untouched.
        assert all(c.closed is None for c in (writer, *readers))
        for client in (writer, *readers):
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        assert server.terminate() == 0


def test_a_reader_that_never_acknowledges_is_told_to_resync_and_resumes(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", store="memory", env={"OFFLINE_MAX_UNACKED_BATCHES": "20"})

    async def scenario() -> None:
        writer, healthy = RawClient(server.sync_url), RawClient(server.sync_url)
        silent = RawClient(server.sync_url, auto_ack=False)
        for client in (writer, healthy, silent):
            await client.open()
        total = 60
        for n in range(total):  # one batch at a time: each commit is its own relay batch
            await writer.push([writer.writer.op("boards", {"name": f"b{n}"})])
        code = await silent.wait_closed()
        assert code == 1013, (code, silent.close_reason)
        assert [(e.code, e.retriable) for e in silent.errors] == [(p.RESYNC_REQUIRED, True)], silent.errors
        await wait_for(lambda: len(healthy.received) == total, "the healthy reader to get every write")
        assert healthy.closed is None

        # It resumes from the last delivery it applied: nothing missing, nothing it had sent again.
        applied = silent.received
        again = RawClient(server.sync_url, writer=silent.writer)
        await again.open(after=silent.last_delivery)
        await wait_for(lambda: len(applied) + len(again.received) >= total, "the rest after reconnecting")
        names = sorted(op["data"]["name"] for op in [*applied, *again.received])
        assert names == sorted(f"b{n}" for n in range(total))
        for client in (writer, healthy, again):
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        assert server.terminate() == 0


def test_a_fast_writer_is_slowed_not_dropped(tmp_path: Path) -> None:
    # 400 operations per second, bursts of 100: pushing 1,100 takes at least 2.5 s of waiting.
    env = {
        "OFFLINE_OPERATIONS_PER_SECOND": "400",
        "OFFLINE_OPERATIONS_BURST": "100",
        "OFFLINE_MAX_BATCH_OPERATIONS": "100",
    }
    server = start_server(tmp_path / "server", store="memory", env=env)

    async def scenario() -> None:
        writer, reader = RawClient(server.sync_url), RawClient(server.sync_url)
        await writer.open()
        await reader.open()
        ops = [writer.writer.op("boards", {"name": f"n{n}"}) for n in range(1100)]
        started = time.monotonic()
        acks = await writer.push(ops, batch=100, window=11)
        held = time.monotonic() - started
        assert len(acks) == 11 and all(a.delivery_sequence is not None for a in acks)
        assert writer.errors == [] and writer.rejections == [] and writer.closed is None
        await wait_for(lambda: len(reader.received) == 1100, "every write relayed")
        metrics = await asyncio.to_thread(_metrics, server.http_url)
        assert 'offline_sync_connections_limited_total{reason="rate_limited_batches"}' in metrics, metrics
        print(f"\n[rate limit] 1,100 operations at 400/s took {held:.1f} s to be acknowledged")
        for client in (writer, reader):
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        assert server.terminate() == 0


def _metrics(base: str) -> str:
    import urllib.request

    with urllib.request.urlopen(base + "/__offline/metrics", timeout=10) as response:
        return response.read().decode()
