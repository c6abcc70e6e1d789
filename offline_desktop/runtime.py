"""The desktop app's data side, without any UI: the native app, first-launch setup, local-only, connect later.

The shell (or a test) drives it: ``runtime.launch.needs_setup`` says whether to show the setup screen;
``await runtime.use_server(url)`` is the setup screen's "Connect" and the settings control's "Connect";
``runtime.stay_local()`` is "Skip, local-only".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from offline import App, OfflineError, create_app
from offline.core.schema import SchemaDefinition
from offline.sync import create_sync_engine

from .config import CONFIG_ERROR, BuildConfig, Launch, Settings, SettingsFile, config_dir, decide_launch
from .connection import ConnectionCheck, test_connection

log = logging.getLogger("offline_desktop")

DATABASE_NAME = "app.db"


class DesktopRuntime:
    """One desktop app instance: the native ``offline`` app on stdlib sqlite3 and where it syncs to."""

    def __init__(
        self,
        schema: SchemaDefinition,
        build: BuildConfig,
        *,
        directory: Path | None = None,
        sync_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.schema = schema
        self.build = build
        self.directory = directory or config_dir(build.app_name)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.settings_file = SettingsFile(self.directory)
        self.settings = self.settings_file.load()
        self.launch: Launch = decide_launch(build, self.settings)
        # Extra sync configuration (auth_client, scope, timeouts); the URL always comes from the launch.
        self.sync_options = dict(sync_options or {})
        config = self._sync_config(self.launch.sync_url) if self.launch.sync_url else None
        self.app: App = create_app(schema, sync=config, path=str(self.directory / DATABASE_NAME))

    @property
    def sync_url(self) -> str | None:
        return getattr(self.app.sync, "url", None)

    def _sync_config(self, url: str) -> dict[str, Any]:
        return {**self.sync_options, "url": url}

    async def start(self) -> None:
        """Start syncing in the background when a URL is known; local-only and setup do nothing here."""
        if self.sync_url is not None:
            # Never wait: the app works offline, and the engine keeps retrying while the server is away.
            await self.app.sync.connect(wait=False)

    async def check(self, url: str, *, timeout: float = 10.0) -> ConnectionCheck:
        token = None
        auth = self.sync_options.get("auth_client", self.sync_options.get("authClient"))
        if auth is not None and hasattr(auth, "get_access_token"):
            token = await auth.get_access_token()
        return await test_connection(url, self.schema, timeout=timeout, auth_token=token)

    async def use_server(self, url: str, *, timeout: float = 10.0) -> ConnectionCheck:
        """Test ``url``; when it works, save it and start syncing (setup screen and settings control)."""
        if self.build.sync_url:
            raise OfflineError(
                "this build's sync URL is fixed (BUILD_SYNC_URL); rebuild the app to change it",
                CONFIG_ERROR,
                {"field": "syncUrl"},
            )
        result = await self.check(url, timeout=timeout)
        if not result.ok:
            log.info("sync URL %s refused: %s", result.url, result.reason)
            return result
        self.settings = Settings(sync_url=result.url, local_only=False, extra=self.settings.extra)
        self.settings_file.save(self.settings)
        await self._attach(result.url)
        self.launch = Launch("saved", result.url)
        return result

    def stay_local(self) -> None:
        """The user skipped setup: run local-only, and do not ask again at the next launch."""
        if self.build.sync_url:
            return  # a build with a sync URL never shows setup; nothing to skip
        self.settings = Settings(sync_url=None, local_only=True, extra=self.settings.extra)
        self.settings_file.save(self.settings)
        self.launch = Launch("local-only", None)

    async def _attach(self, url: str) -> None:
        old = self.app.sync
        if getattr(old, "url", None) == url and old.status not in ("disconnected", "error"):
            return
        await old.disconnect()
        listener = getattr(old, "_on_local_commit", None)
        if listener is not None and listener in self.app.commit_listeners:
            # The replaced engine must stop hearing about local writes.
            self.app.commit_listeners.remove(listener)
        self.app.sync = create_sync_engine(self.app, self._sync_config(url))
        await self.app.sync.connect(wait=False)

    async def close(self) -> None:
        await self.app.sync.disconnect()
        self.app.close()
