from __future__ import annotations

import itertools
import re
import threading
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offline.core.errors import INVALID_OPERATION, OfflineError
from offline.core.uuid7 import UUIDv7Generator, generate_uuid_v7, uuid7_timestamp_ms

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def test_format_version_and_variant_bits() -> None:
    for _ in range(200):
        s = generate_uuid_v7()
        assert UUID_RE.fullmatch(s), s
        parsed = uuid.UUID(s)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert (parsed.int >> 76) & 0xF == 0b0111
        assert (parsed.int >> 62) & 0b11 == 0b10


def test_strictly_increasing_and_unique_in_a_burst() -> None:
    ids = [generate_uuid_v7() for _ in range(5000)]
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert [uuid.UUID(i).int for i in ids] == sorted(uuid.UUID(i).int for i in ids)
    assert len(set(ids)) == len(ids)


def test_timestamp_extraction_matches_wall_clock() -> None:
    before = time.time_ns() // 1_000_000
    s = generate_uuid_v7()
    after = time.time_ns() // 1_000_000
    # The generator may have borrowed a millisecond ahead after a burst, never more than a few.
    assert before <= uuid7_timestamp_ms(s) <= after + 5


def test_known_layout_with_fixed_clock_and_randomness() -> None:
    gen = UUIDv7Generator(now=lambda: 0x0123456789AB, randbits=lambda bits: 0)
    first = gen.generate()
    assert first == "01234567-89ab-7000-8000-000000000000"
    assert uuid7_timestamp_ms(first) == 0x0123456789AB
    # Same millisecond: counter moves by 1 + random step (0 here).
    assert gen.generate() == "01234567-89ab-7000-8000-000000000001"


def test_same_millisecond_and_clock_going_backwards_stay_monotonic() -> None:
    readings = iter([1000, 1000, 1000, 999, 500, 1000, 1001])
    gen = UUIDv7Generator(now=lambda: next(readings))
    ids = [gen.generate() for _ in range(7)]
    assert all(a < b for a, b in itertools.pairwise(ids))
    # While the physical clock is at or behind 1000 the ids keep the 1000 timestamp.
    assert [uuid7_timestamp_ms(i) for i in ids] == [1000] * 6 + [1001]


def test_counter_overflow_borrows_next_millisecond() -> None:
    gen = UUIDv7Generator(now=lambda: 42, randbits=lambda bits: 0)
    first = gen.generate()
    # Reaching the end of the 74-bit counter takes ~2**42 ids; put the generator there directly.
    gen._last_counter = (1 << 74) - 1
    at_limit = "00000000-002a-7fff-bfff-ffffffffffff"
    assert uuid.UUID(at_limit).int >> 80 == 42
    overflowed = gen.generate()
    assert uuid7_timestamp_ms(first) == 42
    assert uuid7_timestamp_ms(overflowed) == 43
    assert first < at_limit < overflowed
    assert uuid.UUID(overflowed).version == 7
    assert uuid.UUID(overflowed).variant == uuid.RFC_4122


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=60))
def test_monotonic_for_any_physical_clock(readings: list[int]) -> None:
    it = iter(readings)
    gen = UUIDv7Generator(now=lambda: next(it))
    ids = [gen.generate() for _ in readings]
    assert all(a < b for a, b in itertools.pairwise(ids))
    stamps = [uuid7_timestamp_ms(i) for i in ids]
    assert stamps == sorted(stamps)
    # Never behind the physical clock reading that produced it.
    assert all(s >= r for s, r in zip(stamps, readings, strict=True))


def test_thread_safe_generation() -> None:
    results: list[list[str]] = [[] for _ in range(8)]

    def work(out: list[str]) -> None:
        out.extend(generate_uuid_v7() for _ in range(500))

    threads = [threading.Thread(target=work, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for r in results for i in r]
    assert len(set(flat)) == len(flat) == 4000
    for r in results:
        assert r == sorted(r)


@pytest.mark.parametrize(
    "bad",
    [
        "not-a-uuid",
        str(uuid.uuid4()),
        "01234567-89ab-7000-0000-000000000000",  # version 7 nibble but NCS variant
        "",
    ],
)
def test_timestamp_extraction_rejects_non_v7(bad: str) -> None:
    with pytest.raises(OfflineError) as info:
        uuid7_timestamp_ms(bad)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["field"] == "uuid"
