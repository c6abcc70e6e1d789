"""Real server processes for integration tests: `python -m server_runtime <entry>` on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from offline.core.schema import SchemaDefinition

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """One server process. ``store``: 'memory', 'sqlite' (``db`` = file path) or 'postgres' (``db`` = URL)."""

    def __init__(
        self,
        entry: Path,
        *,
        store: str = "sqlite",
        db: str | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.entry = entry
        self.store = store
        self.db = db
        self.port = port or free_port()
        self.extra_env = env or {}
        self.log_path = log_path or entry.parent / f"server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def sync_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/offline-sync"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "OFFLINE_SERVER_DB")}
        env.update({"PORT": str(self.port), "HOST": "127.0.0.1", "PYTHONPATH": str(ROOT)})
        if self.store == "memory":
            env["OFFLINE_SERVER_STORE"] = "memory"
        elif self.store == "sqlite":
            env["OFFLINE_SERVER_DB"] = self.db or str(self.entry.parent / "server.db")
        elif self.store == "postgres":
            assert self.db, "postgres needs a connection URL"
            env["DATABASE_URL"] = self.db
        else:
            raise ValueError(self.store)
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 30.0) -> ServerProcess:
        """Start the process and wait until it answers /health. Already running: nothing to do (``with
        start_server(...) as server`` enters a started server; a second process on the same port would fail
        to listen, and the health check, answered by the first, raced that failure on a busy machine)."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the process's lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server_runtime", str(self.entry)],
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(self.entry.parent),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(self.http_url + "/health", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server did not become healthy in {timeout} s:\n{self.log_path.read_text()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.terminate()


def write_entry(folder: Path, schema_source: str) -> Path:
    """A server.py defining ``schema`` from the given Python source (which must assign ``schema``)."""
    entry = folder / "server.py"
    entry.write_text(schema_source)
    return entry


def schema_from_source(source: str) -> SchemaDefinition:
    """The ``schema`` an entry's Python source defines (what ``write_entry`` writes), for clients of it."""
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    schema = namespace["schema"]
    assert isinstance(schema, SchemaDefinition)
    return schema
