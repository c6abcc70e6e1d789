"""Where a signed-in session's tokens live between calls and between runs.

A credential store keeps at most one `Credentials` (one session of one server). Stores are synchronous: the
file store does a few small reads and writes, and the browser's equivalent (localStorage, under Pyodide) is
synchronous too. Passwords are never given to a store: only tokens, the user's id and email, and expiries.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from offline.core.errors import STORAGE_ERROR

from .errors import AuthError

log = logging.getLogger("offline.auth")

FORMAT_VERSION = 1


@dataclass(frozen=True, repr=False)
class Credentials:
    """One session: the token pair, who it belongs to and when its tokens expire (local epoch seconds).

    Expiry times are measured on this machine's clock from the server's ``expiresIn`` at the moment the pair
    arrived, so a skewed local clock does not make a fresh token look expired (or the reverse).
    """

    server_url: str
    user: Mapping[str, Any]
    access_token: str
    refresh_token: str
    access_issued_at: float
    access_expires_at: float | None = None
    refresh_expires_at: float | None = None
    #: The server's known-device token (it spares this device the account-wide sign-in limit next time).
    device_token: str | None = None

    def __repr__(self) -> str:
        # Tokens are bearer secrets: a repr may end up in a log or a traceback.
        return (
            f"Credentials(server_url={self.server_url!r}, user={dict(self.user)!r}, "
            f"access_expires_at={self.access_expires_at!r}, refresh_expires_at={self.refresh_expires_at!r})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "serverUrl": self.server_url,
            "user": dict(self.user),
            "accessToken": self.access_token,
            "refreshToken": self.refresh_token,
            "accessIssuedAt": self.access_issued_at,
            "accessExpiresAt": self.access_expires_at,
            "refreshExpiresAt": self.refresh_expires_at,
            "deviceToken": self.device_token,
        }

    @classmethod
    def from_json(cls, data: Any) -> Credentials:
        """Parse `to_json`'s form; ValueError (naming the key, never a value) when it is not that form."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"unknown format version (expected {FORMAT_VERSION})")
        for key in ("serverUrl", "accessToken", "refreshToken"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ValueError(f"{key} is missing or not a string")
        user = data.get("user")
        if not isinstance(user, dict) or not isinstance(user.get("id"), str):
            raise ValueError("user is missing or has no string id")
        times: dict[str, float | None] = {}
        for key in ("accessIssuedAt", "accessExpiresAt", "refreshExpiresAt"):
            value = data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"{key} is not a number")
            times[key] = None if value is None else float(value)
        return cls(
            server_url=data["serverUrl"],
            user={"id": user["id"], "email": user.get("email")},
            access_token=data["accessToken"],
            refresh_token=data["refreshToken"],
            access_issued_at=times["accessIssuedAt"] or 0.0,
            access_expires_at=times["accessExpiresAt"],
            refresh_expires_at=times["refreshExpiresAt"],
            device_token=data["deviceToken"] if isinstance(data.get("deviceToken"), str) else None,
        )


@runtime_checkable
class CredentialStore(Protocol):
    """Keeps at most one `Credentials`. Implementations raise `AuthError` code STORAGE_ERROR on I/O failure."""

    def load(self) -> Credentials | None: ...

    def save(self, credentials: Credentials) -> None: ...

    def clear(self) -> None: ...


class MemoryCredentialStore:
    """Tokens in this process only: nothing touches the disk; a restart means signing in again."""

    def __init__(self) -> None:
        self._credentials: Credentials | None = None

    def load(self) -> Credentials | None:
        return self._credentials

    def save(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def clear(self) -> None:
        self._credentials = None

    def __repr__(self) -> str:
        return f"MemoryCredentialStore(signed_in={self._credentials is not None})"


def user_config_dir() -> Path:
    """The per-user configuration directory of `offline` (``OFFLINE_CONFIG_DIR`` overrides it)."""
    override = os.environ.get("OFFLINE_CONFIG_DIR")
    if override:
        return Path(override)
    if sys.platform == "win32":
        base = os.environ.get("APPDATA")
        return (Path(base) if base else Path.home() / "AppData" / "Roaming") / "offline"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "offline"
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config") / "offline"


def default_credentials_path(server_url: str) -> Path:
    """``<user config dir>/auth/credentials-<hash of server_url>.json``: one file per server."""
    digest = hashlib.sha256(server_url.encode("utf-8")).hexdigest()[:16]
    return user_config_dir() / "auth" / f"credentials-{digest}.json"


class FileCredentialStore:
    """Credentials in a JSON file that only the user can read (mode 0600, directory 0700 where it creates it).

    Writes are atomic (a temporary file in the same directory, fsynced, then renamed over the old one), so a
    crash leaves either the old or the new credentials, never a torn file. A file that cannot be parsed is
    treated as "signed out" (with a warning naming the file) and replaced by the next sign-in. On Windows the
    file modes are not enforced by the OS; the file lives in the user's own profile directory.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._owns_dir = path is None
        self.path = Path(path) if path is not None else user_config_dir() / "auth" / "credentials.json"

    @classmethod
    def for_server(cls, server_url: str) -> FileCredentialStore:
        """The default store of ``server_url`` (a file of its own under the user config directory)."""
        store = cls(default_credentials_path(server_url))
        store._owns_dir = True
        return store

    def __repr__(self) -> str:
        return f"FileCredentialStore({str(self.path)!r})"

    def _error(self, action: str, exc: OSError) -> AuthError:
        return AuthError(
            f"could not {action} the credential file {self.path}: {exc.strerror or exc}; check that the "
            "directory exists and belongs to you, or pass another path to FileCredentialStore",
            STORAGE_ERROR,
            {"path": str(self.path), "errno": exc.errno},
        )

    def load(self) -> Credentials | None:
        try:
            with open(self.path, "rb") as handle:
                if os.name == "posix":
                    self._tighten(handle.fileno())
                raw = handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error("read", exc) from None
        try:
            return Credentials.from_json(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            log.warning(
                "credential file %s is unreadable (%s); treating it as signed out: sign in again",
                self.path,
                reason,
            )
            return None

    def _tighten(self, fd: int) -> None:
        """Put back mode 0600 on a file someone loosened: it holds a long-lived refresh token."""
        mode = os.fstat(fd).st_mode
        if stat.S_IMODE(mode) & 0o077:
            log.warning("credential file %s was readable by others; restoring mode 0600", self.path)
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o600)

    def save(self, credentials: Credentials) -> None:
        data = json.dumps(credentials.to_json(), separators=(",", ":")).encode("utf-8")
        try:
            self._prepare_dir()
            # mkstemp creates the file with mode 0600 before any byte is written: no window where the
            # token sits in a file others can read.
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".credentials-", suffix=".tmp")
        except OSError as exc:
            raise self._error("create", exc) from None
        try:
            with os.fdopen(fd, "wb") as handle:
                if os.name == "posix":
                    os.fchmod(handle.fileno(), 0o600)
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise self._error("write", exc) from None
        self._sync_dir()

    def clear(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise self._error("delete", exc) from None
        self._sync_dir()

    def _prepare_dir(self) -> None:
        parent = self.path.parent
        # Directories created here get 0700; an existing directory the caller chose is left as it is (it may
        # be shared), except the default one, which belongs to this store.
        missing: list[Path] = []
        probe = parent
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):  # another process created it meanwhile
                directory.mkdir(mode=0o700)
        if self._owns_dir and os.name == "posix" and stat.S_IMODE(parent.stat().st_mode) != 0o700:
            os.chmod(parent, 0o700)

    def _sync_dir(self) -> None:
        # Make the rename durable too (POSIX only: directories cannot be opened on Windows).
        if os.name != "posix":
            return
        try:
            fd = os.open(self.path.parent, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
