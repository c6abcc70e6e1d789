"""Access tokens (JWT, HS256 only, signed with AUTH_SECRET) and opaque refresh tokens.

An access token carries ``sub`` (user id), ``email``, ``sid`` (session id), ``iat``, ``exp``, ``typ`` "access"
and ``iss`` "offline". Verification accepts HS256 and nothing else, so ``alg: none`` and tokens of other
algorithms or other secrets fail; whether the session is still live is the caller's check (``routes``).
A refresh token is 32 random bytes (URL-safe text); only its SHA-256 is stored.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import jwt

from offline.core.errors import OfflineError

__all__ = [
    "ALGORITHM",
    "AUTH_CONFIG",
    "ISSUER",
    "MIN_SECRET_BYTES",
    "AccessToken",
    "InvalidToken",
    "TokenService",
    "hash_secret",
    "new_refresh_token",
]

ALGORITHM: Final = "HS256"
ISSUER: Final = "offline"
#: HMAC-SHA256 keys shorter than the hash output weaken it (RFC 7518 section 3.2).
MIN_SECRET_BYTES: Final = 32
#: Error code of a misconfigured auth setup (weak secret, bad provider entry, bad lifetimes).
AUTH_CONFIG: Final = "AUTH_CONFIG"
_REQUIRED: Final = ["exp", "iat", "sub", "sid", "typ", "iss"]
#: Server processes' clocks may differ a little: a token "issued" this far in the future is still accepted.
_CLOCK_SKEW: Final = 60


class InvalidToken(Exception):
    """An access token that is not valid; ``reason`` is safe to log (it never quotes the token)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AccessToken:
    token: str
    expires_at: int  # epoch seconds
    expires_in: int  # seconds


def hash_secret(value: str) -> str:
    """SHA-256 hex of a high-entropy secret (refresh token, OAuth state): what the store keeps."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def new_refresh_token() -> str:
    return secrets.token_urlsafe(32)


class TokenService:
    """Issues and verifies access tokens. ``now`` (epoch seconds) is injectable for tests."""

    def __init__(
        self, secret: str | bytes, *, access_ttl: float = 900.0, now: Callable[[], float] | None = None
    ) -> None:
        key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        if len(key) < MIN_SECRET_BYTES:
            raise OfflineError(
                f"AUTH_SECRET must be at least {MIN_SECRET_BYTES} bytes long; generate one with "
                '`python -c "import secrets, base64; print(base64.b64encode(secrets.token_bytes(32)).decode())"`',
                AUTH_CONFIG,
                {"field": "secret", "minBytes": MIN_SECRET_BYTES},
            )
        if access_ttl <= 0:
            raise OfflineError(
                "access_ttl must be a positive number of seconds", AUTH_CONFIG, {"field": "access_ttl"}
            )
        self._key = key
        self.access_ttl = int(access_ttl)
        self._now = now or time.time

    def __repr__(self) -> str:  # never show the key
        return f"TokenService(access_ttl={self.access_ttl})"

    def issue_access(
        self, *, user_id: str, email: str | None, session_id: str, extra: Mapping[str, Any] | None = None
    ) -> AccessToken:
        issued = int(self._now())
        expires = issued + self.access_ttl
        claims: dict[str, Any] = {
            **(extra or {}),
            "sub": user_id,
            "email": email,
            "sid": session_id,
            "iat": issued,
            "exp": expires,
            "typ": "access",
            "iss": ISSUER,
        }
        token = jwt.encode(claims, self._key, algorithm=ALGORITHM, headers={"typ": "JWT"})
        return AccessToken(token, expires, self.access_ttl)

    def verify_access(self, token: str | None) -> dict[str, Any]:
        """The claims of a valid access token; raises ``InvalidToken`` (with a loggable reason) otherwise."""
        if not token or not isinstance(token, str):
            raise InvalidToken("no token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise InvalidToken("malformed token") from None
        if header.get("alg") != ALGORITHM:
            # PyJWT refuses these too (algorithms=[HS256]); said here so the log names the reason.
            raise InvalidToken(f"algorithm {str(header.get('alg'))[:16]!r} is not accepted")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._key,
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                # Times are checked below against this service's clock (one clock for issuing and checking).
                options={"require": _REQUIRED, "verify_exp": False, "verify_iat": False, "verify_nbf": False},
            )
        except jwt.InvalidSignatureError:
            raise InvalidToken("bad signature") from None
        except jwt.InvalidTokenError as exc:
            raise InvalidToken(f"invalid token ({type(exc).__name__})") from None
        now = self._now()
        times = [claims["exp"], claims["iat"], claims.get("nbf", 0)]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in times):
            raise InvalidToken("malformed claims")
        if claims["exp"] <= now:
            raise InvalidToken("token expired")
        if claims["iat"] > now + _CLOCK_SKEW or claims.get("nbf", 0) > now + _CLOCK_SKEW:
            raise InvalidToken("token not valid yet")
        if claims.get("typ") != "access":
            raise InvalidToken("not an access token")
        if not isinstance(claims.get("sub"), str) or not isinstance(claims.get("sid"), str):
            raise InvalidToken("malformed claims")
        return claims
