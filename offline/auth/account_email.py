"""Password reset and email verification on the client.

    await auth.request_password_reset("ada@example.com")    # always succeeds (the server never says more)
    await auth.reset_password(token_from_the_link, "a new passphrase")   # then sign in with it
    await auth.request_email_verification()                  # signed in; True when already verified
    await auth.verify_email(token_from_the_link)             # no session needed (the link may be opened elsewhere)

``reset_password`` ends every session of the account on the server, this device's included: sign in again.
``verify_email`` refreshes this device's token afterwards when it is signed in, so its ``email_verified``
claim (and a sync server requiring it) agree at once.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .errors import AUTH_UNAVAILABLE, INVALID_INPUT, AuthError
from .http import AuthHttp, HttpResponse

__all__ = ["AccountEmailMethods"]


def _token(token: Any) -> str:
    if not isinstance(token, str) or not token.strip() or len(token.strip()) > 512:
        raise AuthError("token must be the code from the emailed link", INVALID_INPUT, {"field": "token"})
    return token.strip()


class AccountEmailMethods:
    """Methods of `OfflineAuth` (a mixin; the session plumbing comes from the client)."""

    server_url: str
    _http: AuthHttp

    async def _authed(self, method: str, path: str, body: dict[str, Any] | None = None) -> HttpResponse:
        raise NotImplementedError  # provided by OfflineAuth

    def _body_of(self, response: HttpResponse) -> dict[str, Any]:
        raise NotImplementedError  # provided by OfflineAuth

    @property
    def is_signed_in(self) -> bool:
        raise NotImplementedError  # provided by OfflineAuth

    async def refresh(self) -> str:
        raise NotImplementedError  # provided by OfflineAuth

    async def request_password_reset(self, email: str) -> None:
        """Ask for a reset link sent to ``email``. The answer is the same whether or not an account uses the
        address; RATE_LIMITED (``context["retry_after"]``) after too many requests."""
        from .client import check_email

        await self._http.request("POST", "/password-reset/request", json={"email": check_email(email)})

    async def reset_password(self, token: str, password: str) -> None:
        """Set a new password with the token of a reset link. INVALID_RESET_TOKEN when the link is unknown,
        used or expired (ask for a new one). Every session of the account ends, this one's included."""
        from .client import check_password

        body = {"token": _token(token), "password": check_password(password)}
        await self._http.request("POST", "/password-reset/complete", json=body)

    async def request_email_verification(self) -> bool:
        """Send the signed-in user a verification link; True when the address is already verified (nothing
        sent). NO_EMAIL for an account without an address, RATE_LIMITED after too many."""
        body = self._body_of(await self._authed("POST", "/email/verify/request", {}))
        verified = body.get("emailVerified")
        if not isinstance(verified, bool):
            raise AuthError(
                "unexpected answer from /auth/email/verify/request",
                AUTH_UNAVAILABLE,
                {"url": self.server_url},
            )
        return verified

    async def verify_email(self, token: str) -> dict[str, Any]:
        """Mark the address of a verification link verified; returns ``{"email", "emailVerified": True}``.
        INVALID_VERIFICATION_TOKEN when the link is unknown, used, expired or for another address."""
        answer = self._body_of(
            await self._http.request("POST", "/email/verify", json={"token": _token(token)})
        )
        if self.is_signed_in:
            # The access token's email_verified claim dates from its issue: take a fresh one (best effort; a
            # token of another account or an ended session simply stays as it is).
            with contextlib.suppress(AuthError):
                await self.refresh()
        return answer
