"""A container registry the user names with ``--registry host/namespace`` (DESIGN.md section 7), shared by the
platforms that build the image locally and hand it on through a registry of the user's choice
(``self-hosted-image``, ``web-service-host``).

The login is the engine's own: ``docker login`` / ``podman login`` credentials, which the docker SDK reads
from the engine's client configuration (``DOCKER_CONFIG`` or ``~/.docker/config.json``, credential helpers
included) when no username and password are passed. The deploy never asks for, stores or prints them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import ContainerEngine, DeployError, Reporter

__all__ = [
    "INVALID_REGISTRY",
    "RegistryTarget",
    "parse_registry",
    "push_image",
]

INVALID_REGISTRY = "INVALID_OPTION"  # the flow's code for a flag value it cannot use

# host[:port] then one or more path components: what `docker push` accepts before the repository name.
_HOST = re.compile(
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?$"
)
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_EXAMPLE = "--registry ghcr.io/my-team (or registry.example.com:5000/apps)"


@dataclass(frozen=True)
class RegistryTarget:
    """``ghcr.io/my-team`` split into its host (``ghcr.io``) and namespace (``my-team``)."""

    host: str
    namespace: str

    def __str__(self) -> str:
        return f"{self.host}/{self.namespace}"

    def reference(self, repository: str, tag: str) -> str:
        """``host/namespace/repository:tag``, the name the image is pushed and pulled under."""
        if not _COMPONENT.match(repository) or not _TAG.match(tag):
            raise DeployError(
                f"{repository}:{tag} is not a valid image name under {self}",
                INVALID_REGISTRY,
                {"option": "--registry", "repository": repository, "tag": tag},
                hint="Use a lowercase app name (letters, digits, hyphens).",
            )
        return f"{self}/{repository}:{tag}"


def parse_registry(value: str) -> RegistryTarget:
    """The ``--registry`` value as a RegistryTarget; INVALID_OPTION naming the flag when it is not
    ``host[:port]/namespace`` (no scheme, no tag)."""
    text = value.strip().rstrip("/")
    host, _, namespace = text.partition("/")
    problem = None
    if "://" in value:
        problem = "it must not have a scheme (drop https://)"
    elif not namespace:
        problem = "it needs a namespace after the host (host/namespace)"
    elif not _HOST.match(host) or ("." not in host and ":" not in host and host != "localhost"):
        problem = f"{host!r} is not a registry host (a domain name or address, with an optional :port)"
    elif not all(_COMPONENT.match(part) for part in namespace.split("/")):
        problem = f"{namespace!r} is not a namespace (lowercase letters, digits, '.', '_', '-', and '/')"
    if problem is not None:
        raise DeployError(
            f"--registry {value!r} is not a registry: {problem}",
            INVALID_REGISTRY,
            {"option": "--registry", "value": value},
            hint=f"Pass the registry and namespace to push to, e.g. {_EXAMPLE}.",
        )
    return RegistryTarget(host, namespace)


def push_image(
    engine: ContainerEngine,
    local_tag: str,
    registry: RegistryTarget,
    repository: str,
    tag: str,
    reporter: Reporter,
) -> tuple[str, str]:
    """Tag ``local_tag`` as ``registry/repository:tag`` and push it with the engine's own credentials;
    return (the pushed reference, its digest). A refused login is NOT_AUTHENTICATED (container_engine)."""
    reference = registry.reference(repository, tag)
    engine.tag(local_tag, reference)
    reporter.info(f"pushing {reference} (with the engine's own login for {registry.host})")
    try:
        digest = engine.push(reference)
    except DeployError as exc:
        if exc.code == "NOT_AUTHENTICATED":
            exc.hint = (
                f"Log the engine in to {registry.host} (`docker login {registry.host}` or "
                f"`podman login {registry.host}`) with an account that may push to {registry}, then retry."
            )
        raise
    return reference, digest
