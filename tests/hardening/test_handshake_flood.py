"""One address opening thousands of sync WebSockets that never send a handshake cannot take every connection
slot: past its per-address allowance it is refused at once, what it holds is cut off at the handshake
deadline, and a client from another address connects and completes its handshake meanwhile. The same for
plain TCP connections that never finish their HTTP request (each holds a file descriptor)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from offline.sync import protocol as p
from server_runtime.limits import ConnectionLimits
from tests.support.abuse import SilentFlood, raise_open_file_limit
from tests.support.servers import ServerProcess

from .support import TIMEOUT, BareSocketPeer, start_server, status, wait_for

FLOOD = 5000
ALLOWANCE = ConnectionLimits().max_pending_per_address  # the default


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
            opening = asyncio.create_task(flood.open())
            # While the flood connects, the server never holds more silent connections than the address's
            # allowance, whatever the flood's size: the rest are refused or give way.
            most = 0
            while not opening.done():
                most = max(most, await asyncio.to_thread(_gauge, server, "offline_sync_connections_silent"))
                await asyncio.sleep(0.05)
            await opening
            assert flood.upgraded + flood.failed == flood_size
            assert most <= ALLOWANCE, most
            # The connections told to go away were hung up at once, not kept until their peer says goodbye.
            assert await flood.still_open() <= ALLOWANCE
            # A client from another address is served as usual, the flood still connected.
            legit = BareSocketPeer("127.0.0.1", server.port)
            reply = await asyncio.to_thread(legit.handshake)
            assert reply.accepted
            counts = status(server, "admin-token-for-tests-0123456789")
            assert len(counts["clients"]) == 1
            # The flood's connections were refused (its address at its allowance), made way for newer ones
            # (silent past the grace period) or were cut off at the handshake deadline: all but those it
            # still holds, and in the end those too.
            ended = sum(await asyncio.to_thread(_limited, server))
            assert ended + flood.failed >= flood_size - ALLOWANCE, (ended, flood.failed)
            await wait_for(
                lambda: _gauge(server, "offline_sync_connections_open") == 1,
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


def _limited(server: object) -> list[int]:
    """The flood-related endings of offline_sync_connections_limited_total."""
    reasons = ("refused_pending_per_address", "cut_silent", "cut_crowded", "cut_handshake_timeout")
    found = []
    for line in _metrics(server).splitlines():
        if line.startswith("offline_sync_connections_limited_total{") and any(r in line for r in reasons):
            found.append(int(float(line.split()[-1])))
    return found


def _gauge(server: object, name: str) -> int:
    for line in _metrics(server).splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[-1]))
    raise AssertionError(f"no {name} metric")


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
            # Past its allowance, the address's connections were dropped...
            assert await flood.still_open() <= ALLOWANCE
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
        limits = ConnectionLimits(max_connections=4, max_pending_per_address=2, silent_grace=30.0)
        guard = ConnectionGuard(limits)
        address = "198.51.100.1"
        first, second = guard.admit(None, address), guard.admit(None, address)
        assert isinstance(first, Connection) and isinstance(second, Connection)
        # Both young and silent: a third from the address is refused, one from elsewhere admitted.
        assert isinstance(guard.admit(None, address), str)
        other = guard.admit(None, "203.0.113.5")
        assert isinstance(other, Connection)
        # One that sent its handshake no longer counts: the address may open another.
        guard.heard(second)
        third = guard.admit(None, address)
        assert isinstance(third, Connection)
        assert isinstance(guard.admit(None, address), str)  # first and third: silent and young
        # The oldest has said nothing for longer than the grace period: it gives way to the newcomer.
        first.since -= 60
        fourth = guard.admit(None, address)
        assert isinstance(fourth, Connection) and first.leaving == SILENT and first.stop.is_set()
        guard.release(first)
        # The process is full (second, other, third, fourth): its oldest silent connection gives way, never
        # one that spoke, however old.
        second.since -= 60
        other.since -= 60
        assert len(guard.connections) == 4
        fifth = guard.admit(None, "192.0.2.9")
        assert isinstance(fifth, Connection) and other.leaving == SILENT and second.leaving is None
        assert guard.counts["cut_silent"] == 2
        await guard.drain(0.01)

    asyncio.run(scenario())


def test_one_address_holds_a_quarter_of_the_pre_sign_in_slots_at_most() -> None:
    """With the default limits, young silent sockets from one address (too young to give way) leave room for
    others: several more addresses may connect before the process-wide allowance is reached."""
    from server_runtime.connections import Connection, ConnectionGuard

    async def scenario() -> None:
        limits = ConnectionLimits()
        guard = ConnectionGuard(limits)
        held = 0
        while isinstance(guard.admit(None, "198.51.100.1"), Connection):
            held += 1
        assert held == limits.max_pending_per_address
        assert held * 4 <= limits.max_unauthenticated_connections, (
            held,
            limits.max_unauthenticated_connections,
        )
        for other in ("203.0.113.5", "203.0.113.6", "203.0.113.7"):
            assert isinstance(guard.admit(None, other), Connection), other
        assert guard.counts["refused_unauthenticated"] == 0
        await guard.drain(0.01)

    asyncio.run(scenario())


def _server_where_nothing_gives_way_by_age(tmp_path: Path, **env: str) -> ServerProcess:
    """A grace period and a handshake deadline longer than any test: no silent connection gives way by age."""
    return start_server(
        tmp_path,
        store="memory",
        env={
            "OFFLINE_ADMIN_TOKEN": "admin-token-for-tests-0123456789",
            "OFFLINE_HANDSHAKE_TIMEOUT": "600",
            "OFFLINE_SILENT_GRACE": "600",
            **env,
        },
    )


@contextlib.asynccontextmanager
async def _one_network_floods(server: ServerProcess, partial: bytes | None = None) -> AsyncIterator[None]:
    """Eight addresses of 127.0.1.0/24 open their whole allowance of silent connections each (WebSockets, or
    with ``partial`` request heads never finished), held open until the block ends."""
    floods = [
        SilentFlood("127.0.0.1", server.port, ALLOWANCE, source=f"127.0.1.{i}", partial=partial)
        for i in range(1, 9)
    ]
    try:
        for flood in floods:
            await flood.open()
        yield
    finally:
        for flood in floods:
            await flood.close()


async def _a_client_is_accepted(server: ServerProcess) -> None:
    """A client from 127.0.0.1 completes its handshake (the first reply accepts it)."""
    legit = BareSocketPeer("127.0.0.1", server.port)
    reply = await asyncio.to_thread(legit.handshake)
    assert reply.accepted, reply
    legit.close()


def test_a_client_is_admitted_at_once_while_another_address_holds_its_whole_allowance(tmp_path: Path) -> None:
    # The client gets in only because one address cannot take the slots every address shares before sign-in.
    server = _server_where_nothing_gives_way_by_age(tmp_path)

    async def scenario() -> None:
        flood = SilentFlood("127.0.0.1", server.port, 1000, source="127.0.0.2")
        try:
            await flood.open()
            assert await asyncio.to_thread(_gauge, server, "offline_sync_connections_silent") == ALLOWANCE
            await _a_client_is_accepted(server)
            assert await flood.still_open() == ALLOWANCE
        finally:
            await flood.close()

    try:
        asyncio.run(scenario())
    finally:
        server.terminate()


def test_a_crowded_network_gives_way_to_a_newcomer_from_another_one() -> None:
    """Young silent sockets from a few addresses of one network (an IPv4 /24, an IPv6 /48: what one party
    gets as easily as one address) fill every slot shared before sign-in; none is old enough to give way.
    A client from another network still gets in, in place of one of the crowded network's silent sockets,
    while one more from the crowded network is refused: each network's share, not first come first served."""
    from server_runtime.connections import SILENT, Connection, ConnectionGuard

    async def scenario(crowded: list[str], newcomer: str, neighbour: str) -> None:
        limits = ConnectionLimits(silent_grace=600.0)
        guard = ConnectionGuard(limits)
        held = [conn for address in crowded for conn in _fill(guard, address)]
        assert len(held) == limits.max_unauthenticated_connections
        assert isinstance(guard.admit(None, neighbour), str)
        assert guard.counts["refused_unauthenticated"] == 1
        admitted = guard.admit(None, newcomer)
        assert isinstance(admitted, Connection), admitted
        leaving = [conn for conn in held if conn.leaving is not None]
        assert len(leaving) == 1 and leaving[0].leaving == SILENT
        guard.release(leaving[0])
        # The newcomer's network may hold as many as the crowded one before it no longer gives way.
        assert isinstance(guard.admit(None, newcomer), Connection)
        assert isinstance(guard.admit(None, neighbour), str)
        # A socket that spoke never gives way, however crowded its network.
        for conn in held:
            if conn.leaving is None:
                guard.heard(conn)
        assert isinstance(guard.admit(None, neighbour), Connection)  # in place of a newcomer's silent one
        for conn in list(guard.silent):
            guard.heard(conn)
        assert isinstance(guard.admit(None, neighbour), str)
        assert guard.counts["cut_crowded"] == 3
        await guard.drain(0.01)

    quarter = ConnectionLimits().max_unauthenticated_connections // 4
    assert quarter == ConnectionLimits().max_pending_per_address
    asyncio.run(scenario([f"198.51.100.{i}" for i in range(1, 5)], "203.0.113.5", "198.51.100.77"))
    asyncio.run(scenario([f"2001:db8:1:{i}::/64" for i in range(4)], "2001:db8:2::/64", "2001:db8:1:ff::/64"))


def _fill(guard: object, address: str) -> list[object]:
    from server_runtime.connections import Connection, ConnectionGuard

    assert isinstance(guard, ConnectionGuard)
    held: list[object] = []
    while isinstance(conn := guard.admit(None, address), Connection):
        held.append(conn)
    return held


def test_a_client_is_admitted_at_once_while_one_network_holds_every_shared_slot(tmp_path: Path) -> None:
    # Eight addresses of 127.0.1.0/24 open 64 silent sockets each: 512 attempts for 256 shared slots, none
    # giving way by age. The client, from 127.0.0.1 (another /24), completes its handshake at once.
    server = _server_where_nothing_gives_way_by_age(tmp_path)
    shared = ConnectionLimits().max_unauthenticated_connections

    async def scenario() -> None:
        async with _one_network_floods(server):
            assert await asyncio.to_thread(_gauge, server, "offline_sync_connections_silent") == shared
            await _a_client_is_accepted(server)

    try:
        asyncio.run(scenario())
    finally:
        server.terminate()


def test_a_served_connection_dribbling_its_next_request_is_dropped(tmp_path: Path) -> None:
    import socket
    import time

    server = start_server(tmp_path, store="memory", env={"OFFLINE_HANDSHAKE_TIMEOUT": "2"})
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        # Then one byte of the next request every half second: each restarts uvicorn's keep-alive timer, but
        # the head's deadline (2 s, after the 5 s keep-alive) still ends the connection.
        closed = False
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"G")
                sock.settimeout(0.5)
                if sock.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
        assert closed, "the dribbling connection was still open"
        sock.close()
    finally:
        server.terminate()


class _Transport:
    """What `ConnectionGate` asks of a transport: its peer, reading paused or not, abort."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.aborted = False
        self.paused = False

    def get_extra_info(self, name: str) -> object:
        return (self.host, 40000) if name == "peername" else None

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def test_unfinished_requests_are_bounded_for_every_address_together() -> None:
    """Each address may leave 64 connections without a request head; many addresses together are bounded
    too (each holds a file descriptor), and when that bound is reached by young connections, the network
    holding the most gives one up to a newcomer from a network holding fewer."""
    from server_runtime.client_address import ProxyPolicy
    from server_runtime.connection_gate import ConnectionGate

    async def scenario() -> None:
        gate = ConnectionGate(ProxyPolicy(), 64, deadline=600.0, grace=600.0, max_pending=256)
        crowd = [_Transport(f"198.51.100.{i // 64 + 1}") for i in range(256)]
        for transport in crowd:
            gate.opened(transport)
        assert len(gate.counted) == 256 and not any(t.aborted for t in crowd)
        neighbour = _Transport("198.51.100.77")
        gate.opened(neighbour)
        assert neighbour.aborted  # its network is the crowd
        newcomer = _Transport("203.0.113.5")
        gate.opened(newcomer)
        assert not newcomer.aborted and sum(t.aborted for t in crowd) == 1
        assert len(gate.counted) == 256 and gate.crowded == 2
        for transport in [*crowd, newcomer]:
            gate.lost(transport)
        assert not gate.counted and not gate.networks and not gate.pending

    asyncio.run(scenario())


def test_a_request_gets_through_while_many_addresses_hold_unfinished_ones(tmp_path: Path) -> None:
    # Eight addresses of 127.0.1.0/24 start 64 requests each and never finish them; nothing gives way by age.
    # At most 256 are held (OFFLINE_MAX_PENDING_REQUESTS) and a request from 127.0.0.1 is served.
    import urllib.request

    limit = raise_open_file_limit()
    assert limit >= 1200, f"only {limit} open files allowed here"
    server = _server_where_nothing_gives_way_by_age(tmp_path, OFFLINE_MAX_PENDING_REQUESTS="256")

    async def scenario() -> None:
        async with _one_network_floods(server, partial=b"GET /health HT"):
            held = await asyncio.to_thread(_gauge, server, "offline_http_connections_waiting")
            assert held <= 256 + 1, held  # (+1: the metrics request itself)
            with urllib.request.urlopen(server.http_url + "/health", timeout=TIMEOUT) as response:
                assert response.status == 200

    try:
        asyncio.run(scenario())
    finally:
        server.terminate()
