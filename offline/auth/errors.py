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

#: Refresh answers meaning the session is over for good: the only way back is a new sign-in.
SESSION_ENDED_CODES: Final = frozenset({REFRESH_TOKEN_REUSED, INVALID_REFRESH_TOKEN, AUTH_FAILED})

__all__ = [
    "AUTH_FAILED",
    "AUTH_UNAVAILABLE",
    "EMAIL_TAKEN",
    "INVALID_CREDENTIALS",
    "INVALID_INPUT",
    "INVALID_REFRESH_TOKEN",
    "OAUTH_ACCOUNT_EXISTS",
    "OAUTH_FAILED",
    "OAUTH_PROVIDER_UNKNOWN",
    "RATE_LIMITED",
    "REFRESH_TOKEN_REUSED",
    "SESSION_ENDED_CODES",
    "STORAGE_ERROR",
    "AuthError",
]


class AuthError(OfflineError):
    """An authentication call failed; ``code`` says why, ``context`` names what (never a secret)."""

    def __init__(self, message: str, code: str, context: dict[str, Any] | None = None) -> None:
        super().__init__(message, code, context)
