"""What an unauthenticated attacker costs a real server process (`python -m server_runtime`, AUTH_SECRET set,
SQLite store): server RSS growth while four 256 MiB request bodies are uploaded at once, and how long a
legitimate client takes to connect and complete its sync handshake while another address holds 5,000
WebSockets that never say hello (target: at most 1 s)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FLOOD = 5000
HANDSHAKE_TARGET_S = 1.0


def _log(message: str) -> None:
    print(f"[bench trust_boundary] {message}", file=sys.stderr, flush=True)


def _bodies(server: Any) -> dict[str, Any]:
    from tests.support.abuse import MIB, PeakRss, parallel_uploads

    with PeakRss(server.proc.pid) as rss:
        started = time.monotonic()
        results = parallel_uploads(4, "127.0.0.1", server.port, "/auth/sign-in", 256 * MIB)
        seconds = time.monotonic() - started
    return {
        "uploads": 4,
        "upload_mib": 256,
        "statuses": sorted({r.status for r in results}, key=str),
        "server_took_kib_max": round(max(r.sent for r in results) / 1024),
        "baseline_rss_mib": round(rss.before / MIB, 1),
        "rss_growth_mib": round(rss.growth / MIB, 2),
        "seconds": round(seconds, 2),
    }


def _sign_up(base: str) -> str:
    import json
    import urllib.request

    body = json.dumps({"email": "bench@example.com", "password": "correct horse battery staple"}).encode()
    request = urllib.request.Request(
        base + "/auth/sign-up", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.loads(response.read())["accessToken"])


def _flood(server: Any, size: int) -> dict[str, Any]:
    """Handshake times of a legitimate client while another process (the attacker; sharing no interpreter
    lock with the client measured) opens ``size`` silent WebSockets from 127.0.0.2, then while it holds
    them."""
    import subprocess

    from offline.core.uuid7 import generate_uuid_v7
    from offline.sync import protocol as p
    from tests.hardening.support import SCHEMA, BareSocketPeer

    token = _sign_up(server.http_url)
    refused: list[str] = []

    def connect() -> float | None:
        """Seconds to an accepted handshake; None when refused with a retriable error (counted, and the
        figures then miss their target: the flood must not keep another address out)."""
        began = time.perf_counter()
        peer = BareSocketPeer("127.0.0.1", server.port)
        try:
            hello = p.Handshake(
                p.new_message_id(), generate_uuid_v7(), {}, SCHEMA.version, 0, auth_token=token
            )
            peer.send_text(p.encode(hello))
            reply = peer.next_message()
        finally:
            peer.close()
        if isinstance(reply, p.ErrorMessage) and reply.retriable:
            refused.append(reply.code)
            return None
        assert isinstance(reply, p.HandshakeResponse) and reply.accepted, reply
        return time.perf_counter() - began

    started = time.monotonic()
    attacker = subprocess.Popen(
        [sys.executable, "-m", "bench.trust_boundary", "--flood", str(server.port), str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=str(ROOT),
        text=True,
    )
    assert attacker.stdin is not None and attacker.stdout is not None
    try:
        during: list[float | None] = []
        ready: list[str] = []
        output = attacker.stdout
        reader = threading.Thread(target=lambda: ready.append(output.readline()))
        reader.start()
        while reader.is_alive():  # while the flood connects
            during.append(connect())
            time.sleep(0.2)
        opened = time.monotonic() - started
        upgraded = int(ready[0].split()[1]) if ready and ready[0].startswith("ready") else None
        # Then with every flood socket still connected: those past the address's allowance were refused or
        # made way, the rest are cut off at the handshake deadline (5 s), after these measurements.
        held = [connect() for _ in range(5)]
    finally:
        attacker.stdin.close()
        attacker.wait(60)
    timed = [x for x in during if x is not None]
    timed_held = [x for x in held if x is not None]
    worst = max(timed + timed_held) if timed + timed_held else None
    return {
        "flood_sockets": size,
        "flood_upgraded": upgraded,
        "flood_open_s": round(opened, 1),
        "handshakes_during_flood": len(during),
        "handshakes_refused": len(refused),
        "handshake_during_flood_median_s": round(sorted(timed)[len(timed) // 2], 4) if timed else None,
        "handshake_during_flood_worst_s": round(max(timed), 4) if timed else None,
        "handshake_after_flood_worst_s": round(max(timed_held), 4) if timed_held else None,
        "target_s": HANDSHAKE_TARGET_S,
        "within_target": not refused and worst is not None and worst <= HANDSHAKE_TARGET_S,
    }


def _attack(port: int, size: int) -> None:
    """The attacker's process: open the flood, say so, hold it until stdin closes."""
    from tests.support.abuse import SilentFlood, raise_open_file_limit

    raise_open_file_limit()

    async def hold() -> None:
        flood = SilentFlood("127.0.0.1", port, size, source="127.0.0.2")
        await flood.open()
        print(f"ready {flood.upgraded}", flush=True)
        await asyncio.to_thread(sys.stdin.read)
        await flood.close()

    asyncio.run(hold())


def run() -> dict[str, Any]:
    from tests.hardening.support import SCHEMA_SOURCE
    from tests.support.abuse import raise_open_file_limit
    from tests.support.servers import ServerProcess

    limit = raise_open_file_limit()
    size = min(FLOOD, limit - 200)
    with tempfile.TemporaryDirectory(prefix="bench-trust-") as name:
        folder = Path(name)
        entry = folder / "server.py"
        entry.write_text(SCHEMA_SOURCE)
        env = {"AUTH_SECRET": "b" * 43, "OFFLINE_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
        server = ServerProcess(entry, store="sqlite", db=str(folder / "server.db"), env=env).start(timeout=60)
        try:
            _log("four parallel 256 MiB uploads")
            bodies = _bodies(server)
            _log(f"RSS growth {bodies['rss_growth_mib']} MiB; flooding with {size} silent WebSockets")
            flood = _flood(server, size)
            _log(f"legitimate handshake during the flood: worst {flood['handshake_during_flood_worst_s']} s")
        finally:
            server.terminate()
    return {"open_file_limit": limit, "bodies": bodies, "handshake_flood": flood}


if __name__ == "__main__" and sys.argv[1:2] == ["--flood"]:
    _attack(int(sys.argv[2]), int(sys.argv[3]))
