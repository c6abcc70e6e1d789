"""The Railway adapter (``--platform host-b``): argv builders and parsers as data, every flow against a fake
``railway`` on PATH that records each call, and rollback against a loopback fake of Railway's GraphQL API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from platform_adapters import load_adapter
from platform_adapters.base import (
    CLI_NOT_INSTALLED,
    NO_PREVIOUS_DEPLOYMENT,
    NOT_AUTHENTICATED,
    PLATFORM_ERROR,
    DeployContext,
    DeployError,
    DeployOutcome,
    PlatformAdapter,
)
from platform_adapters.railway import (
    API_URL_ENV,
    ROLLBACK_MUTATION,
    RailwayAdapter,
    deployment_from_up_output,
    domain_from_output,
    railway_add_service_argv,
    railway_deployments_argv,
    railway_domain_argv,
    railway_init_argv,
    railway_link_argv,
    railway_logs_argv,
    railway_rollback_target,
    railway_status_argv,
    railway_status_report,
    railway_up_argv,
    railway_variable_stdin_argv,
    railway_variables_set_argv,
    railway_volume_add_argv,
    railway_whoami_argv,
    render_railway_json,
)
from tests.deploy.fakes.harness import FakeCliEnv, ListReporter, make_context
from tests.deploy.fakes.railway import deployment
from tests.deploy.fakes.railway_api import FakeRailwayApi

APP = "demo-app"
HOST = f"{APP}-production.up.railway.app"
SECRETS = {
    "DATABASE_URL": "postgresql://app:pw-Rq55-yy@db.example.com:5432/app",
    "AUTH_SECRET": "cmFpbHdheS1zaWduaW5nLWtleS0zMi1ieXRlcy1sb25n",
    "PUBLIC_URL": "https://demo.example.org",
}
WHOAMI = ["railway", "whoami", "--json"]
STATUS = ["railway", "status", "--json"]
INIT = ["railway", "init", "--name", APP]
ADD = ["railway", "add", "--service", APP]
PORT_ONLY = ["railway", "variables", "--service", APP, "--set", "PORT=3001", "--skip-deploys"]
DOMAIN = ["railway", "domain", "--service", APP, "--json"]
UP = ["railway", "up", "--detach", "--ci", "--service", APP]
LIST = ["railway", "deployment", "list", "--service", APP, "--json"]


def from_stdin(name: str) -> list[str]:
    return ["railway", "variables", "--service", APP, "--set-from-stdin", name, "--skip-deploys"]


@pytest.fixture
def railway(fake_cli: FakeCliEnv) -> FakeCliEnv:
    fake_cli.install("railway")
    fake_cli.set_world("railway", {})
    return fake_cli


def context(fake: FakeCliEnv, project_dir: Path, **kwargs: Any) -> DeployContext:
    return make_context(fake, project_dir, app=APP, **kwargs)


def linked_world(ctx: DeployContext, deployments: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A project named like the app with its service, linked to the deploy directory."""
    return {
        "counter": 10,
        "projects": {
            "proj-1": {
                "id": "proj-1",
                "name": APP,
                "environments": [{"id": "env-1", "name": "production"}],
                "services": [{"id": "svc-1", "name": APP}],
            }
        },
        "links": {str(ctx.deploy_dir): {"project": "proj-1", "environment": "env-1", "service": "svc-1"}},
        "deployments": {"svc-1": deployments},
        "domains": {"svc-1": HOST},
        **extra,
    }


LINKED_STATE = {
    "project_id": "proj-1",
    "environment_id": "env-1",
    "service_id": "svc-1",
    "service": APP,
    "url": f"https://{HOST}",
}


def full_deploy(adapter: PlatformAdapter, ctx: DeployContext) -> Any:
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


def test_argv_builders_are_the_documented_railway_commands() -> None:
    assert railway_whoami_argv() == WHOAMI
    assert railway_status_argv() == STATUS
    assert railway_init_argv(APP) == INIT
    assert railway_init_argv(APP, "team") == [*INIT, "--workspace", "team"]
    assert railway_link_argv("proj-1", "env-1") == [
        "railway",
        "link",
        "--project",
        "proj-1",
        "--environment",
        "env-1",
    ]
    assert railway_add_service_argv(APP) == ADD
    assert railway_volume_add_argv(APP) == [
        "railway",
        "volume",
        "--service",
        APP,
        "add",
        "--mount-path",
        "/data",
    ]
    assert railway_variables_set_argv(APP, {"PORT": "3001"}) == PORT_ONLY
    assert railway_variable_stdin_argv(APP, "AUTH_SECRET") == from_stdin("AUTH_SECRET")
    assert railway_domain_argv(APP) == DOMAIN
    assert railway_up_argv(APP) == UP
    assert railway_deployments_argv(APP) == LIST
    assert railway_logs_argv(APP, 50) == ["railway", "logs", "--service", APP, "--lines", "50", "--json"]


def test_railway_json_is_dockerfile_build_with_health_check() -> None:
    config = render_railway_json()
    assert config["build"] == {"builder": "DOCKERFILE", "dockerfilePath": "Dockerfile"}
    assert config["deploy"]["healthcheckPath"] == "/health"
    assert config["deploy"]["restartPolicyType"] == "ON_FAILURE"


def test_railway_json_written_to_the_deploy_dir_parses_and_names_the_dockerfile(
    railway: FakeCliEnv, project_dir: Path
) -> None:
    ctx = context(railway, project_dir, env=SECRETS)
    written = RailwayAdapter().render_config(ctx)

    assert written == [ctx.deploy_dir / "railway.json", ctx.deploy_dir / ".railwayignore"]
    assert (ctx.deploy_dir / ".railwayignore").read_text() == "logs/\n"  # the deploy logs are not uploaded
    config = json.loads(written[0].read_text(encoding="utf-8"))  # what `railway up` uploads, from disk
    assert config == render_railway_json()
    assert config["$schema"] == "https://railway.com/railway.schema.json"
    assert config["build"] == {"builder": "DOCKERFILE", "dockerfilePath": "Dockerfile"}
    assert (ctx.deploy_dir / config["build"]["dockerfilePath"]).is_file()  # relative to the uploaded dir
    assert config["deploy"]["healthcheckPath"] == "/health"
    assert isinstance(config["deploy"]["healthcheckTimeout"], int)
    assert not any(value in written[0].read_text() for value in SECRETS.values())  # variables go via the CLI
    assert railway.calls() == []  # rendering runs nothing


def test_output_parsers() -> None:
    assert domain_from_output('{\n  "domain": "https://a.up.railway.app"\n}') == "https://a.up.railway.app"
    assert domain_from_output("Domains already exists on the service:\n🚀 https://b.up.railway.app\n") == (
        "https://b.up.railway.app"
    )
    assert domain_from_output("nothing here") is None
    assert deployment_from_up_output('{"deploymentId": "d-1", "logsUrl": "x"}') == "d-1"
    assert deployment_from_up_output(
        "  Build Logs: https://railway.com/project/p/service/s?id=0a1b2c3d-44&"
    ) == ("0a1b2c3d-44")
    assert deployment_from_up_output("Uploaded") is None


def dep(deployment_id: str, status: str, minute: int) -> dict[str, Any]:
    return {"id": deployment_id, "status": status, "createdAt": f"2025-01-01T00:{minute:02d}:00Z", "meta": {}}


@pytest.mark.parametrize(
    ("deployments", "wanted", "state", "healthy"),
    [
        ([dep("d2", "SUCCESS", 2), dep("d1", "REMOVED", 1)], None, "RUNNING", True),
        ([dep("d2", "BUILDING", 2), dep("d1", "SUCCESS", 1)], None, "DEPLOYING", True),
        (
            [dep("d2", "FAILED", 2), dep("d1", "SUCCESS", 1)],
            None,
            "RUNNING",
            True,
        ),  # the old one still serves
        ([dep("d1", "CRASHED", 1)], None, "FAILED", False),
        ([dep("d1", "REMOVED", 1)], None, "STOPPED", False),
        ([], None, "NOT_FOUND", False),
        ([dep("d2", "DEPLOYING", 2), dep("d1", "SUCCESS", 1)], "d2", "DEPLOYING", False),
        ([dep("d2", "SUCCESS", 2), dep("d1", "REMOVED", 1)], "d2", "RUNNING", True),
        ([dep("d2", "FAILED", 2), dep("d1", "SUCCESS", 1)], "d2", "FAILED", False),
    ],
)
def test_status_report_from_deployments(
    deployments: list[dict[str, Any]], wanted: str | None, state: str, healthy: bool
) -> None:
    report = railway_status_report(deployments, url="https://x", deployment_id=wanted)
    assert (report.state, report.healthy) == (state, healthy)


def test_rollback_target_is_the_deployment_before_the_live_one() -> None:
    history = [
        dep("d4", "FAILED", 4),
        dep("d3", "SUCCESS", 3),
        dep("d2", "CRASHED", 2),
        dep("d1", "REMOVED", 1),
    ]
    assert railway_rollback_target(history, None)["id"] == "d1"
    assert railway_rollback_target(history, "d1")["id"] == "d1"
    for impossible in ("d2", "d3", "nope"):
        with pytest.raises(DeployError) as caught:
            railway_rollback_target(history, impossible)
        assert caught.value.code == NO_PREVIOUS_DEPLOYMENT
    with pytest.raises(DeployError):
        railway_rollback_target([dep("d1", "SUCCESS", 1)], None)


# -- against the fake railway CLI ---------------------------------------------------------------------------------


def test_registry_loads_the_railway_adapter() -> None:
    adapter = load_adapter("host-b")
    assert isinstance(adapter, RailwayAdapter) and adapter.name == "host-b"


def test_first_deploy_creates_project_service_variables_and_domain(
    railway: FakeCliEnv, project_dir: Path
) -> None:
    ctx = context(railway, project_dir, env=SECRETS)
    adapter = RailwayAdapter()

    assert adapter.public_url(ctx) is None  # Railway names the domain when it creates it
    outcome, report = full_deploy(adapter, ctx)

    assert railway.argvs() == [
        WHOAMI,
        STATUS, INIT, STATUS, ADD, STATUS,
        PORT_ONLY, *(from_stdin(name) for name in SECRETS), DOMAIN,
        UP,
        LIST, LIST,
    ]  # fmt: skip
    calls = railway.calls()
    assert {c["cwd"] for c in calls[1:]} == {str(ctx.deploy_dir)}
    for name, value in SECRETS.items():
        (call,) = [c for c in calls if c["argv"] == from_stdin(name)]
        assert railway.stdin_of(call) == value
    world = railway.world("railway")
    assert world["variables"]["svc-2"] == {
        "PORT": {"value": "3001"},
        **{name: {"stdin_length": len(value)} for name, value in SECRETS.items()},
    }
    assert "volumes" not in world  # DATABASE_URL is set: no SQLite volume
    assert world["uploads"] == [
        {
            "service": APP,
            "files": [".dockerignore", ".railwayignore", "Dockerfile", "railway.json", "server.pyz"],
        }
    ]
    assert outcome.url == f"https://{HOST}" and outcome.sync_url == f"wss://{HOST}/offline-sync"
    assert outcome.deployment_id == "dep-0003"
    assert (report.state, report.healthy, report.deployment_id) == ("RUNNING", True, "dep-0003")
    assert ctx.state["project_id"] == "proj-1" and ctx.state["service_id"] == "svc-2"
    assert adapter.public_url(ctx) == f"https://{HOST}"


def test_first_deploy_without_database_url_keeps_sqlite_on_a_volume(
    railway: FakeCliEnv, project_dir: Path
) -> None:
    ctx = context(railway, project_dir, options={"workspace": "team"})
    railway.set_world("railway", {"workspaces": 2})
    RailwayAdapter().provision(ctx)

    # No RAILWAY_RUN_UID: the image itself starts as root and hands /data to its user (zipapp entry).
    sqlite_vars = ["--set", "PORT=3001", "--set", "OFFLINE_SERVER_DB=/data/offline-server.db"]
    assert railway.argvs() == [
        STATUS,
        [*INIT, "--workspace", "team"],
        STATUS,
        ADD,
        STATUS,
        VOLUME_LIST,
        ["railway", "volume", "--service", "svc-2", "add", "--mount-path", "/data"],  # the id, not the name
        VOLUME_LIST,
        ["railway", "variables", "--service", APP, *sqlite_vars, "--skip-deploys"],
        DOMAIN,
    ]
    assert railway.world("railway")["volumes"] == {"svc-2": "/data"}


VOLUME_LIST = ["railway", "volume", "--service", "svc-2", "list", "--json"]


def test_a_volume_missing_on_a_later_deploy_is_added_then_not_again(
    railway: FakeCliEnv, project_dir: Path
) -> None:
    """A first deploy whose volume step failed must not leave SQLite on a throwaway disk for good: every
    deploy checks the volume and adds it when missing (the old code only tried when it created the service)."""
    ctx = context(railway, project_dir)
    railway.set_world("railway", {})
    adapter = RailwayAdapter()
    ctx.state.update(adapter.provision(ctx))
    railway.update_world("railway", lambda w: w.update(volumes={}))  # as if that first add had failed
    railway.clear_calls()

    RailwayAdapter().provision(ctx)
    argvs = railway.argvs()
    assert ["railway", "volume", "--service", "svc-2", "add", "--mount-path", "/data"] in argvs
    assert railway.world("railway")["volumes"] == {"svc-2": "/data"}

    railway.clear_calls()
    RailwayAdapter().provision(ctx)
    assert not any(argv[:2] == ["railway", "volume"] and "add" in argv for argv in railway.argvs())


def test_a_volume_that_cannot_be_added_stops_the_deploy_after_one_retry(
    railway: FakeCliEnv, project_dir: Path
) -> None:
    ctx = context(railway, project_dir)
    railway.set_world("railway", {})
    adapter = RailwayAdapter()
    ctx.state.update(adapter.provision(ctx))
    railway.update_world("railway", lambda w: w.update(volumes={}, volume_error="Failed to create volume"))
    railway.clear_calls()
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().provision(ctx)
    adds = [argv for argv in railway.argvs() if argv[:2] == ["railway", "volume"] and "add" in argv]
    assert len(adds) == 2
    assert "did not add the volume at /data" in caught.value.message and "DATABASE_URL" in caught.value.hint
    assert "Failed to create volume" in caught.value.message


def test_the_fake_volume_command_panics_on_a_service_name_like_the_real_cli(
    railway: FakeCliEnv, project_dir: Path
) -> None:
    ctx = context(railway, project_dir)
    railway.set_world("railway", {})
    RailwayAdapter().provision(ctx)
    result = ctx.runner.run(
        railway_volume_add_argv(APP), cwd=ctx.deploy_dir if ctx.deploy_dir.is_dir() else ctx.project_dir
    )
    assert result.returncode == 101 and "panicked" in result.stderr


def test_redeploy_reuses_the_linked_project_and_service(railway: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(
        railway, project_dir, env={"DATABASE_URL": SECRETS["DATABASE_URL"]}, state=dict(LINKED_STATE)
    )
    railway.set_world("railway", linked_world(ctx, [deployment("dep-0001", "SUCCESS", 1)]))

    outcome, report = full_deploy(RailwayAdapter(), ctx)

    assert railway.argvs() == [WHOAMI, STATUS, PORT_ONLY, from_stdin("DATABASE_URL"), DOMAIN, UP, LIST, LIST]
    assert outcome.deployment_id == "dep-0011" and outcome.url == f"https://{HOST}"
    assert report.state == "RUNNING"
    statuses = {d["id"]: d["status"] for d in railway.world("railway")["deployments"]["svc-1"]}
    assert statuses == {"dep-0011": "SUCCESS", "dep-0001": "REMOVED"}


def test_a_directory_linked_elsewhere_is_relinked_to_the_known_project(
    railway: FakeCliEnv, project_dir: Path
) -> None:
    ctx = context(railway, project_dir, env={"DATABASE_URL": "postgres://x"}, state=dict(LINKED_STATE))
    world = linked_world(ctx, [])
    world["projects"]["proj-9"] = {"id": "proj-9", "name": "other", "environments": [], "services": []}
    world["links"] = {str(ctx.project_dir): {"project": "proj-9", "environment": "env-9", "service": None}}
    railway.set_world("railway", world)

    RailwayAdapter().provision(ctx)

    assert railway.argvs()[:3] == [
        STATUS,
        ["railway", "link", "--project", "proj-1", "--environment", "env-1"],
        STATUS,
    ]


def test_status_shows_deploying_while_a_new_deployment_builds(railway: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(railway, project_dir, state=dict(LINKED_STATE))
    railway.set_world(
        "railway",
        linked_world(ctx, [deployment("dep-0002", "BUILDING", 2, ["DEPLOYING", "SUCCESS"]),
                           deployment("dep-0001", "SUCCESS", 1)]),
    )  # fmt: skip
    adapter = RailwayAdapter()

    during = adapter.status(ctx)
    after = adapter.status(ctx)

    assert (during.state, during.healthy, during.deployment_id) == ("DEPLOYING", True, "dep-0002")
    assert during.details["live"] == "dep-0001" and during.url == f"https://{HOST}"
    assert (after.state, after.healthy, after.details["live"]) == ("RUNNING", True, "dep-0002")
    assert railway.argvs() == [LIST, LIST]


def test_status_before_anything_is_linked(railway: FakeCliEnv, project_dir: Path) -> None:
    report = RailwayAdapter().status(context(railway, project_dir))
    assert (report.state, report.healthy) == ("NOT_FOUND", False)


def test_wait_stops_when_the_deployment_fails(railway: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(railway, project_dir, state=dict(LINKED_STATE))
    railway.set_world(
        "railway",
        linked_world(
            ctx, [deployment("dep-0002", "BUILDING", 2, ["FAILED"]), deployment("dep-0001", "SUCCESS", 1)]
        ),
    )
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().wait_until_healthy(
            ctx, DeployOutcome(url=f"https://{HOST}", deployment_id="dep-0002")
        )
    assert caught.value.code == PLATFORM_ERROR
    assert "ended as FAILED" in caught.value.message and "railway logs --build dep-0002" in caught.value.hint
    assert railway.argvs() == [LIST]


def test_logs_are_the_requested_number_of_lines(railway: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(railway, project_dir, state=dict(LINKED_STATE))
    entries = [
        {"timestamp": f"2025-01-01T00:00:0{i}Z", "message": f"line {i}", "level": "info"} for i in range(4)
    ]
    railway.set_world("railway", linked_world(ctx, [], logs={"svc-1": entries}))

    lines = RailwayAdapter().logs(ctx, lines=2)

    assert lines == ["2025-01-01T00:00:02Z line 2", "2025-01-01T00:00:03Z line 3"]
    assert railway.argvs() == [["railway", "logs", "--service", APP, "--lines", "2", "--json"]]


def test_deployments_list_marks_the_live_one(railway: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(railway, project_dir, state=dict(LINKED_STATE))
    railway.set_world(
        "railway",
        linked_world(ctx, [deployment("dep-0002", "FAILED", 2), deployment("dep-0001", "SUCCESS", 1)]),
    )
    listed = RailwayAdapter().deployments(ctx)
    assert [(d.id, d.status, d.current) for d in listed] == [
        ("dep-0002", "FAILED", False),
        ("dep-0001", "SUCCESS", True),
    ]
    assert railway.argvs() == [LIST]


# -- rollback through the GraphQL API -------------------------------------------------------------------------------


def rollback_world(ctx: DeployContext) -> dict[str, Any]:
    return linked_world(
        ctx,
        [
            deployment("dep-0003", "SUCCESS", 3),
            deployment("dep-0002", "FAILED", 2),
            deployment("dep-0001", "REMOVED", 1),
        ],
    )


def api_context(
    fake: FakeCliEnv, project_dir: Path, api: FakeRailwayApi, token: dict[str, str]
) -> DeployContext:
    return context(fake, project_dir, env={API_URL_ENV: api.url, **token}, state=dict(LINKED_STATE))


def test_rollback_posts_deployment_rollback_with_the_account_token(
    railway: FakeCliEnv, project_dir: Path, fake_railway_api: FakeRailwayApi
) -> None:
    ctx = api_context(railway, project_dir, fake_railway_api, {"RAILWAY_API_TOKEN": "test-api-token"})
    railway.set_world("railway", rollback_world(ctx))
    adapter = RailwayAdapter()

    outcome = adapter.rollback(ctx)
    report = adapter.wait_until_healthy(ctx, outcome)

    (request,) = fake_railway_api.requests
    assert request.path == "/graphql/v2"
    assert request.headers["authorization"] == "Bearer test-api-token"
    assert request.headers["content-type"] == "application/json"
    assert request.body == {"query": ROLLBACK_MUTATION, "variables": {"id": "dep-0001"}}
    assert railway.argvs() == [LIST, LIST, LIST]
    assert outcome.deployment_id == "dep-0011" and outcome.url == f"https://{HOST}"
    assert (report.state, report.deployment_id) == ("RUNNING", "dep-0011")


def test_rollback_to_a_named_deployment_with_a_project_token(
    railway: FakeCliEnv, project_dir: Path, fake_railway_api: FakeRailwayApi
) -> None:
    ctx = api_context(railway, project_dir, fake_railway_api, {"RAILWAY_TOKEN": "test-project-token"})
    railway.set_world("railway", rollback_world(ctx))

    RailwayAdapter().rollback(ctx, "dep-0001")

    (request,) = fake_railway_api.requests
    assert request.headers["project-access-token"] == "test-project-token"
    assert "authorization" not in request.headers
    assert request.body["variables"] == {"id": "dep-0001"}


def test_rollback_with_nothing_before_the_live_deployment(
    railway: FakeCliEnv, project_dir: Path, fake_railway_api: FakeRailwayApi
) -> None:
    ctx = api_context(railway, project_dir, fake_railway_api, {"RAILWAY_API_TOKEN": "test-api-token"})
    railway.set_world("railway", linked_world(ctx, [deployment("dep-0001", "SUCCESS", 1)]))
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().rollback(ctx)
    assert caught.value.code == NO_PREVIOUS_DEPLOYMENT
    assert railway.argvs() == [LIST] and fake_railway_api.requests == []


def test_rollback_without_a_token_touches_nothing(
    railway: FakeCliEnv, project_dir: Path, fake_railway_api: FakeRailwayApi
) -> None:
    ctx = api_context(railway, project_dir, fake_railway_api, {})
    railway.set_world("railway", rollback_world(ctx))
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().rollback(ctx)
    assert caught.value.code == NOT_AUTHENTICATED
    assert "RAILWAY_API_TOKEN" in caught.value.message and "railway.com/account/tokens" in caught.value.hint
    assert railway.calls() == [] and fake_railway_api.requests == []


def test_rollback_with_a_refused_token(
    railway: FakeCliEnv, project_dir: Path, fake_railway_api: FakeRailwayApi
) -> None:
    ctx = api_context(railway, project_dir, fake_railway_api, {"RAILWAY_API_TOKEN": "wrong-token-value"})
    railway.set_world("railway", rollback_world(ctx))
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().rollback(ctx)
    assert caught.value.code == NOT_AUTHENTICATED
    assert "wrong-token-value" not in str(caught.value)


# -- errors ------------------------------------------------------------------------------------------------------


def test_missing_cli_says_how_to_install_it(fake_cli: FakeCliEnv, project_dir: Path) -> None:
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().check_prerequisites(context(fake_cli, project_dir))
    assert caught.value.code == CLI_NOT_INSTALLED
    assert "host CLI required but not installed" in caught.value.message
    assert "npm install -g @railway/cli" in caught.value.hint


def test_not_logged_in_says_how_to_log_in(railway: FakeCliEnv, project_dir: Path) -> None:
    railway.set_world("railway", {"logged_in": False})
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().check_prerequisites(context(railway, project_dir))
    assert caught.value.code == NOT_AUTHENTICATED
    assert "cloud CLI is not authenticated" in caught.value.message
    assert "railway login" in caught.value.hint and "RAILWAY_TOKEN" in caught.value.hint


def test_a_project_token_needs_no_whoami(railway: FakeCliEnv, project_dir: Path) -> None:
    railway.set_world("railway", {"logged_in": False})
    RailwayAdapter().check_prerequisites(context(railway, project_dir, env={"RAILWAY_TOKEN": "tok"}))
    assert railway.argvs() == [WHOAMI]


def test_several_workspaces_without_one_chosen(railway: FakeCliEnv, project_dir: Path) -> None:
    railway.set_world("railway", {"workspaces": 2})
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().provision(context(railway, project_dir))
    assert caught.value.code == PLATFORM_ERROR
    assert "--workspace" in caught.value.message  # Railway's words
    assert f"railway init --name {APP} --workspace" in caught.value.hint


def test_a_failed_upload_reports_railways_words(railway: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(railway, project_dir, state=dict(LINKED_STATE))
    railway.set_world("railway", linked_world(ctx, [], up_error="Failed to upload code with status code 413"))
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().deploy(ctx)
    assert caught.value.code == PLATFORM_ERROR
    assert "status code 413" in caught.value.message


def test_deployment_id_from_the_list_when_up_prints_none(railway: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(railway, project_dir, state=dict(LINKED_STATE))
    railway.set_world("railway", linked_world(ctx, [deployment("dep-0001", "SUCCESS", 1)], up_quiet=True))
    outcome = RailwayAdapter().deploy(ctx)
    assert outcome.deployment_id == "dep-0011"
    assert railway.argvs() == [UP, LIST]


def test_an_outdated_railway_cli_is_asked_to_update(fake_cli: FakeCliEnv, project_dir: Path) -> None:
    fake_cli.install("railway", "tests.deploy.fakes.outdated_cli")
    with pytest.raises(DeployError) as caught:
        RailwayAdapter().deployments(context(fake_cli, project_dir, state=dict(LINKED_STATE)))
    assert caught.value.code == PLATFORM_ERROR
    assert "unexpected argument '--service'" in caught.value.message
    assert "npm install -g @railway/cli@latest" in caught.value.hint


# -- secrets (`offline deploy --reset` never runs the CLI: test_deploy_integration.py) ----------------------------


def test_secret_values_reach_railway_only_through_stdin(railway: FakeCliEnv, project_dir: Path) -> None:
    ctx = context(railway, project_dir, env=SECRETS)
    outcome, report = full_deploy(RailwayAdapter(), ctx)

    assert isinstance(ctx.reporter, ListReporter)
    exposed = [
        railway.recorded_text(),
        json.dumps(railway.world("railway")),
        json.dumps(outcome.state),
        json.dumps(ctx.state),
        json.dumps(report.details),
        *(str(event) for event in ctx.reporter.events),
        *(path.read_text(errors="replace") for path in ctx.deploy_dir.rglob("*") if path.is_file()),
    ]
    for value in SECRETS.values():
        assert all(value not in text for text in exposed)
    stdin_files = list((railway.state_dir / "stdin").iterdir())
    assert sorted(path.read_text() for path in stdin_files) == sorted(SECRETS.values())
