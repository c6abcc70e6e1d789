"""WebSocket pings that tell a peer that vanished from one that is busy.

uvicorn's keepalive closes a connection (1011) when the pong to its ping is not back within ``ping_timeout``.
But a ping is queued behind every relay frame already sent: a client working through a backlog (a burst of
writes in its scope, on a loaded machine) reads the ping, and answers it, only after those frames. While it
does, its acknowledgements keep arriving, so it is plainly there; cutting it made it reconnect and fetch the
same backlog again. The pong may also wait on our side: the server reads a connection's next frame only once
the session took the last one, and a session behind on its own work leaves the pong unread in the socket.

So here the pong's deadline moves on, by ``ping_timeout`` each time, while the peer sent anything since the
ping (or its frames wait on us, unread); a peer that went silent for a whole ``ping_timeout`` is cut as
before, with a line in the log (uvicorn logs nothing at its usual levels). A peer that stops reading is the
send watchdog's (``send_stall_timeout``, see ``server_runtime.connections``): its socket stops accepting our
frames.
"""

from __future__ import annotations

import logging
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from .log_budget import LogBudget

__all__ = ["PatientWebSocketProtocol"]

log = logging.getLogger("offline.server.sync")
# uvicorn says nothing (below DEBUG) when its keepalive closes a connection: one line here, within a budget.
_SILENT_PEERS = LogBudget(log, "peers cut for not answering pings", period=30.0, burst=1)


class PatientWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, taking any frame from the peer as a sign of life while a pong is due."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.heard_since_ping = False

    def data_received(self, data: bytes) -> None:
        self.heard_since_ping = True
        super().data_received(data)

    def send_keepalive_ping(self) -> None:
        self.heard_since_ping = False
        super().send_keepalive_ping()

    def keepalive_timeout(self) -> None:
        if (self.heard_since_ping or self.read_paused) and self.ping_timeout is not None:
            self.heard_since_ping = False
            self.pong_timer = self.loop.call_later(self.ping_timeout, self.keepalive_timeout)
            return
        if not (self.close_sent or self.transport.is_closing()):
            peer = self.client
            _SILENT_PEERS.log(
                logging.INFO,
                "sync client %s has not answered a ping for %.1f s and sent nothing in the last %g s: "
                "disconnecting it (close 1011)",
                peer[0] if peer else "?",
                self.loop.time() - self.ping_sent_at,
                self.ping_timeout,
            )
        super().keepalive_timeout()
