"""``--platform cloud-a-containers``: AWS Lightsail container services (SPEC 4.6 rules 4 and 5).

A service of power ``nano`` with one node is created once; each deploy builds the image locally for
linux/amd64, pushes it into the service's own registry with the AWS-documented
``aws lightsail push-container-image`` (which runs the lightsailctl plugin), and creates a deployment whose
public endpoint health-checks ``/health``. Lightsail has no waiter and no rollback API: readiness is polled
with ``get_container_services`` and a rollback redeploys the containers and endpoint of an earlier entry of
``get_container_service_deployments``.

The forwarded variables (DATABASE_URL, AUTH_SECRET, PUBLIC_URL, the OFFLINE_*_TOKEN ones) go only into the
deployment's container environment, which is what Lightsail stores for the running service; they never
reach argv, deploy.json or the reporter. Each deployment replaces the whole environment, so the admin token
the first deploy generated is read back from the current deployment and sent again. A rollback redeploys the
earlier deployment's environment as Lightsail kept it. A container service has no persistent disk: without
DATABASE_URL the deploy command refuses unless ``--ephemeral-data`` accepts that.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ._aws import (
    AWS_LOGIN_HINT,
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
    CLI_NOT_INSTALLED,
    HEALTH_TIMEOUT,
    NO_PREVIOUS_DEPLOYMENT,
    NOT_AUTHENTICATED,
    NOT_DEPLOYED,
    PLATFORM_ERROR,
    PUSH_PLUGIN_MISSING,
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
    "IMAGE_LABEL",
    "POWERS",
    "LightsailAdapter",
    "lightsail_deployment_request",
    "lightsail_push_argv",
    "lightsail_redeploy_request",
    "lightsail_state",
    "parse_pushed_image",
]

#: SPEC 8: the size values; the first deploy uses the smallest with one node.
POWERS = ("nano", "micro", "small", "medium", "large", "xlarge")
INITIAL_POWER = "nano"
INITIAL_SCALE = 1
CONTAINER_NAME = "server"
#: Pushed images become ``:<service>.<label>.<n>``, ``n`` counting up with each push.
IMAGE_LABEL = "offline"
PUSH_TIMEOUT = 1800.0

AWS_CLI_HINT = (
    "Install the AWS CLI v2 (https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html), "
    "then run `aws configure`."
)
LIGHTSAILCTL_HINT = (
    "Install the Lightsail Control plugin `lightsailctl` and put it on PATH: "
    "https://docs.aws.amazon.com/lightsail/latest/userguide/amazon-lightsail-install-software.html"
)
RESIZE_HINT = (
    "Change the size or node count later with `aws lightsail update-container-service --service-name {service} "
    "--power <nano|micro|small|medium|large|xlarge> --scale <n>`."
)

_HEALTH_CHECK = {
    "path": "/health",
    "intervalSeconds": 10,
    "timeoutSeconds": 5,
    "healthyThreshold": 2,
    "unhealthyThreshold": 3,
    "successCodes": "200-299",
}
# Service states in which Lightsail is still working and will settle by itself.
_BUSY_STATES = frozenset({"PENDING", "DEPLOYING", "UPDATING"})
_PUSHED = re.compile(r'Refer to this image as "(:[^"\s]+)"')


# -- request shapes, as data ------------------------------------------------------------------------------------


def lightsail_push_argv(region: str, service: str, label: str, image: str) -> list[str]:
    """The AWS-documented push: the CLI hands the image to lightsailctl, which uploads and registers it."""
    return [
        "aws",
        "lightsail",
        "push-container-image",
        "--region",
        region,
        "--service-name",
        service,
        "--label",
        label,
        "--image",
        image,
    ]


def parse_pushed_image(output: str) -> str | None:
    """``:service.label.n`` from the push command's output (``Refer to this image as ":svc.offline.3" ...``).
    The ``Image "..." registered`` line names the *local* image, which is no reference a deployment takes."""
    match = _PUSHED.search(output)
    return match.group(1) if match else None


def newest_pushed_image(images: Any, service: str, label: str) -> str | None:
    """The newest ``:service.label.n`` among ``get_container_images``' ``containerImages``."""
    prefix = f":{service}.{label}."
    best: tuple[int, str] | None = None
    for entry in images or []:
        name = str((entry or {}).get("image") or "")
        number = name[len(prefix) :]
        if name.startswith(prefix) and number.isdigit() and (best is None or int(number) > best[0]):
            best = (int(number), name)
    return best[1] if best else None


def lightsail_deployment_request(
    service: str, image: str, port: int, env: Mapping[str, str]
) -> dict[str, Any]:
    """Keyword arguments of ``create_container_service_deployment``: one container listening on ``port``
    with PORT and the forwarded variables of ``env`` set, exposed publicly with a ``/health`` check."""
    environment = {"PORT": str(port), **forwarded_environment(env)}
    return {
        "serviceName": service,
        "containers": {
            CONTAINER_NAME: {
                "image": image,
                "environment": environment,
                "ports": {str(port): "HTTP"},
            }
        },
        "publicEndpoint": {
            "containerName": CONTAINER_NAME,
            "containerPort": port,
            "healthCheck": dict(_HEALTH_CHECK),
        },
    }


def lightsail_redeploy_request(service: str, deployment: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments that deploy again what an entry of ``get_container_service_deployments`` ran."""
    request: dict[str, Any] = {"serviceName": service, "containers": deployment.get("containers", {})}
    if deployment.get("publicEndpoint"):
        request["publicEndpoint"] = deployment["publicEndpoint"]
    return request


def lightsail_state(service: Mapping[str, Any]) -> tuple[DeploymentState, bool]:
    """The service's state as ``offline deploy status`` reports it, and whether it serves a deployment."""
    state = service.get("state", "")
    current = service.get("currentDeployment") or {}
    if state in _BUSY_STATES:
        return "DEPLOYING", False
    if state == "RUNNING":
        return "RUNNING", current.get("state") == "ACTIVE"
    if state in ("READY", "DISABLED", "DELETING"):
        # READY: the service exists but runs no deployment (none yet, or the first one failed).
        return "STOPPED", False
    return "UNKNOWN", False


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else (str(value) if value else None)


def _url(service: Mapping[str, Any]) -> str:
    return str(service.get("url") or "").rstrip("/")


# -- the adapter -------------------------------------------------------------------------------------------------


class LightsailAdapter(PlatformAdapter):
    name = "cloud-a-containers"
    title = "AWS Lightsail containers"
    default_region = None  # from the AWS configuration (DESIGN.md section 6)
    regions = (
        "us-east-1",
        "us-east-2",
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
    )
    needs_container_engine = True
    persistent_storage = False

    def __init__(self) -> None:
        self._session: AwsSession | None = None
        self._session_ctx: DeployContext | None = None

    def _aws(self, ctx: DeployContext) -> AwsSession:
        # One session per deploy run, so the credential check and clients are not repeated step to step.
        if self._session is None or self._session_ctx is not ctx:
            self._session = AwsSession.for_context(ctx)
            self._session_ctx = ctx
        return self._session

    def _client(self, ctx: DeployContext) -> Any:
        return self._aws(ctx).client("lightsail")

    @staticmethod
    def _service_name(ctx: DeployContext) -> str:
        return str(ctx.state.get("service") or ctx.app)

    def _get_service(self, ctx: DeployContext) -> dict[str, Any] | None:
        found = aws_call_or_none(
            self._client(ctx),
            "get_container_services",
            ("NotFoundException",),
            serviceName=self._service_name(ctx),
        )
        services = (found or {}).get("containerServices") or []
        return dict(services[0]) if services else None

    def _require_service(self, ctx: DeployContext) -> dict[str, Any]:
        service = self._get_service(ctx)
        if service is None:
            raise DeployError(
                f"The Lightsail container service {self._service_name(ctx)!r} does not exist in "
                f"{self._aws(ctx).region}.",
                NOT_DEPLOYED,
                {"service": self._service_name(ctx), "region": self._aws(ctx).region},
                hint="Run `offline deploy --platform cloud-a-containers` first.",
            )
        return service

    # -- deploy ---------------------------------------------------------------------------------------------

    def existing_secrets(self, ctx: DeployContext) -> dict[str, str | None]:
        service = self._get_service(ctx)
        containers = ((service or {}).get("currentDeployment") or {}).get("containers") or {}
        environment = (containers.get(CONTAINER_NAME) or {}).get("environment") or {}
        return {name: str(environment[name]) for name in SECRET_VARIABLES if environment.get(name)}

    def planned_resources(self, ctx: DeployContext) -> list[str]:
        name = self._service_name(ctx)
        return [
            f"Lightsail container service {name} (power {INITIAL_POWER}, {INITIAL_SCALE} node; billed monthly; "
            "when missing)",
            "an image built here for linux/amd64 and pushed to the service, then a new deployment",
        ]

    def check_prerequisites(self, ctx: DeployContext) -> None:
        """boto3 and valid credentials always; for a deploy (``ctx.engine`` set: an image will be built and
        pushed) also the `aws` CLI, its lightsailctl plugin and a running engine. status, logs and rollback
        need only boto3."""
        import_boto3()
        if ctx.engine is not None:
            if ctx.runner.which("aws") is None:
                raise DeployError(
                    "host CLI required but not installed: the AWS CLI (`aws`) was not found on PATH; "
                    "cloud-a-containers pushes images with `aws lightsail push-container-image`.",
                    CLI_NOT_INSTALLED,
                    {"cli": "aws"},
                    hint=AWS_CLI_HINT,
                )
            if ctx.runner.which("lightsailctl") is None:
                raise DeployError(
                    "container push plugin was not found: `lightsailctl` is not on PATH.",
                    PUSH_PLUGIN_MISSING,
                    {"plugin": "lightsailctl"},
                    hint=LIGHTSAILCTL_HINT,
                )
        self._aws(ctx).identity()
        if ctx.engine is not None:
            check_engine(ctx.engine)

    def public_url(self, ctx: DeployContext) -> str | None:
        if ctx.state.get("url"):
            return str(ctx.state["url"])
        # The URL is fixed when the service is created, so an existing service already knows it.
        service = self._get_service(ctx)
        return (_url(service) or None) if service else None

    def provision(self, ctx: DeployContext) -> dict[str, Any]:
        name = self._service_name(ctx)
        validate_app_name(name)
        client = self._client(ctx)
        service = self._get_service(ctx)
        if service is None:
            ctx.reporter.step(f"Creating Lightsail container service {name}")
            created = aws_call(
                client,
                "create_container_service",
                serviceName=name,
                power=INITIAL_POWER,
                scale=INITIAL_SCALE,
            )
            service = dict(created["containerService"])
            ctx.reporter.info(
                f"Created service {name} (power {INITIAL_POWER}, {INITIAL_SCALE} node). "
                + RESIZE_HINT.format(service=name)
            )
        if service.get("state") not in ("READY", "RUNNING"):
            service = self._wait_until_settled(ctx, service)
        return {"service": name, "region": self._aws(ctx).region, "url": _url(service)}

    def _wait_until_settled(self, ctx: DeployContext, service: dict[str, Any]) -> dict[str, Any]:
        """Lightsail refuses new deployments while the service is PENDING or mid-deployment."""
        name = self._service_name(ctx)
        if service.get("state") in ("DISABLED", "DELETING"):
            raise DeployError(
                f"The Lightsail container service {name!r} is {service['state']}.",
                PLATFORM_ERROR,
                {"service": name, "state": service["state"]},
                hint="Enable it in the Lightsail console (or wait for the deletion and deploy again).",
            )
        ctx.reporter.info(f"Waiting for service {name} to become ready (state {service.get('state')}).")

        def probe(_: int) -> dict[str, Any] | None:
            current = self._get_service(ctx)
            return current if current and current.get("state") in ("READY", "RUNNING") else None

        settled = poll(ctx, probe)
        if settled is None:
            raise DeployError(
                f"The Lightsail container service {name!r} did not become ready within "
                f"{ctx.health_timeout:.0f} s.",
                HEALTH_TIMEOUT,
                {"service": name},
                hint="Check it with `offline deploy status`, then deploy again.",
            )
        return settled

    def deploy(self, ctx: DeployContext) -> DeployOutcome:
        session = self._aws(ctx)
        name = self._service_name(ctx)
        engine = ctx.engine if ctx.engine is not None else check_engine(None)
        local_tag = f"offline-{name}:latest"

        ctx.reporter.step("Building the image for linux/amd64")
        engine.build(ctx.deploy_dir, local_tag)
        require_amd64(engine, local_tag)

        ctx.reporter.step(f"Pushing the image to the Lightsail service {name}")
        image = self._push(ctx, session.region, name, local_tag)
        ctx.reporter.info(f"Pushed {local_tag} as {image}.")

        ctx.reporter.step("Creating the deployment")
        for variable in forwarded_environment(ctx.env):
            ctx.reporter.info(f"Forwarding {variable} from the local environment to the container.")
        request = lightsail_deployment_request(name, image, ctx.port, ctx.env)
        response = aws_call(self._client(ctx), "create_container_service_deployment", **request)
        service = response["containerService"]
        version = (service.get("nextDeployment") or {}).get("version")
        return DeployOutcome(
            url=_url(service) or str(ctx.state.get("url") or ""),
            deployment_id=str(version) if version is not None else "",
            state={
                "service": name,
                "region": session.region,
                "url": _url(service) or ctx.state.get("url") or "",
                "image": image,
                "container": CONTAINER_NAME,
            },
        )

    def _push(self, ctx: DeployContext, region: str, service: str, local_tag: str) -> str:
        result = ctx.runner.run(
            lightsail_push_argv(region, service, IMAGE_LABEL, local_tag), timeout=PUSH_TIMEOUT, stream=True
        )
        output = f"{result.stdout}\n{result.stderr}"
        if result.returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-5:])
            lowered = output.lower()
            if "plugin was not found" in lowered or ("lightsailctl" in lowered and "not found" in lowered):
                raise DeployError(
                    f"container push plugin was not found: {tail}",
                    PUSH_PLUGIN_MISSING,
                    {"plugin": "lightsailctl", "returncode": result.returncode},
                    hint=LIGHTSAILCTL_HINT,
                )
            if "unable to locate credentials" in lowered or "expiredtoken" in lowered:
                raise DeployError(
                    f"cloud CLI is not authenticated: `aws lightsail push-container-image` failed: {tail}",
                    NOT_AUTHENTICATED,
                    {"returncode": result.returncode},
                    hint=AWS_LOGIN_HINT,
                )
            raise DeployError(
                f"`aws lightsail push-container-image` failed (exit {result.returncode}): {tail}",
                PLATFORM_ERROR,
                {"returncode": result.returncode},
                hint="Check the message above and that the service exists (`offline deploy status`).",
            )
        image = parse_pushed_image(output)
        if image is None:  # an older plugin worded it differently: ask the service for its newest image
            found = aws_call_or_none(
                self._client(ctx), "get_container_images", ("NotFoundException",), serviceName=service
            )
            image = newest_pushed_image((found or {}).get("containerImages"), service, IMAGE_LABEL)
        if image is None:
            raise DeployError(
                "`aws lightsail push-container-image` succeeded but did not name the pushed image.",
                PLATFORM_ERROR,
                {"service": service},
                hint="Update the AWS CLI and lightsailctl, then deploy again.",
            )
        return image

    def wait_until_healthy(self, ctx: DeployContext, outcome: DeployOutcome) -> StatusReport:
        name = self._service_name(ctx)
        expected = outcome.deployment_id
        announced = False

        seen: list[str] = []

        def probe(_: int) -> StatusReport | None:
            nonlocal announced
            service = self._require_service(ctx)
            current = service.get("currentDeployment") or {}
            upcoming = service.get("nextDeployment") or {}
            ours = upcoming if str(upcoming.get("version")) == expected else current
            report_change(
                ctx.reporter,
                seen,
                f"Lightsail: service {service.get('state')}, deployment {expected} "
                f"{ours.get('state') if str(ours.get('version')) == expected else 'not listed yet'}",
            )
            if str(upcoming.get("version")) == expected:
                if upcoming.get("state") == "FAILED":
                    self._fail(name, expected)
                if not announced:
                    ctx.reporter.info(
                        f"Lightsail is rolling out deployment {expected} (DEPLOYING); this takes 2 to 5 minutes."
                    )
                    announced = True
                return None
            if str(current.get("version")) == expected and current.get("state") == "ACTIVE":
                if service.get("state") == "RUNNING":
                    return StatusReport("RUNNING", True, _url(service) or None, expected, _details(service))
                return None
            if service.get("state") in _BUSY_STATES:
                return None
            # Neither current nor next is ours and the service is idle: Lightsail dropped it.
            if self._deployment_state(ctx, expected) == "FAILED":
                self._fail(name, expected)
            return None

        report = poll(ctx, probe)
        if report is None:
            raise DeployError(
                f"Lightsail did not report deployment {expected} of {name!r} active within "
                f"{ctx.health_timeout:.0f} s.",
                HEALTH_TIMEOUT,
                {"service": name, "deployment": expected},
                hint="Check `offline deploy status` and `offline deploy logs`; a rollout can take 5 minutes.",
            )
        return report

    def _deployment_state(self, ctx: DeployContext, version: str) -> str | None:
        for entry in self._raw_deployments(ctx):
            if str(entry.get("version")) == version:
                return str(entry.get("state"))
        return None

    @staticmethod
    def _fail(service: str, version: str) -> None:
        raise DeployError(
            f"Lightsail deployment {version} of {service!r} failed: the container did not pass its /health "
            "check; the previous deployment (if any) keeps serving.",
            PLATFORM_ERROR,
            {"service": service, "deployment": version},
            hint="Read `offline deploy logs` for the cause (a missing DATABASE_URL or AUTH_SECRET, a crash).",
        )

    # -- management -----------------------------------------------------------------------------------------

    def status(self, ctx: DeployContext) -> StatusReport:
        service = self._get_service(ctx)
        if service is None:
            return StatusReport("NOT_FOUND", False, None, None, {"service": self._service_name(ctx)})
        state, healthy = lightsail_state(service)
        current = service.get("currentDeployment") or {}
        version = current.get("version")
        return StatusReport(
            state,
            healthy,
            _url(service) or None,
            str(version) if version is not None else None,
            _details(service),
        )

    def logs(self, ctx: DeployContext, *, lines: int = 100) -> list[str]:
        name = self._service_name(ctx)
        container = str(ctx.state.get("container") or CONTAINER_NAME)
        client = self._client(ctx)
        collected: list[str] = []
        params: dict[str, Any] = {"serviceName": name, "containerName": container}
        for _ in range(5):  # a few pages are plenty for "recent output"
            page = aws_call(client, "get_container_log", **params)
            for event in page.get("logEvents") or []:
                stamp = _iso(event.get("createdAt")) or ""
                collected.append(f"{stamp} {event.get('message', '')}".strip())
            token = page.get("nextPageToken")
            if not token:
                break
            params["pageToken"] = token
        return collected[-lines:] if lines > 0 else []

    def _raw_deployments(self, ctx: DeployContext) -> list[dict[str, Any]]:
        response = aws_call(
            self._client(ctx), "get_container_service_deployments", serviceName=self._service_name(ctx)
        )
        entries = [dict(entry) for entry in response.get("deployments") or []]
        return sorted(entries, key=lambda entry: int(entry.get("version", 0)), reverse=True)

    def deployments(self, ctx: DeployContext) -> list[Deployment]:
        result = []
        for entry in self._raw_deployments(ctx):
            result.append(
                Deployment(
                    id=str(entry.get("version")),
                    status=str(entry.get("state", "")),
                    created_at=_iso(entry.get("createdAt")),
                    image=_image_of(entry),
                    current=entry.get("state") == "ACTIVE",
                )
            )
        return result

    def rollback(self, ctx: DeployContext, deployment_id: str | None = None) -> DeployOutcome:
        name = self._service_name(ctx)
        entries = self._raw_deployments(ctx)
        current = next((entry for entry in entries if entry.get("state") == "ACTIVE"), None)
        current_version = int(current["version"]) if current else None
        listed = ", ".join(str(entry.get("version")) for entry in entries) or "none"
        if deployment_id is not None:
            target = next((e for e in entries if str(e.get("version")) == str(deployment_id)), None)
            if target is None or (current_version is not None and int(target["version"]) == current_version):
                reason = "is the current one" if target is not None else f"is not listed (versions: {listed})"
                raise DeployError(
                    f"Cannot roll back {name!r} to deployment {deployment_id}: it {reason}.",
                    NO_PREVIOUS_DEPLOYMENT,
                    {"service": name, "deployment": str(deployment_id)},
                    hint="Pick another version from `offline deploy status` or the Lightsail console.",
                )
        else:
            # An earlier deployment that once ran; FAILED ones never served and are no place to return to.
            target = next(
                (
                    entry
                    for entry in entries
                    if entry.get("state") == "INACTIVE"
                    and (current_version is None or int(entry["version"]) < current_version)
                ),
                None,
            )
            if target is None:
                raise DeployError(
                    f"There is no previous deployment of {name!r} to roll back to (versions: {listed}).",
                    NO_PREVIOUS_DEPLOYMENT,
                    {"service": name},
                    hint="Deploy a fixed version with `offline deploy` instead.",
                )
        ctx.reporter.step(f"Redeploying version {target['version']} of {name}")
        response = aws_call(
            self._client(ctx),
            "create_container_service_deployment",
            **lightsail_redeploy_request(name, target),
        )
        service = response["containerService"]
        version = (service.get("nextDeployment") or {}).get("version")
        image = _image_of(target)
        return DeployOutcome(
            url=_url(service),
            deployment_id=str(version) if version is not None else "",
            state={
                "service": name,
                "region": self._aws(ctx).region,
                "url": _url(service),
                "image": image,
                "rolled_back_to": str(target["version"]),
            },
        )


def _image_of(deployment: Mapping[str, Any]) -> str | None:
    containers: Mapping[str, Any] = deployment.get("containers") or {}
    container: Mapping[str, Any] = containers.get(CONTAINER_NAME) or next(iter(containers.values()), {})
    image = container.get("image")
    return str(image) if image else None


def _details(service: Mapping[str, Any]) -> dict[str, Any]:
    detail = service.get("stateDetail") or {}
    current = service.get("currentDeployment") or {}
    upcoming = service.get("nextDeployment") or {}
    details: dict[str, Any] = {
        "service": service.get("containerServiceName"),
        "lightsail_state": service.get("state"),
        "power": service.get("power"),
        "scale": service.get("scale"),
        "current_deployment": current.get("version"),
        "current_deployment_state": current.get("state"),
    }
    if upcoming:
        details["next_deployment"] = upcoming.get("version")
        details["next_deployment_state"] = upcoming.get("state")
    if detail.get("code"):
        details["state_detail"] = f"{detail.get('code')}: {detail.get('message', '')}".strip()
    return details
