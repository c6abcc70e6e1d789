"""The WebSocket sync endpoint: one `Session` per connection, driven by `SyncService`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from starlette.websockets import WebSocket, WebSocketDisconnect

from offline.core.errors import OfflineError
from offline.sync import protocol as p

from .sync import Refusal, Session, SyncService

log = logging.getLogger("offline.server.sync")

# WebSocket close codes: 1008 policy violation (auth, schema), 1011 server error, 1013 try again later.
POLICY = 1008
TRY_AGAIN = 1013


class _Closed(Exception):
    pass


async def _receive_text(websocket: WebSocket) -> str:
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise _Closed()
    if message.get("text") is not None:
        return str(message["text"])
    data = message.get("bytes") or b""
    return data.decode("utf-8", "replace")


async def sync_endpoint(websocket: WebSocket, service: SyncService) -> None:
    await websocket.accept()
    send_lock = asyncio.Lock()

    async def send(text: str) -> None:
        # The relay task and the receive loop both write; frames must not interleave.
        async with send_lock:
            await websocket.send_text(text)

    async def refuse(code: str, message: str, retriable: bool, close_code: int = POLICY) -> None:
        with contextlib.suppress(Exception):
            await send(p.encode(p.ErrorMessage(p.new_message_id(), code, message, retriable)))
            await websocket.close(close_code, code)

    try:
        frame = await asyncio.wait_for(_receive_text(websocket), service.limits.handshake_timeout)
    except TimeoutError:
        await refuse(p.PROTOCOL_VIOLATION, "no handshake received in time", True)
        return
    except (_Closed, WebSocketDisconnect):
        return
    try:
        hello = p.decode(frame, max_bytes=service.limits.max_message_bytes)
    except p.ProtocolError as exc:
        await refuse(exc.code, exc.message, False)
        return
    if not isinstance(hello, p.Handshake):
        await refuse(p.PROTOCOL_VIOLATION, "the first message must be a handshake", False)
        return
    if not service.started:
        await refuse(p.SERVER_SHUTDOWN, "the server is shutting down; reconnect shortly", True, TRY_AGAIN)
        return
    try:
        claims = await service.authenticate(hello.auth_token)
    except OfflineError:
        await refuse(p.AUTH_FAILED, "authentication failed", False)
        return
    schema = service.schema
    lo, hi = service.supported_schema
    if not lo <= hello.schema_version <= hi:
        response = p.HandshakeResponse(
            message_id=p.new_message_id(),
            accepted=False,
            node_id=service.node_id,
            version_vector={},
            schema_version=schema.version,
            server_time=int(time.time() * 1000),
            server_max_delivery_sequence=service.watermark,
            reject_reason=f"SCHEMA_MISMATCH: client schema version {hello.schema_version}, server supports {lo} to {hi}",
            supported_schema_min=lo,
            supported_schema_max=hi,
        )
        with contextlib.suppress(Exception):
            await send(p.encode(response))
            await websocket.close(POLICY, "SCHEMA_MISMATCH")
        return

    filters = service.resolve_scope(claims, hello.sync_scope)
    cursor = hello.last_delivery_sequence
    if cursor > service.watermark:
        cursor = 0  # a watermark from another (or a reset) server: resend everything visible
    session = Session(node_id=hello.node_id, filters=filters, claims=claims, send=send, cursor=cursor)
    vector = await service.store.version_vector()
    response = p.HandshakeResponse(
        message_id=p.new_message_id(),
        accepted=True,
        node_id=service.node_id,
        version_vector=vector,
        schema_version=schema.version,
        server_time=int(time.time() * 1000),
        server_max_delivery_sequence=service.watermark,
        accepted_scope={name: dict(f) for name, f in filters.items()},
        supported_schema_min=lo,
        supported_schema_max=hi,
    )
    await send(p.encode(response))
    service.sessions.add(session)
    service.emit("connection", {"nodeId": session.node_id, "state": "connected"})
    relay = asyncio.create_task(service.relay(session), name=f"relay-{session.node_id}")
    errors = 0
    reason = "closed"
    try:
        while True:
            receive = asyncio.create_task(_receive_text(websocket))
            done, _ = await asyncio.wait({receive, relay}, return_when=asyncio.FIRST_COMPLETED)
            if relay in done:
                receive.cancel()
                relay.result()
                reason = "relay stopped"
                break
            frame = receive.result()
            try:
                message = p.decode(
                    frame,
                    max_bytes=service.limits.max_message_bytes,
                    max_batch=service.limits.max_batch_operations,
                )
            except p.ProtocolError as exc:
                errors += 1
                await send(p.encode(p.ErrorMessage(p.new_message_id(), exc.code, exc.message, exc.retriable)))
                if errors >= service.limits.max_protocol_errors:
                    await websocket.close(POLICY, "too many malformed messages")
                    reason = "misbehaving"
                    break
                continue
            if isinstance(message, (p.OperationBatch, p.OperationMessage)):
                raw = (
                    list(message.operations) if isinstance(message, p.OperationBatch) else [message.operation]
                )
                await _receive_operations(service, session, message.message_id, raw)
            elif isinstance(message, p.Acknowledgment):
                # The client persists its own watermark; the relay only needs to know the batch arrived.
                session.acknowledged(message.acknowledged_message_id)
            elif isinstance(message, p.Handshake) and message.message_id == hello.message_id:
                continue  # the same handshake delivered twice: a duplicate is ignored, never fatal
            else:
                errors += 1
                await send(
                    p.encode(
                        p.ErrorMessage(
                            p.new_message_id(),
                            p.PROTOCOL_VIOLATION,
                            f"unexpected {type(message).__name__}",
                            False,
                        )
                    )
                )
    except (_Closed, WebSocketDisconnect):
        reason = "client closed"
    except Exception:
        log.exception("sync session %s failed", session.node_id)
        reason = "server error"
        with contextlib.suppress(Exception):
            await websocket.close(1011, "server error")
    finally:
        service.sessions.discard(session)
        relay.cancel()
        with contextlib.suppress(BaseException):
            await relay
        service.emit("connection", {"nodeId": session.node_id, "state": "disconnected", "reason": reason})


async def _receive_operations(
    service: SyncService, session: Session, message_id: str, raw: Sequence[object]
) -> None:
    refused: dict[str, Refusal] = {}
    ops = []
    for item in raw:
        try:
            ops.append(p.decode_operation(item, max_bytes=service.limits.max_operation_bytes))  # type: ignore[arg-type]
        except p.ProtocolError as exc:
            op_id = item.get("id") if isinstance(item, dict) else None
            key = str(op_id) if op_id is not None else "?"
            refused[key] = Refusal(exc.code, exc.message)
            # Counted and published like the pipeline's own refusals (metrics, status, live events).
            service.rejections[exc.code] = service.rejections.get(exc.code, 0) + 1
            service.emit("rejected", {"operationId": key, "code": exc.code, "message": exc.message})
    results = await service.commit(session, ops)
    session.received += len(raw)
    for op_id, value in [*refused.items(), *results.items()]:
        if isinstance(value, Refusal):
            session.rejected += 1
            await session.send(
                p.encode(
                    p.OperationRejected(p.new_message_id(), op_id, value.code, value.message, value.retriable)
                )
            )
    deliveries = [v for v in results.values() if isinstance(v, int) and not isinstance(v, bool)]
    ack = p.Acknowledgment(
        message_id=p.new_message_id(),
        acknowledged_message_id=message_id,
        last_sequence_number=max(
            (op.sequence_number for op in ops if op.node_id == session.node_id), default=0
        ),
        delivery_sequence=max(deliveries) if deliveries else None,
    )
    await session.send(p.encode(ack))
