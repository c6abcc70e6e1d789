"""An in-process emulation of the auth routes' HTTP contract (/tmp/auth_contract.md), behind httpx.MockTransport.

The auth server is the true external boundary of the client under test, so the fake follows the contract
faithfully: HS256 JWT access tokens with sub/email/sid/iat/exp/typ/iss, opaque refresh tokens stored hashed
with a family, rotation with reuse detection (a second use revokes the family), revocation by session, the
error bodies and status codes, Retry-After on 429, OAuth state. Time comes from a clock the test controls.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

SECRET = b"test-secret-of-the-fake-auth-server"


class FakeClock:
    """Epoch seconds that only move when the test says so."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def sign_jwt(claims: dict[str, Any], secret: bytes = SECRET) -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps(claims).encode())
    signature = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(signature)}"


def verify_jwt(token: str, secret: bytes = SECRET) -> dict[str, Any] | None:
    try:
        header, payload, signature = token.split(".")
    except ValueError:
        return None
    expected = b64url(hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(expected, signature):
        return None
    head = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    if head.get("alg") != "HS256":
        return None
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


@dataclass
class RefreshRecord:
    user_id: str
    family: str
    sid: str
    expires_at: float
    used: bool = False


@dataclass
class FakeAuthServer:
    clock: FakeClock
    access_ttl: int = 900
    refresh_ttl: int = 30 * 24 * 3600
    max_failed_sign_ins: int = 5
    retry_after: int = 30
    users: dict[str, dict[str, str]] = field(default_factory=dict)  # email -> {id, password}
    refresh_tokens: dict[str, RefreshRecord] = field(default_factory=dict)  # sha256 hex -> record
    revoked_sids: set[str] = field(default_factory=set)
    failed_sign_ins: dict[str, int] = field(default_factory=dict)
    oauth_states: dict[str, tuple[str, str]] = field(default_factory=dict)  # state -> (provider, redirect)
    oauth_providers: tuple[str, ...] = ("github",)
    calls: list[tuple[str, str, Any]] = field(default_factory=list)  # (method, path, json body)
    unreachable: bool = False
    # When set, /auth/refresh waits for it: lets a test hold a refresh in flight.
    refresh_gate: asyncio.Event | None = None

    # -- helpers the tests use ----------------------------------------------------------------------------

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def http_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport())

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.calls]

    def verify_access(self, token: str) -> dict[str, Any] | None:
        """What a sync auth provider does: signature, type, expiry, revocation."""
        claims = verify_jwt(token)
        if claims is None or claims.get("typ") != "access" or claims.get("iss") != "offline":
            return None
        if claims["exp"] <= self.clock():
            return None
        if claims["sid"] in self.revoked_sids:
            return None
        return claims

    def session_alive(self, refresh_token: str) -> bool:
        record = self.refresh_tokens.get(_hash(refresh_token))
        return record is not None and not record.used and record.sid not in self.revoked_sids

    # -- the routes ---------------------------------------------------------------------------------------

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body: Any = json.loads(request.content) if request.content else None
        self.calls.append((request.method, path, body))
        if self.unreachable:
            raise httpx.ConnectError("connection refused", request=request)
        route = (request.method, path)
        if route == ("POST", "/auth/sign-up"):
            return self._sign_up(body)
        if route == ("POST", "/auth/sign-in"):
            return self._sign_in(body)
        if route == ("POST", "/auth/refresh"):
            if self.refresh_gate is not None:
                await self.refresh_gate.wait()
            return self._refresh(body)
        if route == ("POST", "/auth/sign-out"):
            return self._sign_out(body)
        if route == ("POST", "/auth/revoke"):
            return self._revoke(request, body)
        if route == ("GET", "/auth/me"):
            return self._me(request)
        parts = path.split("/")
        if len(parts) == 5 and parts[1:3] == ["auth", "oauth"]:
            provider, action = parts[3], parts[4]
            if provider not in self.oauth_providers:
                return _error(404, "OAUTH_PROVIDER_UNKNOWN", f"no OAuth provider named {provider}")
            if (request.method, action) == ("GET", "authorize"):
                return self._authorize(provider, request)
            if (request.method, action) == ("POST", "callback"):
                return self._callback(provider, body)
        return httpx.Response(404, text="Not Found")

    def _pair(
        self, user_id: str, email: str, *, family: str | None = None, sid: str | None = None
    ) -> dict[str, Any]:
        now = int(self.clock())
        sid = sid or uuid.uuid4().hex
        access = sign_jwt(
            {
                "sub": user_id,
                "email": email,
                "sid": sid,
                "iat": now,
                "exp": now + self.access_ttl,
                "typ": "access",
                "iss": "offline",
                "jti": uuid.uuid4().hex,
            }
        )
        refresh = secrets.token_urlsafe(32)
        self.refresh_tokens[_hash(refresh)] = RefreshRecord(
            user_id=user_id, family=family or uuid.uuid4().hex, sid=sid, expires_at=now + self.refresh_ttl
        )
        return {
            "user": {"id": user_id, "email": email},
            "accessToken": access,
            "refreshToken": refresh,
            "tokenType": "Bearer",
            "expiresIn": self.access_ttl,
            "refreshExpiresIn": self.refresh_ttl,
        }

    def _email_of(self, user_id: str) -> str:
        return next(email for email, user in self.users.items() if user["id"] == user_id)

    def _sign_up(self, body: Any) -> httpx.Response:
        invalid = _check_input(body)
        if invalid is not None:
            return invalid
        if body["email"] in self.users:
            return _error(409, "EMAIL_TAKEN", "an account with this email exists; sign in instead")
        user_id = str(uuid.uuid4())
        self.users[body["email"]] = {"id": user_id, "password": body["password"]}
        return httpx.Response(201, json=self._pair(user_id, body["email"]))

    def _sign_in(self, body: Any) -> httpx.Response:
        invalid = _check_input(body)
        if invalid is not None:
            return invalid
        email = body["email"]
        if self.failed_sign_ins.get(email, 0) >= self.max_failed_sign_ins:
            return _error(
                429,
                "RATE_LIMITED",
                "too many sign-in attempts; wait before trying again",
                headers={"Retry-After": str(self.retry_after)},
            )
        user = self.users.get(email)
        if user is None or not hmac.compare_digest(user["password"], body["password"]):
            self.failed_sign_ins[email] = self.failed_sign_ins.get(email, 0) + 1
            return _error(401, "INVALID_CREDENTIALS", "email or password is wrong")
        return httpx.Response(200, json=self._pair(user["id"], email))

    def _refresh(self, body: Any) -> httpx.Response:
        token = body.get("refreshToken") if isinstance(body, dict) else None
        record = self.refresh_tokens.get(_hash(token)) if isinstance(token, str) else None
        if record is None or record.expires_at <= self.clock() or record.sid in self.revoked_sids:
            return _error(401, "INVALID_REFRESH_TOKEN", "the refresh token is not valid; sign in again")
        if record.used:
            self.revoked_sids.add(record.sid)  # the whole family (one session) ends
            return _error(401, "REFRESH_TOKEN_REUSED", "this refresh token was already used; sign in again")
        record.used = True
        return httpx.Response(
            200,
            json=self._pair(
                record.user_id, self._email_of(record.user_id), family=record.family, sid=record.sid
            ),
        )

    def _sign_out(self, body: Any) -> httpx.Response:
        token = body.get("refreshToken") if isinstance(body, dict) else None
        record = self.refresh_tokens.get(_hash(token)) if isinstance(token, str) else None
        if record is None:
            return _error(401, "INVALID_REFRESH_TOKEN", "the refresh token is not valid")
        self.revoked_sids.add(record.sid)
        return httpx.Response(204)

    def _bearer_claims(self, request: httpx.Request) -> dict[str, Any] | None:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return None
        return self.verify_access(header[len("Bearer ") :])

    def _revoke(self, request: httpx.Request, body: Any) -> httpx.Response:
        claims = self._bearer_claims(request)
        if claims is None:
            return _error(401, "AUTH_FAILED", "sign in again", headers={"WWW-Authenticate": "Bearer"})
        if isinstance(body, dict) and body.get("all") is True:
            self.revoked_sids.update(
                r.sid for r in self.refresh_tokens.values() if r.user_id == claims["sub"]
            )
        else:
            self.revoked_sids.add(claims["sid"])
        return httpx.Response(204)

    def _me(self, request: httpx.Request) -> httpx.Response:
        claims = self._bearer_claims(request)
        if claims is None:
            return _error(401, "AUTH_FAILED", "sign in again", headers={"WWW-Authenticate": "Bearer"})
        return httpx.Response(200, json={"id": claims["sub"], "email": claims["email"], "createdAt": 0})

    def _authorize(self, provider: str, request: httpx.Request) -> httpx.Response:
        redirect = request.url.params.get("redirectUri")
        if not redirect:
            return _error(400, "INVALID_INPUT", "redirectUri is required", field_name="redirectUri")
        state = secrets.token_urlsafe(16)
        self.oauth_states[state] = (provider, redirect)
        query = urllib.parse.urlencode({"state": state, "redirect_uri": redirect, "client_id": "fake"})
        return httpx.Response(
            200, json={"authorizationUrl": f"https://{provider}.example/authorize?{query}", "state": state}
        )

    def _callback(self, provider: str, body: Any) -> httpx.Response:
        state = body.get("state") if isinstance(body, dict) else None
        expected = self.oauth_states.pop(state, None) if isinstance(state, str) else None
        if expected is None or expected[0] != provider or body.get("code") != "good-code":
            return _error(400, "OAUTH_FAILED", "the OAuth sign-in could not be completed; start again")
        email = f"oauth-user@{provider}.example"
        user = self.users.setdefault(email, {"id": str(uuid.uuid4()), "password": ""})
        return httpx.Response(200, json=self._pair(user["id"], email))


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _error(
    status: int,
    code: str,
    message: str,
    *,
    headers: dict[str, str] | None = None,
    field_name: str | None = None,
) -> httpx.Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if field_name is not None:
        error["field"] = field_name
    return httpx.Response(status, json={"error": error}, headers=headers)


def _check_input(body: Any) -> httpx.Response | None:
    if not isinstance(body, dict):
        return _error(400, "INVALID_INPUT", "the body must be a JSON object", field_name="body")
    email = body.get("email")
    if not isinstance(email, str) or "." not in email.partition("@")[2]:
        return _error(400, "INVALID_INPUT", "email is not a valid address", field_name="email")
    password = body.get("password")
    if not isinstance(password, str) or len(password) < 8:
        return _error(400, "INVALID_INPUT", "password must be at least 8 characters", field_name="password")
    return None
