"""The real ContainerEngine (platform_adapters.base): any Docker-compatible daemon through the docker SDK.

Docker itself, or podman's Docker-compatible socket (``podman system service``), picked the way the docker
CLI picks it: ``DOCKER_HOST`` (and ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``) from the environment the caller
passes, else the current docker context, else ``unix:///var/run/docker.sock``.

The SDK is imported inside methods only: ``offline --help`` and every platform that builds remotely must not
pay for (or need) it. Every failure leaves as a DeployError with a code the deploy command understands.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import (
    BUILD_FAILED,
    DAEMON_UNAVAILABLE,
    NOT_AUTHENTICATED,
    PLATFORM_ERROR,
    WRONG_ARCHITECTURE,
    DeployError,
)

if TYPE_CHECKING:
    from .base import ContainerEngine

__all__ = [
    "DEFAULT_DOCKER_HOST",
    "TARGET_PLATFORM",
    "DockerEngine",
    "LogCallback",
    "require_platform",
    "split_reference",
]

#: Every image the deploy command builds runs on linux/amd64 hosts (SPEC 4.6 rule 4), also from ARM laptops.
TARGET_PLATFORM = "linux/amd64"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
#: How many log lines a BUILD_FAILED error quotes: enough for the failing step and its output.
LOG_TAIL_LINES = 25
#: Builds and pushes go quiet for long stretches (a big layer upload); the SDK's 60 s default is too short.
DEFAULT_TIMEOUT = 900.0

LogCallback = Callable[[str], None]

_DIGEST = re.compile(r"\b(sha256:[0-9a-f]{64})\b")
_AUTH_FAILURE = re.compile(
    r"unauthori[sz]ed|authentication required|access denied|denied:|\b401\b|\b403\b|no basic auth",
    re.IGNORECASE,
)
_USERINFO = re.compile(r"(//)[^/@\s]+@")

_DAEMON_HINT = (
    "Start Docker, or podman's Docker-compatible service "
    "(`podman system service --time=0 unix:///run/podman/podman.sock`), "
    "or set DOCKER_HOST to the engine's socket (e.g. DOCKER_HOST=unix:///run/podman/podman.sock), then retry."
)


class DockerEngine:
    """A ContainerEngine backed by a Docker-compatible daemon. Connects on first use, not on construction."""

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        log: LogCallback | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._env = dict(env)
        self._log = log
        self._timeout = timeout
        self._client: Any = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, log: LogCallback | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> DockerEngine:
        """An engine for the daemon ``env`` names (``DOCKER_HOST``); ``log`` receives build and push output."""
        return cls(env, log=log, timeout=timeout)

    @property
    def host(self) -> str:
        """Where the daemon is expected, for messages (user:password parts of a URL are never shown)."""
        return _USERINFO.sub(r"\1", self._env.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST)

    # -- ContainerEngine ---------------------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise DeployError(DAEMON_UNAVAILABLE) unless a daemon answers."""
        client = self._connect()
        try:
            client.ping()
        except Exception as exc:
            raise self._translate(exc) from None

    def build(
        self,
        context_dir: Path,
        tag: str,
        *,
        build_args: Mapping[str, str] | None = None,
        log: LogCallback | None = None,
    ) -> str:
        """Build ``context_dir``'s Dockerfile for linux/amd64 as ``tag``; return the image id.

        Each line of the build's output goes to ``log`` (or the engine's callback) as it arrives. A failed step
        raises BUILD_FAILED quoting the last lines; an image of another platform raises WRONG_ARCHITECTURE.
        """
        context = Path(context_dir)
        if not (context / "Dockerfile").is_file():
            raise DeployError(
                f"cannot build the image {tag}: {context / 'Dockerfile'} does not exist",
                BUILD_FAILED,
                {"context": str(context), "tag": tag},
                hint="Run `offline deploy` again to regenerate .offline/deploy/.",
            )
        client = self._connect()
        tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        emit = log or self._log
        image_id: str | None = None
        try:
            # The low-level API streams the log; the high-level images.build only returns it at the end.
            events = client.api.build(
                path=str(context),
                tag=tag,
                buildargs=dict(build_args or {}),
                platform=TARGET_PLATFORM,
                rm=True,
                forcerm=True,
                decode=True,
            )
            for event in events:
                error = _event_error(event)
                if error is not None:
                    if emit is not None:
                        emit(error)
                    raise _build_failed(tag, error, tail)
                _record(event.get("stream") or event.get("status") or "", tail, emit)
                aux = event.get("aux")
                if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
                    image_id = aux["ID"]
        except DeployError:
            raise
        except Exception as exc:
            translated = self._translate(exc)
            if translated.code == DAEMON_UNAVAILABLE:
                raise translated from None
            raise _build_failed(tag, _explanation(exc), tail) from None
        if image_id is None:
            # Daemons that send no aux record (older Docker) still tagged the image: ask for its id.
            image_id = str(self._inspect(client, tag)["Id"])
        require_platform(self, tag)
        return image_id

    def image_platform(self, tag: str) -> str:
        """``os/architecture`` of the local image ``tag`` (``linux/amd64``), from the image's own config."""
        attrs = self._inspect(self._connect(), tag)
        return f"{attrs.get('Os') or 'unknown'}/{attrs.get('Architecture') or 'unknown'}"

    def tag(self, source: str, target: str) -> None:
        """Give the local image ``source`` the extra name ``target`` (``registry/repository:tag``)."""
        client = self._connect()
        repository, ref = split_reference(target)
        try:
            ok = client.api.tag(source, repository, ref)
        except Exception as exc:
            translated = self._translate(exc)
            if translated.code == DAEMON_UNAVAILABLE:
                raise translated from None
            raise DeployError(
                f"could not tag the image {source} as {target}: {_explanation(exc)}",
                BUILD_FAILED,
                {"source": source, "target": target},
                hint="Check that the image was built (`offline deploy` builds it) and that the name is valid.",
            ) from None
        if ok is False:
            raise DeployError(
                f"the container daemon refused to tag {source} as {target}",
                BUILD_FAILED,
                {"source": source, "target": target},
                hint="Check that the image was built and that the name is valid.",
            )

    def push(self, tag: str, *, username: str | None = None, password: str | None = None) -> str:
        """Push ``tag`` to its registry with these credentials; return the pushed manifest digest."""
        client = self._connect()
        repository, ref = split_reference(tag)
        auth = {"username": username, "password": password} if username and password else None
        emit = self._log
        digest: str | None = None
        try:
            events: Iterable[dict[str, Any]] = client.api.push(
                repository, tag=ref, auth_config=auth, stream=True, decode=True
            )
            for event in events:
                error = _event_error(event)
                if error is not None:
                    raise _push_failed(tag, _redact(error, password))
                status = str(event.get("status") or "")
                if status and emit is not None:
                    emit(_redact(status, password))
                aux = event.get("aux")
                if isinstance(aux, dict) and isinstance(aux.get("Digest"), str):
                    digest = aux["Digest"]
                elif digest is None and (found := _DIGEST.search(status)) and "digest" in status.lower():
                    digest = found.group(1)
        except DeployError:
            raise
        except Exception as exc:
            translated = self._translate(exc)
            if translated.code == DAEMON_UNAVAILABLE:
                raise translated from None
            raise _push_failed(tag, _redact(_explanation(exc), password)) from None
        if digest is None:
            digest = self._repo_digest(client, tag, repository)
        return digest

    # -- plumbing ----------------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        try:
            import docker  # type: ignore[import-untyped, unused-ignore]
        except ImportError:
            raise DeployError(
                "cannot connect to the container daemon: the Python package `docker` is not installed",
                DAEMON_UNAVAILABLE,
                {"package": "docker"},
                hint="Install it with `pip install 'offline[aws]'` (or `pip install 'docker>=7.1'`), then retry.",
            ) from None
        # DOCKER_HOST=ssh://user@machine goes through the system's OpenSSH client (its config, agent and
        # known_hosts), as the docker CLI does; the SDK still imports paramiko for that transport.
        over_ssh = self._env.get("DOCKER_HOST", "").startswith("ssh://")
        try:
            # version="auto" asks the daemon for its API version, so a dead socket fails here, not mid-build.
            self._client = docker.from_env(
                environment=self._env, timeout=self._timeout, version="auto", use_ssh_client=over_ssh
            )
        except ImportError:
            raise DeployError(
                "cannot connect to the container daemon over SSH: the Python package `paramiko` is not installed",
                DAEMON_UNAVAILABLE,
                {"package": "paramiko"},
                hint="Install it with `pip install 'offline[self-hosted]'` (or `pip install paramiko`), then retry.",
            ) from None
        except Exception as exc:
            raise self._unavailable(exc) from None
        return self._client

    def _unavailable(self, exc: BaseException) -> DeployError:
        return DeployError(
            f"cannot connect to the container daemon at {self.host}: {self._scrub(_explanation(exc))}",
            DAEMON_UNAVAILABLE,
            {"docker_host": self.host},
            hint=_DAEMON_HINT,
        )

    def _translate(self, exc: BaseException) -> DeployError:
        """DAEMON_UNAVAILABLE for a connection that broke; PLATFORM_ERROR for anything else the daemon said."""
        import requests  # type: ignore[import-untyped, unused-ignore]

        if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError):
            return self._unavailable(exc)
        return DeployError(
            f"the container daemon at {self.host} answered with an error: {self._scrub(_explanation(exc))}",
            PLATFORM_ERROR,
            {"docker_host": self.host},
            hint="Check the engine's own log; `docker info` (or `podman info`) shows its state.",
        )

    def _scrub(self, text: str) -> str:
        # The SDK's messages repeat DOCKER_HOST, which may carry user:password@ (a proxy URL, say).
        return _short(_USERINFO.sub(r"\1", text))

    def _inspect(self, client: Any, tag: str) -> dict[str, Any]:
        from docker.errors import ImageNotFound  # type: ignore[import-untyped, unused-ignore]

        try:
            attrs: dict[str, Any] = client.api.inspect_image(tag)
        except ImageNotFound:
            raise DeployError(
                f"the image {tag} is not in the local container engine ({self.host})",
                BUILD_FAILED,
                {"tag": tag},
                hint="Build it first: `offline deploy` builds the image before it tags or pushes it.",
            ) from None
        except Exception as exc:
            raise self._translate(exc) from None
        return attrs

    def _repo_digest(self, client: Any, tag: str, repository: str) -> str:
        # Docker records a pushed image's digest in RepoDigests; podman's compat push may not stream it.
        for entry in self._inspect(client, tag).get("RepoDigests") or []:
            name, _, digest = str(entry).partition("@")
            if name == repository and _DIGEST.fullmatch(digest):
                return digest
        raise DeployError(
            f"the push of {tag} finished but the container daemon reported no digest",
            PLATFORM_ERROR,
            {"tag": tag},
            hint="Look the image up in the registry; retry the deploy if it is missing.",
        )


def require_platform(engine: ContainerEngine, tag: str, expected: str = TARGET_PLATFORM) -> None:
    """Raise WRONG_ARCHITECTURE unless the local image ``tag`` is ``expected``."""
    actual = engine.image_platform(tag)
    if actual != expected:
        raise DeployError(
            f"image does not provide {expected} platform: {tag} is {actual}",
            WRONG_ARCHITECTURE,
            {"tag": tag, "platform": actual, "expected": expected},
            hint=(
                "Rebuild for linux/amd64: on an ARM machine enable amd64 emulation in your engine "
                "(Docker Desktop does; for podman install qemu-user-static), then retry."
            ),
        )


def split_reference(reference: str) -> tuple[str, str]:
    """``registry:5000/repo:tag`` -> (``registry:5000/repo``, ``tag``); no tag means ``latest``."""
    if "@" in reference:
        raise DeployError(
            f"{reference!r} is a digest reference; a tag (repository:tag) is needed here",
            BUILD_FAILED,
            {"reference": reference},
            hint="Pass a tagged image name such as my-app:latest.",
        )
    slash = reference.rfind("/")
    colon = reference.rfind(":")
    if colon > slash:
        return reference[:colon], reference[colon + 1 :]
    return reference, "latest"


# -- stream events and messages ------------------------------------------------------------------------------------


def _event_error(event: Mapping[str, Any]) -> str | None:
    detail = event.get("errorDetail")
    if isinstance(detail, Mapping) and detail.get("message"):
        return str(detail["message"]).strip()
    if event.get("error"):
        return str(event["error"]).strip()
    return None


def _record(text: str, tail: deque[str], emit: LogCallback | None) -> None:
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            continue
        tail.append(line)
        if emit is not None:
            emit(line)


def _build_failed(tag: str, reason: str, tail: Iterable[str]) -> DeployError:
    lines = list(tail)
    shown = "\n".join(f"  {line}" for line in lines)
    message = f"the image build of {tag} failed: {_short(reason)}"
    if shown:
        message += f"\nLast lines of the build log:\n{shown}"
    return DeployError(
        message,
        BUILD_FAILED,
        {"tag": tag, "log_tail": lines},
        hint="Fix the failing step above (the Dockerfile is in .offline/deploy/), then run the deploy again.",
    )


def _push_failed(tag: str, reason: str) -> DeployError:
    if _AUTH_FAILURE.search(reason):
        return DeployError(
            f"cloud CLI is not authenticated: the registry refused to let it push {tag} ({_short(reason)})",
            NOT_AUTHENTICATED,
            {"tag": tag},
            hint="Log in again with the cloud CLI (its credentials must be allowed to push to this repository).",
        )
    return DeployError(
        f"the push of {tag} failed: {_short(reason)}",
        PLATFORM_ERROR,
        {"tag": tag},
        hint="Check the network and the registry address, then run the deploy again.",
    )


def _explanation(exc: BaseException) -> str:
    # docker's APIError carries the daemon's own words in ``explanation``; str() adds the request URL.
    explanation = getattr(exc, "explanation", None)
    text = str(explanation if explanation else exc).strip()
    return text or type(exc).__name__


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def _short(text: str, limit: int = 400) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


if TYPE_CHECKING:

    def _is_a_container_engine(engine: DockerEngine) -> ContainerEngine:
        return engine  # mypy checks DockerEngine against the protocol here
