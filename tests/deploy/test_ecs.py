"""`--platform cloud-a-orchestrated` (ECS on Fargate, ECR, CloudWatch Logs) against moto's in-process AWS,
with every call recorded through the client factory; rollout sequences moto cannot play use botocore's
Stubber."""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

if not os.environ.get("CI"):  # CI installs .[dev]: a missing boto3 or moto there must fail, not skip
    pytest.importorskip("boto3", reason="the AWS extra is not installed: pip install 'offline[aws]'")
    pytest.importorskip("moto", reason="moto is not installed: pip install 'offline[test]'")

import boto3
from botocore.stub import Stubber
from moto import mock_aws

from platform_adapters._aws import AwsSession
from platform_adapters.base import (
    DAEMON_UNAVAILABLE,
    HEALTH_TIMEOUT,
    NO_PREVIOUS_DEPLOYMENT,
    NOT_AUTHENTICATED,
    NOT_DEPLOYED,
    PLATFORM_ERROR,
    WRONG_ARCHITECTURE,
    DeployContext,
    DeployError,
    DeployOutcome,
    StatusReport,
)
from platform_adapters.ecs import (
    EcsAdapter,
    ecs_create_service_command,
    ecs_create_service_request,
    ecs_task_definition,
    health_check_command,
    rollout_state,
)

from ._aws_support import (
    APP,
    AUTH_SECRET,
    DATABASE_URL,
    PUSHED_DIGEST,
    REGION,
    FakeEngine,
    RecordingFactory,
    assert_no_secrets,
    make_context,
    reporter_of,
    set_fake_aws_credentials,
)

ACCOUNT = "123456789012"  # moto's account
REPOSITORY_URI = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{APP}"
ECR_PASSWORD = f"{ACCOUNT}-auth-token"  # what moto's get_authorization_token encodes
EXECUTION_ROLE = f"arn:aws:iam::{ACCOUNT}:role/ecsTaskExecutionRole"
CREATE_SERVICE_COMMAND = (
    f"aws ecs create-service --region {REGION} --cluster {APP} --service-name {APP} "
    f"--task-definition {APP}:1 --desired-count 1 --launch-type FARGATE --network-configuration "
    "'awsvpcConfiguration={subnets=[<subnet-id>],securityGroups=[<security-group-id>],assignPublicIp=ENABLED}' "
    "--deployment-configuration "
    "'deploymentCircuitBreaker={enable=true,rollback=true},maximumPercent=200,minimumHealthyPercent=100'"
)


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    set_fake_aws_credentials(monkeypatch, tmp_path)
    with mock_aws():
        yield


@pytest.fixture
def factory(moto: None) -> RecordingFactory:
    return RecordingFactory()


def network() -> tuple[str, str]:
    """A subnet and a security group in moto's EC2 (create_service checks that both exist)."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.10.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.10.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName=APP, Description="offline app", VpcId=vpc)["GroupId"]
    return subnet, group


def deploy_like_the_command(adapter: EcsAdapter, ctx: DeployContext) -> tuple[DeployOutcome, StatusReport]:
    """The deploy command's order of adapter calls (offline_cli.deploy.flow)."""
    adapter.check_prerequisites(ctx)
    ctx.state.update(adapter.provision(ctx))
    assert adapter.public_url(ctx) is None  # a task IP changes with every task: nothing to bake in
    assert adapter.render_config(ctx) == []
    outcome = adapter.deploy(ctx)
    return outcome, adapter.wait_until_healthy(ctx, outcome)


def service_of(ecs: Any) -> dict[str, Any]:
    services: list[dict[str, Any]] = ecs.describe_services(cluster=APP, services=[APP])["services"]
    assert len(services) == 1
    return services[0]


PROVISION_FIRST = [
    ("sts", "get_caller_identity"),
    ("ecr", "describe_repositories"),
    ("ecr", "create_repository"),
    ("ecs", "describe_clusters"),
    ("ecs", "create_cluster"),
    ("logs", "create_log_group"),
    ("logs", "put_retention_policy"),
]
REGISTER = [
    ("ecr", "get_authorization_token"),
    ("ecs", "register_task_definition"),
    ("ecs", "describe_services"),
]
#: What rollback and deployments() ask first: the service (its current revision), then the family's revisions.
LIST_REVISIONS = [("ecs", "describe_services"), ("ecs", "list_task_definitions")]


# -- request shapes as data --------------------------------------------------------------------------------------


def test_task_definition_is_one_fargate_container_with_health_check_and_logs() -> None:
    request = ecs_task_definition(
        "app",
        "repo@sha256:00",
        3001,
        "us-east-2",
        "/ecs/app",
        {"DATABASE_URL": "postgres://x", "AUTH_SECRET": "", "PATH": "/bin"},
        execution_role_arn="arn:aws:iam::1:role/r",
    )
    assert request == {
        "family": "app",
        "networkMode": "awsvpc",
        "requiresCompatibilities": ["FARGATE"],
        "cpu": "256",
        "memory": "512",
        "runtimePlatform": {"cpuArchitecture": "X86_64", "operatingSystemFamily": "LINUX"},
        "executionRoleArn": "arn:aws:iam::1:role/r",
        "containerDefinitions": [
            {
                "name": "server",
                "image": "repo@sha256:00",
                "essential": True,
                "portMappings": [{"containerPort": 3001, "hostPort": 3001, "protocol": "tcp"}],
                "environment": [
                    {"name": "DATABASE_URL", "value": "postgres://x"},
                    {"name": "PORT", "value": "3001"},
                ],
                "logConfiguration": {
                    "logDriver": "awslogs",
                    "options": {
                        "awslogs-group": "/ecs/app",
                        "awslogs-region": "us-east-2",
                        "awslogs-stream-prefix": "offline",
                    },
                },
                "healthCheck": {
                    "command": health_check_command(3001),
                    "interval": 30,
                    "timeout": 5,
                    "retries": 3,
                    "startPeriod": 20,
                },
            }
        ],
    }


def test_health_check_command_is_python3_fetching_health_on_the_port() -> None:
    command = health_check_command(8080)
    assert command[:3] == ["CMD", "python3", "-c"]  # Debian-style images may have no `python`
    assert "urllib.request.urlopen('http://localhost:8080/health'" in command[3]
    compile(command[3], "<health check>", "exec")  # a syntax error would fail every task


def test_create_service_request_enables_the_circuit_breaker_and_a_public_ip() -> None:
    request = ecs_create_service_request("c", "s", "arn:td", ["subnet-1", "subnet-2"], ["sg-1"])
    assert request["launchType"] == "FARGATE" and request["desiredCount"] == 1
    assert request["networkConfiguration"] == {
        "awsvpcConfiguration": {
            "subnets": ["subnet-1", "subnet-2"],
            "securityGroups": ["sg-1"],
            "assignPublicIp": "ENABLED",
        }
    }
    assert request["deploymentConfiguration"]["deploymentCircuitBreaker"] == {
        "enable": True,
        "rollback": True,
    }


def test_create_service_command_is_a_valid_shell_command_with_placeholders() -> None:
    command = ecs_create_service_command(REGION, APP, APP, f"{APP}:1")
    assert command == CREATE_SERVICE_COMMAND
    argv = shlex.split(command)
    assert argv[argv.index("--network-configuration") + 1] == (
        "awsvpcConfiguration={subnets=[<subnet-id>],securityGroups=[<security-group-id>],assignPublicIp=ENABLED}"
    )


@pytest.mark.parametrize(
    ("deployment", "expected"),
    [
        ({"rolloutState": "IN_PROGRESS"}, "IN_PROGRESS"),
        ({"rolloutState": "COMPLETED"}, "COMPLETED"),
        ({"rolloutState": "FAILED"}, "FAILED"),
        ({"desiredCount": 1, "runningCount": 1, "pendingCount": 0}, "COMPLETED"),
        ({"desiredCount": 1, "runningCount": 0, "pendingCount": 1}, "IN_PROGRESS"),
    ],
)
def test_rollout_state(deployment: dict[str, Any], expected: str) -> None:
    assert rollout_state(deployment) == expected


# -- deploy against moto -----------------------------------------------------------------------------------------


def test_first_deploy_without_network_settings_registers_and_prints_the_create_command(
    factory: RecordingFactory, tmp_path: Path
) -> None:
    ctx = make_context(tmp_path, client_factory=factory)
    outcome, report = deploy_like_the_command(EcsAdapter(), ctx)

    assert factory.operations() == PROVISION_FIRST + REGISTER  # and no create_service / update_service
    assert set(factory.regions) == {REGION}
    ecr = boto3.client("ecr", region_name=REGION)
    assert (
        ecr.describe_repositories(repositoryNames=[APP])["repositories"][0]["repositoryUri"] == REPOSITORY_URI
    )
    ecs = boto3.client("ecs", region_name=REGION)
    assert ecs.describe_clusters(clusters=[APP])["clusters"][0]["status"] == "ACTIVE"
    groups = boto3.client("logs", region_name=REGION).describe_log_groups(logGroupNamePrefix=f"/ecs/{APP}")
    assert [(g["logGroupName"], g.get("retentionInDays")) for g in groups["logGroups"]] == [
        (f"/ecs/{APP}", 30)
    ]

    definition = ecs.describe_task_definition(taskDefinition=f"{APP}:1")["taskDefinition"]
    assert definition["requiresCompatibilities"] == ["FARGATE"]
    assert (definition["networkMode"], definition["cpu"], definition["memory"]) == ("awsvpc", "256", "512")
    assert definition["executionRoleArn"] == EXECUTION_ROLE
    (container,) = definition["containerDefinitions"]
    assert container["image"] == f"{REPOSITORY_URI}@{PUSHED_DIGEST}"
    assert container["portMappings"][0]["containerPort"] == 3001
    assert "http://localhost:3001/health" in container["healthCheck"]["command"][3]
    assert container["logConfiguration"]["options"]["awslogs-group"] == f"/ecs/{APP}"
    assert container["logConfiguration"]["options"]["awslogs-region"] == REGION
    # The forwarded secrets are in the task's environment: that is how the container gets them.
    assert {e["name"]: e["value"] for e in container["environment"]} == {
        "PORT": "3001",
        "DATABASE_URL": DATABASE_URL,
        "AUTH_SECRET": AUTH_SECRET,
    }

    engine = ctx.engine
    assert isinstance(engine, FakeEngine)
    remote = f"{REPOSITORY_URI}:{'ab' * 6}"
    assert engine.calls == [
        ("ping",),
        ("build", ctx.deploy_dir, f"offline-{APP}:latest"),
        ("image_platform", f"offline-{APP}:latest"),
        ("tag", f"offline-{APP}:latest", remote),
        ("push", remote, "AWS", ECR_PASSWORD),
    ]

    messages = reporter_of(ctx).text()
    assert CREATE_SERVICE_COMMAND in messages
    assert "<subnet-id>" in messages and "<security-group-id>" in messages
    assert (
        "AUTH_SECRET, DATABASE_URL are set in the task definition" in messages
        and "Secrets Manager" in messages
    )
    assert outcome.deployment_id == f"{APP}:1"
    assert outcome.state["service_created"] is False
    assert outcome.state["task_definition"].endswith(f"task-definition/{APP}:1")
    assert report.state == "NOT_FOUND" and not report.healthy
    assert "Skipping the health wait" in messages
    assert_no_secrets(messages, json.dumps(outcome.state), json.dumps(report.details))
    assert ECR_PASSWORD not in messages + json.dumps(outcome.state)


def test_first_deploy_with_network_settings_creates_the_service_with_the_circuit_breaker(
    factory: RecordingFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOTO_ECS_SERVICE_RUNNING", "1")  # moto then reports the rollout COMPLETED
    subnet, group = network()
    ctx = make_context(
        tmp_path, client_factory=factory, options={"subnets": subnet, "security_groups": [group]}
    )
    outcome, report = deploy_like_the_command(EcsAdapter(), ctx)

    assert factory.operations() == [
        *PROVISION_FIRST,
        *REGISTER,
        ("ecs", "create_service"),
        ("ecs", "describe_services"),  # wait_until_healthy
        ("ecs", "list_tasks"),  # the best-effort public IP lookup (moto runs no tasks)
    ]
    (created,) = factory.params("ecs", "create_service")
    assert created["deploymentConfiguration"]["deploymentCircuitBreaker"] == {
        "enable": True,
        "rollback": True,
    }
    assert created["networkConfiguration"]["awsvpcConfiguration"] == {
        "subnets": [subnet],
        "securityGroups": [group],
        "assignPublicIp": "ENABLED",
    }
    assert created["launchType"] == "FARGATE" and created["desiredCount"] == 1
    service = service_of(boto3.client("ecs", region_name=REGION))
    assert service["taskDefinition"].endswith(f":task-definition/{APP}:1")
    assert outcome.state["service_created"] is True
    assert outcome.state["subnets"] == [subnet] and outcome.state["security_groups"] == [group]
    assert (report.state, report.healthy, report.deployment_id, report.url) == (
        "RUNNING",
        True,
        f"{APP}:1",
        None,
    )
    assert "inbound TCP 3001" in reporter_of(ctx).text()


def test_redeploy_updates_the_service_to_the_new_revision(
    factory: RecordingFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOTO_ECS_SERVICE_RUNNING", "1")
    subnet, group = network()
    first_ctx = make_context(
        tmp_path, client_factory=factory, options={"subnets": [subnet], "security_groups": [group]}
    )
    first, _ = deploy_like_the_command(EcsAdapter(), first_ctx)
    factory.calls.clear()

    ctx = make_context(tmp_path, client_factory=factory, state=dict(first.state))
    outcome, report = deploy_like_the_command(EcsAdapter(), ctx)

    assert factory.operations() == [
        ("sts", "get_caller_identity"),
        ("ecr", "describe_repositories"),
        ("ecs", "describe_clusters"),
        ("logs", "create_log_group"),  # answers "already exists", which is fine
        *REGISTER,
        ("ecs", "update_service"),
        ("ecs", "describe_services"),
        ("ecs", "list_tasks"),
    ]
    (update,) = factory.params("ecs", "update_service")
    assert update["taskDefinition"].endswith(f":task-definition/{APP}:2")
    assert (update["cluster"], update["service"], update["forceNewDeployment"]) == (APP, APP, True)
    assert service_of(boto3.client("ecs", region_name=REGION))["taskDefinition"].endswith(f"{APP}:2")
    assert outcome.deployment_id == f"{APP}:2" and report.state == "RUNNING"


def two_revisions(factory: RecordingFactory, tmp_path: Path) -> DeployContext:
    subnet, group = network()
    ctx = make_context(
        tmp_path, client_factory=factory, options={"subnets": [subnet], "security_groups": [group]}
    )
    for _ in range(2):
        adapter = EcsAdapter()
        adapter.check_prerequisites(ctx)
        ctx.state.update(adapter.provision(ctx))
        ctx.state.update(adapter.deploy(ctx).state)
    factory.calls.clear()
    return ctx


def test_rollback_points_the_service_at_the_previous_revision(
    factory: RecordingFactory, tmp_path: Path
) -> None:
    ctx = two_revisions(factory, tmp_path)
    adapter = EcsAdapter()
    assert [(d.id, d.current) for d in adapter.deployments(ctx)] == [(f"{APP}:2", True), (f"{APP}:1", False)]
    assert factory.operations() == LIST_REVISIONS
    factory.calls.clear()

    outcome = adapter.rollback(ctx)

    # The service (for its current revision), the family's ACTIVE revisions, then one update; no new task
    # definition is registered and nothing is created.
    assert factory.operations() == [*LIST_REVISIONS, ("ecs", "update_service")]
    (listed,) = factory.params("ecs", "list_task_definitions")
    assert listed == {"familyPrefix": APP, "status": "ACTIVE", "sort": "DESC"}
    (update,) = factory.params("ecs", "update_service")
    assert (update["cluster"], update["service"]) == (APP, APP)
    assert update["taskDefinition"].endswith(f":task-definition/{APP}:1")
    assert "forceNewDeployment" not in update
    assert outcome.deployment_id == f"{APP}:1"
    assert service_of(boto3.client("ecs", region_name=REGION))["taskDefinition"].endswith(f"{APP}:1")
    assert [(d.id, d.current) for d in adapter.deployments(ctx)] == [(f"{APP}:2", False), (f"{APP}:1", True)]
    factory.calls.clear()
    # ... and forward again by revision, in either spelling: the same three calls each time.
    assert adapter.rollback(ctx, "2").deployment_id == f"{APP}:2"
    assert adapter.rollback(ctx, f"{APP}:1").deployment_id == f"{APP}:1"
    assert factory.operations() == [*LIST_REVISIONS, ("ecs", "update_service")] * 2
    assert [p["taskDefinition"].rsplit("/", 1)[1] for p in factory.params("ecs", "update_service")] == [
        f"{APP}:2",
        f"{APP}:1",
    ]


@pytest.mark.parametrize("wanted", [f"{APP}:2", "7"])
def test_rollback_to_the_current_or_an_unknown_revision_is_refused(
    factory: RecordingFactory, tmp_path: Path, wanted: str
) -> None:
    ctx = two_revisions(factory, tmp_path)
    with pytest.raises(DeployError) as raised:
        EcsAdapter().rollback(ctx, wanted)
    assert raised.value.code == NO_PREVIOUS_DEPLOYMENT
    assert factory.operations() == LIST_REVISIONS  # looked, changed nothing


def test_rollback_with_a_single_revision_has_nothing_to_return_to(
    factory: RecordingFactory, tmp_path: Path
) -> None:
    subnet, group = network()
    ctx = make_context(
        tmp_path, client_factory=factory, options={"subnets": [subnet], "security_groups": [group]}
    )
    adapter = EcsAdapter()
    ctx.state.update(adapter.provision(ctx))
    adapter.deploy(ctx)
    factory.calls.clear()
    with pytest.raises(DeployError) as raised:
        adapter.rollback(ctx)
    assert raised.value.code == NO_PREVIOUS_DEPLOYMENT
    assert f"{APP}:1" in raised.value.message
    assert factory.operations() == LIST_REVISIONS


def test_rollback_before_the_service_exists_is_not_deployed(
    factory: RecordingFactory, tmp_path: Path
) -> None:
    ctx = make_context(tmp_path, client_factory=factory)
    adapter = EcsAdapter()
    ctx.state.update(adapter.provision(ctx))
    adapter.deploy(ctx)  # registers only
    factory.calls.clear()
    with pytest.raises(DeployError) as raised:
        adapter.rollback(ctx)
    assert raised.value.code == NOT_DEPLOYED
    assert factory.operations() == [("ecs", "describe_services")]  # no service: nothing else is asked


def test_status_follows_the_rollout(
    factory: RecordingFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_context(tmp_path, client_factory=factory)
    adapter = EcsAdapter()
    ctx.state.update(adapter.provision(ctx))
    ctx.state.update(adapter.deploy(ctx).state)
    factory.calls.clear()
    missing = adapter.status(ctx)
    assert (missing.state, missing.healthy) == ("NOT_FOUND", False)
    assert missing.details["command"] == CREATE_SERVICE_COMMAND
    assert factory.operations() == [("ecs", "describe_services")]
    assert factory.params("ecs", "describe_services") == [{"cluster": APP, "services": [APP]}]

    subnet, group = network()
    ctx.options = {"subnets": [subnet], "security_groups": [group]}
    adapter.deploy(ctx)  # moto: no task running yet, the rollout stays IN_PROGRESS
    factory.calls.clear()
    deploying = adapter.status(ctx)
    assert (deploying.state, deploying.healthy, deploying.deployment_id) == ("DEPLOYING", False, f"{APP}:2")
    assert factory.operations() == [("ecs", "describe_services")]  # no task address while rolling out

    monkeypatch.setenv("MOTO_ECS_SERVICE_RUNNING", "1")
    boto3.client("ecs", region_name=REGION).delete_service(cluster=APP, service=APP, force=True)
    ctx.state.pop("create_service_command")
    adapter.deploy(ctx)
    factory.calls.clear()
    running = adapter.status(ctx)
    assert (running.state, running.healthy, running.deployment_id) == ("RUNNING", True, f"{APP}:3")
    # Running: the service, then the best-effort task address (moto runs no task, so it stops there).
    assert factory.operations() == [("ecs", "describe_services"), ("ecs", "list_tasks")]
    assert factory.params("ecs", "list_tasks") == [
        {"cluster": APP, "serviceName": APP, "desiredStatus": "RUNNING"}
    ]
    assert running.url is None


def test_logs_are_the_newest_lines_across_streams(factory: RecordingFactory, tmp_path: Path) -> None:
    ctx = make_context(tmp_path, client_factory=factory)
    adapter = EcsAdapter()
    ctx.state.update(adapter.provision(ctx))
    logs = boto3.client("logs", region_name=REGION)
    now = int(time.time() * 1000)
    for stream, offsets in (("offline/server/task-a", (0, 2)), ("offline/server/task-b", (1, 3))):
        logs.create_log_stream(logGroupName=f"/ecs/{APP}", logStreamName=stream)
        logs.put_log_events(
            logGroupName=f"/ecs/{APP}",
            logStreamName=stream,
            logEvents=[{"timestamp": now + i * 1000, "message": f"line {i}"} for i in offsets],
        )
    factory.calls.clear()
    lines = adapter.logs(ctx, lines=3)
    assert [line.split(" ", 1)[1] for line in lines] == ["line 1", "line 2", "line 3"]
    stamp = datetime.fromtimestamp((now + 3000) / 1000, UTC).isoformat()
    assert lines[-1] == f"{stamp} line 3"
    # The newest streams first, then the tail of each: CloudWatch Logs only, nothing from ECS.
    assert factory.operations() == [
        ("logs", "describe_log_streams"),
        ("logs", "get_log_events"),
        ("logs", "get_log_events"),
    ]
    (described,) = factory.params("logs", "describe_log_streams")
    assert described["logGroupName"] == f"/ecs/{APP}"
    assert (described["orderBy"], described["descending"]) == ("LastEventTime", True)
    assert [
        (p["logStreamName"], p["limit"], p["startFromHead"]) for p in factory.params("logs", "get_log_events")
    ] == [("offline/server/task-b", 3, False), ("offline/server/task-a", 3, False)]


def test_logs_before_any_deploy_are_not_deployed(factory: RecordingFactory, tmp_path: Path) -> None:
    with pytest.raises(DeployError) as raised:
        EcsAdapter().logs(make_context(tmp_path, client_factory=factory))
    assert raised.value.code == NOT_DEPLOYED
    assert f"/ecs/{APP}" in raised.value.message
    assert factory.operations() == [("logs", "describe_log_streams")]


# -- readiness sequences moto cannot produce (Stubber) -----------------------------------------------------------

TASK_DEFINITION = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/{APP}:5"
OLD_TASK_DEFINITION = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/{APP}:4"


def ecs_service(*deployments: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "services": [
            {
                "serviceName": APP,
                "clusterArn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{APP}",
                "status": "ACTIVE",
                "desiredCount": 1,
                "runningCount": 1,
                "pendingCount": 0,
                "taskDefinition": TASK_DEFINITION,
                "deployments": [
                    {"id": f"ecs-svc/{i}", "status": status, "taskDefinition": td, "rolloutState": rollout}
                    for i, (status, td, rollout) in enumerate(deployments)
                ],
            }
        ],
        "failures": [],
    }


@pytest.fixture
def stubbed(tmp_path: Path) -> Iterator[tuple[DeployContext, Stubber, Stubber]]:
    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
    )
    clients = {name: session.client(name) for name in ("ecs", "ec2")}
    stubbers = [Stubber(clients["ecs"]), Stubber(clients["ec2"])]
    for stubber in stubbers:
        stubber.activate()
    ctx = make_context(tmp_path, client_factory=lambda name, region_name=None: clients[name])
    yield ctx, stubbers[0], stubbers[1]
    for stubber in stubbers:
        stubber.assert_no_pending_responses()
        stubber.deactivate()


DESCRIBE = {"cluster": APP, "services": [APP]}
OUTCOME = DeployOutcome("", f"{APP}:5", {"task_definition": TASK_DEFINITION, "service_created": True})


def test_wait_reports_deploying_then_running_at_the_task_public_ip(
    stubbed: tuple[DeployContext, Stubber, Stubber],
) -> None:
    ctx, ecs, ec2 = stubbed
    ecs.add_response(
        "describe_services",
        ecs_service(
            ("PRIMARY", TASK_DEFINITION, "IN_PROGRESS"), ("ACTIVE", OLD_TASK_DEFINITION, "COMPLETED")
        ),
        DESCRIBE,
    )
    ecs.add_response("describe_services", ecs_service(("PRIMARY", TASK_DEFINITION, "COMPLETED")), DESCRIBE)
    task = f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{APP}/0f1e2d"
    ecs.add_response(
        "list_tasks", {"taskArns": [task]}, {"cluster": APP, "serviceName": APP, "desiredStatus": "RUNNING"}
    )
    ecs.add_response(
        "describe_tasks",
        {
            "tasks": [
                {
                    "taskArn": task,
                    "attachments": [
                        {
                            "type": "ElasticNetworkInterface",
                            "details": [
                                {"name": "subnetId", "value": "subnet-1"},
                                {"name": "networkInterfaceId", "value": "eni-0abc"},
                            ],
                        }
                    ],
                }
            ]
        },
        {"cluster": APP, "tasks": [task]},
    )
    ec2.add_response(
        "describe_network_interfaces",
        {
            "NetworkInterfaces": [
                {"NetworkInterfaceId": "eni-0abc", "Association": {"PublicIp": "203.0.113.7"}}
            ]
        },
        {"NetworkInterfaceIds": ["eni-0abc"]},
    )
    report = EcsAdapter().wait_until_healthy(ctx, OUTCOME)
    assert (report.state, report.healthy, report.url) == ("RUNNING", True, "http://203.0.113.7:3001")
    assert "DEPLOYING" in reporter_of(ctx).text()


def test_a_rollout_the_circuit_breaker_stopped_is_a_failure(
    stubbed: tuple[DeployContext, Stubber, Stubber],
) -> None:
    ctx, ecs, _ = stubbed
    # The breaker made a new PRIMARY deployment of the old revision; ours is left FAILED.
    ecs.add_response(
        "describe_services",
        ecs_service(("PRIMARY", OLD_TASK_DEFINITION, "IN_PROGRESS"), ("ACTIVE", TASK_DEFINITION, "FAILED")),
        DESCRIBE,
    )
    with pytest.raises(DeployError) as raised:
        EcsAdapter().wait_until_healthy(ctx, OUTCOME)
    assert raised.value.code == PLATFORM_ERROR
    assert f"{APP}:5 failed" in raised.value.message
    assert "offline deploy logs" in raised.value.hint


def test_a_rollout_that_never_completes_times_out(stubbed: tuple[DeployContext, Stubber, Stubber]) -> None:
    ctx, ecs, _ = stubbed
    for _ in range(4):  # health_timeout 3 s at a 1 s interval
        ecs.add_response(
            "describe_services", ecs_service(("PRIMARY", TASK_DEFINITION, "IN_PROGRESS")), DESCRIBE
        )
    with pytest.raises(DeployError) as raised:
        EcsAdapter().wait_until_healthy(ctx, OUTCOME)
    assert raised.value.code == HEALTH_TIMEOUT


# -- prerequisites and failures ----------------------------------------------------------------------------------


def test_no_credentials_is_not_authenticated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The real credential chain (no client_factory), with no keys, no profile files and no instance metadata.
    set_fake_aws_credentials(monkeypatch, tmp_path, keys=False)
    ctx = make_context(tmp_path)
    with pytest.raises(DeployError) as raised:
        EcsAdapter().check_prerequisites(ctx)
    assert raised.value.code == NOT_AUTHENTICATED
    assert "cloud CLI is not authenticated" in raised.value.message
    assert "aws configure" in raised.value.hint and "AWS_SECRET_ACCESS_KEY" in raised.value.hint


def test_credentials_and_region_come_from_the_given_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    set_fake_aws_credentials(monkeypatch, tmp_path, keys=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    env = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_REGION": "ap-south-1"}
    with mock_aws():
        ctx = make_context(tmp_path, env=env, region=None)
        session = AwsSession.for_context(ctx)
        assert session.region == "ap-south-1"
        # The keys of the shell the deploy runs in, not whatever the test process has (moto's own).
        boto3_session: Any = getattr(session.factory, "__self__", None)  # the bound Session.client
        assert boto3_session.get_credentials().access_key == "AKIDEXAMPLE"
        adapter = EcsAdapter()
        adapter.check_prerequisites(ctx)
        state = adapter.provision(ctx)
    assert state["region"] == "ap-south-1"
    assert state["repository_uri"].startswith(f"{ACCOUNT}.dkr.ecr.ap-south-1.")


def test_management_commands_need_no_engine(factory: RecordingFactory, tmp_path: Path) -> None:
    ctx = make_context(tmp_path, client_factory=factory)
    ctx.engine = None
    EcsAdapter().check_prerequisites(ctx)
    assert factory.operations() == [("sts", "get_caller_identity")]


def test_a_stopped_engine_is_daemon_unavailable(factory: RecordingFactory, tmp_path: Path) -> None:
    ctx = make_context(tmp_path, client_factory=factory, engine=FakeEngine(down=True))
    with pytest.raises(DeployError) as raised:
        EcsAdapter().check_prerequisites(ctx)
    assert raised.value.code == DAEMON_UNAVAILABLE
    assert "cannot connect to the container daemon" in raised.value.message


def test_an_arm_image_is_refused_before_touching_ecr(factory: RecordingFactory, tmp_path: Path) -> None:
    ctx = make_context(tmp_path, client_factory=factory, engine=FakeEngine(platform="linux/arm64"))
    adapter = EcsAdapter()
    ctx.state.update(adapter.provision(ctx))
    factory.calls.clear()
    with pytest.raises(DeployError) as raised:
        adapter.deploy(ctx)
    assert raised.value.code == WRONG_ARCHITECTURE
    assert "image does not provide linux/amd64 platform" in raised.value.message
    assert factory.calls == []


def test_an_explicit_execution_role_is_used(factory: RecordingFactory, tmp_path: Path) -> None:
    role = f"arn:aws:iam::{ACCOUNT}:role/my-exec"
    ctx = make_context(tmp_path, client_factory=factory, options={"execution_role_arn": role})
    adapter = EcsAdapter()
    ctx.state.update(adapter.provision(ctx))
    outcome = adapter.deploy(ctx)
    assert factory.params("ecs", "register_task_definition")[0]["executionRoleArn"] == role
    assert outcome.state["execution_role_arn"] == role
    assert ("sts", "get_caller_identity") not in factory.operations()


def test_one_forwarded_variable_is_named_with_is(factory: RecordingFactory, tmp_path: Path) -> None:
    ctx = make_context(
        tmp_path, client_factory=factory, with_secrets=False, env={"DATABASE_URL": DATABASE_URL}
    )
    deploy_like_the_command(EcsAdapter(), ctx)
    assert "DATABASE_URL is set in the task definition's environment" in reporter_of(ctx).text()


def test_the_last_task_address_is_what_the_next_client_build_starts_from(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    assert EcsAdapter().public_url(ctx) is None  # first deploy: no task has run yet
    ctx.state["url"] = "http://203.0.113.7:3001"
    assert EcsAdapter().public_url(ctx) == "http://203.0.113.7:3001"


def test_the_wait_shows_each_new_ecs_event_once(stubbed: tuple[DeployContext, Stubber, Stubber]) -> None:
    from datetime import UTC, datetime

    ctx, ecs, _ = stubbed

    def with_events(response: dict[str, Any], *messages: str) -> dict[str, Any]:
        # ECS lists events newest first.
        response["services"][0]["events"] = [
            {"id": f"ev-{index}", "createdAt": datetime(2025, 1, 1, tzinfo=UTC), "message": message}
            for index, message in reversed(list(enumerate(messages)))
        ]
        return response

    rolling = (("PRIMARY", TASK_DEFINITION, "IN_PROGRESS"), ("ACTIVE", OLD_TASK_DEFINITION, "COMPLETED"))
    old = "(service todo-app) has reached a steady state."
    started = "(service todo-app) has started 1 tasks: (task 0f1e2d)."
    ecs.add_response("describe_services", with_events(ecs_service(*rolling), old, started), DESCRIBE)
    ecs.add_response("describe_services", with_events(ecs_service(*rolling), old, started), DESCRIBE)
    done = with_events(ecs_service(("PRIMARY", TASK_DEFINITION, "COMPLETED")), old, started, old)
    ecs.add_response("describe_services", done, DESCRIBE)
    ecs.add_response(
        "list_tasks", {"taskArns": []}, {"cluster": APP, "serviceName": APP, "desiredStatus": "RUNNING"}
    )
    report = EcsAdapter().wait_until_healthy(ctx, OUTCOME)
    assert report.state == "RUNNING"
    shown = [message for message in reporter_of(ctx).text().splitlines() if message.startswith("ECS: ")]
    # The first look shows only the newest event (older ones are history); each new one appears once.
    assert shown == [f"ECS: {started}", f"ECS: {old}"]
    rollout = [
        line.split(": ", 1)[1].split(",")[0]
        for line in reporter_of(ctx).text().splitlines()
        if line.startswith("ECS rollout of")
    ]
    assert rollout == ["IN_PROGRESS", "COMPLETED"]  # the second identical look said nothing new
