"""The Fly.io adapter (``--platform host-a``): argv builders and parsers as data, and every flow against a
fake ``flyctl`` on PATH that records each call."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from platform_adapters import load_adapter
from platform_adapters.base import (
    CLI_NOT_INSTALLED,
    HEALTH_TIMEOUT,
    NAME_TAKEN,
    NO_PREVIOUS_DEPLOYMENT,
    NOT_AUTHENTICATED,
    PLATFORM_ERROR,
    DeployContext,
    DeployError,
    DeployOutcome,
    PlatformAdapter,
)
from platform_adapters.fly import (
    FlyAdapter,
    fly_apps_create_argv,
    fly_apps_list_argv,
    fly_deploy_argv,
    fly_deployments,
    fly_logs_argv,
    fly_releases_argv,
    fly_rollback_target,
    fly_secrets_import_argv,
    fly_secrets_stdin,
    fly_status_argv,
    fly_status_report,
    fly_whoami_argv,
    render_fly_toml,
)
from tests.deploy.conftest import SERVER_SETTINGS
from tests.deploy.fakes.flyctl import machine, release
from tests.deploy.fakes.harness import FakeCliEnv, ListReporter, make_context

APP = "demo-app"
SECRETS = {
    "DATABASE_URL": "postgresql://app:pw-Xq81-zz@db.example.com:5432/app",
    "AUTH_SECRET": "c2lnbmluZy1rZXktb2YtMzItYnl0ZXMtZm9yLWp3dA==",
    "PUBLIC_URL": "https://demo.example.com",
}
WHOAMI = ["flyctl", "auth", "whoami", "--json"]
APPS_LIST = ["flyctl", "apps", "list", "--json"]
CREATE = ["flyctl", "apps", "create", APP, "--org", "personal", "--json"]
IMPORT = ["flyctl", "secrets", "import", "--stage", "--app", APP]
BUILD = [
    "flyctl",
    "deploy",
    "--remote-only",
    "--config",
    "fly.toml",
    "--dockerfile",
    "Dockerfile",
    "--app",
    APP,
    "--yes",
]
STATUS = ["flyctl", "status", "--json", "--app", APP]
VOLUMES = ["flyctl", "volumes", "list", "--app", APP, "--json"]
SECRETS_LIST = ["flyctl", "secrets", "list", "--app", APP, "--json"]
# The server rate-limits by the address Fly's proxy reports (issue 22's server settings).
PROXY_ENV = {"OFFLINE_TRUSTED_PROXIES": "*", "OFFLINE_CLIENT_IP_HEADER": "Fly-Client-IP"}
RELEASES = ["flyctl", "releases", "--json", "--image", "--app", APP]


def image(tag: str) -> str:
    return f"registry.fly.io/{APP}:deployment-{tag}"


@pytest.fixture
def flyctl(fake_cli: FakeCliEnv) -> FakeCliEnv:
    fake_cli.install("flyctl")
    fake_cli.set_world("fly", {"apps": {}})
    return fake_cli


def context(fake: FakeCliEnv, project_dir: Path, **kwargs: Any) -> DeployContext:
    return make_context(fake, project_dir, app=APP, **kwargs)


def first_deploy(adapter: PlatformAdapter, ctx: DeployContext) -> Any:
    """The adapter calls of `offline deploy` in offline_cli.deploy.flow.run_deploy's order: prerequisites,
    provision (the app exists, its state is saved), public_url (for the client build), render_config,
    deploy, wait_until_healthy."""
    adapter.check_prerequisites(ctx)
    ctx.state.update(adapter.provision(ctx))
    adapter.public_url(ctx)
    adapter.render_config(ctx)
    outcome = adapter.deploy(ctx)
    return outcome, adapter.wait_until_healthy(ctx, outcome)


# -- pure parts ---------------------------------------------------------------------------------------------------


def test_argv_builders_are_the_documented_flyctl_commands() -> None:
    assert fly_whoami_argv() == WHOAMI
    assert fly_apps_list_argv("fly") == ["fly", "apps", "list", "--json"]
    assert fly_apps_create_argv(APP, "acme") == ["flyctl", "apps", "create", APP, "--org", "acme", "--json"]
    assert fly_secrets_import_argv(APP) == IMPORT
    assert fly_deploy_argv(APP) == BUILD
    assert fly_deploy_argv(APP, image="registry.fly.io/x@sha256:ab", cli="fly") == [
        "fly", "deploy", "--image", "registry.fly.io/x@sha256:ab", "--config", "fly.toml", "--app", APP, "--yes",
    ]  # fmt: skip
    assert fly_status_argv(APP) == STATUS
    assert fly_releases_argv(APP) == RELEASES
    assert fly_logs_argv(APP) == ["flyctl", "logs", "--no-tail", "--app", APP]


def test_fly_toml_parses_and_agrees_on_one_port() -> None:
    config = tomllib.loads(render_fly_toml(APP, "ams", 3100, sqlite_volume=False))
    assert config["app"] == APP and config["primary_region"] == "ams"
    assert config["build"] == {"dockerfile": "Dockerfile"}
    assert config["env"] == {"PORT": "3100", **PROXY_ENV}
    service = config["http_service"]
    assert service["internal_port"] == 3100 and service["force_https"] is True
    assert service["min_machines_running"] == 1
    assert service["checks"] == [
        {"grace_period": "10s", "interval": "15s", "method": "GET", "path": "/health", "timeout": "5s"}
    ]
    assert "mounts" not in config


def test_fly_toml_keeps_sqlite_on_a_volume_and_escapes_strings() -> None:
    config = tomllib.loads(render_fly_toml('we"ird\\name', "iad", 3001, sqlite_volume=True))
    assert config["app"] == 'we"ird\\name'
    assert config["mounts"] == {"source": "offline_data", "destination": "/data", "initial_size": "1gb"}
    assert config["env"] == {"PORT": "3001", "OFFLINE_SERVER_DB": "/data/offline-server.db", **PROXY_ENV}


def test_secrets_stdin_survives_flyctls_import_parser() -> None:
    text = fly_secrets_stdin({"A": "plain=value#1", "B": " leading space", "C": '"quoted"'})
    assert text == 'A=plain=value#1\nB=" leading space"\nC=""quoted""\n'
    with pytest.raises(ValueError, match="AUTH_SECRET contains a line break") as caught:
        fly_secrets_stdin({"AUTH_SECRET": "line one\nline two"})
    assert "line one" not in str(caught.value)
    with pytest.raises(ValueError, match="DATABASE_URL"):
        fly_secrets_stdin({"DATABASE_URL": '""starts with two quotes'})


def status_data(machines: list[dict[str, Any]], version: int, *, deployed: bool = True) -> dict[str, Any]:
    return {"Hostname": f"{APP}.fly.dev", "Version": version, "Deployed": deployed, "Machines": machines}


@pytest.mark.parametrize(
    ("machines", "state", "healthy"),
    [
        ([machine("a", 2), machine("b", 2)], "RUNNING", True),
        ([machine("a", 2), machine("b", 1)], "DEPLOYING", True),  # one machine still on the old release
        ([machine("a", 2, state="starting", checks=())], "DEPLOYING", False),
        ([machine("a", 2, checks=("warning",))], "DEPLOYING", False),  # first check result not in yet
        ([machine("a", 2, checks=("critical",))], "FAILED", False),
        ([machine("a", 2, state="failed")], "FAILED", False),
        ([machine("a", 2, state="stopped")], "STOPPED", False),
        ([], "STOPPED", False),
    ],
)
def test_status_report_maps_machines_and_checks(
    machines: list[dict[str, Any]], state: str, healthy: bool
) -> None:
    report = fly_status_report(status_data(machines, 2))
    assert (report.state, report.healthy) == (state, healthy)
    assert report.url == f"https://{APP}.fly.dev"
    assert report.deployment_id == "v2"


def test_status_report_of_an_app_never_deployed() -> None:
    report = fly_status_report(status_data([], 0, deployed=False), url="https://x.fly.dev")
    assert (report.state, report.deployment_id, report.url) == ("NOT_FOUND", None, f"https://{APP}.fly.dev")


RELEASES_WITH_HISTORY = [
    release(4, image("c")),  # current
    release(3, image("c")),  # secrets change: same image
    release(2, image("b"), status="failed"),  # never ran
    release(1, image("a")),
]


def test_rollback_target_skips_same_image_and_failed_releases() -> None:
    assert fly_rollback_target(RELEASES_WITH_HISTORY, None, app=APP)["Version"] == 1
    for wanted in ("v1", "1", "rel_0001"):
        assert fly_rollback_target(RELEASES_WITH_HISTORY, wanted, app=APP)["ImageRef"] == image("a")


@pytest.mark.parametrize("wanted", [None, "v4", "v9"])
def test_rollback_target_refuses_when_there_is_nothing_to_return_to(wanted: str | None) -> None:
    releases = [release(4, image("c"))] if wanted is None else RELEASES_WITH_HISTORY
    with pytest.raises(DeployError) as caught:
        fly_rollback_target(releases, wanted, app=APP)
    assert caught.value.code == NO_PREVIOUS_DEPLOYMENT
    assert caught.value.hint


def test_deployments_mark_the_release_that_runs() -> None:
    listed = fly_deployments([release(2, image("b"), status="failed"), release(1, image("a"))])
    assert [(d.id, d.status, d.image, d.current) for d in listed] == [
        ("v2", "failed", image("b"), False),
        ("v1", "complete", image("a"), True),
    ]


# -- against the fake flyctl ---------------------------------------------------------------------------------------


def test_registry_loads_the_fly_adapter() -> None:
    adapter = load_adapter("host-a")
    assert isinstance(adapter, FlyAdapter) and adapter.name == "host-a"


def test_first_deploy_creates_the_app_stages_secrets_and_waits_for_checks(
    flyctl: FakeCliEnv, project_dir: Path
) -> None:
    rolling = [machine("m1", 1, state="starting", checks=("warning",))]
    warming = [machine("m1", 1, checks=("warning",))]
    flyctl.update_world("fly", lambda w: w.update(status_script={APP: [rolling, rolling, warming]}))
    ctx = context(flyctl, project_dir, env=SECRETS, region="ams")
    adapter = FlyAdapter()

    assert adapter.public_url(ctx) == f"https://{APP}.fly.dev"
    outcome, report = first_deploy(adapter, ctx)

    # DATABASE_URL is set, so Fly is asked whether the app has a volume to keep mounted (it has none).
    assert flyctl.argvs() == [
        WHOAMI,
        APPS_LIST,
        CREATE,
        IMPORT,
        VOLUMES,
        BUILD,
        STATUS,
        STATUS,
        STATUS,
        STATUS,
    ]
    calls = flyctl.calls()
    assert calls[5]["cwd"] == str(ctx.deploy_dir)
    assert flyctl.stdin_of(calls[3]) == "".join(f"{k}={v}\n" for k, v in SECRETS.items())
    assert flyctl.world("fly")["secrets"] == {APP: {k: len(v) for k, v in SECRETS.items()}}
    assert outcome.url == f"https://{APP}.fly.dev" and outcome.deployment_id == "v1"
    assert outcome.sync_url == f"wss://{APP}.fly.dev/offline-sync"
    assert (report.state, report.healthy, report.deployment_id) == ("RUNNING", True, "v1")
    shipped = flyctl.world("fly")["deploys"][0]["config"]
    assert shipped["primary_region"] == "ams" and "mounts" not in shipped  # DATABASE_URL is set
    assert ctx.state["org"] == "personal"


def test_the_servers_auth_and_email_settings_are_staged_as_secrets_not_written(
    flyctl: FakeCliEnv, project_dir: Path
) -> None:
    ctx = context(flyctl, project_dir, env={**SECRETS, **SERVER_SETTINGS}, region="ams")
    adapter = FlyAdapter()
    adapter.public_url(ctx)
    first_deploy(adapter, ctx)
    (staged,) = [call for call in flyctl.calls() if call["argv"] == IMPORT]
    lines = (flyctl.stdin_of(staged) or "").splitlines()
    assert all(f"{name}={value}" in lines for name, value in SERVER_SETTINGS.items())
    generated = "\n".join(f.read_text() for f in ctx.deploy_dir.rglob("*") if f.is_file())
    assert "OFFLINE_SMTP_URL" not in generated and "p%40ss-smtp" not in generated


def test_redeploy_reuses_the_app_and_keeps_the_sqlite_volume(flyctl: FakeCliEnv, project_dir: Path) -> None:
    flyctl.set_world(
        "fly",
        {"apps": {APP: {"org": "personal"}}, "releases": {APP: [release(1, image("a"))]},
         "machines": {APP: [machine("m1", 1)]}},
    )  # fmt: skip
    ctx = context(flyctl, project_dir, state={"sqlite_volume": True, "region": "iad"})

    outcome, report = first_deploy(FlyAdapter(), ctx)

    assert flyctl.argvs() == [WHOAMI, APPS_LIST, BUILD, STATUS, STATUS]
    assert outcome.deployment_id == "v2" and report.deployment_id == "v2"
    config = tomllib.loads((ctx.deploy_dir / "fly.toml").read_text())
    assert config["mounts"]["destination"] == "/data"
    assert outcome.state["sqlite_volume"] is True


def test_only_fly_on_path_is_used_under_that_name(fake_cli: FakeCliEnv, project_dir: Path) -> None:
    fake_cli.install("fly")
    fake_cli.set_world("fly", {"apps": {}})
    FlyAdapter().check_prerequisites(context(fake_cli, project_dir))
    assert fake_cli.argvs() == [["fly", "auth", "whoami", "--json"]]


def test_status_shows_deploying_while_machines_roll_over(flyctl: FakeCliEnv, project_dir: Path) -> None:
    flyctl.set_world(
        "fly",
        {
            "apps": {APP: {}},
            "releases": {APP: [release(2, image("b")), release(1, image("a"))]},
            "machines": {APP: [machine("m1", 2), machine("m2", 2)]},
            "status_script": {APP: [[machine("m1", 2), machine("m2", 1)]]},
        },
    )
    ctx = context(flyctl, project_dir)
    adapter = FlyAdapter()

    during = adapter.status(ctx)
    after = adapter.status(ctx)

    assert (during.state, during.healthy) == ("DEPLOYING", True)
    assert [m["release"] for m in during.details["machines"]] == ["v2", "v1"]
    assert (after.state, after.healthy, after.url) == ("RUNNING", True, f"https://{APP}.fly.dev")
    assert flyctl.argvs() == [STATUS, STATUS]


def test_status_of_an_app_fly_does_not_know(flyctl: FakeCliEnv, project_dir: Path) -> None:
    report = FlyAdapter().status(context(flyctl, project_dir))
    assert (report.state, report.healthy) == ("NOT_FOUND", False)
    assert flyctl.argvs() == [STATUS]


def test_wait_gives_up_after_the_health_timeout(flyctl: FakeCliEnv, project_dir: Path) -> None:
    stuck = [machine("m1", 1, checks=("warning",))]
    flyctl.set_world(
        "fly", {"apps": {APP: {}}, "releases": {APP: [release(1, image("a"))]}, "machines": {APP: stuck}}
    )
    ctx = context(flyctl, project_dir, health_timeout=20.0)
    adapter = FlyAdapter()

    with pytest.raises(DeployError) as caught:
        adapter.wait_until_healthy(ctx, DeployOutcome(url=f"https://{APP}.fly.dev", deployment_id="v1"))

    assert caught.value.code == HEALTH_TIMEOUT
    assert "DEPLOYING" in caught.value.message and "flyctl status" in caught.value.hint
    # One look at the start and one after each 5 s pause, up to 20 s.
    assert flyctl.argvs() == [STATUS] * 5


def test_logs_are_the_last_lines_of_the_buffer(flyctl: FakeCliEnv, project_dir: Path) -> None:
    lines = [f"2025-01-01T00:00:0{i}Z app[m1] iad [info] line {i}" for i in range(5)]
    flyctl.set_world("fly", {"apps": {APP: {}}, "logs": {APP: lines}})
    assert FlyAdapter().logs(context(flyctl, project_dir), lines=3) == lines[2:]
    assert flyctl.argvs() == [["flyctl", "logs", "--no-tail", "--app", APP]]


def test_deployments_come_from_releases(flyctl: FakeCliEnv, project_dir: Path) -> None:
    flyctl.set_world(
        "fly", {"apps": {APP: {}}, "releases": {APP: [release(2, image("b")), release(1, image("a"))]}}
    )
    listed = FlyAdapter().deployments(context(flyctl, project_dir))
    assert [(d.id, d.current, d.image) for d in listed] == [
        ("v2", True, image("b")),
        ("v1", False, image("a")),
    ]
    assert flyctl.argvs() == [RELEASES]


def history_world() -> dict[str, Any]:
    return {
        "apps": {APP: {}},
        "releases": {APP: [dict(r) for r in RELEASES_WITH_HISTORY]},
        "machines": {APP: [machine("m1", 4)]},
    }


def test_rollback_redeploys_the_previous_image(flyctl: FakeCliEnv, project_dir: Path) -> None:
    flyctl.set_world("fly", history_world())
    ctx = context(flyctl, project_dir)

    outcome = FlyAdapter().rollback(ctx)

    redeploy = ["flyctl", "deploy", "--image", image("a"), "--config", "fly.toml", "--app", APP, "--yes"]
    assert flyctl.argvs() == [RELEASES, redeploy, STATUS]
    assert flyctl.calls()[1]["cwd"] == str(ctx.deploy_dir)
    assert flyctl.world("fly")["deploys"][-1]["image"] == image("a")
    assert outcome.deployment_id == "v5" and outcome.url == f"https://{APP}.fly.dev"


def test_rollback_to_a_named_release(flyctl: FakeCliEnv, project_dir: Path) -> None:
    flyctl.set_world("fly", history_world())
    FlyAdapter().rollback(context(flyctl, project_dir), "v3")
    assert flyctl.argvs()[1][:4] == ["flyctl", "deploy", "--image", image("c")]


def test_rollback_without_a_previous_release_calls_no_deploy(flyctl: FakeCliEnv, project_dir: Path) -> None:
    flyctl.set_world("fly", {"apps": {APP: {}}, "releases": {APP: [release(1, image("a"))]}})
    with pytest.raises(DeployError) as caught:
        FlyAdapter().rollback(context(flyctl, project_dir))
    assert caught.value.code == NO_PREVIOUS_DEPLOYMENT
    assert flyctl.argvs() == [RELEASES]


# -- errors ------------------------------------------------------------------------------------------------------


def test_missing_cli_says_how_to_install_it(fake_cli: FakeCliEnv, project_dir: Path) -> None:
    with pytest.raises(DeployError) as caught:
        FlyAdapter().check_prerequisites(context(fake_cli, project_dir))
    assert caught.value.code == CLI_NOT_INSTALLED
    assert "host CLI required but not installed" in caught.value.message
    assert "flyctl" in caught.value.message and "fly.io/install.sh" in caught.value.hint
    assert fake_cli.calls() == []


def test_not_logged_in_says_how_to_log_in(flyctl: FakeCliEnv, project_dir: Path) -> None:
    flyctl.set_world("fly", {"logged_in": False})
    with pytest.raises(DeployError) as caught:
        FlyAdapter().check_prerequisites(context(flyctl, project_dir))
    assert caught.value.code == NOT_AUTHENTICATED
    assert "cloud CLI is not authenticated" in caught.value.message
    assert "flyctl auth login" in caught.value.hint


def test_a_taken_name_asks_for_another_app_name(flyctl: FakeCliEnv, project_dir: Path) -> None:
    flyctl.set_world("fly", {"apps": {}, "taken": [APP]})
    with pytest.raises(DeployError) as caught:
        FlyAdapter().provision(context(flyctl, project_dir, env=SECRETS))
    assert caught.value.code == NAME_TAKEN
    assert "name has already been taken" in caught.value.message
    assert "--app" in caught.value.hint
    assert flyctl.argvs() == [APPS_LIST, CREATE]  # no secrets staged for an app that is not ours


def test_a_failed_remote_build_reports_flyctls_words(flyctl: FakeCliEnv, project_dir: Path) -> None:
    flyctl.set_world(
        "fly", {"apps": {APP: {}}, "deploy_error": "Error: failed to build: exit code 1 (RUN pip)"}
    )
    with pytest.raises(DeployError) as caught:
        FlyAdapter().deploy(context(flyctl, project_dir))
    assert caught.value.code == PLATFORM_ERROR
    assert "failed to build: exit code 1" in caught.value.message and caught.value.hint


def test_an_outdated_flyctl_is_asked_to_update(fake_cli: FakeCliEnv, project_dir: Path) -> None:
    fake_cli.install("flyctl", "tests.deploy.fakes.outdated_cli")
    with pytest.raises(DeployError) as caught:
        FlyAdapter().status(context(fake_cli, project_dir))
    assert caught.value.code == PLATFORM_ERROR
    assert "unknown flag: --json" in caught.value.message
    assert "flyctl version upgrade" in caught.value.hint


def test_the_fake_rejects_flags_flyctl_does_not_have(flyctl: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(flyctl, project_dir)
    result = ctx.runner.run(["flyctl", "status", "--jsn", "--app", APP])
    assert result.returncode == 1 and "unknown flag: --jsn" in result.stderr


# -- secrets (`offline deploy --reset` never runs the CLI: test_deploy_integration.py) ----------------------------


def test_secret_values_reach_fly_only_through_stdin(flyctl: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(flyctl, project_dir, env=SECRETS)
    adapter = FlyAdapter()
    outcome, report = first_deploy(adapter, ctx)

    exposed = [
        flyctl.recorded_text(),  # argv, cwd and env names of every call
        json.dumps(outcome.state),
        json.dumps(ctx.state),
        json.dumps(report.details),
        *(str(event) for event in reporter_events(ctx)),
        *(path.read_text(errors="replace") for path in ctx.deploy_dir.rglob("*") if path.is_file()),
    ]
    for value in SECRETS.values():
        assert all(value not in text for text in exposed)
    imports = [c for c in flyctl.calls() if c["argv"][1:3] == ["secrets", "import"]]
    assert SECRETS["AUTH_SECRET"] in (flyctl.stdin_of(imports[0]) or "")


def reporter_events(ctx: DeployContext) -> list[tuple[str, str]]:
    assert isinstance(ctx.reporter, ListReporter)
    return ctx.reporter.events


def test_existing_secrets_are_read_by_name_from_fly(flyctl: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(flyctl, project_dir)
    assert FlyAdapter().existing_secrets(ctx) == {}  # no app yet: nothing set
    flyctl.set_world(
        "fly", {"apps": {APP: {"org": "personal"}}, "secrets": {APP: {"OFFLINE_ADMIN_TOKEN": 43, "OTHER": 3}}}
    )
    assert FlyAdapter().existing_secrets(ctx) == {"OFFLINE_ADMIN_TOKEN": None}
    assert flyctl.argvs()[-1] == SECRETS_LIST


def test_a_volume_on_fly_stays_mounted_after_reset_even_with_database_url(
    flyctl: FakeCliEnv, project_dir: Path
) -> None:
    """`offline deploy --reset` forgets sqlite_volume; a deploy with DATABASE_URL must still keep [mounts],
    because flyctl, without a terminal, refuses a config that drops an attached volume."""
    flyctl.set_world("fly", {"apps": {}})
    first = context(flyctl, project_dir)  # no DATABASE_URL: the volume is created
    first_deploy(FlyAdapter(), first)
    assert flyctl.world("fly")["volumes"][APP][0]["name"] == "offline_data"

    # What the fake (like flyctl) does with a config without the mount: it refuses.
    (first.deploy_dir / "fly.toml").write_text(render_fly_toml(APP, "iad", 3001, sqlite_volume=False))
    refused = FlyAdapter()
    with pytest.raises(DeployError) as caught:
        refused.deploy(first)
    assert "yes flag must be specified" in str(caught.value)

    after_reset = context(flyctl, project_dir, env=SECRETS)  # empty state, DATABASE_URL set
    _outcome, report = first_deploy(FlyAdapter(), after_reset)
    assert report.state == "RUNNING"
    shipped = flyctl.world("fly")["deploys"][-1]["config"]
    assert shipped["mounts"]["source"] == "offline_data"
    assert VOLUMES in flyctl.argvs()


def test_the_wait_shows_each_new_machine_state_once(flyctl: FakeCliEnv, project_dir: Path) -> None:
    rolling = [machine("m1", 1, state="starting", checks=("warning",))]
    warming = [machine("m1", 1, checks=("warning",))]
    flyctl.update_world("fly", lambda w: w.update(status_script={APP: [rolling, rolling, warming]}))
    ctx = context(flyctl, project_dir, env=SECRETS)
    first_deploy(FlyAdapter(), ctx)
    shown = [message for kind, message in ctx.reporter.events if message.startswith("Fly.io: ")]  # type: ignore[attr-defined]
    assert shown == [
        "Fly.io: DEPLOYING; machines: m1 starting (v1, checks 0/1 passing)",
        "Fly.io: DEPLOYING; machines: m1 started (v1, checks 0/1 passing)",
        "Fly.io: RUNNING; machines: m1 started (v1, checks 1/1 passing)",
    ]
