"""Operational endpoints (DESIGN.md section 5): status, Prometheus metrics, live events, backup.

The live event stream carries ``status``, ``connection``, ``operation``, ``conflict``, ``rejected``, ``log``
and, with auth routes, ``audit`` events (``server_runtime.auth.audit``: security events of this process).
User administration (``/__offline/users``, ``/__offline/audit``) is in ``user_admin``.

Token rules: `/__offline/status`, `/__offline/events` and the dashboard take the admin token; metrics take
the metrics token (the admin token only when no metrics token is set); backup takes the backup token (the
admin token only when no backup token is set). A token that is not configured leaves its endpoint open,
which the server logs at start. Tokens travel as `Authorization: Bearer`; the dashboard's browser session
uses an HttpOnly cookie holding a random session id the server keeps (`dashboard_sessions`), never the token.

Wrong tokens (Bearer on any of these endpoints, or the dashboard's sign-in form) are counted per client
address: after `TOKEN_ATTEMPTS` of them within `TOKEN_WINDOW` seconds, that address gets 429 with
Retry-After for every token it sends until the oldest failure leaves the window; other addresses are not
affected. A request without any token is not a guess and is not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from offline.core.errors import OfflineError

from .auth.rate_limit import SlidingWindow, retry_after_header
from .backup import BackupKey, BackupRefused, export_backup, import_backup, read_backup
from .client_address import client_address
from .dashboard_sessions import DEFAULT_TTL, DashboardSessions

if TYPE_CHECKING:
    from .server import ProductionServer

log = logging.getLogger("offline.server")

COOKIE = "offline_dashboard"
#: Wrong tokens a client address may send within TOKEN_WINDOW seconds before it gets 429.
TOKEN_ATTEMPTS = 5
TOKEN_WINDOW = 300.0
CLOSE = "__close__"
SESSION_ENDED = "__session_ended__"  # a dashboard session ended: streams it opened must check theirs
STATUS_INTERVAL = 5.0


def _token_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


def _session_ttl(env: Mapping[str, str]) -> float:
    text = env.get("OFFLINE_DASHBOARD_SESSION_SECONDS", "").strip()
    if not text:
        return DEFAULT_TTL
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise OfflineError(
            f"OFFLINE_DASHBOARD_SESSION_SECONDS must be a positive number of seconds, got {text!r}",
            "SERVER_CONFIG",
            {"field": "OFFLINE_DASHBOARD_SESSION_SECONDS"},
        )
    return seconds


class OperationalAuth:
    def __init__(self, config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> None:
        def pick(camel: str, snake: str) -> str | None:
            value = config.get(camel, config.get(snake))
            return str(value) if value else None

        self.admin = pick("adminToken", "admin_token")
        self.metrics = pick("metricsToken", "metrics_token")
        self.backup = pick("backupToken", "backup_token")
        self.backup_key = BackupKey.choose(
            backup_token=self.backup, auth_secret=pick("authSecret", "auth_secret"), admin_token=self.admin
        )
        self.sessions = DashboardSessions(_session_ttl(os.environ if env is None else env))
        self.attempts = SlidingWindow(TOKEN_ATTEMPTS, TOKEN_WINDOW, max_keys=50_000)

    def warn_open(self) -> None:
        if not self.admin:
            log.warning(
                "OFFLINE_ADMIN_TOKEN is not set: /__offline/status, events and the dashboard are open"
            )
        if not self.metrics and not self.admin:
            log.warning("no metrics or admin token is set: /__offline/metrics is open")
        if not self.backup and not self.admin:
            log.warning("no backup or admin token is set: /__offline/backup is open")

    def expected(self, kind: str) -> str | None:
        if kind == "metrics":
            return self.metrics or self.admin
        if kind == "backup":
            return self.backup or self.admin
        return self.admin

    def allowed(self, request: Request, kind: str, *, cookie_ok: bool = False) -> bool:
        """Whether the request carries the right credentials (no rate limit: see `check`)."""
        expected = self.expected(kind)
        if expected is None:
            return True
        token = _token_of(request)
        if token is not None and _same(token, expected):
            return True
        return cookie_ok and self.sessions.valid(request.cookies.get(COOKIE))

    def locked(self, request: Request) -> float | None:
        """Seconds until this client address may send a token again (None: it may now)."""
        return self.attempts.retry_after(client_address(request))

    def failed(self, request: Request) -> None:
        self.attempts.hit(client_address(request))

    def check(self, request: Request, kind: str, *, cookie_ok: bool = False) -> Response | None:
        """None when the request may proceed, else the 401 or 429 response to send."""
        if self.expected(kind) is None:
            return None
        token = _token_of(request)
        if token is None:
            return None if self.allowed(request, kind, cookie_ok=cookie_ok) else unauthorized(kind)
        # A locked address is refused before its token is compared: even the right one would tell a
        # guesser that it guessed right.
        wait = self.locked(request)
        if wait is not None:
            return too_many_attempts(wait)
        if self.allowed(request, kind):
            return None
        self.failed(request)
        return unauthorized(kind)


def unauthorized(kind: str) -> Response:
    return JSONResponse(
        {"error": "unauthorized", "message": f"send the {kind} token as 'Authorization: Bearer <token>'"},
        status_code=401,
        headers={"WWW-Authenticate": 'Bearer realm="offline"'},
    )


def too_many_attempts(wait: float) -> Response:
    seconds = retry_after_header(wait)
    return JSONResponse(
        {
            "error": "RATE_LIMITED",
            "message": f"too many wrong tokens from this address; try again in {seconds} s",
        },
        status_code=429,
        headers={"Retry-After": seconds},
    )


class EventHub:
    """Fan-out of live events to SSE subscribers; a slow subscriber loses events, never slows the server."""

    def __init__(self, size: int = 1000) -> None:
        self.size = size
        self.subscribers: set[asyncio.Queue[tuple[str, dict[str, Any]]]] = set()
        self.recent: dict[str, deque[dict[str, Any]]] = {
            "conflict": deque(maxlen=50),
            "rejected": deque(maxlen=50),
            "connection": deque(maxlen=50),
            "log": deque(maxlen=200),
            "audit": deque(maxlen=50),
        }
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's loop, which owns the queues

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        data = {**data, "time": time.time()}
        loop = self.loop
        if loop is not None and not _running_on(loop):
            # A log record from another thread: asyncio queues are not thread-safe, so the server's loop
            # delivers it (calling put_nowait from here loses the event or corrupts the loop's queue).
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
                loop.call_soon_threadsafe(self._deliver, kind, data)
            return
        self._deliver(kind, data)

    def _deliver(self, kind: str, data: dict[str, Any]) -> None:
        if kind in self.recent:
            self.recent[kind].append(data)
        for queue in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait((kind, data))

    def subscribe(self) -> asyncio.Queue[tuple[str, dict[str, Any]]]:
        self.loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(maxsize=self.size)
        self.subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        self.subscribers.discard(queue)

    def nudge(self, kind: str) -> None:
        """Hand every live stream a control marker (not an event: streams act on it, never send it)."""
        for queue in list(self.subscribers):
            if queue.full():  # a stalled subscriber must still see it
                queue.get_nowait()
            queue.put_nowait((kind, {}))

    def close(self) -> None:
        """End every live stream (server shutdown): they must not hold the server open."""
        for queue in list(self.subscribers):
            if queue.full():  # a stalled subscriber must still see the end, or shutdown waits on it
                queue.get_nowait()
            queue.put_nowait((CLOSE, {}))


def _running_on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class HubLogHandler(logging.Handler):
    """Structured log records of the `offline` loggers, as `log` events on the live stream."""

    def __init__(self, hub: EventHub, secrets: list[str]) -> None:
        super().__init__(level=logging.INFO)
        self.hub = hub
        self.secrets = [s for s in secrets if s]

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            for secret in self.secrets:  # a configured secret never leaves the process in a log event
                message = message.replace(secret, "[redacted]")
            self.hub.publish(
                "log", {"level": record.levelname.lower(), "logger": record.name, "message": message}
            )
        except Exception:
            self.handleError(record)


class _SyncCollector:
    """Reads the sync service's counters at scrape time (no double bookkeeping)."""

    def __init__(self, server: ProductionServer) -> None:
        self.server = server

    def collect(self) -> Any:
        sync = self.server.sync
        counters = sync.counters
        yield GaugeMetricFamily("offline_connections", "Connected sync sessions", value=len(sync.sessions))
        received = CounterMetricFamily("offline_operations_received", "Operations received from clients")
        received.add_metric([], counters["received"])
        yield received
        accepted = CounterMetricFamily("offline_operations_accepted", "Operations accepted and stored")
        accepted.add_metric([], counters["accepted"])
        yield accepted
        duplicates = CounterMetricFamily(
            "offline_operations_duplicate", "Operations received again and ignored"
        )
        duplicates.add_metric([], counters["duplicates"])
        yield duplicates
        sent = CounterMetricFamily("offline_operations_sent", "Operations sent to clients")
        sent.add_metric([], counters["sent"])
        yield sent
        server_ops = CounterMetricFamily("offline_server_operations", "Operations the server wrote itself")
        server_ops.add_metric([], counters["server_ops"])
        yield server_ops
        rejected = CounterMetricFamily(
            "offline_operations_rejected", "Operations refused, by code", labels=["code"]
        )
        for code, count in sorted(sync.rejections.items()):
            rejected.add_metric([code], count)
        yield rejected
        conflicts = CounterMetricFamily(
            "offline_conflicts", "Conflicts resolved, by strategy", labels=["strategy"]
        )
        for strategy, count in sorted(sync.conflicts.items()):
            conflicts.add_metric([strategy], count)
        yield conflicts
        watermark = sync.watermark
        lag = max((watermark - s.cursor for s in sync.sessions), default=0)
        yield GaugeMetricFamily(
            "offline_sync_lag_operations", "Largest delivery backlog of a session", value=lag
        )
        yield GaugeMetricFamily(
            "offline_delivery_sequence", "Highest committed delivery sequence", value=watermark
        )
        yield GaugeMetricFamily(
            "offline_uptime_seconds",
            "Seconds since the server started",
            value=time.time() - self.server.started_at,
        )


class Operational:
    def __init__(self, server: ProductionServer) -> None:
        self.server = server
        self.auth = OperationalAuth(server.operational_auth)
        self.hub = EventHub()
        self._compacting = asyncio.Lock()  # one compaction at a time
        self.registry = CollectorRegistry(auto_describe=True)  # one per server: tests run several
        self.registry.register(_SyncCollector(server))  # type: ignore[arg-type]
        self.commit_seconds = Histogram(
            "offline_store_commit_seconds",
            "Time to judge and durably store one incoming batch",
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        secrets = [t for t in (self.auth.admin, self.auth.metrics, self.auth.backup) if t]
        self.log_handler = HubLogHandler(self.hub, secrets)
        server.sync.listeners.append(self._on_sync_event)
        # "operation" events only reach live event streams (they are not kept in `recent`).
        server.sync.wants_operation_events = lambda: bool(self.hub.subscribers)
        if server.auth_routes is not None:  # security events of the auth routes (server_runtime.auth.audit)
            server.auth_routes.audit.listeners.append(lambda entry: self.hub.publish("audit", entry))

    def install(self) -> None:
        logging.getLogger("offline").addHandler(self.log_handler)
        self.auth.warn_open()

    def uninstall(self) -> None:
        logging.getLogger("offline").removeHandler(self.log_handler)
        self.hub.close()

    def _on_sync_event(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "commit":
            self.commit_seconds.observe(float(payload.get("seconds", 0.0)))
            return
        self.hub.publish(kind, payload)

    # -- payloads -----------------------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        server = self.server
        sync = server.sync
        stats = await server.store.stats()
        return {
            "status": "ok",
            "version": server.version,
            "uptime": round(time.time() - server.started_at, 3),
            "store": server.store.kind,
            "schemaVersion": sync.schema.version,
            "serverNodeId": getattr(sync, "node_id", None),
            "deliverySequence": sync.watermark,
            "operations": {
                "stored": stats.get("operations", 0),
                "received": sync.counters["received"],
                "accepted": sync.counters["accepted"],
                "sent": sync.counters["sent"],
                "rejected": dict(sync.rejections),
            },
            "records": stats.get("records", {}),
            # Fresh devices' first syncs built as files (server_runtime.snapshot), sent (a file is sent
            # again while the log has not moved), and of those built, the ones built ahead of any request.
            "snapshots": {
                "built": sync.counters["snapshots_built"],
                "served": sync.counters["snapshots_served"],
                "prepared": sync.counters["snapshots_prepared"],
            },
            "conflicts": dict(sync.conflicts),
            "connectedClients": len(sync.sessions),
            "clients": [
                {
                    "nodeId": s.node_id,
                    "connectedAt": s.connected_at,
                    "cursor": s.cursor,
                    "received": s.received,
                    "rejected": s.rejected,
                    "scope": s.filters,
                }
                for s in sorted(sync.sessions, key=lambda s: s.connected_at)
            ],
        }

    # -- endpoints -------------------------------------------------------------------------------------------

    async def status_endpoint(self, request: Request) -> Response:
        refused = self.auth.check(request, "admin", cookie_ok=True)
        if refused is not None:
            return refused
        return JSONResponse(await self.status())

    async def metrics_endpoint(self, request: Request) -> Response:
        refused = self.auth.check(request, "metrics")
        if refused is not None:
            return refused
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def events_endpoint(self, request: Request) -> Response:
        refused = self.auth.check(request, "admin", cookie_ok=True)
        if refused is not None:
            return refused
        # A stream opened with the dashboard cookie lives only as long as its session: signing out (or the
        # session expiring) ends it, so a copied cookie cannot keep a stream open past sign-out.
        session = (
            request.cookies.get(COOKIE)
            if self.auth.expected("admin") is not None and not self.auth.allowed(request, "admin")
            else None
        )
        queue = self.hub.subscribe()

        async def stream() -> AsyncIterator[str]:
            try:
                yield _sse("status", await self.status())
                for kind in ("connection", "conflict", "rejected", "log", "audit"):
                    for item in list(self.hub.recent[kind])[-20:]:
                        yield _sse(kind, {**item, "replay": True})
                yield _sse("ready", {"replayed": True})  # history ends here; live events follow
                next_status = time.monotonic() + STATUS_INTERVAL
                while True:
                    if session is not None and not self.auth.sessions.valid(session):
                        return
                    timeout = max(0.0, next_status - time.monotonic())
                    try:
                        kind, data = await asyncio.wait_for(queue.get(), timeout)
                        if kind == CLOSE:
                            return
                        if kind == SESSION_ENDED:
                            continue
                        yield _sse(kind, data)
                    except TimeoutError:
                        yield _sse("status", await self.status())
                        next_status = time.monotonic() + STATUS_INTERVAL
            finally:
                self.hub.unsubscribe(queue)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def backup_export(self, request: Request) -> Response:
        refused = self.auth.check(request, "backup")
        if refused is not None:
            return refused
        return StreamingResponse(
            export_backup(self.server, self.auth.backup_key),
            media_type="application/x-ndjson",
            headers={"Content-Disposition": 'attachment; filename="offline-backup.ndjson"'},
        )

    async def compact_endpoint(self, request: Request) -> Response:
        """``POST /__offline/compact`` (admin token): `SyncService.compact`, one at a time."""
        refused = self.auth.check(request, "admin")
        if refused is not None:
            return refused
        if self._compacting.locked():
            return JSONResponse(
                {"error": "COMPACTION_RUNNING", "message": "a compaction is running; try again when it ends"},
                status_code=409,
            )
        async with self._compacting:
            result = await self.server.sync.compact()
        return JSONResponse(result)

    async def backup_import(self, request: Request) -> Response:
        """Import a backup whole or not at all (see `backup`); ``?legacy=1`` takes an unkeyed file."""
        refused = self.auth.check(request, "backup")
        if refused is not None:
            return refused
        legacy = request.query_params.get("legacy", "").lower() in ("1", "true", "yes")
        body = await request.body()
        try:
            backup = read_backup(
                body,
                self.auth.backup_key,
                legacy=legacy,
                max_operation_bytes=self.server.sync.limits.max_operation_bytes,
            )
            result = await import_backup(self.server, backup)
        except BackupRefused as exc:
            log.warning("backup import refused: %s %s", exc.code, exc.message)
            return JSONResponse(exc.body(), status_code=exc.status)
        if not backup.keyed:
            log.warning("imported an unkeyed backup (?legacy=1): %d operation(s)", result["imported"])
        return JSONResponse(result, status_code=200 if not result["refused"] else 207)


def _sse(kind: str, data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def plain(text: str, status: int = 200) -> PlainTextResponse:
    return PlainTextResponse(text, status_code=status)
