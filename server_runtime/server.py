"""`create_production_server`: the Starlette application and the uvicorn server that runs it.

`server.app` is the ASGI app (for embedding); `await server.start()` runs it in this event loop and returns
the public URL; `await server.stop()` stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from .endpoint import sync_endpoint
from .stores.base import ServerStore
from .sync import SyncLimits, SyncService

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
    ) -> None:
        self.store = store
        self.port = port
        self.host = host
        self.static_dir = static_dir
        self.sync_path = sync_path if sync_path.startswith("/") else "/" + sync_path
        self.operational_auth = dict(operational_auth or {})
        options = dict(sync_options or {})
        limits = options.pop("limits", None)
        self.sync = SyncService(
            store,
            auth=options.get("auth"),
            limits=limits if isinstance(limits, SyncLimits) else SyncLimits(**(limits or {})),
        )
        self.started_at = time.time()
        self.version = VERSION
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self.url: str | None = None
        self.app = self._build_app()

    def _build_app(self) -> Starlette:
        from . import dashboard
        from .operational import Operational
        from .static import spa_static

        ops = self.operational = Operational(self)

        async def health(request: Request) -> JSONResponse:
            return JSONResponse(
                {"status": "ok", "version": VERSION, "uptime": round(time.time() - self.started_at, 3)}
            )

        async def sync(websocket: WebSocket) -> None:
            await sync_endpoint(websocket, self.sync)

        def bind(handler: Any) -> Any:
            async def endpoint(request: Request) -> Any:
                return await handler(request, ops)

            return endpoint

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> Any:
            await self.sync.start()
            ops.install()
            try:
                yield
            finally:
                ops.uninstall()
                await self.sync.stop()

        routes: list[Any] = [
            Route("/health", health),
            WebSocketRoute(self.sync_path, sync),
            Route("/__offline/status", ops.status_endpoint),
            Route("/__offline/metrics", ops.metrics_endpoint),
            Route("/__offline/events", ops.events_endpoint),
            Route("/__offline/backup/export", ops.backup_export, methods=["POST"]),
            Route("/__offline/backup/import", ops.backup_import, methods=["POST"]),
            Route("/__offline/login", bind(dashboard.login_page), methods=["GET"]),
            Route("/__offline/login", bind(dashboard.login_submit), methods=["POST"]),
            Route("/__offline/logout", bind(dashboard.logout), methods=["POST", "GET"]),
            Route("/__offline", bind(dashboard.dashboard)),
            Route("/__offline/", bind(dashboard.dashboard)),
        ]
        if self.static_dir:
            routes.append(spa_static(self.static_dir))
        return Starlette(routes=routes, lifespan=lifespan)

    async def start(self) -> str:
        """Serve in the running event loop; returns the URL (``http://host:port``) once listening."""
        import uvicorn

        # Listen first: a busy port fails here, before anything (the log handler, the sync service) started.
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
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
        self.operational.install()
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="off",  # started above, so start() fails loudly instead of inside uvicorn
            ws_max_size=self.sync.limits.max_message_bytes + 1024,
            ws_ping_interval=20.0,
            ws_ping_timeout=20.0,
            # Batches of JSON compress well but deflate costs more CPU per operation than it saves on
            # loopback and LAN links; the relay's throughput matters more here.
            ws_per_message_deflate=False,
            timeout_graceful_shutdown=5,
        )
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="offline-server")
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        self.url = f"http://{shown}:{self.port}"
        return self.url

    async def stop(self) -> None:
        self.operational.uninstall()
        await self.sync.stop()
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
) -> ProductionServer:
    return ProductionServer(
        store=store,
        port=port,
        host=host,
        static_dir=static_dir,
        sync_path=sync_path,
        operational_auth=operational_auth,
        sync_options=sync_options,
    )
