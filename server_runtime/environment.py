"""Build a server from environment variables alone (SPEC 2.14), so a container needs only the user's
schema: `PORT` (3001), `DATABASE_URL` (PostgreSQL when set, else the SQLite file `OFFLINE_SERVER_DB`,
default `./offline-server.db`), `OFFLINE_ADMIN_TOKEN`, `OFFLINE_METRICS_TOKEN`, `OFFLINE_BACKUP_TOKEN`.

`AUTH_SECRET` (at least 32 bytes; SPEC 2.14 suggests 32 random bytes, base64) turns on the `/auth` routes,
with users kept in the same store, and makes their sync auth provider guard the sync endpoint (unless
`sync_options` brings its own `auth`). `OFFLINE_OAUTH_PROVIDERS` may hold a JSON object of OAuth providers
(name -> `client_id`, `client_secret`, `authorize_url`, `token_url`, `userinfo_url`, `scope`, ...; see
`server_runtime.auth.oauth`); `OFFLINE_AUTH_*` set token lifetimes and sign-in limits (see
`server_runtime.auth.settings`); `OFFLINE_JWT_ISSUERS` (a JSON list) names external OpenID Connect issuers
whose tokens sync accepts (see `server_runtime.auth.external_issuers`). Without `AUTH_SECRET` the server
accepts every sync connection, and says so.
Email for password reset and verification: `OFFLINE_SMTP_URL`, `OFFLINE_EMAIL_FROM`, `OFFLINE_EMAIL_TEMPLATES`,
`OFFLINE_APP_URL` (see `server_runtime.email.settings`); `OFFLINE_AUTH_REQUIRE_VERIFIED_EMAIL` (`sign-in`,
`sync`, `true` for both) is read by `server_runtime.auth.settings`.

`OFFLINE_TRUSTED_PROXIES` and `OFFLINE_CLIENT_IP_HEADER` say which peers' forwarding headers name the client
(none by default; see `server_runtime.client_address`)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from offline.core.errors import OfflineError
from offline.core.schema import SchemaDefinition

from .auth import AuthRoutes, create_auth_routes
from .auth.external_issuers import ENVIRONMENT_VARIABLE as ISSUERS_VARIABLE
from .auth.external_issuers import external_issuers_from_environment
from .auth.settings import auth_options_from_environment
from .client_address import CLIENT_IP_HEADER_ENV, TRUSTED_PROXIES_ENV
from .email.settings import email_options_from_environment
from .server import ProductionServer, create_production_server
from .stores import create_relational_server_store, create_sqlite_server_store
from .stores.base import ServerStore

ENTRY_CANDIDATES = ("server.py", "src/server.py")


def find_entry(root: Path) -> Path | None:
    for name in ENTRY_CANDIDATES:
        candidate = root / name
        if candidate.is_file():
            return candidate
    return None


def load_entry(path: Path) -> ModuleType:
    path = path.resolve()
    spec = importlib.util.spec_from_file_location("offline_server_entry", path)
    if spec is None or spec.loader is None:
        raise OfflineError(f"{path} is not a Python file", "SYNC_ERROR", {"path": str(path)})
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    sys.modules["offline_server_entry"] = module
    spec.loader.exec_module(module)
    return module


async def store_from_environment(env: Mapping[str, str]) -> ServerStore:
    if env.get("OFFLINE_SERVER_STORE", "").strip().lower() == "memory":
        from .stores import MemoryServerStore

        return MemoryServerStore()  # development and tests only: nothing survives a restart
    url = env.get("DATABASE_URL", "").strip()
    if url:
        return await create_relational_server_store(url)
    return create_sqlite_server_store(env.get("OFFLINE_SERVER_DB") or "./offline-server.db")


def operational_auth_from_environment(env: Mapping[str, str]) -> dict[str, str]:
    tokens = {
        "adminToken": env.get("OFFLINE_ADMIN_TOKEN", ""),
        "metricsToken": env.get("OFFLINE_METRICS_TOKEN", ""),
        "backupToken": env.get("OFFLINE_BACKUP_TOKEN", ""),
        # Keys backups when no backup token is set (server_runtime.backup); a secret, so it is redacted too.
        "authSecret": env.get("AUTH_SECRET", "").strip(),
    }
    return {k: v for k, v in tokens.items() if v}


def auth_routes_from_environment(env: Mapping[str, str]) -> AuthRoutes | None:
    """Auth routes when `AUTH_SECRET` is set (None otherwise); OAuth providers from `OFFLINE_OAUTH_PROVIDERS`."""
    secret = env.get("AUTH_SECRET", "").strip()
    issuers = external_issuers_from_environment(
        env
    )  # checked first: a bad value fails with or without a secret
    if not secret:
        if issuers:
            raise OfflineError(
                f"{ISSUERS_VARIABLE} needs AUTH_SECRET as well (the /auth routes carry the external issuers); "
                "set AUTH_SECRET to 32 random bytes, base64",
                "AUTH_CONFIG",
                {"field": "AUTH_SECRET"},
            )
        return None
    providers_text = env.get("OFFLINE_OAUTH_PROVIDERS", "").strip()
    providers = None
    if providers_text:
        try:
            providers = json.loads(providers_text)
        except ValueError:
            providers = None
        if not isinstance(providers, dict):
            # Never echo the value: it holds client secrets.
            raise OfflineError(
                "OFFLINE_OAUTH_PROVIDERS must be a JSON object: provider name -> its settings",
                "AUTH_CONFIG",
                {"field": "OFFLINE_OAUTH_PROVIDERS"},
            )
    return create_auth_routes(
        secret=secret,
        oauth_providers=providers,
        external_issuers=issuers,
        **auth_options_from_environment(env),
        **email_options_from_environment(env),
    )


async def server_from_environment(
    schema: SchemaDefinition,
    env: Mapping[str, str] | None = None,
    *,
    static_dir: str | None = None,
    sync_options: Mapping[str, Any] | None = None,
) -> ProductionServer:
    env = dict(os.environ if env is None else env)
    auth_routes = auth_routes_from_environment(env)  # before the store: a bad secret fails fast
    if auth_routes is not None and not (sync_options or {}).get("auth"):
        sync_options = {**(sync_options or {}), "auth": auth_routes.to_sync_auth_provider()}
    store = await store_from_environment(env)
    await store.set_schema(schema)
    port_text = env.get("PORT", "").strip() or "3001"
    try:
        port = int(port_text)
    except ValueError:
        raise OfflineError(
            f"PORT must be a number, got {port_text!r}", "SYNC_ERROR", {"field": "PORT"}
        ) from None
    return create_production_server(
        store=store,
        port=port,
        host=env.get("HOST", "0.0.0.0"),
        static_dir=static_dir or env.get("OFFLINE_STATIC_DIR") or None,
        operational_auth=operational_auth_from_environment(env),
        sync_options=sync_options,
        auth_routes=auth_routes,
        trusted_proxies=env.get(TRUSTED_PROXIES_ENV, ""),
        client_ip_header=env.get(CLIENT_IP_HEADER_ENV, "").strip() or None,
    )
