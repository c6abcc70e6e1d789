"""Access tokens: HS256 with AUTH_SECRET and nothing else; expiry; claims; weak secrets refused."""

from __future__ import annotations

import base64
import json
from typing import Any

import jwt
import pytest

from offline.core.errors import OfflineError
from server_runtime.auth.tokens import (
    ISSUER,
    InvalidToken,
    TokenService,
    hash_secret,
    new_refresh_token,
)

from .conftest import OTHER_SECRET, SECRET

NOW = 1_800_000_000.0


def service(secret: str = SECRET, now: float = NOW, ttl: float = 900) -> TokenService:
    return TokenService(secret, access_ttl=ttl, now=lambda: now)


def b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return decoded


def test_issued_token_carries_the_contract_claims_and_verifies() -> None:
    tokens = service()
    access = tokens.issue_access(user_id="u1", email="a@example.com", session_id="s1")
    assert access.expires_in == 900
    assert access.expires_at == int(NOW) + 900
    header = jwt.get_unverified_header(access.token)
    assert header["alg"] == "HS256"
    claims = tokens.verify_access(access.token)
    assert claims == {
        "sub": "u1",
        "email": "a@example.com",
        "sid": "s1",
        "iat": int(NOW),
        "exp": int(NOW) + 900,
        "typ": "access",
        "iss": ISSUER,
    }


def test_expired_token_is_refused() -> None:
    access = service(now=NOW).issue_access(user_id="u1", email=None, session_id="s1")
    assert service(now=NOW + 899).verify_access(access.token)["sub"] == "u1"
    with pytest.raises(InvalidToken) as caught:
        service(now=NOW + 900).verify_access(access.token)
    assert caught.value.reason == "token expired"
    # A token from the future (beyond a minute of clock skew) is refused as well.
    with pytest.raises(InvalidToken, match="not valid yet"):
        service(now=NOW - 61).verify_access(access.token)
    assert service(now=NOW - 59).verify_access(access.token)["sub"] == "u1"


def test_alg_none_is_refused() -> None:
    good = claims_of(service().issue_access(user_id="u1", email=None, session_id="s1").token)
    for alg in ("none", "None", "NONE"):
        forged = f"{b64({'alg': alg, 'typ': 'JWT'})}.{b64(good)}."
        with pytest.raises(InvalidToken, match="not accepted"):
            service().verify_access(forged)


def test_other_secret_and_other_algorithms_are_refused() -> None:
    claims = claims_of(service().issue_access(user_id="u1", email=None, session_id="s1").token)
    signed_elsewhere = jwt.encode(claims, OTHER_SECRET, algorithm="HS256")
    with pytest.raises(InvalidToken, match="bad signature"):
        service().verify_access(signed_elsewhere)
    for alg in ("HS384", "HS512"):
        other_alg = jwt.encode(claims, SECRET + "-padding-for-hs512-keys-0123456789", algorithm=alg)
        with pytest.raises(InvalidToken, match="not accepted"):
            service().verify_access(other_alg)
    # A valid signature over a tampered payload fails too.
    header, _, signature = service().issue_access(user_id="u1", email=None, session_id="s1").token.split(".")
    tampered = f"{header}.{b64({**claims, 'sub': 'someone-else'})}.{signature}"
    with pytest.raises(InvalidToken, match="bad signature"):
        service().verify_access(tampered)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"typ": "refresh"}, "not an access token"),
        ({"iss": "elsewhere"}, "InvalidIssuerError"),
        ({"sid": None}, "MissingRequiredClaimError"),
        ({"sub": 42}, "InvalidSubjectError"),
        ({"exp": "soon"}, "malformed claims"),
    ],
)
def test_claims_must_match_the_contract(change: dict[str, Any], reason: str) -> None:
    claims = claims_of(service().issue_access(user_id="u1", email=None, session_id="s1").token)
    claims.update(change)
    claims = {k: v for k, v in claims.items() if v is not None}
    with pytest.raises(InvalidToken, match=reason):
        service().verify_access(jwt.encode(claims, SECRET, algorithm="HS256"))


@pytest.mark.parametrize("token", [None, "", "not-a-jwt", "a.b.c"])
def test_garbage_is_refused(token: str | None) -> None:
    with pytest.raises(InvalidToken):
        service().verify_access(token)


def test_weak_secret_and_bad_lifetime_are_configuration_errors() -> None:
    with pytest.raises(OfflineError) as caught:
        TokenService("short-secret")
    assert caught.value.code == "AUTH_CONFIG"
    assert caught.value.context == {"field": "secret", "minBytes": 32}
    assert "short-secret" not in caught.value.message
    with pytest.raises(OfflineError, match="access_ttl"):
        TokenService(SECRET, access_ttl=0)
    assert SECRET not in repr(TokenService(SECRET))


def test_refresh_tokens_are_random_and_stored_as_hashes() -> None:
    tokens = {new_refresh_token() for _ in range(200)}
    assert len(tokens) == 200
    token = next(iter(tokens))
    assert len(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))) == 32
    digest = hash_secret(token)
    assert len(digest) == 64 and token not in digest
    assert hash_secret(token) == digest
