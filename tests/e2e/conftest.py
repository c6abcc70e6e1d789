"""Fixtures of the end-to-end container tests: a real engine, a local base image, a local registry.

Engine. ``OFFLINE_TEST_DOCKER_HOST`` names an engine to use as is (a Docker daemon, say). Otherwise the session
starts podman's Docker-compatible service on a private socket, rootful (so root is needed), with a generated
containers.conf. What this machine kind needed, found by trying (Debian bookworm, podman 4.3):

* runtime ``runc``: crun 1.8 refuses this host's cgroup v1/v2 hybrid ("cgroups in hybrid mode not supported");
  runc runs both ``RUN`` steps and containers. Build isolation stays the default (OCI through runc): the
  service ignores BUILDAH_ISOLATION and the compat build API ignores its ``isolation`` parameter.
* ``default_ulimits`` no higher than this process's own limits: podman asks for nofile=1048576 for root, and
  without CAP_SYS_RESOURCE (a sandboxed root) runc cannot raise the limit ("error setting rlimit type 7").
* networking: podman's default CNI bridge with port publishing (``-p 127.0.0.1:<port>:<port>``) works as
  is; nothing else (slirp4netns, host networking) is needed.
* registries.conf: one insecure (plain HTTP) registry on loopback for the push test; base images are never
  pulled (no registry access), so no search registries are configured.

Base image. No registry is reachable, so ``base_image`` makes Debian bookworm with CPython 3.11 (the version
of the project's venv and therefore of the zipapp) by debootstrap, imports its root filesystem as
``localhost/offline-test-base:<version>`` and keeps the tarball in ``~/.cache/offline-tests/`` (or
``$OFFLINE_TEST_CACHE``). Later sessions find the image in the engine (instant) or re-import the tarball
(seconds); only a fresh machine runs debootstrap (under a minute with a nearby mirror). Bump
``BASE_IMAGE_VERSION`` whenever ``BASE_PACKAGES`` change.

Anything missing (podman, debootstrap, root, the network for debootstrap) skips with the reason, except
under ``CI``, where it fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.support.servers import free_port

BASE_IMAGE_VERSION = "bookworm-py311-2"
BASE_IMAGE_REPOSITORY = "localhost/offline-test-base"
#: Only python3, no `python` command (no python-is-python3): the generated Dockerfile must work on
#: Debian-style images that lack it. ca-certificates as in the slim images.
BASE_PACKAGES = ("python3", "ca-certificates")
DEBIAN_SUITE = "bookworm"
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"

#: podman 4.3 caps its own nproc at 32768 (checked: 50000 became 32768, 20000 stayed); a container may not
#: ask for more than its engine has.
PODMAN_NPROC_CEILING = 32768

REGISTRY_USER = "offline-e2e"


def unavailable(reason: str) -> NoReturn:
    """Skip with the reason, or fail under CI (where every tool must be installed)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must provide it (scripts/setup.sh --test installs it)", pytrace=False)
    pytest.skip(f"{reason}; run scripts/setup.sh --test as root to install it")


def cache_dir() -> Path:
    base = os.environ.get("OFFLINE_TEST_CACHE")
    if base:
        folder = Path(base)
    else:
        folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "offline-tests"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialises sessions that would build or import the same base image at once."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# -- the engine ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    """A running Docker-compatible engine: ``env`` for DockerEngine.from_env, ``client`` for the test's own calls."""

    docker_host: str
    client: Any  # docker.DockerClient
    registry_port: int  # the loopback port the engine treats as a plain-HTTP registry
    kind: str  # "podman" (started here) or "external"

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.docker_host}


def _containers_conf(runtime: str | None) -> str:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    nproc = PODMAN_NPROC_CEILING if nproc == resource.RLIM_INFINITY else min(nproc, PODMAN_NPROC_CEILING)
    lines = [
        "[containers]",
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]',
    ]
    if runtime:
        lines += ["", "[engine]", f'runtime = "{runtime}"']
    return "\n".join(lines) + "\n"


def _registries_conf(registry_port: int) -> str:
    return f'[[registry]]\nlocation = "127.0.0.1:{registry_port}"\ninsecure = true\n'


def _wait_for_socket(
    process: subprocess.Popen[bytes], socket_path: Path, log_path: Path, timeout: float = 30.0
) -> None:
    import docker  # type: ignore[import-untyped, unused-ignore]

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"podman service exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        if socket_path.exists():
            try:
                client = docker.DockerClient(base_url=f"unix://{socket_path}", version="auto", timeout=5)
                client.ping()
                client.close()
                return
            except Exception as exc:
                last = exc
        time.sleep(0.1)
    pytest.fail(
        f"podman service did not answer on {socket_path} in {timeout} s ({last}):\n{log_path.read_text()}"
    )


@contextlib.contextmanager
def _podman_service(registry_port: int) -> Iterator[str]:
    podman = shutil.which("podman")
    if podman is None:
        unavailable("podman is not installed (the e2e container tests build and run images with it)")
    if os.geteuid() != 0:
        unavailable("the e2e container tests start a rootful podman service and need root")
    workdir = Path(tempfile.mkdtemp(prefix="offline-podman-"))
    socket_path = workdir / "podman.sock"
    log_path = workdir / "service.log"
    (workdir / "containers.conf").write_text(_containers_conf("runc" if shutil.which("runc") else None))
    (workdir / "registries.conf").write_text(_registries_conf(registry_port))
    env = {
        **os.environ,
        "CONTAINERS_CONF": str(workdir / "containers.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(workdir / "registries.conf"),
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [podman, "system", "service", "--time=0", f"unix://{socket_path}"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for_socket(process, socket_path, log_path)
        yield f"unix://{socket_path}"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def container_engine() -> Iterator[Engine]:
    """The engine every e2e container test uses (see the module docstring)."""
    try:
        import docker
    except ImportError:
        unavailable("the Python package docker is not installed (pip install 'docker>=7.1')")
    registry_port = free_port()
    external = os.environ.get("OFFLINE_TEST_DOCKER_HOST")
    with contextlib.ExitStack() as stack:
        if external:
            docker_host, kind = external, "external"
        else:
            docker_host, kind = stack.enter_context(_podman_service(registry_port)), "podman"
        try:
            client = docker.from_env(environment={"DOCKER_HOST": docker_host}, version="auto", timeout=900)
        except Exception as exc:
            unavailable(f"no container engine answers at {docker_host} ({exc})")
        stack.callback(client.close)
        yield Engine(docker_host, client, registry_port, kind)


# -- the base image ------------------------------------------------------------------------------------------------


def _debootstrap(tarball: Path) -> None:
    """Debian + CPython root filesystem as a tarball (written atomically: a killed run leaves no half file)."""
    debootstrap = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")
    if debootstrap is None:
        unavailable("debootstrap is not installed (the e2e tests build their Debian base image with it)")
    if os.geteuid() != 0:
        unavailable("debootstrap needs root to build the e2e base image")
    mirror = os.environ.get("OFFLINE_TEST_DEBIAN_MIRROR") or DEFAULT_DEBIAN_MIRROR
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=tarball.parent))
    rootfs = work / "rootfs"
    log = tarball.parent / f"debootstrap-{BASE_IMAGE_VERSION}.log"
    try:
        with open(log, "wb") as out:
            done = subprocess.run(
                [
                    debootstrap,
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    DEBIAN_SUITE,
                    str(rootfs),
                    mirror,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=1200,
                check=False,
            )
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-2000:]
            unavailable(
                f"debootstrap {DEBIAN_SUITE} from {mirror} failed ({done.returncode}); log {log}:\n{tail}"
            )
        # Package caches would only make the image bigger.
        for leftover in [*(rootfs / "var/cache/apt/archives").glob("*.deb"), rootfs / "var/lib/apt/lists"]:
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
        partial = work / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        os.replace(partial, tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _import_image(client: Any, tarball: Path, repository: str, tag: str) -> None:
    # podman's compat import ignores repo/tag (it names the image :latest), so tag the returned id ourselves.
    answer = client.api.import_image(src=str(tarball), changes=['CMD ["python3"]'])
    found = re.search(r"sha256:[0-9a-f]{64}", str(answer))
    if found is None:
        pytest.fail(f"importing {tarball} gave no image id: {str(answer)[:500]}")
    client.api.tag(found.group(0), repository, tag)


@pytest.fixture(scope="session")
def base_image(container_engine: Engine) -> str:
    """``localhost/offline-test-base:<version>``: Debian bookworm with CPython 3.11, in the engine."""
    from docker.errors import ImageNotFound  # type: ignore[import-untyped, unused-ignore]

    reference = f"{BASE_IMAGE_REPOSITORY}:{BASE_IMAGE_VERSION}"
    client = container_engine.client
    folder = cache_dir()
    with file_lock(folder / f"base-{BASE_IMAGE_VERSION}.lock"):
        try:
            client.api.inspect_image(reference)
            return reference
        except ImageNotFound:
            pass
        tarball = folder / f"debian-{BASE_IMAGE_VERSION}.tar"
        if not tarball.exists():
            _debootstrap(tarball)
        _import_image(client, tarball, BASE_IMAGE_REPOSITORY, BASE_IMAGE_VERSION)
    return reference


# -- a local registry (for push) -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registry:
    address: str  # 127.0.0.1:<port>
    username: str
    password: str

    def manifest_digest(self, repository: str, tag: str) -> str | None:
        """The registry's own digest of ``repository:tag`` (Docker-Content-Digest), None when absent."""
        import base64

        request = urllib.request.Request(
            f"http://{self.address}/v2/{repository}/manifests/{tag}",
            method="HEAD",
            headers={
                "Accept": ", ".join(
                    [
                        "application/vnd.oci.image.manifest.v1+json",
                        "application/vnd.docker.distribution.manifest.v2+json",
                    ]
                ),
                "Authorization": "Basic "
                + base64.b64encode(f"{self.username}:{self.password}".encode()).decode(),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                digest = response.headers.get("Docker-Content-Digest")
                return str(digest) if digest else None
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise


def _bcrypt(password: str) -> str:
    """The registry's htpasswd wants bcrypt: libxcrypt's through the stdlib ``crypt`` (gone in 3.13), else
    the ``bcrypt`` package."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt  # deprecated since 3.11, still the only stdlib door to bcrypt

        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
        if hashed and hashed.startswith("$2"):
            return hashed
    except ImportError:
        pass
    try:
        import bcrypt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        unavailable("no bcrypt for the registry's htpasswd (Python < 3.13 with glibc, or pip install bcrypt)")
    return str(bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode())


@pytest.fixture
def local_registry(container_engine: Engine, tmp_path: Path) -> Iterator[Registry]:
    """Debian's docker-registry on the engine's insecure loopback port, with htpasswd (bcrypt) auth."""
    import secrets

    binary = shutil.which("docker-registry")
    if binary is None:
        unavailable("docker-registry is not installed (the push test runs a local registry)")
    password = secrets.token_urlsafe(16)
    hashed = _bcrypt(password)
    (tmp_path / "htpasswd").write_text(f"{REGISTRY_USER}:{hashed}\n")
    address = f"127.0.0.1:{container_engine.registry_port}"
    (tmp_path / "registry.yml").write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
        f"http:\n  addr: {address}\n  secret: {secrets.token_hex(16)}\n"
        f"auth:\n  htpasswd:\n    realm: offline-e2e\n    path: {tmp_path / 'htpasswd'}\n"
    )
    log_path = tmp_path / "registry.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [binary, "serve", str(tmp_path / "registry.yml")], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://{address}/v2/", timeout=1)
                break
            except urllib.error.HTTPError:
                break  # 401: up and asking for credentials
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"docker-registry did not start on {address}:\n{log_path.read_text()}")
                time.sleep(0.1)
        yield Registry(address, REGISTRY_USER, password)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
