"""A loopback fake of Railway's public GraphQL API (the part the Railway adapter calls: deploymentRollback).

A real HTTP server on 127.0.0.1 in a thread. It records every request (path, headers, parsed JSON body),
answers ``deploymentRollback(id)`` like Railway (``{"data": {"deploymentRollback": true}}``) and, when given
the fake CLI's world file, adds the rollback as a new deployment of the same service so that the next
``railway deployment list`` shows it. A wrong token gets GraphQL's ``Not Authorized`` error.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.deploy.fakes.railway import deployment

ROLLBACK_SCRIPT = ["DEPLOYING", "SUCCESS"]


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeRailwayApi:
    """Start with ``start()``, stop with ``stop()`` (the ``fake_railway_api`` fixture does both)."""

    world_path: Path | None = None
    #: accepted credentials: exact ``Authorization`` or ``Project-Access-Token`` header values
    accepted: set[str] = field(default_factory=lambda: {"Bearer test-api-token", "test-project-token"})
    requests: list[RecordedRequest] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/graphql/v2"

    def start(self) -> FakeRailwayApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = None
                api.requests.append(
                    RecordedRequest(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                status, answer = api.answer(self.headers, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-railway-api",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def answer(self, headers: Any, body: Any) -> tuple[int, dict[str, Any]]:
        credential = headers.get("Authorization") or headers.get("Project-Access-Token")
        if credential not in self.accepted:
            return 200, {"errors": [{"message": "Not Authorized"}], "data": None}
        if not isinstance(body, dict) or "deploymentRollback" not in str(body.get("query")):
            return 400, {"errors": [{"message": "fake API: only deploymentRollback is implemented"}]}
        target = str((body.get("variables") or {}).get("id"))
        if self.world_path is not None and not self._roll_back(target):
            return 200, {"errors": [{"message": "Deployment not found"}], "data": None}
        return 200, {"data": {"deploymentRollback": True}}

    def _roll_back(self, target: str) -> bool:
        assert self.world_path is not None
        world = json.loads(self.world_path.read_text())
        for deployments in world.get("deployments", {}).values():
            if any(item["id"] == target for item in deployments):
                number = int(world.get("counter", 0)) + 1
                world["counter"] = number
                deployments.insert(
                    0, deployment(f"dep-{number:04d}", ROLLBACK_SCRIPT[0], number, ROLLBACK_SCRIPT[1:])
                )
                self.world_path.write_text(json.dumps(world, indent=2, sort_keys=True))
                return True
        return False
