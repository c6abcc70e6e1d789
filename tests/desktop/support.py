"""Live sync servers and loopback HTTP servers for the desktop tests."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from offline import define_schema, t
from server_runtime import MemoryServerStore, ProductionServer, create_production_server

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {"todos": {"fields": {"title": t.string(), "done": t.boolean().default(False)}}},
    }
)
FAST = {"backoff_initial": 0.05, "backoff_max": 0.5, "ack_timeout": 2.0, "handshake_timeout": 10.0}


@contextlib.asynccontextmanager
async def sync_server() -> AsyncIterator[tuple[ProductionServer, str]]:
    """An in-memory offline server on a free loopback port, and its ws:// sync URL."""
    store = MemoryServerStore()
    await store.set_schema(SCHEMA)
    server = create_production_server(store=store, port=0, host="127.0.0.1")
    try:
        url = await server.start()
        yield server, url.replace("http://", "ws://", 1) + "/offline-sync"
    finally:
        await server.stop()
        with contextlib.suppress(Exception):
            await store.close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def static_server(folder: Path) -> Iterator[str]:
    """A plain HTTP file server for ``folder`` on a free loopback port (in a thread); yields its base URL."""

    def handler(*args: object, **kwargs: object) -> _Quiet:
        return _Quiet(*args, directory=str(folder), **kwargs)  # type: ignore[arg-type]

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
