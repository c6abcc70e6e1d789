"""A loopback fake of Render's public REST API (the part ``--platform render`` calls), a starlette app
served by uvicorn in a thread on 127.0.0.1 (port 0).

Faithful where the adapter could go wrong: every request body and query is checked against the fields
Render's API reference documents for that endpoint (render_api.py lists them), and an undocumented field, a
missing required one or a value outside a documented enum is refused with 400, as Render does. Only the
Bearer key in ``accepted_key`` passes (401 otherwise). A deploy's image URL must keep the service's
repository (Render's documented rule for ``imageUrl``). Service names are unique within a workspace (409).

State lives in plain dicts the tests read and arrange: ``services``, ``deploys`` (per service, newest
first), ``env_vars``, ``logs``. Each new deploy walks through ``deploy_script`` one status per read of it;
``fail_next_deploy`` makes the next one end ``update_failed`` after writing its log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# -- the documented fields, by endpoint ------------------------------------------------------------------------

SERVICE_POST = {
    "autoDeploy",
    "autoDeployTrigger",
    "branch",
    "buildFilter",
    "envVars",
    "environmentId",
    "image",
    "name",
    "ownerId",
    "repo",
    "rootDir",
    "secretFiles",
    "serviceDetails",
    "type",
}
SERVICE_PATCH = {
    "artifactId",
    "artifactSourceId",
    "autoDeploy",
    "autoDeployTrigger",
    "branch",
    "buildFilter",
    "image",
    "name",
    "repo",
    "rootDir",
    "serviceDetails",
}
IMAGE = {"ownerId", "imagePath", "registryCredentialId"}
WEB_DETAILS_POST = {
    "artifactSourceId",
    "autoscaling",
    "disk",
    "env",
    "envSpecificDetails",
    "healthCheckPath",
    "internalRouting",
    "ipAllowList",
    "maintenanceMode",
    "maxShutdownDelaySeconds",
    "numInstances",
    "plan",
    "preDeployCommand",
    "previews",
    "pullRequestPreviewsEnabled",
    "region",
    "renderSubdomainPolicy",
    "runtime",
}
WEB_DETAILS_PATCH = {
    "cache",
    "envSpecificDetails",
    "healthCheckPath",
    "ipAllowList",
    "maintenanceMode",
    "maxShutdownDelaySeconds",
    "plan",
    "preDeployCommand",
    "previews",
    "pullRequestPreviewsEnabled",
    "renderSubdomainPolicy",
    "runtime",
}
SERVICE_DISK = {"name", "mountPath", "sizeGB"}
DISK_POST = {"name", "mountPath", "sizeGB", "serviceId"}
CREATE_DEPLOY = {"artifactId", "clearCache", "commitId", "deployMode", "imageUrl"}
TIME_FILTERS = {"createdBefore", "createdAfter", "updatedBefore", "updatedAfter"}
QUERIES: dict[str, set[str]] = {
    "owners": {"name", "email", "cursor", "limit"},
    "services": {
        "name",
        "type",
        "environmentId",
        "env",
        "region",
        "suspended",
        "ownerId",
        "includePreviews",
        "cursor",
        "limit",
        *TIME_FILTERS,
    },
    "deploys": {"status", "finishedBefore", "finishedAfter", "cursor", "limit", *TIME_FILTERS},
    "env-vars": {"cursor", "limit"},
    "registrycredentials": {"name", "username", "type", "ownerId", "cursor", "limit", *TIME_FILTERS},
    "logs": {
        "ownerId",
        "startTime",
        "endTime",
        "direction",
        "resource",
        "instance",
        "host",
        "statusCode",
        "method",
        "task",
        "taskRun",
        "sandbox",
        "level",
        "type",
        "text",
        "path",
        "limit",
    },
    "none": set(),
}
PLANS = {"free", "starter", "standard", "pro", "pro_plus", "pro_max", "pro_ultra", "custom", "starter_plus"}
REGIONS = {"oregon", "ohio", "virginia", "frankfurt", "singapore"}
RUNTIMES = {"docker", "elixir", "go", "image", "node", "python", "ruby", "rust"}
SERVICE_TYPES = {"static_site", "web_service", "private_service", "background_worker", "cron_job"}
IN_PROGRESS = {"created", "queued", "build_in_progress", "update_in_progress", "pre_deploy_in_progress"}


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _fields(what: str, body: Any, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    if not isinstance(body, dict):
        raise Refused(400, f"{what}: expected a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise Refused(400, f"{what}: unknown field(s) {', '.join(unknown)}")
    missing = sorted(required - set(body))
    if missing:
        raise Refused(400, f"{what}: missing required field(s) {', '.join(missing)}")
    return body


def _enum(what: str, value: Any, allowed: set[str]) -> None:
    if value is not None and value not in allowed:
        raise Refused(400, f"{what}: {value!r} is not one of {sorted(allowed)}")


def _repository(reference: str) -> str:
    name = reference.split("@", 1)[0]
    slash, colon = name.rfind("/"), name.rfind(":")
    return name[:colon] if colon > slash else name


@dataclass
class Recorded:
    method: str
    path: str
    query: list[tuple[str, str]]
    body: Any


@dataclass
class FakeRenderApi:
    accepted_key: str = "rnd_test_key_0123456789"
    owners: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {"id": "tea-owner1", "name": "My Team", "email": "me@example.com", "type": "team"}
        ]
    )
    registry_credentials: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {
                "id": "rgc-ghcr1",
                "name": "ghcr-bot",
                "registry": "GITHUB",
                "username": "bot",
                "updatedAt": "2026-01-01T00:00:00Z",
            }
        ]
    )
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    deploys: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    env_vars: dict[str, dict[str, str]] = field(default_factory=dict)
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    deploy_script: list[str] = field(default_factory=lambda: ["update_in_progress", "live"])
    #: log lines the next deploy writes before it ends update_failed; None: it goes live
    fail_next_deploy: list[str] | None = None
    requests: list[Recorded] = field(default_factory=list)
    url: str = ""
    _counter: int = 0
    _clock: datetime = field(default_factory=lambda: datetime(2026, 3, 1, 12, 0, tzinfo=UTC))
    _scripts: dict[str, list[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- helpers for the tests

    def calls(self, method: str | None = None) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.requests if method is None or r.method == method]

    def bodies(self, method: str, path: str) -> list[Any]:
        return [r.body for r in self.requests if r.method == method and r.path == path]

    def service_named(self, name: str) -> dict[str, Any]:
        return next(s for s in self.services.values() if s["name"] == name)

    def add_service(self, name: str, *, service_type: str = "static_site", image: str | None = None) -> str:
        """A service that exists before the deploy (someone else's, or one created by an earlier run)."""
        service_id = self._id("srv")
        self.services[service_id] = self._service(service_id, name, service_type, image, None, {}, None)
        self.deploys[service_id] = []
        self.env_vars[service_id] = {}
        return service_id

    # -- state

    def _id(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}-{self._counter:04d}"

    def _now(self) -> str:
        self._clock += timedelta(seconds=1)
        return self._clock.isoformat().replace("+00:00", "Z")

    def _service(
        self,
        service_id: str,
        name: str,
        service_type: str,
        image: str | None,
        credential: dict[str, Any] | None,
        details: Mapping[str, Any],
        disk: dict[str, Any] | None,
    ) -> dict[str, Any]:
        owner = self.owners[0]["id"]
        service: dict[str, Any] = {
            "id": service_id,
            "name": name,
            "ownerId": owner,
            "type": service_type,
            "autoDeploy": "no",
            "createdAt": self._now(),
            "updatedAt": self._now(),
            "dashboardUrl": f"https://dashboard.render.com/web/{service_id}",
            "notifyOnFail": "default",
            "rootDir": "",
            "slug": name,
            "suspended": "not_suspended",
            "suspenders": [],
            "serviceDetails": {
                "url": f"https://{name}.onrender.com",
                "region": details.get("region", "oregon"),
                "plan": details.get("plan", "starter"),
                "runtime": details.get("runtime", "image" if image else "node"),
                "env": details.get("runtime", "image" if image else "node"),
                "healthCheckPath": details.get("healthCheckPath", ""),
                "numInstances": details.get("numInstances", 1),
                "openPorts": [],
                "buildPlan": "starter",
                "envSpecificDetails": {},
            },
        }
        if image:
            service["imagePath"] = image
        if credential:
            service["registryCredential"] = {"id": credential["id"], "name": credential["name"]}
        if disk:
            service["serviceDetails"]["disk"] = disk
        return service

    def _log(self, service_id: str, message: str, kind: str = "app") -> None:
        self.logs.setdefault(service_id, []).append(
            {
                "id": self._id("log"),
                "message": message,
                "timestamp": self._now(),
                "labels": [
                    {"name": "resource", "value": service_id},
                    {"name": "type", "value": kind},
                    {"name": "level", "value": "info"},
                ],
            }
        )

    def _start_deploy(self, service_id: str, reference: str, *, trigger: str = "api") -> dict[str, Any]:
        service = self.services[service_id]
        deploy_id = self._id("dep")
        credential = service.get("registryCredential") or {}
        deploy = {
            "id": deploy_id,
            "status": "created",
            "trigger": trigger,
            "createdAt": self._now(),
            "updatedAt": self._now(),
            "image": {
                "ref": reference,
                "sha": "sha256:" + f"{self._counter:064x}",
                **({"registryCredential": credential["name"]} if credential else {}),
            },
        }
        self.deploys[service_id].insert(0, deploy)
        self._log(service_id, f"==> Pulling image {reference}", "build")
        if self.fail_next_deploy is not None:
            lines, self.fail_next_deploy = self.fail_next_deploy, None
            for line in lines:
                self._log(service_id, line)
            self._scripts[deploy_id] = ["update_in_progress", "update_failed"]
        else:
            self._scripts[deploy_id] = list(self.deploy_script)
        return deploy

    def _advance(self, service_id: str, deploy: dict[str, Any]) -> None:
        """One step of the deploy's script per read: a deploy going live deactivates the live one."""
        script = self._scripts.get(deploy["id"])
        if not script:
            return
        status = script.pop(0)
        if status == "live":
            for other in self.deploys[service_id]:
                if other["status"] == "live":
                    other["status"] = "deactivated"
            self._log(service_id, f"==> Your service is live (deploy {deploy['id']})")
        if status not in IN_PROGRESS:
            deploy["finishedAt"] = self._now()
        deploy["status"] = status
        deploy["updatedAt"] = self._now()

    # -- the app

    def app(self) -> Starlette:
        def endpoint(handler: Any, query: str) -> Any:
            async def run(request: Request) -> Response:
                raw = await request.body()
                body = None
                if raw:
                    try:
                        body = await request.json()
                    except ValueError:
                        return JSONResponse({"id": "bad_request", "message": "invalid JSON"}, 400)
                pairs = list(request.query_params.multi_items())
                with self._lock:
                    self.requests.append(Recorded(request.method, request.url.path, pairs, body))
                    if request.headers.get("authorization") != f"Bearer {self.accepted_key}":
                        return JSONResponse({"id": "unauthorized", "message": "Unauthorized"}, 401)
                    try:
                        unknown = sorted({name for name, _ in pairs} - QUERIES[query])
                        if unknown:
                            raise Refused(400, f"unknown query parameter(s) {', '.join(unknown)}")
                        limit = request.query_params.get("limit")
                        if limit is not None and not (limit.isdigit() and 1 <= int(limit) <= 100):
                            raise Refused(400, "limit must be between 1 and 100")
                        status, answer = handler(request.path_params, pairs, body)
                    except Refused as exc:
                        return JSONResponse({"id": "refused", "message": exc.message}, exc.status)
                return JSONResponse(answer, status)

            return run

        routes = [
            Route("/v1/owners", endpoint(self.list_owners, "owners"), methods=["GET"]),
            Route(
                "/v1/registrycredentials",
                endpoint(self.list_credentials, "registrycredentials"),
                methods=["GET"],
            ),
            Route("/v1/services", endpoint(self.list_services, "services"), methods=["GET"]),
            Route("/v1/services", endpoint(self.create_service, "none"), methods=["POST"]),
            Route("/v1/services/{id}", endpoint(self.get_service, "none"), methods=["GET"]),
            Route("/v1/services/{id}", endpoint(self.update_service, "none"), methods=["PATCH"]),
            Route("/v1/services/{id}/env-vars", endpoint(self.list_env_vars, "env-vars"), methods=["GET"]),
            Route("/v1/services/{id}/env-vars/{key}", endpoint(self.put_env_var, "none"), methods=["PUT"]),
            Route("/v1/disks", endpoint(self.create_disk, "none"), methods=["POST"]),
            Route("/v1/services/{id}/deploys", endpoint(self.list_deploys, "deploys"), methods=["GET"]),
            Route("/v1/services/{id}/deploys", endpoint(self.create_deploy, "none"), methods=["POST"]),
            Route("/v1/services/{id}/deploys/{deploy}", endpoint(self.get_deploy, "none"), methods=["GET"]),
            Route("/v1/services/{id}/rollback", endpoint(self.rollback, "none"), methods=["POST"]),
            Route("/v1/logs", endpoint(self.list_logs, "logs"), methods=["GET"]),
        ]
        return Starlette(routes=routes)

    def _known(self, params: Mapping[str, str]) -> dict[str, Any]:
        service = self.services.get(params["id"])
        if service is None:
            raise Refused(404, "service not found")
        return service

    # -- handlers: (path params, query pairs, body) -> (status, JSON)

    def list_owners(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        return 200, [{"owner": owner, "cursor": f"c-{owner['id']}"} for owner in self.owners]

    def list_credentials(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        return 200, list(self.registry_credentials)

    def list_services(self, params: Any, query: list[tuple[str, str]], body: Any) -> tuple[int, Any]:
        names = [value for name, value in query if name == "name"]
        owners = [value for name, value in query if name == "ownerId"]
        found = [
            s
            for s in self.services.values()
            if (not names or s["name"] in names) and (not owners or s["ownerId"] in owners)
        ]
        return 200, [{"service": s, "cursor": f"c-{s['id']}"} for s in found]

    def create_service(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        body = _fields("servicePOST", body, SERVICE_POST, {"type", "name", "ownerId"})
        _enum("type", body["type"], SERVICE_TYPES)
        if body["ownerId"] not in {o["id"] for o in self.owners}:
            raise Refused(404, "owner not found")
        image = _fields("image", body.get("image"), IMAGE, {"ownerId", "imagePath"})
        if image["ownerId"] != body["ownerId"]:
            raise Refused(400, "image.ownerId must match ownerId")
        credential = None
        if "registryCredentialId" in image:
            credential = next(
                (c for c in self.registry_credentials if c["id"] == image["registryCredentialId"]), None
            )
            if credential is None:
                raise Refused(400, "registry credential not found")
        details = _fields("webServiceDetailsPOST", body.get("serviceDetails"), WEB_DETAILS_POST, {"runtime"})
        _enum("serviceDetails.runtime", details["runtime"], RUNTIMES)
        _enum("serviceDetails.plan", details.get("plan"), PLANS)
        _enum("serviceDetails.region", details.get("region"), REGIONS)
        disk = None
        if "disk" in details:
            spec = _fields("serviceDisk", details["disk"], SERVICE_DISK, {"name", "mountPath"})
            if details.get("plan", "starter") == "free":
                raise Refused(400, "disks are not available on the free instance type")
            disk = {"id": self._id("dsk"), "sizeGB": 1, **spec}
        env: dict[str, str] = {}
        for item in body.get("envVars") or []:
            item = _fields("envVarInput", item, {"key", "value", "generateValue"}, {"key"})
            if ("value" in item) == ("generateValue" in item):
                raise Refused(400, "envVarInput: exactly one of value and generateValue")
            env[item["key"]] = str(item.get("value") or "generated-value")
        if any(s["name"] == body["name"] and s["ownerId"] == body["ownerId"] for s in self.services.values()):
            raise Refused(409, f"a service named {body['name']} already exists in this workspace")
        service_id = self._id("srv")
        self.services[service_id] = self._service(
            service_id, body["name"], body["type"], image["imagePath"], credential, details, disk
        )
        self.deploys[service_id] = []
        self.env_vars[service_id] = env
        deploy = self._start_deploy(service_id, image["imagePath"], trigger="new_service")
        return 201, {"service": self.services[service_id], "deployId": deploy["id"]}

    def get_service(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        return 200, self._known(params)

    def update_service(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        service = self._known(params)
        body = _fields("servicePATCH", body, SERVICE_PATCH)
        if "image" in body:
            image = _fields("image", body["image"], IMAGE, {"ownerId", "imagePath"})
            service["imagePath"] = image["imagePath"]
            credential = next(
                (c for c in self.registry_credentials if c["id"] == image.get("registryCredentialId")), None
            )
            if credential:
                service["registryCredential"] = {"id": credential["id"], "name": credential["name"]}
            else:
                service.pop("registryCredential", None)
        if "serviceDetails" in body:
            details = _fields("webServiceDetailsPATCH", body["serviceDetails"], WEB_DETAILS_PATCH)
            service["serviceDetails"].update(details)
        return 200, service

    def list_env_vars(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        self._known(params)
        return 200, [
            {"envVar": {"key": k, "value": v}, "cursor": f"c-{k}"}
            for k, v in self.env_vars[params["id"]].items()
        ]

    def put_env_var(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        self._known(params)
        body = _fields("addUpdateEnvVarInput", body, {"value", "generateValue"})
        if len(body) != 1:
            raise Refused(400, "addUpdateEnvVarInput: exactly one of value and generateValue")
        value = str(body.get("value") or "generated-value")
        self.env_vars[params["id"]][params["key"]] = value
        return 200, {"key": params["key"], "value": value}

    def create_disk(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        body = _fields("diskPOST", body, DISK_POST, DISK_POST)
        service = self.services.get(body["serviceId"])
        if service is None:
            raise Refused(404, "service not found")
        if service["serviceDetails"].get("disk"):
            raise Refused(400, "the service already has a disk")
        disk = {
            "id": self._id("dsk"),
            "name": body["name"],
            "mountPath": body["mountPath"],
            "sizeGB": body["sizeGB"],
        }
        service["serviceDetails"]["disk"] = disk
        stamp = self._now()
        return 201, {**disk, "serviceId": service["id"], "createdAt": stamp, "updatedAt": stamp}

    def list_deploys(self, params: Any, query: list[tuple[str, str]], body: Any) -> tuple[int, Any]:
        self._known(params)
        limit = int(dict(query).get("limit", 20))
        return 200, [{"deploy": d, "cursor": f"c-{d['id']}"} for d in self.deploys[params["id"]][:limit]]

    def create_deploy(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        service = self._known(params)
        body = _fields("createDeploy", body or {}, CREATE_DEPLOY)
        reference = body.get("imageUrl") or service.get("imagePath")
        if not service.get("imagePath"):
            raise Refused(400, "imageUrl is only for image-backed services")
        if _repository(reference) != _repository(service["imagePath"]):
            raise Refused(400, "imageUrl must have the host, repository and name of the service's image")
        return 201, self._start_deploy(service["id"], reference)

    def get_deploy(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        self._known(params)
        deploy = next((d for d in self.deploys[params["id"]] if d["id"] == params["deploy"]), None)
        if deploy is None:
            raise Refused(404, "deploy not found")
        self._advance(params["id"], deploy)
        return 200, deploy

    def rollback(self, params: Any, query: Any, body: Any) -> tuple[int, Any]:
        service = self._known(params)
        body = _fields("rollback", body, {"deployId"}, {"deployId"})
        target = next((d for d in self.deploys[service["id"]] if d["id"] == body["deployId"]), None)
        if target is None:
            raise Refused(404, "deploy not found")
        return 201, self._start_deploy(service["id"], target["image"]["ref"], trigger="rollback")

    def list_logs(self, params: Any, query: list[tuple[str, str]], body: Any) -> tuple[int, Any]:
        given = dict(query)
        for required in ("ownerId", "resource"):
            if required not in given:
                raise Refused(400, f"missing required query parameter {required}")
        resources = [value for name, value in query if name == "resource"]
        entries = [e for r in resources for e in self.logs.get(r, [])]
        if "startTime" in given:
            entries = [e for e in entries if e["timestamp"] >= given["startTime"]]
        if "endTime" in given:
            entries = [e for e in entries if e["timestamp"] < given["endTime"]]
        backward = given.get("direction", "backward") == "backward"
        entries.sort(key=lambda e: e["timestamp"], reverse=backward)
        limit = int(given.get("limit", 20))
        page, rest = entries[:limit], entries[limit:]
        edge = page[-1]["timestamp"] if page else self._clock.isoformat()
        return 200, {
            "logs": page,
            "hasMore": bool(rest),
            "nextStartTime": edge,
            "nextEndTime": edge,
        }


@contextlib.contextmanager
def serve(api: FakeRenderApi) -> Iterator[FakeRenderApi]:
    """Serve ``api`` on a free loopback port in a thread; ``api.url`` is the base URL (``.../v1``)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    api.url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server = uvicorn.Server(uvicorn.Config(api.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="fake-render-api", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30.0  # generous: a loaded machine starts threads slowly
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            threading.Event().wait(0.02)
        assert server.started, "the fake Render API did not start"
        yield api
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
