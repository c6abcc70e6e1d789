"""A small but faithful OAuth 2.0 provider on loopback (real HTTP, uvicorn) for the OAuth tests.

- ``GET /authorize``: checks client id, ``response_type=code``, the redirect URI and an S256 code challenge,
  then redirects to ``redirect_uri?code=...&state=...`` (the test plays the browser and reads the Location).
- ``POST /token``: client authentication (HTTP Basic, or ``client_secret_post``), ``grant_type``, a code that
  exists and was not used, the same ``redirect_uri``, and ``BASE64URL(SHA256(code_verifier)) == challenge``
  (RFC 7636 4.6); a failure answers 400 ``{"error": "invalid_grant"}`` and burns the code.
- ``GET /userinfo``: the user behind a Bearer access token.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import secrets
import socket
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route


@dataclass
class Grant:
    challenge: str
    redirect_uri: str
    subject: str


@dataclass
class FakeProvider:
    client_id: str = "fake-client-id"
    client_secret: str = "fake-client-secret-0a1b2c3d4e5f"
    # The user who signs in at the provider next: (subject, email, email_verified).
    user: tuple[str, str | None, bool] = ("provider-user-1", "olive@example.com", True)
    emails: dict[str, tuple[str | None, bool]] = field(default_factory=dict)
    grants: dict[str, Grant] = field(default_factory=dict)
    access: dict[str, str] = field(default_factory=dict)
    issued_codes: list[str] = field(default_factory=list)
    issued_access: list[str] = field(default_factory=list)
    pkce_verified: int = 0
    verifiers: list[str] = field(default_factory=list)
    auth_methods: list[str] = field(default_factory=list)
    url: str = ""

    def config(self, **overrides: Any) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "client_secret": self.client_secret,
            "authorize_url": f"{self.url}/authorize",
            "token_url": f"{self.url}/token",
            "userinfo_url": f"{self.url}/userinfo",
            "scope": "openid email",
            **overrides,
        }

    # -- endpoints ----------------------------------------------------------------------------------------------

    async def authorize(self, request: Request) -> Response:
        q = request.query_params
        if q.get("client_id") != self.client_id or q.get("response_type") != "code":
            return JSONResponse({"error": "unauthorized_client"}, status_code=400)
        if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
            return JSONResponse({"error": "invalid_request", "error_description": "PKCE S256 required"}, 400)
        redirect = q.get("redirect_uri")
        if not redirect:
            return JSONResponse({"error": "invalid_request"}, status_code=400)
        subject, email, verified = self.user
        self.emails[subject] = (email, verified)
        code = secrets.token_urlsafe(24)
        self.issued_codes.append(code)
        self.grants[code] = Grant(q["code_challenge"], redirect, subject)
        target = redirect + "?" + urllib.parse.urlencode({"code": code, "state": q.get("state", "")})
        return RedirectResponse(target, status_code=302)

    def _client_ok(self, request: Request, form: Any) -> bool:
        header = request.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            self.auth_methods.append("client_secret_basic")
            return (
                urllib.parse.unquote(user) == self.client_id
                and urllib.parse.unquote(password) == self.client_secret
            )
        self.auth_methods.append("client_secret_post")
        return bool(
            form.get("client_id") == self.client_id and form.get("client_secret") == self.client_secret
        )

    async def token(self, request: Request) -> Response:
        form = dict(urllib.parse.parse_qsl((await request.body()).decode("ascii")))
        if not self._client_ok(request, form):
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        if form.get("grant_type") != "authorization_code":
            return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
        grant = self.grants.pop(str(form.get("code", "")), None)  # single use, even when refused
        if grant is None or form.get("redirect_uri") != grant.redirect_uri:
            return JSONResponse({"error": "invalid_grant"}, status_code=400)
        verifier = str(form.get("code_verifier", ""))
        self.verifiers.append(verifier)
        digest = (
            base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode()
        )
        if not 43 <= len(verifier) <= 128 or digest != grant.challenge:
            return JSONResponse(
                {"error": "invalid_grant", "error_description": "PKCE verification failed"}, 400
            )
        self.pkce_verified += 1
        token = secrets.token_urlsafe(24)
        self.issued_access.append(token)
        self.access[token] = grant.subject
        return JSONResponse({"access_token": token, "token_type": "Bearer", "expires_in": 3600})

    async def userinfo(self, request: Request) -> Response:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        subject = self.access.get(token) if scheme.lower() == "bearer" else None
        if subject is None:
            return JSONResponse({"error": "invalid_token"}, status_code=401)
        email, verified = self.emails[subject]
        return JSONResponse({"sub": subject, "email": email, "email_verified": verified, "name": "Olive"})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/authorize", self.authorize),
                Route("/token", self.token, methods=["POST"]),
                Route("/userinfo", self.userinfo),
            ]
        )


@contextlib.asynccontextmanager
async def running_provider() -> AsyncIterator[FakeProvider]:
    """The fake provider listening on a free loopback port in this event loop."""
    provider = FakeProvider()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    provider.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(provider.app(), log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield provider
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        sock.close()
