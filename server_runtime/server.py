"""`create_production_server`: the Starlette application and the uvicorn server that runs it.

`server.app` is the ASGI app (for embedding); `await server.start()` runs it in this event loop and returns
the public URL; `await server.stop()` stops it gracefully: it stops listening, lets every sync session finish
the batch in hand (stored and acknowledged) and closes it with a retriable SERVER_SHUTDOWN (close 1012), so a
rolling deploy loses nothing. Limits, heartbeats and the Origin allow-list: see ``server_runtime.limits``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope
from starlette.types import Send as ASGISend
from starlette.websockets import WebSocket

from .client_address import ProxyPolicy
from .connection_gate import ConnectionGate, GateCollector
from .connections import ConnectionGuard, GuardCollector
from .endpoint import ABORT_KEY, sync_endpoint
from .limits import OriginPolicy, resolve_limits
from .log_budget import install_transport_warning_budget
from .redaction import SecretRedactor, install, secrets_from_environment
from .request_limits import RequestLimits, TransportInScope
from .stores.base import ServerStore
from .sync import SyncService

if TYPE_CHECKING:
    from .auth import AuthRoutes

log = logging.getLogger("offline.server")

VERSION = "0.1.0"


class ProductionServer:
    def __init__(
        self,
        *,
        store: ServerStore,
        port: int = 3001,
        host: str = "0.0.0.0",
        static_dir: str | None = None,
        sync_path: str = "/offline-sync",
        operational_auth: Mapping[str, Any] | None = None,
        sync_options: Mapping[str, Any] | None = None,
        auth_routes: AuthRoutes | None = None,
        trusted_proxies: str | Iterable[str] | None = None,
        client_ip_header: str | None = None,
    ) -> None:
        self.store = store
        self.port = port
        self.host = host
        self.static_dir = static_dir
        self.sync_path = sync_path if sync_path.startswith("/") else "/" + sync_path
        self.operational_auth = dict(operational_auth or {})
        options = dict(sync_options or {})
        sync_limits, self.limits = resolve_limits(options.pop("limits", None))
        self.origins = OriginPolicy.resolve(options.pop("allowed_origins", None))
        # Whose forwarding headers count (none unless configured): see server_runtime.client_address.
        self.proxies = ProxyPolicy.resolve(trusted_proxies, client_ip_header)
        self.guard = ConnectionGuard(self.limits)
        # TCP connections that never finish their request head: bounded per address and in time.
        self.gate = ConnectionGate(
            self.proxies,
            self.limits.max_pending_per_address,
            sync_limits.handshake_timeout,
            self.limits.silent_grace,
            self.limits.max_pending_requests,
        )
        self.sync = SyncService(
            store, auth=options.get("auth"), limits=sync_limits, rules=options.get("rules")
        )
        # Auth data lives in this server's store; a provider from `to_sync_auth_provider()` needs it too.
        self.auth_routes = auth_routes
        for holder in (auth_routes, self.sync.auth):
            bind = getattr(holder, "bind_server_store", None)
            if callable(bind):
                bind(store)
        self.started_at = time.time()
        self.version = VERSION
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self.url: str | None = None
        self.app = self._build_app()

    def _build_app(self) -> Starlette:
        from . import dashboard
        from .operational import Operational
        from .operational_routes import OperationalFallback
        from .static import spa_static

        ops = self.operational = Operational(self)
        ops.registry.register(GuardCollector(self.guard))  # type: ignore[arg-type]
        ops.registry.register(GateCollector(self.gate))  # type: ignore[arg-type]
        # Log lines reach stdout and the live event stream: neither may carry a configured secret.
        self.redactor = SecretRedactor(
            [*secrets_from_environment(os.environ), *(str(v) for v in self.operational_auth.values() if v)]
        )
        install(self.redactor, [ops.log_handler])

        async def health(request: Request) -> JSONResponse:
            return JSONResponse(
                {"status": "ok", "version": VERSION, "uptime": round(time.time() - self.started_at, 3)}
            )

        from .snapshot import Snapshots

        snapshots = self.snapshots = Snapshots(self.sync, self.origins)

        async def sync(websocket: WebSocket) -> None:
            await sync_endpoint(websocket, self.sync, self.guard, self.origins)

        def bind(handler: Any) -> Any:
            async def endpoint(request: Request) -> Any:
                return await handler(request, ops)

            return endpoint

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> Any:
            await self.sync.start()
            self._warn_open_sync()
            ops.install()
            snapshots.start()
            try:
                yield
            finally:
                await snapshots.stop()
                await self.guard.drain()
                ops.uninstall()
                await self.sync.stop()

        routes: list[Any] = [
            Route("/health", health),
            WebSocketRoute(self.sync_path, sync),
            Route(self.sync_path.rstrip("/") + "/snapshot", snapshots.endpoint, methods=["POST"]),
            Route("/__offline/status", ops.status_endpoint),
            Route("/__offline/metrics", ops.metrics_endpoint),
            Route("/__offline/events", ops.events_endpoint),
            Route("/__offline/backup/export", ops.backup_export, methods=["POST"]),
            Route("/__offline/backup/import", ops.backup_import, methods=["POST"]),
            Route("/__offline/compact", ops.compact_endpoint, methods=["POST"]),
            Route("/__offline/login", bind(dashboard.login_page), methods=["GET"]),
            Route("/__offline/login", bind(dashboard.login_submit), methods=["POST"]),
            Route("/__offline/logout", bind(dashboard.logout), methods=["POST"]),
            Route("/__offline", bind(dashboard.dashboard)),
            Route("/__offline/", bind(dashboard.dashboard)),
        ]
        if self.auth_routes is not None:
            from .user_admin import UserAdmin

            routes.extend(UserAdmin(ops, self.auth_routes).routes())
            routes.append(Mount("/auth", routes=self.auth_routes.routes))
        # Wrong methods and unknown paths under /__offline are answered here, never by the page below.
        routes.append(OperationalFallback(routes))
        if self.static_dir:  # last: its SPA fallback answers every path not matched above
            routes.append(spa_static(self.static_dir))
        limits = Middleware(
            RequestLimits,
            policy=self.proxies,
            max_body=self.limits.max_body_bytes,
            max_backup_body=self.limits.max_backup_body_bytes,
        )
        return Starlette(routes=routes, lifespan=lifespan, middleware=[limits, Middleware(_Hardening)])

    async def start(self) -> str:
        """Serve in the running event loop; returns the URL (``http://host:port``) once listening."""
        import uvicorn

        # Listen first: a busy port fails here, before anything (the log handler, the sync service) started.
        # proto=IPPROTO_TCP: accepted sockets inherit it, and asyncio turns Nagle off (TCP_NODELAY) only on
        # sockets that say so; otherwise the second of two small frames (a rejection, then the acknowledgement)
        # waits for the peer's delayed ACK, some 40 ms.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from exc
        self.port = sock.getsockname()[1]
        try:
            await self.sync.start()
        except BaseException:
            sock.close()
            raise
        self._warn_open_sync()  # before the dashboard log handler: its live history starts empty
        install_transport_warning_budget()  # asyncio's warning per write to a reset peer, bounded
        self.operational.install()
        self.snapshots.start()
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        from .keepalive import PatientWebSocketProtocol

        config = uvicorn.Config(
            TransportInScope(self.app, self.gate),
            http=self.gate.protocol(AutoHTTPProtocol),
            log_level="warning",
            lifespan="off",  # started above, so start() fails loudly instead of inside uvicorn
            ws=PatientWebSocketProtocol,
            ws_max_size=self.sync.limits.max_message_bytes + 1024,
            # Pings find peers that vanished without closing; a peer silent until a pong's deadline is cut off.
            ws_ping_interval=self.limits.ping_interval,
            ws_ping_timeout=self.limits.ping_timeout,
            # Batches of JSON compress well but deflate costs more CPU per operation than it saves on
            # loopback and LAN links; the relay's throughput matters more here.
            ws_per_message_deflate=False,
            timeout_graceful_shutdown=5,
            # Forwarding headers count only from OFFLINE_TRUSTED_PROXIES (uvicorn's own default trusts loopback).
            proxy_headers=False,
        )
        # uvicorn configured its loggers just now (uvicorn.Config does it): redact their output too.
        install(self.redactor, _uvicorn_handlers())
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="offline-server")
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        self.url = f"http://{shown}:{self.port}"
        return self.url

    def _warn_open_sync(self) -> None:
        if self.sync.auth is None:
            log.warning(
                "no sync auth provider is configured: accepting all sync connections "
                "(pass sync_options={'auth': auth_routes.to_sync_auth_provider()} to require sign-in)"
            )

    async def stop(self) -> None:
        """Stop listening, drain the sync sessions (see the module docstring), then stop everything else."""
        for listener in getattr(self._server, "servers", None) or []:
            listener.close()  # new connections are refused from here; open ones carry on
        await self.snapshots.stop()
        await self.guard.drain()
        self.operational.uninstall()
        await self.sync.stop()
        if self.auth_routes is not None:
            self.auth_routes.close()
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        self._task = None

    async def serve_forever(self) -> None:
        await self.start()
        assert self._task is not None
        await self._task


_OPERATIONAL_PREFIXES = ("/__offline", "/auth")
# For every operational and auth response that does not set its own (the dashboard's pages set a full CSP).
_BASELINE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
}


class _Hardening:
    """ASGI middleware: baseline security headers on operational responses, and for WebSockets a way to drop
    the TCP connection (uvicorn's protocol object owns the transport; see ConnectionGuard)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: ASGISend) -> None:
        if scope["type"] == "websocket":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            abort = getattr(transport, "abort", None)
            if callable(abort):
                scope[ABORT_KEY] = abort
        elif scope["type"] == "http" and str(scope.get("path", "")).startswith(_OPERATIONAL_PREFIXES):

            async def send_hardened(message: Message) -> None:
                if message["type"] == "http.response.start":
                    headers = MutableHeaders(scope=message)
                    for name, value in _BASELINE_HEADERS.items():
                        if name not in headers:
                            headers[name] = value
                await send(message)

            await self.app(scope, receive, send_hardened)
            return
        await self.app(scope, receive, send)


def _uvicorn_handlers() -> list[logging.Handler]:
    return [
        h for name in ("uvicorn", "uvicorn.error", "uvicorn.access") for h in logging.getLogger(name).handlers
    ]


def _embedded_server_class() -> Any:
    import uvicorn

    class EmbeddedServer(uvicorn.Server):
        """uvicorn without its signal handlers: the embedding program (or our __main__) owns the signals."""

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    return EmbeddedServer


def _EmbeddedServer(config: Any) -> Any:
    return _embedded_server_class()(config)


def create_production_server(
    *,
    store: ServerStore,
    port: int = 3001,
    host: str = "0.0.0.0",
    static_dir: str | None = None,
    sync_path: str = "/offline-sync",
    operational_auth: Mapping[str, Any] | None = None,
    sync_options: Mapping[str, Any] | None = None,
    auth_routes: AuthRoutes | None = None,
    trusted_proxies: str | Iterable[str] | None = None,
    client_ip_header: str | None = None,
) -> ProductionServer:
    return ProductionServer(
        store=store,
        port=port,
        host=host,
        static_dir=static_dir,
        sync_path=sync_path,
        operational_auth=operational_auth,
        sync_options=sync_options,
        auth_routes=auth_routes,
        trusted_proxies=trusted_proxies,
        client_ip_header=client_ip_header,
    )
