"""The dashboard's sign-in and the operational tokens at the trust boundary, against real server processes:
server-side sessions that die at sign-out and expiry, and wrong tokens rate-limited per client address."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path

import httpx
import pytest

from offline import define_schema, t
from offline.core.errors import OfflineError
from server_runtime import create_production_server
from server_runtime.dashboard_sessions import DashboardSessions
from server_runtime.operational import COOKIE, TOKEN_ATTEMPTS, OperationalAuth
from server_runtime.stores import MemoryServerStore
from tests.hardening.support import start_server

ADMIN = "admin-token-for-sessions-0123"
METRICS = "metrics-token-for-sessions"
BACKUP = "backup-token-for-sessions"
TOKENS = {"OFFLINE_ADMIN_TOKEN": ADMIN, "OFFLINE_METRICS_TOKEN": METRICS, "OFFLINE_BACKUP_TOKEN": BACKUP}
HTML = {"Accept": "text/html"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def sign_in(http: httpx.Client) -> tuple[str, str]:
    """Sign in through the form; (the cookie's value, the whole Set-Cookie header)."""
    response = http.post("/__offline/login", data={"token": ADMIN})
    assert response.status_code == 303 and response.headers["location"] == "/__offline"
    set_cookie = response.headers["set-cookie"]
    name, _, value = set_cookie.split(";")[0].partition("=")
    assert name == COOKIE and value
    return value, set_cookie


def with_cookie(url: str, value: str) -> httpx.Client:
    return httpx.Client(base_url=url, cookies={COOKIE: value}, timeout=10)


def test_the_cookie_is_dead_after_sign_out(tmp_path: Path) -> None:
    with (
        start_server(tmp_path, env=TOKENS) as server,
        httpx.Client(base_url=server.http_url, timeout=10) as http,
    ):
        first, set_cookie = sign_in(http)
        attributes = [part.strip().lower() for part in set_cookie.split(";")]
        assert (
            "httponly" in attributes and "samesite=strict" in attributes and "path=/__offline" in attributes
        )
        assert "secure" not in attributes  # plain http here: a Secure cookie would never come back
        assert (
            "max-age=43200" in attributes
        )  # 12 hours unless OFFLINE_DASHBOARD_SESSION_SECONDS says otherwise
        second, _ = sign_in(httpx.Client(base_url=server.http_url, timeout=10))
        assert first != second and ADMIN not in first  # random per sign-in, never derived from the token

        # A copy of the cookie, kept by someone else, works while the session lives ...
        with with_cookie(server.http_url, first) as copy:
            assert copy.get("/__offline/status").status_code == 200
            assert copy.get("/__offline", headers=HTML).status_code == 200
        # A live event stream opened with it ...
        stream_client = with_cookie(server.http_url, first)
        stream = stream_client.send(stream_client.build_request("GET", "/__offline/events"), stream=True)
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("event: ready"))
        ended = threading.Event()

        def drain() -> None:
            with contextlib.suppress(httpx.HTTPError):
                for _ in lines:
                    pass
            ended.set()

        threading.Thread(target=drain, daemon=True).start()
        # ... and not after sign-out: the server forgot the session, and ends the streams it opened.
        out = http.post("/__offline/logout")
        assert out.status_code == 303 and out.headers["location"] == "/__offline/login"
        with with_cookie(server.http_url, first) as copy:
            assert copy.get("/__offline/status").status_code == 401
            page = copy.get("/__offline", headers=HTML)
            assert page.status_code == 303 and page.headers["location"] == "/__offline/login"
            with copy.stream("GET", "/__offline/events") as stream:
                assert stream.status_code == 401
        assert ended.wait(30), "the event stream of the ended session is still open"
        stream.close()
        stream_client.close()
        # Another browser's session is its own.
        with with_cookie(server.http_url, second) as other:
            assert other.get("/__offline/status").status_code == 200


def test_an_expired_session_is_refused(tmp_path: Path) -> None:
    env = {**TOKENS, "OFFLINE_DASHBOARD_SESSION_SECONDS": "1"}
    with (
        start_server(tmp_path, env=env) as server,
        httpx.Client(base_url=server.http_url, timeout=10) as http,
    ):
        value, set_cookie = sign_in(http)
        assert "max-age=1" in set_cookie.lower()
        deadline = time.monotonic() + 30
        with with_cookie(server.http_url, value) as browser:
            while browser.get("/__offline/status").status_code != 401:
                assert time.monotonic() < deadline, "the session outlived its expiry by far"
                time.sleep(0.2)
            # Expired for good: the same cookie stays refused.
            assert browser.get("/__offline/status").status_code == 401


def test_wrong_tokens_are_rate_limited_per_address(tmp_path: Path) -> None:
    with (
        start_server(tmp_path, env=TOKENS) as server,
        httpx.Client(base_url=server.http_url, timeout=10) as attacker,
        httpx.Client(
            base_url=server.http_url, timeout=10, transport=httpx.HTTPTransport(local_address="127.0.0.2")
        ) as admin,
    ):
        # Requests without any token are not guesses: they never count.
        for _ in range(TOKEN_ATTEMPTS + 2):
            assert attacker.get("/__offline/status").status_code == 401
        # Wrong tokens on every kind of endpoint, and in the sign-in form, count together.
        guesses = [
            lambda: attacker.get("/__offline/status", headers=bearer("guess-1")),
            lambda: attacker.get("/__offline/metrics", headers=bearer(ADMIN)),  # not the metrics token
            lambda: attacker.post("/__offline/backup/export", headers=bearer("guess-3")),
            lambda: attacker.post("/__offline/login", data={"token": "guess-4"}),
            lambda: attacker.get("/__offline", headers=bearer("guess-5")),
        ]
        assert len(guesses) == TOKEN_ATTEMPTS
        for guess in guesses:
            assert guess().status_code == 401
        limited = attacker.get("/__offline/status", headers=bearer("guess-6"))
        assert limited.status_code == 429
        assert int(limited.headers["retry-after"]) > 0
        # Locked out: even the right token is not compared (a 200 would tell the guesser it got there).
        for locked in (
            attacker.get("/__offline/status", headers=bearer(ADMIN)),
            attacker.get("/__offline/metrics", headers=bearer(METRICS)),
            attacker.post("/__offline/backup/import", headers=bearer(BACKUP), content=b""),
            attacker.post("/__offline/login", data={"token": ADMIN}),
        ):
            assert locked.status_code == 429
            assert int(locked.headers["retry-after"]) > 0
            assert "set-cookie" not in locked.headers

        # A forwarding header from a peer that is not a trusted proxy changes nothing.
        spoofed = attacker.get(
            "/__offline/status", headers={**bearer(ADMIN), "X-Forwarded-For": "198.51.100.7"}
        )
        assert spoofed.status_code == 429

        # Another address is not affected: its right tokens work and its own failures start from zero.
        assert admin.get("/__offline/status", headers=bearer(ADMIN)).status_code == 200
        assert admin.get("/__offline/metrics", headers=bearer(METRICS)).status_code == 200
        assert admin.get("/__offline/status", headers=bearer("typo")).status_code == 401
        sign_in(admin)
        assert admin.get("/__offline/status").status_code == 200


def test_behind_a_trusted_proxy_the_forwarded_client_is_limited_and_https_is_seen(tmp_path: Path) -> None:
    env = {**TOKENS, "OFFLINE_TRUSTED_PROXIES": "127.0.0.1"}
    with (
        start_server(tmp_path, env=env) as server,
        httpx.Client(base_url=server.http_url, timeout=10) as proxy,
    ):
        guesser = {"X-Forwarded-For": "203.0.113.5"}
        for attempt in range(TOKEN_ATTEMPTS):
            assert (
                proxy.get("/__offline/status", headers={**guesser, **bearer(f"guess-{attempt}")}).status_code
                == 401
            )
        assert proxy.get("/__offline/status", headers={**guesser, **bearer(ADMIN)}).status_code == 429
        # The proxy's other clients are not locked out with the guesser.
        admin = {"X-Forwarded-For": "203.0.113.6"}
        assert proxy.get("/__offline/status", headers={**admin, **bearer(ADMIN)}).status_code == 200
        # TLS ended at the proxy: the browser's https still makes the cookie Secure.
        response = proxy.post(
            "/__offline/login", data={"token": ADMIN}, headers={**admin, "X-Forwarded-Proto": "https"}
        )
        assert response.status_code == 303
        assert "secure" in [part.strip().lower() for part in response.headers["set-cookie"].split(";")]
    # From a peer that is not a trusted proxy, the same header is ignored.
    with start_server(tmp_path / "direct", env=TOKENS) as server:
        response = httpx.post(
            f"{server.http_url}/__offline/login",
            data={"token": ADMIN},
            headers={"X-Forwarded-Proto": "https"},
        )
        assert response.status_code == 303
        assert "secure" not in [part.strip().lower() for part in response.headers["set-cookie"].split(";")]


# -- in process -------------------------------------------------------------------------------------------------


def test_the_cookie_is_secure_when_the_request_came_over_https() -> None:
    server = create_production_server(
        store=MemoryServerStore(), port=0, host="127.0.0.1", operational_auth={"adminToken": ADMIN}
    )

    async def sign_in_over_https() -> httpx.Response:
        transport = httpx.ASGITransport(app=server.app)
        async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as https:
            return await https.post("/__offline/login", data={"token": ADMIN})

    response = asyncio.run(sign_in_over_https())
    assert response.status_code == 303
    attributes = [part.strip().lower() for part in response.headers["set-cookie"].split(";")]
    assert "secure" in attributes and "httponly" in attributes and "samesite=strict" in attributes


def test_sessions_expire_and_end() -> None:
    clock = [100.0]
    sessions = DashboardSessions(60, max_sessions=3, now=lambda: clock[0])
    one = sessions.create()
    assert sessions.valid(one) and not sessions.valid(one + "x") and not sessions.valid(None)
    clock[0] += 59.9
    assert sessions.valid(one)
    clock[0] += 0.1
    assert not sessions.valid(one) and len(sessions) == 0  # expired sessions are dropped when seen
    two = sessions.create()
    sessions.end(two)
    assert not sessions.valid(two)
    kept = [sessions.create() for _ in range(4)]  # beyond max_sessions the oldest goes
    assert [sessions.valid(s) for s in kept] == [False, True, True, True]
    with pytest.raises(ValueError):
        DashboardSessions(0)


def test_a_session_length_that_is_not_a_positive_number_is_refused_at_start() -> None:
    for text in ("soon", "0", "-5", "nan", "inf"):
        with pytest.raises(OfflineError) as refused:
            OperationalAuth({"adminToken": ADMIN}, env={"OFFLINE_DASHBOARD_SESSION_SECONDS": text})
        assert refused.value.context["field"] == "OFFLINE_DASHBOARD_SESSION_SECONDS", text
    assert OperationalAuth({}, env={"OFFLINE_DASHBOARD_SESSION_SECONDS": "90"}).sessions.ttl == 90


@pytest.mark.parametrize("with_page", [False, True])
def test_sign_out_takes_a_post_only(tmp_path: Path, with_page: bool) -> None:
    """A GET must not end a session (a link or an image on any page could sign the admin out): 405 with
    Allow: POST, also when the server's page answers every other path (its SPA fallback)."""
    static = None
    if with_page:
        (tmp_path / "index.html").write_text("<!doctype html><title>app</title>")
        static = str(tmp_path)
    store = MemoryServerStore()
    asyncio.run(
        store.set_schema(
            define_schema({"version": 1, "collections": {"items": {"fields": {"name": t.string()}}}})
        )
    )
    server = create_production_server(
        store=store,
        port=0,
        host="127.0.0.1",
        static_dir=static,
        operational_auth={"adminToken": ADMIN},
    )

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=server.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            signed_in = await http.post("/__offline/login", data={"token": ADMIN})
            assert signed_in.status_code == 303
            session = http.cookies[COOKIE]
            for method in ("GET", "HEAD", "PUT", "DELETE"):
                refused = await http.request(method, "/__offline/logout")
                assert refused.status_code == 405, (method, refused.status_code)
                assert refused.headers["allow"] == "POST"
            assert (await http.get("/__offline/status")).status_code == 200  # still signed in
            out = await http.post("/__offline/logout")
            assert out.status_code == 303 and out.headers["location"] == "/__offline/login"
        async with httpx.AsyncClient(
            transport=transport, base_url="http://testserver", cookies={COOKIE: session}
        ) as copy:
            assert (await copy.get("/__offline/status")).status_code == 401  # the server forgot the session

    asyncio.run(scenario())


def test_the_sign_in_page_shows_its_error_message_as_text_not_markup() -> None:
    """The error line is built from a message string: markup in it (a path or name a later caller might pass)
    is shown escaped, never run as script in the dashboard's origin."""
    from server_runtime.dashboard import _error_page

    body = _error_page('<script>alert("x")</script> & more', 400).body.decode()
    assert "<script>alert" not in body
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in body
