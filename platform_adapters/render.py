"""``--platform web-service-host`` (alias ``render``): Render, through its public REST API (render_api.py
lists the request and response shapes relied on).

Render runs an image it pulls from a registry, so the image is built here (the local container engine,
linux/amd64) and pushed to the user's registry (``--registry host/namespace``, with the engine's own login;
platform_adapters.image_registry). Render pulls it with a registry credential of the workspace, referenced
by name (``--registry-credential``; without it, the one credential for that registry's host when there is
exactly one, else none: a public image).

- prerequisites: RENDER_API_KEY set and accepted (``GET /owners``; a 401 is NOT_AUTHENTICATED); the
  workspace (owner) is the only one the key sees, or the one ``--workspace`` names (id or name). A deploy
  also needs ``--registry`` and a container engine that answers.
- provision: the service is looked up by the id remembered in deploy.json, else by name in the workspace
  (so a deploy after ``offline deploy --reset`` finds its service again). A service of that name that does
  not run an image belongs to something else: NAME_TAKEN. An existing service gets the environment
  variables one by one (``PUT /services/{id}/env-vars/{key}``: the others, such as the admin token set by the
  first deploy, stay), the ``/health`` check path, and without DATABASE_URL a disk at ``/data`` for the
  SQLite file (``POST /disks``). A new service is created only in ``deploy``, once there is an image:
  ``POST /services`` takes the image and starts the first deploy.
- deploy: build, push ``<registry>/<app>:<image id>``, then either create the service (web service, runtime
  ``image``, plan ``starter`` (disks need a paid instance type), the region, health check ``/health``, the
  variables, the disk) or point it at the image (``PATCH`` when the repository or credential changed) and
  start a deploy with ``POST /services/{id}/deploys {"imageUrl"}``.
- readiness: the deploy's status (``GET /services/{id}/deploys/{deployId}``) until ``live``, each new state
  shown once and the service's log lines since the deploy began streamed into the live view; a failed one
  (build_failed, update_failed, pre_deploy_failed, canceled) stops the wait and quotes those log lines.
- status: the service (suspended: STOPPED) and its latest deploys (in progress: DEPLOYING; a failed newest
  deploy leaves the previous live one serving: RUNNING).
- logs: ``GET /logs`` for the service, newest first, paged back with ``nextEndTime``, shown oldest first.
- rollback: ``POST /services/{id}/rollback {"deployId"}`` to the given deploy, or the newest one before the
  live one that once was live (``deactivated``).

Secrets (DATABASE_URL, AUTH_SECRET, PUBLIC_URL, the OFFLINE_*_TOKEN ones) travel only in request bodies to
Render; the API key only in the Authorization header. Neither reaches deploy.json, argv, output or logs.
``offline deploy --reset`` calls nothing here (the service keeps running).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ._aws import check_engine
from ._cli import poll_until_healthy, redact
from .base import (
    MISSING_OPTION,
    NAME_TAKEN,
    NO_PREVIOUS_DEPLOYMENT,
    NOT_DEPLOYED,
    PLATFORM_ERROR,
    SECRET_VARIABLES,
    DeployContext,
    DeployError,
    Deployment,
    DeploymentState,
    DeployOutcome,
    PlatformAdapter,
    StatusReport,
    report_change,
)
from .container_engine import require_platform, split_reference
from .image_registry import RegistryTarget, parse_registry, push_image
from .render_api import RenderApi, RenderApiError, create_service_body, disk_body, image_spec

__all__ = [
    "DATA_DIR",
    "DISK_NAME",
    "RenderAdapter",
    "credential_for_host",
    "render_rollback_target",
    "render_status_report",
]

DATA_DIR = "/data"
SQLITE_PATH = f"{DATA_DIR}/offline-server.db"
DISK_NAME = "offline-data"
DISK_SIZE_GB = 1
#: The smallest instance type that can have a disk; the plan line says so before anything is created.
PLAN = "starter"
HEALTH_PATH = "/health"
LOG_LINES_ON_FAILURE = 30

IN_PROGRESS = frozenset(
    {"created", "queued", "build_in_progress", "update_in_progress", "pre_deploy_in_progress"}
)
FAILED = frozenset({"build_failed", "update_failed", "pre_deploy_failed", "canceled"})
#: A deploy that served once keeps its image: the ones a rollback may return to.
ROLLBACK_ABLE = frozenset({"deactivated"})

#: Registry hosts of each credential type Render knows (``registry`` of ``GET /registrycredentials``).
_CREDENTIAL_HOSTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("GITHUB", re.compile(r"^ghcr\.io$")),
    ("GITLAB", re.compile(r"^registry\.gitlab\.com$")),
    ("DOCKER", re.compile(r"^(docker\.io|index\.docker\.io|registry-1\.docker\.io)$")),
    ("GOOGLE_ARTIFACT", re.compile(r"(^|\.)(pkg\.dev|gcr\.io)$")),
    ("AWS_ECR", re.compile(r"\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com$")),
)


def credential_for_host(credentials: Sequence[Mapping[str, Any]], host: str) -> list[Mapping[str, Any]]:
    """The credentials whose registry type serves ``host`` (``ghcr.io`` -> the GITHUB ones)."""
    types = {kind for kind, pattern in _CREDENTIAL_HOSTS if pattern.search(host.lower())}
    return [credential for credential in credentials if credential.get("registry") in types]


def _status(deploy: Mapping[str, Any] | None) -> str:
    return str((deploy or {}).get("status") or "unknown").lower()


def render_status_report(
    deploys: Sequence[Mapping[str, Any]],
    *,
    url: str | None,
    deployment_id: str | None = None,
    suspended: bool = False,
) -> StatusReport:
    """A StatusReport from a service's deploys (newest first), for ``deployment_id`` or the newest one."""
    if suspended:
        return StatusReport("STOPPED", False, url, deployment_id, {"suspended": True})
    if not deploys:
        return StatusReport("NOT_FOUND", False, url, deployment_id, {"deploys": 0})
    live = next((d for d in deploys if _status(d) == "live"), None)
    target = next((d for d in deploys if d.get("id") == deployment_id), None) if deployment_id else deploys[0]
    status = _status(target)
    state: DeploymentState
    if target is None:
        state = "UNKNOWN"
    elif status in IN_PROGRESS:
        state = "DEPLOYING"
    elif status == "live" or (deployment_id is None and live is not None):
        state = "RUNNING"  # a newer failed or canceled deploy leaves the live one serving
    elif status in FAILED:
        state = "FAILED"
    elif status == "deactivated":
        state = "STOPPED"
    else:
        state = "UNKNOWN"
    healthy = live is not None and (deployment_id is None or live is target)
    if deployment_id is None and state == "RUNNING":
        target = live  # what serves, not a newer deploy that failed
    return StatusReport(
        state,
        healthy,
        url,
        str(target.get("id")) if target else deployment_id,
        {
            "status": status,
            "live": str(live.get("id")) if live else None,
            "latest": {"id": deploys[0].get("id"), "status": _status(deploys[0])},
        },
    )


def render_rollback_target(
    deploys: Sequence[Mapping[str, Any]], deployment_id: str | None
) -> Mapping[str, Any]:
    """``deployment_id`` (one that served once and is not live now), or the newest such deploy older than
    the live one."""
    live = next((d for d in deploys if _status(d) == "live"), None)
    candidates = [d for d in deploys if _status(d) in ROLLBACK_ABLE]
    if deployment_id is not None:
        target = next((d for d in candidates if d.get("id") == deployment_id), None)
        if target is None:
            known = ", ".join(str(d.get("id")) for d in candidates) or "none"
            raise DeployError(
                f"No previous deploy {deployment_id!r} to roll back to on Render (deploys that served and "
                f"can be restored: {known}).",
                NO_PREVIOUS_DEPLOYMENT,
                {"deployment_id": deployment_id},
                hint="Pick one of those ids, or omit it to return to the deploy before the live one.",
            )
        return target
    start = deploys.index(live) + 1 if live is not None else 0
    for deploy in deploys[start:]:
        if _status(deploy) in ROLLBACK_ABLE:
            return deploy
    raise DeployError(
        "No previous deploy to roll back to on Render (it needs an earlier deploy that was live).",
        NO_PREVIOUS_DEPLOYMENT,
        {},
        hint="Deploy a new version first; rollback returns to the deploy before the live one.",
    )


def _url(service: Mapping[str, Any] | None) -> str:
    details = (service or {}).get("serviceDetails") or {}
    return str(details.get("url") or "")


def _repository(reference: str) -> str:
    """``host/ns/app:tag`` (or ``...@sha256:...``) -> ``host/ns/app``."""
    return split_reference(reference.split("@", 1)[0])[0] if reference else ""


class RenderAdapter(PlatformAdapter):
    name = "web-service-host"
    title = "Render"
    default_region = "oregon"
    regions = ("oregon", "ohio", "virginia", "frankfurt", "singapore")
    needs_container_engine = True
    persistent_storage = True  # a Render disk at /data

    def __init__(self) -> None:
        self._owner_id: str | None = None
        self._credential: Mapping[str, Any] | None = None
        self._service_cache: dict[str, Any] | None = None
        self._looked_up = False  # _service_cache holds the answer, None included
        self._client: RenderApi | None = None

    # -- plumbing

    def _api(self, ctx: DeployContext) -> RenderApi:
        if self._client is None:
            self._client = RenderApi.from_env(ctx.env, mask=lambda text: redact(text, ctx))
        return self._client

    def _sqlite(self, ctx: DeployContext) -> bool:
        return "DATABASE_URL" not in ctx.forwarded_secrets()

    def _registry(self, ctx: DeployContext) -> RegistryTarget:
        value = ctx.options.get("registry")
        if not value:
            raise DeployError(
                "--registry is required: Render runs an image it pulls from a registry, and the deploy "
                "pushes the image it builds to the registry you name",
                MISSING_OPTION,
                {"option": "--registry"},
                hint="Pass it on the command line, e.g. offline deploy --platform render --registry ghcr.io/my-team "
                "(log the engine in first: `docker login ghcr.io`).",
            )
        return parse_registry(str(value))

    def _owner(self, ctx: DeployContext) -> str:
        """The workspace: remembered, else the one ``--workspace`` names, else the only one the key sees."""
        if self._owner_id:
            return self._owner_id
        owners = self._api(ctx).list_all("/owners", "owner")
        wanted = ctx.options.get("workspace")
        remembered = ctx.state.get("owner_id")
        chosen = None
        for owner in owners:
            if owner.get("id") == remembered or (wanted and wanted in (owner.get("id"), owner.get("name"))):
                chosen = owner
                break
        if chosen is None and not wanted and len(owners) == 1:
            chosen = owners[0]
        if chosen is None:
            names = ", ".join(f"{o.get('name')} ({o.get('id')})" for o in owners) or "none"
            if wanted:
                raise DeployError(
                    f"The Render API key sees no workspace {wanted!r} (workspaces: {names}).",
                    PLATFORM_ERROR,
                    {"option": "--workspace", "value": wanted},
                    hint="Pass one of those names or ids with --workspace, or use an API key of that workspace.",
                )
            raise DeployError(
                f"--workspace is required: the Render API key sees several workspaces ({names}), and "
                "offline deploy does not guess which one",
                MISSING_OPTION,
                {"option": "--workspace"},
                hint="Pass it on the command line: offline deploy --platform render --workspace <name or id>",
            )
        self._owner_id = str(chosen["id"])
        return self._owner_id

    def _find_service(self, ctx: DeployContext, *, refresh: bool = False) -> dict[str, Any] | None:
        """The app's service: by the remembered id, else by name in the workspace; None when there is none.
        A service of that name that runs no image is someone else's: NAME_TAKEN."""
        if self._looked_up and not refresh:
            return self._service_cache
        api = self._api(ctx)
        service_id = ctx.state.get("service_id")
        service = None
        if service_id:
            service = api.request("GET", f"/services/{service_id}", allow=(404,))
            if service is None:
                ctx.reporter.warn(
                    f"Render has no service {service_id} any more (deleted?); looking for {ctx.app} by name"
                )
        if service is None:
            owner = self._owner(ctx)
            found = [
                s
                for s in api.list_all("/services", "service", {"name": ctx.app, "ownerId": owner})
                if s.get("name") == ctx.app
            ]
            if found:
                service = found[0]
                if service.get("type") != "web_service" or not service.get("imagePath"):
                    raise DeployError(
                        f"name has already been taken: the Render workspace already has a service named "
                        f"{ctx.app!r} ({service.get('id')}, type {service.get('type')}) that does not run an image.",
                        NAME_TAKEN,
                        {"app": ctx.app, "service_id": service.get("id")},
                        hint=_taken_hint(ctx.app),
                    )
                if not service_id:
                    ctx.reporter.info(
                        f"Found the Render web service {ctx.app} ({service.get('id')}); deploying to it"
                    )
        self._service_cache = dict(service) if isinstance(service, Mapping) else None
        self._looked_up = True
        return self._service_cache

    def _require_service(self, ctx: DeployContext) -> dict[str, Any]:
        service = self._find_service(ctx)
        if service is None:
            raise DeployError(
                f"Render has no web service {ctx.app!r} in this workspace.",
                NOT_DEPLOYED,
                {"app": ctx.app},
                hint="Run `offline deploy` to create it (or `offline deploy --reset` to forget the old one).",
            )
        return service

    def _plain_env(self, ctx: DeployContext) -> dict[str, str]:
        """Variables that are not secret: the port, the proxy trust (Render's proxy is the only way in), the
        SQLite file on the disk."""
        plain = {"PORT": str(ctx.port), "OFFLINE_TRUSTED_PROXIES": "*"}
        if self._sqlite(ctx):
            plain["OFFLINE_SERVER_DB"] = SQLITE_PATH
        return plain

    def _resolve_credential(self, ctx: DeployContext, registry: RegistryTarget) -> Mapping[str, Any] | None:
        """The workspace's registry credential Render pulls the image with (see the module docstring)."""
        wanted = ctx.options.get("registry_credential")
        credentials = [
            c
            for c in self._api(ctx).request(
                "GET", "/registrycredentials", params={"ownerId": self._owner(ctx)}
            )
            or []
            if isinstance(c, Mapping)
        ]
        if wanted:
            for credential in credentials:
                if wanted in (credential.get("name"), credential.get("id")):
                    return credential
            names = ", ".join(str(c.get("name")) for c in credentials) or "none"
            raise DeployError(
                f"The Render workspace has no registry credential named {wanted!r} (credentials: {names}).",
                PLATFORM_ERROR,
                {"option": "--registry-credential", "value": wanted},
                hint="Add it in the Render Dashboard (Workspace Settings > Registry Credentials) or pass "
                "another name with --registry-credential, then retry.",
            )
        matching = credential_for_host(credentials, registry.host)
        if len(matching) == 1:
            return matching[0]
        if len(matching) > 1:
            names = ", ".join(str(c.get("name")) for c in matching)
            raise DeployError(
                f"--registry-credential is required: the Render workspace has several credentials for "
                f"{registry.host} ({names})",
                MISSING_OPTION,
                {"option": "--registry-credential"},
                hint="Pass it on the command line: --registry-credential <name>",
            )
        ctx.reporter.warn(
            f"Render has no registry credential for {registry.host}: it pulls the image without one, so the "
            f"repository must be public (add a credential in the Render Dashboard and pass "
            "--registry-credential NAME for a private one)"
        )
        return None

    # -- the interface

    def check_prerequisites(self, ctx: DeployContext) -> None:
        # Only a deploy gets an engine: it also needs the registry (a flag, so it is checked first).
        deploying = ctx.engine is not None
        registry = self._registry(ctx) if deploying else None
        self._owner(ctx)  # the key is accepted (401: NOT_AUTHENTICATED) and the workspace known
        if registry is not None:
            check_engine(ctx.engine)
            self._credential = self._resolve_credential(ctx, registry)

    def existing_secrets(self, ctx: DeployContext) -> dict[str, str | None]:
        service = self._find_service(ctx)
        if service is None:
            return {}
        variables = self._api(ctx).list_all(f"/services/{service['id']}/env-vars", "envVar")
        names = {str(v.get("key")) for v in variables}
        # Render keeps every variable across deploys: nothing needs sending again.
        return {name: None for name in SECRET_VARIABLES if name in names}

    def planned_resources(self, ctx: DeployContext) -> list[str]:
        registry = ctx.options.get("registry") or "<--registry>"
        service_id = ctx.state.get("service_id")
        if service_id:
            lines = [f"a new deploy of the Render web service {ctx.app} ({service_id})"]
        else:
            region = ctx.region or self.default_region
            lines = [
                f"Render web service {ctx.app} (when missing): image-backed, instance type {PLAN}, region "
                f"{region}, health check {HEALTH_PATH}"
            ]
        if self._sqlite(ctx):
            lines.append(
                f"Render disk {DISK_NAME} ({DISK_SIZE_GB} GB) at {DATA_DIR} for the SQLite file (when missing)"
            )
        credential = self._credential.get("name") if self._credential else None
        lines.append(
            f"image {registry}/{ctx.app} built here and pushed with the engine's login; Render pulls it "
            + (
                f"with the registry credential {credential}"
                if credential
                else "without a credential (public)"
            )
        )
        return lines

    def storage(self, ctx: DeployContext) -> str:
        if not self._sqlite(ctx):
            return "the database at DATABASE_URL"
        return f"SQLite on the Render disk {DISK_NAME} at {DATA_DIR} (kept across deploys)"

    def provision(self, ctx: DeployContext) -> dict[str, Any]:
        owner = self._owner(ctx)
        service = self._find_service(ctx, refresh=True)
        state: dict[str, Any] = {"owner_id": owner, "service": ctx.app}
        if service is None:
            return state  # created by deploy(), which has the image Render needs to create it
        api = self._api(ctx)
        service_id = str(service["id"])
        variables = {**self._plain_env(ctx), **ctx.forwarded_secrets()}
        secret_names = [name for name in variables if name in SECRET_VARIABLES]
        if secret_names:
            ctx.reporter.info(f"Setting Render environment variables {', '.join(secret_names)}")
        for key, value in variables.items():
            api.request("PUT", f"/services/{service_id}/env-vars/{key}", body={"value": value})
        details = service.get("serviceDetails") or {}
        if details.get("healthCheckPath") != HEALTH_PATH:
            api.request(
                "PATCH", f"/services/{service_id}", body={"serviceDetails": {"healthCheckPath": HEALTH_PATH}}
            )
        if self._sqlite(ctx):
            self._ensure_disk(ctx, service)
        state.update({"service_id": service_id, "url": _url(service) or ctx.state.get("url")})
        return state

    def _ensure_disk(self, ctx: DeployContext, service: Mapping[str, Any]) -> None:
        disk = (service.get("serviceDetails") or {}).get("disk")
        if isinstance(disk, Mapping):
            if disk.get("mountPath") == DATA_DIR:
                return
            raise DeployError(
                f"The Render service {ctx.app} has a disk at {disk.get('mountPath')}, not at {DATA_DIR} where "
                "the server keeps its SQLite file.",
                PLATFORM_ERROR,
                {"service_id": service.get("id"), "mount_path": disk.get("mountPath")},
                hint=f"Change the disk's mount path to {DATA_DIR} in the Render Dashboard (or set DATABASE_URL), "
                "then deploy again.",
            )
        ctx.reporter.info(f"No DATABASE_URL: adding a Render disk at {DATA_DIR} for the SQLite file")
        self._api(ctx).request(
            "POST", "/disks", body=disk_body(DISK_NAME, DATA_DIR, DISK_SIZE_GB, str(service["id"]))
        )

    def deploy(self, ctx: DeployContext) -> DeployOutcome:
        registry = self._registry(ctx)
        engine = ctx.engine if ctx.engine is not None else check_engine(None)  # pinged by the prerequisites
        local_tag = f"offline-{ctx.app}:latest"
        ctx.reporter.step("Building the image for linux/amd64")
        image_id = engine.build(ctx.deploy_dir, local_tag)
        require_platform(engine, local_tag)
        ctx.reporter.step(f"Pushing the image to {registry}")
        tag = image_id.split(":")[-1][:12] or "latest"
        reference, digest = push_image(engine, local_tag, registry, ctx.app, tag, ctx.reporter)
        owner = self._owner(ctx)
        if self._credential is None and ctx.options.get("registry_credential"):
            self._credential = self._resolve_credential(ctx, registry)
        credential_id = str(self._credential["id"]) if self._credential else None
        image = image_spec(owner, reference, credential_id)
        api = self._api(ctx)
        service = self._find_service(ctx)
        if service is None:
            ctx.reporter.step(f"Creating the Render web service {ctx.app}")
            body = create_service_body(
                name=ctx.app,
                owner_id=owner,
                image=image,
                env={**self._plain_env(ctx), **ctx.forwarded_secrets()},
                region=ctx.region or self.default_region,
                plan=PLAN,
                health_check_path=HEALTH_PATH,
                disk=disk_body(DISK_NAME, DATA_DIR, DISK_SIZE_GB) if self._sqlite(ctx) else None,
            )
            try:
                created = api.request("POST", "/services", body=body)
            except RenderApiError as exc:
                if exc.status == 409:
                    exc.hint = _taken_hint(ctx.app)
                raise
            service = dict(created.get("service") or {})
            deploy_id = str(created.get("deployId") or "")
            self._service_cache = service
        else:
            ctx.reporter.step(f"Starting a deploy of the Render web service {ctx.app}")
            current_credential = (service.get("registryCredential") or {}).get("id")
            if _repository(str(service.get("imagePath") or "")) != _repository(reference) or (
                current_credential != credential_id
            ):
                api.request("PATCH", f"/services/{service['id']}", body={"image": image})
            deploy = api.request("POST", f"/services/{service['id']}/deploys", body={"imageUrl": reference})
            deploy_id = str((deploy or {}).get("id") or "")
        url = _url(service) or str(ctx.state.get("url") or "")
        return DeployOutcome(
            url=url,
            deployment_id=deploy_id,
            state={
                "owner_id": owner,
                "service_id": str(service.get("id")),
                "service": ctx.app,
                "url": url,
                "image": reference,
                "digest": digest,
            },
        )

    def _deploys(self, ctx: DeployContext, service_id: str, limit: int = 20) -> list[dict[str, Any]]:
        page = self._api(ctx).request("GET", f"/services/{service_id}/deploys", params={"limit": limit})
        return [
            dict(e["deploy"])
            for e in page or []
            if isinstance(e, Mapping) and isinstance(e.get("deploy"), Mapping)
        ]

    def wait_until_healthy(self, ctx: DeployContext, outcome: DeployOutcome) -> StatusReport:
        service_id = str(ctx.state.get("service_id") or outcome.state.get("service_id") or "")
        seen: list[str] = []
        api = self._api(ctx)
        # The deploy's own log lines go to the live view (and the run's log file) as Render writes them.
        vendor_line = getattr(ctx.reporter, "vendor_line", None)
        shown: set[str] = set()

        def probe() -> StatusReport:
            deploy = api.request("GET", f"/services/{service_id}/deploys/{outcome.deployment_id}")
            if callable(vendor_line) and isinstance(deploy, Mapping):
                for line in self._log_lines(ctx, 100, since=deploy.get("createdAt")):
                    if line not in shown:
                        shown.add(line)
                        vendor_line(line)
            report = render_status_report(
                [deploy], url=outcome.url or None, deployment_id=outcome.deployment_id
            )
            report_change(ctx.reporter, seen, f"Render deploy {outcome.deployment_id}: {_status(deploy)}")
            if report.state == "RUNNING":
                return StatusReport("RUNNING", True, report.url, report.deployment_id, report.details)
            return StatusReport(
                report.state, False, report.url, report.deployment_id, {**report.details, "deploy": deploy}
            )

        def give_up(report: StatusReport) -> DeployError | None:
            status = str(report.details.get("status"))
            if status not in FAILED:
                return None
            deploy = report.details.get("deploy") or {}
            lines = self._log_lines(ctx, LOG_LINES_ON_FAILURE, since=deploy.get("createdAt"))
            shown = "\n".join(f"  {line}" for line in lines) or "  (Render returned no log lines for it)"
            return DeployError(
                f"Render deploy {outcome.deployment_id} of {ctx.app} ended as {status}. Its last log lines:\n{shown}",
                PLATFORM_ERROR,
                {"deployment_id": outcome.deployment_id, "status": status},
                hint="Fix the cause shown in the log lines (a missing variable, a crash at start), then run "
                "`offline deploy` again; the previous deploy, if any, keeps serving.",
            )

        return poll_until_healthy(
            ctx,
            probe,
            what=f"Render service {ctx.app!r}",
            hint="Check `offline deploy status` and `offline deploy logs`, or the service in the Render Dashboard.",
            give_up=give_up,
        )

    def status(self, ctx: DeployContext) -> StatusReport:
        service = self._find_service(ctx)
        if service is None:
            return StatusReport("NOT_FOUND", False, None, None, {"service": ctx.app})
        deploys = self._deploys(ctx, str(service["id"]), limit=10)
        report = render_status_report(
            deploys, url=_url(service) or None, suspended=service.get("suspended") == "suspended"
        )
        details = service.get("serviceDetails") or {}
        disk = details.get("disk") if isinstance(details.get("disk"), Mapping) else None
        extra = {
            "service_id": service.get("id"),
            "dashboard": service.get("dashboardUrl"),
            "region": details.get("region"),
            "plan": details.get("plan"),
            "disk": f"{disk.get('name')} at {disk.get('mountPath')}" if disk else None,
        }
        return StatusReport(
            report.state, report.healthy, report.url, report.deployment_id, {**report.details, **extra}
        )

    def _log_lines(self, ctx: DeployContext, lines: int, *, since: str | None = None) -> list[str]:
        service = self._require_service(ctx)
        params: dict[str, Any] = {
            "ownerId": self._owner(ctx),
            "resource": [str(service["id"])],
            "direction": "backward",
        }
        if since:
            params["startTime"] = since
        collected: list[str] = []
        api = self._api(ctx)
        while len(collected) < lines:
            params["limit"] = min(100, lines - len(collected))
            page = api.request("GET", "/logs", params=params) or {}
            for entry in page.get("logs") or []:
                if isinstance(entry, Mapping):
                    collected.append(
                        redact(f"{entry.get('timestamp', '')} {entry.get('message', '')}".strip(), ctx)
                    )
            if not page.get("hasMore") or not page.get("nextEndTime"):
                break
            params["endTime"] = page["nextEndTime"]
        return list(reversed(collected[:lines]))  # newest first from Render; oldest first on screen

    def logs(self, ctx: DeployContext, *, lines: int = 100) -> list[str]:
        return self._log_lines(ctx, lines) if lines > 0 else []

    def deployments(self, ctx: DeployContext) -> list[Deployment]:
        service = self._require_service(ctx)
        deploys = self._deploys(ctx, str(service["id"]))
        live = next((d for d in deploys if _status(d) == "live"), None)
        return [
            Deployment(
                id=str(d.get("id")),
                status=_status(d),
                created_at=str(d["createdAt"]) if d.get("createdAt") else None,
                image=str((d.get("image") or {}).get("ref") or "") or None,
                current=d is live,
            )
            for d in deploys
        ]

    def rollback(self, ctx: DeployContext, deployment_id: str | None = None) -> DeployOutcome:
        service = self._require_service(ctx)
        service_id = str(service["id"])
        target = render_rollback_target(self._deploys(ctx, service_id), deployment_id)
        target_id = str(target.get("id"))
        ctx.reporter.info(f"Rolling back to Render deploy {target_id}")
        deploy = self._api(ctx).request(
            "POST", f"/services/{service_id}/rollback", body={"deployId": target_id}
        )
        url = _url(service) or str(ctx.state.get("url") or "")
        image = (target.get("image") or {}).get("ref")
        return DeployOutcome(
            url=url,
            deployment_id=str((deploy or {}).get("id") or ""),
            state={
                "service_id": service_id,
                "url": url,
                "rolled_back_to": target_id,
                **({"image": image} if image else {}),
            },
        )


def _taken_hint(app: str) -> str:
    return (
        f"Render service names are unique within a workspace: pick another with --app NAME, or delete the "
        f"service {app!r} in the Render Dashboard if it is no longer needed."
    )
