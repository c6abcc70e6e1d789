"""`offline dev` as a user runs it: a real `offline dev` process serving a project's server.py (or the built-in
demo) on SQLite, printing its URLs, syncing real clients, and restarting when server.py changes."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from offline import create_app
from offline.core.schema import SchemaDefinition
from offline.store import App
from tests.support.servers import schema_from_source

ROOT = Path(__file__).resolve().parents[2]
FAST = {"backoff_initial": 0.05, "backoff_max": 0.4, "ack_timeout": 2.0, "handshake_timeout": 10.0}

SERVER_SOURCE = """
from offline import define_schema, t

schema = define_schema({"version": 1, "collections": {"notes": {"fields": {"body": t.string()}}}})
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def health(base: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(base + "/health", timeout=1) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result
    except (OSError, urllib.error.URLError):
        return None


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


class Lines:
    """A text stream read by a background thread; ``wait`` finds a line, ``text`` is everything so far."""

    def __init__(self, stream: Any) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for line in iter(stream.readline, ""):
            self.queue.put(line)

    def _drain(self, timeout: float) -> bool:
        try:
            self.seen.append(self.queue.get(timeout=timeout))
            return True
        except queue.Empty:
            return False

    def wait(self, needle: str, timeout: float = 30.0, start: int = 0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.seen[start:]:
                if needle in line:
                    return line
            start = len(self.seen)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._drain(remaining):
                raise AssertionError(f"no line with {needle!r} within {timeout} s; saw {self.seen}")

    @property
    def text(self) -> str:
        while self._drain(0):
            pass
        return "".join(self.seen)


@dataclass
class Dev:
    proc: subprocess.Popen[str]
    base: str
    out: Lines
    err: Lines

    def wait_healthy(self, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"offline dev exited: {self.err.text}"
            answer = health(self.base)
            if answer is not None:
                return answer
            time.sleep(0.05)
        raise AssertionError(f"no /health within {timeout} s; stderr: {self.err.text}")


@pytest.fixture
def dev_process() -> Iterator[Any]:
    started: list[subprocess.Popen[str]] = []

    def start(project: Path, *extra: str, port: int | None = None) -> Dev:
        port = port or free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("OFFLINE_") and k not in ("DATABASE_URL", "PORT")
        }
        env["PYTHONPATH"] = str(ROOT)
        proc = subprocess.Popen(
            [sys.executable, "-m", "offline_cli", "dev", str(project), "--port", str(port), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(project),
        )
        started.append(proc)
        assert proc.stdout is not None and proc.stderr is not None
        return Dev(proc, f"http://127.0.0.1:{port}", Lines(proc.stdout), Lines(proc.stderr))

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # dev stops its server child on the way out
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


async def write_and_read(
    url: str, schema: SchemaDefinition, folder: Path, name: str, data: dict[str, Any]
) -> list[Any]:
    """A writer client syncs one record; a fresh reader client then syncs everything; returns its records."""
    collection = next(iter(schema.collections))
    writer = create_app(schema, sync={"url": url, **FAST}, path=str(folder / f"{name}-writer.db"))
    reader = create_app(schema, sync={"url": url, **FAST}, path=str(folder / f"{name}-reader.db"))
    try:
        await writer.sync.connect()
        writer.collection(collection).insert(data)
        await writer.sync.wait_until_synced(20)
        await reader.sync.connect()
        await reader.sync.wait_until_synced(20)
        deadline = time.monotonic() + 20
        while not any(all(r.get(k) == v for k, v in data.items()) for r in records(reader, collection)):
            assert time.monotonic() < deadline, f"{data} never reached the reader"
            await asyncio.sleep(0.02)
        return records(reader, collection)
    finally:
        for app in (writer, reader):
            await app.sync.disconnect()
            app.close()


def records(app: App, collection: str) -> list[dict[str, Any]]:
    return list(app.collection(collection).all().fetch())


def test_dev_serves_server_py_and_restarts_when_it_changes(tmp_path: Path, dev_process: Any) -> None:
    project = tmp_path / "project"
    project.mkdir()
    entry = project / "server.py"
    entry.write_text(SERVER_SOURCE)
    schema = schema_from_source(SERVER_SOURCE)
    dev: Dev = dev_process(project, "--exit-after", "90")
    dev.wait_healthy()
    port = dev.base.rsplit(":", 1)[1]

    # The URLs a developer needs, on stdout.
    assert dev.out.wait("app:").split() == ["app:", dev.base]
    assert dev.out.wait("sync:").split() == ["sync:", f"ws://127.0.0.1:{port}/offline-sync"]
    assert dev.out.wait("dashboard:").split() == ["dashboard:", f"{dev.base}/__offline"]
    assert dev.out.wait("health:").split() == ["health:", f"{dev.base}/health"]
    assert "server.py" in dev.err.wait("serving") and "watching for changes" in dev.err.wait("serving")

    sync = f"ws://127.0.0.1:{port}/offline-sync"
    seen = asyncio.run(write_and_read(sync, schema, tmp_path, "first", {"body": "before the edit"}))
    assert [r["body"] for r in seen] == ["before the edit"]
    status = get_json(dev.base + "/__offline/status")  # no tokens in development: open
    assert status["store"] == "sqlite" and status["records"] == {"notes": 1}
    assert (project / "offline-server.db").is_file()  # the project's own SQLite file by default

    # A broken edit: dev says so and keeps watching; fixing it brings the server back.
    mark = len(dev.err.seen)
    entry.write_text(SERVER_SOURCE + "\ndef broken(:\n")
    dev.err.wait("change detected", start=mark)
    dev.err.wait("SyntaxError", start=mark)  # the developer sees what is wrong ...
    dev.err.wait("failed to start", start=mark)  # ... and that dev waits for the next save
    assert dev.proc.poll() is None
    assert health(dev.base) is None

    mark = len(dev.err.seen)
    fixed_at = time.monotonic()
    entry.write_text(SERVER_SOURCE + "\n# edited\n")
    dev.err.wait("change detected", start=mark)
    assert dev.base in dev.err.wait("server restarted", start=mark)
    after = dev.wait_healthy()
    assert after["uptime"] <= time.monotonic() - fixed_at + 0.5  # a server process started after the fix

    # The restarted server kept its data (SQLite) and syncs.
    seen = asyncio.run(write_and_read(sync, schema, tmp_path, "second", {"body": "after the edit"}))
    assert sorted(r["body"] for r in seen) == ["after the edit", "before the edit"]

    # Ctrl-C stops dev and its server.
    dev.proc.send_signal(signal.SIGINT)
    assert dev.proc.wait(15) == 0
    assert health(dev.base) is None
    assert "Traceback" not in "".join(dev.err.seen[mark:])


def test_dev_without_server_py_serves_the_demo_schema(tmp_path: Path, dev_process: Any) -> None:
    from offline_cli.demo_server import schema as demo

    dev: Dev = dev_process(tmp_path, "--exit-after", "3")
    dev.wait_healthy()
    assert "demo" in dev.err.wait("no server.py")
    port = dev.base.rsplit(":", 1)[1]
    seen = asyncio.run(
        write_and_read(f"ws://127.0.0.1:{port}/offline-sync", demo, tmp_path, "demo", {"title": "demo todo"})
    )
    assert [r["title"] for r in seen] == ["demo todo"]
    status = get_json(dev.base + "/__offline/status")
    assert status["records"] == {"todos": 1}
    # --exit-after: it stops on its own, server included.
    assert dev.proc.wait(20) == 0
    assert health(dev.base) is None
    assert not (tmp_path / "server.py").exists()


def test_dev_tells_its_server_it_is_in_development(tmp_path: Path, dev_process: Any) -> None:
    """The server dev starts gets OFFLINE_DEV=1 (its console email sender then prints whole messages, links
    included); dev's own environment has no OFFLINE_ variable (the fixture drops them)."""
    recorder = (
        "import json, os, pathlib\n"
        "pathlib.Path(f'env-{os.getpid()}.json').write_text(json.dumps(dict(os.environ)))\n"
    )
    (tmp_path / "server.py").write_text(recorder + SERVER_SOURCE)
    dev: Dev = dev_process(tmp_path)
    dev.wait_healthy()
    server_pids = server_children(dev.proc.pid)
    seen = {int(f.stem.split("-")[1]): json.loads(f.read_text()) for f in tmp_path.glob("env-*.json")}
    served = [env for pid, env in seen.items() if pid in server_pids]
    assert served, (server_pids, list(seen))
    assert all(env["OFFLINE_DEV"] == "1" for env in served)


def test_dev_on_a_busy_port_says_so(tmp_path: Path, dev_process: Any) -> None:
    (tmp_path / "server.py").write_text(SERVER_SOURCE)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        started = time.monotonic()
        dev: Dev = dev_process(tmp_path, "--exit-after", "5", port=port)
        assert dev.proc.wait(30) == 1
        assert time.monotonic() - started < 10  # it says so at once, not after a start timeout
    message = dev.err.text
    assert f"port {port}" in message and "not available" in message and "--port" in message
    assert dev.out.text == ""


def server_children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux's /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"  # a zombie has exited already


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_dev_and_its_server(
    tmp_path: Path, dev_process: Any, signum: signal.Signals
) -> None:
    """A process manager's SIGTERM (or a closed terminal's SIGHUP) must not leave the server child running."""
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        reason = "needs Linux's /proc/<pid>/task/<pid>/children to find the server process"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    (tmp_path / "server.py").write_text(SERVER_SOURCE)
    dev: Dev = dev_process(tmp_path, "--exit-after", "90")
    dev.wait_healthy()
    children = server_children(dev.proc.pid)
    assert len(children) == 1, children
    server = children[0]
    try:
        dev.proc.send_signal(signum)
        assert dev.proc.wait(20) == 0, dev.err.text
        assert not alive(server), f"the server process {server} outlived offline dev"
        assert health(dev.base) is None
        assert "Traceback" not in dev.err.text
    finally:
        if alive(server):
            os.kill(server, signal.SIGKILL)


def http_get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers.get("content-type", ""), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("content-type", ""), error.read().decode()


def test_dev_serves_the_built_client_from_dist_with_spa_fallback(tmp_path: Path, dev_process: Any) -> None:
    project = tmp_path / "project"
    (project / "dist" / "assets").mkdir(parents=True)
    (project / "server.py").write_text(SERVER_SOURCE)
    index = "<!doctype html><title>notes</title><div id=app data-built=dist-index></div>\n"
    (project / "dist" / "index.html").write_text(index)
    (project / "dist" / "assets" / "app.js").write_text("console.log('built client')\n")
    dev: Dev = dev_process(project, "--exit-after", "60")
    dev.wait_healthy()

    code, kind, body = http_get(dev.base + "/")
    assert (code, body) == (200, index) and kind.startswith("text/html")
    assert http_get(dev.base + "/assets/app.js")[::2] == (200, "console.log('built client')\n")
    # A client-side route the app handles itself gets the app shell; a missing asset stays a 404.
    for route in ("/notes", "/notes/42/edit"):
        assert http_get(dev.base + route)[::2] == (200, index), route
    assert http_get(dev.base + "/assets/missing.js")[0] == 404
    # The server's own routes still answer ahead of the fallback.
    code, kind, body = http_get(dev.base + "/health")
    assert code == 200 and kind.startswith("application/json") and json.loads(body)["status"] == "ok"
    assert get_json(dev.base + "/__offline/status")["store"] == "sqlite"
    assert dev.proc.poll() is None
