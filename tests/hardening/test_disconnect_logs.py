"""Clients that vanish (a TCP reset) right after an authenticated handshake cost at most one short log line
each, and a flood of them a bounded number of lines overall: no tracebacks, no line per failed write."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from pathlib import Path

import pytest

from offline.core.uuid7 import generate_uuid_v7
from offline.sync import protocol as p
from server_runtime.log_budget import LogBudget, is_disconnect
from tests.support.abuse import reset

from .support import SCHEMA, BareSocketPeer, RawClient, start_server, wait_for

ADMIN = "admin-token-for-tests-0123456789"


def sign_up(base: str) -> str:
    body = json.dumps({"email": "reset@example.com", "password": "correct horse battery staple"}).encode()
    request = urllib.request.Request(
        base + "/auth/sign-up", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.loads(response.read())["accessToken"])


def open_connections(base: str) -> int:
    request = urllib.request.Request(
        base + "/__offline/metrics", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("offline_sync_connections_open "):
                return int(float(line.split()[-1]))
    raise AssertionError("no offline_sync_connections_open metric")


def test_200_resets_after_an_authenticated_handshake_add_a_few_hundred_bytes_of_log(tmp_path: Path) -> None:
    server = start_server(tmp_path, env={"AUTH_SECRET": "s" * 43, "OFFLINE_ADMIN_TOKEN": ADMIN})
    try:
        token = sign_up(server.http_url)

        async def fill() -> None:
            # Something to stream after each handshake, so resets also land mid-catch-up.
            client = RawClient(server.sync_url, token=token)
            await client.open()
            await client.push([client.writer.op("boards", {"name": "x" * 400}) for _ in range(2000)])
            await client.close()

        asyncio.run(fill())
        before = server.log_path.stat().st_size
        for i in range(200):
            peer = BareSocketPeer("127.0.0.1", server.port)
            hello = p.Handshake(
                message_id=p.new_message_id(),
                node_id=generate_uuid_v7(),
                version_vector={},
                schema_version=SCHEMA.version,
                last_delivery_sequence=0,
                auth_token=token,
            )
            peer.send_text(p.encode(hello))
            if i % 3:  # sometimes gone before the answer, sometimes after it
                assert isinstance(peer.next_message(), p.HandshakeResponse)
            if i % 3 == 2:
                peer.next_message()  # and sometimes during the catch-up
            reset(peer.sock)

        asyncio.run(
            wait_for(
                lambda: open_connections(server.http_url) == 0, "the server to see every reset connection"
            )
        )
        written = server.log_path.read_bytes()[before:]
        assert b"Traceback" not in written, written.decode(errors="replace")[:3000]
        assert len(written) <= 600, written.decode(errors="replace")
        # The server still serves.
        healthy = BareSocketPeer("127.0.0.1", server.port)
        assert healthy.handshake(token=token).accepted
        healthy.close()
    finally:
        server.terminate()


def test_a_flood_of_one_message_is_one_line_and_a_summary(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("offline.test.budget")

    async def scenario() -> None:
        budget = LogBudget(logger, "abrupt disconnects", period=0.2, burst=1)
        for i in range(200):
            budget.log(logging.INFO, "client %d vanished", i)
        lines = [r.getMessage() for r in caplog.records if r.name == logger.name]
        assert lines == ["client 0 vanished"]
        await wait_for(
            lambda: any("suppressed" in r.getMessage() for r in caplog.records),
            "the suppressed-lines summary",
        )

    with caplog.at_level(logging.INFO, logger=logger.name):
        asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert lines == ["client 0 vanished", "suppressed 199 more abrupt disconnects"]


def test_what_counts_as_a_vanished_peer() -> None:
    from starlette.websockets import WebSocketDisconnect

    assert is_disconnect(WebSocketDisconnect(1006))
    assert is_disconnect(ConnectionResetError())
    try:
        try:
            raise BrokenPipeError()
        except OSError as exc:
            raise RuntimeError("send failed") from exc
    except RuntimeError as wrapped:
        assert is_disconnect(wrapped)  # raised from one
    assert not is_disconnect(ValueError("a bug"))
    assert not is_disconnect(RuntimeError("another bug"))
