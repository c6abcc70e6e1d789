"""An OpenID Connect issuer on loopback for the external-issuer tests: real HTTP (a thread of this process),
OpenID Connect discovery and a JWKS of keys generated here (``cryptography``), and tokens signed with them.

It is what a provider (Auth0, Keycloak, ...) exposes to a resource server: ``{issuer}/.well-known/
openid-configuration`` naming ``jwks_uri``, and that key set. Keys can be rotated while it runs; every request
it answers is counted by path.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

AUDIENCE = "https://api.todos.example"


@dataclass(frozen=True)
class TestKey:
    kid: str
    algorithm: str  # RS256 or ES256
    private: Any

    @property
    def public_pem(self) -> bytes:
        return bytes(
            self.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def jwk(self) -> dict[str, Any]:
        codec = RSAAlgorithm if self.algorithm == "RS256" else ECAlgorithm
        jwk: dict[str, Any] = json.loads(codec.to_jwk(self.private.public_key()))
        return {**jwk, "kid": self.kid, "use": "sig"}


def new_key(algorithm: str = "RS256") -> TestKey:
    if algorithm == "RS256":
        private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif algorithm == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    else:
        raise ValueError(algorithm)
    return TestKey(uuid.uuid4().hex[:12], algorithm, private)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unsigned_parts(header: dict[str, Any], claims: dict[str, Any]) -> str:
    return _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())


class IdentityProvider:
    """Serves discovery and the JWKS at ``issuer`` (a path on a loopback port); ``with`` starts and stops it."""

    def __init__(self, *algorithms: str, tenant: str = "tenant") -> None:
        self.keys: list[TestKey] = [new_key(a) for a in algorithms or ("RS256",)]
        self.requests: Counter[str] = Counter()
        #: Cleared: JWKS requests wait until it is set again (a slow provider).
        self.open = threading.Event()
        self.open.set()
        #: Extra bytes in every JWKS answer (an oversized key set).
        self.padding = 0
        #: Replaces fields of the discovery document (e.g. another issuer, a jwks_uri elsewhere).
        self.discovery: dict[str, Any] = {}
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                provider.requests[self.path] += 1
                if self.path == f"/{tenant}/.well-known/openid-configuration":
                    body: dict[str, Any] = {
                        "issuer": provider.issuer,
                        "jwks_uri": provider.jwks_url,
                        **provider.discovery,
                    }
                elif self.path == f"/{tenant}/jwks":
                    provider.open.wait(60)
                    body = {"keys": [key.jwk() for key in provider.keys], "padding": "x" * provider.padding}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        base = f"http://127.0.0.1:{self.server.server_address[1]}/{tenant}"
        self.issuer = base
        self.jwks_url = base + "/jwks"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> IdentityProvider:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.open.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)

    @property
    def jwks_fetches(self) -> int:
        return self.requests["/" + self.jwks_url.split("/", 3)[3]]

    def config(self, **extra: Any) -> dict[str, Any]:
        """This issuer's entry for ``external_issuers`` / ``OFFLINE_JWT_ISSUERS`` (discovery unless told)."""
        return {"issuer": self.issuer, "audience": AUDIENCE, **extra}

    def rotate(self, algorithm: str = "RS256") -> TestKey:
        """Publish only a new key from now on (the old one is retired)."""
        key = new_key(algorithm)
        self.keys = [key]
        return key

    def claims(self, subject: str, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": AUDIENCE, "sub": subject, "iat": now, "exp": now + 3600}
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(
        self, subject: str, key: TestKey | None = None, headers: dict[str, Any] | None = None, **claims: Any
    ) -> str:
        """A token of this issuer signed with ``key`` (its first key by default); ``claims`` override or,
        as None, remove the defaults (iss, aud, sub, iat, exp: an hour)."""
        key = key or self.keys[0]
        return jwt.encode(
            self.claims(subject, **claims),
            key.private,
            algorithm=key.algorithm,
            headers={"kid": key.kid, **(headers or {})},
        )

    def hs256_with_public_key(self, subject: str) -> str:
        """The algorithm-confusion forgery: HS256 keyed with the issuer's public key (PEM), naming its kid."""
        key = self.keys[0]
        head = unsigned_parts({"alg": "HS256", "typ": "JWT", "kid": key.kid}, self.claims(subject))
        return head + "." + _b64(hmac.new(key.public_pem, head.encode(), hashlib.sha256).digest())

    def unsigned(self, subject: str) -> str:
        """``alg: none`` with an empty signature, naming a real kid."""
        return (
            unsigned_parts({"alg": "none", "typ": "JWT", "kid": self.keys[0].kid}, self.claims(subject)) + "."
        )
