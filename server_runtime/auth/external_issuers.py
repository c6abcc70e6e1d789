"""Tokens of external OpenID Connect issuers (Auth0, Clerk, Supabase, Keycloak, Cognito, ...) for sync and /me.

``create_auth_routes(..., external_issuers=[...])``, or ``OFFLINE_JWT_ISSUERS`` (a JSON list) for a server built
from the environment. Each entry::

    {"issuer": "https://tenant.example.com/",       # the tokens' ``iss``, exactly
     "audience": "https://api.example.com",        # or a list: the token's ``aud`` must name one of them
     "jwksUrl": "https://.../jwks.json",           # optional: else OpenID Connect discovery finds it
     "userIdClaim": "sub",                         # optional: the claim holding the user id
     "scopeClaims": {"orgId": "org_id"}}           # optional: scope value -> claim (or a list of names)

(snake_case keys are accepted too). A token whose unverified ``iss`` is not this server's own (``offline``) is
checked here: its issuer must be configured, its signature must verify with the issuer's key named by its
``kid`` under that key's own algorithm (``server_runtime.auth.jwks``: ``alg`` from the token header is never
trusted, so ``none`` and HS256-with-the-public-key fail), its ``aud`` must name a configured audience (a
token without ``aud``: its ``client_id`` or ``azp``, where Cognito and Clerk name the client), and
``exp`` (required), ``nbf`` and ``iat`` must hold within a leeway of ``LEEWAY`` seconds.

An accepted token becomes the session's claims: ``sub`` (the user id from ``userIdClaim``), ``iss``, ``exp``,
``email`` and ``email_verified`` when the token has them, each ``scopeClaims`` value under its scope name
(then read exactly as a native token's scope claims are: ``offline.core.scopes.extract_scope_values_from_claims``,
with ``userId`` falling back to ``sub``), ``principal`` (``external:<issuer> <user id>``: node ids are
registered to it, so an external user never speaks for a native user's devices nor for another issuer's user
of the same id) and ``externalClaims`` (the verified token's own claims, for write rules). Such a session has
no server-side session to revoke; it ends at the token's ``exp`` (``TOKEN_EXPIRED``) and the client passes a
fresh token (``offline.auth.external``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import jwt

from offline.core.errors import OfflineError

from .jwks import Fetch, JwksCache, fetch_json, require_fetchable_url
from .tokens import AUTH_CONFIG, InvalidToken
from .tokens import ISSUER as NATIVE_ISSUER

__all__ = [
    "ENVIRONMENT_VARIABLE",
    "LEEWAY",
    "ExternalIssuer",
    "ExternalIssuers",
    "external_issuers_from",
    "external_issuers_from_environment",
    "external_principal",
]

ENVIRONMENT_VARIABLE: Final = "OFFLINE_JWT_ISSUERS"
#: Seconds of clock difference tolerated between the issuer and this server (exp, nbf, iat).
LEEWAY: Final = 60
#: A user id longer than this is refused (it is stored with every node id its devices register).
MAX_USER_ID_CHARS: Final = 255

_KNOWN_FIELDS: Final = {
    "issuer": "issuer",
    "audience": "audience",
    "jwksUrl": "jwks_url",
    "userIdClaim": "user_id_claim",
    "scopeClaims": "scope_claims",
}


@dataclass(frozen=True, slots=True)
class ExternalIssuer:
    """One trusted issuer (module docstring)."""

    issuer: str
    audience: tuple[str, ...]
    jwks_url: str | None = None
    user_id_claim: str = "sub"
    scope_claims: Mapping[str, str] = field(default_factory=dict)  # scope value name -> token claim


def external_principal(issuer: str, user_id: str) -> str:
    """The principal an external user's node ids are registered to (an issuer URL holds no space)."""
    return f"external:{issuer} {user_id}"


def _bad(message: str, where: str) -> OfflineError:
    return OfflineError(message, AUTH_CONFIG, {"field": where})


def _entry(raw: Any, where: str) -> ExternalIssuer:
    if isinstance(raw, ExternalIssuer):  # checked like the dict it stands for
        raw = {
            "issuer": raw.issuer,
            "audience": list(raw.audience),
            "jwksUrl": raw.jwks_url,
            "userIdClaim": raw.user_id_claim,
            "scopeClaims": dict(raw.scope_claims),
        }
    if not isinstance(raw, Mapping):
        raise _bad(f"{where} must be an object with issuer and audience", where)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = _KNOWN_FIELDS.get(key, key if key in _KNOWN_FIELDS.values() else None)
        if name is None:
            known = ", ".join(_KNOWN_FIELDS)
            raise _bad(f"{where} has an unknown field {str(key)[:40]!r} (known: {known})", f"{where}.{key}")
        values[name] = value
    issuer = values.get("issuer")
    if not isinstance(issuer, str) or not issuer:
        raise _bad(
            f"{where}.issuer is required: the tokens' iss, e.g. https://tenant.example.com/",
            f"{where}.issuer",
        )
    problem = require_fetchable_url(issuer, f"{where}.issuer")
    if problem is not None or any(c.isspace() for c in issuer):
        raise _bad(problem or f"{where}.issuer must not contain spaces", f"{where}.issuer")
    audience = values.get("audience")
    audiences = [audience] if isinstance(audience, str) else audience
    if (
        not isinstance(audiences, list)
        or not audiences
        or not all(isinstance(a, str) and a for a in audiences)
    ):
        raise _bad(
            f"{where}.audience is required: the aud your provider puts in access tokens (a string or a list)",
            f"{where}.audience",
        )
    jwks_url = values.get("jwks_url")
    if jwks_url is not None and (
        not isinstance(jwks_url, str) or require_fetchable_url(jwks_url, "jwksUrl") is not None
    ):
        raise _bad(
            f"{where}.jwksUrl must be an https:// URL (http:// only for localhost)", f"{where}.jwksUrl"
        )
    user_id_claim = values.get("user_id_claim", "sub")
    if not isinstance(user_id_claim, str) or not user_id_claim:
        raise _bad(f"{where}.userIdClaim must be a claim name, e.g. 'sub'", f"{where}.userIdClaim")
    return ExternalIssuer(
        issuer, tuple(audiences), jwks_url, user_id_claim, _scope_claims(values.get("scope_claims"), where)
    )


def _scope_claims(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, list) and all(isinstance(name, str) and name for name in raw):
        return {name: name for name in raw}
    if isinstance(raw, Mapping) and all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in raw.items()
    ):
        return dict(raw)
    raise _bad(
        f'{where}.scopeClaims must map scope value names to claim names, e.g. {{"orgId": "org_id"}} '
        "(or list claim names that are scope value names already)",
        f"{where}.scopeClaims",
    )


def external_issuers_from(
    config: Sequence[Any] | None, where: str = "external_issuers"
) -> list[ExternalIssuer]:
    """Validate the ``external_issuers`` option (module docstring); errors name the entry and field."""
    if config is None:
        return []
    if isinstance(config, (str, bytes, Mapping)) or not isinstance(config, Sequence):
        raise _bad(f"{where} must be a list of issuer objects", where)
    issuers = [_entry(raw, f"{where}[{i}]") for i, raw in enumerate(config)]
    seen: set[str] = set()
    for i, entry in enumerate(issuers):
        if entry.issuer in seen:
            raise _bad(f"{where}[{i}].issuer {entry.issuer} is listed twice", f"{where}[{i}].issuer")
        seen.add(entry.issuer)
    return issuers


def external_issuers_from_environment(env: Mapping[str, str]) -> list[ExternalIssuer] | None:
    """``OFFLINE_JWT_ISSUERS`` parsed (None when unset); errors name the variable and the entry's field."""
    text = env.get(ENVIRONMENT_VARIABLE, "").strip()
    if not text:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(
            f"{ENVIRONMENT_VARIABLE} is not valid JSON ({exc.msg} at character {exc.pos}); "
            'it must be a list like [{"issuer": "https://...", "audience": "..."}]',
            ENVIRONMENT_VARIABLE,
        ) from None
    if isinstance(config, Mapping):
        config = [config]  # one issuer written without the list brackets
    return external_issuers_from(config, ENVIRONMENT_VARIABLE)


def _check_audience(claims: Mapping[str, Any], entry: ExternalIssuer) -> None:
    """The token must be meant for this server: its ``aud`` names a configured audience. A token without
    ``aud`` is judged by the client it was issued to, as its provider documents: Cognito access tokens name
    their app client in ``client_id``, Clerk session tokens their origin in ``azp``."""
    audience = claims.get("aud")
    if audience is None:
        named = [claims[k] for k in ("client_id", "azp") if isinstance(claims.get(k), str)]
        if not named:
            raise InvalidToken(f"a token of {entry.issuer} lacks the 'aud' claim")
    elif isinstance(audience, str):
        named = [audience]
    elif isinstance(audience, list) and all(isinstance(a, str) for a in audience):
        named = audience
    else:
        raise InvalidToken(f"malformed aud claim in a token of {entry.issuer}")
    if not set(named) & set(entry.audience):
        raise InvalidToken(f"wrong audience: a token of {entry.issuer} is not for {list(entry.audience)}")


class ExternalIssuers:
    """Verifies tokens of the configured issuers (module docstring). ``now`` (epoch seconds) and ``fetch``
    (URL -> parsed JSON) are injectable for tests; ``keys`` tunes every issuer's ``JwksCache``."""

    def __init__(
        self,
        issuers: Sequence[ExternalIssuer],
        *,
        now: Callable[[], float] | None = None,
        fetch: Fetch = fetch_json,
        **keys: Any,
    ) -> None:
        self.issuers = {entry.issuer: entry for entry in issuers}
        self._now = now or time.time
        self.keys = {
            entry.issuer: JwksCache(entry.issuer, entry.jwks_url, fetch=fetch, **keys) for entry in issuers
        }

    def __repr__(self) -> str:
        return f"ExternalIssuers({sorted(self.issuers)})"

    @staticmethod
    def claims_external(token: str | None) -> bool:
        """Whether ``token`` is a JWT naming an issuer other than this server (read unverified, to route it)."""
        if not token or not isinstance(token, str):
            return False
        try:
            issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
        except jwt.InvalidTokenError:
            return False
        return isinstance(issuer, str) and issuer != NATIVE_ISSUER

    async def verify(self, token: str) -> dict[str, Any]:
        """The session claims of a valid token of a configured issuer; raises ``InvalidToken`` otherwise
        (its reason names the issuer and what failed, never the token)."""
        try:
            header = jwt.get_unverified_header(token)
            issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
        except jwt.InvalidTokenError:
            raise InvalidToken("malformed token") from None
        entry = self.issuers.get(issuer) if isinstance(issuer, str) else None
        if entry is None:
            raise InvalidToken(f"the token's issuer {str(issuer)[:100]!r} is not a configured issuer")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken(f"malformed key id in a token of {entry.issuer}")
        key = await self.keys[entry.issuer].key_for(kid)
        algorithm = header.get("alg")
        if algorithm != key.algorithm:
            raise InvalidToken(
                f"algorithm {str(algorithm)[:16]!r} of a token of {entry.issuer} is not its key's ({key.algorithm})"
            )
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[key.algorithm],
                issuer=entry.issuer,
                # Times are checked below against this server's clock (injectable), with the leeway; the
                # audience too (_check_audience: tokens of some providers name it in another claim).
                options={
                    "require": ["exp", "iss"],
                    "verify_aud": False,
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.InvalidSignatureError:
            raise InvalidToken(f"bad signature on a token of {entry.issuer}") from None
        except jwt.MissingRequiredClaimError as exc:
            raise InvalidToken(f"a token of {entry.issuer} lacks the {exc.claim!r} claim") from None
        except jwt.InvalidTokenError as exc:
            raise InvalidToken(f"invalid token of {entry.issuer} ({type(exc).__name__})") from None
        self._check_times(claims, entry.issuer)
        _check_audience(claims, entry)
        return self._session_claims(entry, claims)

    def _check_times(self, claims: Mapping[str, Any], issuer: str) -> None:
        now = self._now()
        times = {name: claims[name] for name in ("exp", "nbf", "iat") if name in claims}
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in times.values()):
            raise InvalidToken(f"malformed time claims in a token of {issuer}")
        if times["exp"] <= now - LEEWAY:
            raise InvalidToken(f"token of {issuer} expired")
        if times.get("nbf", 0) > now + LEEWAY or times.get("iat", 0) > now + LEEWAY:
            raise InvalidToken(f"token of {issuer} not valid yet (nbf or iat in the future)")

    def _session_claims(self, entry: ExternalIssuer, claims: Mapping[str, Any]) -> dict[str, Any]:
        user_id = claims.get(entry.user_id_claim)
        if isinstance(user_id, int) and not isinstance(user_id, bool):
            user_id = str(user_id)
        if not isinstance(user_id, str) or not user_id or len(user_id) > MAX_USER_ID_CHARS:
            raise InvalidToken(
                f"a token of {entry.issuer} has no usable user id claim {entry.user_id_claim!r}"
            )
        session: dict[str, Any] = {
            "sub": user_id,
            "iss": entry.issuer,
            # Live sync sessions end at this time (TOKEN_EXPIRED): one accepted within the leeway after its
            # expiry ends at once, and its client fetches a fresh token.
            "exp": claims["exp"],
            "principal": external_principal(entry.issuer, user_id),
            "externalClaims": dict(claims),
        }
        if isinstance(claims.get("email"), str):
            session["email"] = claims["email"]
        # OpenID Connect's standard claim; native access tokens carry it too.
        if isinstance(claims.get("email_verified"), bool):
            session["email_verified"] = claims["email_verified"]
        for name, claim in entry.scope_claims.items():
            if claim in claims:
                session[name] = claims[claim]
        return session
