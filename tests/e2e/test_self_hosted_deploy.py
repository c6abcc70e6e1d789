"""`offline deploy --platform self-hosted-image`, for real: the whole command against podman's Docker-compatible
service (tests/e2e/conftest.py), with the real bundler, image build, engine API and health probe.

The project is a copy of examples/todo; the image is built FROM the session's local base image
(``OFFLINE_BASE_IMAGE``, passed as the Dockerfile's BASE_IMAGE: no registry is reachable). Every test removes
the containers, volumes, network and images of its app afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from offline import create_app
from offline_cli.deploy.prompts import ScriptedPrompter
from offline_cli.environment import Environment
from offline_cli.main import cli
from tests.e2e.conftest import Engine
from tests.e2e.test_container_deploy import FAST, TIMEOUT, load_schema, wait_for
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TODO_EXAMPLE = ROOT / "examples" / "todo"


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.stdout)
        return data


@dataclass
class Deployer:
    """Runs `offline deploy ...` in this process with ``env`` as the whole environment (no terminal)."""

    project: Path
    env: dict[str, str]
    app: str
    port: int
    runs: list[Run] = field(default_factory=list)

    def __call__(self, *args: str) -> Run:
        out, err = io.StringIO(), io.StringIO()
        environment = Environment(
            stdin=io.StringIO(),
            stdout=out,
            stderr=err,
            env=self.env,
            stdin_isatty=False,
            stdout_isatty=False,
            prompter=ScriptedPrompter(),
        )
        result = CliRunner().invoke(
            cli,
            ["deploy", *args, "--project-dir", str(self.project)],
            obj=environment,
            catch_exceptions=False,
        )
        run = Run(result.exit_code, out.getvalue(), err.getvalue())
        self.runs.append(run)
        return run

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def remove_stack(client: Any, app: str) -> None:
    """Everything the deploy made for ``app`` on the engine (containers, volumes, network, images)."""
    for container in client.containers.list(all=True, filters={"label": f"dev.offline.app={app}"}):
        with contextlib.suppress(Exception):
            container.remove(force=True)
    for name in (f"{app}-app", f"{app}-app-previous", f"{app}-postgres"):
        with contextlib.suppress(Exception):
            client.api.remove_container(name, force=True)
    for volume in (f"{app}_data", f"{app}_postgres"):
        with contextlib.suppress(Exception):
            client.api.remove_volume(volume, force=True)
    with contextlib.suppress(Exception):
        client.api.remove_network(f"{app}_default")
    for image in client.images.list():
        for tag in image.tags:
            if f"offline-{app}:" in tag:
                with contextlib.suppress(Exception):
                    client.api.remove_image(tag, force=True)


@pytest.fixture
def deployer(container_engine: Engine, base_image: str, tmp_path: Path) -> Iterator[Deployer]:
    project = tmp_path / "todo"
    project.mkdir()
    for name in ("schema.py", "server.py"):
        shutil.copy(TODO_EXAMPLE / name, project / name)
    app = f"sh-{uuid.uuid4().hex[:10]}"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path / "home"),
        "DOCKER_HOST": container_engine.docker_host,
        "OFFLINE_BASE_IMAGE": base_image,
        "OFFLINE_METRICS_TOKEN": "metrics-" + uuid.uuid4().hex,
    }
    runner = Deployer(project, env, app, free_port())
    try:
        yield runner
    finally:
        remove_stack(container_engine.client, app)


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/health", timeout=10) as response:
        assert response.status == 200
        body: dict[str, Any] = json.loads(response.read() or b"{}")
        return body


def files_holding(root: Path, value: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]


def admin_token_of(stderr: str) -> str:
    lines = stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Admin token"))
    return next(line.strip() for line in lines[at + 1 :] if line.strip() and not line.startswith("("))


async def write_and_read(schema_path: Path, url: str, folder: Path, title: str) -> set[str]:
    """A client writes a todo through the server; a second, fresh client receives it (and everything the
    server kept from before). Returns the titles the fresh client ends with."""
    schema = load_schema(schema_path)
    sync = {"url": url.replace("http://", "ws://") + "/offline-sync", "scope": {"userId": "alice"}, **FAST}
    writer = create_app(schema, sync=sync, path=str(folder / f"w-{uuid.uuid4().hex}.db"))
    reader = create_app(schema, sync=sync, path=str(folder / f"r-{uuid.uuid4().hex}.db"))
    try:
        await writer.sync.connect()
        todo = writer.todos.insert({"title": title, "ownerId": "alice", "status": "open"})
        await writer.sync.wait_until_synced(TIMEOUT)
        await reader.sync.connect()
        await wait_for(lambda: reader.todos.find_by_id(todo["id"]) is not None, f"the reader gets {title}")
        return {str(record["title"]) for record in reader.todos.all().fetch()}
    finally:
        for app in (writer, reader):
            with contextlib.suppress(Exception):
                await app.sync.disconnect()
            app.close()


def app_container(engine: Engine, app: str) -> Any:
    return engine.client.containers.get(f"{app}-app")


def test_deploy_runs_the_stack_locally_keeps_data_across_a_redeploy_and_rolls_back(
    deployer: Deployer, container_engine: Engine, tmp_path: Path
) -> None:
    first = deployer(
        "--platform",
        "self-hosted",
        "--app",
        deployer.app,
        "--publish",
        f"127.0.0.1:{deployer.port}",
        "--confirm",
        "--json",
    )
    assert first.exit_code == 0, first.stderr
    result = first.json()
    assert (result["platform"], result["state"], result["healthy"]) == ("self-hosted-image", "RUNNING", True)
    assert (
        result["url"] == deployer.url and result["sync_url"] == f"ws://127.0.0.1:{deployer.port}/offline-sync"
    )
    assert health(deployer.url)["status"] == "ok"
    token = admin_token_of(first.stderr)
    assert len(token) >= 40 and first.stderr.count(token) == 1

    # The stack as the engine holds it: compose's names and labels, the restart policy, the volume at /data,
    # the secrets in the container's environment only.
    container = app_container(container_engine, deployer.app)
    first_id, first_image = container.id, container.attrs["Config"]["Image"]
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    assert container.labels["com.docker.compose.project"] == deployer.app
    mounts = {m["Destination"]: m.get("Name") for m in container.attrs["Mounts"]}
    assert mounts["/data"] == f"{deployer.app}_data"
    environment = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert environment["OFFLINE_ADMIN_TOKEN"] == token
    assert environment["OFFLINE_METRICS_TOKEN"] == deployer.env["OFFLINE_METRICS_TOKEN"]

    compose = (deployer.project / ".offline/deploy/compose.yaml").read_text()
    example = (deployer.project / ".offline/deploy/.env.example").read_text()
    assert "${OFFLINE_ADMIN_TOKEN:?" in compose and f"offline-{deployer.app}:" in compose
    assert "OFFLINE_ADMIN_TOKEN=\n" in example and "OFFLINE_METRICS_TOKEN=\n" in example

    titles = asyncio.run(write_and_read(deployer.project / "schema.py", deployer.url, tmp_path, "before"))
    assert titles == {"before"}

    # A changed project: a new image replaces the container; the volume keeps the data.
    with open(deployer.project / "server.py", "a") as handle:
        handle.write("\n# second version\n")
    second = deployer("--confirm", "--json")
    assert second.exit_code == 0, second.stderr
    assert token not in second.stderr and "Admin token" not in second.stderr
    container = app_container(container_engine, deployer.app)
    assert container.id != first_id and container.attrs["Config"]["Image"] != first_image
    environment = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert environment["OFFLINE_ADMIN_TOKEN"] == token  # kept from the running container
    assert not container_engine.client.containers.list(
        all=True, filters={"name": f"{deployer.app}-app-previous"}
    )
    titles = asyncio.run(write_and_read(deployer.project / "schema.py", deployer.url, tmp_path, "after"))
    assert titles == {"before", "after"}

    status = deployer("status", "--json")
    assert status.exit_code == 0, status.stderr
    reported = status.json()
    assert (reported["state"], reported["healthy"], reported["admin_protected"]) == ("RUNNING", True, True)
    assert reported["deployment_id"] == second.json()["deployment_id"]
    logs = deployer("logs", "--lines", "20")
    assert logs.exit_code == 0 and logs.stdout.strip(), logs.stderr

    back = deployer("rollback", "--confirm", "--json")
    assert back.exit_code == 0, back.stderr
    assert back.json()["deployment_id"] == result["deployment_id"]
    container = app_container(container_engine, deployer.app)
    assert container.attrs["Config"]["Image"] == first_image
    titles = asyncio.run(
        write_and_read(deployer.project / "schema.py", deployer.url, tmp_path, "rolled back")
    )
    assert titles == {"before", "after", "rolled back"}

    # No secret value in a generated file, deploy.json, the logs of the runs, or anything printed after.
    for value in (token, deployer.env["OFFLINE_METRICS_TOKEN"]):
        assert files_holding(deployer.project, value) == []
        for run in deployer.runs[1:]:
            assert value not in run.stdout and value not in run.stderr
        assert value not in first.stdout
