"""The self-hosted stack as data (platform_adapters.compose_stack, self_hosted.parse_host): compose.yaml and
.env.example name the secrets and never hold a value; the engine API requests carry the values, the names
compose would give, the restart policy, the volume and the health check."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from platform_adapters.base import DeployError
from platform_adapters.compose_stack import (
    Publish,
    app_stack,
    container_request,
    env_example,
    parse_publish,
    render_compose,
)
from platform_adapters.self_hosted import parse_host

SECRETS = {"AUTH_SECRET": "auth-s3cret", "OFFLINE_ADMIN_TOKEN": "admin-t0ken"}


def test_compose_file_describes_the_app_with_its_volume_healthcheck_and_restart_policy() -> None:
    stack = app_stack(
        "notes",
        "offline-notes:1",
        port=3001,
        publish=Publish(8080, "127.0.0.1"),
        secrets=list(SECRETS),
        with_postgres=False,
    )
    text = render_compose(stack)
    compose = yaml.safe_load(text)
    app = compose["services"]["app"]
    assert list(compose["services"]) == ["app"]
    assert compose["networks"] == {"default": {"name": "notes_default"}}
    assert app["image"] == "offline-notes:1" and app["container_name"] == "notes-app"
    assert app["restart"] == "unless-stopped"
    assert app["ports"] == ["127.0.0.1:8080:3001"]
    assert app["volumes"] == ["data:/data"] and compose["volumes"] == {"data": {"name": "notes_data"}}
    assert (
        app["healthcheck"]["test"][:2] == ["CMD", "python3"] and "/health" in app["healthcheck"]["test"][-1]
    )
    assert app["environment"]["PORT"] == "3001"
    assert app["environment"]["AUTH_SECRET"].startswith("${AUTH_SECRET:?")
    for value in SECRETS.values():
        assert value not in text
    example = env_example(stack)
    assert "AUTH_SECRET=\n" in example and "OFFLINE_ADMIN_TOKEN=\n" in example
    assert all(line.startswith("#") or line.endswith("=") for line in example.splitlines())


def test_with_database_url_the_app_gets_no_sqlite_volume() -> None:
    stack = app_stack(
        "notes", "img:1", port=3001, publish=Publish(3001), secrets=["DATABASE_URL"], with_postgres=False
    )
    compose = yaml.safe_load(render_compose(stack))
    assert "volumes" not in compose["services"]["app"] and "volumes" not in compose
    assert compose["services"]["app"]["ports"] == ["3001:3001"]


def test_with_postgres_adds_the_service_its_volume_and_wires_database_url_by_name() -> None:
    stack = app_stack(
        "notes",
        "img:1",
        port=3001,
        publish=Publish(3001),
        secrets=["AUTH_SECRET"],
        with_postgres=True,
        postgres_image="localhost/pg:15",
    )
    text = render_compose(stack)
    compose = yaml.safe_load(text)
    postgres = compose["services"]["postgres"]
    app = compose["services"]["app"]
    assert postgres["image"] == "localhost/pg:15" and postgres["volumes"] == [
        "postgres:/var/lib/postgresql/data"
    ]
    assert postgres["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    assert postgres["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert app["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert (
        app["environment"]["DATABASE_URL"]
        == "postgresql://offline:${POSTGRES_PASSWORD}@postgres:5432/offline"
    )
    assert "volumes" not in app and compose["volumes"] == {"postgres": {"name": "notes_postgres"}}
    assert "POSTGRES_PASSWORD=\n" in env_example(stack)

    request = container_request(
        stack, stack.service("app"), {"AUTH_SECRET": "a", "POSTGRES_PASSWORD": "pw"}, "7"
    )
    assert request["environment"]["DATABASE_URL"] == "postgresql://offline:pw@postgres:5432/offline"
    database = container_request(stack, stack.service("postgres"), {"POSTGRES_PASSWORD": "pw"})
    assert database["environment"] == {
        "POSTGRES_USER": "offline",
        "POSTGRES_DB": "offline",
        "POSTGRES_PASSWORD": "pw",
    }
    assert database["networking_config"] == {"notes_default": {"aliases": ["postgres"]}}
    assert database["host_config"]["binds"] == {
        "notes_postgres": {"bind": "/var/lib/postgresql/data", "mode": "rw"}
    }


def test_the_container_request_carries_values_names_labels_port_and_volume() -> None:
    stack = app_stack(
        "notes",
        "offline-notes:1",
        port=3001,
        publish=Publish(8080, "127.0.0.1"),
        secrets=list(SECRETS),
        with_postgres=False,
    )
    request = container_request(stack, stack.service("app"), SECRETS, "20261127-131500")
    assert request["name"] == "notes-app" and request["image"] == "offline-notes:1"
    assert request["environment"] == {"PORT": "3001", **SECRETS}
    assert request["labels"] == {
        "com.docker.compose.project": "notes",
        "com.docker.compose.service": "app",
        "dev.offline.app": "notes",
        "dev.offline.deployment": "20261127-131500",
    }
    assert request["ports"] == [3001]
    assert request["host_config"] == {
        "restart_policy": {"Name": "unless-stopped"},
        "binds": {"notes_data": {"bind": "/data", "mode": "rw"}},
        "network_mode": "notes_default",
        "port_bindings": {3001: ("127.0.0.1", 8080)},
    }
    assert request["healthcheck"]["test"][0] == "CMD" and request["healthcheck"]["retries"] == 3


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, Publish(3001)),
        ("8080", Publish(8080)),
        ("127.0.0.1:8080", Publish(8080, "127.0.0.1")),
        ("localhost:9000", Publish(9000, "127.0.0.1")),
    ],
)
def test_publish_values(value: str | None, expected: Publish) -> None:
    assert parse_publish(value, 3001) == expected


@pytest.mark.parametrize("value", ["http", "0", "70000", "host:port", "1.2.3.4:"])
def test_unusable_publish_values_name_the_flag(value: str) -> None:
    with pytest.raises(DeployError) as caught:
        parse_publish(value, 3001)
    assert caught.value.code == "INVALID_OPTION" and "--publish" in caught.value.message


def test_ssh_hosts() -> None:
    assert parse_host("ssh://deploy@my-server.example.com") == (
        "ssh://deploy@my-server.example.com",
        "my-server.example.com",
    )
    assert parse_host("ssh://root@127.0.0.1:2222") == ("ssh://root@127.0.0.1:2222", "127.0.0.1")
    for wrong in ("deploy@server", "tcp://server:2375", "ssh://", "ssh://user@host/path"):
        with pytest.raises(DeployError) as caught:
            parse_host(wrong)
        assert caught.value.code == "INVALID_OPTION" and "--host" in caught.value.message


def test_docker_compose_accepts_the_file_and_fills_the_secrets_from_env(tmp_path: Path) -> None:
    """Debian's docker-compose (1.29) reads the rendered file as it is: the names resolve from .env."""
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is not installed; CI must provide it (scripts/setup.sh --test)")
        pytest.skip("docker-compose is not installed; run scripts/setup.sh --test as root to install it")
    stack = app_stack(
        "notes",
        "offline-notes:1",
        port=3001,
        publish=Publish(8080, "127.0.0.1"),
        secrets=list(SECRETS),
        with_postgres=True,
    )
    (tmp_path / "compose.yaml").write_text(render_compose(stack))
    (tmp_path / ".env").write_text("AUTH_SECRET=a1\nOFFLINE_ADMIN_TOKEN=t2\nPOSTGRES_PASSWORD=p3\n")
    done = subprocess.run(
        [binary, "-f", "compose.yaml", "config"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    app = config["services"]["app"]
    assert app["environment"]["DATABASE_URL"] == "postgresql://offline:p3@postgres:5432/offline"
    assert app["environment"]["OFFLINE_ADMIN_TOKEN"] == "t2" and "POSTGRES_PASSWORD" not in app["environment"]
    assert config["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == "p3"
    assert config["volumes"]["postgres"]["name"] == "notes_postgres"

    (tmp_path / ".env").write_text("AUTH_SECRET=a1\n")
    missing = subprocess.run(
        [binary, "-f", "compose.yaml", "config"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert missing.returncode != 0 and "OFFLINE_ADMIN_TOKEN is not set" in missing.stderr
