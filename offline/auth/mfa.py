"""Two-step verification (TOTP) on the client: enrolment and the second step of a sign-in.

try:
    await auth.sign_in(email, password)
except MfaRequired:
    await auth.complete_mfa(input("code: "))          # or recovery_code="xxxx-xxxx-xxxx-xxxx"

enrolment = await auth.enroll_totp()                  # show enrolment.provisioning_uri as a QR code
recovery_codes = await auth.verify_totp(code)         # show these once; the server keeps only hashes
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import AUTH_UNAVAILABLE, INVALID_INPUT, AuthError
from .http import HttpResponse

__all__ = ["MfaMethods", "TotpEnrollment"]


@dataclass(frozen=True, slots=True)
class TotpEnrollment:
    """A started enrolment: put ``provisioning_uri`` into a QR code (or show ``secret`` for manual entry),
    then confirm with ``verify_totp(code)``."""

    secret: str = field(repr=False)
    provisioning_uri: str = field(repr=False)
    issuer: str
    digits: int
    period: int


def _factor(code: str | None, recovery_code: str | None) -> dict[str, str]:
    if (code is None) == (recovery_code is None):
        raise AuthError("give either code or recovery_code", INVALID_INPUT, {"field": "code"})
    name, value = ("code", code) if code is not None else ("recoveryCode", recovery_code)
    if not isinstance(value, str) or not value.strip():
        raise AuthError(f"{name} must be a non-empty string", INVALID_INPUT, {"field": name})
    return {name: value.strip()}


class MfaMethods:
    """TOTP methods of `OfflineAuth` (a mixin; the session plumbing comes from the client)."""

    server_url: str

    async def _authed(self, method: str, path: str, body: dict[str, Any] | None = None) -> HttpResponse:
        raise NotImplementedError  # provided by OfflineAuth

    def _body_of(self, response: HttpResponse) -> dict[str, Any]:
        raise NotImplementedError  # provided by OfflineAuth

    async def enroll_totp(self) -> TotpEnrollment:
        """Start (or restart) a TOTP enrolment for the signed-in user. MFA_ALREADY_ENABLED when it is on."""
        body = self._body_of(await self._authed("POST", "/mfa/totp/enroll", {}))
        secret, uri = body.get("secret"), body.get("provisioningUri")
        if not isinstance(secret, str) or not isinstance(uri, str):
            raise AuthError(
                "the auth server sent an unexpected enrolment answer",
                AUTH_UNAVAILABLE,
                {"url": self.server_url},
            )
        return TotpEnrollment(
            secret, uri, str(body.get("issuer", "")), int(body.get("digits", 6)), int(body.get("period", 30))
        )

    async def verify_totp(self, code: str) -> list[str]:
        """Confirm the enrolment with a current code; returns the recovery codes (shown once, keep them safe).
        INVALID_MFA_CODE for a wrong code, MFA_NOT_PENDING without a started enrolment."""
        fields = _factor(code, None)
        body = self._body_of(await self._authed("POST", "/mfa/totp/verify", fields))
        codes = body.get("recoveryCodes")
        if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
            raise AuthError(
                "the auth server sent no recovery codes", AUTH_UNAVAILABLE, {"url": self.server_url}
            )
        return list(codes)

    async def disable_totp(self, code: str | None = None, *, recovery_code: str | None = None) -> None:
        """Switch TOTP off; needs a current code or a recovery code (an access token alone is not enough)."""
        fields = _factor(code, recovery_code)
        await self._authed("POST", "/mfa/totp/disable", fields)

    async def mfa_status(self) -> dict[str, Any]:
        """``{"totp": "off" | "pending" | "enabled", "recoveryCodesLeft": n}``."""
        return self._body_of(await self._authed("GET", "/mfa"))
