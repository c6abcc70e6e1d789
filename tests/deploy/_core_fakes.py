"""Test doubles for the deploy core: a platform that keeps its apps and deployments in memory.

``FakePlatform`` is the vendor's side (what exists remotely); ``FakeAdapter`` is a faithful PlatformAdapter
over it that records every call. Tests register it as a ``--platform`` value with ``register_fake``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

import platform_adapters
from platform_adapters.base import (
    NO_PREVIOUS_DEPLOYMENT,
    DeployContext,
    DeployError,
    Deployment,
    DeployOutcome,
    PlatformAdapter,
    StatusReport,
)

FAKE_PLATFORM = "fake-host"


@dataclass
class FakePlatform:
    """The remote side: apps by name, each with deployments (newest last) and a current one."""

    apps: dict[str, list[Deployment]] = field(default_factory=dict)
    current: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    contexts: list[DeployContext] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)  # ctx.state as each call saw it
    seen_files: list[list[str]] = field(default_factory=list)
    status_state: str = "RUNNING"
    logged_in: bool = True
    leak_secrets: bool = False  # a buggy adapter returning the forwarded secrets as state
    progress: list[tuple[str, str]] = field(default_factory=list)  # (kind, message) deploy() reports
    log_lines: list[str] = field(default_factory=lambda: [f"line {i}" for i in range(1, 301)])
    next_id: int = 1
    # Like ECS without a load balancer: deploy() knows no URL ("") and the health wait may find one.
    outcome_url: str | None = None  # None: the app's https URL
    healthy_url: str | None = None  # None: the outcome's URL

    def url(self, app: str) -> str:
        return f"https://{app}.fake.test"


class FakeAdapter(PlatformAdapter):
    name: ClassVar[str] = FAKE_PLATFORM
    title: ClassVar[str] = "Fake host"
    default_region: ClassVar[str | None] = "fra"
    regions: ClassVar[tuple[str, ...]] = ("fra", "iad", "syd")

    def __init__(self, remote: FakePlatform) -> None:
        self.remote = remote

    def _record(self, name: str, ctx: DeployContext) -> None:
        self.remote.calls.append(name)
        self.remote.contexts.append(ctx)
        self.remote.states.append(dict(ctx.state))

    def check_prerequisites(self, ctx: DeployContext) -> None:
        self._record("check_prerequisites", ctx)
        if not self.remote.logged_in:
            raise DeployError(
                "fakectl is not logged in", "NOT_AUTHENTICATED", hint="Run `fakectl auth login`."
            )

    def provision(self, ctx: DeployContext) -> dict[str, Any]:
        self._record("provision", ctx)
        created = ctx.app not in self.remote.apps
        self.remote.apps.setdefault(ctx.app, [])
        return {"app_id": f"id-{ctx.app}", "created": created}

    def public_url(self, ctx: DeployContext) -> str | None:
        self._record("public_url", ctx)
        return self.remote.url(ctx.app) if ctx.app in self.remote.apps else None

    def render_config(self, ctx: DeployContext) -> list[Path]:
        self._record("render_config", ctx)
        path = ctx.deploy_dir / "fake.toml"
        path.write_text(f'app = "{ctx.app}"\ninternal_port = {ctx.port}\n')
        return [path]

    def deploy(self, ctx: DeployContext) -> DeployOutcome:
        self._record("deploy", ctx)
        for kind, message in self.remote.progress:  # like build output relayed to the user
            getattr(ctx.reporter, kind)(message)
        self.remote.seen_files.append(
            sorted(str(p.relative_to(ctx.deploy_dir)) for p in ctx.deploy_dir.rglob("*") if p.is_file())
        )
        deployment_id = f"d{self.remote.next_id}"
        self.remote.next_id += 1
        self._activate(ctx.app, Deployment(id=deployment_id, status="SUCCESS", image=f"img:{deployment_id}"))
        state: dict[str, Any] = {"last_image": f"img:{deployment_id}"}
        if self.remote.leak_secrets:
            state["env"] = ctx.forwarded_secrets()
        url = self.remote.url(ctx.app) if self.remote.outcome_url is None else self.remote.outcome_url
        return DeployOutcome(url, deployment_id, state)

    def _activate(self, app: str, deployment: Deployment) -> None:
        self.remote.apps[app].append(deployment)
        self.remote.current[app] = deployment.id

    def wait_until_healthy(self, ctx: DeployContext, outcome: DeployOutcome) -> StatusReport:
        self._record("wait_until_healthy", ctx)
        url = outcome.url if self.remote.healthy_url is None else self.remote.healthy_url
        return StatusReport("RUNNING", True, url or None, outcome.deployment_id)

    def status(self, ctx: DeployContext) -> StatusReport:
        self._record("status", ctx)
        if ctx.app not in self.remote.apps:
            return StatusReport("NOT_FOUND", False)
        return StatusReport(
            self.remote.status_state,  # type: ignore[arg-type]
            self.remote.status_state == "RUNNING",
            self.remote.url(ctx.app),
            self.remote.current.get(ctx.app),
        )

    def logs(self, ctx: DeployContext, *, lines: int = 100) -> list[str]:
        self._record(f"logs:{lines}", ctx)
        return self.remote.log_lines[-lines:]

    def deployments(self, ctx: DeployContext) -> list[Deployment]:
        self._record("deployments", ctx)
        current = self.remote.current.get(ctx.app)
        return [
            Deployment(d.id, d.status, d.created_at, d.image, current=d.id == current)
            for d in reversed(self.remote.apps.get(ctx.app, []))
        ]

    def rollback(self, ctx: DeployContext, deployment_id: str | None = None) -> DeployOutcome:
        self._record(f"rollback:{deployment_id}", ctx)
        history = self.remote.apps.get(ctx.app, [])
        if deployment_id is None:
            # Like the real platforms: the newest successful deployment before the current one.
            current = self.remote.current.get(ctx.app)
            position = next((i for i, d in enumerate(history) if d.id == current), len(history))
            earlier = [
                d for d in history[:position] if d.status == "SUCCESS" and d.image != history[position].image
            ]
            target = earlier[-1] if earlier else None
        else:
            target = next((d for d in history if d.id == deployment_id), None)
        if target is None:
            raise DeployError(f"{ctx.app} has no deployment to roll back to", NO_PREVIOUS_DEPLOYMENT)
        new_id = f"d{self.remote.next_id}"
        self.remote.next_id += 1
        self._activate(ctx.app, Deployment(id=new_id, status="SUCCESS", image=target.image))
        return DeployOutcome(self.remote.url(ctx.app), new_id, {"last_image": target.image})


class FakeAwsAdapter(FakeAdapter):
    """Stands in for an AWS platform (region from the AWS configuration; no region list)."""

    name: ClassVar[str] = "cloud-a-containers"
    title: ClassVar[str] = "Fake AWS"
    default_region: ClassVar[str | None] = None
    regions: ClassVar[tuple[str, ...]] = ()


class FakeEcsAdapter(FakeAwsAdapter):
    name: ClassVar[str] = "cloud-a-orchestrated"


def register_fake(monkeypatch: pytest.MonkeyPatch, remote: FakePlatform) -> None:
    """Make ``--platform fake-host`` (and the two AWS values) load fakes over ``remote``."""
    original = platform_adapters.load_adapter
    monkeypatch.setitem(
        platform_adapters.PLATFORMS, FAKE_PLATFORM, ("tests.deploy._core_fakes:FakeAdapter", "Fake host")
    )

    def load(name: str) -> PlatformAdapter:
        if name == FAKE_PLATFORM:
            return FakeAdapter(remote)
        if name == "cloud-a-containers":
            return FakeAwsAdapter(remote)
        if name == "cloud-a-orchestrated":
            return FakeEcsAdapter(remote)
        return original(name)

    monkeypatch.setattr(platform_adapters, "load_adapter", load)


@dataclass
class FakeBundler:
    """Stands in for the shiv bundle (the real one is tested once, slowly): writes a placeholder zipapp."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, project_dir: Path, entry: Path, deploy_dir: Path, **kwargs: Any) -> Path:
        self.calls.append({"project_dir": project_dir, "entry": entry, "deploy_dir": deploy_dir, **kwargs})
        output = deploy_dir / "server.pyz"
        output.write_bytes(b"PK fake zipapp")
        return output


def write_project(folder: Path, *, entry: str = "server.py", client: str | None = None) -> Path:
    """A minimal project: a schema, an entry, and optionally a client (``"dist"`` or ``"npm"``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "schema.py").write_text(
        "from offline import define_schema, t\n"
        "schema = define_schema({'version': 1, 'collections': {'notes': {'fields': {'title': t.string()}}}})\n"
    )
    target = folder / entry
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("from schema import schema\n\n__all__ = ['schema']\n")
    if client == "dist":
        (folder / "dist").mkdir()
        (folder / "dist" / "index.html").write_text("<!doctype html><title>notes</title>\n")
    elif client == "npm":
        (folder / "package.json").write_text('{"name": "notes", "scripts": {"build": "fake-build"}}\n')
    return folder


FAKE_NPM = """#!/bin/sh
# A stand-in for npm: records argv and BUILD_SYNC_URL, then writes dist/index.html like a real build.
printf '%s\\n' "$*" >> "$FAKE_NPM_LOG"
printf 'BUILD_SYNC_URL=%s\\n' "${BUILD_SYNC_URL-<unset>}" >> "$FAKE_NPM_LOG"
if [ -n "$FAKE_NPM_FAIL" ]; then echo "error: $FAKE_NPM_FAIL" >&2; exit 3; fi
mkdir -p dist
printf '<!doctype html><script>const sync = "%s";</script>\\n' "$BUILD_SYNC_URL" > dist/index.html
"""


def install_fake_npm(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    npm = bin_dir / "npm"
    npm.write_text(FAKE_NPM)
    npm.chmod(0o755)
    return npm


def secret_scan(root: Path, secrets: Sequence[str]) -> list[str]:
    """Files under ``root`` (zip members included as bytes) that contain any secret."""
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {s[:3]}…" for s in secrets if s.encode() in data]
    return found
