"""TCP connections that have not sent a complete request head yet: a bounded number per peer address, for a
bounded time. uvicorn has no deadline of its own for a request head, so a peer opening connections and
sending nothing (or a byte now and then) would hold a file descriptor each, until the process can accept no
more. Here each new connection must reach the application (its HTTP request or WebSocket upgrade complete)
within ``handshake_timeout`` or it is dropped, and one address may have at most ``max_pending_per_address``
such connections at once (see `ConnectionGate.opened`), of which it reads a few at a time; all addresses
together at most ``max_pending_requests``, shared out between networks when young ones fill them. Trusted
proxies (``OFFLINE_TRUSTED_PROXIES``) carry every client's connections, so their count is not limited; the
deadline still applies.

The protocol class wraps uvicorn's own (whichever HTTP implementation it picked); the application side
reports each head's arrival through `TransportInScope` (see ``server_runtime.request_limits``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from .client_address import ProxyPolicy, limit_key, most_crowded, network_of
from .log_budget import LogBudget

__all__ = ["ConnectionGate", "GateCollector"]

log = logging.getLogger("offline.server")
# uvicorn's default keep-alive: how long a served connection may wait before its next request starts.
KEEP_ALIVE = 5.0
# Connections of one address whose request is read at once; more wait their turn, unread.
READING_PER_ADDRESS = 16


class ConnectionGate:
    def __init__(
        self,
        policy: ProxyPolicy,
        max_per_address: int,
        deadline: float,
        grace: float = 1.0,
        max_pending: int = 1024,
    ) -> None:
        self.policy = policy
        self.max_per_address = max_per_address
        self.max_pending = max_pending
        self.deadline = deadline
        self.grace = grace
        # Per counted address, its waiting transports (oldest first) and when each arrived.
        self.pending: dict[str, dict[Any, float]] = {}
        # Per counted address, its connections being read, and those held unread until one of them is done.
        self.reading: dict[str, set[Any]] = {}
        self.held: dict[str, dict[Any, None]] = {}
        # Every counted waiting transport (oldest first) and when it arrived, and each network's
        # (`client_address.network_of`): the bound on all addresses together, and its fair share.
        self.counted: dict[Any, float] = {}
        self.networks: dict[str, dict[Any, None]] = {}
        # transport -> (its counted address or None, the deadline's timer)
        self._waiting: dict[Any, tuple[str | None, asyncio.TimerHandle]] = {}
        self.refused = 0
        self.expired = 0
        self.crowded = 0  # dropped at max_pending: the newcomer, or one of the most crowded network's
        self._refusals = LogBudget(log, "dropped connections", period=30.0, burst=1)

    def opened(self, transport: Any) -> None:
        """A new TCP connection: counted against its peer's address and given its deadline, or dropped.

        At the address's limit, its oldest waiting connection gives way when it has waited ``grace`` seconds
        (a real client sends its request at once); otherwise the newcomer is dropped. At ``max_pending`` for
        all addresses together, likewise, or one of the most crowded network's (`_make_room`)."""
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else None
        address = None if host is None or self.policy.trusts_peer(host) else limit_key(host)
        now = time.monotonic()
        if address is not None:
            waiting = self.pending.get(address, {})
            if len(waiting) >= self.max_per_address:
                oldest, since = next(iter(waiting.items()))
                if now - since >= self.grace:
                    self._drop(oldest, address)
                else:
                    self._drop(transport, address)
                    return
            network = network_of(address)
            if len(self.counted) >= self.max_pending and not self._make_room(network, now):
                self.crowded += 1
                self._drop(transport, address)
                return
            self.pending.setdefault(address, {})[transport] = now  # (the drop above may have emptied it)
            self.counted[transport] = now
            self.networks.setdefault(network, {})[transport] = None
            reading = self.reading.setdefault(address, set())
            if len(reading) < READING_PER_ADDRESS:
                reading.add(transport)
            else:
                # Its turn comes when one of the address's connections reached the application: one address
                # opening connections by the thousand gets no more of the event loop than a few clients.
                with contextlib.suppress(Exception):
                    transport.pause_reading()
                self.held.setdefault(address, {})[transport] = None
        timer = asyncio.get_running_loop().call_later(self.deadline, self._expire, transport)
        self._waiting[transport] = (address, timer)

    def _make_room(self, network: str, now: float) -> bool:
        """At ``max_pending``: drop the oldest waiting connection when it has waited ``grace`` seconds, else
        the oldest of the most crowded network's (`client_address.most_crowded`); whether one was dropped."""
        oldest, since = next(iter(self.counted.items()))
        if now - since < self.grace:
            crowd = most_crowded(self.networks, network)
            if crowd is None:
                return False
            oldest = next(iter(crowd))
        self.crowded += 1
        address = self._waiting[oldest][0]
        assert address is not None
        self._drop(oldest, address)
        return True

    def _drop(self, transport: Any, address: str) -> None:
        self.refused += 1
        self._refusals.log(
            logging.WARNING,
            "dropped a connection from %s: %d of its connections have not sent a request yet",
            address,
            len(self.pending.get(address, ())),
        )
        self._release(transport)
        with contextlib.suppress(Exception):
            transport.abort()

    def idle(self, transport: Any) -> None:
        """A response went out on a kept-alive connection: its next request head has the same deadline, on
        top of the keep-alive time (uvicorn's own keep-alive timer stops at the first byte, so a peer
        sending one byte now and then would otherwise hold the connection for ever). Not counted against
        the address: the connection has been served."""
        if transport in self._waiting or transport.is_closing():
            return
        timer = asyncio.get_running_loop().call_later(self.deadline + KEEP_ALIVE, self._expire, transport)
        self._waiting[transport] = (None, timer)

    def headed(self, transport: Any) -> None:
        """The connection's request (or upgrade) reached the application: no longer waited for."""
        self._release(transport)

    def lost(self, transport: Any) -> None:
        self._release(transport)

    def _release(self, transport: Any) -> None:
        entry = self._waiting.pop(transport, None)
        if entry is None:
            return
        address, timer = entry
        timer.cancel()
        if address is not None:
            self.counted.pop(transport, None)
            network = network_of(address)
            crowd = self.networks.get(network)
            if crowd is not None:
                crowd.pop(transport, None)
                if not crowd:
                    del self.networks[network]
            waiting = self.pending.get(address)
            if waiting is not None:
                waiting.pop(transport, None)
                if not waiting:
                    del self.pending[address]
            held = self.held.get(address)
            if held is not None and transport in held:
                del held[transport]
            reading = self.reading.get(address)
            if reading is not None and transport in reading:
                reading.discard(transport)
                while held:  # the next held connection of the address is read now
                    nxt = next(iter(held))
                    del held[nxt]
                    if not nxt.is_closing():
                        reading.add(nxt)
                        with contextlib.suppress(Exception):
                            nxt.resume_reading()
                        break
            if held is not None and not held:
                del self.held[address]
            if reading is not None and not reading:
                del self.reading[address]

    def _expire(self, transport: Any) -> None:
        if transport in self._waiting:
            self.expired += 1
            self._release(transport)
            with contextlib.suppress(Exception):
                transport.abort()

    def protocol(self, base: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
        """``base`` (uvicorn's HTTP protocol) reporting its connections to this gate."""
        gate = self

        class GatedProtocol(base):  # type: ignore[valid-type,misc]
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self._gate_transport = transport
                super().connection_made(transport)
                if not transport.is_closing():
                    gate.opened(transport)

            def on_response_complete(self) -> None:
                super().on_response_complete()
                transport = getattr(self, "_gate_transport", None)
                if transport is not None:
                    gate.idle(transport)

            def connection_lost(self, exc: Exception | None) -> None:
                gate.lost(getattr(self, "_gate_transport", None))
                super().connection_lost(exc)

        GatedProtocol.__name__ = GatedProtocol.__qualname__ = f"Gated{base.__name__}"
        return GatedProtocol


class GateCollector:
    """Prometheus view of the gate (registered on the server's own registry)."""

    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield GaugeMetricFamily(
            "offline_http_connections_waiting",
            "TCP connections that have not sent a complete request yet",
            value=len(self.gate._waiting),
        )
        dropped = CounterMetricFamily(
            "offline_http_connections_dropped",
            "TCP connections dropped before their request: too many from one address, too many from every "
            "address together (the most crowded network gives way), or past the deadline",
            labels=["reason"],
        )
        dropped.add_metric(["per_address"], self.gate.refused - self.gate.crowded)
        dropped.add_metric(["crowded"], self.gate.crowded)
        dropped.add_metric(["deadline"], self.gate.expired)
        yield dropped
