"""`offline deploy` through the command line with the real adapters behind it: ECS against moto (a first deploy
that can only register the task definition, a service whose task has no known address), Fly.io and Railway
against their fake CLIs (``--org``, ``--workspace``). Only the shiv bundle and the final health probe are
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

from offline_cli.commands import deploy as deploy_command
from offline_cli.deploy.flow import Services
from offline_cli.deploy.prompts import ScriptedPrompter
from offline_cli.deploy.state import load_state
from offline_cli.environment import Environment
from offline_cli.main import cli
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

    def __call__(self, *args: str) -> Run:
        out, err = io.StringIO(), io.StringIO()
        environment = Environment(
            stdin=io.StringIO(),
            stdout=out,
            stderr=err,
            env=self.env,
            stdin_isatty=False,
            stdout_isatty=False,
            prompter=ScriptedPrompter(),
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
        services = replace(real_build(environment), bundler=FakeBundler(), health_probe=probe)
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
