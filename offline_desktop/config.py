"""Where a desktop app's sync URL comes from: the build, the user's settings, or nowhere yet (SPEC 4.7).

Order of precedence at launch:
1. ``sync_url`` baked into the build (``BUILD_SYNC_URL`` when the app was built): no setup screen.
2. The user's settings file (written by the setup screen or the settings control): connect automatically.
3. The user chose "skip, local-only": no setup screen, no sync, until they connect from the settings control.
4. Otherwise: first launch, show the setup screen.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal

from offline import OfflineError

#: File name of the build configuration, inside the app's package (works inside a zipapp too).
BUILD_CONFIG_NAME: Final = "offline_build.json"
#: File name of the user's settings, inside the app's config directory.
SETTINGS_NAME: Final = "settings.json"
#: Overrides the config directory (tests, portable installs).
CONFIG_DIR_ENV: Final = "OFFLINE_DESKTOP_CONFIG_DIR"

CONFIG_ERROR: Final = "DESKTOP_CONFIG"

LaunchMode = Literal["build", "saved", "local-only", "setup"]


@dataclass(frozen=True)
class BuildConfig:
    """What the build baked into the app. Public values only: no secret ever goes in here."""

    app_name: str
    version: str
    sync_url: str | None = None
    update_url: str | None = None  # the manifest of the latest release
    update_public_key: str | None = None  # Ed25519 public key, PEM (SubjectPublicKeyInfo)

    def to_json(self) -> dict[str, Any]:
        return {
            "appName": self.app_name,
            "version": self.version,
            "syncUrl": self.sync_url,
            "updateUrl": self.update_url,
            "updatePublicKey": self.update_public_key,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildConfig:
        name, version = data.get("appName"), data.get("version")
        if not isinstance(name, str) or not name or not isinstance(version, str) or not version:
            raise OfflineError(
                f"{BUILD_CONFIG_NAME} needs appName and version strings; rebuild the app",
                CONFIG_ERROR,
                {"field": "appName" if not isinstance(name, str) or not name else "version"},
            )
        return cls(
            app_name=name,
            version=version,
            sync_url=data.get("syncUrl") or None,
            update_url=data.get("updateUrl") or None,
            update_public_key=data.get("updatePublicKey") or None,
        )


def build_config_from_env(
    app_name: str,
    version: str,
    *,
    update_url: str | None = None,
    update_public_key: str | None = None,
    environ: dict[str, str] | None = None,
) -> BuildConfig:
    """The build configuration for this build, taking the sync URL from ``BUILD_SYNC_URL`` when set."""
    env = os.environ if environ is None else environ
    raw = (env.get("BUILD_SYNC_URL") or "").strip()
    sync_url = None
    if raw:
        from .connection import normalize_sync_url

        sync_url = normalize_sync_url(raw)  # a build with a malformed URL fails now, not on users' machines
    return BuildConfig(
        app_name=app_name,
        version=version,
        sync_url=sync_url,
        update_url=update_url,
        update_public_key=update_public_key,
    )


def write_build_config(package_dir: Path, config: BuildConfig) -> Path:
    """Write ``offline_build.json`` into the app's package directory (before it is zipped)."""
    target = package_dir / BUILD_CONFIG_NAME
    target.write_text(json.dumps(config.to_json(), indent=2) + "\n", encoding="utf-8")
    return target


def read_build_config(package: str) -> BuildConfig:
    """Read the build configuration of the importable package ``package`` (a directory or a zipapp)."""
    try:
        text = resources.files(package).joinpath(BUILD_CONFIG_NAME).read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        raise OfflineError(
            f"{package} has no {BUILD_CONFIG_NAME}; build the app with offline_desktop.write_build_config",
            CONFIG_ERROR,
            {"package": package},
        ) from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise OfflineError(f"{BUILD_CONFIG_NAME} of {package} is not JSON: {exc}", CONFIG_ERROR) from exc
    if not isinstance(data, dict):
        raise OfflineError(f"{BUILD_CONFIG_NAME} of {package} is not a JSON object", CONFIG_ERROR)
    return BuildConfig.from_json(data)


def config_dir(app_name: str, environ: dict[str, str] | None = None) -> Path:
    """The per-user directory holding this app's settings and database (the OS's usual place)."""
    env = os.environ if environ is None else environ
    override = env.get(CONFIG_DIR_ENV)
    if override:
        return Path(override)
    if sys.platform == "win32":
        base = Path(env.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / app_name


@dataclass
class Settings:
    """What the user chose: a sync URL, or local-only. Saved as JSON in the config directory."""

    sync_url: str | None = None
    local_only: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # keys a newer version wrote; kept on save

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "syncUrl": self.sync_url, "localOnly": self.local_only}


class SettingsFile:
    """The settings file of one app; every save replaces the file atomically (a crash never truncates it)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / SETTINGS_NAME

    def load(self) -> Settings:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Settings()
        except ValueError:
            # A damaged file must not lock the user out: treat it as a first launch (setup asks again).
            return Settings()
        if not isinstance(data, dict):
            return Settings()
        url = data.get("syncUrl")
        extra = {k: v for k, v in data.items() if k not in ("syncUrl", "localOnly")}
        return Settings(
            sync_url=url if isinstance(url, str) and url else None,
            local_only=data.get("localOnly") is True,
            extra=extra,
        )

    def save(self, settings: Settings) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".settings-", suffix=".json", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(settings.to_json(), handle, indent=2)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@dataclass(frozen=True)
class Launch:
    """How this launch starts: ``mode`` and, unless local-only or setup, the URL to sync with."""

    mode: LaunchMode
    sync_url: str | None

    @property
    def needs_setup(self) -> bool:
        return self.mode == "setup"


def decide_launch(build: BuildConfig, settings: Settings) -> Launch:
    """Apply the precedence above."""
    if build.sync_url:
        return Launch("build", build.sync_url)
    if settings.sync_url:
        return Launch("saved", settings.sync_url)
    if settings.local_only:
        return Launch("local-only", None)
    return Launch("setup", None)
