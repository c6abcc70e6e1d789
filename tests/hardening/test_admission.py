"""Who may connect, and how a refusal reads: the Origin allow-list, the per-process connection limit (a
retriable refusal the client library waits out), the dashboard's security headers, and the limits' own
configuration errors."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from offline import OfflineError, create_app
from offline.core.uuid7 import generate_uuid_v7
from offline.sync import protocol as p
from server_runtime import MemoryServerStore, create_production_server
from server_runtime.limits import ConnectionLimits, OriginPolicy, resolve_limits
from server_runtime.sync import SyncLimits

from .support import SCHEMA, TIMEOUT, BareSocketPeer, RawClient, session_nodes, start_server, wait_for

FAST = {"backoff_initial": 0.05, "backoff_max": 0.3, "ack_timeout": 2.0, "handshake_timeout": 5.0}


@contextlib.asynccontextmanager
async def in_process_server(**options: Any) -> Any:
    store = MemoryServerStore()
    await store.set_schema(SCHEMA)
    server = create_production_server(store=store, port=0, host="127.0.0.1", **options)
    try:
        await server.start()
        yield server
    finally:
        await server.stop()
        await store.close()


def ws_url(server: Any) -> str:
    return str(server.url).replace("http://", "ws://") + server.sync_path


# -- Origin -------------------------------------------------------------------------------------------------------


def test_origin_allow_list_refuses_other_pages_before_the_upgrade() -> None:
    async def scenario() -> None:
        options = {"allowed_origins": ["https://app.example.com", "http://localhost:5173/"]}
        async with in_process_server(sync_options=options) as server:
            url = ws_url(server)
            for origin in ("https://evil.example.com", "https://app.example.com.evil.net", "null"):
                with pytest.raises(InvalidStatus) as refused:
                    await ws_connect(url, origin=origin)  # type: ignore[arg-type]
                assert refused.value.response.status_code == 403, origin
            # Listed origins (case and a trailing slash aside) and clients that send no Origin are served.
            for origin in (
                "https://app.example.com",
                "HTTPS://APP.EXAMPLE.COM",
                "http://localhost:5173",
                None,
            ):
                client = RawClient(url)
                if origin is None:
                    await client.open()
                else:
                    await client.open(origin=origin)
                assert client.reply is not None and client.reply.accepted
                await client.close()

    asyncio.run(scenario())


def test_origin_policy_from_environment_and_wildcard() -> None:
    env = {"OFFLINE_ALLOWED_ORIGINS": "https://a.example, https://b.example/"}
    policy = OriginPolicy.resolve(None, env)
    assert policy.permits("https://b.example") and policy.permits("https://A.example")
    assert not policy.permits("https://c.example")
    assert policy.permits(None)  # no Origin header: not a browser
    assert OriginPolicy.resolve(["*"], env).permits("https://c.example")
    assert OriginPolicy.resolve(None, {}).permits("https://anything.example")
    with pytest.raises(OfflineError) as bad:
        OriginPolicy.resolve([1, 2], {})
    assert bad.value.code == "SERVER_CONFIG" and "allowed_origins" in bad.value.message


# -- limits' configuration -----------------------------------------------------------------------------------------


def test_limits_come_from_options_over_environment_and_are_checked() -> None:
    env = {
        "OFFLINE_MAX_CONNECTIONS": "70",
        "OFFLINE_MAX_BATCH_OPERATIONS": "200",
        "OFFLINE_PING_INTERVAL": "0",
        "OFFLINE_SNAPSHOT_PREPARE_EVERY": "0",
    }
    sync, conn = resolve_limits({"max_connections": 5}, env)
    assert conn.max_connections == 5  # the explicit option wins
    assert sync.max_batch_operations == 200 and conn.ping_interval is None  # 0 turns pings off
    assert sync.snapshot_prepare_every == 0  # 0 turns background snapshot builds off
    assert resolve_limits(None, {}) == (SyncLimits(), ConnectionLimits())
    problems = [
        ({"max_conections": 5}, {}, "max_conections"),
        ({"operations_per_second": -1}, {}, "operations_per_second"),
        (None, {"OFFLINE_MAX_CONNECTIONS": "lots"}, "OFFLINE_MAX_CONNECTIONS"),
        ({"max_connections": 2.5}, {}, "max_connections"),
        ({"operations_per_second": 10}, {}, "ping_timeout"),  # a full batch would be held past the pings
        (None, {"OFFLINE_RELAY_FRAME_BYTES": str(8 << 20)}, "relay_frame_bytes"),  # past what clients accept
    ]
    for given, environment, named in problems:
        with pytest.raises(OfflineError) as bad:
            resolve_limits(given, environment)
        assert bad.value.code == "SERVER_CONFIG"
        assert named in bad.value.message, bad.value.message


# -- the connection limit -------------------------------------------------------------------------------------------


def test_connection_limit_refusal_is_retriable_and_the_client_gets_in_later(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", store="memory", env={"OFFLINE_MAX_CONNECTIONS": "2"})

    async def scenario() -> None:
        holders = [RawClient(server.sync_url), RawClient(server.sync_url)]
        for holder in holders:
            await holder.open()
        # A third connection: told to come back later, in the protocol and in the close code.
        async with ws_connect(server.sync_url) as ws:
            refusal = p.decode(await asyncio.wait_for(ws.recv(), TIMEOUT))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.recv(), 5)
            assert isinstance(refusal, p.ErrorMessage), refusal
            assert (refusal.code, refusal.retriable) == (p.OVERLOADED, True)
            assert ws.close_code == 1013

        # The client library treats that as "offline for now": it backs off, retries, and gets in once a
        # slot frees up.
        app = create_app(SCHEMA, sync={"url": server.sync_url, **FAST}, path=str(tmp_path / "app.db"))
        reasons: list[str] = []
        app.events.on("sync:disconnected", lambda event: reasons.append(str(event.reason)))
        try:
            app.boards.insert({"name": "written while the server was full"})
            await app.sync.connect(wait=False)
            await wait_for(
                lambda: sum("OVERLOADED" in r for r in reasons) >= 2, lambda: f"refusals: {reasons}"
            )
            assert app.sync.status != "error" and app.sync.last_error is None
            await holders[0].close()
            await app.sync.wait_until_synced(TIMEOUT)
            await wait_for(lambda: len(holders[1].received) == 1, "the write relayed to the other session")
            assert holders[1].received[0]["data"]["name"] == "written while the server was full"
        finally:
            await app.sync.disconnect()
            app.close()
            for holder in holders:
                await holder.close()

    try:
        asyncio.run(scenario())
    finally:
        assert server.terminate() == 0


# -- heartbeats -------------------------------------------------------------------------------------------------------


def test_a_peer_that_stops_answering_pings_is_dropped_and_its_session_freed(tmp_path: Path) -> None:
    env = {"OFFLINE_PING_INTERVAL": "0.5", "OFFLINE_PING_TIMEOUT": "0.5"}
    server = start_server(tmp_path / "server", store="memory", env=env)

    async def scenario() -> None:
        live = RawClient(server.sync_url)  # the websockets library answers pings by itself
        await live.open()
        dead = BareSocketPeer("127.0.0.1", server.port)  # completes the handshake, then never reads again
        dead_node = "0190c0de-0000-7000-8000-00000000dead"
        dead.handshake(node=dead_node)
        assert live.reply is not None
        await wait_for(lambda: dead_node in session_nodes(server), "the silent peer's session")
        try:
            await wait_for(
                lambda: dead_node not in session_nodes(server),
                "the server to drop the peer that answers no pings",
                timeout=15,
            )
            assert dead.is_closed_by_peer(timeout=2.0)
            # Said in the server's log (uvicorn's own keepalive said nothing an operator would see).
            await wait_for(
                lambda: "sent nothing in the last" in server.log_path.read_text(errors="replace"),
                "the server's log line for the peer cut for not answering pings",
            )
            # The live client answered every ping meanwhile: still connected, still served.
            assert live.closed is None
            assert live.writer.node in session_nodes(server)
            ack = await (await live.send_batch([live.writer.op("boards", {"name": "still here"})]))
            assert ack.delivery_sequence is not None
        finally:
            dead.close()
            await live.close()

    try:
        asyncio.run(scenario())
    finally:
        assert server.terminate() == 0


def test_a_slow_reader_behind_on_relayed_data_is_not_taken_for_a_dead_peer(tmp_path: Path) -> None:
    """The server's ping waits behind the relay frames already sent, so a client working through a backlog
    answers it late; while frames keep arriving from it (its acknowledgements) it is alive and stays
    connected. (The pings' timeout is short against the backlog: a server counting only pongs cuts it.)"""
    env = {
        "OFFLINE_PING_INTERVAL": "0.5",
        "OFFLINE_PING_TIMEOUT": "3",
        "OFFLINE_RELAY_FRAME_BYTES": "2048",  # many small frames: a deep backlog of frames to read
    }
    server = start_server(tmp_path / "server", store="memory", env=env)
    batches, per_batch = 12, 10

    async def scenario() -> None:
        writer = RawClient(server.sync_url)
        await writer.open()
        # Pings off on the client's side: only the server's judgement is under test.
        reader = await ws_connect(server.sync_url, max_size=None, ping_interval=None, max_queue=2)
        hello = p.Handshake(p.new_message_id(), generate_uuid_v7(), {}, SCHEMA.version, 0)
        await reader.send(p.encode(hello))
        reply = p.decode(await asyncio.wait_for(reader.recv(), TIMEOUT))
        assert isinstance(reply, p.HandshakeResponse) and reply.accepted
        for _ in range(batches):
            ops = [writer.writer.op("boards", {"name": "n" * 900}) for _ in range(per_batch)]
            ack = await (await writer.send_batch(ops))
            assert ack.delivery_sequence is not None
        received = 0
        try:
            while received < batches * per_batch:
                message = p.decode(await asyncio.wait_for(reader.recv(), TIMEOUT))
                assert isinstance(message, p.OperationBatch), message
                received += len(message.operations)
                ack_message = p.Acknowledgment(
                    p.new_message_id(), message.message_id, 0, message.max_delivery_sequence
                )
                await reader.send(p.encode(ack_message))
                await asyncio.sleep(0.1)  # a client busy applying what it reads: the backlog takes seconds
        except ConnectionClosed as exc:
            raise AssertionError(
                f"the server cut a reading client after {received} operations: {exc}"
            ) from exc
        finally:
            await reader.close()
            await writer.close()

    try:
        asyncio.run(scenario())
    finally:
        assert server.terminate() == 0


# -- dashboard headers --------------------------------------------------------------------------------------------------


def test_dashboard_and_operational_responses_carry_security_headers() -> None:
    token = "admin-token-for-headers-test"

    async def scenario() -> None:
        async with (
            in_process_server(operational_auth={"adminToken": token}) as server,
            httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT) as http,
        ):
            auth = {"Authorization": f"Bearer {token}"}
            pages = {
                "dashboard": await http.get("/__offline", headers=auth),
                "sign-in page": await http.get("/__offline/login"),
                "dashboard without credentials": await http.get("/__offline"),
                "status": await http.get("/__offline/status", headers=auth),
                "status refused": await http.get("/__offline/status"),
                "metrics": await http.get("/__offline/metrics", headers=auth),
            }
            assert (
                pages["dashboard"].status_code == 200
                and "text/html" in pages["dashboard"].headers["content-type"]
            )
            assert pages["status refused"].status_code == 401
            for name, response in pages.items():
                headers = response.headers
                csp = headers.get("content-security-policy", "")
                assert "frame-ancestors 'none'" in csp, (name, csp)
                assert headers.get("x-frame-options") == "DENY", name
                assert headers.get("x-content-type-options") == "nosniff", name
                assert headers.get("referrer-policy") == "no-referrer", name
            # The pages' own policy is kept whole (scripts only from the page itself, nothing external).
            page_csp = pages["dashboard"].headers["content-security-policy"]
            assert "default-src 'none'" in page_csp and "connect-src 'self'" in page_csp
            # The health check is public and untouched.
            assert (await http.get("/health")).status_code == 200

    asyncio.run(scenario())
