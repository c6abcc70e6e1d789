"""One session's batches are stored while the next ones are read: batches sent back to back share group
commits instead of each waiting for the one before it, and are still judged, stored and acknowledged in the
order they were sent. A real server process on SQLite (every commit fsynced) and a real WebSocket client."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from offline.sync import protocol as p
from tests.hardening.support import TIMEOUT, RawClient, start_server

TOKEN = "pipeline-admin-token"
BATCHES = 40


def commits(http_url: str) -> float:
    """How many store transactions the server has committed (its commit-time histogram's count)."""
    request = urllib.request.Request(http_url + "/__offline/metrics")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("offline_store_commit_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no offline_store_commit_seconds_count in the metrics")


def test_batches_sent_back_to_back_share_commits_and_are_acknowledged_in_order(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", env={"OFFLINE_ADMIN_TOKEN": TOKEN})
    try:
        before = commits(server.http_url)

        async def scenario() -> tuple[list[int], list[p.Acknowledgment], list[int]]:
            client = RawClient(server.sync_url)
            await client.open()
            ops = [client.writer.op("boards", {"name": f"board {i}"}) for i in range(BATCHES)]
            answered: list[int] = []
            futures = []
            for index, op in enumerate(ops):  # every batch sent before any is acknowledged
                future = await client.send_batch([op])
                future.add_done_callback(lambda _, index=index: answered.append(index))
                futures.append(future)
            acks = [await asyncio.wait_for(future, TIMEOUT) for future in futures]
            await client.close()
            return answered, acks, [op["sequenceNumber"] for op in ops]

        answered, acks, sequences = asyncio.run(scenario())
        assert answered == list(range(BATCHES))  # acknowledged in the order sent
        assert [ack.last_sequence_number for ack in acks] == sequences
        deliveries = [ack.delivery_sequence for ack in acks]
        assert all(isinstance(d, int) for d in deliveries)
        assert deliveries == sorted(deliveries) and len(set(deliveries)) == BATCHES  # stored in that order
        # Read one at a time, each batch was its own commit (BATCHES of them); read while the earlier ones
        # are stored, those that arrive meanwhile are committed together.
        assert commits(server.http_url) - before < BATCHES * 3 / 4
    finally:
        assert server.terminate() == 0
