"""Everything needed for ``docker build`` of a project, without any platform: ``prepare_build_context``.

It runs the shared deploy steps in one go (server entry, Dockerfile and .dockerignore, .gitignore, the
``server.pyz`` zipapp, the client build) and returns ``<project>/.offline/deploy``, ready to be the build
context. The base image stays a build argument (``--build-arg BASE_IMAGE=...``); it is never rendered into
the Dockerfile. End-to-end image tests use this; ``offline deploy`` runs the same steps interleaved with the
platform's (the client is built once the app's URL is known).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from platform_adapters.base import CommandRunner, Reporter, SubprocessRunner

from .bundle import bundle_server, check_python_version
from .client_build import build_client, client_available
from .entry import find_server_entry
from .reporter import NullReporter
from .state import deploy_dir_of
from .templates import DEFAULT_PORT, ensure_gitignored, render_deploy_files

_PYTHON_IMAGE = re.compile(r"(?:^|/)python:(3\.\d{1,2})(?:[.\-]|$)")


def python_version_of_image(image: str | None) -> str | None:
    """``3.12`` for ``python:3.12-slim`` (or ``docker.io/library/python:3.12.4``); None when not readable."""
    if not image:
        return None
    found = _PYTHON_IMAGE.search(image)
    return found.group(1) if found else None


def prepare_build_context(
    project_dir: Path,
    *,
    python_version: str | None = None,
    base_image: str | None = None,
    sync_url: str | None = None,
    reporter: Reporter | None = None,
    runner: CommandRunner | None = None,
    port: int = DEFAULT_PORT,
) -> Path:
    """Render, bundle and build into ``project_dir/.offline/deploy``; return that folder.

    ``python_version`` is the image's CPython minor version; when None it is read from a ``python:X.Y…``
    ``base_image`` name, else the running interpreter's. ``sync_url`` becomes the client's BUILD_SYNC_URL.
    """
    project_dir = project_dir.resolve()
    reporter = reporter or NullReporter()
    runner = runner or SubprocessRunner(dict(os.environ))
    version = check_python_version(python_version or python_version_of_image(base_image))
    entry = find_server_entry(project_dir)
    deploy_dir = deploy_dir_of(project_dir)
    reporter.step("Generating the container build recipe")
    render_deploy_files(
        deploy_dir, python_version=version, port=port, has_client=client_available(project_dir)
    )
    ensure_gitignored(project_dir)
    bundle_server(project_dir, entry, deploy_dir, python_version=version, runner=runner, reporter=reporter)
    build_client(project_dir, deploy_dir, sync_url=sync_url, runner=runner, reporter=reporter)
    return deploy_dir
