"""`offline deploy` and its management commands, composed over one platform adapter (DESIGN.md section 6).

Deploy validates first, asks only for what flags and deploy.json did not give, shows the plan, then
executes. The order of checks is fixed: a stub platform is refused, then missing values under
``--confirm``/no terminal (the error names the flag), then the adapter's prerequisites (vendor CLI, login),
then the server entry. Nothing is built before all of them pass.

Everything outside the process (adapters, commands, the prompt, the health probe, the bundler) comes in
through ``Services``, so tests drive the whole flow with fakes at those boundaries.
"""

from __future__ import annotations

import configparser
import http.client
import re
import secrets as secret_tokens
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import platform_adapters
from offline_cli.environment import Prompter
from platform_adapters.base import (
    ADMIN_TOKEN,
    DAEMON_UNAVAILABLE,
    EPHEMERAL_DATA,
    MISSING_OPTION,
    NO_PREVIOUS_DEPLOYMENT,
    NOT_DEPLOYED,
    NOT_IMPLEMENTED,
    CommandRunner,
    ContainerEngine,
    DeployContext,
    DeployError,
    Deployment,
    DeployOutcome,
    PlatformAdapter,
    Reporter,
    StatusReport,
    forwarded_environment,
    masked_values,
    sync_url_for,
)

from .bundle import bundle_server, check_python_version
from .client_build import build_client, client_available
from .entry import find_server_entry
from .state import DeployState, deploy_dir_of, load_state, reset_state, save_state
from .templates import DEFAULT_PORT, ensure_gitignored, render_deploy_files

#: Platforms whose region comes from the AWS configuration (never from another platform's default).
AWS_PLATFORMS = frozenset({"cloud-a-containers", "cloud-a-orchestrated"})
#: The direct GET <url>/health after the platform reports healthy: at most this long, warn only.
HEALTH_PROBE_SECONDS = 10.0
#: DeployRequest fields kept in deploy.json's ``options`` under the same names (adapters read ctx.options).
PLATFORM_OPTIONS = (
    "subnets",
    "security_groups",
    "org",
    "workspace",
    "registry",
    "registry_credential",
    "host",
    "with_postgres",
    "publish",
)
INVALID_OPTION = "INVALID_OPTION"
STATE_CONFLICT = "STATE_CONFLICT"
UNKNOWN_DEPLOYMENT = "UNKNOWN_DEPLOYMENT"
_APP_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")

Bundler = Callable[..., Path]  # the signature of bundle.bundle_server
HealthProbe = Callable[[str, float], str | None]  # (url, seconds) -> None when healthy, else why not


def probe_health(url: str, seconds: float = HEALTH_PROBE_SECONDS) -> str | None:
    """GET ``url`` until it answers 200 or ``seconds`` pass; None when healthy, else the last problem.
    Never raises: a URL urllib cannot use is a problem to report, not a crash."""
    deadline = time.monotonic() + seconds
    problem = "no answer"
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            with urllib.request.urlopen(url, timeout=min(5.0, remaining)) as response:
                if response.status == 200:
                    return None
                problem = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            problem = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            problem = str(getattr(exc, "reason", exc))
        except http.client.HTTPException as exc:  # a garbled answer (BadStatusLine, IncompleteRead)
            problem = f"{type(exc).__name__}: {exc}"
        except ValueError as exc:  # not a URL urllib can fetch: retrying will not help
            return f"invalid URL ({exc})"
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    return problem


def default_container_engine(env: Mapping[str, str], reporter: Reporter) -> ContainerEngine:
    """The docker-SDK engine of ``platform_adapters.container_engine`` (imported only when a platform builds
    its image locally). It connects on first use; build and push output goes to the reporter."""
    from platform_adapters.container_engine import DockerEngine

    # Build and push output is vendor output: the live view and the log when the reporter takes it.
    line = getattr(reporter, "vendor_line", None)
    return DockerEngine.from_env(env, log=line if callable(line) else reporter.info)


def aws_configured_region(env: Mapping[str, str]) -> str | None:
    """The region the AWS CLI would use: AWS_REGION, AWS_DEFAULT_REGION, then the profile's ``region`` in
    the AWS config file."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if env.get(name, "").strip():
            return env[name].strip()
    config_file = env.get("AWS_CONFIG_FILE") or (
        str(Path(env["HOME"]) / ".aws" / "config") if env.get("HOME") else None
    )
    if not config_file or not Path(config_file).is_file():
        return None
    parser = configparser.ConfigParser()
    try:
        parser.read(config_file, encoding="utf-8")
    except configparser.Error:
        return None
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    section = "default" if profile == "default" else f"profile {profile}"
    region = parser.get(section, "region", fallback="").strip()
    return region or None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Services:
    """The outside world of the flow. Build one per command from the Environment (see commands/deploy)."""

    env: Mapping[str, str]
    interactive: bool
    reporter: Reporter
    runner: CommandRunner
    prompter: Callable[[], Prompter]  # called only when a question is really asked
    load_adapter: Callable[[str], PlatformAdapter] | None = None  # None: platform_adapters.load_adapter
    bundler: Bundler = bundle_server
    health_probe: HealthProbe | None = probe_health
    engine_factory: Callable[[Mapping[str, str]], ContainerEngine] | None = None
    client_factory: Callable[..., Any] | None = None  # None: the AWS adapters build boto3 sessions from env
    sleep: Callable[[float], None] | None = None
    health_timeout: float | None = None
    poll_interval: float | None = None
    now: Callable[[], str] = _now

    def adapter(self, platform: str) -> PlatformAdapter:
        # Looked up at call time, so a test's monkeypatched platform_adapters.load_adapter is used.
        loader = self.load_adapter or platform_adapters.load_adapter
        return loader(platform)

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(forwarded_environment(self.env).values())


@dataclass
class DeployRequest:
    """What the user asked for on the command line (None: not given)."""

    project_dir: Path
    platform: str | None = None
    app: str | None = None
    region: str | None = None
    confirm: bool = False
    subnets: list[str] | None = None
    security_groups: list[str] | None = None
    org: str | None = None  # host-a: the Fly.io organization a new app is created in
    workspace: str | None = None  # host-b: the Railway workspace a new project is created in; render's
    # workspace (owner) when the API key sees several
    python_version: str | None = None
    ephemeral_data: bool = False  # accept SQLite on a disk that a redeploy erases (Lightsail, ECS)
    registry: str | None = None  # self-hosted-image, web-service-host: host/namespace to push the image to
    registry_credential: str | None = None  # web-service-host: the Render registry credential, by name
    host: str | None = None  # self-hosted-image: ssh://user@machine to run the stack on
    with_postgres: bool | None = None  # self-hosted-image: a PostgreSQL service next to the app
    publish: str | None = None  # self-hosted-image: [address:]port the app is published on


@dataclass
class DeployResult:
    """A finished deploy or rollback: what `offline deploy` prints.

    ``url`` is None when the platform gave no address (an ECS service without a load balancer whose task IP
    is not known yet). ``next_step`` is a command the user must run before the app serves anything (the ECS
    create-service command on a first deploy without network settings); the deploy itself succeeded."""

    platform: str
    app: str
    region: str | None
    url: str | None
    sync_url: str | None
    deployment_id: str
    state: str
    healthy: bool
    health_warning: str | None = None
    client_deployed: bool | None = None
    next_step: str | None = None
    warnings: list[str] = field(default_factory=list)
    #: generated by this deploy and set on the platform; shown once on stderr, never in JSON or a file
    admin_token: str | None = None

    @property
    def vendor(self) -> str:
        return platform_adapters.vendor_name(self.platform)

    def to_json(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "vendor": self.vendor,
            "app": self.app,
            "region": self.region,
            "url": self.url,
            "sync_url": self.sync_url,
            "deployment_id": self.deployment_id,
            "state": self.state,
            "healthy": self.healthy,
            "health_warning": self.health_warning,
            "client_deployed": self.client_deployed,
            "next_step": self.next_step,
            "warnings": list(self.warnings),
        }


@dataclass
class StatusResult:
    platform: str
    app: str
    region: str | None
    report: StatusReport
    url: str | None
    sync_url: str | None
    admin_protected: bool | None = None  # None: the platform could not tell

    def to_json(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "vendor": platform_adapters.vendor_name(self.platform),
            "app": self.app,
            "region": self.region,
            "state": self.report.state,
            "healthy": self.report.healthy,
            "url": self.url,
            "sync_url": self.sync_url,
            "deployment_id": self.report.deployment_id,
            "details": self.report.details,
            "admin_protected": self.admin_protected,
        }


@dataclass
class Plan:
    """Everything resolved before anything is built or created."""

    platform: str
    title: str
    app: str
    region: str | None
    options: dict[str, Any]
    python_version: str
    adapter: PlatformAdapter
    previous: DeployState | None
    notes: list[str] = field(default_factory=list)
    ephemeral_data: bool = False


# -- resolving what to do ------------------------------------------------------------------------------------


def _title(platform: str) -> str:
    return platform_adapters.PLATFORMS[platform][1]


def _missing(flag: str, what: str, example: str) -> DeployError:
    """A value no flag, deploy.json or prompt gave; the message names the flag."""
    if flag == "--confirm":
        message = f"--confirm is required: {what}, and there is no terminal to ask on"
    else:
        message = (
            f"{flag} is required: {what}, and offline deploy does not ask (--confirm was given, or there is "
            "no terminal to answer a prompt)"
        )
    return DeployError(
        message, MISSING_OPTION, {"option": flag}, hint=f"Pass it on the command line: {example}"
    )


def _choices_hint() -> str:
    """The platforms that work, by the names a person types (stubs are not offered)."""
    return (
        "Choose one of: "
        + ", ".join(
            f"{platform_adapters.alias_of(code)} ({_title(code)})" for code in platform_adapters.implemented()
        )
        + "."
    )


def _not_implemented(platform: str) -> DeployError:
    return DeployError(
        f"The platform {platform!r} ({_title(platform)}) is not implemented yet.",
        NOT_IMPLEMENTED,
        {"platform": platform},
        hint=_choices_hint(),
    )


def _check_platform(platform: str) -> str:
    """The neutral code of ``platform`` (an alias or a code); refuses unknown and stub platforms."""
    code = platform_adapters.canonical(platform)
    if code not in platform_adapters.PLATFORMS:
        raise DeployError(
            f"unknown platform {platform!r}",
            INVALID_OPTION,
            {"option": "--platform", "value": platform},
            hint=_choices_hint(),
        )
    if code in platform_adapters.STUB_PLATFORMS:
        raise _not_implemented(code)
    return code


def _platform_menu() -> list[tuple[str, str]]:
    choices = []
    for code in platform_adapters.PLATFORMS:
        title = f"{_title(code)}  (--platform {platform_adapters.alias_of(code)})"
        if code == platform_adapters.RECOMMENDED:
            title += "  recommended"
        if code in platform_adapters.STUB_PLATFORMS:
            title = f"{_title(code)}  (not implemented yet)"
        choices.append((code, title))
    return choices


def _ask_platform(services: Services) -> str:
    """The menu, asked again (with the reason) when the answer is a platform that is not built yet."""
    prompter = services.prompter()
    while True:
        answer = prompter.select(
            "Where should the app run?", _platform_menu(), default=platform_adapters.RECOMMENDED
        )
        try:
            return _check_platform(answer)
        except DeployError as exc:
            services.reporter.warn(f"{exc.message} Pick another one.")


def _ask_app(services: Services, project_dir: Path) -> str:
    """The app name, asked again (with the reason) until it is one the platforms accept."""
    prompter = services.prompter()
    default = suggested_app_name(project_dir)
    while True:
        answer = prompter.text("App name", default=default)
        try:
            return _check_app(answer)
        except DeployError as exc:
            services.reporter.warn(f"{exc.message}. Try again.")


def suggested_app_name(project_dir: Path) -> str:
    """A platform-safe app name from the project folder's name."""
    name = re.sub(r"[^a-z0-9-]+", "-", project_dir.resolve().name.lower()).strip("-")
    return (name or "offline-app")[:63].strip("-") or "offline-app"


def _check_app(app: str) -> str:
    app = app.strip()
    if not _APP_NAME.match(app):
        raise DeployError(
            f"--app {app!r} is not a valid app name: use 1 to 63 lowercase letters, digits and hyphens, "
            "starting and ending with a letter or digit",
            INVALID_OPTION,
            {"option": "--app", "value": app},
            hint="Pass another name, e.g. --app my-notes-app",
        )
    return app


def _conflict(flag: str, given: str, saved: str, project_dir: Path) -> DeployError:
    return DeployError(
        f"this project is already deployed with {flag} {saved}; {flag} {given} would start a second, "
        "unrelated deployment",
        STATE_CONFLICT,
        {"option": flag, "saved": saved, "given": given},
        hint=f"Drop {flag} to redeploy {saved}, or run `offline deploy --reset --project-dir {project_dir}` "
        "first to start over.",
    )


def _resolve_region(
    request: DeployRequest,
    previous: DeployState | None,
    adapter: PlatformAdapter,
    platform: str,
    ask: bool,
    services: Services,
    notes: list[str],
) -> str | None:
    if request.region:
        region = request.region.strip()
        if previous is not None and previous.region and previous.region != region:
            notes.append(
                f"region changes from {previous.region} to {region}; whatever runs in {previous.region} "
                "is left as it is"
            )
        return region
    if previous is not None and previous.region:
        return previous.region
    is_aws = platform in AWS_PLATFORMS
    configured = aws_configured_region(services.env) if is_aws else None
    suggestion = configured or adapter.default_region
    if ask and adapter.regions:
        choices = list(adapter.regions)
        if suggestion and suggestion not in choices:
            choices.insert(0, suggestion)
        return services.prompter().select("Region", [(r, r) for r in choices], default=suggestion)
    if ask and is_aws:
        answer = services.prompter().text("AWS region", default=suggestion or "").strip()
        if answer:
            return answer
    if is_aws:
        if configured:
            notes.append(f"region {configured} from the AWS configuration")
            return configured
        raise _missing(
            "--region",
            "no AWS region is configured (AWS_REGION, AWS_DEFAULT_REGION or `aws configure`)",
            "offline deploy --region us-east-1",
        )
    if adapter.default_region:
        notes.append(f"region {adapter.default_region} ({adapter.title} default; change it with --region)")
    return adapter.default_region


def resolve_plan(request: DeployRequest, services: Services) -> Plan:
    """Validate the request against deploy.json and ask for what is missing (only when allowed)."""
    project_dir = request.project_dir
    requested = _check_platform(request.platform) if request.platform is not None else None
    previous = load_state(project_dir)
    ask = services.interactive and not request.confirm
    saved = platform_adapters.canonical(previous.platform) if previous is not None else None
    if saved is not None and requested and requested != saved:
        raise _conflict("--platform", requested, saved, project_dir)
    platform = requested or saved
    if platform is None:
        if not ask:
            raise _missing("--platform", "choose where to deploy", "offline deploy --platform fly")
        platform = _ask_platform(services)
    platform = _check_platform(platform)
    if previous is not None and request.app and _check_app(request.app) != previous.app:
        raise _conflict("--app", request.app, previous.app, project_dir)
    app = request.app or (previous.app if previous else None)
    if app is None:
        if not ask:
            raise _missing(
                "--app", "the name of the app on the platform", "offline deploy --app my-notes-app"
            )
        app = _ask_app(services, project_dir)
    app = _check_app(app)
    adapter = services.adapter(platform)
    if (
        not adapter.persistent_storage
        and "DATABASE_URL" not in forwarded_environment(services.env)
        and not request.ephemeral_data
    ):
        raise DeployError(
            f"DATABASE_URL is not set, and {adapter.title} has no persistent storage for SQLite: the data "
            "would live on the container's disk, which every redeploy or restart erases",
            EPHEMERAL_DATA,
            {"option": "--ephemeral-data", "variable": "DATABASE_URL"},
            hint='Set DATABASE_URL to a PostgreSQL database (export DATABASE_URL="postgresql://..."), or '
            "pass --ephemeral-data to accept data that a redeploy erases.",
        )
    notes: list[str] = []
    region = _resolve_region(request, previous, adapter, platform, ask, services, notes)
    options = dict(previous.options) if previous else {}
    for name in PLATFORM_OPTIONS:
        value = getattr(request, name)
        if value is not None:
            options[name] = (
                list(value)
                if isinstance(value, list)
                else value
                if isinstance(value, bool)
                else str(value).strip()
            )
    version = check_python_version(request.python_version or (previous.python_version if previous else None))
    ephemeral = not adapter.persistent_storage and "DATABASE_URL" not in forwarded_environment(services.env)
    return Plan(
        platform,
        adapter.title,
        app,
        region,
        options,
        version,
        adapter,
        previous,
        notes,
        ephemeral_data=ephemeral,
    )


def _context(
    project_dir: Path,
    adapter: PlatformAdapter,
    app: str,
    region: str | None,
    adapter_state: Mapping[str, Any],
    options: Mapping[str, Any],
    services: Services,
    *,
    with_engine: bool = False,
    env: Mapping[str, str] | None = None,
) -> DeployContext:
    ctx = DeployContext(
        project_dir=project_dir,
        deploy_dir=deploy_dir_of(project_dir),
        app=app,
        region=region,
        env=services.env if env is None else env,
        runner=services.runner,
        reporter=services.reporter,
        state=dict(adapter_state),
        options=dict(options),
        port=DEFAULT_PORT,
        client_factory=services.client_factory,
        sleep=services.sleep,
    )
    if services.health_timeout is not None:
        ctx.health_timeout = services.health_timeout
    if services.poll_interval is not None:
        ctx.poll_interval = services.poll_interval
    if with_engine and adapter.needs_container_engine:
        try:
            if services.engine_factory is not None:
                ctx.engine = services.engine_factory(services.env)
            else:
                ctx.engine = default_container_engine(services.env, services.reporter)
        except DeployError:
            raise
        except Exception as exc:  # the SDK missing or its own errors (bad DOCKER_HOST)
            raise DeployError(
                f"cannot connect to the container daemon: {exc}",
                DAEMON_UNAVAILABLE,
                hint="Start Docker (or Podman with its Docker-compatible socket) and retry; DOCKER_HOST "
                "selects another engine.",
            ) from None
    return ctx


# -- deploy ---------------------------------------------------------------------------------------------------


@dataclass
class SecretsPlan:
    """Which variables of SECRET_VARIABLES this deploy hands to the platform, and which it leaves there."""

    env: dict[str, str]  # the environment the adapter sees: the shell's plus what the platform must get
    to_set: list[str]
    kept: list[str]
    generated_admin_token: str | None = None


def plan_secrets(shell: Mapping[str, str], existing: Mapping[str, str | None]) -> SecretsPlan:
    """What the shell sets wins; a variable it does not set keeps the platform's value (sent again with that
    value where every deploy replaces the whole environment: Lightsail, ECS). The admin token, when neither
    has one, is generated."""
    env = dict(shell)
    forwarded = forwarded_environment(shell)
    generated = None
    kept = [name for name in existing if name not in forwarded]
    for name in kept:
        value = existing[name]
        if value:
            env[name] = value
    if ADMIN_TOKEN not in forwarded and ADMIN_TOKEN not in existing:
        generated = secret_tokens.token_urlsafe(32)
        env[ADMIN_TOKEN] = generated
    to_set = list(forwarded_environment(env))
    return SecretsPlan(env, to_set, [name for name in kept if name not in to_set], generated)


def _mask(reporter: Reporter, value: str) -> None:
    """Tell a reporter that masks secrets (ProgressReporter) about a value it did not know at start."""
    mask = getattr(reporter, "mask", None)
    if callable(mask):
        mask(value)


def plan_lines(plan: Plan, ctx: DeployContext, secrets: SecretsPlan, *, has_client: bool) -> list[str]:
    """What the deploy is about to do, shown before anything is created or changed."""
    adapter = plan.adapter
    code = platform_adapters.alias_of(plan.platform)
    lines = [
        f"platform:  {plan.title} (--platform {code})",
        f"app:       {plan.app}" + (" (redeploy)" if plan.previous else ""),
    ]
    if plan.region:
        lines.append(f"region:    {plan.region}")
    lines.append(
        f"build:     CPython {plan.python_version}, port {ctx.port}, "
        + ("server and client" if has_client else "server only")
    )
    for index, resource in enumerate(adapter.planned_resources(ctx)):
        lines.append(("creates:   " if index == 0 else "           ") + resource)
    names = [
        name
        + (
            " (new, generated; shown once at the end)"
            if name == ADMIN_TOKEN and secrets.generated_admin_token
            else ""
        )
        for name in secrets.to_set
    ]
    lines.append("secrets:   " + (", ".join(names) if names else "none"))
    if secrets.kept:
        lines.append("kept:      " + ", ".join(secrets.kept) + " (already set on the platform)")
    lines.append(f"storage:   {adapter.storage(ctx)}")
    return lines + [f"note:      {note}" for note in plan.notes]


def run_deploy(request: DeployRequest, services: Services) -> DeployResult | None:
    """Deploy the project: the whole of `offline deploy`. None when the user declined the plan."""
    reporter = services.reporter
    project_dir = request.project_dir
    plan = resolve_plan(request, services)
    adapter = plan.adapter
    previous_adapter_state = plan.previous.adapter if plan.previous else {}
    ctx = _context(
        project_dir,
        adapter,
        plan.app,
        plan.region,
        previous_adapter_state,
        plan.options,
        services,
        with_engine=True,
    )

    reporter.step(f"Checking {plan.title} prerequisites")
    adapter.check_prerequisites(ctx)
    entry = find_server_entry(project_dir)
    has_client = client_available(project_dir)

    secrets = plan_secrets(services.env, adapter.existing_secrets(ctx))
    ctx.env = secrets.env
    token = secrets.generated_admin_token
    # Values from the platform or generated here are as secret as the shell's: masked everywhere.
    scrub = tuple(dict.fromkeys((*services.secrets, *masked_values(secrets.env))))
    for value in scrub:
        _mask(reporter, value)

    action = "Redeploying" if plan.previous else "Deploying"
    reporter.step(f"Plan: {action} {entry.relative_to(project_dir)} to {plan.title}")
    for line in plan_lines(plan, ctx, secrets, has_client=has_client):
        reporter.info(line)
    asks = services.interactive and not request.confirm
    if asks:
        pause = getattr(reporter, "pause", None)
        if callable(pause):
            pause()  # the question and a live view cannot share the terminal
        if not services.prompter().confirm("Go ahead?", default=True):
            return None

    open_log = getattr(reporter, "open_log", None)
    if callable(open_log):
        reporter.info(f"full output of this run: {open_log(ctx.deploy_dir)}")

    state = plan.previous or DeployState(platform=plan.platform, app=plan.app)
    state.platform = plan.platform
    state.region = plan.region
    state.options = dict(plan.options)
    state.python_version = plan.python_version

    def persist() -> None:
        state.adapter = dict(ctx.state)
        for where in save_state(project_dir, state, scrub):
            reporter.warn(f"{where} contained a secret value and was not saved to deploy.json")

    reached: list[str] = []  # the steps begun, so a failure knows whether the platform was touched
    try:
        result = _execute(
            plan, ctx, state, persist, services, entry=entry, has_client=has_client, reached=reached
        )
    except DeployError as exc:
        # Once the platform was touched the token may be there: the user must see it, even after a failure.
        if "platform" in reached:
            exc.admin_token = token
        raise
    result.admin_token = token
    if plan.ephemeral_data:
        warning = (
            f"{plan.app} keeps its data in SQLite on the container's disk (--ephemeral-data): every redeploy "
            "or restart erases it; set DATABASE_URL for data that lasts"
        )
        reporter.warn(warning)
        result.warnings.append(warning)
    return result


def _execute(
    plan: Plan,
    ctx: DeployContext,
    state: DeployState,
    persist: Callable[[], None],
    services: Services,
    *,
    entry: Path,
    has_client: bool,
    reached: list[str],
) -> DeployResult:
    reporter = services.reporter
    adapter = plan.adapter
    project_dir = ctx.project_dir

    reporter.step("Generating the container build recipe")
    render_deploy_files(
        ctx.deploy_dir, python_version=plan.python_version, port=ctx.port, has_client=has_client
    )
    if ensure_gitignored(project_dir):
        reporter.info("added .offline/ to .gitignore")
    services.bundler(
        project_dir,
        entry,
        ctx.deploy_dir,
        python_version=plan.python_version,
        runner=services.runner,
        reporter=reporter,
    )

    reporter.step(f"Creating the app on {plan.title} (when it does not exist)")
    reached.append("platform")
    ctx.state.update(adapter.provision(ctx) or {})
    persist()  # the app exists now: the next run must reuse its name even if a later step fails

    early_url = adapter.public_url(ctx)
    early_sync = sync_url_for(early_url)
    client_dir = build_client(
        project_dir, ctx.deploy_dir, sync_url=early_sync, runner=services.runner, reporter=reporter
    )

    reporter.step("Writing platform configuration")
    for path in adapter.render_config(ctx):
        reporter.info(f"wrote {path.name}")

    reporter.step(f"Deploying to {plan.title}")
    outcome = adapter.deploy(ctx)
    ctx.state.update(outcome.state)
    _remember(state, outcome, "deploy", services)
    persist()

    reporter.step("Waiting for the platform to report the app healthy")
    report = adapter.wait_until_healthy(ctx, outcome)
    url, sync_url, next_step, warning = _settle(state, outcome, report, services)
    if url:
        # The address the next client build starts from (an ECS task's IP is known only now).
        ctx.state["url"] = url
    persist()

    if client_dir is not None and early_sync is not None and early_sync != sync_url:
        reporter.warn(
            f"the client was built for {early_sync} but the app answers at {sync_url or 'no known URL'}; "
            "run `offline deploy` again so the client syncs with the deployed server"
        )
    return DeployResult(
        platform=plan.platform,
        app=plan.app,
        region=plan.region,
        url=url,
        sync_url=sync_url,
        deployment_id=outcome.deployment_id,
        state=report.state,
        healthy=report.healthy,
        health_warning=warning,
        client_deployed=client_dir is not None,
        next_step=next_step,
    )


def _remember(state: DeployState, outcome: DeployOutcome, kind: str, services: Services) -> None:
    state.url = outcome.url or None
    state.sync_url = sync_url_for(outcome.url)
    if outcome.deployment_id:
        state.record_deployment(outcome.deployment_id, kind=kind, at=services.now())


def next_step_of(report: StatusReport) -> str | None:
    """The command the user must run before the app serves (see PlatformAdapter.wait_until_healthy)."""
    command = report.details.get("command")
    if report.state == "NOT_FOUND" and isinstance(command, str) and command.strip():
        return command.strip()
    return None


def _settle(
    state: DeployState, outcome: DeployOutcome, report: StatusReport, services: Services
) -> tuple[str | None, str | None, str | None, str | None]:
    """After wait_until_healthy: the app's URL (the outcome's, else the one the platform reported), its sync
    URL, the next step when the deploy needs the user, and the health probe's warning. Updates ``state``."""
    url = outcome.url or report.url or None
    state.url = url
    state.sync_url = sync_url_for(url)
    next_step = next_step_of(report)
    warning = None if next_step else _probe(url, services)
    return url, state.sync_url, next_step, warning


def _probe(url: str | None, services: Services) -> str | None:
    """GET <url>/health for at most HEALTH_PROBE_SECONDS; warns (never raises) when it does not answer."""
    if services.health_probe is None:
        return None
    if not url:
        services.reporter.info(
            "skipping the direct GET /health: the platform reported no public URL for the app "
            "(`offline deploy status` shows it once it has one)"
        )
        return None
    health = url.rstrip("/") + "/health"
    problem = _bounded(services.health_probe, health, HEALTH_PROBE_SECONDS)
    if problem is not None:
        services.reporter.warn(
            f"the platform reports the app healthy, but GET {health} did not answer within "
            f"{HEALTH_PROBE_SECONDS:g} s ({problem}); DNS and certificates can take a few minutes"
        )
    return problem


def _bounded(probe: HealthProbe, url: str, seconds: float) -> str | None:
    """Run ``probe`` in a daemon thread for at most ``seconds``: a resolver that hangs (DNS is outside
    urlopen's timeout) or a probe that raises must not hold up or fail a deploy that already succeeded."""
    answers: list[str | None] = []

    def work() -> None:
        try:
            answers.append(probe(url, seconds))
        except Exception as exc:
            answers.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=work, name="offline-health-probe", daemon=True)
    thread.start()
    thread.join(seconds)
    return answers[0] if answers else "no answer"


# -- management: status, logs, rollback, reset -----------------------------------------------------------------


def _deployed(project_dir: Path, services: Services) -> tuple[DeployState, PlatformAdapter, DeployContext]:
    state = load_state(project_dir)
    if state is None:
        raise DeployError(
            f"{project_dir} has not been deployed yet (no .offline/deploy/deploy.json)",
            NOT_DEPLOYED,
            {"project_dir": str(project_dir)},
            hint="Run `offline deploy` first (or pass --project-dir for another folder).",
        )
    adapter = services.adapter(_check_platform(state.platform))
    ctx = _context(project_dir, adapter, state.app, state.region, state.adapter, state.options, services)
    return state, adapter, ctx


def run_status(project_dir: Path, services: Services) -> StatusResult:
    """Ask the platform how the deployed app is doing."""
    state, adapter, ctx = _deployed(project_dir, services)
    adapter.check_prerequisites(ctx)
    report = adapter.status(ctx)
    url = report.url or state.url
    try:
        protected: bool | None = ADMIN_TOKEN in adapter.existing_secrets(ctx)
    except DeployError:
        protected = None
    return StatusResult(
        platform_adapters.canonical(state.platform),
        state.app,
        state.region,
        report,
        url,
        sync_url_for(url),
        admin_protected=protected,
    )


def run_logs(project_dir: Path, services: Services, *, lines: int = 100) -> list[str]:
    """Recent output of the deployed app."""
    _, adapter, ctx = _deployed(project_dir, services)
    adapter.check_prerequisites(ctx)
    return adapter.logs(ctx, lines=lines)


def check_rollback(history: Sequence[Deployment], deployment_id: str | None, app: str) -> Deployment | None:
    """Refuse early what cannot be rolled back to. With ``deployment_id``: that deployment (it must be among
    those the platform lists, when it lists any). Without: None, after checking there is some deployment
    other than the current one; which one is the "previous" is the adapter's call (platforms differ on what
    can be returned to: Railway keeps REMOVED deployments, Fly skips releases of the same image)."""
    if deployment_id is not None:
        for deployment in history:
            if deployment.id == deployment_id:
                return deployment
        if not history:  # the platform lists nothing; trust the id and let the platform judge it
            return Deployment(id=deployment_id, status="UNKNOWN")
        known = ", ".join(d.id for d in history[:10])
        raise DeployError(
            f"{app} has no deployment {deployment_id!r} (known: {known})",
            UNKNOWN_DEPLOYMENT,
            {"deployment_id": deployment_id},
            hint="Pick an id from the list, or omit it to return to the previous deployment.",
        )
    current = next((i for i, d in enumerate(history) if d.current), 0)
    if len(history) > current + 1:
        return None
    raise DeployError(
        f"{app} has no previous deployment to roll back to",
        NO_PREVIOUS_DEPLOYMENT,
        {"app": app, "deployments": len(history)},
        hint="A rollback needs at least two deployments; deploy again after your next change.",
    )


def run_rollback(
    project_dir: Path, services: Services, *, deployment_id: str | None = None, confirm: bool = False
) -> DeployResult | None:
    """Return the app to an earlier deployment; None when the user declined."""
    if not confirm and not services.interactive:
        raise _missing("--confirm", "a rollback must be confirmed", "offline deploy rollback --confirm")
    state, adapter, ctx = _deployed(project_dir, services)
    adapter.check_prerequisites(ctx)
    history = adapter.deployments(ctx)
    target = check_rollback(history, deployment_id, state.app)
    current = next((d.id for d in history if d.current), None)
    if target is not None:
        when = f" from {target.created_at}" if target.created_at else ""
        goal = f"deployment {target.id}{when}"
    else:
        goal = "the previous deployment" + (f" (the current one is {current})" if current else "")
    if not confirm:
        question = f"Roll {state.app} on {adapter.title} back to {goal}?"
        if not services.prompter().confirm(question, default=False):
            return None
    services.reporter.step(f"Rolling {state.app} back to {goal}")
    outcome = adapter.rollback(ctx, deployment_id)
    ctx.state.update(outcome.state)
    _remember(state, outcome, "rollback", services)
    state.adapter = dict(ctx.state)
    save_state(project_dir, state, services.secrets)
    services.reporter.step("Waiting for the platform to report the app healthy")
    report = adapter.wait_until_healthy(ctx, outcome)
    url, sync_url, next_step, warning = _settle(state, outcome, report, services)
    save_state(project_dir, state, services.secrets)
    return DeployResult(
        platform=state.platform,
        app=state.app,
        region=state.region,
        url=url,
        sync_url=sync_url,
        deployment_id=outcome.deployment_id,
        state=report.state,
        healthy=report.healthy,
        health_warning=warning,
        next_step=next_step,
    )


@dataclass
class ResetResult:
    removed: bool
    platform: str | None = None
    app: str | None = None


def run_reset(project_dir: Path, services: Services, *, confirm: bool = False) -> ResetResult | None:
    """Delete ``.offline/deploy/`` (state and generated files); None when the user declined. The deployed
    app is not touched: no adapter is called."""
    folder = deploy_dir_of(project_dir)
    if not folder.exists():
        return ResetResult(removed=False)
    try:
        state = load_state(project_dir)
    except DeployError:
        state = None  # a broken deploy.json is one more reason to reset, not a reason to refuse
    if not confirm:
        if not services.interactive:
            raise _missing(
                "--confirm", "deleting the deploy state must be confirmed", "offline deploy --reset --confirm"
            )
        what = (
            f" of {state.app} on {_title(state.platform)}"
            if state and state.platform in platform_adapters.PLATFORMS
            else ""
        )
        if not services.prompter().confirm(
            f"Delete {folder} (the deploy state{what} and generated files)?", default=False
        ):
            return None
    reset_state(project_dir)
    return ResetResult(
        removed=True, platform=state.platform if state else None, app=state.app if state else None
    )
