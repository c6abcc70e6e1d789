"""The auth client's part-two methods against the real server (SQLite store, loopback): two-step sign-in
(`MfaRequired` then `complete_mfa`), TOTP enrolment, organizations with an app syncing the active
organization's records, account linking, passkeys through a software ceremony, and `is_passkey_supported`."""

from __future__ import annotations

import asyncio
import sys
import types
import urllib.parse
from pathlib import Path

import pyotp
import pytest

from offline import create_app
from offline.auth import (
    INVALID_MFA_CODE,
    INVALID_MFA_TOKEN,
    PASSKEYS_UNSUPPORTED,
    AuthError,
    MfaRequired,
    create_offline_auth,
    create_offline_auth_sync,
    is_passkey_supported,
)
from server_runtime import create_sqlite_server_store
from tests.auth.fake_oauth import running_provider
from tests.auth.part_two import Clock, routes_with, serve_with
from tests.auth.soft_authenticator import SoftAuthenticator
from tests.auth.test_oauth import REDIRECT, play_browser
from tests.auth.test_orgs import ORG_SCHEMA
from tests.auth.test_sync_auth import FAST, close_all, wait_for

PASSWORD = "correct horse battery"
ORIGIN = "http://localhost:5173"


def test_mfa_orgs_linking_and_passkeys_through_the_client(tmp_path: Path) -> None:
    clock = Clock()
    authenticator = SoftAuthenticator(ORIGIN)

    async def scenario() -> None:
        async with running_provider() as fake:
            routes = routes_with(
                clock,
                oauth_providers={"fake": fake.config()},
                passkeys={"rp_id": "localhost", "origins": [ORIGIN]},
            )
            store = create_sqlite_server_store(str(tmp_path / "server.db"))
            async with serve_with(store, routes, schema=ORG_SCHEMA) as server:
                assert server.url is not None
                ann = create_offline_auth(server.url, credential_store=None)
                bob = create_offline_auth(server.url, credential_store=None)
                await ann.sign_up("ann@example.com", PASSWORD)
                await bob.sign_up("bob@example.com", PASSWORD)

                # TOTP enrolment and the two-step sign-in.
                enrolment = await ann.enroll_totp()
                assert enrolment.secret not in repr(enrolment)
                assert urllib.parse.urlsplit(enrolment.provisioning_uri).scheme == "otpauth"
                totp = pyotp.TOTP(enrolment.secret)
                recovery = await ann.verify_totp(totp.at(clock()))
                assert len(recovery) == 10
                assert await ann.mfa_status() == {"totp": "enabled", "recoveryCodesLeft": 10}
                await ann.sign_out()
                with pytest.raises(MfaRequired) as step:
                    await ann.sign_in("ann@example.com", PASSWORD)
                assert step.value.mfa_types == ["totp"] and ann.user is None and ann.mfa_pending
                assert "mfaToken" not in str(step.value.context)
                clock.next_step()
                wrong = next(f"{n:06d}" for n in range(10**6) if f"{n:06d}" != totp.at(clock()))
                with pytest.raises(AuthError) as bad:
                    await ann.complete_mfa(wrong)
                assert bad.value.code == INVALID_MFA_CODE and ann.mfa_pending  # try again
                user = await ann.complete_mfa(totp.at(clock()))
                assert user["email"] == "ann@example.com" and ann.claims["sub"] == user["id"]
                assert not ann.mfa_pending
                with pytest.raises(AuthError) as none_pending:
                    await ann.complete_mfa("123456")
                assert none_pending.value.code == INVALID_MFA_TOKEN
                await ann.sign_out()
                with pytest.raises(MfaRequired):
                    await ann.sign_in("ann@example.com", PASSWORD)
                assert (await ann.complete_mfa(recovery_code=recovery[0]))["id"] == user["id"]

                # Organizations: bob joins ann's, activates it, and his app syncs its records.
                org = await ann.create_org("Acme")
                invite = await ann.invite_member(org["id"], "bob@example.com")
                assert (await bob.accept_invite(invite["inviteToken"])) == {
                    "orgId": org["id"],
                    "role": "member",
                }
                assert bob.active_org is None
                assert await bob.activate_org(org["id"]) == {"id": org["id"], "role": "member"}
                assert [o["name"] for o in await bob.list_orgs()] == ["Acme"]
                await ann.activate_org(org["id"])
                assert [m["email"] for m in await ann.org_members(org["id"])] == [
                    "ann@example.com",
                    "bob@example.com",
                ]
                sync_url = server.url.replace("http://", "ws://") + server.sync_path
                writer = create_app(
                    ORG_SCHEMA,
                    sync={"url": sync_url, "auth_client": create_offline_auth_sync(ann, ORG_SCHEMA), **FAST},
                    path=str(tmp_path / "ann.db"),
                )
                bridge = create_offline_auth_sync(bob, ORG_SCHEMA)
                assert bridge.scope_values() == {"orgId": org["id"]}
                reader = create_app(
                    ORG_SCHEMA,
                    sync={"url": sync_url, "auth_client": bridge, **FAST},
                    path=str(tmp_path / "bob.db"),
                )
                try:
                    writer.notes.insert({"orgId": org["id"], "title": "welcome"})
                    await writer.sync.connect()
                    await reader.sync.connect()
                    await wait_for(lambda: len(reader.notes.all().fetch()) == 1, "the org's note at bob")
                finally:
                    await close_all(writer, reader)
                await ann.remove_member(org["id"], bob.claims["sub"])
                await bob.refresh()
                assert bob.active_org is None and bob.claims["orgs"] == []

                # Linking the provider identity to bob's account, then signing in with it.
                fake.user = ("provider-bob", "bob@example.com", True)
                url = await bob.link_oauth_authorize("fake", REDIRECT)
                back = await play_browser(url)
                linked = await bob.complete_link_oauth("fake", back["code"], back["state"])
                assert linked["linked"] is True and linked["provider"] == "fake"
                carol = create_offline_auth(server.url, credential_store=None)
                back = await play_browser(await carol.oauth_authorize("fake", REDIRECT))
                assert (await carol.complete_oauth("fake", back["code"], back["state"]))["id"] == bob.claims[
                    "sub"
                ]

                # Passkeys through a ceremony function (a desktop WebView's, or here the software one).
                with pytest.raises(AuthError) as unsupported:
                    await ann.register_passkey()
                assert unsupported.value.code == PASSKEYS_UNSUPPORTED
                added = await ann.register_passkey(authenticator.create)
                await ann.sign_out()
                signed_in = await ann.sign_in_with_passkey(authenticator.get)  # no second step for a passkey
                assert signed_in["id"] == user["id"]
                assert [p["credentialId"] for p in await ann.list_passkeys()] == [added["credentialId"]]
                await ann.delete_passkey(added["credentialId"])
                assert await ann.list_passkeys() == []

    asyncio.run(scenario())


def test_is_passkey_supported_only_in_a_browser_with_webauthn(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_passkey_supported() is False  # native Python: no WebAuthn to talk to
    monkeypatch.setattr(sys, "platform", "emscripten")
    monkeypatch.delitem(sys.modules, "js", raising=False)
    monkeypatch.setattr("builtins.__import__", _no_js(__import__))
    assert is_passkey_supported() is False  # Pyodide without the js module (e.g. a bare interpreter)
    monkeypatch.undo()
    monkeypatch.setattr(sys, "platform", "emscripten")
    # Pyodide's `js` module is the browser's global scope: a faithful stand-in is a namespace.
    webauthn_window = types.SimpleNamespace(PublicKeyCredential=object())
    monkeypatch.setitem(sys.modules, "js", types.SimpleNamespace(window=webauthn_window))
    assert is_passkey_supported() is True
    monkeypatch.setitem(sys.modules, "js", types.SimpleNamespace(window=types.SimpleNamespace()))
    assert is_passkey_supported() is False  # an old browser or a WebView without WebAuthn
    monkeypatch.setitem(sys.modules, "js", types.SimpleNamespace())
    assert is_passkey_supported() is False  # a web worker: no window


def _no_js(real: object) -> object:
    def importer(name: str, *args: object, **kwargs: object) -> object:
        if name == "js":
            raise ImportError("No module named 'js'")
        return real(name, *args, **kwargs)  # type: ignore[operator]

    return importer
