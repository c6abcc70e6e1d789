"""`offline status` and `offline logs` (SPEC 4.6) against a live server: output, token rules and the errors a
user meets (wrong token, nothing listening, a server that never answers)."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from offline.store import App
from offline_cli.commands import remote
from offline_cli.main import cli
from server_runtime import operational
from tests.server.test_operational import ADMIN, ALL_TOKENS, METRICS, TIMEOUT, LiveServer, client, shutdown

ROOT = Path(__file__).resolve().parents[2]
NO_TOKEN_ENV: dict[str, str | None] = {"OFFLINE_ADMIN_TOKEN": None}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with LiveServer(tmp_path_factory.mktemp("remote"), auth=ALL_TOKENS) as server:
        yield server


@pytest.fixture(autouse=True)
def forgive_wrong_tokens(request: pytest.FixtureRequest) -> None:
    """The module's tests share one server and several send wrong tokens on purpose: each starts without the
    failures of the ones before (the per-address limit has its own tests in tests/server)."""
    if "live" in request.fixturenames:
        live: LiveServer = request.getfixturevalue("live")
        assert live.server is not None
        live.server.operational.auth.attempts.reset("127.0.0.1")


@pytest.fixture(scope="module")
def connected(live: LiveServer) -> Iterator[App]:
    """One client that wrote a record and stays connected, plus a server log line."""

    async def start() -> App:
        app = client(live.folder, "cli-client", live.sync_url)
        await app.sync.connect()
        app.items.insert({"title": "from the client"})
        await app.sync.wait_until_synced(TIMEOUT)
        logging.getLogger("offline.server").warning("disk usage at 91%")
        return app

    app = live.call(start())
    yield app
    live.call(shutdown(app))


def offline(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env={**NO_TOKEN_ENV, **(env or {})})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- offline status --------------------------------------------------------------------------------------------------


def test_status_prints_a_table(live: LiveServer, connected: App) -> None:
    result = offline("status", "--url", live.url, "--token", ADMIN)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert f"offline server at {live.url}" in out
    for label in ("status", "version", "uptime", "store", "schema version", "connected clients", "records"):
        assert label in out, label
    assert "sqlite" in out and "items: 1" in out
    assert connected.node_id in out  # the clients table
    assert result.stderr == ""


def test_status_json_is_machine_readable(live: LiveServer, connected: App) -> None:
    result = offline("status", "--url", live.url + "/", "--token", ADMIN, "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "ok" and data["store"] == "sqlite"
    assert data["connectedClients"] == 1
    assert [c["nodeId"] for c in data["clients"]] == [connected.node_id]
    assert data["operations"]["stored"] == 1
    assert data["records"] == {"items": 1}


def test_status_token_defaults_to_the_environment(live: LiveServer, connected: App) -> None:
    result = offline("status", "--url", live.url, "--json", env={"OFFLINE_ADMIN_TOKEN": ADMIN})
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["connectedClients"] == 1
    # --token wins over the environment, both ways.
    result = offline(
        "status", "--url", live.url, "--json", "--token", ADMIN, env={"OFFLINE_ADMIN_TOKEN": "stale"}
    )
    assert result.exit_code == 0, result.stderr
    result = offline("status", "--url", live.url, "--token", "wrong", env={"OFFLINE_ADMIN_TOKEN": ADMIN})
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("token", "env"), [(None, {}), ("wrong", {}), (METRICS, {}), (None, {"OFFLINE_ADMIN_TOKEN": "stale"})]
)
def test_status_refused_token_is_a_clear_error(
    live: LiveServer, token: str | None, env: dict[str, str]
) -> None:
    args = ["status", "--url", live.url] + (["--token", token] if token else [])
    result = offline(*args, env=dict(env))
    assert result.exit_code == 1
    assert "401" in result.stderr and "OFFLINE_ADMIN_TOKEN" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["status", "logs"])
def test_nothing_listening_is_a_clear_error(command: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = offline(command, "--url", url, "--token", ADMIN)
    assert result.exit_code == 1
    assert "cannot connect" in result.stderr and url in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A local socket that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


@pytest.mark.parametrize("command", [["status"], ["logs", "--no-follow"]])
def test_a_server_that_never_answers_is_a_timeout_error(silent_server: str, command: list[str]) -> None:
    started = time.monotonic()
    result = offline(*command, "--url", silent_server, "--token", ADMIN, "--timeout", "0.5")
    assert time.monotonic() - started < 5
    assert result.exit_code == 1
    assert "did not answer within 0.5 s" in result.stderr and "--timeout" in result.stderr
    assert "Traceback" not in result.stderr


def test_following_a_server_that_never_answers_does_not_hang(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Following, silence is allowed for a while (the server sends a status event at least every 5 s), but a
    # server that never answers is an error, not a command that hangs forever.
    assert remote.FOLLOW_IDLE_TIMEOUT >= 3 * operational.STATUS_INTERVAL
    monkeypatch.setattr(remote, "FOLLOW_IDLE_TIMEOUT", 1.0)
    started = time.monotonic()
    result = offline("logs", "--url", silent_server, "--token", ADMIN, "--timeout", "0.5")
    assert 1.0 <= time.monotonic() - started < 6
    assert result.exit_code == 1
    assert "did not answer within 1 s" in result.stderr
    assert "Traceback" not in result.stderr


# -- offline logs ----------------------------------------------------------------------------------------------------


def test_logs_no_follow_prints_recent_lines_and_exits(live: LiveServer, connected: App) -> None:
    started = time.monotonic()
    result = offline("logs", "--url", live.url, "--no-follow", env={"OFFLINE_ADMIN_TOKEN": ADMIN})
    assert time.monotonic() - started < 5  # it does not wait for live events
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any("CLIENT" in line and connected.node_id in line and "connected" in line for line in lines), (
        lines
    )
    assert any("WARNING" in line and "offline.server: disk usage at 91%" in line for line in lines), lines
    assert all(line[:2].isdigit() and line[2] == ":" for line in lines)  # every line starts with a time


def test_logs_json_is_ndjson(live: LiveServer, connected: App) -> None:
    result = offline("logs", "--url", live.url, "--token", ADMIN, "--no-follow", "--json")
    assert result.exit_code == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events and all(isinstance(e["time"], float) for e in events)
    kinds = {e["event"] for e in events}
    assert {"connection", "log"} <= kinds
    assert "status" not in kinds and "ready" not in kinds  # stream bookkeeping is not a log line
    assert any(e["event"] == "connection" and e["nodeId"] == connected.node_id for e in events)
    assert any(e["event"] == "log" and e["message"] == "disk usage at 91%" for e in events)


def test_logs_refused_token_is_a_clear_error(live: LiveServer) -> None:
    result = offline("logs", "--url", live.url, "--token", "wrong", "--no-follow")
    assert result.exit_code == 1
    assert "401" in result.stderr and "Traceback" not in result.stderr


def _lines(stream: Any) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in iter(stream.readline, ""):
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_line(lines: queue.Queue[str], needle: str, timeout: float = 10.0) -> str:
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r} within {timeout} s; saw {seen}")


def test_logs_follow_streams_live_events(live: LiveServer, connected: App) -> None:
    assert live.server is not None
    hub = live.server.operational.hub
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLINE_")}
    env.update({"OFFLINE_ADMIN_TOKEN": ADMIN, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    before = len(hub.subscribers)
    proc = subprocess.Popen(
        [sys.executable, "-m", "offline_cli", "logs", "--url", live.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out = _lines(proc.stdout)
        _wait_line(out, "disk usage at 91%")  # recent history first
        deadline = time.monotonic() + 15
        while len(hub.subscribers) <= before:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "offline logs never subscribed"
            time.sleep(0.02)

        async def happen() -> App:
            logging.getLogger("offline.server").warning("live line %s", proc.pid)
            newcomer = client(live.folder, "newcomer", live.sync_url)
            await newcomer.sync.connect()
            newcomer.items.insert({"title": "live"})
            await newcomer.sync.wait_until_synced(TIMEOUT)
            return newcomer

        newcomer = live.call(happen())
        try:
            assert "WARNING" in _wait_line(out, f"live line {proc.pid}")
            assert "connected" in _wait_line(out, f"CLIENT  {newcomer.node_id}")
            assert "insert items/" in _wait_line(out, "OP      #2")
            assert proc.poll() is None  # still following
        finally:
            live.call(shutdown(newcomer))
        # Ctrl-C ends it quietly.
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
