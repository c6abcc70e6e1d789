"""DockerEngine against a real engine: failed builds, the platform check, tag and push to a real registry.

Small images only (``FROM scratch`` plus one file, or the cached base image), so these stay quick.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from platform_adapters.base import BUILD_FAILED, NOT_AUTHENTICATED, WRONG_ARCHITECTURE, DeployError
from platform_adapters.container_engine import DockerEngine, require_platform
from tests.e2e.conftest import Engine, Registry

pytestmark = pytest.mark.slow


@pytest.fixture
def tags(container_engine: Engine) -> Iterator[list[str]]:
    """Image names a test creates; all removed afterwards."""
    made: list[str] = []
    yield made
    for tag in made:
        with contextlib.suppress(Exception):
            container_engine.client.api.remove_image(tag, force=True)


def scratch_context(folder: Path, marker: str) -> Path:
    folder.mkdir()
    (folder / "marker.txt").write_text(marker)
    (folder / "Dockerfile").write_text("FROM scratch\nCOPY marker.txt /marker.txt\n")
    return folder


def test_failed_step_raises_build_failed_with_the_last_log_lines(
    container_engine: Engine, base_image: str, tmp_path: Path, tags: list[str]
) -> None:
    (tmp_path / "Dockerfile").write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo preparing-the-step && echo about-to-fail && exit 3\n"
    )
    streamed: list[str] = []
    tag = f"localhost/offline-e2e-broken:{uuid.uuid4().hex[:12]}"
    tags.append(tag)
    engine = DockerEngine.from_env(container_engine.env)
    with pytest.raises(DeployError) as caught:
        engine.build(tmp_path, tag, build_args={"BASE_IMAGE": base_image}, log=streamed.append)
    error = caught.value
    assert error.code == BUILD_FAILED
    assert tag in error.message
    assert "about-to-fail" in error.message  # the failing step's own output is quoted
    assert "exit 3" in error.message or "exit status 3" in error.message
    assert "about-to-fail" in streamed  # and it was streamed while the build ran
    assert error.hint


def test_image_of_another_platform_is_refused(
    container_engine: Engine, tmp_path: Path, tags: list[str]
) -> None:
    # Built straight through the API (DockerEngine always builds amd64); no RUN step, so no emulation needed.
    context = scratch_context(tmp_path / "ctx", "arm")
    tag = f"localhost/offline-e2e-arm:{uuid.uuid4().hex[:12]}"
    tags.append(tag)
    for event in container_engine.client.api.build(
        path=str(context), tag=tag, platform="linux/arm64", decode=True, rm=True
    ):
        assert "error" not in event, event
    engine = DockerEngine.from_env(container_engine.env)
    assert engine.image_platform(tag) == "linux/arm64"
    with pytest.raises(DeployError) as caught:
        require_platform(engine, tag)
    assert caught.value.code == WRONG_ARCHITECTURE
    assert "image does not provide linux/amd64 platform" in caught.value.message


def test_tag_and_push_to_a_registry_returns_its_digest(
    container_engine: Engine, local_registry: Registry, tmp_path: Path, tags: list[str]
) -> None:
    log: list[str] = []
    engine = DockerEngine.from_env(container_engine.env, log=log.append)
    local = f"localhost/offline-e2e-push:{uuid.uuid4().hex[:12]}"
    tags.append(local)
    engine.build(scratch_context(tmp_path / "ctx", uuid.uuid4().hex), local)
    assert engine.image_platform(local) == "linux/amd64"

    repository = "offline/e2e-app"
    remote = f"{local_registry.address}/{repository}:v1"
    tags.append(remote)
    engine.tag(local, remote)
    assert engine.image_platform(remote) == "linux/amd64"

    wrong = "not-the-password-" + uuid.uuid4().hex
    with pytest.raises(DeployError) as caught:
        engine.push(remote, username=local_registry.username, password=wrong)
    assert caught.value.code == NOT_AUTHENTICATED
    assert wrong not in str(caught.value) and wrong not in repr(caught.value.context)
    assert local_registry.manifest_digest(repository, "v1") is None

    digest = engine.push(remote, username=local_registry.username, password=local_registry.password)
    assert digest.startswith("sha256:")
    assert digest == local_registry.manifest_digest(repository, "v1")
    assert not any(local_registry.password in line or wrong in line for line in log)
