"""No secret in a log line or an error answer: passwords, access and refresh tokens, AUTH_SECRET, the OAuth
client secret, authorization codes, provider tokens, states and PKCE verifiers; and for part two, organization
invite tokens, the account-linking flow's state and code, TOTP secrets, recovery codes, MFA tokens and passkey
challenges (with their handles).

Full flows (every route, failures included, OAuth against the fake provider, sync handshakes) run with the
server side logging everything down to DEBUG; every captured line and every error body is then searched.
"""

from __future__ import annotations

import asyncio
import base64
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import httpx

from offline.sync import protocol as p
from server_runtime import create_sqlite_server_store

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
from .part_two import Clock, code_at, routes_with, serve_with
from .soft_authenticator import SoftAuthenticator
from .test_mfa import wrong_code
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


# -- part two: invites, account linking, recovery codes, TOTP secrets, passkey challenges --------------------------

PASSKEY_ORIGIN = "http://localhost:5173"


def b64url_variants(value: str) -> set[str]:
    """A base64url value and the other spellings a log might use for its bytes (hex, standard base64)."""
    raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    return {value, raw.hex(), base64.b64encode(raw).decode("ascii").rstrip("=")}


def test_no_part_two_secret_reaches_logs_or_error_answers(tmp_path: Path, captured_logs: Capture) -> None:
    """Organization invites, account linking, TOTP (secret, recovery codes, MFA tokens) and passkeys
    (challenges and their handles), each with its failure paths, with everything logged down to DEBUG."""
    clock = Clock()
    found: dict[str, set[str]] = {
        kind: set()
        for kind in (
            "invite token",
            "link state",
            "link code",
            "totp secret",
            "recovery code",
            "mfa token",
            "passkey challenge",
            "passkey challenge id",
            "token",
        )
    }
    error_bodies: list[str] = []
    error_codes: set[str] = set()

    async def scenario() -> None:
        async with running_provider() as fake:
            routes = routes_with(
                clock,
                oauth_providers={"fake": fake.config()},
                passkeys={"rpId": "localhost", "origins": [PASSKEY_ORIGIN]},
            )
            store = create_sqlite_server_store(str(tmp_path / "server.db"))
            async with serve_with(store, routes) as server, http(server) as client:

                async def call(method: str, path: str, token: str | None = None, **kwargs: Any) -> Any:
                    headers = bearer(token) if token else {}
                    response = await client.request(method, path, headers=headers, **kwargs)
                    if response.status_code >= 400:
                        error_bodies.append(response.text + repr(dict(response.headers)))
                        error_codes.add(response.json()["error"]["code"])
                    body = response.json() if response.content else {}
                    for key in ("accessToken", "refreshToken"):
                        if isinstance(body, dict) and key in body:
                            found["token"].add(body[key])
                    return body

                ann = await call(
                    "POST", "/auth/sign-up", json={"email": "ann@example.com", "password": PASSWORD}
                )
                bob = await call(
                    "POST", "/auth/sign-up", json={"email": "bob@example.com", "password": PASSWORD}
                )
                ann_token, bob_token = ann["accessToken"], bob["accessToken"]

                # Organizations: an invite token refused for the wrong account, mistyped, used, reused.
                org = (await call("POST", "/auth/orgs", ann_token, json={"name": "Acme"}))["id"]
                invite = await call(
                    "POST", f"/auth/orgs/{org}/invites", ann_token, json={"email": "bob@example.com"}
                )
                invite_token = invite["inviteToken"]
                found["invite token"].add(invite_token)
                for token, value in (
                    (ann_token, invite_token),  # not the invited email
                    (bob_token, invite_token + "x"),
                    (bob_token, invite_token),  # accepted
                    (bob_token, invite_token),  # spent
                ):
                    await call("POST", "/auth/invites/accept", token, json={"inviteToken": value})
                second = await call(
                    "POST",
                    f"/auth/orgs/{org}/invites",
                    ann_token,
                    json={"email": "cy@example.com", "role": "admin"},
                )
                found["invite token"].add(second["inviteToken"])
                await call(
                    "POST", "/auth/invites/accept", bob_token, json={"inviteToken": second["inviteToken"]}
                )
                await call("POST", f"/auth/orgs/{org}/activate", json={"refreshToken": bob["refreshToken"]})

                # TOTP: the secret, wrong and right codes, recovery codes used, mistyped and reused.
                enrolled = await call("POST", "/auth/mfa/totp/enroll", ann_token, json={})
                secret = enrolled["secret"]
                found["totp secret"].add(secret)
                await call(
                    "POST", "/auth/mfa/totp/verify", ann_token, json={"code": wrong_code(secret, clock)}
                )
                verified = await call(
                    "POST", "/auth/mfa/totp/verify", ann_token, json={"code": code_at(secret, clock)}
                )
                recovery = verified["recoveryCodes"]
                found["recovery code"].update(recovery)
                found["recovery code"].update(code.replace("-", "") for code in recovery)

                async def mfa_step() -> str:
                    step = await call(
                        "POST", "/auth/sign-in", json={"email": "ann@example.com", "password": PASSWORD}
                    )
                    found["mfa token"].add(step["mfaToken"])
                    return str(step["mfaToken"])

                step = await mfa_step()
                await call(
                    "POST", "/auth/mfa/challenge", json={"mfaToken": step, "code": wrong_code(secret, clock)}
                )
                await call(
                    "POST", "/auth/mfa/challenge", json={"mfaToken": step, "recoveryCode": recovery[0] + "x"}
                )
                await call(
                    "POST", "/auth/mfa/challenge", json={"mfaToken": step + "x", "recoveryCode": recovery[0]}
                )
                await call(
                    "POST", "/auth/mfa/challenge", json={"mfaToken": step, "recoveryCode": recovery[0]}
                )
                step = await mfa_step()
                await call(
                    "POST", "/auth/mfa/challenge", json={"mfaToken": step, "recoveryCode": recovery[0]}
                )
                clock.next_step()
                await call(
                    "POST", "/auth/mfa/challenge", json={"mfaToken": step, "code": code_at(secret, clock)}
                )
                await call("POST", "/auth/mfa/totp/disable", ann_token, json={"recoveryCode": recovery[0]})
                await call("POST", "/auth/mfa/totp/disable", ann_token, json={"recoveryCode": recovery[1]})

                # Account linking: a code the provider refuses, a state used by the wrong account, a state
                # reused, and a successful link.
                async def link_flow(token: str) -> dict[str, str]:
                    flow = await call(
                        "GET", "/auth/link/oauth/fake/authorize", token, params={"redirectUri": REDIRECT}
                    )
                    found["link state"].add(flow["state"])
                    back = await asyncio.to_thread(browser_redirect, flow["authorizationUrl"])
                    found["link code"].add(back["code"])
                    return back

                async def link(token: str, code: str, state: str) -> Any:
                    body = {"code": code, "state": state, "redirectUri": REDIRECT}
                    return await call("POST", "/auth/link/oauth/fake/callback", token, json=body)

                back = await link_flow(ann_token)
                await link(ann_token, back["code"] + "x", back["state"])
                back = await link_flow(ann_token)
                await link(bob_token, back["code"], back["state"])  # ann's state, bob's account
                await link(ann_token, back["code"], back["state"])  # that state is spent
                back = await link_flow(ann_token)
                assert (await link(ann_token, back["code"], back["state"]))["linked"] is True
                await link(ann_token, back["code"], back["state"])
                found["link code"].update(fake.issued_codes)
                found["token"].update(fake.issued_access + fake.verifiers)

                # Passkeys: a registration against the wrong challenge, one that succeeds, sign-ins with a
                # stale assertion, from a look-alike origin, after expiry, and one that succeeds.
                authenticator = SoftAuthenticator(PASSKEY_ORIGIN)

                async def options(path: str, token: str | None = None) -> dict[str, Any]:
                    asked: dict[str, Any] = await call("POST", path, token, json={})
                    found["passkey challenge id"].add(asked["challengeId"])
                    found["passkey challenge"].update(b64url_variants(asked["options"]["challenge"]))
                    return asked

                first = await options("/auth/passkeys/register/options", ann_token)
                other = await options("/auth/passkeys/register/options", ann_token)
                credential = await authenticator.create(first["options"])
                verify = "/auth/passkeys/register/verify"
                await call(
                    "POST",
                    verify,
                    ann_token,
                    json={"challengeId": other["challengeId"], "credential": credential},
                )
                registered = await options("/auth/passkeys/register/options", ann_token)
                credential = await authenticator.create(registered["options"])
                body = {"challengeId": registered["challengeId"], "credential": credential}
                assert "credentialId" in await call("POST", verify, ann_token, json=body)
                await call("POST", verify, ann_token, json=body)  # the challenge is spent

                verify = "/auth/passkeys/authenticate/verify"
                asked = await options("/auth/passkeys/authenticate/options")
                assertion = await authenticator.get(asked["options"])
                body = {"challengeId": asked["challengeId"], "credential": assertion}
                assert "accessToken" in await call("POST", verify, json=body)
                await call("POST", verify, json=body)  # spent
                fresh = await options("/auth/passkeys/authenticate/options")
                await call(
                    "POST", verify, json={"challengeId": fresh["challengeId"], "credential": assertion}
                )
                phishing = SoftAuthenticator("http://login.localhost:5173", authenticator.credentials)
                fresh = await options("/auth/passkeys/authenticate/options")
                await call(
                    "POST",
                    verify,
                    json={
                        "challengeId": fresh["challengeId"],
                        "credential": await phishing.get(fresh["options"]),
                    },
                )
                late = await options("/auth/passkeys/authenticate/options")
                clock.advance(301)
                await call(
                    "POST",
                    verify,
                    json={
                        "challengeId": late["challengeId"],
                        "credential": await authenticator.get(late["options"]),
                    },
                )

    asyncio.run(scenario())

    lines = captured_logs.lines
    text = "\n".join(lines)
    # The capture saw every flow, failures included: otherwise an empty log would pass trivially.
    for expected in (
        "invited someone to organization",
        "joined organization",
        "started a TOTP enrolment",
        "enabled TOTP",
        "second factor failed",
        "signed in with a recovery code",
        "disabled TOTP",
        "linking fake for user",
        "linked a fake identity",
        "passkey registration of user",
        "registered a passkey",
        "passkey sign-in refused",
        "signed in with a passkey",
    ):
        assert expected in text, f"no log line mentions {expected!r}"
    # ... and so did the error answers: each failure path ran.
    assert len(error_bodies) >= 20
    assert error_codes >= {
        "INVITE_EMAIL_MISMATCH",
        "INVITE_INVALID",
        "INVALID_MFA_CODE",
        "INVALID_MFA_TOKEN",
        "OAUTH_FAILED",
        "PASSKEY_INVALID",
        "PASSKEY_CHALLENGE_INVALID",
        "PASSKEY_FAILED",
    }, error_codes
    for kind, values in found.items():
        assert values, f"the flows produced no {kind}"
        for value in sorted(values, key=len):
            assert len(value) >= 8, (kind, value)
            for line in lines:
                assert value not in line, f"a {kind} appears in the log line: {line[:200]}"
            for body in error_bodies:
                assert value not in body, f"a {kind} appears in an error answer: {body[:200]}"
