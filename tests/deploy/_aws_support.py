"""Test helpers for the two AWS adapters: a recording reporter and container engine, fake `aws` and
`lightsailctl` executables on a private PATH, fake AWS credentials, and a recording proxy around boto3
clients (so a test can assert the exact sequence of AWS calls an adapter makes)."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from platform_adapters.base import (
    DAEMON_UNAVAILABLE,
    DeployContext,
    DeployError,
    SubprocessRunner,
)

FAKES = Path(__file__).parent / "fakes"
REGION = "eu-west-1"
APP = "todo-app"
IMAGE_ID = "sha256:" + "ab" * 32
PUSHED_DIGEST = "sha256:" + "cd" * 32
# Values that must reach the deployed container's environment and nothing else.
DATABASE_URL = "postgresql://todo:pg-Pa55word-xyz@db.internal:5432/todo"
AUTH_SECRET = "c2VjcmV0LWF1dGgtc2VjcmV0LWJ5dGVzLTMyLWxvbmc="
SECRETS = ("pg-Pa55word-xyz", DATABASE_URL, AUTH_SECRET)


@dataclass
class RecordingReporter:
    entries: list[tuple[str, str]] = field(default_factory=list)

    def step(self, title: str) -> None:
        self.entries.append(("step", title))

    def info(self, message: str) -> None:
        self.entries.append(("info", message))

    def warn(self, message: str) -> None:
        self.entries.append(("warn", message))

    def text(self) -> str:
        return "\n".join(message for _, message in self.entries)


@dataclass
class FakeEngine:
    """A ContainerEngine that records calls; ``down`` and ``platform`` simulate a stopped daemon and a
    wrong-architecture build."""

    down: bool = False
    platform: str = "linux/amd64"
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def ping(self) -> None:
        self.calls.append(("ping",))
        if self.down:
            raise DeployError(
                "cannot connect to the container daemon at unix:///var/run/docker.sock",
                DAEMON_UNAVAILABLE,
                hint="Start Docker.",
            )

    def build(self, context_dir: Path, tag: str, *, build_args: Mapping[str, str] | None = None) -> str:
        self.calls.append(("build", context_dir, tag))
        return IMAGE_ID

    def image_platform(self, tag: str) -> str:
        self.calls.append(("image_platform", tag))
        return self.platform

    def tag(self, source: str, target: str) -> None:
        self.calls.append(("tag", source, target))

    def push(self, tag: str, *, username: str | None = None, password: str | None = None) -> str:
        self.calls.append(("push", tag, username, password))
        return PUSHED_DIGEST


def install_fake_clis(bin_dir: Path, *, aws: bool = True, lightsailctl: bool = True) -> None:
    """Put `aws` and/or `lightsailctl` (thin shell wrappers running the fakes with this interpreter) into
    ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for wanted, name, script in (
        (aws, "aws", "aws_cli.py"),
        (lightsailctl, "lightsailctl", "aws_lightsailctl.py"),
    ):
        if not wanted:
            continue
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKES / script}" "$@"\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def read_cli_log(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def make_context(
    tmp_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    state: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    client_factory: Any = None,
    engine: FakeEngine | None = None,
    region: str | None = REGION,
    with_secrets: bool = True,
) -> DeployContext:
    """A context whose runner sees only ``tmp_path/bin`` on PATH (the wrappers name their interpreters)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    deploy_dir = tmp_path / "project" / ".offline" / "deploy"
    deploy_dir.mkdir(parents=True, exist_ok=True)
    (deploy_dir / "Dockerfile").write_text("FROM python:3.11-slim\n")
    full_env = {"PATH": str(bin_dir), "FAKE_AWS_LOG": str(tmp_path / "cli.jsonl")}
    if with_secrets:
        full_env |= {"DATABASE_URL": DATABASE_URL, "AUTH_SECRET": AUTH_SECRET}
    full_env |= dict(env or {})
    return DeployContext(
        project_dir=tmp_path / "project",
        deploy_dir=deploy_dir,
        app=APP,
        region=region,
        env=full_env,
        runner=SubprocessRunner(full_env),
        reporter=RecordingReporter(),
        state=dict(state or {}),
        options=dict(options or {}),
        client_factory=client_factory,
        engine=engine if engine is not None else FakeEngine(),
        health_timeout=3.0,
        poll_interval=1.0,
        sleep=lambda _seconds: None,
    )


def reporter_of(ctx: DeployContext) -> RecordingReporter:
    assert isinstance(ctx.reporter, RecordingReporter)
    return ctx.reporter


def assert_no_secrets(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


def set_fake_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, keys: bool = True) -> None:
    """Fake credentials for boto3/moto in this test only (none when ``keys`` is False), and no way to reach
    a real AWS configuration or the instance metadata service."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    if keys:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


class RecordingClient:
    """Forwards to a boto3 client and appends ``(service, operation, params)`` for every API call."""

    def __init__(self, client: Any, service: str, calls: list[tuple[str, str, dict[str, Any]]]) -> None:
        self._client = client
        self._service = service
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name.startswith("_") or name in ("meta", "exceptions") or not callable(attribute):
            return attribute

        def call(**params: Any) -> Any:
            self._calls.append((self._service, name, params))
            return attribute(**params)

        return call


@dataclass
class RecordingFactory:
    """A ``client_factory`` handing out one recording client per service (boto3 clients, so moto answers)."""

    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    clients: dict[str, RecordingClient] = field(default_factory=dict)
    regions: list[str | None] = field(default_factory=list)

    def __call__(self, service: str, region_name: str | None = None) -> RecordingClient:
        import boto3

        self.regions.append(region_name)
        if service not in self.clients:
            self.clients[service] = RecordingClient(
                boto3.client(service, region_name=region_name), service, self.calls
            )
        return self.clients[service]

    def operations(self) -> list[tuple[str, str]]:
        return [(service, operation) for service, operation, _ in self.calls]

    def params(self, service: str, operation: str) -> list[dict[str, Any]]:
        return [params for s, o, params in self.calls if (s, o) == (service, operation)]
