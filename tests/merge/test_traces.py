"""MergeTrace contents (SPEC 2.12) for Tier 1 and Tier 3 conflicts, as received through app events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from offline import MergeTrace, op
from offline.core.operations import Operation
from offline.store.app import App

from ._support import FakeClock, exchange_all, make_schema, new_apps


class Recorder:
    """Collects merge events of one app, in emission order."""

    def __init__(self, app: App) -> None:
        self.events: list[tuple[str, Any]] = []
        for kind in ("merge:started", "merge:conflict", "merge:completed"):
            app.events.on(kind, lambda event, kind=kind: self.events.append((kind, event)))

    def traces(self, kind: str = "merge:conflict") -> list[MergeTrace]:
        return [event.trace for k, event in self.events if k == kind]

    def by_field(self) -> dict[str, MergeTrace]:
        traces = self.traces()
        out = {trace.field: trace for trace in traces}
        assert len(out) == len(traces), "one trace per conflicting field"
        return out


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pair(clock: FakeClock) -> Any:
    a, _ = apps = new_apps(2, clock=clock)
    a.items.insert(
        {"id": "r1", "title": "base", "notes": "n0", "tags": ["a"], "count": 10, "body": "hello", "hi": 1}
    )
    exchange_all(apps)
    clock.advance()
    yield apps
    for app in apps:
        app.close()


def own_ops(app: App) -> list[Operation]:
    return [o for o in app.operations() if o.node_id == app.node_id]


def concurrent_updates(
    pair: list[App], clock: FakeClock, first: dict[str, Any], second: dict[str, Any]
) -> tuple[Operation, Operation]:
    """A writes ``first``, then (later HLC, without having seen it) B writes ``second``."""
    a, b = pair
    a.items.update("r1", first)
    clock.advance()
    b.items.update("r1", second)
    return own_ops(a)[-1], own_ops(b)[-1]


def test_lww_conflict_trace_tier_1(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    op_a, op_b = concurrent_updates(pair, clock, {"title": "A"}, {"title": "B"})
    recorders = [Recorder(a), Recorder(b)]
    b.apply(a.operations())  # B receives the earlier write
    a.apply(b.operations())  # A receives the later write
    for recorder in recorders:
        (trace,) = recorder.traces()
        assert isinstance(trace, MergeTrace)
        # The two concurrent operations, in HLC order whichever side received which.
        assert trace.operation_a.id == op_a.id and trace.operation_b.id == op_b.id
        assert trace.operation_a == op_a and trace.operation_b == op_b
        assert trace.field == "title"
        assert trace.strategy == "lww"
        assert trace.input_a == "A" and trace.input_b == "B"
        assert trace.base == "base"
        assert trace.output == "B"
        assert trace.tier == 1
        assert trace.constraint_violated is None
        assert isinstance(trace.duration, (int, float)) and trace.duration >= 0
        # merge:completed carries the same trace, after merge:started and merge:conflict.
        assert recorder.traces("merge:completed") == [trace]
        assert [kind for kind, _ in recorder.events] == ["merge:started", "merge:conflict", "merge:completed"]
        started = recorder.events[0][1]
        assert started.operationA.id == op_a.id and started.operationB.id == op_b.id
    assert a.items.find_by_id("r1")["title"] == b.items.find_by_id("r1")["title"] == "B"


def test_trace_to_dict_uses_spec_names(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    op_a, op_b = concurrent_updates(pair, clock, {"title": "A"}, {"title": "B"})
    recorder = Recorder(b)
    b.apply(a.operations())
    (trace,) = recorder.traces()
    shape = trace.to_dict()
    assert set(shape) == {
        "operationA", "operationB", "field", "strategy", "inputA", "inputB",
        "base", "output", "tier", "constraintViolated", "duration",
    }  # fmt: skip
    assert shape["operationA"] == op_a.to_wire() and shape["operationB"] == op_b.to_wire()
    assert (shape["inputA"], shape["inputB"], shape["output"], shape["tier"]) == ("A", "B", "B", 1)
    assert shape["constraintViolated"] is None
    json.dumps(shape)  # ready for the wire / dashboard


def test_custom_resolver_trace_tier_3(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    op_a, op_b = concurrent_updates(pair, clock, {"notes": "zeta"}, {"notes": "alpha"})
    recorders = [Recorder(a), Recorder(b)]
    exchange_all(pair)
    for recorder in recorders:
        (trace,) = recorder.traces()
        assert trace.field == "notes"
        assert trace.strategy == "custom"
        assert trace.tier == 3
        assert (trace.operation_a.id, trace.operation_b.id) == (op_a.id, op_b.id)
        assert (trace.input_a, trace.input_b, trace.base) == ("zeta", "alpha", "n0")
        assert trace.output == "alpha|zeta"  # what the resolver returned (sorted concatenation)
        assert trace.constraint_violated is None
        assert trace.duration >= 0
        assert recorder.traces("merge:completed") == [trace]
    assert a.items.find_by_id("r1")["notes"] == b.items.find_by_id("r1")["notes"] == "alpha|zeta"


def test_strategy_names_of_tier_1_traces(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    op_a, op_b = concurrent_updates(
        pair,
        clock,
        {"tags": ["a", "x"], "count": op.increment(2), "hi": 5},
        {"tags": [], "count": op.increment(3), "hi": 4},
    )
    a.items.richtext("r1", "body").insert(0, "A ")
    b.items.richtext("r1", "body").insert(5, " B")
    recorder = Recorder(b)
    b.apply(a.operations())
    traces = recorder.by_field()
    assert {name: trace.strategy for name, trace in traces.items()} == {
        "tags": "add-wins-set",
        "count": "counter",
        "hi": "max",
        "body": "crdt-text",
    }
    assert all(trace.tier == 1 and trace.constraint_violated is None for trace in traces.values())

    tags = traces["tags"]
    assert (tags.input_a, tags.input_b, tags.base, tags.output) == (["a", "x"], [], ["a"], ["x"])
    count = traces["count"]
    assert (count.input_a, count.input_b, count.base, count.output) == (12, 13, 10, 15)
    assert (traces["hi"].input_a, traces["hi"].input_b, traces["hi"].output) == (5, 4, 5)
    body = traces["body"]
    assert body.base is None  # a rich text edit does not carry the text it started from (SPEC: null)
    assert body.output == "A hello B"
    assert b.items.find_by_id("r1")["body"] == "A hello B"
    for trace in (tags, count, traces["hi"]):
        assert (trace.operation_a.id, trace.operation_b.id) == (op_a.id, op_b.id)
    # Every trace is JSON-ready, the rich text one too (its inputs are Yjs updates, in their wire form).
    shape = json.loads(json.dumps(body.to_dict()))
    assert shape["output"] == "A hello B" and shape["base"] is None
    for side in ("inputA", "inputB"):
        if not isinstance(body.input_a if side == "inputA" else body.input_b, str):
            assert set(shape[side]) == {"__offline_bytes__"}
    for trace in traces.values():
        json.dumps(trace.to_dict())
        assert trace.duration > 0  # measured, in milliseconds


def test_causally_ordered_writes_are_not_conflicts(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    recorders = [Recorder(a), Recorder(b)]
    a.items.update("r1", {"title": "one", "count": op.increment(1)})
    exchange_all(pair)
    clock.advance()
    b.items.update("r1", {"title": "two", "count": op.increment(1)})
    exchange_all(pair)
    assert [r.events for r in recorders] == [[], []]
    assert a.items.find_by_id("r1")["title"] == "two"


def test_no_trace_for_a_field_only_one_side_wrote(pair: list[App], clock: FakeClock) -> None:
    a, b = pair
    concurrent_updates(pair, clock, {"title": "A"}, {"lo": 3})
    recorder = Recorder(b)
    b.apply(a.operations())
    assert recorder.traces() == []
    assert b.items.find_by_id("r1")["title"] == "A" and b.items.find_by_id("r1")["lo"] == 3


@pytest.mark.parametrize(
    ("resolver", "reason"),
    [
        (lambda a, b, base: 1 / 0, "raised ZeroDivisionError"),
        (lambda a, b, base: 42, "returned a int, not a string"),
    ],
)
def test_a_failing_resolver_falls_back_to_the_later_value_once_and_says_so(
    clock: FakeClock, resolver: Any, reason: str
) -> None:
    """A resolver that raises or returns an ill-typed value: every replica keeps the later write's value,
    the trace says why (``fallback``), and reads do not call the resolver again."""
    calls: list[Any] = []

    def counted(a: Any, b: Any, base: Any) -> Any:
        calls.append((a, b))
        return resolver(a, b, base)

    apps = new_apps(2, make_schema(resolver=counted), clock=clock)
    try:
        a, b = apps
        a.items.insert({"id": "r1", "notes": "n0"})
        exchange_all(apps)
        clock.advance()
        concurrent_updates(apps, clock, {"notes": "zeta"}, {"notes": "alpha"})
        recorders = [Recorder(a), Recorder(b)]
        exchange_all(apps)
        for recorder in recorders:
            (trace,) = recorder.traces()
            assert trace.field == "notes" and trace.tier == 3
            assert trace.output == "alpha"  # the later write (b's, later HLC)
            assert trace.fallback is not None and reason in trace.fallback
            assert json.loads(json.dumps(trace.to_dict()))["fallback"] == trace.fallback
        called = len(calls)
        for _ in range(3):
            for app in apps:
                assert app.items.find_by_id("r1")["notes"] == "alpha"  # type: ignore[index]
                assert app.items.where({"notes": "alpha"}).count() == 1
                app.flush()
                state = app.cached_state("items", "r1")
                assert state is not None
                assert app.engine.materialize("items", "r1", state)["notes"] == "alpha"  # type: ignore[index]
        assert len(calls) == called  # settled when the operations were folded, not on reads
    finally:
        for app in apps:
            app.close()
