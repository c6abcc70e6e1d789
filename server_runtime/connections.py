"""The sync connections of one server process: admission, write rate, lag watchdog and graceful drain.

The relay pulls from the committed log at the pace the socket accepts frames (uvicorn's send waits while the
transport's buffer is above its high-water mark), so a slow reader holds at most one frame and one socket
buffer, never a growing queue. What remains to bound is time and bookkeeping: a connection whose socket has
accepted nothing for ``send_stall_timeout`` is cut off, and one that leaves too many relay batches
unacknowledged is told to resync. Both are checked here, by one watchdog task for all connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from .client_address import most_crowded, network_of
from .limits import ConnectionLimits
from .sync import Session

log = logging.getLogger("offline.server.sync")

SHUTDOWN = "shutdown"
RESYNC = "resync"
STALLED = "stalled"
SILENT = "silent"


class TokenBucket:
    """Operations a session may send: ``rate`` per second, up to ``burst`` at once."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def delay(self, count: int) -> float:
        """Take ``count`` tokens; the seconds to wait before acting on them (0 when within the rate)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate) - count
        self.stamp = now
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def _no_op() -> None:
    return None


class Connection:
    """One admitted sync WebSocket."""

    __slots__ = (
        "abort",
        "address",
        "bucket",
        "heard",
        "leaving",
        "network",
        "restore_frame_limit",
        "sending_since",
        "session",
        "since",
        "stop",
        "task",
    )

    def __init__(self, limits: ConnectionLimits, abort: Callable[[], None] | None, address: str = "") -> None:
        self.abort = abort  # drops the TCP connection at once (None when the ASGI server offers no way)
        self.address = address  # the client's (see server_runtime.client_address)
        self.network = network_of(address)
        self.since = time.monotonic()
        self.heard = False  # a first frame arrived
        self.restore_frame_limit: Callable[[], None] = _no_op  # see endpoint._cap_frames
        self.bucket = TokenBucket(limits.operations_per_second, limits.operations_burst)
        self.session: Session | None = None
        self.sending_since = 0.0  # monotonic start of the send in progress; 0 when none
        self.stop = asyncio.Event()  # set with `leaving` to make the endpoint end the session
        self.leaving: str | None = None
        self.task = asyncio.current_task()

    def ask_to_leave(self, reason: str) -> None:
        if self.leaving is None:
            self.leaving = reason
        self.stop.set()

    def cut(self) -> None:
        """End the connection without a word: the peer reads nothing we send (or must not wait for it)."""
        if self.abort is not None:
            with contextlib.suppress(Exception):
                self.abort()
        elif self.task is not None and not self.task.done():
            self.task.cancel()  # frees the session; the socket is left to the ASGI server


class ConnectionGuard:
    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.connections: set[Connection] = set()
        self.draining = False
        self.counts: Counter[str] = Counter()  # refusals and forced endings by reason, for metrics
        # Connections that have sent nothing yet, by client address and all together, oldest first (dicts keep
        # insertion order).
        self.pending: dict[str, dict[Connection, None]] = {}
        self.silent: dict[Connection, None] = {}
        # ...and by network (`client_address.network_of`), for each network's share when every slot is taken.
        self.crowds: dict[str, dict[Connection, None]] = {}
        # Connections whose handshake has not been accepted yet (each may buffer max_handshake_bytes).
        self.unauthenticated: dict[Connection, None] = {}
        self._empty = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self.connections))

    def admit(self, abort: Callable[[], None] | None, address: str = "") -> Connection | str:
        """A slot for a new connection from ``address``, or why there is none: the process holds
        ``max_connections`` already, or that address has ``max_pending_per_address`` connections that have
        not sent their handshake (so one address cannot hold every slot with sockets that never say hello), or
        ``max_unauthenticated_connections`` of all addresses together have not had their handshake accepted
        (so many addresses together cannot make it buffer gigabytes before sign-in). Either way a
        connection that has said nothing for ``silent_grace`` seconds gives way to the new one first; at a
        process-wide limit, failing that, so does one of the network holding the most silent connections, when
        that is more than the newcomer's would hold (`_evict_crowded`)."""
        now = time.monotonic()
        network = network_of(address)
        made_room = False  # an evicted connection counts until it is gone: evict one at most per admission
        if len(self.connections) >= self.limits.max_connections:
            made_room = self._evict_silent(self.silent, now) or self._evict_crowded(network)
            if not made_room:
                self.counts["refused_overloaded"] += 1
                return (
                    f"this server holds its maximum of {self.limits.max_connections} sync connections; "
                    "retry later (with backoff)"
                )
        waiting = self.pending.get(address)
        if waiting is not None and len(waiting) >= self.limits.max_pending_per_address:
            if not self._evict_silent(waiting, now):
                self.counts["refused_pending_per_address"] += 1
                return (
                    f"{self.limits.max_pending_per_address} sync connections from this address have not sent "
                    "their handshake yet; retry later (with backoff)"
                )
            made_room = True
        # Every address together: each of these may buffer max_handshake_bytes before it is signed in.
        if (
            len(self.unauthenticated) >= self.limits.max_unauthenticated_connections
            and not made_room
            and not self._evict_silent(self.silent, now)
            and not self._evict_crowded(network)
        ):
            self.counts["refused_unauthenticated"] += 1
            return (
                f"{self.limits.max_unauthenticated_connections} sync connections are waiting for their "
                "handshake to be accepted; retry later (with backoff)"
            )
        conn = Connection(self.limits, abort, address)
        self.pending.setdefault(address, {})[conn] = None
        self.silent[conn] = None
        self.crowds.setdefault(conn.network, {})[conn] = None
        self.unauthenticated[conn] = None
        self.connections.add(conn)
        self._empty.clear()
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch(), name="offline-sync-watchdog")
        return conn

    def _evict_silent(self, group: dict[Connection, None], now: float) -> bool:
        """Ask the oldest connection of ``group`` that has sent nothing for ``silent_grace`` to leave; whether
        there was one."""
        for conn in group:
            if conn.heard or conn.leaving is not None:
                continue
            if now - conn.since < self.limits.silent_grace:
                return False  # the rest are younger still
            self.counts["cut_silent"] += 1
            conn.ask_to_leave(SILENT)
            self.heard(conn)
            return True
        return False

    def _evict_crowded(self, network: str) -> bool:
        """Ask the oldest silent connection of the network holding the most silent connections to leave,
        when that network would still hold more than the newcomer's (from ``network``) with it; whether one
        was asked. Every slot taken by young silent sockets (too young to give way by age) is then shared out
        between networks, not kept by whoever filled it first: a party with a few addresses, or an IPv6 /48,
        keeps no other network out. Those sockets are what clients hold only for the moment before their
        handshake, so a real client rarely loses one, and then retries."""
        crowd = most_crowded(self.crowds, network)
        if crowd is None:
            return False
        conn = next(iter(crowd))  # oldest first; every one of them silent (`heard` takes them out)
        self.counts["cut_crowded"] += 1
        conn.ask_to_leave(SILENT)
        self.heard(conn)
        return True

    def heard(self, conn: Connection) -> None:
        """``conn`` sent its first frame (or is leaving): no longer silent, no longer counted against its
        address. (Only silence holds a slot for free: a handshake that arrived is answered at once.)"""
        conn.heard = True
        self.silent.pop(conn, None)
        crowd = self.crowds.get(conn.network)
        if crowd is not None and conn in crowd:
            del crowd[conn]
            if not crowd:
                del self.crowds[conn.network]
        waiting = self.pending.get(conn.address)
        if waiting is not None and conn in waiting:
            del waiting[conn]
            if not waiting:
                del self.pending[conn.address]  # no entry per address ever seen

    def authenticated(self, conn: Connection) -> None:
        """``conn``'s handshake was accepted: it no longer counts against max_unauthenticated_connections."""
        self.unauthenticated.pop(conn, None)

    def release(self, conn: Connection) -> None:
        self.heard(conn)
        self.authenticated(conn)
        self.connections.discard(conn)
        if not self.connections:
            self._empty.set()

    def note_sent(self, conn: Connection) -> None:
        """After each frame: a session leaving this many relay batches unacknowledged must resync."""
        session = conn.session
        if session is not None and len(session.unacked) > self.limits.max_unacked_batches:
            if conn.leaving is None:
                self.counts["resync_unacknowledged"] += 1
            conn.ask_to_leave(RESYNC)

    async def _watch(self) -> None:
        stall = self.limits.send_stall_timeout
        period = max(0.1, min(1.0, stall / 4))
        while self.connections:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn in list(self.connections):
                since = conn.sending_since
                if since and now - since > stall and conn.leaving != STALLED:
                    # Every buffer between us and the peer is full and it drains none of it: a message
                    # asking it to resync could not get through either.
                    log.warning(
                        "sync session %s accepted no data for %.0f s: disconnecting it (it resumes from its "
                        "watermark when it reconnects)",
                        conn.session.node_id if conn.session else "(handshaking)",
                        now - since,
                    )
                    self.counts["cut_stalled"] += 1
                    conn.leaving = STALLED
                    conn.cut()

    async def drain(self, grace: float | None = None) -> None:
        """Stop admitting; ask every session to finish what it has in hand and leave (SERVER_SHUTDOWN); cut
        the ones still there after ``grace`` seconds."""
        self.draining = True
        for conn in self:
            conn.ask_to_leave(SHUTDOWN)
        if self.connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.limits.shutdown_grace if grace is None else grace):
                    await self._empty.wait()
        left = list(self)
        if left:
            log.warning(
                "%d sync connection(s) did not leave within the shutdown grace period: cutting them off "
                "(their clients resend what was not acknowledged)",
                len(left),
            )
        for conn in left:
            self.counts["cut_shutdown"] += 1
            conn.cut()
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(BaseException):
                await self._watchdog
            self._watchdog = None


class GuardCollector:
    """Prometheus view of the guard (registered on the server's own registry)."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        guard = self.guard
        yield GaugeMetricFamily(
            "offline_sync_connections_open", "Open sync WebSocket connections", value=len(guard.connections)
        )
        yield GaugeMetricFamily(
            "offline_sync_connections_silent",
            "Open sync connections that have not sent their handshake yet",
            value=len(guard.silent),
        )
        yield GaugeMetricFamily(
            "offline_sync_connections_unauthenticated",
            "Open sync connections whose handshake has not been accepted yet",
            value=len(guard.unauthenticated),
        )
        yield GaugeMetricFamily(
            "offline_sync_connections_limit",
            "Most sync connections this process admits",
            value=guard.limits.max_connections,
        )
        ended = CounterMetricFamily(
            "offline_sync_connections_limited",
            "Sync connections refused or ended by a limit, by reason",
            labels=["reason"],
        )
        for reason, count in sorted(guard.counts.items()):
            ended.add_metric([reason], count)
        yield ended
