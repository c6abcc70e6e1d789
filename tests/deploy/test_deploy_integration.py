"""`offline deploy` through the command line with the real adapters behind it: ECS against moto (a first deploy
that can only register the task definition, a service whose task has no known address), Fly.io and Railway
against their fake CLIs (``--org``, ``--workspace``, and ``--reset``, which must run no vendor CLI), SPEC 7.3
errors with their hints, and secrets masked in what the user sees. Only the shiv bundle and the final health probe are
replaced (the real ones are covered in test_steps.py and test_deploy_command.py)."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import platform_adapters
from offline_cli.commands import deploy as deploy_command
from offline_cli.deploy.flow import Services
from offline_cli.deploy.prompts import ScriptedPrompter
from offline_cli.deploy.state import load_state
from offline_cli.environment import Environment
from offline_cli.main import cli
from platform_adapters import STUB_PLATFORMS, load_adapter
from platform_adapters.base import DeployError
from tests.deploy.fakes.harness import FakeCliEnv

from ._core_fakes import FakeBundler, write_project


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


@dataclass
class Cli:
    """Runs `offline deploy` with ``env`` as the whole environment and the given service overrides."""

    project: Path
    env: dict[str, str]
    overrides: dict[str, Any] = field(default_factory=dict)
    probes: list[str] = field(default_factory=list)

    def __call__(self, *args: str, prompter: ScriptedPrompter | None = None) -> Run:
        """``prompter`` given: stdin is a terminal and questions go to it; otherwise there is no terminal."""
        out, err = io.StringIO(), io.StringIO()
        environment = Environment(
            stdin=io.StringIO(),
            stdout=out,
            stderr=err,
            env=self.env,
            stdin_isatty=prompter is not None,
            stdout_isatty=False,
            prompter=prompter or ScriptedPrompter(),
        )
        result = CliRunner().invoke(
            cli,
            ["deploy", *args, "--project-dir", str(self.project)],
            obj=environment,
            catch_exceptions=False,
        )
        return Run(result.exit_code, out.getvalue(), err.getvalue())


@pytest.fixture
def deploy_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    runner = Cli(write_project(tmp_path / "notes"), env={})
    real_build = deploy_command.build_services

    def probe(url: str, seconds: float) -> str | None:
        runner.probes.append(url)
        return None

    def build(environment: Environment) -> Services:
        # No real pause between status polls: the fake vendor CLIs advance a deployment one status per call,
        # not with time, so each 5 s poll_interval only cost wall time (10 s of a Railway deploy and redeploy).
        # The polls still happen, and the health deadline still counts their nominal pauses (_cli.py).
        services = replace(
            real_build(environment), bundler=FakeBundler(), health_probe=probe, sleep=lambda seconds: None
        )
        return replace(services, **runner.overrides)

    monkeypatch.setattr(deploy_command, "build_services", build)
    yield runner


# -- ECS (cloud-a-orchestrated) against moto ------------------------------------------------------------------


@pytest.fixture
def ecs(deploy_cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Cli]:
    if not os.environ.get("CI"):
        pytest.importorskip("boto3", reason="the AWS extra is not installed: pip install 'offline[aws]'")
        pytest.importorskip("moto", reason="moto is not installed: pip install 'offline[test]'")
    from moto import mock_aws

    from ._aws_support import REGION, FakeEngine, RecordingFactory, set_fake_aws_credentials

    set_fake_aws_credentials(monkeypatch, tmp_path)
    deploy_cli.env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path / "home"),
        "AWS_REGION": REGION,
        "DATABASE_URL": ECS_DATABASE_URL,
    }
    with mock_aws():
        deploy_cli.overrides = {
            "client_factory": RecordingFactory(),
            "engine_factory": lambda env: FakeEngine(),
            "sleep": lambda seconds: None,
            "health_timeout": 3.0,
            "poll_interval": 1.0,
        }
        yield deploy_cli


ECS_FIRST = ("--platform", "cloud-a-orchestrated", "--app", "notes", "--confirm")
ECS_DATABASE_URL = "postgresql://notes:pg-secret-pw@db.internal:5432/notes"


def _task_environments(ecs: Cli) -> list[dict[str, str]]:
    factory = ecs.overrides["client_factory"]
    return [
        {item["name"]: item["value"] for item in params["containerDefinitions"][0]["environment"]}
        for params in factory.params("ecs", "register_task_definition")
    ]


def test_ecs_without_database_url_is_refused_naming_the_variable_and_the_flag(ecs: Cli) -> None:
    del ecs.env["DATABASE_URL"]
    run = ecs(*ECS_FIRST, "--json")
    assert run.exit_code == 1
    error = json.loads(run.stdout)["error"]
    assert error["code"] == "EPHEMERAL_DATA"
    assert "DATABASE_URL" in error["message"] and "--ephemeral-data" in error["hint"]
    assert ecs.overrides["client_factory"].calls == []  # refused before anything on AWS
    assert not (ecs.project / ".offline").exists()

    accepted = ecs(*ECS_FIRST, "--ephemeral-data", "--json")
    assert accepted.exit_code == 0, accepted.stderr
    warnings = json.loads(accepted.stdout)["warnings"]
    assert len(warnings) == 1 and "every redeploy or restart erases it" in warnings[0]
    assert "warning:" in accepted.stderr and "--ephemeral-data" in accepted.stderr
    assert "SQLite on the container's disk" in accepted.stderr  # the plan said so first


def test_ecs_gets_a_generated_admin_token_shown_once_and_kept_by_later_deploys(ecs: Cli) -> None:
    import boto3

    ec2 = boto3.client("ec2", region_name="eu-west-1")
    vpc = ec2.create_vpc(CidrBlock="10.10.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.10.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="notes", Description="offline app", VpcId=vpc)["GroupId"]
    # moto never completes an ECS rollout, so both deploys end in HEALTH_TIMEOUT after the service got the
    # revision: the token must be shown all the same, since it is on the platform by then.
    first = ecs(*ECS_FIRST, "--subnets", subnet, "--security-groups", group)
    assert first.exit_code == 1 and "HEALTH_TIMEOUT" in first.stderr
    token = _task_environments(ecs)[0]["OFFLINE_ADMIN_TOKEN"]
    assert len(token) >= 40
    assert first.stderr.count(token) == 1 and "Admin token" in first.stderr and token not in first.stdout

    second = ecs("--confirm", "--json")
    assert second.exit_code == 1 and json.loads(second.stdout)["error"]["code"] == "HEALTH_TIMEOUT"
    assert [env["OFFLINE_ADMIN_TOKEN"] for env in _task_environments(ecs)] == [token, token]
    assert token not in second.stderr and token not in second.stdout and "Admin token" not in second.stderr
    assert "OFFLINE_ADMIN_TOKEN (already set on the platform)" not in second.stderr  # it is sent again
    assert secret_scan_text(ecs.project, token) == []


def secret_scan_text(root: Path, value: str) -> list[str]:
    return [str(path) for path in root.rglob("*") if path.is_file() and value.encode() in path.read_bytes()]


def test_first_ecs_deploy_without_network_settings_succeeds_with_the_create_command_as_next_step(
    ecs: Cli,
) -> None:
    run = ecs(*ECS_FIRST, "--json")
    assert run.exit_code == 0, run.stderr
    result = json.loads(run.stdout)
    command = result["next_step"]
    assert command.startswith(
        "aws ecs create-service --region eu-west-1 --cluster notes --service-name notes"
    )
    assert "--task-definition notes:1" in command and "<subnet-id>" in command
    assert (result["state"], result["healthy"], result["url"], result["sync_url"]) == (
        "NOT_FOUND",
        False,
        None,
        None,
    )
    assert result["deployment_id"] == "notes:1"
    # The command is the last thing said on stderr; nothing claims the app is deployed, and no URL is probed.
    assert "Next step:" in run.stderr and run.stderr.rstrip().endswith(command)
    assert "Deployed" not in run.stderr and "Traceback" not in run.stderr
    assert ecs.probes == []
    state = load_state(ecs.project)
    assert state is not None and (state.platform, state.url, state.sync_url) == (
        "cloud-a-orchestrated",
        None,
        None,
    )
    assert state.adapter["service_created"] is False and state.adapter["create_service_command"] == command
    assert state.deployment_ids == ["notes:1"]


def test_without_json_the_next_step_goes_to_stderr_and_stdout_has_no_url(ecs: Cli) -> None:
    run = ecs(*ECS_FIRST)
    assert run.exit_code == 0, run.stderr
    assert run.stdout == "url:  -\nsync: -\n"
    assert "aws ecs create-service" in run.stderr and "aws ecs create-service" not in run.stdout


def test_ecs_service_without_a_known_task_address_skips_the_probe(
    ecs: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.deploy.test_ecs import network

    monkeypatch.setenv(
        "MOTO_ECS_SERVICE_RUNNING", "1"
    )  # moto reports the rollout COMPLETED (and runs no task)
    subnet, group = network()
    run = ecs(*ECS_FIRST, "--subnets", subnet, "--security-groups", group, "--json")
    assert run.exit_code == 0, run.stderr
    result = json.loads(run.stdout)
    assert (result["state"], result["healthy"], result["next_step"]) == ("RUNNING", True, None)
    assert result["url"] is None and result["sync_url"] is None  # never "wss:///offline-sync"
    assert ecs.probes == []
    assert "skipping the direct GET /health" in run.stderr and "Deployed notes" in run.stderr
    state = load_state(ecs.project)
    assert state is not None and state.options == {"subnets": [subnet], "security_groups": [group]}
    assert state.adapter["service_created"] is True


# -- Fly.io --org and Railway --workspace -------------------------------------------------------------------------


def test_fly_org_creates_the_app_in_that_organization_and_is_remembered(
    deploy_cli: Cli, fake_cli: FakeCliEnv
) -> None:
    fake_cli.install("flyctl")
    fake_cli.set_world("fly", {"apps": {}})
    deploy_cli.env = fake_cli.env({"DATABASE_URL": "postgresql://u:pw-Fly-1@db.example.com/app"})
    run = deploy_cli(
        "--platform", "host-a", "--app", "notes", "--region", "ams", "--org", "acme", "--confirm"
    )
    assert run.exit_code == 0, run.stderr
    assert ["flyctl", "apps", "create", "notes", "--org", "acme", "--json"] in fake_cli.argvs("flyctl")
    assert fake_cli.world("fly")["apps"]["notes"]["org"] == "acme"
    state = load_state(deploy_cli.project)
    assert state is not None and state.options == {"org": "acme"} and state.adapter["org"] == "acme"
    assert deploy_cli.probes == ["https://notes.fly.dev/health"]
    assert run.stdout == "url:  https://notes.fly.dev\nsync: wss://notes.fly.dev/offline-sync\n"


def test_railway_workspace_creates_the_project_there_and_is_remembered(
    deploy_cli: Cli, fake_cli: FakeCliEnv
) -> None:
    fake_cli.install("railway")
    fake_cli.set_world("railway", {"workspaces": 2})
    deploy_cli.env = fake_cli.env({"RAILWAY_API_TOKEN": "token-for-tests"})
    run = deploy_cli("--platform", "host-b", "--app", "notes", "--workspace", "team", "--confirm")
    assert run.exit_code == 0, run.stderr
    assert ["railway", "init", "--name", "notes", "--workspace", "team"] in fake_cli.argvs("railway")
    state = load_state(deploy_cli.project)
    assert state is not None and state.options == {"workspace": "team"}
    fake_cli.clear_calls()
    again = deploy_cli("--confirm")  # a redeploy: the project exists, the saved workspace is kept
    assert again.exit_code == 0, again.stderr
    assert not any(argv[1] == "init" for argv in fake_cli.argvs("railway"))
    state = load_state(deploy_cli.project)
    assert state is not None and state.options == {"workspace": "team"}


# -- --reset on a real deployment: local files only, never the vendor CLI -----------------------------------------

#: --platform -> (fake CLI to install, its vendor world, a deployable starting world, title in the prompt)
DEPLOYED_TO: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "host-a": ("flyctl", "fly", {"apps": {}}, "Fly.io"),
    "host-b": ("railway", "railway", {}, "Railway"),
}


def _deployed(deploy_cli: Cli, fake_cli: FakeCliEnv, platform: str) -> dict[str, bytes]:
    """Deploy the project to ``platform`` over its fake CLI; return the files of .offline/deploy/ (the
    vendor's call log is cleared, so anything recorded afterwards was run later)."""
    cli_name, vendor, world, _ = DEPLOYED_TO[platform]
    fake_cli.install(cli_name)
    fake_cli.set_world(vendor, world)
    deploy_cli.env = fake_cli.env({"RAILWAY_API_TOKEN": "token-for-tests"} if platform == "host-b" else {})
    region = ["--region", "ams"] if platform == "host-a" else []
    run = deploy_cli("--platform", platform, "--app", "notes", *region, "--confirm")
    assert run.exit_code == 0, run.stderr
    assert fake_cli.calls(), "the deploy itself went through the fake CLI"
    fake_cli.clear_calls()
    return _files(deploy_cli.project / ".offline" / "deploy")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("platform", sorted(DEPLOYED_TO))
def test_reset_with_confirm_deletes_the_deploy_folder_and_runs_no_vendor_cli(
    deploy_cli: Cli, fake_cli: FakeCliEnv, platform: str
) -> None:
    files = _deployed(deploy_cli, fake_cli, platform)
    assert "deploy.json" in files and "Dockerfile" in files
    vendor_world = fake_cli.world(DEPLOYED_TO[platform][1])

    run = deploy_cli("--reset", "--confirm")

    assert run.exit_code == 0, run.stderr
    assert fake_cli.calls() == []  # not even `whoami`: a reset never reaches the platform
    assert fake_cli.world(DEPLOYED_TO[platform][1]) == vendor_world  # the app is left as it was
    assert not (deploy_cli.project / ".offline" / "deploy").exists()
    assert load_state(deploy_cli.project) is None
    assert "The app notes on " + DEPLOYED_TO[platform][3] in run.stderr and "left running" in run.stderr
    assert run.stdout == ""


@pytest.mark.parametrize("platform", sorted(DEPLOYED_TO))
def test_reset_on_a_terminal_asks_and_no_keeps_everything(
    deploy_cli: Cli, fake_cli: FakeCliEnv, platform: str
) -> None:
    files = _deployed(deploy_cli, fake_cli, platform)
    folder = deploy_cli.project / ".offline" / "deploy"
    title = DEPLOYED_TO[platform][3]

    declined = ScriptedPrompter([False])
    run = deploy_cli("--reset", prompter=declined)

    assert run.exit_code == 1 and "Aborted: nothing was deleted." in run.stderr
    assert declined.asked == [
        ("confirm", f"Delete {folder} (the deploy state of notes on {title} and generated files)?")
    ]
    assert _files(folder) == files  # every generated file and deploy.json, byte for byte
    state = load_state(deploy_cli.project)
    assert state is not None and (state.platform, state.app) == (platform, "notes")
    assert fake_cli.calls() == []

    accepted = ScriptedPrompter([True])
    run = deploy_cli("--reset", prompter=accepted)
    assert run.exit_code == 0, run.stderr
    assert len(accepted.asked) == 1 and not folder.exists()
    assert fake_cli.calls() == []


def test_reset_without_a_terminal_or_confirm_is_refused_and_keeps_everything(
    deploy_cli: Cli, fake_cli: FakeCliEnv
) -> None:
    files = _deployed(deploy_cli, fake_cli, "host-a")
    run = deploy_cli("--reset")
    assert run.exit_code == 1 and "--confirm is required" in run.stderr and "MISSING_OPTION" in run.stderr
    assert "hint: Pass it on the command line: offline deploy --reset --confirm" in run.stderr
    assert _files(deploy_cli.project / ".offline" / "deploy") == files
    assert fake_cli.calls() == []


# -- SPEC 7.3: the error and what to do next ------------------------------------------------------------------------

WORKING_PLATFORMS_HINT = (
    "hint: Choose one of: fly (Fly.io), railway (Railway), lightsail (AWS Lightsail containers), "
    "ecs (AWS ECS on Fargate), render (Render), self-hosted (Self-hosted container image)."
)


@pytest.mark.parametrize("platform", ["managed-hosting"])
def test_a_stub_platform_says_not_implemented_and_lists_the_working_ones(
    deploy_cli: Cli, platform: str
) -> None:
    title = platform_adapters.PLATFORMS[platform][1]
    run = deploy_cli("--platform", platform, "--app", "notes", "--confirm")
    assert run.exit_code == 1 and run.stdout == ""
    assert (
        f"error [NOT_IMPLEMENTED]: The platform '{platform}' ({title}) is not implemented yet." in run.stderr
    )
    hint = [line for line in run.stderr.splitlines() if line.startswith("hint:")]
    assert hint == [WORKING_PLATFORMS_HINT]  # the ones that work, no stub among them
    assert not (deploy_cli.project / ".offline").exists()

    # Chosen in the menu (where it is marked): the reason, and the menu again (here flyctl is missing).
    prompter = ScriptedPrompter([platform, "host-a", "notes", "iad"])
    run = deploy_cli(prompter=prompter)
    assert run.exit_code == 1 and "is not implemented yet. Pick another one." in run.stderr
    assert [kind for kind, _ in prompter.asked] == ["select", "select", "text", "select"]

    # The adapter refuses with the very same hint, so the list cannot drift from the platform table.
    working = [name for name in platform_adapters.PLATFORMS if name not in STUB_PLATFORMS]
    assert f"hint: Choose one of: {', '.join(working)}." != WORKING_PLATFORMS_HINT
    assert all(f"({platform_adapters.vendor_name(code)})" in WORKING_PLATFORMS_HINT for code in working)
    with pytest.raises(DeployError) as caught:
        load_adapter(platform).check_prerequisites(None)  # type: ignore[arg-type]
    assert caught.value.code == "NOT_IMPLEMENTED" and f"hint: {caught.value.hint}" == WORKING_PLATFORMS_HINT


def test_an_arm_image_is_wrong_architecture_with_how_to_build_for_amd64(ecs: Cli) -> None:
    from ._aws_support import FakeEngine

    engine = FakeEngine(platform="linux/arm64")
    ecs.overrides["engine_factory"] = lambda env: engine
    run = ecs(*ECS_FIRST)
    assert run.exit_code == 1 and run.stdout == ""
    assert (
        "error [WRONG_ARCHITECTURE]: image does not provide linux/amd64 platform: offline-notes:latest was "
        "built for linux/arm64." in run.stderr
    )
    (hint,) = [line for line in run.stderr.splitlines() if line.startswith("hint:")]
    assert hint.startswith("hint: AWS runs x86_64 containers. Enable multi-platform builds")
    assert "qemu-user-static" in hint and hint.endswith("then deploy again.")
    assert [call[0] for call in engine.calls] == ["ping", "build", "image_platform"]  # nothing pushed
    assert ecs.overrides["client_factory"].params("ecs", "register_task_definition") == []


# -- secrets in what the user sees ---------------------------------------------------------------------------------

DB_PASSWORD = "Pg-s3cret-Pa55"
DB_URL = f"postgresql://notes:{DB_PASSWORD}@db.example.com:5432/notes"
AUTH = "QXV0aFNlY3JldC1mb3ItbWFza2luZy10ZXN0cy0zMg=="


def test_a_vendor_error_that_echoes_secrets_is_shown_masked(deploy_cli: Cli, fake_cli: FakeCliEnv) -> None:
    fake_cli.install("flyctl")
    echoed = (
        f"Error: release command failed: connecting to {DB_URL}\n"
        f'FATAL: password authentication failed for user "notes" (password "{DB_PASSWORD}")\n'
        f"AUTH_SECRET {AUTH} is not valid base64url"
    )
    fake_cli.set_world("fly", {"apps": {}, "deploy_error": echoed})
    deploy_cli.env = fake_cli.env({"DATABASE_URL": DB_URL, "AUTH_SECRET": AUTH})

    run = deploy_cli("--platform", "host-a", "--app", "notes", "--region", "ams", "--confirm")

    assert run.exit_code == 1
    assert "error [PLATFORM_ERROR]: `flyctl deploy` failed:" in run.stderr
    for raw in (DB_URL, DB_PASSWORD, AUTH):
        assert raw not in run.stderr and raw not in run.stdout
    # Masked in place: the rest of what flyctl said is still there to act on.
    assert "connecting to ***" in run.stderr
    assert 'password authentication failed for user "notes" (password "***")' in run.stderr
    assert "AUTH_SECRET *** is not valid base64url" in run.stderr
    assert "hint:" in run.stderr


# -- the admin token and the names a person types, over the fake vendor CLIs ----------------------------------------

#: alias -> (neutral code, fake CLI, vendor world, the world's record of what was set)
ALIASED: dict[str, tuple[str, str, str]] = {
    "fly": ("host-a", "flyctl", "fly"),
    "railway": ("host-b", "railway", "railway"),
}


def _token_on_platform(fake_cli: FakeCliEnv, vendor: str) -> bool:
    world = fake_cli.world(vendor)
    if vendor == "fly":
        return "OFFLINE_ADMIN_TOKEN" in world.get("secrets", {}).get("notes", {})
    return any("OFFLINE_ADMIN_TOKEN" in names for names in world.get("variables", {}).values())


@pytest.mark.parametrize("alias", sorted(ALIASED))
def test_the_first_deploy_sets_an_admin_token_shown_once_and_later_deploys_keep_it(
    deploy_cli: Cli, fake_cli: FakeCliEnv, alias: str
) -> None:
    code, cli_name, vendor = ALIASED[alias]
    fake_cli.install(cli_name)
    fake_cli.set_world(vendor, {"apps": {}} if vendor == "fly" else {})
    deploy_cli.env = fake_cli.env({"RAILWAY_API_TOKEN": "token-for-tests"} if vendor == "railway" else {})

    first = deploy_cli("--platform", alias, "--app", "notes", "--confirm", "--json")
    assert first.exit_code == 0, first.stderr
    assert _token_on_platform(fake_cli, vendor)
    after = first.stderr.split("Admin token", 1)[1].splitlines()
    token = after[1].strip()
    assert len(token) >= 40 and " " not in token
    assert first.stderr.count(token) == 1 and token not in first.stdout
    title = DEPLOYED_TO[code][3]
    assert f"Deployed notes to {title}." in first.stderr and json.loads(first.stdout)["vendor"] == title
    state = load_state(deploy_cli.project)
    assert state is not None and state.platform == code  # deploy.json keeps the neutral code
    # The value went to the platform on stdin only: in no argv, generated file or deploy.json.
    assert token not in fake_cli.recorded_text()
    assert secret_scan_text(deploy_cli.project, token) == []

    fake_cli.clear_calls()
    on_platform_only = "postgresql://u:only-on-the-platform-pw@db/x"
    if vendor == "railway":  # a value the platform holds and the shell does not: listed, never logged
        fake_cli.update_world(
            "railway",
            lambda w: [v.update(DATABASE_URL={"value": on_platform_only}) for v in w["variables"].values()],
        )
    second = deploy_cli("--confirm")
    assert second.exit_code == 0, second.stderr
    assert secret_scan_text(deploy_cli.project, on_platform_only) == []
    assert secret_scan_text(deploy_cli.project, "only-on-the-platform-pw") == []
    assert (
        "Admin token" not in second.stderr
        and "OFFLINE_ADMIN_TOKEN (already set on the platform)" in second.stderr
    )
    assert not any("OFFLINE_ADMIN_TOKEN" in (fake_cli.stdin_of(call) or "") for call in fake_cli.calls())

    status = deploy_cli("status")
    assert status.exit_code == 0 and "admin:      protected" in status.stdout


def test_an_admin_token_from_the_shell_is_used_and_never_printed(
    deploy_cli: Cli, fake_cli: FakeCliEnv
) -> None:
    fake_cli.install("flyctl")
    fake_cli.set_world("fly", {"apps": {}})
    mine = "my-own-admin-token-0123456789abcdef"
    deploy_cli.env = fake_cli.env({"OFFLINE_ADMIN_TOKEN": mine})
    run = deploy_cli("--platform", "fly", "--app", "notes", "--confirm")
    assert run.exit_code == 0, run.stderr
    assert "Admin token" not in run.stderr and mine not in run.stderr + run.stdout
    assert fake_cli.world("fly")["secrets"]["notes"]["OFFLINE_ADMIN_TOKEN"] == len(mine)


def test_lightsail_without_database_url_is_refused_before_any_aws_call(deploy_cli: Cli) -> None:
    deploy_cli.env = {"PATH": "", "AWS_REGION": "eu-west-1"}
    run = deploy_cli("--platform", "lightsail", "--app", "notes", "--confirm")
    assert run.exit_code == 1 and "EPHEMERAL_DATA" in run.stderr
    assert "DATABASE_URL" in run.stderr and "--ephemeral-data" in run.stderr
    assert not (deploy_cli.project / ".offline").exists()


def test_every_platform_keeps_sqlite_data_or_refuses_without_database_url() -> None:
    persistent = {code: load_adapter(code).persistent_storage for code in platform_adapters.implemented()}
    assert persistent == {
        "host-a": True,  # a Fly volume
        "host-b": True,  # a Railway volume
        "cloud-a-containers": False,  # refused without DATABASE_URL unless --ephemeral-data
        "cloud-a-orchestrated": False,
        "web-service-host": True,  # a Render disk
        "self-hosted-image": True,  # a named volume on the machine
    }


def test_a_failed_remote_build_ends_with_the_vendor_lines_and_the_log_path(
    deploy_cli: Cli, fake_cli: FakeCliEnv
) -> None:
    fake_cli.install("flyctl")
    fake_cli.set_world("fly", {"apps": {}, "deploy_error": "Error: failed to build: exit code 1"})
    deploy_cli.env = fake_cli.env()
    run = deploy_cli("--platform", "fly", "--app", "notes", "--confirm", "--json")
    assert run.exit_code == 1
    error = json.loads(run.stdout)["error"]
    assert error["code"] == "PLATFORM_ERROR" and "failed to build" in error["message"]
    assert "Last lines of the vendor output:" in run.stderr
    assert "==> Building image with Depot" in run.stderr  # what flyctl printed before it failed
    logs = sorted((deploy_cli.project / ".offline" / "deploy" / "logs").glob("*.log"))
    assert len(logs) == 1 and f"Full output of this run: {logs[0]}" in run.stderr.replace("\n", "")
    log = logs[0].read_text()
    assert "--> build step 1/3 done" in log and "failed to build" in log
    assert "see the build and rollout output above" not in run.stderr.lower()
