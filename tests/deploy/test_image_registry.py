"""``--registry host/namespace`` (platform_adapters.image_registry): what is accepted, what is refused with the
flag's name, and the push going through the engine with its own login (no credentials passed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from platform_adapters.base import DeployError
from platform_adapters.image_registry import RegistryTarget, parse_registry, push_image

from ._aws_support import FakeEngine


@pytest.mark.parametrize(
    ("value", "host", "namespace"),
    [
        ("ghcr.io/my-team", "ghcr.io", "my-team"),
        ("registry.example.com:5000/apps/prod", "registry.example.com:5000", "apps/prod"),
        ("127.0.0.1:5000/offline", "127.0.0.1:5000", "offline"),
        ("localhost/dev", "localhost", "dev"),
        (" docker.io/alice/ ", "docker.io", "alice"),
    ],
)
def test_registry_values_split_into_host_and_namespace(value: str, host: str, namespace: str) -> None:
    assert parse_registry(value) == RegistryTarget(host, namespace)
    assert (
        parse_registry(value).reference("notes", "20261127-131500")
        == f"{host}/{namespace}/notes:20261127-131500"
    )


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("https://ghcr.io/team", "scheme"),
        ("ghcr.io", "namespace"),
        ("my-team/notes", "not a registry host"),
        ("ghcr.io/My_Team", "not a namespace"),
        ("bad host/x", "not a registry host"),
    ],
)
def test_unusable_registry_values_are_refused_naming_the_flag(value: str, why: str) -> None:
    with pytest.raises(DeployError) as caught:
        parse_registry(value)
    assert caught.value.code == "INVALID_OPTION"
    assert "--registry" in caught.value.message and why in caught.value.message
    assert "--registry ghcr.io/" in caught.value.hint


class Said:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, title: str) -> None:
        self.lines.append(title)

    def info(self, message: str) -> None:
        self.lines.append(message)

    def warn(self, message: str) -> None:
        self.lines.append(message)


def test_push_tags_then_pushes_with_the_engines_own_login(tmp_path: Path) -> None:
    engine = FakeEngine()
    reference, digest = push_image(
        engine, "offline-notes:1", parse_registry("ghcr.io/team"), "notes", "1", Said()
    )
    assert reference == "ghcr.io/team/notes:1" and digest.startswith("sha256:")
    assert ("tag", "offline-notes:1", "ghcr.io/team/notes:1") in engine.calls
    assert ("push", "ghcr.io/team/notes:1", None, None) in engine.calls  # no username/password: the engine's


class RefusingEngine(FakeEngine):
    def push(self, tag: str, *, username: str | None = None, password: str | None = None) -> str:
        raise DeployError("cloud CLI is not authenticated: the registry refused", "NOT_AUTHENTICATED")


def test_a_refused_push_says_how_to_log_the_engine_in() -> None:
    engine = RefusingEngine()
    with pytest.raises(DeployError) as caught:
        push_image(engine, "offline-notes:1", parse_registry("ghcr.io/team"), "notes", "1", Said())
    assert caught.value.code == "NOT_AUTHENTICATED"
    assert "docker login ghcr.io" in caught.value.hint and "podman login ghcr.io" in caught.value.hint
