"""`offline deploy`'s image, for real: build the generated `.offline/deploy/` with the real engine through
DockerEngine, run it, and sync two Python clients through the server inside the container (issue 7).

The project is a copy of examples/todo. The base image is the local Debian + CPython 3.11 image of
``conftest.base_image`` (python3 only, no `python` command), passed as the Dockerfile's BASE_IMAGE build
argument (no registry is reachable). The container gets no store settings, so the server uses the SQLite file
the Dockerfile points at, in /data, where a fresh root-owned folder is mounted the way Fly.io and Railway mount
their volumes: the image must hand it to its unprivileged user and run the server as that user.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import shutil
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import create_app
from offline.core.schema import SchemaDefinition
from offline.store import App
from offline_cli.deploy.templates import CONTAINER_UID
from platform_adapters.container_engine import DockerEngine
from tests.e2e.conftest import Engine
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TODO_EXAMPLE = ROOT / "examples" / "todo"
TIMEOUT = 60.0
# Reconnect fast: the first connection may race the server's start.
FAST = {"backoff_initial": 0.05, "backoff_max": 0.5, "ack_timeout": 5.0, "handshake_timeout": 15.0}


def load_schema(path: Path) -> SchemaDefinition:
    spec = importlib.util.spec_from_file_location(f"e2e_schema_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    schema = module.schema
    assert isinstance(schema, SchemaDefinition)
    return schema


@pytest.fixture
def todo_project(tmp_path: Path) -> Path:
    project = tmp_path / "todo"
    project.mkdir()
    for name in ("schema.py", "server.py"):
        shutil.copy(TODO_EXAMPLE / name, project / name)
    return project


@pytest.fixture
def image_tag(container_engine: Engine) -> Iterator[str]:
    """A unique name for the test's image, removed afterwards (the base image's layers stay cached)."""
    tag = f"localhost/offline-e2e-todo:{uuid.uuid4().hex[:12]}"
    yield tag
    with contextlib.suppress(Exception):
        container_engine.client.api.remove_image(tag, force=True)


@contextlib.contextmanager
def running_container(
    engine: Engine, image: str, container_port: int, host_port: int, volumes: dict[str, Any] | None = None
) -> Iterator[Any]:
    container = engine.client.containers.run(
        image,
        detach=True,
        name=f"offline-e2e-{uuid.uuid4().hex[:12]}",
        ports={f"{container_port}/tcp": ("127.0.0.1", host_port)},
        volumes=volumes or {},
    )
    try:
        yield container
    finally:
        with contextlib.suppress(Exception):
            container.stop(timeout=10)
        container.remove(force=True)


def wait_for_health(container: Any, url: str, timeout: float = 120.0) -> dict[str, Any]:
    """GET /health until it answers 200; fail with the container's log when it exits or never answers."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        container.reload()
        if container.status in ("exited", "dead"):
            pytest.fail(f"the container exited ({container.status}):\n{container.logs().decode()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    body: dict[str, Any] = json.loads(response.read() or b"{}")
                    return body
        except OSError as exc:
            last = exc
        time.sleep(0.25)
    pytest.fail(f"{url} did not answer in {timeout} s ({last}):\n{container.logs().decode()[-4000:]}")


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        await asyncio.sleep(0.05)


def process_ids(container: Any) -> dict[str, list[int]]:
    """Uid, Gid and Groups of the container's PID 1 (the server), from /proc/1/status."""
    done = container.exec_run(["cat", "/proc/1/status"])
    assert done.exit_code == 0, done.output
    ids: dict[str, list[int]] = {}
    for line in done.output.decode().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            ids[key] = [int(item) for item in value.split()]
    return ids


def snapshot(app: App) -> dict[str, list[dict[str, Any]]]:
    return {
        name: sorted(app.collection(name).all().fetch(), key=lambda r: str(r["id"]))
        for name in app.schema.collections
    }


def test_generated_image_builds_runs_and_syncs_two_clients(
    container_engine: Engine, base_image: str, todo_project: Path, image_tag: str, tmp_path: Path
) -> None:
    from offline_cli.deploy.build_context import prepare_build_context

    deploy_dir = prepare_build_context(todo_project)
    assert deploy_dir == todo_project.resolve() / ".offline" / "deploy"
    assert (deploy_dir / "server.pyz").is_file()
    assert "ARG BASE_IMAGE" in (deploy_dir / "Dockerfile").read_text()

    build_log: list[str] = []
    engine = DockerEngine.from_env(container_engine.env, log=build_log.append)
    try:
        engine.ping()
        image_id = engine.build(deploy_dir, image_tag, build_args={"BASE_IMAGE": base_image})
        assert image_id.startswith("sha256:")
        assert engine.image_platform(image_tag) == "linux/amd64"
    finally:
        engine.close()
    assert any(base_image in line for line in build_log), build_log[:5]  # FROM took the build argument

    # One port everywhere: what the image exposes is what the server listens on (PORT).
    config = container_engine.client.api.inspect_image(image_tag)["Config"]
    exposed = [int(key.split("/")[0]) for key in config.get("ExposedPorts") or {}]
    environment = dict(item.split("=", 1) for item in config.get("Env") or [])
    assert exposed == [int(environment["PORT"])]
    assert "OFFLINE_SERVER_STORE" not in environment  # SQLite, the store a real deploy gets by default

    # A fresh volume as Fly.io and Railway mount one: an empty folder owned by root, writable only by root.
    database = Path(environment["OFFLINE_SERVER_DB"])
    volume = tmp_path / "volume"
    volume.mkdir(mode=0o755)
    assert (volume.stat().st_uid, volume.stat().st_gid) == (0, 0)
    mounts = {str(volume): {"bind": str(database.parent), "mode": "rw"}}

    host_port = free_port()
    with running_container(container_engine, image_tag, exposed[0], host_port, mounts) as container:
        health = wait_for_health(container, f"http://127.0.0.1:{host_port}/health")
        assert health["status"] == "ok", health
        # The server runs as the unprivileged user, with no group of root's left.
        ids = process_ids(container)
        assert ids["Uid"] == [CONTAINER_UID] * 4 and ids["Gid"] == [CONTAINER_UID] * 4, ids
        assert ids["Groups"] == [], ids
        # The base image has python3 only: CMD and HEALTHCHECK must not need a `python` command.
        assert container.exec_run(["sh", "-c", "command -v python"]).exit_code != 0
        asyncio.run(sync_two_clients(todo_project / "schema.py", host_port, tmp_path))
        # The operations live in the SQLite file the Dockerfile names, on the mounted volume, and the file and
        # the folder now belong to the server's user.
        stored = volume / database.name
        assert stored.is_file() and stored.stat().st_size > 0
        assert (stored.stat().st_uid, stored.stat().st_gid) == (CONTAINER_UID, CONTAINER_UID)
        assert (volume.stat().st_uid, volume.stat().st_gid) == (CONTAINER_UID, CONTAINER_UID)
        container.stop(timeout=10)
        container.reload()
        assert container.status == "exited"
        assert container.attrs["State"]["ExitCode"] == 0, container.logs().decode()[-2000:]
    remaining = container_engine.client.containers.list(all=True, filters={"id": container.id})
    assert remaining == []


async def sync_two_clients(schema_path: Path, port: int, folder: Path) -> None:
    schema = load_schema(schema_path)
    url = f"ws://127.0.0.1:{port}/offline-sync"
    scope = {"userId": "alice"}
    a = create_app(schema, sync={"url": url, "scope": scope, **FAST}, path=str(folder / "a.db"))
    b = create_app(schema, sync={"url": url, "scope": scope, **FAST}, path=str(folder / "b.db"))
    try:
        await a.sync.connect()
        await b.sync.connect()
        groceries = a.lists.insert({"name": "Groceries", "ownerId": "alice"})
        milk = a.todos.insert(
            {"title": "Milk", "ownerId": "alice", "listId": groceries["id"], "status": "open"}
        )
        bread = b.todos.insert({"title": "Bread", "ownerId": "alice", "status": "open"})

        await wait_for(lambda: b.todos.find_by_id(milk["id"]) is not None, "b receives a's todo")
        await wait_for(lambda: a.todos.find_by_id(bread["id"]) is not None, "a receives b's todo")
        # A later edit crosses too, and both end with the same records and nothing left to send.
        b.todos.update(milk["id"], {"status": "done"})
        await wait_for(lambda: (a.todos.find_by_id(milk["id"]) or {}).get("status") == "done", "a sees done")
        for app in (a, b):
            await app.sync.wait_until_synced(TIMEOUT)
        await wait_for(
            lambda: snapshot(a) == snapshot(b) and a.sync.pending == 0 and b.sync.pending == 0,
            "both clients hold the same records",
        )
        final = snapshot(a)
        assert {r["title"] for r in final["todos"]} == {"Milk", "Bread"}
        assert [r["name"] for r in final["lists"]] == ["Groceries"]
        assert b.lists.find_by_id(groceries["id"]) is not None
    finally:
        for app in (a, b):
            with contextlib.suppress(Exception):
                await app.sync.disconnect()
            app.close()
