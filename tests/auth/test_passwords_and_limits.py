"""argon2 password hashing (off the event loop, dummy work for unknown accounts) and the sliding-window limits."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import pytest
from argon2 import PasswordHasher

from offline.core.errors import OfflineError
from server_runtime.auth.hash_queue import HashQueue, QueueFull
from server_runtime.auth.passwords import PasswordService, check_password_shape
from server_runtime.auth.rate_limit import RateLimits, SlidingWindow, rate_limits_from, retry_after_header
from server_runtime.auth.settings import auth_options_from_environment
from server_runtime.auth.sign_in_limits import Reservation, SignInLimiter

from .conftest import FAST_HASHER


class CountingHasher(PasswordHasher):
    """The real argon2 hasher, counting the verifications it performs."""

    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=1024, parallelism=1)
        self.verified: list[str] = []

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self.verified.append(str(hash))
        return super().verify(hash, password)


def test_hash_and_verify() -> None:
    async def scenario() -> None:
        passwords = PasswordService(FAST_HASHER)
        try:
            stored = await passwords.hash("s3cret-password")
            assert stored.startswith("$argon2id$")
            assert "s3cret-password" not in stored
            assert await passwords.verify(stored, "s3cret-password") is True
            assert await passwords.verify(stored, "s3cret-passwordX") is False
            # Same password, different salt.
            assert await passwords.hash("s3cret-password") != stored
        finally:
            passwords.close()

    asyncio.run(scenario())


def test_unknown_account_costs_one_real_verification() -> None:
    async def scenario() -> None:
        hasher = CountingHasher()
        passwords = PasswordService(hasher)
        try:
            assert await passwords.verify(None, "whatever-password") is False
            assert await passwords.verify(None, "another-password") is False
            assert len(hasher.verified) == 2
            # Against a genuine argon2id hash with the hasher's own parameters, so it costs the same.
            dummy = hasher.verified[0]
            assert dummy == hasher.verified[1]
            assert dummy.startswith("$argon2id$v=19$m=1024,t=1,p=1$")
        finally:
            passwords.close()

    asyncio.run(scenario())


def test_rehash_is_wanted_after_parameters_grow() -> None:
    async def scenario() -> None:
        weak = PasswordService(FAST_HASHER)
        stronger = PasswordService(PasswordHasher(time_cost=2, memory_cost=2048, parallelism=1))
        try:
            stored = await weak.hash("password-1234")
            assert not weak.needs_rehash(stored)
            assert stronger.needs_rehash(stored)
            assert await stronger.verify(stored, "password-1234")  # old hashes still verify
        finally:
            weak.close()
            stronger.close()

    asyncio.run(scenario())


def test_corrupted_hash_is_a_storage_error_not_a_wrong_password() -> None:
    async def scenario() -> None:
        passwords = PasswordService(FAST_HASHER)
        try:
            with pytest.raises(OfflineError) as caught:
                await passwords.verify("not-an-argon2-hash", "password-1234")
            assert caught.value.code == "STORAGE_ERROR"
            assert "password-1234" not in caught.value.message
        finally:
            passwords.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("password", "problem"),
    [
        ("1234567", "at least 8"),
        ("12345678", None),
        ("        ", None),  # no composition rules
        ("x" * 1025, "at most 1024"),
        (12345678, "must be a string"),
        (None, "must be a string"),
    ],
)
def test_password_shape(password: object, problem: str | None) -> None:
    found = check_password_shape(password)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sliding_window_counts_per_key_and_slides() -> None:
    clock = Clock()
    window = SlidingWindow(3, 60.0, now=clock)
    for _ in range(3):
        assert window.retry_after("a") is None
        window.hit("a")
        clock.now += 10
    # Three hits at t=1000, 1010, 1020; now t=1030: the oldest leaves the window at 1060.
    assert window.retry_after("a") == pytest.approx(30.0)
    assert window.retry_after("b") is None  # other keys are unaffected
    clock.now = 1059.9
    assert window.retry_after("a") == pytest.approx(0.1)
    clock.now = 1060.0
    assert window.retry_after("a") is None  # the first hit slid out
    window.hit("a")
    assert window.retry_after("a") == pytest.approx(10.0)  # now blocked until the 1010 hit leaves
    window.reset("a")
    assert window.retry_after("a") is None


def test_sliding_window_memory_is_bounded() -> None:
    clock = Clock()
    window = SlidingWindow(1, 60.0, max_keys=3, now=clock)
    for key in ("a", "b", "c"):
        window.hit(key)
    window.hit("a")  # refreshes "a"; "b" is now the least recently touched
    window.hit("d")
    assert window.retry_after("b") is None  # forgotten
    assert window.retry_after("a") is not None
    assert window.retry_after("d") is not None
    clock.now += 61
    assert window.retry_after("a") is None and window.retry_after("d") is None


def test_rate_limits_configuration() -> None:
    assert rate_limits_from(None) == RateLimits()
    limits = rate_limits_from({"account_attempts": 2, "addressWindow": 30})
    assert limits.account_attempts == 2 and limits.address_window == 30
    assert rate_limits_from(limits) is limits
    with pytest.raises(OfflineError) as caught:
        rate_limits_from({"acount_attempts": 2})
    assert caught.value.code == "AUTH_CONFIG"
    assert caught.value.context == {"field": "rate_limits.acount_attempts"}
    with pytest.raises(OfflineError, match="positive"):
        rate_limits_from({"address_attempts": 0})
    assert retry_after_header(0.2) == "1"
    assert retry_after_header(30.01) == "31"


def test_sign_in_reservations_count_before_the_check_and_only_failures_stay() -> None:
    clock = [1000.0]
    limiter = SignInLimiter(
        RateLimits(account_attempts=2, address_attempts=10, account_total_attempts=3), now=lambda: clock[0]
    )
    first = limiter.reserve("a@example.com", "192.0.2.1")
    second = limiter.reserve("a@example.com", "192.0.2.1")
    assert isinstance(first, Reservation) and isinstance(second, Reservation)
    # Two checks in flight: a third concurrent attempt from that address is refused before any finishes.
    assert isinstance(limiter.reserve("a@example.com", "192.0.2.1"), float)
    first.failed()
    second.cancelled()  # never checked (the queue was full): it gives its place back
    third = limiter.reserve("a@example.com", "192.0.2.1")
    assert isinstance(third, Reservation)
    third.succeeded()  # the right password clears that address's failures and makes it known
    assert limiter.known("a@example.com", "192.0.2.1")
    # The first failure counted toward the account's total too (its address was not known then).
    for address in ("198.51.100.1", "198.51.100.2"):
        attempt = limiter.reserve("a@example.com", address)
        assert isinstance(attempt, Reservation)
        attempt.failed()
    # The account's total is spent: new addresses wait, the known one does not.
    wait = limiter.reserve("a@example.com", "203.0.113.5")
    assert isinstance(wait, float) and 0 < wait <= 900
    assert isinstance(limiter.reserve("a@example.com", "192.0.2.1"), Reservation)
    clock[0] += 901
    assert isinstance(limiter.reserve("a@example.com", "203.0.113.5"), Reservation)


def test_hash_queue_is_bounded_and_serves_keys_in_turn() -> None:
    async def scenario() -> None:
        queue = HashQueue(1, waiting=4, per_key=3)
        gate = threading.Event()
        order: list[str] = []

        def work(name: str) -> str:
            gate.wait(10)
            order.append(name)
            return name

        try:
            busy = [asyncio.ensure_future(queue.run("attacker", work, f"a{i}")) for i in range(3)]
            await asyncio.sleep(0)
            fair = asyncio.ensure_future(queue.run("owner", work, "owner"))
            await asyncio.sleep(0)
            with pytest.raises(QueueFull) as own_share:  # the attacker's three places are taken
                await queue.run("attacker", work, "a3")
            assert own_share.value.per_key and own_share.value.retry_after >= 1
            other = asyncio.ensure_future(queue.run("third", work, "t0"))
            await asyncio.sleep(0)
            # Full (one running, four waiting): a key with nothing waiting takes the place of the attacker's
            # newest check, which is refused at once...
            late = asyncio.ensure_future(queue.run("fourth", work, "f0"))
            await asyncio.sleep(0)
            with pytest.raises(QueueFull) as evicted:
                await busy.pop()
            assert not evicted.value.per_key
            # ...then, no key having two more waiting, a newcomer displaces the key served most recently (the
            # attacker's, which keeps checks in hand)...
            fifth = asyncio.ensure_future(queue.run("fifth", work, "g0"))
            await asyncio.sleep(0)
            with pytest.raises(QueueFull):
                await busy.pop()
            # ...and with only keys waiting for their first turn left, a newcomer is refused.
            with pytest.raises(QueueFull) as full:
                await queue.run("sixth", work, "h0")
            assert not full.value.per_key
            gate.set()
            await asyncio.gather(*busy, fair, other, late, fifth)
            # The key served longest ago goes first: the owner waited for no attacker check but the running one.
            assert order == ["a0", "owner", "t0", "f0", "g0"], order
        finally:
            gate.set()
            queue.close()

    asyncio.run(scenario())


def test_a_newcomer_displaces_a_flooding_key_never_one_asking_in_turn() -> None:
    async def scenario() -> None:
        queue = HashQueue(1, waiting=2, per_key=2)
        gate = threading.Event()

        def work(name: str) -> str:
            gate.wait(10)
            return name

        try:
            running = asyncio.ensure_future(queue.run("flood", work, "f0"))
            flood_waiting = asyncio.ensure_future(queue.run("flood", work, "f1"))
            first_turn = asyncio.ensure_future(queue.run("owner", work, "o0"))
            await asyncio.sleep(0)
            with pytest.raises(QueueFull):  # more than its share: the flood is marked
                await queue.run("flood", work, "f2")
            # Full, and no key has two more waiting than a newcomer: the flood's waiting check gives way...
            newcomer = asyncio.ensure_future(queue.run("new", work, "n0"))
            await asyncio.sleep(0)
            with pytest.raises(QueueFull):
                await flood_waiting
            # ...but the owner's does not (nor does the newcomer's): the next newcomer is refused, and the
            # flood, refused a moment ago, cannot push anyone out either.
            with pytest.raises(QueueFull):
                await queue.run("another", work, "a0")
            with pytest.raises(QueueFull):
                await queue.run("flood", work, "f3")
            gate.set()
            assert await asyncio.gather(running, first_turn, newcomer) == ["f0", "o0", "n0"]
        finally:
            gate.set()
            queue.close()

    asyncio.run(scenario())


def test_auth_settings_from_the_environment() -> None:
    options = auth_options_from_environment(
        {
            "OFFLINE_AUTH_ACCESS_TTL": "120",
            "OFFLINE_AUTH_ADDRESS_ATTEMPTS": "100",
            "OFFLINE_AUTH_MFA_WINDOW": "60.5",
        }
    )
    assert options["access_ttl"] == 120.0
    assert options["rate_limits"].address_attempts == 100 and options["rate_limits"].mfa_window == 60.5
    assert auth_options_from_environment({}) == {}
    for name, value in (
        ("OFFLINE_AUTH_ADDRESS_ATTEMPTS", "2.5"),
        ("OFFLINE_AUTH_ACCOUNT_WINDOW", "-1"),
        ("OFFLINE_AUTH_REFRESH_TTL", "soon"),
    ):
        with pytest.raises(OfflineError) as bad:
            auth_options_from_environment({name: value})
        assert bad.value.code == "AUTH_CONFIG" and bad.value.context["field"] == name
        assert name in bad.value.message
