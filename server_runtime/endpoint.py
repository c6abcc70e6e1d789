"""The WebSocket sync endpoint: one `Session` per connection, driven by `SyncService`.

Admission and limits (see ``server_runtime.limits``): the ``Origin`` allow-list is checked before the upgrade
(HTTP 403); a process at ``max_connections`` or ``max_unauthenticated_connections``, or a client address with ``max_pending_per_address``
connections that have not sent their handshake, answers ``error OVERLOADED`` and closes with 1013 (unless a connection silent
for ``silent_grace`` can give way); a server shutting down answers ``error SERVER_SHUTDOWN``. A connection
must send its handshake within ``handshake_timeout``. A client that vanishes is one log line, within a budget
(see ``server_runtime.log_budget``). Once a session runs, its writes pass a per-session rate
(waited out, never refused), and the `ConnectionGuard` may ask it to leave: on shutdown after the batches in
hand are stored and acknowledged (``SERVER_SHUTDOWN``, close 1012), or when it falls too far behind
(``RESYNC_REQUIRED``, close 1013). Both codes are retriable: the client reconnects and resumes from its
watermark, resending whatever was not acknowledged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from offline.core.errors import STORAGE_ERROR, OfflineError
from offline.sync import protocol as p

from .client_address import client_address
from .connections import RESYNC, SHUTDOWN, SILENT, Connection, ConnectionGuard
from .limits import OriginPolicy
from .live_sessions import EXPIRED, REVOKED
from .log_budget import LogBudget, is_disconnect
from .request_limits import TRANSPORT_KEY
from .sync import Refusal, Session, SyncService

log = logging.getLogger("offline.server.sync")
# Clients that vanish mid-session: one line each, a bounded number a minute whatever a flood of resets does.
_DISCONNECTS = LogBudget(log, "abrupt sync disconnects", period=30.0, burst=1)

# WebSocket close codes: 1008 policy violation (auth, schema), 1011 server error, 1012 service restart,
# 1013 try again later.
POLICY = 1008
SERVICE_RESTART = 1012
TRY_AGAIN = 1013

#: ASGI scope key under which the server puts a callable that drops the connection's TCP socket at once.
ABORT_KEY = "offline.abort"
# How long a session's last words (an error and the close frame) may take before the socket is cut instead.
_FAREWELL_TIMEOUT = 5.0
# Batches of one session stored at once (the client's window is 4 by default); past it the socket waits.
_MAX_STORING = 8

Send = Callable[[str], Awaitable[None]]
# Ids and messages echoed from a peer's input: bounded, and valid UTF-8 (a lone surrogate from a JSON escape
# would make the frame unsendable, and the peer's decoder refuses it).
_MAX_ECHOED_ID = 128
_MAX_ECHOED_TEXT = 1000


def _clean(text: str, limit: int = _MAX_ECHOED_TEXT) -> str:
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _named(item: object, name: str) -> str:
    """An undecodable operation's ``name`` field as ``operation-rejected`` echoes it ("" when it has none)."""
    value = item.get(name) if isinstance(item, dict) else None
    return _clean(value, _MAX_ECHOED_ID) if isinstance(value, str) else ""


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


async def _deny_origin(websocket: WebSocket, origin: str) -> None:
    log.warning(
        "refused a sync connection from origin %r: it is not in allowed_origins (OFFLINE_ALLOWED_ORIGINS)",
        origin[:200],
    )
    # Closing before accepting makes the ASGI server answer HTTP 403. (A denial response with a body would
    # say more, but uvicorn logs every one of those as an application error.)
    await websocket.close(POLICY, "ORIGIN_NOT_ALLOWED")


async def sync_endpoint(
    websocket: WebSocket,
    service: SyncService,
    guard: ConnectionGuard,
    origins: OriginPolicy | None = None,
) -> None:
    origin = websocket.headers.get("origin")
    if origins is not None and not origins.permits(origin):
        await _deny_origin(websocket, origin or "")
        return
    if guard.draining:
        await websocket.accept()
        await _refuse(websocket, None, p.SERVER_SHUTDOWN, "the server is shutting down; reconnect shortly")
        return
    conn = guard.admit(websocket.scope.get(ABORT_KEY), client_address(websocket))
    if isinstance(conn, str):
        _stop_reading(websocket)
        await websocket.accept()
        await _refuse(websocket, None, p.OVERLOADED, conn)
        _hang_up(websocket)
        return
    try:
        await _serve(websocket, service, guard, conn)
    except Exception as exc:
        if not is_disconnect(exc):
            raise
        _abrupt(conn, None)  # gone while being answered (its handshake, say)
    finally:
        guard.release(conn)


def _cap_frames(websocket: WebSocket, limit: int) -> Callable[[], None]:
    """Until the handshake is accepted, frames larger than ``limit`` are refused by the WebSocket layer as they
    arrive (close 1009), before they are buffered: an unauthenticated peer cannot make the server hold
    ``max_message_bytes`` per connection. Returns what puts the connection's usual limit back. (The frame
    parser reads the limit when a frame's first byte arrives, and a client sends nothing after its handshake
    before the answer, so the larger limit is in place for its first batch.) Best effort: an ASGI server
    whose protocol object does not expose the limit keeps its own."""
    transport = websocket.scope.get(TRANSPORT_KEY)
    protocol = getattr(transport, "get_protocol", lambda: None)()
    parser = getattr(protocol, "conn", None)  # uvicorn's sans-I/O implementation: a websockets protocol
    for name in ("max_message_size", "max_size"):  # websockets >= 15, then older releases
        usual = getattr(parser, name, None)
        if isinstance(usual, int) and usual > limit:

            def restore(parser: Any = parser, name: str = name, usual: int = usual) -> None:
                setattr(parser, name, usual)

            setattr(parser, name, limit)
            return restore
    return _nothing


def _nothing() -> None:
    return None


def _stop_reading(websocket: WebSocket) -> None:
    """A refused connection is answered and hung up without reading another byte: what its peer sends meanwhile
    (a frame of up to max_handshake_bytes) stays in the kernel instead of this process, so a flood of refused
    connections costs no memory."""
    transport = websocket.scope.get(TRANSPORT_KEY)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.pause_reading()


def _hang_up(websocket: WebSocket) -> None:
    """Close the TCP connection once the refusal is sent, without waiting (up to 10 s) for the peer to echo
    the close frame: a flood of connections told to go away must not keep their sockets meanwhile."""
    transport = websocket.scope.get(TRANSPORT_KEY)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()


def _abrupt(conn: Connection, node_id: str | None) -> None:
    """One line (no traceback) for a client that vanished, within the process's budget for such lines."""
    _DISCONNECTS.log(
        logging.INFO,
        "sync client %s%s disconnected abruptly",
        conn.address,
        f" (node {node_id})" if node_id else "",
    )


async def _store_failed(refuse: Callable[..., Awaitable[None]], doing: str, exc: BaseException) -> None:
    """Refuse a handshake the server's store failed during: INTERNAL_ERROR, retriable (the client tries again
    with backoff; nothing is wrong with its credentials), the cause in the server's log only."""
    cause = f"[{exc.code}] {exc.message}" if isinstance(exc, OfflineError) else f"{type(exc).__name__}: {exc}"
    log.error("sync handshake failed: the server store failed while %s: %s", doing, cause)
    await refuse(
        p.INTERNAL_ERROR,
        f"the server's store failed while {doing}; try again shortly (the server's log says why)",
        True,
        TRY_AGAIN,
    )


async def _refuse(
    websocket: WebSocket,
    send: Send | None,
    code: str,
    message: str,
    retriable: bool = True,
    close_code: int = TRY_AGAIN,
) -> None:
    with contextlib.suppress(Exception):
        text = p.encode(p.ErrorMessage(p.new_message_id(), code, message, retriable))
        await (send(text) if send is not None else websocket.send_text(text))
        await websocket.close(close_code, code)


async def _serve(
    websocket: WebSocket, service: SyncService, guard: ConnectionGuard, conn: Connection
) -> None:
    await websocket.accept()
    conn.restore_frame_limit = _cap_frames(websocket, guard.limits.max_handshake_bytes)
    send_lock = asyncio.Lock()

    async def send(text: str) -> None:
        # The relay task and the receive loop both write; frames must not interleave. The watchdog reads
        # `sending_since` to find sockets that stopped draining.
        async with send_lock:
            conn.sending_since = time.monotonic()
            try:
                await websocket.send_text(text)
            finally:
                conn.sending_since = 0.0
        guard.note_sent(conn)

    async def refuse(code: str, message: str, retriable: bool, close_code: int = POLICY) -> None:
        await _refuse(websocket, send, code, message, retriable, close_code)

    stop: asyncio.Future[Any] = asyncio.ensure_future(conn.stop.wait())
    try:
        await _session(websocket, service, guard, conn, send, refuse, stop)
    finally:
        stop.cancel()


async def _session(
    websocket: WebSocket,
    service: SyncService,
    guard: ConnectionGuard,
    conn: Connection,
    send: Send,
    refuse: Callable[..., Awaitable[None]],
    stop: asyncio.Future[Any],
) -> None:
    first: asyncio.Future[Any] = asyncio.ensure_future(_receive_text(websocket))
    done, _ = await asyncio.wait(
        {first, stop}, timeout=service.limits.handshake_timeout, return_when=asyncio.FIRST_COMPLETED
    )
    if first not in done:
        first.cancel()
        if stop in done and conn.leaving != SILENT:
            await refuse(p.SERVER_SHUTDOWN, "the server is shutting down; reconnect shortly", True, TRY_AGAIN)
        else:
            if conn.leaving != SILENT:
                guard.counts["cut_handshake_timeout"] += 1
            await refuse(p.PROTOCOL_VIOLATION, "no handshake received in time", True)
            _hang_up(websocket)
        return
    guard.heard(conn)
    try:
        frame = first.result()
    except (_Closed, WebSocketDisconnect):
        return
    try:
        hello = p.decode(frame, max_bytes=service.limits.max_message_bytes)
    except p.ProtocolError as exc:
        await refuse(exc.code, _clean(exc.message), False)
        return
    if not isinstance(hello, p.Handshake):
        await refuse(p.PROTOCOL_VIOLATION, "the first message must be a handshake", False)
        return
    if not service.started or guard.draining:
        await refuse(p.SERVER_SHUTDOWN, "the server is shutting down; reconnect shortly", True, TRY_AGAIN)
        return
    try:
        claims = await service.authenticate(hello.auth_token)
    except OfflineError as exc:
        if exc.code in (p.USER_DISABLED, p.EMAIL_NOT_VERIFIED):
            # The provider's own words: not retriable, not a token problem (no refresh helps).
            await refuse(exc.code, _clean(exc.message), False)
        elif exc.code == p.OVERLOADED:  # the token could not be checked now (an identity provider is down)
            await refuse(p.OVERLOADED, _clean(exc.message), True, TRY_AGAIN)
        elif exc.code == STORAGE_ERROR:
            await _store_failed(refuse, "checking the sign-in", exc)
        else:
            await refuse(p.AUTH_FAILED, "authentication failed", False)
        return
    try:
        bound = await service.bind_node(hello.node_id, claims)
    except Exception as exc:  # the store failed reading or registering the device: not the client's fault
        await _store_failed(refuse, "reading the device's registration", exc)
        return
    if not bound:
        await refuse(p.AUTH_FAILED, "this node id belongs to another principal", False)
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
    session = Session(
        node_id=hello.node_id,
        filters=filters,
        claims=claims,
        send=send,
        cursor=cursor,
        wants_states=hello.initial_sync == "states",
    )
    try:
        vector = await service.store.version_vector()
    except Exception as exc:
        await _store_failed(refuse, "reading what it holds", exc)
        return
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
        delivery_epoch=service.delivery_epoch,
    )
    conn.restore_frame_limit()  # signed in: the session's frames may be as large as max_message_bytes
    guard.authenticated(conn)
    await send(p.encode(response))
    conn.session = session
    service.sessions.add(session)
    # Revoking the auth session or the token expiring asks this session to leave (see live_sessions).
    live = service.live.add(claims, conn.ask_to_leave)
    service.emit("connection", {"nodeId": session.node_id, "state": "connected"})
    relay = asyncio.create_task(service.relay(session), name=f"relay-{session.node_id}")
    # Batches of this session being stored, oldest first. The next frame is read while they are: a batch
    # that arrives meanwhile joins the next group commit instead of waiting for the one before it to be
    # stored and acknowledged (at a few hundred small batches a second, that wait made the queue). Each
    # acknowledgement still follows the one before it; past _MAX_STORING the socket is not read
    # (backpressure, as before).
    storing: collections.deque[asyncio.Task[None]] = collections.deque()
    receive: asyncio.Future[Any] | None = None
    errors = 0
    reason = "closed"
    try:
        while True:
            while storing and storing[0].done():
                storing.popleft().result()  # a batch that could not be stored ends the session, as before
            if conn.stop.is_set():
                if receive is not None:
                    receive.cancel()  # the frame, if one arrives, stays queued; its sender resends it anyway
                    receive = None
                if conn.leaving in (REVOKED, EXPIRED):
                    await _stop_task(relay)  # its credentials are gone: nothing more is relayed to it
                await _settle(storing)  # the batches in hand are stored and acknowledged first
                reason = await _farewell(websocket, send, relay, conn)
                break
            if receive is None and len(storing) < _MAX_STORING:
                receive = asyncio.ensure_future(_receive_text(websocket))
            waiting: set[asyncio.Future[Any]] = {relay, stop}
            if receive is not None:
                waiting.add(receive)
            if storing:
                waiting.add(storing[0])
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if receive is None or receive not in done:
                if relay in done:
                    relay.result()
                    if not service.started:  # the service stopped without a drain (embedded use)
                        conn.ask_to_leave(SHUTDOWN)
                        continue
                    reason = "relay stopped"
                    break
                continue  # a batch stored, or asked to leave: the top of the loop sees to it
            frame = receive.result()
            receive = None
            try:
                message = p.decode(
                    frame,
                    max_bytes=service.limits.max_message_bytes,
                    max_batch=service.limits.max_batch_operations,
                )
                if not isinstance(message, (p.OperationBatch, p.OperationMessage, p.Acknowledgment)) and not (
                    isinstance(message, p.Handshake) and message.message_id == hello.message_id
                ):
                    # Well formed but not for the server (a second handshake, a server-only message).
                    raise p.ProtocolError(p.PROTOCOL_VIOLATION, f"unexpected {type(message).__name__}", False)
            except p.ProtocolError as exc:
                # Not fatal, until a connection keeps at it.
                errors += 1
                await send(
                    p.encode(p.ErrorMessage(p.new_message_id(), exc.code, _clean(exc.message), exc.retriable))
                )
                if errors >= service.limits.max_protocol_errors:
                    await websocket.close(POLICY, "too many malformed messages")
                    reason = "misbehaving"
                    break
                continue
            if isinstance(message, (p.OperationBatch, p.OperationMessage)):
                raw = (
                    list(message.operations) if isinstance(message, p.OperationBatch) else [message.operation]
                )
                wait = conn.bucket.delay(len(raw))
                if wait > 0:
                    # Over its rate: hold this batch (and so its acknowledgement and the reading of the next
                    # one) instead of refusing it.
                    guard.counts["rate_limited_batches"] += 1
                    await asyncio.sleep(wait)
                texts = message.operation_texts if isinstance(message, p.OperationBatch) else None
                # Created in arrival order, each task hands its batch to the write pipeline before any
                # other runs: batches are judged and stored in the order they arrived.
                storing.append(
                    asyncio.create_task(
                        _receive_operations(
                            service,
                            session,
                            message.message_id,
                            raw,
                            texts,
                            after=storing[-1] if storing else None,
                        ),
                        name=f"store-{session.node_id}",
                    )
                )
            elif isinstance(message, p.Acknowledgment):
                # The client persists its own watermark; the relay only needs to know the batch arrived.
                session.acknowledged(message.acknowledged_message_id)
            # else: the same handshake delivered twice, a duplicate ignored (never fatal)
    except (_Closed, WebSocketDisconnect):
        reason = "client closed" if conn.leaving is None else f"cut ({conn.leaving})"
    except asyncio.CancelledError:
        if conn.leaving is None:
            raise
        reason = f"cut ({conn.leaving})"  # the guard freed this session (see Connection.cut)
    except Exception as exc:
        if is_disconnect(exc):  # a send (the relay's, say) found the connection gone
            reason = "client vanished"
            _abrupt(conn, session.node_id)
        else:
            log.exception("sync session %s failed", session.node_id)
            reason = "server error"
            with contextlib.suppress(Exception):
                await websocket.close(1011, "server error")
    finally:
        if receive is not None:
            receive.cancel()
        for task in storing:
            # The commit itself goes on (it is shielded): only an acknowledgement nobody can receive is dropped.
            task.cancel()
        conn.session = None
        service.sessions.discard(session)
        service.live.discard(live)
        await _stop_task(relay)
        service.emit("connection", {"nodeId": session.node_id, "state": "disconnected", "reason": reason})


async def _settle(storing: collections.deque[asyncio.Task[None]]) -> None:
    """Wait for the batches being stored (and their acknowledgements), at most the farewell timeout."""
    if storing:
        await asyncio.wait(storing, timeout=_FAREWELL_TIMEOUT)
    while storing and storing[0].done():
        storing.popleft().result()


async def _farewell(websocket: WebSocket, send: Send, relay: asyncio.Task[None], conn: Connection) -> str:
    """End a session the guard asked to leave: stop relaying, say why, close (or cut a peer not reading)."""
    await _stop_task(relay)
    session = conn.session
    retriable = True
    if conn.leaving == REVOKED:
        code, close_code, retriable = p.SESSION_REVOKED, POLICY, False
        message = "this session was signed out or revoked; sign in again"
    elif conn.leaving == EXPIRED:
        code, close_code = p.TOKEN_EXPIRED, POLICY
        message = "the access token expired; refresh it and reconnect"
    elif conn.leaving == RESYNC:
        pending = len(session.unacked) if session is not None else 0
        code, close_code = p.RESYNC_REQUIRED, TRY_AGAIN
        message = (
            f"this connection fell too far behind ({pending} relay batches unacknowledged); reconnect and "
            "resume from the last delivery you applied"
        )
    else:
        code, close_code = p.SERVER_SHUTDOWN, SERVICE_RESTART
        message = "the server is restarting; reconnect shortly (unacknowledged operations are resent then)"
    try:
        async with asyncio.timeout(_FAREWELL_TIMEOUT):
            await send(p.encode(p.ErrorMessage(p.new_message_id(), code, message, retriable)))
            await websocket.close(close_code, code)
    except (TimeoutError, OSError, WebSocketDisconnect, RuntimeError):
        conn.cut()
    return conn.leaving if conn.leaving in (RESYNC, REVOKED, EXPIRED) else SHUTDOWN


async def _stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it to end; cancel again if it carried on. (Python 3.11's ``wait_for``
    returns normally when a cancellation races with its inner future completing: the relay, waiting for a
    wake-up with a timeout, can swallow a cancel that arrives together with a commit.)"""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    if not task.cancelled():
        task.exception()  # retrieved: a relay that failed on a closed socket is not worth a warning


async def _receive_operations(
    service: SyncService,
    session: Session,
    message_id: str,
    raw: Sequence[object],
    texts: Sequence[str] | None = None,
    *,
    after: asyncio.Task[None] | None = None,
) -> None:
    """Decode, judge and store one batch's operations; ``texts`` are their compact texts when ``decode``
    vouched for them (the operations keep them: the store and the relay use them as they are). ``after``: the
    task storing the session's previous batch, whose answers must go out first."""
    refused: list[tuple[str, Refusal, str, str]] = []  # (id, refusal, collection, record id)
    ops = []
    limit = service.limits.max_operation_bytes
    for index, item in enumerate(raw):
        try:
            text = None if texts is None else texts[index]
            ops.append(p.decode_operation_text(item, max_bytes=limit, text=text)[0])  # type: ignore[arg-type]
        except p.ProtocolError as exc:
            op_id = item.get("id") if isinstance(item, dict) else None
            # Echo the id only when the peer can take it back (the protocol's rule for operationId).
            key = _clean(op_id, _MAX_ECHOED_ID) if isinstance(op_id, str) and op_id else "?"
            collection, record_id = _named(item, "collection"), _named(item, "recordId")
            refused.append((key, Refusal(exc.code, _clean(exc.message)), collection, record_id))
            # Counted and published like the pipeline's own refusals (metrics, status, live events).
            service.rejections[exc.code] = service.rejections.get(exc.code, 0) + 1
            service.emit(
                "rejected",
                {
                    "operationId": key,
                    "collection": collection,
                    "recordId": record_id,
                    "code": exc.code,
                    "message": exc.message,
                },
            )
    results = await service.commit(session, ops)
    if after is not None and not after.done():
        await asyncio.wait({after})  # its failure, if any, is the session's to report
    session.received += len(raw)
    records: dict[str, tuple[str, str]] | None = None  # built only when the pipeline refused something
    for op_id, value in results.items():
        if isinstance(value, Refusal):
            if records is None:
                records = {op.id: (op.collection, op.record_id) for op in ops}
            refused.append((op_id, value, *records[op_id]))
    for op_id, refusal, collection, record_id in refused:
        session.rejected += 1
        await session.send(
            p.encode(
                p.OperationRejected(
                    p.new_message_id(),
                    op_id,
                    refusal.code,
                    _clean(refusal.message),
                    refusal.retriable,
                    collection=collection,
                    record_id=record_id,
                )
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
