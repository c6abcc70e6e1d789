"""A small client of Render's public REST API (https://api.render.com/v1), for ``--platform render``.

Every request carries ``Authorization: Bearer <RENDER_API_KEY>``; the key lives only in that header (never
in a URL, a message or a log line). ``OFFLINE_RENDER_API_URL`` replaces the base URL (tests point it at a
loopback fake). Request bodies are built by the pure functions below, so tests check them as data.

The shapes relied on, as published in Render's API reference (and the OpenAPI-generated client of Render's
own CLI, render-oss/cli ``pkg/client``):

- ``GET /owners`` -> ``[{"owner": {"id", "name", "email", "type": "user"|"team"}, "cursor"}]``.
- ``GET /registrycredentials?ownerId=`` -> ``[{"id", "name", "registry": "GITHUB"|"GITLAB"|"DOCKER"|
  "GOOGLE_ARTIFACT"|"AWS_ECR", "username", "updatedAt"}]`` (a bare list, no cursors).
- ``GET /services?name=&ownerId=`` -> ``[{"service": Service, "cursor"}]``; ``GET /services/{id}`` -> Service:
  ``{"id", "name", "ownerId", "type", "imagePath", "suspended": "suspended"|"not_suspended",
  "registryCredential": {"id", "name"}, "dashboardUrl", "serviceDetails": {"url", "region", "plan",
  "runtime", "healthCheckPath", "disk": {"id", "name", "mountPath", "sizeGB"}, "numInstances"}}``.
- ``POST /services`` with ``{"type": "web_service", "name", "ownerId", "image": {"ownerId", "imagePath",
  "registryCredentialId"}, "envVars": [{"key", "value"}], "serviceDetails": {"runtime": "image", "plan",
  "region", "healthCheckPath", "numInstances", "disk": {"name", "mountPath", "sizeGB"}}}`` -> 201
  ``{"service": Service, "deployId"}`` (creating the service starts its first deploy); 409 when the name
  is taken in the workspace.
- ``PATCH /services/{id}`` with ``{"image": {...}, "serviceDetails": {"healthCheckPath"}}`` -> Service.
- ``GET /services/{id}/env-vars`` -> ``[{"envVar": {"key", "value"}, "cursor"}]``;
  ``PUT /services/{id}/env-vars/{key}`` with ``{"value"}`` adds or replaces one variable (the others stay).
- ``POST /disks`` with ``{"name", "mountPath", "sizeGB", "serviceId"}`` -> 201 disk.
- ``POST /services/{id}/deploys`` with ``{"imageUrl"}`` (same host, repository and name as the service's
  image) -> 201 Deploy; ``GET /services/{id}/deploys?limit=`` -> ``[{"deploy": Deploy, "cursor"}]``, newest
  first; ``GET /services/{id}/deploys/{deployId}`` -> Deploy: ``{"id", "status", "createdAt", "finishedAt",
  "image": {"ref", "sha", "registryCredential"}}`` with status one of created, queued, build_in_progress,
  update_in_progress, pre_deploy_in_progress, live, deactivated, build_failed, update_failed,
  pre_deploy_failed, canceled.
- ``POST /services/{id}/rollback`` with ``{"deployId"}`` -> 201 Deploy (a new deploy of that one's image).
- ``GET /logs?ownerId=&resource=<service id>&direction=backward&limit=&startTime=`` -> ``{"logs": [{"id",
  "message", "timestamp", "labels": [{"name", "value"}]}], "hasMore", "nextStartTime", "nextEndTime"}``.
- Errors: ``{"id", "message"}`` with 400, 401 (bad key), 402, 403, 404, 409, 429, 5xx.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from .base import NAME_TAKEN, NOT_AUTHENTICATED, PLATFORM_ERROR, DeployError

__all__ = [
    "API_KEY_ENV",
    "API_URL_ENV",
    "DEFAULT_API_URL",
    "RenderApi",
    "RenderApiError",
    "create_service_body",
    "disk_body",
    "image_spec",
]

DEFAULT_API_URL = "https://api.render.com/v1"
API_URL_ENV = "OFFLINE_RENDER_API_URL"
API_KEY_ENV = "RENDER_API_KEY"
KEY_HINT = (
    "Create an API key in the Render Dashboard (Account Settings > API Keys) and export it: "
    "export RENDER_API_KEY=rnd_..., then retry."
)
#: Render's list endpoints return at most 100 items a page.
PAGE_LIMIT = 100


class RenderApiError(DeployError):
    """A refused request; ``status`` is the HTTP status (the adapter turns 404 and 409 into its own words)."""

    def __init__(self, message: str, code: str, status: int, *, hint: str = "") -> None:
        super().__init__(message, code, {"status": status}, hint=hint)
        self.status = status


# -- request bodies (pure) --------------------------------------------------------------------------------------


def image_spec(owner_id: str, image_path: str, credential_id: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"ownerId": owner_id, "imagePath": image_path}
    if credential_id:
        spec["registryCredentialId"] = credential_id
    return spec


def disk_body(name: str, mount_path: str, size_gb: int, service_id: str | None = None) -> dict[str, Any]:
    """The ``disk`` of a new service (no ``serviceId``), or a ``POST /disks`` body for an existing one."""
    body: dict[str, Any] = {"name": name, "mountPath": mount_path, "sizeGB": size_gb}
    if service_id is not None:
        body["serviceId"] = service_id
    return body


def create_service_body(
    *,
    name: str,
    owner_id: str,
    image: Mapping[str, Any],
    env: Mapping[str, str],
    region: str | None,
    plan: str,
    health_check_path: str,
    disk: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """``POST /services`` for an image-backed web service with one instance."""
    details: dict[str, Any] = {
        "runtime": "image",
        "plan": plan,
        "healthCheckPath": health_check_path,
        "numInstances": 1,
    }
    if region:
        details["region"] = region
    if disk is not None:
        details["disk"] = dict(disk)
    return {
        "type": "web_service",
        "name": name,
        "ownerId": owner_id,
        "image": dict(image),
        "envVars": [{"key": key, "value": value} for key, value in env.items()],
        "serviceDetails": details,
    }


# -- the client -------------------------------------------------------------------------------------------------


@dataclass
class RenderApi:
    """Calls Render's API with ``key``. ``mask`` hides secret values in anything quoted from an answer."""

    key: str
    base_url: str = DEFAULT_API_URL
    mask: Callable[[str], str] = field(default=lambda text: text)
    timeout: float = 30.0
    _client: httpx.Client | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str], mask: Callable[[str], str] | None = None) -> RenderApi:
        """The client for RENDER_API_KEY; NOT_AUTHENTICATED with where to get a key when it is unset."""
        key = env.get(API_KEY_ENV, "").strip()
        if not key:
            raise DeployError(
                "cloud CLI is not authenticated: RENDER_API_KEY is not set, and Render's API needs it.",
                NOT_AUTHENTICATED,
                {"variable": API_KEY_ENV},
                hint=KEY_HINT,
            )
        base = (env.get(API_URL_ENV) or DEFAULT_API_URL).rstrip("/")
        return cls(key, base, mask or (lambda text: text))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        allow: Sequence[int] = (),
    ) -> Any:
        """The parsed JSON answer (None for an empty one). A status in ``allow`` returns None instead of
        raising; any other failure raises RenderApiError."""
        url = f"{self.base_url}{path}"
        headers = {"Authorization": f"Bearer {self.key}", "Accept": "application/json"}
        if self._client is None:  # one connection pool (and TLS context) for all the calls of a command
            self._client = httpx.Client(timeout=self.timeout)
        try:
            response = self._client.request(method, url, params=_query(params), json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise RenderApiError(
                f"Could not reach Render's API at {self.base_url}: {type(exc).__name__}: {self.mask(str(exc))}",
                PLATFORM_ERROR,
                0,
                hint="Check the network connection (and OFFLINE_RENDER_API_URL if you set it), then retry.",
            ) from None
        if response.status_code in allow:
            return None
        if response.status_code >= 400:
            raise self._error(method, path, response)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise RenderApiError(
                f"Render's API answered {method} {path} with something other than JSON.",
                PLATFORM_ERROR,
                response.status_code,
                hint="Check OFFLINE_RENDER_API_URL (unset it to use https://api.render.com/v1), then retry.",
            ) from None

    def _error(self, method: str, path: str, response: httpx.Response) -> RenderApiError:
        status = response.status_code
        said = _message(response)
        # The key is never echoed, but an answer may quote a value we sent (an env var): masked.
        said = self.mask(said.replace(self.key, "***"))
        if status == 401:
            return RenderApiError(
                f"cloud CLI is not authenticated: Render's API refused the API key in RENDER_API_KEY "
                f"(HTTP 401: {said}).",
                NOT_AUTHENTICATED,
                status,
                hint="The key is wrong, revoked or expired. " + KEY_HINT,
            )
        if status == 403:
            return RenderApiError(
                f"Render's API refused {method} {path} (HTTP 403: {said}).",
                NOT_AUTHENTICATED,
                status,
                hint="The API key's user may not manage this workspace; use a key of a workspace member "
                "(pass --workspace to pick the workspace), then retry.",
            )
        if status == 409:
            return RenderApiError(
                f"name has already been taken: Render answered {method} {path} with HTTP 409 ({said}).",
                NAME_TAKEN,
                status,
            )
        if status == 402:
            hint = (
                "Add a payment method to the Render workspace (disks need a paid instance type), then retry."
            )
        elif status == 429:
            hint = "Render's API rate limit was reached: wait a minute, then retry."
        else:
            hint = "Check the message above; `offline deploy status` shows what Render has now."
        return RenderApiError(
            f"Render's API answered {method} {path} with HTTP {status}: {said}",
            PLATFORM_ERROR,
            status,
            hint=hint,
        )

    # -- paged lists

    def list_all(
        self, path: str, item: str | None, params: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Every item of a cursor-paged list (``[{item: {...}, "cursor"}]``); ``item`` None: a bare list."""
        found: list[dict[str, Any]] = []
        query = {"limit": PAGE_LIMIT, **(params or {})}
        for _ in range(20):  # 2,000 items is far past anything a deploy needs to look through
            page = self.request("GET", path, params=query)
            entries = [entry for entry in page or [] if isinstance(entry, Mapping)]
            for entry in entries:
                value = entry.get(item) if item else entry
                if isinstance(value, Mapping):
                    found.append(dict(value))
            cursor = entries[-1].get("cursor") if entries and item else None
            if not cursor or len(entries) < int(query["limit"]):
                break
            query["cursor"] = cursor
        return found


def _query(params: Mapping[str, Any] | None) -> list[tuple[str, str | int | float | bool | None]] | None:
    """Query parameters as pairs; a list value repeats its name (Render's array parameters)."""
    if not params:
        return None
    pairs: list[tuple[str, str | int | float | bool | None]] = []
    for name, value in params.items():
        if value is None:
            continue
        values = value if isinstance(value, list | tuple) else [value]
        pairs += [(name, str(item)) for item in values]
    return pairs


def _message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, Mapping) and data.get("message"):
        return " ".join(str(data["message"]).split())[:300]
    return " ".join(response.text.split())[:300] or response.reason_phrase
