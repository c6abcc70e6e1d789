"""``--platform render`` (web-service-host) against a loopback fake of Render's REST API that refuses
undocumented fields (tests/deploy/fakes/render_api.py). The image build and push go to a recording engine
(the real engine's registry push is covered by tests/deploy/test_image_registry.py against a real registry).

Adapter-level tests drive the calls in the order the deploy command makes them; the command-level ones at
the end go through `offline deploy` itself (plan, admin token, output, deploy.json)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from offline_cli.deploy.flow import plan_secrets
from offline_cli.deploy.state import load_state
from platform_adapters import load_adapter
from platform_adapters.base import DeployContext, DeployError, DeployOutcome, StatusReport
from platform_adapters.render import RenderAdapter, credential_for_host
from platform_adapters.render_api import create_service_body
from tests.deploy.fakes.render_api import FakeRenderApi, serve

from ._aws_support import AUTH_SECRET, DATABASE_URL, SECRETS, FakeEngine, make_context, reporter_of
from .conftest import SERVER_SETTINGS
from .test_deploy_integration import Cli
from .test_deploy_integration import deploy_cli as deploy_cli_fixture  # noqa: F401 - the fixture, reused

REGISTRY = "ghcr.io/my-team"
KEY = FakeRenderApi.accepted_key


@pytest.fixture
def render_api() -> Iterator[FakeRenderApi]:
    with serve(FakeRenderApi()) as api:
        yield api


def context(
    tmp_path: Path,
    api: FakeRenderApi,
    *,
    state: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    key: str = KEY,
    sqlite: bool = False,
    engine: FakeEngine | None = None,
    deploying: bool = True,
) -> DeployContext:
    env = {"RENDER_API_KEY": key, "OFFLINE_RENDER_API_URL": api.url}
    if not sqlite:
        env["DATABASE_URL"] = DATABASE_URL
    ctx = make_context(
        tmp_path,
        env=env,
        state=state,
        options={"registry": REGISTRY, **(options or {})},
        engine=engine,
        region="oregon",
        with_secrets=False,
    )
    ctx.env = {**ctx.env, "AUTH_SECRET": AUTH_SECRET}
    ctx.app = "notes"
    if not deploying:
        ctx.engine = None  # status, logs and rollback get no engine
    return ctx


def deploy(ctx: DeployContext) -> tuple[RenderAdapter, DeployOutcome, StatusReport]:
    """The adapter calls of one `offline deploy`, in the command's order, carrying state as it does."""
    adapter = load_adapter("render")
    assert isinstance(adapter, RenderAdapter)
    adapter.check_prerequisites(ctx)
    ctx.env = plan_secrets(ctx.env, adapter.existing_secrets(ctx)).env
    adapter.planned_resources(ctx)
    ctx.state.update(adapter.provision(ctx))
    adapter.public_url(ctx)
    adapter.render_config(ctx)
    outcome = adapter.deploy(ctx)
    ctx.state.update(outcome.state)
    report = adapter.wait_until_healthy(ctx, outcome)
    return adapter, outcome, report


def fresh(ctx: DeployContext, **changes: Any) -> DeployContext:
    """The next command's context: same project and deploy.json state, a new reporter, the shell's
    environment (without the admin token the earlier deploy generated: the shell never had it)."""
    from ._aws_support import RecordingReporter

    shell = {name: value for name, value in ctx.env.items() if name != "OFFLINE_ADMIN_TOKEN"}
    return replace(ctx, state=dict(ctx.state), reporter=RecordingReporter(), env=shell, **changes)


# -- first deploy and redeploy -------------------------------------------------------------------------------------


def test_first_deploy_pushes_the_image_and_creates_an_image_backed_web_service(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    engine = FakeEngine()
    ctx = context(tmp_path, render_api, sqlite=True, engine=engine)
    _, outcome, report = deploy(ctx)

    reference = f"{REGISTRY}/notes:{'ab' * 6}"
    assert [call[0] for call in engine.calls] == ["ping", "build", "image_platform", "tag", "push"]
    assert engine.calls[3] == ("tag", "offline-notes:latest", reference)
    assert engine.calls[4][1:] == (reference, None, None)  # the engine's own login: no credentials passed

    (body,) = render_api.bodies("POST", "/v1/services")
    assert body["type"] == "web_service" and body["name"] == "notes" and body["ownerId"] == "tea-owner1"
    assert body["image"] == {
        "ownerId": "tea-owner1",
        "imagePath": reference,
        "registryCredentialId": "rgc-ghcr1",
    }
    details = body["serviceDetails"]
    assert details["runtime"] == "image" and details["healthCheckPath"] == "/health"
    assert details["disk"] == {"name": "offline-data", "mountPath": "/data", "sizeGB": 1}
    assert details["plan"] == "starter" and details["region"] == "oregon"
    env = {item["key"]: item["value"] for item in body["envVars"]}
    assert env["PORT"] == "3001" and env["OFFLINE_SERVER_DB"] == "/data/offline-server.db"
    assert env["AUTH_SECRET"] == AUTH_SECRET and len(env["OFFLINE_ADMIN_TOKEN"]) >= 40

    assert (
        outcome.url == "https://notes.onrender.com"
        and outcome.sync_url == "wss://notes.onrender.com/offline-sync"
    )
    assert (report.state, report.healthy, report.deployment_id) == ("RUNNING", True, outcome.deployment_id)
    service = render_api.service_named("notes")
    assert ctx.state["service_id"] == service["id"] and ctx.state["owner_id"] == "tea-owner1"
    said = reporter_of(ctx).text()
    # The wait shows what Render reports, each state once.
    assert f"Render deploy {outcome.deployment_id}: update_in_progress" in said
    assert f"Render deploy {outcome.deployment_id}: live" in said
    assert "Render disk offline-data (1 GB) at /data" in "\n".join(RenderAdapter().planned_resources(ctx))


def test_the_servers_auth_and_email_settings_become_service_variables(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    ctx = context(tmp_path, render_api, sqlite=True)
    ctx.env = {**ctx.env, **SERVER_SETTINGS}
    deploy(ctx)
    (body,) = render_api.bodies("POST", "/v1/services")
    env = {item["key"]: item["value"] for item in body["envVars"]}
    assert {name: env.get(name) for name in SERVER_SETTINGS} == SERVER_SETTINGS


def test_redeploy_sets_variables_one_by_one_and_starts_a_deploy_of_the_new_image(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    first = context(tmp_path, render_api)
    _, first_outcome, _ = deploy(first)
    service_id = first.state["service_id"]
    token = render_api.env_vars[service_id]["OFFLINE_ADMIN_TOKEN"]
    render_api.requests.clear()

    second = fresh(first, engine=FakeEngine())
    second.env = {**second.env, "AUTH_SECRET": "rotated-auth-secret-value-0001"}
    _, outcome, report = deploy(second)

    assert render_api.bodies("POST", "/v1/services") == []
    (deploy_body,) = render_api.bodies("POST", f"/v1/services/{service_id}/deploys")
    assert deploy_body == {"imageUrl": f"{REGISTRY}/notes:{'ab' * 6}"}
    put = {r.path.rsplit("/", 1)[1]: r.body for r in render_api.requests if r.method == "PUT"}
    assert put["AUTH_SECRET"] == {"value": "rotated-auth-secret-value-0001"}
    assert "OFFLINE_ADMIN_TOKEN" not in put  # kept on Render, never sent again
    assert render_api.env_vars[service_id]["OFFLINE_ADMIN_TOKEN"] == token
    assert (report.state, report.healthy) == ("RUNNING", True)
    statuses = [d["status"] for d in render_api.deploys[service_id]]
    assert statuses == ["live", "deactivated"] and outcome.deployment_id != first_outcome.deployment_id


def test_a_redeploy_to_another_registry_points_the_service_at_it_first(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    first = context(tmp_path, render_api)
    deploy(first)
    second = fresh(first, engine=FakeEngine(), options={"registry": "docker.io/someone"})
    render_api.registry_credentials.append(
        {
            "id": "rgc-hub",
            "name": "hub",
            "registry": "DOCKER",
            "username": "someone",
            "updatedAt": "2026-01-01T00:00:00Z",
        }
    )
    deploy(second)
    service = render_api.service_named("notes")
    (patch,) = [b for b in render_api.bodies("PATCH", f"/v1/services/{service['id']}") if "image" in b]
    assert patch["image"]["imagePath"].startswith("docker.io/someone/notes:")
    assert patch["image"]["registryCredentialId"] == "rgc-hub"


def test_a_redeploy_of_a_service_without_a_disk_adds_one_for_sqlite(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    first = context(tmp_path, render_api)  # DATABASE_URL: no disk
    deploy(first)
    service = render_api.service_named("notes")
    assert "disk" not in service["serviceDetails"]
    second = fresh(first, engine=FakeEngine())
    second.env = {k: v for k, v in second.env.items() if k != "DATABASE_URL"}
    deploy(second)
    (disk,) = render_api.bodies("POST", "/v1/disks")
    assert disk == {"name": "offline-data", "mountPath": "/data", "sizeGB": 1, "serviceId": service["id"]}
    assert render_api.env_vars[service["id"]]["OFFLINE_SERVER_DB"] == "/data/offline-server.db"


def test_after_a_reset_the_deploy_finds_its_service_by_name_instead_of_creating_another(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    first = context(tmp_path, render_api)
    deploy(first)
    again = context(tmp_path, render_api, engine=FakeEngine())  # deploy.json gone: no state
    _, outcome, _ = deploy(again)
    assert len(render_api.bodies("POST", "/v1/services")) == 1
    assert again.state["service_id"] == render_api.service_named("notes")["id"]
    assert "Found the Render web service notes" in reporter_of(again).text()
    assert outcome.url == "https://notes.onrender.com"


# -- status, logs, rollback ------------------------------------------------------------------------------------------


def test_status_comes_from_the_service_and_its_latest_deploy(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    ctx = context(tmp_path, render_api)
    _, outcome, _ = deploy(ctx)
    adapter = RenderAdapter()
    report = adapter.status(fresh(ctx, engine=None))
    assert (report.state, report.healthy, report.deployment_id) == ("RUNNING", True, outcome.deployment_id)
    assert report.url == "https://notes.onrender.com"
    assert report.details["region"] == "oregon" and report.details["dashboard"].startswith(
        "https://dashboard"
    )

    service_id = ctx.state["service_id"]
    render_api.deploys[service_id].insert(
        0, {"id": "dep-9999", "status": "update_in_progress", "createdAt": "2026-03-02T00:00:00Z"}
    )
    report = RenderAdapter().status(fresh(ctx, engine=None))
    assert (report.state, report.healthy) == ("DEPLOYING", True)  # the live deploy still serves

    render_api.deploys[service_id][0]["status"] = "update_failed"
    report = RenderAdapter().status(fresh(ctx, engine=None))
    assert (report.state, report.deployment_id) == ("RUNNING", outcome.deployment_id)
    assert report.details["latest"] == {"id": "dep-9999", "status": "update_failed"}

    render_api.services[service_id]["suspended"] = "suspended"
    assert RenderAdapter().status(fresh(ctx, engine=None)).state == "STOPPED"
    del render_api.services[service_id]
    assert RenderAdapter().status(fresh(ctx, engine=None)).state == "NOT_FOUND"


def test_logs_come_from_the_logs_api_oldest_first_across_pages(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    ctx = context(tmp_path, render_api)
    deploy(ctx)
    service_id = ctx.state["service_id"]
    for number in range(1, 151):
        render_api._log(service_id, f"request {number}")
    lines = RenderAdapter().logs(fresh(ctx, engine=None), lines=120)
    assert len(lines) == 120
    assert lines[-1].endswith("request 150") and lines[0].endswith("request 31")
    log_queries = [dict(r.query) for r in render_api.requests if r.path == "/v1/logs"]
    assert [q["limit"] for q in log_queries] == ["100", "20"] and "endTime" in log_queries[1]
    assert all(q["resource"] == service_id and q["ownerId"] == "tea-owner1" for q in log_queries)
    assert RenderAdapter().logs(fresh(ctx, engine=None), lines=0) == []


def test_rollback_returns_to_the_deploy_before_the_live_one(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    first = context(tmp_path, render_api)
    _, first_outcome, _ = deploy(first)
    second = fresh(first, engine=FakeEngine())
    deploy(second)
    service_id = first.state["service_id"]

    ctx = fresh(second, engine=None)
    adapter = RenderAdapter()
    history = adapter.deployments(ctx)
    assert [d.status for d in history] == ["live", "deactivated"] and history[0].current
    outcome = adapter.rollback(ctx, None)
    assert render_api.bodies("POST", f"/v1/services/{service_id}/rollback") == [
        {"deployId": first_outcome.deployment_id}
    ]
    report = adapter.wait_until_healthy(ctx, outcome)
    assert (report.state, report.healthy, report.deployment_id) == ("RUNNING", True, outcome.deployment_id)
    assert [d["status"] for d in render_api.deploys[service_id]] == ["live", "deactivated", "deactivated"]

    with pytest.raises(DeployError) as caught:
        RenderAdapter().rollback(fresh(ctx), "dep-nope")
    assert (
        caught.value.code == "NO_PREVIOUS_DEPLOYMENT" and first_outcome.deployment_id in caught.value.message
    )


# -- what goes wrong ---------------------------------------------------------------------------------------------------


def test_a_refused_api_key_is_not_authenticated_with_where_to_get_one(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    wrong = "rnd_wrong_key_value_42"
    ctx = context(tmp_path, render_api, key=wrong)
    with pytest.raises(DeployError) as caught:
        deploy(ctx)
    error = caught.value
    assert (
        error.code == "NOT_AUTHENTICATED"
        and "HTTP 401" in error.message
        and "RENDER_API_KEY" in error.message
    )
    assert "Account Settings > API Keys" in error.hint
    assert wrong not in str(error) and wrong not in json.dumps(error.context)
    assert render_api.calls() == ["GET /v1/owners"]  # refused before anything was built or created

    unset = context(tmp_path, render_api, key="")
    with pytest.raises(DeployError) as caught:
        deploy(unset)
    assert caught.value.code == "NOT_AUTHENTICATED" and "RENDER_API_KEY is not set" in caught.value.message


def test_a_name_taken_by_another_service_is_refused_with_what_to_do(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    render_api.add_service("notes", service_type="static_site")
    engine = FakeEngine()
    with pytest.raises(DeployError) as caught:
        deploy(context(tmp_path, render_api, engine=engine))
    error = caught.value
    assert error.code == "NAME_TAKEN" and "name has already been taken" in error.message
    assert "--app" in error.hint
    assert ("build",) not in [call[:1] for call in engine.calls]
    assert render_api.bodies("POST", "/v1/services") == []


def test_a_409_from_render_is_name_taken(tmp_path: Path, render_api: FakeRenderApi) -> None:
    # Another service took the name between the lookup and the creation.
    ctx = context(tmp_path, render_api)
    adapter = RenderAdapter()
    adapter.check_prerequisites(ctx)
    ctx.state.update(adapter.provision(ctx))
    render_api.add_service("notes", service_type="web_service", image="docker.io/other/notes:1")
    with pytest.raises(DeployError) as caught:
        adapter.deploy(ctx)
    assert caught.value.code == "NAME_TAKEN" and "HTTP 409" in caught.value.message
    assert "--app" in caught.value.hint


def test_a_failed_deploy_shows_its_log_lines_with_secrets_masked(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    render_api.fail_next_deploy = [
        "Traceback (most recent call last):",
        f"RuntimeError: cannot connect to {DATABASE_URL}",
        "==> Exited with status 1",
    ]
    ctx = context(tmp_path, render_api)
    with pytest.raises(DeployError) as caught:
        deploy(ctx)
    error = caught.value
    assert error.code == "PLATFORM_ERROR" and "ended as update_failed" in error.message
    assert "Traceback (most recent call last):" in error.message and "Exited with status 1" in error.message
    assert "RuntimeError: cannot connect to ***" in error.message
    assert all(secret not in str(error) for secret in SECRETS)
    assert "offline deploy" in error.hint


def test_missing_registry_and_ambiguous_workspace_name_their_flags(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    ctx = context(tmp_path, render_api, options={"registry": None})
    with pytest.raises(DeployError) as caught:
        deploy(ctx)
    assert caught.value.code == "MISSING_OPTION" and caught.value.context["option"] == "--registry"
    assert render_api.requests == []  # a flag is checked before the API

    render_api.owners.append({"id": "usr-me", "name": "Me", "email": "me@example.com", "type": "user"})
    with pytest.raises(DeployError) as caught:
        deploy(context(tmp_path, render_api))
    assert caught.value.code == "MISSING_OPTION" and caught.value.context["option"] == "--workspace"
    assert "My Team (tea-owner1)" in caught.value.message
    deploy(context(tmp_path, render_api, options={"workspace": "Me"}))
    assert (
        render_api.service_named("notes")["ownerId"] == "tea-owner1"
    )  # the fake's services live in the first
    assert render_api.bodies("POST", "/v1/services")[0]["ownerId"] == "usr-me"


def test_the_registry_credential_is_picked_by_name_or_by_registry_host(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    hub = {
        "id": "rgc-hub",
        "name": "hub",
        "registry": "DOCKER",
        "username": "x",
        "updatedAt": "2026-01-01T00:00:00Z",
    }
    assert (
        credential_for_host([hub, *render_api.registry_credentials], "ghcr.io")
        == render_api.registry_credentials
    )
    assert credential_for_host([hub], "docker.io") == [hub]
    assert credential_for_host([hub], "registry.example.com:5000") == []

    render_api.registry_credentials.append(hub)
    deploy(context(tmp_path, render_api, options={"registry_credential": "hub", "registry": "docker.io/me"}))
    assert render_api.bodies("POST", "/v1/services")[0]["image"]["registryCredentialId"] == "rgc-hub"

    with pytest.raises(DeployError) as caught:
        RenderAdapter().check_prerequisites(
            context(tmp_path, render_api, options={"registry_credential": "nope"})
        )
    assert (
        "no registry credential named 'nope'" in caught.value.message and "ghcr-bot" in caught.value.message
    )

    ctx = context(tmp_path, render_api, options={"registry": "registry.example.com:5000/apps"})
    adapter = RenderAdapter()
    adapter.check_prerequisites(ctx)
    assert "repository must be public" in reporter_of(ctx).text()


def test_the_service_body_is_what_render_documents() -> None:
    body = create_service_body(
        name="notes",
        owner_id="tea-1",
        image={"ownerId": "tea-1", "imagePath": "ghcr.io/t/notes:1"},
        env={"PORT": "3001"},
        region=None,
        plan="starter",
        health_check_path="/health",
        disk=None,
    )
    assert body == {
        "type": "web_service",
        "name": "notes",
        "ownerId": "tea-1",
        "image": {"ownerId": "tea-1", "imagePath": "ghcr.io/t/notes:1"},
        "envVars": [{"key": "PORT", "value": "3001"}],
        "serviceDetails": {
            "runtime": "image",
            "plan": "starter",
            "healthCheckPath": "/health",
            "numInstances": 1,
        },
    }


def test_the_fake_refuses_undocumented_fields(tmp_path: Path, render_api: FakeRenderApi) -> None:
    from platform_adapters.render_api import RenderApi

    api = RenderApi(KEY, render_api.url)
    with pytest.raises(DeployError) as caught:
        api.request(
            "POST",
            "/services",
            body={"type": "web_service", "name": "x", "ownerId": "tea-owner1", "port": 3001},
        )
    assert "HTTP 400" in caught.value.message and "unknown field(s) port" in caught.value.message
    with pytest.raises(DeployError) as caught:
        api.request("GET", "/services", params={"nme": "x"})
    assert "unknown query parameter(s) nme" in caught.value.message


def test_secrets_and_the_api_key_stay_out_of_files_state_and_output(
    tmp_path: Path, render_api: FakeRenderApi
) -> None:
    ctx = context(tmp_path, render_api)
    _, outcome, _ = deploy(ctx)
    token = render_api.env_vars[ctx.state["service_id"]]["OFFLINE_ADMIN_TOKEN"]
    secrets = (*SECRETS, token, KEY)
    said = reporter_of(ctx).text() + json.dumps(ctx.state) + json.dumps(outcome.state)
    assert all(secret not in said for secret in secrets)
    for path in ctx.project_dir.rglob("*"):
        if path.is_file():
            assert all(secret.encode() not in path.read_bytes() for secret in secrets), path
    # The key travels only in the Authorization header, never in a URL.
    assert all(KEY not in f"{r.path}?{r.query}" for r in render_api.requests)


# -- through `offline deploy` ----------------------------------------------------------------------------------------


@pytest.fixture
def render_cli(request: pytest.FixtureRequest, render_api: FakeRenderApi, tmp_path: Path) -> Cli:
    """`offline deploy` as in test_deploy_integration (its ``deploy_cli``, imported here under another
    name), with Render's key and fake API and a recording engine."""
    deploy_cli: Cli = request.getfixturevalue("deploy_cli_fixture")
    deploy_cli.env = {
        "PATH": str(tmp_path / "empty-bin"),
        "HOME": str(tmp_path / "home"),
        "RENDER_API_KEY": KEY,
        "OFFLINE_RENDER_API_URL": render_api.url,
        "AUTH_SECRET": AUTH_SECRET,
    }
    deploy_cli.overrides = {
        "engine_factory": lambda env: FakeEngine(),
        "sleep": lambda seconds: None,
        "health_timeout": 3.0,
        "poll_interval": 1.0,
    }
    return deploy_cli


FIRST = ("--platform", "render", "--app", "notes", "--registry", REGISTRY, "--confirm")


def _everything_shown(cli: Cli, *runs: Any) -> str:
    """All the user saw, plus every file of the project (deploy.json, the run logs)."""
    files = [p.read_text(errors="replace") for p in cli.project.rglob("*") if p.is_file()]
    return "\n".join([*(f"{run.stdout}\n{run.stderr}" for run in runs), *files])


def test_offline_deploy_to_render_then_status_logs_rollback_and_reset(
    render_cli: Cli, render_api: FakeRenderApi
) -> None:
    first = render_cli(*FIRST, "--json")
    assert first.exit_code == 0, first.stderr
    result = json.loads(first.stdout)
    assert (result["platform"], result["vendor"], result["url"], result["sync_url"]) == (
        "web-service-host",
        "Render",
        "https://notes.onrender.com",
        "wss://notes.onrender.com/offline-sync",
    )
    assert (result["state"], result["healthy"]) == ("RUNNING", True)
    # The plan said what Render gets before anything was created.
    assert "Render web service notes (when missing): image-backed, instance type starter" in first.stderr
    assert "Render disk offline-data (1 GB) at /data" in first.stderr
    assert "with the registry credential ghcr-bot" in first.stderr
    service = render_api.service_named("notes")
    token = render_api.env_vars[service["id"]]["OFFLINE_ADMIN_TOKEN"]
    assert first.stderr.count(token) == 1 and "Admin token" in first.stderr and token not in first.stdout
    state = load_state(render_cli.project)
    assert state is not None and state.platform == "web-service-host"
    assert state.options == {"registry": REGISTRY} and state.adapter["service_id"] == service["id"]
    assert render_cli.probes == ["https://notes.onrender.com/health"]
    # Render's log lines of the deploy went into the run's log file as they came.
    (run_log,) = (render_cli.project / ".offline" / "deploy" / "logs").glob("*.log")
    assert f"==> Pulling image {REGISTRY}/notes:" in run_log.read_text()
    assert "==> Your service is live" in run_log.read_text()

    second = render_cli("--confirm")  # a redeploy: registry and service remembered
    assert second.exit_code == 0, second.stderr
    assert "OFFLINE_ADMIN_TOKEN (already set on the platform)" in second.stderr
    assert token not in second.stderr and "Admin token" not in second.stderr
    assert len(render_api.bodies("POST", "/v1/services")) == 1
    assert len(render_api.bodies("POST", f"/v1/services/{service['id']}/deploys")) == 1

    status = render_cli("status", "--json")
    assert status.exit_code == 0, status.stderr
    report = json.loads(status.stdout)
    assert (report["state"], report["healthy"], report["admin_protected"]) == ("RUNNING", True, True)

    render_api._log(service["id"], "GET /health 200")
    logs = render_cli("logs", "--lines", "2")
    assert logs.exit_code == 0, logs.stderr
    assert logs.stdout.splitlines()[-1].endswith("GET /health 200")

    rollback = render_cli("rollback", "--confirm", "--json")
    assert rollback.exit_code == 0, rollback.stderr
    back = render_api.deploys[service["id"]][0]
    assert back["trigger"] == "rollback" and back["status"] == "live"
    assert json.loads(rollback.stdout)["deployment_id"] == back["id"]

    shown = _everything_shown(render_cli, first, second, status, logs, rollback)
    for secret in (AUTH_SECRET, KEY):
        assert secret not in shown
    assert shown.count(token) == 1  # the one display of the first deploy, in no file or later output

    render_api.requests.clear()
    reset = render_cli("--reset", "--confirm")
    assert reset.exit_code == 0, reset.stderr
    assert render_api.requests == []  # the service keeps running; Render is not called
    assert "left running" in reset.stderr


def test_offline_deploy_errors_for_render_say_what_to_do(render_cli: Cli, render_api: FakeRenderApi) -> None:
    missing = render_cli("--platform", "render", "--app", "notes", "--confirm", "--json")
    assert missing.exit_code == 1
    error = json.loads(missing.stdout)["error"]
    assert error["code"] == "MISSING_OPTION" and "--registry" in error["message"]

    render_cli.env["RENDER_API_KEY"] = "rnd_revoked_key_000"
    refused = render_cli(*FIRST)
    assert refused.exit_code == 1
    assert "error [NOT_AUTHENTICATED]" in refused.stderr and "HTTP 401" in refused.stderr
    assert "hint:" in refused.stderr and "RENDER_API_KEY" in refused.stderr
    assert "rnd_revoked_key_000" not in refused.stderr + refused.stdout

    render_cli.env["RENDER_API_KEY"] = KEY
    render_api.fail_next_deploy = ["Error: AUTH_SECRET is too short", "==> Exited with status 1"]
    failed = render_cli(*FIRST)
    assert failed.exit_code == 1
    assert "ended as update_failed" in failed.stderr and "Error: AUTH_SECRET is too short" in failed.stderr
    assert "Exited with status 1" in failed.stderr
    # The failed deploy reached Render with a generated token: shown once so the user has it.
    assert "Admin token" in failed.stderr
    assert AUTH_SECRET not in _everything_shown(render_cli, missing, refused, failed)
