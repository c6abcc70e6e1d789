"""The auth client against a faithful emulation of the auth routes (fake_server.py), with a controlled clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from offline import OfflineError, define_schema, t
from offline.auth import (
    AUTH_FAILED,
    AUTH_UNAVAILABLE,
    EMAIL_TAKEN,
    INVALID_CREDENTIALS,
    INVALID_INPUT,
    OAUTH_FAILED,
    OAUTH_PROVIDER_UNKNOWN,
    RATE_LIMITED,
    AuthError,
    FileCredentialStore,
    MemoryCredentialStore,
    OfflineAuth,
    create_offline_auth,
    create_offline_auth_sync,
    decode_claims,
)

from .fake_server import FakeAuthServer, FakeClock

T = TypeVar("T")

SERVER = "http://127.0.0.1:3001"
EMAIL = "ada@example.com"
PASSWORD = "correct horse battery"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> FakeAuthServer:
    return FakeAuthServer(clock=clock)


def make_auth(server: FakeAuthServer, store: Any = None, **options: Any) -> OfflineAuth:
    return create_offline_auth(
        server_url=SERVER,
        credential_store=store,
        http_client=server.http_client(),
        clock=server.clock,
        **options,
    )


def refreshes(server: FakeAuthServer) -> int:
    return server.paths().count("/auth/refresh")


# -- sign up / sign in ---------------------------------------------------------------------------------------


def test_sign_up_signs_in_and_user_is_the_token_subject(server: FakeAuthServer) -> None:
    store = MemoryCredentialStore()
    auth = make_auth(server, store)
    assert auth.user is None and not auth.is_signed_in

    user = run(auth.sign_up(EMAIL, PASSWORD))

    assert user == auth.user
    assert user["email"] == EMAIL
    token = run(auth.get_access_token())
    assert token is not None
    claims = server.verify_access(token)
    assert claims is not None and claims["sub"] == user["id"]
    assert decode_claims(token)["sub"] == user["id"]
    stored = store.load()
    assert stored is not None and stored.access_token == token
    assert PASSWORD not in repr(stored.to_json())
    assert server.paths() == ["/auth/sign-up"]


def test_sign_in_after_sign_up_elsewhere(server: FakeAuthServer) -> None:
    run(make_auth(server).sign_up(EMAIL, PASSWORD))
    auth = make_auth(server)
    user = run(auth.sign_in(f"  {EMAIL} ", PASSWORD))  # surrounding spaces are not part of an address
    assert user["email"] == EMAIL
    assert server.calls[-1][2]["email"] == EMAIL


def test_email_taken_and_invalid_credentials_carry_the_server_code(server: FakeAuthServer) -> None:
    run(make_auth(server).sign_up(EMAIL, PASSWORD))
    auth = make_auth(server)
    with pytest.raises(AuthError) as taken:
        run(auth.sign_up(EMAIL, PASSWORD))
    assert taken.value.code == EMAIL_TAKEN and taken.value.context is not None
    assert taken.value.context["status"] == 409

    wrong: list[OfflineError] = []
    for email, password in ((EMAIL, "wrong password"), ("nobody@example.com", PASSWORD)):
        with pytest.raises(OfflineError) as info:
            run(auth.sign_in(email, password))
        wrong.append(info.value)
    assert [e.code for e in wrong] == [INVALID_CREDENTIALS, INVALID_CREDENTIALS]
    assert wrong[0].message == wrong[1].message  # unknown email and wrong password look the same
    assert all(e.name == "OfflineError" for e in wrong)
    assert auth.user is None


def test_rate_limited_reports_retry_after(server: FakeAuthServer) -> None:
    server.max_failed_sign_ins = 2
    auth = make_auth(server)
    codes = []
    for _ in range(3):
        with pytest.raises(AuthError) as info:
            run(auth.sign_in(EMAIL, "not the password"))
        codes.append(info.value.code)
    assert codes == [INVALID_CREDENTIALS, INVALID_CREDENTIALS, RATE_LIMITED]
    assert info.value.context is not None and info.value.context["retry_after"] == server.retry_after


@pytest.mark.parametrize(
    ("email", "password", "field"),
    [
        ("not-an-email", PASSWORD, "email"),
        ("a@b@example.com", PASSWORD, "email"),
        ("ada @example.com", PASSWORD, "email"),
        ("ada@", PASSWORD, "email"),
        (None, PASSWORD, "email"),
        (EMAIL, "short77", "password"),
        (EMAIL, None, "password"),
    ],
)
def test_input_is_checked_before_anything_is_sent(
    server: FakeAuthServer, email: Any, password: Any, field: str
) -> None:
    auth = make_auth(server)
    for call in (auth.sign_up, auth.sign_in):
        with pytest.raises(AuthError) as info:
            run(call(email, password))
        assert info.value.code == INVALID_INPUT
        assert info.value.context == {"field": field}
        assert field in info.value.message
        if isinstance(password, str):
            assert password not in str(info.value) and password not in repr(info.value)
    assert server.calls == []


def test_eight_characters_is_enough_without_composition_rules(server: FakeAuthServer) -> None:
    user = run(make_auth(server).sign_up(EMAIL, "aaaaaaaa"))
    assert user["email"] == EMAIL


def test_server_side_invalid_input_names_the_field(server: FakeAuthServer) -> None:
    # The local check is deliberately loose (any a@b); the server may be stricter and names the field.
    with pytest.raises(AuthError) as info:
        run(make_auth(server).sign_up("ada@localhost", PASSWORD))
    assert info.value.code == INVALID_INPUT
    assert info.value.context is not None and info.value.context["field"] == "email"
    assert server.paths() == ["/auth/sign-up"]


def test_password_never_reaches_store_logs_or_errors(
    server: FakeAuthServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = FileCredentialStore(tmp_path / "creds.json")
    auth = make_auth(server, store)
    run(auth.sign_up(EMAIL, PASSWORD))
    with pytest.raises(AuthError) as info:
        run(auth.sign_in(EMAIL, PASSWORD + "x"))
    assert PASSWORD not in (tmp_path / "creds.json").read_text()
    assert PASSWORD not in caplog.text
    assert PASSWORD not in str(info.value) and PASSWORD not in repr(info.value.context)
    token = run(auth.get_access_token())
    assert token is not None and token not in repr(auth) and token not in repr(store.load())


# -- refresh --------------------------------------------------------------------------------------------------


def test_token_is_reused_until_the_margin_then_refreshed_and_rotated(
    server: FakeAuthServer, clock: FakeClock
) -> None:
    store = MemoryCredentialStore()
    auth = make_auth(server, store, refresh_margin=60)
    run(auth.sign_up(EMAIL, PASSWORD))
    first = run(auth.get_access_token())
    first_refresh = store.load().refresh_token  # type: ignore[union-attr]

    # Expiry is reckoned as expiresIn less 1 s (JWT times are whole seconds): 899 s here.
    clock.advance(server.access_ttl - 1 - 61)
    assert run(auth.get_access_token()) == first
    assert refreshes(server) == 0

    clock.advance(2)  # now within 60 s of expiry
    second = run(auth.get_access_token())
    assert second != first and refreshes(server) == 1
    assert server.verify_access(second) is not None  # type: ignore[arg-type]
    stored = store.load()
    assert stored is not None and stored.refresh_token != first_refresh and stored.access_token == second
    assert not server.session_alive(first_refresh)  # rotated: the old one is spent
    assert server.session_alive(stored.refresh_token)
    assert run(auth.get_access_token()) == second and refreshes(server) == 1


def test_short_lived_tokens_are_not_refreshed_at_every_call(server: FakeAuthServer, clock: FakeClock) -> None:
    server.access_ttl = 5  # 4 s reckoned; the margin is capped to a quarter of that (1 s), not 60 s
    auth = make_auth(server)
    run(auth.sign_up(EMAIL, PASSWORD))
    token = run(auth.get_access_token())
    clock.advance(2.9)
    assert run(auth.get_access_token()) == token
    clock.advance(0.2)
    assert run(auth.get_access_token()) != token and refreshes(server) == 1


def test_concurrent_callers_share_one_refresh(server: FakeAuthServer, clock: FakeClock) -> None:
    auth = make_auth(server)

    async def scenario() -> list[str | None]:
        await auth.sign_up(EMAIL, PASSWORD)
        clock.advance(server.access_ttl)  # expired
        server.refresh_gate = asyncio.Event()
        callers = [asyncio.create_task(auth.get_access_token()) for _ in range(5)]
        forced = asyncio.create_task(auth.refresh())
        await asyncio.sleep(0.01)
        server.refresh_gate.set()
        return [*await asyncio.gather(*callers), await forced]

    tokens = run(scenario())
    assert refreshes(server) == 1  # one use of the refresh token: no reuse alarm
    assert len(set(tokens)) == 1 and tokens[0] is not None
    assert server.verify_access(tokens[0]) is not None


def test_a_cancelled_caller_does_not_cancel_the_shared_refresh(
    server: FakeAuthServer, clock: FakeClock
) -> None:
    auth = make_auth(server)

    async def scenario() -> str | None:
        await auth.sign_up(EMAIL, PASSWORD)
        clock.advance(server.access_ttl)
        server.refresh_gate = asyncio.Event()
        impatient = asyncio.create_task(auth.get_access_token())
        patient = asyncio.create_task(auth.get_access_token())
        await asyncio.sleep(0.01)
        impatient.cancel()
        server.refresh_gate.set()
        return await patient

    token = run(scenario())
    assert token is not None and server.verify_access(token) is not None and refreshes(server) == 1


@pytest.mark.parametrize("reason", ["REFRESH_TOKEN_REUSED", "INVALID_REFRESH_TOKEN"])
def test_a_session_the_server_ended_clears_credentials(
    server: FakeAuthServer, clock: FakeClock, tmp_path: Path, reason: str
) -> None:
    store = FileCredentialStore(tmp_path / "creds.json")
    auth = make_auth(server, store)
    seen: list[Any] = []
    auth.on_change(seen.append)
    run(auth.sign_up(EMAIL, PASSWORD))
    stolen = store.load()
    assert stolen is not None
    if reason == "REFRESH_TOKEN_REUSED":
        # Someone else used our refresh token first: our refresh is the second use.
        assert server._refresh({"refreshToken": stolen.refresh_token}).status_code == 200
    else:
        server.refresh_tokens.clear()
    clock.advance(server.access_ttl)

    with pytest.raises(AuthError) as info:
        run(auth.get_access_token())

    assert info.value.code == AUTH_FAILED
    assert info.value.context is not None and info.value.context["reason"] == reason
    assert "sign in again" in info.value.message
    assert auth.user is None and store.load() is None and not (tmp_path / "creds.json").exists()
    assert run(auth.get_access_token()) is None
    assert seen == [auth_user_of(server), None]


def auth_user_of(server: FakeAuthServer) -> dict[str, Any]:
    return {"id": server.users[EMAIL]["id"], "email": EMAIL}


def test_an_expired_refresh_token_ends_the_session_without_a_request(
    server: FakeAuthServer, clock: FakeClock
) -> None:
    auth = make_auth(server)
    run(auth.sign_up(EMAIL, PASSWORD))
    clock.advance(server.refresh_ttl + 1)
    calls = len(server.calls)
    with pytest.raises(AuthError) as info:
        run(auth.get_access_token())
    assert info.value.code == AUTH_FAILED and auth.user is None
    assert len(server.calls) == calls


def test_unreachable_server_keeps_the_session(server: FakeAuthServer, clock: FakeClock) -> None:
    store = MemoryCredentialStore()
    auth = make_auth(server, store)
    run(auth.sign_up(EMAIL, PASSWORD))
    token = run(auth.get_access_token())
    server.unreachable = True

    clock.advance(server.access_ttl - 30)  # within the margin, not expired: the current token still serves
    assert run(auth.get_access_token()) == token

    clock.advance(30)  # expired (expiry is reckoned 1 s early): now the failure shows
    with pytest.raises(AuthError) as info:
        run(auth.get_access_token())
    assert info.value.code == AUTH_UNAVAILABLE
    assert info.value.context is not None and info.value.context["retriable"] is True
    assert auth.user is not None and store.load() is not None

    server.unreachable = False
    fresh = run(auth.get_access_token())
    assert fresh is not None and fresh != token and server.verify_access(fresh) is not None


def test_another_instance_sharing_the_store_refreshed_first(
    server: FakeAuthServer, clock: FakeClock, tmp_path: Path
) -> None:
    path = tmp_path / "creds.json"
    first = make_auth(server, FileCredentialStore(path))
    run(first.sign_up(EMAIL, PASSWORD))
    second = make_auth(server, FileCredentialStore(path))
    assert second.user == first.user
    clock.advance(server.access_ttl)

    token = run(first.get_access_token())
    # The second instance holds the spent refresh token in memory; it must take the stored one, not reuse it.
    assert run(second.get_access_token()) == token
    assert refreshes(server) == 1 and second.user is not None


# -- sign out -------------------------------------------------------------------------------------------------


def test_sign_out_revokes_the_session_and_clears_the_store(server: FakeAuthServer, tmp_path: Path) -> None:
    store = FileCredentialStore(tmp_path / "creds.json")
    auth = make_auth(server, store)
    run(auth.sign_up(EMAIL, PASSWORD))
    token = run(auth.get_access_token())
    creds = store.load()
    assert token is not None and creds is not None

    assert run(auth.sign_out()) is True

    assert server.calls[-1] == ("POST", "/auth/sign-out", {"refreshToken": creds.refresh_token})
    assert server.verify_access(token) is None  # its access tokens are refused (session revoked)
    assert not server.session_alive(creds.refresh_token)
    assert auth.user is None and store.load() is None and not (tmp_path / "creds.json").exists()
    assert run(auth.get_access_token()) is None
    assert run(auth.sign_out()) is True  # signing out twice is harmless
    assert make_auth(server, FileCredentialStore(tmp_path / "creds.json")).user is None


def test_sign_out_while_unreachable_still_forgets_locally(server: FakeAuthServer) -> None:
    store = MemoryCredentialStore()
    auth = make_auth(server, store)
    run(auth.sign_up(EMAIL, PASSWORD))
    server.unreachable = True
    assert run(auth.sign_out()) is False
    assert auth.user is None and store.load() is None


def test_sign_out_during_a_refresh_revokes_the_rotated_session(
    server: FakeAuthServer, clock: FakeClock
) -> None:
    store = MemoryCredentialStore()
    auth = make_auth(server, store)

    async def scenario() -> Any:
        await auth.sign_up(EMAIL, PASSWORD)
        clock.advance(server.access_ttl)
        server.refresh_gate = asyncio.Event()
        pending = asyncio.create_task(auth.get_access_token())
        await asyncio.sleep(0.01)
        signing_out = asyncio.create_task(auth.sign_out())
        await asyncio.sleep(0.01)
        server.refresh_gate.set()
        await signing_out
        return await asyncio.gather(pending, return_exceptions=True)

    run(scenario())
    assert server.paths()[-2:] == ["/auth/refresh", "/auth/sign-out"]
    assert store.load() is None and auth.user is None
    # The pair the refresh produced was not saved over the sign-out, and its session is revoked.
    assert len(server.refresh_tokens) == 2
    assert all(record.sid in server.revoked_sids for record in server.refresh_tokens.values())


def test_signing_in_over_a_session_revokes_the_old_one(server: FakeAuthServer) -> None:
    store = MemoryCredentialStore()
    auth = make_auth(server, store)
    run(auth.sign_up(EMAIL, PASSWORD))
    old = store.load()
    run(auth.sign_up("grace@example.com", PASSWORD))
    assert old is not None and not server.session_alive(old.refresh_token)
    assert auth.user is not None and auth.user["email"] == "grace@example.com"


def test_sign_out_everywhere_and_me(server: FakeAuthServer) -> None:
    phone, laptop = make_auth(server), make_auth(server)
    run(phone.sign_up(EMAIL, PASSWORD))
    run(laptop.sign_in(EMAIL, PASSWORD))
    laptop_token = run(laptop.get_access_token())
    assert run(phone.me())["email"] == EMAIL

    run(phone.sign_out_everywhere())

    assert phone.user is None
    assert server.verify_access(laptop_token) is None  # type: ignore[arg-type]
    with pytest.raises(AuthError) as info:
        run(laptop.me())
    assert info.value.code == AUTH_FAILED


# -- OAuth ----------------------------------------------------------------------------------------------------


def test_oauth_loopback_flow(server: FakeAuthServer) -> None:
    auth = make_auth(server)
    redirect = "http://127.0.0.1:53117/callback"
    url = run(auth.oauth_authorize("github", redirect))
    state = next(iter(server.oauth_states))
    assert url.startswith("https://github.example/authorize?") and f"state={state}" in url

    user = run(auth.complete_oauth("github", "good-code", state))

    assert user["email"] == "oauth-user@github.example" and auth.user == user
    assert server.calls[-1] == (
        "POST",
        "/auth/oauth/github/callback",
        {"code": "good-code", "state": state, "redirectUri": redirect},
    )


def test_oauth_refuses_a_state_it_did_not_start(server: FakeAuthServer) -> None:
    auth = make_auth(server)
    run(auth.oauth_authorize("github", "http://127.0.0.1:1/cb"))
    calls = len(server.calls)
    with pytest.raises(AuthError) as info:
        run(auth.complete_oauth("github", "good-code", "attacker-state"))
    assert info.value.code == OAUTH_FAILED and len(server.calls) == calls
    # Without the local check the server's own check still refuses it.
    with pytest.raises(AuthError) as info:
        run(auth.complete_oauth("github", "good-code", "attacker-state", check_state=False))
    assert info.value.code == OAUTH_FAILED and auth.user is None


def test_oauth_unknown_provider(server: FakeAuthServer) -> None:
    with pytest.raises(AuthError) as info:
        run(make_auth(server).oauth_authorize("myspace", "http://127.0.0.1:1/cb"))
    assert info.value.code == OAUTH_PROVIDER_UNKNOWN
    with pytest.raises(AuthError) as info:
        run(make_auth(server).oauth_authorize("../admin", "http://127.0.0.1:1/cb"))
    assert info.value.code == INVALID_INPUT and info.value.context == {"field": "provider"}


# -- configuration and the sync bridge ------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["ws://127.0.0.1:3001", "example.com", "", 3001])
def test_server_url_must_be_http(url: Any) -> None:
    with pytest.raises(AuthError) as info:
        create_offline_auth(server_url=url, credential_store=None)
    assert info.value.code == INVALID_INPUT and info.value.context == {"field": "server_url"}


def test_credential_store_must_be_a_store() -> None:
    with pytest.raises(AuthError) as info:
        create_offline_auth(server_url=SERVER, credential_store="~/.tokens")  # type: ignore[arg-type]
    assert info.value.code == INVALID_INPUT and info.value.context == {"field": "credential_store"}


def test_a_server_without_auth_routes_is_reported(server: FakeAuthServer) -> None:
    auth = create_offline_auth(
        server_url=SERVER, credential_store=None, http_client=server.http_client(), auth_path="/nothing-here"
    )
    with pytest.raises(AuthError) as info:
        run(auth.sign_in(EMAIL, PASSWORD))
    assert info.value.code == AUTH_UNAVAILABLE and "create_auth_routes" in info.value.message


def test_offline_auth_sync_hands_over_tokens_and_reads_scope_values(
    server: FakeAuthServer, clock: FakeClock
) -> None:
    schema = define_schema(
        {
            "version": 1,
            "collections": {"todos": {"fields": {"ownerId": t.string(), "title": t.string()}}},
            "sync": {"todos": {"where": {"ownerId": "userId"}}},
        }
    )
    auth = make_auth(server)
    bridge = create_offline_auth_sync(auth_client=auth, schema=schema)
    assert run(bridge.get_access_token()) is None and bridge.scope_values() == {}
    user = run(auth.sign_up(EMAIL, PASSWORD))

    token = run(bridge.get_access_token())
    assert token == run(auth.get_access_token())
    assert bridge.scope_values() == {"userId": user["id"]}
    assert bridge.scope_map() == {"todos": {"ownerId": user["id"]}}
    clock.advance(server.access_ttl)
    assert run(bridge.get_access_token()) != token  # refreshed through the bridge
    forced = run(bridge.refresh_access_token())
    assert forced is not None and forced == run(auth.get_access_token())


def test_offline_auth_sync_checks_its_arguments() -> None:
    schema = define_schema({"version": 1, "collections": {"notes": {"fields": {"body": t.string()}}}})
    with pytest.raises(AuthError) as info:
        create_offline_auth_sync(auth_client=object(), schema=schema)  # type: ignore[arg-type]
    assert info.value.context == {"field": "auth_client"}
    auth = create_offline_auth(server_url=SERVER, credential_store=None)
    with pytest.raises(AuthError) as info:
        create_offline_auth_sync(auth_client=auth, schema={"version": 1})  # type: ignore[arg-type]
    assert info.value.context == {"field": "schema"}
