"""User administration and the audit log against real server processes (``/__offline/users``,
``/__offline/audit``): disabling closes a live sync socket and refuses the next sign-in, refresh and
handshake (``USER_DISABLED``) until the user is enabled; a forced sign-out closes sockets; deleting removes
the account (records stay); each action is an audit entry, seen on the live event stream too; the API wants
the admin token (wrong ones rate-limited, none configured: refused). On SQLite, and on two processes sharing
PostgreSQL (the admin acts through one, the socket is held by the other)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from offline.auth import AuthError, create_offline_auth
from tests.hardening.support import RawClient
from tests.server.test_operational import EventReader
from tests.support.servers import ServerProcess

from .conftest import PASSWORD
from .live import TIMEOUT, auth_server, client_from, sign_in_from, sign_up_from, wait_for
from .test_live_session_ends import board, servers

ADMIN_TOKEN = "admin-token-5b0e5d1c9a8f4e3d2c1b0a9f8e7d6c5b"
ADMIN = {"OFFLINE_ADMIN_TOKEN": ADMIN_TOKEN}


def admin(process: ServerProcess, token: str = ADMIN_TOKEN) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=process.http_url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"}
    )


async def refused_handshake(process: ServerProcess, token: str) -> str:
    """The error code a handshake with ``token`` gets."""
    client = RawClient(process.sync_url, token=token)
    try:
        with pytest.raises(AssertionError) as refused:
            await client.open()
    finally:
        await client.close()
    text = str(refused.value)
    return next(code for code in ("USER_DISABLED", "AUTH_FAILED", "SESSION_REVOKED") if code in text)


async def audit_kinds(process: ServerProcess, user_id: str) -> list[str]:
    async with admin(process) as http:
        response = await http.get("/__offline/audit", params={"user": user_id, "limit": 500})
    assert response.status_code == 200, response.text
    return [entry["kind"] for entry in reversed(response.json()["entries"])]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_disable_closes_the_socket_and_refuses_sign_in_refresh_and_sync_until_enabled(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with servers(kind, tmp_path, request, **ADMIN) as where:

        async def scenario() -> None:
            victim = await sign_up_from(where.first, "victim@example.com")
            other = await sign_up_from(where.first, "other@example.com")
            user_id = victim["user"]["id"]
            async with httpx.AsyncClient(timeout=None) as stream_http:
                events = EventReader(
                    stream_http, where.second.http_url, {"Authorization": f"Bearer {ADMIN_TOKEN}"}
                )
                await events.wait(lambda: "ready" in events.kinds(), "the event stream")
                held = RawClient(where.first.sync_url, token=victim["accessToken"])
                peer = RawClient(where.first.sync_url, token=other["accessToken"])
                await held.open()
                await peer.open()
                try:
                    await held.push([board(held.writer, "before")])
                    async with admin(where.second) as http:
                        shown = (await http.get(f"/__offline/users/{user_id}")).json()
                        assert shown["email"] == "victim@example.com" and shown["disabled"] is None
                        assert [s["live"] for s in shown["sessions"]] == [True]
                        assert shown["devices"] == [held.writer.node]

                        disabled = await http.post(
                            f"/__offline/users/{user_id}/disable", json={"reason": "abuse"}
                        )
                        assert disabled.status_code == 200, disabled.text
                        assert disabled.json() == {
                            "id": user_id,
                            "disabled": True,
                            "changed": True,
                            "sessionsRevoked": 1,
                        }
                    # The live socket is told and closed; the other user's is untouched.
                    assert await held.wait_closed() == 1008
                    assert [e.code for e in held.errors] == ["SESSION_REVOKED"]
                    assert peer.closed is None

                    # Sign-in (right password), refresh and the handshake all say USER_DISABLED.
                    signed_in = await sign_in_from(where.first, "victim@example.com")
                    assert signed_in.status_code == 403
                    assert signed_in.json()["error"]["code"] == "USER_DISABLED"
                    wrong = await sign_in_from(where.first, "victim@example.com", password="not the password")
                    assert wrong.json()["error"]["code"] == "INVALID_CREDENTIALS"  # nothing told to a guesser
                    async with client_from(where.first) as client:
                        refreshed = await client.post(
                            "/auth/refresh", json={"refreshToken": victim["refreshToken"]}
                        )
                    assert refreshed.json()["error"]["code"] == "USER_DISABLED"
                    assert await refused_handshake(where.first, victim["accessToken"]) == "USER_DISABLED"
                    async with admin(where.second) as http:
                        listed = (await http.get("/__offline/users", params={"q": "victim"})).json()
                        assert listed["users"][0]["disabled"]["reason"] == "abuse"
                        enabled = await http.post(f"/__offline/users/{user_id}/enable")
                        assert enabled.json() == {"id": user_id, "disabled": False, "changed": True}

                    # Enabled: signing in works again and its token opens a sync session.
                    again = await sign_in_from(where.first, "victim@example.com")
                    assert again.status_code == 200, again.text
                    fresh = RawClient(where.first.sync_url, token=again.json()["accessToken"])
                    await fresh.open()
                    await fresh.close()

                    await events.wait(
                        lambda: {"user-disabled", "user-enabled"} <= {e["kind"] for e in events.of("audit")},
                        "the admin actions on the event stream",
                    )
                finally:
                    await held.close()
                    await peer.close()
                    await events.close()
            kinds = await audit_kinds(where.second, user_id)
            assert kinds[0] == "sign-up"
            assert kinds[1:] == [
                "user-disabled",
                "sign-in-failed",  # the right password, refused: disabled
                "sign-in-failed",  # the wrong password
                "sign-in-failed",  # the refresh
                "user-enabled",
                "sign-in",
            ]
            async with admin(where.second) as http:
                entries = (
                    await http.get("/__offline/audit", params={"user": user_id, "kind": "user-disabled"})
                ).json()
            [entry] = entries["entries"]
            assert entry["actor"] == "admin" and entry["detail"] == {"sessionsRevoked": 1, "reason": "abuse"}

        asyncio.run(scenario())


def test_sign_out_and_delete(tmp_path: Path) -> None:
    with servers("sqlite", tmp_path, **ADMIN) as where:

        async def scenario() -> None:
            user = await sign_up_from(where.first, "leaving@example.com")
            second = (await sign_in_from(where.first, "leaving@example.com")).json()
            other = await sign_up_from(where.first, "staying@example.com")
            user_id = user["user"]["id"]
            held = [RawClient(where.first.sync_url, token=pair["accessToken"]) for pair in (user, second)]
            for client in held:
                await client.open()
            await held[0].push([board(held[0].writer, "written before leaving")])
            async with admin(where.first) as http:
                out = await http.post(f"/__offline/users/{user_id}/sign-out")
                assert out.json() == {"id": user_id, "sessionsRevoked": 2}
                for client in held:
                    assert await client.wait_closed() == 1008
                    await client.close()
                assert await refused_handshake(where.first, user["accessToken"]) == "AUTH_FAILED"
                # Not disabled: signing in again works.
                back = await sign_in_from(where.first, "leaving@example.com")
                assert back.status_code == 200
                live = RawClient(where.first.sync_url, token=back.json()["accessToken"])
                await live.open()

                deleted = await http.delete(f"/__offline/users/{user_id}")
                assert deleted.status_code == 200, deleted.text
                body = deleted.json()
                assert body["deleted"] is True and body["sessionsEnded"] == 1 and "records" in body["kept"]
                assert await live.wait_closed() == 1008
                await live.close()
                assert (await http.get(f"/__offline/users/{user_id}")).json()["error"][
                    "code"
                ] == "USER_NOT_FOUND"
                assert (await http.delete(f"/__offline/users/{user_id}")).status_code == 404
                assert (await http.post(f"/__offline/users/{user_id}/disable")).status_code == 404
                gone = await sign_in_from(where.first, "leaving@example.com")
                assert gone.json()["error"]["code"] == "INVALID_CREDENTIALS"
                # The records it wrote stay.
                watcher = RawClient(where.first.sync_url, token=other["accessToken"])
                await watcher.open()
                await wait_for(
                    lambda: any(op["data"]["name"] == "written before leaving" for op in watcher.received),
                    "the deleted user's record",
                )
                await watcher.close()
                # The email can sign up again, as a new account.
                again = await sign_up_from(where.first, "leaving@example.com")
                assert again["user"]["id"] != user_id
            kinds = await audit_kinds(where.first, user_id)
            assert kinds == ["sign-up", "sign-in", "user-signed-out", "sign-in", "user-deleted"]

        asyncio.run(scenario())


def test_users_are_listed_and_searched_in_pages(tmp_path: Path) -> None:
    with servers("sqlite", tmp_path, **ADMIN) as where:

        async def scenario() -> None:
            made = [await sign_up_from(where.first, f"user{i}@example.com") for i in range(5)]
            await sign_up_from(where.first, "someone@else.org")
            async with admin(where.first) as http:
                first = (await http.get("/__offline/users", params={"limit": 2, "q": "example.com"})).json()
                second = (
                    await http.get(
                        "/__offline/users", params={"limit": 2, "q": "example.com", "after": first["next"]}
                    )
                ).json()
                third = (
                    await http.get(
                        "/__offline/users", params={"limit": 2, "q": "example.com", "after": second["next"]}
                    )
                ).json()
                assert third["next"] is None
                ids = [u["id"] for page in (first, second, third) for u in page["users"]]
                assert ids == [pair["user"]["id"] for pair in made]
                everyone = (await http.get("/__offline/users")).json()
                assert len(everyone["users"]) == 6 and everyone["next"] is None
                bad = await http.get("/__offline/users", params={"limit": "0"})
                assert bad.status_code == 400 and bad.json()["error"]["field"] == "limit"
                audit = await http.get("/__offline/audit", params={"since": "yesterday"})
                assert audit.status_code == 400 and audit.json()["error"]["field"] == "since"
                paged = (await http.get("/__offline/audit", params={"kind": "sign-up", "limit": 4})).json()
                rest = (
                    await http.get("/__offline/audit", params={"kind": "sign-up", "before": paged["next"]})
                ).json()
                assert len(paged["entries"]) == 4 and len(rest["entries"]) == 2 and rest["next"] is None

        asyncio.run(scenario())


def test_the_admin_api_needs_the_admin_token(tmp_path: Path) -> None:
    with servers("sqlite", tmp_path, **ADMIN) as where:

        async def scenario() -> None:
            user = await sign_up_from(where.first, "target@example.com")
            path = f"/__offline/users/{user['user']['id']}/disable"
            async with httpx.AsyncClient(base_url=where.first.http_url, timeout=TIMEOUT) as http:
                assert (await http.post(path)).status_code == 401
                # A user's own access token is not the admin token.
                mine = await http.post(path, headers={"Authorization": f"Bearer {user['accessToken']}"})
                assert mine.status_code == 401
            statuses = []
            async with admin(where.first, "wrong-token") as http:
                for _ in range(6):
                    statuses.append((await http.get("/__offline/users")).status_code)
            assert statuses[:4] == [401] * 4 and statuses[-1] == 429
            async with admin(where.first) as http:  # the right token from that address waits too
                assert (await http.get("/__offline/users")).status_code == 429
            assert (await sign_in_from(where.first, "target@example.com")).status_code == 200

        asyncio.run(scenario())

    # Without OFFLINE_ADMIN_TOKEN the API is closed, not open.
    process = auth_server(tmp_path / "open")
    try:

        async def closed() -> None:
            async with httpx.AsyncClient(base_url=process.http_url, timeout=TIMEOUT) as http:
                response = await http.get("/__offline/users")
            assert response.status_code == 403
            assert response.json()["error"]["code"] == "ADMIN_TOKEN_REQUIRED"

        asyncio.run(closed())
    finally:
        assert process.terminate() == 0


def test_the_auth_client_is_told_its_user_is_disabled(tmp_path: Path) -> None:
    with servers("sqlite", tmp_path, **ADMIN) as where:

        async def scenario() -> None:
            auth = create_offline_auth(where.first.http_url, credential_store=None)
            user = await auth.sign_up("dana@example.com", PASSWORD)
            async with admin(where.first) as http:
                assert (await http.post(f"/__offline/users/{user['id']}/disable")).status_code == 200
            # The refresh is refused for good: the session ends and the credentials are dropped.
            with pytest.raises(AuthError) as ended:
                await auth.refresh()
            assert ended.value.code == "AUTH_FAILED" and ended.value.context["reason"] == "USER_DISABLED"
            assert not auth.is_signed_in
            with pytest.raises(AuthError) as refused:
                await auth.sign_in("dana@example.com", PASSWORD)
            assert refused.value.code == "USER_DISABLED"

        asyncio.run(scenario())


def test_deleting_the_last_owner_of_an_organization_with_members_is_refused(tmp_path: Path) -> None:
    """The organization would be left without an owner (nobody could invite, re-role or remove members):
    409 LAST_OWNER naming it and what to do; once another member is owner, the deletion goes ahead. A user
    alone in their organization leaves nobody stranded: deleted."""
    with servers("sqlite", tmp_path, **ADMIN) as where:

        async def scenario() -> None:
            olga = await sign_up_from(where.first, "olga@example.com")
            max_ = await sign_up_from(where.first, "max@example.com")
            solo = await sign_up_from(where.first, "solo@example.com")
            olga_id, max_id = olga["user"]["id"], max_["user"]["id"]
            async with client_from(where.first) as client:

                async def call(method: str, path: str, pair: dict[str, Any], body: Any = None) -> Any:
                    response = await client.request(
                        method, path, json=body, headers={"Authorization": f"Bearer {pair['accessToken']}"}
                    )
                    assert response.status_code < 300, response.text
                    return response.json() if response.content else None

                org = await call("POST", "/auth/orgs", olga, {"name": "Acme"})
                await call("POST", "/auth/orgs", solo, {"name": "Solo Ltd"})
                invite = await call(
                    "POST", f"/auth/orgs/{org['id']}/invites", olga, {"email": "max@example.com"}
                )
                await call("POST", "/auth/invites/accept", max_, {"inviteToken": invite["inviteToken"]})

                async with admin(where.first) as http:
                    refused = await http.delete(f"/__offline/users/{olga_id}")
                    assert refused.status_code == 409, refused.text
                    error = refused.json()["error"]
                    assert error["code"] == "LAST_OWNER"
                    assert "Acme" in error["message"] and org["id"] in error["message"]
                    assert '"role": "owner"' in error["message"]  # what to do next
                    # Nothing was deleted: the user signs in, the organization keeps its owner.
                    assert (await http.get(f"/__offline/users/{olga_id}")).status_code == 200
                    assert (await sign_in_from(where.first, "olga@example.com")).status_code == 200

                    await call("PATCH", f"/auth/orgs/{org['id']}/members/{max_id}", olga, {"role": "owner"})
                    deleted = await http.delete(f"/__offline/users/{olga_id}")
                    assert deleted.status_code == 200, deleted.text
                    members = await call("GET", f"/auth/orgs/{org['id']}/members", max_)
                    assert [(m["email"], m["role"]) for m in members["members"]] == [
                        ("max@example.com", "owner")
                    ]
                    alone = await http.delete(f"/__offline/users/{solo['user']['id']}")
                    assert alone.status_code == 200, alone.text

        asyncio.run(scenario())
