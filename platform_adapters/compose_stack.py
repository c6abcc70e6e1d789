"""The self-hosted stack as data: one description rendered two ways, as ``compose.yaml`` (for people, and for
``docker compose`` if they take over) and as the Docker Engine API requests the deploy sends itself.

The deploy does not need a compose binary: it creates the same network, volumes and containers through the
engine's API (docker SDK), with the names compose would give them (``<app>_default``, ``<app>_data``,
``container_name``) and compose's project and service labels, so ``docker compose -f compose.yaml`` later
finds the stack it describes.

Secrets are names here, never values: compose.yaml refers to them as ``${NAME}`` (filled from the shell or
an ``.env`` file that ``.env.example`` lists), and the API request builders take the values as an argument
at deploy time only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import DeployError

__all__ = [
    "APP_SERVICE",
    "DATA_PATH",
    "POSTGRES_DATABASE",
    "POSTGRES_IMAGE",
    "POSTGRES_PASSWORD",
    "POSTGRES_SERVICE",
    "POSTGRES_USER",
    "Publish",
    "ServiceSpec",
    "StackSpec",
    "app_stack",
    "container_request",
    "env_example",
    "parse_publish",
    "render_compose",
]

APP_SERVICE = "app"
POSTGRES_SERVICE = "postgres"
#: Where the image keeps SQLite (the Dockerfile's OFFLINE_SERVER_DB folder).
DATA_PATH = "/data"
#: Docker's official image; air-gapped hosts name another with OFFLINE_POSTGRES_IMAGE.
POSTGRES_IMAGE = "postgres:16-bookworm"
POSTGRES_USER = "offline"
POSTGRES_DATABASE = "offline"
#: Generated once, kept by the PostgreSQL container's environment; compose.yaml names it only.
POSTGRES_PASSWORD = "POSTGRES_PASSWORD"
POSTGRES_DATA_PATH = "/var/lib/postgresql/data"
RESTART_POLICY = "unless-stopped"
COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"
APP_LABEL = "dev.offline.app"
DEPLOYMENT_LABEL = "dev.offline.deployment"

_PUBLISH = re.compile(r"^(?:(?P<address>\[[0-9a-fA-F:]+\]|[0-9.]+|localhost):)?(?P<port>[0-9]{1,5})$")


@dataclass(frozen=True)
class Publish:
    """``[address:]port`` on the host that reaches the app's container port."""

    port: int
    address: str = ""  # "" = every interface

    def __str__(self) -> str:
        return f"{self.address}:{self.port}" if self.address else str(self.port)

    @property
    def probe_host(self) -> str:
        """Where this machine reaches the port when the stack runs here."""
        return "127.0.0.1" if self.address in ("", "0.0.0.0", "localhost") else self.address.strip("[]")


def parse_publish(value: str | None, default_port: int) -> Publish:
    """``--publish`` (``8080`` or ``127.0.0.1:8080``); INVALID_OPTION naming the flag otherwise."""
    if value is None or not value.strip():
        return Publish(default_port)
    match = _PUBLISH.match(value.strip())
    port = int(match.group("port")) if match else 0
    if match is None or not 0 < port < 65536:
        raise DeployError(
            f"--publish {value!r} is not a port to publish: use PORT or ADDRESS:PORT",
            "INVALID_OPTION",
            {"option": "--publish", "value": value},
            hint="For example --publish 8080, or --publish 127.0.0.1:8080 behind a reverse proxy on the host.",
        )
    address = match.group("address") or ""
    return Publish(port, "127.0.0.1" if address == "localhost" else address)


@dataclass(frozen=True)
class ServiceSpec:
    """One container of the stack."""

    service: str  # compose's service name
    container: str  # its container_name
    image: str
    environment: Mapping[str, str] = field(default_factory=dict)  # plain, non-secret values
    #: name -> template with ${NAME} parts filled from secret values at deploy time (DATABASE_URL)
    derived: Mapping[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # names whose values come from the shell at deploy time
    container_port: int | None = None
    publish: Publish | None = None
    volumes: tuple[tuple[str, str], ...] = ()  # (volume key, path in the container)
    healthcheck: tuple[str, ...] = ()  # exec form, without the leading "CMD"
    depends_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class StackSpec:
    project: str  # the app name; compose's project name
    services: tuple[ServiceSpec, ...]

    @property
    def network(self) -> str:
        return f"{self.project}_default"

    def volume_name(self, key: str) -> str:
        return f"{self.project}_{key}"

    @property
    def volume_keys(self) -> list[str]:
        return list(dict.fromkeys(key for service in self.services for key, _ in service.volumes))

    def service(self, name: str) -> ServiceSpec:
        return next(s for s in self.services if s.service == name)

    @property
    def secret_names(self) -> list[str]:
        """Every variable whose value must come from outside compose.yaml (for .env.example)."""
        names = [name for service in self.services for name in service.secrets]
        return list(dict.fromkeys(names))


def app_health_probe(port: int) -> tuple[str, ...]:
    """The image's own HEALTHCHECK command (python3 only; slim images have no curl)."""
    code = (
        "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + "
        f"os.environ.get('PORT', '{port}') + '/health', timeout=4)"
    )
    return ("python3", "-c", code)


def app_stack(
    app: str,
    image: str,
    *,
    port: int,
    publish: Publish,
    secrets: Sequence[str],
    with_postgres: bool,
    postgres_image: str = POSTGRES_IMAGE,
) -> StackSpec:
    """The stack of ``app``: the server (SQLite on the named volume ``data``, or the PostgreSQL service
    through DATABASE_URL), published on ``publish``, with the forwarded variables ``secrets`` by name."""
    app_secrets = [name for name in secrets if not (with_postgres and name == "DATABASE_URL")]
    derived: dict[str, str] = {}
    volumes: tuple[tuple[str, str], ...] = ()
    services: list[ServiceSpec] = []
    if with_postgres:
        derived["DATABASE_URL"] = (
            f"postgresql://{POSTGRES_USER}:${{{POSTGRES_PASSWORD}}}@{POSTGRES_SERVICE}:5432/{POSTGRES_DATABASE}"
        )
        services.append(
            ServiceSpec(
                service=POSTGRES_SERVICE,
                container=f"{app}-{POSTGRES_SERVICE}",
                image=postgres_image,
                environment={"POSTGRES_USER": POSTGRES_USER, "POSTGRES_DB": POSTGRES_DATABASE},
                secrets=(POSTGRES_PASSWORD,),
                volumes=(("postgres", POSTGRES_DATA_PATH),),
                healthcheck=("pg_isready", "-h", "127.0.0.1", "-U", POSTGRES_USER, "-d", POSTGRES_DATABASE),
            )
        )
    elif "DATABASE_URL" not in secrets:
        volumes = (("data", DATA_PATH),)
    services.insert(
        0,
        ServiceSpec(
            service=APP_SERVICE,
            container=f"{app}-{APP_SERVICE}",
            image=image,
            environment={"PORT": str(port)},
            derived=derived,
            secrets=tuple(app_secrets),
            container_port=port,
            publish=publish,
            volumes=volumes,
            healthcheck=app_health_probe(port),
            depends_on=(POSTGRES_SERVICE,) if with_postgres else (),
        ),
    )
    return StackSpec(app, tuple(services))


# -- compose.yaml and .env.example -------------------------------------------------------------------------------


def _q(value: str) -> str:
    """A YAML scalar: JSON's double-quoted strings are valid YAML and escape everything that needs it."""
    return json.dumps(value)


def render_compose(stack: StackSpec) -> str:
    """compose.yaml for the stack (Compose Specification). Secret values appear as ``${NAME}`` only."""
    lines = [
        "# Generated by `offline deploy --platform self-hosted-image`; rewritten on every deploy.",
        "# The deploy runs this stack through the engine's API itself. To run it by hand instead:",
        "#   cp .env.example .env   (fill in the values), then   docker compose up -d",
        "services:",
    ]
    for service in stack.services:
        lines += [f"  {service.service}:", f"    image: {_q(service.image)}"]
        lines.append(f"    container_name: {_q(service.container)}")
        lines.append(f"    restart: {RESTART_POLICY}")
        if service.depends_on:
            lines.append("    depends_on:")
            for name in service.depends_on:
                lines += [f"      {name}:", "        condition: service_healthy"]
        if service.publish is not None and service.container_port is not None:
            lines += ["    ports:", f"      - {_q(f'{service.publish}:{service.container_port}')}"]
        environment = [
            *((name, value) for name, value in service.environment.items()),
            *((name, f"${{{name}:?{name} is not set (see .env.example)}}") for name in service.secrets),
            *service.derived.items(),
        ]
        if environment:
            lines.append("    environment:")
            lines += [f"      {name}: {_q(value)}" for name, value in environment]
        if service.volumes:
            lines.append("    volumes:")
            lines += [f"      - {_q(f'{key}:{path}')}" for key, path in service.volumes]
        if service.healthcheck:
            lines += [
                "    healthcheck:",
                "      test: " + json.dumps(["CMD", *service.healthcheck]),
                "      interval: 10s",
                "      timeout: 5s",
                "      retries: 3",
                "      start_period: 30s",
            ]
    # Explicit names (no top-level `name:`, which docker-compose 1.x refuses): whatever project name compose
    # picks from the folder, these are the network and volumes the deploy created and the data lives on.
    lines += ["networks:", "  default:", f"    name: {_q(stack.network)}"]
    keys = stack.volume_keys
    if keys:
        lines.append("volumes:")
        for key in keys:
            lines += [f"  {key}:", f"    name: {_q(stack.volume_name(key))}"]
    return "\n".join(lines) + "\n"


def env_example(stack: StackSpec) -> str:
    """.env.example: the names compose.yaml expects from outside, each with what it is, never a value."""
    what = {
        "DATABASE_URL": "PostgreSQL URL of the app's database (postgresql://user:password@host:5432/db)",
        "AUTH_SECRET": "secret that signs the app's sign-in tokens",
        "PUBLIC_URL": "the address people reach the app at (https://...)",
        "OFFLINE_ADMIN_TOKEN": "guards /__offline/status, the dashboard and backups (offline deploy printed it once)",
        "OFFLINE_METRICS_TOKEN": "guards /metrics",
        "OFFLINE_BACKUP_TOKEN": "keys backups",
        POSTGRES_PASSWORD: "password of the PostgreSQL service (the deploy generated one; `docker inspect` shows it)",
    }
    lines = [
        "# The variables compose.yaml takes from outside: copy to .env and fill in the values.",
        "# `offline deploy` takes them from the local shell instead and never writes their values to a file.",
    ]
    for name in stack.secret_names:
        lines += [f"# {what.get(name, name)}", f"{name}="]
    return "\n".join(lines) + "\n"


# -- engine API requests -----------------------------------------------------------------------------------------


def fill(template: str, values: Mapping[str, str]) -> str:
    """``${NAME}`` parts of ``template`` replaced by ``values[NAME]``."""
    return re.sub(r"\$\{([A-Z_][A-Z0-9_]*)\}", lambda m: values.get(m.group(1), ""), template)


def container_request(
    stack: StackSpec, service: ServiceSpec, values: Mapping[str, str], deployment: str | None = None
) -> dict[str, Any]:
    """What creates ``service``'s container through the engine API: keyword arguments of the docker SDK's
    ``api.create_container`` with ``host_config`` and ``networking_config`` as plain dicts of their
    ``create_host_config`` / ``create_endpoint_config`` arguments. ``values``: the secret values by name."""
    environment = dict(service.environment)
    environment.update({name: values[name] for name in service.secrets if values.get(name)})
    environment.update({name: fill(template, values) for name, template in service.derived.items()})
    labels = {
        COMPOSE_PROJECT_LABEL: stack.project,
        COMPOSE_SERVICE_LABEL: service.service,
        APP_LABEL: stack.project,
    }
    if deployment:
        labels[DEPLOYMENT_LABEL] = deployment
    host_config: dict[str, Any] = {
        "restart_policy": {"Name": RESTART_POLICY},
        "binds": {stack.volume_name(key): {"bind": path, "mode": "rw"} for key, path in service.volumes},
        "network_mode": stack.network,
    }
    ports: list[int] = []
    if service.publish is not None and service.container_port is not None:
        ports = [service.container_port]
        binding = (
            (service.publish.address, service.publish.port)
            if service.publish.address
            else service.publish.port
        )
        host_config["port_bindings"] = {service.container_port: binding}
    request: dict[str, Any] = {
        "image": service.image,
        "name": service.container,
        "environment": environment,
        "labels": labels,
        "ports": ports,
        "host_config": host_config,
        "networking_config": {stack.network: {"aliases": [service.service]}},
    }
    if service.healthcheck:
        request["healthcheck"] = {
            "test": ["CMD", *service.healthcheck],
            "interval": 10 * 10**9,
            "timeout": 5 * 10**9,
            "retries": 3,
            "start_period": 30 * 10**9,
        }
    return request
