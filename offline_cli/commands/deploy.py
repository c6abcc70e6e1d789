"""`offline deploy` and `offline deploy status|logs|rollback` (SPEC 4.6, DESIGN.md section 6).

Data (URLs, status, log lines) goes to stdout; progress, warnings and errors go to stderr. A DeployError
prints its message and hint and exits 1. The work itself lives in offline_cli.deploy.flow, imported only
when a command runs: `offline deploy --help` must stay fast (bench/cli_startup.py), and the flow pulls in
the whole `offline` library through the adapters' error classes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from rich.markup import escape

import platform_adapters

from ..environment import Environment, current_environment

if TYPE_CHECKING:
    from platform_adapters.base import DeployError

    from ..deploy.flow import DeployResult, Services, StatusResult

#: Where the deploy state and generated files live (offline_cli.deploy.state.DEPLOY_DIR, kept here so the
#: messages need no import of the state module).
DEPLOY_DIR = Path(".offline") / "deploy"

T = TypeVar("T")


class PlatformChoice(click.Choice):  # type: ignore[type-arg]
    """``--platform`` values: the names a person types (``fly``) and the neutral codes (``host-a``), read
    from platform_adapters when used (not when imported). The value passed on is the neutral code."""

    name = "platform"

    def __init__(self) -> None:
        super().__init__([], case_sensitive=True)

    @property  # type: ignore[override]
    def choices(self) -> list[str]:
        return [*platform_adapters.ALIASES, *platform_adapters.PLATFORMS]

    @choices.setter
    def choices(self, _: Any) -> None:
        pass  # click.Choice.__init__ assigns; the live table wins

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:  # type: ignore[override]
        return "[" + "|".join(platform_adapters.alias_of(c) for c in platform_adapters.implemented()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        return platform_adapters.canonical(str(super().convert(value, param, ctx)))


def _platform_help() -> str:
    names = ", ".join(
        f"{platform_adapters.alias_of(code)} = {title}"
        for code, (_, title) in platform_adapters.PLATFORMS.items()
        if code not in platform_adapters.STUB_PLATFORMS
    )
    return (
        f"Where to deploy: {names} (the codes host-a, host-b, cloud-a-containers, cloud-a-orchestrated, "
        "web-service-host work too). Asked when missing; remembered after the first deploy."
    )


def build_services(env: Environment) -> Services:
    """The real outside world of a deploy command (tests replace parts of it)."""
    from platform_adapters.base import SubprocessRunner, masked_values

    from ..deploy.flow import Services
    from ..deploy.progress import ProgressReporter

    reporter = ProgressReporter(env.err, masked_values(env.env), live=env.live_progress)
    return Services(
        env=env.env,
        interactive=env.interactive,
        reporter=reporter,
        runner=SubprocessRunner(dict(env.env), listener=reporter),
        prompter=env.get_prompter,
    )


def _fail(env: Environment, exc: DeployError, as_json: bool = False, reporter: Any = None) -> NoReturn:
    from platform_adapters.base import masked_values

    from ..deploy.reporter import redact

    secrets = (*masked_values(env.env), *getattr(reporter, "secrets", ()))
    err = env.err
    _show_vendor_tail(env, exc, reporter)
    if exc.admin_token:
        _show_admin_token(env, exc.admin_token, None, failed=True)
        secrets = (*secrets, exc.admin_token)
    if as_json:
        error = {
            "code": exc.code,
            "message": redact(exc.message, secrets),
            "hint": redact(exc.hint, secrets) or None,
        }
        _emit(env, json.dumps({"ok": False, "error": error}) + "\n")
    err.print(
        f"[bold red]error[/bold red] [{exc.code}]: {escape(redact(exc.message, secrets))}", highlight=False
    )
    if exc.hint:
        err.print(f"[yellow]hint:[/yellow] {escape(redact(exc.hint, secrets))}", highlight=False)
    raise click.exceptions.Exit(1)


def _guarded(env: Environment, work: Callable[[], T], as_json: bool = False, reporter: Any = None) -> T:
    """Run ``work``; a DeployError ends the command (exit 1) with the vendor's last lines, the error and
    its hint. ``reporter``: a ProgressReporter to close (its last step's time, the log file) either way."""
    from platform_adapters.base import DeployError

    try:
        return work()
    except DeployError as exc:
        _close(reporter)
        _fail(env, exc, as_json, reporter)
    finally:
        _close(reporter)  # also on Ctrl-C: the live view gives the terminal back


def _close(reporter: Any) -> None:
    close = getattr(reporter, "close", None)
    if callable(close):
        close()


def _show_vendor_tail(env: Environment, exc: DeployError, reporter: Any) -> None:
    """What the vendor tools said last (the lines the error does not quote already) and where all of it is."""
    tail = getattr(reporter, "tail", None)
    lines = [line for line in (tail() if callable(tail) else []) if line.strip() not in exc.message]
    log_path = getattr(reporter, "log_path", None)
    if lines:
        env.err.print("[dim]Last lines of the vendor output:[/dim]", highlight=False)
        for line in lines:
            env.err.print(f"  [dim]│[/dim] {escape(line)}", highlight=False, soft_wrap=True)
    if log_path is not None:
        env.err.print(f"[dim]Full output of this run: {escape(str(log_path))}[/dim]", highlight=False)


def _show_admin_token(env: Environment, token: str, url: str | None, *, failed: bool = False) -> None:
    """The one time the generated admin token is shown (stderr): it is in no file, and later runs keep the
    platform's value without printing it. After a failed run it may or may not have reached the platform."""
    err = env.err
    err.print()
    err.print(
        "[bold yellow]Admin token[/bold yellow] of the deployed app (shown only this once; keep it in a "
        "password manager). It guards /__offline/status, the dashboard and backups:",
        highlight=False,
    )
    if failed:
        err.print(
            "(this run failed: if it got as far as setting the token, the app has this one; otherwise the "
            "next deploy makes a new one and shows it)",
            highlight=False,
        )
    err.print(f"  [bold]{escape(token)}[/bold]", highlight=False, soft_wrap=True)
    target = url or "https://<your app>"
    err.print(
        f"Use it: OFFLINE_ADMIN_TOKEN=<the token> offline status --url {escape(target)}  (or pass --token)",
        highlight=False,
    )
    err.print()


def _comma_list(value: str | None, prefix: str, flag: str) -> list[str] | None:
    if value is None:
        return None
    items = [item.strip() for item in value.split(",") if item.strip()]
    wrong = [item for item in items if not item.startswith(prefix)]
    if not items or wrong:
        raise click.BadParameter(
            f"expected a comma-separated list of {prefix}… ids, got {value!r}", param_hint=flag
        )
    return items


def _project(project_dir: Path | None) -> Path:
    folder = (project_dir or Path.cwd()).resolve()
    if not folder.is_dir():
        raise click.BadParameter(f"{folder} is not a folder", param_hint="--project-dir")
    return folder


def _emit(env: Environment, text: str) -> None:
    env.stdout.write(text)
    env.stdout.flush()


def _print_result(env: Environment, result: DeployResult, as_json: bool) -> None:
    if as_json:
        _emit(env, json.dumps(result.to_json()) + "\n")
        return
    _emit(env, f"url:  {result.url or '-'}\nsync: {result.sync_url or '-'}\n")


def _print_next_step(env: Environment, result: DeployResult) -> None:
    """The deploy went as far as it can without the user: say what to run (stderr; --json carries it)."""
    env.err.print(
        f"[bold yellow]Next step:[/bold yellow] {escape(result.app)} is registered on {escape(result.vendor)} "
        "but does not run yet. Run:",
        highlight=False,
    )
    env.err.print(f"  {escape(result.next_step or '')}", highlight=False, soft_wrap=True)


def _inherited(name: str) -> Any:
    """A group-level option given before the subcommand (``offline deploy --project-dir X status``)."""
    ctx = click.get_current_context()
    return ctx.parent.params.get(name) if ctx.parent is not None else None


_PROJECT_DIR = click.option(
    "--project-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The project folder (default: the current folder).",
)


class DeployGroup(click.Group):
    """`offline deploy`: with --json, a command line click refuses (an unknown --platform, a bad flag, for the
    group or a subcommand such as `logs --lines x`) is also answered with one JSON error object on stdout, like
    every other failure."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        wants_json = "--json" in args
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            if wants_json:
                _emit_usage_error(exc)
            raise

    def invoke(self, ctx: click.Context) -> Any:
        # The subcommand's words are still pending here; click parses them (and may refuse them) inside.
        pending = [*getattr(ctx, "_protected_args", ()), *ctx.args]
        wants_json = "--json" in pending or bool(ctx.params.get("as_json"))
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            if wants_json:
                _emit_usage_error(exc)
            raise


def _emit_usage_error(exc: click.UsageError) -> None:
    command = exc.ctx.command_path if exc.ctx is not None else "offline deploy"
    error = {"code": "USAGE", "message": exc.format_message(), "hint": f"See `{command} --help`."}
    _emit(current_environment(), json.dumps({"ok": False, "error": error}) + "\n")


@click.group(
    cls=DeployGroup,
    invoke_without_command=True,
    epilog="""\b
Examples:
  offline deploy                                    choose a platform and app name interactively
  offline deploy --platform fly --app my-notes --confirm             Fly.io, non-interactive (CI)
  offline deploy --platform railway --app my-notes --confirm         Railway
  DATABASE_URL=postgresql://... offline deploy --platform lightsail --app notes --region eu-west-1
  offline deploy --platform ecs --app notes \\
      --subnets subnet-0a1b,subnet-2c3d --security-groups sg-0e4f --confirm
  offline deploy --platform fly --app notes --org my-team --confirm
  RENDER_API_KEY=rnd_... offline deploy --platform render --app notes --registry ghcr.io/my-team \\
      --registry-credential ghcr-bot --confirm                      Render (image pushed to your registry)
  offline deploy --platform self-hosted --app notes --publish 127.0.0.1:8080    this machine's engine
  offline deploy --platform docker --app notes --host ssh://deploy@my-server \\
      --registry ghcr.io/my-team --with-postgres --confirm                 your server, over SSH
  offline deploy --json                             redeploy; print one JSON object
  offline deploy status | logs --lines 50 | rollback
  offline deploy --reset --confirm                  forget the deployment (the app keeps running)
""",
)
@click.option("--platform", type=PlatformChoice(), default=None, help=_platform_help())
@click.option("--app", default=None, help="App name on the platform (asked when missing; remembered).")
@click.option("--region", default=None, help="Region (default: remembered, the AWS configuration, or asked).")
@click.option(
    "--confirm",
    is_flag=True,
    help="Never prompt (no plan question either): fail naming any missing option instead.",
)
@click.option(
    "--ephemeral-data",
    is_flag=True,
    help="lightsail/ecs without DATABASE_URL: accept SQLite on the container's disk, which a redeploy erases.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout.")
@click.option("--reset", is_flag=True, help="Delete the deploy state and generated files (.offline/deploy/).")
@click.option("--subnets", default=None, help="ecs: comma-separated subnet ids (remembered).")
@click.option("--security-groups", default=None, help="ecs: comma-separated security group ids (remembered).")
@click.option(
    "--org",
    default=None,
    help="fly: Fly.io organization a new app is created in (default personal; remembered).",
)
@click.option(
    "--workspace",
    default=None,
    help="railway: Railway workspace a new project is created in; render: the Render workspace (name or id) "
    "when the API key sees several (remembered).",
)
@click.option(
    "--registry",
    default=None,
    help="self-hosted/render: push the image to this registry, host/namespace (login: the engine's own, "
    "`docker login`; remembered).",
)
@click.option(
    "--registry-credential",
    default=None,
    help="render: name of the Render registry credential Render pulls the image with (default: the one for "
    "the registry's host, if exactly one; remembered).",
)
@click.option(
    "--host",
    default=None,
    help="self-hosted: run the stack on this machine's engine over SSH, ssh://user@machine[:port] "
    "(default: the local engine; remembered).",
)
@click.option(
    "--with-postgres",
    is_flag=True,
    default=None,
    help="self-hosted: add a PostgreSQL service with its own volume and wire DATABASE_URL (remembered).",
)
@click.option(
    "--publish",
    default=None,
    help="self-hosted: [address:]port the app is published on, e.g. 127.0.0.1:8080 (default 3001; remembered).",
)
@click.option(
    "--python-version",
    default=None,
    help="CPython minor version of the image, e.g. 3.12 (default: remembered, else this interpreter's).",
)
@_PROJECT_DIR
@click.pass_context
def deploy(
    ctx: click.Context,
    platform: str | None,
    app: str | None,
    region: str | None,
    confirm: bool,
    ephemeral_data: bool,
    as_json: bool,
    reset: bool,
    subnets: str | None,
    security_groups: str | None,
    org: str | None,
    workspace: str | None,
    registry: str | None,
    registry_credential: str | None,
    host: str | None,
    with_postgres: bool | None,
    publish: str | None,
    python_version: str | None,
    project_dir: Path | None,
) -> None:
    """Build the project and deploy it; print the live URL and the sync endpoint.

    The first run asks for (or takes from the flags) the platform, app name and region and remembers them
    in .offline/deploy/deploy.json. Every run shows its plan and, on a terminal, asks once before it
    creates or changes anything (--confirm does not ask). Generated files (Dockerfile, server.pyz, client
    build, platform configuration) and the log of each run (logs/) all live in .offline/deploy/.
    """
    if ctx.invoked_subcommand is not None:
        given = [
            flag
            for flag, value in (
                ("--platform", platform),
                ("--app", app),
                ("--region", region),
                ("--reset", reset),
                ("--ephemeral-data", ephemeral_data),
                ("--subnets", subnets),
                ("--security-groups", security_groups),
                ("--org", org),
                ("--workspace", workspace),
                ("--registry", registry),
                ("--registry-credential", registry_credential),
                ("--host", host),
                ("--with-postgres", with_postgres),
                ("--publish", publish),
                ("--python-version", python_version),
            )
            if value
        ]
        if given:
            raise click.UsageError(
                f"{', '.join(given)} cannot be combined with `deploy {ctx.invoked_subcommand}`"
            )
        return
    env = current_environment()
    folder = _project(project_dir)
    services = build_services(env)
    if reset:
        if (
            any(
                (
                    platform,
                    app,
                    region,
                    subnets,
                    security_groups,
                    org,
                    workspace,
                    registry,
                    registry_credential,
                    host,
                    with_postgres,
                    publish,
                )
            )
            or python_version
        ):
            raise click.UsageError("--reset takes no other deploy options (only --confirm and --project-dir)")
        _reset(env, folder, services, confirm)
        return
    from ..deploy.flow import DeployRequest, run_deploy

    request = DeployRequest(
        project_dir=folder,
        platform=platform,
        app=app,
        region=region,
        confirm=confirm,
        subnets=_comma_list(subnets, "subnet-", "--subnets"),
        security_groups=_comma_list(security_groups, "sg-", "--security-groups"),
        org=_name(org, "--org"),
        workspace=_name(workspace, "--workspace"),
        python_version=python_version,
        ephemeral_data=ephemeral_data,
        registry=_name(registry, "--registry"),
        registry_credential=_name(registry_credential, "--registry-credential"),
        host=_name(host, "--host"),
        with_postgres=True if with_postgres else None,
        publish=_name(publish, "--publish"),
    )
    for flags, flag_value, wanted in (
        ("--subnets and --security-groups apply", subnets or security_groups, ("cloud-a-orchestrated",)),
        ("--org applies", org, ("host-a",)),
        ("--workspace applies", workspace, ("host-b", "web-service-host")),
        (
            "--host, --with-postgres and --publish apply",
            host or with_postgres or publish,
            ("self-hosted-image",),
        ),
        ("--registry applies", registry, ("self-hosted-image", "web-service-host")),
        ("--registry-credential applies", registry_credential, ("web-service-host",)),
    ):
        if flag_value and platform and platform not in wanted:
            services.reporter.warn(
                f"{flags} only to {' and '.join(platform_adapters.vendor_name(code) for code in wanted)}; "
                f"ignored for {platform_adapters.vendor_name(platform)}"
            )
    result = _guarded(env, lambda: run_deploy(request, services), as_json, services.reporter)
    if result is None:
        env.err.print("Aborted: nothing was created or changed.")
        if as_json:
            _emit(env, json.dumps({"ok": False, "error": {"code": "ABORTED", "message": "declined"}}) + "\n")
        raise click.exceptions.Exit(1)
    if result.admin_token:
        _show_admin_token(env, result.admin_token, result.url)
    if result.next_step:
        _print_next_step(env, result)
    else:
        env.err.print(f"[bold green]Deployed[/bold green] {escape(result.app)} to {escape(result.vendor)}.")
    _print_result(env, result, as_json)


def _name(value: str | None, flag: str) -> str | None:
    """An organization or workspace name: given means not blank."""
    if value is None:
        return None
    if not value.strip():
        raise click.BadParameter("must not be empty", param_hint=flag)
    return value.strip()


def _reset(env: Environment, folder: Path, services: Services, confirm: bool) -> None:
    from ..deploy.flow import run_reset

    outcome = _guarded(env, lambda: run_reset(folder, services, confirm=confirm), reporter=services.reporter)
    if outcome is None:
        env.err.print("Aborted: nothing was deleted.")
        raise click.exceptions.Exit(1)
    if not outcome.removed:
        env.err.print(f"Nothing to reset: {folder / DEPLOY_DIR} does not exist.")
        return
    env.err.print(f"Deleted {escape(str(folder / DEPLOY_DIR))} (deploy state and generated files).")
    if outcome.app:
        env.err.print(
            f"The app {escape(outcome.app)} on {escape(platform_adapters.vendor_name(outcome.platform or '?'))} "
            "was left running; delete it "
            "with the platform's own tools if you no longer need it. The next `offline deploy` starts from "
            "scratch."
        )
    else:
        env.err.print(
            "Any app deployed earlier was left running; the next `offline deploy` starts from scratch."
        )


def _status_text(result: StatusResult) -> str:
    report = result.report
    state: str = report.state
    if state == "DEPLOYING":
        state += " (a rollout is in progress; it can take 2 to 5 minutes)"
    elif state == "RUNNING":
        state += " (healthy)" if report.healthy else " (not healthy)"
    where = platform_adapters.vendor_name(result.platform) + (
        f", region {result.region}" if result.region else ""
    )
    lines = [
        f"app:        {result.app} ({where})",
        f"state:      {state}",
        f"url:        {result.url or '-'}",
        f"sync:       {result.sync_url or '-'}",
    ]
    if report.deployment_id:
        lines.append(f"deployment: {report.deployment_id}")
    if result.admin_protected is not None:
        lines.append(
            "admin:      "
            + (
                "protected (OFFLINE_ADMIN_TOKEN is set)"
                if result.admin_protected
                else "OPEN: OFFLINE_ADMIN_TOKEN is not set; run `offline deploy` to set one"
            )
        )
    return "\n".join(lines) + "\n"


@deploy.command(
    epilog="""\b
Examples:
  offline deploy status
  offline deploy status --json | jq .state
  offline deploy status --project-dir ~/src/notes
"""
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_PROJECT_DIR
def status(as_json: bool, project_dir: Path | None) -> None:
    """Report the deployed app's health, URL and sync endpoint (DEPLOYING during a rollout)."""
    from ..deploy.flow import run_status

    env = current_environment()
    folder = _project(project_dir or _inherited("project_dir"))
    services = build_services(env)
    result = _guarded(
        env, lambda: run_status(folder, services), as_json or bool(_inherited("as_json")), services.reporter
    )
    if as_json or _inherited("as_json"):
        _emit(env, json.dumps(result.to_json()) + "\n")
    else:
        _emit(env, _status_text(result))


@deploy.command(
    epilog="""\b
Examples:
  offline deploy logs
  offline deploy logs --lines 500 > app.log
"""
)
@click.option(
    "--lines", "-n", type=click.IntRange(1, 10_000), default=100, show_default=True, help="How many."
)
@_PROJECT_DIR
def logs(lines: int, project_dir: Path | None) -> None:
    """Show recent output of the deployed app."""
    from ..deploy.flow import run_logs

    env = current_environment()
    folder = _project(project_dir or _inherited("project_dir"))
    services = build_services(env)
    output = _guarded(env, lambda: run_logs(folder, services, lines=lines), reporter=services.reporter)
    if not output:
        env.err.print("No log lines yet: the platform returned none for this app.")
    _emit(env, "".join(line.rstrip("\n") + "\n" for line in output))


@deploy.command(
    epilog="""\b
Examples:
  offline deploy rollback                 back to the previous deployment (asks first)
  offline deploy rollback --confirm       without asking (CI)
  offline deploy rollback 01J9ZK3...      back to a given deployment id
"""
)
@click.argument("deployment_id", required=False)
@click.option("--confirm", is_flag=True, help="Do not ask; required when there is no terminal.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@_PROJECT_DIR
def rollback(deployment_id: str | None, confirm: bool, as_json: bool, project_dir: Path | None) -> None:
    """Return the app to its previous deployment, or to DEPLOYMENT_ID."""
    from ..deploy.flow import run_rollback

    env = current_environment()
    folder = _project(project_dir or _inherited("project_dir"))
    services = build_services(env)
    confirmed = confirm or bool(_inherited("confirm"))
    wants_json = as_json or bool(_inherited("as_json"))
    result = _guarded(
        env,
        lambda: run_rollback(folder, services, deployment_id=deployment_id, confirm=confirmed),
        wants_json,
        services.reporter,
    )
    if result is None:
        env.err.print("Aborted: nothing was changed.")
        raise click.exceptions.Exit(1)
    if result.next_step:
        _print_next_step(env, result)
    else:
        env.err.print(
            f"[bold green]Rolled back[/bold green] {escape(result.app)} to {escape(result.deployment_id)}."
        )
    _print_result(env, result, as_json or bool(_inherited("as_json")))
