"""An identity provider's signing keys (its JWKS), fetched over HTTP, cached, and refreshed with a budget.

``JwksCache(issuer, jwks_url)`` answers ``await cache.key_for(kid)`` with the provider's key of that id. The
key set comes from ``jwks_url`` or, without one, from OpenID Connect discovery (``{issuer}/.well-known/
openid-configuration`` -> ``jwks_uri``, whose ``issuer`` must be the configured one). It is fetched on first
use, again once it is older than ``max_age``, and again when a token names a key id the cached set lacks (the
provider rotated its keys). Every fetch, whatever asked for it, spends one of ``refresh_limit`` fetches per
``refresh_window`` seconds: tokens naming random key ids cannot make the server hammer the provider, and a
real rotation is still picked up at once unless such a flood just spent the budget (then within the window).
Keys that could not be read (never, or not again for a new key id) raise ``KeysUnavailable``: the token is not
known to be bad, and the sync handshake answers it with a retriable refusal.

Each key is pinned to one algorithm, decided by the key itself (its ``alg`` when it has one, else its type:
RSA -> RS256, EC P-256/P-384/P-521 -> ES256/ES384/ES512, OKP Ed25519 -> EdDSA), never by a token's header:
a token signed with HS256 and the public key as the HMAC secret, or with ``none``, matches no key. Keys that
are not for signatures (``use`` other than ``sig``), RSA keys under 2048 bits and unknown types are skipped.

Fetches run on the event loop with httpx (never blocking it), with a total timeout, no redirects, and a size
cap on the answer; only ``https://`` URLs are fetched, except on loopback (development and tests).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
import jwt

from .rate_limit import SlidingWindow
from .tokens import InvalidToken

__all__ = [
    "DISCOVERY_PATH",
    "JwksCache",
    "JwksUnavailable",
    "KeysUnavailable",
    "SigningKey",
    "fetch_json",
    "require_fetchable_url",
    "signing_keys_from",
]

log = logging.getLogger("offline.server.auth")

DISCOVERY_PATH: Final = "/.well-known/openid-configuration"
#: A JWKS or discovery document larger than this is refused (real ones are a few KiB).
MAX_DOCUMENT_BYTES: Final = 256 * 1024
#: Keys kept from one JWKS at most (providers publish two or three).
MAX_KEYS: Final = 64
FETCH_TIMEOUT: Final = 10.0
MIN_RSA_BITS: Final = 2048

_RSA_ALGORITHMS: Final = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_ALGORITHMS: Final = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}

Fetch = Callable[[str], Awaitable[Any]]


class KeysUnavailable(InvalidToken):
    """The token could not be checked now: the issuer's keys could not be read, or a key id new to this
    server arrived while refreshes were paused (the floor on refresh frequency). Worth retrying later."""


class JwksUnavailable(Exception):
    """The key set (or the discovery document) could not be fetched or read; the message names the URL
    and what went wrong, never a token."""


@dataclass(frozen=True, slots=True)
class SigningKey:
    kid: str | None
    algorithm: str  # the only algorithm a token verified with this key may use
    key: jwt.PyJWK


def require_fetchable_url(url: str, what: str) -> str | None:
    """Why ``url`` may not be fetched (None when it may): https, or http to a loopback host."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return f"{what} is not a valid URL"
    if parts.scheme == "https" and host:
        return None
    if parts.scheme == "http" and host and _loopback(host):
        return None
    return f"{what} must be an https:// URL (http:// only for localhost)"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def fetch_json(url: str, *, timeout: float = FETCH_TIMEOUT, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """GET ``url`` and parse its JSON body: ``timeout`` seconds in all, no redirects, at most ``max_bytes``."""
    body = bytearray()
    try:
        async with (
            asyncio.timeout(timeout),
            httpx.AsyncClient(follow_redirects=False) as client,
            client.stream("GET", url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise JwksUnavailable(f"{url} answered HTTP {response.status_code}")
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise JwksUnavailable(f"{url} sent more than {max_bytes} bytes")
    except TimeoutError:
        raise JwksUnavailable(f"{url} did not answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise JwksUnavailable(f"{url} could not be reached ({type(exc).__name__})") from None
    try:
        return json.loads(bytes(body))
    except ValueError:
        raise JwksUnavailable(f"{url} did not answer JSON") from None


def _algorithm_of(jwk: Mapping[str, Any]) -> str | None:
    """The one algorithm this key verifies, from the key itself; None for keys that are not used."""
    if jwk.get("use", "sig") != "sig":
        return None
    kty, declared = jwk.get("kty"), jwk.get("alg")
    if kty == "RSA":
        implied = "RS256"
        allowed: set[str] | frozenset[str] = _RSA_ALGORITHMS
    elif kty == "EC" and jwk.get("crv") in _EC_ALGORITHMS:
        implied = _EC_ALGORITHMS[jwk["crv"]]
        allowed = {implied}
    elif kty == "OKP" and jwk.get("crv") == "Ed25519":
        implied = "EdDSA"
        allowed = {implied}
    else:
        return None
    if declared is None:
        return implied
    return declared if declared in allowed else None


def signing_keys_from(document: Any, source: str) -> dict[str | None, SigningKey]:
    """Key id -> key, from a JWKS document (keys it cannot use are skipped; None: a key without an id)."""
    keys = document.get("keys") if isinstance(document, Mapping) else None
    if not isinstance(keys, list):
        raise JwksUnavailable(f"{source} is not a JWKS (no 'keys' list)")
    out: dict[str | None, SigningKey] = {}
    for jwk in keys[:MAX_KEYS]:
        if not isinstance(jwk, Mapping):
            continue
        algorithm = _algorithm_of(jwk)
        kid = jwk.get("kid")
        if algorithm is None or not (kid is None or isinstance(kid, str)):
            continue
        try:
            key = jwt.PyJWK(dict(jwk), algorithm=algorithm)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            continue
        if jwk.get("kty") == "RSA" and getattr(key.key, "key_size", 0) < MIN_RSA_BITS:
            continue
        out.setdefault(kid, SigningKey(kid, algorithm, key))
    return out


class JwksCache:
    """The signing keys of one issuer (module docstring). ``fetch`` and ``now`` are injectable for tests."""

    def __init__(
        self,
        issuer: str,
        jwks_url: str | None = None,
        *,
        max_age: float = 3600.0,
        refresh_limit: int = 3,
        refresh_window: float = 60.0,
        fetch: Fetch = fetch_json,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.issuer = issuer
        self.jwks_url = jwks_url
        self.max_age = max_age
        self._fetch = fetch
        self._now = now
        self._budget = SlidingWindow(refresh_limit, refresh_window, now=now)
        self._keys: dict[str | None, SigningKey] = {}
        self._fetched_at: float | None = None  # when the keys were last read successfully
        self._attempts = 0  # fetch attempts ended so far: waiters for the lock skip one made meanwhile
        self._lock = asyncio.Lock()
        self._last_error: str | None = None
        self._read_ok = False  # whether the last fetch attempt read the keys

    def __repr__(self) -> str:
        return f"JwksCache({self.issuer!r}, keys={len(self._keys)})"

    async def key_for(self, kid: str | None) -> SigningKey:
        """The key a token naming ``kid`` must verify with; raises ``InvalidToken`` (loggable reason), or its
        subclass ``KeysUnavailable`` when the answer may differ once the keys can be read again."""
        read: bool | None = None  # whether this call read the keys (None: it did not try)
        if self._fetched_at is None or self._now() - self._fetched_at > self.max_age:
            read = await self._refresh()
        key = self._lookup(kid)
        if key is None and kid is not None and read is None:
            read = await self._refresh()  # a new key id: the provider may have rotated its keys
            key = self._lookup(kid)
        if key is not None:
            return key
        if self._fetched_at is None:
            raise KeysUnavailable(
                f"the keys of issuer {self.issuer} could not be fetched: {self._last_error}"
            )
        if kid is None:
            raise InvalidToken(f"the token names no key id (kid) and issuer {self.issuer} has several keys")
        if not read:
            raise KeysUnavailable(
                f"the token's key id is not among the cached keys of issuer {self.issuer}, which could not be "
                f"read again now ({self._last_error or 'refreshes are paused: at most a few reads a minute'})"
            )
        raise InvalidToken(f"the token's key id is not among the keys of issuer {self.issuer}")

    def _lookup(self, kid: str | None) -> SigningKey | None:
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))  # a provider with one key may leave kid out
        return self._keys.get(kid)

    async def _refresh(self) -> bool:
        """Read the keys again (or share a read that ended while waiting); whether the keys were read."""
        seen = self._attempts
        async with self._lock:
            if self._attempts != seen:
                return self._read_ok  # a fetch ended while this request waited for it: use its result
            try:
                self._read_ok = await self._fetch_keys()
            finally:
                self._attempts += 1  # counted when it ends: requests waiting meanwhile share its result
            return self._read_ok

    async def _fetch_keys(self) -> bool:
        if self._budget.retry_after(self.issuer) is not None:
            return False  # fetched often enough lately: the floor on refresh frequency
        self._budget.hit(self.issuer)
        try:
            self._keys = await self._read_keys()
        except JwksUnavailable as exc:
            self._last_error = str(exc)
            kept = "keeping the keys read before" if self._fetched_at is not None else "no keys yet"
            log.warning("JWKS of issuer %s unavailable (%s): %s", self.issuer, kept, exc)
            return False
        self._fetched_at = self._now()
        self._last_error = None
        log.info("read %d signing key(s) of issuer %s", len(self._keys), self.issuer)
        return True

    async def _read_keys(self) -> dict[str | None, SigningKey]:
        url = self.jwks_url or await self._discover()
        return signing_keys_from(await self._fetch(url), url)

    async def _discover(self) -> str:
        url = self.issuer.rstrip("/") + DISCOVERY_PATH
        document = await self._fetch(url)
        if not isinstance(document, Mapping):
            raise JwksUnavailable(f"{url} is not an OpenID Connect discovery document")
        if document.get("issuer") != self.issuer:
            # OpenID Connect Discovery 1.0, section 4.3: the document must name the issuer it was read for.
            raise JwksUnavailable(f"{url} names another issuer than {self.issuer}")
        jwks_uri = document.get("jwks_uri")
        if not isinstance(jwks_uri, str):
            raise JwksUnavailable(f"{url} has no jwks_uri")
        problem = require_fetchable_url(jwks_uri, f"the jwks_uri of {url}")
        if problem is not None:
            raise JwksUnavailable(problem)
        self.jwks_url = jwks_uri  # discovery is read once; the key set is what gets refreshed
        return jwks_uri
