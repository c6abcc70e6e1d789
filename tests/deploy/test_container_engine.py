"""DockerEngine's error mapping and stream handling, without a real engine.

Connection failures use real sockets where nothing answers. The rest talks to a small fake daemon on a unix
socket: it speaks the Docker Engine API paths the SDK calls and replays event streams recorded from podman 4.3's
Docker-compatible service (build steps, a failing RUN, podman's ``<tag>: digest: ...`` push status, a registry's
401) and Docker's documented ``aux`` records. tests/e2e runs the same code against a real engine.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import socketserver
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from platform_adapters.base import (
    BUILD_FAILED,
    DAEMON_UNAVAILABLE,
    NOT_AUTHENTICATED,
    PLATFORM_ERROR,
    WRONG_ARCHITECTURE,
    DeployError,
)
from platform_adapters.container_engine import DockerEngine, require_platform, split_reference
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
IMAGE_ID = "sha256:a4c2ac51a0c549e879f8dad466479daab39626e694fbfb278f159349cabd7669"
PUSHED = "sha256:9a1b6cdcdc439b7f2b74544a20f2f5b82875ebc07333b827b9130152763d495c"

# Recorded from podman 4.3 (`client.api.build(..., decode=True)`), a successful build.
PODMAN_BUILD_OK: list[dict[str, Any]] = [
    {"stream": "STEP 1/3: FROM localhost/offline-test-base:manual\n"},
    {"stream": "STEP 2/3: RUN python3 -c \"print('hello from build')\"\n"},
    {"stream": "hello from build\n"},
    {"stream": "--> 01babe55a5c\n"},
    {"stream": 'STEP 3/3: CMD ["python3", "/app/app.py"]\n'},
    {"stream": "COMMIT docker.io/offline-test/manual:1\n"},
    {"stream": "--> a4c2ac51a0c\n"},
    {"stream": "Successfully tagged docker.io/offline-test/manual:1\n"},
    {"stream": "a4c2ac51a0c549e879f8dad466479daab39626e694fbfb278f159349cabd7669\n"},
    {"aux": {"ID": IMAGE_ID}},
    {"stream": "Successfully built a4c2ac51a0c5\n"},
]
# Recorded from podman 4.3: a RUN step that exits non-zero.
PODMAN_BUILD_FAILED: list[dict[str, Any]] = [
    {"stream": "STEP 1/2: FROM localhost/offline-test-base:manual\n"},
    {"stream": "STEP 2/2: RUN echo step-one && false\n"},
    {"stream": "step-one\n"},
    {
        "errorDetail": {
            "message": 'building at STEP "RUN echo step-one && false": while running runtime: exit status 1\n'
        },
        "error": 'building at STEP "RUN echo step-one && false": while running runtime: exit status 1\n',
    },
]


def amd64(**extra: Any) -> dict[str, Any]:
    return {"Id": IMAGE_ID, "Os": "linux", "Architecture": "amd64", "RepoDigests": [], **extra}


@dataclass
class FakeDaemon:
    """Docker Engine API on a unix socket: canned streams, a table of images, and a log of what it was asked."""

    socket_path: Path
    build_events: list[dict[str, Any]] = field(default_factory=lambda: list(PODMAN_BUILD_OK))
    push_events: list[dict[str, Any]] = field(default_factory=list)
    images: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, dict[str, list[str]], dict[str, str]]] = field(default_factory=list)
    server: socketserver.ThreadingUnixStreamServer | None = None

    def stop(self) -> None:
        """The daemon dies: no more connections (each response closed its own, so none lingers)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.socket_path.unlink(missing_ok=True)

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket_path}"

    def calls_to(self, method: str, pattern: str) -> list[tuple[dict[str, list[str]], dict[str, str]]]:
        return [(q, h) for m, p, q, h in self.calls if m == method and re.fullmatch(pattern, p)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    daemon: FakeDaemon  # set on a subclass per fake

    def log_message(self, format: str, *args: Any) -> None:  # quiet (and unix sockets have no address)
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _json(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, events: list[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            data = (json.dumps(event) + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")

    def end_headers(self) -> None:
        # One request per connection, so a stopped fake leaves no kept-alive connection answering.
        self.send_header("Connection", "close")
        self.close_connection = True
        super().end_headers()

    def _route(self, method: str) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        path = re.sub(r"^/v[0-9.]+(?=/)", "", parsed.path)
        query = urllib.parse.parse_qs(parsed.query)
        self._body()
        self.daemon.calls.append((method, path, query, dict(self.headers.items())))
        image = re.fullmatch(r"/images/(.+)/(json|tag|push)", path)
        if method == "GET" and path == "/_ping":
            body = b"OK"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif method == "GET" and path == "/version":
            self._json(200, {"ApiVersion": "1.41", "Version": "4.3.1", "Os": "linux", "Arch": "amd64"})
        elif method == "POST" and path == "/build":
            self._stream(self.daemon.build_events)
        elif image and image.group(2) == "json" and method == "GET":
            name = urllib.parse.unquote(image.group(1))
            if name in self.daemon.images:
                self._json(200, self.daemon.images[name])
            else:
                self._json(404, {"message": f"failed to find image {name}: No such image"})
        elif image and image.group(2) == "tag" and method == "POST":
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif image and image.group(2) == "push" and method == "POST":
            self._stream(self.daemon.push_events)
        else:
            self._json(404, {"message": f"page not found: {method} {path}"})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    daemon = FakeDaemon(tmp_path / "docker.sock")
    handler = type("Handler", (_Handler,), {"daemon": daemon})
    server = socketserver.ThreadingUnixStreamServer(str(daemon.socket_path), handler)
    server.daemon_threads = True
    daemon.server = server
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        thread.join(5)


@pytest.fixture
def engine(fake_daemon: FakeDaemon) -> Iterator[DockerEngine]:
    engine = DockerEngine.from_env({"DOCKER_HOST": fake_daemon.docker_host}, timeout=10)
    yield engine
    engine.close()


@pytest.fixture
def build_context(tmp_path: Path) -> Path:
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY server.pyz /app/\n")
    (context / "server.pyz").write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    return context


def unavailable(env: dict[str, str]) -> DeployError:
    with pytest.raises(DeployError) as caught:
        DockerEngine.from_env(env, timeout=5).ping()
    assert caught.value.code == DAEMON_UNAVAILABLE
    assert "cannot connect to the container daemon" in caught.value.message
    assert "DOCKER_HOST" in caught.value.hint and "podman" in caught.value.hint
    return caught.value


# -- connecting --------------------------------------------------------------------------------------------------


def test_ping_where_no_socket_exists_is_daemon_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "docker.sock"
    error = unavailable({"DOCKER_HOST": f"unix://{path}"})
    assert str(path) in error.message
    assert error.context == {"docker_host": f"unix://{path}"}


def test_ping_where_nothing_listens_on_the_socket_is_daemon_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))  # the file exists, but nobody accepts: ECONNREFUSED
        error = unavailable({"DOCKER_HOST": f"unix://{path}"})
    assert str(path) in error.message


def test_ping_on_a_closed_tcp_port_is_daemon_unavailable() -> None:
    port = free_port()
    error = unavailable({"DOCKER_HOST": f"tcp://127.0.0.1:{port}"})
    assert f"127.0.0.1:{port}" in error.message


def test_invalid_docker_host_is_named() -> None:
    error = unavailable({"DOCKER_HOST": "bogus://nowhere"})
    assert "bogus://nowhere" in error.message


def test_credentials_in_docker_host_are_not_shown() -> None:
    port = free_port()
    error = unavailable({"DOCKER_HOST": f"tcp://admin:hunter2@127.0.0.1:{port}"})
    assert "hunter2" not in str(error) and "hunter2" not in repr(error.context)


def test_daemon_that_went_away_is_daemon_unavailable(fake_daemon: FakeDaemon, engine: DockerEngine) -> None:
    engine.ping()
    fake_daemon.stop()
    with pytest.raises(DeployError) as caught:
        engine.ping()
    assert caught.value.code == DAEMON_UNAVAILABLE


def test_missing_docker_sdk_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # `import docker` now raises ImportError
    with pytest.raises(DeployError) as caught:
        DockerEngine.from_env({}).ping()
    assert caught.value.code == DAEMON_UNAVAILABLE
    assert "`docker` is not installed" in caught.value.message
    assert "pip install" in caught.value.hint


def test_importing_the_module_does_not_import_the_sdk() -> None:
    code = "import sys, platform_adapters.container_engine; print('docker' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


# -- build -------------------------------------------------------------------------------------------------------


def test_build_streams_lines_and_returns_the_image_id(
    fake_daemon: FakeDaemon, engine: DockerEngine, build_context: Path
) -> None:
    fake_daemon.images["app:1"] = amd64()
    lines: list[str] = []
    image_id = engine.build(build_context, "app:1", build_args={"BASE_IMAGE": "base:1"}, log=lines.append)
    assert image_id == IMAGE_ID
    assert lines[:3] == [
        "STEP 1/3: FROM localhost/offline-test-base:manual",
        "STEP 2/3: RUN python3 -c \"print('hello from build')\"",
        "hello from build",
    ]
    assert lines[-1] == "Successfully built a4c2ac51a0c5"
    [(query, _)] = fake_daemon.calls_to("POST", "/build")
    assert query["t"] == ["app:1"]
    assert query["platform"] == ["linux/amd64"]
    assert json.loads(query["buildargs"][0]) == {"BASE_IMAGE": "base:1"}


def test_build_without_an_aux_record_asks_for_the_id(
    fake_daemon: FakeDaemon, engine: DockerEngine, build_context: Path
) -> None:
    fake_daemon.build_events = [e for e in PODMAN_BUILD_OK if "aux" not in e]
    fake_daemon.images["app:1"] = amd64(Id="sha256:" + "b" * 64)
    assert engine.build(build_context, "app:1") == "sha256:" + "b" * 64


def test_failed_step_is_build_failed_with_the_last_lines(
    fake_daemon: FakeDaemon, engine: DockerEngine, build_context: Path
) -> None:
    fake_daemon.build_events = PODMAN_BUILD_FAILED
    lines: list[str] = []
    with pytest.raises(DeployError) as caught:
        engine.build(build_context, "app:1", log=lines.append)
    error = caught.value
    assert error.code == BUILD_FAILED
    assert "the image build of app:1 failed" in error.message
    assert "exit status 1" in error.message
    assert error.message.endswith("  STEP 2/2: RUN echo step-one && false\n  step-one")
    assert error.context is not None and error.context["log_tail"][-1] == "step-one"
    assert lines[-1].startswith('building at STEP "RUN echo step-one && false"')  # the error was streamed too


def test_only_the_last_lines_are_quoted(
    fake_daemon: FakeDaemon, engine: DockerEngine, build_context: Path
) -> None:
    fake_daemon.build_events = [{"stream": f"line {i}\n"} for i in range(100)] + [{"error": "boom"}]
    with pytest.raises(DeployError) as caught:
        engine.build(build_context, "app:1")
    assert "line 99" in caught.value.message
    assert "line 74" not in caught.value.message and "line 75" in caught.value.message


def test_build_of_another_platform_is_wrong_architecture(
    fake_daemon: FakeDaemon, engine: DockerEngine, build_context: Path
) -> None:
    fake_daemon.images["app:1"] = amd64(Architecture="arm64")
    with pytest.raises(DeployError) as caught:
        engine.build(build_context, "app:1")
    assert caught.value.code == WRONG_ARCHITECTURE
    assert "image does not provide linux/amd64 platform" in caught.value.message
    assert "linux/arm64" in caught.value.message
    # What to do next: build for amd64 through emulation, then retry.
    assert caught.value.hint.startswith("Rebuild for linux/amd64: on an ARM machine enable amd64 emulation")
    assert "qemu-user-static" in caught.value.hint and caught.value.hint.endswith("then retry.")


def test_missing_dockerfile_is_build_failed_before_connecting(tmp_path: Path) -> None:
    nowhere = DockerEngine.from_env({"DOCKER_HOST": f"unix://{tmp_path / 'none.sock'}"})
    with pytest.raises(DeployError) as caught:
        nowhere.build(tmp_path, "app:1")
    assert caught.value.code == BUILD_FAILED
    assert str(tmp_path / "Dockerfile") in caught.value.message


# -- inspect, tag ------------------------------------------------------------------------------------------------


def test_image_platform_reads_os_and_architecture(fake_daemon: FakeDaemon, engine: DockerEngine) -> None:
    fake_daemon.images["app:1"] = amd64()
    fake_daemon.images["arm:1"] = amd64(Architecture="arm64")
    assert engine.image_platform("app:1") == "linux/amd64"
    assert engine.image_platform("arm:1") == "linux/arm64"
    require_platform(engine, "app:1")


def test_image_platform_of_a_missing_image_names_it(engine: DockerEngine) -> None:
    with pytest.raises(DeployError) as caught:
        engine.image_platform("ghost:7")
    assert caught.value.code == BUILD_FAILED
    assert "ghost:7" in caught.value.message


def test_tag_splits_registry_port_from_tag(fake_daemon: FakeDaemon, engine: DockerEngine) -> None:
    engine.tag("app:1", "123.dkr.ecr.example:5000/team/app:v2")
    [(query, _)] = fake_daemon.calls_to("POST", "/images/app:1/tag")
    assert (query["repo"], query["tag"]) == (["123.dkr.ecr.example:5000/team/app"], ["v2"])


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("app", ("app", "latest")),
        ("app:v1", ("app", "v1")),
        ("localhost:5000/app", ("localhost:5000/app", "latest")),
        ("localhost:5000/team/app:v1", ("localhost:5000/team/app", "v1")),
    ],
)
def test_split_reference(reference: str, expected: tuple[str, str]) -> None:
    assert split_reference(reference) == expected


def test_digest_references_cannot_be_tagged_or_pushed() -> None:
    with pytest.raises(DeployError):
        split_reference("app@sha256:" + "0" * 64)


# -- push --------------------------------------------------------------------------------------------------------


def test_push_returns_podmans_status_digest_and_sends_credentials(
    fake_daemon: FakeDaemon, engine: DockerEngine
) -> None:
    lines: list[str] = []
    engine = DockerEngine.from_env({"DOCKER_HOST": fake_daemon.docker_host}, log=lines.append, timeout=10)
    fake_daemon.push_events = [
        {"status": "The push refers to repository [registry.example/app:v1]"},
        {"status": f"v1: digest: {PUSHED} size: 738"},
    ]
    assert engine.push("registry.example/app:v1", username="AWS", password="s3cr3t-t0ken") == PUSHED
    [(query, headers)] = fake_daemon.calls_to("POST", "/images/registry.example/app/push")
    assert query["tag"] == ["v1"]
    auth = json.loads(base64.urlsafe_b64decode(headers["X-Registry-Auth"]))
    assert (auth["username"], auth["password"]) == ("AWS", "s3cr3t-t0ken")
    assert lines == [e["status"] for e in fake_daemon.push_events]


def test_push_returns_dockers_aux_digest(fake_daemon: FakeDaemon, engine: DockerEngine) -> None:
    fake_daemon.push_events = [
        {"status": "Pushed", "progressDetail": {}, "id": "5f70bf18a086"},
        {"progressDetail": {}, "aux": {"Tag": "v1", "Digest": PUSHED, "Size": 528}},
    ]
    assert engine.push("registry.example/app:v1") == PUSHED


def test_refused_credentials_are_not_authenticated_and_never_shown(
    fake_daemon: FakeDaemon, engine: DockerEngine
) -> None:
    # podman's words, with the password echoed back to prove it is scrubbed whatever the daemon says.
    message = (
        "trying to reuse blob sha256:34ab at destination: checking whether a blob exists in "
        "registry.example/app: unauthorized: authentication required (password s3cr3t-t0ken)"
    )
    fake_daemon.push_events = [
        {"status": "The push refers to repository [registry.example/app:v1]"},
        {"errorDetail": {"message": message}, "error": message},
    ]
    with pytest.raises(DeployError) as caught:
        engine.push("registry.example/app:v1", username="AWS", password="s3cr3t-t0ken")
    error = caught.value
    assert error.code == NOT_AUTHENTICATED
    assert "cloud CLI is not authenticated" in error.message
    assert "s3cr3t-t0ken" not in str(error) and "s3cr3t-t0ken" not in repr(error.context)


def test_other_push_failures_are_platform_errors(fake_daemon: FakeDaemon, engine: DockerEngine) -> None:
    message = (
        'pinging container registry registry.example: Get "https://registry.example/v2/": connection refused'
    )
    fake_daemon.push_events = [{"errorDetail": {"message": message}, "error": message}]
    with pytest.raises(DeployError) as caught:
        engine.push("registry.example/app:v1")
    assert caught.value.code == PLATFORM_ERROR
    assert "registry.example/app:v1" in caught.value.message and "connection refused" in caught.value.message


def test_push_without_a_streamed_digest_uses_repo_digests(
    fake_daemon: FakeDaemon, engine: DockerEngine
) -> None:
    fake_daemon.push_events = [{"status": "Pushed"}]
    fake_daemon.images["registry.example/app:v1"] = amd64(
        RepoDigests=[f"other.example/app@sha256:{'c' * 64}", f"registry.example/app@{PUSHED}"]
    )
    assert engine.push("registry.example/app:v1") == PUSHED


def test_push_with_no_digest_at_all_is_a_platform_error(
    fake_daemon: FakeDaemon, engine: DockerEngine
) -> None:
    fake_daemon.push_events = [{"status": "Pushed"}]
    fake_daemon.images["registry.example/app:v1"] = amd64()
    with pytest.raises(DeployError) as caught:
        engine.push("registry.example/app:v1")
    assert caught.value.code == PLATFORM_ERROR
    assert "no digest" in caught.value.message
