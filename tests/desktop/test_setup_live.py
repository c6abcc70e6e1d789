"""First-launch setup, local-only and connect-later against a live offline server on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from offline_desktop import (
    BAD_URL,
    NOT_OFFLINE_SERVER,
    UNREACHABLE,
    BuildConfig,
    DesktopRuntime,
)
from offline_desktop import test_connection as check_url
from tests.support.servers import free_port

from .support import FAST, SCHEMA, static_server, sync_server

TIMEOUT = 30.0
PLAIN = BuildConfig("notes", "1.0.0")


def runtime(folder: Path, build: BuildConfig = PLAIN) -> DesktopRuntime:
    return DesktopRuntime(SCHEMA, build, directory=folder, sync_options=FAST)


def titles(rt: DesktopRuntime) -> list[str]:
    return sorted(r["title"] for r in rt.app.todos.where({}).fetch())


def test_connection_check_gives_a_reason_for_each_kind_of_bad_url(tmp_path: Path) -> None:
    async def scenario() -> None:
        assert (await check_url("gopher://x", SCHEMA)).code == BAD_URL
        dead = await check_url(f"ws://127.0.0.1:{free_port()}/offline-sync", SCHEMA, timeout=5)
        assert dead.code == UNREACHABLE and "cannot reach" in (dead.reason or "")
        with static_server(tmp_path) as web:
            other = await check_url(web, SCHEMA, timeout=5)
        assert other.code == NOT_OFFLINE_SERVER, other
        async with sync_server() as (_server, url):
            good = await check_url(url.replace("ws://", "http://").removesuffix("/offline-sync"), SCHEMA)
            assert good.ok and good.url == url and good.server_node_id
            wrong_path = await check_url(url.replace("/offline-sync", "/elsewhere"), SCHEMA, timeout=5)
            assert not wrong_path.ok and wrong_path.code == NOT_OFFLINE_SERVER

    asyncio.run(scenario())


def test_first_launch_setup_refuses_a_bad_url_and_saves_a_good_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sync_server() as (_server, url):
            first = runtime(tmp_path / "device")
            assert first.launch.needs_setup and first.sync_url is None
            refused = await first.use_server(f"ws://127.0.0.1:{free_port()}/offline-sync", timeout=5)
            assert not refused.ok and refused.code == UNREACHABLE
            assert first.launch.needs_setup and not first.settings_file.path.exists()
            first.app.todos.insert({"title": "written before setup"})
            accepted = await first.use_server(url)
            assert accepted.ok and first.sync_url == url
            await first.app.sync.wait_until_synced(TIMEOUT)
            await first.close()

            # The next launch skips setup and syncs with the saved URL on its own.
            again = runtime(tmp_path / "device")
            assert again.launch.mode == "saved" and again.sync_url == url
            await again.start()
            again.app.todos.insert({"title": "second launch"})
            await again.app.sync.wait_until_synced(TIMEOUT)
            await again.close()

            # A second device sees both writes: they really reached the server.
            other = runtime(tmp_path / "other", BuildConfig("notes", "1.0.0", sync_url=url))
            assert other.launch.mode == "build"
            await other.start()
            await other.app.sync.wait_until_synced(TIMEOUT)
            assert titles(other) == ["second launch", "written before setup"]
            await other.close()

    asyncio.run(scenario())


def test_local_only_works_and_connects_later_from_settings(tmp_path: Path) -> None:
    async def scenario() -> None:
        device = runtime(tmp_path / "device")
        device.stay_local()
        device.app.todos.insert({"title": "offline note"})
        await device.start()  # nothing to connect to: must not fail
        assert device.app.sync.status == "disabled"
        await device.close()

        relaunched = runtime(tmp_path / "device")
        assert relaunched.launch.mode == "local-only" and not relaunched.launch.needs_setup
        assert titles(relaunched) == ["offline note"]
        async with sync_server() as (_server, url):
            result = await relaunched.use_server(url)  # the settings control's "Connect"
            assert result.ok
            await relaunched.app.sync.wait_until_synced(TIMEOUT)
            peer = runtime(tmp_path / "peer", BuildConfig("notes", "1.0.0", sync_url=url))
            await peer.start()
            await peer.app.sync.wait_until_synced(TIMEOUT)
            assert titles(peer) == ["offline note"]
            await peer.close()
            await relaunched.close()
        assert runtime(tmp_path / "device").launch.mode == "saved"

    asyncio.run(scenario())


def test_two_desktop_instances_converge_through_a_live_server(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sync_server() as (_server, url):
            build = BuildConfig("notes", "1.0.0", sync_url=url)
            a, b = runtime(tmp_path / "a", build), runtime(tmp_path / "b", build)
            try:
                await a.start()
                await b.start()
                shared = a.app.todos.insert({"title": "from a"})
                await a.app.sync.wait_until_synced(TIMEOUT)
                await b.app.sync.wait_until_synced(TIMEOUT)
                # Concurrent edits on both sides of the same record and one new record each.
                a.app.todos.update(shared["id"], {"done": True})
                b.app.todos.update(shared["id"], {"title": "from a, renamed on b"})
                b.app.todos.insert({"title": "from b"})
                for _ in range(2):  # a second round delivers what the other side sent meanwhile
                    await a.app.sync.wait_until_synced(TIMEOUT)
                    await b.app.sync.wait_until_synced(TIMEOUT)
                deadline = asyncio.get_running_loop().time() + TIMEOUT
                while a.app.todos.where({}).fetch() != b.app.todos.where({}).fetch():
                    assert asyncio.get_running_loop().time() < deadline, "the two instances did not converge"
                    await asyncio.sleep(0.05)
                merged = a.app.todos.find_by_id(shared["id"])
                assert merged is not None
                assert merged["done"] is True and merged["title"] == "from a, renamed on b"
                assert titles(a) == ["from a, renamed on b", "from b"]
            finally:
                await a.close()
                await b.close()

    asyncio.run(scenario())
