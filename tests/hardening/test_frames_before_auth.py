"""Before its handshake is accepted, a connection's frames are capped at max_handshake_bytes (256 KiB) by the
WebSocket layer as they arrive: unauthenticated peers sending 4 MiB frames cost the server almost nothing,
while a signed-in session still sends frames up to max_message_bytes."""

from __future__ import annotations

import asyncio
import json
import struct
import urllib.request
from pathlib import Path

from offline.core.uuid7 import generate_uuid_v7
from offline.sync import protocol as p
from tests.support.abuse import MIB, PeakRss, oversized_first_frame

from .support import SCHEMA, BareSocketPeer, RawClient, start_server

SECRET = "s" * 43


def sign_up(base: str) -> str:
    body = json.dumps({"email": "frames@example.com", "password": "correct horse battery staple"}).encode()
    request = urllib.request.Request(
        base + "/auth/sign-up", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.loads(response.read())["accessToken"])


def test_unauthenticated_4_mib_frames_are_refused_as_they_arrive(tmp_path: Path) -> None:
    server = start_server(tmp_path, env={"AUTH_SECRET": SECRET})
    assert server.proc is not None
    try:

        async def flood() -> list[bytes]:
            return await asyncio.gather(
                *(oversized_first_frame("127.0.0.1", server.port, 4 * MIB) for _ in range(200))
            )

        with PeakRss(server.proc.pid) as rss:
            answers = asyncio.run(flood())
        assert rss.growth < 20 * MIB, f"server RSS grew {rss.growth / MIB:.1f} MiB"
        # Each was closed with 1009 (message too big), or reset before the close frame could be read.
        closes = [a for a in answers if a]
        assert all(a[0] == 0x88 and struct.unpack("!H", a[2:4])[0] == 1009 for a in closes), closes[:3]

        token = sign_up(server.http_url)
        # A handshake under the cap is served (a version vector of 2,000 nodes: some 100 KiB).
        vector = {generate_uuid_v7(): 1 for _ in range(2000)}
        peer = BareSocketPeer("127.0.0.1", server.port)
        hello = p.Handshake(
            message_id=p.new_message_id(),
            node_id=generate_uuid_v7(),
            version_vector=vector,
            schema_version=SCHEMA.version,
            last_delivery_sequence=0,
            auth_token=token,
        )
        assert 64 * 1024 < len(p.encode(hello)) < 256 * 1024
        peer.send_text(p.encode(hello))
        reply = peer.next_message()
        assert isinstance(reply, p.HandshakeResponse) and reply.accepted
        peer.close()

        async def signed_in_large_batch() -> None:
            # After the handshake, a frame of more than 1 MiB (well past the pre-handshake cap) is taken.
            client = RawClient(server.sync_url, token=token)
            await client.open()
            ops = [client.writer.op("boards", {"name": "n" * 2000}) for _ in range(600)]
            acks = await client.push(ops, batch=600, window=1)
            assert len(acks) == 1 and not client.rejections and not client.errors
            await client.close()

        asyncio.run(signed_in_large_batch())
    finally:
        server.terminate()
