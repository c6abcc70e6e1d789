"""Account linking: attach an OAuth provider identity to the signed-in account, with proof of both.

The access token proves the account; completing the provider's authorization-code flow (PKCE) proves the
identity. The flow's state is bound to the user who started it (``GET /auth/link/oauth/{provider}/authorize``
needs the access token), so a code obtained by someone else cannot be linked into this account by making
the user's client post it. Once linked, signing in through the provider signs in to this account. An OAuth
sign-in whose email belongs to an existing account still answers 409 ``OAUTH_ACCOUNT_EXISTS``: accounts are
never linked on email alone.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import TYPE_CHECKING, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from . import oauth as _oauth
from .audit import user_actor
from .storage import Identity
from .storage_ext import ChallengeRow
from .tokens import hash_secret
from .web import AuthError, client_address, invalid, normalize_email, read_body, string_field

if TYPE_CHECKING:
    from .routes import AuthRoutes

__all__ = ["LinkRoutes"]

log = logging.getLogger("offline.server.auth")

LINK_STATE_TTL: Final = 10 * 60
_NO_STORE: Final = {"Cache-Control": "no-store"}


def _flow_failed(message: str, field: str | None = None) -> AuthError:
    return AuthError(400, "OAUTH_FAILED", message, field=field)


class LinkRoutes:
    """``/link/oauth/{provider}/authorize`` and ``/link/oauth/{provider}/callback`` of an ``AuthRoutes``."""

    def __init__(self, core: AuthRoutes) -> None:
        self.core = core

    def routes(self) -> list[BaseRoute]:
        h = self.core._handler
        return [
            Route("/link/oauth/{provider}/authorize", h(self.authorize), methods=["GET"]),
            Route("/link/oauth/{provider}/callback", h(self.callback), methods=["POST"]),
        ]

    async def authorize(self, request: Request) -> Response:
        claims = await self.core._claims(request)
        provider = self.core._provider_named(request)
        redirect = request.query_params.get("redirectUri") or provider.redirect_uri
        if not redirect:
            raise invalid("redirectUri", "redirectUri is required (where the provider sends the user back)")
        if len(redirect) > 2048 or "://" not in redirect:
            raise invalid("redirectUri", "redirectUri must be an absolute URI such as https://app.example/cb")
        state = secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(48)
        url = await _oauth.authorization_url(
            provider, state=state, code_verifier=verifier, redirect_uri=redirect
        )
        now = self.core._ms()
        payload = {"provider": provider.name, "verifier": verifier, "redirectUri": redirect}
        async with self.core._store().transaction() as tx:
            await tx.insert_challenge(
                ChallengeRow(
                    hash_secret(state),
                    "link",
                    str(claims["sub"]),
                    json.dumps(payload),
                    now,
                    now + LINK_STATE_TTL * 1000,
                )
            )
        return JSONResponse({"authorizationUrl": url, "state": state}, headers=_NO_STORE)

    async def callback(self, request: Request) -> Response:
        claims = await self.core._claims(request)  # no access token: 401 before anything is spent
        user_id = str(claims["sub"])
        provider = self.core._provider_named(request)
        body = await read_body(request)
        code = string_field(body, "code")
        state = string_field(body, "state")
        redirect = body.get("redirectUri")
        if redirect is not None and not isinstance(redirect, str):
            raise invalid("redirectUri", "redirectUri must be a string")
        now = self.core._ms()
        async with self.core._store().transaction() as tx:
            pending = await tx.take_challenge(hash_secret(state))
        payload = json.loads(pending.payload) if pending is not None and pending.kind == "link" else {}
        if (
            pending is None
            or pending.kind != "link"
            or pending.user_id != user_id
            or pending.expires_at <= now
            or payload.get("provider") != provider.name
        ):
            raise _flow_failed(
                "the linking state is unknown, used, expired or not yours; start linking again"
            )
        if redirect and redirect != payload.get("redirectUri"):
            raise _flow_failed(
                "redirectUri differs from the one the linking started with; start linking again",
                "redirectUri",
            )
        try:
            profile = await _oauth.fetch_profile(
                provider,
                code=code,
                code_verifier=str(payload["verifier"]),
                redirect_uri=payload.get("redirectUri"),
            )
        except _oauth.OAuthFailure as exc:
            log.warning("linking %s for user %s failed: %s", provider.name, user_id, exc.message)
            raise AuthError(exc.status, "OAUTH_FAILED", exc.message) from None
        email = normalize_email(profile.email) if profile.email else None
        outcome = "linked"
        async with self.core._store().transaction() as tx:
            owner = await tx.user_by_identity(provider.name, profile.subject)
            if owner is not None:
                outcome = "already" if owner.id == user_id else "taken"
            elif await tx.user_by_id(user_id) is None:
                outcome = "gone"
            elif not await tx.insert_identity(Identity(provider.name, profile.subject, user_id, email, now)):
                outcome = "taken"  # linked by a concurrent request meanwhile
        if outcome == "taken":
            raise AuthError(
                409,
                "OAUTH_IDENTITY_LINKED",
                f"this {provider.name} account is already linked to another account; unlink it there or "
                "sign in with it instead",
            )
        if outcome == "gone":
            raise AuthError(401, "AUTH_FAILED", "the account no longer exists; sign in again")
        if outcome == "linked":
            log.info("user %s linked a %s identity", user_id, provider.name)
            await self.core.audit.record(
                "identity-linked",
                actor=user_actor(user_id),
                subject=user_id,
                address=client_address(request),
                detail={"provider": provider.name},
            )
        return JSONResponse(
            {
                "linked": True,
                "provider": provider.name,
                "email": email,
                "alreadyLinked": outcome == "already",
            },
            headers=_NO_STORE,
        )
