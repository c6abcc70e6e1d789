"""Role-based write rules (``sync_options={"rules": {collection: fn(claims, operation) -> bool}}``) on a live
server with real sync clients (SQLite store): a ``member`` cannot delete a note, an ``admin`` can; the role is
the one the store holds at the handshake; a rule that fails refuses the write; a malformed rules option is
a configuration error."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from offline import OfflineError
from offline.core.operations import Operation
from server_runtime import MemoryServerStore, create_production_server, create_sqlite_server_store

from .conftest import bearer, http, sign_up, sync_url
from .part_two import claims_of, post, routes_with, serve_with
from .test_orgs import ORG_SCHEMA, activate, device, titles
from .test_sync_auth import TIMEOUT, close_all, wait_for

seen: list[tuple[str | None, str]] = []


def managers_delete(claims: Mapping[str, Any], operation: Operation) -> bool:
    seen.append((claims.get("role"), operation.type))
    return operation.type != "delete" or claims.get("role") in ("owner", "admin")


def broken_rule(claims: Mapping[str, Any], operation: Operation) -> bool:
    raise RuntimeError("a bug in the application's rule")


def test_member_cannot_delete_admin_can(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="offline.server.sync")

    async def scenario() -> None:
        store = create_sqlite_server_store(str(tmp_path / "server.db"))
        rules = {"notes": managers_delete}
        async with (
            serve_with(store, routes_with(), schema=ORG_SCHEMA, sync_options={"rules": rules}) as server,
            http(server) as client,
        ):
            olga = await sign_up(client, "olga@example.com")
            max_ = await sign_up(client, "max@example.com")
            org_id = (await post(client, "/auth/orgs", olga["accessToken"], {"name": "Acme"})).json()["id"]
            invite = await post(
                client, f"/auth/orgs/{org_id}/invites", olga["accessToken"], {"email": "max@example.com"}
            )
            await post(
                client,
                "/auth/invites/accept",
                max_["accessToken"],
                {"inviteToken": invite.json()["inviteToken"]},
            )
            olga = await activate(client, org_id, olga)
            max_ = await activate(client, org_id, max_)
            assert claims_of(max_["accessToken"])["role"] == "member"

            url = sync_url(server)
            o_app, _ = device(tmp_path, "olga", url, olga["accessToken"])
            m_app, _ = device(tmp_path, "max", url, max_["accessToken"])
            rejected: list[Any] = []
            m_app.events.on("sync:rejected", rejected.append)
            try:
                first = o_app.notes.insert({"orgId": org_id, "title": "first"})
                second = o_app.notes.insert({"orgId": org_id, "title": "second"})
                await o_app.sync.connect()
                await m_app.sync.connect()
                await wait_for(lambda: titles(m_app) == {"first", "second"}, "the notes at max")

                # A member may write, but not delete.
                m_app.notes.update(first["id"], {"title": "first, edited by max"})
                m_app.notes.delete(second["id"])
                await wait_for(lambda: len(rejected) == 1, "the refusal of max's delete")
                assert rejected[0].code == "SCOPE_VIOLATION"
                assert "write rule" in rejected[0].message and rejected[0].operation.type == "delete"
                await m_app.sync.wait_until_synced(TIMEOUT)
                assert m_app.notes.find_by_id(second["id"]) is not None  # the refused delete is undone
                await wait_for(lambda: "first, edited by max" in titles(o_app), "max's edit at olga")
                assert o_app.notes.find_by_id(second["id"]) is not None
                assert ("member", "delete") in seen and ("member", "update") in seen

                # Promoted to admin: the role is read from the store at his next handshake (same token).
                promoted = await client.patch(
                    f"/auth/orgs/{org_id}/members/{max_['user']['id']}",
                    json={"role": "admin"},
                    headers=bearer(olga["accessToken"]),
                )
                assert promoted.status_code == 200
                await m_app.sync.disconnect()
                await m_app.sync.connect()
                m_app.notes.delete(second["id"])
                await wait_for(lambda: o_app.notes.find_by_id(second["id"]) is None, "max's delete at olga")
                assert len(rejected) == 1 and ("admin", "delete") in seen
            finally:
                await close_all(o_app, m_app)

    asyncio.run(scenario())


def test_failing_rule_refuses_and_bad_rules_are_a_configuration_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="offline.server.sync")

    async def scenario() -> None:
        store = MemoryServerStore()
        async with (
            serve_with(
                store, routes_with(), schema=ORG_SCHEMA, sync_options={"rules": {"notes": broken_rule}}
            ) as server,
            http(server) as client,
        ):
            olga = await sign_up(client, "olga@example.com")
            org_id = (await post(client, "/auth/orgs", olga["accessToken"], {"name": "Acme"})).json()["id"]
            olga = await activate(client, org_id, olga)
            app, _ = device(tmp_path, "olga", sync_url(server), olga["accessToken"])
            rejected: list[Any] = []
            app.events.on("sync:rejected", rejected.append)
            try:
                app.notes.insert({"orgId": org_id, "title": "never stored"})
                await app.sync.connect()
                await wait_for(lambda: len(rejected) == 1, "the refusal")
                assert rejected[0].code == "SCOPE_VIOLATION"
            finally:
                await close_all(app)

    asyncio.run(scenario())
    assert any("write rule of 'notes' failed" in r.getMessage() for r in caplog.records)

    for bad in ({"notes": "admins only"}, [("notes", managers_delete)]):
        with pytest.raises(OfflineError) as caught:
            create_production_server(store=MemoryServerStore(), port=0, sync_options={"rules": bad})
        assert (caught.value.context or {})["field"] == "sync_options.rules"

    async def misspelt() -> None:
        store = MemoryServerStore()
        with pytest.raises(OfflineError) as caught:
            async with serve_with(
                store, routes_with(), schema=ORG_SCHEMA, sync_options={"rules": {"note": broken_rule}}
            ):
                pass
        assert (
            "note" in caught.value.message and (caught.value.context or {})["field"] == "sync_options.rules"
        )

    asyncio.run(misspelt())
