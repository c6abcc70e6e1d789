"""`python -m server_runtime [server.py]`: run the server a project's entry file describes.

The entry defines `schema` and may define `server` (from `create_production_server`); without `server`, one is
built from the environment (see server_runtime.environment). `OFFLINE_LOG_LEVEL` (default INFO) sets the log
level. SIGTERM or SIGINT stops the server gracefully (see `ProductionServer.stop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from pathlib import Path

from offline.core.errors import OfflineError

from .environment import find_entry, load_entry, server_from_environment
from .redaction import SecretRedactor, install, secrets_from_environment


def _raise_open_file_limit() -> None:
    """Every connection is a file descriptor: take the hard limit (often 1024 soft vs much more hard)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        # Failing keeps the soft limit; max_connections should then stay below it.
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# (allocations before a young collection, young collections per middle one, middle ones per full one):
# young collections are then rarer, and full ones still run, their cost growing only with the live heap.
_GC_THRESHOLDS = (20_000, 10, 10)


def _tune_garbage_collector() -> None:
    """Collect less often than CPython's defaults, which suit short scripts: a busy server allocates
    hundreds of thousands of short-lived containers a second, and every collection that triggers walks the
    live ones again (a fifth to a quarter of the server's time under write load, measured). What is alive
    once the server has started (modules, the schema, the record cache) stays for the life of the process:
    frozen, no collection walks it. Only this process entry does it; an embedding program keeps its own
    settings."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLDS)


async def _main(argv: list[str]) -> int:
    level = getattr(logging, os.environ.get("OFFLINE_LOG_LEVEL", "INFO").strip().upper(), None)
    logging.basicConfig(
        level=level if isinstance(level, int) else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install(SecretRedactor(secrets_from_environment(os.environ)), logging.getLogger().handlers)
    _raise_open_file_limit()
    entry = Path(argv[0]) if argv else find_entry(Path.cwd())
    if entry is None or not entry.is_file():
        print("no server entry: pass a path, or create server.py (or src/server.py) here", file=sys.stderr)
        return 2
    module = load_entry(entry)
    server = getattr(module, "server", None)
    if server is None:
        schema = getattr(module, "schema", None)
        if schema is None:
            print(f"{entry} defines neither `server` nor `schema`", file=sys.stderr)
            return 2
        try:
            server = await server_from_environment(schema)
        except (
            OfflineError
        ) as exc:  # a bad setting (AUTH_SECRET, OFFLINE_JWT_ISSUERS, ...): its message says which
            print(f"offline server could not start: [{exc.code}] {exc.message}", file=sys.stderr, flush=True)
            return 2
    # Before the server starts: it answers /health while start() still awaits, and a SIGTERM sent as soon as
    # it answers (a supervisor, a test) must stop it gracefully, not kill it with the default action.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        url = await server.start()
    except OSError as exc:
        print(f"offline server could not start: {exc}", file=sys.stderr, flush=True)
        await _close_store(server)
        return 1
    _tune_garbage_collector()
    print(f"offline server listening on {url} (sync: {server.sync_path})", file=sys.stderr, flush=True)
    try:
        await stop.wait()
        print("offline server stopping", file=sys.stderr, flush=True)
        await server.stop()
    finally:
        await _close_store(server)
    return 0


async def _close_store(server: object) -> None:
    # The process owns the store: close it, or aiosqlite's non-daemon worker threads keep the interpreter
    # alive (the process never exits).
    store = getattr(server, "store", None)
    if store is not None:
        await store.close()


def main() -> None:
    sys.exit(asyncio.run(_main(sys.argv[1:])))


if __name__ == "__main__":
    main()
