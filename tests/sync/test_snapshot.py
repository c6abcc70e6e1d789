"""A fresh device's first sync from a server-built snapshot (``POST <sync path>/snapshot``), end to end: a
real server process (memory, SQLite, PostgreSQL stores), the file it sends opened as a real replica, real
WebSocket sessions afterwards.

The snapshot is the replica a state-based first sync would have built: the same records, no received
operation in its log, a watermark from which the device syncs by operations (no ``record-states`` over the
socket), and no node id of its own (every device opening it makes one). Anything but a usable snapshot is an
answer the device falls back from (204, or an error with a code naming what was wrong).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import socket
import sqlite3
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import offline
from offline import op
from offline.store.replication import delivery_watermark
from offline.sync import snapshot
from tests.hardening.test_secrets import TokenClient
from tests.merge._support import SCHEMA
from tests.sync.test_integration import (
    SCOPED,
    SCOPED_SOURCE,
    TIMEOUT,
    Backend,
    client,
    clients,
    collect,
    converge,
    wait_for,
)
from tests.sync.test_state_first_sync import ENTRY, received_in_log, write_history, write_scoped_history

SECRET = "s" * 43
#: Builds only on request: these tests count builds and hold the one build slot, which a background build
#: of the open scope (the server's own, `Snapshots._prepare`) would otherwise take at moments they cannot see.
ON_REQUEST = {"OFFLINE_SNAPSHOT_PREPARE_EVERY": "0"}


def ask(
    base: str,
    body: Any = None,
    *,
    token: str | None = None,
    gzip_ok: bool = True,
    origin: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """POST a snapshot request; (status, headers in lower case, body decoded from gzip)."""
    if body is None:
        body = {
            "format": snapshot.FORMAT,
            "offline": offline.__version__,
            "schemaVersion": 1,
            "syncScope": None,
        }
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json"}
    if gzip_ok:
        headers["accept-encoding"] = "gzip"
    if token:
        headers["authorization"] = f"Bearer {token}"
    if origin:
        headers["origin"] = origin
    request = urllib.request.Request(
        base + "/offline-sync/snapshot", data=data, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, got, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, got, raw = exc.code, dict(exc.headers), exc.read()
    got = {k.lower(): v for k, v in got.items()}
    if got.get("content-encoding") == "gzip":
        raw = gzip.decompress(raw)
    return status, got, raw


def write_items(tmp_path: Path, sync_url: str, name: str, count: int, **options: Any) -> None:
    """``count`` items written by a client named ``name`` (with sync ``options``) and synced to the server
    at ``sync_url``."""

    async def scenario() -> None:
        writer = client(tmp_path, name, sync_url, SCHEMA, **options)
        async with clients(writer):
            await writer.sync.connect()
            with writer.batch():
                for i in range(count):
                    writer.items.insert({"title": f"item {i}"})
            await writer.sync.wait_until_synced(TIMEOUT)

    asyncio.run(scenario())


def meta(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT key, value FROM _offline_meta").fetchall())
    finally:
        conn.close()


def test_a_device_opening_a_snapshot_holds_the_servers_records_and_syncs_on_by_operations(
    server_backend: Backend, tmp_path: Path
) -> None:
    server = server_backend.server(
        ENTRY, name="snapshot", env={**ON_REQUEST, "OFFLINE_STATE_SYNC_AFTER": "1"}
    )

    async def scenario() -> None:
        writer = client(tmp_path, "writer", server.sync_url, SCHEMA)
        async with clients(writer):
            await writer.sync.connect()
            ids = await write_history(writer)

            status, headers, body = ask(server.http_url)
            assert status == 200, body
            # Asked again while the log has not moved: the same file, not built again.
            again = ask(server.http_url)
            assert again[0] == 200 and again[2] == body
            assert served(server.http_url) == {"built": 1, "served": 2}
            assert headers["content-type"] == snapshot_media()
            assert headers["x-offline-snapshot-format"] == str(snapshot.FORMAT)
            assert headers["content-encoding"] == "gzip"  # asked for: sent compressed
            assert "no-store" in headers["cache-control"]
            horizon = int(headers["x-offline-snapshot-horizon"])
            assert horizon >= 181  # every operation the writer made is accounted for
            assert body.startswith(snapshot.SQLITE_HEADER)
            # One file, two devices: each makes its own node id (the file has none).
            for name in ("first", "second"):
                (tmp_path / f"{name}.db").write_bytes(body)
            stored = meta(tmp_path / "first.db")
            assert "node_id" not in stored and stored[snapshot.FORMAT_KEY] == str(snapshot.FORMAT)
            assert int(stored["delivery_watermark"]) == horizon

            first = client(tmp_path, "first", server.sync_url, SCHEMA)
            second = client(tmp_path, "second", server.sync_url, SCHEMA)
            assert first.node_id != second.node_id and writer.node_id not in (first.node_id, second.node_id)
            # Before any connection: the server's records, as of the horizon.
            assert {r["id"] for r in first.items.fetch()} == set(ids[:100])
            assert received_in_log(first) == 0
            assert delivery_watermark(first) == horizon
            states = collect(first, "sync:states")
            async with clients(first, second):
                await first.sync.connect()
                await second.sync.connect()
                records = await converge(writer, first, second)
                assert {r["id"] for r in records["items"]} == set(ids[:100])
                [one] = [r for r in records["items"] if r["id"] == ids[0]]
                assert one["count"] == 5 and sorted(one["tags"]) == ["a", "b"] and one["body"] == "rich text"
                assert not states  # nothing was sent again by states: operations from the horizon only

                # All three write to the same records: they converge, counters adding up.
                first.items.update(ids[1], {"count": op.increment(7), "title": "first"})
                second.items.update(ids[1], {"count": op.increment(11), "tags": op.append("second")})
                writer.items.update(ids[1], {"count": op.increment(13)})
                second.items.delete(ids[2])
                records = await converge(writer, first, second)
                # The log moved: the next fresh device's snapshot is built anew.
                assert ask(server.http_url)[0] == 200
                assert served(server.http_url) == {"built": 2, "served": 3}
                [two] = [r for r in records["items"] if r["id"] == ids[1]]
                assert two["count"] == 1 + 5 + 7 + 11 + 13
                assert ids[2] not in {r["id"] for r in records["items"]}

    asyncio.run(scenario())


def test_a_server_without_sign_in_has_the_open_scope_ready_before_any_device_asks(
    memory_backend: Backend, tmp_path: Path
) -> None:
    """Once the log has stayed still a moment, the server builds the open scope's file on its own: the first
    fresh device is sent that file (no build of its own), holding everything written."""
    server = memory_backend.server(ENTRY, name="snapshot-prepared", env={"OFFLINE_STATE_SYNC_AFTER": "1"})
    write_items(tmp_path, server.sync_url, "writer", 20)

    def prepared() -> int:
        with urllib.request.urlopen(server.http_url + "/__offline/status", timeout=30) as response:
            return int(json.loads(response.read())["snapshots"]["prepared"])

    asyncio.run(wait_for(lambda: prepared() == 1, "the open scope prepared"))
    status, headers, body = ask(server.http_url)
    assert status == 200 and headers["x-offline-snapshot-records"] == "20"
    assert served(server.http_url) == {"built": 1, "served": 1}
    (tmp_path / "fresh.db").write_bytes(body)
    fresh = client(tmp_path, "fresh", server.sync_url, SCHEMA)
    try:
        assert sorted(r["title"] for r in fresh.items.fetch()) == sorted(f"item {i}" for i in range(20))
    finally:
        fresh.close()


def served(base: str) -> dict[str, int]:
    """The server's count of snapshots built and sent (its status endpoint)."""
    with urllib.request.urlopen(base + "/__offline/status", timeout=30) as response:
        counts = dict(json.loads(response.read())["snapshots"])
    return {name: counts[name] for name in ("built", "served")}


def snapshot_media() -> str:
    from server_runtime.snapshot import MEDIA_TYPE

    return MEDIA_TYPE


def test_a_scoped_snapshot_holds_exactly_the_scope(server_backend: Backend, tmp_path: Path) -> None:
    """A snapshot asked with a scope holds that scope's records only: not another user's, and not a record
    that moved out of it (the state the server sends of it only tells a device to drop it)."""
    server = server_backend.server(
        SCOPED_SOURCE, "scoped-snapshot", env={**ON_REQUEST, "OFFLINE_STATE_SYNC_AFTER": "1"}
    )

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
        async with clients(admin):
            await admin.sync.connect()
            mine = await write_scoped_history(admin)

            body = {
                "format": snapshot.FORMAT,
                "offline": offline.__version__,
                "schemaVersion": 1,
                "syncScope": {"todos": {"ownerId": "a"}},
            }
            status, _, raw = ask(server.http_url, body)
            assert status == 200, raw
            (tmp_path / "a.db").write_bytes(raw)
            device = client(tmp_path, "a", server.sync_url, schema=SCOPED, scope={"userId": "a"})
            by_states = client(tmp_path, "a-states", server.sync_url, schema=SCOPED, scope={"userId": "a"})
            expected = {m["id"] for m in mine[1:]}
            assert {r["id"] for r in device.todos.fetch()} == expected
            restarted = collect(device, "sync:states")
            async with clients(device, by_states):
                await device.sync.connect()
                await by_states.sync.connect()
                await device.sync.wait_until_synced(TIMEOUT)
                # The scope the snapshot was built under is the one the handshake accepts: no resync.
                assert not restarted
                admin.todos.insert({"ownerId": "a", "title": "after the snapshot"})
                await wait_for(
                    lambda: len(device.todos.fetch()) == len(expected) + 1, "the new record of A arrives"
                )
                await wait_for(
                    lambda: device.todos.fetch() == by_states.todos.fetch(),
                    "the same records as a device synced by states over the socket",
                )

    asyncio.run(scenario())


def test_requests_a_snapshot_cannot_serve_are_answered_with_a_status_and_a_code(
    memory_backend: Backend, tmp_path: Path
) -> None:
    server = memory_backend.server(ENTRY, name="snapshot-refusals", env=ON_REQUEST)  # threshold: 1,000
    write_items(tmp_path, server.sync_url, "writer", 20)
    base = server.http_url
    good = {"format": snapshot.FORMAT, "offline": offline.__version__, "schemaVersion": 1, "syncScope": None}
    # A short log: the socket's first sync by operations is cheap, nothing to build.
    assert ask(base)[0] == 204
    # Another build of the library, another format, another (supported) schema: the socket serves them.
    assert ask(base, {**good, "offline": "0.0.0-other"})[0] == 204
    assert ask(base, {**good, "format": snapshot.FORMAT + 1})[0] == 204
    status, _, raw = ask(base, {**good, "schemaVersion": 7})
    assert status == 409 and json.loads(raw)["error"] == "SCHEMA_MISMATCH"
    for bad, field in (
        (b"not json", "body"),
        ([1, 2], "body"),
        ({**good, "format": "1"}, "format"),
        ({**good, "schemaVersion": True}, "schemaVersion"),
        ({**good, "offline": None}, "offline"),
        ({**good, "syncScope": "all"}, "syncScope"),
        (b"{" + b" " * 60_000, "body"),
    ):
        status, _, raw = ask(base, bad)
        answer = json.loads(raw)
        assert (status, answer["error"], answer["field"]) == (400, "INVALID_REQUEST", field), (bad, answer)
    # Past the server's request body limit: refused before it is read.
    assert ask(base, b"{" + b" " * 70_000 + b"}")[0] == 413
    # The server keeps serving: a health check and a socket session.
    with urllib.request.urlopen(base + "/health", timeout=10) as response:
        assert response.status == 200


def test_a_server_with_sign_in_builds_snapshots_for_signed_in_devices_only(
    memory_backend: Backend, tmp_path: Path
) -> None:
    server = memory_backend.server(
        ENTRY,
        name="snapshot-auth",
        env={**ON_REQUEST, "AUTH_SECRET": SECRET, "OFFLINE_STATE_SYNC_AFTER": "1"},
    )
    base = server.http_url
    request = urllib.request.Request(
        base + "/auth/sign-up",
        data=json.dumps({"email": "snap@example.com", "password": "correct horse battery staple"}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        token = str(json.loads(response.read())["accessToken"])
    write_items(tmp_path, server.sync_url, "writer", 10, auth_client=TokenClient(token))
    for bad in (None, "not-a-token", token[:-4] + "AAAA"):
        status, _, raw = ask(base, token=bad)
        assert status == 401 and json.loads(raw)["error"] == "AUTH_FAILED", raw
        assert b"SQLite" not in raw
    status, _, raw = ask(base, token=token)
    assert status == 200 and raw.startswith(snapshot.SQLITE_HEADER)


def test_snapshots_can_be_turned_off_and_origins_are_checked(memory_backend: Backend, tmp_path: Path) -> None:
    off = memory_backend.server(
        ENTRY, name="snapshot-off", env={"OFFLINE_SNAPSHOT_BUILDS": "0", "OFFLINE_STATE_SYNC_AFTER": "1"}
    )
    guarded = memory_backend.server(
        ENTRY,
        name="snapshot-origins",
        env={
            **ON_REQUEST,
            "OFFLINE_ALLOWED_ORIGINS": "https://app.example.com",
            "OFFLINE_STATE_SYNC_AFTER": "1",
        },
    )
    for server, name in ((off, "w-off"), (guarded, "w-guarded")):
        write_items(tmp_path, server.sync_url, name, 2)
    assert ask(off.http_url)[0] == 204
    status, _, raw = ask(guarded.http_url, origin="https://evil.example.com")
    assert status == 403 and json.loads(raw)["error"] == "ORIGIN_NOT_ALLOWED"
    status, headers, raw = ask(guarded.http_url, origin="https://app.example.com", gzip_ok=False)
    assert status == 200 and "content-encoding" not in headers and raw.startswith(snapshot.SQLITE_HEADER)


def _stalled_request(base: str) -> socket.socket:
    """A snapshot request whose body never arrives: its headers promise 100 bytes and stop there."""
    parsed = urllib.parse.urlsplit(base)
    conn = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 80), timeout=TIMEOUT)
    conn.sendall(
        b"POST /offline-sync/snapshot HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{"
    )
    return conn


def test_one_address_holds_at_most_snapshot_per_address_requests_at_once(
    memory_backend: Backend, tmp_path: Path
) -> None:
    """A snapshot request is open to anyone a server without sign-in syncs with, and each one in progress
    holds a file of up to ``snapshot_max_bytes`` on its way out: one address may have
    ``snapshot_per_address`` in progress (from its first byte to its last sent); one more is answered 429
    ``RATE_LIMITED`` (the device syncs by socket), and other requests are served meanwhile."""
    server = memory_backend.server(
        ENTRY,
        name="snapshot-per-address",
        env={**ON_REQUEST, "OFFLINE_STATE_SYNC_AFTER": "1", "OFFLINE_SNAPSHOT_PER_ADDRESS": "2"},
    )
    write_items(tmp_path, server.sync_url, "w-per-address", 3)
    stalled = [_stalled_request(server.http_url) for _ in range(2)]
    try:
        # (The server counts a request once it has read its headers: asked until both are counted.)
        deadline = time.monotonic() + TIMEOUT
        while (answer := ask(server.http_url))[0] != 429:
            assert answer[0] == 200, answer
            assert time.monotonic() < deadline, "the stalled requests were never counted"
            time.sleep(0.05)
        _, headers, raw = answer
        assert json.loads(raw)["error"] == "RATE_LIMITED" and headers.get("retry-after"), raw
        with urllib.request.urlopen(server.http_url + "/health", timeout=TIMEOUT) as health:
            assert health.status == 200
    finally:
        for conn in stalled:
            conn.close()
    # Closed, they free the address's places.
    deadline = time.monotonic() + TIMEOUT
    while (answer := ask(server.http_url))[0] != 200:
        assert answer[0] == 429 and time.monotonic() < deadline, answer
        time.sleep(0.05)
    assert answer[2].startswith(snapshot.SQLITE_HEADER)


def test_a_scope_larger_than_snapshot_max_bytes_syncs_by_socket(
    memory_backend: Backend, tmp_path: Path
) -> None:
    """The replica is built in the server's memory: past ``snapshot_max_bytes`` the build stops and the device
    is answered 204 (it syncs by socket, whose catch-up streams pages); the server keeps serving snapshots
    of scopes within the limit."""
    server = memory_backend.server(
        SCOPED_SOURCE,
        name="snapshot-max-bytes",
        env={**ON_REQUEST, "OFFLINE_STATE_SYNC_AFTER": "1", "OFFLINE_SNAPSHOT_MAX_BYTES": str(256 * 1024)},
    )

    async def scenario() -> None:
        admin = client(tmp_path, "admin", server.sync_url, schema=SCOPED)
        async with clients(admin):
            await admin.sync.connect()
            with admin.batch():
                for i in range(1500):
                    admin.todos.insert({"ownerId": "big", "title": f"big {i} " + "x" * 200})
                for i in range(5):
                    admin.todos.insert({"ownerId": "small", "title": f"small {i}"})
            await admin.sync.wait_until_synced(TIMEOUT)

    asyncio.run(scenario())
    body = {"format": snapshot.FORMAT, "offline": offline.__version__, "schemaVersion": 1}
    assert ask(server.http_url, {**body, "syncScope": {"todos": {"ownerId": "big"}}})[0] == 204
    status, _, raw = ask(server.http_url, {**body, "syncScope": {"todos": {"ownerId": "small"}}})
    assert status == 200 and raw.startswith(snapshot.SQLITE_HEADER)
    assert served(server.http_url) == {"built": 1, "served": 1}


def test_the_browser_asks_for_the_format_the_server_writes() -> None:
    # web/snapshot.js keeps its own copy of FORMAT (it asks before Python has started): a layout change
    # bumps both, or every fresh browser is told 204 and syncs over the socket.
    script = Path(offline.__file__).parent.parent / "offline_cli/templates/project/web/snapshot.js"
    (line,) = [text for text in script.read_text().splitlines() if text.startswith("export const FORMAT = ")]
    assert line == f"export const FORMAT = {snapshot.FORMAT};"


# The layout of the local database's own tables, and how a log row holds an operation, by snapshot format: a
# snapshot is a copy of that database, so a client of one format cannot be sent a file of another layout. A
# change to either fails this test until FORMAT (offline/sync/snapshot.py and web/snapshot.js) is raised and
# the new digest written here.
LAYOUT_OF_FORMAT = {4: "8478290b87741d88223051317f5400b2a1ba15536705c382fffeabfe18991339"}


def test_a_change_to_the_local_database_layout_comes_with_a_new_snapshot_format(tmp_path: Path) -> None:
    from offline.core.hlc import HLCTimestamp
    from offline.core.operations import create_operation

    node = "0190c0de-0000-7000-8000-00000000f00d"
    held = create_operation(
        {
            "node_id": node,
            "type": "insert",
            "collection": "items",
            "record_id": "r1",
            "data": {"title": "a"},
            "timestamp": HLCTimestamp(1_700_000_000_000, 0, node),
            "sequence_number": 1,
            "schema_version": SCHEMA.version,
            "causal_context": {node: 1},
        }
    )
    with offline.create_app(SCHEMA, path=str(tmp_path / "layout.db")) as app:
        app.apply([held])
        rows = app.db.conn.execute(
            "SELECT type, name, sql FROM sqlite_schema WHERE name LIKE '\\_offline%' ESCAPE '\\' ORDER BY name"
        ).fetchall()
        rows += app.db.conn.execute("SELECT id, node_id, wire FROM _offline_ops").fetchall()
    digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    assert LAYOUT_OF_FORMAT.get(snapshot.FORMAT) == digest, (
        f"the local database's layout is {digest}; raise snapshot FORMAT if it changed"
    )
