"""`--platform cloud-a-containers` (AWS Lightsail container services) against botocore's Stubber, which
checks every request's parameters and their order, and fake `aws` / `lightsailctl` executables for the push."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

if not os.environ.get("CI"):  # CI installs .[dev]: a missing boto3 there must fail, not skip
    pytest.importorskip("boto3", reason="the AWS extra is not installed: pip install 'offline[aws]'")

import boto3
from botocore.stub import Stubber

from platform_adapters import load_adapter
from platform_adapters.base import (
    CLI_NOT_INSTALLED,
    DAEMON_UNAVAILABLE,
    HEALTH_TIMEOUT,
    NO_PREVIOUS_DEPLOYMENT,
    NOT_AUTHENTICATED,
    PLATFORM_ERROR,
    PUSH_PLUGIN_MISSING,
    WRONG_ARCHITECTURE,
    DeployContext,
    DeployError,
    DeployOutcome,
    StatusReport,
)
from platform_adapters.lightsail import (
    LightsailAdapter,
    lightsail_deployment_request,
    lightsail_push_argv,
    lightsail_state,
    newest_pushed_image,
    parse_pushed_image,
)

from ._aws_support import (
    APP,
    AUTH_SECRET,
    DATABASE_URL,
    REGION,
    FakeEngine,
    assert_no_secrets,
    install_fake_clis,
    make_context,
    read_cli_log,
    reporter_of,
    set_fake_aws_credentials,
)

URL = f"https://{APP}.k8abc12def.{REGION}.cs.amazonlightsail.com/"
CREATED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
HEALTH_CHECK = {
    "path": "/health",
    "intervalSeconds": 10,
    "timeoutSeconds": 5,
    "healthyThreshold": 2,
    "unhealthyThreshold": 3,
    "successCodes": "200-299",
}
PUBLIC_ENDPOINT = {"containerName": "server", "containerPort": 3001, "healthCheck": HEALTH_CHECK}


def container_service(
    state: str, current: tuple[int, str] | None = None, upcoming: tuple[int, str] | None = None
) -> dict[str, Any]:
    service: dict[str, Any] = {
        "containerServiceName": APP,
        "arn": f"arn:aws:lightsail:{REGION}:123456789012:ContainerService/1f2e3d",
        "createdAt": CREATED,
        "power": "nano",
        "scale": 1,
        "state": state,
        "url": URL,
    }
    if current:
        service["currentDeployment"] = {"version": current[0], "state": current[1], "createdAt": CREATED}
    if upcoming:
        service["nextDeployment"] = {"version": upcoming[0], "state": upcoming[1], "createdAt": CREATED}
    return service


def deployment_entry(
    version: int, state: str, image: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "version": version,
        "state": state,
        "createdAt": CREATED,
        "containers": {
            "server": {
                "image": image,
                "environment": env or {"PORT": "3001"},
                "ports": {"3001": "HTTP"},
            }
        },
        "publicEndpoint": PUBLIC_ENDPOINT,
    }


@dataclass
class Aws:
    """Stubbed sts and lightsail clients; ``factory`` is what the adapter gets as ctx.client_factory."""

    clients: dict[str, Any]
    stubbers: dict[str, Stubber]

    def factory(self, service: str, region_name: str | None = None) -> Any:
        assert region_name == REGION  # the adapter never falls back to another platform's region
        return self.clients[service]

    @property
    def sts(self) -> Stubber:
        return self.stubbers["sts"]

    @property
    def lightsail(self) -> Stubber:
        return self.stubbers["lightsail"]

    def identity(self) -> None:
        self.sts.add_response(
            "get_caller_identity",
            {"UserId": "AIDATEST", "Account": "123456789012", "Arn": "arn:aws:iam::123456789012:user/dev"},
            {},
        )

    def get(self, response: dict[str, Any] | None) -> None:
        """One get_container_services for the app: the service, or NotFoundException when None."""
        if response is None:
            self.lightsail.add_client_error(
                "get_container_services",
                service_error_code="NotFoundException",
                service_message="The container service does not exist.",
                http_status_code=400,
                expected_params={"serviceName": APP},
            )
        else:
            self.lightsail.add_response(
                "get_container_services", {"containerServices": [response]}, {"serviceName": APP}
            )


@pytest.fixture
def aws() -> Iterator[Aws]:
    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
    )
    clients = {name: session.client(name) for name in ("sts", "lightsail")}
    stubbers = {name: Stubber(client) for name, client in clients.items()}
    for stubber in stubbers.values():
        stubber.activate()
    yield Aws(clients, stubbers)
    for stubber in stubbers.values():
        stubber.deactivate()


@pytest.fixture
def ctx(tmp_path: Path, aws: Aws) -> DeployContext:
    install_fake_clis(tmp_path / "bin")
    return make_context(tmp_path, client_factory=aws.factory)


def deploy_like_the_command(
    adapter: LightsailAdapter, ctx: DeployContext
) -> tuple[DeployOutcome, StatusReport]:
    """The deploy command's order of adapter calls (offline_cli.deploy.flow): the service exists, and so
    does its URL, before the client is built."""
    adapter.check_prerequisites(ctx)
    ctx.state.update(adapter.provision(ctx))
    assert adapter.public_url(ctx) == URL.rstrip("/")  # from provision's state: no extra request
    assert adapter.render_config(ctx) == []
    outcome = adapter.deploy(ctx)
    return outcome, adapter.wait_until_healthy(ctx, outcome)


def expected_deployment(image: str) -> dict[str, Any]:
    return {
        "serviceName": APP,
        "containers": {
            "server": {
                "image": image,
                "environment": {"PORT": "3001", "DATABASE_URL": DATABASE_URL, "AUTH_SECRET": AUTH_SECRET},
                "ports": {"3001": "HTTP"},
            }
        },
        "publicEndpoint": PUBLIC_ENDPOINT,
    }


# -- request shapes as data --------------------------------------------------------------------------------------


def test_deployment_request_forwards_only_the_set_variables_and_checks_health() -> None:
    request = lightsail_deployment_request(
        "svc", ":svc.offline.3", 3001, {"DATABASE_URL": "postgres://x", "PUBLIC_URL": "", "HOME": "/root"}
    )
    assert request == {
        "serviceName": "svc",
        "containers": {
            "server": {
                "image": ":svc.offline.3",
                "environment": {"PORT": "3001", "DATABASE_URL": "postgres://x"},
                "ports": {"3001": "HTTP"},
            }
        },
        "publicEndpoint": {"containerName": "server", "containerPort": 3001, "healthCheck": HEALTH_CHECK},
    }


def test_push_argv_is_the_documented_cli_path() -> None:
    assert lightsail_push_argv("us-east-1", "svc", "offline", "offline-svc:latest") == [
        "aws",
        "lightsail",
        "push-container-image",
        "--region",
        "us-east-1",
        "--service-name",
        "svc",
        "--label",
        "offline",
        "--image",
        "offline-svc:latest",
    ]


def test_pushed_image_reference_is_parsed_from_the_push_output() -> None:
    output = (
        "4a3b2c1d0e9f: Pushed\nDigest: sha256:0123\n"
        'Image "svc.offline.7" registered.\nRefer to this image as ":svc.offline.7" in deployments.\n'
    )
    assert parse_pushed_image(output) == ":svc.offline.7"
    # lightsailctl's "registered" line names the local image: no reference a deployment can use.
    assert parse_pushed_image('Image "offline-svc:latest" registered.') is None
    images = [{"image": ":svc.offline.2"}, {"image": ":svc.offline.10"}, {"image": ":other.offline.99"}]
    assert newest_pushed_image(images, "svc", "offline") == ":svc.offline.10"
    assert newest_pushed_image([], "svc", "offline") is None
    assert parse_pushed_image("Digest: sha256:0123") is None


@pytest.mark.parametrize(
    ("state", "current", "expected"),
    [
        ("RUNNING", "ACTIVE", ("RUNNING", True)),
        ("RUNNING", "ACTIVATING", ("RUNNING", False)),
        ("DEPLOYING", "ACTIVE", ("DEPLOYING", False)),
        ("UPDATING", "ACTIVE", ("DEPLOYING", False)),
        ("PENDING", None, ("DEPLOYING", False)),
        ("READY", None, ("STOPPED", False)),
        ("DISABLED", "ACTIVE", ("STOPPED", False)),
        ("SOMETHING_NEW", None, ("UNKNOWN", False)),
    ],
)
def test_service_states_map_to_deploy_states(
    state: str, current: str | None, expected: tuple[str, bool]
) -> None:
    service = container_service(state, (1, current) if current else None)
    assert lightsail_state(service) == expected


def test_the_platform_table_loads_this_adapter_without_importing_boto3() -> None:
    code = (
        "import sys\n"
        "from platform_adapters import load_adapter\n"
        "adapter = load_adapter('cloud-a-containers')\n"
        "load_adapter('cloud-a-orchestrated')\n"
        "print(type(adapter).__name__, 'boto3' in sys.modules, 'docker' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["LightsailAdapter", "False", "False"]
    assert isinstance(load_adapter("cloud-a-containers"), LightsailAdapter)
    assert LightsailAdapter.default_region is None
    assert LightsailAdapter.needs_container_engine


# -- deploy ------------------------------------------------------------------------------------------------------


def test_first_deploy_creates_a_nano_service_pushes_and_waits_for_running(
    aws: Aws, ctx: DeployContext, tmp_path: Path
) -> None:
    aws.identity()
    aws.get(None)  # provision: no service yet
    aws.lightsail.add_response(
        "create_container_service",
        {"containerService": container_service("PENDING")},
        {"serviceName": APP, "power": "nano", "scale": 1},
    )
    aws.get(container_service("PENDING"))
    aws.get(container_service("READY"))
    aws.lightsail.add_response(
        "create_container_service_deployment",
        {"containerService": container_service("DEPLOYING", upcoming=(1, "ACTIVATING"))},
        expected_deployment(":todo-app.offline.1"),
    )
    aws.get(container_service("DEPLOYING", upcoming=(1, "ACTIVATING")))
    aws.get(container_service("RUNNING", current=(1, "ACTIVE")))

    outcome, report = deploy_like_the_command(LightsailAdapter(), ctx)

    aws.sts.assert_no_pending_responses()
    aws.lightsail.assert_no_pending_responses()
    assert outcome.url == URL.rstrip("/")
    assert outcome.sync_url == f"wss://{APP}.k8abc12def.{REGION}.cs.amazonlightsail.com/offline-sync"
    assert outcome.deployment_id == "1"
    assert outcome.state == {
        "service": APP,
        "region": REGION,
        "url": URL.rstrip("/"),
        "image": ":todo-app.offline.1",
        "container": "server",
    }
    assert report == StatusReport("RUNNING", True, URL.rstrip("/"), "1", report.details)
    assert report.details["power"] == "nano" and report.details["scale"] == 1

    engine = ctx.engine
    assert isinstance(engine, FakeEngine)
    assert engine.calls == [
        ("ping",),
        ("build", ctx.deploy_dir, f"offline-{APP}:latest"),
        ("image_platform", f"offline-{APP}:latest"),
    ]
    log = read_cli_log(tmp_path / "cli.jsonl")
    assert [entry["program"] for entry in log] == ["aws", "lightsailctl"]
    assert log[0]["argv"] == [
        "lightsail",
        "push-container-image",
        "--region",
        REGION,
        "--service-name",
        APP,
        "--label",
        "offline",
        "--image",
        f"offline-{APP}:latest",
    ]
    assert log[1]["input"]["payload"] == {
        "service": APP,
        "label": "offline",
        "image": f"offline-{APP}:latest",
    }

    messages = reporter_of(ctx).text()
    assert "aws lightsail update-container-service" in messages
    assert "--power <nano|micro|small|medium|large|xlarge> --scale <n>" in messages
    assert "DEPLOYING" in messages
    # The wait showed the deployment's state as Lightsail reported it, each change once.
    states = [line for line in messages.splitlines() if line.startswith("Lightsail: ")]
    assert states == [
        "Lightsail: service DEPLOYING, deployment 1 ACTIVATING",
        "Lightsail: service RUNNING, deployment 1 ACTIVE",
    ]
    # The secrets reached the deployment's environment (checked by the Stubber) and nothing else.
    assert_no_secrets(messages, json.dumps(outcome.state), json.dumps(log), json.dumps(report.details))


def test_redeploy_reuses_the_service_and_waits_out_an_update(aws: Aws, tmp_path: Path) -> None:
    install_fake_clis(tmp_path / "bin")
    # Four pushes happened before: Lightsail numbers this one 5.
    (tmp_path / "cli.jsonl.versions.json").write_text(json.dumps({f"{APP}.offline": 4}))
    state = {"service": APP, "region": REGION, "url": URL.rstrip("/")}
    ctx = make_context(tmp_path, client_factory=aws.factory, state=state, with_secrets=False)
    aws.identity()
    aws.get(container_service("RUNNING", current=(4, "ACTIVE")))  # provision finds it
    aws.lightsail.add_response(
        "create_container_service_deployment",
        {"containerService": container_service("DEPLOYING", (4, "ACTIVE"), (5, "ACTIVATING"))},
        {
            "serviceName": APP,
            "containers": {
                "server": {
                    "image": ":todo-app.offline.5",
                    "environment": {"PORT": "3001"},
                    "ports": {"3001": "HTTP"},
                }
            },
            "publicEndpoint": PUBLIC_ENDPOINT,
        },
    )
    aws.get(container_service("UPDATING", (4, "ACTIVE"), (5, "ACTIVATING")))
    aws.get(container_service("RUNNING", current=(5, "ACTIVE")))

    outcome, report = deploy_like_the_command(LightsailAdapter(), ctx)

    aws.lightsail.assert_no_pending_responses()
    assert outcome.deployment_id == "5"
    assert outcome.state["image"] == ":todo-app.offline.5"
    assert report.state == "RUNNING" and report.healthy and report.deployment_id == "5"
    assert not any("Creating Lightsail container service" in m for _, m in reporter_of(ctx).entries)


@pytest.mark.parametrize("public_url", ["https://notes.example.com", None])
def test_public_url_reaches_the_container_only_when_set(
    aws: Aws, tmp_path: Path, public_url: str | None
) -> None:
    install_fake_clis(tmp_path / "bin")
    env = {"PUBLIC_URL": public_url} if public_url else {}
    state = {"service": APP, "region": REGION, "url": URL.rstrip("/")}
    ctx = make_context(tmp_path, client_factory=aws.factory, state=state, env=env)
    environment = {"PORT": "3001", "DATABASE_URL": DATABASE_URL, "AUTH_SECRET": AUTH_SECRET}
    if public_url:
        environment["PUBLIC_URL"] = public_url
    # The Stubber compares the whole request: an extra or a missing variable fails the call.
    aws.lightsail.add_response(
        "create_container_service_deployment",
        {"containerService": container_service("DEPLOYING", upcoming=(1, "ACTIVATING"))},
        {
            "serviceName": APP,
            "containers": {
                "server": {
                    "image": ":todo-app.offline.1",
                    "environment": environment,
                    "ports": {"3001": "HTTP"},
                }
            },
            "publicEndpoint": PUBLIC_ENDPOINT,
        },
    )

    LightsailAdapter().deploy(ctx)

    aws.lightsail.assert_no_pending_responses()
    forwarding = [m for _, m in reporter_of(ctx).entries if m.startswith("Forwarding ")]
    names = ["DATABASE_URL", "AUTH_SECRET"] + (["PUBLIC_URL"] if public_url else [])
    assert forwarding == [f"Forwarding {name} from the local environment to the container." for name in names]


def test_a_failed_deployment_is_reported_with_the_logs_hint(aws: Aws, ctx: DeployContext) -> None:
    aws.get(container_service("DEPLOYING", (4, "ACTIVE"), (5, "ACTIVATING")))
    aws.get(container_service("RUNNING", current=(4, "ACTIVE")))
    aws.lightsail.add_response(
        "get_container_service_deployments",
        {
            "deployments": [
                deployment_entry(5, "FAILED", ":todo-app.offline.5"),
                deployment_entry(4, "ACTIVE", ":todo-app.offline.4"),
            ]
        },
        {"serviceName": APP},
    )
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().wait_until_healthy(ctx, DeployOutcome(URL, "5"))
    assert raised.value.code == PLATFORM_ERROR
    assert "deployment 5" in raised.value.message and "failed" in raised.value.message
    assert "offline deploy logs" in raised.value.hint


def test_a_rollout_that_never_finishes_times_out(aws: Aws, ctx: DeployContext) -> None:
    # health_timeout 3 s at a 1 s interval: the first look and three more.
    for _ in range(4):
        aws.get(container_service("DEPLOYING", (4, "ACTIVE"), (5, "ACTIVATING")))
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().wait_until_healthy(ctx, DeployOutcome(URL, "5"))
    aws.lightsail.assert_no_pending_responses()
    assert raised.value.code == HEALTH_TIMEOUT


# -- management --------------------------------------------------------------------------------------------------


def test_status_maps_the_service_state(aws: Aws, ctx: DeployContext) -> None:
    adapter = LightsailAdapter()
    aws.get(container_service("RUNNING", current=(3, "ACTIVE")))
    aws.get(container_service("DEPLOYING", (3, "ACTIVE"), (4, "ACTIVATING")))
    aws.get(None)

    running = adapter.status(ctx)
    assert (running.state, running.healthy, running.url, running.deployment_id) == (
        "RUNNING",
        True,
        URL.rstrip("/"),
        "3",
    )
    deploying = adapter.status(ctx)
    assert deploying.state == "DEPLOYING" and not deploying.healthy
    assert deploying.details["next_deployment"] == 4
    missing = adapter.status(ctx)
    assert (missing.state, missing.healthy, missing.url) == ("NOT_FOUND", False, None)


def test_logs_are_the_newest_lines_of_the_container(aws: Aws, ctx: DeployContext) -> None:
    events = [
        {"createdAt": datetime(2025, 1, 2, 3, 4, second, tzinfo=UTC), "message": f"line {second}"}
        for second in range(4)
    ]
    aws.lightsail.add_response(
        "get_container_log", {"logEvents": events}, {"serviceName": APP, "containerName": "server"}
    )
    lines = LightsailAdapter().logs(ctx, lines=2)
    assert lines == ["2025-01-02T03:04:02+00:00 line 2", "2025-01-02T03:04:03+00:00 line 3"]


def test_deployments_are_listed_newest_first_with_the_current_one_marked(
    aws: Aws, ctx: DeployContext
) -> None:
    aws.lightsail.add_response(
        "get_container_service_deployments",
        {
            "deployments": [
                deployment_entry(1, "INACTIVE", ":todo-app.offline.1"),
                deployment_entry(3, "ACTIVE", ":todo-app.offline.3"),
                deployment_entry(2, "FAILED", ":todo-app.offline.2"),
            ]
        },
        {"serviceName": APP},
    )
    listed = LightsailAdapter().deployments(ctx)
    assert [(d.id, d.status, d.current, d.image) for d in listed] == [
        ("3", "ACTIVE", True, ":todo-app.offline.3"),
        ("2", "FAILED", False, ":todo-app.offline.2"),
        ("1", "INACTIVE", False, ":todo-app.offline.1"),
    ]
    assert listed[0].created_at == CREATED.isoformat()


def history(aws: Aws) -> None:
    aws.lightsail.add_response(
        "get_container_service_deployments",
        {
            "deployments": [
                deployment_entry(3, "ACTIVE", ":todo-app.offline.3"),
                deployment_entry(2, "FAILED", ":todo-app.offline.2"),
                deployment_entry(
                    1, "INACTIVE", ":todo-app.offline.1", {"PORT": "3001", "AUTH_SECRET": "old"}
                ),
            ]
        },
        {"serviceName": APP},
    )


def test_rollback_redeploys_the_previous_working_deployment(aws: Aws, ctx: DeployContext) -> None:
    history(aws)
    # Version 2 failed, so the one before the current that actually ran is 1: its containers and endpoint
    # (including the environment it ran with) are deployed again as a new version.
    aws.lightsail.add_response(
        "create_container_service_deployment",
        {"containerService": container_service("DEPLOYING", (3, "ACTIVE"), (4, "ACTIVATING"))},
        {
            "serviceName": APP,
            "containers": deployment_entry(
                1, "INACTIVE", ":todo-app.offline.1", {"PORT": "3001", "AUTH_SECRET": "old"}
            )["containers"],
            "publicEndpoint": PUBLIC_ENDPOINT,
        },
    )
    outcome = LightsailAdapter().rollback(ctx)
    aws.lightsail.assert_no_pending_responses()
    assert outcome.deployment_id == "4"
    assert outcome.state["rolled_back_to"] == "1"
    assert outcome.state["image"] == ":todo-app.offline.1"
    assert "old" not in json.dumps(outcome.state)


def test_rollback_to_a_given_version(aws: Aws, ctx: DeployContext) -> None:
    history(aws)
    aws.lightsail.add_response(
        "create_container_service_deployment",
        {"containerService": container_service("DEPLOYING", (3, "ACTIVE"), (4, "ACTIVATING"))},
        {
            "serviceName": APP,
            "containers": deployment_entry(2, "FAILED", ":todo-app.offline.2")["containers"],
            "publicEndpoint": PUBLIC_ENDPOINT,
        },
    )
    outcome = LightsailAdapter().rollback(ctx, "2")
    aws.lightsail.assert_no_pending_responses()
    assert outcome.state["rolled_back_to"] == "2"


@pytest.mark.parametrize("wanted", ["3", "9"])
def test_rollback_to_the_current_or_an_unknown_version_is_refused(
    aws: Aws, ctx: DeployContext, wanted: str
) -> None:
    history(aws)
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().rollback(ctx, wanted)
    assert raised.value.code == NO_PREVIOUS_DEPLOYMENT
    assert wanted in raised.value.message


def test_rollback_without_a_previous_deployment(aws: Aws, ctx: DeployContext) -> None:
    aws.lightsail.add_response(
        "get_container_service_deployments",
        {"deployments": [deployment_entry(1, "ACTIVE", ":todo-app.offline.1")]},
        {"serviceName": APP},
    )
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().rollback(ctx)
    assert raised.value.code == NO_PREVIOUS_DEPLOYMENT
    assert "no previous deployment" in raised.value.message


# -- prerequisites and failures ----------------------------------------------------------------------------------


def test_rejected_credentials_are_not_authenticated(aws: Aws, ctx: DeployContext) -> None:
    aws.sts.add_client_error(
        "get_caller_identity",
        service_error_code="InvalidClientTokenId",
        service_message="The security token included in the request is invalid.",
        http_status_code=403,
    )
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().check_prerequisites(ctx)
    assert raised.value.code == NOT_AUTHENTICATED
    assert "cloud CLI is not authenticated" in raised.value.message
    assert "aws configure" in raised.value.hint and "AWS_ACCESS_KEY_ID" in raised.value.hint


def test_missing_aws_cli_is_reported_before_anything_else(aws: Aws, tmp_path: Path) -> None:
    ctx = make_context(tmp_path, client_factory=aws.factory)  # nothing on PATH
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().check_prerequisites(ctx)
    assert raised.value.code == CLI_NOT_INSTALLED
    assert "host CLI required but not installed" in raised.value.message
    assert "`aws`" in raised.value.message


def test_missing_lightsailctl_is_the_push_plugin_error(aws: Aws, tmp_path: Path) -> None:
    install_fake_clis(tmp_path / "bin", lightsailctl=False)
    ctx = make_context(tmp_path, client_factory=aws.factory)
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().check_prerequisites(ctx)
    assert raised.value.code == PUSH_PLUGIN_MISSING
    assert "container push plugin was not found" in raised.value.message
    assert "lightsailctl" in raised.value.hint


def test_a_push_that_cannot_find_the_plugin_is_the_push_plugin_error(aws: Aws, tmp_path: Path) -> None:
    # Prerequisites passed earlier, but the plugin is gone by the time the CLI looks for it.
    install_fake_clis(tmp_path / "bin", lightsailctl=False)
    ctx = make_context(tmp_path, client_factory=aws.factory, state={"service": APP, "url": URL})
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().deploy(ctx)
    assert raised.value.code == PUSH_PLUGIN_MISSING
    assert "lightsailctl" in raised.value.message
    aws.lightsail.assert_no_pending_responses()


def test_a_failing_push_is_a_platform_error_naming_the_command(aws: Aws, tmp_path: Path) -> None:
    install_fake_clis(tmp_path / "bin")
    ctx = make_context(
        tmp_path,
        client_factory=aws.factory,
        env={"FAKE_LIGHTSAILCTL_FAIL": "denied: requested access to the resource is denied"},
    )
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().deploy(ctx)
    assert raised.value.code == PLATFORM_ERROR
    assert "push-container-image" in raised.value.message and "denied" in raised.value.message


def test_a_stopped_engine_is_daemon_unavailable(aws: Aws, tmp_path: Path) -> None:
    install_fake_clis(tmp_path / "bin")
    ctx = make_context(tmp_path, client_factory=aws.factory, engine=FakeEngine(down=True))
    aws.identity()
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().check_prerequisites(ctx)
    assert raised.value.code == DAEMON_UNAVAILABLE
    assert "cannot connect to the container daemon" in raised.value.message


def test_an_arm_image_is_refused_before_pushing(aws: Aws, tmp_path: Path) -> None:
    install_fake_clis(tmp_path / "bin")
    ctx = make_context(tmp_path, client_factory=aws.factory, engine=FakeEngine(platform="linux/arm64"))
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().deploy(ctx)
    assert raised.value.code == WRONG_ARCHITECTURE
    assert "image does not provide linux/amd64 platform" in raised.value.message
    assert "built for linux/arm64" in raised.value.message
    assert raised.value.hint.startswith("AWS runs x86_64 containers. Enable multi-platform builds")
    assert raised.value.hint.endswith("then deploy again.")
    assert read_cli_log(tmp_path / "cli.jsonl") == []


def test_an_invalid_app_name_is_refused_before_creating_anything(aws: Aws, tmp_path: Path) -> None:
    install_fake_clis(tmp_path / "bin")
    ctx = make_context(tmp_path, client_factory=aws.factory)
    ctx.app = "My_App"
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().provision(ctx)
    assert "--app" in raised.value.hint
    aws.lightsail.assert_no_pending_responses()


def test_management_commands_need_no_cli_plugin_or_engine(aws: Aws, tmp_path: Path) -> None:
    ctx = make_context(tmp_path, client_factory=aws.factory)  # nothing on PATH
    ctx.engine = None  # status, logs and rollback get no engine
    aws.identity()
    LightsailAdapter().check_prerequisites(ctx)
    aws.sts.assert_no_pending_responses()


def test_public_url_of_an_existing_service_without_state(aws: Aws, ctx: DeployContext) -> None:
    aws.get(container_service("RUNNING", current=(2, "ACTIVE")))
    aws.get(None)
    assert LightsailAdapter().public_url(ctx) == URL.rstrip("/")
    assert LightsailAdapter().public_url(ctx) is None


def test_region_comes_from_the_aws_config_file(
    aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_fake_aws_credentials(monkeypatch, tmp_path, keys=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\nregion = {REGION}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    ctx = make_context(tmp_path, client_factory=aws.factory, region=None)
    aws.get(None)
    assert LightsailAdapter().status(ctx).state == "NOT_FOUND"  # the factory asserts the region


def test_no_region_anywhere_asks_for_one(aws: Aws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    set_fake_aws_credentials(monkeypatch, tmp_path, keys=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    ctx = make_context(tmp_path, client_factory=aws.factory, region=None)
    with pytest.raises(DeployError) as raised:
        LightsailAdapter().status(ctx)
    assert "--region" in raised.value.hint


def test_existing_secrets_come_back_from_the_current_deployment(aws: Aws, ctx: DeployContext) -> None:
    """Each Lightsail deployment replaces the whole environment: the admin token the first deploy set must
    be read back and sent again, or the next deploy would leave the admin surface open."""
    aws.identity()
    aws.get(None)
    assert LightsailAdapter().existing_secrets(ctx) == {}  # no service yet
    service = container_service("RUNNING", current=(3, "ACTIVE"))
    service["currentDeployment"]["containers"] = deployment_entry(
        3, "ACTIVE", ":todo-app.offline.3", {"PORT": "3001", "OFFLINE_ADMIN_TOKEN": "kept-admin-token-value"}
    )["containers"]
    aws.identity()
    aws.get(service)
    assert LightsailAdapter().existing_secrets(ctx) == {"OFFLINE_ADMIN_TOKEN": "kept-admin-token-value"}


def test_the_admin_token_goes_into_the_deployment_environment() -> None:
    request = lightsail_deployment_request(
        APP, ":todo-app.offline.4", 3001, {"OFFLINE_ADMIN_TOKEN": "t0ken-value", "PATH": "/bin"}
    )
    assert request["containers"]["server"]["environment"] == {
        "PORT": "3001",
        "OFFLINE_ADMIN_TOKEN": "t0ken-value",
    }
