"""The one interface every deploy platform implements (DESIGN.md section 6).

The deploy command (``offline_cli.deploy``) owns the steps every platform shares: find the server entry,
render the Dockerfile, bundle the zipapp, build the client, keep ``deploy.json``. An adapter owns only what
differs between platforms: its prerequisites, its configuration files, creating the app, shipping the image,
and reading back status, logs and past deployments.

Adapters never touch the terminal or ``os.environ`` directly. Vendor CLIs run through a ``CommandRunner`` and
their argv comes from pure builder functions (tested as data); AWS goes through boto3 clients made by a
``client_factory`` (tests pass Stubber- or moto-backed clients); the local container engine goes through a
``ContainerEngine``. Everything an adapter learns that a later run needs (service ARNs, image references) goes
in ``DeployOutcome.state`` and comes back as ``DeployContext.state``; secrets never do.
"""

from __future__ import annotations

import abc
import json
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from offline.core.errors import OfflineError

__all__ = [
    "ADMIN_TOKEN",
    "DEPLOY_ERROR_CODES",
    "EPHEMERAL_DATA",
    "SECRET_VARIABLES",
    "CommandResult",
    "CommandRunner",
    "ContainerEngine",
    "DeployContext",
    "DeployError",
    "DeployOutcome",
    "Deployment",
    "DeploymentState",
    "OutputListener",
    "PlatformAdapter",
    "Reporter",
    "StatusReport",
    "SubprocessRunner",
    "forwarded_environment",
    "masked_values",
    "report_change",
    "sync_url_for",
]

# Error codes of SPEC 7.3 (and the few the deploy command adds). Each DeployError message contains SPEC's
# phrase for its condition, and ``hint`` says what to do next.
CLI_NOT_INSTALLED = "CLI_NOT_INSTALLED"  # "host CLI required but not installed"
ENTRY_NOT_FOUND = "ENTRY_NOT_FOUND"  # "could not find a server entry file"
NAME_TAKEN = "NAME_TAKEN"  # "name has already been taken"
DAEMON_UNAVAILABLE = "DAEMON_UNAVAILABLE"  # "cannot connect to the container daemon"
PUSH_PLUGIN_MISSING = "PUSH_PLUGIN_MISSING"  # "container push plugin was not found"
NOT_AUTHENTICATED = "NOT_AUTHENTICATED"  # "cloud CLI is not authenticated"
WRONG_ARCHITECTURE = "WRONG_ARCHITECTURE"  # "image does not provide linux/amd64 platform"
NOT_IMPLEMENTED = "NOT_IMPLEMENTED"  # "not implemented yet"
MISSING_OPTION = "MISSING_OPTION"  # a value no flag, state or prompt gave (names the flag)
NO_PREVIOUS_DEPLOYMENT = "NO_PREVIOUS_DEPLOYMENT"  # rollback with nothing to roll back to
NOT_DEPLOYED = "NOT_DEPLOYED"  # status/logs/rollback before any deploy (no deploy.json)
PLATFORM_ERROR = "PLATFORM_ERROR"  # the vendor answered with an error we have no better name for
BUILD_FAILED = "BUILD_FAILED"  # bundling, client build or image build failed
HEALTH_TIMEOUT = "HEALTH_TIMEOUT"  # the platform never reported the deployment healthy
EPHEMERAL_DATA = "EPHEMERAL_DATA"  # SQLite would live on a disk a redeploy erases, and nobody agreed to that

DEPLOY_ERROR_CODES = frozenset(
    {
        CLI_NOT_INSTALLED,
        ENTRY_NOT_FOUND,
        NAME_TAKEN,
        DAEMON_UNAVAILABLE,
        PUSH_PLUGIN_MISSING,
        NOT_AUTHENTICATED,
        WRONG_ARCHITECTURE,
        NOT_IMPLEMENTED,
        MISSING_OPTION,
        NO_PREVIOUS_DEPLOYMENT,
        NOT_DEPLOYED,
        PLATFORM_ERROR,
        BUILD_FAILED,
        HEALTH_TIMEOUT,
        EPHEMERAL_DATA,
    }
)

#: Variables forwarded from the local shell to the deployed container (SPEC 4.6 rule 5). They are passed to
#: the platform's secret/environment API at deploy time and never written to generated files or deploy.json.
#: The server's auth and email settings travel the same way: some carry credentials (OFFLINE_SMTP_URL's
#: password, OAuth client secrets), and one channel for all keeps every adapter forwarding every setting.
SECRET_VARIABLES = (
    "DATABASE_URL",
    "AUTH_SECRET",
    "PUBLIC_URL",
    "OFFLINE_ADMIN_TOKEN",
    "OFFLINE_METRICS_TOKEN",
    "OFFLINE_BACKUP_TOKEN",
    "OFFLINE_SMTP_URL",
    "OFFLINE_EMAIL_FROM",
    "OFFLINE_APP_URL",
    "OFFLINE_OAUTH_PROVIDERS",
    "OFFLINE_JWT_ISSUERS",
    "OFFLINE_AUTH_REQUIRE_VERIFIED_EMAIL",
)
#: Forwarded like the others but not masked in output: a switch such as ``true`` or ``sync`` is no secret, and
#: masking it would blank every occurrence of that word in the deploy's messages.
UNMASKED_VARIABLES = frozenset({"OFFLINE_AUTH_REQUIRE_VERIFIED_EMAIL"})
#: Guards the deployed app's admin surface (/__offline/status, the dashboard, backups). The first deploy
#: generates one when neither the shell nor the platform has it.
ADMIN_TOKEN = "OFFLINE_ADMIN_TOKEN"

#: What `offline deploy status` reports. DEPLOYING while a rollout is in progress (SPEC 3.2).
DeploymentState = Literal["RUNNING", "DEPLOYING", "FAILED", "STOPPED", "NOT_FOUND", "UNKNOWN"]


class DeployError(OfflineError):
    """A deploy step failed. ``hint`` is the next thing the user should do (an install command, a flag)."""

    def __init__(
        self, message: str, code: str, context: Mapping[str, Any] | None = None, *, hint: str = ""
    ) -> None:
        super().__init__(message, code, dict(context or {}))
        self.hint = hint
        #: an admin token this run generated and may already have set on the platform (shown with the error)
        self.admin_token: str | None = None

    def __str__(self) -> str:
        return f"{self.message}\n{self.hint}" if self.hint else self.message


# -- the outside world, injectable -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """stdout parsed as JSON (vendor CLIs' ``--json``); a DeployError naming the command otherwise."""
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as exc:
            raise DeployError(
                f"`{' '.join(self.argv[:3])}` did not print JSON: {exc}",
                PLATFORM_ERROR,
                {"argv": list(self.argv[:3])},
                hint="Update the vendor CLI to a version that supports --json, then retry.",
            ) from None


class CommandRunner(Protocol):
    """Runs vendor CLIs. Tests use the real SubprocessRunner with fake executables first on PATH.

    ``stream``: a long step (a remote build, an upload) whose output people want to watch as it comes.
    ``secret_output``: the output carries secret values (a variables listing): it is for the caller only,
    never shown or logged."""

    def which(self, name: str) -> str | None: ...

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        input: str | None = None,
        timeout: float | None = None,
        stream: bool = False,
        secret_output: bool = False,
    ) -> CommandResult: ...


class OutputListener(Protocol):
    """Where vendor output goes besides the CommandResult (offline_cli.deploy.progress.ProgressReporter)."""

    def vendor_line(self, line: str) -> None: ...

    def vendor_output(self, argv: Sequence[str], stdout: str, stderr: str, returncode: int) -> None: ...


@dataclass
class SubprocessRunner:
    """The real runner. ``env`` is the whole environment of the child (PATH included); ``extra`` adds to it.
    With a ``listener``, streamed commands hand each output line to it as it is printed, and the others
    their whole output when they end."""

    env: Mapping[str, str]
    listener: OutputListener | None = None

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.env.get("PATH"))

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        input: str | None = None,
        timeout: float | None = None,
        stream: bool = False,
        secret_output: bool = False,
    ) -> CommandResult:
        full_env = {**self.env, **(env or {})}
        executable = self.which(argv[0]) or argv[0]
        if stream and not secret_output and self.listener is not None:
            return self._streamed(argv, [executable, *argv[1:]], full_env, cwd, input, timeout, self.listener)
        result = self._captured(argv, [executable, *argv[1:]], full_env, cwd, input, timeout)
        if self.listener is not None:
            if secret_output:
                self.listener.vendor_output(
                    argv, "(output not logged: it carries secret values)", "", result.returncode
                )
            else:
                self.listener.vendor_output(argv, result.stdout, result.stderr, result.returncode)
        return result

    @staticmethod
    def _streamed(
        argv: Sequence[str],
        command: list[str],
        env: Mapping[str, str],
        cwd: Path | None,
        input: str | None,
        timeout: float | None,
        listener: OutputListener,
    ) -> CommandResult:
        import threading

        try:
            process = subprocess.Popen(
                command,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                encoding="utf-8",
                errors="replace",
                bufsize=1,
            )
        except FileNotFoundError:
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: command not found")
        captured: dict[str, list[str]] = {"stdout": [], "stderr": []}

        def pump(name: str, pipe: Any) -> None:
            for line in pipe:
                captured[name].append(line)
                listener.vendor_line(line)
            pipe.close()

        readers = [
            threading.Thread(target=pump, args=(name, pipe), daemon=True)
            for name, pipe in (("stdout", process.stdout), ("stderr", process.stderr))
        ]
        for reader in readers:
            reader.start()
        assert process.stdin is not None
        try:
            process.stdin.write(input or "")
            process.stdin.close()
        except BrokenPipeError:
            pass  # the tool ended without reading its input; its exit status tells what happened
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            for reader in readers:
                reader.join(5)
            return CommandResult(
                tuple(argv), 124, "".join(captured["stdout"]), f"{argv[0]} timed out after {timeout} s"
            )
        for reader in readers:
            reader.join()
        return CommandResult(
            tuple(argv), returncode, "".join(captured["stdout"]), "".join(captured["stderr"])
        )

    @staticmethod
    def _captured(
        argv: Sequence[str],
        command: list[str],
        env: Mapping[str, str],
        cwd: Path | None,
        input: str | None,
        timeout: float | None,
    ) -> CommandResult:
        full_env = env
        executable, *rest = command
        try:
            done = subprocess.run(
                [executable, *rest],
                env=full_env,
                cwd=cwd,
                input=input,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError:
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return CommandResult(tuple(argv), 124, "", f"{argv[0]} timed out after {timeout} s")
        return CommandResult(tuple(argv), done.returncode, done.stdout, done.stderr)


class ContainerEngine(Protocol):
    """The local container engine (Docker, or podman's Docker-compatible socket), for the AWS platforms."""

    def ping(self) -> None:
        """Raise DeployError(DAEMON_UNAVAILABLE) when no engine answers."""

    def build(self, context_dir: Path, tag: str, *, build_args: Mapping[str, str] | None = None) -> str:
        """Build ``context_dir``'s Dockerfile for linux/amd64; return the image id."""

    def image_platform(self, tag: str) -> str:
        """``os/architecture`` of a local image, e.g. ``linux/amd64``."""

    def tag(self, source: str, target: str) -> None: ...

    def push(self, tag: str, *, username: str | None = None, password: str | None = None) -> str:
        """Push; return the pushed digest (``sha256:...``)."""


class Reporter(Protocol):
    """Progress of the deploy on stderr (rich in the CLI; a list in tests)."""

    def step(self, title: str) -> None:
        """A new step starts (``Building image``)."""

    def info(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...


def report_change(reporter: Reporter, seen: list[str], message: str) -> None:
    """``reporter.info(message)`` unless it repeats the last message reported through ``seen``: a wait on
    the platform shows each new state once, as the platform reports it."""
    if not seen or seen[-1] != message:
        seen.append(message)
        reporter.info(message)


# -- what the deploy command hands an adapter and gets back -------------------------------------------------------


@dataclass
class DeployContext:
    """Everything an adapter may use. ``state`` is the adapter's part of deploy.json from earlier runs."""

    project_dir: Path
    deploy_dir: Path  # <project>/.offline/deploy: Dockerfile, server.pyz, client/, platform files
    app: str
    region: str | None
    env: Mapping[str, str]  # the local shell's environment (credentials, SECRET_VARIABLES, PATH)
    runner: CommandRunner
    reporter: Reporter
    state: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # platform flags, e.g. subnets, security_groups
    port: int = 3001
    client_factory: Callable[..., Any] | None = None  # boto3-like: client_factory("ecs", region_name=...)
    engine: ContainerEngine | None = None
    health_timeout: float = 600.0  # platform rollouts take 2 to 5 minutes (SPEC 3.2)
    poll_interval: float = 5.0
    sleep: Callable[[float], None] | None = None  # injectable for tests (time.sleep otherwise)

    def forwarded_secrets(self) -> dict[str, str]:
        return forwarded_environment(self.env)


SYNC_PATH = "/offline-sync"


def sync_url_for(url: str | None) -> str | None:
    """The sync endpoint of the app at ``url``: ``wss://`` for https, ``ws://`` for plain http (an ECS task
    reached at its IP, a local test); None when there is no URL."""
    if not url:
        return None
    scheme, _, rest = url.partition("://")
    if not rest:  # a bare host: platforms give https hosts
        scheme, rest = "https", url
    host = rest.split("/", 1)[0]
    return f"{'ws' if scheme.lower() == 'http' else 'wss'}://{host}{SYNC_PATH}"


@dataclass(frozen=True)
class DeployOutcome:
    """The result of deploy or rollback: where it lives and what to remember."""

    url: str  # https://<host>; http://<ip>:<port> or "" when the platform has no stable address (ECS)
    deployment_id: str
    state: dict[str, Any] = field(default_factory=dict)  # merged into the adapter's part of deploy.json

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[-1].split("/", 1)[0]

    @property
    def sync_url(self) -> str:
        """``wss://<host>/offline-sync`` (``ws://`` for an http URL); "" when ``url`` is empty."""
        return sync_url_for(self.url) or ""


@dataclass(frozen=True)
class StatusReport:
    state: DeploymentState
    healthy: bool
    url: str | None = None
    deployment_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Deployment:
    """One past or current deployment, newest first in ``PlatformAdapter.deployments``."""

    id: str
    status: str
    created_at: str | None = None
    image: str | None = None
    current: bool = False


def forwarded_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The SECRET_VARIABLES set (non-empty) in ``env``."""
    return {name: env[name] for name in SECRET_VARIABLES if env.get(name)}


def masked_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """What must never be shown: each forwarded secret value and, for a URL-valued one (DATABASE_URL), its
    password on its own, as written and percent-decoded (a database or vendor error may echo just that).
    For masking output only; deploy.json is scrubbed of the whole values (see offline_cli.deploy.state)."""
    from urllib.parse import unquote, urlsplit

    values: list[str] = []
    for name, value in forwarded_environment(env).items():
        if name in UNMASKED_VARIABLES:
            continue
        values.append(value)
        try:
            password = urlsplit(value).password
        except ValueError:  # not a URL urllib can split
            password = None
        if password:
            values += [password, unquote(password)]
    return tuple(dict.fromkeys(values))


class PlatformAdapter(abc.ABC):
    """One deploy platform. Methods run in the order the deploy command (``offline_cli.deploy.flow``) calls
    them.

    Deploy: check_prerequisites, then (after the shared Dockerfile and zipapp steps) provision, public_url
    (its answer becomes the client build's BUILD_SYNC_URL; the client is built right after), render_config,
    deploy, wait_until_healthy. A redeploy runs the same calls (provision finds the app and does nothing).
    Management: check_prerequisites, then status (``deploy status``), logs (``deploy logs``), or deployments,
    rollback, wait_until_healthy (``deploy rollback``). ``offline deploy --reset`` only removes local state
    and files; it calls no adapter method.
    """

    #: the ``--platform`` value (DESIGN.md section 6)
    name: ClassVar[str]
    #: shown in the interactive prompt
    title: ClassVar[str]
    #: None when the platform has no regions or picks one itself
    default_region: ClassVar[str | None] = None
    #: offered by the interactive region prompt
    regions: ClassVar[tuple[str, ...]] = ()
    #: True when the image is built locally (the AWS platforms) rather than by the vendor's builders
    needs_container_engine: ClassVar[bool] = False
    #: True when SQLite (no DATABASE_URL) gets storage that outlives a redeploy (a volume); False when it
    #: would sit on the container's throwaway disk, which the deploy refuses without --ephemeral-data
    persistent_storage: ClassVar[bool] = True

    def existing_secrets(self, ctx: DeployContext) -> dict[str, str | None]:
        """Variables of SECRET_VARIABLES the platform already holds for the app, by name. The value is
        given where every deploy must send it again (the AWS platforms replace the whole environment),
        None where the platform keeps it across deploys. {} when the app does not exist yet."""
        return {}

    def planned_resources(self, ctx: DeployContext) -> list[str]:
        """What the deploy creates or changes on the platform, one line each, for the plan shown before
        anything happens."""
        return [f"app {ctx.app} (created when missing), then a new deployment of it"]

    def storage(self, ctx: DeployContext) -> str:
        """Where the app's data lives, for the plan."""
        if "DATABASE_URL" in ctx.forwarded_secrets():
            return "the database at DATABASE_URL"
        if self.persistent_storage:
            return "SQLite on a persistent volume at /data"
        return "SQLite on the container's disk: a redeploy or restart erases it"

    @abc.abstractmethod
    def check_prerequisites(self, ctx: DeployContext) -> None:
        """Vendor CLI installed, logged in, plugins present; raise DeployError with an install/login hint."""

    def public_url(self, ctx: DeployContext) -> str | None:
        """The app's https URL when it can be known before deploying (to bake BUILD_SYNC_URL into the client)."""
        return ctx.state.get("url")

    def render_config(self, ctx: DeployContext) -> list[Path]:
        """Write platform configuration files into ``ctx.deploy_dir``; return their paths."""
        return []

    @abc.abstractmethod
    def provision(self, ctx: DeployContext) -> dict[str, Any]:
        """Create the app/service/repository when missing; return state to remember."""

    @abc.abstractmethod
    def deploy(self, ctx: DeployContext) -> DeployOutcome:
        """Build/push the image from ``ctx.deploy_dir`` and start it."""

    @abc.abstractmethod
    def wait_until_healthy(self, ctx: DeployContext, outcome: DeployOutcome) -> StatusReport:
        """Poll the platform until it reports the deployment healthy (DESIGN.md section 6), or raise
        DeployError(HEALTH_TIMEOUT) after ``ctx.health_timeout``.

        A deploy that went as far as it can without the user (ECS without network settings registers the
        task definition but cannot create the service) returns state NOT_FOUND with the command to run in
        ``details["command"]``: the deploy command reports it as the next step and exits 0."""

    @abc.abstractmethod
    def status(self, ctx: DeployContext) -> StatusReport: ...

    @abc.abstractmethod
    def logs(self, ctx: DeployContext, *, lines: int = 100) -> list[str]: ...

    @abc.abstractmethod
    def deployments(self, ctx: DeployContext) -> list[Deployment]:
        """Past deployments, newest first."""

    @abc.abstractmethod
    def rollback(self, ctx: DeployContext, deployment_id: str | None = None) -> DeployOutcome:
        """Return to ``deployment_id``, or to the one before the current when None; raise
        DeployError(NO_PREVIOUS_DEPLOYMENT) when there is none."""


def _working_platforms_hint() -> str:
    """The platforms that work, by the names a person types, from the platform table (so it cannot drift)."""
    from . import PLATFORMS, STUB_PLATFORMS, alias_of

    working = [
        f"{alias_of(code)} ({title})" for code, (_, title) in PLATFORMS.items() if code not in STUB_PLATFORMS
    ]
    return "Choose one of: " + ", ".join(working) + "."


class StubAdapter(PlatformAdapter):
    """A platform shown in the prompt but not built yet: every entry point refuses (SPEC 4.6)."""

    def _refuse(self) -> DeployError:
        return DeployError(
            f"The platform {self.name!r} ({self.title}) is not implemented yet.",
            NOT_IMPLEMENTED,
            {"platform": self.name},
            hint=_working_platforms_hint(),
        )

    def check_prerequisites(self, ctx: DeployContext) -> None:
        raise self._refuse()

    def provision(self, ctx: DeployContext) -> dict[str, Any]:
        raise self._refuse()

    def deploy(self, ctx: DeployContext) -> DeployOutcome:
        raise self._refuse()

    def wait_until_healthy(self, ctx: DeployContext, outcome: DeployOutcome) -> StatusReport:
        raise self._refuse()

    def status(self, ctx: DeployContext) -> StatusReport:
        raise self._refuse()

    def logs(self, ctx: DeployContext, *, lines: int = 100) -> list[str]:
        raise self._refuse()

    def deployments(self, ctx: DeployContext) -> list[Deployment]:
        raise self._refuse()

    def rollback(self, ctx: DeployContext, deployment_id: str | None = None) -> DeployOutcome:
        raise self._refuse()
