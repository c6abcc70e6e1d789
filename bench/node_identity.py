"""What binding node ids to principals costs a real server process (`python -m server_runtime`, AUTH_SECRET
set, SQLite store): a handshake with a node id the server has not seen (it registers it: one small write
transaction) against one it knows; and storing batches of a session's own operations, of a sibling device's
(relayed: the registration is looked up once, then kept; being another node's, they are also relayed back to
the sending session), and of operations numbered below their node's highest stored number (the rare resend
that makes the server look their places up)."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

HANDSHAKES = 60
BATCHES = 40
BATCH = 50


def _log(message: str) -> None:
    print(f"[bench node_identity] {message}", file=sys.stderr, flush=True)


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1] * 1000, 2),
    }


async def _handshakes(url: str, token: str) -> dict[str, Any]:
    from tests.hardening.support import RawClient, Writer

    writers = [Writer() for _ in range(HANDSHAKES)]
    timings: dict[str, list[float]] = {"new": [], "known": []}
    for kind in ("new", "known"):
        for writer in writers:
            client = RawClient(url, token=token, writer=writer)
            started = time.perf_counter()
            await client.open()
            timings[kind].append(time.perf_counter() - started)
            await client.close()
    return {kind: _ms(samples) for kind, samples in timings.items()}


@contextlib.asynccontextmanager
async def _session(url: str, token: str, writer: Any) -> AsyncIterator[Any]:
    from tests.hardening.support import RawClient

    client = RawClient(url, token=token, writer=writer)
    await client.open()
    try:
        yield client
    finally:
        await client.close()


async def _batches(url: str, token: str) -> dict[str, Any]:
    from tests.hardening.support import RawClient, Writer

    own, sibling = Writer(), Writer()
    async with _session(url, token, sibling):
        pass  # registers the sibling device to the same user
    results: dict[str, Any] = {}
    client = RawClient(url, token=token, writer=own)
    await client.open()
    try:
        for kind, writer in (("own", own), ("relayed_sibling", sibling)):
            batches = [
                [writer.op("boards", {"name": f"{kind} {b}.{i}"}) for i in range(BATCH)]
                for b in range(BATCHES)
            ]
            started = time.perf_counter()
            await client.push([op for batch in batches for op in batch], batch=BATCH, window=4)
            seconds = time.perf_counter() - started
            results[kind] = {"operations": BATCHES * BATCH, "ops_per_s": round(BATCHES * BATCH / seconds)}
        # Numbers below the node's highest stored one: leave gaps, then fill them.
        gaps = Writer(own.node)
        gaps.sequence = own.sequence
        later = [gaps.op("boards", {"name": f"after gap {i}"}) for i in range(2 * BATCHES * BATCH)]
        filling = later[::2]
        await client.push(later[1::2], batch=BATCH, window=4)
        started = time.perf_counter()
        await client.push(filling, batch=BATCH, window=4)
        seconds = time.perf_counter() - started
        results["below_highest_number"] = {
            "operations": len(filling),
            "ops_per_s": round(len(filling) / seconds),
        }
        assert not client.rejections, client.rejections[:3]
    finally:
        await client.close()
    return results


def run() -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import httpx

    from tests.hardening.support import sign_up, start_server

    with tempfile.TemporaryDirectory(prefix="bench-node-identity-") as folder:
        server = start_server(
            Path(folder) / "server", env={"AUTH_SECRET": "bench-node-identity-secret-0123456789abcdef"}
        )
        try:

            async def main() -> dict[str, Any]:
                async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
                    _, token, _ = await sign_up(http, "bench@example.com")
                _log("handshakes")
                handshakes = await _handshakes(server.sync_url, token)
                _log("batches")
                return {"handshake": handshakes, "store": await _batches(server.sync_url, token)}

            return asyncio.run(main())
        finally:
            server.terminate()
