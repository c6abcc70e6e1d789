"""Second factor with TOTP: enrolment, recovery codes, and the challenge step of a sign-in.

A sign-in (password or OAuth) of a user with TOTP enabled answers ``{"mfaRequired": true, "mfaToken", ...}``
instead of a token pair; ``POST /auth/mfa/challenge`` with that token and a code (or a recovery code) then
gives the pair. The MFA token is opaque, kept hashed, valid for ``MFA_TOKEN_TTL`` seconds and spent by the
successful challenge (a wrong code leaves it usable until it expires). Wrong codes count against a per-user
limit (``RateLimits.mfa_attempts`` per ``mfa_window``); a TOTP code is accepted once (see ``totp``).
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .audit import user_actor
from .rate_limit import SlidingWindow
from .storage import AuthTx, User
from .storage_ext import ChallengeRow, TotpRow
from .tokens import hash_secret
from .totp import DIGITS, PERIOD, TotpKeys, hash_recovery_code, new_recovery_codes
from .web import AuthError, client_address, invalid, read_body, string_field

if TYPE_CHECKING:
    from .routes import AuthRoutes

__all__ = ["MFA_TOKEN_TTL", "MfaRoutes"]

log = logging.getLogger("offline.server.auth")

MFA_TOKEN_TTL: Final = 5 * 60
_NO_STORE: Final = {"Cache-Control": "no-store"}


def _wrong_code() -> AuthError:
    return AuthError(401, "INVALID_MFA_CODE", "the code is wrong, expired or already used; enter a new code")


def _invalid_token() -> AuthError:
    return AuthError(
        401, "INVALID_MFA_TOKEN", "the sign-in step expired or is unknown; sign in again with your password"
    )


def _second_factor(body: dict[str, Any]) -> tuple[str | None, str | None]:
    """(code, recoveryCode) from a body holding exactly one of them."""
    code, recovery = body.get("code"), body.get("recoveryCode")
    if (code is None) == (recovery is None):
        raise invalid("code", "send either code (from the authenticator app) or recoveryCode")
    for name, value in (("code", code), ("recoveryCode", recovery)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > 64):
            raise invalid(name, f"{name} must be a non-empty string")
    return code, recovery


class MfaRoutes:
    """The ``/mfa`` routes of an ``AuthRoutes`` and the MFA step of its sign-ins."""

    def __init__(self, core: AuthRoutes, *, key: bytes, issuer: str) -> None:
        self.core = core
        self.keys = TotpKeys(key, issuer)
        limits = core.rate_limits
        self.limiter = SlidingWindow(limits.mfa_attempts, limits.mfa_window)

    def routes(self) -> list[BaseRoute]:
        h = self.core._handler
        return [
            Route("/mfa", h(self.status), methods=["GET"]),
            Route("/mfa/totp/enroll", h(self.enroll), methods=["POST"]),
            Route("/mfa/totp/verify", h(self.verify), methods=["POST"]),
            Route("/mfa/totp/disable", h(self.disable), methods=["POST"]),
            Route("/mfa/challenge", h(self.challenge), methods=["POST"]),
        ]

    # -- the sign-in step -------------------------------------------------------------------------------------

    async def required(self, tx: AuthTx, user: User, method: str) -> Response | None:
        """The "second factor needed" answer when ``user`` has TOTP enabled (an MFA token is stored), else
        None: the caller opens the session."""
        row = await tx.totp(user.id)
        if row is None or row.enabled_at is None:
            return None
        token = secrets.token_urlsafe(32)
        now = self.core._ms()
        await tx.insert_challenge(
            ChallengeRow(
                hash_secret(token),
                "mfa",
                user.id,
                json.dumps({"method": method}),
                now,
                now + MFA_TOKEN_TTL * 1000,
            )
        )
        log.info("user %s passed the first factor (%s); second factor required", user.id, method)
        return JSONResponse(
            {"mfaRequired": True, "mfaToken": token, "mfaTypes": ["totp"], "expiresIn": MFA_TOKEN_TTL},
            headers=_NO_STORE,
        )

    def _reserve(self, user_id: str) -> float:
        """Count this code before it is checked (no await in between), so concurrent guesses cannot all pass
        the limit; returns the stamp to take back when the code turns out right or was never checked."""
        retry = self.limiter.retry_after(user_id)
        if retry is not None:
            log.warning("second factor refused for user %s: too many wrong codes", user_id)
            raise self.core._rate_limited(retry, "wrong codes")
        return self.limiter.hit(user_id)

    async def _accept(self, tx: AuthTx, user_id: str, code: str | None, recovery: str | None) -> bool:
        """True when the code (TOTP, unused step) or the recovery code (unspent) is good; spends it."""
        now = self.core._ms()
        if recovery is not None:
            return await tx.use_recovery_code(user_id, hash_recovery_code(recovery), now)
        row = await tx.totp(user_id)
        if row is None or code is None:
            return False
        step = self._step(row, code)
        return step is not None and await tx.advance_totp(user_id, step, now)

    def _step(self, row: TotpRow, code: str) -> int | None:
        secret = self.keys.open(row.sealed_secret, row.user_id)
        if secret is None:
            log.error(
                "the TOTP secret of user %s cannot be opened (was AUTH_SECRET changed?); "
                "the user can sign in with a recovery code and enrol again",
                row.user_id,
            )
            return None
        return self.keys.matching_step(secret, code, self.core._now())

    async def challenge(self, request: Request) -> Response:
        body = await read_body(request)
        token = string_field(body, "mfaToken", limit=256)
        code, recovery = _second_factor(body)
        now = self.core._ms()
        async with self.core._store().reader() as reader:
            pending = await reader.challenge(hash_secret(token))
        if pending is None or pending.kind != "mfa" or pending.expires_at <= now or pending.user_id is None:
            raise _invalid_token()
        user_id = pending.user_id
        stamp = self._reserve(user_id)
        outcome = "wrong"
        try:
            async with self.core._store().transaction() as tx:
                user = await tx.user_by_id(user_id)
                if user is not None and await self._accept(tx, user_id, code, recovery):
                    if await tx.take_challenge(pending.key_hash) is None:
                        raise _Spent()  # a concurrent challenge with the same token won: undo the code's use
                    pair = await self.core._open_session(tx, user)
                    outcome = "ok"
        except _Spent:
            self.limiter.unhit(user_id, stamp)
            raise _invalid_token() from None
        except BaseException:
            self.limiter.unhit(user_id, stamp)  # not checked (storage trouble): not a wrong code
            raise
        if outcome != "ok":
            log.info("second factor failed for user %s", user_id)
            await self.core.audit.record(
                "sign-in-failed",
                subject=user_id,
                address=client_address(request),
                detail={"method": "mfa", "reason": "invalid-mfa-code", "recovery": recovery is not None},
            )
            raise _wrong_code()
        self.limiter.reset(user_id)
        if recovery is not None:
            async with self.core._store().reader() as reader:
                left = await reader.recovery_codes_left(user_id)
            log.warning("user %s signed in with a recovery code (%d left)", user_id, left)
        log.info("user %s signed in with a second factor (session %s)", user_id, pair.session_id)
        await self.core.audit.record(
            "sign-in",
            actor=user_actor(user_id),
            subject=user_id,
            address=client_address(request),
            detail={"method": "mfa", "recovery": recovery is not None, "session": pair.session_id},
        )
        return self.core._pair_response(pair)

    # -- enrolment --------------------------------------------------------------------------------------------

    async def status(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        user_id = str(claims["sub"])
        async with self.core._store().reader() as tx:
            row = await tx.totp(user_id)
            left = await tx.recovery_codes_left(user_id)
        state = "off" if row is None else ("pending" if row.enabled_at is None else "enabled")
        return JSONResponse({"totp": state, "recoveryCodesLeft": left}, headers=_NO_STORE)

    async def enroll(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        user_id = str(claims["sub"])
        await read_body(request, required=False)  # nothing to read, but a malformed body is refused
        secret = self.keys.new_secret()
        now = self.core._ms()
        async with self.core._store().transaction() as tx:
            existing = await tx.totp(user_id)
            if existing is not None and existing.enabled_at is not None:
                raise AuthError(
                    409,
                    "MFA_ALREADY_ENABLED",
                    "TOTP is already enabled; disable it first to enrol a new device",
                )
            user = await tx.user_by_id(user_id)
            # A new enrolment replaces one that was never confirmed.
            await tx.put_totp(TotpRow(user_id, self.keys.seal(secret, user_id), None, -1, now))
        account = (user.email if user is not None else None) or user_id
        log.info("user %s started a TOTP enrolment", user_id)
        return JSONResponse(
            {
                "secret": secret,
                "provisioningUri": self.keys.provisioning_uri(secret, account),
                "issuer": self.keys.issuer,
                "digits": DIGITS,
                "period": PERIOD,
            },
            headers=_NO_STORE,
        )

    async def verify(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        user_id = str(claims["sub"])
        body = await read_body(request)
        code = string_field(body, "code", limit=64)
        stamp = self._reserve(user_id)
        codes = new_recovery_codes()
        outcome = "wrong"
        try:
            async with self.core._store().transaction() as tx:
                row = await tx.totp(user_id)
                if row is None or row.enabled_at is not None:
                    outcome = "not-pending"
                else:
                    step = self._step(row, code)
                    now = self.core._ms()
                    if step is not None and await tx.advance_totp(user_id, step, now):
                        await tx.replace_recovery_codes(user_id, [hash_recovery_code(c) for c in codes], now)
                        outcome = "ok"
        except BaseException:
            self.limiter.unhit(user_id, stamp)
            raise
        if outcome == "not-pending":
            self.limiter.unhit(user_id, stamp)
            raise AuthError(
                409,
                "MFA_NOT_PENDING",
                "there is no TOTP enrolment waiting for a code; start with /mfa/totp/enroll",
            )
        if outcome != "ok":
            raise _wrong_code()
        self.limiter.reset(user_id)
        log.info("user %s enabled TOTP", user_id)
        await self.core.audit.record(
            "mfa-enabled",
            actor=user_actor(user_id),
            subject=user_id,
            address=client_address(request),
            detail={"type": "totp"},
        )
        return JSONResponse({"enabled": True, "recoveryCodes": codes}, headers=_NO_STORE)

    async def disable(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        user_id = str(claims["sub"])
        body = await read_body(request, required=False)
        stamp = self._reserve(user_id)
        outcome = "ok"
        try:
            async with self.core._store().transaction() as tx:
                row = await tx.totp(user_id)
                if row is None:
                    outcome = "off"
                elif row.enabled_at is not None:
                    # An access token alone (a stolen one, say) must not switch the second factor off.
                    code, recovery = _second_factor(body)
                    if not await self._accept(tx, user_id, code, recovery):
                        outcome = "wrong"
                if outcome == "ok":
                    await tx.delete_totp(user_id)
        except BaseException:
            self.limiter.unhit(user_id, stamp)
            raise
        if outcome != "wrong":
            self.limiter.unhit(user_id, stamp)
        if outcome == "off":
            raise AuthError(409, "MFA_NOT_ENABLED", "TOTP is not enabled for this account")
        if outcome == "wrong":
            raise _wrong_code()
        log.info("user %s disabled TOTP", user_id)
        await self.core.audit.record(
            "mfa-disabled",
            actor=user_actor(user_id),
            subject=user_id,
            address=client_address(request),
            detail={"type": "totp"},
        )
        return Response(status_code=204, headers=_NO_STORE)


class _Spent(Exception):
    pass
