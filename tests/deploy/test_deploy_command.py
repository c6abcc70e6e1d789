"""`offline deploy` end to end over a recording fake platform: the order of adapter calls, prompts, state,
messages and exit codes (SPEC 3.3, 4.6, 7.3; DESIGN.md section 6)."""

from __future__ import annotations

import http.server
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import platform_adapters
from offline_cli.commands import deploy as deploy_command
from offline_cli.deploy import flow
from offline_cli.deploy.flow import Services, probe_health
from offline_cli.deploy.prompts import ScriptedPrompter
from offline_cli.deploy.state import DEPLOY_DIR, load_state, state_path
from offline_cli.environment import Environment, Prompter
from offline_cli.main import cli
from platform_adapters.base import Deployment

from ._core_fakes import (
    FakeBundler,
    FakePlatform,
    install_fake_npm,
    register_fake,
    secret_scan,
    write_project,
)
from .conftest import SERVER_SETTINGS

FIRST_DEPLOY = [
    "check_prerequisites",
    "provision",
    "public_url",
    "render_config",
    "deploy",
    "wait_until_healthy",
]
SECRETS = {
    "AUTH_SECRET": "c2VjcmV0LWF1dGgtdmFsdWUtZm9yLXRlc3Rz",
    "DATABASE_URL": "postgresql://app:very-secret-pw@db.internal/app",
    "OFFLINE_SMTP_URL": "smtps://mailer:smtp-pa55word-9@smtp.example:465",
}


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str


@dataclass
class Harness:
    remote: FakePlatform
    bundler: FakeBundler
    probes: list[str]
    project: Path
    env: dict[str, str]
    probe_answer: str | None = None
    probe_hook: Callable[[], str | None] | None = None  # replaces probe_answer (may raise or block)

    def run(self, *args: str, interactive: bool = False, prompter: Prompter | None = None) -> Outcome:
        out, err = io.StringIO(), io.StringIO()
        environment = Environment(
            stdin=io.StringIO(),
            stdout=out,
            stderr=err,
            env=self.env,
            stdin_isatty=interactive,
            stdout_isatty=False,
            prompter=prompter or ScriptedPrompter(),
        )
        result = CliRunner().invoke(cli, ["deploy", *args], obj=environment, catch_exceptions=False)
        return Outcome(result.exit_code, out.getvalue(), err.getvalue())

    def deploy(self, *args: str, **kwargs: Any) -> Outcome:
        return self.run(*args, "--project-dir", str(self.project), **kwargs)

    def first_deploy(self) -> Outcome:
        outcome = self.deploy("--platform", "fake-host", "--app", "notes", "--region", "iad", "--confirm")
        assert outcome.exit_code == 0, outcome.stderr
        return outcome

    @property
    def deploy_dir(self) -> Path:
        return self.project / ".offline" / "deploy"


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    remote = FakePlatform()
    register_fake(monkeypatch, remote)
    bundler = FakeBundler()
    probes: list[str] = []
    project = write_project(tmp_path / "notes", client="dist")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path / "home"), **SECRETS}
    h = Harness(remote, bundler, probes, project, env)
    real_build = deploy_command.build_services

    def probe(url: str, seconds: float) -> str | None:
        probes.append(url)
        return h.probe_hook() if h.probe_hook is not None else h.probe_answer

    def build(environment: Environment) -> Services:
        return replace(real_build(environment), bundler=bundler, health_probe=probe)

    monkeypatch.setattr(deploy_command, "build_services", build)
    yield h


# -- deploy ---------------------------------------------------------------------------------------------------


def test_first_deploy_runs_every_step_in_order_and_prints_url_and_sync(harness: Harness) -> None:
    outcome = harness.first_deploy()
    assert harness.remote.calls == FIRST_DEPLOY
    assert outcome.stdout == "url:  https://notes.fake.test\nsync: wss://notes.fake.test/offline-sync\n"
    ctx = harness.remote.contexts[0]
    assert (ctx.app, ctx.region, ctx.port) == ("notes", "iad", 3001)
    # What the platform got to ship when deploy() ran (the run's log sits beside it; .dockerignore keeps
    # the image to the files it lists).
    seen = harness.remote.seen_files[0]
    logs = [name for name in seen if name.startswith("logs/")]
    assert len(logs) == 1 and logs[0].endswith(".log")
    assert "*" in (harness.deploy_dir / ".dockerignore").read_text().splitlines()
    assert [name for name in seen if name not in logs] == [
        ".dockerignore",
        "Dockerfile",
        "client/index.html",
        "deploy.json",
        "fake.toml",
        "server.pyz",
    ]
    assert "ENV OFFLINE_STATIC_DIR=/app/client" in (harness.deploy_dir / "Dockerfile").read_text()
    assert harness.bundler.calls[0]["entry"] == harness.project / "server.py"
    assert harness.bundler.calls[0]["python_version"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert harness.probes == ["https://notes.fake.test/health"]
    assert ".offline/" in (harness.project / ".gitignore").read_text().splitlines()
    data = json.loads(state_path(harness.project).read_text())
    assert data["schema_version"] == 1
    assert (data["platform"], data["app"], data["region"]) == ("fake-host", "notes", "iad")
    assert (
        data["url"] == "https://notes.fake.test" and data["sync_url"] == "wss://notes.fake.test/offline-sync"
    )
    assert [d["id"] for d in data["deployments"]] == ["d1"]
    assert data["adapter"] == {
        "app_id": "id-notes",
        "created": True,
        "last_image": "img:d1",
        "url": "https://notes.fake.test",  # the address the health wait settled on
    }
    # Progress went to stderr, one numbered step at a time.
    assert "[1] Checking Fake host prerequisites" in outcome.stderr
    assert "Deploying to Fake host" in outcome.stderr


def test_redeploy_reuses_platform_app_region_and_adapter_state_asking_only_to_go_ahead(
    harness: Harness,
) -> None:
    harness.first_deploy()
    # Interactive terminal, no flags: only the plan's question is asked (any other would fail).
    prompter = ScriptedPrompter([True])
    outcome = harness.deploy(interactive=True, prompter=prompter)
    assert outcome.exit_code == 0, outcome.stderr
    assert prompter.asked == [("confirm", "Go ahead?")]
    assert harness.remote.calls == FIRST_DEPLOY * 2
    second = harness.remote.contexts[len(FIRST_DEPLOY)]
    assert (second.app, second.region) == ("notes", "iad")
    seen = harness.remote.states[len(FIRST_DEPLOY)]  # what the second check_prerequisites was given
    assert seen == {
        "app_id": "id-notes",
        "created": True,
        "last_image": "img:d1",
        "url": "https://notes.fake.test",  # the address the health wait settled on
    }
    state = load_state(harness.project)
    assert state is not None and state.deployment_ids == ["d1", "d2"]
    assert "Redeploying" in outcome.stderr


def test_json_output_is_one_object_on_stdout(harness: Harness) -> None:
    outcome = harness.deploy("--platform", "fake-host", "--app", "notes", "--confirm", "--json")
    assert outcome.exit_code == 0, outcome.stderr
    data = json.loads(outcome.stdout)
    assert (
        data["url"] == "https://notes.fake.test" and data["sync_url"] == "wss://notes.fake.test/offline-sync"
    )
    assert data["region"] == "fra"  # the platform's own default, said on stderr
    assert data["deployment_id"] == "d1" and data["healthy"] is True and data["client_deployed"] is True
    assert "region fra" in outcome.stderr


def test_interactive_first_deploy_asks_only_for_what_is_missing(harness: Harness) -> None:
    prompter = ScriptedPrompter(["fake-host", "my-notes", "syd", True])
    outcome = harness.deploy(interactive=True, prompter=prompter)
    assert outcome.exit_code == 0, outcome.stderr
    assert [kind for kind, _ in prompter.asked] == ["select", "text", "select", "confirm"]
    state = load_state(harness.project)
    assert state is not None and (state.platform, state.app, state.region) == ("fake-host", "my-notes", "syd")
    # A flag that was given is not asked again.
    other = write_project(harness.project.parent / "second")
    prompter = ScriptedPrompter(["second-app", True])
    harness.run(
        "--platform",
        "fake-host",
        "--region",
        "iad",
        "--project-dir",
        str(other),
        interactive=True,
        prompter=prompter,
    )
    assert prompter.asked == [("text", "App name"), ("confirm", "Go ahead?")]


def test_stub_platform_is_refused_first(harness: Harness) -> None:
    outcome = harness.deploy("--platform", "managed-hosting", "--confirm")  # --app missing too
    assert outcome.exit_code == 1
    assert "not implemented yet" in outcome.stderr and "NOT_IMPLEMENTED" in outcome.stderr
    assert "--app" not in outcome.stderr.split("hint:")[0]
    assert outcome.stdout == ""
    assert not harness.deploy_dir.exists()


def test_stub_platform_chosen_in_the_prompt_is_asked_again_with_the_reason(harness: Harness) -> None:
    prompter = ScriptedPrompter(["managed-hosting", "fake-host", "notes", "fra", True])
    outcome = harness.deploy(interactive=True, prompter=prompter)
    assert outcome.exit_code == 0, outcome.stderr
    assert [kind for kind, _ in prompter.asked] == ["select", "select", "text", "select", "confirm"]
    assert "'managed-hosting' (Managed hosting) is not implemented yet" in outcome.stderr


def test_an_invalid_app_name_at_the_prompt_is_asked_again_with_the_reason(harness: Harness) -> None:
    prompter = ScriptedPrompter(["fake-host", "My Notes!", "my-notes", "fra", True])
    outcome = harness.deploy(interactive=True, prompter=prompter)
    assert outcome.exit_code == 0, outcome.stderr
    assert [message for kind, message in prompter.asked if kind == "text"] == ["App name", "App name"]
    assert "'My Notes!' is not a valid app name" in outcome.stderr and "Try again" in outcome.stderr
    state = load_state(harness.project)
    assert state is not None and state.app == "my-notes"


def test_the_plan_is_shown_and_declining_it_creates_nothing(harness: Harness) -> None:
    prompter = ScriptedPrompter(["fake-host", "notes", "fra", False])
    outcome = harness.deploy(interactive=True, prompter=prompter)
    assert outcome.exit_code == 1
    assert "Aborted: nothing was created or changed." in outcome.stderr
    plan = outcome.stderr.split("Go ahead")[0] if "Go ahead" in outcome.stderr else outcome.stderr
    for part in ("platform:  Fake host", "app:       notes", "region:    fra", "creates:", "storage:"):
        assert part in plan, part
    assert "OFFLINE_ADMIN_TOKEN (new, generated; shown once at the end)" in plan
    assert "secrets:   DATABASE_URL, AUTH_SECRET, OFFLINE_ADMIN_TOKEN" in plan  # names, never values
    assert harness.remote.calls == ["check_prerequisites"]  # nothing created on the platform
    assert harness.bundler.calls == [] and load_state(harness.project) is None


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--platform", "fake-host", "--confirm"], "--app"),
        (["--app", "notes", "--confirm"], "--platform"),
        (["--platform", "fake-host"], "--app"),  # no terminal: the same as --confirm
    ],
)
def test_missing_values_without_prompting_name_the_flag(harness: Harness, args: list[str], flag: str) -> None:
    outcome = harness.deploy(*args)
    assert outcome.exit_code == 1
    assert f"{flag} is required" in outcome.stderr and "MISSING_OPTION" in outcome.stderr
    assert harness.remote.calls == []  # checked before the vendor CLI


def test_confirm_never_prompts_even_on_a_terminal(harness: Harness) -> None:
    outcome = harness.deploy(
        "--platform", "fake-host", "--confirm", interactive=True, prompter=ScriptedPrompter()
    )
    assert outcome.exit_code == 1 and "--app is required" in outcome.stderr


def test_prerequisites_are_checked_before_the_server_entry(harness: Harness) -> None:
    (harness.project / "server.py").unlink()
    harness.remote.logged_in = False
    outcome = harness.deploy("--platform", "fake-host", "--app", "notes", "--confirm")
    assert (
        outcome.exit_code == 1
        and "NOT_AUTHENTICATED" in outcome.stderr
        and "fakectl auth login" in outcome.stderr
    )
    harness.remote.logged_in = True
    outcome = harness.deploy("--platform", "fake-host", "--app", "notes", "--confirm")
    assert outcome.exit_code == 1
    assert "could not find a server entry file" in outcome.stderr and "ENTRY_NOT_FOUND" in outcome.stderr
    assert "hint:" in outcome.stderr and "server.py" in outcome.stderr
    assert harness.remote.calls == ["check_prerequisites", "check_prerequisites"]
    assert not harness.deploy_dir.exists() and outcome.stdout == ""


def test_client_is_built_with_the_deployed_sync_url(harness: Harness, tmp_path: Path) -> None:
    project = write_project(tmp_path / "spa", client="npm")
    install_fake_npm(tmp_path / "bin")
    harness.env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{harness.env['PATH']}"
    harness.env["FAKE_NPM_LOG"] = str(tmp_path / "npm.log")
    outcome = harness.run(
        "--platform", "fake-host", "--app", "spa", "--confirm", "--project-dir", str(project)
    )
    assert outcome.exit_code == 0, outcome.stderr
    assert (tmp_path / "npm.log").read_text().splitlines() == [
        "run build",
        "BUILD_SYNC_URL=wss://spa.fake.test/offline-sync",
    ]
    built = project / ".offline" / "deploy" / "client" / "index.html"
    assert "wss://spa.fake.test/offline-sync" in built.read_text()


def test_project_without_client_deploys_only_the_server_with_a_warning(
    harness: Harness, tmp_path: Path
) -> None:
    project = write_project(tmp_path / "api")
    outcome = harness.run(
        "--platform", "fake-host", "--app", "api", "--confirm", "--project-dir", str(project)
    )
    assert outcome.exit_code == 0, outcome.stderr
    assert "only the server is deployed" in outcome.stderr
    assert "OFFLINE_STATIC_DIR" not in (project / ".offline" / "deploy" / "Dockerfile").read_text()


def test_aws_region_comes_from_the_aws_configuration(harness: Harness) -> None:
    harness.env["AWS_REGION"] = "eu-west-3"
    outcome = harness.deploy("--platform", "cloud-a-containers", "--app", "notes", "--confirm")
    assert outcome.exit_code == 0, outcome.stderr
    assert harness.remote.contexts[0].region == "eu-west-3"
    assert "region eu-west-3 from the AWS configuration" in outcome.stderr


def test_aws_region_from_the_config_file_profile(harness: Harness) -> None:
    config = Path(harness.env["HOME"]) / ".aws" / "config"
    config.parent.mkdir(parents=True)
    config.write_text("[default]\nregion = us-east-2\n\n[profile work]\nregion = ap-southeast-2\n")
    harness.env["AWS_PROFILE"] = "work"
    outcome = harness.deploy("--platform", "cloud-a-containers", "--app", "notes", "--confirm")
    assert outcome.exit_code == 0, outcome.stderr
    assert harness.remote.contexts[0].region == "ap-southeast-2"


def test_aws_without_a_region_asks_for_region_never_another_platforms_default(harness: Harness) -> None:
    outcome = harness.deploy("--platform", "cloud-a-containers", "--app", "notes", "--confirm")
    assert outcome.exit_code == 1 and "--region is required" in outcome.stderr
    assert "fra" not in outcome.stderr and harness.remote.calls == []


def test_ecs_network_options_are_passed_and_remembered(harness: Harness) -> None:
    outcome = harness.deploy(
        "--platform", "cloud-a-orchestrated", "--app", "notes", "--region", "us-east-1",
        "--subnets", "subnet-aa, subnet-bb", "--security-groups", "sg-11", "--confirm",
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    expected = {"subnets": ["subnet-aa", "subnet-bb"], "security_groups": ["sg-11"]}
    assert harness.remote.contexts[0].options == expected
    harness.deploy("--confirm")
    assert harness.remote.contexts[-1].options == expected
    state = load_state(harness.project)
    assert state is not None and state.options == expected


@pytest.mark.parametrize(
    ("platform", "flag", "key"), [("host-a", "--org", "org"), ("host-b", "--workspace", "workspace")]
)
def test_org_and_workspace_are_passed_to_the_adapter_and_remembered(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, platform: str, flag: str, key: str
) -> None:
    from ._core_fakes import FakeAdapter

    loader = platform_adapters.load_adapter
    monkeypatch.setattr(
        platform_adapters,
        "load_adapter",
        lambda name: FakeAdapter(harness.remote) if name == platform else loader(name),
    )
    outcome = harness.deploy(
        "--platform", platform, "--app", "notes", "--region", "iad", flag, " acme ", "--confirm"
    )
    assert outcome.exit_code == 0, outcome.stderr
    assert harness.remote.contexts[0].options == {key: "acme"}
    assert "applies only" not in outcome.stderr
    assert harness.deploy("--confirm").exit_code == 0
    assert harness.remote.contexts[-1].options == {key: "acme"}
    state = load_state(harness.project)
    assert state is not None and state.options == {key: "acme"}


def test_org_for_another_platform_warns_and_an_empty_one_is_a_usage_error(harness: Harness) -> None:
    outcome = harness.deploy("--platform", "fake-host", "--app", "notes", "--org", "acme", "--confirm")
    assert outcome.exit_code == 0 and "--org applies only to Fly.io; ignored for Fake host" in outcome.stderr
    harness.remote.calls.clear()
    empty = harness.deploy("--workspace", " ", "--confirm")
    assert empty.exit_code == 2 and harness.remote.calls == []


def test_bad_subnet_list_is_a_usage_error(harness: Harness) -> None:
    outcome = harness.deploy(
        "--platform", "cloud-a-orchestrated", "--app", "n", "--subnets", "vpc-1", "--confirm"
    )
    assert outcome.exit_code == 2 and harness.remote.calls == []


def test_another_platform_or_app_than_the_saved_one_is_refused(harness: Harness) -> None:
    harness.first_deploy()
    for args in (["--platform", "cloud-a-containers"], ["--app", "other"]):
        outcome = harness.deploy(*args, "--confirm")
        assert outcome.exit_code == 1 and "STATE_CONFLICT" in outcome.stderr and "--reset" in outcome.stderr


def test_secrets_reach_no_file_no_output(harness: Harness) -> None:
    harness.remote.leak_secrets = True  # even an adapter that returns them as state
    outcome = harness.first_deploy()
    leaks = secret_scan(harness.project, list(SECRETS.values()))
    assert leaks == []
    for value in SECRETS.values():
        assert value not in outcome.stdout and value not in outcome.stderr
    assert "was not saved to deploy.json" in outcome.stderr


def test_secrets_in_progress_messages_are_masked_on_stderr(harness: Harness) -> None:
    password = "very-secret-pw"  # the password inside SECRETS["DATABASE_URL"]
    assert f":{password}@" in SECRETS["DATABASE_URL"]
    harness.remote.progress = [
        ("step", f"Building with AUTH_SECRET={SECRETS['AUTH_SECRET']}"),
        ("info", f"build log: connecting to {SECRETS['DATABASE_URL']}"),
        ("warn", f"the database refused password {password}"),
    ]
    outcome = harness.first_deploy()
    for raw in (*SECRETS.values(), password):
        assert raw not in outcome.stderr and raw not in outcome.stdout
    assert "] Building with AUTH_SECRET=***\n" in outcome.stderr
    assert "    build log: connecting to ***\n" in outcome.stderr
    assert "warning: the database refused password ***\n" in outcome.stderr


def test_the_progress_reporter_masks_every_kind_of_message_and_keeps_markup_literal() -> None:
    from rich.console import Console

    from offline_cli.deploy.progress import ProgressReporter
    from offline_cli.deploy.reporter import redact

    out = io.StringIO()
    secret = "[bold]s3cret-value[/bold]"  # rich markup inside a secret must neither render nor leak
    reporter = ProgressReporter(Console(file=out, soft_wrap=True, color_system=None), [secret, "abc"])
    reporter.step(f"step {secret}")
    reporter.info(f"info {secret} [red]literal[/red]")
    reporter.warn(f"warn {secret}")
    reporter.success(f"done {secret} abc")  # values under 4 characters are not masked
    assert out.getvalue().splitlines() == [
        "[1] step ***",
        "    info *** [red]literal[/red]",
        "warning: warn ***",
        "✓ done *** abc",
    ]
    # The longest value first: a URL is masked whole, not around its password.
    url = "postgresql://u:pw-1234@h/db"
    assert redact(f"{url} / pw-1234", ["pw-1234", url]) == "*** / ***"


def test_a_database_url_password_is_masked_on_its_own_raw_and_decoded() -> None:
    from offline_cli.deploy.reporter import NullReporter
    from platform_adapters.base import SubprocessRunner, masked_values

    env = {
        "DATABASE_URL": "postgresql://app:p%40ss-w0rd%2F1@db.internal/app",
        "AUTH_SECRET": "auth-secret-value",
        "PUBLIC_URL": "",  # unset values are not secrets
        "HOME": "/root",  # nor are variables that are not forwarded
    }
    assert masked_values(env) == (
        "postgresql://app:p%40ss-w0rd%2F1@db.internal/app",
        "p%40ss-w0rd%2F1",
        "p@ss-w0rd/1",
        "auth-secret-value",
    )
    assert masked_values({"DATABASE_URL": "sqlite:///data.db", "AUTH_SECRET": "x" * 8}) == (
        "sqlite:///data.db",
        "x" * 8,
    )
    # The state file is scrubbed of whole values only: a weak password must not drop an app name.
    services = Services(
        env=env,
        interactive=False,
        reporter=NullReporter(),
        runner=SubprocessRunner(env),
        prompter=ScriptedPrompter,
    )
    assert services.secrets == ("postgresql://app:p%40ss-w0rd%2F1@db.internal/app", "auth-secret-value")


def test_the_servers_auth_and_email_settings_are_forwarded_and_only_secrets_masked() -> None:
    """Every setting the server reads for auth and email goes to the platform through the one channel every
    adapter uses for SECRET_VARIABLES (never a generated file); the SMTP URL and OAuth providers carry
    credentials and are masked, a plain switch like OFFLINE_AUTH_REQUIRE_VERIFIED_EMAIL=true is not (it would
    turn every 'true' in the output into ***)."""
    from platform_adapters.base import forwarded_environment, masked_values

    settings = SERVER_SETTINGS
    assert forwarded_environment({**settings, "HOME": "/root"}) == settings
    masked = masked_values(settings)
    for secret in (
        "p%40ss-smtp",
        "p@ss-smtp",
        settings["OFFLINE_SMTP_URL"],
        settings["OFFLINE_OAUTH_PROVIDERS"],
    ):
        assert secret in masked
    assert "true" not in masked


def test_a_failing_health_probe_only_warns(harness: Harness) -> None:
    harness.probe_answer = "HTTP 502"
    outcome = harness.first_deploy()
    assert "did not answer within 10 s (HTTP 502)" in outcome.stderr
    assert outcome.stdout.startswith("url:  https://notes.fake.test")


def test_a_health_probe_that_raises_only_warns(harness: Harness) -> None:
    def broken() -> str | None:
        raise ValueError("unknown url type")

    harness.probe_hook = broken
    outcome = harness.first_deploy()
    assert "did not answer within 10 s (ValueError: unknown url type)" in outcome.stderr
    assert load_state(harness.project) is not None


def test_a_health_probe_that_hangs_is_abandoned_after_its_time(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flow, "HEALTH_PROBE_SECONDS", 0.2)
    release = threading.Event()

    def hanging() -> str | None:  # a resolver that never answers
        release.wait(30)
        return None

    harness.probe_hook = hanging
    try:
        outcome = harness.first_deploy()
    finally:
        release.set()
    assert "did not answer within 0.2 s (no answer)" in outcome.stderr
    assert outcome.stdout.startswith("url:  https://notes.fake.test")


def test_no_url_from_the_platform_skips_the_probe_and_prints_none(harness: Harness) -> None:
    harness.remote.outcome_url = ""
    harness.remote.healthy_url = ""
    outcome = harness.first_deploy()
    assert harness.probes == []
    assert "skipping the direct GET /health" in outcome.stderr
    assert outcome.stdout == "url:  -\nsync: -\n"
    data = json.loads(state_path(harness.project).read_text())
    assert data["url"] is None and data["sync_url"] is None
    as_json = json.loads(harness.deploy("--confirm", "--json").stdout)
    assert as_json["url"] is None and as_json["sync_url"] is None and as_json["next_step"] is None


def test_the_url_the_health_wait_found_is_used_and_http_gives_a_ws_sync_url(harness: Harness) -> None:
    harness.remote.outcome_url = ""  # like ECS: the task's address is known only once it runs
    harness.remote.healthy_url = "http://203.0.113.7:3001"
    outcome = harness.first_deploy()
    assert outcome.stdout == "url:  http://203.0.113.7:3001\nsync: ws://203.0.113.7:3001/offline-sync\n"
    assert harness.probes == ["http://203.0.113.7:3001/health"]
    data = json.loads(state_path(harness.project).read_text())
    assert (data["url"], data["sync_url"]) == (
        "http://203.0.113.7:3001",
        "ws://203.0.113.7:3001/offline-sync",
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://notes.fly.dev", "wss://notes.fly.dev/offline-sync"),
        ("https://notes.fly.dev/", "wss://notes.fly.dev/offline-sync"),
        ("http://203.0.113.7:3001", "ws://203.0.113.7:3001/offline-sync"),
        ("HTTP://10.0.0.1:8080/x", "ws://10.0.0.1:8080/offline-sync"),
        ("notes.example.com", "wss://notes.example.com/offline-sync"),
        ("", None),
        (None, None),
    ],
)
def test_sync_url_follows_the_scheme(url: str | None, expected: str | None) -> None:
    from platform_adapters.base import DeployOutcome, sync_url_for

    assert sync_url_for(url) == expected
    if url is not None:
        assert DeployOutcome(url, "d1").sync_url == (expected or "")


# -- status, logs -----------------------------------------------------------------------------------------------


def test_status_reports_health_url_and_sync_endpoint(harness: Harness) -> None:
    harness.first_deploy()
    harness.remote.calls.clear()
    outcome = harness.deploy("status")
    assert outcome.exit_code == 0, outcome.stderr
    assert harness.remote.calls == ["check_prerequisites", "status"]
    assert "state:      RUNNING (healthy)" in outcome.stdout
    assert "url:        https://notes.fake.test" in outcome.stdout
    assert "sync:       wss://notes.fake.test/offline-sync" in outcome.stdout
    data = json.loads(harness.deploy("status", "--json").stdout)
    assert data["state"] == "RUNNING" and data["sync_url"] == "wss://notes.fake.test/offline-sync"


@pytest.mark.parametrize("state", ["DEPLOYING", "FAILED"])
def test_status_exits_zero_whenever_the_platform_answered(harness: Harness, state: str) -> None:
    harness.first_deploy()
    harness.remote.status_state = state
    outcome = harness.deploy("status")
    assert outcome.exit_code == 0
    assert f"state:      {state}" in outcome.stdout


def test_group_options_before_the_subcommand_apply(harness: Harness) -> None:
    harness.first_deploy()
    outcome = harness.run("--project-dir", str(harness.project), "--json", "status")
    assert outcome.exit_code == 0 and json.loads(outcome.stdout)["app"] == "notes"
    outcome = harness.run("--app", "x", "status", "--project-dir", str(harness.project))
    assert outcome.exit_code == 2


def test_management_before_any_deploy_says_deploy_first(harness: Harness) -> None:
    for args in (["status"], ["logs"], ["rollback", "--confirm"]):
        outcome = harness.deploy(*args)
        assert (
            outcome.exit_code == 1 and "NOT_DEPLOYED" in outcome.stderr and "offline deploy" in outcome.stderr
        )
    assert harness.remote.calls == []


def test_logs_prints_the_last_lines(harness: Harness) -> None:
    harness.first_deploy()
    harness.remote.calls.clear()
    outcome = harness.deploy("logs", "--lines", "3")
    assert outcome.exit_code == 0
    assert outcome.stdout == "line 298\nline 299\nline 300\n"
    assert harness.remote.calls == ["check_prerequisites", "logs:3"]


# -- rollback ------------------------------------------------------------------------------------------------


def _deploy_twice(harness: Harness) -> None:
    harness.first_deploy()
    assert harness.deploy("--confirm").exit_code == 0
    harness.remote.calls.clear()


def test_rollback_returns_to_the_previous_deployment(harness: Harness) -> None:
    _deploy_twice(harness)
    outcome = harness.deploy("rollback", "--confirm")
    assert outcome.exit_code == 0, outcome.stderr
    assert harness.remote.calls == [
        "check_prerequisites",
        "deployments",
        "rollback:None",
        "wait_until_healthy",
    ]
    assert outcome.stdout == "url:  https://notes.fake.test\nsync: wss://notes.fake.test/offline-sync\n"
    state = load_state(harness.project)
    assert state is not None and state.deployment_ids == ["d1", "d2", "d3"]
    assert state.deployments[-1]["kind"] == "rollback" and state.adapter["last_image"] == "img:d1"


def test_rollback_json_is_one_object_on_stdout(harness: Harness) -> None:
    _deploy_twice(harness)
    outcome = harness.deploy("rollback", "--confirm", "--json")
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout.endswith("\n") and outcome.stdout.count("\n") == 1  # one line, one object
    assert json.loads(outcome.stdout) == {
        "platform": "fake-host",
        "vendor": "Fake host",
        "app": "notes",
        "region": "iad",
        "url": "https://notes.fake.test",
        "sync_url": "wss://notes.fake.test/offline-sync",
        "deployment_id": "d3",
        "state": "RUNNING",
        "healthy": True,
        "health_warning": None,
        "client_deployed": None,
        "next_step": None,
        "warnings": [],
    }
    assert "Rolled back notes to d3" in outcome.stderr  # progress stays on stderr
    assert harness.remote.calls[-2:] == ["rollback:None", "wait_until_healthy"]
    # --json given to the group (before the subcommand) does the same.
    harness.deploy("--confirm")  # d4
    before = harness.run("--json", "--project-dir", str(harness.project), "rollback", "--confirm")
    assert before.exit_code == 0, before.stderr
    assert before.stdout.count("\n") == 1 and json.loads(before.stdout)["deployment_id"] == "d5"


def test_rollback_json_failure_prints_a_json_error_object_on_stdout(harness: Harness) -> None:
    harness.first_deploy()
    outcome = harness.deploy("rollback", "--confirm", "--json")
    assert outcome.exit_code == 1 and outcome.stdout.count("\n") == 1
    error = json.loads(outcome.stdout)
    assert error["ok"] is False and error["error"]["code"] == "NO_PREVIOUS_DEPLOYMENT"
    assert "no previous deployment" in error["error"]["message"] and error["error"]["hint"]
    assert "NO_PREVIOUS_DEPLOYMENT" in outcome.stderr


def test_rollback_to_a_given_id(harness: Harness) -> None:
    _deploy_twice(harness)
    assert harness.deploy("--confirm").exit_code == 0  # d3
    harness.remote.calls.clear()
    outcome = harness.deploy("rollback", "d1", "--confirm")
    assert outcome.exit_code == 0, outcome.stderr
    assert "rollback:d1" in harness.remote.calls
    unknown = harness.deploy("rollback", "d99", "--confirm")
    assert unknown.exit_code == 1 and "UNKNOWN_DEPLOYMENT" in unknown.stderr and "d99" in unknown.stderr


def test_rollback_with_nothing_to_return_to(harness: Harness) -> None:
    harness.first_deploy()
    harness.remote.calls.clear()
    outcome = harness.deploy("rollback", "--confirm")
    assert outcome.exit_code == 1
    assert "NO_PREVIOUS_DEPLOYMENT" in outcome.stderr and "no previous deployment" in outcome.stderr
    assert harness.remote.calls == ["check_prerequisites", "deployments"]


def test_rollback_the_platform_refuses_is_reported(harness: Harness) -> None:
    harness.first_deploy()
    harness.remote.apps["notes"].insert(0, Deployment(id="d0", status="FAILED", image="img:d0"))
    harness.remote.calls.clear()
    outcome = harness.deploy("rollback", "--confirm")
    assert outcome.exit_code == 1 and "NO_PREVIOUS_DEPLOYMENT" in outcome.stderr
    assert harness.remote.calls == ["check_prerequisites", "deployments", "rollback:None"]


def test_rollback_asks_unless_confirmed(harness: Harness) -> None:
    _deploy_twice(harness)
    no_tty = harness.deploy("rollback")
    assert no_tty.exit_code == 1 and "--confirm is required" in no_tty.stderr
    assert harness.remote.calls == []
    declined = ScriptedPrompter([False])
    outcome = harness.deploy("rollback", interactive=True, prompter=declined)
    assert outcome.exit_code == 1 and "nothing was changed" in outcome.stderr
    assert declined.asked == [
        ("confirm", "Roll notes on Fake host back to the previous deployment (the current one is d2)?")
    ]
    assert not any(c.startswith("rollback") for c in harness.remote.calls)
    named = ScriptedPrompter([True])
    outcome = harness.deploy("rollback", "d1", interactive=True, prompter=named)
    assert outcome.exit_code == 0 and "rollback:d1" in harness.remote.calls
    assert named.asked == [("confirm", "Roll notes on Fake host back to deployment d1?")]


# -- reset ----------------------------------------------------------------------------------------------------


def test_reset_deletes_state_and_files_and_calls_no_adapter(harness: Harness) -> None:
    harness.first_deploy()
    harness.remote.calls.clear()
    outcome = harness.deploy("--reset", "--confirm")
    assert outcome.exit_code == 0, outcome.stderr
    assert not harness.deploy_dir.exists()
    assert harness.remote.calls == []
    assert "left running" in outcome.stderr and "notes" in outcome.stderr
    # The next deploy starts from scratch: it needs the flags again.
    again = harness.deploy("--confirm")
    assert again.exit_code == 1 and "--platform is required" in again.stderr


def test_reset_asks_unless_confirmed(harness: Harness) -> None:
    harness.first_deploy()
    no_tty = harness.deploy("--reset")
    assert no_tty.exit_code == 1 and "--confirm is required" in no_tty.stderr and harness.deploy_dir.exists()
    declined = harness.deploy("--reset", interactive=True, prompter=ScriptedPrompter([False]))
    assert declined.exit_code == 1 and harness.deploy_dir.exists()
    accepted = harness.deploy("--reset", interactive=True, prompter=ScriptedPrompter([True]))
    assert accepted.exit_code == 0 and not harness.deploy_dir.exists()


def test_reset_with_nothing_or_a_broken_state(harness: Harness) -> None:
    outcome = harness.deploy("--reset", "--confirm")
    assert outcome.exit_code == 0 and "Nothing to reset" in outcome.stderr
    state_path(harness.project).parent.mkdir(parents=True)
    state_path(harness.project).write_text("{broken")
    outcome = harness.deploy("--reset", "--confirm")
    assert outcome.exit_code == 0 and not harness.deploy_dir.exists()


# -- help and laziness ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [["--help"], ["status", "--help"], ["logs", "--help"], ["rollback", "--help"]]
)
def test_every_deploy_command_has_help_with_examples(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["deploy", *args])
    assert result.exit_code == 0 and "Examples:" in result.output


def test_help_imports_no_heavy_deploy_dependency() -> None:
    code = (
        "import sys\n"
        "from offline_cli.main import cli\n"
        "for args in (['--help'], ['deploy', '--help']):\n"
        "    try:\n"
        "        cli(args, prog_name='offline')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    heavy = [m for m in ('boto3', 'docker', 'jinja2', 'questionary', 'prompt_toolkit', 'shiv',\n"
        "                         'offline.store', 'offline_cli.deploy.flow') if m in sys.modules]\n"
        "    print('HEAVY', args[0], heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "HEAVY --help []" in result.stdout and "HEAVY deploy []" in result.stdout


def test_the_command_module_names_the_same_deploy_folder_as_the_state_module() -> None:
    assert deploy_command.DEPLOY_DIR == DEPLOY_DIR


# -- the direct health probe ----------------------------------------------------------------------------------


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/health" else 503
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args: Any) -> None:
        pass


def test_probe_health_answers_none_when_healthy_and_why_otherwise() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert probe_health(f"{base}/health", 5) is None
        assert probe_health(f"{base}/down", 0.5) == "HTTP 503"
        # What an empty URL used to become: a problem to report, never an exception.
        assert probe_health("/health", 0.5) is not None
        assert probe_health("wss:///offline-sync/health", 0.5) is not None
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_the_client_rebuild_warning_appears_only_when_the_sync_url_really_changed(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like ECS: no address before the first deploy, then the last task's address, which a new task may
    change. The warning to deploy again is right only when the address really moved."""
    from ._core_fakes import FakeAdapter

    monkeypatch.setattr(FakeAdapter, "public_url", lambda self, ctx: ctx.state.get("url"))
    harness.remote.outcome_url = ""
    harness.remote.healthy_url = "http://203.0.113.7:3001"
    first = harness.first_deploy()
    assert first.exit_code == 0, first.stderr
    assert "the client was built for" not in first.stderr
    second = harness.deploy("--confirm")
    assert "the client was built for" not in second.stderr
    harness.remote.healthy_url = "http://203.0.113.9:3001"  # a new task, a new address
    third = harness.deploy("--confirm")
    assert (
        "the client was built for ws://203.0.113.7:3001/offline-sync but the app answers at "
        "ws://203.0.113.9:3001/offline-sync" in " ".join(third.stderr.split())
    )


def test_empty_logs_say_so(harness: Harness) -> None:
    harness.first_deploy()
    harness.remote.log_lines = []
    outcome = harness.deploy("logs")
    assert outcome.exit_code == 0 and outcome.stdout == ""
    assert "No log lines yet" in outcome.stderr


def test_plan_secrets_generates_an_admin_token_only_when_neither_shell_nor_platform_has_one() -> None:
    from platform_adapters.base import forwarded_environment

    fresh = flow.plan_secrets({"PATH": "/bin", "AUTH_SECRET": "a" * 32}, {})
    token = fresh.generated_admin_token
    assert token is not None and len(token) >= 40 and fresh.env["OFFLINE_ADMIN_TOKEN"] == token
    assert fresh.to_set == ["AUTH_SECRET", "OFFLINE_ADMIN_TOKEN"] and fresh.kept == []
    assert flow.plan_secrets({}, {}).generated_admin_token != token  # a new one each time

    # The shell's token wins over the platform's.
    shell = flow.plan_secrets({"OFFLINE_ADMIN_TOKEN": "mine-0123456789"}, {"OFFLINE_ADMIN_TOKEN": None})
    assert shell.generated_admin_token is None and shell.to_set == ["OFFLINE_ADMIN_TOKEN"]
    assert shell.env["OFFLINE_ADMIN_TOKEN"] == "mine-0123456789"

    # Fly and Railway keep it across deploys: nothing is sent.
    kept = flow.plan_secrets({}, {"OFFLINE_ADMIN_TOKEN": None, "OFFLINE_METRICS_TOKEN": None})
    assert kept.generated_admin_token is None and kept.to_set == []
    assert kept.kept == ["OFFLINE_ADMIN_TOKEN", "OFFLINE_METRICS_TOKEN"]
    assert forwarded_environment(kept.env) == {}

    # Lightsail and ECS replace the environment: the platform's values are sent again.
    again = flow.plan_secrets(
        {"AUTH_SECRET": "from-the-shell"},
        {"OFFLINE_ADMIN_TOKEN": "on-aws-token", "OFFLINE_BACKUP_TOKEN": "backup-tok", "AUTH_SECRET": "old"},
    )
    assert again.generated_admin_token is None and again.kept == []
    assert forwarded_environment(again.env) == {
        "AUTH_SECRET": "from-the-shell",
        "OFFLINE_ADMIN_TOKEN": "on-aws-token",
        "OFFLINE_BACKUP_TOKEN": "backup-tok",
    }


def test_json_usage_errors_are_a_json_object_too(harness: Harness) -> None:
    outcome = harness.deploy("--platform", "flyy", "--app", "notes", "--json")
    assert outcome.exit_code == 2
    error = json.loads(outcome.stdout)["error"]
    assert error["code"] == "USAGE" and "flyy" in error["message"]
    assert harness.remote.calls == []


@pytest.mark.parametrize(
    "words",
    [("logs", "--lines", "x", "--json"), ("status", "--bogus", "--json"), ("--json", "rollback", "--bogus")],
)
def test_json_usage_errors_of_a_subcommand_are_a_json_object_too(
    harness: Harness, words: tuple[str, ...]
) -> None:
    outcome = harness.deploy(*words)
    assert outcome.exit_code == 2
    error = json.loads(outcome.stdout)["error"]
    assert error["code"] == "USAGE" and error["message"] and "--help" in error["hint"]
    assert harness.remote.calls == []


@pytest.mark.parametrize(
    ("alias", "code"),
    [
        ("fly", "host-a"),
        ("railway", "host-b"),
        ("lightsail", "cloud-a-containers"),
        ("ecs", "cloud-a-orchestrated"),
        ("host-a", "host-a"),
    ],
)
def test_platform_aliases_become_the_neutral_code(alias: str, code: str) -> None:
    assert deploy_command.PlatformChoice().convert(alias, None, None) == code
    assert platform_adapters.canonical(alias) == code


def test_a_failure_before_the_platform_was_touched_shows_no_admin_token(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from platform_adapters.base import BUILD_FAILED, DeployError

    def broken(self: FakeBundler, *args: Any, **kwargs: Any) -> Path:
        raise DeployError("bundling the server failed", BUILD_FAILED)

    monkeypatch.setattr(FakeBundler, "__call__", broken)
    outcome = harness.deploy("--platform", "fake-host", "--app", "notes", "--region", "iad", "--confirm")
    assert outcome.exit_code == 1 and "BUILD_FAILED" in outcome.stderr
    assert "Admin token" not in outcome.stderr  # it was never set anywhere: the next deploy makes one
    assert harness.remote.calls == ["check_prerequisites"]


def test_confirm_on_a_terminal_shows_the_plan_without_asking(harness: Harness) -> None:
    prompter = ScriptedPrompter()  # any question would fail
    outcome = harness.deploy(
        "--platform",
        "fake-host",
        "--app",
        "notes",
        "--region",
        "iad",
        "--confirm",
        interactive=True,
        prompter=prompter,
    )
    assert outcome.exit_code == 0, outcome.stderr
    assert prompter.asked == []
    assert "platform:  Fake host" in outcome.stderr and "storage:" in outcome.stderr
