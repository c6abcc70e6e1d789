"""The ``/auth`` routes and the sync auth provider (the HTTP contract is in the package docstring).

State lives in the server's store (``ServerStore.auth_store()``): ``create_production_server(auth_routes=...)``
attaches the routes to it. Token checks, password hashing and rate limits are in their own modules; this one
turns requests into store transactions and answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import enum
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from argon2 import PasswordHasher
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, Router

from offline.core.errors import STORAGE_ERROR, OfflineError
from offline.core.uuid7 import generate_uuid_v7
from offline.sync.protocol import OVERLOADED, USER_DISABLED

from ..live_sessions import SessionBinding
from . import accounts as _accounts
from . import oauth as _oauth
from . import sessions as _sessions
from .attempts import SharedAttempts
from .audit import AuditLog, AuditRetention, user_actor
from .devices import DeviceTokens
from .email_tokens import purge_tokens
from .email_verification import (
    DEFAULT_VERIFICATION_TTL,
    EMAIL_NOT_VERIFIED,
    EmailNotVerified,
    EmailVerificationRoutes,
    external_email_verified,
    required_checks,
)
from .external_issuers import ExternalIssuers, external_issuers_from
from .jwks import KeysUnavailable
from .linking import LinkRoutes
from .mailer import AuthMailer, EmailLimits
from .mfa import MfaRoutes
from .orgs import OrgRoutes, current_org_claims, org_claims, roles_from
from .passkeys import PasskeyRoutes, passkey_config_from
from .password_reset import DEFAULT_RESET_TTL, PasswordResetRoutes
from .passwords import MAX_PASSWORD_CHARS, PasswordService, QueueFull, check_password_shape
from .rate_limit import RateLimits, SlidingWindow, rate_limits_from, retry_after_header
from .sign_in_limits import Reservation, SignInLimiter
from .storage import (
    AuthStore,
    AuthTx,
    Identity,
    OAuthStateRow,
    PostgresAuthStore,
    RefreshRow,
    SessionRow,
    User,
)
from .tokens import AUTH_CONFIG, InvalidToken, TokenService, hash_secret, new_refresh_token
from .verified_emails import is_verified, mark_verified
from .web import AuthError, normalize_email
from .web import auth_failed as _auth_failed
from .web import bearer as _bearer
from .web import client_address as _client_address
from .web import email_field as _email_field
from .web import invalid as _invalid
from .web import iso as _iso
from .web import read_body as _body
from .web import seconds_option as _seconds
from .web import string_field as _string_field

if TYPE_CHECKING:
    from ..email.sender import EmailSender
    from ..email.templates import EmailTemplates
    from ..stores.base import ServerStore

__all__ = ["AuthRoutes", "SyncAuthProvider", "create_auth_routes"]

log = logging.getLogger("offline.server.auth")

DEFAULT_ACCESS_TTL: Final = 15 * 60
DEFAULT_REFRESH_TTL: Final = 30 * 24 * 3600
OAUTH_STATE_TTL: Final = 10 * 60
_PURGE_EVERY: Final = 3600.0

# One body for an unknown email and a wrong password alike (and for accounts without a password).
_BAD_CREDENTIALS: Final = AuthError(
    401, "INVALID_CREDENTIALS", "the email or password is wrong; check both and try again"
)


class UserDisabled(AuthError):
    """USER_DISABLED: an administrator disabled the account (told only after the credentials were right)."""

    audit_reason = "user-disabled"  # the reason of its sign-in-failed audit entry

    def __init__(self, user_id: str) -> None:
        super().__init__(
            403,
            "USER_DISABLED",
            "this account is disabled; ask the application's administrator to enable it again",
        )
        self.user_id = user_id


#: The reason ``verify_access_token`` gives when the token's account is disabled (the handshake says so).
DISABLED_REASON: Final = "account disabled"


def _invalid_refresh() -> AuthError:
    return AuthError(
        401,
        "INVALID_REFRESH_TOKEN",
        "the refresh token is unknown, expired or revoked; sign in again",
    )


@dataclass(frozen=True, slots=True)
class _Pair:
    user: User
    session_id: str
    refresh_token: str
    claims: dict[str, Any] = field(default_factory=dict)  # extra access-token claims (organizations)


class _Keep(enum.Enum):
    ORG = "keep"


#: ``rotate``'s ``org_id`` when the refresh leaves the session's active organization as it is.
KEEP_ORG: Final = _Keep.ORG
DEFAULT_INVITE_TTL: Final = 7 * 24 * 3600


# -- the routes -----------------------------------------------------------------------------------------------


class AuthRoutes:
    """Sign-up, sign-in, refresh, sign-out, revocation, ``/me`` and OAuth; mount ``.routes`` (or ``.app``)
    at ``/auth``. Build with ``create_auth_routes``."""

    def __init__(
        self,
        *,
        secret: str | bytes,
        oauth_providers: Mapping[str, Mapping[str, Any]] | None = None,
        access_ttl: float | datetime.timedelta = DEFAULT_ACCESS_TTL,
        refresh_ttl: float | datetime.timedelta = DEFAULT_REFRESH_TTL,
        rate_limits: RateLimits | Mapping[str, Any] | None = None,
        password_hasher: PasswordHasher | None = None,
        roles: Sequence[str] | None = None,
        invite_ttl: float | datetime.timedelta = DEFAULT_INVITE_TTL,
        passkeys: Mapping[str, Any] | None = None,
        totp_issuer: str = "offline",
        audit_retention: AuditRetention | None = None,
        external_issuers: Sequence[Any] | None = None,
        email_sender: EmailSender | None = None,
        email_templates: EmailTemplates | str | None = None,
        app_url: str | None = None,
        require_verified_email: bool | str | Sequence[str] = False,
        password_reset_ttl: float | datetime.timedelta = DEFAULT_RESET_TTL,
        email_verification_ttl: float | datetime.timedelta = DEFAULT_VERIFICATION_TTL,
        now: Callable[[], float] | None = None,
    ) -> None:
        self._now = now or time.time
        issuers = external_issuers_from(external_issuers)
        #: Verifier of external OpenID Connect issuers' tokens (sync and /me); None when none are configured.
        self.external = ExternalIssuers(issuers, now=self._now) if issuers else None
        self.access_ttl = _seconds(access_ttl, "access_ttl")
        self.refresh_ttl = _seconds(refresh_ttl, "refresh_ttl")
        self.tokens = TokenService(secret, access_ttl=self.access_ttl, now=self._now)
        self.providers = _oauth.providers_from(oauth_providers)
        self.rate_limits = limits = rate_limits_from(rate_limits)
        self.passwords = PasswordService(
            password_hasher,
            waiting=limits.password_checks_waiting,
            per_key=limits.password_checks_per_address,
        )
        self.sign_in_limits = SignInLimiter(limits)
        # Passkey sign-ins count their failures per address too, in the same window.
        self.address_limiter = self.sign_in_limits.address
        self.sign_up_limiter = SlidingWindow(limits.sign_up_attempts, limits.sign_up_window)
        self.roles = roles_from(roles)
        if not isinstance(totp_issuer, str) or not totp_issuer.strip() or ":" in totp_issuer:
            raise OfflineError(
                "totp_issuer must be a non-empty name without ':' (authenticator apps show it)",
                AUTH_CONFIG,
                {"field": "totp_issuer"},
            )
        self.server_store: ServerStore | None = None
        # Told the ids of sessions revoked through these routes, after the revocation commits (live sync
        # sessions of theirs are then ended; see server_runtime.live_sessions).
        self._revocation_listeners: list[Callable[[list[str]], None]] = []
        self._shared: SharedAttempts | Literal[False] | None = None  # None: not decided yet
        self._next_purge = 0.0
        self._provider = SyncAuthProvider(self)
        #: The audit log of security events (``server_runtime.auth.audit``): ``await audit.record(kind, ...)``.
        self.audit = AuditLog(self._store, retention=audit_retention, now=self._now)
        key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
        self.devices = DeviceTokens(key, now=self._now)
        self.mfa = MfaRoutes(self, key=key, issuer=totp_issuer.strip())
        self.orgs = OrgRoutes(self, roles=self.roles, invite_ttl=_seconds(invite_ttl, "invite_ttl"))
        self.linking = LinkRoutes(self)
        self.passkeys = PasskeyRoutes(self, passkey_config_from(passkeys))
        self.mailer = _mailer(email_sender, email_templates, app_url)
        self.email_limits = EmailLimits(
            limits.email_requests,
            limits.email_requests_per_address,
            limits.email_window,
            limits.token_attempts,
            limits.token_window,
        )
        self.password_reset = PasswordResetRoutes(
            self, ttl=_seconds(password_reset_ttl, "password_reset_ttl")
        )
        checks = required_checks(require_verified_email)
        # Verifying this server's own accounts takes a message with a link. An external issuer's token is
        # judged by its own email_verified claim: requiring a verified address for sync with external
        # issuers needs no sender (this server's accounts then cannot verify, and their refusal says so).
        if checks and email_sender is None and not (checks == {"sync"} and issuers):
            raise OfflineError(
                f"require_verified_email={require_verified_email!r} needs an email_sender to send this server's "
                "accounts their verification links: pass email_sender to create_auth_routes (SmtpEmailSender; "
                "a server built from the environment takes OFFLINE_SMTP_URL and OFFLINE_EMAIL_FROM). Only "
                'require_verified_email="sync" with external_issuers (OFFLINE_JWT_ISSUERS) works without one: '
                "those tokens' own email_verified claim decides",
                AUTH_CONFIG,
                {"field": "email_sender"},
            )
        self.email_verification = EmailVerificationRoutes(
            self, ttl=_seconds(email_verification_ttl, "email_verification_ttl"), required=checks
        )
        self.routes: list[BaseRoute] = [
            Route("/sign-up", self._handler(self.sign_up), methods=["POST"]),
            Route("/sign-in", self._handler(self.sign_in), methods=["POST"]),
            Route("/refresh", self._handler(self.refresh), methods=["POST"]),
            Route("/sign-out", self._handler(self.sign_out), methods=["POST"]),
            Route("/revoke", self._handler(self.revoke), methods=["POST"]),
            Route("/me", self._handler(self.me), methods=["GET"]),
            Route("/oauth/{provider}/authorize", self._handler(self.oauth_authorize), methods=["GET"]),
            Route("/oauth/{provider}/callback", self._handler(self.oauth_callback), methods=["POST"]),
            *self.mfa.routes(),
            *self.orgs.routes(),
            *self.linking.routes(),
            *self.passkeys.routes(),
            *self.password_reset.routes(),
            *self.email_verification.routes(),
        ]
        #: The routes as one ASGI app, for mounting at ``/auth`` in another application.
        self.app = Router(routes=self.routes)

    def __repr__(self) -> str:
        return (
            f"AuthRoutes(providers={sorted(self.providers)}, passkeys={self.passkeys.config is not None}, "
            f"bound={self.server_store is not None})"
        )

    # -- wiring ---------------------------------------------------------------------------------------------------

    def bind_server_store(self, store: ServerStore) -> None:
        """Keep auth data in ``store`` (``create_production_server`` calls this)."""
        if self.server_store is not None and self.server_store is not store:
            raise OfflineError(
                "these auth routes already keep their data in another server store; "
                "create one create_auth_routes(...) per server",
                AUTH_CONFIG,
                {"field": "auth_routes"},
            )
        self.server_store = store

    def to_sync_auth_provider(self) -> SyncAuthProvider:
        """The provider for ``sync_options={"auth": ...}``: accepts valid, unrevoked access tokens."""
        return self._provider

    def close(self) -> None:
        """Release the password-hashing threads (they are started again on demand) and cancel emails not
        sent yet."""
        self.passwords.close()
        self.mailer.close()

    def require_email(self, what: str) -> None:
        """503 EMAIL_NOT_CONFIGURED when no email sender was given (``what`` needs one)."""
        if not self.mailer.configured:
            raise AuthError(
                503,
                "EMAIL_NOT_CONFIGURED",
                f"{what} needs email, and this server has no email sender; its operator must set "
                "OFFLINE_SMTP_URL (or pass email_sender to create_auth_routes)",
            )

    def subscribe_revocations(self, listener: Callable[[list[str]], None]) -> None:
        if listener not in self._revocation_listeners:
            self._revocation_listeners.append(listener)

    def unsubscribe_revocations(self, listener: Callable[[list[str]], None]) -> None:
        with contextlib.suppress(ValueError):
            self._revocation_listeners.remove(listener)

    def _announce_revoked(self, session_ids: list[str]) -> None:
        if not session_ids:
            return
        for listener in list(self._revocation_listeners):
            try:
                listener(session_ids)
            except Exception:
                log.exception("a revocation listener failed")

    async def ended_sessions(self, session_ids: Sequence[str]) -> set[str]:
        """The ids among ``session_ids`` whose sessions are revoked or gone (read from the store, so
        revocations by other server processes sharing it count too)."""
        async with self._store().reader() as tx:
            return await _sessions.ended_sessions(tx, session_ids)

    def _store(self) -> AuthStore:
        if self.server_store is None:
            raise OfflineError(
                "the auth routes are not attached to a server store; pass auth_routes=... to "
                "create_production_server, or call bind_server_store(store)",
                AUTH_CONFIG,
                {"field": "auth_routes"},
            )
        return self.server_store.auth_store()

    def _ms(self) -> int:
        return int(self._now() * 1000)

    def _handler(
        self, method: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                await self._maybe_purge()
                return await method(request)
            except (UserDisabled, EmailNotVerified) as exc:
                await self.audit.record(
                    "sign-in-failed",
                    subject=exc.user_id,
                    address=_client_address(request),
                    detail={"reason": exc.audit_reason, "path": request.url.path},
                )
                return exc.response()
            except AuthError as exc:
                return exc.response()
            except OfflineError as exc:
                # Storage trouble (or a route used before it was attached). The details go to the log; the
                # client learns only that it may retry.
                log.error("auth request %s failed: [%s] %s", request.url.path, exc.code, exc.message)
                return AuthError(
                    503, "SERVICE_UNAVAILABLE", "the server could not complete the request; try again shortly"
                ).response()

        return endpoint

    async def _maybe_purge(self) -> None:
        clock = time.monotonic()
        if clock < self._next_purge or self.server_store is None:
            return
        self._next_purge = clock + _PURGE_EVERY
        async with self._store().transaction() as tx:
            await tx.purge(self._ms(), keep_revoked_ms=self.access_ttl * 1000)
            await purge_tokens(tx, self._ms())
        shared = self._shared_attempts()
        if shared is not None:
            longest = max(self.rate_limits.account_window, self.rate_limits.address_window)
            await shared.purge(self._ms() - int(longest * 1000))

    # -- tokens ----------------------------------------------------------------------------------------------------

    async def verify_access_token(self, token: str | None, *, current_orgs: bool = False) -> dict[str, Any]:
        """Claims of a valid access token whose session is live; raises ``InvalidToken`` otherwise. With
        ``current_orgs`` the org claims are replaced by what the store says now (see ``orgs``)."""
        claims = self.tokens.verify_access(token)
        async with self._store().reader() as tx:
            session = await tx.session(str(claims["sid"]))
            if session is None or session.revoked_at is not None or session.user_id != claims["sub"]:
                # Disabling revokes every session: say why, so the client stops instead of signing in again.
                if await _accounts.disabled(tx, str(claims["sub"])) is not None:
                    raise InvalidToken(DISABLED_REASON)
                raise InvalidToken("session revoked")
            if current_orgs:
                claims = await current_org_claims(tx, claims)
        return claims

    async def external_claims(self, token: str | None) -> dict[str, Any] | None:
        """Session claims of a valid token of a configured external issuer, None for a token that does not
        name an external issuer (``server_runtime.auth.external_issuers``); raises ``InvalidToken``."""
        if self.external is None or not self.external.claims_external(token):
            return None
        assert token is not None
        claims = await self.external.verify(token)
        async with self._store().reader() as tx:
            # Scope values come from the user id (userId <- sub): an external user named like a native user
            # (a provider letting users choose the claimed id) would see that user's records.
            if await tx.user_by_id(str(claims["sub"])) is not None:
                raise InvalidToken(f"the user id of a token of {claims['iss']} is a native user's id")
        return claims

    async def _claims(self, request: Request) -> dict[str, Any]:
        try:
            return await self.verify_access_token(_bearer(request))
        except InvalidToken as exc:
            log.info("auth request %s refused: %s", request.url.path, exc.reason)
            raise _auth_failed() from None

    async def _open_session(self, tx: AuthTx, user: User) -> _Pair:
        """A new session of ``user`` and its first refresh token (no organization is active yet); refused with
        USER_DISABLED (rolling the caller's transaction back) when the account is disabled, or
        EMAIL_NOT_VERIFIED when sign-in needs a verified address (``email_verification``)."""
        await self.refuse_disabled(tx, user.id)
        await self.email_verification.check_sign_in(tx, user)
        now = self._ms()
        session_id = generate_uuid_v7()
        await tx.insert_session(SessionRow(session_id, user.id, now))
        refresh = new_refresh_token()
        await tx.insert_refresh(
            RefreshRow(
                hash_secret(refresh), session_id, session_id, user.id, now, now + self.refresh_ttl * 1000
            )
        )
        return _Pair(user, session_id, refresh, await self._claims_of(tx, user, session_id))

    async def _claims_of(self, tx: AuthTx, user: User, session_id: str) -> dict[str, Any]:
        """The access token's claims beyond the standard ones: organizations and ``email_verified``."""
        claims = await org_claims(tx, user.id, session_id)
        claims["email_verified"] = await is_verified(tx, user)
        return claims

    async def refuse_disabled(self, tx: AuthTx, user_id: str) -> None:
        """Raise USER_DISABLED when an administrator disabled the account (and INVALID_CREDENTIALS when it was
        deleted meanwhile). Locks the user's row for the rest of the transaction (``accounts.lock_user``)."""
        if not await _accounts.lock_user(tx, user_id):
            raise _BAD_CREDENTIALS
        if await _accounts.disabled(tx, user_id) is not None:
            raise UserDisabled(user_id)

    def _pair_response(self, pair: _Pair, status: int = 200) -> Response:
        access = self.tokens.issue_access(
            user_id=pair.user.id, email=pair.user.email, session_id=pair.session_id, extra=pair.claims
        )
        body: dict[str, Any] = {
            "user": {"id": pair.user.id, "email": pair.user.email},
            "accessToken": access.token,
            "refreshToken": pair.refresh_token,
            "tokenType": "Bearer",
            "expiresIn": access.expires_in,
            "refreshExpiresIn": self.refresh_ttl,
        }
        if pair.user.email is not None:
            # This device now knows the account: see devices (a sign-in that sends it back is not held to
            # the account's limit over all addresses).
            body["deviceToken"] = self.devices.issue(pair.user.email)
        return JSONResponse(
            body,
            status_code=status,
            headers={"Cache-Control": "no-store"},
        )

    def _rate_limited(self, retry: float, what: str) -> AuthError:
        return AuthError(
            429,
            "RATE_LIMITED",
            f"too many {what}; wait {retry_after_header(retry)} seconds and try again",
            headers={"Retry-After": retry_after_header(retry)},
        )

    def _shared_attempts(self) -> SharedAttempts | None:
        """Attempt windows in the database, when it is one several processes may share (PostgreSQL)."""
        if self._shared is None:
            store = self._store()
            self._shared = SharedAttempts(store) if isinstance(store, PostgresAuthStore) else False
        return self._shared or None

    async def _take_back(self, shared: SharedAttempts | None, reservation: str | None, *reset: str) -> None:
        if shared is None or reservation is None:
            return
        try:
            await asyncio.shield(shared.take_back(reservation, reset=reset))
        except OfflineError as exc:  # the attempt stays counted until it leaves its window
            log.warning("could not take back a sign-in attempt: [%s] %s", exc.code, exc.message)

    def _busy(self, full: QueueFull) -> AuthError:
        """The answer when a password check finds no room in the queue: at once, never a long wait."""
        wait = retry_after_header(full.retry_after)
        if full.per_key:
            return AuthError(
                429,
                "RATE_LIMITED",
                f"too many sign-ins at once from this address; wait {wait} seconds and try again",
                headers={"Retry-After": wait},
            )
        return AuthError(
            503,
            "SERVICE_UNAVAILABLE",
            f"the server is checking too many passwords right now; try again in {wait} seconds",
            headers={"Retry-After": wait},
        )

    # -- email and password ----------------------------------------------------------------------------------------

    async def sign_up(self, request: Request) -> Response:
        body = await _body(request)
        email = _email_field(body)
        password = body.get("password")
        problem = check_password_shape(password)
        if problem is not None:
            raise _invalid("password", problem)
        assert isinstance(password, str)
        address = _client_address(request)
        retry = self.sign_up_limiter.retry_after(address)
        if retry is not None:
            log.warning("sign-up refused: too many sign-ups from %s", address)
            raise self._rate_limited(retry, "sign-ups from this address")
        stamp = self.sign_up_limiter.hit(address)
        try:
            password_hash = await self.passwords.hash(password, key=address)
        except QueueFull as full:
            self.sign_up_limiter.unhit(address, stamp)  # nothing was hashed: the sign-up does not count
            raise self._busy(full) from None
        verification = self.email_verification
        async with self._store().transaction() as tx:
            user = User(generate_uuid_v7(), email, password_hash, self._ms())
            if not await tx.insert_user(user):
                raise AuthError(
                    409,
                    "EMAIL_TAKEN",
                    "an account with this email already exists; sign in instead",
                    field="email",
                )
            # Sign-in needs a verified address: the account is created without a session.
            pair = None if verification.for_sign_in else await self._open_session(tx, user)
        self.sign_in_limits.remember(email, address)
        verification.send_later(user)
        if pair is None:
            log.info("user %s signed up (verification required before sign-in)", user.id)
            return JSONResponse(
                {
                    "user": {"id": user.id, "email": user.email},
                    "emailVerified": False,
                    "emailVerificationRequired": True,
                },
                status_code=201,
                headers={"Cache-Control": "no-store"},
            )
        log.info("user %s signed up (session %s)", user.id, pair.session_id)
        await self.audit.record(
            "sign-up", actor=user_actor(user.id), subject=user.id, address=address, detail={"email": email}
        )
        return self._pair_response(pair, 201)

    async def sign_in(self, request: Request) -> Response:
        body = await _body(request)
        email = _email_field(body)
        password = body.get("password")
        if not isinstance(password, str) or not password:
            raise _invalid("password", "password is required (a non-empty string)")
        if len(password) > MAX_PASSWORD_CHARS:
            raise _invalid("password", f"password must be at most {MAX_PASSWORD_CHARS} characters long")
        device = body.get("deviceToken")
        if device is not None and not isinstance(device, str):
            raise _invalid("deviceToken", "deviceToken must be the string a previous sign-in returned")
        known_device = (
            self.devices.device_id(device)
            if isinstance(device, str) and self.devices.valid_for(device, email)
            else None
        )
        address = _client_address(request)
        # Counted before the check, with no await in between: concurrent guesses cannot all pass the limit.
        reservation = self.sign_in_limits.reserve(email, address, device=known_device)
        if not isinstance(reservation, Reservation):
            log.warning("sign-in refused from %s: too many failed attempts", address)
            raise self._rate_limited(reservation, "failed sign-ins")
        shared = self._shared_attempts()
        shared_id: str | None = None
        try:
            if shared is not None:  # other processes serve this database too: count there as well
                outcome = await shared.reserve(self.sign_in_limits.shared_windows(reservation), self._ms())
                if not isinstance(outcome, str):
                    reservation.cancelled()
                    log.warning("sign-in refused from %s: too many failed attempts", address)
                    raise self._rate_limited(outcome, "failed sign-ins")
                shared_id = outcome
            async with self._store().reader() as tx:
                user = await tx.user_by_email(email)
            # Unknown accounts cost one argon2 verification too (against a dummy hash): same answer, same time.
            stored = user.password_hash if user is not None else None
            matches = await self.passwords.verify(stored, password, key=address)
        except QueueFull as full:
            reservation.cancelled()
            await self._take_back(shared, shared_id)
            raise self._busy(full) from None
        except AuthError:
            raise
        except BaseException:
            reservation.cancelled()  # the password was not checked (storage trouble, a client gone)
            await self._take_back(shared, shared_id)
            raise
        if user is None or not matches:
            reservation.failed()
            log.info("sign-in failed from %s", address)
            await self.audit.record(
                "sign-in-failed",
                subject=None if user is None else user.id,
                address=address,
                detail={"email": email, "method": "password", "reason": "invalid-credentials"},
            )
            raise _BAD_CREDENTIALS
        reservation.succeeded()
        await self._take_back(shared, shared_id, self.sign_in_limits.shared_pair_key(reservation))
        upgraded = None
        if user.password_hash is not None and self.passwords.needs_rehash(user.password_hash):
            # Hashed before the transaction (it holds the store's write lock); skipped when the queue is full.
            with contextlib.suppress(QueueFull):
                upgraded = await self.passwords.hash(password, key=address)
        async with self._store().transaction() as tx:
            if upgraded is not None:
                await tx.set_password_hash(user.id, upgraded)
            await self.refuse_disabled(tx, user.id)
            second_factor = await self.mfa.required(tx, user, "password")
            if second_factor is not None:
                return second_factor
            pair = await self._open_session(tx, user)
        log.info("user %s signed in (session %s)", user.id, pair.session_id)
        await self.audit.record(
            "sign-in",
            actor=user_actor(user.id),
            subject=user.id,
            address=address,
            detail={"method": "password", "session": pair.session_id},
        )
        return self._pair_response(pair)

    # -- refresh, sign-out, revocation --------------------------------------------------------------------------

    async def refresh(self, request: Request) -> Response:
        body = await _body(request)
        token = _string_field(body, "refreshToken")
        if "orgId" not in body:
            return await self.rotate(token, KEEP_ORG)
        org_id = body["orgId"]
        if org_id is not None and (not isinstance(org_id, str) or not org_id or len(org_id) > 64):
            raise _invalid("orgId", "orgId must be the id of one of your organizations, or null for none")
        return await self.rotate(token, org_id)

    async def rotate(self, token: str, org_id: str | _Keep | None) -> Response:
        """Exchange a refresh token for a new pair; ``org_id`` makes that organization the session's active
        one (None: no active organization; ``KEEP_ORG``: unchanged, provided the user is still a member)."""
        token_hash = hash_secret(token)
        now = self._ms()
        outcome: str
        pair: _Pair | None = None
        # The transaction decides and commits in one go, including the revocation on reuse (an error
        # raised inside it would roll that back), so it returns its verdict instead of raising.
        async with self._store().transaction() as tx:
            row = await tx.refresh(token_hash)
            session = await tx.session(row.session_id) if row is not None else None
            if row is None or session is None:
                outcome = "invalid"
            elif await _accounts.disabled(tx, row.user_id) is not None:
                outcome = "disabled"
            elif row.used_at is not None:
                await tx.revoke_session(row.session_id, now, "refresh token reused")
                outcome = "reused"
            elif session.revoked_at is not None or row.expires_at <= now:
                outcome = "invalid"
            elif isinstance(org_id, str) and await tx.membership(org_id, row.user_id) is None:
                outcome = "not-member"  # the token stays unused: the client may retry without orgId
            elif not await tx.mark_refresh_used(token_hash, now):  # a concurrent request used it first
                await tx.revoke_session(row.session_id, now, "refresh token reused")
                outcome = "reused"
            else:
                user = await tx.user_by_id(row.user_id)
                if user is None:
                    outcome = "invalid"
                else:
                    refresh = new_refresh_token()
                    await tx.insert_refresh(
                        RefreshRow(
                            hash_secret(refresh),
                            row.family_id,
                            row.session_id,
                            row.user_id,
                            now,
                            now + self.refresh_ttl * 1000,
                        )
                    )
                    if not isinstance(org_id, _Keep):
                        await tx.set_active_org(row.session_id, org_id)
                    claims = await self._claims_of(tx, user, row.session_id)
                    pair = _Pair(user, row.session_id, refresh, claims)
                    outcome = "ok"
        if outcome == "reused":
            assert row is not None
            self._announce_revoked([row.session_id])
            log.warning(
                "refresh token reuse detected: session %s of user %s revoked", row.session_id, row.user_id
            )
            await self.audit.record(
                "refresh-reused", subject=row.user_id, detail={"session": row.session_id, "revoked": True}
            )
            raise AuthError(
                401,
                "REFRESH_TOKEN_REUSED",
                "this refresh token was already used, so the session has been revoked; sign in again",
            )
        if outcome == "disabled":
            assert row is not None
            raise UserDisabled(row.user_id)
        if outcome == "not-member":
            raise AuthError(
                404, "ORG_NOT_FOUND", "no such organization among yours; check the id (GET /auth/orgs)"
            )
        if pair is None:
            raise _invalid_refresh()
        return self._pair_response(pair)

    async def sign_out(self, request: Request) -> Response:
        body = await _body(request, required=False)
        token = body.get("refreshToken")
        bearer = _bearer(request)
        if token is not None and (not isinstance(token, str) or not token):
            raise _invalid("refreshToken", "refreshToken must be a non-empty string")
        if token is None and bearer is None:
            raise _invalid("refreshToken", "send the refreshToken (or an access token as Bearer) to sign out")
        sessions: set[str] = set()
        users: set[str] = set()
        if bearer is not None:
            # The signature proves the session is the caller's; a revoked one needs no second revocation.
            with contextlib.suppress(InvalidToken):
                claims = self.tokens.verify_access(bearer)
                sessions.add(str(claims["sid"]))
                users.add(str(claims["sub"]))
        now = self._ms()
        async with self._store().transaction() as tx:
            if token is not None:
                row = await tx.refresh(hash_secret(token))
                if row is not None:
                    sessions.add(row.session_id)
                    users.add(row.user_id)
            revoked = [sid for sid in sorted(sessions) if await tx.revoke_session(sid, now, "signed out")]
        for sid in revoked:
            log.info("session %s signed out", sid)
        self._announce_revoked(revoked)
        if revoked:
            for user_id in sorted(users):
                await self.audit.record(
                    "sign-out",
                    actor=user_actor(user_id),
                    subject=user_id,
                    address=_client_address(request),
                    detail={"sessions": revoked},
                )
        return Response(status_code=204, headers={"Cache-Control": "no-store"})

    async def revoke(self, request: Request) -> Response:
        claims = await self._claims(request)
        body = await _body(request, required=False)
        everything = body.get("all", False)
        if not isinstance(everything, bool):
            raise _invalid("all", "all must be true or false")
        now = self._ms()
        async with self._store().transaction() as tx:
            if everything:
                ended = await _sessions.live_session_ids(tx, str(claims["sub"]))
                count = await tx.revoke_user_sessions(str(claims["sub"]), now, "revoked by the user")
            else:
                ended = [str(claims["sid"])]
                count = int(await tx.revoke_session(str(claims["sid"]), now, "revoked by the user"))
        log.info("user %s revoked %d session(s)", claims["sub"], count)
        self._announce_revoked(ended)
        await self.audit.record(
            "sessions-revoked",
            actor=user_actor(str(claims["sub"])),
            subject=str(claims["sub"]),
            address=_client_address(request),
            detail={"all": everything, "count": count},
        )
        return Response(status_code=204, headers={"Cache-Control": "no-store"})

    async def me(self, request: Request) -> Response:
        try:
            external = await self.external_claims(_bearer(request))
        except KeysUnavailable as exc:
            log.warning("auth request %s not checked: %s", request.url.path, exc.reason)
            raise _keys_unavailable() from None
        except InvalidToken as exc:
            log.info("auth request %s refused: %s", request.url.path, exc.reason)
            raise _auth_failed() from None
        if external is not None:  # a user of an external issuer: no account here, the token says who
            return JSONResponse(
                {
                    "id": external["sub"],
                    "email": external.get("email"),
                    "emailVerified": external_email_verified(external),
                    "issuer": external["iss"],
                    "createdAt": None,
                },
                headers={"Cache-Control": "no-store"},
            )
        claims = await self._claims(request)
        async with self._store().reader() as tx:
            user = await tx.user_by_id(str(claims["sub"]))
            verified = user is not None and await is_verified(tx, user)
        if user is None:
            raise _auth_failed()
        return JSONResponse(
            {
                "id": user.id,
                "email": user.email,
                "emailVerified": verified,
                "createdAt": _iso(user.created_at),
            },
            headers={"Cache-Control": "no-store"},
        )

    # -- OAuth ----------------------------------------------------------------------------------------------------

    def _provider_named(self, request: Request) -> _oauth.OAuthProvider:
        name = str(request.path_params.get("provider", ""))
        provider = self.providers.get(name)
        if provider is None:
            known = ", ".join(sorted(self.providers)) or "none are configured"
            raise AuthError(
                404, "OAUTH_PROVIDER_UNKNOWN", f"no OAuth provider named {name[:64]!r} (known: {known})"
            )
        return provider

    async def oauth_authorize(self, request: Request) -> Response:
        provider = self._provider_named(request)
        redirect = request.query_params.get("redirectUri") or provider.redirect_uri
        if not redirect:
            raise _invalid("redirectUri", "redirectUri is required (where the provider sends the user back)")
        if len(redirect) > 2048 or "://" not in redirect:
            raise _invalid(
                "redirectUri", "redirectUri must be an absolute URI such as https://app.example/cb"
            )
        state = secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(48)  # 64 characters, inside RFC 7636's 43..128
        now = self._ms()
        url = await _oauth.authorization_url(
            provider, state=state, code_verifier=verifier, redirect_uri=redirect
        )
        async with self._store().transaction() as tx:
            await tx.insert_oauth_state(
                OAuthStateRow(
                    hash_secret(state), provider.name, verifier, redirect, now, now + OAUTH_STATE_TTL * 1000
                )
            )
        return JSONResponse({"authorizationUrl": url, "state": state}, headers={"Cache-Control": "no-store"})

    async def oauth_callback(self, request: Request) -> Response:
        provider = self._provider_named(request)
        body = await _body(request)
        code = _string_field(body, "code")
        state = _string_field(body, "state")
        redirect = body.get("redirectUri")
        if redirect is not None and not isinstance(redirect, str):
            raise _invalid("redirectUri", "redirectUri must be a string")
        now = self._ms()
        async with self._store().transaction() as tx:
            pending = await tx.take_oauth_state(hash_secret(state))
        if pending is None or pending.provider != provider.name or pending.expires_at <= now:
            raise AuthError(
                400, "OAUTH_FAILED", "the sign-in state is unknown, used or expired; start the sign-in again"
            )
        if redirect and redirect != pending.redirect_uri:
            raise AuthError(
                400,
                "OAUTH_FAILED",
                "redirectUri differs from the one the sign-in started with; start the sign-in again",
                field="redirectUri",
            )
        try:
            profile = await _oauth.fetch_profile(
                provider, code=code, code_verifier=pending.code_verifier, redirect_uri=pending.redirect_uri
            )
        except _oauth.OAuthFailure as exc:
            log.warning("oauth sign-in via %s failed: %s", provider.name, exc.message)
            raise AuthError(exc.status, "OAUTH_FAILED", exc.message) from None
        email = normalize_email(profile.email) if profile.email else None
        user, created = await self._oauth_user(provider.name, profile.subject, email)
        if created and email is not None and profile.email_verified:
            async with self._store().transaction() as tx:
                await mark_verified(tx, user.id, email, self._ms())
        async with self._store().transaction() as tx:
            await self.refuse_disabled(tx, user.id)
            second_factor = await self.mfa.required(tx, user, f"oauth:{provider.name}")
            if second_factor is not None:
                return second_factor
            pair = await self._open_session(tx, user)
        log.info(
            "user %s signed in via %s (%s, session %s)",
            user.id,
            provider.name,
            "new account" if created else "existing account",
            pair.session_id,
        )
        await self.audit.record(
            "sign-up" if created else "sign-in",
            actor=user_actor(user.id),
            subject=user.id,
            address=_client_address(request),
            detail={"method": f"oauth:{provider.name}", "session": pair.session_id},
        )
        return self._pair_response(pair)

    async def _oauth_user(self, provider: str, subject: str, email: str | None) -> tuple[User, bool]:
        """The user linked to (provider, subject), created on first sign-in. An email that already belongs to
        another account is refused (OAUTH_ACCOUNT_EXISTS): linking accounts needs proof of both sides."""
        for _ in range(2):  # a second round only when another request linked the identity meanwhile
            try:
                async with self._store().transaction() as tx:
                    user = await tx.user_by_identity(provider, subject)
                    if user is not None:
                        return user, False
                    if email is not None and await tx.user_by_email(email) is not None:
                        raise _account_exists()
                    user = User(generate_uuid_v7(), email, None, self._ms())
                    if not await tx.insert_user(user):
                        raise _account_exists()
                    identity = Identity(provider, subject, user.id, email, user.created_at)
                    if await tx.insert_identity(identity):
                        return user, True
                    raise _LostRace()  # rolls the new user back
            except _LostRace:
                continue
        raise AuthError(503, "SERVICE_UNAVAILABLE", "the sign-in could not be completed; try again shortly")


def _keys_unavailable() -> AuthError:
    return AuthError(
        503,
        "SERVICE_UNAVAILABLE",
        "the identity provider's keys could not be read; try again shortly",
        headers={"Retry-After": "30"},
    )


class _LostRace(Exception):
    pass


def _mailer(
    sender: EmailSender | None, templates: EmailTemplates | str | None, app_url: str | None
) -> AuthMailer:
    from ..email.sender import EmailSender
    from ..email.templates import EmailTemplates

    if sender is not None and not isinstance(sender, EmailSender):
        raise OfflineError(
            "email_sender must be an EmailSender (SmtpEmailSender, ConsoleEmailSender or a subclass)",
            AUTH_CONFIG,
            {"field": "email_sender"},
        )
    if app_url is not None and (not isinstance(app_url, str) or "://" not in app_url):
        raise OfflineError(
            "app_url must be the app's absolute address, such as https://app.example",
            AUTH_CONFIG,
            {"field": "app_url"},
        )
    chosen = templates if isinstance(templates, EmailTemplates) else EmailTemplates(templates)
    return AuthMailer(sender, chosen, app_url=app_url)


def _account_exists() -> AuthError:
    return AuthError(
        409,
        "OAUTH_ACCOUNT_EXISTS",
        "an account with this email already exists; sign in to it, then link this provider to it "
        "(GET /auth/link/oauth/{provider}/authorize with the access token)",
    )


# -- sync ---------------------------------------------------------------------------------------------------------


class SyncAuthProvider:
    """``sync_options={"auth": provider}``: the handshake's token must be a valid access token of a live
    session, or of a configured external issuer; its claims then decide the session's scope (SPEC 4.4).
    Anything else is refused (AUTH_FAILED), except a token of an external issuer whose keys cannot be read now:
    OVERLOADED (retriable)."""

    def __init__(self, routes: AuthRoutes) -> None:
        self.routes = routes

    def bind_server_store(self, store: ServerStore) -> None:
        self.routes.bind_server_store(store)

    async def authenticate(self, token: str | None) -> dict[str, Any] | None:
        try:
            external = await self.routes.external_claims(token)
            if external is not None:
                self.routes.email_verification.check_external_sync(external)
                return external
            # Membership is read from the store at every handshake: a member removed from an organization
            # gets no more of its data, even with a token issued before the removal.
            claims = await self.routes.verify_access_token(token, current_orgs=True)
            await self.routes.email_verification.check_sync(claims)
            return claims
        except KeysUnavailable as exc:
            # The identity provider's keys cannot be read now: a retriable refusal, so clients try again later
            # instead of stopping as they do on AUTH_FAILED.
            log.warning("sync handshake not checked: %s", exc.reason)
            raise OfflineError(
                "the identity provider's keys could not be read; try again shortly", OVERLOADED, {}
            ) from None
        except InvalidToken as exc:
            log.info("sync handshake refused: %s", exc.reason)
            if exc.reason == DISABLED_REASON:
                raise OfflineError(
                    "this account is disabled; ask the application's administrator to enable it again",
                    USER_DISABLED,
                    {},
                ) from None
        except OfflineError as exc:
            if exc.code == EMAIL_NOT_VERIFIED:
                log.info("sync handshake refused: email not verified")
                raise  # the endpoint tells the client why (not a token problem: no refresh helps)
            if exc.code == STORAGE_ERROR:
                # The store failed, not the token: the endpoint tells the client to try again later (refused
                # as AUTH_FAILED, it would stop syncing for good and its user be sent to sign in again).
                raise
            log.error(
                "sync handshake refused: the token could not be checked: [%s] %s", exc.code, exc.message
            )
        return None

    async def __call__(self, token: str | None) -> dict[str, Any] | None:
        return await self.authenticate(token)

    # What the sync core needs to end live sessions (server_runtime.live_sessions).

    def session_binding(self, claims: Mapping[str, Any]) -> SessionBinding:
        """The auth session a connection's token belongs to (``sid``; none for an external issuer's token)
        and when the token expires (``exp``)."""
        sid = claims.get("sid")
        return SessionBinding(None if sid is None else str(sid), float(claims["exp"]))

    async def ended_sessions(self, session_ids: Sequence[str]) -> set[str]:
        return await self.routes.ended_sessions(session_ids)

    def subscribe_revocations(self, listener: Callable[[list[str]], None]) -> None:
        self.routes.subscribe_revocations(listener)

    def unsubscribe_revocations(self, listener: Callable[[list[str]], None]) -> None:
        self.routes.unsubscribe_revocations(listener)


def create_auth_routes(
    *,
    secret: str | bytes,
    oauth_providers: Mapping[str, Mapping[str, Any]] | None = None,
    access_ttl: float | datetime.timedelta = DEFAULT_ACCESS_TTL,
    refresh_ttl: float | datetime.timedelta = DEFAULT_REFRESH_TTL,
    rate_limits: RateLimits | Mapping[str, Any] | None = None,
    password_hasher: PasswordHasher | None = None,
    roles: Sequence[str] | None = None,
    invite_ttl: float | datetime.timedelta = DEFAULT_INVITE_TTL,
    passkeys: Mapping[str, Any] | None = None,
    totp_issuer: str = "offline",
    audit_retention: AuditRetention | None = None,
    external_issuers: Sequence[Any] | None = None,
    email_sender: EmailSender | None = None,
    email_templates: EmailTemplates | str | None = None,
    app_url: str | None = None,
    require_verified_email: bool | str | Sequence[str] = False,
    password_reset_ttl: float | datetime.timedelta = DEFAULT_RESET_TTL,
    email_verification_ttl: float | datetime.timedelta = DEFAULT_VERIFICATION_TTL,
) -> AuthRoutes:
    """Auth routes signing tokens with ``secret`` (AUTH_SECRET, at least 32 bytes). ``access_ttl`` and
    ``refresh_ttl`` in seconds (15 minutes and 30 days by default); ``oauth_providers``: name -> provider dict
    (see ``server_runtime.auth.oauth``); ``rate_limits``: a ``RateLimits`` or a dict of its fields.
    ``roles``: organization roles beyond owner, admin and member; ``invite_ttl``: how long an organization
    invite stays valid (7 days); ``passkeys``: WebAuthn relying-party settings (``server_runtime.auth.passkeys``;
    None: no passkeys); ``totp_issuer``: the name authenticator apps show next to the account;
    ``audit_retention``: how much of the audit log is kept (``server_runtime.auth.audit``);
    ``external_issuers``: OpenID Connect issuers whose tokens sync and ``/auth/me`` accept (a list of
    ``{issuer, audience, jwksUrl?, userIdClaim?, scopeClaims?}``; ``server_runtime.auth.external_issuers``).

    Email (``server_runtime.email``, ``password_reset``, ``email_verification``): ``email_sender`` delivers the
    password-reset and verification messages (None: those routes answer 503 EMAIL_NOT_CONFIGURED);
    ``email_templates``: an ``EmailTemplates`` or a folder overriding the shipped templates; ``app_url``: the
    app's address, for the links in messages; ``require_verified_email``: False, True, ``"sign-in"``,
    ``"sync"`` or a list of those; ``password_reset_ttl`` (30 minutes) and ``email_verification_ttl`` (24
    hours): how long an emailed token works."""
    return AuthRoutes(
        secret=secret,
        oauth_providers=oauth_providers,
        access_ttl=access_ttl,
        refresh_ttl=refresh_ttl,
        rate_limits=rate_limits,
        password_hasher=password_hasher,
        roles=roles,
        invite_ttl=invite_ttl,
        passkeys=passkeys,
        totp_issuer=totp_issuer,
        audit_retention=audit_retention,
        external_issuers=external_issuers,
        email_sender=email_sender,
        email_templates=email_templates,
        app_url=app_url,
        require_verified_email=require_verified_email,
        password_reset_ttl=password_reset_ttl,
        email_verification_ttl=email_verification_ttl,
    )
