"""Signed auto-update (SPEC 4.7 rule 4): check a manifest at launch, download, verify, install, restart.

The manifest is JSON ``{"version", "url", "sha256", "signature", "app"?}``. ``signature`` is Ed25519 over the
RFC 8785 canonical JSON of every other field, so neither the version, the download URL nor the hash can be
changed without the private key; the payload is then checked against ``sha256``. The public key is part of the
build (``BuildConfig.update_public_key``); the private key never leaves CI (see ``sign_release``).

The payload is the app's zipapp: installing it replaces the running ``.pyz`` with ``os.replace`` (atomic: the
old or the new file, never half of one), then the process re-executes itself. Any failure leaves the app
running its current version: no network is skipped quietly (debug log), a refused update is logged as a
warning.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urljoin

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from packaging.version import InvalidVersion, Version

from offline import OfflineError

from .config import BuildConfig

log = logging.getLogger("offline_desktop.update")

UPDATE_REFUSED: Final = "UPDATE_REFUSED"
#: Set in the re-executed process: it runs the update just installed and does not check again at once.
JUST_UPDATED_ENV: Final = "OFFLINE_DESKTOP_JUST_UPDATED"
MAX_MANIFEST_BYTES: Final = 64 * 1024
MAX_PAYLOAD_BYTES: Final = 1024 * 1024 * 1024
_CHUNK: Final = 1024 * 1024

Status = Literal["disabled", "offline", "unavailable", "current", "refused", "installed", "just-updated"]


class UpdateRefused(OfflineError):
    """A manifest or payload failed verification; nothing was installed."""

    def __init__(self, message: str, context: dict[str, Any] | None = None) -> None:
        super().__init__(message, UPDATE_REFUSED, context)


@dataclass(frozen=True)
class Manifest:
    version: str
    url: str
    sha256: str
    app: str | None = None


@dataclass(frozen=True)
class UpdateResult:
    status: Status
    version: str | None = None  # the version installed, or offered
    reason: str | None = None


def canonical_manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The bytes the signature covers: RFC 8785 JSON of every field except ``signature``."""
    return bytes(rfc8785.dumps({k: v for k, v in manifest.items() if k != "signature"}))


def sign_manifest(manifest: Mapping[str, Any], private_key: Ed25519PrivateKey) -> dict[str, Any]:
    """``manifest`` with its ``signature`` (base64)."""
    unsigned = {k: v for k, v in manifest.items() if k != "signature"}
    signature = private_key.sign(canonical_manifest_bytes(unsigned))
    return {**unsigned, "signature": base64.b64encode(signature).decode("ascii")}


def load_public_key(pem: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise UpdateRefused(f"the app's update public key is not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise UpdateRefused("the app's update public key is not an Ed25519 key")
    return key


def public_key_pem(private_key: Ed25519PrivateKey) -> str:
    return (
        private_key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode("ascii")
    )


def verify_manifest(raw: bytes, public_key: Ed25519PublicKey, *, app_name: str | None = None) -> Manifest:
    """Parse and verify a manifest; raises ``UpdateRefused`` naming what is wrong."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise UpdateRefused(f"the update manifest is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UpdateRefused("the update manifest is not a JSON object")
    signature = data.get("signature")
    if not isinstance(signature, str):
        raise UpdateRefused("the update manifest is not signed", {"field": "signature"})
    try:
        public_key.verify(base64.b64decode(signature, validate=True), canonical_manifest_bytes(data))
    except (InvalidSignature, binascii.Error, ValueError, TypeError) as exc:
        raise UpdateRefused(
            "the update manifest's signature does not match the app's public key", {"field": "signature"}
        ) from exc
    for name in ("version", "url", "sha256"):
        if not isinstance(data.get(name), str) or not data[name]:
            raise UpdateRefused(f"the signed manifest lacks {name}", {"field": name})
    digest = data["sha256"].lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise UpdateRefused("the signed manifest's sha256 is not a SHA-256 hex digest", {"field": "sha256"})
    app = data.get("app")
    if app_name is not None and app is not None and app != app_name:
        raise UpdateRefused(f"the manifest is for app {app!r}, not {app_name!r}", {"field": "app"})
    return Manifest(version=data["version"], url=data["url"], sha256=digest, app=app)


def _is_newer(offered: str, current: str) -> bool:
    try:
        return Version(offered) > Version(current)
    except InvalidVersion as exc:
        raise UpdateRefused(f"cannot compare versions {offered!r} and {current!r}: {exc}") from exc


def _fetch_manifest(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        raw: bytes = response.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise UpdateRefused(f"the update manifest is larger than {MAX_MANIFEST_BYTES} bytes")
    return raw


def _download_verified(url: str, sha256: str, folder: Path, timeout: float) -> Path:
    """Download into a temporary file in ``folder`` (same file system as the target); check its hash."""
    fd, name = tempfile.mkstemp(prefix=".update-", suffix=".part", dir=folder)
    tmp = Path(name)
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            while chunk := response.read(_CHUNK):
                size += len(chunk)
                if size > MAX_PAYLOAD_BYTES:
                    raise UpdateRefused(f"the update payload is larger than {MAX_PAYLOAD_BYTES} bytes")
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != sha256:
            raise UpdateRefused(
                "the downloaded update does not match the signed sha256", {"url": url, "field": "sha256"}
            )
        return tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_and_install(build: BuildConfig, target: Path, *, timeout: float = 10.0) -> UpdateResult:
    """Check the manifest and, for a newer signed version, replace ``target`` (the app's zipapp) with it.

    Never raises for network trouble or a bad update; the result says what happened.
    """
    if not build.update_url or not build.update_public_key:
        return UpdateResult("disabled")
    try:
        key = load_public_key(build.update_public_key)
        try:
            raw = _fetch_manifest(build.update_url, timeout)
        except urllib.error.HTTPError as exc:
            log.info("no update manifest at %s (HTTP %s)", build.update_url, exc.code)
            return UpdateResult("unavailable", reason=f"HTTP {exc.code}")
        except (OSError, TimeoutError) as exc:
            log.debug("update check skipped, network unavailable: %s", exc)
            return UpdateResult("offline", reason=str(exc))
        manifest = verify_manifest(raw, key, app_name=build.app_name)
        if not _is_newer(manifest.version, build.version):
            return UpdateResult("current", manifest.version)
        if not target.is_file():
            raise UpdateRefused(f"cannot install over {target}: the app is not running from a zipapp file")
        payload_url = urljoin(build.update_url, manifest.url)
        try:
            fresh = _download_verified(payload_url, manifest.sha256, target.parent, timeout)
        except urllib.error.HTTPError as exc:
            log.info("update %s not downloadable (HTTP %s)", manifest.version, exc.code)
            return UpdateResult("unavailable", manifest.version, f"HTTP {exc.code}")
        except (OSError, TimeoutError) as exc:
            log.debug("update download skipped, network unavailable: %s", exc)
            return UpdateResult("offline", manifest.version, str(exc))
        fresh.chmod(target.stat().st_mode & 0o7777)
        os.replace(fresh, target)
        log.info("installed update %s over %s", manifest.version, build.version)
        return UpdateResult("installed", manifest.version)
    except UpdateRefused as exc:
        log.warning("update refused: %s", exc.message)
        return UpdateResult("refused", reason=exc.message)


def restart(target: Path, argv: Sequence[str], version: str) -> None:
    """Replace this process with the freshly installed app (same interpreter, same arguments)."""
    os.environ[JUST_UPDATED_ENV] = version
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, str(target), *argv])


def update_at_launch(
    build: BuildConfig,
    target: Path | None = None,
    *,
    argv: Sequence[str] | None = None,
    timeout: float = 10.0,
) -> UpdateResult:
    """The launch-time check: install a newer signed version and restart into it, else keep running.

    ``target`` defaults to the running zipapp (``sys.argv[0]``). Returns only when no restart happens.
    """
    just = os.environ.pop(JUST_UPDATED_ENV, None)
    if just is not None:
        # This process is the restart after an install: do not check again straight away (a manifest whose
        # payload reports an older version would otherwise restart the app in a loop).
        return UpdateResult("just-updated", just)
    where = (target or Path(sys.argv[0])).resolve()
    result = check_and_install(build, where, timeout=timeout)
    if result.status == "installed" and result.version is not None:
        restart(where, list(sys.argv[1:] if argv is None else argv), result.version)
    return result
