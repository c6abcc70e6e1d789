"""Client side of authentication (DESIGN.md section 2, "Auth"; SPEC 4.3a, 5.2).

    auth = create_offline_auth(server_url="https://example.com")
    await auth.sign_up("ada@example.com", "correct horse battery")   # also signs in
    app = create_app(schema, sync={"url": "wss://example.com/offline-sync",
                                   "auth_client": create_offline_auth_sync(auth_client=auth, schema=schema)})

Pure Python (httpx for HTTP), so it also runs under Pyodide; nothing here imports the server.
"""

from .client import DEFAULT_STORE, MIN_PASSWORD_LENGTH, OfflineAuth, create_offline_auth
from .credentials import (
    Credentials,
    CredentialStore,
    FileCredentialStore,
    MemoryCredentialStore,
    default_credentials_path,
    user_config_dir,
)
from .errors import (
    AUTH_FAILED,
    AUTH_UNAVAILABLE,
    EMAIL_TAKEN,
    INVALID_CREDENTIALS,
    INVALID_INPUT,
    INVALID_REFRESH_TOKEN,
    OAUTH_ACCOUNT_EXISTS,
    OAUTH_FAILED,
    OAUTH_PROVIDER_UNKNOWN,
    RATE_LIMITED,
    REFRESH_TOKEN_REUSED,
    AuthError,
)
from .sync import AccessTokenSource, OfflineAuthSync, create_offline_auth_sync
from .tokens import decode_claims

__all__ = [
    "AUTH_FAILED",
    "AUTH_UNAVAILABLE",
    "DEFAULT_STORE",
    "EMAIL_TAKEN",
    "INVALID_CREDENTIALS",
    "INVALID_INPUT",
    "INVALID_REFRESH_TOKEN",
    "MIN_PASSWORD_LENGTH",
    "OAUTH_ACCOUNT_EXISTS",
    "OAUTH_FAILED",
    "OAUTH_PROVIDER_UNKNOWN",
    "RATE_LIMITED",
    "REFRESH_TOKEN_REUSED",
    "AccessTokenSource",
    "AuthError",
    "CredentialStore",
    "Credentials",
    "FileCredentialStore",
    "MemoryCredentialStore",
    "OfflineAuth",
    "OfflineAuthSync",
    "create_offline_auth",
    "create_offline_auth_sync",
    "decode_claims",
    "default_credentials_path",
    "user_config_dir",
]
