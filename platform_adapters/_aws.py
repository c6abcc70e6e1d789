"""What the two AWS platforms share: boto3 loaded lazily, clients, the credential check, error mapping and
polling.

boto3 is an optional dependency (``pip install 'offline[aws]'``) and is imported only inside functions, so
``offline --help`` and the other platforms never pay for it. Credentials follow the AWS CLI's chain; the
access-key variables and ``AWS_PROFILE`` are read from ``DeployContext.env`` (the local shell), so a test can
hand an adapter an environment without touching the process's own.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from .base import (
    CLI_NOT_INSTALLED,
    DAEMON_UNAVAILABLE,
    MISSING_OPTION,
    NOT_AUTHENTICATED,
    PLATFORM_ERROR,
    WRONG_ARCHITECTURE,
    ContainerEngine,
    DeployContext,
    DeployError,
)

__all__ = [
    "AWS_INSTALL_HINT",
    "AWS_LOGIN_HINT",
    "AwsSession",
    "aws_call",
    "aws_call_or_none",
    "check_engine",
    "configured_region",
    "error_code",
    "import_boto3",
    "poll",
    "require_amd64",
    "validate_app_name",
]

AWS_INSTALL_HINT = "Install the AWS extra: pip install 'offline[aws]'"
AWS_LOGIN_HINT = (
    "Run `aws configure` (or `aws sso login` for an SSO profile), or set AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, then retry."
)
ENGINE_HINT = "Start Docker (or podman's Docker-compatible service), then retry. Check it with `docker info`."

# Errors AWS returns when the credentials themselves are wrong (as opposed to lacking a permission).
_AUTH_ERROR_CODES = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidSignatureException",
        "UnauthenticatedException",
        "AuthFailure",
        "IncompleteSignature",
        "MissingAuthenticationToken",
    }
)

# One name works for every resource both platforms create: Lightsail service names are the strictest
# (lowercase letters, digits and inner hyphens, at most 63), and ECR repository names must be lowercase.
_APP_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")

T = TypeVar("T")


def import_boto3() -> ModuleType:
    """boto3, or a DeployError with the install hint when the optional extra is missing."""
    try:
        import boto3
    except ImportError:
        raise DeployError(
            "host CLI required but not installed: the AWS platforms need boto3, the AWS SDK for Python.",
            CLI_NOT_INSTALLED,
            {"package": "boto3"},
            hint=AWS_INSTALL_HINT,
        ) from None
    module: ModuleType = boto3
    return module


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError (``""`` for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _not_authenticated(reason: str) -> DeployError:
    return DeployError(
        f"cloud CLI is not authenticated: AWS credentials are missing or invalid ({reason}).",
        NOT_AUTHENTICATED,
        {"reason": reason},
        hint=AWS_LOGIN_HINT,
    )


def translate_error(exc: Exception, what: str) -> DeployError | None:
    """A DeployError for a botocore failure of ``what`` (``"lightsail.get_container_services"``), or None when
    ``exc`` is not a botocore error."""
    import botocore.exceptions as bex

    if isinstance(exc, bex.NoCredentialsError | bex.PartialCredentialsError | bex.ProfileNotFound):
        return _not_authenticated(type(exc).__name__)
    if isinstance(exc, bex.NoRegionError):
        return _region_missing()
    if isinstance(exc, bex.ClientError):
        code = error_code(exc)
        if code in _AUTH_ERROR_CODES:
            return _not_authenticated(code)
        message = str(exc.response.get("Error", {}).get("Message", "")) or code
        if code in ("AccessDeniedException", "AccessDenied"):
            hint = f"Give the AWS identity permission for {what.split('.')[0]}:* (or the single action), then retry."
        else:
            hint = "Check the message above; `offline deploy status` shows what the platform has now."
        return DeployError(
            f"AWS {what} failed: {code}: {message}",
            PLATFORM_ERROR,
            {"operation": what, "code": code},
            hint=hint,
        )
    if isinstance(exc, bex.EndpointConnectionError | bex.ConnectTimeoutError | bex.ReadTimeoutError):
        return DeployError(
            f"AWS {what} failed: could not reach the AWS endpoint ({type(exc).__name__}).",
            PLATFORM_ERROR,
            {"operation": what},
            hint="Check the network connection and the region, then retry.",
        )
    if isinstance(exc, bex.BotoCoreError):
        return DeployError(
            f"AWS {what} failed: {exc}", PLATFORM_ERROR, {"operation": what}, hint="Retry; see the message."
        )
    return None


def _operation_name(client: Any, operation: str) -> str:
    service = getattr(getattr(client, "meta", None), "service_model", None)
    return f"{getattr(service, 'service_name', 'aws')}.{operation}"


def aws_call(client: Any, operation: str, **params: Any) -> dict[str, Any]:
    """``client.<operation>(**params)`` with botocore errors turned into DeployError."""
    try:
        result: dict[str, Any] = getattr(client, operation)(**params)
    except Exception as exc:
        error = translate_error(exc, _operation_name(client, operation))
        if error is None:
            raise
        raise error from None
    return result


def aws_call_or_none(
    client: Any, operation: str, absent: tuple[str, ...], **params: Any
) -> dict[str, Any] | None:
    """Like ``aws_call``, but None when AWS answers with one of the error codes in ``absent`` (a lookup of
    something that does not exist yet)."""
    try:
        result: dict[str, Any] = getattr(client, operation)(**params)
    except Exception as exc:
        if error_code(exc) in absent:
            return None
        error = translate_error(exc, _operation_name(client, operation))
        if error is None:
            raise
        raise error from None
    return result


def _region_missing() -> DeployError:
    return DeployError(
        "No AWS region is configured for this deploy.",
        MISSING_OPTION,
        {"option": "--region"},
        hint="Pass --region (for example --region us-east-1) or set one with `aws configure set region <region>`.",
    )


@dataclass
class AwsSession:
    """Clients for one deploy run, all in one region; the caller identity once it has been checked."""

    region: str
    factory: Callable[..., Any]
    _clients: dict[str, Any] = field(default_factory=dict)
    _identity: dict[str, Any] | None = None

    @classmethod
    def for_context(cls, ctx: DeployContext) -> AwsSession:
        """Region: ``ctx.region``, else ``state["region"]`` of an earlier run, else the AWS configuration
        (AWS_REGION, AWS_DEFAULT_REGION, the profile's ``region``). Never another platform's default."""
        if ctx.client_factory is not None:
            region = ctx.region or ctx.state.get("region") or configured_region(ctx.env)
            if not region:
                raise _region_missing()
            return cls(region=str(region), factory=ctx.client_factory)
        boto3 = import_boto3()
        session = _boto3_session(boto3, ctx.env, ctx.region or ctx.state.get("region"))
        region = session.region_name
        if not region:
            raise _region_missing()
        return cls(region=region, factory=session.client)

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.factory(service, region_name=self.region)
        return self._clients[service]

    def identity(self) -> dict[str, Any]:
        """STS GetCallerIdentity (allowed for every valid credential): the cheap way to prove we are logged
        in. NOT_AUTHENTICATED when there are no credentials or AWS rejects them."""
        if self._identity is None:
            try:
                self._identity = self.client("sts").get_caller_identity()
            except Exception as exc:
                error = translate_error(exc, "sts.get_caller_identity")
                if error is None:
                    raise
                if error.code == PLATFORM_ERROR and error.context and error.context.get("code"):
                    # STS answers every valid credential; any refusal means the credentials are unusable.
                    raise _not_authenticated(str(error.context["code"])) from None
                raise error from None
        return self._identity


def configured_region(env: Mapping[str, str]) -> str | None:
    """The region the AWS CLI would use: AWS_REGION, AWS_DEFAULT_REGION, else the ``region`` of the profile
    (AWS_PROFILE or ``default``) in the AWS config file; None when nothing sets one."""
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        return region
    try:
        import botocore.exceptions as bex
        import botocore.session
    except ImportError:
        return None
    try:
        value = botocore.session.Session(profile=env.get("AWS_PROFILE") or None).get_config_variable("region")
    except bex.BotoCoreError:
        return None
    return str(value) if value else None


def _boto3_session(boto3: ModuleType, env: Mapping[str, str], region: str | None) -> Any:
    import botocore.exceptions as bex

    keys = {}
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        keys = {
            "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
            "aws_session_token": env.get("AWS_SESSION_TOKEN") or None,
        }
    profile = None if keys else (env.get("AWS_PROFILE") or None)
    region = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    try:
        return boto3.session.Session(profile_name=profile, region_name=region, **keys)
    except bex.ProfileNotFound:
        raise _not_authenticated(f"the profile {profile!r} is not in the AWS configuration") from None


def validate_app_name(app: str) -> None:
    if not _APP_NAME.match(app):
        raise DeployError(
            f"The app name {app!r} cannot name AWS resources: use lowercase letters, digits and hyphens, "
            "starting and ending with a letter or digit, at most 63 characters.",
            MISSING_OPTION,
            {"option": "--app", "app": app},
            hint="Pass a different --app, for example --app my-app.",
        )


def check_engine(engine: ContainerEngine | None) -> ContainerEngine:
    """The engine, after a ping; DAEMON_UNAVAILABLE when there is none or it does not answer."""
    if engine is None:
        raise DeployError(
            "cannot connect to the container daemon: no container engine is configured.",
            DAEMON_UNAVAILABLE,
            hint=ENGINE_HINT,
        )
    engine.ping()
    return engine


def require_amd64(engine: ContainerEngine, tag: str) -> None:
    platform = engine.image_platform(tag)
    if platform != "linux/amd64":
        raise DeployError(
            f"image does not provide linux/amd64 platform: {tag} was built for {platform}.",
            WRONG_ARCHITECTURE,
            {"image": tag, "platform": platform},
            hint="AWS runs x86_64 containers. Enable multi-platform builds (Docker Desktop: use containerd "
            "for images; Linux: install qemu-user-static / binfmt), then deploy again.",
        )


def poll(ctx: DeployContext, probe: Callable[[int], T | None], *, timeout: float | None = None) -> T | None:
    """Call ``probe(attempt)`` until it returns something other than None, sleeping ``ctx.poll_interval``
    between calls, for at most ``timeout`` (default ``ctx.health_timeout``) worth of intervals. Counting
    attempts instead of reading a clock keeps tests with a no-op sleep finite and exact."""
    sleep = ctx.sleep or time.sleep
    interval = max(ctx.poll_interval, 0.0)
    budget = ctx.health_timeout if timeout is None else timeout
    attempts = 1 + (math.ceil(budget / interval) if interval > 0 else 1)
    for attempt in range(attempts):
        if attempt:
            sleep(interval)
        result = probe(attempt)
        if result is not None:
            return result
    return None
