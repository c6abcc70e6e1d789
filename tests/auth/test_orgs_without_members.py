"""An organization whose last member's account was deleted (user administration allows it: nobody is
stranded) has nobody to answer for it: its pending invites are withdrawn with the account, and an invite that
still reaches such an organization is refused (ORG_WITHOUT_OWNER), so accepting one never makes a member of an
organization without an owner. Memory, SQLite and PostgreSQL stores, on a live server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from server_runtime import create_production_server
from server_runtime.auth.storage_ext import InviteRow
from server_runtime.auth.tokens import hash_secret

from .conftest import SCHEMA, StoreFactory, bearer, make_routes, sign_up

ADMIN_TOKEN = "admin-token-3c1e9a7b5d2f4e6a8c0b1d3f5a7c9e1b"


def test_deleting_the_last_member_withdraws_the_invites_and_an_ownerless_org_takes_nobody(
    stores: StoreFactory,
) -> None:
    async def scenario() -> None:
        store = await stores.open()
        await store.set_schema(SCHEMA)
        routes = make_routes()
        server = create_production_server(
            store=store,
            port=0,
            host="127.0.0.1",
            auth_routes=routes,
            operational_auth={"adminToken": ADMIN_TOKEN},
        )
        url = await server.start()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:

                async def call(method: str, path: str, pair: dict[str, Any], body: Any = None) -> Any:
                    response = await client.request(
                        method, path, json=body, headers=bearer(pair["accessToken"])
                    )
                    assert response.status_code < 300, response.text
                    return response.json() if response.content else None

                olga = await sign_up(client, "olga@example.com")
                max_ = await sign_up(client, "max@example.com")
                org = await call("POST", "/auth/orgs", olga, {"name": "Acme"})
                invite = await call(
                    "POST", f"/auth/orgs/{org['id']}/invites", olga, {"email": "max@example.com"}
                )
                other = await call("POST", "/auth/orgs", olga, {"name": "Beta"})
                await call("POST", f"/auth/orgs/{other['id']}/invites", olga, {"email": "max@example.com"})
                deleted = await client.delete(
                    f"/__offline/users/{olga['user']['id']}", headers=bearer(ADMIN_TOKEN)
                )
                assert deleted.status_code == 200, deleted.text

                # The invite went with its organization's last member.
                accepted = await client.post(
                    "/auth/invites/accept",
                    json={"inviteToken": invite["inviteToken"]},
                    headers=bearer(max_["accessToken"]),
                )
                assert accepted.status_code == 404, accepted.text
                assert accepted.json()["error"]["code"] == "INVITE_INVALID"
                assert (await call("GET", "/auth/orgs", max_))["orgs"] == []

                # An invite that reaches such an organization anyway (written before this rule, or by
                # another process's racing invite) is refused, and spent.
                token = "left-over-invite-token-0123456789"
                now = int(time.time() * 1000)
                async with routes._store().transaction() as tx:
                    await tx.insert_invite(
                        InviteRow(
                            hash_secret(token),
                            org["id"],
                            "max@example.com",
                            "member",
                            olga["user"]["id"],
                            now,
                            now + 3_600_000,
                        )
                    )
                refused = await client.post(
                    "/auth/invites/accept", json={"inviteToken": token}, headers=bearer(max_["accessToken"])
                )
                assert refused.status_code == 409, refused.text
                error = refused.json()["error"]
                assert error["code"] == "ORG_WITHOUT_OWNER" and org["id"] in error["message"]
                assert (await call("GET", "/auth/orgs", max_))["orgs"] == []
                again = await client.post(
                    "/auth/invites/accept", json={"inviteToken": token}, headers=bearer(max_["accessToken"])
                )
                assert again.json()["error"]["code"] == "INVITE_INVALID"
        finally:
            await server.stop()
            await store.close()

    asyncio.run(scenario())
