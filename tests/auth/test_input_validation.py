"""Input validation of the part-two routes (MFA, organizations, account linking, passkeys) on a live server.

Every route that reads a JSON body gets malformed JSON (broken, truncated, not UTF-8, nested beyond the
parser's depth) and bodies that are not an object; every route gets its required fields missing and
ill-typed, and bad ids in its path. Each answer must be 400 with ``{"error": {"code": "INVALID_INPUT",
"field": <the field>, "message"}}``, change nothing, and leave the server serving.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from server_runtime import MemoryServerStore

from .conftest import bearer, http, sign_up
from .part_two import Clock, code_at, post, routes_with, serve_with

# Passkeys and an OAuth provider are configured, so their routes get as far as validating input. The
# provider is never contacted: every request here is refused before that.
PASSKEYS = {"rpId": "localhost", "origins": ["http://localhost:5173"]}
PROVIDER = {
    "client_id": "fake-client-id",
    "client_secret": "fake-client-secret-0a1b2c3d",
    "authorize_url": "http://127.0.0.1:9/authorize",
    "token_url": "http://127.0.0.1:9/token",
    "userinfo_url": "http://127.0.0.1:9/userinfo",
}

#: Bodies that are not a JSON object: (what, bytes). All are refused with field "body".
MALFORMED: list[tuple[str, bytes]] = [
    ("not JSON", b"{not json"),
    ("truncated JSON", b'{"code": "12'),
    ("not UTF-8", b'{"name": "\xff\xfe"}'),
    ("nested too deeply", b"[" * 50_000),  # under the 64 KiB limit, past the JSON parser's depth
    ("an array", b'["inviteToken", "code"]'),
    ("a string", b'"text"'),
    ("a number", b"42"),
    ("null", b"null"),
]

#: A credential of the right outline (for the cases about the other field).
CREDENTIAL = {
    "id": "AAAAAAAAAAAAAAAAAAAAAA",
    "rawId": "AAAAAAAAAAAAAAAAAAAAAA",
    "type": "public-key",
    "response": {"clientDataJSON": "e30", "attestationObject": "oA"},
}
BAD_CREDENTIALS: list[tuple[Any, str]] = [
    ({}, "credential"),
    ({"challengeId": "c"}, "credential"),
    ({"challengeId": "c", "credential": "x"}, "credential"),
    ({"challengeId": "c", "credential": {"id": 7}}, "credential"),
    ({"challengeId": "c", "credential": {"id": "", "response": {}}}, "credential"),
    ({"challengeId": "c", "credential": {"id": "AAAA"}}, "credential"),
    ({"challengeId": "c", "credential": {"id": "AAAA", "response": "x"}}, "credential"),
    ({"credential": CREDENTIAL}, "challengeId"),
    ({"credential": CREDENTIAL, "challengeId": 7}, "challengeId"),
    ({"credential": CREDENTIAL, "challengeId": "c" * 257}, "challengeId"),
]
LONG_ID = "x" * 65


@dataclass(frozen=True)
class Case:
    method: str
    path: str  # {org}: the organization, {member}: a member of it who is not the caller
    fields: tuple[tuple[Any, str], ...] = ()  # (JSON body, the field the error names)
    paths: tuple[tuple[str, str], ...] = ()  # (path with a bad id or query, the field), sent a good body
    reads_body: bool = True


CASES: dict[str, Case] = {
    "mfa enroll": Case("POST", "/auth/mfa/totp/enroll"),
    "mfa verify": Case(
        "POST",
        "/auth/mfa/totp/verify",
        fields=(
            ({}, "code"),
            ({"code": 123456}, "code"),
            ({"code": ""}, "code"),
            ({"code": "1" * 65}, "code"),
        ),
    ),
    "mfa disable": Case(
        "POST",
        "/auth/mfa/totp/disable",
        fields=(
            ({}, "code"),
            ({"code": 123456}, "code"),
            ({"code": "123456", "recoveryCode": "abcd-efgh-ijkl-mnop"}, "code"),
            ({"recoveryCode": ["abcd"]}, "recoveryCode"),
        ),
    ),
    "mfa challenge": Case(
        "POST",
        "/auth/mfa/challenge",
        fields=(
            ({}, "mfaToken"),
            ({"mfaToken": 7, "code": "123456"}, "mfaToken"),
            ({"mfaToken": "t"}, "code"),
            ({"mfaToken": "t", "code": 123456}, "code"),
        ),
    ),
    "org create": Case(
        "POST",
        "/auth/orgs",
        fields=(
            ({}, "name"),
            ({"name": 7}, "name"),
            ({"name": "   "}, "name"),
            ({"name": "n" * 201}, "name"),
        ),
    ),
    "org invite": Case(
        "POST",
        "/auth/orgs/{org}/invites",
        fields=(
            ({}, "email"),
            ({"email": 7}, "email"),
            ({"email": "not an email"}, "email"),
            ({"email": "x@example.com", "role": "emperor"}, "role"),
            ({"email": "x@example.com", "role": 7}, "role"),
        ),
        paths=((f"/auth/orgs/{LONG_ID}/invites", "org_id"),),
    ),
    "invite accept": Case(
        "POST",
        "/auth/invites/accept",
        fields=(
            ({}, "inviteToken"),
            ({"inviteToken": 7}, "inviteToken"),
            ({"inviteToken": "t" * 257}, "inviteToken"),
        ),
    ),
    "member role": Case(
        "PATCH",
        "/auth/orgs/{org}/members/{member}",
        fields=(({}, "role"), ({"role": 7}, "role"), ({"role": "emperor"}, "role")),
        paths=((f"/auth/orgs/{{org}}/members/{LONG_ID}", "user_id"),),
    ),
    "org activate": Case(
        "POST",
        "/auth/orgs/{org}/activate",
        fields=(
            ({}, "refreshToken"),
            ({"refreshToken": 7}, "refreshToken"),
            ({"refreshToken": ""}, "refreshToken"),
        ),
        paths=((f"/auth/orgs/{LONG_ID}/activate", "org_id"),),
    ),
    "org leave": Case("POST", "/auth/orgs/{org}/leave", paths=((f"/auth/orgs/{LONG_ID}/leave", "org_id"),)),
    "member remove": Case(
        "DELETE",
        "/auth/orgs/{org}/members/{member}",
        paths=((f"/auth/orgs/{{org}}/members/{LONG_ID}", "user_id"),),
    ),
    "link start": Case(
        "GET",
        "/auth/link/oauth/fake/authorize",
        paths=(
            ("/auth/link/oauth/fake/authorize", "redirectUri"),
            ("/auth/link/oauth/fake/authorize?redirectUri=not-a-uri", "redirectUri"),
        ),
        reads_body=False,
    ),
    "link callback": Case(
        "POST",
        "/auth/link/oauth/fake/callback",
        fields=(
            ({}, "code"),
            ({"state": "s"}, "code"),
            ({"code": 7, "state": "s"}, "code"),
            ({"code": "c"}, "state"),
            ({"code": "c", "state": 7}, "state"),
            ({"code": "c", "state": "s", "redirectUri": 7}, "redirectUri"),
        ),
    ),
    "passkey register options": Case("POST", "/auth/passkeys/register/options"),
    "passkey register verify": Case("POST", "/auth/passkeys/register/verify", fields=tuple(BAD_CREDENTIALS)),
    "passkey authenticate options": Case("POST", "/auth/passkeys/authenticate/options"),
    "passkey authenticate verify": Case(
        "POST", "/auth/passkeys/authenticate/verify", fields=tuple(BAD_CREDENTIALS)
    ),
}


def check_refused(response: httpx.Response, field: str, what: str) -> None:
    assert response.status_code == 400, f"{what}: {response.status_code} {response.text[:300]}"
    assert response.headers["content-type"].startswith("application/json"), what
    assert response.headers["cache-control"] == "no-store", what
    error = response.json()["error"]
    assert error["code"] == "INVALID_INPUT", f"{what}: {error}"
    assert error["field"] == field, f"{what}: {error}"
    assert isinstance(error["message"], str) and error["message"], what
    if field != "body":
        assert field in error["message"], f"{what}: the message does not name {field}: {error}"


@pytest.mark.parametrize("name", list(CASES))
def test_part_two_route_refuses_bad_input_with_the_field(name: str) -> None:
    case = CASES[name]
    clock = Clock()

    async def scenario() -> None:
        routes = routes_with(clock, passkeys=PASSKEYS, oauth_providers={"fake": PROVIDER})
        async with serve_with(MemoryServerStore(), routes) as server, http(server) as client:
            owner = await sign_up(client, "owner@example.com")
            member = await sign_up(client, "member@example.com")
            token = owner["accessToken"]
            org = (await post(client, "/auth/orgs", token, {"name": "Acme"})).json()["id"]
            invite = await post(client, f"/auth/orgs/{org}/invites", token, {"email": "member@example.com"})
            accepted = await post(
                client,
                "/auth/invites/accept",
                member["accessToken"],
                {"inviteToken": invite.json()["inviteToken"]},
            )
            assert accepted.status_code == 200, accepted.text
            secret = (await post(client, "/auth/mfa/totp/enroll", token)).json()["secret"]
            enabled = await post(client, "/auth/mfa/totp/verify", token, {"code": code_at(secret, clock)})
            assert enabled.status_code == 200, enabled.text
            names = {"org": org, "member": member["user"]["id"]}

            async def state() -> Any:
                members = await client.get(f"/auth/orgs/{org}/members", headers=bearer(token))
                mfa = await client.get("/auth/mfa", headers=bearer(token))
                orgs = await client.get("/auth/orgs", headers=bearer(token))
                return members.json(), mfa.json(), orgs.json()

            before = await state()
            path = case.path.format(**names)
            headers = {**bearer(token), "Content-Type": "application/json"}
            sent = 0
            if case.reads_body:
                for what, content in MALFORMED:
                    response = await client.request(case.method, path, content=content, headers=headers)
                    check_refused(response, "body", f"{name} with {what}")
                    sent += 1
            for body, field in case.fields:
                response = await client.request(case.method, path, json=body, headers=bearer(token))
                check_refused(response, field, f"{name} with {body!r}")
                sent += 1
            for bad_path, field in case.paths:
                response = await client.request(
                    case.method,
                    bad_path.format(**names),
                    json={} if case.reads_body else None,
                    headers=bearer(token),
                )
                check_refused(response, field, f"{name} at {bad_path}")
                sent += 1
            assert sent >= 2, name

            # Nothing changed (no one left or was removed, TOTP is still on, no organization was made) ...
            assert await state() == before
            # ... and the server keeps serving: the caller is still signed in and the route still works.
            me = await client.get("/auth/me", headers=bearer(token))
            assert me.status_code == 200 and me.json()["email"] == "owner@example.com"
            made = await post(client, "/auth/orgs", token, {"name": "Still here"})
            assert made.status_code == 201, made.text

    asyncio.run(scenario())
