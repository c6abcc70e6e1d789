"""Static frontend files (SPEC 4.1 "any other path", DESIGN.md section 5): files from ``static_dir``, SPA
fallback to ``index.html`` for client-side routes, 404 for missing assets, and nothing outside the directory,
however the path is spelled. Traversal attempts go over a raw socket so no client library normalizes them."""

from __future__ import annotations

import gzip
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.test_operational import ALL_TOKENS, LiveServer

INDEX = "<!doctype html><title>app shell</title><div id=root></div>"
SECRET = "TOP-SECRET-DO-NOT-SERVE"
BIG_JS = "".join(f"export const value{i} = {i};\n" for i in range(2000))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp_path = tmp_path_factory.mktemp("static")
    dist = tmp_path / "site" / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text(INDEX)
    (dist / "assets" / "app.js").write_text("console.log('app');")
    (dist / "assets" / "style.css").write_text("body{margin:0}")
    # A build's precompressed copies (offline_cli.web_build): served in place of the file when the client
    # accepts gzip; one made before its file changed (stale) never is.
    (dist / "assets" / "big.js").write_text(BIG_JS)
    (dist / "assets" / "big.js.gz").write_bytes(gzip.compress(BIG_JS.encode(), mtime=0))
    (dist / "assets" / "stale.js").write_text("console.log('new');")
    (dist / "assets" / "stale.js.gz").write_bytes(gzip.compress(b"console.log('old');", mtime=0))
    os.utime(dist / "assets" / "stale.js.gz", (1_000_000, 1_000_000))
    (dist / "assets" / "runtime.wasm").write_bytes(b"\0asm\1\0\0\0")
    (dist / "assets" / "app.0123456789ab.zip").write_bytes(b"PK\5\6" + bytes(18))
    (dist / "docs").mkdir()
    (dist / "docs" / "index.html").write_text("<p>docs page</p>")
    # Things next to and above the served directory that must never come out.
    (tmp_path / "site" / "secret").write_text(SECRET)
    (tmp_path / "site" / "secret.txt").write_text(SECRET)
    (tmp_path / "secret.txt").write_text(SECRET)
    (dist / "escape.txt").symlink_to(tmp_path / "site" / "secret.txt")
    (dist / "escape-dir").symlink_to(tmp_path / "site")
    with LiveServer(tmp_path, auth=ALL_TOKENS, static_dir=str(dist)) as server:
        yield server


@pytest.fixture(scope="module")
def http(site: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=site.url, timeout=10) as client:
        yield client


def raw_get(url: str, target: str) -> tuple[int, str]:
    """Send ``GET <target>`` exactly as written; return (status, body)."""
    status, _, body = raw_response(url, target, {})
    return status, body.decode("utf-8", "replace")


def test_files_are_served_with_their_types(http: httpx.Client) -> None:
    script = http.get("/assets/app.js")
    assert script.status_code == 200 and script.text == "console.log('app');"
    assert "javascript" in script.headers["content-type"]
    style = http.get("/assets/style.css")
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    root = http.get("/")
    assert root.status_code == 200 and root.text == INDEX
    assert root.headers["content-type"].startswith("text/html")
    assert http.get("/index.html").text == INDEX
    assert http.get("/docs/").text == "<p>docs page</p>"
    assert http.head("/assets/app.js").status_code == 200


@pytest.mark.parametrize(
    "route", ["/some/route", "/settings", "/users/42/edit", "/todos/", "/docs/deep/link"]
)
def test_client_side_routes_fall_back_to_the_app_shell(http: httpx.Client, route: str) -> None:
    response = http.get(route)
    assert response.status_code == 200
    assert response.text == INDEX
    assert response.headers["content-type"].startswith("text/html")


@pytest.mark.parametrize("asset", ["/x.js", "/assets/missing.css", "/favicon.ico", "/deep/path/chunk-123.js"])
def test_a_missing_asset_is_a_404_not_the_app_shell(http: httpx.Client, asset: str) -> None:
    response = http.get(asset)
    assert response.status_code == 404
    assert INDEX not in response.text


def test_server_routes_win_over_static_files(http: httpx.Client) -> None:
    assert http.get("/health").json()["status"] == "ok"
    assert http.get("/__offline/status").status_code == 401  # still guarded, never the app shell
    assert http.get("/__offline", headers={"Accept": "text/html"}).status_code == 303


@pytest.mark.parametrize(
    "target",
    [
        "/../secret.txt",
        "/../../secret.txt",
        "/../secret",
        "/assets/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E/%2E%2E/secret.txt",
        "/%2e%2e%2fsecret.txt",
        "/..%2fsecret.txt",
        "/..%2f..%2fsecret.txt",
        "/assets/%2e%2e/%2e%2e/secret",
        "/..%5csecret.txt",
        "/%252e%252e/secret.txt",
        "//secret.txt",
        "/etc/passwd",
        "//etc/passwd",
        "/escape.txt",
        "/escape-dir/secret",
        "/escape-dir/secret.txt",
    ],
)
def test_paths_never_escape_the_static_directory(site: LiveServer, target: str) -> None:
    status, body = raw_get(site.url, target)
    assert SECRET not in body
    assert "root:" not in body  # /etc/passwd
    # Either refused, or a client-side route answered with the app shell; never a file from outside.
    assert status in (400, 404) or (status == 200 and body == INDEX), (status, body[:200])


def test_absolute_paths_in_the_request_target_are_refused(site: LiveServer) -> None:
    assert site.static_dir is not None
    outside = Path(site.static_dir).parent / "secret.txt"
    for target in (str(outside), "http://evil.example/../secret.txt", f"http://127.0.0.1{outside}"):
        status, body = raw_get(site.url, target)
        assert SECRET not in body
        assert status != 200 or body == INDEX, (target, status)


# -- precompressed files and caching ---------------------------------------------------------------------------


def raw_response(url: str, target: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """``GET <target>`` with exactly ``headers`` (no client adds or decodes anything): (status, headers, body)."""
    host, port = url.removeprefix("http://").split(":")
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{lines}\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        parsed[name.strip().lower()] = value.strip()
    return int(status_line.split(" ")[1]), parsed, body


def test_the_precompressed_copy_is_served_to_a_client_that_accepts_gzip(site: LiveServer) -> None:
    status, headers, body = raw_response(site.url, "/assets/big.js", {"Accept-Encoding": "gzip, deflate, br"})
    assert status == 200
    assert headers["content-encoding"] == "gzip"
    assert "javascript" in headers["content-type"]  # the file's type, not the copy's (application/gzip)
    assert "accept-encoding" in headers["vary"].lower()
    assert int(headers["content-length"]) == len(body) < len(BIG_JS) / 3
    assert gzip.decompress(body).decode() == BIG_JS


@pytest.mark.parametrize("accept", [None, "identity", "br", "gzip;q=0", "deflate, gzip;q=0"])
def test_the_file_itself_is_served_to_a_client_that_does_not_accept_gzip(
    site: LiveServer, accept: str | None
) -> None:
    status, headers, body = raw_response(
        site.url, "/assets/big.js", {} if accept is None else {"Accept-Encoding": accept}
    )
    assert status == 200 and body.decode() == BIG_JS
    assert "content-encoding" not in headers
    assert "accept-encoding" in headers["vary"].lower()  # (a shared cache must not hand it to others)


def test_a_copy_older_than_its_file_is_never_served(site: LiveServer) -> None:
    status, headers, body = raw_response(site.url, "/assets/stale.js", {"Accept-Encoding": "gzip"})
    assert status == 200 and body == b"console.log('new');"
    assert "content-encoding" not in headers


def test_webassembly_is_served_as_application_wasm(http: httpx.Client) -> None:
    # (WebAssembly.instantiateStreaming refuses any other type, and the browser then compiles the module
    # only once it has all of it.)
    response = http.get("/assets/runtime.wasm")
    assert response.status_code == 200 and response.headers["content-type"] == "application/wasm"


def test_files_named_by_their_hash_are_cached_for_good(http: httpx.Client) -> None:
    response = http.get("/assets/app.0123456789ab.zip")
    assert response.status_code == 200
    cache = response.headers["cache-control"]
    assert "immutable" in cache and "max-age=31536000" in cache and "public" in cache


@pytest.mark.parametrize("path", ["/", "/index.html", "/assets/app.js", "/assets/big.js", "/settings"])
def test_other_files_are_revalidated_with_their_etag(site: LiveServer, path: str) -> None:
    for accept in ("gzip", "identity"):
        status, headers, _ = raw_response(site.url, path, {"Accept-Encoding": accept})
        assert status == 200
        assert headers["cache-control"] == "no-cache"
        etag = headers["etag"]
        status, again, body = raw_response(site.url, path, {"Accept-Encoding": accept, "If-None-Match": etag})
        assert status == 304 and body == b""
        assert again["cache-control"] == "no-cache" and "accept-encoding" in again["vary"].lower()


def test_the_copy_and_the_file_have_different_etags(site: LiveServer) -> None:
    _, compressed, _ = raw_response(site.url, "/assets/big.js", {"Accept-Encoding": "gzip"})
    _, plain, _ = raw_response(site.url, "/assets/big.js", {})
    assert compressed["etag"] != plain["etag"]
    # The copy's ETag never validates the file itself (a cache would pair the wrong bytes and encoding).
    status, _, body = raw_response(site.url, "/assets/big.js", {"If-None-Match": compressed["etag"]})
    assert status == 200 and body.decode() == BIG_JS
