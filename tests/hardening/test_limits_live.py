"""The configured limits against a live server process, over real WebSockets, and the drain's refusal of
newcomers.

- A well-formed frame larger than ``max_message_bytes`` (but within the transport's extra 1 KiB) gets
  ``error MESSAGE_TOO_LARGE``; a batch with more than ``max_batch_operations`` gets ``error BATCH_TOO_LARGE``.
  Neither is fatal (the same session then sends the same operations in smaller frames), nothing of the refused
  frame is stored, and another client keeps syncing throughout.
- One operation larger than ``max_operation_bytes`` is refused alone (``operation-rejected
  OPERATION_TOO_LARGE``, before the batch's acknowledgement); the rest of its batch is stored and relayed.
- SIGTERM: the server stops listening at once (a new connection is refused at the TCP level, which every
  client retries) and a connection it had accepted before, upgrading during the drain, hears a retriable
  ``SERVER_SHUTDOWN`` (close 1013); the session whose batch was in hand gets it stored and acknowledged first.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import sqlite3
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect

from offline.sync import protocol as p
from tests.support.servers import ServerProcess

from .support import TIMEOUT, BareSocketPeer, RawClient, start_server, status, wait_for

MAX_MESSAGE = 16_384
MAX_BATCH = 10
MAX_OPERATION = 4_096
LIMITS = {
    "OFFLINE_MAX_MESSAGE_BYTES": str(MAX_MESSAGE),
    "OFFLINE_MAX_BATCH_OPERATIONS": str(MAX_BATCH),
    "OFFLINE_MAX_OPERATION_BYTES": str(MAX_OPERATION),
}
TRANSPORT_SLACK = 1024  # the WebSocket layer accepts frames up to max_message_bytes + 1 KiB


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_server(tmp_path / "server", store="memory", env=LIMITS)
    try:
        yield server
    finally:
        assert server.terminate() == 0, server.log_path.read_text()


def batch_frame(ops: list[dict[str, Any]]) -> tuple[str, str]:
    """(message id, frame) of one final ``operation-batch`` carrying ``ops``, as `RawClient` sends them."""
    message_id = p.new_message_id()
    frame = p.encode_batch_frame(message_id, [json.dumps(op) for op in ops], is_final=True, batch_index=0)
    return message_id, frame


def size(frame: str) -> int:
    return len(frame.encode("utf-8"))


def ids(ops: list[dict[str, Any]]) -> set[str]:
    return {str(op["id"]) for op in ops}


def relayed(client: RawClient) -> set[str]:
    return {str(op["id"]) for op in client.received}


async def clients(server: ServerProcess) -> tuple[RawClient, RawClient]:
    """The client that breaks a limit, and a bystander on the same server."""
    offender, bystander = RawClient(server.sync_url), RawClient(server.sync_url)
    await offender.open()
    await bystander.open()
    return offender, bystander


async def bystander_still_served(bystander: RawClient, offender: RawClient, label: str) -> None:
    """The bystander writes and is acknowledged, and its write reaches the offender's session."""
    op = bystander.writer.op("boards", {"name": f"bystander {label}"})
    ack = await asyncio.wait_for(await bystander.send_batch([op]), TIMEOUT)
    assert ack.delivery_sequence is not None
    await wait_for(lambda: op["id"] in relayed(offender), f"the bystander's {label} write relayed")
    assert bystander.closed is None and not bystander.errors and not bystander.rejections


def oversized_but_well_formed_frame(client: RawClient) -> tuple[list[dict[str, Any]], str]:
    """Operations, each within every limit, whose one frame is 512 bytes over ``max_message_bytes``."""
    ops = [client.writer.op("boards", {"name": "x" * 3000, "rank": n}) for n in range(4)]
    probe = client.writer.op("boards", {"name": "", "rank": 4})
    missing = MAX_MESSAGE + TRANSPORT_SLACK // 2 - size(batch_frame([*ops, probe])[1])
    client.writer.sequence -= 1  # the probe is replaced, not sent: keep the sequence numbers contiguous
    ops.append(client.writer.op("boards", {"name": "x" * missing, "rank": 4}))
    return ops, batch_frame(ops)[1]


def test_a_well_formed_frame_over_the_message_limit_gets_message_too_large(limited: ServerProcess) -> None:
    async def scenario() -> None:
        offender, bystander = await clients(limited)
        try:
            ops, frame = oversized_but_well_formed_frame(offender)
            # Over the configured limit, under the transport's (so the protocol layer answers), and valid in
            # every other respect.
            assert MAX_MESSAGE < size(frame) <= MAX_MESSAGE + TRANSPORT_SLACK
            decoded = p.decode(frame, max_bytes=2 * MAX_MESSAGE)
            assert isinstance(decoded, p.OperationBatch) and len(decoded.operations) == 5
            for op in ops:
                p.decode_operation(op, max_bytes=MAX_OPERATION)
            with pytest.raises(p.ProtocolError):
                p.decode(frame, max_bytes=MAX_MESSAGE)

            assert offender.ws is not None
            await offender.ws.send(frame)
            await wait_for(lambda: bool(offender.errors), "the server's answer to the oversized frame")
            [error] = offender.errors
            assert (error.code, error.retriable) == (p.MESSAGE_TOO_LARGE, False)
            assert str(MAX_MESSAGE) in error.message
            assert not offender.rejections

            # Another client is served meanwhile, and nothing of the refused frame was stored.
            await bystander_still_served(bystander, offender, "first")
            assert status(limited)["operations"]["stored"] == 1
            assert not ids(ops) & relayed(bystander)

            # Not fatal: the same session sends the same operations in frames under the limit.
            assert offender.closed is None
            acks = await offender.push(ops, batch=3)
            assert len(acks) == 2 and all(ack.delivery_sequence is not None for ack in acks)
            await wait_for(lambda: ids(ops) <= relayed(bystander), "the resent operations relayed")
            assert offender.errors == [error] and not offender.rejections
            assert status(limited)["operations"]["stored"] == 1 + len(ops)
            await bystander_still_served(bystander, offender, "second")
        finally:
            await offender.close()
            await bystander.close()

    asyncio.run(scenario())


def test_a_batch_over_the_operation_limit_gets_batch_too_large(limited: ServerProcess) -> None:
    async def scenario() -> None:
        offender, bystander = await clients(limited)
        try:
            ops = [
                offender.writer.op("boards", {"name": f"board {n}", "rank": n}) for n in range(MAX_BATCH + 1)
            ]
            message_id, frame = batch_frame(ops)
            assert size(frame) < MAX_MESSAGE  # only the count is over a limit
            assert offender.ws is not None
            await offender.ws.send(frame)
            await wait_for(lambda: bool(offender.errors), "the server's answer to the long batch")
            [error] = offender.errors
            assert (error.code, error.retriable) == (p.BATCH_TOO_LARGE, False)
            assert str(MAX_BATCH) in error.message and str(MAX_BATCH + 1) in error.message
            assert not offender.rejections

            await bystander_still_served(bystander, offender, "first")
            assert status(limited)["operations"]["stored"] == 1
            assert not ids(ops) & relayed(bystander)

            # The same operations within the limit: all stored, in two batches on the same session.
            assert offender.closed is None
            acks = await offender.push(ops, batch=MAX_BATCH)
            assert len(acks) == 2 and all(ack.delivery_sequence is not None for ack in acks)
            assert message_id not in {ack.acknowledged_message_id for ack in acks}
            await wait_for(lambda: ids(ops) <= relayed(bystander), "the resent operations relayed")
            assert offender.errors == [error]
            assert status(limited)["operations"]["stored"] == 1 + len(ops)
            await bystander_still_served(bystander, offender, "second")
        finally:
            await offender.close()
            await bystander.close()

    asyncio.run(scenario())


def test_one_oversized_operation_is_rejected_alone_and_the_rest_of_its_batch_is_stored(
    limited: ServerProcess,
) -> None:
    async def scenario() -> None:
        offender, bystander = await clients(limited)
        try:
            small = offender.writer.op("boards", {"name": "small before", "rank": 1})
            big = offender.writer.op("boards", {"name": "x" * (MAX_OPERATION + 100), "rank": 2})
            after = offender.writer.op("boards", {"name": "small after", "rank": 3})
            assert (
                size(batch_frame([small, big, after])[1]) < MAX_MESSAGE
            )  # only the one operation is too big
            with pytest.raises(p.ProtocolError):
                p.decode_operation(big, max_bytes=MAX_OPERATION)

            ack = await asyncio.wait_for(await offender.send_batch([small, big, after]), TIMEOUT)
            # The refusal came before the batch's acknowledgement, and named only the big operation.
            assert [(r.operation_id, r.code, r.retriable) for r in offender.rejections] == [
                (big["id"], p.OPERATION_TOO_LARGE, False)
            ]
            assert ack.delivery_sequence is not None
            assert not offender.errors and offender.closed is None

            await wait_for(
                lambda: {small["id"], after["id"]} <= relayed(bystander), "the two small ones relayed"
            )
            answer = status(limited)
            assert answer["operations"]["stored"] == 2
            assert answer["operations"]["rejected"] == {p.OPERATION_TOO_LARGE: 1}
            assert answer["records"] == {"boards": 2}
            assert big["id"] not in relayed(bystander)
            await bystander_still_served(bystander, offender, "after the rejection")
            assert status(limited)["operations"]["stored"] == 3
        finally:
            await offender.close()
            await bystander.close()

    asyncio.run(scenario())


# -- SIGTERM: stop accepting ------------------------------------------------------------------------------------------

HELD_BATCH = 4
# A full bucket holds one batch; the next one waits HELD_BATCH / RATE = 8 s (the pings' timeout is 20 s) before
# the server even judges it. Meanwhile the server is draining, with that session's batch in hand.
DRAIN = {
    "OFFLINE_MAX_BATCH_OPERATIONS": str(HELD_BATCH),
    "OFFLINE_OPERATIONS_BURST": str(HELD_BATCH),
    "OFFLINE_OPERATIONS_PER_SECOND": "0.5",
    "OFFLINE_SHUTDOWN_GRACE": "60",
}


def rate_limited_batches(server: ServerProcess) -> int:
    with urllib.request.urlopen(server.http_url + "/__offline/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(
        r'^offline_sync_connections_limited_total\{reason="rate_limited_batches"\} (\S+)$', text, re.M
    )
    return int(float(found.group(1))) if found else 0


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        # A connect that raced the listening socket's close (queued, then reset): ask again.
        return False
    return False


def finish_upgrade(peer: BareSocketPeer, sent: int) -> tuple[p.Message, tuple[int, str]]:
    """Send the rest of ``peer``'s upgrade request; the first message it then reads and its close (code,
    reason)."""
    peer.upgrade(sent)
    opcode, payload = peer.read_frame()
    assert opcode == 0x1, (opcode, payload)
    message = p.decode(payload.decode())
    opcode, payload = peer.read_frame()
    assert opcode == 0x8, (opcode, payload)
    (code,) = struct.unpack("!H", payload[:2])
    return message, (code, payload[2:].decode())


def test_sigterm_stops_accepting_and_a_connection_upgrading_during_the_drain_is_told_to_retry(
    tmp_path: Path,
) -> None:
    db = tmp_path / "server.db"
    server = start_server(tmp_path / "server", db=str(db), env=DRAIN)
    process = server.proc
    assert process is not None
    late: BareSocketPeer | None = None

    async def scenario() -> None:
        nonlocal late
        held = RawClient(server.sync_url)
        await held.open()
        try:
            first = [held.writer.op("boards", {"name": f"first {n}"}) for n in range(HELD_BATCH)]
            second = [held.writer.op("boards", {"name": f"held {n}"}) for n in range(HELD_BATCH)]
            await asyncio.wait_for(await held.send_batch(first), TIMEOUT)  # the bucket is empty now
            in_hand = await held.send_batch(second)
            await wait_for(
                lambda: rate_limited_batches(server) == 1, "the second batch held by the rate limit"
            )

            # A connection the server accepted before the signal: proven by a kept-alive request, then the
            # upgrade's first line (which also stops the keep-alive timer) while the server is still running.
            late = BareSocketPeer("127.0.0.1", server.port, upgrade=False)
            head, body = late.get("/health")
            assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["status"] == "ok"
            first_line = late.request.index(b"\r\n") + 2
            late.sock.sendall(late.request[:first_line])

            process.send_signal(signal.SIGTERM)
            # Stop accepting: the listening socket closes at once, so a newcomer is refused by TCP (every
            # client treats that as offline and retries), not by an HTTP status or a protocol error.
            await wait_for(lambda: refuses_connections(server.port), "the listening socket to close")
            with pytest.raises(ConnectionRefusedError):
                await ws_connect(server.sync_url, open_timeout=5)

            # The connection accepted before: its upgrade completes, and it is told to come back later.
            refusal, closing = await asyncio.to_thread(finish_upgrade, late, first_line)
            assert isinstance(refusal, p.ErrorMessage), refusal
            assert (refusal.code, refusal.retriable) == (p.SERVER_SHUTDOWN, True)
            assert closing == (1013, p.SERVER_SHUTDOWN)

            # The batch in hand is stored and acknowledged, then the session is closed with a retriable code.
            ack = await asyncio.wait_for(in_hand, TIMEOUT)
            assert ack.delivery_sequence is not None
            assert await held.wait_closed() == 1012
            assert [(e.code, e.retriable) for e in held.errors] == [(p.SERVER_SHUTDOWN, True)]
            assert not held.rejections
            assert await asyncio.to_thread(process.wait, TIMEOUT) == 0

            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                stored = {row[0] for row in conn.execute("SELECT id FROM offline_operations")}
            finally:
                conn.close()
            assert ids(first) | ids(second) <= stored
        finally:
            await held.close()

    try:
        asyncio.run(scenario())
    finally:
        if late is not None:
            late.close()
        server.kill()
