"""Time-ordered identifiers: RFC 9562 UUID version 7 (SPEC 4.4 ``generateUUIDv7``).

Layout (128 bits, most significant first)::

    unix_ts_ms (48) | ver = 0b0111 (4) | rand_a (12) | var = 0b10 (2) | rand_b (62)

rand_a and rand_b together are used as one 74-bit counter (RFC 9562 section 6.2, method 2 "monotonic
random"): a fresh random value at the start of each millisecond, then increased by a random step for every
further id in that millisecond. That keeps ids strictly increasing within a process, both as integers and as
their canonical lowercase strings, even when many are generated per millisecond or the system clock steps
backwards, while keeping most of the bits unpredictable.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Final

from .errors import INVALID_OPERATION, OfflineError

__all__ = ["UUIDv7Generator", "generate_uuid_v7", "uuid7_timestamp_ms"]

_TIMESTAMP_BITS: Final = 48
_COUNTER_BITS: Final = 74
_MAX_TIMESTAMP: Final = (1 << _TIMESTAMP_BITS) - 1
_MAX_COUNTER: Final = (1 << _COUNTER_BITS) - 1
# A new millisecond starts its counter with the top bit clear, so at least 2**73 of room is left for the
# ids that follow in the same millisecond before it has to borrow the next one.
_SEED_BITS: Final = _COUNTER_BITS - 1
# Random increments rather than +1 so consecutive ids do not reveal each other; 32 bits keeps the expected
# number of ids per millisecond before overflow astronomically high (about 2**42).
_STEP_BITS: Final = 32


def _system_ms() -> int:
    return time.time_ns() // 1_000_000


class _RandomBits:
    """``secrets.randbits``, drawing its bytes from ``os.urandom`` a page at a time (one system call per
    ~400 ids instead of one per id). A forked child starts with a fresh pool, so parent and child never
    hand out the same bytes."""

    _POOL = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0

    def reset(self) -> None:
        self._pool = b""
        self._at = 0

    def __call__(self, bits: int) -> int:
        size = (bits + 7) // 8
        with self._lock:
            at = self._at
            if at + size > len(self._pool):
                self._pool = os.urandom(max(self._POOL, size))
                at = 0
            self._at = at + size
            chunk = self._pool[at : at + size]
        # As random.SystemRandom.getrandbits builds it from ``size`` fresh bytes.
        return int.from_bytes(chunk, "big") >> (size * 8 - bits)


_random_bits: Final = _RandomBits()
if hasattr(os, "register_at_fork"):  # not on every platform (Pyodide has no fork)
    os.register_at_fork(after_in_child=_random_bits.reset)


class UUIDv7Generator:
    """A source of strictly increasing UUIDv7 strings.

    ``now`` returns the physical time in unix milliseconds and ``randbits`` random integers; both are only
    injectable so tests can drive the edge cases (clock going backwards, counter overflow).
    """

    __slots__ = ("_last_counter", "_last_ms", "_lock", "_now", "_randbits")

    def __init__(
        self,
        now: Callable[[], int] | None = None,
        randbits: Callable[[int], int] | None = None,
    ) -> None:
        self._now = now if now is not None else _system_ms
        self._randbits = randbits if randbits is not None else _random_bits
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_counter = 0

    def generate(self) -> str:
        physical = int(self._now())
        with self._lock:
            if physical > self._last_ms:
                ms = physical
                counter = self._randbits(_SEED_BITS)
            else:
                # Same millisecond, or the clock went backwards: stay on the last timestamp and move the
                # counter forward, so ordering never depends on the wall clock behaving.
                ms = self._last_ms
                counter = self._last_counter + 1 + self._randbits(_STEP_BITS)
                if counter > _MAX_COUNTER:
                    ms += 1
                    counter = self._randbits(_SEED_BITS)
            if not 0 <= ms <= _MAX_TIMESTAMP:
                raise OfflineError(
                    "UUIDv7 timestamp out of the 48-bit range",
                    INVALID_OPERATION,
                    {"field": "timestamp", "received": ms},
                )
            self._last_ms = ms
            self._last_counter = counter
        rand_a = counter >> 62
        rand_b = counter & ((1 << 62) - 1)
        value = (ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
        # str(uuid.UUID(int=value)), without building the UUID object.
        text = f"{value:032x}"
        return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


_default_generator: Final = UUIDv7Generator()


def generate_uuid_v7() -> str:
    """Return a new UUIDv7 string, strictly greater than every one this process returned before."""
    return _default_generator.generate()


def uuid7_timestamp_ms(s: str) -> int:
    """Return the unix millisecond timestamp embedded in the UUIDv7 string ``s``."""
    try:
        parsed = uuid.UUID(s)
    except (TypeError, ValueError, AttributeError) as exc:
        raise OfflineError(
            "not a valid UUID string", INVALID_OPERATION, {"field": "uuid", "received": repr(s)}
        ) from exc
    if parsed.version != 7 or parsed.variant != uuid.RFC_4122:
        raise OfflineError(
            "not a version 7 UUID",
            INVALID_OPERATION,
            {"field": "uuid", "expected": "version 7", "received": parsed.version},
        )
    return parsed.int >> 80
