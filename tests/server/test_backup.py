"""Backup export and import (DESIGN.md sections 5 and 7): NDJSON with a manifest line first and an HMAC line
last, keyed by the server's backup secret. A backup taken from a server on SQLite restores into a fresh server on
PostgreSQL (``postgres_url``, skipped when PostgreSQL is unreachable) so that clients see exactly the same
records; a damaged or altered file is refused whole."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from offline import op
from offline.store import App
from server_runtime import create_relational_server_store
from server_runtime.server import ProductionServer
from tests.server.test_operational import (
    ADMIN,
    ALL_TOKENS,
    BACKUP,
    TIMEOUT,
    bearer,
    client,
    serve,
    shutdown,
    sync_url,
    wait_for,
)


def snapshot(app: App) -> dict[str, list[dict[str, Any]]]:
    return {
        name: sorted(app.collection(name).all().fetch(), key=lambda r: str(r["id"]))
        for name in app.schema.collections
    }


async def converge(a: App, b: App) -> None:
    """``a`` sees everything, ``b`` (scoped to userId u1) the items and its own todos."""
    await a.sync.wait_until_synced(TIMEOUT)
    await b.sync.wait_until_synced(TIMEOUT)

    def same() -> bool:
        mine = [r for r in snapshot(a)["todos"] if r["ownerId"] == "u1"]
        return snapshot(a)["items"] == snapshot(b)["items"] and snapshot(b)["todos"] == mine

    await wait_for(same, lambda: json.dumps([snapshot(a), snapshot(b)], default=str)[:2000])


async def fill(folder: Path, url: str) -> dict[str, list[dict[str, Any]]]:
    """Real client traffic of every kind (inserts, counters, concurrent lww edits, deletes, scoped records)."""
    a = client(folder, "a", url)
    b = client(folder, "b", url, scope={"userId": "u1"})
    try:
        await a.sync.connect()
        await b.sync.connect()
        items = [a.items.insert({"title": f"item {i}", "count": i}) for i in range(6)]
        b.todos.insert({"ownerId": "u1", "title": "mine"})
        a.todos.insert({"ownerId": "u2", "title": "someone else's"})
        await converge(a, b)
        await a.sync.disconnect()
        await b.sync.disconnect()
        a.items.update(items[0]["id"], {"title": "a's edit", "count": op.increment(5)})
        b.items.update(items[0]["id"], {"title": "b's edit", "count": op.increment(7)})
        a.items.delete(items[1]["id"])
        b.items.update(items[2]["id"], {"title": "üñíçødé ✓"})
        await a.sync.connect()
        await b.sync.connect()
        await converge(a, b)
        return snapshot(a)
    finally:
        await shutdown(a, b)


async def fresh_client_records(folder: Path, server: ProductionServer, name: str) -> dict[str, Any]:
    reader = client(folder, name, sync_url(server))
    try:
        await reader.sync.connect()
        await reader.sync.wait_until_synced(TIMEOUT)
        return snapshot(reader)
    finally:
        await shutdown(reader)


def backup_mac(secret: str, signed: bytes) -> str:
    """The backup HMAC as documented: HMAC-SHA256 keyed by HMAC-SHA256(secret, "offline backup hmac key v2")."""
    key = hmac.new(secret.encode(), b"offline backup hmac key v2", hashlib.sha256).digest()
    return hmac.new(key, signed, hashlib.sha256).hexdigest()


def lines_of(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines()]


async def status(http: httpx.AsyncClient, server: ProductionServer) -> dict[str, Any]:
    response = await http.get(f"{server.url}/__offline/status", headers=bearer(ADMIN))
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


async def import_backup(http: httpx.AsyncClient, server: ProductionServer, body: bytes) -> httpx.Response:
    return await http.post(
        f"{server.url}/__offline/backup/import",
        content=body,
        headers={**bearer(BACKUP), "Content-Type": "application/x-ndjson"},
    )


def damaged_copies(body: bytes) -> list[tuple[str, bytes, str, str]]:
    """(what, damaged body, the refusal's error code, a phrase its message must contain)."""
    lines = body.splitlines(keepends=True)
    at = body.index(b'"title":"item 3"') + len(b'"title":"item ')
    one_byte = body[:at] + b"4" + body[at + 1 :]
    assert len(one_byte) == len(body) and one_byte != body
    # Edited, then "re-signed" by someone without the secret: a bare sha256 (the older format) or the
    # unkeyed HMAC of a server without a secret.
    edited = [line.replace(b'"title":"item 3"', b'"title":"item X"') for line in lines[:-1]]
    tail = json.loads(lines[-1])
    plain = (
        b"".join(edited)
        + (
            json.dumps(
                {
                    "type": "checksum",
                    "algorithm": "sha256",
                    "sha256": hashlib.sha256(b"".join(edited)).hexdigest(),
                    "operations": tail["operations"],
                }
            )
            + "\n"
        ).encode()
    )
    unkeyed_manifest = (json.dumps({**json.loads(edited[0]), "key": "none"}) + "\n").encode()
    unkeyed_lines = [unkeyed_manifest, *edited[1:]]
    unkeyed = (
        b"".join(unkeyed_lines)
        + (json.dumps({**tail, "hmac": backup_mac("", b"".join(unkeyed_lines))}) + "\n").encode()
    )
    hex_at = body.rindex(b'"hmac":"') + len(b'"hmac":"')
    flipped = body[:hex_at] + (b"0" if body[hex_at : hex_at + 1] != b"0" else b"1") + body[hex_at + 1 :]
    recount = (
        b"".join(lines[:-1]) + (json.dumps({**tail, "operations": tail["operations"] + 1}) + "\n").encode()
    )
    return [
        ("one byte changed", one_byte, "BACKUP_HMAC_MISMATCH", "hmac"),
        ("hmac flipped", flipped, "BACKUP_HMAC_MISMATCH", "hmac"),
        ("hmac line miscounts", recount, "BACKUP_INVALID", "operations"),
        ("cut in the middle", body[: len(body) // 2], "BACKUP_TRUNCATED", "truncated"),
        ("hmac line missing", b"".join(lines[:-1]), "BACKUP_TRUNCATED", "truncated"),
        ("an operation line dropped", b"".join(lines[:2] + lines[3:]), "BACKUP_HMAC_MISMATCH", "hmac"),
        ("edited, plain checksum recomputed", plain, "BACKUP_UNKEYED", "legacy=1"),
        ("edited, unkeyed hmac recomputed", unkeyed, "BACKUP_UNKEYED", "legacy=1"),
        ("empty", b"", "BACKUP_INVALID", "manifest"),
        ("not NDJSON", b"hello\nworld\n", "BACKUP_INVALID", "NDJSON"),
    ]


def test_backup_from_sqlite_restores_into_postgresql(tmp_path: Path, postgres_url: str) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path, auth=ALL_TOKENS, name="old") as old,
            httpx.AsyncClient(timeout=30) as http,
        ):
            records = await fill(tmp_path, sync_url(old))
            assert len(records["items"]) == 5 and len(records["todos"]) == 2
            old_status = await status(http, old)
            stored = old_status["operations"]["stored"]

            response = await http.post(f"{old.url}/__offline/backup/export", headers=bearer(BACKUP))
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/x-ndjson")
            body = response.content
            parsed = lines_of(body)
            manifest, operations, checksum = parsed[0], parsed[1:-1], parsed[-1]
            assert manifest["type"] == "manifest" and manifest["format"] == "offline-backup"
            assert manifest["operations"] == stored == len(operations)
            assert manifest["schemaVersion"] == 1 and manifest["store"] == "sqlite"
            assert manifest["serverNodeId"] == old_status["serverNodeId"]
            assert [line["delivery"] for line in operations] == list(range(1, stored + 1))
            assert all(line["type"] == "operation" for line in operations)
            assert manifest["version"] == 2 and manifest["key"] == "backupToken"  # names the secret only
            assert BACKUP not in body.decode()
            assert checksum["type"] == "hmac" and checksum["algorithm"] == "hmac-sha256"
            assert checksum["operations"] == stored
            assert checksum["hmac"] == backup_mac(BACKUP, body[: body.rindex(b"\n", 0, -1) + 1])

            store = await create_relational_server_store(postgres_url)
            async with serve(tmp_path, auth=ALL_TOKENS, store=store) as new:
                assert new.store.kind == "postgresql"
                # Damaged files are refused whole, with a message saying what is wrong.
                for what, damaged, code, phrase in damaged_copies(body):
                    refused = await import_backup(http, new, damaged)
                    assert refused.status_code == 400, what
                    answer = refused.json()
                    assert answer["error"] == code, (what, answer)
                    assert phrase.lower() in answer["message"].lower(), (what, answer["message"])
                assert (await status(http, new))["operations"]["stored"] == 0

                first = await import_backup(http, new, body)
                assert first.status_code == 200, first.text
                assert first.json() == {
                    "imported": stored,
                    "duplicates": 0,
                    "refused": {},
                    "operations": stored,
                }
                again = await import_backup(http, new, body)
                assert again.status_code == 200
                assert again.json() == {
                    "imported": 0,
                    "duplicates": stored,
                    "refused": {},
                    "operations": stored,
                }
                new_status = await status(http, new)
                assert new_status["operations"]["stored"] == stored
                # The restored server carries on as the backed-up server (its writes stay authoritative).
                assert new_status["serverNodeId"] == old_status["serverNodeId"]
                assert new_status["records"] == old_status["records"]

                from_new = await fresh_client_records(tmp_path, new, "reader-new")
                from_old = await fresh_client_records(tmp_path, old, "reader-old")
                assert from_new == from_old == records

                # The restored server is a working server: a write through it reaches its clients.
                writer = client(tmp_path, "writer", sync_url(new))
                try:
                    await writer.sync.connect()
                    await writer.sync.wait_until_synced(TIMEOUT)
                    writer.items.insert({"title": "after restore"})
                    await writer.sync.wait_until_synced(TIMEOUT)
                finally:
                    await shutdown(writer)
                assert (await status(http, new))["operations"]["stored"] == stored + 1

    asyncio.run(scenario())


def test_a_backup_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path, auth=ALL_TOKENS, name="src") as src,
            serve(tmp_path, auth=ALL_TOKENS, name="dst") as dst,
            httpx.AsyncClient(timeout=30) as http,
        ):
            body = (await http.post(f"{src.url}/__offline/backup/export", headers=bearer(BACKUP))).content
            lines = body.splitlines(keepends=True)
            manifest = json.loads(lines[0])
            assert manifest["operations"] == 0 and len(lines) == 2  # an empty server: manifest and hmac
            newer = (json.dumps({**manifest, "schemaVersion": 99}) + "\n").encode()
            tail = json.loads(lines[-1])
            tail["hmac"] = backup_mac(BACKUP, newer)  # as a newer server with the same secret writes it
            refused = await import_backup(http, dst, newer + (json.dumps(tail) + "\n").encode())
            assert refused.status_code == 409
            assert refused.json()["error"] == "SCHEMA_MISMATCH"
            assert "99" in refused.json()["message"]
            accepted = await import_backup(http, dst, body)
            assert accepted.status_code == 200
            assert accepted.json()["imported"] == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("token", [None, ADMIN, "wrong"])
def test_import_needs_the_backup_token(tmp_path: Path, token: str | None) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, auth=ALL_TOKENS) as server, httpx.AsyncClient(timeout=30) as http:
            body = (await http.post(f"{server.url}/__offline/backup/export", headers=bearer(BACKUP))).content
            headers = bearer(token) if token else {}
            response = await http.post(f"{server.url}/__offline/backup/import", content=body, headers=headers)
            assert response.status_code == 401
            assert response.headers["www-authenticate"].startswith("Bearer")

    asyncio.run(scenario())


def test_a_restored_server_keeps_each_device_with_its_user(tmp_path: Path) -> None:
    """Node ids belong to the principal that first used them (SyncService.bind_node); a backup carries the
    registrations, so after a restore nobody can take another user's device id by connecting first."""

    async def scenario() -> None:
        async with (
            serve(tmp_path, auth=ALL_TOKENS, name="old") as old,
            serve(tmp_path, auth=ALL_TOKENS, name="new") as new,
            httpx.AsyncClient(timeout=30) as http,
        ):
            await fill(tmp_path, sync_url(old))  # its two devices register to the anonymous principal
            assert await old.sync.bind_node("ada-phone", {"sub": "ada"})
            registered = await old.store.node_registrations()
            assert registered["ada-phone"] == "user:ada" and len(registered) == 4  # + server, a, b

            body = (await http.post(f"{old.url}/__offline/backup/export", headers=bearer(BACKUP))).content
            assert lines_of(body)[0]["nodes"] == registered
            assert (await import_backup(http, new, body)).status_code == 200
            assert await new.store.node_principals(registered) == registered
            assert not await new.sync.bind_node("ada-phone", {"sub": "bob"})
            assert await new.sync.bind_node("ada-phone", {"sub": "ada"})

            # A manifest whose nodes are not a map of node ids to principals is refused whole.
            manifest, rest = body.split(b"\n", 1)
            damaged = json.loads(manifest)
            damaged["nodes"] = {"ada-phone": 7}
            unsigned = json.dumps(damaged).encode() + b"\n" + rest[: rest.rindex(b"\n", 0, -1) + 1]
            trailer = json.loads(rest.splitlines()[-1])
            trailer["hmac"] = backup_mac(BACKUP, unsigned)
            refused = await import_backup(http, new, unsigned + json.dumps(trailer).encode() + b"\n")
            assert refused.status_code == 400 and refused.json()["error"] == "BACKUP_INVALID", refused.text
            assert "nodes" in refused.json()["message"]

    asyncio.run(scenario())
