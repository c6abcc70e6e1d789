"""Step 4: build the frontend for production and copy it to ``.offline/deploy/client/``.

``npm run build`` when package.json has a ``build`` script (output ``dist/``), else an existing ``dist/``;
neither means only the server is deployed. The build gets ``BUILD_SYNC_URL`` (the deployed
``wss://<host>/offline-sync``) so the client talks to the server it ships with (SPEC 2.14), and
``OFFLINE_PYTHON`` (this Python, unless already set): an `offline init` project's build runs
``python -m offline_cli.web_build``, and the Python running `offline deploy` is the one known to have it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from platform_adapters.base import BUILD_FAILED, CommandRunner, DeployError, Reporter

CLIENT_DIR_NAME = "client"
BUILD_OUTPUT = "dist"
_ERROR_TAIL_LINES = 15


def has_build_script(project_dir: Path) -> bool:
    """True when ``package.json`` declares a ``build`` script."""
    manifest = project_dir / "package.json"
    if not manifest.is_file():
        return False
    try:
        scripts = json.loads(manifest.read_text(encoding="utf-8")).get("scripts") or {}
    except (ValueError, AttributeError) as exc:
        raise DeployError(
            f"{manifest} is not valid JSON: {exc}",
            BUILD_FAILED,
            {"file": str(manifest)},
            hint="Fix package.json (or remove it when the project has no frontend).",
        ) from None
    return isinstance(scripts, dict) and bool(scripts.get("build"))


def client_available(project_dir: Path) -> bool:
    """Whether a client will be deployed (a build script or an existing dist/)."""
    return has_build_script(project_dir) or (project_dir / BUILD_OUTPUT).is_dir()


def build_client(
    project_dir: Path,
    deploy_dir: Path,
    *,
    sync_url: str | None,
    runner: CommandRunner,
    reporter: Reporter,
    timeout: float = 1800.0,
) -> Path | None:
    """Build the client and copy it to ``deploy_dir/client``; return that folder, or None (server only)."""
    reporter.step("Building the client")
    target = deploy_dir / CLIENT_DIR_NAME
    source = project_dir / BUILD_OUTPUT
    if has_build_script(project_dir):
        if runner.which("npm") is None:
            raise DeployError(
                "npm is required to build the client (package.json has a build script) but is not installed",
                BUILD_FAILED,
                {"step": "client", "tool": "npm"},
                hint="Install Node.js (https://nodejs.org), which provides npm, then run offline deploy again.",
            )
        # Without it the template's build would look for .venv, $VIRTUAL_ENV, python3, python: possibly a
        # Python without offline installed, or another version of it than the one deploying.
        env = {"OFFLINE_PYTHON": os.environ.get("OFFLINE_PYTHON") or sys.executable}
        if sync_url:
            env["BUILD_SYNC_URL"] = sync_url
        if sync_url:
            reporter.info(f"npm run build with BUILD_SYNC_URL={sync_url}")
        else:
            reporter.warn(
                "the app's URL is not known yet, so the client is built without BUILD_SYNC_URL; "
                "run `offline deploy` again after this first deploy to bake in the sync URL"
            )
        result = runner.run(["npm", "run", "build"], env=env, cwd=project_dir, timeout=timeout, stream=True)
        if result.returncode != 0:
            lines = [line for line in (result.stdout + "\n" + result.stderr).splitlines() if line.strip()]
            raise DeployError(
                f"the client build failed (npm run build exit code {result.returncode}):\n"
                + "\n".join(lines[-_ERROR_TAIL_LINES:]),
                BUILD_FAILED,
                {"step": "client", "returncode": result.returncode},
                hint="Run `npm run build` in the project to see the whole error, fix it, and deploy again.",
            )
        if not source.is_dir():
            raise DeployError(
                f"npm run build finished but produced no {BUILD_OUTPUT}/ folder in {project_dir}",
                BUILD_FAILED,
                {"step": "client"},
                hint=f"Make the build script write the production client to {BUILD_OUTPUT}/.",
            )
    elif source.is_dir():
        reporter.info(f"no build script in package.json: deploying the existing {BUILD_OUTPUT}/ as it is")
    else:
        if target.exists():
            shutil.rmtree(target)
        reporter.warn(
            "no client found (no build script in package.json and no dist/ folder): "
            "only the server is deployed"
        )
        return None
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    reporter.info(f"client copied to {target}")
    return target
