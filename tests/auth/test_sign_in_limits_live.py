"""Sign-in limits against a real server process (SQLite store, default argon2 cost), clients on distinct
loopback addresses: concurrent guesses are held to the configured number, an attacker cannot lock the owner
out, and a full password-check queue answers at once with Retry-After."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from offline import OfflineError
from offline.auth import FileCredentialStore, create_offline_auth
from tests.support.servers import ServerProcess

from .conftest import PASSWORD
from .live import auth_server, burst, client_from, sign_in_from, sign_up_from, statuses

OWNER = "owner@example.com"
WRONG = {"email": OWNER, "password": "not the password"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = auth_server(tmp_path / "server")
    try:
        yield process
    finally:
        assert process.terminate() == 0, process.log_path.read_text()


async def one_by_one(
    process: ServerProcess, address: str, bodies: list[dict[str, str]]
) -> list[httpx.Response]:
    async with client_from(process, address) as client:
        return [await client.post("/auth/sign-in", json=body) for body in bodies]


def assert_rate_limited(response: object) -> None:
    assert getattr(response, "status_code", None) == 429, response
    headers = response.headers  # type: ignore[attr-defined]
    assert int(headers["retry-after"]) >= 1
    assert response.json()["error"]["code"] == "RATE_LIMITED"  # type: ignore[attr-defined]


def test_concurrent_guesses_get_at_most_the_limit_of_401s_and_the_owner_still_signs_in(
    server: ServerProcess,
) -> None:
    async def scenario() -> None:
        await sign_up_from(server, OWNER, "127.0.0.1")
        answers = await burst(server, "127.0.0.2", [WRONG] * 60)
        counts = statuses(answers)
        # The default limit: 5 failed sign-ins per account from one address; every other guess is refused
        # before its password is checked.
        assert counts[401] <= 5 and counts[401] + counts[429] == 60, counts
        for answer in answers:
            if answer.status_code == 429:
                assert_rate_limited(answer)
        # Guesses refused because that address already had its share of the password-check queue did not
        # count: the attacker may try again, one at a time, until the limit, and no further.
        failed = counts[401]
        while failed < 6:
            answer = await sign_in_from(server, OWNER, WRONG["password"], "127.0.0.2")
            if answer.status_code == 429:
                break
            assert answer.status_code == 401, answer.text
            failed += 1
        assert failed == 5
        # The attacker's address stays refused, even with the right password...
        assert_rate_limited(await sign_in_from(server, OWNER, PASSWORD, "127.0.0.2"))
        # ...while the owner signs in from a clean address and from the address it signed up from.
        for address in ("127.0.0.3", "127.0.0.1"):
            ok = await sign_in_from(server, OWNER, PASSWORD, address)
            assert ok.status_code == 200, (address, ok.text)

    asyncio.run(scenario())


def test_guesses_spread_over_addresses_stop_new_addresses_but_not_known_ones(server: ServerProcess) -> None:
    async def scenario() -> None:
        await sign_up_from(server, OWNER, "127.0.0.1")
        earlier = await sign_in_from(server, OWNER, PASSWORD, "127.0.0.4")  # a device the owner used before
        device = earlier.json()["deviceToken"]
        stranger = (await sign_up_from(server, "stranger@example.com", "127.0.0.5"))["deviceToken"]
        # Six attacking addresses at once, five guesses each in turn: 30 guesses, past the account's total of 20.
        answers = await asyncio.gather(*(one_by_one(server, f"127.0.1.{i}", [WRONG] * 5) for i in range(6)))
        counts = statuses([a for batch in answers for a in batch])
        assert counts[401] == 20 and counts[429] == 10, counts
        # A new address now waits, like the attacker's next one...
        assert_rate_limited(await sign_in_from(server, OWNER, PASSWORD, "127.0.2.1"))
        # ...and so does a device token of another account...
        async with client_from(server, "127.0.2.2") as client:
            body = {"email": OWNER, "password": PASSWORD, "deviceToken": stranger}
            assert_rate_limited(await client.post("/auth/sign-in", json=body))
        # ...but the owner's known addresses still sign in, and so does the owner's device at a new address.
        for address in ("127.0.0.1", "127.0.0.4"):
            ok = await sign_in_from(server, OWNER, PASSWORD, address)
            assert ok.status_code == 200, (address, ok.text)
        async with client_from(server, "127.0.2.3") as client:
            body = {"email": OWNER, "password": PASSWORD, "deviceToken": device}
            moved = await client.post("/auth/sign-in", json=body)
            assert moved.status_code == 200, moved.text

    asyncio.run(scenario())


def test_a_full_password_check_queue_answers_at_once_with_retry_after(tmp_path: Path) -> None:
    # One waiting place and one check per address: a burst from many addresses overflows the queue.
    env = {"OFFLINE_AUTH_PASSWORD_CHECKS_WAITING": "1", "OFFLINE_AUTH_PASSWORD_CHECKS_PER_ADDRESS": "1"}
    process = auth_server(tmp_path / "server", env=env)
    try:

        async def scenario() -> None:
            await sign_up_from(process, OWNER, "127.0.0.1")
            bodies = [{"email": f"junk{i}@example.com", "password": "junk password"} for i in range(3)]
            answers = await asyncio.gather(*(burst(process, f"127.0.3.{i}", bodies) for i in range(12)))
            flat = [a for batch in answers for a in batch]
            counts = statuses(flat)
            assert set(counts) <= {401, 429, 503}, counts
            assert counts[503] >= 1 and counts[429] >= 1, counts
            for answer in flat:
                if answer.status_code == 503:
                    assert int(answer.headers["retry-after"]) >= 1
                    assert answer.json()["error"]["code"] == "SERVICE_UNAVAILABLE"
                elif answer.status_code == 429:  # that address's own share of the queue was in use
                    assert_rate_limited(answer)
            # Refused checks are not failures: once the burst is over, the owner signs in from any of them.
            ok = await sign_in_from(process, OWNER, PASSWORD, "127.0.3.0")
            assert ok.status_code == 200, ok.text

        asyncio.run(scenario())
    finally:
        assert process.terminate() == 0, process.log_path.read_text()


def test_the_auth_client_sends_its_device_token_so_its_owner_gets_in_from_a_new_address(
    server: ServerProcess, tmp_path: Path
) -> None:
    def auth_from(address: str, store: object) -> Any:
        transport = httpx.AsyncHTTPTransport(local_address=address)
        client = httpx.AsyncClient(transport=transport, timeout=60)
        return create_offline_auth(server.http_url, credential_store=store, http_client=client)

    async def scenario() -> None:
        saved = FileCredentialStore(tmp_path / "credentials.json")
        await auth_from("127.0.0.6", saved).sign_up(OWNER, PASSWORD)
        await asyncio.gather(*(one_by_one(server, f"127.0.4.{i}", [WRONG] * 5) for i in range(6)))
        # The same device (its stored session carries the device token), now at another address, gets in...
        moved = auth_from("127.0.0.8", saved)
        assert (await moved.sign_in(OWNER, PASSWORD))["email"] == OWNER
        # ...while a device that never signed in, at yet another address, waits.
        with pytest.raises(OfflineError) as refused:
            await auth_from("127.0.0.9", None).sign_in(OWNER, PASSWORD)
        assert refused.value.code == "RATE_LIMITED"

    asyncio.run(scenario())


def test_two_processes_sharing_postgres_share_the_limits(tmp_path: Path, postgres_url: str) -> None:
    first = auth_server(tmp_path / "one", store="postgres", db=postgres_url)
    second = auth_server(tmp_path / "two", store="postgres", db=postgres_url)
    try:

        async def scenario() -> None:
            await sign_up_from(first, OWNER, "127.0.0.1")
            # The same 60 guesses, half to each process, at once: still at most 5 wrong passwords checked.
            halves = await asyncio.gather(
                burst(first, "127.0.0.2", [WRONG] * 30), burst(second, "127.0.0.2", [WRONG] * 30)
            )
            counts = statuses([a for half in halves for a in half])
            assert counts[401] <= 5 and counts[401] + counts[429] == 60, counts
            failed = counts[401]
            for process in [first, second] * 3:  # one at a time, alternating, up to the limit and no further
                answer = await sign_in_from(process, OWNER, WRONG["password"], "127.0.0.2")
                if answer.status_code == 429:
                    continue
                assert answer.status_code == 401, answer.text
                failed += 1
            assert failed == 5
            for process in (first, second):
                assert_rate_limited(await sign_in_from(process, OWNER, PASSWORD, "127.0.0.2"))
                ok = await sign_in_from(process, OWNER, PASSWORD, "127.0.0.3")
                assert ok.status_code == 200, ok.text

        asyncio.run(scenario())
    finally:
        for process in (first, second):
            assert process.terminate() == 0, process.log_path.read_text()


def test_the_owners_device_gets_in_from_an_address_an_attacker_shares(server: ServerProcess) -> None:
    async def scenario() -> None:
        shared = "127.0.0.20"  # one office, one carrier NAT: the owner and an attacker behind it
        device = (await sign_up_from(server, OWNER, "127.0.0.1"))["deviceToken"]
        guesses = [WRONG] * 6 + [
            {"email": f"other{i}@example.com", "password": "guess 12345"} for i in range(20)
        ]
        counts = statuses(await one_by_one(server, shared, guesses))
        assert counts[401] == 20 and counts[429] == 6, (
            counts
        )  # 5 at the owner, 15 elsewhere: the address is spent
        # The right password from that address is refused (its address and its account-and-address windows
        # are full)...
        assert_rate_limited(await sign_in_from(server, OWNER, PASSWORD, shared))
        # ...unless it comes with the owner's device token: that device is counted on its own.
        async with client_from(server, shared) as client:
            body = {"email": OWNER, "password": PASSWORD, "deviceToken": device}
            ok = await client.post("/auth/sign-in", json=body)
            assert ok.status_code == 200, ok.text
            # The token is good for its own account only.
            other = {"email": "other0@example.com", "password": PASSWORD, "deviceToken": device}
            assert_rate_limited(await client.post("/auth/sign-in", json=other))

    asyncio.run(scenario())
