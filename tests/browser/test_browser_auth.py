"""`offline.auth` inside the browser: the page's Web Worker (Pyodide) signs up and in with the Python auth client,
whose HTTP goes through the browser's fetch (httpx cannot run there), and syncs with the scope its token's
claims give. A live server with `create_auth_routes` and the sync auth provider serves the page; the usual
loopback-only guard (support.py) applies.

The `offline init` template is built with a scoped schema and a few auth functions added to todos.py, which
the page calls through the worker bridge (``offlineClient.call``), as its own buttons would.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offline.auth.fetch_http import FetchSender
from offline.auth.http import AuthHttp

from .support import LiveServer, copy_project, guarded_browser, load_module, new_context
from .test_browser_client import eventually, open_app, sync_status

SECRET = "browser-auth-test-secret-of-32-bytes!!"
PASSWORD = "correct horse battery"

SCOPED_SCHEMA = """
from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "ownerId": t.string(),
                    "createdAt": t.timestamp().auto(),
                },
            },
        },
        "sync": {"todos": {"where": {"ownerId": "userId"}}},
    }
)
"""

AUTH_FUNCTIONS = """

# -- added by tests/browser/test_browser_auth.py: signing in from the page ------------------------------------
import sys as _sys

from offline.auth import OfflineAuth, create_offline_auth, create_offline_auth_sync

_auth: OfflineAuth | None = None


def _client() -> OfflineAuth:
    global _auth
    if _auth is None:
        import js  # the worker's global scope: the auth server is the one that served the page

        _auth = create_offline_auth(server_url=str(js.location.origin))
    return _auth


async def _sync_as(app: App, auth: OfflineAuth | None) -> dict[str, Any]:
    await app.sync.disconnect()
    app.sync.auth_client = None if auth is None else create_offline_auth_sync(auth, app.schema)
    if auth is not None:
        await app.sync.connect(wait=False)
    client = _client()
    return {
        "user": client.user,
        "store": type(client.credential_store).__name__,
        "sender": type(client._http.sender).__name__,
        "platform": _sys.platform,
        "httpx": "httpx" in _sys.modules,
        "scope": None if auth is None else app.sync.auth_client.scope_values(),
    }


async def sign_up(app: App, email: str, password: str) -> dict[str, Any]:
    await _client().sign_up(email, password)
    return await _sync_as(app, _client())


async def sign_in(app: App, email: str, password: str) -> dict[str, Any]:
    await _client().sign_in(email, password)
    return await _sync_as(app, _client())


async def sign_out(app: App) -> dict[str, Any]:
    await _client().sign_out()
    return await _sync_as(app, None)


async def whoami(app: App) -> dict[str, Any]:
    return dict(await _client().me())


def add_mine(app: App, title: str) -> dict[str, Any]:
    user = _client().user
    if user is None:
        raise OfflineError("sign in first", "AUTH_FAILED", {})
    return app.todos.insert({"title": title, "ownerId": user["id"]})


__all__ = [*__all__, "add_mine", "sign_in", "sign_out", "sign_up", "whoami"]
"""


@pytest.fixture(scope="module")
def auth_project(web_project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template with a per-user scope and the auth functions, built for the server that serves it."""
    from offline_cli.web_build import build_web_client

    variant = tmp_path_factory.mktemp("browser-auth") / "auth-app"
    copy_project(web_project, variant)
    (variant / "schema.py").write_text(SCOPED_SCHEMA, encoding="utf-8")
    with (variant / "todos.py").open("a", encoding="utf-8") as todos:
        todos.write(AUTH_FUNCTIONS)
    build_web_client(variant, sync_url="/offline-sync")
    return variant


@contextlib.contextmanager
def auth_server(
    schema: Any, static_dir: Path, db_path: Path, *, port: int = 0, **route_options: Any
) -> Iterator[LiveServer]:
    """`create_production_server` with `create_auth_routes` and its sync provider, in its own thread (on
    ``port``, 0 for any free one; ``route_options`` go to `create_auth_routes`, e.g. ``passkeys``)."""
    from server_runtime import create_auth_routes, create_production_server
    from server_runtime.stores import create_sqlite_server_store

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="browser-auth-server", daemon=True)
    thread.start()

    async def start() -> tuple[Any, Any, str]:
        store = create_sqlite_server_store(str(db_path))
        await store.set_schema(schema)
        routes = create_auth_routes(
            secret=SECRET, **{"rate_limits": {"account_attempts": 2}, **route_options}
        )
        server = create_production_server(
            store=store,
            port=port,
            host="127.0.0.1",
            static_dir=str(static_dir),
            auth_routes=routes,
            sync_options={"auth": routes.to_sync_auth_provider()},
        )
        try:
            return server, store, await server.start()
        except BaseException:
            await store.close()
            raise

    server, store, url = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    live = LiveServer(server, store, loop, url.rstrip("/"))
    try:
        yield live
    finally:

        async def stop() -> None:
            try:
                await server.stop()
            finally:
                await store.close()

        try:
            live.call(stop())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


async def call(page: Any, name: str, *args: Any) -> Any:
    return await page.evaluate(
        "([name, args]) => window.offlineClient.call(name, ...args)", [name, list(args)]
    )


async def call_error(page: Any, name: str, *args: Any) -> dict[str, Any]:
    """The error a call fails with (name, code, message, context); the call must fail."""
    error = await page.evaluate(
        """([name, args]) => window.offlineClient.call(name, ...args).then(
            () => null, (e) => ({name: e.name, code: e.code, message: e.message, context: e.context}))""",
        [name, list(args)],
    )
    assert error is not None, f"{name}{args} succeeded"
    return dict(error)


async def titles_in(page: Any) -> list[str]:
    rows = await page.evaluate("window.offlineClient.collection('todos').fetch()")
    return sorted(row["title"] for row in rows)


def test_the_worker_signs_in_with_offline_auth_and_syncs_only_its_users_records(
    chromium: str, auth_project: Path, tmp_path: Path
) -> None:
    schema = load_module(auth_project / "schema.py", "auth_app_schema").schema

    async def scenario(live: LiveServer) -> None:
        async with guarded_browser(chromium) as (browser, guard):
            ada = await open_app(await new_context(browser, guard), live.url)
            bob = await open_app(await new_context(browser, guard), live.url)

            signed = await call(ada, "sign_up", "ada@example.com", PASSWORD)
            assert signed["platform"] == "emscripten"
            assert signed["sender"] == "FetchSender" and signed["httpx"] is False  # fetch, no httpx at all
            assert signed["store"] == "MemoryCredentialStore"  # the browser default: nothing on disk
            assert signed["user"]["email"] == "ada@example.com"
            ada_id = signed["user"]["id"]
            assert signed["scope"] == {"userId": ada_id}  # from the access token's claims
            assert (await call(ada, "whoami"))["email"] == "ada@example.com"  # a Bearer call over fetch

            signed = await call(bob, "sign_up", "bob@example.com", PASSWORD)
            bob_id = signed["user"]["id"]
            assert bob_id != ada_id
            for page in (ada, bob):
                await sync_status(page, "connected", pending=0)

            await call(ada, "add_mine", "ada's secret")
            await call(bob, "add_mine", "bob's secret")
            for page in (ada, bob):
                await sync_status(page, "connected", pending=0)

            async def on_the_server() -> None:
                owners = {r["title"]: r["ownerId"] for r in live.records("todos")}
                assert owners == {"ada's secret": ada_id, "bob's secret": bob_id}

            await eventually(on_the_server)
            # Each browser holds only its user's records: the server scoped their sync by the token.
            assert await titles_in(ada) == ["ada's secret"]
            assert await titles_in(bob) == ["bob's secret"]

            # The server's error codes come through fetch as they do through httpx.
            error = await call_error(bob, "sign_in", "bob@example.com", "not the password")
            assert (error["name"], error["code"]) == ("OfflineError", "INVALID_CREDENTIALS"), error
            taken = await call_error(bob, "sign_up", "ada@example.com", PASSWORD)
            assert taken["code"] == "EMAIL_TAKEN", taken

            # Signing out and in again (a new session), then writing more: still only bob's records.
            assert (await call(bob, "sign_out"))["user"] is None
            assert (await call(bob, "sign_in", "bob@example.com", PASSWORD))["user"]["id"] == bob_id
            await sync_status(bob, "connected", pending=0)
            await call(bob, "add_mine", "bob again")
            await sync_status(bob, "connected", pending=0)

            async def both_of_bob() -> None:
                assert await titles_in(bob) == ["bob again", "bob's secret"]
                assert len(live.records("todos")) == 3

            await eventually(both_of_bob)
            assert await titles_in(ada) == ["ada's secret"]

            # Ada on a fresh browser: signing in pulls her records, and only hers.
            again = await open_app(await new_context(browser, guard), live.url)
            assert (await call(again, "sign_in", "ada@example.com", PASSWORD))["user"]["id"] == ada_id
            await sync_status(again, "connected", pending=0)

            async def adas_records() -> None:
                assert await titles_in(again) == ["ada's secret"]

            await eventually(adas_records)

            # A rate limit arrives with its Retry-After header, read through fetch.
            for _ in range(2):
                error = await call_error(again, "sign_in", "ada@example.com", "wrong password")
                assert error["code"] == "INVALID_CREDENTIALS", error
            limited = await call_error(again, "sign_in", "ada@example.com", "wrong password")
            assert limited["code"] == "RATE_LIMITED", limited
            assert limited["context"]["retry_after"] > 0, limited

    with auth_server(schema, auth_project / "dist", tmp_path / "server.db") as live:
        asyncio.run(scenario(live))


# -- FetchSender on CPython, with a stand-in for pyodide.http.pyfetch's response --------------------------------


class _FetchResponse:
    """The parts of `pyodide.http.FetchResponse` FetchSender reads."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str], kind: str = "basic") -> None:
        self.status = status
        self.headers = (
            headers  # FetchResponse.headers: a dict with the names as fetch gives them (lower case)
        )
        self.type = kind
        self._body = body

    async def bytes(self) -> bytes:
        return self._body


def test_fetch_sender_maps_answers_errors_and_timeouts() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    answers: list[Any] = [
        _FetchResponse(200, b'{"id": "u1", "email": "a@b.c"}', {"content-type": "application/json"}),
        _FetchResponse(
            429,
            b'{"error": {"code": "RATE_LIMITED", "message": "wait"}}',
            {"retry-after": "42", "content-type": "application/json"},
        ),
        OSError("TypeError: Failed to fetch"),  # what a refused connection looks like from fetch
        _FetchResponse(0, b"", {}, kind="opaqueredirect"),
        "hang",
    ]

    async def fetch(url: str, **options: Any) -> Any:
        sent.append((url, options))
        answer = answers.pop(0)
        if answer == "hang":
            await asyncio.sleep(3600)
        if isinstance(answer, Exception):
            raise answer
        return answer

    from offline.auth import AuthError

    async def scenario() -> None:
        http = AuthHttp("http://127.0.0.1:9/auth", timeout=0.2, sender=FetchSender(fetch))
        response = await http.request("GET", "/me", bearer="tok", params={"x": "1 2"})
        assert response.json() == {"id": "u1", "email": "a@b.c"}
        assert response.headers["Content-Type"] == "application/json"  # case-insensitive names
        url, options = sent[0]
        assert url == "http://127.0.0.1:9/auth/me?x=1+2"
        assert options["method"] == "GET" and "body" not in options
        assert options["headers"]["Authorization"] == "Bearer tok"
        assert options["redirect"] == "manual" and options["credentials"] == "omit"

        with pytest.raises(AuthError) as caught:
            await http.request("POST", "/sign-in", json={"email": "a@b.c", "password": "secret pw"})
        assert caught.value.code == "RATE_LIMITED" and caught.value.context["retry_after"] == 42.0
        assert sent[1][1]["body"] == '{"email":"a@b.c","password":"secret pw"}'
        assert sent[1][1]["headers"]["Content-Type"] == "application/json"

        for expected in ("Failed to fetch", "redirect", "no answer within 0.2 s"):
            with pytest.raises(AuthError) as caught:
                await http.request("POST", "/sign-in", json={"email": "a@b.c", "password": "secret pw"})
            assert caught.value.code == "AUTH_UNAVAILABLE" and caught.value.context["retriable"] is True
            assert expected in caught.value.message, caught.value.message
            assert "secret pw" not in caught.value.message

    asyncio.run(scenario())


def test_offline_auth_imports_without_httpx(tmp_path: Path) -> None:
    """Pyodide has no httpx: importing the auth client (and making one) must not need it."""
    import subprocess

    code = (
        "import sys\n"
        "sys.modules['httpx'] = None  # importing httpx now fails, as in a browser\n"
        "sys.platform = 'emscripten'\n"
        "from offline.auth import create_offline_auth\n"
        "auth = create_offline_auth(server_url='http://127.0.0.1:9')\n"
        "print(type(auth._http.sender).__name__, type(auth.credential_store).__name__)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=60,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["FetchSender", "MemoryCredentialStore"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
