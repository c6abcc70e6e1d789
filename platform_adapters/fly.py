"""``--platform host-a``: Fly.io through the ``flyctl`` CLI (``fly`` is accepted as well).

What runs, in order (argv builders below are pure and tested as data):

- prerequisites: ``flyctl auth whoami --json`` (a token in FLY_API_TOKEN works too: flyctl reads it).
- ``fly.toml`` in the deploy directory: app, primary region, the Dockerfile, one HTTP service on
  ``ctx.port`` with a ``GET /health`` check, ``[env] PORT``. Without DATABASE_URL the server keeps its SQLite
  file on a Fly volume (``[mounts]`` ``offline_data`` at ``/data``), so data survives redeploys (Fly mounts
  it owned by root; the image's entry hands the folder to the server's user before dropping root, see
  dockerfile_templates/zipapp_main.py.j2); a volume lives on one machine, so flyctl then runs a single
  machine, which is also what one SQLite writer needs.
  Once an app has that volume the mount stays in later configs, whatever deploy.json says (it may have been
  reset): ``flyctl volumes list --json`` tells, because flyctl refuses to drop a mount from machines that
  have one. ``[env]`` also trusts Fly's proxy for the client address (``OFFLINE_TRUSTED_PROXIES = "*"``,
  ``OFFLINE_CLIENT_IP_HEADER = "Fly-Client-IP"``), so the server rate-limits by the real client. No secret
  is ever written to the file.
- provision: ``flyctl apps list --json``; when the app is missing ``flyctl apps create <app> --org <org>
  --json`` (org from ``--org``, i.e. ``ctx.options["org"]``, default ``personal``); "Name has already been
  taken" becomes NAME_TAKEN. The forwarded variables (DATABASE_URL, AUTH_SECRET, PUBLIC_URL and the
  OFFLINE_*_TOKEN ones, the generated admin token among them) go through ``flyctl secrets import
  --stage``, which reads ``NAME=VALUE`` lines from stdin, so values are in no argv, file or log; staged
  secrets apply with the next deploy.
- deploy: ``flyctl deploy --remote-only --config fly.toml --dockerfile Dockerfile --app <app> --yes`` in the
  deploy directory (Fly's builders build the image: no local engine), then ``flyctl status --json`` for the
  hostname and release version.
- readiness: every machine of the app started, on the current release, with every check passing
  (``flyctl status --json``); DEPLOYING while not.
- deployments: ``flyctl releases --json --image``. Rollback: Fly has no rollback command, so the previous
  release's image (``ImageRef``) is deployed again with ``flyctl deploy --image``; this makes a new release,
  so a second rollback returns to where the first started.
- logs: ``flyctl logs --no-tail`` (the buffered recent lines), cut to the requested count.

``offline deploy --reset`` is handled by the deploy command alone; this adapter has no reset entry point,
so a reset never calls flyctl (the Fly app keeps running; ``flyctl apps destroy <app>`` removes it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._cli import LONG_TIMEOUT, failure, find_cli, output_tail, poll_until_healthy, run_cli, tail_lines
from .base import (
    NAME_TAKEN,
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
    "CONFIG_NAME",
    "FlyAdapter",
    "fly_apps_create_argv",
    "fly_apps_list_argv",
    "fly_deploy_argv",
    "fly_deployments",
    "fly_logs_argv",
    "fly_releases_argv",
    "fly_rollback_target",
    "fly_secrets_import_argv",
    "fly_secrets_list_argv",
    "fly_secrets_stdin",
    "fly_status_argv",
    "fly_status_report",
    "fly_volume_names",
    "fly_volumes_list_argv",
    "fly_whoami_argv",
    "render_fly_toml",
]

CONFIG_NAME = "fly.toml"
DOCKERFILE_NAME = "Dockerfile"
DEFAULT_ORG = "personal"
VOLUME_NAME = "offline_data"
DATA_DIR = "/data"
SQLITE_PATH = f"{DATA_DIR}/offline-server.db"

CLI_NAMES = ("flyctl", "fly")
INSTALL_HINT = (
    "Install flyctl: `curl -L https://fly.io/install.sh | sh` (macOS: `brew install flyctl`), "
    "then run `flyctl auth login`."
)
LOGIN_HINT = "Run `flyctl auth login` (or set FLY_API_TOKEN to a Fly.io access token), then retry."
UPDATE_HINT = "This flyctl does not know the command: update it with `flyctl version upgrade`, then retry."
AUTH_MARKERS = ("no access token", "not logged in", "please login", "flyctl auth login", "unauthorized")
TAKEN_MARKER = "already been taken"
MISSING_APP_MARKERS = ("could not find app", "app not found")

#: Release statuses of a release that ran: a rollback target must have one.
GOOD_RELEASE_STATUSES = frozenset({"complete", "completed", "succeeded", "success", "successful"})
#: Machine states in the middle of a change (the rollout is still going on).
TRANSITIONAL_STATES = frozenset({"created", "starting", "replacing", "updating", "launching", "restarting"})
IDLE_STATES = frozenset({"stopped", "suspended", "stopping", "suspending"})


# -- argv builders (pure) -------------------------------------------------------------------------------------


def fly_whoami_argv(cli: str = "flyctl") -> list[str]:
    return [cli, "auth", "whoami", "--json"]


def fly_apps_list_argv(cli: str = "flyctl") -> list[str]:
    return [cli, "apps", "list", "--json"]


def fly_apps_create_argv(app: str, org: str = DEFAULT_ORG, cli: str = "flyctl") -> list[str]:
    return [cli, "apps", "create", app, "--org", org, "--json"]


def fly_secrets_import_argv(app: str, cli: str = "flyctl") -> list[str]:
    """Reads ``NAME=VALUE`` lines from stdin; ``--stage`` defers them to the next deploy."""
    return [cli, "secrets", "import", "--stage", "--app", app]


def fly_secrets_list_argv(app: str, cli: str = "flyctl") -> list[str]:
    """Names and digests of the app's secrets (values never leave Fly)."""
    return [cli, "secrets", "list", "--app", app, "--json"]


def fly_volumes_list_argv(app: str, cli: str = "flyctl") -> list[str]:
    return [cli, "volumes", "list", "--app", app, "--json"]


def fly_volume_names(data: Any) -> set[str]:
    """Names of the live volumes in ``flyctl volumes list --json`` (fly-go Volume objects)."""
    names = set()
    for volume in data if isinstance(data, list) else []:
        if not isinstance(volume, Mapping):
            continue
        state = str(volume.get("state") or volume.get("State") or "").lower()
        name = volume.get("name") or volume.get("Name")
        if name and state not in ("destroyed", "destroying", "pending_destroy", "scheduling_destroy"):
            names.add(str(name))
    return names


def fly_deploy_argv(
    app: str,
    config_path: str = CONFIG_NAME,
    image: str | None = None,
    *,
    dockerfile: str = DOCKERFILE_NAME,
    cli: str = "flyctl",
) -> list[str]:
    """Build on Fly's remote builders, or (``image``) deploy an image already in Fly's registry."""
    if image:
        source = ["--image", image, "--config", config_path]
    else:
        source = ["--remote-only", "--config", config_path, "--dockerfile", dockerfile]
    # --yes: without a TTY flyctl refuses to ask its confirmation questions.
    return [cli, "deploy", *source, "--app", app, "--yes"]


def fly_status_argv(app: str, cli: str = "flyctl") -> list[str]:
    return [cli, "status", "--json", "--app", app]


def fly_releases_argv(app: str, cli: str = "flyctl") -> list[str]:
    return [cli, "releases", "--json", "--image", "--app", app]


def fly_logs_argv(app: str, cli: str = "flyctl") -> list[str]:
    return [cli, "logs", "--no-tail", "--app", app]


# -- files and stdin (pure) -----------------------------------------------------------------------------------


def _toml_string(value: str) -> str:
    # A JSON string with ASCII escapes is a valid TOML basic string.
    return json.dumps(value, ensure_ascii=True)


def render_fly_toml(app: str, region: str, port: int, *, sqlite_volume: bool) -> str:
    """The ``fly.toml`` text. Secrets never appear here: they go through ``flyctl secrets import``."""
    lines = [
        "# Generated by `offline deploy --platform host-a`; rewritten on every deploy (change the flags instead).",
        f"app = {_toml_string(app)}",
        f"primary_region = {_toml_string(region)}",
        "",
        "[build]",
        f"  dockerfile = {_toml_string(DOCKERFILE_NAME)}",
        "",
        "[env]",
        f'  PORT = "{port}"',
        # Fly's proxy is the only way in and sets Fly-Client-IP: rate limits then count real clients.
        '  OFFLINE_TRUSTED_PROXIES = "*"',
        '  OFFLINE_CLIENT_IP_HEADER = "Fly-Client-IP"',
    ]
    if sqlite_volume:
        lines.append(f"  OFFLINE_SERVER_DB = {_toml_string(SQLITE_PATH)}")
    lines += [
        "",
        "[http_service]",
        f"  internal_port = {port}",
        "  force_https = true",
        # Keep one machine up: sync clients hold WebSockets and expect the server to be there.
        '  auto_stop_machines = "stop"',
        "  auto_start_machines = true",
        "  min_machines_running = 1",
        "",
        # Every sync client is one long-lived connection: Fly's default limit (25) would turn clients away.
        "  [http_service.concurrency]",
        '    type = "connections"',
        "    soft_limit = 800",
        "    hard_limit = 1000",
        "",
        "  [[http_service.checks]]",
        '    grace_period = "10s"',
        '    interval = "15s"',
        '    method = "GET"',
        '    path = "/health"',
        '    timeout = "5s"',
    ]
    if sqlite_volume:
        lines += [
            "",
            "[mounts]",
            f"  source = {_toml_string(VOLUME_NAME)}",
            f"  destination = {_toml_string(DATA_DIR)}",
            '  initial_size = "1gb"',
        ]
    return "\n".join(lines) + "\n"


def fly_secrets_stdin(secrets: Mapping[str, str]) -> str:
    """``NAME=VALUE`` lines as ``flyctl secrets import`` parses them. That parser drops leading spaces and
    one pair of surrounding double quotes and treats a value starting with three quotes as multi-line, so
    such values are quoted; a value it cannot carry raises ValueError naming the variable (never the value)."""
    lines = []
    for name, value in secrets.items():
        if "\n" in value or "\r" in value:
            raise ValueError(f"{name} contains a line break, which `flyctl secrets import` cannot take")
        encoded = f'"{value}"' if value[:1] in (" ", '"') else value
        if encoded.startswith('"""'):
            raise ValueError(f"{name} starts with quote characters that `flyctl secrets import` would alter")
        lines.append(f"{name}={encoded}")
    return "\n".join(lines) + "\n"


# -- reading flyctl's JSON (pure) -------------------------------------------------------------------------------


def _machine_version(machine: Mapping[str, Any]) -> str | None:
    metadata = (machine.get("config") or {}).get("metadata") or {}
    version = metadata.get("fly_release_version")
    return str(version) if version not in (None, "") else None


def _check_summary(machine: Mapping[str, Any]) -> str:
    checks = machine.get("checks") or []
    passing = sum(1 for check in checks if check.get("status") == "passing")
    return f"{passing}/{len(checks)} passing"


def fly_status_report(data: Mapping[str, Any], *, url: str | None = None) -> StatusReport:
    """Map ``flyctl status --json`` onto a StatusReport.

    RUNNING: every machine started, on the app's current release, every check passing. DEPLOYING: a machine
    is changing, still runs an older release, or its checks have not passed yet. FAILED: a machine failed or
    a check is critical. STOPPED: every machine stopped (or none left). NOT_FOUND: nothing deployed yet.
    ``healthy`` is true while at least one started machine passes all its checks (it serves traffic).
    """
    version = data.get("Version")
    current = str(version) if version not in (None, "", 0) else None
    machines = [m for m in data.get("Machines") or [] if m.get("state") not in ("destroyed", "destroying")]
    hostname = data.get("Hostname")
    report_url = f"https://{hostname}" if hostname else url

    def checks_of(machine: Mapping[str, Any]) -> list[str]:
        return [str(check.get("status") or "unknown") for check in machine.get("checks") or []]

    serving = [
        m for m in machines if m.get("state") == "started" and all(s == "passing" for s in checks_of(m))
    ]
    state: DeploymentState
    if not machines:
        state = "STOPPED" if data.get("Deployed") else "NOT_FOUND"
    elif any(m.get("state") == "failed" for m in machines):
        state = "FAILED"
    elif any(
        m.get("state") in TRANSITIONAL_STATES
        or (current is not None and _machine_version(m) not in (None, current))
        for m in machines
    ):
        state = "DEPLOYING"
    elif all(m.get("state") in IDLE_STATES for m in machines):
        state = "STOPPED"
    elif any("critical" in checks_of(m) for m in machines):
        state = "FAILED"
    elif len(serving) == len(machines):
        state = "RUNNING"
    elif any(m.get("state") == "started" for m in machines):
        state = "DEPLOYING"  # checks still warming up ("warning" until the first result)
    else:
        state = "UNKNOWN"
    details = {
        "release": f"v{current}" if current else None,
        "machines": [
            {
                "id": m.get("id"),
                "state": m.get("state"),
                "region": m.get("region"),
                "release": f"v{v}" if (v := _machine_version(m)) else None,
                "checks": _check_summary(m),
            }
            for m in machines
        ],
    }
    return StatusReport(
        state=state,
        healthy=bool(serving),
        url=report_url,
        deployment_id=f"v{current}" if current else None,
        details=details,
    )


def fly_progress_line(report: StatusReport) -> str:
    """What a wait shows while Fly rolls out: the state and each machine's state and checks."""
    machines = report.details.get("machines") or []
    shown = ", ".join(
        f"{m.get('id')} {m.get('state')} ({m.get('release') or '?'}, checks {m.get('checks')})"
        for m in machines
    )
    return f"Fly.io: {report.state}" + (f"; machines: {shown}" if shown else "")


def _release_version(release: Mapping[str, Any]) -> int:
    try:
        return int(release.get("Version") or 0)
    except (TypeError, ValueError):
        return 0


def _is_good(release: Mapping[str, Any]) -> bool:
    return str(release.get("Status") or "").lower() in GOOD_RELEASE_STATUSES


def _newest_first(releases: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(releases, key=_release_version, reverse=True)


def fly_deployments(releases: Sequence[Mapping[str, Any]]) -> list[Deployment]:
    """``flyctl releases --json --image`` as Deployments, newest first; ``current`` marks the newest
    release that completed (a failed newer release leaves the previous one running)."""
    ordered = _newest_first(releases)
    current = next((r for r in ordered if _is_good(r)), None)
    return [
        Deployment(
            id=f"v{_release_version(r)}",
            status=str(r.get("Status") or "unknown"),
            created_at=str(r["CreatedAt"]) if r.get("CreatedAt") else None,
            image=str(r["ImageRef"]) if r.get("ImageRef") else None,
            current=r is current,
        )
        for r in ordered
    ]


def _matches(release: Mapping[str, Any], wanted: str) -> bool:
    version = str(_release_version(release))
    return wanted in (f"v{version}", version, str(release.get("ID") or ""))


def fly_rollback_target(
    releases: Sequence[Mapping[str, Any]], deployment_id: str | None, *, app: str
) -> Mapping[str, Any]:
    """The release to redeploy: ``deployment_id`` (``v3``, ``3`` or a release ID) or, when None, the newest
    completed release older than the current one that ran a different image (a secrets-only release reuses
    the image, and deploying the same image again would change nothing)."""
    ordered = _newest_first(releases)
    current = next((r for r in ordered if _is_good(r)), None)
    if deployment_id is not None:
        target = next((r for r in ordered if _matches(r, deployment_id)), None)
        if target is None or not target.get("ImageRef"):
            known = ", ".join(f"v{_release_version(r)}" for r in ordered if r.get("ImageRef")) or "none"
            raise DeployError(
                f"No previous deployment {deployment_id!r} with an image on Fly.io app {app!r} "
                f"(releases with an image: {known}).",
                NO_PREVIOUS_DEPLOYMENT,
                {"app": app, "deployment_id": deployment_id},
                hint=f"See the releases with `flyctl releases --image --app {app}`.",
            )
        if current is not None and target is current:
            raise DeployError(
                f"No previous deployment to return to: {deployment_id!r} is already the current release of "
                f"Fly.io app {app!r}.",
                NO_PREVIOUS_DEPLOYMENT,
                {"app": app, "deployment_id": deployment_id},
                hint=f"Pick an older release from `flyctl releases --image --app {app}`.",
            )
        return target
    if current is not None:
        older = ordered[ordered.index(current) + 1 :]
        for release in older:
            if (
                _is_good(release)
                and release.get("ImageRef")
                and release.get("ImageRef") != current.get("ImageRef")
            ):
                return release
    raise DeployError(
        f"No previous deployment of Fly.io app {app!r} to roll back to (it needs an earlier completed "
        "release with a different image).",
        NO_PREVIOUS_DEPLOYMENT,
        {"app": app},
        hint="Deploy a new version first; rollback returns to the release before the current one.",
    )


# -- the adapter ------------------------------------------------------------------------------------------------


class FlyAdapter(PlatformAdapter):
    name = "host-a"
    title = "Fly.io"
    default_region = "iad"
    regions = (
        "iad", "ewr", "ord", "dfw", "lax", "sjc", "yyz", "gru",
        "lhr", "ams", "fra", "cdg", "arn", "jnb", "bom", "sin", "nrt", "syd",
    )  # fmt: skip

    def __init__(self) -> None:
        self._has_volume: bool | None = None  # what Fly said about the volume, asked once per run

    # -- helpers

    def _cli(self, ctx: DeployContext) -> str:
        return find_cli(ctx, CLI_NAMES, vendor="Fly.io (--platform host-a)", install_hint=INSTALL_HINT)

    def _run(self, ctx: DeployContext, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        # NO_COLOR keeps ANSI codes out of logs and error messages.
        return run_cli(
            ctx,
            argv,
            env={"NO_COLOR": "1"},
            auth_markers=AUTH_MARKERS,
            login_hint=LOGIN_HINT,
            update_hint=UPDATE_HINT,
            **kwargs,
        )

    def _region(self, ctx: DeployContext) -> str:
        return ctx.region or str(ctx.state.get("region") or self.default_region)

    def _sqlite_volume(self, ctx: DeployContext) -> bool:
        """Mount the volume when SQLite needs it or when the app already has it (read from Fly, since
        local state may be gone after --reset): dropping an attached volume makes flyctl stop to ask."""
        if "DATABASE_URL" not in ctx.forwarded_secrets() or ctx.state.get("sqlite_volume"):
            return True
        if self._has_volume is None:
            self._has_volume = VOLUME_NAME in self._volumes(ctx)
        return self._has_volume

    def _volumes(self, ctx: DeployContext) -> set[str]:
        result = self._run(ctx, fly_volumes_list_argv(ctx.app, self._cli(ctx)), check=False)
        if result.returncode != 0:
            said = f"{result.stdout}\n{result.stderr}".lower()
            if any(marker in said for marker in MISSING_APP_MARKERS):
                return set()
            raise failure(
                ctx, result, auth_markers=AUTH_MARKERS, login_hint=LOGIN_HINT, update_hint=UPDATE_HINT
            )
        return fly_volume_names(result.json())

    def _status_data(self, ctx: DeployContext, cli: str) -> dict[str, Any] | None:
        """``flyctl status --json``, or None when Fly does not know the app."""
        result = self._run(ctx, fly_status_argv(ctx.app, cli), check=False)
        if result.returncode != 0:
            said = f"{result.stdout}\n{result.stderr}".lower()
            if any(marker in said for marker in MISSING_APP_MARKERS):
                return None
            raise failure(
                ctx, result, auth_markers=AUTH_MARKERS, login_hint=LOGIN_HINT, update_hint=UPDATE_HINT
            )
        data = result.json()
        if not isinstance(data, dict):
            raise DeployError("`flyctl status --json` did not print an object.", PLATFORM_ERROR, {})
        return data

    def _releases(self, ctx: DeployContext, cli: str) -> list[Mapping[str, Any]]:
        data = self._run(ctx, fly_releases_argv(ctx.app, cli)).json()
        return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []

    def _outcome(self, ctx: DeployContext, cli: str) -> DeployOutcome:
        data = self._status_data(ctx, cli) or {}
        report = fly_status_report(data, url=self.public_url(ctx))
        url = report.url or f"https://{ctx.app}.fly.dev"
        state = {
            "app": ctx.app,
            "region": self._region(ctx),
            "url": url,
            "hostname": url.split("://", 1)[-1],
            "release": report.deployment_id,
            "sqlite_volume": self._sqlite_volume(ctx),
        }
        return DeployOutcome(url=url, deployment_id=report.deployment_id or "", state=state)

    def _ensure_config(self, ctx: DeployContext) -> None:
        if not (ctx.deploy_dir / CONFIG_NAME).is_file():
            self.render_config(ctx)

    # -- the interface

    def existing_secrets(self, ctx: DeployContext) -> dict[str, str | None]:
        result = self._run(ctx, fly_secrets_list_argv(ctx.app, self._cli(ctx)), check=False)
        if result.returncode != 0:
            said = f"{result.stdout}\n{result.stderr}".lower()
            if any(marker in said for marker in MISSING_APP_MARKERS):
                return {}
            raise failure(
                ctx, result, auth_markers=AUTH_MARKERS, login_hint=LOGIN_HINT, update_hint=UPDATE_HINT
            )
        data = result.json()
        names = {
            str(item.get("name") or item.get("Name"))
            for item in (data if isinstance(data, list) else [])
            if isinstance(item, Mapping) and (item.get("name") or item.get("Name"))
        }
        return {name: None for name in SECRET_VARIABLES if name in names}

    def planned_resources(self, ctx: DeployContext) -> list[str]:
        org = str(ctx.options.get("org") or ctx.state.get("org") or DEFAULT_ORG)
        lines = [f"Fly.io app {ctx.app} in organization {org} (when missing)"]
        if "DATABASE_URL" not in ctx.forwarded_secrets():
            lines.append(
                f"volume {VOLUME_NAME} (1 GB, at {DATA_DIR}; kept when Fly already has it, else created)"
            )
        lines.append("a release built on Fly.io's remote builder, on one machine")
        return lines

    def check_prerequisites(self, ctx: DeployContext) -> None:
        cli = self._cli(ctx)
        result = self._run(ctx, fly_whoami_argv(cli), check=False)
        if result.returncode != 0:
            raise DeployError(
                f"cloud CLI is not authenticated: `{cli} auth whoami` says you are not logged in to Fly.io:\n"
                f"{output_tail(result, ctx, 2)}",
                NOT_AUTHENTICATED,
                {"cli": cli},
                hint=LOGIN_HINT,
            )

    def public_url(self, ctx: DeployContext) -> str | None:
        # Fly names are global, so the address is known before the app exists.
        return str(ctx.state.get("url") or f"https://{ctx.app}.fly.dev")

    def render_config(self, ctx: DeployContext) -> list[Path]:
        ctx.deploy_dir.mkdir(parents=True, exist_ok=True)
        path = ctx.deploy_dir / CONFIG_NAME
        volume = self._sqlite_volume(ctx)
        path.write_text(render_fly_toml(ctx.app, self._region(ctx), ctx.port, sqlite_volume=volume))
        if volume and "DATABASE_URL" not in ctx.forwarded_secrets():
            ctx.reporter.info(
                f"No DATABASE_URL: the SQLite file lives on the Fly volume {VOLUME_NAME} ({DATA_DIR})."
            )
        return [path]

    def provision(self, ctx: DeployContext) -> dict[str, Any]:
        cli = self._cli(ctx)
        org = str(ctx.options.get("org") or ctx.state.get("org") or DEFAULT_ORG)
        apps = self._run(ctx, fly_apps_list_argv(cli)).json()
        names = (
            {str(app.get("Name")) for app in apps if isinstance(app, dict)}
            if isinstance(apps, list)
            else set()
        )
        if ctx.app not in names:
            ctx.reporter.info(f"Creating the Fly.io app {ctx.app} in organization {org}")
            result = self._run(ctx, fly_apps_create_argv(ctx.app, org, cli), check=False)
            if result.returncode != 0:
                if TAKEN_MARKER in f"{result.stdout}\n{result.stderr}".lower():
                    raise DeployError(
                        f"name has already been taken: the Fly.io app name {ctx.app!r} is used by another "
                        "account (Fly.io app names are global).",
                        NAME_TAKEN,
                        {"app": ctx.app},
                        hint=f"Choose another name with --app (for example --app {ctx.app}-2).",
                    )
                raise failure(
                    ctx, result, auth_markers=AUTH_MARKERS, login_hint=LOGIN_HINT, update_hint=UPDATE_HINT
                )
        secrets = ctx.forwarded_secrets()
        if secrets:
            try:
                stdin = fly_secrets_stdin(secrets)
            except ValueError as exc:
                raise DeployError(
                    f"Cannot forward a secret to Fly.io: {exc}.",
                    PLATFORM_ERROR,
                    {"app": ctx.app},
                    hint="Remove the line break or leading quotes from that variable, then retry.",
                ) from None
            ctx.reporter.info(f"Staging Fly.io secrets {', '.join(secrets)}")
            self._run(ctx, fly_secrets_import_argv(ctx.app, cli), input=stdin)
        return {"app": ctx.app, "org": org, "region": self._region(ctx)}

    def deploy(self, ctx: DeployContext) -> DeployOutcome:
        cli = self._cli(ctx)
        self._ensure_config(ctx)
        ctx.reporter.info("Building on Fly.io's remote builder and rolling out (this takes a few minutes)")
        self._run(
            ctx,
            fly_deploy_argv(ctx.app, cli=cli),
            cwd=ctx.deploy_dir,
            timeout=LONG_TIMEOUT,
            stream=True,
            hint="flyctl's last lines are above and all of its output is in the deploy log named below; "
            "`offline deploy logs` shows the app's own output.",
        )
        return self._outcome(ctx, cli)

    def wait_until_healthy(self, ctx: DeployContext, outcome: DeployOutcome) -> StatusReport:
        seen: list[str] = []

        def probe() -> StatusReport:
            report = self.status(ctx)
            report_change(ctx.reporter, seen, fly_progress_line(report))
            return report

        return poll_until_healthy(
            ctx,
            probe,
            what=f"Fly.io app {ctx.app!r}",
            hint=f"Check `offline deploy logs` or `flyctl status --app {ctx.app}`.",
        )

    def status(self, ctx: DeployContext) -> StatusReport:
        data = self._status_data(ctx, self._cli(ctx))
        if data is None:
            return StatusReport(state="NOT_FOUND", healthy=False, details={"app": ctx.app})
        return fly_status_report(data, url=self.public_url(ctx))

    def logs(self, ctx: DeployContext, *, lines: int = 100) -> list[str]:
        result = self._run(ctx, fly_logs_argv(ctx.app, self._cli(ctx)))
        return tail_lines(result.stdout, lines)

    def deployments(self, ctx: DeployContext) -> list[Deployment]:
        return fly_deployments(self._releases(ctx, self._cli(ctx)))

    def rollback(self, ctx: DeployContext, deployment_id: str | None = None) -> DeployOutcome:
        cli = self._cli(ctx)
        target = fly_rollback_target(self._releases(ctx, cli), deployment_id, app=ctx.app)
        image = str(target["ImageRef"])
        ctx.reporter.info(f"Redeploying release v{_release_version(target)} ({image})")
        self._ensure_config(ctx)
        self._run(
            ctx,
            fly_deploy_argv(ctx.app, image=image, cli=cli),
            cwd=ctx.deploy_dir,
            timeout=LONG_TIMEOUT,
            stream=True,
            hint="flyctl's last lines are above; `offline deploy logs` shows the app's own output.",
        )
        return self._outcome(ctx, cli)
