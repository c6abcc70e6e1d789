"""One address opening thousands of sync WebSockets that never send a handshake cannot take every connection
slot: past its per-address allowance it is refused at once, what it holds is cut off at the handshake
deadline, and a client from another address connects and completes its handshake meanwhile."""

from __future__ import annotations

import asyncio
from pathlib import Path

from offline.sync import protocol as p
from tests.support.abuse import SilentFlood, raise_open_file_limit

from .support import TIMEOUT, BareSocketPeer, start_server, status, wait_for

FLOOD = 5000


def test_a_client_connects_while_another_address_holds_5000_silent_sockets(tmp_path: Path) -> None:
    # One socket a flood connection here, one per client and a few for the runner: 5,000 needs more than the
    # usual soft limit of 1,024 (the server raises its own).
    limit = raise_open_file_limit()
    flood_size = min(FLOOD, limit - 200)
    assert flood_size >= 1000, f"only {limit} open files allowed here"
    server = start_server(
        tmp_path,
        store="memory",
        env={"OFFLINE_ADMIN_TOKEN": "admin-token-for-tests-0123456789", "OFFLINE_HANDSHAKE_TIMEOUT": "3"},
    )

    async def scenario() -> None:
        flood = SilentFlood("127.0.0.1", server.port, flood_size, source="127.0.0.2")
        try:
            await flood.open()
            # Every socket got its upgrade (nothing was refused at the TCP or HTTP level)...
            assert flood.upgraded + flood.failed == flood_size
            # ...while a client from another address is served as usual, the flood still connected.
            legit = BareSocketPeer("127.0.0.1", server.port)
            reply = await asyncio.to_thread(legit.handshake)
            assert reply.accepted
            counts = status(server, "admin-token-for-tests-0123456789")
            assert len(counts["clients"]) == 1
            # The flood's address held at most its allowance (64) at a time; the rest were told to retry later.
            # (Each deadline that passes while the flood connects frees another 64, so not exactly 64 held.)
            refused = await asyncio.to_thread(_refused_by_metrics, server)
            assert refused >= flood_size // 2, refused
            # And what it held is let go at the handshake deadline.
            await wait_for(
                lambda: _open_sync_connections(server) == 1,
                "the flood's silent connections to be cut off at the handshake deadline",
                timeout=TIMEOUT,
            )
            legit.send_text(p.encode(p.Acknowledgment(p.new_message_id(), "nothing", 0, None)))
            assert not legit.is_closed_by_peer(0.2)  # the real client's session carries on
            legit.close()
        finally:
            await flood.close()

    try:
        asyncio.run(scenario())
    finally:
        server.terminate()


def _metrics(server: object) -> str:
    import urllib.request

    from tests.support.servers import ServerProcess

    assert isinstance(server, ServerProcess)
    request = urllib.request.Request(server.http_url + "/__offline/metrics")
    request.add_header("Authorization", "Bearer admin-token-for-tests-0123456789")
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.read().decode())


def _refused_by_metrics(server: object) -> int:
    for line in _metrics(server).splitlines():
        if line.startswith('offline_sync_connections_limited_total{reason="refused_pending_per_address"}'):
            return int(float(line.split()[-1]))
    return 0


def _open_sync_connections(server: object) -> int:
    for line in _metrics(server).splitlines():
        if line.startswith("offline_sync_connections_open "):
            return int(float(line.split()[-1]))
    raise AssertionError("no offline_sync_connections_open metric")
