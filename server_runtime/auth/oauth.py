"""OAuth 2.0 authorization-code flow with PKCE (S256) against configured providers, via authlib's httpx client.

A provider is configured by a dict: ``client_id``, ``client_secret`` (optional for public clients),
``authorize_url``, ``token_url``, ``userinfo_url``, ``scope`` (optional), and optionally ``redirect_uri``
(default when a request names none), ``token_endpoint_auth_method`` (``client_secret_basic`` by default, or
``client_secret_post`` / ``none``) and ``timeout`` (seconds, default 10). camelCase spellings are accepted too.
Provider URLs must be ``https://`` (plain ``http://`` only on a loopback host, for development and tests).

The user's identity is the userinfo's ``sub`` (or ``id``); its ``email`` is kept unless the provider marks it
unverified (``email_verified: false``).
"""

from __future__ import annotations

import urllib.parse
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from offline.core.errors import OfflineError

from ..client_address import is_loopback_host as _is_loopback
from .tokens import AUTH_CONFIG

__all__ = ["OAuthFailure", "OAuthProvider", "Profile", "fetch_profile", "providers_from"]

_AUTH_METHODS: Final = ("client_secret_basic", "client_secret_post", "none")
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")


class OAuthFailure(Exception):
    """The flow could not complete; ``status`` 400 (the request's fault) or 502 (the provider's). The
    message is safe to show and log: it never quotes codes, verifiers, tokens or secrets."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class OAuthProvider:
    name: str
    client_id: str
    authorize_url: str
    token_url: str
    userinfo_url: str
    client_secret: str | None = field(default=None, repr=False)
    scope: str | None = None
    redirect_uri: str | None = None
    token_endpoint_auth_method: str = "client_secret_basic"
    timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class Profile:
    subject: str
    email: str | None
    email_verified: bool = False  # the provider said ``email_verified: true``


def _check_url(provider: str, key: str, url: object) -> str:
    where = f"oauth_providers.{provider}.{key}"
    if not isinstance(url, str) or not url:
        raise OfflineError(f"{where} is required (an https:// URL)", AUTH_CONFIG, {"field": where})
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and _is_loopback(parts.hostname):
        return url
    raise OfflineError(
        f"{where} must be an https:// URL (http:// is accepted only on a loopback host), got {url!r}",
        AUTH_CONFIG,
        {"field": where},
    )


def providers_from(config: Mapping[str, Mapping[str, Any]] | None) -> dict[str, OAuthProvider]:
    """Validate the ``oauth_providers`` option: provider name -> configuration dict (module docstring)."""
    out: dict[str, OAuthProvider] = {}
    for name, raw in (config or {}).items():
        if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
            raise OfflineError(
                f"OAuth provider name {name!r} must use lower-case letters, digits, '-' or '_'",
                AUTH_CONFIG,
                {"field": "oauth_providers"},
            )
        if not isinstance(raw, Mapping):
            raise OfflineError(
                f"oauth_providers.{name} must be a dict", AUTH_CONFIG, {"field": f"oauth_providers.{name}"}
            )

        def pick(snake: str, raw: Mapping[str, Any] = raw) -> Any:
            head, *rest = snake.split("_")
            return raw.get(snake, raw.get(head + "".join(p.title() for p in rest)))

        client_id = pick("client_id")
        if not isinstance(client_id, str) or not client_id:
            where = f"oauth_providers.{name}.client_id"
            raise OfflineError(f"{where} is required", AUTH_CONFIG, {"field": where})
        method = pick("token_endpoint_auth_method") or "client_secret_basic"
        if method not in _AUTH_METHODS:
            where = f"oauth_providers.{name}.token_endpoint_auth_method"
            raise OfflineError(
                f"{where} must be one of {', '.join(_AUTH_METHODS)}", AUTH_CONFIG, {"field": where}
            )
        secret = pick("client_secret")
        if method != "none" and not secret:
            where = f"oauth_providers.{name}.client_secret"
            raise OfflineError(
                f"{where} is required unless token_endpoint_auth_method is 'none'",
                AUTH_CONFIG,
                {"field": where},
            )
        redirect = pick("redirect_uri")
        out[name] = OAuthProvider(
            name=name,
            client_id=client_id,
            client_secret=str(secret) if secret else None,
            authorize_url=_check_url(name, "authorize_url", pick("authorize_url")),
            token_url=_check_url(name, "token_url", pick("token_url")),
            userinfo_url=_check_url(name, "userinfo_url", pick("userinfo_url")),
            scope=pick("scope") or None,
            redirect_uri=str(redirect) if redirect else None,
            token_endpoint_auth_method=method,
            timeout=float(pick("timeout") or 10.0),
        )
    return out


def _authlib() -> Any:
    """authlib's httpx integration, imported on first use (servers without OAuth never load it)."""
    with warnings.catch_warnings():
        # authlib prefers the `httpx2` package and warns when it falls back to `httpx`, which works the same.
        # Importing authlib.deprecate installs an "always" filter for that warning, so silence it after.
        import authlib.deprecate  # type: ignore[import-untyped, unused-ignore]  # noqa: F401

        warnings.simplefilter("ignore", DeprecationWarning)
        from authlib.integrations import httpx_client  # type: ignore[import-untyped, unused-ignore]
    return httpx_client


def _client(provider: OAuthProvider, redirect_uri: str | None) -> Any:
    return _authlib().AsyncOAuth2Client(
        client_id=provider.client_id,
        client_secret=provider.client_secret,
        token_endpoint_auth_method=provider.token_endpoint_auth_method,
        scope=provider.scope,
        redirect_uri=redirect_uri,
        code_challenge_method="S256",
        timeout=provider.timeout,
        trust_env=False,
    )


async def authorization_url(
    provider: OAuthProvider, *, state: str, code_verifier: str, redirect_uri: str | None
) -> str:
    """The provider's authorization URL carrying ``state`` and the S256 challenge of ``code_verifier``."""
    client = _client(provider, redirect_uri)
    try:
        url, _ = client.create_authorization_url(
            provider.authorize_url, state=state, code_verifier=code_verifier
        )
    finally:
        await client.aclose()
    return str(url)


async def fetch_profile(
    provider: OAuthProvider, *, code: str, code_verifier: str, redirect_uri: str | None
) -> Profile:
    """Exchange the authorization code (with the PKCE verifier) and read the user's profile."""
    OAuthError = _authlib().OAuthError
    async with _client(provider, redirect_uri) as client:
        try:
            await client.fetch_token(
                provider.token_url,
                grant_type="authorization_code",
                code=code,
                code_verifier=code_verifier,
            )
        except OAuthError as exc:
            error = str(getattr(exc, "error", "") or "oauth_error")[:64]
            raise OAuthFailure(
                f"the {provider.name} provider refused the authorization code ({error}); start the sign-in again"
            ) from None
        except (httpx.HTTPError, ValueError) as exc:
            raise OAuthFailure(
                f"the {provider.name} token endpoint did not answer usably ({type(exc).__name__}); "
                "try again later or check the provider configuration",
                502,
            ) from None
        try:
            response = await client.get(provider.userinfo_url)
            response.raise_for_status()
            info = response.json()
        except (httpx.HTTPError, ValueError, OAuthError) as exc:
            raise OAuthFailure(
                f"the {provider.name} userinfo endpoint did not answer usably ({type(exc).__name__}); "
                "try again later or check the provider configuration",
                502,
            ) from None
    if not isinstance(info, Mapping):
        raise OAuthFailure(f"the {provider.name} userinfo endpoint did not return a JSON object", 502)
    subject = info.get("sub", info.get("id"))
    if isinstance(subject, bool) or not isinstance(subject, (str, int)) or str(subject) == "":
        raise OAuthFailure(f"the {provider.name} userinfo has no 'sub' (or 'id') to identify the user", 502)
    email = info.get("email")
    if not isinstance(email, str) or not email or info.get("email_verified") is False:
        email = None
    return Profile(str(subject), email, email is not None and info.get("email_verified") is True)
