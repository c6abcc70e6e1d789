"""Client side of authentication (DESIGN.md section 2, "Auth"; SPEC 4.3a, 5.2).

    auth = create_offline_auth(server_url="https://example.com")
    await auth.sign_up("ada@example.com", "correct horse battery")   # also signs in
    app = create_app(schema, sync={"url": "wss://example.com/offline-sync",
                                   "auth_client": create_offline_auth_sync(auth_client=auth, schema=schema)})

Also: two-step sign-in (`MfaRequired`, ``auth.complete_mfa(code)``, ``enroll_totp()``, ``verify_totp(code)``),
organizations (``create_org``, ``invite_member``, ``accept_invite``, ``activate_org``, ...), account linking
(``link_oauth_authorize``, ``complete_link_oauth``), passkeys (`is_passkey_supported`,
``register_passkey``, ``sign_in_with_passkey``), and an identity provider's own tokens for sync
(`external_token_auth`).

Pure Python: HTTP goes through httpx on CPython and the browser's fetch under Pyodide (imported lazily, so this
package also runs in a browser worker); nothing here imports the server.
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
    ALREADY_MEMBER,
    AUTH_FAILED,
    AUTH_UNAVAILABLE,
    EMAIL_TAKEN,
    FORBIDDEN,
    INVALID_CREDENTIALS,
    INVALID_INPUT,
    INVALID_MFA_CODE,
    INVALID_MFA_TOKEN,
    INVALID_REFRESH_TOKEN,
    INVITE_EMAIL_MISMATCH,
    INVITE_INVALID,
    LAST_OWNER,
    MEMBER_NOT_FOUND,
    MFA_ALREADY_ENABLED,
    MFA_NOT_ENABLED,
    MFA_NOT_PENDING,
    MFA_REQUIRED,
    OAUTH_ACCOUNT_EXISTS,
    OAUTH_FAILED,
    OAUTH_IDENTITY_LINKED,
    OAUTH_PROVIDER_UNKNOWN,
    ORG_NOT_FOUND,
    PASSKEY_CANCELLED,
    PASSKEY_CHALLENGE_INVALID,
    PASSKEY_EXISTS,
    PASSKEY_FAILED,
    PASSKEY_INVALID,
    PASSKEY_NOT_FOUND,
    PASSKEYS_NOT_CONFIGURED,
    PASSKEYS_UNSUPPORTED,
    RATE_LIMITED,
    REFRESH_TOKEN_REUSED,
    AuthError,
    MfaRequired,
)
from .external import ExternalTokenAuth, external_token_auth
from .mfa import TotpEnrollment
from .passkeys import Ceremony, browser_create, browser_get, is_passkey_supported
from .sync import AccessTokenSource, OfflineAuthSync, create_offline_auth_sync
from .tokens import decode_claims

__all__ = [
    "ALREADY_MEMBER",
    "AUTH_FAILED",
    "AUTH_UNAVAILABLE",
    "DEFAULT_STORE",
    "EMAIL_TAKEN",
    "FORBIDDEN",
    "INVALID_CREDENTIALS",
    "INVALID_INPUT",
    "INVALID_MFA_CODE",
    "INVALID_MFA_TOKEN",
    "INVALID_REFRESH_TOKEN",
    "INVITE_EMAIL_MISMATCH",
    "INVITE_INVALID",
    "LAST_OWNER",
    "MEMBER_NOT_FOUND",
    "MFA_ALREADY_ENABLED",
    "MFA_NOT_ENABLED",
    "MFA_NOT_PENDING",
    "MFA_REQUIRED",
    "MIN_PASSWORD_LENGTH",
    "OAUTH_ACCOUNT_EXISTS",
    "OAUTH_FAILED",
    "OAUTH_IDENTITY_LINKED",
    "OAUTH_PROVIDER_UNKNOWN",
    "ORG_NOT_FOUND",
    "PASSKEYS_NOT_CONFIGURED",
    "PASSKEYS_UNSUPPORTED",
    "PASSKEY_CANCELLED",
    "PASSKEY_CHALLENGE_INVALID",
    "PASSKEY_EXISTS",
    "PASSKEY_FAILED",
    "PASSKEY_INVALID",
    "PASSKEY_NOT_FOUND",
    "RATE_LIMITED",
    "REFRESH_TOKEN_REUSED",
    "AccessTokenSource",
    "AuthError",
    "Ceremony",
    "CredentialStore",
    "Credentials",
    "ExternalTokenAuth",
    "FileCredentialStore",
    "MemoryCredentialStore",
    "MfaRequired",
    "OfflineAuth",
    "OfflineAuthSync",
    "TotpEnrollment",
    "browser_create",
    "browser_get",
    "create_offline_auth",
    "create_offline_auth_sync",
    "decode_claims",
    "default_credentials_path",
    "external_token_auth",
    "is_passkey_supported",
    "user_config_dir",
]
