"""OAuth sign-in (authorization code + PKCE S256) against a fake provider served over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from typing import Any

import httpx
import pytest

from offline.core.errors import OfflineError
from server_runtime import MemoryServerStore
from server_runtime.auth.oauth import providers_from

from .conftest import PASSWORD, StoreFactory, bearer, http, make_routes, serve, sign_up
from .fake_oauth import FakeProvider, running_provider

REDIRECT = "http://127.0.0.1:9/app/callback"


async def start_flow(
    client: httpx.AsyncClient, provider: str = "fake", redirect: str = REDIRECT
) -> dict[str, Any]:
    response = await client.get(f"/auth/oauth/{provider}/authorize", params={"redirectUri": redirect})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def play_browser(authorization_url: str) -> dict[str, str]:
    """What a browser does: open the provider's page, (sign in there,) and follow the redirect back."""
    async with httpx.AsyncClient() as browser:
        response = await browser.get(authorization_url, follow_redirects=False)
    assert response.status_code == 302, response.text
    location = response.headers["location"]
    assert location.startswith(REDIRECT + "?")
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(location).query))


async def sign_in_with_provider(client: httpx.AsyncClient, provider: str = "fake") -> httpx.Response:
    flow = await start_flow(client, provider)
    back = await play_browser(flow["authorizationUrl"])
    assert back["state"] == flow["state"]
    return await client.post(
        f"/auth/oauth/{provider}/callback",
        json={"code": back["code"], "state": back["state"], "redirectUri": REDIRECT},
    )


def test_oauth_sign_in_creates_then_finds_the_user(stores: StoreFactory) -> None:
    async def scenario() -> None:
        async with running_provider() as fake:
            routes = make_routes(oauth_providers={"fake": fake.config()})
            async with serve(await stores.open(), routes) as server, http(server) as client:
                flow = await start_flow(client)
                query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(flow["authorizationUrl"]).query))
                assert flow["authorizationUrl"].startswith(fake.url + "/authorize?")
                assert query["code_challenge_method"] == "S256"
                assert query["client_id"] == fake.client_id
                assert query["redirect_uri"] == REDIRECT
                assert query["state"] == flow["state"]
                assert "code_verifier" not in query  # only its challenge travels through the browser

                back = await play_browser(flow["authorizationUrl"])
                answer = await client.post(
                    "/auth/oauth/fake/callback", json={"code": back["code"], "state": back["state"]}
                )
                assert answer.status_code == 200, answer.text
                pair = answer.json()
                assert pair["user"]["email"] == "olive@example.com"
                assert pair["tokenType"] == "Bearer"
                assert fake.pkce_verified == 1
                assert fake.auth_methods == ["client_secret_basic"]
                me = await client.get("/auth/me", headers=bearer(pair["accessToken"]))
                assert me.status_code == 200 and me.json()["email"] == "olive@example.com"
                refreshed = await client.post("/auth/refresh", json={"refreshToken": pair["refreshToken"]})
                assert refreshed.status_code == 200

                # The same provider account signs in to the same user, whatever its email says now.
                fake.user = ("provider-user-1", "olive.new@example.com", True)
                again = await sign_in_with_provider(client)
                assert again.status_code == 200
                assert again.json()["user"]["id"] == pair["user"]["id"]
                assert fake.pkce_verified == 2

                # The provider account has no password: password sign-in for its email fails like any other.
                refused = await client.post(
                    "/auth/sign-in", json={"email": "olive@example.com", "password": PASSWORD}
                )
                assert refused.status_code == 401
                assert refused.json()["error"]["code"] == "INVALID_CREDENTIALS"

    asyncio.run(scenario())


def test_code_verifier_must_match_the_challenge_of_the_flow() -> None:
    async def scenario() -> None:
        async with running_provider() as fake:
            routes = make_routes(oauth_providers={"fake": fake.config()})
            async with serve(MemoryServerStore(), routes) as server, http(server) as client:
                first = await start_flow(client)
                second = await start_flow(client)
                back = await play_browser(first["authorizationUrl"])
                # The code of the first flow with the second flow's state: the server sends the second flow's
                # verifier, which does not match the first challenge, and the provider refuses.
                mixed = await client.post(
                    "/auth/oauth/fake/callback", json={"code": back["code"], "state": second["state"]}
                )
                assert mixed.status_code == 400
                assert mixed.json()["error"]["code"] == "OAUTH_FAILED"
                assert "invalid_grant" in mixed.json()["error"]["message"]
                assert fake.pkce_verified == 0

    asyncio.run(scenario())


def test_state_is_single_use_and_belongs_to_its_provider() -> None:
    async def scenario() -> None:
        async with running_provider() as fake:
            routes = make_routes(oauth_providers={"fake": fake.config(), "other": fake.config()})
            async with serve(MemoryServerStore(), routes) as server, http(server) as client:
                flow = await start_flow(client)
                back = await play_browser(flow["authorizationUrl"])
                body = {"code": back["code"], "state": back["state"]}
                assert (await client.post("/auth/oauth/fake/callback", json=body)).status_code == 200
                replay = await client.post("/auth/oauth/fake/callback", json=body)
                assert replay.status_code == 400 and replay.json()["error"]["code"] == "OAUTH_FAILED"
                unknown = await client.post(
                    "/auth/oauth/fake/callback", json={"code": "c", "state": "made-up"}
                )
                assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "OAUTH_FAILED"

                other = await start_flow(client, "fake")
                back = await play_browser(other["authorizationUrl"])
                crossed = await client.post(
                    "/auth/oauth/other/callback", json={"code": back["code"], "state": back["state"]}
                )
                assert crossed.status_code == 400 and crossed.json()["error"]["code"] == "OAUTH_FAILED"

                moved = await start_flow(client)
                back = await play_browser(moved["authorizationUrl"])
                wrong_redirect = await client.post(
                    "/auth/oauth/fake/callback",
                    json={
                        "code": back["code"],
                        "state": back["state"],
                        "redirectUri": "https://evil.example/cb",
                    },
                )
                assert wrong_redirect.status_code == 400
                assert wrong_redirect.json()["error"]["field"] == "redirectUri"

                missing = [
                    await client.get("/auth/oauth/nope/authorize", params={"redirectUri": REDIRECT}),
                    await client.post("/auth/oauth/nope/callback", json=body),
                ]
                for response in missing:
                    assert response.status_code == 404
                    assert response.json()["error"]["code"] == "OAUTH_PROVIDER_UNKNOWN"
                no_redirect = await client.get("/auth/oauth/fake/authorize")
                assert (
                    no_redirect.status_code == 400 and no_redirect.json()["error"]["field"] == "redirectUri"
                )

    asyncio.run(scenario())


def test_provider_email_of_an_existing_account_is_refused_and_unverified_email_ignored() -> None:
    async def scenario() -> None:
        async with running_provider() as fake:
            routes = make_routes(
                oauth_providers={"fake": fake.config(token_endpoint_auth_method="client_secret_post")}
            )
            async with serve(MemoryServerStore(), routes) as server, http(server) as client:
                await sign_up(client, "olive@example.com")
                clash = await sign_in_with_provider(client)
                assert clash.status_code == 409
                assert clash.json()["error"]["code"] == "OAUTH_ACCOUNT_EXISTS"
                assert fake.auth_methods == ["client_secret_post"]

                fake.user = ("provider-user-2", "olive@example.com", False)  # the provider did not verify it
                unverified = await sign_in_with_provider(client)
                assert unverified.status_code == 200
                assert unverified.json()["user"]["email"] is None

    asyncio.run(scenario())


def test_unreachable_provider_is_a_bad_gateway() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there once closed

    async def scenario() -> None:
        async with running_provider() as fake:
            routes = make_routes(oauth_providers={"fake": fake.config(token_url=f"{dead}/token", timeout=5)})
            async with serve(MemoryServerStore(), routes) as server, http(server) as client:
                answer = await sign_in_with_provider(client)
                assert answer.status_code == 502
                assert answer.json()["error"]["code"] == "OAUTH_FAILED"

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"authorize_url": "http://provider.example/authorize"}, "oauth_providers.p.authorize_url"),
        ({"token_url": None}, "oauth_providers.p.token_url"),
        ({"client_id": ""}, "oauth_providers.p.client_id"),
        ({"client_secret": None}, "oauth_providers.p.client_secret"),
        ({"token_endpoint_auth_method": "private_key_jwt"}, "oauth_providers.p.token_endpoint_auth_method"),
    ],
)
def test_provider_configuration_is_checked(config: dict[str, Any], field: str) -> None:
    base = FakeProvider(url="https://provider.example").config()
    with pytest.raises(OfflineError) as caught:
        providers_from({"p": {**base, **config}})
    assert caught.value.code == "AUTH_CONFIG"
    assert caught.value.context == {"field": field}
    assert base["client_secret"] not in caught.value.message


def test_provider_configuration_accepts_camel_case_and_public_clients() -> None:
    providers = providers_from(
        {
            "github": {
                "clientId": "id",
                "authorizeUrl": "https://github.example/login/oauth/authorize",
                "tokenUrl": "https://github.example/login/oauth/access_token",
                "userinfoUrl": "https://api.github.example/user",
                "tokenEndpointAuthMethod": "none",
            }
        }
    )
    assert providers["github"].client_secret is None
    assert providers["github"].token_endpoint_auth_method == "none"
    with pytest.raises(OfflineError, match="provider name"):
        providers_from({"Bad Name": {}})
    assert "secret" not in repr(FakeProvider(url="https://x.example").config()["client_id"])
