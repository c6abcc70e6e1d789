"""Server limits and who may connect: the configuration side of hardening.

Every limit has a default, can be passed in ``sync_options={"limits": {...}}`` (keys are the field names of
``SyncLimits`` and ``ConnectionLimits``) and can be set by an environment variable ``OFFLINE_<FIELD>`` (upper
case, e.g. ``OFFLINE_MAX_CONNECTIONS=2000``); an explicit option wins over the environment.

What each limit does when it is hit (codes are the protocol's, see ``offline.sync.protocol``):

- ``max_message_bytes``: a larger frame gets ``error MESSAGE_TOO_LARGE``; one beyond the transport limit
  (that size + 1 KiB) is closed with 1009 (message too big).
- ``max_batch_operations``: ``error BATCH_TOO_LARGE``. ``max_operation_bytes``: that operation gets
  ``operation-rejected OPERATION_TOO_LARGE``, the rest of its batch proceeds.
- ``operations_per_second`` / ``operations_burst``: a token bucket per session. A faster writer is slowed,
  never dropped: the server waits before it judges the next batch, which delays its acknowledgement (the
  client's send window then holds it back) and stops reading the socket meanwhile (TCP does the rest).
- ``max_connections``: a sync connection beyond it gets ``error OVERLOADED`` (retriable) and close 1013.
- ``max_unacked_batches``: a session that leaves more relay batches than this unacknowledged gets
  ``error RESYNC_REQUIRED`` (retriable) and close 1013: it reconnects and resumes from its watermark.
- ``send_stall_timeout``: a session whose socket accepted nothing for this long (the peer stopped reading and
  every buffer is full) is cut off at the TCP level; nothing it could read would get through anyway.
- ``ping_interval`` / ``ping_timeout``: WebSocket pings; a peer that does not answer is disconnected and its
  session freed.
- ``relay_frame_bytes``: the largest frame the relay sends a client (about; one larger operation goes alone).
  A catch-up batch of ``batch_size`` operations larger than this goes in several frames. At most the
  clients' own frame limit (``protocol.MAX_MESSAGE_BYTES``, 4 MiB): a larger value is refused.
- ``shutdown_grace``: on shutdown, how long sessions get to finish the batch in hand before being cut off.
- ``handshake_timeout``: a sync connection that sends no handshake within it (5 s) gets ``error
  PROTOCOL_VIOLATION`` and is closed.
- ``max_pending_per_address``: sync connections from one client address (see ``server_runtime.client_address``)
  that have not sent their handshake yet (64); one more gets ``error OVERLOADED`` (retriable) and close 1013,
  so one address cannot take every connection slot, nor more than a quarter of
  ``max_unauthenticated_connections`` (keep that ratio when changing either). ``silent_grace``: at either
  limit, a connection that has sent nothing for this long (1 s) is closed (``PROTOCOL_VIOLATION``) to make
  room instead.
- ``max_handshake_bytes``: until its handshake is accepted, a connection's frames may be at most this large
  (256 KiB); a larger one is refused by the WebSocket layer as it arrives (close 1009), so an unauthenticated
  peer cannot make the server buffer ``max_message_bytes``.
- ``max_unauthenticated_connections``: sync connections, from all addresses together, whose handshake has not
  been accepted yet (256: with ``max_handshake_bytes`` at most 64 MiB of frames buffered before sign-in); one
  more gets ``error OVERLOADED`` (retriable) and close 1013, unless a connection silent for ``silent_grace``
  gives way, or failing that one of the network holding the most silent connections (an IPv4 /24, an IPv6
  /48; see ``ConnectionGuard._evict_crowded``) when that is more than the newcomer's network would hold. The
  per-address limit alone would let many addresses together buffer gigabytes.
- ``max_pending_requests``: TCP connections, from all addresses together, that have not sent a complete
  request head yet (1024; one address may hold ``max_pending_per_address`` of them). One more is dropped,
  unless the oldest has waited ``silent_grace`` (it is dropped instead) or the network holding the most of
  them holds more than the newcomer's would (its oldest is dropped instead).
- ``max_body_bytes`` / ``max_backup_body_bytes``: the largest HTTP request body (every route / the backup
  import); a larger one gets HTTP 413 ``BODY_TOO_LARGE`` and nothing past the cap is read (see
  ``server_runtime.request_limits``).
- ``snapshot_builds``: fresh devices' first syncs built as database files (``POST <sync path>/snapshot``,
  ``server_runtime.snapshot``) at once (1); one more is answered 503 and that device syncs by socket. 0 turns
  snapshots off. ``snapshot_max_bytes``: the largest replica built (in memory, 96 MiB); a scope holding more
  is answered 204 and its devices sync by socket. ``snapshot_prepare_every``: a server without sign-in builds
  its open scope's snapshot as it starts and again once the log has moved and stayed still, at most once per
  this many seconds (30) and at most a tenth of the time; 0 builds only on request. ``snapshot_per_address``:
  snapshot requests one client address may have in progress, from its first byte to the file's last (2);
  one more is answered 429 ``RATE_LIMITED`` and that device syncs by socket.

``allowed_origins`` (option ``sync_options={"allowed_origins": [...]}`` or ``OFFLINE_ALLOWED_ORIGINS``, a
comma list) restricts which web pages may open the sync WebSocket (and ask for a snapshot): a request whose
``Origin`` header is not listed is refused with HTTP 403 before the upgrade. A request without ``Origin`` comes from a non-browser
client (browsers always send it) and is allowed; ``*`` allows every origin.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from offline.core.errors import OfflineError
from offline.sync.protocol import MAX_MESSAGE_BYTES

from .sync import SyncLimits

CONFIG_ERROR = "SERVER_CONFIG"
ORIGINS_ENV = "OFFLINE_ALLOWED_ORIGINS"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 5000
    operations_per_second: float = 10_000.0
    operations_burst: int = 50_000
    max_unacked_batches: int = 1000
    send_stall_timeout: float = 30.0
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    shutdown_grace: float = 5.0  # inside the usual stop timeouts (Docker 10 s, Fly.io 5 s) before SIGKILL
    # Sync connections of one client address that have not sent their handshake yet: a quarter of
    # max_unauthenticated_connections, so one address's young silent sockets (too young to give way) leave
    # the others room. Only silence counts, and clients speak as soon as they connect, so 64 still lets a
    # whole office behind one address connect at once.
    max_pending_per_address: int = 64
    # A connection that has sent nothing for this long gives way to a new one when its address (or the
    # process) is at its limit. Clients send their handshake as soon as the upgrade completes, so a burst of
    # real clients is not evicted, while sockets held open to take slots are.
    silent_grace: float = 1.0
    # The largest frame before the handshake is accepted (a handshake with a version vector of some 5,000
    # nodes); the session's frames may then be max_message_bytes.
    max_handshake_bytes: int = 256 * 1024
    # Sync connections of all addresses together whose handshake has not been accepted yet: each may buffer
    # max_handshake_bytes, so this bounds what unauthenticated peers can make the process hold (64 MiB).
    max_unauthenticated_connections: int = 256
    # TCP connections of all addresses together that have not sent a complete request head (each holds a
    # file descriptor until its deadline): many addresses at their per-address allowance would otherwise
    # exhaust the process's descriptors. At the bound the most crowded network gives way to another's.
    max_pending_requests: int = 1024
    max_body_bytes: int = 64 * 1024
    max_backup_body_bytes: int = 512 * 1024 * 1024


_OPTIONAL = frozenset({"ping_interval", "ping_timeout"})  # 0 or None turns pings off
_ZERO_TURNS_OFF = frozenset({"snapshot_builds", "snapshot_prepare_every"})  # 0: the feature is off


def env_name(field: str) -> str:
    return "OFFLINE_" + field.upper()


def _parse(field: str, value: Any, kind: Any, source: str) -> Any:
    """``value`` as the field's type (int or float), positive; a clear error naming the field otherwise."""
    if field in _OPTIONAL and (value is None or value == "" or value == 0 or value == "0"):
        return None
    want_int = kind in (int, "int")
    number: float | None
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
        if want_int:
            number = (
                int(value) if not isinstance(value, float) else (int(value) if value.is_integer() else None)
            )
    except (TypeError, ValueError, OverflowError):
        number = None
    zero_ok = field in _ZERO_TURNS_OFF
    if number is None or not math.isfinite(number) or number < 0 or (number == 0 and not zero_ok):
        expected = "a positive whole number" if want_int else "a positive number"
        if zero_ok:
            expected = f"a {'whole ' if want_int else ''}number, 0 or more (0: off)"
        raise OfflineError(
            f"limit {field} must be {expected}, got {value!r} (from {source}); fix or remove it",
            CONFIG_ERROR,
            {"field": field},
        )
    return number


def resolve_limits(
    given: SyncLimits | ConnectionLimits | Mapping[str, Any] | None,
    env: Mapping[str, str] | None = None,
) -> tuple[SyncLimits, ConnectionLimits]:
    """Both limit sets from ``given`` (a dict of field names, or one of the dataclasses) over the environment
    over the defaults. Unknown names and bad values raise ``OfflineError`` (code ``SERVER_CONFIG``)."""
    env = os.environ if env is None else env
    sync_fields = {f.name: f.type for f in dataclasses.fields(SyncLimits)}
    conn_fields = {f.name: f.type for f in dataclasses.fields(ConnectionLimits)}
    explicit: dict[str, Any] = {}
    base_sync: SyncLimits | None = None
    base_conn: ConnectionLimits | None = None
    if isinstance(given, SyncLimits):
        base_sync = given
    elif isinstance(given, ConnectionLimits):
        base_conn = given
    elif given is not None:
        unknown = sorted(set(given) - set(sync_fields) - set(conn_fields))
        if unknown:
            raise OfflineError(
                f"unknown limit(s) {', '.join(unknown)} in sync_options['limits']; known limits: "
                f"{', '.join(sorted({*sync_fields, *conn_fields}))}",
                CONFIG_ERROR,
                {"field": unknown[0]},
            )
        explicit = {k: _parse(k, v, (sync_fields | conn_fields)[k], "sync_options") for k, v in given.items()}

    def pick(fields: Mapping[str, Any], skip: bool) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, kind in fields.items():
            if name in explicit:
                values[name] = explicit[name]
            elif not skip and env.get(env_name(name), "").strip():
                values[name] = _parse(name, env[env_name(name)].strip(), kind, env_name(name))
        return values

    sync = base_sync or SyncLimits(**pick(sync_fields, False))
    conn = base_conn or ConnectionLimits(**pick(conn_fields, False))
    _check_consistent(sync, conn)
    return sync, conn


def _check_consistent(sync: SyncLimits, conn: ConnectionLimits) -> None:
    if sync.relay_frame_bytes > MAX_MESSAGE_BYTES:
        raise OfflineError(
            f"relay_frame_bytes={sync.relay_frame_bytes} exceeds the {MAX_MESSAGE_BYTES} bytes clients accept "
            "in one frame: a client catching up on a larger batch would refuse it on every reconnect; lower it",
            CONFIG_ERROR,
            {"field": "relay_frame_bytes"},
        )
    # While the server waits out a writer's rate, it reads nothing from that socket, pongs included.
    longest_wait = sync.max_batch_operations / conn.operations_per_second
    if conn.ping_timeout is not None and longest_wait >= conn.ping_timeout:
        raise OfflineError(
            f"operations_per_second={conn.operations_per_second:g} is too low for "
            f"max_batch_operations={sync.max_batch_operations}: one full batch would be held "
            f"{longest_wait:.1f} s, past ping_timeout={conn.ping_timeout:g} s; raise the rate or lower the batch",
            CONFIG_ERROR,
            {"field": "operations_per_second"},
        )
    if conn.operations_burst < sync.max_batch_operations:
        raise OfflineError(
            f"operations_burst={conn.operations_burst} must be at least max_batch_operations="
            f"{sync.max_batch_operations} (a full batch must fit in the bucket)",
            CONFIG_ERROR,
            {"field": "operations_burst"},
        )


def normalize_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


class OriginPolicy:
    """Which ``Origin`` headers may open the sync WebSocket (None: all)."""

    __slots__ = ("allowed", "any")

    def __init__(self, origins: Iterable[str] | None) -> None:
        cleaned = None if origins is None else {normalize_origin(o) for o in origins if o.strip()}
        self.any = cleaned is None or "*" in cleaned
        self.allowed = frozenset(cleaned or ())

    def permits(self, origin: str | None) -> bool:
        # Browsers always send Origin on a WebSocket upgrade; other clients (apps, servers) need not.
        if self.any or origin is None:
            return True
        return normalize_origin(origin) in self.allowed

    @classmethod
    def resolve(cls, given: Any, env: Mapping[str, str] | None = None) -> OriginPolicy:
        """From ``sync_options['allowed_origins']`` (a list, or a comma string), else the environment."""
        env = os.environ if env is None else env
        if given is None:
            text = env.get(ORIGINS_ENV, "").strip()
            return cls([part for part in text.split(",")] if text else None)
        if isinstance(given, str):
            given = given.split(",")
        if not isinstance(given, Iterable) or not all(isinstance(o, str) for o in given):
            raise OfflineError(
                "sync_options['allowed_origins'] must be a list of origins like 'https://app.example.com'",
                CONFIG_ERROR,
                {"field": "allowed_origins"},
            )
        return cls(list(given))
