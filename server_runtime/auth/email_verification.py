"""Email verification: ``POST /auth/email/verify/request`` (Bearer) and ``POST /auth/email/verify {token}``,
the ``email_verified`` claim, and ``require_verified_email``.

A verification message goes out at sign-up (when an email sender is configured) and on request: the request
answers 202 ``{"emailVerified": false}`` and sends in the background, or 200 ``{"emailVerified": true}``
when there is nothing to verify; 400 ``NO_EMAIL`` for an account without an address; 429 after
``RateLimits.email_requests`` messages to the account within ``email_window``. The token is single use,
kept hashed, valid ``email_verification_ttl`` seconds (24 hours by default) and only for the address it was
sent to. ``POST /auth/email/verify`` needs no access token (the link may be opened on another device):
200 ``{"email", "emailVerified": true}``; 400 ``INVALID_VERIFICATION_TOKEN``.

Access tokens carry ``email_verified`` (true or false, as of their issue: refresh after verifying);
``GET /auth/me`` says ``emailVerified``. Changing an account's address makes it unverified (see
``verified_emails``); an account created through an OAuth provider starts verified when the provider says
``email_verified: true``.

``require_verified_email`` (``create_auth_routes``): False (default); True for both checks; ``"sign-in"``,
``"sync"`` or a list of them for one. ``sign-in``: a session is not started for an unverified account
(password, OAuth, second factor, passkey): 403 ``EMAIL_NOT_VERIFIED``, given only after the credentials were
right, and a fresh verification message is sent (within the account's limit); a sign-up then creates the
account, sends the message and answers 201 ``{user, emailVerified: false, emailVerificationRequired: true}``
without tokens. ``sync``: the sync handshake of an unverified account is refused with the connection error
``EMAIL_NOT_VERIFIED`` (read from the store at each handshake, so a verification counts at once). A token of an
external issuer (``external_issuers``) has no account here: its own ``email_verified`` claim decides, and a
token without that claim (or with anything but ``true``) is refused as not verified; ``/auth/me`` reports the
claim as ``emailVerified`` (false when absent). ``sign-in`` does not concern them (the provider signs them in).
Without an email sender only ``"sync"`` with external issuers may be required (their claim needs no message);
this server's own accounts then cannot verify, and the handshake's refusal says why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from offline.core.errors import OfflineError

from .audit import user_actor
from .email_tokens import VERIFY_EMAIL, EmailTokenRow, drop_user_tokens, insert_token, peek_token, take_token
from .storage import AuthTx, User
from .tokens import AUTH_CONFIG, hash_secret, new_refresh_token
from .verified_emails import is_verified, mark_verified
from .web import AuthError, client_address, read_body, string_field

if TYPE_CHECKING:
    from .routes import AuthRoutes

__all__ = [
    "DEFAULT_VERIFICATION_TTL",
    "EMAIL_NOT_VERIFIED",
    "EmailNotVerified",
    "EmailVerificationRoutes",
    "required_checks",
]

log = logging.getLogger("offline.server.auth")

DEFAULT_VERIFICATION_TTL: Final = 24 * 3600
EMAIL_NOT_VERIFIED: Final = "EMAIL_NOT_VERIFIED"
SIGN_IN: Final = "sign-in"
SYNC: Final = "sync"
_NO_STORE: Final = {"Cache-Control": "no-store"}


class EmailNotVerified(AuthError):
    """EMAIL_NOT_VERIFIED at sign-in (told only after the credentials were right)."""

    audit_reason = "email-not-verified"  # the reason of its sign-in-failed audit entry

    def __init__(self, user_id: str) -> None:
        self.user_id = user_id
        super().__init__(
            403,
            EMAIL_NOT_VERIFIED,
            "this account's email address is not verified yet; open the link in the verification message "
            "(a new one was just sent), then sign in again",
        )


def required_checks(value: bool | str | Iterable[str] | None) -> frozenset[str]:
    """``require_verified_email`` as the set of checks it turns on (``sign-in``, ``sync``)."""
    if value is None or value is False:
        return frozenset()
    if value is True:
        return frozenset({SIGN_IN, SYNC})
    names = [value] if isinstance(value, str) else list(value)
    unknown = [n for n in names if n not in (SIGN_IN, SYNC)]
    if unknown or not names:
        raise OfflineError(
            "require_verified_email must be True, False, 'sign-in', 'sync' or a list of those",
            AUTH_CONFIG,
            {"field": "require_verified_email"},
        )
    return frozenset(names)


def external_email_verified(claims: Mapping[str, Any]) -> bool:
    """Whether an external issuer's session claims say the address is verified (OpenID Connect's
    ``email_verified``; only a boolean true counts)."""
    return claims.get("email_verified") is True


def invalid_verification_token() -> AuthError:
    return AuthError(
        400,
        "INVALID_VERIFICATION_TOKEN",
        "the verification link is unknown, already used, expired or for another address; ask for a new one",
        field="token",
    )


class EmailVerificationRoutes:
    """The ``/email/verify`` routes of an ``AuthRoutes``, and its verified-email checks."""

    def __init__(self, core: AuthRoutes, *, ttl: int, required: frozenset[str]) -> None:
        self.core = core
        self.ttl = ttl
        self.required = required

    @property
    def for_sign_in(self) -> bool:
        return SIGN_IN in self.required

    @property
    def for_sync(self) -> bool:
        return SYNC in self.required

    def routes(self) -> list[BaseRoute]:
        h = self.core._handler
        return [
            Route("/email/verify/request", h(self.request), methods=["POST"]),
            Route("/email/verify", h(self.verify), methods=["POST"]),
        ]

    # -- sending ----------------------------------------------------------------------------------------------

    def send_later(self, user: User) -> bool:
        """Send ``user`` a verification message in the background; False when the account's limit is
        reached (or no sender is configured, or the account has no address)."""
        core = self.core
        limits = core.email_limits.per_account
        if not core.mailer.configured or user.email is None or limits.retry_after(user.id) is not None:
            return False
        limits.hit(user.id)
        core.mailer.submit(lambda: self._send(user.id, str(user.email)), "email verification")
        return True

    async def _send(self, user_id: str, email: str) -> None:
        core = self.core
        token = new_refresh_token()
        now = core._ms()
        async with core._store().transaction() as tx:
            await insert_token(
                tx,
                EmailTokenRow(hash_secret(token), VERIFY_EMAIL, user_id, email, now, now + self.ttl * 1000),
            )
        await core.mailer.send(core.mailer.message(VERIFY_EMAIL, email, token=token, expires_in=self.ttl))
        log.info("verification message sent to user %s", user_id)

    # -- checks -----------------------------------------------------------------------------------------------

    async def check_sign_in(self, tx: AuthTx, user: User) -> None:
        """Raise EMAIL_NOT_VERIFIED (sending a fresh message) when sign-in needs a verified address."""
        if self.for_sign_in and not await is_verified(tx, user):
            self.send_later(user)
            log.info("sign-in of user %s refused: email not verified", user.id)
            raise EmailNotVerified(user.id)

    async def check_sync(self, claims: dict[str, Any]) -> None:
        """Raise ``OfflineError(EMAIL_NOT_VERIFIED)`` when sync needs a verified address the user lacks."""
        if not self.for_sync:
            return
        async with self.core._store().reader() as tx:
            user = await tx.user_by_id(str(claims.get("sub")))
            verified = user is not None and await is_verified(tx, user)
        if not verified:
            if not self.core.mailer.configured:
                raise OfflineError(
                    "this account's email address is not verified, and this server has no email sender to "
                    "send the link (its operator must set OFFLINE_SMTP_URL, or pass email_sender to "
                    "create_auth_routes); sign in through the identity provider instead",
                    EMAIL_NOT_VERIFIED,
                    {},
                )
            raise OfflineError(
                "this account's email address is not verified; open the link in the verification message "
                "(ask for a new one with request_email_verification), then reconnect",
                EMAIL_NOT_VERIFIED,
                {},
            )

    def check_external_sync(self, claims: Mapping[str, Any]) -> None:
        """Raise ``OfflineError(EMAIL_NOT_VERIFIED)`` when sync needs a verified address and an external
        issuer's token does not say ``email_verified: true``. There is no account here to verify: the identity
        provider is the only source, so a claim that is absent (or not a boolean) counts as not verified."""
        if self.for_sync and not external_email_verified(claims):
            raise OfflineError(
                "the identity provider does not say this user's email address is verified "
                "(email_verified is not true in its token); verify it with the provider, then reconnect",
                EMAIL_NOT_VERIFIED,
                {},
            )

    # -- routes -----------------------------------------------------------------------------------------------

    async def request(self, request: Request) -> Response:
        core = self.core
        core.require_email("email verification")
        claims = await core._claims(request)
        async with core._store().reader() as tx:
            user = await tx.user_by_id(str(claims["sub"]))
            verified = user is not None and await is_verified(tx, user)
        if user is None:
            raise AuthError(401, "AUTH_FAILED", "the account no longer exists; sign in again")
        if verified:
            return JSONResponse({"emailVerified": True}, headers=_NO_STORE)
        if user.email is None:
            raise AuthError(
                400,
                "NO_EMAIL",
                "this account has no email address to verify (it signed up through a provider)",
            )
        address = client_address(request)
        retry = core.email_limits.per_address.retry_after(address)
        if retry is None:
            retry = core.email_limits.per_account.retry_after(user.id)
        if retry is not None:
            raise core._rate_limited(retry, "verification messages")
        core.email_limits.per_address.hit(address)
        self.send_later(user)
        return JSONResponse({"emailVerified": False}, status_code=202, headers=_NO_STORE)

    async def verify(self, request: Request) -> Response:
        core = self.core
        token = string_field(await read_body(request), "token", limit=512)
        address = client_address(request)
        failures = core.email_limits.token_failures
        retry = failures.retry_after(address)
        if retry is not None:
            raise core._rate_limited(retry, "invalid verification links")
        async with core._store().transaction() as tx:
            token_hash = hash_secret(token)
            row = await peek_token(tx, token_hash)
            # Taken only when it is a verification token: a reset link pasted here stays usable.
            row = (
                await take_token(tx, token_hash) if row is not None and row.purpose == VERIFY_EMAIL else None
            )
            user = None if row is None else await tx.user_by_id(row.user_id)
            valid = (
                row is not None
                and user is not None
                and row.purpose == VERIFY_EMAIL
                and row.expires_at > core._ms()
                and user.email == row.email
            )
            if valid:
                assert row is not None
                await mark_verified(tx, row.user_id, row.email, core._ms())
                await drop_user_tokens(tx, row.user_id, VERIFY_EMAIL)
        if not valid:
            failures.hit(address)
            raise invalid_verification_token()
        assert row is not None
        log.info("user %s verified their email address", row.user_id)
        await core.audit.record(
            "email-verified",
            actor=user_actor(row.user_id),
            subject=row.user_id,
            address=address,
            detail={"email": row.email},
        )
        return JSONResponse({"email": row.email, "emailVerified": True}, headers=_NO_STORE)
