"""Password reset by email: ``POST /auth/password-reset/request {email}`` and
``POST /auth/password-reset/complete {token, password}``.

The request always answers 202 with the same body, before the address is even looked up: the lookup, the
token and the message happen in the background (``mailer``), so neither the answer nor its timing says
whether the address has an account. For an unknown address the background job still draws and hashes a token
and renders the message, then stores and sends nothing. Requests are limited per email address (counted
whether it has an account or not) and per client address (429 ``RATE_LIMITED``); at most
``RateLimits.email_requests`` messages per window reach one account (more are dropped silently).

The token is 32 random bytes sent only in the message; the store keeps its SHA-256, the account and the
address it went to. It works once, within ``password_reset_ttl`` seconds (30 minutes by default), and only
while the account still has that address. Completion checks the token first (a wrong one costs no password
hash and counts against ``RateLimits.token_attempts`` per client address), then in one transaction spends
it, sets the new password, revokes every session of the account (live sync connections are then closed with
``SESSION_REVOKED``), drops the account's other emailed tokens and marks the address verified (the message
reached it). 400 ``INVALID_RESET_TOKEN`` for an unknown, used or expired token.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from . import sessions as _sessions
from .audit import user_actor
from .email_tokens import (
    PASSWORD_RESET,
    VERIFY_EMAIL,
    EmailTokenRow,
    drop_user_tokens,
    insert_token,
    peek_token,
    take_token,
)
from .passwords import QueueFull, check_password_shape
from .tokens import hash_secret, new_refresh_token
from .verified_emails import mark_verified
from .web import AuthError, client_address, email_field, invalid, read_body, string_field

if TYPE_CHECKING:
    from .routes import AuthRoutes

__all__ = ["DEFAULT_RESET_TTL", "PasswordResetRoutes"]

log = logging.getLogger("offline.server.auth")

DEFAULT_RESET_TTL: Final = 30 * 60
_NO_STORE: Final = {"Cache-Control": "no-store"}
#: The one answer to every accepted request, whatever the address.
ACCEPTED_BODY: Final = {
    "status": "accepted",
    "message": "if an account uses this address, a message with a reset link is on its way",
}


def invalid_reset_token() -> AuthError:
    return AuthError(
        400,
        "INVALID_RESET_TOKEN",
        "the reset link is unknown, already used or expired; ask for a new one",
        field="token",
    )


class PasswordResetRoutes:
    """The ``/password-reset`` routes of an ``AuthRoutes``."""

    def __init__(self, core: AuthRoutes, *, ttl: int) -> None:
        self.core = core
        self.ttl = ttl

    def routes(self) -> list[BaseRoute]:
        h = self.core._handler
        return [
            Route("/password-reset/request", h(self.request), methods=["POST"]),
            Route("/password-reset/complete", h(self.complete), methods=["POST"]),
        ]

    async def request(self, request: Request) -> Response:
        core = self.core
        core.require_email("password reset")
        email = email_field(await read_body(request))
        address = client_address(request)
        limits = core.email_limits
        # Counted per address as typed: the same 429 for an address with or without an account.
        retry = max(
            (w for w in (limits.per_address.retry_after(address), limits.per_email.retry_after(email)) if w),
            default=None,
        )
        if retry is not None:
            log.warning("password reset request refused from %s: too many requests", address)
            raise core._rate_limited(retry, "password reset requests")
        limits.per_address.hit(address)
        limits.per_email.hit(email)
        core.mailer.submit(lambda: self._send(email, address), "password reset")
        return JSONResponse(ACCEPTED_BODY, status_code=202, headers=_NO_STORE)

    async def _send(self, email: str, address: str) -> None:
        core = self.core
        async with core._store().reader() as tx:
            user = await tx.user_by_email(email)
        token = new_refresh_token()
        token_hash = hash_secret(token)
        message = core.mailer.message(PASSWORD_RESET, email, token=token, expires_in=self.ttl)
        limits = core.email_limits.per_account
        sending = user is not None and limits.retry_after(user.id) is None
        await core.audit.record(
            "password-reset-requested",
            subject=None if user is None else user.id,
            address=address,
            detail={"email": email, "sent": sending},
        )
        if user is None:
            log.info("password reset requested for an address without an account: nothing sent")
            return
        if not sending:
            log.warning("password reset for user %s not sent: too many messages to this account", user.id)
            return
        limits.hit(user.id)
        now = core._ms()
        async with core._store().transaction() as tx:
            await insert_token(
                tx, EmailTokenRow(token_hash, PASSWORD_RESET, user.id, email, now, now + self.ttl * 1000)
            )
        await core.mailer.send(message)
        log.info("password reset message sent to user %s", user.id)

    async def complete(self, request: Request) -> Response:
        core = self.core
        body = await read_body(request)
        token = string_field(body, "token", limit=512)
        password = body.get("password")
        problem = check_password_shape(password)
        if problem is not None:
            raise invalid("password", problem)
        assert isinstance(password, str)
        address = client_address(request)
        failures = core.email_limits.token_failures
        retry = failures.retry_after(address)
        if retry is not None:
            log.warning("password reset refused from %s: too many invalid tokens", address)
            raise core._rate_limited(retry, "invalid reset links")
        token_hash = hash_secret(token)
        now = core._ms()
        async with core._store().reader() as tx:
            row = await peek_token(tx, token_hash)
        if row is None or row.purpose != PASSWORD_RESET or row.expires_at <= now:
            failures.hit(address)
            await self._failed(address, None if row is None else row.user_id)
            raise invalid_reset_token()
        try:
            password_hash = await core.passwords.hash(password, key=address)
        except QueueFull as full:
            raise core._busy(full) from None
        ended: list[str] = []
        async with core._store().transaction() as tx:
            row = await take_token(tx, token_hash)  # single use: a concurrent completion gets None
            user = None if row is None else await tx.user_by_id(row.user_id)
            valid = (
                row is not None
                and user is not None
                and row.purpose == PASSWORD_RESET
                and row.expires_at > core._ms()
                and user.email == row.email
            )
            if valid:
                assert row is not None and user is not None
                await tx.set_password_hash(user.id, password_hash)
                ended = await _sessions.live_session_ids(tx, user.id)
                await tx.revoke_user_sessions(user.id, core._ms(), "password reset")
                await drop_user_tokens(tx, user.id, PASSWORD_RESET)
                await drop_user_tokens(tx, user.id, VERIFY_EMAIL)  # the address is verified just below
                await mark_verified(tx, user.id, row.email, core._ms())
        if not valid:
            # The spent row stays spent (committed above): a token never works twice.
            failures.hit(address)
            await self._failed(address, None if row is None else row.user_id)
            raise invalid_reset_token()
        assert user is not None and user.email is not None
        core._announce_revoked(ended)
        # This address proved it owns the account: its failed sign-ins no longer hold the owner back.
        core.sign_in_limits.remember(user.email, address)
        log.info("user %s reset their password; %d session(s) revoked", user.id, len(ended))
        await core.audit.record(
            "password-reset",
            actor=user_actor(user.id),
            subject=user.id,
            address=address,
            detail={"sessionsRevoked": len(ended)},
        )
        return Response(status_code=204, headers=_NO_STORE)

    async def _failed(self, address: str, user_id: str | None) -> None:
        await self.core.audit.record(
            "password-reset-failed", subject=user_id, address=address, detail={"reason": "invalid-link"}
        )
