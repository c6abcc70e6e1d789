"""Test-side helpers: install fake executables on a private PATH, read their call log, build contexts."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from platform_adapters.base import DeployContext, SubprocessRunner
from tests.deploy.fakes._runtime import STATE_ENV

REPO_ROOT = Path(__file__).resolve().parents[3]

#: Fake programs by the executable names they stand in for.
KNOWN_FAKES = {
    "flyctl": "tests.deploy.fakes.flyctl",
    "fly": "tests.deploy.fakes.flyctl",
    "railway": "tests.deploy.fakes.railway",
}


class FakeCliEnv:
    """A bin directory of fake executables, their state directory, and the environment that uses them.

    ``env()`` is the *whole* environment for ``SubprocessRunner``: PATH holds only the fakes, so a CLI that
    was not installed is really missing, and HOME is private so no real vendor config is read or written.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin_dir = root / "bin"
        self.state_dir = root / "state"
        self.home = root / "home"
        for directory in (self.bin_dir, self.state_dir, self.home):
            directory.mkdir(parents=True, exist_ok=True)

    def install(self, name: str, module: str | None = None) -> Path:
        """Put an executable ``name`` on the fake PATH that runs ``module``'s ``main()`` (default: the known
        fake for that name) with the test interpreter."""
        target = module or KNOWN_FAKES[name]
        path = self.bin_dir / name
        path.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
            f"from {target} import main\n"
            "sys.exit(main())\n"
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {
            "PATH": str(self.bin_dir),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            STATE_ENV: str(self.state_dir),
            **(extra or {}),
        }

    # -- the world a fake vendor lives in

    def world_path(self, vendor: str) -> Path:
        return self.state_dir / f"{vendor}.json"

    def world(self, vendor: str) -> dict[str, Any]:
        path = self.world_path(vendor)
        return json.loads(path.read_text()) if path.exists() else {}

    def set_world(self, vendor: str, world: Mapping[str, Any]) -> None:
        self.world_path(vendor).write_text(json.dumps(world, indent=2, sort_keys=True))

    def update_world(self, vendor: str, change: Callable[[dict[str, Any]], None]) -> None:
        world = self.world(vendor)
        change(world)
        self.set_world(vendor, world)

    # -- what the fakes were asked

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        log = self.state_dir / "calls.jsonl"
        entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        return [entry for entry in entries if tool is None or entry["tool"] == tool]

    def argvs(self, tool: str | None = None) -> list[list[str]]:
        return [entry["argv"] for entry in self.calls(tool)]

    def stdin_of(self, call: Mapping[str, Any]) -> str | None:
        name = call.get("stdin")
        return (self.state_dir / "stdin" / name).read_text() if name else None

    def clear_calls(self) -> None:
        (self.state_dir / "calls.jsonl").unlink(missing_ok=True)

    def recorded_text(self) -> str:
        """Everything the fakes logged except stdin (argv, cwd, env names): secrets must not be in it."""
        log = self.state_dir / "calls.jsonl"
        return log.read_text() if log.exists() else ""


def write_build_context(deploy_dir: Path, *, client: bool = False) -> Path:
    """What the deploy command leaves in ``.offline/deploy`` before the adapter runs."""
    deploy_dir.mkdir(parents=True, exist_ok=True)
    (deploy_dir / "Dockerfile").write_text('FROM python:3.11-slim\nCMD ["python3", "/app/server.pyz"]\n')
    (deploy_dir / ".dockerignore").write_text("*\n!server.pyz\n!client/\n")
    (deploy_dir / "server.pyz").write_bytes(b"PK\x05\x06" + b"\x00" * 18)
    if client:
        (deploy_dir / "client").mkdir(exist_ok=True)
        (deploy_dir / "client" / "index.html").write_text("<!doctype html>")
    return deploy_dir


class ListReporter:
    """Reporter that keeps ``(kind, message)`` pairs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def step(self, title: str) -> None:
        self.events.append(("step", title))

    def info(self, message: str) -> None:
        self.events.append(("info", message))

    def warn(self, message: str) -> None:
        self.events.append(("warn", message))


def make_context(
    fake: FakeCliEnv,
    project_dir: Path,
    *,
    app: str = "demo-app",
    region: str | None = None,
    env: Mapping[str, str] | None = None,
    state: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    health_timeout: float = 60.0,
) -> DeployContext:
    """A DeployContext over the fakes: runner on the fake PATH, instant polling, a build context on disk."""
    full_env = fake.env(env)
    deploy_dir = project_dir / ".offline" / "deploy"
    if not deploy_dir.exists():
        write_build_context(deploy_dir)
    return DeployContext(
        project_dir=project_dir,
        deploy_dir=deploy_dir,
        app=app,
        region=region,
        env=full_env,
        runner=SubprocessRunner(full_env),
        reporter=ListReporter(),
        state=dict(state or {}),
        options=dict(options or {}),
        health_timeout=health_timeout,
        poll_interval=5.0,
        sleep=lambda seconds: None,
    )
