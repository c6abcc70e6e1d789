"""Organizations on a live server: create, invite (single use, expiring, for one email), accept, roles and
who may do what, the active organization in the token, and sync scopes that follow membership — after a
member is removed, their device's next handshake gets none of the organization's new records, even with an
access token issued before the removal. SQLite and PostgreSQL (``postgres_url``) stores."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from offline import create_app, define_schema, t
from offline.store import App
from offline.sync import protocol as p
from server_runtime import create_relational_server_store, create_sqlite_server_store
from server_runtime.stores.base import ServerStore

from .conftest import bearer, http, sign_up, sync_url
from .part_two import Clock, claims_of, error_code, post, routes_with, serve_with
from .test_sync_auth import FAST, TIMEOUT, TokenClient, close_all, handshake, wait_for

ORG_SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {"notes": {"fields": {"orgId": t.string(), "title": t.string()}}},
        "sync": {"notes": {"where": {"orgId": "orgId"}}},
    }
)


def store_opener(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Callable[[], Awaitable[ServerStore]]:
    """Opens the store of ``kind`` (the PostgreSQL schema is made before the test's event loop starts)."""
    if kind == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
        return lambda: create_relational_server_store(url)

    async def sqlite() -> ServerStore:
        return create_sqlite_server_store(str(tmp_path / "server.db"))

    return sqlite


def device(tmp_path: Path, name: str, url: str, token: str) -> tuple[App, TokenClient]:
    client = TokenClient(token)
    app = create_app(
        ORG_SCHEMA, sync={"url": url, "auth_client": client, **FAST}, path=str(tmp_path / f"{name}.db")
    )
    return app, client


def titles(app: App) -> set[str]:
    return {r["title"] for r in app.notes.all().fetch()}


async def activate(client: httpx.AsyncClient, org_id: str, pair: dict[str, Any]) -> dict[str, Any]:
    response = await post(
        client, f"/auth/orgs/{org_id}/activate", None, {"refreshToken": pair["refreshToken"]}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_membership_roles_and_sync_scope(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    clock = Clock()
    open_store = store_opener(kind, request, tmp_path)

    async def scenario() -> None:
        store = await open_store()
        routes = routes_with(clock, roles=["editor"], invite_ttl=60)
        async with serve_with(store, routes, schema=ORG_SCHEMA) as server, http(server) as client:
            olga = await sign_up(client, "olga@example.com")
            max_ = await sign_up(client, "max@example.com")
            mia = await sign_up(client, "mia@example.com")
            eve = await sign_up(client, "eve@example.com")
            o_tok, m_tok, mia_tok = olga["accessToken"], max_["accessToken"], mia["accessToken"]
            assert claims_of(o_tok)["orgs"] == [] and "orgId" not in claims_of(o_tok)

            created = await post(client, "/auth/orgs", o_tok, {"name": "  Acme  "})
            assert created.status_code == 201, created.text
            org = created.json()
            assert (org["name"], org["role"]) == ("Acme", "owner")
            org_id = org["id"]
            assert error_code(await post(client, "/auth/orgs", o_tok, {"name": "  "})) == "INVALID_INPUT"
            assert error_code(await post(client, "/auth/orgs", None, {"name": "x"})) == "AUTH_FAILED"

            # Invites: owners and admins only; the token goes back to the inviter (no email is sent).
            bad_role = await post(
                client, f"/auth/orgs/{org_id}/invites", o_tok, {"email": "max@example.com", "role": "boss"}
            )
            assert (bad_role.status_code, bad_role.json()["error"]["field"]) == (400, "role")
            invite = await post(client, f"/auth/orgs/{org_id}/invites", o_tok, {"email": "MAX@example.com"})
            assert invite.status_code == 201, invite.text
            assert (invite.json()["email"], invite.json()["role"], invite.json()["expiresIn"]) == (
                "max@example.com",
                "member",
                60,
            )
            max_invite = invite.json()["inviteToken"]
            wrong_person = await post(
                client, "/auth/invites/accept", eve["accessToken"], {"inviteToken": max_invite}
            )
            assert (wrong_person.status_code, error_code(wrong_person)) == (403, "INVITE_EMAIL_MISMATCH")
            joined = await post(client, "/auth/invites/accept", m_tok, {"inviteToken": max_invite})
            assert joined.status_code == 200, joined.text
            assert joined.json() == {"orgId": org_id, "role": "member"}
            reused = await post(client, "/auth/invites/accept", m_tok, {"inviteToken": max_invite})
            assert (reused.status_code, error_code(reused)) == (404, "INVITE_INVALID")
            member_invites = await post(
                client, f"/auth/orgs/{org_id}/invites", m_tok, {"email": "eve@example.com"}
            )
            assert (member_invites.status_code, error_code(member_invites)) == (403, "FORBIDDEN")
            mia_invite = (
                await post(
                    client,
                    f"/auth/orgs/{org_id}/invites",
                    o_tok,
                    {"email": "mia@example.com", "role": "admin"},
                )
            ).json()
            assert (
                await post(
                    client, "/auth/invites/accept", mia_tok, {"inviteToken": mia_invite["inviteToken"]}
                )
            ).status_code == 200
            late_invite = (
                await post(client, f"/auth/orgs/{org_id}/invites", o_tok, {"email": "eve@example.com"})
            ).json()
            clock.advance(61)
            expired = await post(
                client,
                "/auth/invites/accept",
                eve["accessToken"],
                {"inviteToken": late_invite["inviteToken"]},
            )
            assert error_code(expired) == "INVITE_INVALID"
            outsider = await client.get(f"/auth/orgs/{org_id}/members", headers=bearer(eve["accessToken"]))
            assert (outsider.status_code, error_code(outsider)) == (404, "ORG_NOT_FOUND")

            members = await client.get(f"/auth/orgs/{org_id}/members", headers=bearer(m_tok))
            assert [(m["email"], m["role"]) for m in members.json()["members"]] == [
                ("olga@example.com", "owner"),
                ("max@example.com", "member"),
                ("mia@example.com", "admin"),
            ]
            listed = await client.get("/auth/orgs", headers=bearer(m_tok))
            assert [(o["id"], o["name"], o["role"]) for o in listed.json()["orgs"]] == [
                (org_id, "Acme", "member")
            ]

            # Roles: admins cannot touch owners; the last owner can neither leave nor be demoted.
            mia_id, max_id, olga_id = mia["user"]["id"], max_["user"]["id"], olga["user"]["id"]
            denied = await client.delete(f"/auth/orgs/{org_id}/members/{olga_id}", headers=bearer(mia_tok))
            assert (denied.status_code, error_code(denied)) == (403, "FORBIDDEN")
            last = await post(client, f"/auth/orgs/{org_id}/leave", o_tok)
            assert (last.status_code, error_code(last)) == (409, "LAST_OWNER")
            demote = await client.patch(
                f"/auth/orgs/{org_id}/members/{olga_id}", json={"role": "admin"}, headers=bearer(o_tok)
            )
            assert error_code(demote) == "LAST_OWNER"
            to_editor = await client.patch(
                f"/auth/orgs/{org_id}/members/{max_id}", json={"role": "editor"}, headers=bearer(mia_tok)
            )
            assert to_editor.json() == {"userId": max_id, "role": "editor"}
            self_promotion = await client.patch(
                f"/auth/orgs/{org_id}/members/{mia_id}", json={"role": "owner"}, headers=bearer(mia_tok)
            )
            assert error_code(self_promotion) == "FORBIDDEN"

            # The active organization travels in the token; refreshes keep it and re-check membership.
            olga = await activate(client, org_id, olga)
            max_ = await activate(client, org_id, max_)
            mia = await activate(client, org_id, mia)
            assert {k: claims_of(max_["accessToken"])[k] for k in ("orgId", "role", "orgs")} == {
                "orgId": org_id,
                "role": "editor",
                "orgs": [{"id": org_id, "role": "editor"}],
            }
            eve_in = await post(
                client, f"/auth/orgs/{org_id}/activate", None, {"refreshToken": eve["refreshToken"]}
            )
            assert (eve_in.status_code, error_code(eve_in)) == (404, "ORG_NOT_FOUND")
            eve = (await post(client, "/auth/refresh", None, {"refreshToken": eve["refreshToken"]})).json()
            assert "orgId" not in claims_of(eve["accessToken"])  # the refused switch left the token usable

            url = sync_url(server)
            reply, _ = await handshake(url, max_["accessToken"])
            assert isinstance(reply, p.HandshakeResponse) and reply.accepted_scope == {
                "notes": {"orgId": org_id}
            }

            o_app, _ = device(tmp_path, "olga", url, olga["accessToken"])
            m_app, _ = device(tmp_path, "max", url, max_["accessToken"])
            mia_app, _ = device(tmp_path, "mia", url, mia["accessToken"])
            e_app, _ = device(tmp_path, "eve", url, eve["accessToken"])
            try:
                o_app.notes.insert({"orgId": org_id, "title": "plan"})
                for app in (o_app, m_app, mia_app, e_app):
                    await app.sync.connect()
                await wait_for(
                    lambda: titles(m_app) == {"plan"} and titles(mia_app) == {"plan"}, "the org's note"
                )
                await e_app.sync.wait_until_synced(TIMEOUT)
                assert titles(e_app) == set()  # no active organization: nothing of it

                # Max is removed (by an admin). His device reconnects with the token it already had.
                removed = await client.delete(
                    f"/auth/orgs/{org_id}/members/{max_id}", headers=bearer(mia["accessToken"])
                )
                assert removed.status_code == 204
                await m_app.sync.disconnect()
                await mia_app.sync.disconnect()
                o_app.notes.insert({"orgId": org_id, "title": "after the removal"})
                await o_app.sync.wait_until_synced(TIMEOUT)
                await m_app.sync.connect()
                await mia_app.sync.connect()
                await wait_for(lambda: "after the removal" in titles(mia_app), "the new note at a member")
                await m_app.sync.wait_until_synced(TIMEOUT)
                assert "after the removal" not in titles(m_app)
                reply, _ = await handshake(url, max_["accessToken"])
                assert isinstance(reply, p.HandshakeResponse) and reply.accepted_scope == {}
                # His writes into the organization are refused too.
                rejected: list[Any] = []
                m_app.events.on("sync:rejected", rejected.append)
                m_app.notes.insert({"orgId": org_id, "title": "from outside"})
                await wait_for(lambda: len(rejected) == 1, "the rejection of max's write")
                assert rejected[0].code == "SCOPE_VIOLATION"
            finally:
                await close_all(o_app, m_app, mia_app, e_app)

            # His refresh yields a token without the organization; he cannot switch back to it.
            refreshed = (
                await post(client, "/auth/refresh", None, {"refreshToken": max_["refreshToken"]})
            ).json()
            assert claims_of(refreshed["accessToken"])["orgs"] == []
            assert "orgId" not in claims_of(refreshed["accessToken"])
            back = await post(
                client, f"/auth/orgs/{org_id}/activate", None, {"refreshToken": refreshed["refreshToken"]}
            )
            assert error_code(back) == "ORG_NOT_FOUND"
            left = await post(client, f"/auth/orgs/{org_id}/leave", mia["accessToken"])
            assert left.status_code == 204
            remaining = await client.get(f"/auth/orgs/{org_id}/members", headers=bearer(o_tok))
            assert [m["email"] for m in remaining.json()["members"]] == ["olga@example.com"]

    asyncio.run(scenario())
