"""An engine that runs containers, not only builds them: the machine a self-hosted stack lives on.

The local engine (``DOCKER_HOST`` or the default socket) or a remote one reached through the engine's own SSH
support (``DOCKER_HOST=ssh://user@machine``: the docker SDK runs ``ssh user@machine docker system dial-stdio``,
as the docker CLI does). Everything goes through the Docker Engine API, which podman's service speaks too, so
neither machine needs a compose binary. The SDK is imported lazily (through DockerEngine).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .base import DAEMON_UNAVAILABLE, PLATFORM_ERROR, DeployError
from .container_engine import DockerEngine, _explanation

__all__ = ["ContainerHost"]

_SSH_HINT = (
    "Check that `ssh {target}` logs in without a password prompt (a key in ssh-agent or ~/.ssh/config) and "
    "that the machine runs Docker (`ssh {target} docker info`); then retry."
)


class ContainerHost(DockerEngine):
    """DockerEngine plus what running a stack needs: networks, volumes, containers, logs, image transfer."""

    @property
    def over_ssh(self) -> bool:
        return self._env.get("DOCKER_HOST", "").startswith("ssh://")

    def _unavailable(self, exc: BaseException) -> DeployError:
        error = super()._unavailable(exc)
        if self.over_ssh:
            error.hint = _SSH_HINT.format(target=self.host.removeprefix("ssh://"))
        return error

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``client.api.<method>(...)``; engine errors become DeployErrors saying ``what`` failed."""
        client = self._connect()
        try:
            return getattr(client.api, method)(*args, **kwargs)
        except Exception as exc:
            translated = self._translate(exc)
            if translated.code == DAEMON_UNAVAILABLE:
                raise translated from None
            raise DeployError(
                f"{what} failed on the container engine at {self.host}: {self._scrub(_explanation(exc))}",
                PLATFORM_ERROR,
                {"docker_host": self.host},
                hint="Check the engine's own log (`docker info`, `docker ps -a` on that machine), then retry.",
            ) from None

    def _absent(self, exc: Exception) -> bool:
        from docker.errors import NotFound  # type: ignore[import-untyped, unused-ignore]

        return isinstance(exc, NotFound)

    def _inspect_or_none(self, method: str, name: str) -> dict[str, Any] | None:
        client = self._connect()
        try:
            found: dict[str, Any] = getattr(client.api, method)(name)
        except Exception as exc:
            if self._absent(exc):
                return None
            raise self._translate(exc) from None
        return found

    # -- images ----------------------------------------------------------------------------------------------

    def image(self, reference: str) -> dict[str, Any] | None:
        return self._inspect_or_none("inspect_image", reference)

    def pull(self, reference: str) -> None:
        """Pull with the credentials of this client's configuration (``docker login``), sent to the engine."""
        repository, tag = reference.rsplit(":", 1)
        for event in self._call(
            f"pulling {reference}", "pull", repository, tag=tag, stream=True, decode=True
        ):
            error = event.get("error") or (event.get("errorDetail") or {}).get("message")
            if error:
                raise DeployError(
                    f"the engine at {self.host} could not pull {reference}: {self._scrub(str(error))}",
                    PLATFORM_ERROR,
                    {"image": reference},
                    hint="Log that machine's engine in to the registry, or deploy without --registry "
                    "(the image is then copied over SSH).",
                )

    def export_image(self, reference: str) -> Iterator[bytes]:
        """The image as a tar stream (``docker save``)."""
        stream: Iterator[bytes] = self._call(f"saving {reference}", "get_image", reference)
        return stream

    def import_image(self, chunks: Iterable[bytes]) -> None:
        """Load a tar stream (``docker load``), sent as it is read."""
        answer = self._call("loading the image", "load_image", chunks)
        for event in answer or []:
            if isinstance(event, Mapping) and (event.get("error") or event.get("errorDetail")):
                raise DeployError(
                    f"the engine at {self.host} could not load the image: {event.get('error') or event}",
                    PLATFORM_ERROR,
                    hint="Check free disk space on that machine, then retry.",
                )

    def remove_image(self, reference: str) -> None:
        client = self._connect()
        try:
            client.api.remove_image(reference)
        except Exception as exc:
            if not self._absent(exc):
                raise self._translate(exc) from None

    # -- networks and volumes --------------------------------------------------------------------------------

    def ensure_network(self, name: str, labels: Mapping[str, str]) -> None:
        if self._inspect_or_none("inspect_network", name) is None:
            self._call(f"creating the network {name}", "create_network", name, labels=dict(labels))

    def ensure_volume(self, name: str, labels: Mapping[str, str]) -> bool:
        """True when the volume was created now (False: it exists, with the data of earlier deploys)."""
        if self._inspect_or_none("inspect_volume", name) is not None:
            return False
        self._call(f"creating the volume {name}", "create_volume", name, labels=dict(labels))
        return True

    # -- containers ------------------------------------------------------------------------------------------

    def container(self, name: str) -> dict[str, Any] | None:
        return self._inspect_or_none("inspect_container", name)

    def run(self, request: Mapping[str, Any]) -> str:
        """Create and start a container from ``compose_stack.container_request``'s description."""
        client = self._connect()
        api = client.api
        args = dict(request)
        host_config = api.create_host_config(**args.pop("host_config"))
        endpoints = {
            network: api.create_endpoint_config(**settings)
            for network, settings in args.pop("networking_config").items()
        }
        created = self._call(
            f"creating the container {args['name']}",
            "create_container",
            host_config=host_config,
            networking_config=api.create_networking_config(endpoints),
            **args,
        )
        container_id = str(created["Id"])
        self._call(f"starting the container {args['name']}", "start", container_id)
        return container_id

    def start(self, name: str) -> None:
        self._call(f"starting {name}", "start", name)

    def stop(self, name: str, timeout: int = 20) -> None:
        self._call(f"stopping {name}", "stop", name, timeout=timeout)

    def remove(self, name: str) -> None:
        client = self._connect()
        try:
            client.api.remove_container(name, force=True)
        except Exception as exc:
            if not self._absent(exc):
                raise self._translate(exc) from None

    def rename(self, name: str, new_name: str) -> None:
        self._call(f"renaming {name}", "rename", name, new_name)

    def logs(self, name: str, lines: int) -> list[str]:
        raw = self._call(f"reading the logs of {name}", "logs", name, tail=lines, timestamps=True)
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        return [line for line in text.splitlines() if line.strip()]

    def exec(self, name: str, command: list[str]) -> int:
        """Run ``command`` in the running container ``name``; its exit code (-1 when it could not run)."""
        client = self._connect()
        try:
            created = client.api.exec_create(name, command)  # podman wants a stream attached
            # Over SSH the engine ends the exec's raw stream when the command ends, and the ssh process behind it
            # exits; the SDK then closes that stream by writing to the gone process's stdin (BrokenPipeError). The
            # output was read by then; the exit code below says how the command ended (or -1 if it never ran).
            with contextlib.suppress(BrokenPipeError):
                client.api.exec_start(created["Id"])
            # The exec's connection is spent and, over SSH, the SDK cannot tell: the next request starts afresh.
            self.close()
            client = self._connect()
            code = client.api.exec_inspect(created["Id"]).get("ExitCode")
        except Exception as exc:
            translated = self._translate(exc)
            if translated.code == DAEMON_UNAVAILABLE:
                raise translated from None
            return -1
        return int(code) if code is not None else -1
