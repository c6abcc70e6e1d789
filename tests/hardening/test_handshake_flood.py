"""One address opening thousands of sync WebSockets that never send a handshake cannot take every connection
slot: past its per-address allowance it is refused at once, what it holds is cut off at the handshake
deadline, and a client from another address connects and completes its handshake meanwhile. The same for
plain TCP connections that never finish their HTTP request (each holds a file descriptor)."""

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
            assert flood.upgraded + flood.failed == flood_size
            # A client from another address is served as usual, the flood still connected.
            legit = BareSocketPeer("127.0.0.1", server.port)
            reply = await asyncio.to_thread(legit.handshake)
            assert reply.accepted
            counts = status(server, "admin-token-for-tests-0123456789")
            assert len(counts["clients"]) == 1
            # The flood's address held at most its allowance (64) at a time; the rest were dropped before their
            # upgrade completed (too many of its connections still sending their request) or told to retry
            # later. (Each deadline that passes while the flood connects frees another 64.)
            refused = await asyncio.to_thread(_refused_by_metrics, server)
            assert refused + flood.failed >= flood_size // 2, (refused, flood.failed)
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


def _metrics(server: object, token: str | None = "admin-token-for-tests-0123456789") -> str:
    import urllib.request

    from tests.support.servers import ServerProcess

    assert isinstance(server, ServerProcess)
    request = urllib.request.Request(server.http_url + "/__offline/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
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


def test_connections_that_never_finish_a_request_are_bounded_per_address_and_dropped(tmp_path: Path) -> None:
    limit = raise_open_file_limit()
    flood_size = min(2000, limit - 200)
    server = start_server(tmp_path, store="memory", env={"OFFLINE_HANDSHAKE_TIMEOUT": "3"})

    async def scenario() -> None:
        flood = SilentFlood(
            "127.0.0.1", server.port, flood_size, source="127.0.0.2", partial=b"GET /health HT"
        )
        try:
            await flood.open()
            legit = BareSocketPeer("127.0.0.1", server.port)
            assert (await asyncio.to_thread(legit.handshake)).accepted
            legit.close()
            # Past its allowance (64; four times that for a burst younger than the grace period), the address's
            # connections were dropped...
            assert await flood.still_open() <= 4 * 64
            # ...and the rest at the deadline.
            deadline = asyncio.get_running_loop().time() + TIMEOUT
            while (still := await flood.still_open()) > 0:
                assert asyncio.get_running_loop().time() < deadline, f"{still} silent connections still open"
                await asyncio.sleep(0.2)
            # The server counts both kinds of drop, and waits for nothing any more.
            metrics = await asyncio.to_thread(_metrics, server, None)
            assert "offline_http_connections_waiting 0.0" in metrics
            for reason in ("per_address", "deadline"):
                line = f'offline_http_connections_dropped_total{{reason="{reason}"}}'
                assert any(
                    row.startswith(line) and float(row.split()[-1]) > 0 for row in metrics.splitlines()
                )
        finally:
            await flood.close()

    try:
        asyncio.run(scenario())
    finally:
        server.terminate()


def test_at_a_limit_a_connection_silent_past_the_grace_period_gives_way() -> None:
    from server_runtime.connections import SILENT, Connection, ConnectionGuard
    from server_runtime.limits import ConnectionLimits

    async def scenario() -> None:
        limits = ConnectionLimits(max_connections=3, max_pending_per_address=2, silent_grace=30.0)
        guard = ConnectionGuard(limits)
        first, second = guard.admit(None, "198.51.100.1"), guard.admit(None, "198.51.100.1")
        assert isinstance(first, Connection) and isinstance(second, Connection)
        # Both young: a third from the address is refused, one from elsewhere admitted.
        assert isinstance(guard.admit(None, "198.51.100.1"), str)
        other = guard.admit(None, "203.0.113.5")
        assert isinstance(other, Connection)
        # The oldest has said nothing for longer than the grace period: it gives way to the newcomer.
        first.since -= 60
        third = guard.admit(None, "198.51.100.1")
        assert isinstance(third, Connection)
        assert first.leaving == SILENT and first.stop.is_set()
        # One that spoke is not evicted, however old; the process-wide limit evicts the same way.
        guard.heard(second)
        second.since -= 60
        guard.release(first)
        assert isinstance(guard.admit(None, "198.51.100.1"), str)  # second spoke, third is young
        other.since -= 60
        assert len(guard.connections) == 3
        # The process is full: its oldest silent connection (not the one that spoke) gives way.
        fourth = guard.admit(None, "192.0.2.9")
        assert isinstance(fourth, Connection) and other.leaving == SILENT and second.leaving is None
        assert guard.counts["cut_silent"] == 2
        await guard.drain(0.01)

    asyncio.run(scenario())
