"""The /auth routes on a live server (real HTTP on loopback), on each server store: memory, SQLite and
PostgreSQL (``postgres_url``; skipped when PostgreSQL is unreachable, except in CI)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any, Literal

import asyncpg  # type: ignore[import-untyped, unused-ignore]
import httpx
import jwt
import pytest
from argon2 import PasswordHasher

from offline.core.errors import OfflineError
from server_runtime import MemoryServerStore, create_production_server
from server_runtime.auth import AuthRoutes
from server_runtime.auth.tokens import TokenService

from .conftest import (
    FAST_HASHER,
    PASSWORD,
    SCHEMA,
    SECRET,
    StoreFactory,
    bearer,
    http,
    make_routes,
    serve,
    sign_up,
)


def claims(token: str) -> dict[str, Any]:
    decoded: dict[str, Any] = jwt.decode(
        token, SECRET, algorithms=["HS256"], options={"verify_exp": False, "verify_iat": False}
    )
    return decoded


async def auth_rows(stores: StoreFactory) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the offline_auth_* tables, read straight from the database (server stopped)."""
    tables = ("users", "sessions", "refresh_tokens", "identities", "oauth_states")
    out: dict[str, list[tuple[Any, ...]]] = {}
    assert stores.location is not None
    if stores.kind == "sqlite":
        with sqlite3.connect(stores.location) as conn:
            for table in tables:
                out[table] = list(conn.execute(f"SELECT * FROM offline_auth_{table}"))
        return out
    conn = await asyncpg.connect(stores.location)
    try:
        for table in tables:
            out[table] = [tuple(r) for r in await conn.fetch(f"SELECT * FROM offline_auth_{table}")]
    finally:
        await conn.close()
    return out


# -- sign-up, sign-in, /me -------------------------------------------------------------------------------------


def test_sign_up_sign_in_and_me(stores: StoreFactory) -> None:
    secrets_seen: list[str] = []

    async def scenario() -> None:
        async with serve(await stores.open(), make_routes()) as server, http(server) as client:
            pair = await sign_up(client, "  Ann@Example.COM ")
            assert set(pair) == {
                "user",
                "accessToken",
                "refreshToken",
                "tokenType",
                "expiresIn",
                "refreshExpiresIn",
                "deviceToken",
            }
            assert pair["user"]["email"] == "ann@example.com"
            assert pair["tokenType"] == "Bearer"
            assert pair["expiresIn"] == 900
            assert pair["refreshExpiresIn"] == 30 * 24 * 3600
            access = claims(pair["accessToken"])
            assert access["sub"] == pair["user"]["id"]
            assert access["email"] == "ann@example.com"
            assert access["typ"] == "access" and access["iss"] == "offline"
            assert access["exp"] - access["iat"] == 900

            me = await client.get("/auth/me", headers=bearer(pair["accessToken"]))
            assert me.status_code == 200
            assert me.headers["cache-control"] == "no-store"
            body = me.json()
            assert body["id"] == pair["user"]["id"] and body["email"] == "ann@example.com"
            assert body["createdAt"].endswith("Z") and "T" in body["createdAt"]

            taken = await client.post(
                "/auth/sign-up", json={"email": "ann@example.com", "password": PASSWORD}
            )
            assert taken.status_code == 409
            assert taken.json()["error"]["code"] == "EMAIL_TAKEN"
            assert taken.json()["error"]["field"] == "email"

            signed_in = await client.post(
                "/auth/sign-in", json={"email": "ANN@example.com", "password": PASSWORD}
            )
            assert signed_in.status_code == 200
            second = signed_in.json()
            assert second["user"] == pair["user"]
            assert claims(second["accessToken"])["sid"] != access["sid"]  # a session per sign-in
            secrets_seen.extend([second["refreshToken"], pair["refreshToken"]])

        if not stores.durable:
            return
        # The data lives in the store: a new server on the same database knows the user and its sessions.
        rows = await auth_rows(stores)
        assert [(r[1], str(r[2])[:10]) for r in rows["users"]] == [("ann@example.com", "$argon2id$")]
        assert len(rows["sessions"]) == 2
        dumped = json.dumps(rows, default=str)
        assert PASSWORD not in dumped
        for token in secrets_seen:
            assert token not in dumped  # refresh tokens are kept as hashes only
        async with serve(await stores.open(), make_routes()) as server, http(server) as client:
            again = await client.post(
                "/auth/sign-in", json={"email": "ann@example.com", "password": PASSWORD}
            )
            assert again.status_code == 200
            refreshed = await client.post("/auth/refresh", json={"refreshToken": secrets_seen[0]})
            assert refreshed.status_code == 200, refreshed.text

    asyncio.run(scenario())


def test_invalid_input_names_the_field() -> None:
    async def scenario() -> None:
        async with serve(MemoryServerStore(), make_routes()) as server, http(server) as client:
            cases: list[tuple[str, Any, str]] = [
                ("/auth/sign-up", {"email": "not-an-email", "password": PASSWORD}, "email"),
                ("/auth/sign-up", {"email": "a@example.com", "password": "short"}, "password"),
                ("/auth/sign-up", {"email": "a@example.com"}, "password"),
                ("/auth/sign-in", {"password": PASSWORD}, "email"),
                ("/auth/sign-in", {"email": "a@example.com", "password": ""}, "password"),
                ("/auth/refresh", {}, "refreshToken"),
                ("/auth/refresh", {"refreshToken": 5}, "refreshToken"),
                ("/auth/sign-out", {}, "refreshToken"),
                ("/auth/sign-in", [1, 2], "body"),
            ]
            for path, body, field in cases:
                response = await client.post(path, json=body)
                assert response.status_code == 400, (path, body, response.text)
                error = response.json()["error"]
                assert error["code"] == "INVALID_INPUT" and error["field"] == field, (path, body, error)
                assert field in error["message"] or field == "body"
            broken = await client.post(
                "/auth/sign-in", content=b"{not json", headers={"content-type": "application/json"}
            )
            assert broken.status_code == 400 and broken.json()["error"]["field"] == "body"

            missing = await client.get("/auth/me")
            assert missing.status_code == 401
            assert missing.headers["www-authenticate"] == "Bearer"
            assert missing.json()["error"]["code"] == "AUTH_FAILED"

    asyncio.run(scenario())


# -- refresh rotation and reuse ------------------------------------------------------------------------------


def test_refresh_rotates_and_reuse_revokes_the_family(stores: StoreFactory) -> None:
    async def scenario() -> None:
        async with serve(await stores.open(), make_routes()) as server, http(server) as client:
            first = await sign_up(client, "bob@example.com")
            other_device = (
                await client.post("/auth/sign-in", json={"email": "bob@example.com", "password": PASSWORD})
            ).json()

            r1 = await client.post("/auth/refresh", json={"refreshToken": first["refreshToken"]})
            assert r1.status_code == 200
            one = r1.json()
            assert one["refreshToken"] != first["refreshToken"]
            assert claims(one["accessToken"])["sid"] == claims(first["accessToken"])["sid"]  # same session
            two = (await client.post("/auth/refresh", json={"refreshToken": one["refreshToken"]})).json()
            assert (await client.get("/auth/me", headers=bearer(two["accessToken"]))).status_code == 200

            # A spent token comes back (stolen, or replayed): the whole family is revoked.
            reused = await client.post("/auth/refresh", json={"refreshToken": one["refreshToken"]})
            assert reused.status_code == 401
            assert reused.json()["error"]["code"] == "REFRESH_TOKEN_REUSED"
            newest = await client.post("/auth/refresh", json={"refreshToken": two["refreshToken"]})
            assert newest.status_code == 401
            assert newest.json()["error"]["code"] == "INVALID_REFRESH_TOKEN"
            for token in (first["accessToken"], one["accessToken"], two["accessToken"]):
                me = await client.get("/auth/me", headers=bearer(token))
                assert me.status_code == 401 and me.json()["error"]["code"] == "AUTH_FAILED"

            # The user's other session is not part of that family.
            assert (
                await client.get("/auth/me", headers=bearer(other_device["accessToken"]))
            ).status_code == 200
            ok = await client.post("/auth/refresh", json={"refreshToken": other_device["refreshToken"]})
            assert ok.status_code == 200

            unknown = await client.post("/auth/refresh", json={"refreshToken": "x" * 43})
            assert unknown.status_code == 401
            assert unknown.json()["error"]["code"] == "INVALID_REFRESH_TOKEN"

    asyncio.run(scenario())


def test_concurrent_use_of_one_refresh_token_succeeds_once(stores: StoreFactory) -> None:
    async def scenario() -> None:
        async with serve(await stores.open(), make_routes()) as server, http(server) as client:
            pair = await sign_up(client, "race@example.com")
            answers = await asyncio.gather(
                *(client.post("/auth/refresh", json={"refreshToken": pair["refreshToken"]}) for _ in range(4))
            )
            codes = sorted(a.status_code for a in answers)
            assert codes == [200, 401, 401, 401]
            assert {a.json()["error"]["code"] for a in answers if a.status_code == 401} == {
                "REFRESH_TOKEN_REUSED"
            }
            # Reuse revoked the session, including the pair the winner got.
            winner = next(a.json() for a in answers if a.status_code == 200)
            assert (await client.get("/auth/me", headers=bearer(winner["accessToken"]))).status_code == 401

    asyncio.run(scenario())


# -- sign-out and revocation -----------------------------------------------------------------------------------


def test_sign_out_and_revoke(stores: StoreFactory) -> None:
    async def scenario() -> None:
        async with serve(await stores.open(), make_routes()) as server, http(server) as client:
            a = await sign_up(client, "carol@example.com")

            async def sign_in() -> dict[str, Any]:
                response = await client.post(
                    "/auth/sign-in", json={"email": "carol@example.com", "password": PASSWORD}
                )
                assert response.status_code == 200
                body: dict[str, Any] = response.json()
                return body

            b, c, d = await sign_in(), await sign_in(), await sign_in()

            out = await client.post("/auth/sign-out", json={"refreshToken": a["refreshToken"]})
            assert out.status_code == 204
            assert (await client.get("/auth/me", headers=bearer(a["accessToken"]))).status_code == 401
            gone = await client.post("/auth/refresh", json={"refreshToken": a["refreshToken"]})
            assert gone.json()["error"]["code"] == "INVALID_REFRESH_TOKEN"
            # Signing out twice, or with an unknown token, is not an error and reveals nothing.
            assert (
                await client.post("/auth/sign-out", json={"refreshToken": a["refreshToken"]})
            ).status_code == 204
            assert (await client.post("/auth/sign-out", json={"refreshToken": "nope"})).status_code == 204
            # Sign-out with only the access token ends that session too.
            assert (await client.post("/auth/sign-out", headers=bearer(b["accessToken"]))).status_code == 204
            assert (await client.get("/auth/me", headers=bearer(b["accessToken"]))).status_code == 401

            # Revoke the current session only: the others stay.
            assert (
                await client.post("/auth/revoke", headers=bearer(c["accessToken"]), json={})
            ).status_code == 204
            assert (await client.get("/auth/me", headers=bearer(c["accessToken"]))).status_code == 401
            assert (await client.get("/auth/me", headers=bearer(d["accessToken"]))).status_code == 200

            e = await sign_in()
            everything = await client.post(
                "/auth/revoke", headers=bearer(d["accessToken"]), json={"all": True}
            )
            assert everything.status_code == 204
            for pair in (d, e):
                assert (await client.get("/auth/me", headers=bearer(pair["accessToken"]))).status_code == 401
                refused = await client.post("/auth/refresh", json={"refreshToken": pair["refreshToken"]})
                assert refused.status_code == 401
            # A revoked token cannot revoke anything any more.
            again = await client.post("/auth/revoke", headers=bearer(d["accessToken"]), json={"all": True})
            assert again.status_code == 401 and again.headers["www-authenticate"] == "Bearer"

    asyncio.run(scenario())


# -- expiry ------------------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def test_access_and_refresh_tokens_expire() -> None:
    clock = Clock()
    routes = AuthRoutes(
        secret=SECRET, password_hasher=FAST_HASHER, access_ttl=60, refresh_ttl=3600, now=clock
    )

    async def scenario() -> None:
        async with serve(MemoryServerStore(), routes) as server, http(server) as client:
            pair = await sign_up(client, "dave@example.com")
            assert pair["expiresIn"] == 60 and pair["refreshExpiresIn"] == 3600
            clock.now += 59
            assert (await client.get("/auth/me", headers=bearer(pair["accessToken"]))).status_code == 200
            clock.now += 1
            expired = await client.get("/auth/me", headers=bearer(pair["accessToken"]))
            assert expired.status_code == 401 and expired.json()["error"]["code"] == "AUTH_FAILED"
            # A token signed with the right secret but already expired is refused the same way.
            forged = TokenService(SECRET, access_ttl=60, now=lambda: clock.now - 61).issue_access(
                user_id=pair["user"]["id"], email=None, session_id=claims(pair["accessToken"])["sid"]
            )
            assert (await client.get("/auth/me", headers=bearer(forged.token))).status_code == 401

            fresh = (await client.post("/auth/refresh", json={"refreshToken": pair["refreshToken"]})).json()
            assert (await client.get("/auth/me", headers=bearer(fresh["accessToken"]))).status_code == 200
            clock.now += 3600
            late = await client.post("/auth/refresh", json={"refreshToken": fresh["refreshToken"]})
            assert late.status_code == 401 and late.json()["error"]["code"] == "INVALID_REFRESH_TOKEN"

    asyncio.run(scenario())


# -- credentials: identical answers, rate limits ---------------------------------------------------------------


class CountingHasher(PasswordHasher):
    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=1024, parallelism=1)
        self.verifications = 0

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self.verifications += 1
        return super().verify(hash, password)


def test_unknown_email_and_wrong_password_answer_identically() -> None:
    hasher = CountingHasher()

    async def scenario() -> None:
        async with (
            serve(MemoryServerStore(), make_routes(password_hasher=hasher)) as server,
            http(server) as client,
        ):
            await sign_up(client, "erin@example.com")
            before = hasher.verifications
            wrong = await client.post(
                "/auth/sign-in", json={"email": "erin@example.com", "password": "wrong-password"}
            )
            unknown = await client.post(
                "/auth/sign-in", json={"email": "nobody@example.com", "password": "wrong-password"}
            )
            assert wrong.status_code == unknown.status_code == 401
            assert wrong.content == unknown.content
            assert wrong.json() == {
                "error": {
                    "code": "INVALID_CREDENTIALS",
                    "message": "the email or password is wrong; check both and try again",
                }
            }
            same_headers = {"content-type", "content-length", "cache-control"}
            assert {k: wrong.headers[k] for k in same_headers} == {
                k: unknown.headers[k] for k in same_headers
            }
            # Both cost one argon2 verification: the unknown email is checked against a dummy hash.
            assert hasher.verifications - before == 2

    asyncio.run(scenario())


def test_failed_sign_ins_spread_over_addresses_stop_new_addresses_of_that_account() -> None:
    limits = {"account_total_attempts": 3, "account_window": 600, "address_attempts": 100}

    async def scenario() -> None:
        async with (
            serve(MemoryServerStore(), make_routes(rate_limits=limits)) as server,
            http(server) as client,
        ):
            await sign_up(client, "frank@example.com")
            for i in range(3):  # each from another address: the account is what is counted
                response = await client.post(
                    "/auth/sign-in",
                    json={"email": "frank@example.com", "password": "wrong-password"},
                    headers={"X-Forwarded-For": f"198.51.100.{i}"},
                )
                assert response.status_code == 401
            for email in ("frank@example.com", "nobody@example.com"):
                password = PASSWORD if email.startswith("frank") else "wrong-password"
                if email.startswith("nobody"):  # an unknown account gets there the same way
                    for _ in range(3):
                        await client.post("/auth/sign-in", json={"email": email, "password": password})
                limited = await client.post(
                    "/auth/sign-in",
                    json={"email": email, "password": password},
                    headers={"X-Forwarded-For": "203.0.113.9"},
                )
                assert limited.status_code == 429, email
                assert limited.json()["error"]["code"] == "RATE_LIMITED"
                assert 1 <= int(limited.headers["retry-after"]) <= 600
            # The address frank signed up from is not held to the account's total: the owner gets in.
            known = await client.post(
                "/auth/sign-in", json={"email": "frank@example.com", "password": PASSWORD}
            )
            assert known.status_code == 200
            # Another account from the same addresses is not affected.
            await sign_up(client, "grace@example.com")
            ok = await client.post(
                "/auth/sign-in",
                json={"email": "grace@example.com", "password": PASSWORD},
                headers={"X-Forwarded-For": "198.51.100.0"},
            )
            assert ok.status_code == 200

    asyncio.run(scenario())


def test_failed_sign_ins_are_limited_per_address() -> None:
    limits = {"account_attempts": 100, "address_attempts": 3, "address_window": 600}

    async def scenario() -> None:
        async with (
            serve(MemoryServerStore(), make_routes(rate_limits=limits)) as server,
            http(server) as client,
        ):
            await sign_up(client, "heidi@example.com")
            attacker = {"X-Forwarded-For": "198.51.100.7"}
            for i in range(3):
                response = await client.post(
                    "/auth/sign-in",
                    json={"email": f"guess{i}@example.com", "password": "x" * 8},
                    headers=attacker,
                )
                assert response.status_code == 401
            # Even the right password is refused from that address now, with the same answer for any account.
            refused = await client.post(
                "/auth/sign-in", json={"email": "heidi@example.com", "password": PASSWORD}, headers=attacker
            )
            unknown = await client.post(
                "/auth/sign-in", json={"email": "nobody@example.com", "password": PASSWORD}, headers=attacker
            )
            assert refused.status_code == unknown.status_code == 429
            assert refused.json() == unknown.json()
            assert refused.headers["retry-after"].isdigit()
            # Another address signs in fine.
            ok = await client.post(
                "/auth/sign-in",
                json={"email": "heidi@example.com", "password": PASSWORD},
                headers={"X-Forwarded-For": "192.0.2.1"},
            )
            assert ok.status_code == 200

    asyncio.run(scenario())


def test_sign_in_upgrades_an_outdated_password_hash(tmp_path: Path) -> None:
    factory = StoreFactory("sqlite", str(tmp_path / "server.db"))
    stronger = PasswordHasher(time_cost=2, memory_cost=2048, parallelism=1)

    async def stored_hash() -> str:
        store = await factory.open()
        await store.set_schema(SCHEMA)
        try:
            async with store.auth_store().reader() as tx:
                user = await tx.user_by_email("ivan@example.com")
        finally:
            await store.close()
        assert user is not None and user.password_hash is not None
        return user.password_hash

    async def scenario() -> None:
        async with serve(await factory.open(), make_routes()) as server, http(server) as client:
            await sign_up(client, "ivan@example.com")
        assert "$m=1024,t=1,p=1$" in await stored_hash()
        async with (
            serve(await factory.open(), make_routes(password_hasher=stronger)) as server,
            http(server) as client,
        ):
            response = await client.post(
                "/auth/sign-in", json={"email": "ivan@example.com", "password": PASSWORD}
            )
            assert response.status_code == 200
        assert "$m=2048,t=2,p=1$" in await stored_hash()

    asyncio.run(scenario())


def test_sign_ups_are_limited_per_address() -> None:
    async def scenario() -> None:
        routes = make_routes(rate_limits={"sign_up_attempts": 2})
        async with serve(MemoryServerStore(), routes) as server, http(server) as client:
            await sign_up(client, "j1@example.com")
            await sign_up(client, "j2@example.com")
            third = await client.post("/auth/sign-up", json={"email": "j3@example.com", "password": PASSWORD})
            assert third.status_code == 429 and third.json()["error"]["code"] == "RATE_LIMITED"
            elsewhere = await client.post(
                "/auth/sign-up",
                json={"email": "j3@example.com", "password": PASSWORD},
                headers={"X-Forwarded-For": "192.0.2.55"},
            )
            assert elsewhere.status_code == 201

    asyncio.run(scenario())


def test_routes_refuse_to_serve_two_stores() -> None:
    routes = make_routes()
    routes.bind_server_store(MemoryServerStore())
    with pytest.raises(OfflineError, match="another server store"):
        routes.bind_server_store(MemoryServerStore())


def test_unknown_auth_path_is_not_the_spa(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<html>app</html>")

    async def scenario() -> None:
        store = MemoryServerStore()
        await store.set_schema(SCHEMA)
        server = create_production_server(
            store=store, port=0, host="127.0.0.1", static_dir=str(tmp_path), auth_routes=make_routes()
        )
        url = await server.start()
        try:
            async with httpx.AsyncClient(base_url=url) as client:
                assert (await client.get("/some/page")).text == "<html>app</html>"
                assert (await client.get("/auth/nothing-here")).status_code == 404
                assert (await client.post("/auth/sign-in", json={})).status_code == 400
        finally:
            await server.stop()
            await store.close()

    asyncio.run(scenario())
