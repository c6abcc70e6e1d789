"""The client sync engine behind `app.sync` (DESIGN.md section 4).

One background task keeps a session alive: connect, handshake, send what the server lacks (from its version
vector), apply what the server streams (persisting the delivery watermark with the operations), stream new
local writes, and reconnect with exponential backoff and jitter when the connection drops. Local writes
never wait for the network: they are durable in the local store and sent when a session exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import random
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from offline.core.errors import SYNC_ERROR, OfflineError
from offline.core.hlc import MAX_DRIFT_MS
from offline.core.operations import Operation, operation_from_text
from offline.core.scopes import build_scope_map
from offline.merge.values import operation_text
from offline.store import compaction, replication

from . import protocol as p
from . import snapshot
from .transport import ConnectionLost, Transport, TransportRefused, default_transport

if TYPE_CHECKING:
    from offline.store.app import App

log = logging.getLogger("offline.sync")

# Connection states reported by `app.sync.status`.
DISCONNECTED = "disconnected"  # not started, or stopped by disconnect()
CONNECTING = "connecting"
SYNCING = "syncing"  # handshake accepted, catching up
CONNECTED = "connected"  # caught up; streaming both ways
OFFLINE = "offline"  # the connection dropped; retrying with backoff
ERROR = "error"  # refused for good (authentication, schema); see last_error

#: `SyncFatal` code: the server holds fewer of this device's operations than the device once had
#: acknowledged, and the missing ones were compacted away here (`app.compact()`), so they cannot be sent
#: again: the server lost data (restored from an older backup, or its database replaced). Syncing stops
#: before anything is sent or received; the replica stays exactly as it is.
COMPACTED_OPERATIONS_LOST = "COMPACTED_OPERATIONS_LOST"


class SyncFatal(OfflineError):
    """The server refused this client in a way retrying cannot fix."""


class ApplyFailed(ConnectionLost):
    """A received operation could not be stored here: its batch is not acknowledged, the session ends and
    the next one receives it again (see `SyncEngine.apply_error`)."""


# Restamped operations are stamped at most this far ahead of the server's time (the server refuses past
# MAX_DRIFT_MS): the margin covers the error of the offset, measured over one round trip.
_RESTAMP_MARGIN_MS = 60_000


class SyncEngine:
    def __init__(self, app: App, config: Mapping[str, Any]) -> None:
        url = config.get("url")
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise OfflineError(
                f"sync url must be a ws:// or wss:// URL, got {url!r}", SYNC_ERROR, {"field": "sync.url"}
            )
        self.app = app
        self.url = url
        self.auth_client = config.get("auth_client", config.get("authClient"))
        self.scope: dict[str, Any] = dict(config.get("scope") or {})
        self.transport: Transport = config.get("transport") or default_transport()
        self.batch_size = int(config.get("batch_size", 500))
        # Batches sent and not yet acknowledged, at most. Writes made meanwhile wait and go out together in
        # the next batch, so a fast writer sends fewer, larger batches instead of queueing one tiny batch
        # per write at a server that commits (and fsyncs) each message on its own.
        self.max_in_flight = max(1, int(config.get("max_in_flight", 4)))
        # A batch also ends at this many bytes of operations, well inside the server's frame limit.
        self.batch_bytes = int(config.get("batch_bytes", p.MAX_MESSAGE_BYTES // 4))
        # Most operations held from frames that end no batch (a batch split by size, or made long by the
        # earlier operations of records entering the scope): past this many, they are applied as they come.
        self.max_held_operations = int(config.get("max_held_operations", 20_000))
        self.backoff_initial = float(config.get("backoff_initial", 0.2))
        self.backoff_max = float(config.get("backoff_max", 15.0))
        self.handshake_timeout = float(config.get("handshake_timeout", 15.0))
        # A batch the server has not acknowledged after this long is sent again (it may have been lost).
        self.ack_timeout = float(config.get("ack_timeout", 5.0))
        # How a replica that has received nothing yet asks to be brought up to date: "states" (the server
        # may send each record's merge state instead of all of its operations when its log is long; the
        # replica then holds what a compaction would have left) or "operations" (every operation, so the
        # replica can export the whole history to peers through `App.operations`).
        self.initial_sync = str(config.get("initial_sync", "states"))
        if self.initial_sync not in ("states", "operations"):
            raise OfflineError(
                f'sync initial_sync must be "states" or "operations", got {self.initial_sync!r}',
                SYNC_ERROR,
                {"field": "sync.initial_sync"},
            )
        self.status = DISCONNECTED
        self.last_error: OfflineError | None = None
        self.server_node_id: str | None = None
        self._handshake_reply = ""  # messageId of the accepted handshake-response of this session
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self._synced: asyncio.Event | None = None
        self._stopping = False
        self._progress: asyncio.Event | None = None  # set on acknowledgements and status changes
        # Batch message id -> (send time, operation ids, this node's sequence numbers among them).
        self._in_flight: dict[str, tuple[float, list[str], list[int]]] = {}
        # Batches given up on (see _expire_in_flight): message id -> (operation ids, own sequence numbers).
        self._expired: dict[str, tuple[list[str], list[int]]] = {}
        # Where each operation sent in this session is held (node id, sequence number), for refusals.
        self._places: dict[str, tuple[str, int]] = {}
        self._cursor = 0
        # How far the server's scan of its log went in a state-based first sync (progress only).
        self._states_through = 0
        # The server's last delivery sequence when this session began: how far a first sync has to go.
        self.server_delivery_sequence = 0
        self._sent: set[str] = set()
        # This session sent (or holds in _sent) every pending local operation up to this sequence number.
        self._scan_from = 0
        #: Operations sent (resends included), for monitoring.
        self.sent_operations = 0
        # Acknowledgement timing, for deciding when an unacknowledged batch is lost (see _expire_in_flight).
        self._last_ack = 0.0  # when the server last acknowledged one of our batches
        self._acked_upto = 0.0  # send time of the latest-sent batch the server acknowledged
        self._ack_rtt = 0.0  # smoothed time from sending a batch to its acknowledgement
        self.connections = 0
        self._accepted = False  # whether the current session's handshake was accepted
        #: The received operation that could not be stored, while it is not (a dict: operationId,
        #: collection, recordId, code, message); nothing after it is acknowledged meanwhile.
        self.apply_error: dict[str, Any] | None = None
        # Per collection, the record filter the server accepted for this session (what it may see).
        self._scope_filters: dict[str, dict[str, Any]] = {}
        # Operations (and their texts) of frames that end no batch (no watermark), held to be applied with the
        # frame that ends it: one transaction, so no state in between is ever visible (a record entering this
        # session's scope arrives with its earlier operations first, in the states it had before the move).
        self._held: tuple[list[Operation], list[str]] = ([], [])
        # Applied before the end of their batch (past max_held_operations): judged for leaving the scope
        # at the end.
        self._unsettled: list[Operation] = []
        self._auth_retry_used = False  # one refresh-and-retry per refused handshake (reset when accepted)
        # When set (the browser's worker does, see offline/worker_tabs.py), this node's operations are sent
        # only up to this sequence number: the ones above are not in the browser's storage yet, and a tab
        # that closed before storing them would number its next operations the same, which the server then
        # refuses as forgeries (taking those writes out of their records).
        self.durable_sequence: int | None = None
        app.commit_listeners.append(self._on_local_commit)

    # -- public API ------------------------------------------------------------------------------------------

    async def connect(self, *, wait: bool = True, timeout: float | None = 30.0) -> None:
        """Start syncing in the background; with ``wait``, return once the first handshake is accepted."""
        if self._task is None or self._task.done():
            self._loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
            self._ready = asyncio.Event()
            self._synced = asyncio.Event()
            self._progress = asyncio.Event()
            self._stopping = False
            self.last_error = None
            self._task = asyncio.create_task(self._run(), name="offline-sync")
        if wait:
            assert self._ready is not None
            waiter = asyncio.create_task(self._ready.wait())
            try:
                done, _ = await asyncio.wait(
                    {waiter, self._task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                waiter.cancel()  # also when connect() itself is cancelled: no task left pending
            if self.last_error is not None and self.status == ERROR:
                raise self.last_error
            if not done:
                raise OfflineError(
                    f"could not reach the sync server at {self.url} within {timeout} s; it keeps retrying "
                    "in the background (check the URL and that the server runs)",
                    SYNC_ERROR,
                    {"url": self.url},
                )

    async def disconnect(self) -> None:
        self._stopping = True
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._task = None
        self.status = DISCONNECTED

    async def wait_until_synced(self, timeout: float = 30.0) -> None:
        """Wait until the server's backlog is applied and every local operation is acknowledged."""
        deadline = time.monotonic() + timeout
        while True:
            if self.status == ERROR and self.last_error is not None:
                raise self.last_error
            synced = self._synced is not None and self._synced.is_set()
            # Batches in flight are unacknowledged operations: no need to count them in the database.
            if (
                synced
                and self.status == CONNECTED
                and self.apply_error is None
                and not self._in_flight
                and replication.pending_count(self.app) == 0
            ):
                return
            remaining = deadline - time.monotonic()
            if remaining < 0:
                failed = self.apply_error
                unapplied = (
                    ""
                    if failed is None
                    else f"; received operation {failed['operationId']} could not be applied: "
                    f"{failed['code']}: {failed['message']}"
                )
                raise OfflineError(
                    f"not in sync with {self.url} after {timeout} s (status {self.status}, "
                    f"{replication.pending_count(self.app)} operations waiting{unapplied})",
                    SYNC_ERROR,
                    {"url": self.url, "status": self.status, "applyError": failed},
                )
            progress = self._progress
            if progress is None:
                await asyncio.sleep(min(remaining, 0.02))
                continue
            # Woken by every acknowledgement and status change; the bound covers states nobody signals
            # (an app closed underneath, a local write made while connected).
            progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progress.wait(), min(remaining, 0.05))

    @property
    def pending(self) -> int:
        return replication.pending_count(self.app)

    @property
    def clock_offset_ms(self) -> int:
        """Server time minus this device's time, from the last handshake (0 before the first)."""
        return self.app.clock_offset_ms

    def rejected(self) -> list[dict[str, Any]]:
        """The operations the server refused, with its code and message and the record as this device
        wrote it: ``{operationId, collection, recordId, code, message, data, rejectedAt}``."""
        return replication.rejected(self.app)

    def retry(self, operation_id: str) -> dict[str, Any] | None:
        """Write a refused operation's data again, as a new operation; returns the record written."""
        return replication.retry(self.app, operation_id)

    def discard(self, operation_id: str) -> bool:
        """Forget a refused operation (the record keeps the server's state)."""
        return replication.discard(self.app, operation_id)

    def describe(self) -> dict[str, Any]:
        """The sync status as data: state, operations waiting, refusals kept, clock offset, what could
        not be applied or went wrong last, and how far the server's log is received (``received`` of
        ``serverTotal``, delivery sequences: a first sync's progress)."""
        error = self.last_error
        return {
            "status": self.status,
            "pending": self.pending,
            "received": max(self._cursor, self._states_through),
            "serverTotal": max(self.server_delivery_sequence, self._cursor, self._states_through),
            "rejected": replication.rejected_count(self.app),
            "clockOffsetMs": self.clock_offset_ms,
            "applyError": None if self.apply_error is None else dict(self.apply_error),
            "error": None if error is None else {"code": error.code, "message": error.message},
        }

    # -- local writes ---------------------------------------------------------------------------------------

    def allow_through(self, sequence: int) -> None:
        """This node's operations up to ``sequence`` are stored for good: they may be sent now."""
        if self.durable_sequence is None or sequence > self.durable_sequence:
            self.durable_sequence = sequence
            self._on_local_commit([])

    def _durable(self, items: list[tuple[str, int, str, str]]) -> list[tuple[str, int, str, str]]:
        limit, own = self.durable_sequence, self.app.node_id
        if limit is None:
            return items
        return [item for item in items if item[0] != own or item[1] <= limit]

    def _on_local_commit(self, ops: list[Operation]) -> None:
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            wake.set()
        else:  # a write from another thread: hand the wake-up to the loop's thread
            loop.call_soon_threadsafe(wake.set)

    # -- the session loop -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        while not self._stopping:
            if self.app._closed:  # app.close() without disconnect(): nothing left to sync, stop for good
                self.status = DISCONNECTED
                return
            self.status = CONNECTING if attempt == 0 else OFFLINE
            try:
                conn = await self.transport.connect(self.url)
            except TransportRefused as exc:
                if exc.status in (401, 403):
                    self._fail("AUTH_FAILED", f"the server refused the connection: {exc}")
                    return
                await self._backoff(attempt, str(exc))
                attempt += 1
                continue
            except ConnectionLost as exc:
                await self._backoff(attempt, str(exc))
                attempt += 1
                continue
            self.connections += 1
            self._accepted = False
            try:
                await self._session(conn)
            except SyncFatal as exc:
                self.last_error = exc
                self.status = ERROR
                await conn.close(1008, exc.code)
                self._emit_disconnected(exc.code)
                assert self._ready is not None
                self._ready.set()
                return
            except (TimeoutError, ConnectionLost, p.ProtocolError) as exc:
                self._emit_disconnected(str(exc) or type(exc).__name__)
                await conn.close()
            except asyncio.CancelledError:
                await conn.close(1000, "client disconnect")
                self._emit_disconnected("client disconnect")
                raise
            except Exception as exc:  # a bug must not kill sync for good: log, back off, retry
                if self.app._closed:  # the app was closed under a running session: not a failure
                    await conn.close(1000, "app closed")
                    self._emit_disconnected("app closed")
                    self.status = DISCONNECTED
                    return
                log.exception("sync session failed")
                self._emit_disconnected(f"{type(exc).__name__}: {exc}")
                await conn.close(1011, "client error")
            if self._synced is not None:
                self._synced.clear()
            if self._accepted and self.apply_error is None:
                # A session was established: the backoff starts over (drops hours apart). Not when it ended
                # on an operation this replica cannot store: the next session meets it again at once.
                attempt = 0
            if not self._stopping:
                await self._backoff(attempt, "reconnecting")
                attempt += 1

    def _fail(self, code: str, message: str) -> None:
        self.last_error = SyncFatal(message, code, {"url": self.url})
        self.status = ERROR
        if self._ready is not None:
            self._ready.set()

    async def _backoff(self, attempt: int, reason: str) -> None:
        self.status = OFFLINE
        delay = min(self.backoff_max, self.backoff_initial * (2 ** min(attempt, 16)))
        delay *= random.uniform(0.5, 1.5)  # jitter: clients dropped together must not return together
        log.debug("sync: %s; retrying in %.2f s", reason, delay)
        await asyncio.sleep(delay)

    def _emit_disconnected(self, reason: str) -> None:
        if self.app.events.has_listeners("sync:disconnected"):
            self.app.events.emit("sync:disconnected", reason=reason)

    async def _auth_token(self) -> str | None:
        client = self.auth_client
        if client is None:
            return None
        for name in ("get_access_token", "get_token"):
            getter = getattr(client, name, None)
            if getter is not None:
                token = getter()
                if asyncio.iscoroutine(token):
                    token = await token
                return None if token is None else str(token)
        return None

    async def _session_token(self) -> str | None:
        try:
            return await self._auth_token()
        except OfflineError as exc:
            if exc.code == p.AUTH_FAILED:  # signed out or the session ended: only a new sign-in helps
                raise SyncFatal(exc.message, exc.code, {"url": self.url}) from None
            raise ConnectionLost(f"{exc.code}: {exc.message}") from None  # auth server unreachable: retry

    async def _refresh_once(self) -> bool:
        client = self.auth_client
        if client is None or self._auth_retry_used:
            return False
        refresh = getattr(client, "refresh_access_token", None) or getattr(client, "refresh", None)
        if refresh is None:
            return False
        self._auth_retry_used = True
        try:
            result = refresh()
            if asyncio.iscoroutine(result):
                result = await result
        except OfflineError:
            return False
        return result is not None

    async def _refresh_after_expiry(self) -> None:
        """The server ended the session because its access token expired (TOKEN_EXPIRED): refresh it before
        reconnecting, whatever this machine's clock says about it. A refused refresh (the session was revoked
        meanwhile) is left to the reconnect's token check, which then stops syncing with AUTH_FAILED; an
        unreachable auth server is retried with the reconnect."""
        client = self.auth_client
        refresh = getattr(client, "refresh_access_token", None) or getattr(client, "refresh", None)
        if refresh is None:
            return
        try:
            result = refresh()
            if asyncio.iscoroutine(result):
                await result
        except OfflineError as exc:
            log.info("sync: refreshing the expired access token failed (%s)", exc.code)

    async def _session(self, conn: Any) -> None:
        app = self.app
        watermark = replication.delivery_watermark(app)
        hello = p.Handshake(
            message_id=p.new_message_id(),
            node_id=app.node_id,
            version_vector=app.version_vector,
            schema_version=app.schema.version,
            last_delivery_sequence=watermark,
            auth_token=await self._session_token(),
            sync_scope=build_scope_map(app.schema, self.scope) if self.scope else None,
            # (Also to go on with one that was cut: the server resumes it from the watermark.)
            initial_sync="states"
            if self.initial_sync == "states" and (watermark == 0 or replication.states_sync_unfinished(app))
            else None,
        )
        asked_at = app._wall()
        await conn.send(p.encode(hello))
        reply = p.decode(await asyncio.wait_for(conn.recv(), self.handshake_timeout))
        answered_at = app._wall()
        if isinstance(reply, p.ErrorMessage):
            if reply.retriable:
                raise ConnectionLost(f"{reply.code}: {reply.message}")
            if reply.code == p.AUTH_FAILED and await self._refresh_once():
                # The token may have expired between reading it and the server checking it: one refresh
                # and a reconnect, never a loop (the flag clears only when a handshake is accepted).
                raise ConnectionLost("AUTH_FAILED: retrying once with a refreshed token")
            raise SyncFatal(reply.message, reply.code, {"url": self.url})
        if not isinstance(reply, p.HandshakeResponse):
            raise p.ProtocolError(
                p.PROTOCOL_VIOLATION, f"expected handshake-response, got {type(reply).__name__}"
            )
        if not reply.accepted:
            reason = reply.reject_reason or "SCHEMA_MISMATCH"
            raise SyncFatal(reason, reason.split(":", 1)[0], {"url": self.url})
        stored = reply.version_vector.get(app.node_id, 0)
        dropped = compaction.dropped_own(app)
        if dropped > stored:
            # Resending from the server's number would leave holes it never learns of (the writes live on
            # here only folded into record states), so stop before touching anything. Checked first: a
            # restored server also renumbers deliveries, which would reset the watermark below.
            raise SyncFatal(
                f"the server at {self.url} holds this device's writes only up to sequence number {stored}, "
                f"but it had acknowledged them up to {dropped}, and this device compacted those (dropped them "
                "from its log after the acknowledgement): the server lost data, e.g. it was restored from an "
                "older backup. They cannot be sent again, so syncing stopped and nothing here was changed. "
                "Restore the server from a backup that holds them (a newer one), or sync a device that still "
                "holds them in its log (it sends them again), then connect again; to go on without them, start "
                "this device over with a new replica file (what only it holds is lost)",
                COMPACTED_OPERATIONS_LOST,
                {"url": self.url, "serverSequence": stored, "compactedSequence": dropped},
            )
        renumbered = replication.adopt_delivery_server(app, reply.node_id, reply.delivery_epoch)
        if renumbered and hello.last_delivery_sequence > 0:
            # Our watermark counts another server database's deliveries (an in-memory server restarted, a
            # database replaced, a backup restored): resuming from it would skip operations. Start over
            # from delivery 0.
            raise ConnectionLost(f"server {reply.node_id} did not issue our delivery watermark; resyncing")
        self._accepted = True
        self._auth_retry_used = False
        self.server_node_id = reply.node_id
        self.server_delivery_sequence = reply.server_max_delivery_sequence
        # The server read its clock about halfway through the round trip.
        app.set_clock_offset(reply.server_time - (asked_at + answered_at) // 2)
        self._scope_filters = snapshot.scope_filters(reply.accepted_scope or {})
        if replication.adopt_sync_scope(app, self._scope_filters) and hello.last_delivery_sequence > 0:
            # The replica synced under another scope until now (the user's claims changed, or the app asks
            # for another scope): what the new one adds was delivered before the watermark. Start over.
            raise ConnectionLost("the sync scope changed; resyncing from the start")
        self._handshake_reply = reply.message_id
        app.set_authoritative_nodes([reply.node_id])
        self.status = SYNCING
        self._in_flight.clear()
        self._sent.clear()
        self._places.clear()
        self._held = ([], [])  # the server sends the whole batch again: its cursor did not move
        self._scan_from = 0
        self._last_ack = time.monotonic()
        self._acked_upto = 0.0
        self._cursor = replication.delivery_watermark(app)
        self._states_through = 0
        if app.events.has_listeners("sync:connected"):
            app.events.emit("sync:connected", nodeId=reply.node_id)
        assert self._ready is not None and self._wake is not None
        self._ready.set()

        reader = asyncio.create_task(self._reader(conn), name="offline-sync-reader")
        try:
            server_vector = dict(reply.version_vector)
            missing = app.operations(after=server_vector)
            # All of them at once, however many batches that takes: the window applies to new writes.
            await self._send_operations(conn, missing)
            while True:
                self._wake.clear()
                self._expire_in_flight()
                if len(self._in_flight) < self.max_in_flight:
                    await self._send_pending(conn)
                waiter = asyncio.create_task(self._wake.wait())
                try:
                    done, _ = await asyncio.wait(
                        {waiter, reader}, timeout=self.ack_timeout / 2, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    waiter.cancel()  # a cancelled session must not leave this task pending
                if reader in done:
                    reader.result()  # re-raises why the reader stopped
                    raise ConnectionLost("the server closed the connection")
        finally:
            if not reader.done():
                reader.cancel()
            # Also when the reader already failed (the send side noticed first): retrieve its exception,
            # or asyncio logs "Task exception was never retrieved" on every dropped connection.
            with contextlib.suppress(BaseException):
                await reader

    def _expire_in_flight(self) -> None:
        """Forget batches that look lost, so their operations are sent again.

        The server handles one connection's batches in order, so a batch older than the ack timeout is
        presumed lost when a batch sent after it was acknowledged (it was overtaken) or when the server has
        acknowledged nothing for that long. The timeout stretches with the observed acknowledgement time: a
        busy server still working through the queue must not be sent the same operations again, which
        would only make it slower (each resend of a backlog is a whole backlog more to check).
        """
        now = time.monotonic()
        timeout = max(self.ack_timeout, 2 * self._ack_rtt)
        silent = now - self._last_ack > timeout
        for message_id, (sent_at, ids, sequences) in list(self._in_flight.items()):
            if now - sent_at > timeout and (silent or sent_at < self._acked_upto):
                del self._in_flight[message_id]
                # An acknowledgement may still arrive for it: remember its operations until then.
                self._expired[message_id] = (ids, sequences)
                while len(self._expired) > 1000:
                    self._expired.pop(next(iter(self._expired)))
                self._sent.difference_update(ids)
                if sequences:  # look at this node's pending operations from there again
                    self._scan_from = min(self._scan_from, min(sequences) - 1)

    async def _send_pending(self, conn: Any) -> None:
        """Send this node's unacknowledged operations that this session has not sent, as stored."""
        node_id = self.app.node_id
        rows = replication.pending_wires(self.app, after=self._scan_from)
        await self._send_batches(
            conn, self._durable([(node_id, seq, op_id, wire) for seq, op_id, wire in rows])
        )

    async def _send_operations(self, conn: Any, ops: list[Operation]) -> None:
        items = [(op.node_id, op.sequence_number, op.id, operation_text(op)) for op in ops]
        await self._send_batches(conn, self._durable(items), windowed=False)

    async def _send_batches(
        self, conn: Any, items: list[tuple[str, int, str, str]], *, windowed: bool = True
    ) -> None:
        """Send ``(node id, sequence number, id, wire JSON)`` items not sent yet, in batches; ``windowed``:
        only while fewer than ``max_in_flight`` batches await their acknowledgement (the pending operations
        not sent now are found again on the next round)."""
        sent = self._sent
        own = self.app.node_id
        fresh = [item for item in items if item[2] not in sent]
        index = 0
        start = 0
        while start < len(fresh) and (not windowed or len(self._in_flight) < self.max_in_flight):
            end, size = start, 0
            while end < len(fresh) and end - start < self.batch_size:
                size += len(fresh[end][3])
                if size > self.batch_bytes and end > start:
                    break
                end += 1
            chunk = fresh[start:end]
            message_id = p.new_message_id()
            frame = p.encode_batch_frame(
                message_id, [item[3] for item in chunk], is_final=end >= len(fresh), batch_index=index
            )
            ids = [item[2] for item in chunk]
            sequences = [seq for node, seq, _, _ in chunk if node == own]
            self._in_flight[message_id] = (time.monotonic(), ids, sequences)
            sent.update(ids)
            self._places.update((op_id, (node, seq)) for node, seq, op_id, _ in chunk)
            if sequences and windowed:
                # Pending operations come in sequence order: every one up to here is sent or in _sent. (Not
                # so for the operations missing at the start of a session, which come in causal order and
                # leave out the ones the server holds unacknowledged: the first scan finds those.)
                self._scan_from = max(self._scan_from, sequences[-1])
            await conn.send(frame)
            self.sent_operations += len(chunk)
            if self.app.events.has_listeners("sync:sent"):
                operations = [operation_from_text(item[3]) for item in chunk]
                self.app.events.emit("sync:sent", operations=operations, batchSize=len(chunk))
            start = end
            index += 1

    async def _reader(self, conn: Any) -> None:
        app = self.app
        while True:
            frame = await conn.recv()
            received: _Received | None = None
            # A large frame is a batch whose operations live until they are stored: the collector is held
            # off from parsing it to the end of applying it (see _collector_held_off; no await in between).
            with _collector_held_off(len(frame) // _FRAME_BYTES_PER_OPERATION):
                message = p.decode(frame)
                if isinstance(message, p.OperationBatch) and self._is_next_batch(message):
                    received = self._decode_and_apply(
                        list(message.operations), message.max_delivery_sequence, message.operation_texts
                    )
            if isinstance(message, p.OperationBatch):
                top = message.max_delivery_sequence
                if received is None:
                    # A batch already applied (a duplicate, or re-sent): acknowledge it again, as the server
                    # re-sends what it does not see acknowledged (the first acknowledgement may have been lost).
                    ack = p.Acknowledgment(
                        message_id=p.new_message_id(),
                        acknowledged_message_id=message.message_id,
                        last_sequence_number=0,
                        delivery_sequence=top,
                    )
                    await conn.send(p.encode(ack))
                    continue
                await self._after_applying(conn, message.message_id, received, top)
                # Buffered frames are returned without suspending; let the app, pings and the sender run.
                await asyncio.sleep(0)
                if top is not None:
                    self._cursor = max(self._cursor, top)
                if message.is_final and self._synced is not None and not self._synced.is_set():
                    self._synced.set()
                    self.status = CONNECTED
                    self._signal()
            elif isinstance(message, p.OperationMessage):
                await self._receive(conn, message.message_id, [message.operation], message.delivery_sequence)
            elif isinstance(message, p.Acknowledgment):
                entry = self._in_flight.pop(message.acknowledged_message_id, None)
                late = self._expired.pop(message.acknowledged_message_id, None)
                if late is not None:  # acknowledged after we gave up on it: it was stored all the same
                    replication.mark_acknowledged(app, late[1])
                    self._forget(late[0])
                if entry is not None:
                    sent_at, ids, sequences = entry
                    now = time.monotonic()
                    rtt = now - sent_at
                    self._ack_rtt = 0.8 * self._ack_rtt + 0.2 * rtt if self._ack_rtt else rtt
                    self._last_ack = now
                    self._acked_upto = max(self._acked_upto, sent_at)
                    replication.mark_acknowledged(app, sequences)
                    # Stored: never pending again, and past refusal (refusals precede the acknowledgement).
                    self._forget(ids)
                if app.events.has_listeners("sync:acknowledged"):
                    app.events.emit("sync:acknowledged", sequenceNumber=message.last_sequence_number)
                self._signal()  # a slot for another batch opened; wait_until_synced may be done
            elif isinstance(message, p.OperationRejected):
                self._refused(message)
            elif isinstance(message, p.RecordStates):
                await self._adopt_states(conn, message)
            elif isinstance(message, p.HandshakeResponse) and message.message_id == self._handshake_reply:
                continue  # the same reply delivered twice: a duplicate is ignored, never a reason to reconnect
            elif isinstance(message, p.ErrorMessage):
                if message.code == p.TOKEN_EXPIRED:
                    await self._refresh_after_expiry()
                if message.retriable:
                    raise ConnectionLost(f"{message.code}: {message.message}")
                raise SyncFatal(message.message, message.code, {"url": self.url})
            else:
                raise p.ProtocolError(
                    p.PROTOCOL_VIOLATION, f"unexpected {type(message).__name__} from the server"
                )

    async def _adopt_states(self, conn: Any, message: p.RecordStates) -> None:
        """The server's record states (state-based catch-up after a compaction, see `p.RecordStates`): each
        replaces this replica's state of its record; the final one moves the watermark to the horizon."""
        app = self.app
        horizon = message.horizon if message.is_final else None
        through = message.through if horizon is None else None

        # Each message is stored in one transaction with how far the server's scan got (``through``): a
        # cut from here on resumes from it (issue 28: a first sync cut before its last message started over
        # from 0). A record the server's state puts outside this scope is dropped, as one moved away would be.
        # (The protocol checked each entry: string names and state, versions an object of numbers.)
        snapshot.adopt(app, message.states, self._scope_filters, through=through)
        if horizon is not None:
            snapshot.finish(app, horizon)
            self._cursor = max(self._cursor, horizon)
        elif through is not None:
            self._states_through = max(self._states_through, through)
            self._cursor = max(self._cursor, through)
        ack = p.Acknowledgment(
            message_id=p.new_message_id(),
            acknowledged_message_id=message.message_id,
            last_sequence_number=0,
            delivery_sequence=horizon,
        )
        await conn.send(p.encode(ack))

    def _refused(self, message: p.OperationRejected) -> None:
        """One of the operations sent was refused: written again when only its timestamp was at fault,
        else taken out of the operation set and kept in the rejected list."""
        app = self.app
        place = self._places.get(message.operation_id)
        if message.code == p.CLOCK_DRIFT and (place is None or place[0] == app.node_id):
            # Stamped before this device knew the server's time (its clock is fast; the handshake of this
            # session corrected it): the write is made again under the corrected clock, in the order the
            # refusals come (the order it was sent in).
            ceiling = app._physical() + MAX_DRIFT_MS - _RESTAMP_MARGIN_MS
            again = replication.restamp(app, message.operation_id, place=place, ceiling=ceiling)
            if again is not None:
                if again.id != message.operation_id:  # (else: a refusal delivered twice)
                    log.info(
                        "sync: operation %s was stamped ahead of the server's clock; sent again as %s",
                        message.operation_id,
                        again.id,
                    )
                self._signal()
                return
        log.warning("server refused operation %s: %s %s", message.operation_id, message.code, message.message)
        replication.reject_operation(app, message.operation_id, message.code, message.message, place=place)

    def _forget(self, ids: list[str]) -> None:
        self._sent.difference_update(ids)
        places = self._places
        for op_id in ids:
            places.pop(op_id, None)

    def _signal(self) -> None:
        if self._wake is not None:
            self._wake.set()
        if self._progress is not None:
            self._progress.set()

    def _is_next_batch(self, message: p.OperationBatch) -> bool:
        """False for a batch already applied (to be acknowledged again); raises `ConnectionLost` when one
        before it never arrived."""
        base = message.base_delivery_sequence
        top = message.max_delivery_sequence
        if top is not None and top <= self._cursor and message.operations:
            return False
        if base is not None and base > self._cursor:
            # A batch before this one never arrived (lost or reordered): resume from what is applied.
            raise ConnectionLost(f"delivery gap: expected after {self._cursor}, got a batch after {base}")
        return True

    async def _receive(
        self,
        conn: Any,
        message_id: str,
        raw_ops: list[Any],
        watermark: int | None,
        texts: tuple[str, ...] | None = None,
    ) -> None:
        with _collector_held_off(len(raw_ops)):  # (not across an await: the acknowledgement comes after)
            received = self._decode_and_apply(raw_ops, watermark, texts)
        await self._after_applying(conn, message_id, received, watermark)

    async def _after_applying(
        self, conn: Any, message_id: str, received: _Received, watermark: int | None
    ) -> None:
        """What follows applying a frame's operations: scope upkeep, ``sync:received``, the acknowledgement."""
        app = self.app
        applied, ops, count = received
        if applied is None:  # held, to be applied with a later frame
            await self._acknowledge(conn, message_id, ops, watermark)
            return
        # Operations applied before the end of their batch (more than max_held_operations came without one):
        # only the frame that ends the batch can tell which records left the scope.
        if self._scope_filters:
            if watermark is None:
                self._unsettled.extend(applied)
            elif applied or self._unsettled:
                settled, self._unsettled = self._unsettled + applied, []
                self._forget_moved_away(settled)
        if ops and app.events.has_listeners("sync:received"):
            app.events.emit("sync:received", operations=applied, batchSize=len(ops))
        await self._acknowledge(conn, message_id, ops[len(ops) - count :], watermark)

    def _decode_and_apply(
        self, raw_ops: list[Any], watermark: int | None, texts: tuple[str, ...] | None
    ) -> _Received:
        """Decode a frame's operations and apply them with those held from earlier frames: (the operations
        newly applied, every operation of this apply, how many came in this frame); (None, this frame's
        operations, their number) when they are held for a later frame instead."""
        app = self.app
        ops: list[Operation] = []
        wires: list[str] = []
        for index, raw in enumerate(raw_ops):
            try:
                op, wire = p.decode_operation_text(raw, text=None if texts is None else texts[index])
            except p.ProtocolError as exc:  # never acknowledge what was not stored
                self._unapplied(_describe_raw(raw), exc.code, exc.message)
            ops.append(op)
            wires.append(wire)
        count = len(ops)
        held_ops, held_wires = self._held
        if watermark is None and len(held_ops) + count <= self.max_held_operations:
            held_ops += ops
            held_wires += wires
            return None, ops, count
        if held_ops:
            ops, wires = held_ops + ops, held_wires + wires
            self._held = ([], [])
        try:
            # decode_operation_text verified every id: the store need not hash the operations again, and
            # it stores the texts as they are.
            applied = app.apply_verified(ops, wires, watermark=watermark)
        except OfflineError:
            if app._closed:  # closed under the session: nothing is wrong with the operations
                raise
            # Isolate what this replica cannot take: everything before it is stored, and nothing is
            # acknowledged nor the watermark moved past it (the next session receives it again).
            applied = []
            for op, wire in zip(ops, wires, strict=True):
                try:
                    applied.extend(app.apply_verified([op], [wire]))
                except OfflineError as exc:
                    self._unapplied(_describe(op), exc.code, exc.message)
            if watermark is not None:
                app.apply_verified([], None, watermark=watermark)
        if watermark is not None:
            self.apply_error = None
        return applied, ops, count

    def _unapplied(self, what: dict[str, Any], code: str, message: str) -> NoReturn:
        """Record (status, event) that a received operation cannot be stored here, and end the session
        without acknowledging it."""
        failure = {**what, "code": code, "message": message}
        log.error(
            "sync: could not apply operation %s (%s/%s) from the server: %s: %s; it is not acknowledged "
            "and is received again on the next connection",
            failure["operationId"],
            failure["collection"],
            failure["recordId"],
            code,
            message,
        )
        self.apply_error = failure
        if self.app.events.has_listeners("sync:apply-failed"):
            self.app.events.emit("sync:apply-failed", **failure)
        self._signal()
        raise ApplyFailed(f"{code}: operation {failure['operationId']} could not be applied: {message}")

    async def _acknowledge(
        self, conn: Any, message_id: str, ops: list[Operation], watermark: int | None
    ) -> None:
        ack = p.Acknowledgment(
            message_id=p.new_message_id(),
            acknowledged_message_id=message_id,
            last_sequence_number=max((op.sequence_number for op in ops), default=0),
            delivery_sequence=watermark,
        )
        await conn.send(p.encode(ack))

    def _forget_moved_away(self, applied: list[Operation]) -> None:
        """Records these operations moved out of this session's scope (the server gave them to someone
        else): the server sends nothing more about them, so they are dropped here instead of going stale."""
        self._forget_outside([(op.collection, op.record_id) for op in applied if op.type != "delete"])

    def _forget_outside(self, keys: list[tuple[str, str]]) -> None:
        """Drop those of these records that are outside this session's scope."""
        gone = snapshot.forget_outside(self.app, self._scope_filters, keys)
        if gone:
            log.info("sync: %d record(s) left this device's scope and were removed", len(gone))


def _describe(op: Operation) -> dict[str, Any]:
    return {"operationId": op.id, "collection": op.collection, "recordId": op.record_id}


def _describe_raw(raw: Any) -> dict[str, Any]:
    """`_describe` of an operation that did not decode (whatever of it can be read)."""
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):
            raw = json.loads(raw)
    fields = raw if isinstance(raw, Mapping) else {}
    return {
        name: str(fields.get(key, "?"))[:200]
        for name, key in (("operationId", "id"), ("collection", "collection"), ("recordId", "recordId"))
    }


# Batches at least this large are decoded and applied with the cyclic garbage collector held off.
_HOLD_COLLECTOR_AT = 200
# Frames are held off from their parse on by their size: an operation's wire JSON takes a few hundred bytes,
# so a frame of this many bytes an operation counts as that many operations (a 200-operation batch of the
# smallest operations still comes out above the line, a handshake or an acknowledgement far below).
_FRAME_BYTES_PER_OPERATION = 200

# (the operations newly applied, or None when held for a later frame; every operation of the apply; how
# many came in this frame): what `SyncEngine._decode_and_apply` hands to `_after_applying`.
_Received = tuple[list[Operation] | None, list[Operation], int]


@contextlib.contextmanager
def _collector_held_off(size: int) -> Iterator[None]:
    """Hold Python's cyclic garbage collector off while a large batch is decoded and applied.

    A batch's operations (thousands of containers) live until it is stored, so the collections their
    allocations trigger find them alive, promote them, and soon set off full collections that walk every
    object of the process (~27 ms each with 100,000 objects: 9 % of an initial sync here). What a batch leaves
    behind is freed by reference counting; the collector runs again as soon as the batch is applied. Left
    alone when the application has turned the collector off itself.
    """
    if size < _HOLD_COLLECTOR_AT or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def create_sync_engine(app: App, config: Mapping[str, Any]) -> SyncEngine:
    return SyncEngine(app, config)
