"""The desktop shell of an `offline` app: native SQLite, first-launch setup, signed auto-update (SPEC 4.7).

The data side (``DesktopRuntime``) and the update side (``offline_desktop.update``) need no UI toolkit.
"""

from __future__ import annotations

from .config import (
    BUILD_CONFIG_NAME,
    BuildConfig,
    Launch,
    Settings,
    SettingsFile,
    build_config_from_env,
    config_dir,
    decide_launch,
    read_build_config,
    write_build_config,
)
from .connection import (
    BAD_URL,
    NOT_OFFLINE_SERVER,
    REFUSED,
    UNREACHABLE,
    ConnectionCheck,
    normalize_sync_url,
    test_connection,
)
from .runtime import DesktopRuntime

__all__ = [
    "BAD_URL",
    "BUILD_CONFIG_NAME",
    "NOT_OFFLINE_SERVER",
    "REFUSED",
    "UNREACHABLE",
    "BuildConfig",
    "ConnectionCheck",
    "DesktopRuntime",
    "Launch",
    "Settings",
    "SettingsFile",
    "build_config_from_env",
    "config_dir",
    "decide_launch",
    "normalize_sync_url",
    "read_build_config",
    "test_connection",
    "write_build_config",
]
