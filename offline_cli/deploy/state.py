"""Step 5: ``.offline/deploy/deploy.json``, what a deploy remembers for the next run (SPEC 3.3).

Only names, URLs and ids go in: platform (the ``--platform`` value), app, region, URLs, deployment ids,
options such as ECS subnets, and the adapter's own part. Secret values never do: ``save_state`` refuses
(and drops) any value that contains one of the forwarded secrets.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platform_adapters.base import DeployError

from .templates import write_text_atomic

STATE_SCHEMA_VERSION = 1
STATE_FILE = "deploy.json"
DEPLOY_DIR = Path(".offline") / "deploy"
STATE_INVALID = "STATE_INVALID"
#: How many deployment ids deploy.json keeps (newest last).
MAX_DEPLOYMENTS = 50


def deploy_dir_of(project_dir: Path) -> Path:
    return project_dir / DEPLOY_DIR


def state_path(project_dir: Path) -> Path:
    return deploy_dir_of(project_dir) / STATE_FILE


@dataclass
class DeployState:
    """The parsed deploy.json."""

    platform: str
    app: str
    region: str | None = None
    url: str | None = None
    sync_url: str | None = None
    deployments: list[dict[str, Any]] = field(default_factory=list)
    adapter: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    python_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": STATE_SCHEMA_VERSION,
            "platform": self.platform,
            "app": self.app,
            "region": self.region,
            "url": self.url,
            "sync_url": self.sync_url,
            "python_version": self.python_version,
            "options": self.options,
            "deployments": self.deployments,
            "adapter": self.adapter,
        }

    def record_deployment(self, deployment_id: str, *, kind: str, at: str) -> None:
        """Append a deployment (newest last), keeping the last MAX_DEPLOYMENTS."""
        self.deployments.append({"id": deployment_id, "kind": kind, "at": at})
        del self.deployments[:-MAX_DEPLOYMENTS]

    @property
    def deployment_ids(self) -> list[str]:
        return [str(d["id"]) for d in self.deployments]


def _invalid(path: Path, why: str) -> DeployError:
    return DeployError(
        f"{path} is not a valid deploy state file: {why}",
        STATE_INVALID,
        {"file": str(path)},
        hint="Fix the file, or start over with `offline deploy --reset` (the deployed app keeps running).",
    )


def load_state(project_dir: Path) -> DeployState | None:
    """deploy.json of ``project_dir``, or None when the project was never deployed."""
    path = state_path(project_dir)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise _invalid(path, f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise _invalid(path, "not a JSON object")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _invalid(path, "schema_version is missing")
    if version > STATE_SCHEMA_VERSION:
        raise DeployError(
            f"{path} has schema_version {version}, newer than this offline understands "
            f"({STATE_SCHEMA_VERSION})",
            STATE_INVALID,
            {"file": str(path), "schema_version": version},
            hint="Upgrade offline (pip install -U offline), or start over with `offline deploy --reset`.",
        )
    if version < 1:
        raise _invalid(path, f"schema_version {version} is not a positive integer")
    for key in ("platform", "app"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise _invalid(path, f"{key!r} is missing")
    deployments = [
        d if isinstance(d, dict) else {"id": str(d)} for d in data.get("deployments") or [] if d is not None
    ]
    return DeployState(
        platform=data["platform"],
        app=data["app"],
        region=data.get("region"),
        url=data.get("url"),
        sync_url=data.get("sync_url"),
        deployments=deployments,
        adapter=dict(data.get("adapter") or {}),
        options=dict(data.get("options") or {}),
        python_version=data.get("python_version"),
    )


def _scrub(value: Any, secrets: tuple[str, ...], dropped: list[str], where: str) -> Any:
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            cleaned = _scrub(item, secrets, dropped, f"{where}.{key}")
            if cleaned is not _DROP:
                kept[key] = cleaned
        return kept
    if isinstance(value, list):
        return [
            c for i, v in enumerate(value) if (c := _scrub(v, secrets, dropped, f"{where}[{i}]")) is not _DROP
        ]
    if isinstance(value, str) and any(secret in value for secret in secrets):
        dropped.append(where)
        return _DROP
    return value


_DROP = object()


def save_state(project_dir: Path, state: DeployState, secrets: Iterable[str] = ()) -> list[str]:
    """Write deploy.json atomically. Values containing a secret are left out; their JSON paths are returned
    so the caller can warn."""
    values = tuple(s for s in secrets if len(s) >= 4)
    dropped: list[str] = []
    data = _scrub(state.to_json(), values, dropped, "$")
    write_text_atomic(state_path(project_dir), json.dumps(data, indent=2, sort_keys=False) + "\n")
    return dropped


def reset_state(project_dir: Path) -> bool:
    """Delete ``.offline/deploy/`` (state and every generated file). True when there was something."""
    folder = deploy_dir_of(project_dir)
    if not folder.exists():
        return False
    shutil.rmtree(folder)
    return True
