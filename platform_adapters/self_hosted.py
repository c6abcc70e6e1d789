"""``--platform self-hosted-image`` (aliases ``self-hosted``, ``docker``): the app on a machine of the user's own.

Each deploy builds the image here for linux/amd64 (tag ``offline-<app>:<deployment id>``), then ships it:
pushed to ``--registry`` with the engine's own login (and pulled by the target), or, with ``--host`` and no
registry, copied as ``docker save | docker load`` over SSH; without ``--host`` it stays in the local engine.
The stack (compose_stack: the app with a named volume for SQLite or DATABASE_URL, optionally a PostgreSQL
service with its own volume) is written to ``compose.yaml`` / ``.env.example`` and run through the target
engine's API: the local one, or ``--host ssh://user@machine`` through the engine's SSH support
(``DOCKER_HOST=ssh://...``). No compose binary is needed on either machine.

A redeploy stops the running container and keeps it (renamed ``<app>-app-previous``) until the new one answers
``/health`` through the published port; a new container that dies or never answers is removed and the old
one started again. Earlier images stay tagged (the last KEEP_IMAGES), so ``rollback`` recreates the container
from one of them. The forwarded secrets and the generated PostgreSQL password live only in the containers'
environment on the engine, which later deploys and rollbacks read back; never in files or deploy.json.
"""

from __future__ import annotations

import re
import secrets as secret_tokens
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._aws import poll
from .base import (
    HEALTH_TIMEOUT,
    NO_PREVIOUS_DEPLOYMENT,
    NOT_DEPLOYED,
    PLATFORM_ERROR,
    SECRET_VARIABLES,
    DeployContext,
    DeployError,
    Deployment,
    DeployOutcome,
    PlatformAdapter,
    StatusReport,
    forwarded_environment,
    report_change,
)
from .compose_stack import (
    APP_LABEL,
    APP_SERVICE,
    DEPLOYMENT_LABEL,
    POSTGRES_IMAGE,
    POSTGRES_PASSWORD,
    POSTGRES_SERVICE,
    Publish,
    StackSpec,
    app_stack,
    container_request,
    env_example,
    parse_publish,
    render_compose,
)
from .container_engine import require_platform
from .container_host import ContainerHost
from .image_registry import RegistryTarget, parse_registry, push_image

__all__ = [
    "BASE_IMAGE_VARIABLE",
    "KEEP_IMAGES",
    "POSTGRES_IMAGE_VARIABLE",
    "SelfHostedAdapter",
    "Target",
    "parse_host",
]

#: A base image for the Dockerfile's FROM (air-gapped machines, tests): passed as --build-arg BASE_IMAGE.
BASE_IMAGE_VARIABLE = "OFFLINE_BASE_IMAGE"
#: The PostgreSQL image of --with-postgres (default compose_stack.POSTGRES_IMAGE).
POSTGRES_IMAGE_VARIABLE = "OFFLINE_POSTGRES_IMAGE"
#: Images of earlier deploys kept tagged on the target for rollback.
KEEP_IMAGES = 5
COMPOSE_FILE = "compose.yaml"
ENV_EXAMPLE_FILE = ".env.example"
PREVIOUS_SUFFIX = "-previous"

_SSH_HOST = re.compile(
    r"^ssh://(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<machine>[A-Za-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?$"
)


def parse_host(value: str) -> tuple[str, str]:
    """``--host ssh://user@machine[:port]`` -> (the DOCKER_HOST value, the machine's name); INVALID_OPTION
    naming the flag otherwise."""
    match = _SSH_HOST.match(value.strip())
    if match is None:
        raise DeployError(
            f"--host {value!r} is not an SSH address: use ssh://user@machine (optionally :port)",
            "INVALID_OPTION",
            {"option": "--host", "value": value},
            hint="For example --host ssh://deploy@my-server.example.com; the machine needs Docker and your "
            "SSH key. Omit --host to run the stack on this machine's engine.",
        )
    return value.strip(), match.group("machine")


@dataclass(frozen=True)
class Target:
    """Where the stack runs and how the image gets there, from the remembered options."""

    docker_host: str | None  # ssh://... or None for the local engine
    machine: str  # the host name people reach the app at
    registry: RegistryTarget | None
    with_postgres: bool
    publish: Publish

    @classmethod
    def of(cls, ctx: DeployContext) -> Target:
        options = ctx.options
        docker_host, machine = (None, "")
        if options.get("host"):
            docker_host, machine = parse_host(str(options["host"]))
        publish = parse_publish(options.get("publish"), ctx.port)
        return cls(
            docker_host,
            machine or publish.probe_host,
            parse_registry(str(options["registry"])) if options.get("registry") else None,
            bool(options.get("with_postgres")),
            publish,
        )

    @property
    def where(self) -> str:
        return (
            f"{self.docker_host.removeprefix('ssh://')} (over SSH)"
            if self.docker_host
            else "this machine's engine"
        )

    @property
    def probe_base(self) -> str:
        """Where this machine reaches the published port."""
        host = self.machine if self.docker_host else self.publish.probe_host
        if self.docker_host and self.publish.address not in ("", "0.0.0.0"):
            host = self.publish.probe_host if self.publish.probe_host != "127.0.0.1" else self.machine
        return f"http://{host}:{self.publish.port}"


def _new_deployment_id(taken: list[str]) -> str:
    base = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _environment_of(container: Mapping[str, Any] | None) -> dict[str, str]:
    items = ((container or {}).get("Config") or {}).get("Env") or []
    return dict(str(item).split("=", 1) for item in items if "=" in str(item))


def _get(url: str, timeout: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class SelfHostedAdapter(PlatformAdapter):
    name = "self-hosted-image"
    title = "Self-hosted container image"
    needs_container_engine = True
    persistent_storage = True  # a named volume on the machine

    def __init__(self) -> None:
        self._hosts: dict[str, ContainerHost] = {}
        self._deployment: tuple[str, str] | None = None  # (id, image reference) of the deploy under way
        self._replaced = False

    # -- the engines -------------------------------------------------------------------------------------------

    def _engine(self, ctx: DeployContext, docker_host: str | None) -> ContainerHost:
        key = docker_host or ""
        if key not in self._hosts:
            env = dict(ctx.env)
            if docker_host:
                env["DOCKER_HOST"] = docker_host
                for name in ("DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"):
                    env.pop(name, None)
            line = getattr(ctx.reporter, "vendor_line", None)
            self._hosts[key] = ContainerHost(env, log=line if callable(line) else None)
        return self._hosts[key]

    def _target(self, ctx: DeployContext) -> ContainerHost:
        return self._engine(ctx, Target.of(ctx).docker_host)

    @staticmethod
    def _app_container(ctx: DeployContext) -> str:
        return f"{ctx.app}-{APP_SERVICE}"

    # -- plan ----------------------------------------------------------------------------------------------------

    def check_prerequisites(self, ctx: DeployContext) -> None:
        target = Target.of(ctx)
        if target.with_postgres and ctx.env.get("DATABASE_URL"):
            raise DeployError(
                "--with-postgres and DATABASE_URL were both given: the app can use one database",
                "INVALID_OPTION",
                {"option": "--with-postgres", "variable": "DATABASE_URL"},
                hint="Unset DATABASE_URL to run PostgreSQL next to the app, or drop --with-postgres.",
            )
        if ctx.engine is not None:
            ctx.engine.ping()  # the image is built here
        self._target(ctx).ping()

    def existing_secrets(self, ctx: DeployContext) -> dict[str, str | None]:
        # A new container gets its whole environment anew, so every value is sent again (like Lightsail).
        environment = _environment_of(self._target(ctx).container(self._app_container(ctx)))
        found: dict[str, str | None] = {
            name: environment[name] for name in SECRET_VARIABLES if environment.get(name)
        }
        if Target.of(ctx).with_postgres:
            found.pop("DATABASE_URL", None)  # derived from the PostgreSQL service, not a secret of its own
        return found

    def storage(self, ctx: DeployContext) -> str:
        target = Target.of(ctx)
        if target.with_postgres:
            return (
                f"PostgreSQL in the container {ctx.app}-{POSTGRES_SERVICE}, on the volume {ctx.app}_postgres"
            )
        if "DATABASE_URL" in forwarded_environment(ctx.env):
            return "the database at DATABASE_URL"
        return f"SQLite on the named volume {ctx.app}_data at /data (kept across deploys)"

    def planned_resources(self, ctx: DeployContext) -> list[str]:
        target = Target.of(ctx)
        ship = (
            f"pushed to {target.registry}" + (" and pulled there" if target.docker_host else "")
            if target.registry
            else ("copied over SSH (save | load)" if target.docker_host else "kept in the local engine")
        )
        lines = [
            f"on {target.where}: network {ctx.app}_default and the volumes (when missing)",
            f"an image built here for linux/amd64, {ship}",
            f"container {self._app_container(ctx)} (restart unless-stopped) published on {target.publish}; "
            "the running one is kept until the new one answers /health",
        ]
        if target.with_postgres:
            lines.append(f"container {ctx.app}-{POSTGRES_SERVICE} ({self._postgres_image(ctx)}) when missing")
        return lines

    def public_url(self, ctx: DeployContext) -> str | None:
        public = ctx.env.get("PUBLIC_URL", "").strip().rstrip("/")
        if public:
            return public  # a reverse proxy in front (TLS): the address people and clients use
        target = Target.of(ctx)
        return f"http://{target.machine}:{target.publish.port}"

    # -- deploy --------------------------------------------------------------------------------------------------

    def _history(self, ctx: DeployContext) -> list[dict[str, str]]:
        return [dict(entry) for entry in ctx.state.get("images") or [] if isinstance(entry, dict)]

    def _this_deployment(self, ctx: DeployContext) -> tuple[str, str]:
        if self._deployment is None:
            deployment = _new_deployment_id([entry.get("id", "") for entry in self._history(ctx)])
            local_tag = f"offline-{ctx.app}:{deployment}"
            registry = Target.of(ctx).registry
            image = registry.reference(f"offline-{ctx.app}", deployment) if registry else local_tag
            self._deployment = (deployment, image)
        return self._deployment

    def _postgres_image(self, ctx: DeployContext) -> str:
        return ctx.env.get(POSTGRES_IMAGE_VARIABLE, "").strip() or POSTGRES_IMAGE

    def _stack(self, ctx: DeployContext, image: str) -> StackSpec:
        target = Target.of(ctx)
        names = list(forwarded_environment(ctx.env))
        return app_stack(
            ctx.app,
            image,
            port=ctx.port,
            publish=target.publish,
            secrets=names,
            with_postgres=target.with_postgres,
            postgres_image=self._postgres_image(ctx),
        )

    def provision(self, ctx: DeployContext) -> dict[str, Any]:
        target = Target.of(ctx)
        host = self._target(ctx)
        stack = self._stack(ctx, self._this_deployment(ctx)[1])
        labels = {APP_LABEL: ctx.app, "com.docker.compose.project": ctx.app}
        host.ensure_network(stack.network, labels)
        for key in stack.volume_keys:
            name = stack.volume_name(key)
            if host.ensure_volume(name, {**labels, "com.docker.compose.volume": key}):
                ctx.reporter.info(f"created the volume {name} on {target.where}")
            else:
                ctx.reporter.info(f"the volume {name} exists: its data is kept")
        return {"host": target.docker_host, "machine": target.machine}

    def render_config(self, ctx: DeployContext) -> list[Path]:
        return self._write_files(ctx, self._stack(ctx, self._this_deployment(ctx)[1]))

    @staticmethod
    def _write_files(ctx: DeployContext, stack: StackSpec) -> list[Path]:
        from offline_cli.deploy.templates import write_text_atomic

        written = []
        for name, text in ((COMPOSE_FILE, render_compose(stack)), (ENV_EXAMPLE_FILE, env_example(stack))):
            path = ctx.deploy_dir / name
            write_text_atomic(path, text)
            written.append(path)
        return written

    def deploy(self, ctx: DeployContext) -> DeployOutcome:
        target = Target.of(ctx)
        deployment, image = self._this_deployment(ctx)
        local_tag = f"offline-{ctx.app}:{deployment}"
        builder = ctx.engine if ctx.engine is not None else self._engine(ctx, None)
        host = self._target(ctx)

        ctx.reporter.step("Building the image for linux/amd64")
        base = ctx.env.get(BASE_IMAGE_VARIABLE, "").strip()
        builder.build(ctx.deploy_dir, local_tag, build_args={"BASE_IMAGE": base} if base else None)
        require_platform(builder, local_tag)

        if target.registry is not None:
            ctx.reporter.step(f"Pushing the image to {target.registry}")
            push_image(builder, local_tag, target.registry, f"offline-{ctx.app}", deployment, ctx.reporter)
            if target.docker_host:
                ctx.reporter.step(f"Pulling the image on {target.where}")
                host.pull(image)
        elif target.docker_host:
            ctx.reporter.step(f"Copying the image to {target.where} (save | load)")
            host.import_image(self._engine(ctx, None).export_image(local_tag))

        values = self._secret_values(ctx)
        stack = self._stack(ctx, image)
        if target.with_postgres:
            self._start_postgres(ctx, host, stack, values)
        ctx.reporter.step(f"Starting {self._app_container(ctx)} on {target.where}")
        for name in forwarded_environment(ctx.env):
            ctx.reporter.info(f"Forwarding {name} from the local environment to the container.")
        self._replace_app(ctx, host, stack, values, deployment)

        history = [entry for entry in self._history(ctx) if entry.get("id") != deployment]
        history.append({"id": deployment, "image": image})
        dropped, history = history[:-KEEP_IMAGES], history[-KEEP_IMAGES:]
        for entry in dropped:
            host.remove_image(entry["image"])  # an image a container still uses stays (the engine refuses)
        return self._outcome(ctx, deployment, image, history)

    def _outcome(
        self, ctx: DeployContext, deployment: str, image: str, history: list[dict[str, str]]
    ) -> DeployOutcome:
        target = Target.of(ctx)
        url = self.public_url(ctx) or ""
        return DeployOutcome(
            url=url,
            deployment_id=deployment,
            state={
                "host": target.docker_host,
                "machine": target.machine,
                "url": url,
                "image": image,
                "images": history,
                "with_postgres": target.with_postgres,
            },
        )

    def _secret_values(self, ctx: DeployContext) -> dict[str, str]:
        """The forwarded variables, plus the PostgreSQL password (kept by its container, else generated)."""
        values = forwarded_environment(ctx.env)
        if Target.of(ctx).with_postgres:
            postgres = self._target(ctx).container(f"{ctx.app}-{POSTGRES_SERVICE}")
            password = _environment_of(postgres).get(POSTGRES_PASSWORD) or secret_tokens.token_hex(24)
            mask = getattr(ctx.reporter, "mask", None)
            if callable(mask):
                mask(password)
            values[POSTGRES_PASSWORD] = password
        return values

    def _start_postgres(
        self, ctx: DeployContext, host: ContainerHost, stack: StackSpec, values: Mapping[str, str]
    ) -> None:
        service = stack.service(POSTGRES_SERVICE)
        existing = host.container(service.container)
        if existing is None:
            ctx.reporter.step(f"Starting PostgreSQL ({service.image}) as {service.container}")
            if host.image(service.image) is None:
                host.pull(service.image)
            host.run(container_request(stack, service, values))
        elif not (existing.get("State") or {}).get("Running"):
            host.start(service.container)
        seen: list[str] = []

        def ready(_: int) -> bool | None:
            code = host.exec(service.container, list(service.healthcheck))
            report_change(ctx.reporter, seen, f"PostgreSQL: {'ready' if code == 0 else 'starting'}")
            return True if code == 0 else None

        if poll(ctx, ready, timeout=min(ctx.health_timeout, 180.0)) is None:
            raise DeployError(
                f"PostgreSQL in {service.container} did not become ready",
                HEALTH_TIMEOUT,
                {"container": service.container},
                hint=f"Read its log on the machine (`docker logs {service.container}`), then deploy again.",
            )

    def _replace_app(
        self,
        ctx: DeployContext,
        host: ContainerHost,
        stack: StackSpec,
        values: Mapping[str, str],
        deployment: str,
    ) -> None:
        """Stop the running app container and keep it aside; start the new one (wait_until_healthy decides
        which one stays)."""
        name = self._app_container(ctx)
        kept = name + PREVIOUS_SUFFIX
        running = host.container(name)
        host.remove(kept)  # a leftover of an interrupted deploy
        self._replaced = running is not None
        if running is not None:
            host.stop(name)
            host.rename(name, kept)
        try:
            host.run(container_request(stack, stack.service(APP_SERVICE), values, deployment))
        except DeployError:
            self._restore(ctx, host)
            raise

    def _restore(self, ctx: DeployContext, host: ContainerHost) -> None:
        name = self._app_container(ctx)
        host.remove(name)
        if self._replaced:
            host.rename(name + PREVIOUS_SUFFIX, name)
            host.start(name)
            ctx.reporter.warn(f"the previous container {name} was started again")
        self._replaced = False

    def wait_until_healthy(self, ctx: DeployContext, outcome: DeployOutcome) -> StatusReport:
        target = Target.of(ctx)
        host = self._target(ctx)
        name = self._app_container(ctx)
        health = f"{target.probe_base}/health"
        seen: list[str] = []
        ctx.reporter.info(f"waiting for GET {health}")

        def probe(_: int) -> StatusReport | None:
            container = host.container(name) or {}
            state = container.get("State") or {}
            status = str(state.get("Status") or "missing")
            report_change(ctx.reporter, seen, f"container {name}: {status}")
            if status in ("exited", "dead", "missing") or (
                status == "restarting" and int(container.get("RestartCount") or 0) > 1
            ):
                tail = host.logs(name, 20) if container else []
                self._restore(ctx, host)
                raise DeployError(
                    f"the new container {name} stopped ({status}, exit code {state.get('ExitCode')})"
                    + ("; its last lines:\n" + "\n".join(tail) if tail else ""),
                    PLATFORM_ERROR,
                    {"container": name, "status": status},
                    hint="Fix the cause (a missing variable, a crash at start), then deploy again; "
                    "the previous container keeps serving.",
                )
            if status == "running" and _get(health):
                return StatusReport("RUNNING", True, outcome.url or None, outcome.deployment_id, {})
            return None

        interval, ctx.poll_interval = ctx.poll_interval, min(ctx.poll_interval, 1.0)
        try:
            report = poll(ctx, probe, timeout=min(ctx.health_timeout, 300.0))
        finally:
            ctx.poll_interval = interval
        if report is None:
            tail = host.logs(name, 20)
            self._restore(ctx, host)
            raise DeployError(
                f"GET {health} did not answer within {min(ctx.health_timeout, 300.0):.0f} s"
                + ("; the container's last lines:\n" + "\n".join(tail) if tail else ""),
                HEALTH_TIMEOUT,
                {"container": name, "url": health},
                hint=f"Check that port {target.publish.port} is reachable from here (a firewall?) and read "
                "`offline deploy logs`; the previous container keeps serving.",
            )
        if self._replaced:
            host.remove(name + PREVIOUS_SUFFIX)
            self._replaced = False
        return report

    # -- management ----------------------------------------------------------------------------------------------

    def status(self, ctx: DeployContext) -> StatusReport:
        target = Target.of(ctx)
        container = self._target(ctx).container(self._app_container(ctx))
        url = self.public_url(ctx)
        if container is None:
            return StatusReport("NOT_FOUND", False, url, None, {"host": target.where})
        state = container.get("State") or {}
        status = str(state.get("Status") or "")
        labels = (container.get("Config") or {}).get("Labels") or {}
        mapped = {"running": "RUNNING", "restarting": "DEPLOYING", "created": "DEPLOYING"}.get(status)
        if mapped is None:
            mapped = "FAILED" if status in ("exited", "dead") and state.get("ExitCode") else "STOPPED"
        healthy = mapped == "RUNNING" and _get(f"{target.probe_base}/health")
        details: dict[str, Any] = {
            "host": target.where,
            "container": self._app_container(ctx),
            "container_status": status,
            "image": (container.get("Config") or {}).get("Image"),
            "started_at": state.get("StartedAt"),
            "restart_count": container.get("RestartCount"),
        }
        if target.with_postgres:
            postgres = self._target(ctx).container(f"{ctx.app}-{POSTGRES_SERVICE}") or {}
            details["postgres_status"] = (postgres.get("State") or {}).get("Status") or "missing"
        return StatusReport(mapped, healthy, url, labels.get(DEPLOYMENT_LABEL), details)  # type: ignore[arg-type]

    def logs(self, ctx: DeployContext, *, lines: int = 100) -> list[str]:
        host = self._target(ctx)
        name = self._app_container(ctx)
        if host.container(name) is None:
            raise DeployError(
                f"there is no container {name} on {Target.of(ctx).where}",
                NOT_DEPLOYED,
                {"container": name},
                hint="Run `offline deploy` first.",
            )
        return host.logs(name, lines)

    def deployments(self, ctx: DeployContext) -> list[Deployment]:
        host = self._target(ctx)
        current = host.container(self._app_container(ctx))
        current_id = ((current or {}).get("Config") or {}).get("Labels", {}).get(DEPLOYMENT_LABEL)
        return [
            Deployment(
                id=entry["id"],
                status="AVAILABLE" if host.image(entry["image"]) is not None else "REMOVED",
                image=entry["image"],
                current=entry["id"] == current_id,
            )
            for entry in reversed(self._history(ctx))
        ]

    def rollback(self, ctx: DeployContext, deployment_id: str | None = None) -> DeployOutcome:
        listed = self.deployments(ctx)
        current = next((i for i, d in enumerate(listed) if d.current), None)
        if deployment_id is not None:
            chosen = next((d for d in listed if d.id == deployment_id), None)
        else:
            older = listed[current + 1 :] if current is not None else listed[1:]
            chosen = next((d for d in older if d.status == "AVAILABLE"), None)
        if chosen is None or chosen.status != "AVAILABLE" or chosen.current:
            why = "is the current one" if chosen is not None and chosen.current else "has no image left"
            raise DeployError(
                f"there is no earlier deployment of {ctx.app} to roll back to"
                + (f" ({chosen.id} {why})" if chosen is not None else ""),
                NO_PREVIOUS_DEPLOYMENT,
                {"app": ctx.app},
                hint="Deploy a fixed version with `offline deploy` instead.",
            )
        assert chosen.image is not None
        host = self._target(ctx)
        existing = _environment_of(host.container(self._app_container(ctx)))
        ctx.env = {
            **ctx.env,
            **{name: value for name, value in existing.items() if name in SECRET_VARIABLES},
            **forwarded_environment(ctx.env),
        }
        values = self._secret_values(ctx)
        stack = self._stack(ctx, chosen.image)
        self._write_files(ctx, stack)
        ctx.reporter.info(f"recreating {self._app_container(ctx)} from {chosen.image}")
        self._replace_app(ctx, host, stack, values, chosen.id)
        return self._outcome(ctx, chosen.id, chosen.image, self._history(ctx))
