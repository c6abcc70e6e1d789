"""Sync with a token of your own identity provider (Auth0, Clerk, Supabase, Keycloak, Cognito, ...).

    auth = external_token_auth(lambda: provider_sdk.access_token())          # plain or async callable
    app = create_app(schema, sync={"url": "wss://example.com/offline-sync", "auth_client": auth})

The server must list the provider among its external issuers (``OFFLINE_JWT_ISSUERS`` or
``create_auth_routes(external_issuers=[...])``). The sync engine calls ``get_token()`` before every handshake,
the first and each reconnect. When the server ends a session because the token expired (``TOKEN_EXPIRED``), or
refuses a handshake's token once (``AUTH_FAILED``), the engine asks for a new one: ``refresh()`` when given
(e.g. the SDK's "refresh now"), else ``get_token()`` again, which suits SDKs that renew expired tokens on
their own. A callable returning None means "signed out": sync stops with ``AUTH_FAILED``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import INVALID_INPUT, AuthError
from .tokens import claims_or_empty

__all__ = ["ExternalTokenAuth", "TokenCallable", "external_token_auth"]

#: Returns the provider's current access token (or None when signed out), directly or awaitably.
TokenCallable = Callable[[], "str | Awaitable[str | None] | None"]


class ExternalTokenAuth:
    """Value for ``sync={"auth_client": ...}`` handing an identity provider's token to each handshake."""

    def __init__(self, get_token: TokenCallable, refresh: TokenCallable | None = None) -> None:
        for name, value in (("get_token", get_token), ("refresh", refresh)):
            if value is not None and not callable(value):
                raise AuthError(
                    f"{name} must be a callable returning the provider's access token (or an awaitable of it)",
                    INVALID_INPUT,
                    {"field": name},
                )
        self._get_token = get_token
        self._refresh = refresh
        self._last_token: str | None = None

    def __repr__(self) -> str:  # never show a token
        return f"ExternalTokenAuth(refresh={self._refresh is not None})"

    async def _call(self, source: TokenCallable) -> str | None:
        result = source()
        token = await result if inspect.isawaitable(result) else result
        self._last_token = None if token is None else str(token)
        return self._last_token

    async def get_access_token(self) -> str | None:
        """The token for the next handshake."""
        return await self._call(self._get_token)

    async def refresh_access_token(self) -> str | None:
        """A new token after the server said the current one expired or was refused."""
        return await self._call(self._refresh or self._get_token)

    @property
    def claims(self) -> dict[str, Any]:
        """The last token's claims, decoded without verification: for display, never for decisions."""
        return claims_or_empty(self._last_token)


def external_token_auth(
    get_token: TokenCallable, *, refresh: TokenCallable | None = None
) -> ExternalTokenAuth:
    """The ``auth_client`` for sync with an identity provider's access token (module docstring)."""
    return ExternalTokenAuth(get_token, refresh)
