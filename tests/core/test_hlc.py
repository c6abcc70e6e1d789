from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offline.core.errors import CLOCK_DRIFT, INVALID_OPERATION, OfflineError
from offline.core.hlc import (
    MAX_DRIFT_MS,
    MAX_LOGICAL,
    HLCTimestamp,
    HybridLogicalClock,
    parse_timestamp,
    serialize_timestamp,
)

compare = HybridLogicalClock.compare

node_ids = st.text(alphabet="abcAB0:-\u00e9\u4e2d\U0001f600", min_size=1, max_size=4)
timestamps = st.builds(
    HLCTimestamp,
    wall_time=st.integers(min_value=0, max_value=3),
    logical=st.sampled_from([0, 1, 2, 9, 10, MAX_LOGICAL - 1, MAX_LOGICAL]),
    node_id=node_ids,
)
wide_timestamps = st.builds(
    HLCTimestamp,
    wall_time=st.integers(min_value=0, max_value=10**15 - 1),
    logical=st.integers(min_value=0, max_value=MAX_LOGICAL),
    node_id=node_ids,
)


class FakeClock:
    """Physical clock under test control."""

    def __init__(self, ms: int = 1_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


def _sign(n: int) -> int:
    return (n > 0) - (n < 0)


# ------------------------------------------------------------------------------------------- timestamp


def test_wire_round_trip() -> None:
    ts = HLCTimestamp(1_700_000_000_000, 3, "node-a")
    assert ts.to_wire() == {"wallTime": 1_700_000_000_000, "logical": 3, "nodeId": "node-a"}
    assert HLCTimestamp.from_wire(ts.to_wire()) == ts


@pytest.mark.parametrize(
    ("wire", "key"),
    [
        ({"wallTime": True, "logical": 0, "nodeId": "n"}, "wallTime"),
        ({"wallTime": 1, "logical": False, "nodeId": "n"}, "logical"),
        ({"wallTime": "1", "logical": 0, "nodeId": "n"}, "wallTime"),
        ({"wallTime": 1.0, "logical": 0, "nodeId": "n"}, "wallTime"),
        ({"wallTime": -1, "logical": 0, "nodeId": "n"}, "wallTime"),
        ({"wallTime": 10**15, "logical": 0, "nodeId": "n"}, "wallTime"),
        ({"wallTime": 1, "logical": MAX_LOGICAL + 1, "nodeId": "n"}, "logical"),
        ({"wallTime": 1, "logical": 0, "nodeId": ""}, "nodeId"),
        ({"wallTime": 1, "logical": 0, "nodeId": 7}, "nodeId"),
        ({"logical": 0, "nodeId": "n"}, "wallTime"),
        ({"wallTime": 1, "nodeId": "n"}, "logical"),
        ({"wallTime": 1, "logical": 0}, "nodeId"),
    ],
)
def test_from_wire_rejects_bad_input(wire: dict[str, Any], key: str) -> None:
    with pytest.raises(OfflineError) as info:
        HLCTimestamp.from_wire(wire)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["field"] == "timestamp"
    assert info.value.context["key"] == key


@pytest.mark.parametrize("bad", [None, [1, 0, "n"], "000:00:n", 5])
def test_from_wire_rejects_non_mappings(bad: object) -> None:
    with pytest.raises(OfflineError) as info:
        HLCTimestamp.from_wire(bad)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["field"] == "timestamp"


def test_timestamps_are_immutable() -> None:
    ts = HLCTimestamp(1, 2, "n")
    with pytest.raises(AttributeError):
        ts.wall_time = 5  # type: ignore[misc]


def test_serialize_format() -> None:
    assert serialize_timestamp(HLCTimestamp(1_700_000_000_000, 7, "node:x")) == "001700000000000:00007:node:x"
    assert parse_timestamp("001700000000000:00007:node:x") == HLCTimestamp(1_700_000_000_000, 7, "node:x")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "1:2:n",
        "001700000000000:00007:",
        "001700000000000:0007:n",
        "00170000000000a:00007:n",
        "\u0661" * 15 + ":00000:n",  # Arabic-Indic digits are not ASCII digits,
    ],
)
def test_parse_rejects_malformed(bad: str) -> None:
    with pytest.raises(OfflineError) as info:
        parse_timestamp(bad)
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["field"] == "timestamp"


@given(wide_timestamps)
def test_serialize_parse_round_trip(ts: HLCTimestamp) -> None:
    assert parse_timestamp(serialize_timestamp(ts)) == ts


@settings(max_examples=300)
@given(timestamps, timestamps, timestamps)
def test_compare_is_a_total_order_matching_serialization(
    a: HLCTimestamp, b: HLCTimestamp, c: HLCTimestamp
) -> None:
    # Antisymmetry and consistency with ==.
    assert _sign(compare(a, b)) == -_sign(compare(b, a))
    assert (compare(a, b) == 0) == (a == b)
    assert compare(a, a) == 0
    # Transitivity.
    if compare(a, b) <= 0 and compare(b, c) <= 0:
        assert compare(a, c) <= 0
    # Agrees with the documented key and with the serialized strings' order.
    key_a = (a.wall_time, a.logical, a.node_id)
    key_b = (b.wall_time, b.logical, b.node_id)
    assert _sign(compare(a, b)) == (key_a > key_b) - (key_a < key_b)
    sa, sb = serialize_timestamp(a), serialize_timestamp(b)
    assert _sign(compare(a, b)) == (sa > sb) - (sa < sb)
    # The dataclass ordering agrees too, so sorted() works on timestamps directly.
    assert (a < b) == (compare(a, b) < 0)


@given(st.lists(wide_timestamps, max_size=20))
def test_sorting_by_serialization_equals_sorting_by_compare(items: list[HLCTimestamp]) -> None:
    assert sorted(items, key=serialize_timestamp) == sorted(items)


# ------------------------------------------------------------------------------------------------- now


def test_empty_node_id_is_refused() -> None:
    with pytest.raises(OfflineError) as info:
        HybridLogicalClock("")
    assert info.value.code == INVALID_OPERATION
    assert info.value.context is not None
    assert info.value.context["field"] == "nodeId"


def test_now_uses_physical_time_then_logical_counter() -> None:
    phys = FakeClock(5000)
    clock = HybridLogicalClock("n1", now=phys)
    assert clock.last is None
    assert clock.node_id == "n1"
    assert clock.now() == HLCTimestamp(5000, 0, "n1")
    assert clock.now() == HLCTimestamp(5000, 1, "n1")
    phys.ms = 4000  # clock stepped backwards
    assert clock.now() == HLCTimestamp(5000, 2, "n1")
    phys.ms = 6000
    assert clock.now() == HLCTimestamp(6000, 0, "n1")
    assert clock.last == HLCTimestamp(6000, 0, "n1")


def test_default_physical_clock_is_unix_ms() -> None:
    import time

    before = time.time_ns() // 1_000_000
    ts = HybridLogicalClock("n").now()
    after = time.time_ns() // 1_000_000
    assert before <= ts.wall_time <= after


def test_logical_overflow_moves_to_next_millisecond() -> None:
    clock = HybridLogicalClock("n", now=FakeClock(1000), last=HLCTimestamp(1000, MAX_LOGICAL - 1, "n"))
    a = clock.now()
    b = clock.now()
    assert a == HLCTimestamp(1000, MAX_LOGICAL, "n")
    assert b == HLCTimestamp(1001, 0, "n")
    assert compare(a, b) < 0
    assert serialize_timestamp(a) < serialize_timestamp(b)


def test_seeded_clock_continues_after_restart() -> None:
    last = HLCTimestamp(9_000, 17, "n")
    clock = HybridLogicalClock("n", now=FakeClock(1_000), last=last)
    assert clock.last == last
    assert clock.now() == HLCTimestamp(9_000, 18, "n")


@settings(max_examples=200)
@given(st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=80))
def test_now_strictly_monotonic_for_any_physical_clock(readings: list[int]) -> None:
    # Small range: the physical clock repeatedly stands still and goes backwards.
    it = iter(readings)
    clock = HybridLogicalClock("n", now=lambda: next(it))
    issued = [clock.now() for _ in readings]
    for prev, nxt in itertools.pairwise(issued):
        assert compare(prev, nxt) < 0
        assert serialize_timestamp(prev) < serialize_timestamp(nxt)
    for ts, phys in zip(issued, readings, strict=True):
        assert ts.wall_time >= phys
    assert clock.last == issued[-1]


@settings(max_examples=100)
@given(
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=MAX_LOGICAL - 3, max_value=MAX_LOGICAL),
    st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=10),
)
def test_now_monotonic_across_overflow(wall: int, logical: int, readings: list[int]) -> None:
    it = iter(readings)
    seed = HLCTimestamp(wall, logical, "n")
    clock = HybridLogicalClock("n", now=lambda: next(it), last=seed)
    issued = [seed, *(clock.now() for _ in readings)]
    for prev, nxt in itertools.pairwise(issued):
        assert compare(prev, nxt) < 0
        assert serialize_timestamp(prev) < serialize_timestamp(nxt)
        assert nxt.logical <= MAX_LOGICAL


def test_now_is_thread_safe() -> None:
    clock = HybridLogicalClock("n", now=FakeClock(1))
    out: list[HLCTimestamp] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [clock.now() for _ in range(1000)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 8000


# --------------------------------------------------------------------------------------------- receive


def test_receive_standard_cases() -> None:
    phys = FakeClock(1000)
    clock = HybridLogicalClock("local", now=phys)
    clock.now()  # (1000, 0)
    # Remote ahead of both: adopt its wall time, counter after its counter.
    assert clock.receive(HLCTimestamp(2000, 5, "r")) == HLCTimestamp(2000, 6, "local")
    # Remote equal wall time: counter after the larger of both.
    assert clock.receive(HLCTimestamp(2000, 9, "r")) == HLCTimestamp(2000, 10, "local")
    # Remote behind: local counter continues.
    assert clock.receive(HLCTimestamp(10, 50, "r")) == HLCTimestamp(2000, 11, "local")
    # Physical time ahead of everything: reset the counter.
    phys.ms = 3000
    assert clock.receive(HLCTimestamp(2500, 50, "r")) == HLCTimestamp(3000, 0, "local")


def test_receive_on_fresh_clock() -> None:
    clock = HybridLogicalClock("local", now=FakeClock(1000))
    assert clock.receive(HLCTimestamp(1000, 4, "r")) == HLCTimestamp(1000, 5, "local")


def test_receive_accepts_wire_dict() -> None:
    clock = HybridLogicalClock("local", now=FakeClock(1000))
    got = clock.receive({"wallTime": 1200, "logical": 1, "nodeId": "r"})  # type: ignore[arg-type]
    assert got == HLCTimestamp(1200, 2, "local")


def test_receive_overflow_moves_to_next_millisecond() -> None:
    clock = HybridLogicalClock("local", now=FakeClock(1000))
    remote = HLCTimestamp(1000, MAX_LOGICAL, "r")
    got = clock.receive(remote)
    assert got == HLCTimestamp(1001, 0, "local")
    assert compare(got, remote) > 0
    assert serialize_timestamp(got) > serialize_timestamp(remote)


@st.composite
def receive_scenarios(draw: st.DrawFn) -> list[tuple[str, int, HLCTimestamp | None]]:
    steps: list[tuple[str, int, HLCTimestamp | None]] = []
    for _ in range(draw(st.integers(min_value=1, max_value=40))):
        physical = draw(st.integers(min_value=10_000, max_value=10_010))
        if draw(st.booleans()):
            remote = HLCTimestamp(
                draw(st.integers(min_value=9_990, max_value=physical + MAX_DRIFT_MS)),
                draw(st.sampled_from([0, 1, 5, MAX_LOGICAL - 1, MAX_LOGICAL])),
                draw(st.sampled_from(["a", "local", "zz"])),
            )
            steps.append(("receive", physical, remote))
        else:
            steps.append(("now", physical, None))
    return steps


@settings(max_examples=200)
@given(receive_scenarios())
def test_receive_and_now_properties(steps: list[tuple[str, int, HLCTimestamp | None]]) -> None:
    phys = FakeClock()
    clock = HybridLogicalClock("local", now=phys)
    previous: HLCTimestamp | None = None
    for kind, physical, remote in steps:
        phys.ms = physical
        if kind == "receive":
            assert remote is not None
            got = clock.receive(remote)
            assert compare(got, remote) > 0
            assert got.wall_time >= remote.wall_time
        else:
            got = clock.now()
        assert got.wall_time >= physical
        assert got.node_id == "local"
        if previous is not None:
            assert compare(got, previous) > 0
            assert serialize_timestamp(got) > serialize_timestamp(previous)
        previous = got
        assert clock.last == got


def test_clock_drift_refused_and_clock_unchanged() -> None:
    phys = FakeClock(1_000_000)
    clock = HybridLogicalClock("local", now=phys)
    before = clock.now()
    remote = HLCTimestamp(1_000_000 + MAX_DRIFT_MS + 1, 0, "r")
    with pytest.raises(OfflineError) as info:
        clock.receive(remote)
    assert info.value.code == CLOCK_DRIFT
    assert info.value.context == {
        "remote_wall_time": remote.wall_time,
        "remote_node_id": "r",
        "physical_time": 1_000_000,
        "drift_ms": MAX_DRIFT_MS + 1,
        "max_drift_ms": MAX_DRIFT_MS,
    }
    assert clock.last == before
    assert clock.now() == HLCTimestamp(1_000_000, 1, "local")
    # Exactly at the limit is still accepted.
    assert clock.receive(HLCTimestamp(1_000_000 + MAX_DRIFT_MS, 0, "r")).wall_time == 1_000_000 + MAX_DRIFT_MS


@settings(max_examples=100)
@given(
    st.one_of(
        st.none(), st.builds(HLCTimestamp, st.integers(0, 2_000_000), st.integers(0, MAX_LOGICAL), node_ids)
    ),
    st.integers(min_value=0, max_value=1_000_000),
    st.integers(min_value=1, max_value=10**9),
)
def test_clock_drift_never_changes_the_clock(seed: HLCTimestamp | None, physical: int, excess: int) -> None:
    clock = HybridLogicalClock("local", now=FakeClock(physical), last=seed)
    with pytest.raises(OfflineError) as info:
        clock.receive(HLCTimestamp(physical + MAX_DRIFT_MS + excess, 0, "r"))
    assert info.value.code == CLOCK_DRIFT
    assert clock.last == seed


def test_compare_static_examples() -> None:
    a = HLCTimestamp(1, 0, "b")
    assert compare(a, HLCTimestamp(2, 0, "a")) < 0
    assert compare(a, HLCTimestamp(1, 1, "a")) < 0
    assert compare(a, HLCTimestamp(1, 0, "c")) < 0
    assert compare(a, HLCTimestamp(1, 0, "a")) > 0
    assert compare(a, HLCTimestamp(1, 0, "b")) == 0


def test_receive_after_restart_stays_ahead_of_seed() -> None:
    seed = HLCTimestamp(5000, 3, "local")
    clock = HybridLogicalClock("local", now=FakeClock(100), last=seed)
    got = clock.receive(HLCTimestamp(200, 0, "r"))
    assert got == HLCTimestamp(5000, 4, "local")
    assert compare(clock.now(), got) > 0
