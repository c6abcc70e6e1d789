"""Error codes of the auth client.

Every failure is an `OfflineError` (subclass `AuthError`) whose ``code`` is the auth server's code when the
server gave one, so applications branch on codes, never on messages. Two codes are the client's own:
`AUTH_UNAVAILABLE` (the auth server could not be reached or answered something that is not the contract; the
credentials are kept and the call may be retried) and `STORAGE_ERROR` from credential stores.
"""

from __future__ import annotations

from typing import Any, Final

from offline.core.errors import STORAGE_ERROR, OfflineError

INVALID_INPUT: Final = "INVALID_INPUT"
INVALID_CREDENTIALS: Final = "INVALID_CREDENTIALS"
EMAIL_TAKEN: Final = "EMAIL_TAKEN"
RATE_LIMITED: Final = "RATE_LIMITED"
AUTH_FAILED: Final = "AUTH_FAILED"
REFRESH_TOKEN_REUSED: Final = "REFRESH_TOKEN_REUSED"
INVALID_REFRESH_TOKEN: Final = "INVALID_REFRESH_TOKEN"
OAUTH_PROVIDER_UNKNOWN: Final = "OAUTH_PROVIDER_UNKNOWN"
OAUTH_FAILED: Final = "OAUTH_FAILED"
OAUTH_ACCOUNT_EXISTS: Final = "OAUTH_ACCOUNT_EXISTS"
AUTH_UNAVAILABLE: Final = "AUTH_UNAVAILABLE"
# Second factor (TOTP)
MFA_REQUIRED: Final = "MFA_REQUIRED"  # the client's own: sign-in needs `complete_mfa(code)`
INVALID_MFA_CODE: Final = "INVALID_MFA_CODE"
INVALID_MFA_TOKEN: Final = "INVALID_MFA_TOKEN"
MFA_ALREADY_ENABLED: Final = "MFA_ALREADY_ENABLED"
MFA_NOT_PENDING: Final = "MFA_NOT_PENDING"
MFA_NOT_ENABLED: Final = "MFA_NOT_ENABLED"
# Organizations
ORG_NOT_FOUND: Final = "ORG_NOT_FOUND"
FORBIDDEN: Final = "FORBIDDEN"
LAST_OWNER: Final = "LAST_OWNER"
MEMBER_NOT_FOUND: Final = "MEMBER_NOT_FOUND"
ALREADY_MEMBER: Final = "ALREADY_MEMBER"
INVITE_INVALID: Final = "INVITE_INVALID"
INVITE_EMAIL_MISMATCH: Final = "INVITE_EMAIL_MISMATCH"
# Account linking
OAUTH_IDENTITY_LINKED: Final = "OAUTH_IDENTITY_LINKED"
# Passkeys
PASSKEYS_UNSUPPORTED: Final = "PASSKEYS_UNSUPPORTED"  # the client's own: no WebAuthn in this shell
# The client's own: the browser's WebAuthn prompt was dismissed or timed out (WebAuthn tells these apart from
# "no passkey for this site" on purpose, with one NotAllowedError for all of them).
PASSKEY_CANCELLED: Final = "PASSKEY_CANCELLED"
PASSKEYS_NOT_CONFIGURED: Final = "PASSKEYS_NOT_CONFIGURED"
PASSKEY_CHALLENGE_INVALID: Final = "PASSKEY_CHALLENGE_INVALID"
PASSKEY_INVALID: Final = "PASSKEY_INVALID"
PASSKEY_EXISTS: Final = "PASSKEY_EXISTS"
PASSKEY_FAILED: Final = "PASSKEY_FAILED"
PASSKEY_NOT_FOUND: Final = "PASSKEY_NOT_FOUND"
# User administration: an administrator disabled the account (sign-in, refresh and sync are refused).
USER_DISABLED: Final = "USER_DISABLED"
# Password reset and email verification
EMAIL_NOT_CONFIGURED: Final = "EMAIL_NOT_CONFIGURED"  # the server cannot send email
INVALID_RESET_TOKEN: Final = "INVALID_RESET_TOKEN"
INVALID_VERIFICATION_TOKEN: Final = "INVALID_VERIFICATION_TOKEN"
NO_EMAIL: Final = "NO_EMAIL"
# The server requires a verified address (sign-in, or the sync handshake) and the account's is not yet.
EMAIL_NOT_VERIFIED: Final = "EMAIL_NOT_VERIFIED"

#: Refresh answers meaning the session is over for good: the only way back is a new sign-in.
SESSION_ENDED_CODES: Final = frozenset(
    {REFRESH_TOKEN_REUSED, INVALID_REFRESH_TOKEN, AUTH_FAILED, USER_DISABLED}
)

__all__ = [
    "ALREADY_MEMBER",
    "AUTH_FAILED",
    "AUTH_UNAVAILABLE",
    "EMAIL_NOT_CONFIGURED",
    "EMAIL_NOT_VERIFIED",
    "EMAIL_TAKEN",
    "FORBIDDEN",
    "INVALID_CREDENTIALS",
    "INVALID_INPUT",
    "INVALID_MFA_CODE",
    "INVALID_MFA_TOKEN",
    "INVALID_REFRESH_TOKEN",
    "INVALID_RESET_TOKEN",
    "INVALID_VERIFICATION_TOKEN",
    "INVITE_EMAIL_MISMATCH",
    "INVITE_INVALID",
    "LAST_OWNER",
    "MEMBER_NOT_FOUND",
    "MFA_ALREADY_ENABLED",
    "MFA_NOT_ENABLED",
    "MFA_NOT_PENDING",
    "MFA_REQUIRED",
    "NO_EMAIL",
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
    "SESSION_ENDED_CODES",
    "STORAGE_ERROR",
    "USER_DISABLED",
    "AuthError",
    "MfaRequired",
]


class AuthError(OfflineError):
    """An authentication call failed; ``code`` says why, ``context`` names what (never a secret)."""

    def __init__(self, message: str, code: str, context: dict[str, Any] | None = None) -> None:
        super().__init__(message, code, context)


class MfaRequired(AuthError):
    """The password (or provider) was right and the account has a second factor: finish the sign-in with
    ``await auth.complete_mfa(code)`` (or ``recovery_code=...``) within ``expires_in`` seconds. The sign-in
    token stays inside the auth client; this error carries nothing secret."""

    def __init__(self, mfa_types: list[str], expires_in: float) -> None:
        super().__init__(
            "this account has two-step verification: call complete_mfa(code) with the code from the "
            "authenticator app (or recovery_code=...)",
            MFA_REQUIRED,
            {"mfaTypes": list(mfa_types), "expiresIn": expires_in},
        )
        self.mfa_types = list(mfa_types)
        self.expires_in = expires_in
