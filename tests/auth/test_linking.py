"""Account linking on a live server (SQLite store) against the fake OAuth provider: an identity joins an
existing account only with proof of both (the account's access token and a completed provider flow that
the same account started); no silent linking by email; an identity linked elsewhere is refused."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from server_runtime import create_sqlite_server_store

from .conftest import bearer, http, sign_up
from .fake_oauth import running_provider
from .part_two import Clock, code_at, error_code, post, routes_with, serve_with
from .test_oauth import REDIRECT, play_browser, sign_in_with_provider


async def start_link(client: httpx.AsyncClient, token: str | None) -> httpx.Response:
    headers = bearer(token) if token else {}
    return await client.get(
        "/auth/link/oauth/fake/authorize", params={"redirectUri": REDIRECT}, headers=headers
    )


async def link(client: httpx.AsyncClient, token: str | None, back: dict[str, str]) -> httpx.Response:
    body = {"code": back["code"], "state": back["state"], "redirectUri": REDIRECT}
    return await post(client, "/auth/link/oauth/fake/callback", token, body)


def test_linking_needs_proof_of_both_accounts(tmp_path: Path) -> None:
    clock = Clock()

    async def scenario() -> None:
        async with running_provider() as fake:
            routes = routes_with(clock, oauth_providers={"fake": fake.config()})
            store = create_sqlite_server_store(str(tmp_path / "server.db"))
            async with serve_with(store, routes) as server, http(server) as client:
                # The provider's user (olive@example.com) already has a password account.
                olive = await sign_up(client, "olive@example.com")
                bob = await sign_up(client, "bob@example.com")
                refused = await sign_in_with_provider(client)
                assert (refused.status_code, error_code(refused)) == (409, "OAUTH_ACCOUNT_EXISTS")
                assert "/auth/link/oauth/" in refused.json()["error"]["message"]

                # Without the account's access token: no linking.
                assert error_code(await start_link(client, None)) == "AUTH_FAILED"
                flow = (await start_link(client, olive["accessToken"])).json()
                back = await play_browser(flow["authorizationUrl"])
                anonymous = await link(client, None, back)
                assert (anonymous.status_code, error_code(anonymous)) == (401, "AUTH_FAILED")
                # Someone else's token with olive's flow: the state belongs to olive's account.
                hijack = await link(client, bob["accessToken"], back)
                assert (hijack.status_code, error_code(hijack)) == (400, "OAUTH_FAILED")
                # A sign-in flow's state is no linking state either.
                sign_in_flow = (
                    await client.get("/auth/oauth/fake/authorize", params={"redirectUri": REDIRECT})
                ).json()
                back = await play_browser(sign_in_flow["authorizationUrl"])
                assert error_code(await link(client, olive["accessToken"], back)) == "OAUTH_FAILED"

                # Both proofs: linked. From then on the provider signs in to olive's account.
                flow = (await start_link(client, olive["accessToken"])).json()
                back = await play_browser(flow["authorizationUrl"])
                linked = await link(client, olive["accessToken"], back)
                assert linked.status_code == 200, linked.text
                assert linked.json() == {
                    "linked": True,
                    "provider": "fake",
                    "email": "olive@example.com",
                    "alreadyLinked": False,
                }
                via_provider = await sign_in_with_provider(client)
                assert via_provider.status_code == 200, via_provider.text
                assert via_provider.json()["user"] == olive["user"]
                again = await link(
                    client,
                    olive["accessToken"],
                    await play_browser(
                        (await start_link(client, olive["accessToken"])).json()["authorizationUrl"]
                    ),
                )
                assert again.json()["alreadyLinked"] is True

                # The same provider identity cannot be linked to a second account.
                flow = (await start_link(client, bob["accessToken"])).json()
                taken = await link(client, bob["accessToken"], await play_browser(flow["authorizationUrl"]))
                assert (taken.status_code, error_code(taken)) == (409, "OAUTH_IDENTITY_LINKED")

                # A provider sign-in of an account with TOTP asks for the code as well.
                secret = (await post(client, "/auth/mfa/totp/enroll", olive["accessToken"])).json()["secret"]
                await post(
                    client, "/auth/mfa/totp/verify", olive["accessToken"], {"code": code_at(secret, clock)}
                )
                second_step: dict[str, Any] = (await sign_in_with_provider(client)).json()
                assert second_step["mfaRequired"] is True and "accessToken" not in second_step
                clock.next_step()
                done = await post(
                    client,
                    "/auth/mfa/challenge",
                    None,
                    {"mfaToken": second_step["mfaToken"], "code": code_at(secret, clock)},
                )
                assert done.json()["user"] == olive["user"]

    asyncio.run(scenario())
