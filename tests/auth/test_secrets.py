"""No secret in a log line or an error answer: passwords, access and refresh tokens, AUTH_SECRET, the OAuth
client secret, authorization codes, provider tokens, states and PKCE verifiers.

One full flow (every route, failures included, OAuth against the fake provider, sync handshakes) runs with the
server side logging everything down to DEBUG; every captured line and every error body is then searched.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import httpx

from offline.sync import protocol as p

from .conftest import (
    OTHER_SECRET,
    PASSWORD,
    SECRET,
    Capture,
    StoreFactory,
    bearer,
    http,
    make_routes,
    serve,
    sync_url,
)
from .fake_oauth import running_provider
from .test_sync_auth import handshake

REDIRECT = "http://127.0.0.1:9/app/callback"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def browser_redirect(url: str) -> dict[str, str]:
    """Open the provider's authorization page with urllib (which logs nothing) and read where it sends us."""
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        opener.open(url, timeout=10)
    except urllib.error.HTTPError as redirect:
        assert redirect.code == 302
        location = redirect.headers["Location"]
        return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query))
    raise AssertionError("the provider did not redirect")


def test_no_secret_reaches_logs_or_error_answers(tmp_path: Path, captured_logs: Capture) -> None:
    secrets: set[str] = {SECRET, OTHER_SECRET, PASSWORD, "wrong-password-123", "other-wrong-pass"}
    error_bodies: list[str] = []

    async def scenario() -> None:
        async with running_provider() as fake:
            secrets.add(fake.client_secret)
            routes = make_routes(
                oauth_providers={"fake": fake.config()},
                rate_limits={"account_attempts": 2, "address_attempts": 50},
            )
            store = await StoreFactory("sqlite", str(tmp_path / "server.db")).open()
            async with serve(store, routes) as server, http(server) as client:

                async def call(method: str, path: str, **kwargs: Any) -> httpx.Response:
                    response = await client.request(method, path, **kwargs)
                    if response.status_code >= 400:
                        error_bodies.append(response.text + repr(dict(response.headers)))
                    return response

                def keep(pair: dict[str, Any]) -> dict[str, Any]:
                    secrets.update(
                        {pair["accessToken"], pair["refreshToken"], pair["accessToken"].split(".")[2]}
                    )
                    return pair

                first = keep(
                    (
                        await call(
                            "POST", "/auth/sign-up", json={"email": "kim@example.com", "password": PASSWORD}
                        )
                    ).json()
                )
                await call("POST", "/auth/sign-up", json={"email": "kim@example.com", "password": PASSWORD})
                await call("POST", "/auth/sign-up", json={"email": PASSWORD, "password": PASSWORD})
                await call("POST", "/auth/sign-up", json={"email": "lee@example.com", "password": "short"})
                signed_in = await call(
                    "POST", "/auth/sign-in", json={"email": "kim@example.com", "password": PASSWORD}
                )
                second = keep(signed_in.json())
                for email in (
                    "kim@example.com",
                    "nobody@example.com",
                ):  # up to the account limit, and past it
                    for password in ("wrong-password-123", "other-wrong-pass", "wrong-password-123"):
                        await call("POST", "/auth/sign-in", json={"email": email, "password": password})
                await call("POST", "/auth/sign-in", json={"email": "kim@example.com", "password": PASSWORD})
                await call("GET", "/auth/me", headers=bearer(first["accessToken"]))
                rotated = keep(
                    (await call("POST", "/auth/refresh", json={"refreshToken": first["refreshToken"]})).json()
                )
                await call("POST", "/auth/refresh", json={"refreshToken": first["refreshToken"]})  # reuse
                await call("GET", "/auth/me", headers=bearer(rotated["accessToken"]))  # revoked
                await call("GET", "/auth/me", headers=bearer(rotated["accessToken"] + "x"))
                await call("POST", "/auth/refresh", json={"refreshToken": SECRET})

                # OAuth, including a failing callback.
                flow = (
                    await call("GET", "/auth/oauth/fake/authorize", params={"redirectUri": REDIRECT})
                ).json()
                secrets.add(flow["state"])
                back = await asyncio.to_thread(browser_redirect, flow["authorizationUrl"])
                secrets.add(back["code"])
                await call(
                    "POST",
                    "/auth/oauth/fake/callback",
                    json={"code": back["code"] + "x", "state": back["state"]},
                )
                flow = (
                    await call("GET", "/auth/oauth/fake/authorize", params={"redirectUri": REDIRECT})
                ).json()
                secrets.add(flow["state"])
                back = await asyncio.to_thread(browser_redirect, flow["authorizationUrl"])
                secrets.add(back["code"])
                oauth_pair = keep(
                    (
                        await call(
                            "POST",
                            "/auth/oauth/fake/callback",
                            json={"code": back["code"], "state": back["state"]},
                        )
                    ).json()
                )
                await call(
                    "POST", "/auth/oauth/fake/callback", json={"code": back["code"], "state": back["state"]}
                )
                secrets.update(fake.issued_codes + fake.issued_access + fake.verifiers)

                # Sync handshakes: accepted, refused, revoked.
                url = sync_url(server)
                reply, _ = await handshake(url, oauth_pair["accessToken"])
                assert isinstance(reply, p.HandshakeResponse) and reply.accepted
                for token in (second["accessToken"] + "x", rotated["accessToken"], SECRET):
                    reply, _ = await handshake(url, token)
                    assert isinstance(reply, p.ErrorMessage)
                    error_bodies.append(reply.message)

                await call("POST", "/auth/sign-out", json={"refreshToken": oauth_pair["refreshToken"]})
                await call("POST", "/auth/revoke", headers=bearer(second["accessToken"]), json={"all": True})

    asyncio.run(scenario())

    lines = captured_logs.lines
    text = "\n".join(lines)
    # The capture works and saw the flow: otherwise an empty log would pass trivially.
    for expected in (
        "signed up",
        "sign-in failed from",
        "too many failed attempts",
        "refresh token reuse detected",
        "signed in via fake",
        "oauth sign-in via fake failed",
        "sync handshake refused",
    ):
        assert expected in text, f"no log line mentions {expected!r}"
    assert len(error_bodies) >= 10
    for secret in sorted(secrets, key=len):
        assert len(secret) >= 8, secret
        for line in lines:
            assert secret not in line, f"a secret appears in the log line: {line[:200]}"
        for body in error_bodies:
            assert secret not in body, f"a secret appears in an error answer: {body[:200]}"
