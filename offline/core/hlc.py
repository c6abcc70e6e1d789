"""Hybrid logical clock (Kulkarni et al.), SPEC 2.8 / 4.4 and DESIGN.md section 3.

Timestamps order every event across replicas: by wall time, then the logical counter, then the node id.
The serialized form ``"%015d:%05d:<node_id>"`` is fixed-width in its numeric parts, so plain string
comparison gives exactly the same order; that is what lets stores index and sort by it.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .errors import CLOCK_DRIFT, INVALID_OPERATION, OfflineError

__all__ = [
    "MAX_DRIFT_MS",
    "MAX_LOGICAL",
    "MAX_WALL_TIME",
    "HLCTimestamp",
    "HybridLogicalClock",
    "compare_timestamps",
    "parse_timestamp",
    "serialize_timestamp",
]

#: The serialized form has five digits for the counter; going past it borrows the next millisecond.
MAX_LOGICAL: Final = 99_999
#: Fifteen digits of wall time (until the year 33658), the width of the serialized form.
MAX_WALL_TIME: Final = 10**15 - 1
#: SPEC 8: a remote timestamp more than five minutes ahead of our physical clock is refused.
MAX_DRIFT_MS: Final = 5 * 60 * 1000

_SERIALIZED = re.compile(r"([0-9]{15}):([0-9]{5}):(.+)", re.DOTALL)


def _invalid(message: str, **context: Any) -> OfflineError:
    return OfflineError(message, INVALID_OPERATION, {"field": "timestamp", **context})


def _check_int(key: str, value: object, maximum: int) -> int:
    # bool is an int subclass, but True as a wall time is a caller bug, not a timestamp.
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid(
            f"timestamp {key} must be an integer",
            key=key,
            expected="integer",
            received=type(value).__name__,
        )
    if not 0 <= value <= maximum:
        raise _invalid(
            f"timestamp {key} must be between 0 and {maximum}",
            key=key,
            expected=f"0..{maximum}",
            received=value,
        )
    return value


@dataclass(frozen=True, slots=True, order=True)
class HLCTimestamp:
    """One hybrid logical clock reading. Field order makes the generated ordering match ``compare``."""

    wall_time: int
    logical: int
    node_id: str

    def __post_init__(self) -> None:
        _check_int("wallTime", self.wall_time, MAX_WALL_TIME)
        _check_int("logical", self.logical, MAX_LOGICAL)
        if not isinstance(self.node_id, str) or not self.node_id:
            raise _invalid(
                "timestamp nodeId must be a non-empty string",
                key="nodeId",
                expected="non-empty string",
                received=type(self.node_id).__name__,
            )

    def to_wire(self) -> dict[str, Any]:
        return {"wallTime": self.wall_time, "logical": self.logical, "nodeId": self.node_id}

    @classmethod
    def from_wire(cls, d: object) -> HLCTimestamp:
        if isinstance(d, HLCTimestamp):
            return d
        if not isinstance(d, Mapping):
            raise _invalid(
                "timestamp must be an object with wallTime, logical and nodeId",
                expected="object",
                received=type(d).__name__,
            )
        for key in ("wallTime", "logical", "nodeId"):
            if key not in d:
                raise _invalid(f"timestamp {key} is missing", key=key, reason="MISSING")
        return cls(d["wallTime"], d["logical"], d["nodeId"])


def serialize_timestamp(ts: HLCTimestamp) -> str:
    """Fixed-width text form whose string order equals ``HybridLogicalClock.compare``."""
    # printf-style: measurably cheaper than an f-string's format specs, and this runs for every operation.
    return "%015d:%05d:%s" % (ts.wall_time, ts.logical, ts.node_id)  # noqa: UP031


def parse_timestamp(s: str) -> HLCTimestamp:
    """Inverse of ``serialize_timestamp``."""
    match = _SERIALIZED.fullmatch(s) if isinstance(s, str) else None
    if match is None:
        raise _invalid(
            "timestamp string must look like '<15 digits>:<5 digits>:<nodeId>'",
            expected="serialized timestamp",
            received=repr(s),
        )
    return HLCTimestamp(int(match.group(1)), int(match.group(2)), match.group(3))


def compare_timestamps(a: HLCTimestamp, b: HLCTimestamp) -> int:
    """Negative if ``a`` is before ``b``, zero if identical, positive if after."""
    ka = (a.wall_time, a.logical, a.node_id)
    kb = (b.wall_time, b.logical, b.node_id)
    return (ka > kb) - (ka < kb)


def _system_ms() -> int:
    return time.time_ns() // 1_000_000


class HybridLogicalClock:
    """The local clock of one node.

    ``now`` returns physical time in unix milliseconds (injectable for tests); ``last`` seeds the clock with
    the last timestamp it issued before a restart, so it never goes back behind operations already written.
    """

    __slots__ = ("_last", "_lock", "_node_id", "_physical")

    def __init__(
        self,
        node_id: str,
        now: Callable[[], int] | None = None,
        last: HLCTimestamp | None = None,
    ) -> None:
        if not isinstance(node_id, str) or not node_id:
            raise OfflineError(
                "HybridLogicalClock node_id must be a non-empty string",
                INVALID_OPERATION,
                {"field": "nodeId", "expected": "non-empty string", "received": type(node_id).__name__},
            )
        if last is not None and not isinstance(last, HLCTimestamp):
            raise _invalid(
                "last must be an HLCTimestamp", expected="HLCTimestamp", received=type(last).__name__
            )
        self._node_id = node_id
        self._physical = now if now is not None else _system_ms
        self._last = last
        # Stores and the sync engine may tick the clock from different threads; each tick must see the
        # previous one or two callers could get the same timestamp.
        self._lock = threading.Lock()

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def last(self) -> HLCTimestamp | None:
        return self._last

    def _read_physical(self) -> int:
        return int(self._physical())

    def _issue(self, wall: int, logical: int) -> HLCTimestamp:
        if logical > MAX_LOGICAL:
            # The counter has no digit left in the serialized form: borrow the next millisecond instead,
            # which still orders after everything issued so far.
            wall, logical = wall + 1, 0
        ts = HLCTimestamp(wall, logical, self._node_id)
        self._last = ts
        return ts

    def now(self) -> HLCTimestamp:
        """A timestamp strictly greater than any this clock issued or received before."""
        with self._lock:
            physical = self._read_physical()
            last = self._last
            if last is None or physical > last.wall_time:
                return self._issue(physical, 0)
            return self._issue(last.wall_time, last.logical + 1)

    def receive(self, remote: HLCTimestamp) -> HLCTimestamp:
        """Merge a remote timestamp; the result is after both the previous local value and ``remote``.

        Raises CLOCK_DRIFT (leaving the clock untouched) when ``remote`` is more than MAX_DRIFT_MS ahead of
        the local physical clock: adopting it would drag every later local timestamp into the future.
        """
        if not isinstance(remote, HLCTimestamp):
            remote = HLCTimestamp.from_wire(remote)
        with self._lock:
            physical = self._read_physical()
            drift = remote.wall_time - physical
            if drift > MAX_DRIFT_MS:
                raise OfflineError(
                    f"remote clock is {drift} ms ahead of the local clock (limit {MAX_DRIFT_MS} ms)",
                    CLOCK_DRIFT,
                    {
                        "remote_wall_time": remote.wall_time,
                        "remote_node_id": remote.node_id,
                        "physical_time": physical,
                        "drift_ms": drift,
                        "max_drift_ms": MAX_DRIFT_MS,
                    },
                )
            last = self._last
            last_wall = last.wall_time if last is not None else -1
            wall = max(physical, last_wall, remote.wall_time)
            if last is not None and wall == last_wall and wall == remote.wall_time:
                logical = max(last.logical, remote.logical) + 1
            elif last is not None and wall == last_wall:
                logical = last.logical + 1
            elif wall == remote.wall_time:
                logical = remote.logical + 1
            else:
                logical = 0
            return self._issue(wall, logical)

    @staticmethod
    def compare(a: HLCTimestamp, b: HLCTimestamp) -> int:
        """Negative if ``a`` is before ``b``, zero if identical, positive if after (wall, logical, node)."""
        return compare_timestamps(a, b)

    def __repr__(self) -> str:
        return f"HybridLogicalClock(node_id={self._node_id!r}, last={self._last!r})"
