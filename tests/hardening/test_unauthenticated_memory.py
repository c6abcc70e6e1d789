"""Connections from many addresses, each sending most of a large frame before any handshake, cannot make the
server buffer max_handshake_bytes each without bound: past max_unauthenticated_connections (all addresses
together) a new connection gets the retriable OVERLOADED (or an older silent one gives way), so the server's
memory stays bounded while a legitimate client still connects."""

from __future__ import annotations

import asyncio
from pathlib import Path

from offline.sync import protocol as p
from tests.support.abuse import MIB, PeakRss, raise_open_file_limit, unfinished_first_frame

from .support import TIMEOUT, BareSocketPeer, start_server

ADDRESSES = 16
PER_ADDRESS = (
    100  # under max_pending_per_address (raised to 256 here): only the process-wide bound is in play
)
FRAME = 250 * 1024  # under max_handshake_bytes (256 KiB): taken and buffered as it arrives
BOUND = 100


def test_unauthenticated_connections_from_many_addresses_have_a_process_wide_bound(tmp_path: Path) -> None:
    assert raise_open_file_limit() > ADDRESSES * PER_ADDRESS + 200
    env = {
        "OFFLINE_MAX_UNAUTHENTICATED_CONNECTIONS": str(BOUND),
        "OFFLINE_MAX_PENDING_PER_ADDRESS": "256",
        # The flood's connections are held well past the time they take to open, unless made to give way.
        "OFFLINE_HANDSHAKE_TIMEOUT": "120",
    }
    server = start_server(tmp_path, store="memory", env=env)
    assert server.proc is not None

    async def scenario() -> None:
        sources = [f"127.0.0.{10 + i}" for i in range(ADDRESSES)]
        slots = asyncio.Semaphore(100)

        async def one(source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
            async with slots:
                return await unfinished_first_frame("127.0.0.1", server.port, FRAME, source)

        # 1,600 connections of ~250 KiB each: some 400 MiB if every one were buffered (600 MiB of RSS before).
        held = await asyncio.gather(*(one(s) for s in sources for _ in range(PER_ADDRESS)))
        try:
            # A legitimate client connects meanwhile (retrying OVERLOADED as the client library does).
            reply: p.Message | None = None
            for _ in range(50):
                peer = BareSocketPeer("127.0.0.1", server.port)
                try:
                    peer.send_text(
                        p.encode(
                            p.Handshake(p.new_message_id(), "0190c0de-0000-7000-8000-00000000beef", {}, 1, 0)
                        )
                    )
                    reply = await asyncio.to_thread(peer.next_message)
                except ConnectionError:
                    reply = None
                finally:
                    peer.close()
                if isinstance(reply, p.HandshakeResponse):
                    break
                assert isinstance(reply, p.ErrorMessage) and reply.code == p.OVERLOADED, reply
                await asyncio.sleep(0.2)
            assert isinstance(reply, p.HandshakeResponse) and reply.accepted, reply
        finally:
            for pair in held:
                if pair is not None:
                    pair[1].transport.abort()

    with PeakRss(server.proc.pid) as rss:
        asyncio.run(asyncio.wait_for(scenario(), TIMEOUT * 6))
    try:
        # At most BOUND connections (25 MiB of frames) buffer at once, plus those on their way out (some 110 MiB
        # measured on a loaded machine).
        assert rss.growth < 200 * MIB, f"server RSS grew {rss.growth / MIB:.1f} MiB"
    finally:
        assert server.terminate() == 0
