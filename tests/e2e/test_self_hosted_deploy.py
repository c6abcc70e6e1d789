"""`offline deploy --platform self-hosted-image`, for real: the whole command against podman's Docker-compatible
service (tests/e2e/conftest.py), with the real bundler, image build, engine API and health probe.

The project is a copy of examples/todo; the image is built FROM the session's local base image
(``OFFLINE_BASE_IMAGE``, passed as the Dockerfile's BASE_IMAGE: no registry is reachable). Every test removes
the containers, volumes, network and images of its app afterwards.
"""

from __future__ import annotations

import asyncio
import base64
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
from tests.e2e.conftest import Engine, Registry
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

    # --reset forgets the deployment here and leaves the stack running on the engine.
    reset = deployer("--reset", "--confirm")
    assert reset.exit_code == 0 and "was left running" in reset.stderr, reset.stderr
    assert not (deployer.project / ".offline/deploy").exists()
    assert health(deployer.url)["status"] == "ok"
    assert deployer("status").exit_code == 1


# -- --host ssh:// and --with-postgres ---------------------------------------------------------------------------

#: The "remote" machine's `docker` command as sshd runs it: `docker system dial-stdio` connects the session's
#: stdin/stdout to the engine's socket, which is all the docker CLI does there. It logs each session and the
#: bytes sent up, so the test can tell that the image travelled through SSH.
DIAL_STDIO = """\
import os, socket, sys, threading
command = os.environ.get("SSH_ORIGINAL_COMMAND", "").strip()
if command != "docker system dial-stdio":
    sys.stderr.write(f"this test host runs only `docker system dial-stdio`, not {{command!r}}\\n")
    sys.exit(127)
engine = socket.socket(socket.AF_UNIX)
engine.connect({socket!r})
sent = 0
def upload():
    global sent
    while data := os.read(0, 1 << 16):
        engine.sendall(data)
        sent += len(data)
    engine.shutdown(socket.SHUT_WR)
pump = threading.Thread(target=upload, daemon=True)
pump.start()
while data := engine.recv(1 << 16):
    os.write(1, data)
pump.join(5)
with open({log!r}, "a") as log:
    log.write(f"{{sent}}\\n")
"""

POSTGRES_DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    postgresql-15 >/dev/null && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
CMD ["sh", "/usr/local/bin/entrypoint.sh"]
"""

#: What the official image's entrypoint does with POSTGRES_USER, POSTGRES_DB and POSTGRES_PASSWORD, in short.
POSTGRES_ENTRYPOINT = """\
set -eu
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  printf '%s\\n' "$POSTGRES_PASSWORD" > /tmp/pwfile && chown postgres /tmp/pwfile
  runuser -u postgres -- initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile=/tmp/pwfile \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f /tmp/pwfile
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  runuser -u postgres -- pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  runuser -u postgres -- createdb -U "$POSTGRES_USER" "$POSTGRES_DB"
  runuser -u postgres -- pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec runuser -u postgres -- postgres -D "$PGDATA" -c listen_addresses='*'
"""
POSTGRES_TEST_IMAGE = "localhost/offline-test-postgres:15-1"


@pytest.fixture(scope="session")
def postgres_image(
    container_engine: Engine, base_image: str, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """A PostgreSQL 15 image like the official one, built FROM the local base image with Debian's packages
    (no registry is reachable; Debian's mirror is). Kept in the engine for later sessions."""
    from docker.errors import ImageNotFound  # type: ignore[import-untyped, unused-ignore]

    from platform_adapters.container_engine import DockerEngine

    try:
        container_engine.client.api.inspect_image(POSTGRES_TEST_IMAGE)
        return POSTGRES_TEST_IMAGE
    except ImageNotFound:
        pass
    context = tmp_path_factory.mktemp("postgres-image")
    (context / "Dockerfile").write_text(POSTGRES_DOCKERFILE)
    (context / "entrypoint.sh").write_text(POSTGRES_ENTRYPOINT)
    engine = DockerEngine.from_env(container_engine.env)
    try:
        engine.build(context, POSTGRES_TEST_IMAGE, build_args={"BASE_IMAGE": base_image})
    finally:
        engine.close()
    return POSTGRES_TEST_IMAGE


@dataclass(frozen=True)
class SshHost:
    url: str  # ssh://root@127.0.0.1:<port>
    sessions_log: Path

    def uploads(self) -> list[int]:
        text = self.sessions_log.read_text() if self.sessions_log.exists() else ""
        return [int(line) for line in text.split()]


@pytest.fixture
def ssh_host(container_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SshHost]:
    """An OpenSSH server on loopback whose `docker` is the engine of the session (see DIAL_STDIO), reached
    with a key made here; the `ssh` the docker SDK runs gets this test's client config."""
    import subprocess
    import sys
    import time

    from tests.e2e.conftest import unavailable

    sshd = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/sbin")
    if sshd is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        unavailable(
            "OpenSSH (sshd, ssh, ssh-keygen) is not installed (the --host ssh:// test starts an sshd)"
        )
    if os.geteuid() != 0:
        unavailable("the --host ssh:// test starts sshd and logs in as root, which needs root")
    folder = tmp_path / "ssh"
    folder.mkdir(mode=0o700)
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True)
    socket_path = container_engine.docker_host.removeprefix("unix://")
    sessions = folder / "sessions.log"
    bridge = folder / "dial_stdio.py"
    bridge.write_text(DIAL_STDIO.format(socket=socket_path, log=str(sessions)))
    client_public = (folder / "client_key.pub").read_text().strip()
    (folder / "authorized_keys").write_text(
        f'command="{sys.executable} {bridge}",no-pty,no-port-forwarding,no-agent-forwarding {client_public}\n'
    )
    port = free_port()
    (folder / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host_key'}\nPidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
    )
    host_public = (folder / "host_key.pub").read_text().split()
    (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_public[0]} {host_public[1]}\n")
    (folder / "ssh_config").write_text(
        f"Host 127.0.0.1\n  IdentityFile {folder / 'client_key'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {folder / 'known_hosts'}\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
    )
    wrapper = folder / "bin"
    wrapper.mkdir()
    (wrapper / "ssh").write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {folder / "ssh_config"} "$@"\n')
    (wrapper / "ssh").chmod(0o755)
    # The docker SDK runs `ssh` from the process's own PATH (not the environment the deploy passes it).
    monkeypatch.setenv("PATH", f"{wrapper}:{os.environ.get('PATH', '')}")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    log = folder / "sshd.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(folder / "sshd_config")], stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            probe = subprocess.run(
                ["ssh", "-F", str(folder / "ssh_config"), "-p", str(port), "root@127.0.0.1", "true"],
                capture_output=True,
                timeout=20,
            )
            if b"only `docker system dial-stdio`" in probe.stderr:
                break  # logged in, and the forced command answered
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sshd did not take the test's key: {probe.stderr!r}\n{log.read_text()}")
            time.sleep(0.2)
        yield SshHost(f"ssh://root@127.0.0.1:{port}", sessions)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def test_deploy_over_ssh_copies_the_image_and_runs_postgres_next_to_the_app(
    deployer: Deployer, container_engine: Engine, ssh_host: SshHost, postgres_image: str, tmp_path: Path
) -> None:
    deployer.env["OFFLINE_POSTGRES_IMAGE"] = postgres_image
    run = deployer(
        "--platform",
        "docker",
        "--app",
        deployer.app,
        "--host",
        ssh_host.url,
        "--with-postgres",
        "--publish",
        f"127.0.0.1:{deployer.port}",
        "--confirm",
        "--json",
    )
    assert run.exit_code == 0, run.stderr
    result = run.json()
    assert (result["state"], result["healthy"], result["url"]) == ("RUNNING", True, deployer.url)
    assert "Copying the image to root@127.0.0.1" in run.stderr and "(save | load)" in run.stderr
    # The image went up through SSH: one session carried at least the zipapp's worth of bytes.
    assert max(ssh_host.uploads()) > 5_000_000, ssh_host.uploads()

    postgres = container_engine.client.containers.get(f"{deployer.app}-postgres")
    password = dict(item.split("=", 1) for item in postgres.attrs["Config"]["Env"])["POSTGRES_PASSWORD"]
    assert len(password) >= 32
    assert {m["Destination"]: m.get("Name") for m in postgres.attrs["Mounts"]} == {
        "/var/lib/postgresql/data": f"{deployer.app}_postgres"
    }
    app = app_container(container_engine, deployer.app)
    environment = dict(item.split("=", 1) for item in app.attrs["Config"]["Env"])
    assert environment["DATABASE_URL"] == f"postgresql://offline:{password}@postgres:5432/offline"
    assert "/data" not in {m["Destination"] for m in app.attrs["Mounts"]}  # no SQLite volume

    titles = asyncio.run(
        write_and_read(deployer.project / "schema.py", deployer.url, tmp_path, "in postgres")
    )
    assert titles == {"in postgres"}
    stored = postgres.exec_run(
        ["psql", "-U", "offline", "-d", "offline", "-tAc", "select count(*) from offline_operations"]
    )
    assert stored.exit_code == 0 and int(stored.output.decode().strip()) >= 1, stored.output

    status = deployer("status", "--json")
    assert status.exit_code == 0, status.stderr
    details = status.json()["details"]
    assert status.json()["state"] == "RUNNING" and details["postgres_status"] == "running"
    assert "over SSH" in details["host"]
    logs = deployer("logs", "--lines", "20")
    assert logs.exit_code == 0 and logs.stdout.strip(), logs.stderr

    compose = (deployer.project / ".offline/deploy/compose.yaml").read_text()
    assert (
        "${POSTGRES_PASSWORD}" in compose
        and "POSTGRES_PASSWORD=\n" in (deployer.project / ".offline/deploy/.env.example").read_text()
    )
    token = admin_token_of(run.stderr)
    for value in (password, token, deployer.env["OFFLINE_METRICS_TOKEN"]):
        assert files_holding(deployer.project, value) == []
        assert all(value not in later.stdout + later.stderr for later in deployer.runs[1:])
    assert password not in run.stdout + run.stderr


def test_deploy_pushes_to_the_registry_with_the_engines_login(
    deployer: Deployer, local_registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `docker login`'s file: the docker SDK reads it from DOCKER_CONFIG (the engine's own credentials).
    config = tmp_path / "docker-config"
    config.mkdir()
    auth = base64.b64encode(f"{local_registry.username}:{local_registry.password}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {local_registry.address: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    run = deployer(
        "--platform",
        "self-hosted-image",
        "--app",
        deployer.app,
        "--registry",
        f"{local_registry.address}/offline",
        "--publish",
        f"127.0.0.1:{deployer.port}",
        "--confirm",
        "--json",
    )
    assert run.exit_code == 0, run.stderr
    deployment = run.json()["deployment_id"]
    assert local_registry.manifest_digest(f"offline/offline-{deployer.app}", deployment) is not None
    assert health(deployer.url)["status"] == "ok"
    compose = (deployer.project / ".offline/deploy/compose.yaml").read_text()
    assert f'"{local_registry.address}/offline/offline-{deployer.app}:{deployment}"' in compose
    assert local_registry.password not in run.stdout + run.stderr
    assert files_holding(deployer.project, local_registry.password) == []
