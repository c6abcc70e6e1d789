"""The bridge between an auth client and `create_app(schema, sync={"auth_client": ...})`.

The sync engine asks `get_access_token()` before every handshake, the first and each reconnect, so a
reconnect after the access token expired carries a refreshed one. Scopes are decided by the server from the
verified claims of that token (a client may narrow its scope, never widen it); `scope_values()` reads the
same claims here, unverified, so an app can show which partition it syncs.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol, runtime_checkable

from offline.core.schema import SchemaDefinition
from offline.core.scopes import ScopeMap, build_scope_map, extract_scope_values_from_claims

from .errors import INVALID_INPUT, AuthError
from .tokens import claims_or_empty


@runtime_checkable
class AccessTokenSource(Protocol):
    """What the sync engine needs from an auth client: the access token for the next handshake."""

    def get_access_token(self) -> Awaitable[str | None]: ...


class OfflineAuthSync:
    """Value for ``sync={"auth_client": ...}``: hands the auth client's current token to each handshake."""

    def __init__(self, auth_client: AccessTokenSource, schema: SchemaDefinition) -> None:
        if not callable(getattr(auth_client, "get_access_token", None)):
            raise AuthError(
                "auth_client must be an auth client with get_access_token(), e.g. create_offline_auth(...)",
                INVALID_INPUT,
                {"field": "auth_client"},
            )
        if not isinstance(schema, SchemaDefinition):
            raise AuthError(
                "schema must be the SchemaDefinition the app uses (from define_schema)",
                INVALID_INPUT,
                {"field": "schema"},
            )
        self.auth_client = auth_client
        self.schema = schema
        self._last_token: str | None = None

    def __repr__(self) -> str:
        return f"OfflineAuthSync({self.auth_client!r})"

    async def get_access_token(self) -> str | None:
        """The token for the next handshake (refreshed when close to expiry), None when signed out."""
        token = await self.auth_client.get_access_token()
        self._last_token = token
        return token

    async def refresh_access_token(self) -> str | None:
        """A new token now, e.g. after the server refused the current one; None if the client cannot refresh."""
        refresh = getattr(self.auth_client, "refresh", None)
        if refresh is None:
            return None
        result = refresh()
        token = await result if inspect.isawaitable(result) else result
        self._last_token = None if token is None else str(token)
        return self._last_token

    @property
    def user(self) -> Mapping[str, Any] | None:
        user = getattr(self.auth_client, "user", None)
        return user if isinstance(user, Mapping) else None

    @property
    def claims(self) -> dict[str, Any]:
        """The access token's claims, decoded without verification: for display, never for decisions."""
        claims = getattr(self.auth_client, "claims", None)
        if isinstance(claims, Mapping):
            return dict(claims)
        return claims_or_empty(self._last_token)

    def scope_values(self) -> dict[str, Any]:
        """Scope values from the claims (SPEC 4.4 order: claim, ``claims.scope[field]``, ``sub`` for userId)."""
        return extract_scope_values_from_claims(self.schema, self.claims)

    def scope_map(self) -> ScopeMap:
        """The per-collection filters those values give; the server computes the same from verified claims."""
        return build_scope_map(self.schema, self.scope_values())


def create_offline_auth_sync(auth_client: AccessTokenSource, schema: SchemaDefinition) -> OfflineAuthSync:
    """The value for ``create_app(schema, sync={"url": ..., "auth_client": <this>})`` (SPEC 4.3a)."""
    return OfflineAuthSync(auth_client, schema)
