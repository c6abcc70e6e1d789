"""Request bodies are capped while they are read, before any route or authentication: a huge upload costs the
server at most the cap, and gets 413 BODY_TOO_LARGE (a real server process, real sockets)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.abuse import MIB, PeakRss, parallel_uploads, upload
from tests.support.servers import ServerProcess

from .support import start_server

SECRET = "s" * 43
BACKUP_TOKEN = "backup-token-for-tests-0123456789"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    # The reported setup: sign-in on (AUTH_SECRET), a SQLite store.
    process = start_server(
        tmp_path,
        env={
            "AUTH_SECRET": SECRET,
            "OFFLINE_BACKUP_TOKEN": BACKUP_TOKEN,
            "OFFLINE_MAX_BACKUP_BODY_BYTES": str(2 * MIB),
        },
    )
    try:
        yield process
    finally:
        process.terminate()


def too_large(result: object, cap: int) -> bool:
    from tests.support.abuse import UploadResult

    assert isinstance(result, UploadResult)
    assert result.status == 413, result
    error = result.json()["error"]
    assert isinstance(error, dict)
    assert error["code"] == "BODY_TOO_LARGE" and error["field"] == "body"
    assert str(cap) in str(error["message"])
    # Nothing much past the cap was taken (the chunk that crossed it, plus socket buffers).
    return result.sent <= cap + 8 * MIB


def test_four_parallel_256_mib_uploads_cost_the_server_less_than_20_mib(server: ServerProcess) -> None:
    assert server.proc is not None
    with PeakRss(server.proc.pid) as rss:
        chunked = parallel_uploads(4, "127.0.0.1", server.port, "/auth/sign-in", 256 * MIB)
        declared = parallel_uploads(4, "127.0.0.1", server.port, "/auth/sign-up", 256 * MIB, chunked=False)
    assert all(too_large(result, 64 * 1024) for result in [*chunked, *declared])
    assert rss.growth < 20 * MIB, f"server RSS grew {rss.growth / MIB:.1f} MiB"
    # The server still serves (the connections it cut off took nothing with them).
    with urllib.request.urlopen(server.http_url + "/health", timeout=30) as response:
        assert json.loads(response.read())["status"] == "ok"


def test_every_route_that_reads_a_body_is_capped(server: ServerProcess) -> None:
    for path in ("/auth/sign-up", "/auth/refresh", "/auth/sign-out"):
        assert too_large(upload("127.0.0.1", server.port, path, 1 * MIB), 64 * 1024), path
    # A route that answers without reading the body (an unknown path, a GET route) ends the connection
    # instead of reading the rest of the upload.
    for path, status in (("/some/page", 404), ("/health", 405)):
        ignored = upload("127.0.0.1", server.port, path, 256 * MIB)
        assert ignored.status == status, ignored
        assert ignored.sent < 64 * MIB, f"{path}: the server read {ignored.sent} bytes of an ignored body"
    # A body under the cap reaches the route as before.
    small = upload("127.0.0.1", server.port, "/auth/sign-in", 1000)
    assert small.status == 400 and small.json()["error"]["code"] == "INVALID_INPUT"  # type: ignore[index]


def test_the_backup_import_has_its_own_larger_cap(server: ServerProcess) -> None:
    auth = {"Authorization": f"Bearer {BACKUP_TOKEN}"}
    # Over the general cap, under the backup's: read whole and judged (not a backup, so 400).
    under = upload("127.0.0.1", server.port, "/__offline/backup/import", 1 * MIB, headers=auth)
    assert under.status == 400 and under.sent == 1 * MIB
    over = upload("127.0.0.1", server.port, "/__offline/backup/import", 8 * MIB, headers=auth)
    assert too_large(over, 2 * MIB)
    declared = upload("127.0.0.1", server.port, "/__offline/backup/import", 8 * MIB, chunked=False)
    assert too_large(declared, 2 * MIB)


def test_a_small_body_a_route_refuses_unread_leaves_the_connection_serving(server: ServerProcess) -> None:
    """A route that answers before reading a small body (a wrong token on the backup import) leaves the
    connection usable for the next request: the server reads the rest of that body instead of ending the
    connection without saying so. (It ended it, unannounced: a client reusing the connection, as httpx does,
    sent its next POST into a closing socket and got "Server disconnected", and a POST is not retried.)"""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/__offline/backup/import", body=b"x" * 1000)
        refused = conn.getresponse()
        refused.read()
        assert refused.status == 401
        assert (refused.getheader("connection") or "").lower() != "close"
        conn.request("GET", "/health")  # the same connection
        again = conn.getresponse()
        assert again.status == 200 and json.loads(again.read())["status"] == "ok"
    finally:
        conn.close()
