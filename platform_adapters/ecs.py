"""``--platform cloud-a-orchestrated``: AWS ECS on Fargate with ECR and CloudWatch Logs (SPEC 4.6 rule 6).

Provisioning creates (when missing) an ECR repository, an ECS cluster and a log group, all named after the
app. Each deploy builds the image locally for linux/amd64, pushes it to ECR, registers a Fargate task
definition revision (awsvpc, 0.25 vCPU / 512 MiB, a ``/health`` container health check, awslogs logging),
and points the service at it. A service needs account-specific network settings, so the first deploy creates
it only when ``--subnets`` and ``--security-groups`` are given; otherwise it registers the task definition and
prints the exact ``aws ecs create-service`` command to run, and later deploys update that service.

Choices worth knowing:

- The task's execution role (which lets ECS pull from ECR and write logs) is ``--execution-role-arn`` or the
  AWS-documented default ``ecsTaskExecutionRole`` of the account; the ECS console creates that role the first
  time it is used, or follow the "Amazon ECS task execution IAM role" guide.
- DATABASE_URL, AUTH_SECRET, PUBLIC_URL and the OFFLINE_*_TOKEN ones, when set locally, go into the task
  definition's environment. Anyone who can read task definitions (console, ``describe-task-definition``) can
  read them; for stricter handling store them in AWS Secrets Manager and reference them from the container's
  ``secrets`` instead. Each revision carries the whole environment, so the admin token the first deploy
  generated is read back from the service's current revision and sent again.
- A Fargate task has no persistent disk: without DATABASE_URL the deploy command refuses unless
  ``--ephemeral-data`` accepts that.
- There is no load balancer: the app is reached at the task's public IP on the server port over plain HTTP,
  found best-effort through the task's network interface. The IP changes with every new task; put an
  Application Load Balancer in front for a stable https URL.
- Rollback points the service at an earlier ACTIVE revision of the task definition family; services this
  adapter creates have the deployment circuit breaker with automatic rollback switched on.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ._aws import (
    AwsSession,
    aws_call,
    aws_call_or_none,
    check_engine,
    import_boto3,
    poll,
    require_amd64,
    validate_app_name,
)
from .base import (
    HEALTH_TIMEOUT,
    NO_PREVIOUS_DEPLOYMENT,
    NOT_DEPLOYED,
    PLATFORM_ERROR,
    SECRET_VARIABLES,
    DeployContext,
    DeployError,
    Deployment,
    DeploymentState,
    DeployOutcome,
    PlatformAdapter,
    StatusReport,
    forwarded_environment,
    report_change,
)

__all__ = [
    "CONTAINER_NAME",
    "DEFAULT_EXECUTION_ROLE",
    "EcsAdapter",
    "EcsNames",
    "ecs_create_service_command",
    "ecs_create_service_request",
    "ecs_names",
    "ecs_task_definition",
    "health_check_command",
    "rollout_state",
]

CONTAINER_NAME = "server"
#: The role name AWS's ECS guides (and the console) use for the task execution role.
DEFAULT_EXECUTION_ROLE = "ecsTaskExecutionRole"
TASK_CPU = "256"
TASK_MEMORY = "512"
LOG_RETENTION_DAYS = 30
LOG_STREAM_PREFIX = "offline"
_LOG_STREAMS_READ = 5


@dataclass(frozen=True)
class EcsNames:
    """The AWS resources of one app (all derived from the app name unless deploy.json says otherwise)."""

    cluster: str
    service: str
    family: str
    repository: str
    log_group: str
    container: str = CONTAINER_NAME


def ecs_names(app: str, state: Mapping[str, Any] | None = None) -> EcsNames:
    state = state or {}
    return EcsNames(
        cluster=str(state.get("cluster") or app),
        service=str(state.get("service") or app),
        family=str(state.get("family") or app),
        repository=str(state.get("repository") or app),
        log_group=str(state.get("log_group") or f"/ecs/{app}"),
    )


# -- request shapes, as data ------------------------------------------------------------------------------------


def health_check_command(port: int) -> list[str]:
    """The container health check: the image has python3 (it runs the server zipapp) but maybe no curl."""
    script = (
        "import sys, urllib.request; "
        f"sys.exit(0 if urllib.request.urlopen('http://localhost:{port}/health', timeout=4).status == 200 else 1)"
    )
    return ["CMD", "python3", "-c", script]


def ecs_task_definition(
    family: str,
    image: str,
    port: int,
    region: str,
    log_group: str,
    env: Mapping[str, str],
    *,
    execution_role_arn: str,
    container_name: str = CONTAINER_NAME,
) -> dict[str, Any]:
    """Keyword arguments of ``register_task_definition`` for one Fargate container serving ``port``."""
    environment = {"PORT": str(port), **forwarded_environment(env)}
    return {
        "family": family,
        "networkMode": "awsvpc",
        "requiresCompatibilities": ["FARGATE"],
        "cpu": TASK_CPU,
        "memory": TASK_MEMORY,
        "runtimePlatform": {"cpuArchitecture": "X86_64", "operatingSystemFamily": "LINUX"},
        "executionRoleArn": execution_role_arn,
        "containerDefinitions": [
            {
                "name": container_name,
                "image": image,
                "essential": True,
                "portMappings": [{"containerPort": port, "hostPort": port, "protocol": "tcp"}],
                "environment": [
                    {"name": name, "value": value} for name, value in sorted(environment.items())
                ],
                "logConfiguration": {
                    "logDriver": "awslogs",
                    "options": {
                        "awslogs-group": log_group,
                        "awslogs-region": region,
                        "awslogs-stream-prefix": LOG_STREAM_PREFIX,
                    },
                },
                "healthCheck": {
                    "command": health_check_command(port),
                    "interval": 30,
                    "timeout": 5,
                    "retries": 3,
                    "startPeriod": 20,
                },
            }
        ],
    }


def ecs_create_service_request(
    cluster: str,
    service: str,
    task_definition: str,
    subnets: Sequence[str],
    security_groups: Sequence[str],
) -> dict[str, Any]:
    """Keyword arguments of ``create_service``: one public Fargate task, rolled back by the circuit breaker
    when a new revision never gets healthy."""
    return {
        "cluster": cluster,
        "serviceName": service,
        "taskDefinition": task_definition,
        "desiredCount": 1,
        "launchType": "FARGATE",
        "networkConfiguration": {
            "awsvpcConfiguration": {
                "subnets": list(subnets),
                "securityGroups": list(security_groups),
                "assignPublicIp": "ENABLED",
            }
        },
        "deploymentConfiguration": {
            "deploymentCircuitBreaker": {"enable": True, "rollback": True},
            "maximumPercent": 200,
            "minimumHealthyPercent": 100,
        },
    }


def ecs_create_service_command(
    region: str,
    cluster: str,
    service: str,
    task_definition: str,
    subnets: Sequence[str] = ("<subnet-id>",),
    security_groups: Sequence[str] = ("<security-group-id>",),
) -> str:
    """The AWS CLI command equivalent to ``ecs_create_service_request`` (printed when we cannot run it)."""
    network = (
        f"awsvpcConfiguration={{subnets=[{','.join(subnets)}],"
        f"securityGroups=[{','.join(security_groups)}],assignPublicIp=ENABLED}}"
    )
    deployment = (
        "deploymentCircuitBreaker={enable=true,rollback=true},maximumPercent=200,minimumHealthyPercent=100"
    )
    argv = [
        "aws",
        "ecs",
        "create-service",
        "--region",
        region,
        "--cluster",
        cluster,
        "--service-name",
        service,
        "--task-definition",
        task_definition,
        "--desired-count",
        "1",
        "--launch-type",
        "FARGATE",
        "--network-configuration",
        network,
        "--deployment-configuration",
        deployment,
    ]
    return shlex.join(argv)


def rollout_state(deployment: Mapping[str, Any]) -> str:
    """COMPLETED, IN_PROGRESS or FAILED for one entry of a service's ``deployments``."""
    state = deployment.get("rolloutState")
    if state:
        return str(state)
    # Services on other deployment controllers report no rolloutState; judge by the task counts.
    done = deployment.get("runningCount", 0) >= deployment.get("desiredCount", 0)
    return "COMPLETED" if done and not deployment.get("pendingCount") else "IN_PROGRESS"


def _revision_id(arn: str) -> str:
    """``family:revision`` from a task definition ARN (or an id that already is one)."""
    return arn.rsplit("/", 1)[-1]


def _revision_number(arn: str) -> int:
    return int(_revision_id(arn).rsplit(":", 1)[-1])


def _as_list(value: Any) -> list[str]:
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(item).strip() for item in items if str(item).strip()]


# -- the adapter -------------------------------------------------------------------------------------------------


class EcsAdapter(PlatformAdapter):
    name = "cloud-a-orchestrated"
    title = "AWS ECS on Fargate"
    default_region = None  # from the AWS configuration (DESIGN.md section 6)
    regions = (
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
        "ca-central-1",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "eu-central-1",
        "eu-north-1",
        "ap-south-1",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-southeast-1",
        "ap-southeast-2",
        "sa-east-1",
    )
    needs_container_engine = True
    persistent_storage = False

    def __init__(self) -> None:
        self._session: AwsSession | None = None
        self._session_ctx: DeployContext | None = None
        self._provisioned: dict[str, Any] = {}

    def _aws(self, ctx: DeployContext) -> AwsSession:
        if self._session is None or self._session_ctx is not ctx:
            self._session = AwsSession.for_context(ctx)
            self._session_ctx = ctx
        return self._session

    def _names(self, ctx: DeployContext) -> EcsNames:
        return ecs_names(ctx.app, {**self._provisioned, **ctx.state})

    def _setting(self, ctx: DeployContext, key: str) -> list[str]:
        return _as_list(ctx.options.get(key)) or _as_list(ctx.state.get(key))

    def _find_service(self, ctx: DeployContext) -> dict[str, Any] | None:
        names = self._names(ctx)
        found = aws_call_or_none(
            self._aws(ctx).client("ecs"),
            "describe_services",
            ("ClusterNotFoundException",),
            cluster=names.cluster,
            services=[names.service],
        )
        for service in (found or {}).get("services") or []:
            # A deleted service lingers as DRAINING/INACTIVE; only an ACTIVE one can be updated.
            if service.get("status") == "ACTIVE":
                return dict(service)
        return None

    # -- deploy ---------------------------------------------------------------------------------------------

    def check_prerequisites(self, ctx: DeployContext) -> None:
        """boto3 and valid credentials; for a deploy (``ctx.engine`` set) also a running engine. The AWS
        CLI is not needed: ECR logins go through the engine with a token from the API."""
        import_boto3()
        self._aws(ctx).identity()
        if ctx.engine is not None:
            check_engine(ctx.engine)

    def public_url(self, ctx: DeployContext) -> str | None:
        # Without a load balancer the address is a task's public IP, which changes with every new task: the
        # last one known is the best guess for the client build, and the deploy command warns only when
        # the new task really answers elsewhere.
        return str(ctx.state["url"]) if ctx.state.get("url") else None

    def existing_secrets(self, ctx: DeployContext) -> dict[str, str | None]:
        service = self._find_service(ctx)
        arn = (service or {}).get("taskDefinition")
        if not arn:
            return {}
        described = aws_call(
            self._aws(ctx).client("ecs"), "describe_task_definition", taskDefinition=str(arn)
        )
        containers = (described.get("taskDefinition") or {}).get("containerDefinitions") or []
        environment = {
            str(item.get("name")): str(item.get("value") or "")
            for container in containers
            if container.get("name") == self._names(ctx).container
            for item in container.get("environment") or []
        }
        return {name: environment[name] for name in SECRET_VARIABLES if environment.get(name)}

    def planned_resources(self, ctx: DeployContext) -> list[str]:
        names = self._names(ctx)
        subnets = self._setting(ctx, "subnets")
        groups = self._setting(ctx, "security_groups")
        lines = [
            f"ECR repository {names.repository}, ECS cluster {names.cluster}, log group {names.log_group} "
            "(when missing)",
            f"an image built here for linux/amd64 and pushed to ECR, then task definition revision {names.family}",
        ]
        if subnets and groups:
            lines.append(f"Fargate service {names.service} (0.25 vCPU, 512 MiB, 1 task; billed per hour)")
        else:
            lines.append(
                "no service yet without --subnets/--security-groups (the command to create it is printed)"
            )
        return lines

    def provision(self, ctx: DeployContext) -> dict[str, Any]:
        validate_app_name(ctx.app)
        session = self._aws(ctx)
        names = self._names(ctx)

        ecr = session.client("ecr")
        found = aws_call_or_none(
            ecr, "describe_repositories", ("RepositoryNotFoundException",), repositoryNames=[names.repository]
        )
        repositories = (found or {}).get("repositories") or []
        if repositories:
            repository = repositories[0]
        else:
            ctx.reporter.step(f"Creating ECR repository {names.repository}")
            repository = aws_call(
                ecr,
                "create_repository",
                repositoryName=names.repository,
                imageScanningConfiguration={"scanOnPush": True},
            )["repository"]

        ecs = session.client("ecs")
        clusters = aws_call(ecs, "describe_clusters", clusters=[names.cluster]).get("clusters") or []
        if not any(cluster.get("status") == "ACTIVE" for cluster in clusters):
            ctx.reporter.step(f"Creating ECS cluster {names.cluster}")
            aws_call(ecs, "create_cluster", clusterName=names.cluster)

        logs = session.client("logs")
        created = aws_call_or_none(
            logs, "create_log_group", ("ResourceAlreadyExistsException",), logGroupName=names.log_group
        )
        if created is not None:
            ctx.reporter.step(f"Created log group {names.log_group} (kept {LOG_RETENTION_DAYS} days)")
            aws_call(
                logs, "put_retention_policy", logGroupName=names.log_group, retentionInDays=LOG_RETENTION_DAYS
            )

        self._provisioned = {
            "region": session.region,
            "cluster": names.cluster,
            "service": names.service,
            "family": names.family,
            "repository": names.repository,
            "repository_uri": repository["repositoryUri"],
            "log_group": names.log_group,
        }
        return dict(self._provisioned)

    def _repository_uri(self, ctx: DeployContext, names: EcsNames) -> str:
        known = self._provisioned.get("repository_uri") or ctx.state.get("repository_uri")
        if known:
            return str(known)
        found = aws_call(
            self._aws(ctx).client("ecr"), "describe_repositories", repositoryNames=[names.repository]
        )
        return str(found["repositories"][0]["repositoryUri"])

    def _execution_role(self, ctx: DeployContext) -> str:
        explicit = ctx.options.get("execution_role_arn") or ctx.state.get("execution_role_arn")
        if explicit:
            return str(explicit)
        identity = self._aws(ctx).identity()
        partition = str(identity.get("Arn", "arn:aws:")).split(":")[1] or "aws"
        ctx.reporter.info(
            f"Tasks run with the execution role {DEFAULT_EXECUTION_ROLE} (it lets ECS pull the image and write "
            "logs). If your account lacks it, create it: IAM > Roles > AWS service > Elastic Container Service "
            "Task, with the AmazonECSTaskExecutionRolePolicy policy."
        )
        return f"arn:{partition}:iam::{identity['Account']}:role/{DEFAULT_EXECUTION_ROLE}"

    def deploy(self, ctx: DeployContext) -> DeployOutcome:
        session = self._aws(ctx)
        names = self._names(ctx)
        engine = ctx.engine if ctx.engine is not None else check_engine(None)
        local_tag = f"offline-{ctx.app}:latest"

        ctx.reporter.step("Building the image for linux/amd64")
        image_id = engine.build(ctx.deploy_dir, local_tag)
        require_amd64(engine, local_tag)

        ctx.reporter.step(f"Pushing the image to ECR repository {names.repository}")
        repository_uri = self._repository_uri(ctx, names)
        digest_hex = image_id.split(":", 1)[-1]
        remote_tag = f"{repository_uri}:{digest_hex[:12] if digest_hex else 'latest'}"
        auth = aws_call(session.client("ecr"), "get_authorization_token")["authorizationData"][0]
        username, _, password = base64.b64decode(auth["authorizationToken"]).decode().partition(":")
        engine.tag(local_tag, remote_tag)
        digest = engine.push(remote_tag, username=username, password=password)
        # The digest pins the revision to exactly this image, so a rollback cannot pick up a re-pushed tag.
        image = f"{repository_uri}@{digest}" if digest.startswith("sha256:") else remote_tag
        ctx.reporter.info(f"Pushed {remote_tag}.")

        ctx.reporter.step(f"Registering task definition {names.family}")
        forwarded = sorted(forwarded_environment(ctx.env))
        if forwarded:
            verb = "is" if len(forwarded) == 1 else "are"
            ctx.reporter.warn(
                f"{', '.join(forwarded)} {verb} set in the task definition's environment, readable by anyone "
                "who can view task definitions; AWS Secrets Manager (container `secrets`) is the stricter option."
            )
        request = ecs_task_definition(
            names.family,
            image,
            ctx.port,
            session.region,
            names.log_group,
            ctx.env,
            execution_role_arn=self._execution_role(ctx),
            container_name=names.container,
        )
        ecs = session.client("ecs")
        registered = aws_call(ecs, "register_task_definition", **request)["taskDefinition"]
        arn = str(registered["taskDefinitionArn"])
        revision = _revision_id(arn)

        state: dict[str, Any] = {
            **self._provisioned,
            "region": session.region,
            "cluster": names.cluster,
            "service": names.service,
            "family": names.family,
            "repository": names.repository,
            "repository_uri": repository_uri,
            "log_group": names.log_group,
            "task_definition": arn,
            "image": image,
            "execution_role_arn": request["executionRoleArn"],
        }
        subnets = self._setting(ctx, "subnets")
        security_groups = self._setting(ctx, "security_groups")
        if subnets:
            state["subnets"] = subnets
        if security_groups:
            state["security_groups"] = security_groups

        if self._find_service(ctx) is not None:
            ctx.reporter.step(f"Updating service {names.service} to {revision}")
            aws_call(
                ecs,
                "update_service",
                cluster=names.cluster,
                service=names.service,
                taskDefinition=arn,
                forceNewDeployment=True,
            )
            state["service_created"] = True
            state["create_service_command"] = None  # an earlier first deploy's advice no longer applies
        elif subnets and security_groups:
            ctx.reporter.step(f"Creating service {names.service} with {revision}")
            aws_call(
                ecs,
                "create_service",
                **ecs_create_service_request(names.cluster, names.service, arn, subnets, security_groups),
            )
            ctx.reporter.info(
                f"The security groups must allow inbound TCP {ctx.port}, and the subnets need internet access "
                "(public subnets) to pull the image."
            )
            state["service_created"] = True
            state["create_service_command"] = None  # an earlier first deploy's advice no longer applies
        else:
            command = ecs_create_service_command(session.region, names.cluster, names.service, revision)
            ctx.reporter.warn(
                f"Registered {revision}, but the service {names.service} does not exist yet: creating it needs "
                "your account's network settings."
            )
            ctx.reporter.info(f"Create it with:\n  {command}")
            ctx.reporter.info(
                f"Replace <subnet-id> with public subnets (internet access) and <security-group-id> with a "
                f"security group allowing inbound TCP {ctx.port}; or run `offline deploy --subnets <subnet-id> "
                "--security-groups <security-group-id>`. Later deploys update the service automatically."
            )
            state["service_created"] = False
            state["create_service_command"] = command
        return DeployOutcome(url="", deployment_id=revision, state=state)

    def wait_until_healthy(self, ctx: DeployContext, outcome: DeployOutcome) -> StatusReport:
        names = self._names(ctx)
        if outcome.state.get("service_created") is False:
            ctx.reporter.info(
                f"Skipping the health wait: service {names.service} does not exist yet (see the command above)."
            )
            return StatusReport(
                "NOT_FOUND",
                False,
                None,
                outcome.deployment_id,
                {"reason": "service not created", "command": outcome.state.get("create_service_command")},
            )
        expected = str(outcome.state.get("task_definition") or outcome.deployment_id)
        announced = False
        seen: list[str] = []
        shown_events: set[str] | None = (
            None  # the first look shows only the newest event: the rest is history
        )

        def probe(_: int) -> StatusReport | None:
            nonlocal announced, shown_events
            service = self._find_service(ctx)
            if service is None:
                raise DeployError(
                    f"The ECS service {names.service} disappeared from cluster {names.cluster}.",
                    PLATFORM_ERROR,
                    {"service": names.service, "cluster": names.cluster},
                    hint="Check the ECS console, then run `offline deploy` again.",
                )
            deployment = _deployment_for(service, expected)
            state = rollout_state(deployment) if deployment else "IN_PROGRESS"
            # ECS lists its service events newest first; each new one is shown once, oldest first.
            events = list(service.get("events") or [])
            if shown_events is None:
                shown_events = {str(e.get("id") or e.get("message")) for e in events[1:]}
            for event in reversed(events):
                key = str(event.get("id") or event.get("message"))
                if key not in shown_events:
                    shown_events.add(key)
                    ctx.reporter.info(f"ECS: {event.get('message')}")
            if deployment:
                running = (
                    f"{deployment.get('runningCount', 0)}/{deployment.get('desiredCount', 0)} tasks running"
                )
                report_change(
                    ctx.reporter, seen, f"ECS rollout of {_revision_id(expected)}: {state}, {running}"
                )
            if state == "FAILED":
                reason = (deployment or {}).get("rolloutStateReason") or "the tasks did not become healthy"
                raise DeployError(
                    f"The ECS rollout of {_revision_id(expected)} failed: {reason}",
                    PLATFORM_ERROR,
                    {"service": names.service, "task_definition": _revision_id(expected)},
                    hint="Read `offline deploy logs`; the circuit breaker returns the service to the last "
                    "working revision.",
                )
            if state == "COMPLETED":
                return StatusReport(
                    "RUNNING", True, self._task_url(ctx, names), _revision_id(expected), _details(service)
                )
            if not announced:
                ctx.reporter.info(
                    f"ECS is rolling out {_revision_id(expected)} (DEPLOYING); this takes 2 to 5 minutes."
                )
                announced = True
            return None

        report = poll(ctx, probe)
        if report is None:
            raise DeployError(
                f"ECS did not report the rollout of {_revision_id(expected)} completed within "
                f"{ctx.health_timeout:.0f} s.",
                HEALTH_TIMEOUT,
                {"service": names.service, "task_definition": _revision_id(expected)},
                hint="Check `offline deploy status` and `offline deploy logs`.",
            )
        return report

    def _task_url(self, ctx: DeployContext, names: EcsNames) -> str | None:
        """``http://<public ip>:<port>`` of a running task, best-effort (None when it cannot be found)."""
        session = self._aws(ctx)
        try:
            ecs = session.client("ecs")
            arns = aws_call(
                ecs, "list_tasks", cluster=names.cluster, serviceName=names.service, desiredStatus="RUNNING"
            ).get("taskArns")
            if not arns:
                return None
            tasks = aws_call(ecs, "describe_tasks", cluster=names.cluster, tasks=list(arns)[:10]).get("tasks")
            interfaces = [
                detail["value"]
                for task in tasks or []
                for attachment in task.get("attachments") or []
                if attachment.get("type") == "ElasticNetworkInterface"
                for detail in attachment.get("details") or []
                if detail.get("name") == "networkInterfaceId"
            ]
            if not interfaces:
                return None
            described = aws_call(
                session.client("ec2"), "describe_network_interfaces", NetworkInterfaceIds=interfaces
            )
        except DeployError:
            return None
        for interface in described.get("NetworkInterfaces") or []:
            ip = (interface.get("Association") or {}).get("PublicIp")
            if ip:
                return f"http://{ip}:{ctx.port}"
        return None

    # -- management -----------------------------------------------------------------------------------------

    def status(self, ctx: DeployContext) -> StatusReport:
        names = self._names(ctx)
        service = self._find_service(ctx)
        if service is None:
            details: dict[str, Any] = {"service": names.service, "cluster": names.cluster}
            if ctx.state.get("create_service_command"):
                details["command"] = ctx.state["create_service_command"]
            return StatusReport("NOT_FOUND", False, None, None, details)
        primary = next((d for d in service.get("deployments") or [] if d.get("status") == "PRIMARY"), None)
        rollout = rollout_state(primary) if primary else "COMPLETED"
        state: DeploymentState
        healthy = False
        if rollout == "IN_PROGRESS":
            state = "DEPLOYING"
        elif rollout == "FAILED":
            state = "FAILED"
        elif service.get("desiredCount", 0) == 0:
            state = "STOPPED"
        else:
            state = "RUNNING"
            healthy = service.get("runningCount", 0) >= service.get("desiredCount", 0)
        url = self._task_url(ctx, names) if state == "RUNNING" else None
        task_definition = service.get("taskDefinition")
        return StatusReport(
            state, healthy, url, _revision_id(task_definition) if task_definition else None, _details(service)
        )

    def logs(self, ctx: DeployContext, *, lines: int = 100) -> list[str]:
        names = self._names(ctx)
        logs = self._aws(ctx).client("logs")
        streams = aws_call_or_none(
            logs,
            "describe_log_streams",
            ("ResourceNotFoundException",),
            logGroupName=names.log_group,
            orderBy="LastEventTime",
            descending=True,
            limit=_LOG_STREAMS_READ,
        )
        if streams is None:
            raise DeployError(
                f"The log group {names.log_group} does not exist in {self._aws(ctx).region}.",
                NOT_DEPLOYED,
                {"log_group": names.log_group},
                hint="Run `offline deploy --platform cloud-a-orchestrated` first.",
            )
        events: list[tuple[int, str]] = []
        for stream in streams.get("logStreams") or []:
            page = aws_call(
                logs,
                "get_log_events",
                logGroupName=names.log_group,
                logStreamName=stream["logStreamName"],
                limit=max(lines, 1),
                startFromHead=False,
            )
            events.extend(
                (int(e.get("timestamp", 0)), str(e.get("message", ""))) for e in page.get("events") or []
            )
        events.sort(key=lambda event: event[0])
        formatted = [
            f"{datetime.fromtimestamp(stamp / 1000, UTC).isoformat()} {message.rstrip()}"
            for stamp, message in events
        ]
        return formatted[-lines:] if lines > 0 else []

    def _revisions(self, ctx: DeployContext) -> list[str]:
        """ACTIVE task definition ARNs of the family, newest first."""
        family = self._names(ctx).family
        ecs = self._aws(ctx).client("ecs")
        arns: list[str] = []
        params: dict[str, Any] = {"familyPrefix": family, "status": "ACTIVE", "sort": "DESC"}
        while True:
            page = aws_call(ecs, "list_task_definitions", **params)
            # familyPrefix is a prefix: "app" also lists "app-worker".
            arns.extend(
                arn
                for arn in page.get("taskDefinitionArns") or []
                if _revision_id(arn).rsplit(":", 1)[0] == family
            )
            if not page.get("nextToken"):
                break
            params["nextToken"] = page["nextToken"]
        return sorted(arns, key=_revision_number, reverse=True)

    def deployments(self, ctx: DeployContext) -> list[Deployment]:
        service = self._find_service(ctx)
        current = service.get("taskDefinition") if service else None
        return [
            Deployment(id=_revision_id(arn), status="ACTIVE", current=arn == current)
            for arn in self._revisions(ctx)
        ]

    def rollback(self, ctx: DeployContext, deployment_id: str | None = None) -> DeployOutcome:
        names = self._names(ctx)
        service = self._find_service(ctx)
        if service is None:
            raise DeployError(
                f"The ECS service {names.service} does not exist in cluster {names.cluster}.",
                NOT_DEPLOYED,
                {"service": names.service, "cluster": names.cluster},
                hint="Deploy (and create the service) first; see `offline deploy status`.",
            )
        current = str(service.get("taskDefinition") or "")
        revisions = self._revisions(ctx)
        listed = ", ".join(_revision_id(arn) for arn in revisions) or "none"
        if deployment_id is not None:
            wanted = _revision_id(str(deployment_id))
            target = next(
                (arn for arn in revisions if _revision_id(arn) in (wanted, f"{names.family}:{wanted}")), None
            )
            if target is None or target == current:
                reason = (
                    "is the current one" if target else f"is not an ACTIVE revision (revisions: {listed})"
                )
                raise DeployError(
                    f"Cannot roll back {names.service} to {deployment_id}: it {reason}.",
                    NO_PREVIOUS_DEPLOYMENT,
                    {"service": names.service, "deployment": str(deployment_id)},
                    hint="Pick another revision from `offline deploy status` or the ECS console.",
                )
        else:
            current_number = _revision_number(current) if current else None
            target = next(
                (
                    arn
                    for arn in revisions
                    if current_number is None or _revision_number(arn) < current_number
                ),
                None,
            )
            if target is None:
                raise DeployError(
                    f"There is no earlier task definition revision of {names.family} to roll back to "
                    f"(revisions: {listed}).",
                    NO_PREVIOUS_DEPLOYMENT,
                    {"service": names.service, "family": names.family},
                    hint="Deploy a fixed version with `offline deploy` instead.",
                )
        ctx.reporter.step(f"Rolling {names.service} back to {_revision_id(target)}")
        aws_call(
            self._aws(ctx).client("ecs"),
            "update_service",
            cluster=names.cluster,
            service=names.service,
            taskDefinition=target,
        )
        return DeployOutcome(
            url="",
            deployment_id=_revision_id(target),
            state={
                "task_definition": target,
                "service_created": True,
                "rolled_back_to": _revision_id(target),
            },
        )


def _deployment_for(service: Mapping[str, Any], task_definition: str) -> Mapping[str, Any] | None:
    """The service deployment running ``task_definition`` (the PRIMARY one first: an older deployment of the
    same revision may still be draining), else the PRIMARY one."""
    deployments = sorted(service.get("deployments") or [], key=lambda d: d.get("status") != "PRIMARY")
    for deployment in deployments:
        if deployment.get("taskDefinition") == task_definition:
            return dict(deployment)
    return next((dict(d) for d in deployments if d.get("status") == "PRIMARY"), None)


def _details(service: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "service": service.get("serviceName"),
        "cluster": str(service.get("clusterArn", "")).rsplit("/", 1)[-1] or None,
        "desired": service.get("desiredCount"),
        "running": service.get("runningCount"),
        "pending": service.get("pendingCount"),
        "rollouts": [
            {
                "status": d.get("status"),
                "task_definition": _revision_id(str(d.get("taskDefinition", ""))),
                "rollout": rollout_state(d),
            }
            for d in service.get("deployments") or []
        ],
    }
