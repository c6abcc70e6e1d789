"""Many connections on one server process, functionally: 1,000 concurrent sync clients (this test's process,
separate from the server's) are all admitted and served. Each client of a group of ten writes once and must
receive its nine peers' writes and nobody else's; the server counts 1,000 sessions, then none once they leave.

The figures (memory per connection, throughput while loaded) are `python -m bench load`'s job."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.load import ENTRY_SOURCE, GROUP_SIZE, LoadClient, open_clients, raise_open_file_limit
from tests.support.servers import ServerProcess

from .support import status, wait_for

CLIENTS = 1000


def test_a_thousand_connections_are_held_and_served(tmp_path: Path) -> None:
    raise_open_file_limit()
    entry = tmp_path / "server.py"
    entry.write_text(ENTRY_SOURCE)
    server = ServerProcess(entry, store="sqlite", db=str(tmp_path / "server.db")).start()

    async def scenario() -> None:
        clients: list[LoadClient] = await open_clients(server.sync_url, 0, CLIENTS)
        try:
            assert (await asyncio.to_thread(status, server))["connectedClients"] == CLIENTS
            await asyncio.gather(*(client.write(1) for client in clients))
            assert all(client.acked == 1 for client in clients)
            await wait_for(
                lambda: all(client.received == GROUP_SIZE - 1 for client in clients),
                lambda: f"every client to get its group's writes: {sorted({c.received for c in clients})}",
            )
        finally:
            await asyncio.gather(*(client.close() for client in clients))
        await wait_for(lambda: status(server)["connectedClients"] == 0, "every session to be freed")

    try:
        asyncio.run(scenario())
    finally:
        assert server.terminate() == 0
