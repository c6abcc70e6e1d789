"""No configured secret in any log line, live event or error of a whole server run.

One server process on PostgreSQL (its DATABASE_URL carries a password), with admin, metrics and backup tokens,
AUTH_SECRET and an Origin allow-list, logging at DEBUG. The run exercises everything that could echo a secret:
sign-up, sign-in (right and wrong passwords), refresh, sign-out, sync handshakes with valid, tampered, foreign
and refresh tokens, a real client syncing with its access token, every operational endpoint with right and
wrong tokens, the dashboard's cookie sign-in, backup export and import, a refused Origin, and a graceful
SIGTERM. A second process is pointed at a database it cannot reach (with a password in the URL) and fails.

Then the log output of both processes, the whole SSE stream (``/__offline/events``, subscribed from start to
shutdown) and every HTTP error body and protocol error received are searched for each secret: the three
tokens, AUTH_SECRET, the database password, every user password, every access and refresh token issued (and
anything shaped like a JWT), and the dashboard session cookie.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import urllib.parse
from pathlib import Path

import httpx
import jwt
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from offline import create_app
from offline.core.uuid7 import generate_uuid_v7
from offline.sync import protocol as p
from tests.support.servers import ServerProcess, write_entry

from .support import SCHEMA, SCHEMA_SOURCE, TIMEOUT, wait_for

ADMIN = "adm-3f1c9d0e7b2a4c58a6e1d2f3b4c5d6e7"
METRICS = "met-8e7d6c5b4a39281706f5e4d3c2b1a098"
BACKUP = "bak-0a1b2c3d4e5f60718293a4b5c6d7e8f9"
AUTH_SECRET = "auth-secret-5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
DB_PASSWORD = "dbpw-Q9x7Z2k5M1n8"
PASSWORDS = ["first user's pass 7f3a", "second user's pass 2b9c"]
WRONG_PASSWORD = "a wrong guess 4d8e"
JWT_SHAPE = re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}")


class TokenClient:
    def __init__(self, token: str) -> None:
        self.token = token

    async def get_access_token(self) -> str:
        return self.token


def with_password(url: str, password: str) -> str:
    parts = urllib.parse.urlsplit(url)
    user = parts.username or "postgres"
    host = parts.hostname or "127.0.0.1"
    port = f":{parts.port}" if parts.port else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}{port}"))


async def handshake_error(url: str, token: str | None) -> str:
    async with ws_connect(url) as ws:
        hello = p.Handshake(p.new_message_id(), generate_uuid_v7(), {}, SCHEMA.version, 0, auth_token=token)
        await ws.send(p.encode(hello))
        reply = p.decode(await asyncio.wait_for(ws.recv(), TIMEOUT))
        assert isinstance(reply, p.ErrorMessage) and reply.code == p.AUTH_FAILED, reply
        return p.encode(reply)


def test_no_secret_in_logs_events_or_errors(postgres_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "server"
    folder.mkdir()
    entry = write_entry(folder, SCHEMA_SOURCE)
    env = {
        "OFFLINE_ADMIN_TOKEN": ADMIN,
        "OFFLINE_METRICS_TOKEN": METRICS,
        "OFFLINE_BACKUP_TOKEN": BACKUP,
        "AUTH_SECRET": AUTH_SECRET,
        "OFFLINE_ALLOWED_ORIGINS": "https://app.example.com",
        "OFFLINE_LOG_LEVEL": "DEBUG",
    }
    server = ServerProcess(
        entry, store="postgres", db=with_password(postgres_url, DB_PASSWORD), env=env
    ).start()
    issued: list[str] = []  # every access and refresh token handed out
    answers: list[str] = []  # every error body and protocol error received
    events: list[str] = []

    async def follow_events(ready: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with (
            httpx.AsyncClient(base_url=server.http_url, timeout=None) as http,
            http.stream("GET", "/__offline/events", headers=headers) as response,
        ):
            assert response.status_code == 200
            async for chunk in response.aiter_text():
                events.append(chunk)
                if "event: ready" in chunk:
                    ready.set()

    async def scenario() -> str:
        ready = asyncio.Event()
        stream = asyncio.create_task(follow_events(ready))
        await asyncio.wait_for(ready.wait(), TIMEOUT)
        async with httpx.AsyncClient(base_url=server.http_url, timeout=TIMEOUT) as http:
            pairs = []
            for n, password in enumerate(PASSWORDS):
                response = await http.post(
                    "/auth/sign-up", json={"email": f"user{n}@example.com", "password": password}
                )
                assert response.status_code == 201, response.text
                pairs.append(response.json())
            wrong = await http.post(
                "/auth/sign-in", json={"email": "user0@example.com", "password": WRONG_PASSWORD}
            )
            assert wrong.status_code == 401
            answers.append(wrong.text)
            signed_in = await http.post(
                "/auth/sign-in", json={"email": "user0@example.com", "password": PASSWORDS[0]}
            )
            assert signed_in.status_code == 200
            pairs.append(signed_in.json())
            refreshed = await http.post("/auth/refresh", json={"refreshToken": pairs[2]["refreshToken"]})
            assert refreshed.status_code == 200
            pairs.append(refreshed.json())
            reused = await http.post("/auth/refresh", json={"refreshToken": pairs[2]["refreshToken"]})
            answers.append(reused.text)
            for pair in pairs:
                issued.extend([pair["accessToken"], pair["refreshToken"]])
            token = pairs[0]["accessToken"]
            me = await http.get("/auth/me", headers={"Authorization": f"Bearer {token}"})
            assert me.status_code == 200
            tampered = token[:-3] + ("abc" if not token.endswith("abc") else "xyz")
            answers.append((await http.get("/auth/me", headers={"Authorization": f"Bearer {tampered}"})).text)

            # Sync: refused handshakes of every kind, then a real client with its access token.
            claims = jwt.decode(token, options={"verify_signature": False})
            foreign = jwt.encode(claims, "another-secret-entirely-0123456789abcdef", algorithm="HS256")
            for bad in (tampered, foreign, pairs[0]["refreshToken"], None):
                answers.append(await handshake_error(server.sync_url, bad))
            with contextlib.suppress(InvalidStatus):
                await ws_connect(server.sync_url, origin="https://evil.example.com")  # type: ignore[arg-type]
            app = create_app(
                SCHEMA,
                sync={"url": server.sync_url, "auth_client": TokenClient(token), "backoff_initial": 0.05},
                path=str(tmp_path / "client.db"),
            )
            try:
                app.todos.insert({"ownerId": pairs[0]["user"]["id"], "title": "mine"})
                app.todos.insert({"ownerId": pairs[1]["user"]["id"], "title": "not mine: rejected"})
                await app.sync.connect()
                await app.sync.wait_until_synced(TIMEOUT)
            finally:
                await app.sync.disconnect()
                app.close()

            # Operational endpoints, right and wrong tokens; the dashboard's cookie sign-in; backup.
            for path, good in (("/__offline/status", ADMIN), ("/__offline/metrics", METRICS)):
                assert (await http.get(path, headers={"Authorization": f"Bearer {good}"})).status_code == 200
                refused = await http.get(path, headers={"Authorization": f"Bearer {good}x"})
                assert refused.status_code == 401
                answers.append(refused.text)
            login = await http.post("/__offline/login", data={"token": ADMIN + "-wrong"})
            answers.append(login.text)
            login = await http.post("/__offline/login", data={"token": ADMIN})
            assert login.status_code == 303
            cookie = login.cookies.get("offline_dashboard")
            assert cookie
            backup = await http.post(
                "/__offline/backup/export", headers={"Authorization": f"Bearer {BACKUP}"}
            )
            assert backup.status_code == 200
            imported = await http.post(
                "/__offline/backup/import",
                content=backup.content,
                headers={"Authorization": f"Bearer {BACKUP}"},
            )
            assert imported.status_code == 200, imported.text
            answers.append((await http.post("/__offline/backup/export")).text)
            signed_out = await http.post("/auth/sign-out", json={"refreshToken": pairs[1]["refreshToken"]})
            assert signed_out.status_code == 204

        await wait_for(lambda: any("event: rejected" in e for e in events), "the rejection event")
        assert await asyncio.to_thread(server.terminate, 30.0) == 0
        await asyncio.wait_for(stream, TIMEOUT)  # the stream ends with the server
        return cookie

    try:
        cookie = asyncio.run(scenario())
    finally:
        server.terminate()

    # A second process that cannot reach its database (the URL carries the password) fails and says so.
    unreachable = with_password("postgresql://postgres@127.0.0.1:1/none", DB_PASSWORD)
    failing = ServerProcess(
        entry, store="postgres", db=unreachable, env=env, log_path=tmp_path / "failing.log"
    )
    try:
        failing.start(timeout=20)
        raise AssertionError("a server without its database must not start")
    except RuntimeError:
        pass
    finally:
        failing.kill()

    logs = server.log_path.read_text() + (tmp_path / "failing.log").read_text()
    stream = "".join(events)
    assert "signed up" in logs and "event: log" in stream and "event: connection" in stream  # not vacuous
    assert "sync handshake refused" in logs and "event: rejected" in stream
    secrets = {
        "admin token": ADMIN,
        "metrics token": METRICS,
        "backup token": BACKUP,
        "AUTH_SECRET": AUTH_SECRET,
        "database password": DB_PASSWORD,
        "dashboard cookie": cookie,
        **{f"password {n}": pw for n, pw in enumerate([*PASSWORDS, WRONG_PASSWORD])},
        **{f"issued token {n}": token for n, token in enumerate(issued)},
    }
    for where, text in (
        ("log output", logs),
        ("event stream", stream),
        ("error answers", "\n".join(answers)),
    ):
        found = [name for name, secret in secrets.items() if secret in text]
        assert not found, f"{where} contains: {found}"
        assert not JWT_SHAPE.search(text), f"{where} contains a JWT: {JWT_SHAPE.search(text)}"
