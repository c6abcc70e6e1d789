"""``--platform host-b``: Railway through the ``railway`` CLI, plus Railway's public GraphQL API for rollback.

Every CLI call runs in the deploy directory, which ``railway init`` links to the project (Railway keeps
links per directory in the user's CLI config), and names the service with ``--service <app>``.

- prerequisites: ``railway whoami --json``. A project token in RAILWAY_TOKEN cannot answer whoami, so with
  one set a refused whoami is not an error (the next call tells whether the token works).
- ``railway.json`` in the deploy directory: Dockerfile builder, ``/health`` health check, restart policy.
- provision: ``railway status --json`` shows the linked project. Without one (or linked to a project of
  another name on the first deploy) ``railway init --name <app>`` creates and links it (workspace from
  ``--workspace``, i.e. ``ctx.options["workspace"]``); a later run linked elsewhere is relinked with
  ``railway link --project``.
  A missing service is created with ``railway add --service <app>``. Without DATABASE_URL the SQLite file
  lives on a ``/data`` volume: every deploy checks ``railway volume --service <id> list --json`` and adds
  the missing volume with ``railway volume --service <id> add --mount-path /data`` (``railway volume``
  takes the service *id*; it panics on a name), asking again once when the add fails; a volume that still
  is not there stops the deploy instead of running SQLite on a throwaway disk. Plain variables (PORT, the
  SQLite path) go through ``railway variables --set ... --skip-deploys``; the forwarded variables
  (DATABASE_URL, AUTH_SECRET, PUBLIC_URL, the OFFLINE_*_TOKEN ones) each go through
  ``railway variables --set-from-stdin NAME --skip-deploys`` with the value on stdin, never in an argv.
  ``railway domain --json`` returns the public domain, generating one when the service has none.
- deploy: ``railway up --detach --ci --service <app>`` uploads the deploy directory; Railway builds it.
- readiness: the deployment's status in ``railway deployment list --json`` (SUCCESS; DEPLOYING while it
  builds or starts; FAILED or CRASHED stop the wait).
- rollback: ``railway redeploy`` only repeats the latest deployment, so the GraphQL mutation
  ``deploymentRollback(id)`` is POSTed to Railway's public API (``OFFLINE_RAILWAY_API_URL`` overrides the
  endpoint) with RAILWAY_API_TOKEN (``Authorization: Bearer``) or RAILWAY_TOKEN (``Project-Access-Token``).
- logs: ``railway logs --lines N --json``.

``offline deploy --reset`` is handled by the deploy command alone; this adapter has no reset entry point,
so a reset never calls Railway (the project keeps running, and the deploy directory's link stays in the
Railway CLI config until ``railway unlink``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from ._cli import LONG_TIMEOUT, failure, find_cli, output_tail, poll_until_healthy, redact, run_cli
from .base import (
    NO_PREVIOUS_DEPLOYMENT,
    NOT_AUTHENTICATED,
    PLATFORM_ERROR,
    SECRET_VARIABLES,
    CommandResult,
    DeployContext,
    DeployError,
    Deployment,
    DeploymentState,
    DeployOutcome,
    PlatformAdapter,
    StatusReport,
    report_change,
)

__all__ = [
    "API_URL_ENV",
    "CONFIG_NAME",
    "DEFAULT_API_URL",
    "ROLLBACK_MUTATION",
    "RailwayAdapter",
    "railway_add_service_argv",
    "railway_deployments_argv",
    "railway_domain_argv",
    "railway_init_argv",
    "railway_link_argv",
    "railway_logs_argv",
    "railway_rollback_target",
    "railway_status_argv",
    "railway_status_report",
    "railway_up_argv",
    "railway_variable_stdin_argv",
    "railway_variables_list_argv",
    "railway_variables_set_argv",
    "railway_volume_add_argv",
    "railway_volume_list_argv",
    "railway_volume_mounts",
    "railway_whoami_argv",
    "render_railway_json",
]

CLI = "railway"
CONFIG_NAME = "railway.json"
IGNORE_NAME = ".railwayignore"
DEFAULT_API_URL = "https://backboard.railway.com/graphql/v2"
API_URL_ENV = "OFFLINE_RAILWAY_API_URL"
ROLLBACK_MUTATION = "mutation deploymentRollback($id: String!) { deploymentRollback(id: $id) }"
DATA_DIR = "/data"
SQLITE_PATH = f"{DATA_DIR}/offline-server.db"

INSTALL_HINT = (
    "Install the Railway CLI: `npm install -g @railway/cli` (macOS: `brew install railway`), "
    "then run `railway login`."
)
LOGIN_HINT = (
    "Run `railway login`, or set RAILWAY_API_TOKEN (an account token) or RAILWAY_TOKEN (a project token), "
    "then retry."
)
UPDATE_HINT = (
    "This Railway CLI does not know the command: update it with `npm install -g @railway/cli@latest` "
    "(or `brew upgrade railway`), then retry."
)
TOKEN_HINT = (
    "Rollback calls Railway's API directly: create a token at https://railway.com/account/tokens and set "
    "RAILWAY_API_TOKEN (or RAILWAY_TOKEN to a project token), then retry."
)
AUTH_MARKERS = ("unauthorized", "railway login", "not logged in", "invalid token")
NOT_LINKED_MARKERS = ("no linked project", "railway link", "project not found")

IN_PROGRESS = frozenset({"BUILDING", "DEPLOYING", "INITIALIZING", "QUEUED", "WAITING", "NEEDS_APPROVAL"})
LIVE = frozenset({"SUCCESS", "SLEEPING"})
#: Deployments that ran and were replaced keep their image, so they can be rolled back to.
ROLLBACK_ABLE = frozenset({"SUCCESS", "SLEEPING", "REMOVED"})
ENDED_BADLY = frozenset({"FAILED", "CRASHED", "REMOVED", "REMOVING", "SKIPPED"})


# -- argv builders (pure) -------------------------------------------------------------------------------------


def railway_whoami_argv() -> list[str]:
    return [CLI, "whoami", "--json"]


def railway_status_argv() -> list[str]:
    return [CLI, "status", "--json"]


def railway_init_argv(name: str, workspace: str | None = None) -> list[str]:
    return [CLI, "init", "--name", name, *(["--workspace", workspace] if workspace else [])]


def railway_link_argv(project_id: str, environment_id: str | None = None) -> list[str]:
    return [
        CLI,
        "link",
        "--project",
        project_id,
        *(["--environment", environment_id] if environment_id else []),
    ]


def railway_add_service_argv(service: str) -> list[str]:
    return [CLI, "add", "--service", service]


def railway_volume_add_argv(service_id: str, mount_path: str = DATA_DIR) -> list[str]:
    # --service belongs to `railway volume` itself, so it goes before the subcommand; it is the service
    # id (the CLI looks the name up by id and panics when given a name).
    return [CLI, "volume", "--service", service_id, "add", "--mount-path", mount_path]


def railway_volume_list_argv(service_id: str) -> list[str]:
    return [CLI, "volume", "--service", service_id, "list", "--json"]


def railway_variables_list_argv(service: str) -> list[str]:
    """All variables of the service as one JSON object (values included: only the names are used)."""
    return [CLI, "variables", "--service", service, "--json"]


def railway_volume_mounts(data: Any, service_name: str) -> set[str]:
    """Mount paths of the volumes ``railway volume list --json`` shows attached to ``service_name``."""
    volumes = data.get("volumes") if isinstance(data, Mapping) else data
    return {
        str(volume.get("mountPath"))
        for volume in volumes or []
        if isinstance(volume, Mapping)
        and volume.get("serviceName") == service_name
        and volume.get("mountPath")
    }


def railway_variables_set_argv(service: str, values: Mapping[str, str]) -> list[str]:
    """Plain, non-secret variables only: argv is visible in process lists (secrets use stdin)."""
    pairs = [arg for name, value in values.items() for arg in ("--set", f"{name}={value}")]
    return [CLI, "variables", "--service", service, *pairs, "--skip-deploys"]


def railway_variable_stdin_argv(service: str, name: str) -> list[str]:
    """Sets ``name`` to the value read from stdin."""
    return [CLI, "variables", "--service", service, "--set-from-stdin", name, "--skip-deploys"]


def railway_domain_argv(service: str) -> list[str]:
    return [CLI, "domain", "--service", service, "--json"]


def railway_up_argv(service: str) -> list[str]:
    return [CLI, "up", "--detach", "--ci", "--service", service]


def railway_deployments_argv(service: str) -> list[str]:
    return [CLI, "deployment", "list", "--service", service, "--json"]


def railway_logs_argv(service: str, lines: int) -> list[str]:
    return [CLI, "logs", "--service", service, "--lines", str(lines), "--json"]


# -- files (pure) -----------------------------------------------------------------------------------------------


def render_railway_json() -> dict[str, Any]:
    """Railway's config-as-code for this deploy; no variables (those are set through the CLI)."""
    return {
        "$schema": "https://railway.com/railway.schema.json",
        "build": {"builder": "DOCKERFILE", "dockerfilePath": "Dockerfile"},
        "deploy": {
            "healthcheckPath": "/health",
            "healthcheckTimeout": 300,
            "restartPolicyType": "ON_FAILURE",
            "restartPolicyMaxRetries": 10,
        },
    }


# -- reading railway's JSON (pure) ------------------------------------------------------------------------------


def _nodes(connection: Any) -> list[dict[str, Any]]:
    """GraphQL ``{edges: [{node}]}`` (what `railway status --json` prints) or a plain list, as dicts."""
    if isinstance(connection, Mapping):
        connection = [edge.get("node") for edge in connection.get("edges") or [] if isinstance(edge, Mapping)]
    return [dict(item) for item in connection or [] if isinstance(item, Mapping)]


def project_service(
    project: Mapping[str, Any], name: str, service_id: str | None = None
) -> dict[str, Any] | None:
    for service in _nodes(project.get("services")):
        if (service_id and service.get("id") == service_id) or service.get("name") == name:
            return service
    return None


def project_environment(project: Mapping[str, Any], wanted: str | None = None) -> dict[str, Any] | None:
    environments = _nodes(project.get("environments"))
    for environment in environments:
        if wanted and wanted in (environment.get("id"), environment.get("name")):
            return environment
    production = [e for e in environments if e.get("name") == "production"]
    return (production or environments)[0] if environments else None


def _newest_first(deployments: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    # ISO-8601 UTC timestamps sort as strings; Railway already lists newest first, keep that on ties.
    return sorted(deployments, key=lambda d: str(d.get("createdAt") or ""), reverse=True)


def _status(deployment: Mapping[str, Any] | None) -> str:
    return str((deployment or {}).get("status") or "UNKNOWN").upper()


def railway_status_report(
    deployments: Sequence[Mapping[str, Any]], *, url: str | None = None, deployment_id: str | None = None
) -> StatusReport:
    """Map ``railway deployment list --json`` onto a StatusReport, for ``deployment_id`` or the newest one.

    A newer deployment that is building makes the state DEPLOYING even though the previous one still serves
    (``healthy`` stays true then). A newer deployment that FAILED leaves the previous one live: RUNNING.
    """
    ordered = _newest_first(deployments)
    if not ordered:
        return StatusReport(state="NOT_FOUND", healthy=False, url=url, details={"deployments": 0})
    live = next((d for d in ordered if _status(d) in LIVE), None)
    target = next((d for d in ordered if d.get("id") == deployment_id), None) if deployment_id else ordered[0]
    status = _status(target)
    state: DeploymentState
    if target is None:
        state = "UNKNOWN"
    elif status in IN_PROGRESS:
        state = "DEPLOYING"
    elif status in LIVE or (status == "FAILED" and deployment_id is None and live is not None):
        state = "RUNNING"
    elif status in ("FAILED", "CRASHED"):
        state = "FAILED"
    elif status in ("REMOVED", "REMOVING", "SKIPPED"):
        state = "RUNNING" if deployment_id is None and live is not None else "STOPPED"
    else:
        state = "UNKNOWN"
    healthy = live is not None and _status(live) != "CRASHED" and state != "FAILED"
    if deployment_id is not None:
        healthy = healthy and live is target
    return StatusReport(
        state=state,
        healthy=healthy,
        url=url,
        deployment_id=str(target.get("id")) if target else deployment_id,
        details={
            "status": status,
            "live": str(live.get("id")) if live else None,
            "latest": {"id": ordered[0].get("id"), "status": _status(ordered[0])},
        },
    )


def railway_rollback_target(
    deployments: Sequence[Mapping[str, Any]], deployment_id: str | None
) -> Mapping[str, Any]:
    """``deployment_id``, or the newest deployment older than the live one that ran (SUCCESS, SLEEPING or
    REMOVED: Railway marks a replaced deployment REMOVED but keeps its image)."""
    ordered = _newest_first(deployments)
    live = next((d for d in ordered if _status(d) in LIVE), None)
    if deployment_id is not None:
        target = next((d for d in ordered if d.get("id") == deployment_id), None)
        if target is None or _status(target) not in ROLLBACK_ABLE or target is live:
            known = ", ".join(
                str(d.get("id")) for d in ordered if _status(d) in ROLLBACK_ABLE and d is not live
            )
            raise DeployError(
                f"No previous deployment {deployment_id!r} to roll back to on Railway "
                f"(deployments that can be restored: {known or 'none'}).",
                NO_PREVIOUS_DEPLOYMENT,
                {"deployment_id": deployment_id},
                hint="List them with `railway deployment list`.",
            )
        return target
    if live is not None:
        for deployment in ordered[ordered.index(live) + 1 :]:
            if _status(deployment) in ROLLBACK_ABLE:
                return deployment
    raise DeployError(
        "No previous deployment to roll back to on Railway (it needs an earlier deployment that ran).",
        NO_PREVIOUS_DEPLOYMENT,
        {},
        hint="Deploy a new version first; rollback returns to the deployment before the live one.",
    )


_URL = re.compile(r"https://[^\s\"'<>]+")
_DEPLOYMENT_IN_URL = re.compile(r"[?&]id=([0-9A-Za-z-]{8,})")


def domain_from_output(text: str) -> str | None:
    """The https URL `railway domain --json` printed: ``{"domain": ...}`` for a new domain, a text line for
    one that already existed (older CLIs)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    candidates: list[str] = []
    if isinstance(data, Mapping):
        for key in ("domain", "url"):
            if isinstance(data.get(key), str):
                candidates.append(data[key])
        candidates += [d for d in data.get("domains") or [] if isinstance(d, str)]
    candidates += _URL.findall(text)
    for candidate in candidates:
        candidate = candidate.strip()
        if candidate:
            return candidate if "://" in candidate else f"https://{candidate}"
    return None


def deployment_from_up_output(text: str) -> str | None:
    """The deployment id `railway up` printed: ``{"deploymentId"}`` with --json, else the ``id=`` parameter
    of its build-logs URL."""
    for line in text.splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, Mapping) and isinstance(data.get("deploymentId"), str):
            return str(data["deploymentId"])
    match = _DEPLOYMENT_IN_URL.search(text)
    return match.group(1) if match else None


def format_log_line(line: str) -> str:
    """One line of `railway logs --json` as ``timestamp message`` (non-JSON lines pass through)."""
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        return line.rstrip()
    if not isinstance(entry, Mapping):
        return line.rstrip()
    message = str(entry.get("message") or "").rstrip()
    stamp = entry.get("timestamp")
    return f"{stamp} {message}" if stamp else message


# -- the adapter ------------------------------------------------------------------------------------------------


class RailwayAdapter(PlatformAdapter):
    name = "host-b"
    title = "Railway"
    default_region = None  # Railway places the service itself

    def __init__(self) -> None:
        self._url: str | None = None

    # -- helpers

    def _cli(self, ctx: DeployContext) -> str:
        return find_cli(ctx, (CLI,), vendor="Railway (--platform host-b)", install_hint=INSTALL_HINT)

    def _cwd(self, ctx: DeployContext) -> Path:
        return ctx.deploy_dir if ctx.deploy_dir.is_dir() else ctx.project_dir

    def _run(self, ctx: DeployContext, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        self._cli(ctx)
        kwargs.setdefault("cwd", self._cwd(ctx))
        return run_cli(
            ctx, argv, auth_markers=AUTH_MARKERS, login_hint=LOGIN_HINT, update_hint=UPDATE_HINT, **kwargs
        )

    def _service(self, ctx: DeployContext) -> str:
        return str(ctx.state.get("service") or ctx.app)

    def _sqlite(self, ctx: DeployContext) -> bool:
        return "DATABASE_URL" not in ctx.forwarded_secrets()

    def _linked_project(self, ctx: DeployContext) -> dict[str, Any] | None:
        """The project `railway status --json` shows for the deploy directory, None when nothing is linked."""
        result = self._run(ctx, railway_status_argv(), check=False)
        if result.returncode != 0:
            said = f"{result.stdout}\n{result.stderr}".lower()
            if any(marker in said for marker in NOT_LINKED_MARKERS):
                return None
            raise failure(
                ctx, result, auth_markers=AUTH_MARKERS, login_hint=LOGIN_HINT, update_hint=UPDATE_HINT
            )
        data = result.json()
        if not isinstance(data, dict) or not data.get("id"):
            raise DeployError("`railway status --json` did not print a project.", PLATFORM_ERROR, {})
        return data

    def _deployments(self, ctx: DeployContext) -> list[Mapping[str, Any]]:
        data = self._run(ctx, railway_deployments_argv(self._service(ctx))).json()
        return [d for d in data if isinstance(d, Mapping)] if isinstance(data, list) else []

    def _domain(self, ctx: DeployContext) -> str:
        result = self._run(ctx, railway_domain_argv(self._service(ctx)))
        url = domain_from_output(result.stdout)
        if url is None:
            raise DeployError(
                "`railway domain` printed no domain for the service.",
                PLATFORM_ERROR,
                {"service": self._service(ctx)},
                hint="Generate one in the Railway dashboard (Settings > Networking), then retry.",
            )
        self._url = url
        return url

    def _known_url(self, ctx: DeployContext) -> str | None:
        return self._url or (str(ctx.state["url"]) if ctx.state.get("url") else None)

    def _api_auth(self, ctx: DeployContext) -> tuple[dict[str, str], str]:
        """Headers for Railway's API and the token (to keep it out of error text)."""
        if token := ctx.env.get("RAILWAY_API_TOKEN"):
            return {"Authorization": f"Bearer {token}"}, token
        if token := ctx.env.get("RAILWAY_TOKEN"):
            return {"Project-Access-Token": token}, token
        raise DeployError(
            "cloud CLI is not authenticated for Railway's API: neither RAILWAY_API_TOKEN nor RAILWAY_TOKEN is set.",
            NOT_AUTHENTICATED,
            {"variables": ["RAILWAY_API_TOKEN", "RAILWAY_TOKEN"]},
            hint=TOKEN_HINT,
        )

    def _graphql(self, ctx: DeployContext, query: str, variables: Mapping[str, Any]) -> dict[str, Any]:
        headers, token = self._api_auth(ctx)
        endpoint = ctx.env.get(API_URL_ENV) or DEFAULT_API_URL

        def clean(text: str) -> str:
            return redact(text.replace(token, "***"), ctx)

        try:
            response = httpx.post(
                endpoint, json={"query": query, "variables": dict(variables)}, headers=headers, timeout=30.0
            )
        except httpx.HTTPError as exc:
            raise DeployError(
                f"Could not reach Railway's API at {endpoint}: {clean(str(exc))}",
                PLATFORM_ERROR,
                {"endpoint": endpoint},
                hint="Check the network connection, then retry.",
            ) from None
        if response.status_code in (401, 403):
            raise DeployError(
                f"cloud CLI is not authenticated: Railway's API refused the token (HTTP {response.status_code}).",
                NOT_AUTHENTICATED,
                {"endpoint": endpoint},
                hint=TOKEN_HINT,
            )
        try:
            body = response.json()
        except ValueError:
            body = None
        errors = body.get("errors") if isinstance(body, dict) else None
        messages = "; ".join(str(e.get("message", e)) for e in errors or [] if isinstance(e, Mapping))
        if "not authorized" in messages.lower() or "unauthorized" in messages.lower():
            # GraphQL reports a bad token as an error in a 200 answer.
            raise DeployError(
                f"cloud CLI is not authenticated: Railway's API refused the token ({clean(messages)}).",
                NOT_AUTHENTICATED,
                {"endpoint": endpoint},
                hint=TOKEN_HINT,
            )
        if response.status_code >= 400 or errors or not isinstance(body, dict):
            raise DeployError(
                f"Railway's API answered HTTP {response.status_code}: {clean(messages or response.text[:300])}",
                PLATFORM_ERROR,
                {"endpoint": endpoint, "status": response.status_code},
                hint="Check the deployment id with `railway deployment list`, then retry.",
            )
        data = body.get("data")
        return dict(data) if isinstance(data, Mapping) else {}

    def _ensure_config(self, ctx: DeployContext) -> None:
        if not (ctx.deploy_dir / CONFIG_NAME).is_file():
            self.render_config(ctx)

    def _outcome(self, ctx: DeployContext, deployment_id: str) -> DeployOutcome:
        url = self._known_url(ctx) or self._domain(ctx)
        state: dict[str, Any] = {
            key: ctx.state[key] for key in ("project_id", "environment_id", "service_id") if key in ctx.state
        }
        state.update({"service": self._service(ctx), "url": url, "deployment_id": deployment_id})
        return DeployOutcome(url=url, deployment_id=deployment_id, state=state)

    # -- the interface

    def check_prerequisites(self, ctx: DeployContext) -> None:
        cli = self._cli(ctx)
        result = ctx.runner.run(railway_whoami_argv(), input="", timeout=120.0)
        if result.returncode != 0 and not ctx.env.get("RAILWAY_TOKEN"):
            raise DeployError(
                f"cloud CLI is not authenticated: `{cli} whoami` says you are not logged in to Railway:\n"
                f"{output_tail(result, ctx, 2)}",
                NOT_AUTHENTICATED,
                {"cli": cli},
                hint=LOGIN_HINT,
            )

    def public_url(self, ctx: DeployContext) -> str | None:
        # Railway names the domain when it generates it (during provision), so only later runs know it.
        return self._known_url(ctx)

    def render_config(self, ctx: DeployContext) -> list[Path]:
        ctx.deploy_dir.mkdir(parents=True, exist_ok=True)
        path = ctx.deploy_dir / CONFIG_NAME
        path.write_text(json.dumps(render_railway_json(), indent=2) + "\n")
        # `railway up` uploads the folder: the deploy logs stay here.
        ignore = ctx.deploy_dir / IGNORE_NAME
        ignore.write_text("logs/\n")
        return [path, ignore]

    def provision(self, ctx: DeployContext) -> dict[str, Any]:
        service_name = self._service(ctx)
        known_project = ctx.state.get("project_id")
        project = self._linked_project(ctx)
        if project is None or (
            project.get("id") != known_project if known_project else project.get("name") != ctx.app
        ):
            if known_project:
                ctx.reporter.info(f"Linking the deploy directory to Railway project {known_project}")
                self._run(ctx, railway_link_argv(str(known_project), ctx.state.get("environment_id")))
            else:
                ctx.reporter.info(f"Creating the Railway project {ctx.app}")
                self._run(
                    ctx,
                    railway_init_argv(ctx.app, ctx.options.get("workspace")),
                    hint=f"Run `railway init --name {ctx.app} --workspace <workspace>` in {ctx.deploy_dir}, "
                    "then deploy again.",
                )
            project = self._linked_project(ctx)
            if project is None:
                raise DeployError(
                    "Railway did not link the deploy directory to a project.",
                    PLATFORM_ERROR,
                    {"app": ctx.app},
                    hint=f"Run `railway link` in {ctx.deploy_dir}, then retry.",
                )
        service = project_service(project, service_name, ctx.state.get("service_id"))
        if service is None:
            ctx.reporter.info(f"Creating the Railway service {service_name}")
            self._run(ctx, railway_add_service_argv(service_name))
            project = self._linked_project(ctx) or project
            service = project_service(project, service_name)
            if service is None:
                raise DeployError(
                    f"Railway did not create the service {service_name!r}.",
                    PLATFORM_ERROR,
                    {"service": service_name},
                    hint="Create it in the Railway dashboard, then retry.",
                )
        environment = project_environment(project, ctx.state.get("environment_id"))

        plain = {"PORT": str(ctx.port)}
        if self._sqlite(ctx):
            # Railway mounts the volume owned by root; the image starts as root, hands the folder to its
            # unprivileged user and drops to it (dockerfile_templates/zipapp_main.py.j2).
            plain["OFFLINE_SERVER_DB"] = SQLITE_PATH
            self._ensure_volume(ctx, str(service.get("id")), service_name)
        self._run(ctx, railway_variables_set_argv(service_name, plain))
        secrets = ctx.forwarded_secrets()
        if secrets:
            ctx.reporter.info(f"Setting Railway variables {', '.join(secrets)}")
        for name, value in secrets.items():
            self._run(ctx, railway_variable_stdin_argv(service_name, name), input=value)
        url = self._domain(ctx)
        state = {
            "project_id": str(project["id"]),
            "service_id": str(service.get("id")),
            "service": service_name,
            "url": url,
        }
        if environment and environment.get("id"):
            state["environment_id"] = str(environment["id"])
        return state

    def _volume_mounts(self, ctx: DeployContext, service_id: str, service_name: str) -> set[str]:
        result = self._run(ctx, railway_volume_list_argv(service_id))
        return railway_volume_mounts(result.json(), service_name)

    def _ensure_volume(self, ctx: DeployContext, service_id: str, service_name: str) -> None:
        """The /data volume of the SQLite file, checked on every deploy: one that failed to be added last
        time is added now, and one that cannot be added stops the deploy (never a silent throwaway disk)."""
        if DATA_DIR in self._volume_mounts(ctx, service_id, service_name):
            return
        ctx.reporter.info(f"No DATABASE_URL: adding a Railway volume at {DATA_DIR} for the SQLite file")
        problem = ""
        for _attempt in range(2):
            result = self._run(ctx, railway_volume_add_argv(service_id), check=False)
            if DATA_DIR in self._volume_mounts(ctx, service_id, service_name):
                return
            problem = output_tail(result, ctx, 3)
            ctx.reporter.warn(f"Railway did not add the volume ({problem}); trying once more")
        raise DeployError(
            f"Railway did not add the volume at {DATA_DIR} to service {service_name!r}, and without it the "
            f"SQLite data would be erased by every redeploy:\n{problem}",
            PLATFORM_ERROR,
            {"service": service_name, "service_id": service_id},
            hint=f"Add it with `railway volume --service {service_id} add --mount-path {DATA_DIR}` in "
            f"{ctx.deploy_dir} (or set DATABASE_URL), then deploy again.",
        )

    def existing_secrets(self, ctx: DeployContext) -> dict[str, str | None]:
        # The deploy directory stays linked after `offline deploy --reset`, so this also finds the token
        # of a project deployed before the reset. Not linked, or no such service: nothing is set yet.
        if not ctx.deploy_dir.is_dir():
            return {}
        # The listing carries every value: only the names are read, and the output is never logged.
        result = self._run(
            ctx, railway_variables_list_argv(self._service(ctx)), check=False, secret_output=True
        )
        if result.returncode != 0:
            return {}
        data = result.json()
        names = set(data) if isinstance(data, Mapping) else set()
        return {name: None for name in SECRET_VARIABLES if name in names}

    def planned_resources(self, ctx: DeployContext) -> list[str]:
        lines = [
            f"Railway project {ctx.app} and service {self._service(ctx)} (when missing), with a public domain"
        ]
        if self._sqlite(ctx):
            lines.append(f"volume at {DATA_DIR} for the SQLite file (when missing)")
        lines.append("a deployment built by Railway from the uploaded folder")
        return lines

    def deploy(self, ctx: DeployContext) -> DeployOutcome:
        self._ensure_config(ctx)
        ctx.reporter.info(
            "Uploading to Railway; it builds the image and starts it (this takes a few minutes)"
        )
        result = self._run(
            ctx,
            railway_up_argv(self._service(ctx)),
            cwd=ctx.deploy_dir,
            timeout=LONG_TIMEOUT,
            stream=True,
            hint="Run `offline deploy logs` or open the build logs URL Railway printed.",
        )
        deployment_id = deployment_from_up_output(f"{result.stdout}\n{result.stderr}")
        if deployment_id is None:
            newest = _newest_first(self._deployments(ctx))
            if not newest:
                raise DeployError(
                    "`railway up` finished but Railway lists no deployment for the service.",
                    PLATFORM_ERROR,
                    {"service": self._service(ctx)},
                    hint="Check the Railway dashboard, then retry.",
                )
            deployment_id = str(newest[0].get("id"))
        return self._outcome(ctx, deployment_id)

    def wait_until_healthy(self, ctx: DeployContext, outcome: DeployOutcome) -> StatusReport:
        seen: list[str] = []

        def probe() -> StatusReport:
            report = railway_status_report(
                self._deployments(ctx), url=outcome.url, deployment_id=outcome.deployment_id or None
            )
            status = report.details.get("status")
            report_change(ctx.reporter, seen, f"Railway deployment {report.deployment_id}: {status}")
            return report

        def give_up(report: StatusReport) -> DeployError | None:
            status = str(report.details.get("status"))
            if status not in ENDED_BADLY:
                return None
            return DeployError(
                f"Railway deployment {report.deployment_id} ended as {status}.",
                PLATFORM_ERROR,
                {"deployment_id": report.deployment_id, "status": status},
                hint=f"See why with `railway logs --build {report.deployment_id}` or `offline deploy logs`.",
            )

        return poll_until_healthy(
            ctx,
            probe,
            what=f"Railway service {self._service(ctx)!r}",
            hint="Check `offline deploy logs` or the Railway dashboard.",
            give_up=give_up,
        )

    def status(self, ctx: DeployContext) -> StatusReport:
        result = self._run(ctx, railway_deployments_argv(self._service(ctx)), check=False)
        if result.returncode != 0:
            said = f"{result.stdout}\n{result.stderr}".lower()
            if any(marker in said for marker in NOT_LINKED_MARKERS) or "not found" in said:
                return StatusReport(state="NOT_FOUND", healthy=False, details={"service": self._service(ctx)})
            raise failure(
                ctx, result, auth_markers=AUTH_MARKERS, login_hint=LOGIN_HINT, update_hint=UPDATE_HINT
            )
        data = result.json()
        deployments = [d for d in data if isinstance(d, Mapping)] if isinstance(data, list) else []
        return railway_status_report(deployments, url=self._known_url(ctx))

    def logs(self, ctx: DeployContext, *, lines: int = 100) -> list[str]:
        result = self._run(ctx, railway_logs_argv(self._service(ctx), lines))
        formatted = [format_log_line(line) for line in result.stdout.splitlines() if line.strip()]
        return formatted[-lines:] if lines > 0 else []

    def deployments(self, ctx: DeployContext) -> list[Deployment]:
        ordered = _newest_first(self._deployments(ctx))
        live = next((d for d in ordered if _status(d) in LIVE), None)
        return [
            Deployment(
                id=str(d.get("id")),
                status=_status(d),
                created_at=str(d["createdAt"]) if d.get("createdAt") else None,
                current=d is live,
            )
            for d in ordered
        ]

    def rollback(self, ctx: DeployContext, deployment_id: str | None = None) -> DeployOutcome:
        self._api_auth(ctx)  # no token: refuse before touching anything
        before = self._deployments(ctx)
        target = railway_rollback_target(before, deployment_id)
        target_id = str(target.get("id"))
        ctx.reporter.info(f"Rolling back to Railway deployment {target_id}")
        data = self._graphql(ctx, ROLLBACK_MUTATION, {"id": target_id})
        if data.get("deploymentRollback") is False:
            raise DeployError(
                f"Railway refused to roll back to deployment {target_id}.",
                PLATFORM_ERROR,
                {"deployment_id": target_id},
                hint="Railway keeps images for a limited time; deploy that version again instead.",
            )
        # The rollback is a new deployment; it is the newest one Railway lists now.
        known = {d.get("id") for d in before}
        after = _newest_first(self._deployments(ctx))
        new_id = next((str(d.get("id")) for d in after if d.get("id") not in known), target_id)
        return self._outcome(ctx, new_id)
